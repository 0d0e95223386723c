/* test_uid_limits - one uid cannot take every session or job slot of sm70d: per-uid limits, refusals that name them, another uid served meanwhile. */
/*
 * The attack of issue 17 item 2: one uid opened sessions until the daemon's 256 were gone,
 * and everyone else was refused (with a message about jobs in flight). Here an attacker
 * process running as another uid (ATTACKER_UID, so the test needs root to setresuid; it is
 * skipped otherwise) does the same with raw protocol clients (raw_client.h):
 *
 * - sessions: it connects until it is refused. With max_sessions 16 and no per-uid setting,
 *   the default fair share (a quarter) lets it hold exactly 4; the fifth is refused with
 *   E_BUSY and a reason naming limits.max_sessions_per_uid. The victim (this process, root)
 *   is then welcomed and completes a job within VICTIM_BOUND_MS, and can open its own 4.
 * - jobs: with max_jobs_in_flight 4 and limits.max_jobs_per_uid 6, it fills one session
 *   with 4 long jobs and then submits 4 more on a second session: 2 are accepted and 2 get
 *   ERROR(E_BUSY) naming limits.max_jobs_per_uid. The victim's job is accepted next to
 *   them and finishes within VICTIM_BOUND_MS.
 *
 * After the attacker exits, the daemon's descriptors are back to their count before it
 * (/proc/PID/fd) and SIGTERM ends the daemon with status 0 (under ASan, LeakSanitizer would
 * make that non-zero for leaked memory).
 */
#include <errno.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/integration/daemon_util.h"
#include "tests/integration/raw_client.h"

#define ATTACKER_UID 4243
/* A victim job (5 prompt tokens, 16 new) takes a few milliseconds on this fixture, tens
 * next to the attacker's jobs; the bound leaves room for sanitizers and a loaded machine. */
#define VICTIM_BOUND_MS 3000
#define MAX_TRY 32

static const uint32_t prompt[5] = { 11, 22, 33, 44, 55 };
static struct sm70t_daemon dmn;

/* What the attacker saw, sent to the parent through a pipe. */
struct report {
	int welcomed;	    /* sessions it got */
	int refused_code;   /* the refusal that stopped it (0: none) */
	char reason[232];
	int accepted;	    /* jobs without an ERROR (second session: counted by tag) */
	int busy;	    /* ERROR(E_BUSY) events */
	char busy_msg[104]; /* the first one's message */
	int other_errors;
};

static int start(const char *cfg)
{
	int ret = sm70t_daemon_start(&dmn, cfg, NULL);

	/* the attacker's uid must reach the socket in the (0700) temp dir */
	if (!ret && chmod(dmn.dir, 0711))
		ret = -errno;
	return ret;
}

/* ---- the attacker, in a child process under ATTACKER_UID -------------------------------- */

struct attacker {
	pid_t pid;
	int stop_w, res_r;
};

/* Reads and drops whatever the sessions got, until the parent closes the stop pipe. */
static void drain_until_stop(struct sm70t_raw *c, int n, int stop_r)
{
	struct pollfd p = { .fd = stop_r, .events = POLLIN };
	struct sm70_proto_eqe ev;

	while (poll(&p, 1, 5) == 0)
		for (int i = 0; i < n; i++)
			while (c[i].h && sm70t_raw_pop(&c[i], &ev))
				;
}

/* Sessions until a refusal. */
static void attack_sessions(struct report *r, struct sm70t_raw *c)
{
	for (int i = 0; i < MAX_TRY; i++) {
		int ret = sm70t_raw_connect(&c[i], dmn.sock, 0, 5000);

		if (ret == 1) {
			r->refused_code = c[i].refusal.result;
			memcpy(r->reason, c[i].refusal.reason, sizeof(r->reason) - 1);
			sm70t_raw_close(&c[i]);
			return;
		}
		if (ret)
			_exit(10);
		r->welcomed++;
	}
}

/* 4 long jobs on one session; once the daemon read them, 4 more on a second session
 * (tags 101..104), whose answers it sorts out for a second: a TOKEN means accepted. */
static void attack_jobs(struct report *r, struct sm70t_raw *c)
{
	struct sm70_proto_eqe ev;
	int busy[4] = { 0 }, streaming[4] = { 0 };
	long t0;

	if (sm70t_raw_connect(&c[0], dmn.sock, 0, 5000) ||
	    sm70t_raw_connect(&c[1], dmn.sock, 0, 5000))
		_exit(11);
	for (int s = 0; s < 2; s++) {
		for (uint64_t k = 0; k < 4; k++)
			if (sm70t_raw_submit(&c[s], 100 * (uint64_t)s + k + 1, prompt, 5, 4000,
					     SM70_PROTO_SQF_IGNORE_EOS))
				_exit(12);
		sm70t_raw_publish(&c[s]);
		t0 = sm70t_raw_ms();
		while (sm70_ring_load_acquire(&c[s].h->sq_head) != c[s].sq_tail)
			if (sm70t_raw_ms() - t0 > 5000)
				_exit(13);
	}
	t0 = sm70t_raw_ms();
	while (sm70t_raw_ms() - t0 < 1000) {
		for (int s = 0; s < 2; s++)
			while (sm70t_raw_pop(&c[s], &ev)) {
				uint64_t k = ev.tag - 101;

				if (ev.type == SM70_PROTO_EV_TOKEN) {
					if (s == 1 && k < 4)
						streaming[k] = 1;
					continue;
				}
				if (s == 1 && k < 4 && ev.type == SM70_PROTO_EV_ERROR &&
				    ev.u.error.error == SM70_PROTO_E_BUSY) {
					if (!r->busy++)
						memcpy(r->busy_msg, ev.u.error.message,
						       sizeof(r->busy_msg) - 1);
					busy[k] = 1;
					continue;
				}
				r->other_errors++;
			}
		usleep(1000);
	}
	for (int k = 0; k < 4; k++)
		r->accepted += streaming[k] && !busy[k];
}

static void attacker_start(struct attacker *a, int jobs)
{
	int stop[2], res[2];

	assert_int_equal(pipe(stop), 0);
	assert_int_equal(pipe(res), 0);
	fflush(NULL);
	a->pid = fork();
	assert_true(a->pid >= 0);
	if (a->pid == 0) {
		static struct sm70t_raw c[MAX_TRY];
		struct report r;

		close(stop[1]);
		close(res[0]);
		if (setresgid(ATTACKER_UID, ATTACKER_UID, ATTACKER_UID) ||
		    setresuid(ATTACKER_UID, ATTACKER_UID, ATTACKER_UID))
			_exit(9);
		memset(&r, 0, sizeof(r));
		for (int i = 0; i < MAX_TRY; i++)
			sm70t_raw_init(&c[i]);
		if (jobs)
			attack_jobs(&r, c);
		else
			attack_sessions(&r, c);
		if (write(res[1], &r, sizeof(r)) != (ssize_t)sizeof(r))
			_exit(14);
		drain_until_stop(c, MAX_TRY, stop[0]);
		_exit(0); /* the kernel closes every session: the daemon sees hang-ups */
	}
	close(stop[0]);
	close(res[1]);
	a->stop_w = stop[1];
	a->res_r = res[0];
}

static struct report attacker_report(struct attacker *a)
{
	struct pollfd p = { .fd = a->res_r, .events = POLLIN };
	struct report r;

	memset(&r, 0, sizeof(r));
	if (poll(&p, 1, 20000) != 1 || read(a->res_r, &r, sizeof(r)) != (ssize_t)sizeof(r)) {
		int st = 0;

		kill(a->pid, SIGKILL);
		waitpid(a->pid, &st, 0);
		sm70t_daemon_dump_log(&dmn);
		fail_msg("the attacker reported nothing (exit status %d)", WEXITSTATUS(st));
	}
	return r;
}

static void attacker_stop(struct attacker *a)
{
	int st;

	close(a->stop_w);
	close(a->res_r);
	assert_int_equal(waitpid(a->pid, &st, 0), a->pid);
	assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

/* ---- the victim ------------------------------------------------------------------------ */

/* One job (5 prompt tokens, 16 new) on a fresh session; returns its milliseconds from
 * connect to FINISH, having checked its events. */
static long victim_job(uint64_t tag)
{
	struct sm70t_raw v;
	struct sm70_proto_eqe ev;
	long t0 = sm70t_raw_ms(), ms;

	if (sm70t_raw_connect(&v, dmn.sock, 0, VICTIM_BOUND_MS) || !v.h)
		fail_msg("the victim was not welcomed");
	assert_int_equal(sm70t_raw_submit(&v, tag, prompt, 5, 16, SM70_PROTO_SQF_IGNORE_EOS), 0);
	sm70t_raw_publish(&v);
	assert_int_equal(sm70t_raw_wait_final(&v, tag, &ev, VICTIM_BOUND_MS), 16);
	ms = sm70t_raw_ms() - t0;
	assert_int_equal(ev.type, SM70_PROTO_EV_FINISH);
	assert_int_equal(ev.u.finish.reason, SM70_PROTO_FINISH_LENGTH);
	assert_int_equal(ev.u.finish.completion_tokens, 16);
	sm70t_raw_close(&v);
	assert_true(ms <= VICTIM_BOUND_MS);
	return ms;
}

/* ---- tests ----------------------------------------------------------------------------- */

static int need_root(void)
{
	if (geteuid() == 0)
		return 1;
	printf("skipped: setting another uid for the attacker needs root\n");
	return 0;
}

static void test_sessions_fair_share(void **state)
{
	static const char cfg[] =
		"{ \"engine\": { \"n_threads\": 1, \"max_seqs\": 8, \"kv_bytes\": 16777216 },\n"
		"  \"max_sessions\": 16, \"allowed_uids\": [0, 4243], \"socket_mode\": \"0666\" }\n";
	struct sm70t_raw own[8];
	struct attacker a;
	struct report r;
	int n0, n_end, n_own = 0, ret;
	long ms;

	(void)state;
	if (!need_root())
		skip();
	assert_int_equal(start(cfg), 0);
	n0 = sm70t_settled_fds(dmn.pid);
	attacker_start(&a, 0);
	r = attacker_report(&a);
	printf("attacker uid %d: %d sessions, then refused (%s): \"%s\"\n", ATTACKER_UID,
	       r.welcomed, sm70_proto_strerror(r.refused_code), r.reason);
	assert_int_equal(r.welcomed, 4); /* a quarter of max_sessions */
	assert_int_equal(r.refused_code, SM70_PROTO_E_BUSY);
	assert_non_null(strstr(r.reason, "limits.max_sessions_per_uid"));
	assert_non_null(strstr(r.reason, "4243"));

	ms = victim_job(1);
	printf("victim uid 0: welcomed and served in %ld ms (bound %d ms)\n", ms,
	       VICTIM_BOUND_MS);
	/* the victim's uid has its own share */
	for (int i = 0; i < 8; i++) {
		ret = sm70t_raw_connect(&own[i], dmn.sock, 0, 5000);
		if (ret == 1) {
			assert_int_equal(own[i].refusal.result, SM70_PROTO_E_BUSY);
			assert_non_null(strstr(own[i].refusal.reason, "max_sessions_per_uid"));
			sm70t_raw_close(&own[i]);
			break;
		}
		assert_int_equal(ret, 0);
		n_own++;
	}
	printf("victim uid 0: %d sessions of its own next to the attacker's\n", n_own);
	assert_int_equal(n_own, 4);
	for (int i = 0; i < n_own; i++)
		sm70t_raw_close(&own[i]);
	attacker_stop(&a);
	n_end = sm70t_settled_fds(dmn.pid);
	printf("daemon descriptors: %d before the attack, %d after\n", n0, n_end);
	assert_int_equal(n_end, n0);
	/* the attacker's slots came back with its sessions */
	ms = victim_job(2);
	assert_int_equal(sm70t_daemon_stop(&dmn, SIGTERM, 5000), 0);
}

static void test_jobs_per_uid(void **state)
{
	static const char cfg[] =
		"{ \"engine\": { \"n_threads\": 1, \"max_seqs\": 8, \"kv_bytes\": 67108864 },\n"
		"  \"limits\": { \"max_jobs_in_flight\": 4, \"max_jobs_per_uid\": 6 },\n"
		"  \"allowed_uids\": [0, 4243], \"socket_mode\": \"0666\" }\n";
	struct attacker a;
	struct report r;
	int n0, n_end;
	long ms;

	(void)state;
	if (!need_root())
		skip();
	assert_int_equal(start(cfg), 0);
	n0 = sm70t_settled_fds(dmn.pid);
	attacker_start(&a, 1);
	r = attacker_report(&a);
	printf("attacker uid %d: 4 jobs on one session, then 4 on another: %d accepted, %d "
	       "E_BUSY (\"%s\"), %d other final events\n", ATTACKER_UID, r.accepted, r.busy,
	       r.busy_msg, r.other_errors);
	assert_int_equal(r.busy, 2);
	assert_int_equal(r.accepted, 2);
	assert_int_equal(r.other_errors, 0);
	assert_non_null(strstr(r.busy_msg, "limits.max_jobs_per_uid"));

	/* six attacker jobs of 4000 tokens run; the victim's job is accepted beside them */
	ms = victim_job(1);
	printf("victim uid 0: served in %ld ms next to the attacker's 6 running jobs (bound %d "
	       "ms)\n", ms, VICTIM_BOUND_MS);
	attacker_stop(&a);
	n_end = sm70t_settled_fds(dmn.pid);
	printf("daemon descriptors: %d before the attack, %d after\n", n0, n_end);
	assert_int_equal(n_end, n0);
	assert_int_equal(sm70t_daemon_stop(&dmn, SIGTERM, 5000), 0);
}

static int teardown(void **state)
{
	(void)state;
	if (dmn.pid > 0 && !dmn.exited)
		sm70t_daemon_dump_log(&dmn);
	sm70t_daemon_cleanup(&dmn);
	memset(&dmn, 0, sizeof(dmn));
	return 0;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_sessions_fair_share, teardown),
		cmocka_unit_test_teardown(test_jobs_per_uid, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
