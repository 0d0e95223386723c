/* test_held_events - sessions that never read park bounded daemon memory: past their bound of held events they are cut off with one slow-consumer error, and read again once they drain. */
/*
 * The attack of issue 17 item 3: 128 sessions with 65,536-entry event rings flooded
 * invalid entries and never read; the daemon held 65,537 ERROR events for each (RSS 6 MB ->
 * 2.84 GB). Here N_FLOOD raw sessions (raw_client.h) with EQ-entry rings do the same at a
 * size that fits CI, and one more session runs long jobs into a 16-entry ring it never
 * reads. The daemon's config bounds held events at slow_consumer_events 1024 per session
 * and slow_consumer_events_total 8192 for all (each session's share: 8192 / sessions, at
 * least 64). Checked:
 *
 * - the daemon stops reading every flooding session's SQ (entries stay unread) and its
 *   private memory (RssAnon of /proc/PID/status) grows by less than RSS_BOUND_MB, where
 *   holding what the old daemon held, N_FLOOD x (EQ + 1) events of 136 bytes in FIFOs
 *   rounded up to a power of two, takes +34 MB (measured with both bounds lifted), the
 *   bounded daemon about +2.5 MB;
 * - a victim client in another process completes jobs within VICTIM_BOUND_MS throughout;
 * - one flooding session then reads: every entry it wrote gets exactly one ERROR, one
 *   session-wide ERROR(E_SLOW_CONSUMER) (tag 0, opcode 0, EVF_NOT_FINAL) comes once, its
 *   unread entries are read after it drained, and a job on it completes;
 * - the job session ends its jobs with FINISH(ERROR, E_SLOW_CONSUMER) counting only the
 *   tokens delivered, and gets the session-wide ERROR once;
 * - after every attacker closed, the daemon's descriptors are back to their count before.
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
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/integration/daemon_util.h"
#include "tests/integration/raw_client.h"

#define N_FLOOD 24
#define EQ 8192
#define VICTIM_BOUND_MS 2000
#define RSS_BOUND_MB 16
#define TAG_SHIFT 32

static const uint32_t prompt[5] = { 11, 22, 33, 44, 55 };
static struct sm70t_daemon dmn;

/* ---- the victim: a raw client in a child process, jobs until told to stop -------------- */

struct victim_report {
	int runs, bad;
	long max_ms;
};

static void victim_body(int stop_r, int res_w)
{
	struct victim_report rep = { 0, 0, 0 };
	struct pollfd p = { .fd = stop_r, .events = POLLIN };
	struct sm70t_raw c;
	uint64_t tag = 1;

	if (sm70t_raw_connect(&c, dmn.sock, 0, 5000))
		_exit(2);
	do {
		struct sm70_proto_eqe ev;
		long t0 = sm70t_raw_ms(), ms;
		int n;

		if (sm70t_raw_submit(&c, tag, prompt, 5, 8, SM70_PROTO_SQF_IGNORE_EOS))
			_exit(3);
		sm70t_raw_publish(&c);
		n = sm70t_raw_wait_final(&c, tag++, &ev, VICTIM_BOUND_MS + 1000);
		ms = sm70t_raw_ms() - t0;
		if (n != 8 || ev.type != SM70_PROTO_EV_FINISH ||
		    ev.u.finish.reason != SM70_PROTO_FINISH_LENGTH)
			rep.bad++;
		rep.runs++;
		if (ms > rep.max_ms)
			rep.max_ms = ms;
		if (rep.runs == 1 && write(res_w, "r", 1) != 1)
			_exit(4);
		usleep(5000);
	} while (poll(&p, 1, 0) == 0);
	sm70t_raw_close(&c);
	if (write(res_w, &rep, sizeof(rep)) != (ssize_t)sizeof(rep))
		_exit(4);
	_exit(0);
}

static void victim_start(struct sm70t_child *v)
{
	char ready = 0;

	assert_int_equal(sm70t_child_start(v, victim_body, 10000, &ready), 0);
}

static struct victim_report victim_stop(struct sm70t_child *v)
{
	struct victim_report rep = { 0, -1, -1 };
	int ret = sm70t_child_stop(v, &rep, sizeof(rep), VICTIM_BOUND_MS + 3000, NULL);

	assert_int_not_equal(ret, -ECHILD);
	if (ret)
		fail_msg("the victim did not finish a job within %d ms", VICTIM_BOUND_MS + 3000);
	return rep;
}

/* ---- the attackers --------------------------------------------------------------------- */

/* Writes an entry with an unknown opcode (an ERROR each) into the next SQ slot. Returns 0
 * or -EAGAIN (the SQ is full: the daemon has not read the earlier ones). */
static int put_garbage(struct sm70t_raw *c, uint64_t tag)
{
	struct sm70_proto_sqe e;

	if (c->sq_tail - sm70_ring_load_acquire(&c->h->sq_head) >= c->w.sq_entries)
		return -EAGAIN;
	memset(&e, 0, sizeof(e));
	e.size = sizeof(e);
	e.opcode = 9;
	e.tag = tag;
	memcpy(&c->sq[sm70_ring_slot(c->sq_tail, c->w.sq_entries)], &e, sizeof(e));
	c->sq_tail++;
	return 0;
}

static void test_never_reading_sessions(void **state)
{
	static struct sm70t_raw fl[N_FLOOD];
	static uint8_t seen[1 << 17];
	static uint32_t written[N_FLOOD];
	struct sm70t_raw jobs;
	struct sm70_proto_eqe ev;
	struct sm70t_child v;
	struct victim_report rep;
	uint32_t heads[N_FLOOD];
	long anon0, anon1, shm1, t_quiet, t0;
	int n0, n_end, errors = 0, session_errors = 0, slow_finish = 0, tokens = 0, counted = 0;

	(void)state;
	n0 = sm70t_settled_fds(dmn.pid);
	anon0 = sm70t_status_kb(dmn.pid, "RssAnon");
	assert_true(anon0 > 0);
	victim_start(&v);

	/* a session that runs 4 long jobs into a 16-entry ring and never reads */
	assert_int_equal(sm70t_raw_connect(&jobs, dmn.sock, 16, 5000), 0);
	for (uint64_t k = 1; k <= 4; k++)
		assert_int_equal(sm70t_raw_submit(&jobs, k, prompt, 5, 3000,
						  SM70_PROTO_SQF_IGNORE_EOS), 0);
	sm70t_raw_publish(&jobs);

	/* the flood: refill every SQ until the daemon reads none of them for 300 ms */
	for (int i = 0; i < N_FLOOD; i++) {
		assert_int_equal(sm70t_raw_connect(&fl[i], dmn.sock, EQ, 5000), 0);
		assert_int_equal(fl[i].w.eq_entries, EQ);
		heads[i] = fl[i].sq_tail;
	}
	t0 = t_quiet = sm70t_raw_ms();
	while (sm70t_raw_ms() - t_quiet < 300) {
		for (int i = 0; i < N_FLOOD; i++) {
			uint32_t h = sm70_ring_load_acquire(&fl[i].h->sq_head);
			int put = 0;

			if (h != heads[i])
				t_quiet = sm70t_raw_ms();
			heads[i] = h;
			while (put_garbage(&fl[i], ((uint64_t)i << TAG_SHIFT) | (written[i] + 1)) == 0) {
				written[i]++;
				put++;
			}
			if (put)
				sm70t_raw_publish(&fl[i]);
		}
		usleep(1000);
		assert_true(sm70t_raw_ms() - t0 < 30000);
	}
	usleep(200 * 1000);
	anon1 = sm70t_status_kb(dmn.pid, "RssAnon");
	shm1 = sm70t_status_kb(dmn.pid, "RssShmem");
	for (int i = 0; i < N_FLOOD; i++)
		assert_true(fl[i].sq_tail != sm70_ring_load_acquire(&fl[i].h->sq_head));
	printf("flood: %d sessions (event rings of %d) wrote %u..%u invalid entries each in %ld "
	       "ms and the daemon stopped reading all of them\n", N_FLOOD, EQ, written[0],
	       written[N_FLOOD - 1], t_quiet - t0);
	printf("daemon memory: RssAnon %ld kB before, %ld kB after (+%ld kB, bound %d MB); "
	       "RssShmem %ld kB (the rings it wrote)\n", anon0, anon1, anon1 - anon0,
	       RSS_BOUND_MB, shm1);
	assert_true(anon1 - anon0 < RSS_BOUND_MB * 1024L);

	rep = victim_stop(&v);
	printf("victim: %d jobs during the attack, %d bad, slowest %ld ms (bound %d ms)\n",
	       rep.runs, rep.bad, rep.max_ms, VICTIM_BOUND_MS);
	assert_int_equal(rep.bad, 0);
	assert_true(rep.runs >= 3);
	assert_true(rep.max_ms <= VICTIM_BOUND_MS);

	/* session 0 reads: one ERROR per entry, one session-wide slow-consumer ERROR; then
	 * its remaining entries are read and answered too */
	t0 = sm70t_raw_ms();
	while (sm70_ring_load_acquire(&fl[0].h->sq_head) != fl[0].sq_tail ||
	       sm70_ring_load_acquire(&fl[0].h->eq_tail) != fl[0].eq_head || errors < (int)written[0]) {
		if (!sm70t_raw_pop(&fl[0], &ev)) {
			assert_true(sm70t_raw_ms() - t0 < 10000);
			usleep(200);
			continue;
		}
		assert_int_equal(ev.type, SM70_PROTO_EV_ERROR);
		if (ev.tag == 0) {
			assert_int_equal(ev.u.error.error, SM70_PROTO_E_SLOW_CONSUMER);
			assert_int_equal(ev.u.error.opcode, 0);
			assert_true(ev.flags & SM70_PROTO_EVF_NOT_FINAL);
			if (!session_errors++)
				printf("session-wide ERROR after %d entry errors: \"%s\"\n", errors,
				       ev.u.error.message);
			continue;
		}
		assert_int_equal(ev.u.error.error, SM70_PROTO_E_INVALID);
		assert_true((ev.tag >> TAG_SHIFT) == 0 && (ev.tag & 0xffffffffu) <= written[0]);
		assert_int_equal(seen[ev.tag], 0);
		seen[ev.tag] = 1;
		errors++;
	}
	printf("session 0 read: %d ERRORs for its %u entries (each once), %d session-wide\n",
	       errors, written[0], session_errors);
	assert_int_equal(errors, (int)written[0]);
	assert_int_equal(session_errors, 1);
	/* and it is served again */
	assert_int_equal(sm70t_raw_submit(&fl[0], 1u << 20, prompt, 5, 8,
					  SM70_PROTO_SQF_IGNORE_EOS), 0);
	sm70t_raw_publish(&fl[0]);
	assert_int_equal(sm70t_raw_wait_final(&fl[0], 1u << 20, &ev, 5000), 8);
	assert_int_equal(ev.type, SM70_PROTO_EV_FINISH);
	assert_int_equal(ev.u.finish.reason, SM70_PROTO_FINISH_LENGTH);

	/* the job session: its jobs ended as slow consumers, with the tokens delivered */
	t0 = sm70t_raw_ms();
	while (slow_finish < 4) {
		if (!sm70t_raw_pop(&jobs, &ev)) {
			assert_true(sm70t_raw_ms() - t0 < 10000);
			usleep(500);
			continue;
		}
		if (ev.type == SM70_PROTO_EV_TOKEN) {
			tokens++;
		} else if (ev.type == SM70_PROTO_EV_ERROR) {
			assert_int_equal(ev.tag, 0);
			assert_int_equal(ev.u.error.error, SM70_PROTO_E_SLOW_CONSUMER);
			session_errors++;
		} else {
			assert_int_equal(ev.type, SM70_PROTO_EV_FINISH);
			assert_int_equal(ev.u.finish.reason, SM70_PROTO_FINISH_ERROR);
			assert_int_equal(ev.u.finish.error, SM70_PROTO_E_SLOW_CONSUMER);
			assert_true(ev.u.finish.completion_tokens < 3000);
			counted += (int)ev.u.finish.completion_tokens;
			slow_finish++;
		}
	}
	printf("job session: 4 jobs ended E_SLOW_CONSUMER after %d delivered tokens in all; "
	       "session-wide errors %d\n", tokens, session_errors - 1);
	assert_int_equal(session_errors, 2);
	assert_true(tokens >= 16);
	assert_int_equal(counted, tokens); /* completion_tokens counts what was delivered */

	sm70t_raw_close(&jobs);
	for (int i = 0; i < N_FLOOD; i++)
		sm70t_raw_close(&fl[i]);
	n_end = sm70t_settled_fds(dmn.pid);
	printf("daemon descriptors: %d before the attack, %d after; RssAnon %ld kB\n", n0, n_end,
	       sm70t_status_kb(dmn.pid, "RssAnon"));
	assert_int_equal(n_end, n0);
}

static int setup(void **state)
{
	static const char cfg[] =
		"{ \"engine\": { \"n_threads\": 1, \"max_seqs\": 8, \"kv_bytes\": 16777216 },\n"
		"  \"max_sessions\": 64, \"limits\": { \"max_sessions_per_uid\": 64 },\n"
		"  \"slow_consumer_events\": 1024, \"slow_consumer_events_total\": 8192,\n"
		"  \"slow_consumer_ms\": 60000 }\n";

	(void)state;
	return sm70t_daemon_start(&dmn, cfg, NULL);
}

static int teardown(void **state)
{
	(void)state;
	return sm70t_daemon_finish(&dmn, 5000);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_never_reading_sessions),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
