/* test_nvfp4_ops - NVFP4 weights on the CPU backend: prepare_weight (the ModelOpt layout
 * kept, its named refusals), matmul against a float64 reference decoded in this file from
 * the ModelOpt bytes (every E2M1 code, E4M3 scales from subnormals to 448, a zero-scale
 * row, odd row counts, K 16 / 48 / 2048, n 1 / 3 / 16 / 17), bitwise the same on 1 and 4
 * threads and on the no-scratch path, and sm70_weight_bytes. */
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

#define OP_TEST_SEED 0xf4f4e2d1ULL

#include "kernels/backend.h"
#include "kernels/cpu/cpu_ops.h"
#include "tests/unit/op_test.h"

/* ---- the float64 reference, from the format's definition ----------------------------- */

/* E2M1: sign bit 3; exponent bits 1-2 (bias 1), mantissa bit 0; exponent 0 subnormal. */
static double ref_e2m1(unsigned code)
{
	const unsigned e = (code >> 1) & 3, m = code & 1;
	const double mag = e ? ldexp(1.0 + m / 2.0, (int)e - 1) : m / 2.0;

	return (code & 8) ? -mag : mag;
}

/* E4M3 (finite codes): sign bit 7; exponent bits 3-6 (bias 7), mantissa bits 0-2. */
static double ref_e4m3(unsigned v)
{
	const unsigned e = (v >> 3) & 15, m = v & 7;
	const double mag = e ? ldexp(1.0 + m / 8.0, (int)e - 7) : ldexp((double)m, -9);

	return (v & 0x80) ? -mag : mag;
}

/* A host NVFP4 matrix in ModelOpt's layout. */
struct host_fp4 {
	struct sm70_weight w; /* data, scale: host memory owned here */
};

static void host_fp4_new(struct host_fp4 *h, int rows, int cols, float scale2)
{
	h->w = (struct sm70_weight){ .dtype = SM70_DTYPE_NVFP4, .rows = rows, .cols = cols,
				     .scale2 = scale2 };
	h->w.data = calloc((size_t)rows * cols / 2, 1);
	h->w.scale = calloc((size_t)rows * cols / 16, 1);
	assert_non_null(h->w.data);
	assert_non_null(h->w.scale);
}

static void host_fp4_free(struct host_fp4 *h)
{
	free(h->w.data);
	free(h->w.scale);
}

static unsigned code_at(const struct sm70_weight *w, int r, int k)
{
	const uint8_t b = ((const uint8_t *)w->data)[(size_t)r * (w->cols / 2) + k / 2];

	return (k & 1) ? b >> 4 : b & 15;
}

static void set_code(struct sm70_weight *w, int r, int k, unsigned code)
{
	uint8_t *b = (uint8_t *)w->data + (size_t)r * (w->cols / 2) + k / 2;

	*b = (k & 1) ? (uint8_t)((*b & 0x0f) | (code << 4)) : (uint8_t)((*b & 0xf0) | code);
}

static double ref_w(const struct sm70_weight *w, int r, int k)
{
	const uint8_t s = ((const uint8_t *)w->scale)[(size_t)r * (w->cols / 16) + k / 16];

	return ref_e2m1(code_at(w, r, k)) * ref_e4m3(s) * (double)w->scale2;
}

/* A random finite E4M3 byte, positive (as ModelOpt's scales are) unless signed. */
static uint8_t rnd_e4m3(int signed_ok)
{
	uint8_t v;

	do
		v = (uint8_t)rnd_int(signed_ok ? 256 : 128);
	while ((v & 0x7f) == 0x7f);
	return v;
}

/* ---- helpers ----------------------------------------------------------------------- */

/* h prepared on be, checked to be the ModelOpt bytes (the CPU's arrangement). */
static struct sm70_weight prepare(struct sm70_backend *be, const struct host_fp4 *h)
{
	struct sm70_err err = { { 0 } };
	struct sm70_weight w;

	if (be->ops->prepare_weight(be, &w, &h->w, &err))
		fail_msg("prepare_weight: %s", err.msg);
	assert_int_equal(w.dtype, SM70_DTYPE_NVFP4);
	assert_int_equal(w.rows, h->w.rows);
	assert_int_equal(w.cols, h->w.cols);
	assert_true(w.scale2 == h->w.scale2);
	assert_memory_equal(w.data, h->w.data, (size_t)w.rows * w.cols / 2);
	assert_memory_equal(w.scale, h->w.scale, (size_t)w.rows * w.cols / 16);
	return w;
}

static void release(struct sm70_backend *be, struct sm70_weight *w)
{
	be->ops->buf_free(be, w->data);
	be->ops->buf_free(be, w->scale);
}

/*
 * y = x W^T on be against the float64 reference, error per output relative to
 * sum_k |x_k W_k| (the scale of f32 rounding in a dot): W's elements are correctly
 * rounded f32 (2^-24 each) and the dot keeps 8 partial sums of K / 8 terms, so the
 * first-order bound is (K / 8 + 4) * 2^-24. Returns y (f32 [n][rows], the caller frees it).
 */
static float *check_matmul(struct sm70_backend *be, const struct host_fp4 *h, const float *x,
			   int n, const char *what)
{
	const int rows = h->w.rows, cols = h->w.cols;
	struct sm70_weight w = prepare(be, h);
	float *bx = balloc(be, sizeof(float) * (size_t)n * cols);
	float *y = balloc(be, sizeof(float) * (size_t)n * rows);
	float *out = malloc(sizeof(float) * (size_t)n * rows);
	const double tol = (cols / 8 + 4) * 0x1p-24;
	struct errstat e = { 0 };
	char line[160];

	assert_non_null(out);
	memcpy(bx, x, sizeof(float) * (size_t)n * cols);
	be->ops->matmul(be, y, 1, bx, &w, n);
	for (int i = 0; i < n; i++) {
		for (int r = 0; r < rows; r++) {
			double ref = 0.0, mag = 0.0;

			for (int k = 0; k < cols; k++) {
				const double p = (double)x[(size_t)i * cols + k] * ref_w(&h->w, r, k);

				ref += p;
				mag += fabs(p);
			}
			err_add(&e, y[(size_t)i * rows + r], ref, mag);
		}
	}
	snprintf(line, sizeof(line), "%s W [%d x %d], n %d (rel to sum |x w|)", what, rows, cols,
		 n);
	err_report(line, &e, tol);
	memcpy(out, y, sizeof(float) * (size_t)n * rows);
	be->ops->buf_free(be, y);
	be->ops->buf_free(be, bx);
	release(be, &w);
	return out;
}

static float *rnd_x(int n, int cols, float amp)
{
	float *x = malloc(sizeof(float) * (size_t)n * cols);

	assert_non_null(x);
	for (size_t i = 0; i < (size_t)n * cols; i++)
		x[i] = rnd(amp);
	return x;
}

/* ---- E2M1 codes ------------------------------------------------------------------- */

/* Every code through matmul: row c of W holds code c everywhere, scale 1, scale2 1, and
 * x = e_k picks one column, so y[k][c] must be e2m1(c) exactly. */
static void test_e2m1_codes(void **state)
{
	struct sm70_backend *be = cpu_backend(2);
	struct host_fp4 h;
	float *x = calloc(16 * 16, sizeof(float)), *y;

	assert_non_null(x);
	host_fp4_new(&h, 16, 16, 1.0f);
	for (int c = 0; c < 16; c++) {
		for (int k = 0; k < 16; k++)
			set_code(&h.w, c, k, (unsigned)c);
		((uint8_t *)h.w.scale)[c] = 0x38; /* 1.0 */
		x[c * 16 + c] = 1.0f;
	}
	y = check_matmul(be, &h, x, 16, "e2m1 codes 0..15");
	for (int c = 0; c < 16; c++)
		for (int k = 0; k < 16; k++)
			assert_true(y[k * 16 + c] == (float)ref_e2m1((unsigned)c));
	/* the table's ends and its -0 (a dot's +0 start hides the sign: it must be 0) */
	assert_true(ref_e2m1(7) == 6.0 && ref_e2m1(15) == -6.0 && ref_e2m1(1) == 0.5);
	assert_true(ref_e2m1(8) == 0.0 && signbit(ref_e2m1(8)) && y[8 * 16 + 8] == 0.0f);
	printf("  e2m1: all 16 codes (8 is -0) exact through matmul\n");
	free(y);
	free(x);
	host_fp4_free(&h);
	sm70_backend_destroy(be);
}

/* ---- E4M3 scales ------------------------------------------------------------------- */

/* Row r scaled by one E4M3 byte: the subnormals 0x01..0x07, the first normal 0x08, 1.0,
 * 448 (0x7e), a negative scale, and zero, each checked exactly with x = 1 on one
 * element of code 2 (1.0): y = e4m3 * scale2 rounded once. */
static void test_e4m3_scales(void **state)
{
	static const uint8_t bytes[] = { 0x01, 0x02, 0x03, 0x05, 0x07, 0x08, 0x09, 0x38,
					 0x3b, 0x6f, 0x7e, 0xb8, 0x80, 0x00 };
	const int rows = (int)(sizeof(bytes) / sizeof(bytes[0]));
	const float scale2 = 0.0123f;
	struct sm70_backend *be = cpu_backend(2);
	struct host_fp4 h;
	float x[16] = { 0 }, *y;

	host_fp4_new(&h, rows, 16, scale2);
	for (int r = 0; r < rows; r++) {
		((uint8_t *)h.w.scale)[r] = bytes[r];
		set_code(&h.w, r, 5, 2);
		set_code(&h.w, r, 6, 7); /* x is 0 there */
	}
	x[5] = 1.0f;
	y = check_matmul(be, &h, x, 1, "e4m3 scales");
	for (int r = 0; r < rows; r++) {
		const float want = (float)(ref_e4m3(bytes[r]) * (double)scale2);

		assert_true(y[r] == want);
		assert_true((float)ref_e4m3(bytes[r]) == sm70_e4m3_to_f32(bytes[r]));
	}
	assert_true(ref_e4m3(0x7e) == 448.0 && ref_e4m3(0x01) == 0x1p-9);
	printf("  e4m3: %d scale bytes (subnormals, 448, negative, zero) exact\n", rows);
	free(y);
	host_fp4_free(&h);
	sm70_backend_destroy(be);
}

/* ---- random matrices ---------------------------------------------------------------- */

/* Random codes (every byte value) and scales, odd row counts, K 16 / 48 / 2048, n 1 / 3 /
 * 16 / 17; row 1 has zero scales throughout and must give exact zeros. */
static void test_matmul_random(void **state)
{
	static const int shapes[][2] = { { 7, 16 }, { 33, 48 }, { 19, 2048 }, { 1, 48 } };
	static const int ns[] = { 1, 3, 16, 17 };
	struct sm70_backend *be = cpu_backend(4);

	for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
		const int rows = shapes[s][0], cols = shapes[s][1];
		struct host_fp4 h;

		host_fp4_new(&h, rows, cols, rnd_range(1e-4f, 4.0f));
		for (size_t i = 0; i < (size_t)rows * cols / 2; i++)
			((uint8_t *)h.w.data)[i] = (uint8_t)rnd_int(256);
		for (size_t i = 0; i < (size_t)rows * cols / 16; i++)
			((uint8_t *)h.w.scale)[i] = rnd_e4m3(0);
		if (rows > 1)
			memset((uint8_t *)h.w.scale + cols / 16, 0, (size_t)cols / 16);
		for (size_t k = 0; k < sizeof(ns) / sizeof(ns[0]); k++) {
			float *x = rnd_x(ns[k], cols, 2.0f), *y;

			y = check_matmul(be, &h, x, ns[k], "nvfp4 random");
			for (int i = 0; rows > 1 && i < ns[k]; i++)
				assert_true(y[(size_t)i * rows + 1] == 0.0f);
			free(y);
			free(x);
		}
		host_fp4_free(&h);
	}
	sm70_backend_destroy(be);
}

/* The same outputs, bit for bit, on 1 and 4 threads and without scratch. */
static void test_matmul_threads(void **state)
{
	struct sm70_backend *b1 = cpu_backend(1), *b4 = cpu_backend(4);
	const int rows = 37, cols = 1040, n = 5;
	struct host_fp4 h;
	float *x = rnd_x(n, cols, 1.0f);
	float *y1 = balloc(b1, sizeof(float) * n * rows), *y4 = balloc(b4, sizeof(float) * n * rows);
	struct sm70_weight w1, w4;

	host_fp4_new(&h, rows, cols, 0.5f);
	for (size_t i = 0; i < (size_t)rows * cols / 2; i++)
		((uint8_t *)h.w.data)[i] = (uint8_t)rnd_int(256);
	for (size_t i = 0; i < (size_t)rows * cols / 16; i++)
		((uint8_t *)h.w.scale)[i] = rnd_e4m3(1);
	w1 = prepare(b1, &h);
	w4 = prepare(b4, &h);
	b1->ops->matmul(b1, y1, 1, x, &w1, n);
	b4->ops->matmul(b4, y4, 1, x, &w4, n);
	assert_memory_equal(y1, y4, sizeof(float) * n * rows);
	sm70__cpu_of(b4)->scratch_off = 1;
	memset(y4, 0, sizeof(float) * n * rows);
	b4->ops->matmul(b4, y4, 1, x, &w4, n);
	sm70__cpu_of(b4)->scratch_off = 0;
	assert_memory_equal(y1, y4, sizeof(float) * n * rows);
	printf("  nvfp4 W [%d x %d], n %d: 1 thread == 4 threads == no-scratch path, bitwise\n",
	       rows, cols, n);
	release(b4, &w4);
	release(b1, &w1);
	b4->ops->buf_free(b4, y4);
	b1->ops->buf_free(b1, y1);
	host_fp4_free(&h);
	free(x);
	sm70_backend_destroy(b4);
	sm70_backend_destroy(b1);
}

/* ---- refusals and byte counts ------------------------------------------------------- */

static void expect_refusal(struct sm70_backend *be, const struct sm70_weight *src,
			   const char *needle)
{
	struct sm70_err err = { { 0 } };
	struct sm70_weight w = { .data = (void *)1 };

	assert_int_equal(be->ops->prepare_weight(be, &w, src, &err), -EINVAL);
	assert_null(w.data);
	assert_null(w.scale);
	assert_non_null(strstr(err.msg, needle));
	printf("  refused: %s\n", err.msg);
}

static void test_prepare_refusals(void **state)
{
	struct sm70_backend *be = cpu_backend(1);
	struct host_fp4 h;
	struct sm70_weight bad;

	host_fp4_new(&h, 3, 48, 1.0f);
	bad = h.w;
	bad.cols = 40;
	expect_refusal(be, &bad, "multiple of 16");
	bad = h.w;
	bad.dtype = SM70_DTYPE_F16;
	expect_refusal(be, &bad, "not nvfp4");
	bad = h.w;
	bad.scale2 = NAN;
	expect_refusal(be, &bad, "weight_scale_2");
	((uint8_t *)h.w.scale)[2 * 3 + 1] = 0xff;
	expect_refusal(be, &h.w, "weight_scale[2][1]");
	host_fp4_free(&h);
	sm70_backend_destroy(be);
}

static void test_weight_bytes(void **state)
{
	const struct sm70_weight fp4 = { .dtype = SM70_DTYPE_NVFP4, .rows = 6144, .cols = 4096 };
	const struct sm70_weight f16 = { .dtype = SM70_DTYPE_F16, .rows = 7, .cols = 3 };
	enum sm70_dtype t;

	assert_int_equal(sm70_weight_bytes(&fp4), (size_t)6144 * 4096 / 2 + 6144 * 4096 / 16);
	assert_int_equal(sm70_weight_bytes(&f16), 42);
	assert_int_equal(sm70_dtype_size(SM70_DTYPE_NVFP4), 0);
	assert_string_equal(sm70_dtype_name(SM70_DTYPE_NVFP4), "nvfp4");
	assert_int_equal(sm70_dtype_from_safetensors("nvfp4", &t), -EINVAL);
	assert_int_equal(sm70_dtype_from_safetensors("F8_E4M3", &t), 0);
	assert_int_equal(t, SM70_DTYPE_F8E4M3);
	printf("  sm70_weight_bytes: nvfp4 [6144 x 4096] = %zu (codes + scales)\n",
	       sm70_weight_bytes(&fp4));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_e2m1_codes),
		cmocka_unit_test(test_e4m3_scales),
		cmocka_unit_test(test_matmul_random),
		cmocka_unit_test(test_matmul_threads),
		cmocka_unit_test(test_prepare_refusals),
		cmocka_unit_test(test_weight_bytes),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
