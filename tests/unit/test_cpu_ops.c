/* test_cpu_ops - the CPU backend: its thread pool and every op against double references. */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#define OP_TEST_SEED 0x5eed1234abcdULL

#include "kernels/backend.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/threadpool.h"
#include "tests/unit/op_test.h"

/* ---- helpers ----------------------------------------------------------------------- */

/* This file's wording of err_report (its figures were first printed so). */
static void err_report_wide(const char *what, const struct errstat *e, double tol)
{
	printf("  %-44s max abs err %.3g, max rel err %.3g (tol %.1g) over %zu values\n", what,
	       e->max_abs, e->max_rel, tol, e->n);
	assert_true(e->max_rel <= tol);
}

/* Encodes f32 values into a weight of dtype t; dec gets the values it decodes to. */
static void fill_weight(struct sm70_backend *be, struct sm70_weight *w, float *dec,
			enum sm70_dtype t, int rows, int cols, float amp)
{
	size_t n = (size_t)rows * (size_t)cols;

	w->dtype = t;
	w->rows = rows;
	w->cols = cols;
	w->data = balloc(be, n * sm70_dtype_size(t));
	for (size_t i = 0; i < n; i++) {
		float v = rnd(amp);

		if (t == SM70_DTYPE_F16) {
			uint16_t h = sm70_f32_to_f16(v);

			((uint16_t *)w->data)[i] = h;
			dec[i] = sm70_f16_to_f32(h);
		} else if (t == SM70_DTYPE_BF16) {
			uint16_t h = sm70_f32_to_bf16(v);

			((uint16_t *)w->data)[i] = h;
			dec[i] = sm70_bf16_to_f32(h);
		} else {
			((float *)w->data)[i] = v;
			dec[i] = v;
		}
	}
}

static const enum sm70_dtype wtypes[] = { SM70_DTYPE_F32, SM70_DTYPE_F16, SM70_DTYPE_BF16 };

/* ---- thread pool --------------------------------------------------------------------- */

struct sum_ctx {
	atomic_llong sum;
	atomic_int calls;
	unsigned char *seen;
	int bad_thread;
	int n_threads;
};

static void sum_fn(void *ctx, int begin, int end, int thread)
{
	struct sum_ctx *c = ctx;
	long long s = 0;

	if (thread < 0 || thread >= c->n_threads)
		c->bad_thread = 1;
	for (int i = begin; i < end; i++) {
		s += i;
		c->seen[i]++;
	}
	atomic_fetch_add(&c->sum, s);
	atomic_fetch_add(&c->calls, 1);
}

static void test_pool_sum(void **state)
{
	const int counts[] = { 1, 2, 7 };
	const int n = 1000000;
	unsigned char *seen = malloc((size_t)n);

	assert_non_null(seen);
	for (size_t t = 0; t < sizeof(counts) / sizeof(counts[0]); t++) {
		struct sm70__pool *pool = NULL;
		struct sum_ctx c;
		long long want = (long long)n * (n - 1) / 2;
		int ok = 1;

		assert_int_equal(sm70__pool_create(&pool, counts[t]), 0);
		assert_int_equal(sm70__pool_threads(pool), counts[t]);
		memset(seen, 0, (size_t)n);
		atomic_init(&c.sum, 0);
		atomic_init(&c.calls, 0);
		c.seen = seen;
		c.bad_thread = 0;
		c.n_threads = counts[t];
		sm70__pool_run(pool, n, 1000, sum_fn, &c);
		for (int i = 0; i < n; i++)
			ok &= seen[i] == 1;
		printf("  pool of %d: sum over %d items %lld (want %lld) in %d chunks\n", counts[t],
		       n, (long long)atomic_load(&c.sum), want, atomic_load(&c.calls));
		assert_true(ok);
		assert_false(c.bad_thread);
		assert_true(atomic_load(&c.sum) == want);

		/* many small back-to-back jobs: every wake-up/check-out path, repeatedly */
		for (int r = 0; r < 2000; r++) {
			int m = 1 + r % 61;

			memset(seen, 0, (size_t)m);
			atomic_store(&c.sum, 0);
			sm70__pool_run(pool, m, 1, sum_fn, &c);
			assert_true(atomic_load(&c.sum) == (long long)m * (m - 1) / 2);
		}
		/* a job of one grain runs inline: one call, thread 0 */
		atomic_store(&c.calls, 0);
		memset(seen, 0, 100);
		sm70__pool_run(pool, 100, 100, sum_fn, &c);
		assert_int_equal(atomic_load(&c.calls), 1);
		sm70__pool_run(pool, 0, 1, sum_fn, &c);
		assert_int_equal(atomic_load(&c.calls), 1);
		sm70__pool_destroy(pool);
	}
	assert_int_equal(sm70__pool_create(&(struct sm70__pool *){ NULL }, 0), -EINVAL);
	sm70__pool_destroy(NULL);
	free(seen);
}

/* ---- backend basics ------------------------------------------------------------------ */

static void test_backend_basics(void **state)
{
	struct sm70_backend *be = cpu_backend(0);
	unsigned char src[100], back[100];
	unsigned char *p;
	int zero = 1;

	assert_string_equal(be->name, "cpu");
	assert_int_equal(be->act_dtype, SM70_DTYPE_F32);
	p = balloc(be, 100);
	assert_true(((uintptr_t)p & 63) == 0);
	for (int i = 0; i < 100; i++)
		zero &= p[i] == 0;
	assert_true(zero);
	for (int i = 0; i < 100; i++)
		src[i] = (unsigned char)(i * 7);
	assert_int_equal(be->ops->upload(be, p, src, 100), 0);
	assert_int_equal(be->ops->download(be, back, p, 100), 0);
	assert_memory_equal(src, back, 100);
	assert_int_equal(be->ops->sync(be), 0);
	be->ops->buf_free(be, p);
	p = balloc(be, 0);
	be->ops->buf_free(be, p);
	printf("  cpu backend with %d threads: alloc zeroed and 64-byte aligned, copies exact\n",
	       ((struct sm70__cpu *)be->priv)->n_threads);
	sm70_backend_destroy(be);
	sm70_backend_destroy(NULL);
	assert_int_equal(sm70_backend_cpu_create(&be, -1, NULL), -EINVAL);
}

/* ---- element conversion ------------------------------------------------------------- */

/* The bulk row conversion (tables, unrolled bf16 shift) equals dtype.h's scalar routines
 * bitwise, NaNs included, for every f16, bf16 and e4m3 bit pattern. */
static void test_row_conversion(void **state)
{
	struct sm70_backend *be = cpu_backend(1); /* fills the tables */
	uint16_t *h = malloc(sizeof(uint16_t) * 65536);
	uint8_t b[256];
	float *f = malloc(sizeof(float) * 65536), want;
	int bad = 0;

	assert_non_null(h);
	assert_non_null(f);
	for (int i = 0; i < 65536; i++)
		h[i] = (uint16_t)i;
	for (int i = 0; i < 256; i++)
		b[i] = (uint8_t)i;
	sm70__cpu_row_to_f32(f, h, SM70_DTYPE_F16, 65536);
	for (int i = 0; i < 65536; i++) {
		want = sm70_f16_to_f32(h[i]);
		bad += memcmp(&want, &f[i], sizeof(float)) != 0;
	}
	sm70__cpu_row_to_f32(f, h, SM70_DTYPE_BF16, 65533); /* odd count: the tail loop too */
	for (int i = 0; i < 65533; i++) {
		want = sm70_bf16_to_f32(h[i]);
		bad += memcmp(&want, &f[i], sizeof(float)) != 0;
	}
	sm70__cpu_row_to_f32(f, b, SM70_DTYPE_F8E4M3, 256);
	for (int i = 0; i < 256; i++) {
		want = sm70_e4m3_to_f32(b[i]);
		bad += memcmp(&want, &f[i], sizeof(float)) != 0;
	}
	printf("  row conversion: %d mismatches over all f16, bf16 and e4m3 bit patterns\n", bad);
	assert_int_equal(bad, 0);
	free(f);
	free(h);
	sm70_backend_destroy(be);
}

/* ---- embed, gather_rows, add ---------------------------------------------------------- */

static void test_embed(void **state)
{
	struct sm70_backend *be = cpu_backend(3);
	const int dims[] = { 1, 3, 17, 130 };
	const int vocab = 37, n = 600;
	size_t checked = 0;

	for (size_t ti = 0; ti < 3; ti++) {
		for (size_t di = 0; di < 4; di++) {
			int dim = dims[di];
			float *dec = malloc(sizeof(float) * vocab * dim);
			int32_t *ids = balloc(be, sizeof(int32_t) * n);
			float *x = balloc(be, sizeof(float) * n * dim);
			struct sm70_weight w;

			assert_non_null(dec);
			fill_weight(be, &w, dec, wtypes[ti], vocab, dim, 2.0f);
			for (int i = 0; i < n; i++)
				ids[i] = i % 50 == 49 ? vocab + i :
					 i % 97 == 3  ? -1 :
							rnd_int(vocab);
			be->ops->embed(be, x, &w, ids, n);
			for (int i = 0; i < n; i++) {
				for (int k = 0; k < dim; k++) {
					float want = ids[i] < 0 || ids[i] >= vocab ?
							     0.0f : dec[(size_t)ids[i] * dim + k];

					assert_true(x[(size_t)i * dim + k] == want);
					checked++;
				}
			}
			bfree_all(be, w.data, x, ids);
			free(dec);
		}
	}
	printf("  embed: %zu values bitwise equal to the decoded table (f32/f16/bf16; "
	       "out-of-range ids give zeros)\n", checked);
	sm70_backend_destroy(be);
}

static void test_gather_add(void **state)
{
	struct sm70_backend *be = cpu_backend(4);
	const int n_src = 300, dim = 130, n = 257;
	const size_t count = 100003;
	float *src = balloc(be, sizeof(float) * n_src * dim);
	float *dst = balloc(be, sizeof(float) * n * dim);
	int32_t *rows = balloc(be, sizeof(int32_t) * n);
	float *resid = balloc(be, sizeof(float) * count);
	float *x = balloc(be, sizeof(float) * count);
	float *want = malloc(sizeof(float) * count);

	assert_non_null(want);
	for (int i = 0; i < n_src * dim; i++)
		src[i] = rnd(1.0f);
	for (int i = 0; i < n; i++)
		rows[i] = rnd_int(n_src);
	for (int f = 0; f < 2; f++) {
		memset(dst, 0, sizeof(float) * n * dim);
		be->ops->gather_rows(be, dst, src, rows, n, dim, f);
		for (int i = 0; i < n; i++)
			assert_memory_equal(dst + (size_t)i * dim, src + (size_t)rows[i] * dim,
					    sizeof(float) * dim);
	}
	for (size_t i = 0; i < count; i++) {
		resid[i] = rnd(3.0f);
		x[i] = rnd(3.0f);
		want[i] = resid[i] + x[i];
	}
	be->ops->add(be, resid, x, count);
	assert_memory_equal(resid, want, sizeof(float) * count);
	printf("  gather_rows: %d rows of %d bitwise; add: %zu values bitwise equal to f32 adds\n",
	       n, dim, count);
	free(want);
	bfree_all(be, x, resid, rows, dst, src);
	sm70_backend_destroy(be);
}

/* ---- add_rmsnorm ---------------------------------------------------------------------- */

/* Tolerance: each output within 1e-6 of |reference| (a few f32 roundings: rsqrt, two
 * products). The residual update itself must be bitwise an f32 add. */
static void test_add_rmsnorm(void **state)
{
	struct sm70_backend *be = cpu_backend(2);
	const int dims[] = { 1, 3, 17, 130, 1024 };
	const int n = 9;
	const float eps = 1e-6f;
	struct errstat e = { 0 };

	for (size_t di = 0; di < 5; di++) {
		for (int with_delta = 0; with_delta < 2; with_delta++) {
			int dim = dims[di];
			size_t sz = (size_t)n * dim;
			float *resid = balloc(be, sizeof(float) * sz);
			float *delta = balloc(be, sizeof(float) * sz);
			float *y = balloc(be, sizeof(float) * sz);
			float *w = balloc(be, sizeof(float) * dim);
			float *r0 = malloc(sizeof(float) * sz);

			assert_non_null(r0);
			for (size_t i = 0; i < sz; i++) {
				resid[i] = rnd(4.0f);
				delta[i] = rnd(1.0f);
				r0[i] = with_delta ? resid[i] + delta[i] : resid[i];
			}
			for (int k = 0; k < dim; k++)
				w[k] = 1.0f + rnd(0.5f);
			be->ops->add_rmsnorm(be, y, resid, with_delta ? delta : NULL, w, n, dim,
					     eps);
			assert_memory_equal(resid, r0, sizeof(float) * sz);
			for (int i = 0; i < n; i++) {
				const float *r = r0 + (size_t)i * dim;
				double ss = 0, inv;

				for (int k = 0; k < dim; k++)
					ss += (double)r[k] * r[k];
				inv = 1.0 / sqrt(ss / dim + (double)eps);
				for (int k = 0; k < dim; k++) {
					double ref = r[k] * inv * w[k];

					err_add_nan_ok(&e, y[(size_t)i * dim + k], ref, fabs(ref) + 1e-30);
				}
			}
			free(r0);
			bfree_all(be, w, y, delta, resid);
		}
	}
	err_report_wide("add_rmsnorm (rel to |ref|)", &e, 1e-6);
	sm70_backend_destroy(be);
}

/* ---- matmul ----------------------------------------------------------------------------- */

/* Tolerance: |y - ref| <= 1e-6 * sum_k |x_k w_k|, the scale of f32 accumulation error
 * (the reference uses the same decoded weights, so weight rounding is not counted). */
static void matmul_case(struct sm70_backend *be, enum sm70_dtype t, int n, int cols, int rows,
			struct errstat *e)
{
	float *dec = malloc(sizeof(float) * rows * cols);
	float *x = balloc(be, sizeof(float) * n * cols);
	float *y = balloc(be, sizeof(float) * n * rows);
	struct sm70_weight w;

	assert_non_null(dec);
	fill_weight(be, &w, dec, t, rows, cols, 1.0f);
	for (int i = 0; i < n * cols; i++)
		x[i] = rnd(2.0f);
	be->ops->matmul(be, y, rows & 1, x, &w, n);
	for (int i = 0; i < n; i++) {
		for (int o = 0; o < rows; o++) {
			double s = 0, sa = 0;

			for (int k = 0; k < cols; k++) {
				double p = (double)x[i * cols + k] * dec[(size_t)o * cols + k];

				s += p;
				sa += fabs(p);
			}
			err_add_nan_ok(e, y[(size_t)i * rows + o], s, sa + 1e-30);
		}
	}
	bfree_all(be, w.data, y, x);
	free(dec);
}

static void test_matmul(void **state)
{
	struct sm70_backend *be = cpu_backend(3);
	const int ns[] = { 1, 3, 5 }, colss[] = { 1, 3, 17, 130, 1000 };
	const int rowss[] = { 1, 3, 17, 130, 300 };
	struct errstat e[3] = { { 0 } };

	for (size_t c = 0; c < 3 * 3 * 5 * 5; c++) {
		size_t ti = c / 75, ni = c / 25 % 3, ci = c / 5 % 5, ri = c % 5;

		matmul_case(be, wtypes[ti], ns[ni], colss[ci], rowss[ri], &e[ti]);
	}
	err_report_wide("matmul f32 W (rel to sum |x w|)", &e[0], 1e-6);
	err_report_wide("matmul f16 W (rel to sum |x w|)", &e[1], 1e-6);
	err_report_wide("matmul bf16 W (rel to sum |x w|)", &e[2], 1e-6);
	sm70_backend_destroy(be);
}

/* 1 thread and 4 threads, and the no-scratch path, must give the same bits. */
static void test_matmul_bitwise(void **state)
{
	struct sm70_backend *b1 = cpu_backend(1), *b4 = cpu_backend(4);
	const int n = 7, cols = 1029, rows = 515;
	float *dec = malloc(sizeof(float) * rows * cols);
	float *x = balloc(b1, sizeof(float) * n * cols);
	float *y1 = balloc(b1, sizeof(float) * n * rows);
	float *y4 = balloc(b1, sizeof(float) * n * rows);

	assert_non_null(dec);
	for (int i = 0; i < n * cols; i++)
		x[i] = rnd(1.0f);
	for (size_t ti = 0; ti < 3; ti++) {
		struct sm70_weight w;

		fill_weight(b1, &w, dec, wtypes[ti], rows, cols, 1.0f);
		b1->ops->matmul(b1, y1, 1, x, &w, n);
		b4->ops->matmul(b4, y4, 1, x, &w, n);
		assert_memory_equal(y1, y4, sizeof(float) * n * rows);
		sm70__cpu_of(b4)->scratch_off = 1;
		memset(y4, 0, sizeof(float) * n * rows);
		b4->ops->matmul(b4, y4, 1, x, &w, n);
		sm70__cpu_of(b4)->scratch_off = 0;
		assert_memory_equal(y1, y4, sizeof(float) * n * rows);
		printf("  matmul %s W [%d x %d], n %d: 1 thread == 4 threads == no-scratch path, "
		       "bitwise over %d values\n", sm70_dtype_name(wtypes[ti]), rows, cols, n,
		       n * rows);
		b1->ops->buf_free(b1, w.data);
	}
	b1->ops->buf_free(b1, y4);
	b1->ops->buf_free(b1, y1);
	b1->ops->buf_free(b1, x);
	free(dec);
	sm70_backend_destroy(b4);
	sm70_backend_destroy(b1);
}

/* ---- head_norm_rope -------------------------------------------------------------------- */

static void rope_case(struct sm70_backend *be, int hd, int rot, int norm, double theta,
		      struct errstat *e)
{
	const int32_t positions[] = { 0, 1, 17, 4000, 131071 };
	const int n = 5, n_heads = 3, half = rot / 2, ld = n_heads * hd + 5;
	const float eps = 1e-6f;
	float *qk = balloc(be, sizeof(float) * n * ld);
	float *q0 = malloc(sizeof(float) * n * ld);
	float *w = balloc(be, sizeof(float) * hd);
	int32_t *pos = balloc(be, sizeof(int32_t) * n);

	assert_non_null(q0);
	for (int i = 0; i < n * ld; i++)
		q0[i] = qk[i] = rnd(3.0f);
	for (int k = 0; k < hd; k++)
		w[k] = 1.0f + rnd(0.5f);
	memcpy(pos, positions, sizeof(positions));
	be->ops->head_norm_rope(be, qk, ld, n, n_heads, hd, norm ? w : NULL, eps, pos, rot,
				theta);
	for (int i = 0; i < n; i++) {
		for (int k = n_heads * hd; k < ld; k++)
			assert_true(qk[i * ld + k] == q0[i * ld + k]);
		for (int h = 0; h < n_heads; h++) {
			const float *x0 = q0 + i * ld + h * hd, *got = qk + i * ld + h * hd;
			double x[256], mx = 0, inv = 1, ss = 0;

			for (int k = 0; k < hd; k++)
				ss += (double)x0[k] * x0[k];
			if (norm)
				inv = 1.0 / sqrt(ss / hd + (double)eps);
			for (int k = 0; k < hd; k++) {
				x[k] = norm ? x0[k] * inv * w[k] : x0[k];
				mx = fmax(mx, fabs(x[k]));
			}
			for (int j = 0; j < half; j++) {
				/* the f32 angle, made the way transformers makes it */
				float ef = (float)(2 * j) / (float)rot;
				float invf = 1.0f / powf((float)theta, ef);
				double ang = (float)pos[i] * invf;
				double a = x[j], b = x[j + half];

				x[j] = a * cos(ang) - b * sin(ang);
				x[j + half] = b * cos(ang) + a * sin(ang);
			}
			for (int k = 0; k < hd; k++)
				err_add_nan_ok(e, got[k], x[k], mx);
		}
	}
	be->ops->buf_free(be, pos);
	be->ops->buf_free(be, w);
	free(q0);
	be->ops->buf_free(be, qk);
}

/*
 * The reference reproduces the angle as transformers makes it, in f32 (exponent 2j/rot
 * as a float division, powf, a float reciprocal, (float)pos * inv_freq), since at large
 * positions the angle's rounding matters more than anything else; everything after it
 * (norm, cos/sin, rotation) is in double. Tolerance: 1e-6 of the head's largest value.
 * Columns past the heads (the row's ld padding) must stay untouched. Partial rotary
 * (rot_dim = head_dim / 4, as qwen3_next) leaves the other dims alone.
 */
static void test_head_norm_rope(void **state)
{
	struct sm70_backend *be = cpu_backend(2);
	const int hds[] = { 64, 128, 256 };
	struct errstat e = { 0 };

	for (size_t hi = 0; hi < 3; hi++)
		for (int partial = 0; partial < 2; partial++)
			for (int norm = 0; norm < 2; norm++)
				rope_case(be, hds[hi], partial ? hds[hi] / 4 : hds[hi], norm,
					  partial ? 1e7 : 10000.0, &e);
	err_report_wide("head_norm_rope (rel to max |head|)", &e, 1e-6);
	sm70_backend_destroy(be);
}

/* ---- kv_write and attention ------------------------------------------------------------- */

/* Whether cache element i holds x encoded (or 0 when the slot was never written). */
static int kv_stored_ok(const void *cache, size_t i, enum sm70_dtype t, float x, float scale,
			int unwritten)
{
	if (t == SM70_DTYPE_F16)
		return ((const uint16_t *)cache)[i] == (unwritten ? 0 : sm70_f32_to_f16(x));
	if (t == SM70_DTYPE_F8E4M3)
		return ((const uint8_t *)cache)[i] == (unwritten ? 0 : sm70_f32_to_e4m3(x / scale));
	return ((const float *)cache)[i] == x;
}

/* The KV dtype pairs the CPU tests cover: V like K for each dtype, and the "fp8" mode's K
 * FP8-E4M3 with V f16 (the others mix the same row conversions). */
static const struct kv_pair {
	enum sm70_dtype k, v;
	const char *name;
} kv_pairs[] = {
	{ SM70_DTYPE_F32, SM70_DTYPE_F32, "f32" },
	{ SM70_DTYPE_F16, SM70_DTYPE_F16, "f16" },
	{ SM70_DTYPE_F8E4M3, SM70_DTYPE_F8E4M3, "fp8-all" },
	{ SM70_DTYPE_F8E4M3, SM70_DTYPE_F16, "fp8 (K e4m3, V f16)" },
};
#define N_KV_PAIRS 4

static struct sm70_kv_layout kv_pair_layout(const struct kv_pair *pr, int n_blocks, int bs,
					    int n_kv, int hd)
{
	return (struct sm70_kv_layout){ .dtype = pr->k, .n_blocks = n_blocks, .block_size = bs,
					.n_kv_heads = n_kv, .head_dim = hd,
					.v_dtype = pr->v == pr->k ? SM70_KV_V_AS_K :
								    SM70_KV_V(pr->v) };
}

/* Every stored element is bitwise the dtype's encoding of the input (FP8: of x/scale), K
 * in K's dtype and V in V's; untouched slots and skipped rows (slot -1) stay zero. */
static void test_kv_write(void **state)
{
	struct sm70_backend *be = cpu_backend(3);
	size_t checked = 0;

	for (size_t ti = 0; ti < N_KV_PAIRS; ti++) {
		struct sm70_kv_layout lay = kv_pair_layout(&kv_pairs[ti], 6, 7, 3, 17);
		const int n = 20, row = lay.n_kv_heads * lay.head_dim, ld = row + 3;
		const int n_slots = lay.n_blocks * lay.block_size;
		size_t ksz = sm70_dtype_size(lay.dtype);
		size_t vsz = sm70_dtype_size(sm70_kv_v_dtype(&lay));
		struct sm70_kv_layer kv = { balloc(be, ksz * n_slots * row),
					    balloc(be, vsz * n_slots * row), 0.01f, 0.03f };
		float *k = balloc(be, sizeof(float) * n * ld);
		float *v = balloc(be, sizeof(float) * n * ld);
		int32_t *slots = balloc(be, sizeof(int32_t) * n);
		int owner[42];

		for (int s = 0; s < n_slots; s++)
			owner[s] = -1;
		for (int i = 0; i < n * ld; i++) {
			k[i] = rnd(2.0f);
			v[i] = rnd(2.0f);
		}
		for (int i = 0; i < n; i++) {
			slots[i] = i % 6 == 5 ? -1 : (i * 13 + 5) % n_slots;
			if (slots[i] >= 0)
				owner[slots[i]] = i;
		}
		be->ops->kv_write(be, &kv, &lay, k, v, ld, slots, n);
		for (int s = 0; s < n_slots; s++) {
			for (int d = 0; d < row; d++) {
				size_t idx = (size_t)s * row + d;

				for (int which = 0; which < 2; which++) {
					const void *cache = which ? kv.v : kv.k;
					const float *src = which ? v : k;
					float scale = which ? kv.v_scale : kv.k_scale;
					float x = owner[s] < 0 ? 0.0f : src[owner[s] * ld + d];
					enum sm70_dtype t = which ? sm70_kv_v_dtype(&lay) :
								    lay.dtype;

					assert_true(kv_stored_ok(cache, idx, t, x, scale,
								 owner[s] < 0));
					checked++;
				}
			}
		}
		bfree_all(be, slots, v, k, kv.v, kv.k);
	}
	printf("  kv_write: %zu cache elements bitwise equal to their f32/f16/fp8 encodings "
	       "(V like K, and K fp8 with V f16)\n", checked);
	sm70_backend_destroy(be);
}

#define ATT_SEQS 4

/*
 * One attention case: ATT_SEQS sequences of different lengths in a shuffled block table,
 * their whole K/V written through kv_write, then a batch mixing a one-token prompt,
 * prefill chunks and a decode token. The reference reads the cache back (so K/V
 * rounding is not counted), computes in double, and the tolerance is 1e-6 of the
 * largest |V| in the cache (the output is a convex combination of V rows). K and V in the
 * dtypes of pr.
 */
static void attention_case(struct sm70_backend *be, int hd, int ratio, int bs,
			   const struct kv_pair *pr, struct errstat *e)
{
	const int lens[ATT_SEQS] = { 1, 9, 40, 75 };
	const int take[ATT_SEQS] = { 1, 3, 1, 5 }; /* the last `take` tokens are in the batch */
	const int n_kv = ratio == 6 ? 1 : 2, n_heads = n_kv * ratio;
	const int row = n_kv * hd, ld = row + 3, q_ld = n_heads * hd + 8;
	const enum sm70_dtype t = pr->k, vt = pr->v;
	const size_t ksz = sm70_dtype_size(t), vsz = sm70_dtype_size(vt);
	int max_blocks = 0, n_blocks = 3, total = 0, n_tok = 0, perm[64];
	struct sm70_kv_layout lay;
	struct sm70_kv_layer kv;
	struct sm70_batch b;
	int32_t *bt, *slots, *tp, *ts, *tslot;
	float *k, *v, *q, *out, vmax = 0;

	for (int s = 0; s < ATT_SEQS; s++) {
		int nb = (lens[s] + bs - 1) / bs;

		max_blocks = nb > max_blocks ? nb : max_blocks;
		n_blocks += nb;
		total += lens[s];
		n_tok += take[s];
	}
	assert_true(n_blocks <= 64);
	lay = kv_pair_layout(pr, n_blocks, bs, n_kv, hd);
	kv = (struct sm70_kv_layer){ balloc(be, ksz * n_blocks * bs * row),
				     balloc(be, vsz * n_blocks * bs * row), 0.004f, 0.006f };
	for (int i = 0; i < n_blocks; i++)
		perm[i] = i;
	for (int i = n_blocks - 1; i > 0; i--) {
		int r = rnd_int(i + 1), tmp = perm[i];

		perm[i] = perm[r];
		perm[r] = tmp;
	}
	/* Block table entries past a sequence's length hold a poison value: reading one
	 * would go far outside the cache, which ASan reports. */
	bt = balloc(be, sizeof(int32_t) * ATT_SEQS * (max_blocks + 1));
	for (int s = 0, used = 0; s < ATT_SEQS; s++)
		for (int i = 0; i < max_blocks + 1; i++)
			bt[s * (max_blocks + 1) + i] =
				i < (lens[s] + bs - 1) / bs ? perm[used++] : 0x3fffffff;

	/* the whole K/V history through kv_write */
	k = balloc(be, sizeof(float) * total * ld);
	v = balloc(be, sizeof(float) * total * ld);
	slots = balloc(be, sizeof(int32_t) * total);
	for (int s = 0, i = 0; s < ATT_SEQS; s++) {
		for (int p = 0; p < lens[s]; p++, i++) {
			slots[i] = bt[s * (max_blocks + 1) + p / bs] * bs + p % bs;
			for (int d = 0; d < ld; d++) {
				k[i * ld + d] = rnd(1.0f);
				v[i * ld + d] = rnd(1.0f);
			}
		}
	}
	be->ops->kv_write(be, &kv, &lay, k, v, ld, slots, total);
	for (size_t i = 0; i < (size_t)n_blocks * bs * row; i++)
		vmax = fmaxf(vmax, fabsf(kv_value(kv.v, i, vt, kv.v_scale)));

	tp = balloc(be, sizeof(int32_t) * n_tok);
	ts = balloc(be, sizeof(int32_t) * n_tok);
	tslot = balloc(be, sizeof(int32_t) * n_tok);
	q = balloc(be, sizeof(float) * n_tok * q_ld);
	out = balloc(be, sizeof(float) * n_tok * n_heads * hd);
	for (int s = 0, i = 0; s < ATT_SEQS; s++) {
		for (int p = lens[s] - take[s]; p < lens[s]; p++, i++) {
			tp[i] = p;
			ts[i] = s;
			tslot[i] = bt[s * (max_blocks + 1) + p / bs] * bs + p % bs;
		}
	}
	for (int i = 0; i < n_tok * q_ld; i++)
		q[i] = rnd(4.0f);
	b = (struct sm70_batch){ .n_tokens = n_tok, .n_seqs = ATT_SEQS,
				 .max_blocks = max_blocks + 1, .max_pos = 75, .tok_pos = tp,
				 .tok_seq = ts, .tok_slot = tslot, .block_tables = bt };
	be->ops->attention(be, out, q, q_ld, &kv, &lay, &b, n_heads, 1.0f / sqrtf((float)hd));

	for (int i = 0; i < n_tok; i++) {
		for (int h = 0; h < n_heads; h++) {
			const int32_t *tab = bt + ts[i] * (max_blocks + 1);
			const int kh = h / ratio, np = tp[i] + 1;
			size_t base[75];
			double sc[75], mx = -INFINITY, sum = 0, ref[256] = { 0 };

			for (int p = 0; p < np; p++) {
				double s = 0;

				base[p] = ((size_t)(tab[p / bs] * bs + p % bs) * n_kv + kh) * hd;
				for (int d = 0; d < hd; d++)
					s += (double)q[i * q_ld + h * hd + d] *
					     kv_value(kv.k, base[p] + d, t, kv.k_scale);
				sc[p] = s / sqrt((double)hd);
				mx = fmax(mx, sc[p]);
			}
			for (int p = 0; p < np; p++)
				sum += (sc[p] = exp(sc[p] - mx));
			for (int p = 0; p < np; p++) {
				double w = sc[p] / sum;

				for (int d = 0; d < hd; d++)
					ref[d] += w * kv_value(kv.v, base[p] + d, vt, kv.v_scale);
			}
			for (int d = 0; d < hd; d++)
				err_add_nan_ok(e, out[((size_t)i * n_heads + h) * hd + d], ref[d], vmax);
		}
	}
	bfree_all(be, out, q, tslot, ts, tp, slots, v, k, bt, kv.v, kv.k);
}

static void test_attention(void **state)
{
	struct sm70_backend *be = cpu_backend(3);
	const int hds[] = { 64, 128, 256 }, ratios[] = { 1, 2, 6 }, bss[] = { 16, 7 };
	struct errstat e[N_KV_PAIRS] = { { 0 } }, e2 = { 0 };
	char what[64];

	for (size_t c = 0; c < N_KV_PAIRS * 3 * 3 * 2; c++) {
		size_t ti = c / 18, hi = c / 6 % 3, ri = c / 2 % 3, bi = c % 2;

		attention_case(be, hds[hi], ratios[ri], bss[bi], &kv_pairs[ti], &e[ti]);
	}
	for (size_t ti = 0; ti < N_KV_PAIRS; ti++) {
		snprintf(what, sizeof(what), "attention, %s KV (rel to max |V|)",
			 kv_pairs[ti].name);
		err_report_wide(what, &e[ti], 1e-6);
	}
	/* the two-pass path taken when there is no scratch */
	sm70__cpu_of(be)->scratch_off = 1;
	for (size_t ti = 0; ti < N_KV_PAIRS; ti++)
		attention_case(be, 128, 2, 7, &kv_pairs[ti], &e2);
	sm70__cpu_of(be)->scratch_off = 0;
	err_report_wide("attention, no-scratch path (rel to max |V|)", &e2, 1e-6);
	sm70_backend_destroy(be);
}

/* ---- silu_mul ---------------------------------------------------------------------------- */

/* Tolerance: 1e-6 of |reference| (expf, a division, a product), with an absolute floor
 * of 1e-30 for gates so negative that silu underflows. */
static void test_silu_mul(void **state)
{
	struct sm70_backend *be = cpu_backend(2);
	const int inters[] = { 1, 3, 17, 130, 2000 };
	const int n = 6;
	struct errstat e = { 0 };

	for (size_t ii = 0; ii < 5; ii++) {
		int inter = inters[ii];
		float *gu = balloc(be, sizeof(float) * n * 2 * inter);
		float *out = balloc(be, sizeof(float) * n * inter);

		for (int i = 0; i < n * 2 * inter; i++)
			gu[i] = rnd(12.0f);
		gu[0] = -100.0f;
		gu[n * 2 * inter - inter - 1] = 100.0f;
		be->ops->silu_mul(be, out, gu, n, inter);
		for (int i = 0; i < n; i++) {
			for (int k = 0; k < inter; k++) {
				double g = gu[i * 2 * inter + k], u = gu[i * 2 * inter + inter + k];
				double ref = g / (1.0 + exp(-g)) * u;

				err_add_nan_ok(&e, out[i * inter + k], ref, fabs(ref) + 1e-30);
			}
		}
		be->ops->buf_free(be, out);
		be->ops->buf_free(be, gu);
	}
	err_report_wide("silu_mul (rel to |ref|)", &e, 1e-6);
	sm70_backend_destroy(be);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_pool_sum),
		cmocka_unit_test(test_backend_basics),
		cmocka_unit_test(test_row_conversion),
		cmocka_unit_test(test_embed),
		cmocka_unit_test(test_gather_add),
		cmocka_unit_test(test_add_rmsnorm),
		cmocka_unit_test(test_matmul),
		cmocka_unit_test(test_matmul_bitwise),
		cmocka_unit_test(test_head_norm_rope),
		cmocka_unit_test(test_kv_write),
		cmocka_unit_test(test_attention),
		cmocka_unit_test(test_silu_mul),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
