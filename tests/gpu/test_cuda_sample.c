/* test_cuda_sample - the CUDA sample op (fast path and SM70_SAMPLER=reference) against the
 * host sampler sm70_sample(), row by row; with --bench, microseconds per call. */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "daemon/engine/sampler.h"
#include "kernels/backend.h"
#include "kernels/cuda/cuda_ops.h"

#define GPU_TEST_SEED 0x5a3b1e5eedULL
#include "tests/gpu/gpu_test.h"

#define MAX_ROWS 16
#define BIG_VOCAB 248320
#define LP_TOL 1e-5

static struct sm70_backend *gpu, *gpu_ref;

/* totals over every compared row, per path (0 fast, 1 reference) */
static long n_rows[2], tok_bad[2], top_bad[2], inval_bad[2];
static double lp_err[2];


static double rnd01(void)
{
	return (double)(rng_next() >> 11) * 0x1p-53;
}

enum gen { G_UNIFORM, G_TIES, G_NEGINF, G_PEAKED, G_FLAT, G_COUNT };

static const char *gen_name[G_COUNT] = { "uniform", "ties", "-inf", "peaked", "all-equal" };

static void fill_row(float *x, int vocab, enum gen g)
{
	for (int i = 0; i < vocab; i++) {
		double u = rnd01();

		switch (g) {
		case G_UNIFORM:
			x[i] = (float)(u * 16.0 - 8.0);
			break;
		case G_TIES:
			/* 33 distinct values: lots of equal logits at every cut */
			x[i] = (float)(floor(u * 33.0) * 0.25 - 4.0);
			break;
		case G_NEGINF:
			x[i] = u < 0.3 ? -INFINITY : (float)(rnd01() * 12.0 - 6.0);
			break;
		case G_PEAKED:
			x[i] = (float)((u + rnd01() + rnd01() - 1.5) * 6.0);
			break;
		default:
			x[i] = 1.5f;
		}
	}
	if (g == G_PEAKED)
		x[rng_next() % (uint64_t)vocab] = 30.0f;
	if (g == G_NEGINF)
		x[rng_next() % (uint64_t)vocab] = 2.0f; /* at least one finite */
}

struct setting {
	const char *name;
	float t;
	int k;
	float p;
};

static const struct setting settings[] = {
	{ "greedy", 0.0f, 0, 1.0f },
	{ "T=1", 1.0f, 0, 1.0f },
	{ "T=0.7 k=5", 0.7f, 5, 1.0f },
	{ "top-p 0.8", 1.0f, 0, 0.8f },
	{ "T=1 k=20 p=0.95", 1.0f, 20, 0.95f },
	{ "k=1", 1.0f, 1, 1.0f },
	{ "T=1.3 k=64 p=0.9", 1.3f, 64, 0.9f },
	{ "T=0.5 k=300 p=0.9", 0.5f, 300, 0.9f },
	{ "T=0.2 p=0.5", 0.2f, 0, 0.5f },
};
#define N_SETTINGS (int)(sizeof(settings) / sizeof(settings[0]))

static void *up(struct sm70_backend *be, const void *src, size_t bytes)
{
	void *p = be->ops->buf_alloc(be, bytes);

	assert_non_null(p);
	assert_int_equal(be->ops->upload(be, p, src, bytes), 0);
	return p;
}

/* Samples b rows on both GPU paths and on the host and counts every disagreement. */
static void compare(struct sm70_sampler *host, const float *logits,
		    const struct sm70_sample_row *rows, int b, int vocab, const char *what)
{
	struct sm70_backend *bes[2] = { gpu, gpu_ref };
	struct sm70_sample_result got[MAX_ROWS], ref;

	for (int path = 0; path < 2; path++) {
		struct sm70_backend *be = bes[path];
		void *dl = up(be, logits, (size_t)b * vocab * sizeof(float));
		void *dr = up(be, rows, (size_t)b * sizeof(*rows));
		void *dout = be->ops->buf_alloc(be, sizeof(got));

		assert_non_null(dout);
		be->ops->sample(be, dout, dl, dr, b, vocab);
		assert_int_equal(be->ops->download(be, got, dout, (size_t)b * sizeof(got[0])), 0);
		be->ops->buf_free(be, dout);
		be->ops->buf_free(be, dr);
		be->ops->buf_free(be, dl);

		for (int r = 0; r < b; r++) {
			struct sm70_sampling sp = {
				.temperature = rows[r].temperature,
				.top_k = rows[r].top_k,
				.top_p = rows[r].top_p,
				.seed = rows[r].seed,
				.top_logprobs = rows[r].top_logprobs,
			};
			int rc = sm70_sample(host, logits + (size_t)r * vocab, &sp, rows[r].n, &ref);
			const struct sm70_sample_result *g = &got[r];

			n_rows[path]++;
			if (rc) {
				if (g->token != -1) {
					inval_bad[path]++;
					printf("  %s path %d row %d: host refused, GPU token %d\n", what,
					       path, r, g->token);
				}
				continue;
			}
			if (g->token != ref.token) {
				tok_bad[path]++;
				printf("  MISMATCH %s (%s) row %d: GPU %d host %d\n", what,
				       path ? "reference" : "fast", r, g->token, ref.token);
				continue;
			}
			if (fabs((double)g->logprob - ref.logprob) > lp_err[path])
				lp_err[path] = fabs((double)g->logprob - ref.logprob);
			if (g->n_top != ref.n_top) {
				top_bad[path]++;
				continue;
			}
			for (int j = 0; j < ref.n_top; j++) {
				double e = fabs((double)g->top_logprobs[j] - ref.top_logprobs[j]);

				if (g->top_ids[j] != ref.top_ids[j]) {
					top_bad[path]++;
					printf("  TOP %s (%s) row %d [%d]: GPU %d host %d\n", what,
					       path ? "reference" : "fast", r, j, g->top_ids[j],
					       ref.top_ids[j]);
					break;
				}
				if (e > lp_err[path])
					lp_err[path] = e;
			}
		}
	}
}

static void run_vocab(int vocab, int calls, int b)
{
	struct sm70_sampler *host;
	float *logits = malloc((size_t)b * vocab * sizeof(float));
	struct sm70_sample_row rows[MAX_ROWS];
	static const int tl[3] = { 0, 5, 20 };
	char what[128];

	assert_non_null(logits);
	assert_int_equal(sm70_sampler_create(&host, vocab), 0);
	for (int g = 0; g < G_COUNT; g++) {
		for (int s = 0; s < N_SETTINGS; s++) {
			for (int c = 0; c < calls; c++) {
				for (int r = 0; r < b; r++) {
					const struct setting *st = &settings[(s + r) % N_SETTINGS];

					fill_row(logits + (size_t)r * vocab, vocab, (enum gen)g);
					rows[r] = (struct sm70_sample_row){
						.temperature = st->t,
						.top_k = st->k,
						.top_p = st->p,
						.top_logprobs = tl[(r + c) % 3],
						.seed = rng_next(),
						.n = rng_next() % 4096,
					};
				}
				snprintf(what, sizeof(what), "vocab %d %s from %s", vocab,
					 gen_name[g], settings[s].name);
				compare(host, logits, rows, b, vocab, what);
			}
		}
	}
	sm70_sampler_destroy(host);
	free(logits);
}

static void report(const char *name)
{
	for (int path = 0; path < 2; path++)
		printf("%s, %s path: %ld rows, token mismatches %ld, top-N mismatches %ld, "
		       "invalid-row mismatches %ld, max |logprob err| %.2e\n", name,
		       path ? "reference" : "fast", n_rows[path], tok_bad[path], top_bad[path],
		       inval_bad[path], lp_err[path]);
	for (int path = 0; path < 2; path++) {
		assert_int_equal(tok_bad[path], 0);
		assert_int_equal(top_bad[path], 0);
		assert_int_equal(inval_bad[path], 0);
		assert_true(lp_err[path] <= LP_TOL);
	}
	memset(n_rows, 0, sizeof(n_rows));
	memset(tok_bad, 0, sizeof(tok_bad));
	memset(top_bad, 0, sizeof(top_bad));
	memset(inval_bad, 0, sizeof(inval_bad));
	memset(lp_err, 0, sizeof(lp_err));
}

static void test_small_vocabs(void **state)
{
	(void)state;
	run_vocab(7, 3, 16);
	run_vocab(33, 2, 16);
	run_vocab(1000, 3, 16);
	run_vocab(4099, 2, 11);
	report("vocab 7/33/1000/4099");
}

static void test_big_vocab(void **state)
{
	(void)state;
	run_vocab(BIG_VOCAB, 1, 16);
	run_vocab(65537, 1, 5);
	report("vocab 248320/65537");
}

/*
 * Layouts that defeat the fast path's candidate threshold (built from each thread's best
 * element of its id stride): 32 consecutive residues mod 512 (one warp's stride when a
 * block's slice starts at a multiple of 512) hold only low logits, so more than 512
 * candidates pass and the radix count-select fallback runs; also long runs of ties.
 */
static void test_striped(void **state)
{
	static const int vocabs[3] = { 2000, 1500, 4099 };
	struct sm70_sample_row rows[MAX_ROWS];
	char what[128];

	(void)state;
	for (int v = 0; v < 3; v++) {
		const int vocab = vocabs[v];
		struct sm70_sampler *host;
		float *logits = malloc((size_t)MAX_ROWS * vocab * sizeof(float));

		assert_non_null(logits);
		assert_int_equal(sm70_sampler_create(&host, vocab), 0);
		for (int c = 0; c < 3; c++) {
			for (int r = 0; r < MAX_ROWS; r++) {
				const struct setting *st = &settings[(r + c) % N_SETTINGS];
				float *x = logits + (size_t)r * vocab;

				for (int i = 0; i < vocab; i++) {
					double u = rnd01();

					if ((i & 511) >= 480)
						x[i] = (float)(u - 20.0);
					else if (c == 2)
						x[i] = (float)(floor(u * 3.0) + 2.0);
					else
						x[i] = (float)(u * 8.0 + (i & 1));
				}
				rows[r] = (struct sm70_sample_row){
					.temperature = st->t,
					.top_k = st->k,
					.top_p = st->p,
					.top_logprobs = (r & 1) ? 20 : (r & 2) ? 5 : 0,
					.seed = rng_next(),
					.n = rng_next() % 4096,
				};
			}
			snprintf(what, sizeof(what), "vocab %d striped layout %d", vocab, c);
			compare(host, logits, rows, MAX_ROWS, vocab, what);
		}
		sm70_sampler_destroy(host);
		free(logits);
	}
	report("striped layouts (radix fallback)");
}

/* Rows the host refuses (NaN, +inf, all -inf, bad parameters) come back as token -1. */
static void test_invalid(void **state)
{
	struct sm70_sampler *host;
	const int vocab = 5000;
	float *logits = malloc((size_t)6 * vocab * sizeof(float));
	struct sm70_sample_row rows[6];

	(void)state;
	assert_non_null(logits);
	assert_int_equal(sm70_sampler_create(&host, vocab), 0);
	for (int r = 0; r < 6; r++) {
		fill_row(logits + (size_t)r * vocab, vocab, G_UNIFORM);
		rows[r] = (struct sm70_sample_row){ .temperature = 1.0f, .top_p = 1.0f,
						    .top_logprobs = 3, .seed = (uint64_t)r };
	}
	logits[0 * vocab + 4321] = NAN;
	logits[1 * vocab + 17] = INFINITY;
	for (int i = 0; i < vocab; i++)
		logits[2 * vocab + i] = -INFINITY;
	rows[3].top_p = 0.0f;
	rows[4].temperature = -1.0f;
	rows[5].top_logprobs = 21;
	compare(host, logits, rows, 6, vocab, "invalid rows");
	report("invalid rows");
	sm70_sampler_destroy(host);
	free(logits);
}

static int bench(void)
{
	static const struct setting bs[3] = { { "T=1 k=20 p=0.95", 1.0f, 20, 0.95f },
					      { "T=1 top-p 0.95", 1.0f, 0, 0.95f },
					      { "greedy", 0.0f, 0, 1.0f } };
	static const int sizes[3] = { 1, 8, 16 };
	const int vocab = BIG_VOCAB;
	float *logits = malloc((size_t)MAX_ROWS * vocab * sizeof(float));
	struct sm70_sample_row rows[MAX_ROWS];
	void *dl, *dr, *dout;

	if (!logits)
		return 1;
	for (int r = 0; r < MAX_ROWS; r++)
		fill_row(logits + (size_t)r * vocab, vocab, G_PEAKED);
	dl = gpu->ops->buf_alloc(gpu, (size_t)MAX_ROWS * vocab * sizeof(float));
	dr = gpu->ops->buf_alloc(gpu, sizeof(rows));
	dout = gpu->ops->buf_alloc(gpu, MAX_ROWS * sizeof(struct sm70_sample_result));
	if (!dl || !dr || !dout ||
	    gpu->ops->upload(gpu, dl, logits, (size_t)MAX_ROWS * vocab * sizeof(float)))
		return 1;
	for (int s = 0; s < 3; s++) {
		for (int i = 0; i < 3; i++) {
			for (int lp = 0; lp <= 20; lp += 20) {
				double us = 0.0;

				for (int r = 0; r < MAX_ROWS; r++)
					rows[r] = (struct sm70_sample_row){
						.temperature = bs[s].t, .top_k = bs[s].k,
						.top_p = bs[s].p, .top_logprobs = lp,
						.seed = 1234 + (uint64_t)r, .n = 7 };
				if (gpu->ops->upload(gpu, dr, rows, sizeof(rows)) ||
				    sm70__cuda_sample_time(gpu, dout, dl, dr, sizes[i], vocab, 200,
							   &us))
					return 1;
				printf("bench: B%-2d x %d  %-16s top_logprobs %2d: %7.2f us/call "
				       "(median of 200, CUDA events)\n", sizes[i], vocab, bs[s].name,
				       lp, us);
			}
		}
	}
	gpu->ops->buf_free(gpu, dout);
	gpu->ops->buf_free(gpu, dr);
	gpu->ops->buf_free(gpu, dl);
	free(logits);
	return 0;
}

int main(int argc, char **argv)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_invalid),
		cmocka_unit_test(test_small_vocabs),
		cmocka_unit_test(test_striped),
		cmocka_unit_test(test_big_vocab),
	};
	struct sm70_err err = { { 0 } };
	int ret;

	ret = sm70_backend_cuda_create(&gpu, 0, &err);
	if (ret == -ENODEV) {
		printf("SKIP: no CUDA device (%s)\n", err.msg);
		return 0;
	}
	if (ret) {
		fprintf(stderr, "cuda backend: %s\n", err.msg);
		return 1;
	}
	if (argc > 1 && strcmp(argv[1], "--bench") == 0) {
		ret = bench();
		sm70_backend_destroy(gpu);
		return ret;
	}
	setenv("SM70_SAMPLER", "reference", 1);
	ret = sm70_backend_cuda_create(&gpu_ref, 0, &err);
	unsetenv("SM70_SAMPLER");
	if (ret) {
		fprintf(stderr, "cuda reference backend: %s\n", err.msg);
		sm70_backend_destroy(gpu);
		return 1;
	}
	ret = cmocka_run_group_tests(tests, NULL, NULL);
	sm70_backend_destroy(gpu_ref);
	sm70_backend_destroy(gpu);
	return ret;
}
