/* test_hostile_eventfds - a client that clears O_NONBLOCK on its eventfds, pins its event counter and steals its doorbell cannot stall sm70d. */
/*
 * The doorbell and event eventfds are open file descriptions the client shares with the
 * daemon: it can clear their O_NONBLOCK (fcntl F_SETFL 0), set the event counter to
 * 0xfffffffffffffffe (so that any further write of 1 would wait for a read), and read its
 * own doorbell between the daemon's poll and the daemon's read. A raw protocol client
 * (raw_client.h, not the SDK) does all three while a well-behaved SDK client in another
 * process runs jobs; that client must keep getting each job done within VICTIM_BOUND_MS.
 * Then: the daemon's pending wake lands once the hostile reads its counter (no wake is
 * lost), every descriptor the sessions took is closed again (/proc/PID/fd), and SIGTERM
 * with a wake still pending ends the daemon with status 0.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "sm70/client.h"
#include "tests/integration/daemon_util.h"
#include "tests/integration/raw_client.h"

/* A victim job (5 prompt tokens, 16 new) must end within this long, attack or not. On
 * this fixture it takes a few milliseconds; the bound leaves room for a loaded machine and
 * sanitizers, and is far below "forever", which is what a blocked daemon gives. */
#define VICTIM_BOUND_MS 1000
#define ATTACK_MS 1500
#define PINNED 0xfffffffffffffffeull

static struct sm70t_daemon dmn;
static const uint32_t prompt[5] = { 11, 22, 33, 44, 55 };

/* ---- the victim: an SDK client in a child process --------------------------------------- */

struct victim_report {
	int runs, bad;
	long max_ms;
};

static void victim_body(int stop_r, int res_w)
{
	struct victim_report rep = { 0, 0, 0 };
	struct pollfd p = { .fd = stop_r, .events = POLLIN };
	struct sm70_client *c = NULL;

	if (sm70_client_connect(&c, dmn.sock, NULL))
		_exit(2);
	do {
		struct sm70_job job;
		struct sm70_result res = { .size = sizeof(res) };
		long t0 = sm70t_ms_now(), ms;
		int ret;

		sm70_job_init(&job);
		job.prompt = prompt;
		job.prompt_len = 5;
		job.max_tokens = 16;
		ret = sm70_generate(c, &job, NULL, NULL, &res);
		ms = sm70t_ms_now() - t0;
		if (ret || (res.finish_reason != SM70_REASON_LENGTH &&
			    res.finish_reason != SM70_REASON_STOP_EOS))
			rep.bad++;
		rep.runs++;
		if (ms > rep.max_ms)
			rep.max_ms = ms;
		if (rep.runs == 1 && write(res_w, "r", 1) != 1)
			_exit(3);
	} while (poll(&p, 1, 0) == 0);
	sm70_client_close(c);
	if (write(res_w, &rep, sizeof(rep)) != (ssize_t)sizeof(rep))
		_exit(3);
	_exit(0);
}

static void victim_start(struct sm70t_child *v)
{
	char ready = 0;

	assert_int_equal(sm70t_child_start(v, victim_body, 10000, &ready), 0);
	assert_int_equal(ready, 'r');
}

/* Stops the victim and returns its report; a victim stuck in a job (a blocked daemon) does
 * not answer within the bound and is killed, which fails the test. */
static struct victim_report victim_stop(struct sm70t_child *v)
{
	struct victim_report rep = { 0, -1, -1 };
	int ret = sm70t_child_stop(v, &rep, sizeof(rep), VICTIM_BOUND_MS + 2000, NULL);

	assert_int_not_equal(ret, -ECHILD);
	if (ret) {
		sm70t_daemon_dump_log(&dmn);
		fail_msg("the victim client did not finish its job within %d ms: the daemon is "
			 "stuck", VICTIM_BOUND_MS + 2000);
	}
	return rep;
}

/* ---- the hostile client ------------------------------------------------------------------ */

/* The event counter as the kernel shows it (/proc/self/fdinfo), or -1. */
static long long evfd_count(int fd)
{
	char path[64], line[128];
	long long v = -1;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/self/fdinfo/%d", fd);
	f = fopen(path, "r");
	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (!strncmp(line, "eventfd-count:", 14))
			v = (long long)strtoull(line + 14, NULL, 16);
	fclose(f);
	return v;
}

/* Clears O_NONBLOCK on both eventfds (the daemon's descriptions too: they are the same
 * files); with pin, also pins the event counter and says it sleeps, so that the daemon
 * writes the event fd after every publish. */
static void turn_hostile(struct sm70t_raw *h, int pin)
{
	uint64_t v = PINNED;

	assert_int_equal(fcntl(h->bell, F_SETFL, 0), 0);
	assert_int_equal(fcntl(h->evfd, F_SETFL, 0), 0);
	assert_false(fcntl(h->bell, F_GETFL) & O_NONBLOCK);
	if (!pin)
		return;
	assert_int_equal(write(h->evfd, &v, sizeof(v)), sizeof(v));
	assert_true(evfd_count(h->evfd) == (long long)PINNED);
	sm70_proto_sleep_begin(&h->h->client_sleeping);
}

/* Rings its own doorbell and takes the count back at once, so that the daemon, woken by
 * the ring, finds it empty. (RWF_NOWAIT: the hostile itself must not block on it.) */
static int ring_and_steal(struct sm70t_raw *h)
{
	uint64_t one = 1, v = 0;
	struct iovec iov = { .iov_base = &v, .iov_len = sizeof(v) };

	if (write(h->bell, &one, sizeof(one)) != (ssize_t)sizeof(one))
		return 0;
	return preadv2(h->bell, &iov, 1, -1, RWF_NOWAIT) == (ssize_t)sizeof(v);
}

struct attack_stats {
	int jobs_done, steals, rings;
};

/* For ms milliseconds: keeps four jobs in flight, reads their events from the ring (never
 * from the pinned event fd), rings and steals the doorbell after every publish. */
static void attack(struct sm70t_raw *h, int ms, struct attack_stats *st)
{
	long deadline = sm70t_ms_now() + ms;
	uint64_t tag = 1;
	int in_flight = 0;

	memset(st, 0, sizeof(*st));
	while (sm70t_ms_now() < deadline) {
		struct sm70_proto_eqe ev;
		int put = 0;

		while (in_flight < 4 && sm70t_raw_submit(h, tag, prompt, 5, 8, 0) == 0) {
			tag++;
			in_flight++;
			put++;
		}
		if (put)
			sm70_ring_store_release(&h->h->sq_tail, h->sq_tail);
		st->steals += ring_and_steal(h);
		st->rings++;
		while (sm70t_raw_pop(h, &ev))
			if (ev.type != SM70_PROTO_EV_TOKEN) {
				assert_int_equal(ev.type, SM70_PROTO_EV_FINISH);
				in_flight--;
				st->jobs_done++;
			}
		usleep(200);
	}
	/* the last act: a stolen ring, and nothing after it */
	while (!ring_and_steal(h))
		;
}

/* ---- tests ------------------------------------------------------------------------------- */

static int setup(void **state)
{
	static const char cfg[] =
		"{ \"engine\": { \"n_threads\": 1, \"max_seqs\": 8, \"kv_bytes\": 16777216 },\n"
		"  \"limits\": { \"max_jobs_in_flight\": 8 },\n"
		"  \"drain_grace_ms\": 300, \"slow_consumer_ms\": 3000 }\n";

	return sm70t_daemon_start(&dmn, cfg, NULL);
}

static int teardown(void **state)
{
	if (!dmn.exited)
		sm70t_daemon_stop(&dmn, SIGKILL, 5000);
	return 0;
}

/* The victim runs through an attack and 300 ms past it; returns the attack's numbers. */
static void attack_with_victim(struct sm70t_raw *h, struct attack_stats *st, const char *what)
{
	struct sm70t_child v;
	struct victim_report rep;

	victim_start(&v);
	attack(h, ATTACK_MS, st);
	usleep(300 * 1000); /* the victim keeps running after the last stolen ring */
	rep = victim_stop(&v);
	printf("%s: %d ms, %d doorbell rings (%d taken back before the daemon read them), "
	       "%d hostile jobs done\n", what, ATTACK_MS, st->rings, st->steals, st->jobs_done);
	printf("victim: %d jobs meanwhile, %d bad, slowest %ld ms (bound %d ms)\n", rep.runs,
	       rep.bad, rep.max_ms, VICTIM_BOUND_MS);
	assert_int_equal(rep.bad, 0);
	assert_true(rep.runs >= 5);
	assert_true(rep.max_ms <= VICTIM_BOUND_MS);
	assert_true(st->jobs_done > 0);
	assert_true(st->steals > 0);
}

/* Both clients gone: every descriptor of their sessions is closed again. */
static void expect_fds(int n0)
{
	long t0 = sm70t_ms_now();
	int n;

	while ((n = sm70t_count_fds(dmn.pid)) != n0 && sm70t_ms_now() - t0 < 3000)
		usleep(10000);
	printf("daemon descriptors: %d before the clients, %d after\n", n0, n);
	assert_int_equal(n, n0);
}

static void test_stolen_doorbell(void **state)
{
	struct sm70t_raw h;
	struct attack_stats st;
	int n0 = sm70t_settled_fds(dmn.pid);

	assert_true(n0 > 0);
	assert_int_equal(sm70t_raw_connect(&h, dmn.sock, 0, 5000), 0);
	turn_hostile(&h, 0);
	attack_with_victim(&h, &st, "doorbell attack (O_NONBLOCK cleared, count taken back)");
	sm70t_raw_close(&h);
	expect_fds(n0);
}

static void test_pinned_event_counter(void **state)
{
	struct sm70t_raw h;
	struct attack_stats st;
	uint64_t got = 0;
	long long after;
	long t0;
	int n0 = sm70t_settled_fds(dmn.pid);

	assert_true(n0 > 0);
	assert_int_equal(sm70t_raw_connect(&h, dmn.sock, 0, 5000), 0);
	turn_hostile(&h, 1);
	attack_with_victim(&h, &st, "event fd attack (O_NONBLOCK cleared, counter pinned at "
			   "0xfffffffffffffffe) and doorbell attack");

	/* The daemon's wakes never landed on the full counter; one is still waiting in the
	 * kernel. Reading the counter lets it land: no wake was lost. */
	assert_true(evfd_count(h.evfd) == (long long)PINNED);
	assert_int_equal(read(h.evfd, &got, sizeof(got)), sizeof(got));
	assert_true(got == PINNED);
	t0 = sm70t_ms_now();
	while ((after = evfd_count(h.evfd)) == 0 && sm70t_ms_now() - t0 < 2000)
		usleep(1000);
	printf("the hostile read its pinned counter; the daemon's pending wake landed within "
	       "%ld ms (counter now %lld)\n", sm70t_ms_now() - t0, after);
	assert_true(after >= 1);
	sm70t_raw_close(&h);
	expect_fds(n0);
}

static void test_sigterm_with_a_wake_pending(void **state)
{
	struct sm70t_raw h;
	struct sm70_proto_eqe ev;
	long t0;
	int st, final = 0;

	assert_int_equal(sm70t_raw_connect(&h, dmn.sock, 0, 5000), 0);
	turn_hostile(&h, 1);
	assert_int_equal(sm70t_raw_submit(&h, 7, prompt, 5, 8, 0), 0);
	sm70t_raw_publish(&h);
	sm70t_raw_ring(&h);
	t0 = sm70t_ms_now();
	while (!final && sm70t_ms_now() - t0 < 5000) {
		while (sm70t_raw_pop(&h, &ev))
			final |= ev.type != SM70_PROTO_EV_TOKEN;
		usleep(1000);
	}
	assert_true(final); /* the daemon published, and wanted to wake the pinned fd */
	while (!ring_and_steal(&h))
		;
	t0 = sm70t_ms_now();
	kill(dmn.pid, SIGTERM);
	st = sm70t_daemon_wait(&dmn, 5000);
	if (st != 0)
		sm70t_daemon_dump_log(&dmn);
	assert_int_equal(st, 0);
	printf("SIGTERM with a hostile session and a wake pending on its pinned counter: exit "
	       "status 0 after %ld ms\n", sm70t_ms_now() - t0);
	sm70t_raw_close(&h);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_stolen_doorbell),
		cmocka_unit_test(test_pinned_event_counter),
		cmocka_unit_test(test_sigterm_with_a_wake_pending),
	};
	int ret = cmocka_run_group_tests(tests, setup, teardown);

	if (ret)
		sm70t_daemon_dump_log(&dmn);
	sm70t_daemon_cleanup(&dmn);
	return ret;
}
