/*
 * test_batch_invariance - under engine.batch_invariant one sequence's tokens and logprobs
 * are bitwise the same whatever shares its steps.
 *
 * For a dense (qwen3), a hybrid (qwen3_5, DeltaNet layers), two MoE and two NVFP4 fixtures
 * (and, on the GPU, a larger dense model of dummy weights): one greedy target sequence
 * decoded alone, then again beside 1, 3, 7 and 15 other sequences of other lengths, some
 * admitted before it (its prompt is then cut into other chunks) and some while it decodes
 * (their prefill chunks share its decode steps). The step budget is small, so prompts are
 * split over several steps. Its tokens, logprobs and top-5 alternatives (the raw float
 * bits) must equal the alone run's with the switch on; the default path's differences are
 * printed, not asserted: they are what the switch buys. SM70_BACKEND=cuda runs it on the
 * GPU (tools/gpu-check.sh).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "daemon/engine/engine.h"

#define FIXTURES "tests/fixtures"
#define TARGET_PROMPT 41
#define TARGET_NEW 24
#define MAX_OTHERS 15
#define TOP 5

static const char *backend = "cpu";

/* What the target sequence produced, step by step. */
struct trace {
	int n;
	struct sm70_sample_result s[TARGET_NEW];
};

struct collect {
	uint64_t target;
	struct trace *t;
};

static void on_event(void *ctx, const struct sm70_event *ev)
{
	struct collect *c = ctx;

	if (ev->id != c->target || ev->sample.token < 0)
		return;
	assert_true(c->t->n < TARGET_NEW);
	c->t->s[c->t->n++] = ev->sample;
}

/* A deterministic prompt of n tokens in [1, vocab), different for each seed. */
static void make_prompt(int32_t *ids, int n, uint32_t seed, int vocab)
{
	uint64_t z = 0x9e3779b97f4a7c15ull * (seed + 1);

	for (int i = 0; i < n; i++) {
		z ^= z >> 31;
		z *= 0xbf58476d1ce4e5b9ull;
		z ^= z >> 29;
		ids[i] = 1 + (int32_t)(z % (uint64_t)(vocab - 1));
	}
}

static uint64_t submit(struct sm70_engine *e, uint32_t seed, int n_prompt, int n_new,
		       float temperature)
{
	int32_t ids[128];
	struct sm70_request r = {
		.prompt = ids, .n_prompt = n_prompt, .max_new_tokens = n_new,
		.sampling = { .temperature = temperature, .top_p = 1.0f, .top_logprobs = TOP,
			      .seed = seed },
		.ignore_eos = 1,
	};
	struct sm70_err err = { { 0 } };
	uint64_t id = 0;

	assert_true(n_prompt <= (int)(sizeof(ids) / sizeof(ids[0])));
	make_prompt(ids, n_prompt, seed, sm70_engine_model_config(e)->vocab_size);
	if (sm70_engine_submit(e, &r, &id, &err))
		fail_msg("submit: %s", err.msg);
	return id;
}

/*
 * Runs the target beside n_others other sequences: the even ones are queued before it,
 * the odd ones join while it runs (other i after step i + 1), so both its prompt's chunks
 * and its decodes share steps with other sequences' chunks and decodes.
 */
static void run(const char *dir, int dummy, int invariant, int n_others, struct trace *t)
{
	struct sm70_engine_opts eo;
	struct sm70_engine *e = NULL;
	struct sm70_err err = { { 0 } };
	struct collect c = { 0, t };
	int step = 0, joined = 0;

	sm70_engine_opts_default(&eo);
	eo.backend = backend;
	eo.n_threads = 2;
	eo.max_seqs = 16;
	eo.max_batch_tokens = 48;
	eo.batch_invariant = invariant;
	eo.dummy_weights = dummy;
	if (sm70_engine_open(&e, dir, &eo, &err))
		fail_msg("open %s: %s", dir, err.msg);
	memset(t, 0, sizeof(*t));
	for (int i = 0; i < n_others; i += 2)
		submit(e, 100 + (uint32_t)i, 3 + (i * 29) % 70, 4 + (i * 7) % 30, 0.7f);
	c.target = submit(e, 7, TARGET_PROMPT, TARGET_NEW, 0.0f);
	while (sm70_engine_busy(e) || joined < n_others / 2) {
		for (int i = 1; i < n_others; i += 2)
			if (step == i + 1) {
				submit(e, 100 + (uint32_t)i, 3 + (i * 29) % 70, 4 + (i * 7) % 30,
				       0.7f);
				joined++;
			}
		assert_true(sm70_engine_step(e, on_event, &c) >= 0);
		step++;
	}
	sm70_engine_close(e);
	assert_int_equal(t->n, TARGET_NEW);
}

/* The first step where b differs from a in any bit (token, logprob, the top list), or -1. */
static int first_difference(const struct trace *a, const struct trace *b)
{
	for (int i = 0; i < a->n; i++) {
		const struct sm70_sample_result *x = &a->s[i], *y = &b->s[i];

		if (x->token != y->token || memcmp(&x->logprob, &y->logprob, sizeof(float)) ||
		    x->n_top != y->n_top ||
		    memcmp(x->top_ids, y->top_ids, sizeof(int32_t) * (size_t)x->n_top) ||
		    memcmp(x->top_logprobs, y->top_logprobs, sizeof(float) * (size_t)x->n_top))
			return i;
	}
	return -1;
}

/* The model in dir (dummy: config.json only, dummy weights) under both paths. */
static void check_dir(const char *dir, const char *name, int dummy)
{
	static const int others[] = { 1, 3, 7, MAX_OTHERS };
	struct trace alone_bi, alone_def, t;
	int diffs = 0;

	run(dir, dummy, 1, 0, &alone_bi);
	run(dir, dummy, 0, 0, &alone_def);
	for (size_t k = 0; k < sizeof(others) / sizeof(others[0]); k++) {
		int d;

		run(dir, dummy, 1, others[k], &t);
		d = first_difference(&alone_bi, &t);
		if (d >= 0)
			fail_msg("%s, batch invariant, beside %d others: step %d differs (token %d "
				 "logprob %a, alone token %d logprob %a)", name, others[k], d,
				 t.s[d].token, t.s[d].logprob, alone_bi.s[d].token,
				 alone_bi.s[d].logprob);
		run(dir, dummy, 0, others[k], &t);
		d = first_difference(&alone_def, &t);
		if (d >= 0)
			diffs++;
		printf("%-26s beside %2d others: invariant path identical (%d tokens); default "
		       "path %s", name, others[k], TARGET_NEW, d < 0 ? "identical\n" : "differs");
		if (d >= 0)
			printf(" from step %d (logprob %a, alone %a)\n", d, t.s[d].logprob,
			       alone_def.s[d].logprob);
	}
	printf("%-26s default path differs in %d of 4 batchings; invariant vs default alone: "
	       "%s\n", name, diffs,
	       first_difference(&alone_bi, &alone_def) < 0 ? "identical" : "different bits");
}

static void check_model(const char *name)
{
	char dir[256];

	snprintf(dir, sizeof(dir), FIXTURES "/%s", name);
	check_dir(dir, name, 0);
}

/* NVFP4 weights: on the GPU the B1 dot kernel against WMMA, and the NVFP4 experts */
static void test_nvfp4(void **state)
{
	(void)state;
	check_model("qwen3-gqa2-d64-tied-nvfp4");
	check_model("qwen3_moe-e8k2-nvfp4");
}

/*
 * GPU only (too slow on the CPU): a dense model of dummy weights large enough for the
 * CUDA choices the fixtures' sizes never reach: 4-warp GEMV blocks (gate_up's 5120 rows
 * fill one wave of them), the sampler's blocks per row (a 32768 vocabulary is cut into
 * 16 parts at B1, 4 at B16).
 */
static const char large_config[] =
	"{\"architectures\": [\"Qwen3ForCausalLM\"], \"model_type\": \"qwen3\","
	" \"hidden_size\": 2048, \"intermediate_size\": 2560, \"num_hidden_layers\": 4,"
	" \"num_attention_heads\": 16, \"num_key_value_heads\": 4, \"head_dim\": 128,"
	" \"vocab_size\": 32768, \"max_position_embeddings\": 4096, \"rms_norm_eps\": 1e-06,"
	" \"rope_parameters\": {\"rope_theta\": 1000000.0, \"rope_type\": \"default\"},"
	" \"tie_word_embeddings\": false, \"hidden_act\": \"silu\", \"bos_token_id\": 0,"
	" \"eos_token_id\": 1, \"attention_bias\": false, \"dtype\": \"bfloat16\"}\n";

static void test_dense_large(void **state)
{
	char dir[] = "/tmp/sm70-bi-XXXXXX", path[64];
	FILE *f;

	(void)state;
	if (strcmp(backend, "cuda") != 0) {
		printf("dense-large: GPU only (SM70_BACKEND=cuda), skipped\n");
		return;
	}
	assert_non_null(mkdtemp(dir));
	snprintf(path, sizeof(path), "%s/config.json", dir);
	f = fopen(path, "w");
	assert_non_null(f);
	assert_true(fputs(large_config, f) >= 0);
	assert_int_equal(fclose(f), 0);
	check_dir(dir, "qwen3-dummy-2048", 1);
	unlink(path);
	rmdir(dir);
}

static void test_dense(void **state)
{
	(void)state;
	check_model("qwen3-gqa2-d64-tied");
}

static void test_hybrid(void **state)
{
	(void)state;
	check_model("qwen3_5-gqa6-d256-hybrid");
}

static void test_moe(void **state)
{
	(void)state;
	check_model("qwen3_moe-e8k2");
}

static void test_hybrid_moe(void **state)
{
	(void)state;
	check_model("qwen3_5_moe-e16k4-shared");
}

int main(void)
{
	const char *b = getenv("SM70_BACKEND");
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_dense),
		cmocka_unit_test(test_hybrid),
		cmocka_unit_test(test_moe),
		cmocka_unit_test(test_hybrid_moe),
		cmocka_unit_test(test_nvfp4),
		cmocka_unit_test(test_dense_large),
	};

	if (b && strcmp(b, "cuda") == 0)
		backend = "cuda";
	printf("backend %s: one target sequence alone and beside 1-15 others\n", backend);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
