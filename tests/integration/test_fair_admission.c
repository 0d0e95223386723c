/* test_fair_admission - one client's long jobs do not delay another client's first token by a whole job: the daemon pauses the newest running job of the client above its share. */
/*
 * The attack of issue 17 item 4: 64 jobs of 4,090 tokens from one client put another
 * client's first token at 46.6 s, because the engine's 16 running slots (and the 2 jobs
 * waiting inside it) all belonged to the first client and a running job was never paused.
 * Here client A (a raw protocol client, raw_client.h) submits the same burst on the CPU
 * backend; once its first 16 jobs stream, client B submits N_B short jobs one after another
 * and each must get its first token within TTFT_BOUND_MS (B's share: max_seqs / 2 clients);
 * A's tokens must stay the greedy reference through its pauses (every A job has the same
 * prompt, so every job's i-th token is the same), with indices in order. After A hangs up
 * with paused jobs, `sm70ctl --json status` shows no job and every KV block free, and the
 * daemon's descriptors are back to their count before. Run alone (the old scheduler), B's
 * first token came after A's first 16 jobs ended.
 */
#include <errno.h>
#include <jansson.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/integration/daemon_util.h"
#include "tests/integration/raw_client.h"

#define N_A 64
#define A_NEW 4090
#define N_B 4
#define TTFT_BOUND_MS 1000

static const uint32_t prompt[6] = { 52, 261, 158, 7, 99, 310 };
static struct sm70t_daemon dmn;

struct a_state {
	uint32_t ref[A_NEW];   /* the first token seen at each index */
	uint8_t have[A_NEW];
	uint32_t n[N_A + 1];   /* tokens of each job so far */
	int streaming, bad, finals;
	uint64_t tokens;
};

/* Takes A's events off its ring: token order and the shared greedy reference. */
static void drain_a(struct sm70t_raw *a, struct a_state *st)
{
	struct sm70_proto_eqe ev;

	while (sm70t_raw_pop(a, &ev)) {
		uint64_t k = ev.tag;

		if (k < 1 || k > N_A) {
			st->bad++;
			continue;
		}
		if (ev.type != SM70_PROTO_EV_TOKEN) {
			st->finals++;
			continue;
		}
		if (ev.index != st->n[k] || ev.index >= A_NEW) {
			st->bad++;
			continue;
		}
		if (!st->n[k])
			st->streaming++;
		st->n[k]++;
		st->tokens++;
		if (!st->have[ev.index]) {
			st->have[ev.index] = 1;
			st->ref[ev.index] = ev.u.token.token;
		} else if (st->ref[ev.index] != ev.u.token.token) {
			st->bad++;
		}
	}
}

static void test_burst_leaves_a_share(void **state)
{
	static struct a_state st;
	struct sm70t_raw a, b;
	struct sm70_proto_eqe ev;
	long t0, worst = 0, ttft[N_B];
	int n0, n_end, jobs = -1, fr = -1, total = -2;

	(void)state;
	n0 = sm70t_settled_fds(dmn.pid);
	assert_int_equal(sm70t_raw_connect(&a, dmn.sock, 65536, 5000), 0);
	assert_int_equal(sm70t_raw_connect(&b, dmn.sock, 0, 5000), 0);
	for (uint64_t k = 1; k <= N_A; k++)
		assert_int_equal(sm70t_raw_submit(&a, k, prompt, 6, A_NEW,
						  SM70_PROTO_SQF_IGNORE_EOS), 0);
	sm70t_raw_publish(&a);
	t0 = sm70t_raw_ms();
	while (st.streaming < 16) {
		drain_a(&a, &st);
		assert_true(sm70t_raw_ms() - t0 < 10000);
		usleep(500);
	}
	printf("A: %d jobs of 6 + %d tokens; 16 streaming after %ld ms\n", N_A, A_NEW,
	       sm70t_raw_ms() - t0);

	for (int i = 0; i < N_B; i++) {
		uint64_t tag = 1000 + (uint64_t)i;
		int got = 0, n_tok = 0;

		t0 = sm70t_raw_ms();
		assert_int_equal(sm70t_raw_submit(&b, tag, prompt, 6, 8, SM70_PROTO_SQF_IGNORE_EOS),
				 0);
		sm70t_raw_publish(&b);
		ttft[i] = -1;
		while (!got) {
			drain_a(&a, &st);
			while (sm70t_raw_pop(&b, &ev)) {
				assert_int_equal(ev.tag, tag);
				if (ev.type == SM70_PROTO_EV_TOKEN) {
					if (!n_tok++)
						ttft[i] = sm70t_raw_ms() - t0;
					continue;
				}
				assert_int_equal(ev.type, SM70_PROTO_EV_FINISH);
				assert_int_equal(ev.u.finish.reason, SM70_PROTO_FINISH_LENGTH);
				assert_int_equal(n_tok, 8);
				got = 1;
			}
			if (ttft[i] < 0 && sm70t_raw_ms() - t0 > 30000)
				fail_msg("B's job %d had no token after 30 s", i);
			usleep(200);
		}
		printf("B job %d: first token after %ld ms (daemon ttft %llu us), done after %ld "
		       "ms\n", i, ttft[i], (unsigned long long)ev.u.finish.ttft_us,
		       sm70t_raw_ms() - t0);
		if (ttft[i] > worst)
			worst = ttft[i];
	}
	drain_a(&a, &st);
	printf("A meanwhile: %llu tokens, %d jobs streaming, %d out of order or off the "
	       "reference, %d final events\n", (unsigned long long)st.tokens, st.streaming,
	       st.bad, st.finals);
	printf("B's slowest first token: %ld ms (bound %d ms)\n", worst, TTFT_BOUND_MS);
	assert_int_equal(st.bad, 0);
	assert_int_equal(st.finals, 0);
	assert_true(worst <= TTFT_BOUND_MS);

	/* A hangs up with jobs running, paused and queued: everything is freed */
	sm70t_raw_close(&a);
	sm70t_raw_close(&b);
	t0 = sm70t_raw_ms();
	while ((sm70t_kv_status(&dmn, &jobs, &fr, &total) || jobs || fr != total) &&
	       sm70t_raw_ms() - t0 < 5000)
		usleep(50000);
	printf("after A hung up: %d jobs, %d of %d KV blocks free\n", jobs, fr, total);
	assert_int_equal(jobs, 0);
	assert_int_equal(fr, total);
	n_end = sm70t_settled_fds(dmn.pid);
	printf("daemon descriptors: %d before, %d after\n", n0, n_end);
	assert_int_equal(n_end, n0);
}

static int setup(void **state)
{
	static const char cfg[] =
		"{ \"engine\": { \"n_threads\": 1, \"max_seqs\": 16, \"feed_depth\": 2 },\n"
		"  \"limits\": { \"max_jobs_in_flight\": 64 }, \"slow_consumer_ms\": 60000 }\n";

	(void)state;
	return sm70t_daemon_start(&dmn, cfg, NULL);
}

static int teardown(void **state)
{
	(void)state;
	return sm70t_daemon_finish(&dmn, 10000);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_burst_leaves_a_share),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
