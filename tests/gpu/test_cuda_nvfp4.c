/* test_cuda_nvfp4 - the CUDA matmul op on NVFP4 weights (kernels/cuda/matmul_nvfp4.cu,
 * matmul_nvfp4_split.cu) against its CPU twin on the same ModelOpt bytes, on a backend for
 * every kernel variant (SM70_NVFP4_VARIANT 0-3 and 5-8: auto, WMMA, the dot kernel with one
 * or two row tiles a block, the path back from the f16 sums (the dot kernel held to three
 * blocks an SM where that pays), the split kernel with its f16 block sums up to four rows
 * of x, reading x through L1 or from shared memory, the tile kernel with the same sums):
 * random and odd shapes, n = 1..16 and past 16, weights made by the quantizer's own code
 * (common/nvfp4.c) on every variant, the dot kernel's n = 1..4 on every shape,
 * f16 and f32 outputs, a 448 / zero / subnormal-scale row each checked on its own,
 * row_scale2 rows 2^10 apart; the reference paths (SM70_NVFP4=reference on ModelOpt's
 * layout, SM70_MATMUL=reference and an unaligned x on the arranged one); a captured graph
 * replayed over new x on the WMMA and dot kernels; prepare_weight's refusal of cols not a
 * multiple of 16. */
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

#include "common/dtype.h"
#include "common/nvfp4.h"
#include "kernels/backend.h"

#define GPU_TEST_SEED 0xf4e2d1c0ffeeULL
#include "tests/gpu/gpu_test.h"

/*
 * Errors are max |got - ref| over max |ref| ("rel"). Both backends see the same f16 x
 * and the same W: the CPU's elements are correctly rounded f32, the GPU's are exact, so
 * an f32 output differs only by the f32 summation order and that one product. WMMA:
 * e2m1 * e4m3 in f16, the tensor cores' f32 sums, 128 * scale2 on the f32 sum. The dot
 * kernel (n <= 4): every product x * e2m1 * 2^-14 exact in an FFMA, every sum f32, the
 * block scale and scale2 applied to f32 sums, so each term passes at most 17 + 2 S f32
 * roundings (S = ceil(64-column steps / 8); 33 at K = 4096): |err| <= 33 * 2^-24 * sum
 * |x w| = 2.0e-6 of it at worst, the same form as the WMMA path's and smaller than the
 * CPU's own serial sum's (K roundings). K = 4096 terms of |x w| summed in two orders stay
 * within a few 1e-6 of max |y| (the sums here are at most ~30 times max |y|). No path
 * rounds to f16 before the output, so the same bound holds on rows of tiny scales (2^-9,
 * compared on their own scale). An f16 output adds its rounding, at most 2^-11 of a
 * value's magnitude: <= 4.9e-4 of max |y|.
 */
#define TOL_F32 2e-5
#define TOL_F16 6e-4

/*
 * The f16-sum kernels (variants 6-8, and auto at one or two rows of x) sum each 16-column block
 * in f16 pairs, 8 terms a half, each rounding once: |err| <= 8 * 2^-11 of the terms' size
 * (sum over k of |x_k w_k|), plus the f16 underflow floor cols * scale2 * 2^-13
 * (matmul_nvfp4_split.cu's file comment), plus an f16 output's rounding. Every output is
 * checked against that bound; the worst ratio of error to terms' size is printed (random
 * roundings keep it well under the bound).
 */
#define TOL_SPLIT (8.0 / 2048.0)

/* The variants tested: SM70_NVFP4_VARIANT's values (matmul_nvfp4.cu) */
static const int variants[] = { 0, 1, 2, 3, 5, 6, 7, 8 };
#define N_VARIANTS ((int)(sizeof(variants) / sizeof(variants[0])))
/* The rows of x up to which variant v runs an f16-sum kernel (matmul_nvfp4_split.cu): the
 * split kernel (6: x through L1, 7: x in shared memory) up to 4, the tile kernel (8) up
 * to 2; 0 for the others. */
#define F16SUM_ROWS(v) ((v) == 6 || (v) == 7 ? 4 : (v) == 8 ? 2 : 0)

static struct sm70_backend *gpu, *gpu_ref, *cpu, *gpu_fp4ref;
/* gpu_var[i]: SM70_NVFP4_VARIANT=variants[i] for i >= 1 (variant 0 is gpu: var_be) */
static struct sm70_backend *gpu_var[N_VARIANTS];

static struct sm70_backend *var_be(int i)
{
	return i ? gpu_var[i] : gpu;
}

/* Whether be runs some of n rows of x on an f16-sum kernel: F16SUM_ROWS, and auto (variant
 * 0) at 1-2 (matmul_nvfp4.cu's fp4_dispatch). Past 16 rows the op takes slices of 16, so the
 * last slice's rows decide; the f16 bound then covers the f32 slices' outputs too. */
static int is_split(const struct sm70_backend *be, int n)
{
	const int last = n > 16 ? n % 16 : n;

	if (last == 0)
		return 0;
	if (be == gpu)
		return last <= 2;
	for (int i = 1; i < N_VARIANTS; i++)
		if (gpu_var[i] == be)
			return last <= F16SUM_ROWS(variants[i]);
	return 0;
}

/* ---- the matrices -------------------------------------------------------------------- */

struct fp4_host {
	struct sm70_weight w; /* ModelOpt layout, host memory owned here */
	int special_rows;     /* rows 0..2 carry the scales fp4_host_new gives them */
};

/* A random finite positive E4M3 scale byte (ModelOpt's scales are positive). */
static uint8_t rnd_scale(void)
{
	return (uint8_t)rnd_int(0x7f); /* 0x00 .. 0x7e: zero, subnormals .. 448 */
}

/* Random codes and scales; row 0 has every scale 448 (0x7e), row 1 zero scales, row 2 the
 * smallest subnormal (0x01). scale2 puts |W| at most ~0.05, as a checkpoint's. */
static void fp4_host_new(struct fp4_host *h, int rows, int cols)
{
	const size_t nc = (size_t)rows * cols / 2, ns = (size_t)rows * cols / 16;
	uint8_t *s;

	h->w = (struct sm70_weight){ .dtype = SM70_DTYPE_NVFP4, .rows = rows, .cols = cols,
				     .scale2 = 0.05f / 2688.0f };
	h->w.data = malloc(nc);
	h->w.scale = s = malloc(ns);
	assert_non_null(h->w.data);
	assert_non_null(s);
	for (size_t i = 0; i < nc; i++)
		((uint8_t *)h->w.data)[i] = (uint8_t)rnd_int(256);
	for (size_t i = 0; i < ns; i++)
		s[i] = rnd_scale();
	for (int r = 0; r < 3 && r < rows; r++)
		memset(s + (size_t)r * (cols / 16), r == 0 ? 0x7e : r == 1 ? 0x00 : 0x01,
		       (size_t)cols / 16);
	h->special_rows = 1;
}

/*
 * What sm70-quantize makes of a bf16 matrix: random weights of a checkpoint's scale
 * (|W| ~ 0.02, a row in 8 ten times larger, a column block in 5 all zero) quantized
 * block by block with common/nvfp4.c, scale_2 from the matrix's amax, as the quantizer
 * computes it.
 */
static void fp4_host_quantized(struct fp4_host *h, int rows, int cols)
{
	const size_t n = (size_t)rows * cols;
	float *wv = fvec(n), amax = 0.0f;
	uint8_t *codes, *scales;

	for (size_t i = 0; i < n; i++) {
		const int r = (int)(i / cols), blk = (int)(i % cols) / 16;

		wv[i] = (r + blk) % 5 == 4 ? 0.0f : rnd(0.02f) * (r % 8 == 3 ? 10.0f : 1.0f);
		amax = fmaxf(amax, fabsf(wv[i]));
	}
	h->w = (struct sm70_weight){ .dtype = SM70_DTYPE_NVFP4, .rows = rows, .cols = cols,
				     .scale2 = sm70_nvfp4_scale_2(amax) };
	h->w.data = codes = malloc(n / 2);
	h->w.scale = scales = malloc(n / 16);
	assert_non_null(codes);
	assert_non_null(scales);
	for (size_t b = 0; b < n / 16; b++)
		sm70_nvfp4_quantize_block(wv + b * 16, h->w.scale2, codes + b * 8, scales + b);
	h->special_rows = 0;
	free(wv);
}

static void fp4_host_free(struct fp4_host *h)
{
	free(h->w.data);
	free(h->w.scale);
}

static struct sm70_weight prepare(struct sm70_backend *be, const struct fp4_host *h)
{
	struct sm70_err err = { { 0 } };
	struct sm70_weight w;

	if (be->ops->prepare_weight(be, &w, &h->w, &err))
		fail_msg("prepare_weight on %s: %s", be->name, err.msg);
	return w;
}

static void release(struct sm70_backend *be, struct sm70_weight *w)
{
	bfree(be, w->data);
	bfree(be, w->scale);
	if (w->row_scale2)
		bfree(be, w->row_scale2);
}

/* ---- one comparison ------------------------------------------------------------------ */

/* y = x W^T on be (x shifted by x_off halves to test alignment), as floats in out. */
static void run(struct sm70_backend *be, const struct sm70_weight *w, const float *x, int n,
		int y_f32, int x_off, float *out)
{
	const size_t nx = (size_t)n * w->cols, ny = (size_t)n * w->rows;
	float *padded = fvec(nx + (size_t)x_off);
	void *bx, *by = balloc(be, ny * (y_f32 ? 4 : (be->act_dtype == SM70_DTYPE_F32 ? 4 : 2)));
	const size_t esz = be->act_dtype == SM70_DTYPE_F32 ? 4 : 2;

	memcpy(padded + x_off, x, nx * sizeof(float));
	bx = up_act(be, padded, nx + (size_t)x_off);
	be->ops->matmul(be, by, y_f32, (const char *)bx + (size_t)x_off * esz, w, n);
	if (y_f32)
		get_f32(be, out, by, ny);
	else
		get_act(be, out, by, ny);
	bfree(be, by);
	bfree(be, bx);
	free(padded);
}

/* Row r of y [n][rows] for every i into dst [n]. */
static void gather_row(float *dst, const float *y, int n, int rows, int r)
{
	for (int i = 0; i < n; i++)
		dst[i] = y[(size_t)i * rows + r];
}

/* Row r of y against the CPU's, each value's error over the size of its dot's terms
 * (sum over k of |W[r][k] x[i][k]|): a row's own sum can cancel to far below its terms,
 * where a relative error of the sum says nothing about the kernel. */
static void compare_row(const char *what, const struct fp4_host *h, int r, const float *x,
			const float *got, const float *ref, int n, double tol)
{
	const int cols = h->w.cols;
	const uint8_t *codes = (const uint8_t *)h->w.data + (size_t)r * cols / 2;
	const uint8_t *scales = (const uint8_t *)h->w.scale + (size_t)r * cols / 16;
	double worst = 0.0;

	for (int i = 0; i < n; i++) {
		double mag = 0.0, rel;

		for (int k = 0; k < cols; k++)
			mag += fabs((double)sm70_nvfp4_dequant(codes + k / 16 * 8, scales[k / 16],
							       h->w.scale2, k % 16) *
				    x[(size_t)i * cols + k]);
		rel = fabs((double)got[i] - ref[i]) / (mag > 0.0 ? mag : 1.0);
		if (!(rel <= worst))
			worst = rel;
	}
	printf("  %-52s error over the terms' size %.3g over %d values (tol %.1g)\n", what,
	       worst, n, tol);
	assert_true(worst <= tol);
}

/* Every output of the split kernel against its bound (TOL_SPLIT above): the CPU's
 * output ref (f32) and got, each with the size of its dot's terms, on its row's scale2. */
static void compare_split(const char *what, const struct fp4_host *h, const float *x,
			  const float *got, const float *ref, int n, int y_f32)
{
	const int rows = h->w.rows, cols = h->w.cols;
	float *wr = fvec((size_t)cols);
	double worst = 0.0, worst_bound = 0.0;

	for (int r = 0; r < rows; r++) {
		const uint8_t *codes = (const uint8_t *)h->w.data + (size_t)r * cols / 2;
		const uint8_t *scales = (const uint8_t *)h->w.scale + (size_t)r * cols / 16;
		const float s2 = h->w.row_scale2 ? h->w.row_scale2[r] : h->w.scale2;

		for (int k = 0; k < cols; k++)
			wr[k] = sm70_nvfp4_dequant(codes + k / 16 * 8, scales[k / 16], s2, k % 16);
		for (int i = 0; i < n; i++) {
			const size_t at = (size_t)i * rows + r;
			double terms = 0.0, err, bound;

			for (int k = 0; k < cols; k++)
				terms += fabs((double)wr[k] * x[(size_t)i * cols + k]);
			err = isnan(got[at]) ? INFINITY : fabs((double)got[at] - ref[at]);
			bound = TOL_SPLIT * terms + cols * (double)s2 * 0x1p-13 +
				(y_f32 ? 0.0 : 0x1p-11 * fabs((double)ref[at]) + 0x1p-24);
			if (!(err <= bound))
				fail_msg("%s: row %d x row %d: |%g - %g| = %.3g > bound %.3g (terms %.3g)",
					 what, r, i, got[at], ref[at], err, bound, terms);
			if (terms > 0.0 && err / terms > worst)
				worst = err / terms;
			if (bound > 0.0 && err / bound > worst_bound)
				worst_bound = err / bound;
		}
	}
	printf("  %-52s error over the terms' size %.3g, over its bound %.3g, %d values\n", what,
	       worst, worst_bound, n * rows);
	free(wr);
}

/* be's matmul against the CPU's on h with n rows of x. Row 1 (zero scales) must be
 * zeros; with an f32 y, rows 0 and 2 (scales 448 and 2^-9) are also compared on their own
 * scale, so that a subnormal product the tensor cores dropped would show (as f16, row 2's
 * outputs, ~1e-6, are f16 subnormals themselves and their rounding is not the kernel's). */
static void compare_case(struct sm70_backend *be, const char *path, const struct fp4_host *h,
			 int n, int y_f32, int x_off)
{
	const int rows = h->w.rows, cols = h->w.cols;
	const size_t ny = (size_t)n * rows;
	float *x = rvec16((size_t)n * cols, 1.0f), *got = fvec(ny), *ref = fvec(ny);
	float *rg = fvec((size_t)n), *rr = fvec((size_t)n);
	struct sm70_weight wg = prepare(be, h), wc = prepare(cpu, h);
	const double tol = y_f32 ? TOL_F32 : TOL_F16;
	char what[128];

	run(be, &wg, x, n, y_f32, x_off, got);
	run(cpu, &wc, x, n, 1, 0, ref);
	snprintf(what, sizeof(what), "%s [%d x %d] n %d %s%s", path, rows, cols, n,
		 y_f32 ? "f32" : "f16", x_off ? " unaligned x" : "");
	if (is_split(be, n))
		compare_split(what, h, x, got, ref, n, y_f32);
	else
		compare_values(what, got, ref, ny, tol);
	for (int r = 0; h->special_rows && r < 3 && r < rows; r++) {
		gather_row(rg, got, n, rows, r);
		gather_row(rr, ref, n, rows, r);
		snprintf(what, sizeof(what), "  row %d (scales %s)", r,
			 r == 0 ? "448" : r == 1 ? "zero" : "2^-9");
		if (r == 1)
			for (int i = 0; i < n; i++)
				assert_true(rg[i] == 0.0f);
		else if (y_f32 && !is_split(be, n)) /* compare_split took every row */
			compare_row(what, h, r, x, rg, rr, n, tol);
	}
	release(cpu, &wc);
	release(be, &wg);
	free(rr);
	free(rg);
	free(ref);
	free(got);
	free(x);
}

/* ---- tests ------------------------------------------------------------------------- */

static const int shapes[][2] = { { 1, 16 },     { 7, 48 },      { 33, 80 },
				 { 129, 1040 }, { 1000, 4096 }, { 9001, 256 } };

/* The fast kernels on odd and model shapes (a tall one takes the two-tile blocks), every n
 * up to 16 on one shape, and past 16 (slices of 16 rows): every case on every variant. */
static void test_fast_path(void **state)
{
	static const int ns[] = { 1, 3, 8, 16, 17, 40 };

	for (int v = 0; v < N_VARIANTS; v++) {
		char path[32];

		snprintf(path, sizeof(path), "fast v%d", variants[v]);
		for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
			struct fp4_host h;

			fp4_host_new(&h, shapes[s][0], shapes[s][1]);
			for (size_t k = 0; k < sizeof(ns) / sizeof(ns[0]); k++)
				compare_case(var_be(v), path, &h, ns[k], (int)(k & 1), 0);
			fp4_host_free(&h);
		}
		{
			struct fp4_host h;

			fp4_host_new(&h, 77, 208);
			for (int n = 1; n <= 16; n++)
				compare_case(var_be(v), path, &h, n, n % 2, 0);
			fp4_host_free(&h);
		}
	}
}

/* Quantizer-made weights (common/nvfp4.c, as sm70-quantize writes them) on odd and model
 * shapes, on every variant and the reference path, n 1, 4 and 16. */
static void test_quantized_weights(void **state)
{
	static const int qshapes[][2] = { { 7, 48 }, { 129, 1040 }, { 4096, 4096 } };
	static const int ns[] = { 1, 4, 16 };

	for (size_t s = 0; s < sizeof(qshapes) / sizeof(qshapes[0]); s++) {
		struct fp4_host h;

		fp4_host_quantized(&h, qshapes[s][0], qshapes[s][1]);
		for (int v = 0; v <= N_VARIANTS; v++) {
			char path[32];

			snprintf(path, sizeof(path), v < N_VARIANTS ? "quantized v%d" :
				 "quantized reference", v < N_VARIANTS ? variants[v] : 0);
			for (size_t k = 0; k < sizeof(ns) / sizeof(ns[0]); k++)
				compare_case(v < N_VARIANTS ? var_be(v) : gpu_fp4ref, path, &h, ns[k],
					     (int)(k & 1), 0);
		}
		fp4_host_free(&h);
	}
}

/* The dot kernel's batch sizes, n = 1..4, on every shape with both outputs (the 448,
 * zero and 2^-9 rows among them), on every variant (1: WMMA at those n). */
static void test_dot_rows(void **state)
{
	for (int v = 0; v < N_VARIANTS; v++) {
		char path[32];

		snprintf(path, sizeof(path), "n<=4 v%d", variants[v]);
		for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
			struct fp4_host h;

			fp4_host_new(&h, shapes[s][0], shapes[s][1]);
			for (int n = 1; n <= 4; n++)
				for (int y_f32 = 0; y_f32 < 2; y_f32++)
					compare_case(var_be(v), path, &h, n, y_f32, 0);
			fp4_host_free(&h);
		}
	}
}

/* row_scale2: rows whose scale2 lie 2^10 apart (as gate_up stacked from two parts, and
 * more), each part compared with the CPU on its own scale, on every variant, on the dot
 * kernel (n <= 4) and WMMA (n = 8). */
static void test_row_scale2(void **state)
{
	static const int ns[] = { 1, 2, 4, 8 };
	const int rows = 300, cols = 1040;
	struct fp4_host h;
	float *rs = malloc((size_t)rows * sizeof(float));

	assert_non_null(rs);
	fp4_host_new(&h, rows, cols);
	for (int r = 0; r < rows; r++)
		rs[r] = h.w.scale2 * (r % 3 == 0 ? 1.0f : r % 3 == 1 ? 1024.0f : 1.0f / 1024.0f);
	h.w.row_scale2 = rs;
	for (int v = 0; v < N_VARIANTS; v++) {
		char path[32];

		snprintf(path, sizeof(path), "row_scale2 v%d", variants[v]);
		for (size_t k = 0; k < sizeof(ns) / sizeof(ns[0]); k++) {
			const int n = ns[k];
			const size_t ny = (size_t)n * rows;
			float *x = rvec16((size_t)n * cols, 1.0f), *got = fvec(ny), *ref = fvec(ny);
			float *rg = fvec((size_t)n), *rr = fvec((size_t)n);
			struct sm70_weight wg = prepare(var_be(v), &h), wc = prepare(cpu, &h);
			char what[128];

			run(var_be(v), &wg, x, n, 1, 0, got);
			run(cpu, &wc, x, n, 1, 0, ref);
			snprintf(what, sizeof(what), "%s [%d x %d] n %d f32", path, rows, cols, n);
			/* the split kernel: every row against its bound, on its own scale2 */
			if (is_split(var_be(v), n))
				compare_split(what, &h, x, got, ref, n, 1);
			/* each part on its own scale: the small rows would hide in max |y| */
			for (int part = 0; part < 3 && !is_split(var_be(v), n); part++) {
				double md = 0.0, mr = 0.0;

				for (int r = 3 + part; r < rows; r += 3) {
					gather_row(rg, got, n, rows, r);
					gather_row(rr, ref, n, rows, r);
					for (int i = 0; i < n; i++) {
						const double d = isnan(rg[i]) ? INFINITY :
								 fabs((double)rg[i] - rr[i]);

						md = d > md ? d : md;
						mr = fabs(rr[i]) > mr ? fabs(rr[i]) : mr;
					}
				}
				printf("  %s n %d: scale2 x %-6s rows: rel %.2e\n", path, n,
				       part == 0 ? "1" : part == 1 ? "1024" : "1/1024",
				       mr > 0 ? md / mr : md);
				if (!(md <= TOL_F32 * mr))
					fail_msg("%s n %d: part %d rel %.2e > %.1e", path, n, part,
						 mr > 0 ? md / mr : md, TOL_F32);
			}
			if (!is_split(var_be(v), n))
				compare_values(what, got, ref, ny, TOL_F32);
			release(cpu, &wc);
			release(var_be(v), &wg);
			free(rr);
			free(rg);
			free(ref);
			free(got);
			free(x);
		}
	}
	h.w.row_scale2 = NULL;
	free(rs);
	fp4_host_free(&h);
}

/* SM70_NVFP4=reference keeps ModelOpt's bytes on the device and matches the CPU; the
 * one-thread-an-output kernel on the arranged layout (SM70_MATMUL=reference, unaligned x)
 * does too. */
static void test_reference_paths(void **state)
{
	struct fp4_host h;
	struct sm70_weight w;
	uint8_t *back;

	fp4_host_new(&h, 65, 1056);
	w = prepare(gpu_fp4ref, &h);
	back = malloc((size_t)65 * 1056 / 2);
	assert_non_null(back);
	assert_int_equal(gpu_fp4ref->ops->download(gpu_fp4ref, back, w.data, (size_t)65 * 528),
			 0);
	assert_memory_equal(back, h.w.data, (size_t)65 * 528);
	printf("  SM70_NVFP4=reference: the device holds ModelOpt's bytes as they are\n");
	free(back);
	release(gpu_fp4ref, &w);
	compare_case(gpu_fp4ref, "SM70_NVFP4=reference", &h, 5, 1, 0);
	compare_case(gpu_fp4ref, "SM70_NVFP4=reference", &h, 19, 0, 0);
	compare_case(gpu_ref, "SM70_MATMUL=reference", &h, 4, 1, 0);
	compare_case(gpu, "fast backend", &h, 3, 1, 1);
	fp4_host_free(&h);
}

/* A captured matmul replayed over new x equals eager runs bit for bit: n = 6 (WMMA), and
 * n = 1 and 3 (the dot kernel, auto and with two tiles a block). */
static void graph_replay(struct sm70_backend *be, int n)
{
	const int rows = 300, cols = 512;
	const size_t nx = (size_t)n * cols, ny = (size_t)n * rows;
	struct fp4_host h;
	struct sm70_weight w;
	void *bx, *by, *graph = NULL;
	float *x, *eager = fvec(ny), *replay = fvec(ny);

	fp4_host_new(&h, rows, cols);
	w = prepare(be, &h);
	bx = balloc(be, nx * 2);
	by = balloc(be, ny * 2);
	assert_int_equal(be->ops->sync(be), 0);
	assert_int_equal(be->ops->graph_begin(be), 0);
	be->ops->matmul(be, by, 0, bx, &w, n);
	assert_int_equal(be->ops->graph_end(be, &graph), 0);
	for (int round = 0; round < 3; round++) {
		x = rvec16(nx, 1.0f);
		set_act(be, bx, x, nx);
		assert_int_equal(be->ops->graph_launch(be, graph), 0);
		get_act(be, replay, by, ny);
		be->ops->matmul(be, by, 0, bx, &w, n);
		get_act(be, eager, by, ny);
		assert_memory_equal(replay, eager, ny * sizeof(float));
		free(x);
	}
	printf("  graph replay == eager, bitwise, over 3 new x of [%d x %d]\n", n, cols);
	be->ops->graph_destroy(be, graph);
	bfree(be, by);
	bfree(be, bx);
	release(be, &w);
	fp4_host_free(&h);
	free(replay);
	free(eager);
}

static void test_graph_replay(void **state)
{
	graph_replay(gpu, 6);
	graph_replay(gpu, 1);
	graph_replay(gpu_var[3], 3);
	for (int i = 1; i < N_VARIANTS; i++) {
		if (F16SUM_ROWS(variants[i])) { /* the split kernel's counters reset each call */
			graph_replay(gpu_var[i], 1);
			graph_replay(gpu_var[i], F16SUM_ROWS(variants[i]));
		}
	}
}

static void test_refusal(void **state)
{
	struct fp4_host h;
	struct sm70_err err = { { 0 } };
	struct sm70_weight w, bad;

	fp4_host_new(&h, 4, 48);
	bad = h.w;
	bad.cols = 24;
	assert_int_equal(gpu->ops->prepare_weight(gpu, &w, &bad, &err), -EINVAL);
	assert_null(w.data);
	assert_non_null(strstr(err.msg, "multiple of 16"));
	printf("  refused: %s\n", err.msg);
	fp4_host_free(&h);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_fast_path),
		cmocka_unit_test(test_quantized_weights),
		cmocka_unit_test(test_dot_rows),
		cmocka_unit_test(test_row_scale2),
		cmocka_unit_test(test_reference_paths),
		cmocka_unit_test(test_graph_replay),
		cmocka_unit_test(test_refusal),
	};
	struct sm70_err err = { { 0 } };
	int ret;

	/* the variants' backends and the NVFP4 switch's own, beside the three gpu_test_main
	 * makes (its gpu, made with the variant unset, is variant 0) */
	unsetenv("SM70_NVFP4_VARIANT");
	setenv("SM70_NVFP4", "reference", 1);
	ret = sm70_backend_cuda_create(&gpu_fp4ref, 0, &err);
	unsetenv("SM70_NVFP4");
	if (ret == -ENODEV) {
		printf("SKIP: no CUDA device (%s)\n", err.msg);
		return 0;
	}
	if (ret) {
		fprintf(stderr, "cuda backend (SM70_NVFP4=reference): %s\n", err.msg);
		return 1;
	}
	for (int v = 1; v < N_VARIANTS && !ret; v++) {
		char val[8];

		snprintf(val, sizeof(val), "%d", variants[v]);
		setenv("SM70_NVFP4_VARIANT", val, 1);
		ret = sm70_backend_cuda_create(&gpu_var[v], 0, &err);
		unsetenv("SM70_NVFP4_VARIANT");
		if (ret)
			fprintf(stderr, "cuda backend (SM70_NVFP4_VARIANT=%d): %s\n", variants[v],
				err.msg);
	}
	if (!ret)
		ret = gpu_test_main("cuda_nvfp4", tests, sizeof(tests) / sizeof(tests[0]), &gpu,
				    &gpu_ref, &cpu);
	for (int v = 1; v < N_VARIANTS; v++) {
		if (gpu_var[v] && gpu_var[v]->ops->sync(gpu_var[v])) {
			fprintf(stderr, "a CUDA error was recorded on the variant %d backend\n",
				variants[v]);
			ret = 1;
		}
		if (gpu_var[v])
			sm70_backend_destroy(gpu_var[v]);
	}
	if (gpu_fp4ref->ops->sync(gpu_fp4ref)) {
		fprintf(stderr, "a CUDA error was recorded on the SM70_NVFP4=reference backend\n");
		ret = 1;
	}
	sm70_backend_destroy(gpu_fp4ref);
	return ret;
}
