/*
 * test_engine - scheduling behaviour of the engine on a real (tiny) model: preemption
 * under a starved KV pool gives the same tokens, seeded sampling does not depend on
 * batch composition, stop tokens / EOS / length finish correctly, cancellation frees
 * memory, bad requests are refused with a message, and dummy weights are deterministic.
 * Preemption and the prefix cache run on a hybrid (DeltaNet) model and on qwen4_exp too:
 * their state slots come back, recompute after preemption is exact, and prefix caching is
 * off for them. A
 * parked request (the daemon's fair admission) resumes with the same tokens. The prefix
 * cache is isolated by domain: one domain's prompt is a hit for it and not for another.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "daemon/engine/engine.h"

#define MODEL "tests/fixtures/qwen3-gqa2-d64-tied"
#define HYBRID "tests/fixtures/qwen3_5-gqa6-d256-hybrid"
/* hyper-connections, QSA (its selection past 16 tokens), PLE state and n-gram context */
#define QWEN4 "tests/fixtures/qwen4_exp-hc4-qsa-ple"
#define MAXR 8
#define MAXT 128

struct out {
	uint64_t ids[MAXR];
	int n_req;
	int n[MAXR];
	int32_t tok[MAXR][MAXT];
	enum sm70_finish finish[MAXR];
	int completion[MAXR];
	int cached[MAXR];
};

static void on_event(void *ctx, const struct sm70_event *ev)
{
	struct out *o = ctx;

	for (int i = 0; i < o->n_req; i++) {
		if (o->ids[i] != ev->id)
			continue;
		if (ev->sample.token >= 0 && o->n[i] < MAXT)
			o->tok[i][o->n[i]++] = ev->sample.token;
		if (ev->finish) {
			assert_int_equal(o->finish[i], SM70_FINISH_NONE); /* exactly one final */
			o->finish[i] = ev->finish;
			o->completion[i] = ev->completion_tokens;
			o->cached[i] = ev->cached_tokens;
		}
		return;
	}
	fail_msg("event for unknown request");
}

static const char *model_dir = MODEL;

static struct sm70_engine *open_engine(const struct sm70_engine_opts *eo)
{
	struct sm70_engine *e = NULL;
	struct sm70_err err = { { 0 } };

	if (sm70_engine_open(&e, model_dir, eo, &err))
		fail_msg("open %s: %s", model_dir, err.msg);
	return e;
}

static void submit(struct sm70_engine *e, struct out *o, const struct sm70_request *r)
{
	struct sm70_err err = { { 0 } };

	if (sm70_engine_submit(e, r, &o->ids[o->n_req], &err))
		fail_msg("submit: %s", err.msg);
	o->n_req++;
}

static void drain(struct sm70_engine *e, struct out *o)
{
	int guard = 0;

	while (sm70_engine_busy(e)) {
		assert_true(sm70_engine_step(e, on_event, o) >= 0);
		assert_true(++guard < 10000);
	}
}

static int32_t prompt_a[40], prompt_b[90];

static void make_prompts(void)
{
	for (int i = 0; i < 40; i++)
		prompt_a[i] = (i * 37 + 11) % 500;
	for (int i = 0; i < 90; i++)
		prompt_b[i] = (i * 53 + 7) % 500;
}

/* Two requests that together need more KV blocks than the pool has: the newer is
 * preempted and recomputed, and both still produce the tokens they produce alone. On the
 * hybrid model the recompute also rebuilds the recurrent state from position 0. */
static void preemption_same_tokens(const char *dir)
{
	struct sm70_engine_opts eo;
	struct sm70_request ra = { .prompt = prompt_a, .n_prompt = 40, .max_new_tokens = 60,
				   .ignore_eos = 1, .sampling = { .temperature = 0.9f,
				   .top_p = 0.9f, .seed = 5 } };
	struct sm70_request rb = ra;
	struct out alone = { 0 }, both = { 0 };
	struct sm70_engine *e;
	struct sm70_engine_stats st;

	model_dir = dir;
	make_prompts();
	rb.prompt = prompt_b;
	rb.n_prompt = 90;
	rb.sampling.seed = 6;
	sm70_engine_opts_default(&eo);
	eo.block_size = 8;
	eo.kv_blocks = 24; /* 192 tokens: a needs 100, b needs 150 */

	e = open_engine(&eo);
	submit(e, &alone, &ra);
	drain(e, &alone);
	submit(e, &alone, &rb);
	drain(e, &alone);
	sm70_engine_close(e);

	e = open_engine(&eo);
	submit(e, &both, &ra);
	submit(e, &both, &rb);
	drain(e, &both);
	sm70_engine_get_stats(e, &st);
	assert_int_equal(st.kv_blocks_free, st.kv_blocks_total);
	assert_int_equal(st.state_slots_free, st.state_slots_total);
	sm70_engine_close(e);

	printf("%s: preemptions: %llu; tokens a %d, b %d; state slots %d\n", dir,
	       (unsigned long long)st.preemptions, both.n[0], both.n[1], st.state_slots_total);
	assert_true(st.preemptions >= 1);
	for (int i = 0; i < 2; i++) {
		assert_int_equal(both.n[i], 60);
		assert_memory_equal(both.tok[i], alone.tok[i], sizeof(int32_t) * 60);
		assert_int_equal(both.finish[i], SM70_FINISH_LENGTH);
	}
	model_dir = MODEL;
}

static void test_preemption_same_tokens(void **state)
{
	preemption_same_tokens(MODEL);
}

static void test_preemption_hybrid(void **state)
{
	preemption_same_tokens(HYBRID);
}

static void test_preemption_qwen4(void **state)
{
	preemption_same_tokens(QWEN4);
}

/* Fewer recurrent-state slots than requests: admission waits for a slot, nothing is lost,
 * and every request produces the tokens it produces alone. */
static void test_state_slots_bound_admission(void **state)
{
	struct sm70_engine_opts eo;
	struct sm70_request r = { .prompt = prompt_a, .n_prompt = 40, .max_new_tokens = 12,
				  .ignore_eos = 1, .sampling = { .top_p = 1.0f } };
	struct out alone = { 0 }, many = { 0 };
	struct sm70_engine_stats st;
	struct sm70_engine *e;

	model_dir = HYBRID;
	make_prompts();
	sm70_engine_opts_default(&eo);
	e = open_engine(&eo);
	submit(e, &alone, &r);
	drain(e, &alone);
	sm70_engine_close(e);

	eo.state_slots = 2;
	e = open_engine(&eo);
	for (int i = 0; i < 5; i++)
		submit(e, &many, &r);
	sm70_engine_step(e, on_event, &many);
	sm70_engine_get_stats(e, &st);
	printf("5 requests, 2 state slots: %d running, %d waiting after one step\n", st.running,
	       st.waiting);
	assert_int_equal(st.running, 2);
	assert_int_equal(st.state_slots_free, 0);
	drain(e, &many);
	sm70_engine_get_stats(e, &st);
	assert_int_equal(st.state_slots_free, 2);
	sm70_engine_close(e);
	for (int i = 0; i < 5; i++) {
		assert_int_equal(many.n[i], 12);
		assert_memory_equal(many.tok[i], alone.tok[0], sizeof(int32_t) * 12);
	}
	model_dir = MODEL;
}

static void test_stop_and_length(void **state)
{
	struct sm70_engine_opts eo;
	struct sm70_request r = { .prompt = prompt_a, .n_prompt = 10, .max_new_tokens = 12,
				  .ignore_eos = 1, .sampling = { .top_p = 1.0f } };
	struct out o = { 0 }, o2 = { 0 };
	struct sm70_engine *e;

	make_prompts();
	sm70_engine_opts_default(&eo);
	e = open_engine(&eo);
	submit(e, &o, &r);
	drain(e, &o);
	assert_int_equal(o.n[0], 12);
	assert_int_equal(o.finish[0], SM70_FINISH_LENGTH);
	assert_int_equal(o.completion[0], 12);

	/* The 5th greedy token as a stop token ends the request there, included. */
	r.n_stop = 1;
	r.stop_ids[0] = o.tok[0][4];
	int first = 0;
	while (o.tok[0][first] != r.stop_ids[0])
		first++;
	submit(e, &o2, &r);
	drain(e, &o2);
	printf("stop token %d first generated at step %d; stopped after %d tokens\n",
	       r.stop_ids[0], first, o2.n[0]);
	assert_int_equal(o2.n[0], first + 1);
	assert_int_equal(o2.finish[0], SM70_FINISH_STOP);
	sm70_engine_close(e);
}

static void test_cancel_frees_blocks(void **state)
{
	struct sm70_engine_opts eo;
	struct sm70_request r = { .prompt = prompt_b, .n_prompt = 90, .max_new_tokens = 100,
				  .ignore_eos = 1, .sampling = { .top_p = 1.0f } };
	struct out o = { 0 };
	struct sm70_engine *e;
	struct sm70_engine_stats st;

	make_prompts();
	sm70_engine_opts_default(&eo);
	e = open_engine(&eo);
	submit(e, &o, &r);
	submit(e, &o, &r);
	for (int i = 0; i < 3; i++)
		assert_true(sm70_engine_step(e, on_event, &o) >= 0);
	sm70_engine_get_stats(e, &st);
	assert_true(st.kv_blocks_free < st.kv_blocks_total);
	assert_int_equal(sm70_engine_cancel(e, o.ids[0]), 0);
	assert_int_equal(sm70_engine_cancel(e, o.ids[1]), 0);
	assert_int_equal(sm70_engine_cancel(e, 999999), -ENOENT);
	assert_true(sm70_engine_step(e, on_event, &o) >= 2);
	sm70_engine_get_stats(e, &st);
	assert_int_equal(st.kv_blocks_free, st.kv_blocks_total);
	assert_int_equal(o.finish[0], SM70_FINISH_CANCELLED);
	assert_int_equal(o.finish[1], SM70_FINISH_CANCELLED);
	assert_false(sm70_engine_busy(e));
	printf("cancelled after %d and %d tokens; all %d blocks free\n", o.n[0], o.n[1],
	       st.kv_blocks_total);
	sm70_engine_close(e);
}

static void expect_refused(struct sm70_engine *e, const struct sm70_request *r, int code,
			   const char *needle)
{
	struct sm70_err err = { { 0 } };
	uint64_t id;

	assert_int_equal(sm70_engine_submit(e, r, &id, &err), code);
	printf("refused: %s\n", err.msg);
	assert_non_null(strstr(err.msg, needle));
}

static void test_bad_requests(void **state)
{
	struct sm70_engine_opts eo;
	int32_t bad[2] = { 3, 512 };
	int32_t *huge = calloc(5000, sizeof(int32_t));
	struct sm70_request ok = { .prompt = bad, .n_prompt = 1, .max_new_tokens = 4,
				   .sampling = { .top_p = 1.0f } };
	struct sm70_request r;
	struct sm70_engine *e;

	sm70_engine_opts_default(&eo);
	e = open_engine(&eo);
	r = ok; r.n_prompt = 2;
	expect_refused(e, &r, -EINVAL, "outside the vocabulary");
	r = ok; r.n_prompt = 0;
	expect_refused(e, &r, -EINVAL, "empty");
	r = ok; r.max_new_tokens = 0;
	expect_refused(e, &r, -EINVAL, "max_new_tokens");
	r = ok; r.sampling.top_p = 0;
	expect_refused(e, &r, -EINVAL, "sampling");
	r = ok; r.sampling.temperature = -1;
	expect_refused(e, &r, -EINVAL, "sampling");
	r = ok; r.prompt = huge; r.n_prompt = 5000;
	expect_refused(e, &r, -E2BIG, "context");
	r = ok; r.n_stop = 9;
	expect_refused(e, &r, -EINVAL, "stop tokens");
	assert_false(sm70_engine_busy(e));
	sm70_engine_close(e);
	free(huge);
}

/* Dummy weights: same seed, same tokens; another seed, other tokens. */
static void test_dummy_deterministic(void **state)
{
	struct sm70_engine_opts eo;
	struct sm70_request r = { .prompt = prompt_a, .n_prompt = 8, .max_new_tokens = 8,
				  .ignore_eos = 1, .sampling = { .top_p = 1.0f } };
	struct out o[3];

	memset(o, 0, sizeof(o));

	make_prompts();
	sm70_engine_opts_default(&eo);
	eo.dummy_weights = 1;
	for (int i = 0; i < 3; i++) {
		eo.dummy_seed = i == 2 ? 99 : 1;
		struct sm70_engine *e = open_engine(&eo);
		submit(e, &o[i], &r);
		drain(e, &o[i]);
		sm70_engine_close(e);
	}
	assert_memory_equal(o[0].tok[0], o[1].tok[0], sizeof(int32_t) * 8);
	assert_memory_not_equal(o[0].tok[0], o[2].tok[0], sizeof(int32_t) * 8);
	printf("dummy seed 1 twice: same 8 tokens; seed 99: different\n");
}

/* A repeated long prompt takes its KV blocks from the prefix cache, computes only the
 * rest, and produces the same tokens; with the cache off nothing is reused. A hybrid
 * model keeps the cache off (its DeltaNet state at the prefix is not kept) and says why. */
static void prefix_cache(const char *dir)
{
	struct sm70_engine_opts eo;
	struct sm70_request r = { .prompt = prompt_b, .n_prompt = 90, .max_new_tokens = 10,
				  .ignore_eos = 1, .sampling = { .top_p = 1.0f } };
	struct sm70_engine_stats st0, st1;
	struct out o = { 0 };
	struct sm70_engine *e;

	model_dir = dir;
	make_prompts();
	for (int off = 0; off < 2; off++) {
		int hybrid = dir != (const char *)MODEL;

		sm70_engine_opts_default(&eo);
		eo.block_size = 16;
		eo.no_prefix_cache = off;
		e = open_engine(&eo);
		memset(&o, 0, sizeof(o));
		submit(e, &o, &r);
		drain(e, &o);
		sm70_engine_get_stats(e, &st0);
		submit(e, &o, &r);
		drain(e, &o);
		sm70_engine_get_stats(e, &st1);
		sm70_engine_close(e);

		uint64_t second = st1.computed_tokens - st0.computed_tokens;
		printf("prefix cache %s: first run computed %llu tokens, repeat computed %llu, "
		       "hit tokens %llu\n", off ? "off" : "on",
		       (unsigned long long)st0.computed_tokens, (unsigned long long)second,
		       (unsigned long long)(st1.prefix_hit_tokens - st0.prefix_hit_tokens));
		assert_memory_equal(o.tok[0], o.tok[1], sizeof(int32_t) * 10);
		if (hybrid) {
			printf("  %s: prefix cache off: %s\n", dir,
			       st1.prefix_cache_off ? st1.prefix_cache_off : "(no reason)");
			assert_non_null(st1.prefix_cache_off);
			assert_int_equal(st1.prefix_hit_tokens, 0);
			assert_int_equal(second, st0.computed_tokens);
		} else if (off) {
			assert_int_equal(st1.prefix_hit_tokens, 0);
			assert_int_equal(second, st0.computed_tokens);
		} else {
			/* 90-token prompt: 5 full blocks (80 tokens) of 16 before the last token */
			assert_int_equal(st1.prefix_hit_tokens - st0.prefix_hit_tokens, 80);
			assert_int_equal(second, st0.computed_tokens - 80);
		}
	}
	model_dir = MODEL;
}

static void test_prefix_cache(void **state)
{
	prefix_cache(MODEL);
}

static void test_prefix_cache_hybrid(void **state)
{
	prefix_cache(HYBRID);
}

static void test_prefix_cache_qwen4(void **state)
{
	prefix_cache(QWEN4);
}

/* Domains: A's prompt, then B's same prompt (another domain), then A's again, then B's
 * again: B's first is a miss (nothing computed less, cached_tokens 0), the repeats hit
 * their own domain's blocks; in one domain (the shared scope) B's first is a hit. Every
 * run gives the tokens of a cold run with the cache off. */
static void test_prefix_cache_domains(void **state)
{
	struct sm70_engine_opts eo;
	struct sm70_request r = { .prompt = prompt_b, .n_prompt = 90, .max_new_tokens = 10,
				  .ignore_eos = 1, .sampling = { .top_p = 1.0f } };
	const uint64_t doms[2][4] = { { 1, 2, 1, 2 }, { 7, 7, 7, 7 } };
	const int want[2][4] = { { 0, 0, 80, 80 }, { 0, 80, 80, 80 } };
	struct out cold = { 0 };
	struct sm70_engine *e;

	make_prompts();
	sm70_engine_opts_default(&eo);
	eo.block_size = 16;
	eo.no_prefix_cache = 1;
	e = open_engine(&eo);
	submit(e, &cold, &r);
	drain(e, &cold);
	sm70_engine_close(e);
	eo.no_prefix_cache = 0;
	for (int shared = 0; shared < 2; shared++) {
		struct out o = { 0 };
		struct sm70_engine_stats st0, st1;

		e = open_engine(&eo);
		for (int i = 0; i < 4; i++) {
			r.cache_domain = doms[shared][i];
			sm70_engine_get_stats(e, &st0);
			submit(e, &o, &r);
			drain(e, &o);
			sm70_engine_get_stats(e, &st1);
			printf("%s: run %d in domain %llu: cached_tokens %d, computed %llu, "
			       "hit tokens %llu\n", shared ? "shared" : "isolated", i,
			       (unsigned long long)doms[shared][i], o.cached[i],
			       (unsigned long long)(st1.computed_tokens - st0.computed_tokens),
			       (unsigned long long)(st1.prefix_hit_tokens - st0.prefix_hit_tokens));
			assert_int_equal(o.cached[i], want[shared][i]);
			assert_int_equal(st1.prefix_hit_tokens - st0.prefix_hit_tokens,
					 want[shared][i]);
			assert_int_equal(st1.computed_tokens - st0.computed_tokens,
					 cold.n[0] - 1 + 90 - want[shared][i]);
			assert_int_equal(o.n[i], cold.n[0]);
			assert_memory_equal(o.tok[i], cold.tok[0], sizeof(int32_t) * 10);
		}
		assert_int_equal(st1.prefix_key_mismatches, 0);
		sm70_engine_close(e);
	}
	printf("domains: A's prompt hits for A and not for B; one domain shares; tokens equal "
	       "the cold run's\n");
}

/* A request that outgrows the whole KV cache ends with NO_MEMORY once the cache is full,
 * having produced every token that fit; the engine is left idle with all blocks free. */
static void test_outgrows_cache(void **state)
{
	struct sm70_engine_opts eo;
	struct sm70_request r = { .prompt = prompt_a, .n_prompt = 10, .max_new_tokens = 100,
				  .ignore_eos = 1, .sampling = { .top_p = 1.0f } };
	struct out o = { 0 };
	struct sm70_engine_stats st;
	struct sm70_engine *e;

	make_prompts();
	sm70_engine_opts_default(&eo);
	eo.block_size = 8;
	eo.kv_blocks = 4; /* 32 tokens */
	e = open_engine(&eo);
	submit(e, &o, &r);
	drain(e, &o);
	sm70_engine_get_stats(e, &st);
	sm70_engine_close(e);
	printf("10-token prompt, cache of 32 tokens: %d tokens, finish %d\n", o.n[0],
	       o.finish[0]);
	assert_int_equal(o.finish[0], SM70_FINISH_NO_MEMORY);
	assert_int_equal(o.n[0], 32 - 10 + 1); /* the last one needs no KV slot of its own */
	assert_int_equal(st.kv_blocks_free, st.kv_blocks_total);
}

/* A request parked mid-decode (and one parked while still waiting) produce nothing while
 * parked, leave their KV blocks free, and once unparked (one at the head of the queue) go
 * on with exactly the tokens they produce undisturbed; a parked request can be cancelled. */
static void test_park_unpark(void **state)
{
	struct sm70_engine_opts eo;
	struct sm70_request ra = { .prompt = prompt_a, .n_prompt = 40, .max_new_tokens = 30,
				   .ignore_eos = 1, .sampling = { .temperature = 0.9f,
				   .top_p = 0.9f, .seed = 5 } };
	struct sm70_request rb = ra, rc = ra;
	struct out alone = { 0 }, run = { 0 };
	struct sm70_engine_stats st;
	struct sm70_engine *e;
	int before;

	model_dir = MODEL;
	make_prompts();
	rb.prompt = prompt_b;
	rb.n_prompt = 90;
	rb.sampling.seed = 6;
	sm70_engine_opts_default(&eo);
	eo.no_prefix_cache = 1;
	e = open_engine(&eo);
	submit(e, &alone, &ra);
	submit(e, &alone, &rb);
	drain(e, &alone);

	submit(e, &run, &ra);
	submit(e, &run, &rb);
	submit(e, &run, &rc);
	assert_int_equal(sm70_engine_park(e, run.ids[2]), 0); /* parked while waiting */
	for (int i = 0; i < 5; i++)
		assert_true(sm70_engine_step(e, on_event, &run) >= 0);
	assert_true(sm70_engine_is_running(e, run.ids[0]));
	assert_int_equal(sm70_engine_park(e, run.ids[0]), 0); /* parked mid-decode */
	assert_int_equal(sm70_engine_park(e, run.ids[0]), -ENOENT);
	assert_false(sm70_engine_is_running(e, run.ids[0]));
	sm70_engine_get_stats(e, &st);
	assert_int_equal(st.parked, 2);
	assert_int_equal(st.running, 1);
	before = run.n[0];
	while (sm70_engine_busy(e))
		assert_true(sm70_engine_step(e, on_event, &run) >= 0);
	assert_int_equal(run.n[0], before); /* nothing while parked */
	assert_int_equal(run.finish[1], SM70_FINISH_LENGTH);
	sm70_engine_get_stats(e, &st);
	assert_int_equal(st.kv_blocks_free, st.kv_blocks_total);
	assert_int_equal(sm70_engine_unpark(e, run.ids[0], 1), 0);
	assert_int_equal(sm70_engine_unpark(e, run.ids[0], 1), -ENOENT);
	assert_int_equal(sm70_engine_cancel(e, run.ids[2]), 0);
	drain(e, &run);
	printf("park/unpark: request parked after %d tokens resumed to %d, equal to its "
	       "undisturbed run; a parked one cancelled\n", before, run.n[0]);
	assert_int_equal(run.finish[0], SM70_FINISH_LENGTH);
	assert_int_equal(run.n[0], alone.n[0]);
	assert_memory_equal(run.tok[0], alone.tok[0], sizeof(int32_t) * (size_t)alone.n[0]);
	assert_memory_equal(run.tok[1], alone.tok[1], sizeof(int32_t) * (size_t)alone.n[1]);
	assert_int_equal(run.finish[2], SM70_FINISH_CANCELLED);
	assert_int_equal(run.n[2], 0);
	sm70_engine_get_stats(e, &st);
	assert_int_equal(st.parked, 0);
	assert_int_equal(st.kv_blocks_free, st.kv_blocks_total);
	sm70_engine_close(e);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_park_unpark),
		cmocka_unit_test(test_preemption_same_tokens),
		cmocka_unit_test(test_preemption_hybrid),
		cmocka_unit_test(test_preemption_qwen4),
		cmocka_unit_test(test_state_slots_bound_admission),
		cmocka_unit_test(test_prefix_cache_hybrid),
		cmocka_unit_test(test_prefix_cache_qwen4),
		cmocka_unit_test(test_stop_and_length),
		cmocka_unit_test(test_cancel_frees_blocks),
		cmocka_unit_test(test_bad_requests),
		cmocka_unit_test(test_dummy_deterministic),
		cmocka_unit_test(test_prefix_cache),
		cmocka_unit_test(test_prefix_cache_domains),
		cmocka_unit_test(test_outgrows_cache),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
