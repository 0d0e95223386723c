/* test_cuda_moe_nvfp4 - the CUDA moe_experts op on NVFP4 expert stacks
 * (kernels/cuda/moe_experts_nvfp4.cu) against its CPU twin on the same ModelOpt bytes and
 * the same route: E 8/16/512, k 2/4/10, n 1/3/16, inter 48, hidden 80, Qwen-like dot
 * lengths, an expert of 40 tokens; row_scale2 varying per row and per expert, a zero-scale
 * expert; unused experts' row scales NaN; every tile variant, each with forced splits of
 * 1-8 warps a tile (SM70_MOE_KS), and the reference path (SM70_MOE=reference); a captured
 * route + experts graph replayed over new routings equal to eager runs bit for bit;
 * prepare_experts' refusals. */
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
#include "kernels/backend.h"
#include "kernels/cuda/cuda_ops.h"

#define GPU_TEST_SEED 0x4f4e5f4e7e5ULL
#include "tests/gpu/gpu_test.h"
#include "tests/gpu/moe_route_test.h"

/*
 * Errors are max |got - ref| over max |ref| ("rel"). Both backends decode the same
 * elements exactly (the CPU rounds each to f32, 2^-24 relative; the GPU keeps
 * e2m1 * e4m3 exact in f16 and applies 128 * row_scale2 to the f32 sums), so the f32 dots
 * differ by summation order only (~1e-6). The GPU rounds mid to f16 between the passes
 * (2^-11 of each mid value, through the down dot: a few 1e-4 of max |out|) and out to f16
 * (2^-11 of a value: <= 4.9e-4 of max |out|); as test_cuda_moe's f16 stacks.
 */
#define TOL_F16_OUT 1.5e-3
#define TOL_ROUTE_W 1e-5
#define N_VARIANTS 3 /* sm70__cuda_moe_tune's NVFP4 tile variants */
#define ZERO_EXPERT 3

static struct sm70_backend *gpu, *gpu_ref, *cpu;

/* ---- ModelOpt stacks ------------------------------------------------------------------ */

static struct sm70_experts host_new(int E, int rows, int cols)
{
	const size_t r = (size_t)E * rows;
	struct sm70_experts s = { .dtype = SM70_DTYPE_NVFP4, .n_experts = E, .rows = rows,
				  .cols = cols, .data = malloc(r * cols / 2),
				  .scale = malloc(r * cols / 16), .row_scale2 = fvec(r) };

	assert_true(s.data && s.scale);
	return s;
}

static void host_free(struct sm70_experts *s)
{
	free(s->data), free(s->scale), free(s->row_scale2);
}

/*
 * Random codes (every byte value); block scales mostly in [0.25, 2] with one in 16 a
 * subnormal; row_scale2 per row in [0.5, 1.5) times 2^(e % 3 - 1) times sqrt(3 / cols) / 4
 * (dots of O(1)); row 5 of every expert row_scale2 0; expert `zero` all zero block scales
 * (zero >= 0).
 */
static void host_fill(struct sm70_experts *s, int zero)
{
	const size_t rows = (size_t)s->n_experts * s->rows, blocks = (size_t)s->cols / 16;
	uint8_t *codes = s->data, *scales = s->scale;
	const float base = sqrtf(3.0f / (float)s->cols) / 4.0f;

	for (size_t i = 0; i < rows * s->cols / 2; i++)
		codes[i] = (uint8_t)rnd_int(256);
	for (size_t i = 0; i < rows * blocks; i++)
		scales[i] = rnd_int(16) ? (uint8_t)(0x28 + rnd_int(0x21))
					: (uint8_t)(1 + rnd_int(7));
	for (size_t i = 0; i < rows; i++) {
		const int e = (int)(i / s->rows), r = (int)(i % s->rows);

		s->row_scale2[i] = r == 5 ? 0.0f : base * ldexpf(1.0f, e % 3 - 1) *
							   (1.0f + rnd(0.5f));
	}
	if (zero >= 0)
		memset(scales + (size_t)zero * s->rows * blocks, 0, (size_t)s->rows * blocks);
}

static struct sm70_experts prepare(struct sm70_backend *be, const struct sm70_experts *h)
{
	struct sm70_err err = { { 0 } };
	struct sm70_experts s;

	if (be->ops->prepare_experts(be, &s, h, &err))
		fail_msg("prepare_experts on %s: %s", be->name, err.msg);
	assert_int_equal(s.n_experts, h->n_experts);
	assert_int_equal(s.rows, h->rows);
	assert_int_equal(s.cols, h->cols);
	return s;
}

static void release(struct sm70_backend *be, struct sm70_experts *s)
{
	bfree(be, s->row_scale2), bfree(be, s->scale), bfree(be, s->data);
}

/* ---- routes ------------------------------------------------------------------------- */

/* Router logits [n][ld] in [-4, 4); columns from E on a large value the op must not read;
 * tokens 0 and 1 take ZERO_EXPERT; hot >= 0: every token takes expert `hot` too. */
static void fill_logits(float *l, int ld, int n, int E, int hot)
{
	for (int t = 0; t < n; t++)
		for (int c = 0; c < ld; c++)
			l[(size_t)t * ld + c] = c < E ? rnd(4.0f) : 100.0f;
	for (int t = 0; t < n; t++) {
		if (hot >= 0)
			l[(size_t)t * ld + hot] = 5.0f;
		if (t < 2)
			l[(size_t)t * ld + ZERO_EXPERT] = 6.0f;
	}
}

/* NaN row scales into every expert the route does not use, on be's prepared stack. */
static void poison_unused(struct sm70_backend *be, const struct sm70_experts *s,
			  const struct hroute *h)
{
	float *nan_rows = fvec((size_t)s->rows);

	for (int i = 0; i < s->rows; i++)
		nan_rows[i] = NAN;
	for (int e = 0, u = 0; e < s->n_experts; e++) {
		if (u < h->n_used[0] && h->used[u] == e) {
			u++;
			continue;
		}
		assert_int_equal(be->ops->upload(be, s->row_scale2 + (size_t)e * s->rows, nan_rows,
						 sizeof(float) * (size_t)s->rows), 0);
	}
	free(nan_rows);
}

/* ---- moe_experts ------------------------------------------------------------------------ */

struct shape {
	int hidden, inter, E, k, n, hot;
};

/* A backend's buffers for one case. */
struct bufs {
	struct sm70_experts gu, dn;
	struct sm70_moe_route r;
	void *x, *mid, *out;
	float *part;
};

static void bufs_new(struct sm70_backend *be, struct bufs *b, const struct shape *sh,
		     const struct sm70_experts *hgu, const struct sm70_experts *hdn,
		     const float *x)
{
	const size_t nk = (size_t)sh->n * sh->k, a = be->act_dtype == SM70_DTYPE_F32 ? 4 : 2;

	b->gu = prepare(be, hgu);
	b->dn = prepare(be, hdn);
	route_new(be, &b->r, nk);
	b->x = up_act(be, x, (size_t)sh->n * sh->hidden);
	b->mid = balloc(be, nk * sh->inter * a);
	b->part = balloc(be, nk * sh->hidden * sizeof(float));
	b->out = balloc(be, (size_t)sh->n * sh->hidden * a);
}

static void bufs_free(struct sm70_backend *be, struct bufs *b)
{
	bfree(be, b->out), bfree(be, b->part), bfree(be, b->mid), bfree(be, b->x);
	route_free(be, &b->r);
	release(be, &b->dn), release(be, &b->gu);
}

/* n act values of NaN into a backend buffer: a value the op does not write shows. */
static void poison_act(struct sm70_backend *be, void *dst, size_t n)
{
	float *v = fvec(n);

	for (size_t i = 0; i < n; i++)
		v[i] = NAN;
	set_act(be, dst, v, n);
	free(v);
}

/* moe_experts on be into b->out (poisoned first); out [n][hidden] on the host. */
static void run(struct sm70_backend *be, struct bufs *b, const struct shape *sh, float *out)
{
	const size_t count = (size_t)sh->n * sh->hidden;

	poison_act(be, b->out, count);
	be->ops->moe_experts(be, b->out, b->x, &b->gu, &b->dn, &b->r, sh->n, sh->k, b->mid,
			     b->part);
	get_act(be, out, b->out, count);
}

static const struct shape shapes[] = {
	{ 256, 64, 8, 2, 1, -1 },    { 256, 64, 8, 2, 3, -1 },    { 256, 64, 8, 2, 16, -1 },
	{ 256, 64, 16, 4, 1, -1 },   { 256, 64, 16, 4, 3, -1 },   { 256, 64, 16, 4, 16, -1 },
	{ 256, 64, 512, 10, 1, -1 }, { 256, 64, 512, 10, 3, -1 }, { 256, 64, 512, 10, 16, -1 },
	{ 256, 48, 16, 4, 3, -1 },   /* inter 48: down rows of 3 blocks, one partial step */
	{ 80, 48, 8, 2, 3, -1 },     /* hidden 80: gate_up rows of 5 blocks */
	{ 2048, 512, 16, 4, 16, -1 }, /* Qwen3-Next-like dots: 32 and 8 steps */
	{ 2048, 768, 8, 2, 16, 1 },   /* Qwen3-30B-A3B-like: 32 and 12 steps; expert 1 of all */
	{ 256, 64, 16, 4, 40, 1 },    /* an expert of 40 tokens: passes of 16 */
};

/*
 * Warps a tile forced on each variant (sm70__cuda_moe_tune_ks: gate_up, down; -1 the rule):
 * steps split evenly and not (32 over 3 or 5, 2 over 8: warps with none), the two passes
 * apart. A split above what a variant's block holds is capped there (down on variant 0:
 * 3), so some pairs run twice; every split takes the same kernel. Each split runs twice,
 * bit for bit the same: its partial tiles are added in one order.
 */
static const int split_ks[][2] = { { -1, -1 }, { 1, 1 }, { 2, 2 }, { 3, 3 },
				   { 5, 5 },   { 8, 8 }, { 8, 1 }, { 1, 5 } };

/*
 * For each shape: ModelOpt stacks (expert ZERO_EXPERT's gate_up all zero scales, row 5
 * row_scale2 0), prepared on both backends; the CPU's route uploaded to the GPU; unused
 * experts' row scales NaN on the GPU; each grouped tile variant, with its own split and
 * with each of split_ks, and the reference path against the CPU.
 */
static void test_moe_experts_nvfp4(void **state)
{
	for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++) {
		const struct shape sh = shapes[si];
		const size_t count = (size_t)sh.n * sh.hidden;
		struct sm70_experts hgu = host_new(sh.E, 2 * sh.inter, sh.hidden);
		struct sm70_experts hdn = host_new(sh.E, sh.hidden, sh.inter);
		float *x = rvec16(count, 1.0f), *l = fvec((size_t)sh.n * sh.E);
		float *oc = fvec(count), *og = fvec(count), *o2 = fvec(count);
		struct bufs bc, bg;
		struct hroute h;
		void *lc;
		char what[128];

		host_fill(&hgu, ZERO_EXPERT);
		host_fill(&hdn, -1);
		bufs_new(cpu, &bc, &sh, &hgu, &hdn, x);
		bufs_new(gpu, &bg, &sh, &hgu, &hdn, x);
		fill_logits(l, sh.E, sh.n, sh.E, sh.hot);
		lc = up_bytes(cpu, l, sizeof(float) * (size_t)sh.n * sh.E);
		cpu->ops->moe_route(cpu, &bc.r, lc, sh.E, sh.n, sh.E, sh.k, 1);
		route_get(cpu, &bc.r, (size_t)sh.n * sh.k, &h);
		assert_int_equal(h.ids[0], ZERO_EXPERT);
		route_put(gpu, &bg.r, &h);
		poison_unused(gpu, &bg.gu, &h);
		poison_unused(gpu, &bg.dn, &h);
		run(cpu, &bc, &sh, oc);
		for (int v = 0; v <= N_VARIANTS; v++) {
			const int ref = v == N_VARIANTS;

			sm70__cuda_moe_tune(ref, ref ? 0 : v, 0);
			run(gpu, &bg, &sh, og);
			sm70__cuda_moe_tune(-1, 0, 0);
			snprintf(what, sizeof(what), "nvfp4 H%d I%d E%d k%d n%d (%d used) %s %d",
				 sh.hidden, sh.inter, sh.E, sh.k, sh.n, h.n_used[0],
				 ref ? "reference" : "variant", ref ? 0 : v);
			compare_values(what, og, oc, count, TOL_F16_OUT);
			for (size_t ki = 0; !ref && ki < sizeof(split_ks) / sizeof(split_ks[0]);
			     ki++) {
				sm70__cuda_moe_tune(0, v, 0);
				sm70__cuda_moe_tune_ks(split_ks[ki][0], split_ks[ki][1]);
				run(gpu, &bg, &sh, og);
				run(gpu, &bg, &sh, o2);
				sm70__cuda_moe_tune_ks(-2, -2);
				sm70__cuda_moe_tune(-1, 0, 0);
				snprintf(what, sizeof(what),
					 "nvfp4 H%d I%d E%d k%d n%d (%d used) variant %d ks %d,%d",
					 sh.hidden, sh.inter, sh.E, sh.k, sh.n, h.n_used[0], v,
					 split_ks[ki][0], split_ks[ki][1]);
				compare_values(what, og, oc, count, TOL_F16_OUT);
				assert_memory_equal(og, o2, sizeof(float) * count);
			}
		}
		hroute_free(&h);
		bfree(cpu, lc);
		bufs_free(gpu, &bg), bufs_free(cpu, &bc);
		host_free(&hdn), host_free(&hgu);
		free(x), free(l), free(oc), free(og), free(o2);
	}
	assert_int_equal(gpu->ops->sync(gpu), 0);
}

/* ---- graph replay ----------------------------------------------------------------------- */

/*
 * moe_route + moe_experts on NVFP4 stacks captured once, then for three sets of logits:
 * the replay's route and out equal an eager run's bit for bit, its route the CPU's, its
 * out close to the CPU's, and the routing really changed.
 */
static void graph_case(struct shape sh)
{
	const int ld = sh.E + 1, n = sh.n;
	const size_t nk = (size_t)n * sh.k, count = (size_t)n * sh.hidden;
	struct sm70_experts hgu = host_new(sh.E, 2 * sh.inter, sh.hidden);
	struct sm70_experts hdn = host_new(sh.E, sh.hidden, sh.inter);
	float *x = rvec16(count, 1.0f), *l = fvec((size_t)n * ld);
	float *og = fvec(count), *oe = fvec(count), *oc = fvec(count);
	struct bufs bg, be_, bc;
	void *lg, *lc, *graph = NULL;
	int32_t *prev = calloc(nk, sizeof(int32_t));
	int changed = 0;
	char what[128];

	assert_non_null(prev);
	host_fill(&hgu, ZERO_EXPERT);
	host_fill(&hdn, -1);
	bufs_new(gpu, &bg, &sh, &hgu, &hdn, x);
	bufs_new(gpu, &be_, &sh, &hgu, &hdn, x);
	bufs_new(cpu, &bc, &sh, &hgu, &hdn, x);
	lg = balloc(gpu, sizeof(float) * (size_t)n * ld);
	lc = balloc(cpu, sizeof(float) * (size_t)n * ld);
	assert_int_equal(gpu->ops->sync(gpu), 0);
	assert_int_equal(gpu->ops->graph_begin(gpu), 0);
	gpu->ops->moe_route(gpu, &bg.r, lg, ld, n, sh.E, sh.k, 1);
	gpu->ops->moe_experts(gpu, bg.out, bg.x, &bg.gu, &bg.dn, &bg.r, n, sh.k, bg.mid,
			      bg.part);
	assert_int_equal(gpu->ops->graph_end(gpu, &graph), 0);

	for (int trial = 0; trial < 3; trial++) {
		struct hroute hg, he, hc;

		fill_logits(l, ld, n, sh.E, -1);
		assert_int_equal(gpu->ops->upload(gpu, lg, l, sizeof(float) * (size_t)n * ld), 0);
		memcpy(lc, l, sizeof(float) * (size_t)n * ld);
		poison_act(gpu, bg.out, count);
		assert_int_equal(gpu->ops->graph_launch(gpu, graph), 0);
		get_act(gpu, og, bg.out, count);
		route_get(gpu, &bg.r, nk, &hg);

		poison_act(gpu, be_.out, count);
		gpu->ops->moe_route(gpu, &be_.r, lg, ld, n, sh.E, sh.k, 1);
		gpu->ops->moe_experts(gpu, be_.out, be_.x, &be_.gu, &be_.dn, &be_.r, n, sh.k,
				      be_.mid, be_.part);
		get_act(gpu, oe, be_.out, count);
		route_get(gpu, &be_.r, nk, &he);

		cpu->ops->moe_route(cpu, &bc.r, lc, ld, n, sh.E, sh.k, 1);
		cpu->ops->moe_experts(cpu, bc.out, bc.x, &bc.gu, &bc.dn, &bc.r, n, sh.k, bc.mid,
				      bc.part);
		get_act(cpu, oc, bc.out, count);
		route_get(cpu, &bc.r, nk, &hc);

		assert_true(route_compare(&hg, &he) == 0.0);
		assert_memory_equal(og, oe, sizeof(float) * count);
		assert_true(route_compare(&hg, &hc) <= TOL_ROUTE_W);
		snprintf(what, sizeof(what), "nvfp4 graph E%d k%d n%d trial %d (%d used) vs cpu",
			 sh.E, sh.k, n, trial, hg.n_used[0]);
		compare_values(what, og, oc, count, TOL_F16_OUT);
		changed += trial > 0 && memcmp(hg.ids, prev, sizeof(int32_t) * nk) != 0;
		memcpy(prev, hg.ids, sizeof(int32_t) * nk);
		hroute_free(&hg), hroute_free(&he), hroute_free(&hc);
	}
	assert_true(changed >= 1);
	printf("  nvfp4 graph E%d k%d n%d: replay == eager bit for bit (route and out) over 3 "
	       "routings\n", sh.E, sh.k, n);
	free(prev);
	gpu->ops->graph_destroy(gpu, graph);
	bfree(cpu, lc), bfree(gpu, lg);
	bufs_free(cpu, &bc), bufs_free(gpu, &be_), bufs_free(gpu, &bg);
	host_free(&hdn), host_free(&hgu);
	free(x), free(l), free(og), free(oe), free(oc);
}

static void test_graph_replay(void **state)
{
	graph_case((struct shape){ 512, 256, 128, 8, 16, -1 });
	graph_case((struct shape){ 256, 64, 512, 10, 4, -1 });
	graph_case((struct shape){ 256, 48, 8, 2, 3, -1 });
}

/* ---- prepare_experts refusals ---------------------------------------------------------- */

static void expect_refusal(const struct sm70_experts *h, const char *what)
{
	struct sm70_err err = { { 0 } };
	struct sm70_experts s = { .data = (void *)1, .scale = (void *)1,
				  .row_scale2 = (float *)1 };

	assert_int_equal(gpu->ops->prepare_experts(gpu, &s, h, &err), -EINVAL);
	assert_null(s.data);
	assert_null(s.scale);
	assert_null(s.row_scale2);
	if (!strstr(err.msg, what))
		fail_msg("error \"%s\" does not name \"%s\"", err.msg, what);
	printf("  cuda refused: %s\n", err.msg);
}

static void test_prepare_refusals(void **state)
{
	struct sm70_experts h = host_new(4, 24, 48), bad;
	uint8_t *scales = h.scale;

	host_fill(&h, -1);
	bad = h, bad.cols = 40;
	expect_refusal(&bad, "multiple of 16");
	scales[(1 * 24 + 9) * 3 + 2] = 0xff;
	expect_refusal(&h, "expert 1 row 9: weight_scale[2] is an E4M3 NaN (0xff)");
	scales[(1 * 24 + 9) * 3 + 2] = 0x38;
	h.row_scale2[2 * 24 + 4] = -1.0f;
	expect_refusal(&h, "expert 2 row 4: weight_scale_2 is -1");
	host_free(&h);
	assert_int_equal(gpu->ops->sync(gpu), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_moe_experts_nvfp4),
		cmocka_unit_test(test_graph_replay),
		cmocka_unit_test(test_prepare_refusals),
	};

	return gpu_test_main("cuda_moe_nvfp4", tests, sizeof(tests) / sizeof(tests[0]), &gpu,
			     &gpu_ref, &cpu);
}
