/*
 * test_kv_fp8 - an FP8 KV cache changes the logits little: on every fixture prompt, the
 * logits with each FP8 KV mode against FP16 KV, compared position by position; the mean
 * and minimum cosine and the mean KL(p_f16 || p_fp8) are printed for every case, one table
 * a mode. The CPU backend by default (its FP8 path is the twin of the CUDA kernels');
 * SM70_BACKEND=cuda (tools/gpu-check.sh) on a GPU.
 *
 * "fp8" (K in FP8-E4M3, V in f16, the default FP8 mode) must reach the aim: mean cosine
 * >= 0.999, none below 0.99. "fp8-all" (K and V in E4M3) keeps the bounds it has always
 * had, mean >= 0.998 and none below 0.99: these tiny random fixtures reach 0.9982-0.9992
 * there (docs/PERFORMANCE.md, "FP8 KV accuracy"): E4M3 keeps 3 mantissa bits (about 3.6%
 * RMS error per element whatever the scale), felt mostly through V, which the output is a
 * plain weighted sum of; K's error only nudges softmax weights. The bounds are what the
 * kernels achieve today, so a regression fails.
 * Mixture-of-experts fixtures (their reference carries router margins) get looser bounds
 * in both modes, mean >= 0.99 and min >= 0.7: their random routers put tokens within 1e-4
 * of another expert, FP8's noise sends some to it, and a rerouted position's logits differ
 * wholesale (qwen3_moe-e8k2 case 2 with fp8-all: mean 0.9907, min 0.799, on the CPU and the
 * GPU alike; its NVFP4 copy qwen3_moe-e8k2-nvfp4: mean 0.9927, min 0.750), so the
 * per-position figures measure routing ties there, not the KV cache.
 */
#include <dirent.h>
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

#include "daemon/engine/checkpoint.h"
#include "daemon/engine/model.h"
#include "tests/unit/fixture_cases.h"

#define CHUNK 128 /* positions per step, each with its logits */
#define MAX_ROWS 128

/* The modes measured against FP16 KV, as the engine's kv_mode.c words name them. */
static const struct mode {
	const char *name;
	enum sm70_dtype k;
	enum sm70_dtype v;
	double mean_lo, min_lo; /* bounds for dense fixtures */
} modes[] = {
	{ "fp8 (K E4M3, V f16)", SM70_DTYPE_F8E4M3, SM70_DTYPE_F16, 0.999, 0.99 },
	{ "fp8-all (K, V E4M3)", SM70_DTYPE_F8E4M3, SM70_DTYPE_F8E4M3, 0.998, 0.99 },
};
#define N_MODES 2

/* One printed row: a case under one mode. */
struct row {
	char name[64];
	int c, n, moe, bad;
	double mean, min, kl;
};

static const char *backend = "cpu";
static int no_gpu;
static int n_bad; /* rows under the bounds: reported all, asserted at the end */
static struct row rows_of[N_MODES][MAX_ROWS];
static int n_rows;

/* Runs prompt through a fresh model with K dtype k and V dtype v; logits [n, vocab] into
 * out. */
static int all_logits(const char *dir, enum sm70_dtype k, enum sm70_dtype v,
		      const int32_t *prompt, int n, float *out, int *vocab)
{
	struct sm70_backend *be = NULL;
	struct sm70_ckpt *ck = NULL;
	struct sm70_model *m = NULL;
	struct sm70_err err = { { 0 } };
	struct sm70_model_opts mo = {
		.max_tokens = CHUNK, .max_seqs = CHUNK, .block_size = 16, .kv_bytes = 64u << 20,
		.kv_dtype = k, .kv_v_dtype = v == k ? SM70_KV_V_AS_K : SM70_KV_V(v),
	};
	int32_t pos[CHUNK], seq[CHUNK], slot[CHUNK], rows[CHUNK], *table;
	int ret, n_blocks = (n + 15) / 16;

	if (strcmp(backend, "cuda") == 0)
		ret = sm70_backend_cuda_create(&be, 0, &err);
	else
		ret = sm70_backend_cpu_create(&be, 2, &err);
	if (ret) {
		printf("SKIP: no %s backend (%s)\n", backend, err.msg);
		return ret;
	}
	assert_int_equal(sm70_ckpt_open(&ck, dir, &err), 0);
	ret = sm70_model_load(&m, ck, be, &mo, &err);
	if (ret)
		fail_msg("load %s: %s", dir, err.msg);
	*vocab = m->cfg.vocab_size;
	/* a block holds K and V each in its own dtype (no QSA planes in these fixtures) */
	assert_int_equal(sm70_model_kv_block_bytes(m),
			 (size_t)m->cfg.n_attn_layers * 16 * m->kv_lay.n_kv_heads *
				 m->cfg.head_dim * (sm70_dtype_size(k) + sm70_dtype_size(v)));
	table = malloc(sizeof(int32_t) * (size_t)n_blocks);
	for (int b = 0; b < n_blocks; b++)
		table[b] = b;
	for (int start = 0; start < n; start += CHUNK) {
		int t = n - start < CHUNK ? n - start : CHUNK;
		for (int i = 0; i < t; i++) {
			pos[i] = start + i;
			seq[i] = 0;
			slot[i] = start + i; /* blocks are 0, 1, 2, ... in order */
			rows[i] = i;
		}
		int32_t first = 0, len = t, state_slot = 0; /* recurrent models: slot 0 */
		struct sm70_step st = {
			.n_tokens = t, .n_seqs = 1, .max_blocks = n_blocks, .max_pos = start + t,
			.tok_ids = prompt + start, .tok_pos = pos, .tok_seq = seq, .tok_slot = slot,
			.block_tables = table, .n_out = t, .out_rows = rows,
			.n_decode = 0, .n_chunks = 1, .chunk_first = &first, .chunk_len = &len,
			.seq_state = &state_slot,
		};
		assert_int_equal(sm70_model_forward(m, &st, out + (size_t)start * *vocab), 0);
	}
	free(table);
	sm70_model_free(m);
	sm70_ckpt_close(ck);
	sm70_backend_destroy(be);
	return 0;
}

/* Position-by-position cosine and KL of logits y against x ([n, vocab] each) into r. */
static void measure(const float *a, const float *b, int n, int vocab, struct row *r)
{
	double min_cos = 1, sum_cos = 0, sum_kl = 0;

	for (int i = 0; i < n; i++) {
		const float *x = a + (size_t)i * vocab, *y = b + (size_t)i * vocab;
		double dot = 0, nx = 0, ny = 0, mx = -INFINITY, my = -INFINITY, zx = 0, zy = 0,
		       kl = 0;
		for (int v = 0; v < vocab; v++) {
			dot += (double)x[v] * y[v];
			nx += (double)x[v] * x[v];
			ny += (double)y[v] * y[v];
			mx = fmax(mx, x[v]);
			my = fmax(my, y[v]);
		}
		for (int v = 0; v < vocab; v++) {
			zx += exp(x[v] - mx);
			zy += exp(y[v] - my);
		}
		for (int v = 0; v < vocab; v++) {
			double lpx = x[v] - mx - log(zx), lpy = y[v] - my - log(zy);
			kl += exp(lpx) * (lpx - lpy);
		}
		double cs = dot / sqrt(nx * ny);
		if (cs < min_cos)
			min_cos = cs;
		sum_cos += cs;
		sum_kl += kl;
	}
	r->n = n;
	r->mean = sum_cos / n;
	r->min = min_cos;
	r->kl = sum_kl / n;
}

static void compare(const char *dir, const char *name)
{
	char path[600];
	json_error_t je;
	json_t *ref, *cases;

	snprintf(path, sizeof(path), "%s/reference.json", dir);
	ref = json_load_file(path, 0, &je);
	assert_non_null(ref);
	cases = sm70t_fixture_cases(ref);
	for (size_t c = 0; c < json_array_size(cases); c++) {
		json_t *p = json_object_get(json_array_get(cases, c), "prompt");
		int n = (int)json_array_size(p), vocab = 0;
		int32_t *prompt = malloc(sizeof(int32_t) * (size_t)n);
		float *a, *b;
		int moe = json_object_get(json_array_get(cases, c), "router_margins") != NULL;

		for (int i = 0; i < n; i++)
			prompt[i] = (int32_t)json_integer_value(json_array_get(p, (size_t)i));
		a = malloc(sizeof(float) * (size_t)n * 1024);
		b = malloc(sizeof(float) * (size_t)n * 1024);
		if (all_logits(dir, SM70_DTYPE_F16, SM70_DTYPE_F16, prompt, n, a, &vocab)) {
			no_gpu = 1;
			free(a);
			free(b);
			free(prompt);
			break;
		}
		assert_true(vocab <= 1024);
		assert_true(n_rows < MAX_ROWS);
		for (int md = 0; md < N_MODES; md++) {
			const struct mode *o = &modes[md];
			struct row *r = &rows_of[md][n_rows];
			double mean_lo = moe ? 0.99 : o->mean_lo, min_lo = moe ? 0.7 : o->min_lo;

			all_logits(dir, o->k, o->v, prompt, n, b, &vocab);
			measure(a, b, n, vocab, r);
			snprintf(r->name, sizeof(r->name), "%.63s", name);
			r->c = (int)c;
			r->moe = moe;
			r->bad = r->mean < mean_lo || r->min < min_lo;
			n_bad += r->bad;
		}
		n_rows++;
		free(a);
		free(b);
		free(prompt);
	}
	json_decref(ref);
}

/* One table a mode: every case's figures, and which fell under the bounds. */
static void print_tables(void)
{
	for (int md = 0; md < N_MODES; md++) {
		const struct mode *o = &modes[md];

		printf("\nKV %s vs FP16 KV logits, %s backend (bounds: mean >= %g, min >= %g; "
		       "mixture-of-experts mean >= 0.99, min >= 0.7)\n", o->name, backend,
		       o->mean_lo, o->min_lo);
		printf("%-28s %4s %9s %11s %9s %10s\n", "fixture", "case", "positions",
		       "mean cosine", "min", "mean KL");
		for (int i = 0; i < n_rows; i++) {
			const struct row *r = &rows_of[md][i];

			printf("%-28s %4d %9d %11.6f %9.6f %10.3e%s\n", r->name, r->c, r->n,
			       r->mean, r->min, r->kl, r->bad ? "  <- below the bounds" : "");
		}
	}
}

static void test_fp8_close_to_f16(void **state)
{
	DIR *d = opendir("tests/fixtures");
	struct dirent *de;

	assert_non_null(d);
	while ((de = readdir(d))) {
		char dir[512];
		if (strncmp(de->d_name, "qwen3", 5))
			continue;
		snprintf(dir, sizeof(dir), "tests/fixtures/%s", de->d_name);
		compare(dir, de->d_name);
		if (no_gpu)
			break;
	}
	closedir(d);
	if (no_gpu)
		skip();
	print_tables();
	assert_int_equal(n_bad, 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_fp8_close_to_f16),
	};
	const char *b = getenv("SM70_BACKEND");

	if (b && *b)
		backend = b;
	sm70t_fixture_cases_note();
	return cmocka_run_group_tests(tests, NULL, NULL);
}
