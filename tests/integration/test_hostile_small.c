/* test_hostile_small - the smaller holes of issue 17: a duplicate tag's ERROR ends no job and says so, priority is granted per uid or group, a FIFO config does not hang start-up, --check-config refuses what cannot start, refusals give exact sizes. */
/*
 * Raw protocol clients (raw_client.h) against a real sm70d:
 *
 * - duplicate tags: while job 7 streams, a second SUBMIT with tag 7, a malformed SUBMIT
 *   with tag 7 and an entry of an unknown opcode with tag 7 each get an ERROR with
 *   EVF_NOT_FINAL, and job 7 still delivers every token and exactly one FINISH; a
 *   malformed SUBMIT with a fresh tag gets an ERROR without the flag (its final event).
 *   A victim session completes a job within VICTIM_BOUND_MS meanwhile.
 * - priority: limits.max_priority defaults to 0; overrides grant uid 0 priority 3 (and 7
 *   jobs in flight) and group 4243 priority 1. The welcome's limits show it; a job above
 *   them gets ERROR(E_INVALID) naming priority. As root, uid 4243 (by its group) and uid
 *   4244 (no override) are checked in child processes; otherwise only uid 0.
 * - sizes: a 65,536-byte hello is refused naming 65536 bytes (not the 4096 read);
 *   top_p 1.0000001 is refused "(got 1.00000012)", not "(got 1)".
 * - config: sm70d --check-config and a plain start with a FIFO as --config each exit 2
 *   within 5 s ("not a regular file (a FIFO)"); --check-config exits 2 naming
 *   engine.max_batch_tokens for max_seqs 1024 with max_batch_tokens 16, engine.kv_bytes for
 *   2^63-1 bytes, and overrides[0] for an entry that names no one.
 */
#include <errno.h>
#include <grp.h>
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

#define FIXTURE "tests/fixtures/qwen3-gqa2-d64-tied"
#define VICTIM_BOUND_MS 1000

static const uint32_t prompt[5] = { 11, 22, 33, 44, 55 };
static struct sm70t_daemon dmn;

/* Writes e into the next SQ slot as is. */
static void put_entry(struct sm70t_raw *c, const struct sm70_proto_sqe *e)
{
	assert_true(c->sq_tail - sm70_ring_load_acquire(&c->h->sq_head) < c->w.sq_entries);
	memcpy(&c->sq[sm70_ring_slot(c->sq_tail, c->w.sq_entries)], e, sizeof(*e));
	c->sq_tail++;
}

/* A SUBMIT of 5 prompt tokens (copied with raw_client's arena rule) and priority prio. */
static void submit_prio(struct sm70t_raw *c, uint64_t tag, uint32_t max_new, uint8_t prio)
{
	assert_int_equal(sm70t_raw_submit(c, tag, prompt, 5, max_new, SM70_PROTO_SQF_IGNORE_EOS),
			 0);
	c->sq[sm70_ring_slot(c->sq_tail - 1, c->w.sq_entries)].priority = prio;
	sm70t_raw_publish(c);
}

/* ---- duplicate tags ------------------------------------------------------------------- */

static void test_duplicate_tag(void **state)
{
	struct sm70t_raw c, v;
	struct sm70_proto_sqe e;
	struct sm70_proto_eqe ev;
	int tokens = 0, finals = 0, not_final = 0, fresh_final = 0, n;
	long t0;

	(void)state;
	assert_int_equal(sm70t_daemon_start(&dmn, "{ \"engine\": { \"n_threads\": 1 } }", NULL),
			 0);
	assert_int_equal(sm70t_raw_connect(&c, dmn.sock, 4096, 5000), 0);
	assert_int_equal(sm70t_raw_connect(&v, dmn.sock, 0, 5000), 0);
	submit_prio(&c, 7, 300, 0);
	do {
		assert_int_equal(sm70t_raw_next(&c, &ev, 5000), 0);
	} while (ev.type != SM70_PROTO_EV_TOKEN);
	tokens = 1;

	/* the same tag again, valid; then malformed; then an unknown opcode; then a
	 * malformed SUBMIT with a tag no job holds */
	assert_int_equal(sm70t_raw_submit(&c, 7, prompt, 5, 8, 0), 0);
	memset(&e, 0, sizeof(e));
	e.size = sizeof(e);
	e.opcode = SM70_PROTO_OP_SUBMIT;
	e.tag = 7;
	e.max_new_tokens = 8;
	e.top_p = 1.0f; /* prompt_len 0: invalid */
	put_entry(&c, &e);
	e.opcode = 9;
	put_entry(&c, &e);
	e.opcode = SM70_PROTO_OP_SUBMIT;
	e.tag = 8;
	put_entry(&c, &e);
	sm70t_raw_publish(&c);

	/* a victim session meanwhile */
	t0 = sm70t_raw_ms();
	assert_int_equal(sm70t_raw_submit(&v, 1, prompt, 5, 8, SM70_PROTO_SQF_IGNORE_EOS), 0);
	sm70t_raw_publish(&v);
	assert_int_equal(sm70t_raw_wait_final(&v, 1, &ev, VICTIM_BOUND_MS), 8);
	assert_int_equal(ev.u.finish.reason, SM70_PROTO_FINISH_LENGTH);
	printf("victim: served in %ld ms (bound %d ms)\n", sm70t_raw_ms() - t0, VICTIM_BOUND_MS);
	assert_true(sm70t_raw_ms() - t0 <= VICTIM_BOUND_MS);

	while (!finals || not_final < 3 || !fresh_final) {
		assert_int_equal(sm70t_raw_next(&c, &ev, 5000), 0);
		if (ev.type == SM70_PROTO_EV_TOKEN) {
			assert_int_equal(ev.tag, 7);
			assert_int_equal(finals, 0);
			assert_int_equal(ev.index, tokens);
			tokens++;
		} else if (ev.type == SM70_PROTO_EV_FINISH) {
			assert_int_equal(ev.tag, 7);
			assert_int_equal(ev.u.finish.reason, SM70_PROTO_FINISH_LENGTH);
			assert_int_equal(ev.u.finish.completion_tokens, 300);
			finals++;
		} else if (ev.tag == 7) {
			assert_int_equal(ev.type, SM70_PROTO_EV_ERROR);
			assert_true(ev.flags & SM70_PROTO_EVF_NOT_FINAL);
			if (!not_final++)
				printf("duplicate tag 7: ERROR %s, flags EVF_NOT_FINAL: \"%s\"\n",
				       sm70_proto_strerror(ev.u.error.error), ev.u.error.message);
		} else {
			assert_int_equal(ev.tag, 8);
			assert_int_equal(ev.type, SM70_PROTO_EV_ERROR);
			assert_false(ev.flags & SM70_PROTO_EVF_NOT_FINAL);
			fresh_final++;
		}
	}
	printf("job 7: %d tokens then one FINISH, after 3 NOT_FINAL errors for its tag; tag 8's "
	       "ERROR is final (no flag)\n", tokens);
	assert_int_equal(tokens, 300);
	assert_int_equal(not_final, 3);
	/* nothing more for tag 7 */
	n = sm70t_raw_next(&c, &ev, 200);
	assert_int_equal(n, -ETIMEDOUT);
	sm70t_raw_close(&c);
	sm70t_raw_close(&v);
	assert_int_equal(sm70t_daemon_stop(&dmn, SIGTERM, 5000), 0);
	sm70t_daemon_cleanup(&dmn);
}

/* ---- priority per uid and group ------------------------------------------------------ */

struct prio_report {
	uint32_t max_priority, max_jobs;
	int above_refused, at_limit_ok;
	char msg[104];
};

/* Connects, checks the welcome's limits, runs a job at the limit and one above it. */
static void prio_probe(struct prio_report *r)
{
	struct sm70t_raw c;
	struct sm70_proto_eqe ev;
	uint8_t lim;

	memset(r, 0, sizeof(*r));
	if (sm70t_raw_connect(&c, dmn.sock, 0, 5000))
		return;
	r->max_priority = c.w.limits.max_priority;
	r->max_jobs = c.w.limits.max_jobs_in_flight;
	lim = (uint8_t)r->max_priority;
	submit_prio(&c, 1, 4, lim);
	r->at_limit_ok = sm70t_raw_wait_final(&c, 1, &ev, 5000) == 4 &&
			 ev.type == SM70_PROTO_EV_FINISH;
	submit_prio(&c, 2, 4, (uint8_t)(lim + 1));
	if (sm70t_raw_wait_final(&c, 2, &ev, 5000) == 0 && ev.type == SM70_PROTO_EV_ERROR &&
	    ev.u.error.error == SM70_PROTO_E_INVALID) {
		r->above_refused = 1;
		memcpy(r->msg, ev.u.error.message, sizeof(r->msg) - 1);
	}
	sm70t_raw_close(&c);
}

/* prio_probe in a child running as uid/gid. */
static struct prio_report prio_probe_as(uid_t uid, gid_t gid)
{
	struct prio_report r;
	int p[2], st;
	pid_t pid;

	assert_int_equal(pipe(p), 0);
	fflush(NULL);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		close(p[0]);
		if (setgroups(0, NULL) || setresgid(gid, gid, gid) || setresuid(uid, uid, uid))
			_exit(9);
		prio_probe(&r);
		_exit(write(p[1], &r, sizeof(r)) == (ssize_t)sizeof(r) ? 0 : 8);
	}
	close(p[1]);
	memset(&r, 0, sizeof(r));
	assert_int_equal(read(p[0], &r, sizeof(r)), sizeof(r));
	close(p[0]);
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	return r;
}

static void expect_prio(const struct prio_report *r, const char *who, uint32_t prio,
			uint32_t jobs)
{
	printf("%s: welcome max_priority %u, max_jobs_in_flight %u; a job at %u finished, one "
	       "at %u refused: \"%s\"\n", who, r->max_priority, r->max_jobs, prio, prio + 1,
	       r->msg);
	assert_int_equal(r->max_priority, prio);
	assert_int_equal(r->max_jobs, jobs);
	assert_true(r->at_limit_ok);
	assert_true(r->above_refused);
	assert_non_null(strstr(r->msg, "priority"));
}

static void test_priority_per_uid_and_group(void **state)
{
	static const char cfg[] =
		"{ \"engine\": { \"n_threads\": 1 },\n"
		"  \"allowed_uids\": [0, 4243, 4244], \"socket_mode\": \"0666\",\n"
		"  \"limits\": { \"max_jobs_in_flight\": 5 },\n"
		"  \"overrides\": [ { \"uids\": [0], \"max_priority\": 3, \"max_jobs_in_flight\": 7 },\n"
		"                 { \"gids\": [4243], \"max_priority\": 1 } ] }\n";
	struct prio_report r;

	(void)state;
	assert_int_equal(sm70t_daemon_start(&dmn, cfg, NULL), 0);
	assert_int_equal(chmod(dmn.dir, 0711), 0);
	if (geteuid() == 0) {
		prio_probe(&r);
		expect_prio(&r, "uid 0 (overrides[0])", 3, 7);
		r = prio_probe_as(4243, 4243);
		expect_prio(&r, "uid 4243 (group 4243: overrides[1])", 1, 5);
		r = prio_probe_as(4244, 4244);
		expect_prio(&r, "uid 4244 (no override)", 0, 5);
	} else {
		printf("not root: only this uid is checked, against the defaults\n");
		prio_probe(&r);
		expect_prio(&r, "this uid (no override)", 0, 5);
	}
	assert_int_equal(sm70t_daemon_stop(&dmn, SIGTERM, 5000), 0);
	sm70t_daemon_cleanup(&dmn);
}

/* ---- sizes in refusals ----------------------------------------------------------------- */

static void test_exact_sizes(void **state)
{
	static char big[65536];
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	struct sm70_proto_refusal ref;
	struct sm70_proto_eqe ev;
	struct sm70t_raw c;
	struct pollfd p;
	int fd, sz = 1 << 20;
	float top_p = 1.0000001f;

	(void)state;
	assert_int_equal(sm70t_daemon_start(&dmn, "{ \"engine\": { \"n_threads\": 1 } }", NULL),
			 0);
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	assert_true(fd >= 0);
	setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sz, sizeof(sz));
	snprintf(a.sun_path, sizeof(a.sun_path), "%s", dmn.sock);
	assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	assert_int_equal(send(fd, big, sizeof(big), MSG_NOSIGNAL), sizeof(big));
	p = (struct pollfd){ .fd = fd, .events = POLLIN };
	assert_int_equal(poll(&p, 1, 5000), 1);
	memset(&ref, 0, sizeof(ref));
	assert_int_equal(recv(fd, &ref, sizeof(ref), 0), sizeof(ref));
	close(fd);
	printf("a 65536-byte hello: REFUSAL %s \"%s\"\n", sm70_proto_strerror(ref.result),
	       ref.reason);
	assert_int_equal(ref.type, SM70_PROTO_MSG_REFUSAL);
	assert_int_equal(ref.result, SM70_PROTO_E_INVALID);
	assert_non_null(strstr(ref.reason, "65536 bytes"));

	assert_int_equal(sm70t_raw_connect(&c, dmn.sock, 0, 5000), 0);
	assert_int_equal(sm70t_raw_submit(&c, 1, prompt, 5, 4, 0), 0);
	memcpy(&c.sq[sm70_ring_slot(c.sq_tail - 1, c.w.sq_entries)].top_p, &top_p, 4);
	sm70t_raw_publish(&c);
	assert_int_equal(sm70t_raw_wait_final(&c, 1, &ev, 5000), 0);
	printf("top_p 1.0000001: ERROR \"%s\"\n", ev.u.error.message);
	assert_int_equal(ev.type, SM70_PROTO_EV_ERROR);
	assert_non_null(strstr(ev.u.error.message, "(got 1.00000012)"));
	sm70t_raw_close(&c);
	assert_int_equal(sm70t_daemon_stop(&dmn, SIGTERM, 5000), 0);
	sm70t_daemon_cleanup(&dmn);
}

/* ---- configurations that cannot start ----------------------------------------------- */

/* Runs sm70d with --config path (and --check-config if check) under a 10 s timeout;
 * returns its exit status (124: it hung) and its stderr in out. */
static int run_sm70d(const char *dir, const char *path, int check, char *out, size_t len)
{
	char cmd[1024], errf[256];
	FILE *f;
	size_t n;
	int st;

	snprintf(errf, sizeof(errf), "%s/err.txt", dir);
	snprintf(cmd, sizeof(cmd), "timeout 10 %s/bin/sm70d --model %s --socket %s/s.sock "
		 "--config %s %s >/dev/null 2>%s", sm70t_build_dir(), FIXTURE, dir, path,
		 check ? "--check-config" : "", errf);
	st = system(cmd);
	f = fopen(errf, "r");
	assert_non_null(f);
	n = fread(out, 1, len - 1, f);
	out[n] = '\0';
	fclose(f);
	assert_true(WIFEXITED(st));
	return WEXITSTATUS(st);
}

static void expect_refused(const char *dir, const char *json, const char *needle)
{
	char path[256], out[2048];
	FILE *f;
	long t0 = sm70t_ms_now();
	int st;

	snprintf(path, sizeof(path), "%s/c.json", dir);
	f = fopen(path, "w");
	assert_non_null(f);
	fputs(json, f);
	fclose(f);
	st = run_sm70d(dir, path, 1, out, sizeof(out));
	printf("--check-config %s: exit %d in %ld ms: %s", json, st, sm70t_ms_now() - t0, out);
	assert_int_equal(st, 2);
	assert_non_null(strstr(out, needle));
}

static void test_config_checks(void **state)
{
	char dir[] = "/tmp/sm70t-cfg-XXXXXX", fifo[64], out[2048];
	long t0;
	int st;

	(void)state;
	assert_non_null(mkdtemp(dir));
	snprintf(fifo, sizeof(fifo), "%s/fifo", dir);
	assert_int_equal(mkfifo(fifo, 0600), 0);
	for (int check = 1; check >= 0; check--) {
		t0 = sm70t_ms_now();
		st = run_sm70d(dir, fifo, check, out, sizeof(out));
		printf("%s with a FIFO as --config: exit %d in %ld ms: %s",
		       check ? "--check-config" : "start-up", st, sm70t_ms_now() - t0, out);
		assert_int_equal(st, 2);
		assert_true(sm70t_ms_now() - t0 < 5000);
		assert_non_null(strstr(out, "not a regular file (a FIFO)"));
	}
	expect_refused(dir, "{\"engine\": {\"max_seqs\": 1024, \"max_batch_tokens\": 16}}",
		       "engine.max_batch_tokens: 16 is below engine.max_seqs (1024)");
	expect_refused(dir, "{\"engine\": {\"kv_bytes\": 9223372036854775807}}",
		       "engine.kv_bytes: 9223372036854775807 bytes");
	expect_refused(dir, "{\"overrides\": [{\"max_priority\": 2}]}",
		       "overrides[0]: names no one");
	expect_refused(dir, "{\"overrides\": [{\"uids\": [0], \"max_prio\": 2}]}",
		       "overrides[0].max_prio: unknown key");
	snprintf(out, sizeof(out), "rm -rf %s", dir);
	assert_int_equal(system(out), 0);
}

static int teardown(void **state)
{
	(void)state;
	if (dmn.pid > 0 && !dmn.exited) {
		sm70t_daemon_dump_log(&dmn);
		sm70t_daemon_cleanup(&dmn);
	}
	memset(&dmn, 0, sizeof(dmn));
	return 0;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_duplicate_tag, teardown),
		cmocka_unit_test_teardown(test_priority_per_uid_and_group, teardown),
		cmocka_unit_test_teardown(test_exact_sizes, teardown),
		cmocka_unit_test_teardown(test_config_checks, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
