/*
 * test_engine_stats - sm70_engine_get_stats reads host counters only: on a MoE model
 * (whose expert counts live on the device) a stats call after a step makes no download
 * and no sync, yet reports the experts that step read; the prefix-cache counters count
 * lookups, hits, blocks and tokens at admission.
 *
 * It includes engine.c to reach the backends behind the engine and put a counting op
 * table in front of them (the linker then takes the engine from this object, not from
 * the library).
 */
#include "daemon/engine/engine.c"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#define MOE "tests/fixtures/qwen3_moe-e8k2"
#define DENSE "tests/fixtures/qwen3-gqa2-d64-tied"

static int n_device_calls;
static const struct sm70_backend_ops *real_ops;

static int counting_download(struct sm70_backend *be, void *dst, const void *src,
			     size_t bytes)
{
	n_device_calls++;
	return real_ops->download(be, dst, src, bytes);
}

static int counting_sync(struct sm70_backend *be)
{
	n_device_calls++;
	return real_ops->sync(be);
}

static void ignore(void *ctx, const struct sm70_event *ev)
{
	(void)ctx;
	(void)ev;
}

static struct sm70_engine *open_engine(const char *dir, int prefix_cache)
{
	struct sm70_engine_opts eo;
	struct sm70_engine *e = NULL;
	struct sm70_err err = { { 0 } };

	sm70_engine_opts_default(&eo);
	eo.backend = "cpu";
	eo.n_threads = 1;
	eo.no_prefix_cache = !prefix_cache;
	if (sm70_engine_open(&e, dir, &eo, &err))
		fail_msg("open %s: %s", dir, err.msg);
	return e;
}

static void submit(struct sm70_engine *e, const int32_t *prompt, int n, int max_new)
{
	struct sm70_request r = { .prompt = prompt, .n_prompt = n, .max_new_tokens = max_new,
				  .ignore_eos = 1, .sampling = { .top_p = 1.0f } };
	struct sm70_err err = { { 0 } };
	uint64_t id;

	assert_int_equal(sm70_engine_submit(e, &r, &id, &err), 0);
}

static void test_stats_never_touch_the_device(void **state)
{
	struct sm70_engine *e = open_engine(MOE, 0);
	struct sm70_backend_ops counting;
	struct sm70_engine_stats st, st2;
	int32_t prompt[12];
	size_t expected;

	for (int i = 0; i < 12; i++)
		prompt[i] = 3 + 7 * i;
	submit(e, prompt, 12, 4);
	assert_true(sm70_engine_step(e, ignore, NULL) > 0); /* the prefill and a token */
	assert_true(sm70_engine_step(e, ignore, NULL) > 0); /* a decode step */

	/* every rank's backend behind the counting table */
	real_ops = e->model->rank[0].be->ops;
	counting = *real_ops;
	counting.download = counting_download;
	counting.sync = counting_sync;
	for (int r = 0; r < e->model->tp; r++)
		e->model->rank[r].be->ops = &counting;
	n_device_calls = 0;
	for (int i = 0; i < 100; i++)
		sm70_engine_get_stats(e, i ? &st2 : &st);
	printf("100 stats calls after a MoE decode step: %d device calls; expert_bytes %llu\n",
	       n_device_calls, (unsigned long long)st.expert_bytes);
	assert_int_equal(n_device_calls, 0);
	assert_true(st.expert_bytes == st2.expert_bytes);

	/* and the value is the one the device holds for that step */
	for (int r = 0; r < e->model->tp; r++)
		e->model->rank[r].be->ops = real_ops;
	expected = sm70_model_expert_bytes(e->model);
	printf("expert bytes: stats %llu, read from the device now %zu\n",
	       (unsigned long long)st.expert_bytes, expected);
	assert_true(expected > 0);
	assert_true(st.expert_bytes == expected);
	while (sm70_engine_busy(e))
		assert_true(sm70_engine_step(e, ignore, NULL) >= 0);
	sm70_engine_close(e);
}

static void test_prefix_counters(void **state)
{
	struct sm70_engine *e = open_engine(DENSE, 1);
	struct sm70_engine_stats st;
	int32_t prompt[40];
	int bs;

	for (int i = 0; i < 40; i++)
		prompt[i] = 5 + 3 * i;
	bs = e->bs;
	/* the first run publishes its full blocks; the second finds them */
	submit(e, prompt, 40, 2);
	while (sm70_engine_busy(e))
		assert_true(sm70_engine_step(e, ignore, NULL) >= 0);
	sm70_engine_get_stats(e, &st);
	assert_int_equal(st.prefix_queries, 1);
	assert_int_equal(st.prefix_query_tokens, 40);
	assert_int_equal(st.prefix_hits, 0);
	assert_int_equal(st.prefix_hit_blocks, 0);
	assert_int_equal(st.prefix_hit_tokens, 0);

	submit(e, prompt, 40, 2);
	while (sm70_engine_busy(e))
		assert_true(sm70_engine_step(e, ignore, NULL) >= 0);
	sm70_engine_get_stats(e, &st);
	printf("prefix cache: %llu queries of %llu tokens, %llu hits, %llu blocks, %llu tokens "
	       "(block size %d)\n", (unsigned long long)st.prefix_queries,
	       (unsigned long long)st.prefix_query_tokens, (unsigned long long)st.prefix_hits,
	       (unsigned long long)st.prefix_hit_blocks,
	       (unsigned long long)st.prefix_hit_tokens, bs);
	assert_int_equal(st.prefix_queries, 2);
	assert_int_equal(st.prefix_query_tokens, 80);
	assert_int_equal(st.prefix_hits, 1);
	/* blocks that end before the last prompt token */
	assert_int_equal(st.prefix_hit_blocks, (40 - 1) / bs);
	assert_int_equal(st.prefix_hit_tokens, (uint64_t)((40 - 1) / bs * bs));
	sm70_engine_close(e);

	/* off: nothing is looked up, nothing counted */
	e = open_engine(DENSE, 0);
	submit(e, prompt, 40, 2);
	while (sm70_engine_busy(e))
		assert_true(sm70_engine_step(e, ignore, NULL) >= 0);
	sm70_engine_get_stats(e, &st);
	assert_int_equal(st.prefix_queries, 0);
	assert_int_equal(st.prefix_query_tokens, 0);
	sm70_engine_close(e);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_stats_never_touch_the_device),
		cmocka_unit_test(test_prefix_counters),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
