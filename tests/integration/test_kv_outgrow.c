/* test_kv_outgrow - a job that outgrows the whole KV cache ends with FINISH(ERROR, E_NO_MEMORY) after the tokens that fit, as PROTOCOL.md says, while another client is served. */
/*
 * The case of issue 17 item 6: a job asked for more new tokens than the KV cache holds and
 * ended with LENGTH (1,021 of 2,000 tokens), which a client cannot tell from reaching its
 * max_new_tokens. The daemon reserves nothing for max_new_tokens at admission (most jobs
 * stop early, and a reservation would cut the batch); a job whose sequence outgrows the
 * whole cache ends with FINISH(ERROR, E_NO_MEMORY) and completion_tokens counting what
 * it got, and one whose prompt alone can never fit is refused at submission.
 *
 * On a daemon with a 128-token cache (kv_bytes 262144 on this fixture), raw protocol
 * clients (raw_client.h): a hog asks for 5 + 1000 tokens and gets exactly the 124 that fit
 * (the last token needs no KV slot of its own), then E_NO_MEMORY; meanwhile a victim
 * session runs jobs that each finish by length within VICTIM_BOUND_MS (the hog may
 * preempt them, they are recomputed). A 100-token prompt with 100 new tokens is accepted
 * and ends the same way after 29; a 128-token prompt gets ERROR(E_NO_MEMORY) at once.
 * Afterwards `sm70ctl --json status` shows no job and every KV block free, and the
 * daemon's descriptors are back to their count before.
 */
#include <errno.h>
#include <jansson.h>
#include <poll.h>
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

#define KV_TOKENS 128
#define VICTIM_BOUND_MS 1000

static struct sm70t_daemon dmn;
static uint32_t prompt[KV_TOKENS];

/* Reads events of both sessions until the hog's final event, running victim jobs one
 * after another meanwhile; returns the hog's TOKEN count and its final event in *fin. */
static int hog_with_victim(struct sm70t_raw *hog, struct sm70t_raw *vic, uint64_t hog_tag,
			   struct sm70_proto_eqe *fin, int *victim_runs, long *victim_max_ms)
{
	struct sm70_proto_eqe ev;
	uint64_t vtag = 1000 * hog_tag;
	long t_vic = sm70t_raw_ms(), t0 = t_vic;
	int hog_tokens = 0, vic_tokens = 0, done = 0;

	assert_int_equal(sm70t_raw_submit(vic, vtag, prompt, 5, 8, SM70_PROTO_SQF_IGNORE_EOS), 0);
	sm70t_raw_publish(vic);
	while (!done) {
		int got = 0;

		while (sm70t_raw_pop(hog, &ev)) {
			got = 1;
			assert_int_equal(ev.tag, hog_tag);
			if (ev.type == SM70_PROTO_EV_TOKEN) {
				assert_int_equal(ev.index, hog_tokens);
				hog_tokens++;
				continue;
			}
			*fin = ev;
			done = 1;
		}
		while (sm70t_raw_pop(vic, &ev)) {
			got = 1;
			assert_int_equal(ev.tag, vtag);
			if (ev.type == SM70_PROTO_EV_TOKEN) {
				vic_tokens++;
				continue;
			}
			assert_int_equal(ev.type, SM70_PROTO_EV_FINISH);
			assert_int_equal(ev.u.finish.reason, SM70_PROTO_FINISH_LENGTH);
			assert_int_equal(vic_tokens, 8);
			if (sm70t_raw_ms() - t_vic > *victim_max_ms)
				*victim_max_ms = sm70t_raw_ms() - t_vic;
			(*victim_runs)++;
			vic_tokens = 0;
			t_vic = sm70t_raw_ms();
			assert_int_equal(sm70t_raw_submit(vic, ++vtag, prompt, 5, 8,
							  SM70_PROTO_SQF_IGNORE_EOS), 0);
			sm70t_raw_publish(vic);
		}
		if (!got)
			usleep(200);
		assert_true(sm70t_raw_ms() - t0 < 20000);
	}
	/* the victim's last job ends too (some of its tokens may have been read above) */
	assert_int_equal(vic_tokens + sm70t_raw_wait_final(vic, vtag, &ev, VICTIM_BOUND_MS), 8);
	assert_int_equal(ev.u.finish.reason, SM70_PROTO_FINISH_LENGTH);
	if (sm70t_raw_ms() - t_vic > *victim_max_ms)
		*victim_max_ms = sm70t_raw_ms() - t_vic;
	(*victim_runs)++;
	return hog_tokens;
}

static void test_job_outgrows_the_cache(void **state)
{
	struct sm70t_raw hog, vic;
	struct sm70_proto_eqe fin;
	int n, runs = 0, jobs = -1, fr = -1, total = -2, n0, n_end;
	long max_ms = 0, t0;

	(void)state;
	n0 = sm70t_settled_fds(dmn.pid);
	assert_int_equal(sm70t_raw_connect(&hog, dmn.sock, 4096, 5000), 0);
	assert_int_equal(sm70t_raw_connect(&vic, dmn.sock, 0, 5000), 0);

	/* 5 + 1000 tokens in a 128-token cache, next to a victim */
	assert_int_equal(sm70t_raw_submit(&hog, 1, prompt, 5, 1000, SM70_PROTO_SQF_IGNORE_EOS), 0);
	sm70t_raw_publish(&hog);
	n = hog_with_victim(&hog, &vic, 1, &fin, &runs, &max_ms);
	printf("hog: 5-token prompt, 1000 new tokens asked, cache of %d tokens: %d TOKEN events, "
	       "then FINISH reason %u error %d (%s), completion_tokens %u\n", KV_TOKENS, n,
	       fin.u.finish.reason, fin.u.finish.error, sm70_proto_strerror(fin.u.finish.error),
	       fin.u.finish.completion_tokens);
	printf("victim: %d jobs of 5 + 8 tokens meanwhile, slowest %ld ms (bound %d ms)\n", runs,
	       max_ms, VICTIM_BOUND_MS);
	assert_int_equal(fin.type, SM70_PROTO_EV_FINISH);
	assert_int_equal(fin.u.finish.reason, SM70_PROTO_FINISH_ERROR);
	assert_int_equal(fin.u.finish.error, SM70_PROTO_E_NO_MEMORY);
	assert_int_equal(n, KV_TOKENS - 5 + 1);
	assert_int_equal(fin.u.finish.completion_tokens, n);
	assert_true(runs >= 1);
	assert_true(max_ms <= VICTIM_BOUND_MS);

	/* prompt + new tokens above the cache is accepted; the prompt alone must fit */
	assert_int_equal(sm70t_raw_submit(&hog, 2, prompt, 100, 100, SM70_PROTO_SQF_IGNORE_EOS), 0);
	sm70t_raw_publish(&hog);
	n = sm70t_raw_wait_final(&hog, 2, &fin, 10000);
	assert_int_equal(fin.type, SM70_PROTO_EV_FINISH);
	assert_int_equal(fin.u.finish.error, SM70_PROTO_E_NO_MEMORY);
	assert_int_equal(n, KV_TOKENS - 100 + 1);
	assert_int_equal(sm70t_raw_submit(&hog, 3, prompt, KV_TOKENS, 1, 0), 0);
	sm70t_raw_publish(&hog);
	assert_int_equal(sm70t_raw_wait_final(&hog, 3, &fin, 5000), 0);
	printf("100 + 100 tokens: accepted, E_NO_MEMORY after %d; a %d-token prompt: ERROR %s "
	       "\"%s\"\n", n, KV_TOKENS, sm70_proto_strerror(fin.u.error.error),
	       fin.u.error.message);
	assert_int_equal(fin.type, SM70_PROTO_EV_ERROR);
	assert_int_equal(fin.u.error.error, SM70_PROTO_E_NO_MEMORY);

	/* nothing left behind */
	t0 = sm70t_raw_ms();
	while ((sm70t_kv_status(&dmn, &jobs, &fr, &total) || jobs || fr != total) &&
	       sm70t_raw_ms() - t0 < 3000)
		usleep(50000);
	printf("sm70ctl status after: %d jobs, %d of %d KV blocks free\n", jobs, fr, total);
	assert_int_equal(jobs, 0);
	assert_int_equal(fr, total);
	assert_int_equal(total, KV_TOKENS / 16);
	sm70t_raw_close(&hog);
	sm70t_raw_close(&vic);
	n_end = sm70t_settled_fds(dmn.pid);
	printf("daemon descriptors: %d before, %d after\n", n0, n_end);
	assert_int_equal(n_end, n0);
}

static int setup(void **state)
{
	static const char cfg[] =
		"{ \"engine\": { \"n_threads\": 1, \"max_seqs\": 4, \"kv_bytes\": 262144 } }\n";

	(void)state;
	for (int i = 0; i < KV_TOKENS; i++)
		prompt[i] = (uint32_t)(7 * i + 3) % 500;
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
		cmocka_unit_test(test_job_outgrows_the_cache),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
