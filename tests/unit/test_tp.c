/*
 * test_tp - a model split over 2, 3 or 4 tensor-parallel ranks gives what one rank gives,
 * on every committed fixture: greedy tokens and logprobs, and seeded sampling (top-k,
 * top-p alone, plain), all cases batched together with chunked prefill.
 *
 * CPU backend (the default): the ranks are simulated in one process by one backend, so
 * the sharded weights, the all-reduces and the sampling across vocabulary slices run in
 * CI. Tokens must be equal at every step whose one-rank top-1/top-2 margin exceeds 1e-4
 * and logprobs agree within 1e-4 (fp32 sums in another order).
 * SM70_BACKEND=cuda (tools/gpu-check.sh, on a machine with SM70_TP_MAX GPUs): the margin
 * is 0.05 and logprobs agree within 2e-2 (fp16 activations, reduced in another order).
 * A split the model cannot take (heads not divisible) must be refused with a message.
 */
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "daemon/engine/engine.h"
#include "tests/unit/fixture_cases.h"
#include "daemon/engine/sampler.h"

#define FIXTURES "tests/fixtures"
#define MAX_CASES 8
#define MAX_STEPS 64

static const char *backend = "cpu";
static int tp_max = 4;
static double margin_min = 1e-4, lp_tol = 1e-4;
static int gpu;

/* The sampling settings each case runs with: greedy, then seeded ones. On the CPU the
 * ranks' logits equal one rank's to fp32 rounding, so every sampled token must be equal,
 * top-p alone and plain sampling included. On a GPU fp16 reductions in another order move
 * the logits by about 1e-3, so a draw that lands that close to a boundary of the
 * cumulative distribution may pick the neighbour: there the settings keep top-k <= 20,
 * whose whole distribution the 20 reported logprobs give, and a differing token must be
 * what each run's own distribution gives for the draw (see boundary_case). */
static const struct sm70_sampling cpu_settings[] = {
	{ .temperature = 0.0f, .top_p = 1.0f, .top_logprobs = 2 },
	{ .temperature = 0.8f, .top_k = 20, .top_p = 0.95f, .seed = 11, .top_logprobs = 2 },
	{ .temperature = 0.7f, .top_p = 0.9f, .seed = 12, .top_logprobs = 2 },
	{ .temperature = 1.0f, .top_p = 1.0f, .seed = 13, .top_logprobs = 2 },
};
static const struct sm70_sampling gpu_settings[] = {
	{ .temperature = 0.0f, .top_p = 1.0f, .top_logprobs = 2 },
	{ .temperature = 0.8f, .top_k = 20, .top_p = 0.95f, .seed = 11, .top_logprobs = 20 },
	{ .temperature = 1.0f, .top_k = 10, .top_p = 1.0f, .seed = 12, .top_logprobs = 20 },
	{ .temperature = 0.6f, .top_k = 20, .top_p = 0.8f, .seed = 13, .top_logprobs = 20 },
};
#define N_SETTINGS 4
static const struct sm70_sampling *settings = cpu_settings;

struct got {
	int n;
	struct sm70_sample_result s[MAX_STEPS];
};

struct run {
	uint64_t ids[MAX_CASES * N_SETTINGS];
	struct got got[MAX_CASES * N_SETTINGS];
	int n;
	struct sm70_engine_stats stats;
};

static void on_event(void *ctx, const struct sm70_event *ev)
{
	struct run *r = ctx;

	for (int i = 0; i < r->n; i++) {
		if (r->ids[i] != ev->id)
			continue;
		if (ev->sample.token >= 0 && r->got[i].n < MAX_STEPS)
			r->got[i].s[r->got[i].n++] = ev->sample;
		return;
	}
	fail_msg("event for unknown request %llu", (unsigned long long)ev->id);
}

/* Runs every case under every setting in one engine of tp ranks. Returns 0, or the open
 * error (message in err). */
static int run_all(const char *dir, json_t *cases, int tp, struct run *r, struct sm70_err *err)
{
	struct sm70_engine_opts eo;
	struct sm70_engine *e = NULL;
	int ret;

	sm70_engine_opts_default(&eo);
	eo.backend = backend;
	eo.tp = tp;
	eo.max_batch_tokens = 64; /* long prompts take several chunked steps */
	eo.n_threads = 2;
	ret = sm70_engine_open(&e, dir, &eo, err);
	if (ret)
		return ret;
	memset(r, 0, sizeof(*r));
	for (size_t c = 0; c < json_array_size(cases) && c < MAX_CASES; c++) {
		json_t *cs = json_array_get(cases, c), *prompt = json_object_get(cs, "prompt");
		int n = (int)json_array_size(prompt);
		int32_t *ids = malloc(sizeof(int32_t) * (size_t)n);

		assert_non_null(ids);
		for (int k = 0; k < n; k++)
			ids[k] = (int32_t)json_integer_value(json_array_get(prompt, (size_t)k));
		for (int s = 0; s < N_SETTINGS; s++) {
			struct sm70_request q = {
				.prompt = ids, .n_prompt = n, .ignore_eos = 1,
				.max_new_tokens = (int)json_integer_value(
					json_object_get(cs, "max_new_tokens")),
				.sampling = settings[s],
			};
			assert_int_equal(sm70_engine_submit(e, &q, &r->ids[r->n], err), 0);
			r->n++;
		}
		free(ids);
	}
	while (sm70_engine_busy(e))
		assert_true(sm70_engine_step(e, on_event, r) >= 0);
	sm70_engine_get_stats(e, &r->stats);
	sm70_engine_close(e);
	return 0;
}

/*
 * The token the n-th draw of p picks from the distribution that r's top logprobs give
 * (p has top_k <= r->n_top, so they hold every candidate), by the sampling semantics of
 * common/sampling.h; -1 if r cannot say.
 */
static int32_t inverse_cdf(const struct sm70_sample_result *r, const struct sm70_sampling *p,
			   uint64_t n)
{
	double w[SM70_MAX_TOP_LOGPROBS], z = 0.0, acc = 0.0, target;
	int k = p->top_k, kept;

	if (k < 1 || k > r->n_top)
		return -1;
	for (int j = 0; j < k; j++) {
		w[j] = exp(((double)r->top_logprobs[j] - r->top_logprobs[0]) / p->temperature);
		z += w[j];
	}
	kept = k;
	if (p->top_p < 1.0f) {
		for (int j = 0; j < k; j++) {
			acc += w[j];
			if (acc >= p->top_p * z) {
				kept = j + 1;
				break;
			}
		}
		z = acc;
	}
	target = sm70_sample_uniform(p->seed, n) * z;
	acc = 0.0;
	for (int j = 0; j < kept; j++) {
		acc += w[j];
		if (acc >= target)
			return r->top_ids[j];
	}
	return r->top_ids[kept - 1];
}

/* A sampled step where two runs picked different tokens is acceptable on a GPU when each
 * token is what its own run's distribution gives for the same draw (the runs then differ
 * only in their logits, by fp16 rounding, near a boundary). */
static int boundary_case(const struct sm70_sample_result *a, const struct sm70_sample_result *b,
			 const struct sm70_sampling *p, uint64_t n)
{
	return inverse_cdf(a, p, n) == a->token && inverse_cdf(b, p, n) == b->token;
}

/* Compares request i of a tp run with the one-rank run; returns the worst logprob
 * difference over the steps compared. */
static double compare(const char *name, int tp, int i, const struct got *one,
		      const struct got *many)
{
	int setting = i % N_SETTINGS;
	double worst = 0.0;

	assert_int_equal(one->n, many->n);
	for (int k = 0; k < one->n; k++) {
		const struct sm70_sample_result *a = &one->s[k], *b = &many->s[k];
		double margin = a->top_logprobs[0] - a->top_logprobs[1];
		double d = fabs((double)a->logprob - b->logprob);

		/* where the top logprobs hold the whole distribution, the split run's token is
		 * the inverse CDF of the draw over its own distribution */
		if (setting > 0 && inverse_cdf(b, &settings[setting], (uint64_t)k) >= 0)
			assert_int_equal(inverse_cdf(b, &settings[setting], (uint64_t)k),
					 b->token);
		if (a->token != b->token) {
			/* greedy near a tie may flip under other rounding; then the texts part */
			if (setting == 0 && margin <= margin_min) {
				printf("%s tp %d request %d: parts at step %d, margin %.2e: compared "
				       "up to there\n", name, tp, i, k, margin);
				return worst;
			}
			/* two tokens of the same probability (to fp32 rounding) trade places in
			 * the sorted distribution the draw walks: a near-tie, not a split error */
			if (setting > 0 && fabs((double)a->logprob - b->logprob) <= 1e-5) {
				printf("%s tp %d request %d (setting %d): parts at step %d between %d "
				       "and %d, near-tied (logprobs %.7f, %.7f): compared up to there\n",
				       name, tp, i, setting, k, a->token, b->token, a->logprob,
				       b->logprob);
				return worst;
			}
			if (setting > 0 && gpu && boundary_case(a, b, &settings[setting],
								(uint64_t)k)) {
				printf("%s tp %d request %d (setting %d): parts at step %d, where "
				       "the draw falls between %d and %d, each its run's inverse CDF: "
				       "compared up to there\n", name, tp, i, setting, k, a->token,
				       b->token);
				return worst;
			}
			fail_msg("%s tp %d request %d (setting %d) step %d: token %d, one rank %d "
				 "(margin %.4f)", name, tp, i, setting, k, b->token, a->token, margin);
		}
		if (d > worst)
			worst = d;
		if (d > lp_tol)
			fail_msg("%s tp %d request %d step %d: logprob %.6f, one rank %.6f", name, tp,
				 i, k, b->logprob, a->logprob);
	}
	return worst;
}

static void fixture(const char *dir, const char *name)
{
	char path[640];
	json_error_t je;
	json_t *ref, *cases;
	struct run *one = calloc(1, sizeof(*one)), *many = calloc(1, sizeof(*many));
	struct sm70_err err = { { 0 } };

	assert_non_null(one);
	assert_non_null(many);
	snprintf(path, sizeof(path), "%s/reference.json", dir);
	ref = json_load_file(path, 0, &je);
	if (!ref)
		fail_msg("%s: %s", path, je.text);
	cases = sm70t_fixture_cases(ref);
	if (run_all(dir, cases, 1, one, &err))
		fail_msg("%s tp 1: %s", name, err.msg);
	for (int tp = 2; tp <= tp_max; tp++) {
		double worst = 0.0;
		int ret;

		sm70_err_clear(&err);
		ret = run_all(dir, cases, tp, many, &err);
		if (ret) {
			/* only a split the shapes cannot take may be refused, and it must say so */
			if (!strstr(err.msg, "tensor parallelism"))
				fail_msg("%s tp %d: %s", name, tp, err.msg);
			printf("%-24s tp %d refused as it should be: %s\n", name, tp, err.msg);
			continue;
		}
		assert_int_equal(many->stats.tp, tp);
		assert_int_equal(many->n, one->n);
		for (int i = 0; i < one->n; i++) {
			double w = compare(name, tp, i, &one->got[i], &many->got[i]);
			worst = w > worst ? w : worst;
		}
		printf("%-24s tp %d: %d requests (%d settings) equal to one rank, worst logprob "
		       "diff %.2e, %llu rows sampled from the gathered row\n", name, tp, many->n,
		       N_SETTINGS, worst, (unsigned long long)many->stats.shard_fallbacks);
	}
	json_decref(ref);
	free(one);
	free(many);
}

static void test_fixtures_tp(void **state)
{
	DIR *d = opendir(FIXTURES);
	struct dirent *de;
	int n = 0;

	(void)state;
	assert_non_null(d);
	while ((de = readdir(d))) {
		char dir[512];
		if (strncmp(de->d_name, "qwen", 4) != 0)
			continue;
		snprintf(dir, sizeof(dir), FIXTURES "/%s", de->d_name);
		fixture(dir, de->d_name);
		n++;
	}
	closedir(d);
	assert_true(n >= 3);
}

/* Bad requests for ranks are refused with a message, before anything is loaded. */
static void test_bad_tp(void **state)
{
	struct sm70_engine_opts eo;
	struct sm70_engine *e = NULL;
	struct sm70_err err = { { 0 } };

	(void)state;
	sm70_engine_opts_default(&eo);
	eo.backend = backend;
	eo.tp = 5;
	assert_int_equal(sm70_engine_open(&e, FIXTURES "/qwen3-mha-d32-f16", &eo, &err),
			 -EINVAL);
	assert_non_null(strstr(err.msg, "tp 5 out of range"));
	sm70_err_clear(&err);
	eo.backend = "cuda";
	eo.tp = 2;
	eo.n_gpus = 1;
	eo.gpus[0] = 0;
	assert_int_equal(sm70_engine_open(&e, FIXTURES "/qwen3-mha-d32-f16", &eo, &err),
			 -EINVAL);
	assert_non_null(strstr(err.msg, "tp 2 needs 2 GPUs"));
	printf("refused: %s\n", err.msg);
	sm70_err_clear(&err);
	eo.n_gpus = 2;
	eo.gpus[1] = 0;
	assert_int_equal(sm70_engine_open(&e, FIXTURES "/qwen3-mha-d32-f16", &eo, &err),
			 -EINVAL);
	assert_non_null(strstr(err.msg, "GPU 0 is listed for two ranks"));
	printf("refused: %s\n", err.msg);
}

int main(void)
{
	const char *b = getenv("SM70_BACKEND"), *t = getenv("SM70_TP_MAX");
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_bad_tp),
		cmocka_unit_test(test_fixtures_tp),
	};

	if (b && *b)
		backend = b;
	if (strcmp(backend, "cpu") != 0) {
		gpu = 1;
		settings = gpu_settings;
		margin_min = 0.05;
		lp_tol = 2e-2;
	}
	if (t && *t)
		tp_max = atoi(t);
	if (getenv("SM70_TP_GPU_SETTINGS"))
		settings = gpu_settings; /* to check the GPU rules on the CPU */
	if (tp_max < 2) {
		printf("test_tp: SM70_TP_MAX=%d: nothing to split over, skipped\n", tp_max);
		return 0;
	}
	sm70t_fixture_cases_note();
	return cmocka_run_group_tests(tests, NULL, NULL);
}
