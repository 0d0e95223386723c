/* test_cuda_moe - the CUDA mixture-of-experts ops (moe_route, moe_experts,
 * sigmoid_scale_add) against their CPU twins on the same inputs, the grouped expert
 * kernels (every tile variant) and the reference path (SM70_MOE=reference) against the
 * CPU, and a captured route + experts graph replayed over new router logits against eager
 * runs. */
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

#define GPU_TEST_SEED 0x3e0e5c0ffee77ULL
#include "tests/gpu/gpu_test.h"
#include "tests/gpu/moe_route_test.h"

/*
 * Errors are max |got - ref| over max |ref| ("rel"). Router weights are f32 on both
 * backends: the softmax sums in another order and the libms' expf differ by an ulp or two.
 * The experts' out is f16 on the GPU (up to 2^-11 of rounding) and mid is rounded to f16
 * between the two projections (the CPU keeps it f32): a few 1e-4 of max |out|.
 */
#define TOL_ROUTE_W 1e-5
#define TOL_F16_OUT 1.5e-3
#define N_VARIANTS 5 /* sm70__cuda_moe_tune's tile variants */

static struct sm70_backend *gpu, *gpu_ref, *cpu;

/* ---- helpers ----------------------------------------------------------------------- */

/* n act values of NaN into a backend buffer: a value the op does not write shows. */
static void poison_act(struct sm70_backend *be, void *dst, size_t n)
{
	float *v = fvec(n);

	for (size_t i = 0; i < n; i++)
		v[i] = NAN;
	set_act(be, dst, v, n);
	free(v);
}

/* ---- routes ------------------------------------------------------------------------- */

/* Whether fill_logits' tie rows fit: k - 1 odd ids above the even ones. */
static int ties_fit(int n, int E, int k)
{
	return n >= 3 && 2 * k + 2 <= E;
}

/*
 * Router logits [n][ld] in [-4, 4), columns from E on a large value the op must not
 * read. When ties_fit, three rows carry exact ties:
 *   row 1: every logit equal                        -> ids 0 .. k-1
 *   row 2: four equal maxima at 1, 3, E/2, E-1      -> those first, in that order
 *   row n-1: k-1 distinct highs at odd ids E-1, E-3, ..., then three equal values at
 *     E-2, E/2, 2 competing for the last place      -> 2 takes it
 * hot >= 0: every row's expert `hot` gets the largest logit (one expert of every token).
 */
static void fill_logits(float *l, int ld, int n, int E, int k, int hot)
{
	for (int t = 0; t < n; t++)
		for (int c = 0; c < ld; c++)
			l[(size_t)t * ld + c] = c < E ? rnd(4.0f) : 100.0f;
	if (hot >= 0)
		for (int t = 0; t < n; t++)
			l[(size_t)t * ld + hot] = 6.0f;
	if (!ties_fit(n, E, k))
		return;
	for (int e = 0; e < E; e++) {
		l[1 * (size_t)ld + e] = 0.25f;
		l[2 * (size_t)ld + e] = -2.0f + rnd(2.0f);
		l[(size_t)(n - 1) * ld + e] = -2.0f + rnd(2.0f);
	}
	l[2 * ld + 1] = l[2 * ld + 3] = l[2 * ld + E / 2] = l[2 * ld + E - 1] = 2.5f;
	for (int i = 0; i < k - 1; i++)
		l[(size_t)(n - 1) * ld + E - 1 - 2 * i] = 3.0f - 0.1f * (float)i;
	l[(size_t)(n - 1) * ld + E - 2] = l[(size_t)(n - 1) * ld + E / 2] =
		l[(size_t)(n - 1) * ld + 2] = 1.0f;
}

/* The tie rows picked by the lower-id-first rule. */
static void check_tie_rows(const struct hroute *h, int n, int E, int k)
{
	const int maxima[4] = { 1, 3, E / 2, E - 1 };
	const int32_t *last = h->ids + (size_t)(n - 1) * k;

	for (int j = 0; j < k; j++)
		assert_int_equal(h->ids[1 * k + j], j);
	for (int j = 0; j < k && j < 4; j++)
		assert_int_equal(h->ids[2 * k + j], maxima[j]);
	for (int j = 0; j < k - 1; j++)
		assert_int_equal(last[j], E - 1 - 2 * j);
	assert_int_equal(last[k - 1], 2);
}

/* ---- moe_route ---------------------------------------------------------------------- */

/* moe_route on both backends over the same logits (ld = E + 1: the shared-expert gate
 * column beside the router's), renorm on and off: every array equal, weights close. */
static void test_moe_route(void **state)
{
	static const int ek[][2] = { { 8, 2 }, { 128, 8 }, { 512, 10 } };
	static const int ns[] = { 1, 4, 16, 64, 300 };

	for (size_t c = 0; c < sizeof(ek) / sizeof(ek[0]); c++) {
		const int E = ek[c][0], k = ek[c][1], ld = E + 1;
		double worst = 0.0;
		int cases = 0, ties = 0;

		for (size_t ni = 0; ni < sizeof(ns) / sizeof(ns[0]); ni++) {
			for (int renorm = 0; renorm < 2; renorm++) {
				const int n = ns[ni];
				const size_t nk = (size_t)n * k;
				float *l = fvec((size_t)n * ld);
				struct sm70_moe_route rg, rc;
				struct hroute hg, hc;
				void *lg, *lc;
				double rel;

				fill_logits(l, ld, n, E, k, -1);
				lg = up_bytes(gpu, l, sizeof(float) * (size_t)n * ld);
				lc = up_bytes(cpu, l, sizeof(float) * (size_t)n * ld);
				route_new(gpu, &rg, nk);
				route_new(cpu, &rc, nk);
				gpu->ops->moe_route(gpu, &rg, lg, ld, n, E, k, renorm);
				cpu->ops->moe_route(cpu, &rc, lc, ld, n, E, k, renorm);
				route_get(gpu, &rg, nk, &hg);
				route_get(cpu, &rc, nk, &hc);
				rel = route_compare(&hg, &hc);
				if (rel > worst)
					worst = rel;
				if (ties_fit(n, E, k)) {
					check_tie_rows(&hg, n, E, k);
					ties++;
				}
				cases++;
				hroute_free(&hg), hroute_free(&hc);
				route_free(gpu, &rg), route_free(cpu, &rc);
				bfree(gpu, lg), bfree(cpu, lc);
				free(l);
			}
		}
		printf("  moe_route E %d k %d: %d cases (n 1, 4, 16, 64, 300; renorm off/on): ids, "
		       "order, used, used_first, n_used equal to the cpu's; %d with tie rows "
		       "picked by the lower id; w max rel diff %.3g (tol %.0e)\n",
		       E, k, cases, ties, worst, TOL_ROUTE_W);
		assert_true(worst <= TOL_ROUTE_W);
	}
}

/* Arguments the op does not take leave the empty grouping, as on the CPU. */
static void test_moe_route_empty(void **state)
{
	struct sm70_moe_route r;
	int32_t nu = -1, uf = -1, seven[2] = { 7, 7 };
	float *l = balloc(gpu, sizeof(float) * 64);

	route_new(gpu, &r, 16);
	assert_int_equal(gpu->ops->upload(gpu, r.n_used, seven, 4), 0);
	assert_int_equal(gpu->ops->upload(gpu, r.used_first, seven, 4), 0);
	gpu->ops->moe_route(gpu, &r, l, 8, 2, 8, 9, 1); /* k > E */
	assert_int_equal(gpu->ops->download(gpu, &nu, r.n_used, 4), 0);
	assert_int_equal(gpu->ops->download(gpu, &uf, r.used_first, 4), 0);
	assert_int_equal(nu, 0);
	assert_int_equal(uf, 0);
	assert_int_equal(gpu->ops->sync(gpu), 0);
	printf("  moe_route with k > n_experts: n_used 0, used_first[0] 0\n");
	route_free(gpu, &r);
	bfree(gpu, l);
}

/* ---- moe_experts ------------------------------------------------------------------------ */

struct ex_shape {
	int hidden, inter, E, k;
};

/* One shape's weights: f16 stacks, host and on both backends. */
struct ex_weights {
	struct ex_shape sh;
	uint16_t *gu, *dn; /* host */
	struct sm70_experts gu_c, dn_c, gu_g, dn_g;
};

static void exw_new(struct ex_weights *w, struct ex_shape sh)
{
	const size_t ngu = (size_t)sh.E * 2 * sh.inter * sh.hidden;
	const size_t ndn = (size_t)sh.E * sh.hidden * sh.inter;
	const float agu = sqrtf(3.0f / (float)sh.hidden), adn = sqrtf(3.0f / (float)sh.inter);

	w->sh = sh;
	w->gu = malloc(ngu * 2);
	w->dn = malloc(ndn * 2);
	assert_true(w->gu && w->dn);
	for (size_t i = 0; i < ngu; i++)
		w->gu[i] = sm70_f32_to_f16(rnd(agu));
	for (size_t i = 0; i < ndn; i++)
		w->dn[i] = sm70_f32_to_f16(rnd(2.0f * adn));
	w->gu_c = (struct sm70_experts){ .dtype = SM70_DTYPE_F16, .n_experts = sh.E,
					 .rows = 2 * sh.inter, .cols = sh.hidden,
					 .data = up_bytes(cpu, w->gu, ngu * 2) };
	w->dn_c = (struct sm70_experts){ .dtype = SM70_DTYPE_F16, .n_experts = sh.E,
					 .rows = sh.hidden, .cols = sh.inter,
					 .data = up_bytes(cpu, w->dn, ndn * 2) };
	w->gu_g = w->gu_c;
	w->dn_g = w->dn_c;
	w->gu_g.data = balloc(gpu, ngu * 2);
	w->dn_g.data = balloc(gpu, ndn * 2);
}

static void exw_free(struct ex_weights *w)
{
	bfree(gpu, w->dn_g.data), bfree(gpu, w->gu_g.data);
	bfree(cpu, w->dn_c.data), bfree(cpu, w->gu_c.data);
	free(w->dn), free(w->gu);
}

/* The GPU's stacks: the host weights with every expert the route does not use NaN, so an
 * expert read that should not happen shows in out. */
static void exw_upload_poisoned(struct ex_weights *w, const struct hroute *h)
{
	const size_t pgu = (size_t)2 * w->sh.inter * w->sh.hidden;
	const size_t pdn = (size_t)w->sh.hidden * w->sh.inter;
	uint16_t *gu = malloc(pgu * w->sh.E * 2), *dn = malloc(pdn * w->sh.E * 2);

	assert_true(gu && dn);
	memcpy(gu, w->gu, pgu * w->sh.E * 2);
	memcpy(dn, w->dn, pdn * w->sh.E * 2);
	for (int e = 0, u = 0; e < w->sh.E; e++) {
		if (u < h->n_used[0] && h->used[u] == e) {
			u++;
			continue;
		}
		for (size_t i = 0; i < pgu; i++)
			gu[(size_t)e * pgu + i] = 0x7e00;
		for (size_t i = 0; i < pdn; i++)
			dn[(size_t)e * pdn + i] = 0x7e00;
	}
	assert_int_equal(gpu->ops->upload(gpu, w->gu_g.data, gu, pgu * w->sh.E * 2), 0);
	assert_int_equal(gpu->ops->upload(gpu, w->dn_g.data, dn, pdn * w->sh.E * 2), 0);
	free(gu), free(dn);
}

/* A backend's moe_experts buffers for n tokens. */
struct ex_bufs {
	struct sm70_moe_route r;
	void *x, *mid, *out;
	float *part;
};

static void exb_new(struct sm70_backend *be, struct ex_bufs *b, const struct ex_shape *sh,
		    int n, const float *x)
{
	const size_t nk = (size_t)n * sh->k, a = be->act_dtype == SM70_DTYPE_F32 ? 4 : 2;

	route_new(be, &b->r, nk);
	b->x = up_act(be, x, (size_t)n * sh->hidden);
	b->mid = balloc(be, nk * sh->inter * a);
	b->part = balloc(be, nk * sh->hidden * sizeof(float));
	b->out = balloc(be, (size_t)n * sh->hidden * a);
}

static void exb_free(struct sm70_backend *be, struct ex_bufs *b)
{
	bfree(be, b->out), bfree(be, b->part), bfree(be, b->mid), bfree(be, b->x);
	route_free(be, &b->r);
}

/* moe_experts on be into b->out (poisoned first); out [n][hidden] on the host. */
static void ex_run(struct sm70_backend *be, struct ex_bufs *b, const struct sm70_experts *gu,
		   const struct sm70_experts *dn, int n, int k, float *out)
{
	const size_t count = (size_t)n * gu->cols;

	poison_act(be, b->out, count);
	be->ops->moe_experts(be, b->out, b->x, gu, dn, &b->r, n, k, b->mid, b->part);
	get_act(be, out, b->out, count);
}

static const struct ex_shape ex_shapes[] = {
	{ 256, 128, 8, 2 },   /* E 8 / k 2 */
	{ 512, 256, 128, 8 }, /* E 128 / k 8 */
	{ 256, 128, 512, 10 }, /* E 512 / k 10 */
	{ 2048, 768, 16, 4 }, /* Qwen3-30B-A3B's dot lengths: 32 and 12 steps */
	{ 100, 44, 8, 2 },    /* hidden, inter % 8 != 0: the reference kernels */
};

/*
 * For each shape and n = 1, 4, 16, 64: a route (the CPU's, uploaded to both) in which
 * every token but fill_logits' tie rows chooses expert 1 (at n = 64 its 61 tokens take
 * four passes of 16) and the tie rows tie; unused experts NaN on the GPU; the grouped
 * kernels (each tile variant) and the reference path against the CPU.
 */
static void test_moe_experts(void **state)
{
	static const int ns[] = { 1, 4, 16, 64 };
	static const int ex_ks[][2] = { { -1, -1 }, { 1, 8 }, { 3, 5 }, { 8, 3 }, { 6, 7 } };

	for (size_t si = 0; si < sizeof(ex_shapes) / sizeof(ex_shapes[0]); si++) {
		const struct ex_shape sh = ex_shapes[si];
		struct ex_weights w;

		exw_new(&w, sh);
		for (size_t ni = 0; ni < sizeof(ns) / sizeof(ns[0]); ni++) {
			const int n = ns[ni], ld = sh.E;
			const size_t count = (size_t)n * sh.hidden;
			float *x = rvec16(count, 1.0f), *l = fvec((size_t)n * ld);
			float *oc = fvec(count), *og = fvec(count);
			struct ex_bufs bc, bg;
			struct hroute h;
			void *lc;
			char what[128];

			exb_new(cpu, &bc, &sh, n, x);
			exb_new(gpu, &bg, &sh, n, x);
			fill_logits(l, ld, n, sh.E, sh.k, 1);
			lc = up_bytes(cpu, l, sizeof(float) * (size_t)n * ld);
			cpu->ops->moe_route(cpu, &bc.r, lc, ld, n, sh.E, sh.k, 1);
			route_get(cpu, &bc.r, (size_t)n * sh.k, &h);
			route_put(gpu, &bg.r, &h);
			exw_upload_poisoned(&w, &h);
			ex_run(cpu, &bc, &w.gu_c, &w.dn_c, n, sh.k, oc);
			for (int v = 0; v <= N_VARIANTS; v++) {
				const int ref = v == N_VARIANTS;

				/* v < N_VARIANTS: grouped variant v; then the reference path */
				sm70__cuda_moe_tune(ref, ref ? 0 : v, 0);
				ex_run(gpu, &bg, &w.gu_g, &w.dn_g, n, sh.k, og);
				sm70__cuda_moe_tune(-1, 0, 0);
				if (v < N_VARIANTS && sh.hidden % 8 == 0 && sh.inter % 8 == 0)
					snprintf(what, sizeof(what),
						 "experts H%d I%d E%d k%d n%d (%d used) variant %d",
						 sh.hidden, sh.inter, sh.E, sh.k, n, h.n_used[0], v);
				else
					snprintf(what, sizeof(what),
						 "experts H%d I%d E%d k%d n%d (%d used) reference",
						 sh.hidden, sh.inter, sh.E, sh.k, n, h.n_used[0]);
				compare_values(what, og, oc, count, TOL_F16_OUT);
				if (sh.hidden % 8)
					break; /* every path is the reference one */
			}
			/* variant 0 with other warps a tile (columns split unevenly) and the
			 * fitting rule; every value of the split takes the same kernel */
			for (size_t ki = 0; sh.hidden % 8 == 0 && sh.inter % 8 == 0 &&
					    ki < sizeof(ex_ks) / sizeof(ex_ks[0]); ki++) {
				sm70__cuda_moe_tune(0, 0, 0);
				sm70__cuda_moe_tune_ks(ex_ks[ki][0], ex_ks[ki][1]);
				ex_run(gpu, &bg, &w.gu_g, &w.dn_g, n, sh.k, og);
				sm70__cuda_moe_tune_ks(0, 0);
				sm70__cuda_moe_tune(-1, 0, 0);
				snprintf(what, sizeof(what),
					 "experts H%d I%d E%d k%d n%d (%d used) ks %d,%d", sh.hidden,
					 sh.inter, sh.E, sh.k, n, h.n_used[0], ex_ks[ki][0],
					 ex_ks[ki][1]);
				compare_values(what, og, oc, count, TOL_F16_OUT);
			}
			hroute_free(&h);
			bfree(cpu, lc);
			exb_free(gpu, &bg), exb_free(cpu, &bc);
			free(x), free(l), free(oc), free(og);
		}
		exw_free(&w);
	}
	assert_int_equal(gpu->ops->sync(gpu), 0);
}

/* ---- sigmoid_scale_add ------------------------------------------------------------------ */

/* out += sigmoid(g) x, the gate one column of f32 rows ld apart (as the router's extra
 * column), on both backends; dims odd and even (the 2-wide and 1-wide kernels). */
static void test_sigmoid_scale_add(void **state)
{
	static const int dims[] = { 1, 5, 256, 2048, 3001 };

	for (size_t di = 0; di < sizeof(dims) / sizeof(dims[0]); di++) {
		const int n = 6, dim = dims[di], ld = 9;
		const size_t count = (size_t)n * dim;
		float *o = rvec16(count, 4.0f), *x = rvec16(count, 4.0f), *g = fvec((size_t)n * ld);
		float *rc = fvec(count), *rg = fvec(count);
		void *oc, *og, *xc, *xg, *gc, *gg;
		char what[96];

		for (int i = 0; i < n * ld; i++)
			g[i] = i % ld ? NAN : rnd(15.0f); /* only column 0 may be read */
		g[0] = -200.0f;
		g[(n - 1) * ld] = 200.0f;
		oc = up_act(cpu, o, count), og = up_act(gpu, o, count);
		xc = up_act(cpu, x, count), xg = up_act(gpu, x, count);
		gc = up_bytes(cpu, g, sizeof(float) * n * ld);
		gg = up_bytes(gpu, g, sizeof(float) * n * ld);
		cpu->ops->sigmoid_scale_add(cpu, oc, xc, gc, ld, n, dim);
		gpu->ops->sigmoid_scale_add(gpu, og, xg, gg, ld, n, dim);
		get_act(cpu, rc, oc, count);
		get_act(gpu, rg, og, count);
		snprintf(what, sizeof(what), "sigmoid_scale_add n %d dim %d", n, dim);
		compare_values(what, rg, rc, count, TOL_F16_OUT);
		bfree(cpu, oc), bfree(gpu, og), bfree(cpu, xc), bfree(gpu, xg), bfree(cpu, gc);
		bfree(gpu, gg);
		free(o), free(x), free(g), free(rc), free(rg);
	}
}

/* ---- graph replay ----------------------------------------------------------------------- */

/*
 * moe_route + moe_experts captured once (n tokens, logits in a fixed buffer), then for
 * three sets of logits (the first with tie rows): the replay's route and out equal an
 * eager run's bit for bit, its ids equal the CPU's, its out close to the CPU's, and the
 * routing really differed between the sets.
 */
static void graph_case(struct ex_shape sh, int n)
{
	const int ld = sh.E + 1;
	const size_t nk = (size_t)n * sh.k, count = (size_t)n * sh.hidden;
	struct ex_weights w;
	struct ex_bufs bg, be_, bc;
	float *x = rvec16(count, 1.0f), *l = fvec((size_t)n * ld);
	float *og = fvec(count), *oe = fvec(count), *oc = fvec(count);
	void *lg = balloc(gpu, sizeof(float) * (size_t)n * ld), *lc, *graph = NULL;
	int32_t *prev = calloc(nk, sizeof(int32_t));
	int changed = 0;
	char what[128];

	assert_non_null(prev);
	exw_new(&w, sh);
	assert_int_equal(gpu->ops->upload(gpu, w.gu_g.data, w.gu, (size_t)sh.E * 2 * sh.inter *
							    sh.hidden * 2), 0);
	assert_int_equal(gpu->ops->upload(gpu, w.dn_g.data, w.dn, (size_t)sh.E * sh.hidden *
							    sh.inter * 2), 0);
	exb_new(gpu, &bg, &sh, n, x);
	exb_new(gpu, &be_, &sh, n, x);
	exb_new(cpu, &bc, &sh, n, x);
	lc = balloc(cpu, sizeof(float) * (size_t)n * ld);
	assert_int_equal(gpu->ops->sync(gpu), 0);
	assert_int_equal(gpu->ops->graph_begin(gpu), 0);
	gpu->ops->moe_route(gpu, &bg.r, lg, ld, n, sh.E, sh.k, 1);
	gpu->ops->moe_experts(gpu, bg.out, bg.x, &w.gu_g, &w.dn_g, &bg.r, n, sh.k, bg.mid,
			      bg.part);
	assert_int_equal(gpu->ops->graph_end(gpu, &graph), 0);

	for (int trial = 0; trial < 3; trial++) {
		struct hroute hg, he, hc;

		fill_logits(l, ld, n, sh.E, sh.k, -1);
		if (trial > 0) /* no tie rows: other routings */
			for (size_t i = 0; i < (size_t)n * ld; i++)
				l[i] = (i % ld) < (size_t)sh.E ? rnd(4.0f) : 100.0f;
		assert_int_equal(gpu->ops->upload(gpu, lg, l, sizeof(float) * (size_t)n * ld), 0);
		memcpy(lc, l, sizeof(float) * (size_t)n * ld);
		poison_act(gpu, bg.out, count);
		assert_int_equal(gpu->ops->graph_launch(gpu, graph), 0);
		get_act(gpu, og, bg.out, count);
		route_get(gpu, &bg.r, nk, &hg);

		poison_act(gpu, be_.out, count);
		gpu->ops->moe_route(gpu, &be_.r, lg, ld, n, sh.E, sh.k, 1);
		gpu->ops->moe_experts(gpu, be_.out, be_.x, &w.gu_g, &w.dn_g, &be_.r, n, sh.k,
				      be_.mid, be_.part);
		get_act(gpu, oe, be_.out, count);
		route_get(gpu, &be_.r, nk, &he);

		cpu->ops->moe_route(cpu, &bc.r, lc, ld, n, sh.E, sh.k, 1);
		cpu->ops->moe_experts(cpu, bc.out, bc.x, &w.gu_c, &w.dn_c, &bc.r, n, sh.k, bc.mid,
				      bc.part);
		get_act(cpu, oc, bc.out, count);
		route_get(cpu, &bc.r, nk, &hc);

		assert_true(route_compare(&hg, &he) == 0.0);
		assert_memory_equal(og, oe, sizeof(float) * count);
		assert_true(route_compare(&hg, &hc) <= TOL_ROUTE_W);
		if (ties_fit(n, sh.E, sh.k) && trial == 0)
			check_tie_rows(&hg, n, sh.E, sh.k);
		snprintf(what, sizeof(what), "graph E%d k%d n%d trial %d (%d used) vs cpu", sh.E,
			 sh.k, n, trial, hg.n_used[0]);
		compare_values(what, og, oc, count, TOL_F16_OUT);
		changed += trial > 0 && memcmp(hg.ids, prev, sizeof(int32_t) * nk) != 0;
		memcpy(prev, hg.ids, sizeof(int32_t) * nk);
		hroute_free(&hg), hroute_free(&he), hroute_free(&hc);
	}
	assert_true(changed >= 1);
	printf("  graph E%d k%d n%d: replay == eager bit for bit (route and out) over 3 routings\n",
	       sh.E, sh.k, n);
	free(prev);
	gpu->ops->graph_destroy(gpu, graph);
	bfree(cpu, lc);
	exb_free(cpu, &bc), exb_free(gpu, &be_), exb_free(gpu, &bg);
	bfree(gpu, lg);
	exw_free(&w);
	free(x), free(l), free(og), free(oe), free(oc);
}

static void test_graph_replay(void **state)
{
	graph_case((struct ex_shape){ 512, 256, 128, 8 }, 16);
	graph_case((struct ex_shape){ 256, 128, 512, 10 }, 4);
	graph_case((struct ex_shape){ 256, 128, 8, 2 }, 2);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_moe_route),
		cmocka_unit_test(test_moe_route_empty),
		cmocka_unit_test(test_moe_experts),
		cmocka_unit_test(test_sigmoid_scale_add),
		cmocka_unit_test(test_graph_replay),
	};

	return gpu_test_main("cuda_moe", tests, sizeof(tests) / sizeof(tests[0]), &gpu, &gpu_ref,
			     &cpu);
}
