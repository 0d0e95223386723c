/* test_moe_nvfp4 - NVFP4 expert stacks on the CPU backend: prepare_experts (ModelOpt's
 * layout and the row scales copied; its named refusals, nothing left set) and moe_experts
 * on NVFP4 gate_up / down against a float64 reference decoded here from the ModelOpt
 * bytes (E 8/16/512, k 2/4/10, n 1/3/16, row_scale2 varying per row and per expert, a
 * zero-scale expert and zero-scale rows, inter 48 and hidden 80: partial blocks of 64),
 * unused experts poisoned, bitwise the same on 1 and 4 threads and without scratch. */
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

#define OP_TEST_SEED 0x4e5f4e5f7e11ULL

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

/* A host NVFP4 expert stack in ModelOpt's layout (data, scale, row_scale2 owned here). */
static struct sm70_experts host_new(int E, int rows, int cols)
{
	const size_t r = (size_t)E * rows;
	struct sm70_experts s = { .dtype = SM70_DTYPE_NVFP4, .n_experts = E, .rows = rows,
				  .cols = cols, .data = calloc(r * cols / 2, 1),
				  .scale = calloc(r * cols / 16, 1),
				  .row_scale2 = calloc(r, sizeof(float)) };

	assert_true(s.data && s.scale && s.row_scale2);
	return s;
}

static void host_free(struct sm70_experts *s)
{
	free(s->data), free(s->scale), free(s->row_scale2);
}

/* W[e][r][c] of a ModelOpt stack in float64. */
static double ref_w(const struct sm70_experts *s, int e, int r, int c)
{
	const size_t row = (size_t)e * s->rows + r;
	const uint8_t b = ((const uint8_t *)s->data)[row * (s->cols / 2) + c / 2];
	const uint8_t sc = ((const uint8_t *)s->scale)[row * (s->cols / 16) + c / 16];

	return ref_e2m1((c & 1) ? b >> 4 : b & 15u) * ref_e4m3(sc) * (double)s->row_scale2[row];
}

/*
 * Random codes (every byte value, so every code and -0); block scales mostly in
 * [0.25, 2] (0x28..0x48) with one in 16 a subnormal (0x01..0x07); row_scale2 per row
 * uniform in [0.5, 1.5) times a per-expert power of two (2^-1, 1, 2 by e % 3) times
 * sqrt(3 / cols) / 4, so dots are O(1). Row 5 of every expert (when rows > 5) has
 * row_scale2 0, and expert `zero`'s block scales are all 0 (when zero >= 0).
 */
static void host_fill(struct sm70_experts *s, int zero)
{
	const size_t rows = (size_t)s->n_experts * s->rows, blocks = (size_t)s->cols / 16;
	uint8_t *codes = s->data, *scales = s->scale;
	const double base = sqrt(3.0 / s->cols) / 4.0;

	for (size_t i = 0; i < rows * s->cols / 2; i++)
		codes[i] = (uint8_t)rnd_int(256);
	for (size_t i = 0; i < rows * blocks; i++)
		scales[i] = rnd_int(16) ? (uint8_t)(0x28 + rnd_int(0x21))
					: (uint8_t)(1 + rnd_int(7));
	for (size_t i = 0; i < rows; i++) {
		const int e = (int)(i / s->rows), r = (int)(i % s->rows);

		s->row_scale2[i] = r == 5 ? 0.0f : (float)(base * ldexp(1.0, e % 3 - 1) *
							  rnd_range(0.5f, 1.5f));
	}
	if (zero >= 0)
		memset(scales + (size_t)zero * s->rows * blocks, 0, (size_t)s->rows * blocks);
}

/* ---- prepare_experts --------------------------------------------------------------- */

/* h prepared on be, checked to be h's bytes as they are (the CPU's arrangement). */
static struct sm70_experts prepare(struct sm70_backend *be, const struct sm70_experts *h)
{
	const size_t rows = (size_t)h->n_experts * h->rows;
	struct sm70_err err = { { 0 } };
	struct sm70_experts s;

	if (be->ops->prepare_experts(be, &s, h, &err))
		fail_msg("prepare_experts: %s", err.msg);
	assert_int_equal(s.dtype, SM70_DTYPE_NVFP4);
	assert_int_equal(s.n_experts, h->n_experts);
	assert_int_equal(s.rows, h->rows);
	assert_int_equal(s.cols, h->cols);
	assert_memory_equal(s.data, h->data, rows * h->cols / 2);
	assert_memory_equal(s.scale, h->scale, rows * h->cols / 16);
	assert_memory_equal(s.row_scale2, h->row_scale2, rows * sizeof(float));
	return s;
}

static void release(struct sm70_backend *be, struct sm70_experts *s)
{
	be->ops->buf_free(be, s->row_scale2);
	be->ops->buf_free(be, s->scale);
	be->ops->buf_free(be, s->data);
}

/* prepare_experts refuses h with -EINVAL, an error naming `what`, and nothing set. */
static void expect_refusal(struct sm70_backend *be, const struct sm70_experts *h,
			   const char *what)
{
	struct sm70_err err = { { 0 } };
	struct sm70_experts s = { .data = (void *)1, .scale = (void *)1,
				  .row_scale2 = (float *)1 };

	assert_int_equal(be->ops->prepare_experts(be, &s, h, &err), -EINVAL);
	assert_null(s.data);
	assert_null(s.scale);
	assert_null(s.row_scale2);
	if (!strstr(err.msg, what))
		fail_msg("error \"%s\" does not name \"%s\"", err.msg, what);
	printf("  refused: %s\n", err.msg);
}

/* The copies, and each refusal: not NVFP4, cols not a multiple of 16, no experts, missing
 * buffers, NaN scale bytes (0x7f, 0xff), non-finite and negative row scales. */
static void test_prepare_experts(void **state)
{
	struct sm70_backend *be = cpu_backend(2);
	struct sm70_experts h = host_new(4, 24, 48), bad;
	struct sm70_experts s;
	uint8_t *scales = h.scale;

	host_fill(&h, 1);
	s = prepare(be, &h);
	release(be, &s);

	bad = h, bad.dtype = SM70_DTYPE_F16;
	expect_refusal(be, &bad, "is not nvfp4");
	bad = h, bad.cols = 40;
	expect_refusal(be, &bad, "multiple of 16");
	bad = h, bad.cols = 8;
	expect_refusal(be, &bad, "multiple of 16");
	bad = h, bad.n_experts = 0;
	expect_refusal(be, &bad, "at least one expert");
	bad = h, bad.row_scale2 = NULL;
	expect_refusal(be, &bad, "no weight_scale_2");
	bad = h, bad.scale = NULL;
	expect_refusal(be, &bad, "no weight_scale");

	/* expert 2, row 7, block 1 */
	scales[(2 * 24 + 7) * 3 + 1] = 0x7f;
	expect_refusal(be, &h, "expert 2 row 7: weight_scale[1] is an E4M3 NaN (0x7f)");
	scales[(2 * 24 + 7) * 3 + 1] = 0xff;
	expect_refusal(be, &h, "expert 2 row 7: weight_scale[1] is an E4M3 NaN (0xff)");
	scales[(2 * 24 + 7) * 3 + 1] = 0x38;
	/* 0x80 is -0 and 0xfe is -448: finite, accepted */
	scales[0] = 0x80, scales[1] = 0xfe;
	s = prepare(be, &h);
	release(be, &s);

	h.row_scale2[3 * 24 + 2] = INFINITY;
	expect_refusal(be, &h, "expert 3 row 2: weight_scale_2 is inf");
	h.row_scale2[3 * 24 + 2] = NAN;
	expect_refusal(be, &h, "expert 3 row 2: weight_scale_2 is nan");
	h.row_scale2[3 * 24 + 2] = -0.5f;
	expect_refusal(be, &h, "expert 3 row 2: weight_scale_2 is -0.5");
	h.row_scale2[3 * 24 + 2] = -0.0f; /* not negative */
	s = prepare(be, &h);
	release(be, &s);
	host_free(&h);
	sm70_backend_destroy(be);
}

/* ---- moe_experts ------------------------------------------------------------------------ */

struct case_shape {
	int hidden, inter, E, k, n;
};

/* One case: ModelOpt stacks on the host, the prepared ones, x, the route and scratch. */
struct fp4_case {
	struct case_shape sh;
	struct sm70_experts hgu, hdn; /* host, ModelOpt */
	struct sm70_experts gu, dn;   /* prepared on the backend */
	struct sm70_moe_route r;
	float *x, *mid, *part, *out;
};

static void route_new(struct sm70_backend *be, struct sm70_moe_route *r, size_t nk)
{
	r->ids = balloc(be, sizeof(int32_t) * nk);
	r->w = balloc(be, sizeof(float) * nk);
	r->order = balloc(be, sizeof(int32_t) * nk);
	r->used = balloc(be, sizeof(int32_t) * nk);
	r->used_first = balloc(be, sizeof(int32_t) * (nk + 1));
	r->n_used = balloc(be, sizeof(int32_t));
}

static void route_free(struct sm70_backend *be, struct sm70_moe_route *r)
{
	be->ops->buf_free(be, r->n_used);
	be->ops->buf_free(be, r->used_first);
	be->ops->buf_free(be, r->used);
	be->ops->buf_free(be, r->order);
	be->ops->buf_free(be, r->w);
	be->ops->buf_free(be, r->ids);
}

/* NaN scale bytes and row scales into every prepared expert no token chose (the CPU's
 * arrangement is ModelOpt's): if the op read one into a result, it shows. */
static void poison_unused(struct sm70_experts *s, const struct sm70_moe_route *r)
{
	const size_t blocks = (size_t)s->rows * (s->cols / 16);

	for (int e = 0, u = 0; e < s->n_experts; e++) {
		if (u < r->n_used[0] && r->used[u] == e) {
			u++;
			continue;
		}
		memset((uint8_t *)s->scale + (size_t)e * blocks, 0x7f, blocks);
		for (int row = 0; row < s->rows; row++)
			s->row_scale2[(size_t)e * s->rows + row] = NAN;
	}
}

/* Random x and router logits in which tokens 0 and 1 (when there are two) take expert 3,
 * whose gate_up has zero block scales; the route from moe_route; unused experts
 * poisoned. */
static void case_new(struct sm70_backend *be, struct fp4_case *c, struct case_shape sh)
{
	const size_t nk = (size_t)sh.n * sh.k;
	float *l = balloc(be, sizeof(float) * (size_t)sh.n * sh.E);

	c->sh = sh;
	c->hgu = host_new(sh.E, 2 * sh.inter, sh.hidden);
	c->hdn = host_new(sh.E, sh.hidden, sh.inter);
	host_fill(&c->hgu, 3);
	host_fill(&c->hdn, -1);
	c->gu = prepare(be, &c->hgu);
	c->dn = prepare(be, &c->hdn);
	c->x = balloc(be, sizeof(float) * (size_t)sh.n * sh.hidden);
	for (size_t i = 0; i < (size_t)sh.n * sh.hidden; i++)
		c->x[i] = rnd_range(-1, 1);
	for (size_t i = 0; i < (size_t)sh.n * sh.E; i++)
		l[i] = rnd_range(-2, 2);
	for (int t = 0; t < sh.n && t < 2; t++)
		l[(size_t)t * sh.E + 3] = 6.0f;
	route_new(be, &c->r, nk);
	be->ops->moe_route(be, &c->r, l, sh.E, sh.n, sh.E, sh.k, 1);
	assert_int_equal(c->r.ids[0], 3);
	poison_unused(&c->gu, &c->r);
	poison_unused(&c->dn, &c->r);
	c->mid = balloc(be, sizeof(float) * nk * sh.inter);
	c->part = balloc(be, sizeof(float) * nk * sh.hidden);
	c->out = balloc(be, sizeof(float) * (size_t)sh.n * sh.hidden);
	be->ops->buf_free(be, l);
}

static void case_free(struct sm70_backend *be, struct fp4_case *c)
{
	be->ops->buf_free(be, c->out);
	be->ops->buf_free(be, c->part);
	be->ops->buf_free(be, c->mid);
	route_free(be, &c->r);
	be->ops->buf_free(be, c->x);
	release(be, &c->dn);
	release(be, &c->gu);
	host_free(&c->hdn);
	host_free(&c->hgu);
}

/* moe_experts on be into c->out, which starts as NaN (it must be overwritten). */
static void case_run(struct sm70_backend *be, struct fp4_case *c)
{
	for (size_t i = 0; i < (size_t)c->sh.n * c->sh.hidden; i++)
		c->out[i] = NAN;
	be->ops->moe_experts(be, c->out, c->x, &c->gu, &c->dn, &c->r, c->sh.n, c->sh.k, c->mid,
			     c->part);
}

static void case_run_any(struct sm70_backend *be, void *c)
{
	case_run(be, c);
}

/* The float64 experts from the ModelOpt bytes over the op's own route; ref [n][H]. */
static void ref_experts(const struct fp4_case *c, double *ref)
{
	const int H = c->sh.hidden, I = c->sh.inter, k = c->sh.k;
	double *mid = malloc(sizeof(double) * I);

	assert_non_null(mid);
	for (int t = 0; t < c->sh.n; t++) {
		const float *x = c->x + (size_t)t * H;

		for (int h = 0; h < H; h++)
			ref[(size_t)t * H + h] = 0;
		for (int j = 0; j < k; j++) {
			const int e = c->r.ids[t * k + j];

			for (int i = 0; i < I; i++) {
				double g = 0, u = 0;

				for (int q = 0; q < H; q++) {
					g += ref_w(&c->hgu, e, i, q) * x[q];
					u += ref_w(&c->hgu, e, I + i, q) * x[q];
				}
				mid[i] = g / (1 + exp(-g)) * u;
			}
			for (int h = 0; h < H; h++) {
				double d = 0;

				for (int i = 0; i < I; i++)
					d += ref_w(&c->hdn, e, h, i) * mid[i];
				ref[(size_t)t * H + h] += (double)c->r.w[t * k + j] * d;
			}
		}
	}
	free(mid);
}

/*
 * Relative to the largest |out| of a case. Each element is the correctly rounded f32 of
 * W (2^-24 relative); the dots are f32 over 80..256 terms in 8 lanes, mid f32, and the
 * k-term sum f32: a few 1e-7 (as test_moe_ops' 2e-6 for f32 weights; measured: see the
 * print).
 */
#define EXPERTS_TOL 2e-6

static const struct case_shape shapes[] = {
	{ 256, 64, 8, 2, 1 },    { 256, 64, 8, 2, 3 },    { 256, 64, 8, 2, 16 },
	{ 256, 64, 16, 4, 1 },   { 256, 64, 16, 4, 3 },   { 256, 64, 16, 4, 16 },
	{ 256, 64, 512, 10, 1 }, { 256, 64, 512, 10, 3 }, { 256, 64, 512, 10, 16 },
	{ 256, 48, 16, 4, 3 },   { 256, 48, 16, 4, 16 }, /* inter 48: down rows of 3 blocks */
	{ 80, 48, 8, 2, 3 },     /* hidden 80: gate_up rows of 5 blocks */
};
#define N_SHAPES (sizeof(shapes) / sizeof(shapes[0]))

/* moe_experts on NVFP4 stacks against float64 for each shape. */
static void test_moe_experts_nvfp4(void **state)
{
	struct sm70_backend *be = cpu_backend(3);
	struct errstat e = { 0 };
	size_t zero_expert_tokens = 0;

	for (size_t si = 0; si < N_SHAPES; si++) {
		const struct case_shape sh = shapes[si];
		const size_t count = (size_t)sh.n * sh.hidden;
		double *ref = malloc(sizeof(double) * count), scale = 0;
		struct fp4_case c;

		assert_non_null(ref);
		case_new(be, &c, sh);
		case_run(be, &c);
		ref_experts(&c, ref);
		for (size_t i = 0; i < count; i++)
			scale = fmax(scale, fabs(ref[i]));
		assert_true(scale > 0);
		for (size_t i = 0; i < count; i++)
			err_add(&e, c.out[i], ref[i], scale);
		/* expert 3's gate_up is all zero scales: its mid rows must be exactly 0 */
		for (int a = 0; a < sh.n * sh.k; a++) {
			if (c.r.ids[a] != 3)
				continue;
			for (int i = 0; i < sh.inter; i++)
				assert_true(c.mid[(size_t)a * sh.inter + i] == 0.0f);
			zero_expert_tokens++;
		}
		case_free(be, &c);
		free(ref);
	}
	printf("  (%zu cases: hidden 256 / inter 64 at E 8 k 2, E 16 k 4, E 512 k 10, n 1, 3, "
	       "16; inter 48; hidden 80; unused experts NaN)\n", N_SHAPES);
	printf("  %zu assignments to the zero-scale expert: mid exactly 0\n", zero_expert_tokens);
	err_report("moe_experts nvfp4 vs float64 from the ModelOpt bytes (rel to max |out|)", &e,
		   EXPERTS_TOL);
	sm70_backend_destroy(be);
}

/* Bitwise the same on 1 and 4 threads and without scratch (rows dequantised in stack
 * pieces: hidden 1104 is three pieces of EXPERTS_PIECE). */
static void test_moe_nvfp4_threads(void **state)
{
	struct sm70_backend *be1 = cpu_backend(1), *be4 = cpu_backend(4);
	const struct case_shape big[] = { { 256, 64, 16, 4, 16 }, { 1104, 48, 8, 2, 5 } };
	size_t compared = 0;

	for (size_t si = 0; si < 2; si++) {
		struct fp4_case c;

		case_new(be1, &c, big[si]);
		compared += threads_bitwise(be1, be4, case_run_any, &c, c.out,
					    (size_t)big[si].n * big[si].hidden);
		case_free(be1, &c);
	}
	printf("  %zu nvfp4 moe_experts values bitwise equal on 1 vs 4 threads and without "
	       "scratch\n", compared);
	sm70_backend_destroy(be4);
	sm70_backend_destroy(be1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_prepare_experts),
		cmocka_unit_test(test_moe_experts_nvfp4),
		cmocka_unit_test(test_moe_nvfp4_threads),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
