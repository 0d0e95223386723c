/* test_moe_ops - CPU moe_route, moe_experts and sigmoid_scale_add against float64. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#define OP_TEST_SEED 0x5eed0f3e7a11ULL

#include "kernels/backend.h"
#include "kernels/cpu/cpu_ops.h"
#include "tests/unit/op_test.h"

/* ---- helpers ----------------------------------------------------------------------- */

static struct sm70_backend *mk_backend(int threads)
{
	struct sm70_backend *be = cpu_backend(threads);

	assert_non_null(be->ops->moe_route);
	assert_non_null(be->ops->moe_experts);
	assert_non_null(be->ops->sigmoid_scale_add);
	return be;
}

/* ---- routes ------------------------------------------------------------------------- */

#define MAXE 512

/* A route's arrays for n tokens of k experts, in backend memory. */
static void route_new(struct sm70_backend *be, struct sm70_moe_route *r, int n, int k)
{
	const size_t nk = (size_t)n * (size_t)k;

	r->ids = balloc(be, sizeof(int32_t) * nk);
	r->w = balloc(be, sizeof(float) * nk);
	r->order = balloc(be, sizeof(int32_t) * nk);
	r->used = balloc(be, sizeof(int32_t) * nk);
	r->used_first = balloc(be, sizeof(int32_t) * (nk + 1));
	r->n_used = balloc(be, sizeof(int32_t));
}

static void route_free(struct sm70_backend *be, struct sm70_moe_route *r)
{
	bfree_all(be, r->n_used, r->used_first, r->used, r->order, r->w, r->ids);
}

/* Whether two routes of nk assignments hold the same bits. */
static void route_equal(const struct sm70_moe_route *a, const struct sm70_moe_route *b,
			size_t nk)
{
	assert_memory_equal(a->ids, b->ids, sizeof(int32_t) * nk);
	assert_memory_equal(a->w, b->w, sizeof(float) * nk);
	assert_memory_equal(a->order, b->order, sizeof(int32_t) * nk);
	assert_int_equal(a->n_used[0], b->n_used[0]);
	assert_memory_equal(a->used, b->used, sizeof(int32_t) * (size_t)a->n_used[0]);
	assert_memory_equal(a->used_first, b->used_first,
			    sizeof(int32_t) * (size_t)(a->n_used[0] + 1));
}

/* One row of the float64 router: softmax, then the k largest one at a time, the first
 * (lowest id) of equal ones winning; with renorm divided by their sum. */
static void ref_route_row(const float *l, int E, int k, int renorm, int *ids, double *w)
{
	double p[MAXE], m = l[0], s = 0, sum = 0;
	char taken[MAXE] = { 0 };

	assert_true(E <= MAXE);
	for (int e = 1; e < E; e++)
		m = fmax(m, l[e]);
	for (int e = 0; e < E; e++)
		s += p[e] = exp((double)l[e] - m);
	for (int e = 0; e < E; e++)
		p[e] /= s;
	for (int j = 0; j < k; j++) {
		int best = -1;

		for (int e = 0; e < E; e++)
			if (!taken[e] && (best < 0 || p[e] > p[best]))
				best = e;
		taken[best] = 1;
		ids[j] = best;
		w[j] = p[best];
		sum += p[best];
	}
	for (int j = 0; renorm && j < k; j++)
		w[j] /= sum;
}

/*
 * The grouping arrays against ids, independently of how they were made: every
 * assignment exactly once, experts strictly ascending, assignments (hence tokens)
 * strictly ascending within an expert, used_first bounding the groups, n_used the
 * number of distinct ids; each token's ids distinct and in range. Returns n_used.
 */
static int check_grouping(const struct sm70_moe_route *r, int n, int k, int E)
{
	const int nk = n * k;
	char *seen = calloc((size_t)nk + 1, 1), present[MAXE] = { 0 };
	int distinct = 0, nu = r->n_used[0];

	assert_non_null(seen);
	for (int t = 0; t < n; t++)
		for (int j = 0; j < k; j++) {
			const int e = r->ids[t * k + j];

			assert_true(e >= 0 && e < E);
			for (int i = 0; i < j; i++)
				assert_int_not_equal(r->ids[t * k + i], e);
			distinct += !present[e];
			present[e] = 1;
		}
	assert_int_equal(nu, distinct);
	assert_int_equal(r->used_first[0], 0);
	assert_int_equal(r->used_first[nu], nk);
	for (int u = 0; u < nu; u++) {
		assert_true(u == 0 || r->used[u] > r->used[u - 1]);
		assert_true(r->used_first[u + 1] > r->used_first[u]);
		for (int o = r->used_first[u]; o < r->used_first[u + 1]; o++) {
			const int a = r->order[o];

			assert_true(a >= 0 && a < nk);
			assert_false(seen[a]);
			seen[a] = 1;
			assert_int_equal(r->ids[a], r->used[u]);
			assert_true(o == r->used_first[u] || a / k > r->order[o - 1] / k);
		}
	}
	for (int a = 0; a < nk; a++)
		assert_true(seen[a]);
	free(seen);
	return nu;
}

/* Whether fill_logits' tie rows fit E and k: k - 1 odd ids above the even ones. */
static int ties_fit(int n, int E, int k)
{
	return n >= 3 && 2 * k + 2 <= E;
}

/*
 * Router logits [n][ld], columns from E on a large value the op must not read. When
 * ties_fit, three rows carry exact ties (ids chosen so that E = 8, 16, 512 all work):
 *   row 1: every logit equal                         -> ids 0 .. k-1
 *   row 2: four equal maxima at 1, 3, E/2, E-1       -> those first, in that order
 *   row n-1: k-1 distinct highs at odd ids E-1, E-3, ... and then three equal values at
 *     the even ids E-2, E/2, 2 competing for the last place -> 2 takes it
 */
static void fill_logits(float *l, int ld, int n, int E, int k)
{
	for (int t = 0; t < n; t++)
		for (int c = 0; c < ld; c++)
			l[(size_t)t * ld + c] = c < E ? rnd_range(-4, 4) : 100.0f;
	if (!ties_fit(n, E, k))
		return;
	for (int e = 0; e < E; e++) {
		l[1 * ld + e] = 0.25f;
		l[2 * ld + e] = rnd_range(-4, 0);
		l[(size_t)(n - 1) * ld + e] = rnd_range(-4, 0);
	}
	l[2 * ld + 1] = l[2 * ld + 3] = l[2 * ld + E / 2] = l[2 * ld + E - 1] = 2.5f;
	for (int i = 0; i < k - 1; i++)
		l[(size_t)(n - 1) * ld + E - 1 - 2 * i] = 3.0f - 0.1f * (float)i;
	l[(size_t)(n - 1) * ld + E - 2] = l[(size_t)(n - 1) * ld + E / 2] =
		l[(size_t)(n - 1) * ld + 2] = 1.0f;
}

/* The tie rows of fill_logits picked as the lower-id-first rule says. */
static void check_tie_rows(const struct sm70_moe_route *r, int n, int E, int k)
{
	const int maxima[4] = { 1, 3, E / 2, E - 1 };
	const int32_t *last = r->ids + (size_t)(n - 1) * k;

	for (int j = 0; j < k; j++)
		assert_int_equal(r->ids[1 * k + j], j);
	for (int j = 0; j < k && j < 4; j++)
		assert_int_equal(r->ids[2 * k + j], maxima[j]);
	for (int j = 0; j < k - 1; j++)
		assert_int_equal(last[j], E - 1 - 2 * j);
	assert_int_equal(last[k - 1], 2);
}

/* ---- moe_route ------------------------------------------------------------------------- */

/* Router weights: tol relative to each weight; f32 softmax terms, their 8-lane sum over
 * up to 512 experts and the renorm sum round a few times (measured worst: see the
 * print). */
#define ROUTE_TOL 2e-6

/*
 * moe_route against float64 for (E, k) = 8/2, 16/4, 512/10 (and 8/8, 16/1 for the
 * edges), n = 1, 7, 64, renorm off and on: ids equal, weights within ROUTE_TOL, the
 * grouping consistent, the tie rows by the lower id.
 */
static void test_moe_route(void **state)
{
	struct sm70_backend *be = mk_backend(3);
	const int ek[][2] = { { 8, 2 }, { 16, 4 }, { 512, 10 }, { 8, 8 }, { 16, 1 } };
	const int ns[] = { 1, 7, 64 };
	struct errstat e = { 0 };
	size_t ids_equal = 0, groupings = 0, tie_rows = 0;

	for (size_t c = 0; c < sizeof(ek) / sizeof(ek[0]); c++) {
		for (size_t ni = 0; ni < 3; ni++) {
			for (int renorm = 0; renorm < 2; renorm++) {
				const int E = ek[c][0], k = ek[c][1], n = ns[ni], ld = E + 3;
				float *l = balloc(be, sizeof(float) * (size_t)n * ld);
				struct sm70_moe_route r;

				route_new(be, &r, n, k);
				fill_logits(l, ld, n, E, k);
				be->ops->moe_route(be, &r, l, ld, n, E, k, renorm);
				for (int t = 0; t < n; t++) {
					int ids[MAXE];
					double w[MAXE];

					ref_route_row(l + (size_t)t * ld, E, k, renorm, ids, w);
					for (int j = 0; j < k; j++, ids_equal++) {
						assert_int_equal(r.ids[t * k + j], ids[j]);
						err_add(&e, r.w[t * k + j], w[j], w[j]);
					}
				}
				if (ties_fit(n, E, k)) {
					check_tie_rows(&r, n, E, k);
					tie_rows += 3;
				}
				check_grouping(&r, n, k, E);
				groupings++;
				route_free(be, &r);
				be->ops->buf_free(be, l);
			}
		}
	}
	printf("  moe_route: %zu ids equal to float64's, %zu groupings consistent\n", ids_equal,
	       groupings);
	printf("  ties (%zu rows): all-equal logits pick 0..k-1; four equal maxima pick 1, 3, "
	       "E/2, E-1 in that order; a 3-way tie for the last place picks id 2\n", tie_rows);
	err_report("moe_route weights vs float64 (rel to |w|)", &e, ROUTE_TOL);
	sm70_backend_destroy(be);
}

/* ---- moe_experts ------------------------------------------------------------------------ */

/* A stack of expert matrices in dtype t (backend memory) and the f32 values it holds. */
struct stack {
	struct sm70_experts s;
	float *f; /* [n_experts][rows][cols], host */
};

static void stack_set(struct stack *st, size_t i, float v)
{
	switch (st->s.dtype) {
	case SM70_DTYPE_F16: {
		uint16_t h = sm70_f32_to_f16(v);

		((uint16_t *)st->s.data)[i] = h;
		st->f[i] = sm70_f16_to_f32(h);
		break;
	}
	case SM70_DTYPE_BF16: {
		uint16_t h = sm70_f32_to_bf16(v);

		((uint16_t *)st->s.data)[i] = h;
		st->f[i] = sm70_bf16_to_f32(h);
		break;
	}
	default:
		((float *)st->s.data)[i] = st->f[i] = v;
		break;
	}
}

static void stack_new(struct sm70_backend *be, struct stack *st, enum sm70_dtype t, int E,
		      int rows, int cols)
{
	const size_t count = (size_t)E * rows * cols;
	const float a = sqrtf(3.0f / (float)cols); /* dots of O(1) */

	st->s = (struct sm70_experts){ .dtype = t, .n_experts = E, .rows = rows, .cols = cols,
				    .data = balloc(be, count * sm70_dtype_size(t)) };
	st->f = malloc(sizeof(float) * count);
	assert_non_null(st->f);
	for (size_t i = 0; i < count; i++)
		stack_set(st, i, rnd_range(-a, a));
}

/* NaN into every expert no token chose: if the op read one into a result, it shows. */
static void stack_poison_unused(struct stack *st, const struct sm70_moe_route *r)
{
	const size_t per = (size_t)st->s.rows * st->s.cols;

	for (int e = 0, u = 0; e < st->s.n_experts; e++) {
		if (u < r->n_used[0] && r->used[u] == e) {
			u++;
			continue;
		}
		for (size_t i = 0; i < per; i++)
			stack_set(st, (size_t)e * per + i, NAN);
	}
}

static void stack_free(struct sm70_backend *be, struct stack *st)
{
	free(st->f);
	be->ops->buf_free(be, st->s.data);
}

static const enum sm70_dtype dtypes[] = { SM70_DTYPE_F32, SM70_DTYPE_F16, SM70_DTYPE_BF16 };

struct ex_shape {
	int hidden, inter, E, k, n;
};

/* One moe_experts case: inputs and route in backend memory, out [n][hidden]. */
struct ex_case {
	struct ex_shape sh;
	struct stack gu, dn;
	struct sm70_moe_route r;
	float *x, *mid, *part, *out;
};

/* Random x; a route from random logits in which tokens 0 and 1 (when n >= 2) both
 * have expert 3 (their largest logit); weights of dtype dt; unused experts poisoned. */
static void ex_new(struct sm70_backend *be, struct ex_case *c, struct ex_shape sh,
		   enum sm70_dtype dt)
{
	const size_t nk = (size_t)sh.n * sh.k;
	float *l = balloc(be, sizeof(float) * (size_t)sh.n * sh.E);

	c->sh = sh;
	c->x = balloc(be, sizeof(float) * (size_t)sh.n * sh.hidden);
	for (size_t i = 0; i < (size_t)sh.n * sh.hidden; i++)
		c->x[i] = rnd_range(-1, 1);
	for (size_t i = 0; i < (size_t)sh.n * sh.E; i++)
		l[i] = rnd_range(-2, 2);
	for (int t = 0; t < sh.n && t < 2; t++)
		l[(size_t)t * sh.E + 3] = 6.0f;
	route_new(be, &c->r, sh.n, sh.k);
	be->ops->moe_route(be, &c->r, l, sh.E, sh.n, sh.E, sh.k, 1);
	check_grouping(&c->r, sh.n, sh.k, sh.E);
	if (sh.n >= 2) {
		assert_int_equal(c->r.ids[0], 3);
		assert_int_equal(c->r.ids[sh.k], 3);
	}
	stack_new(be, &c->gu, dt, sh.E, 2 * sh.inter, sh.hidden);
	stack_new(be, &c->dn, dt, sh.E, sh.hidden, sh.inter);
	stack_poison_unused(&c->gu, &c->r);
	stack_poison_unused(&c->dn, &c->r);
	c->mid = balloc(be, sizeof(float) * nk * sh.inter);
	c->part = balloc(be, sizeof(float) * nk * sh.hidden);
	c->out = balloc(be, sizeof(float) * (size_t)sh.n * sh.hidden);
	be->ops->buf_free(be, l);
}

static void ex_free(struct sm70_backend *be, struct ex_case *c)
{
	bfree_all(be, c->out, c->part, c->mid);
	stack_free(be, &c->dn);
	stack_free(be, &c->gu);
	route_free(be, &c->r);
	be->ops->buf_free(be, c->x);
}

/* Runs moe_experts on be into c->out, which starts as NaN (it must be overwritten). */
static void ex_run(struct sm70_backend *be, struct ex_case *c)
{
	for (size_t i = 0; i < (size_t)c->sh.n * c->sh.hidden; i++)
		c->out[i] = NAN;
	be->ops->moe_experts(be, c->out, c->x, &c->gu.s, &c->dn.s, &c->r, c->sh.n, c->sh.k,
			     c->mid, c->part);
}

static void ex_run_any(struct sm70_backend *be, void *c)
{
	ex_run(be, c);
}

/* The float64 experts over the op's own route (its ids and f32 weights); ref [n][H]. */
static void ref_experts(const struct ex_case *c, double *ref)
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
			const double w = c->r.w[t * k + j];
			const float *gu = c->gu.f + (size_t)e * 2 * I * H;
			const float *dn = c->dn.f + (size_t)e * H * I;

			for (int i = 0; i < I; i++) {
				double g = 0, u = 0;

				for (int q = 0; q < H; q++) {
					g += (double)gu[(size_t)i * H + q] * x[q];
					u += (double)gu[(size_t)(I + i) * H + q] * x[q];
				}
				mid[i] = g / (1 + exp(-g)) * u;
			}
			for (int h = 0; h < H; h++) {
				double d = 0;

				for (int i = 0; i < I; i++)
					d += (double)dn[(size_t)h * I + i] * mid[i];
				ref[(size_t)t * H + h] += w * d;
			}
		}
	}
	free(mid);
}

/* Relative to the largest |out| of a case: f32 dots over hidden and inter (measured
 * worst: see the print), the same for every dtype since the reference uses the widened
 * weights. */
#define EXPERTS_TOL 2e-6

static const struct ex_shape ex_shapes[] = {
	{ 64, 32, 8, 2, 5 },    { 100, 44, 8, 2, 9 }, /* no multiple of 8: dot tails */
	{ 128, 96, 16, 4, 7 },  { 256, 128, 16, 4, 33 }, /* n k > E: experts of many tokens */
	{ 256, 128, 16, 4, 1 }, /* a decode */
	{ 96, 64, 64, 8, 3 },   /* most experts unused */
};
#define N_EX_SHAPES (sizeof(ex_shapes) / sizeof(ex_shapes[0]))

/* moe_experts against float64 for each shape and weight dtype. */
static void test_moe_experts(void **state)
{
	struct sm70_backend *be = mk_backend(3);
	struct errstat e[3] = { { 0 } };
	char what[96];

	for (size_t di = 0; di < 3; di++) {
		for (size_t si = 0; si < N_EX_SHAPES; si++) {
			const struct ex_shape sh = ex_shapes[si];
			const size_t count = (size_t)sh.n * sh.hidden;
			double *ref = malloc(sizeof(double) * count), scale = 0;
			struct ex_case c;

			assert_non_null(ref);
			ex_new(be, &c, sh, dtypes[di]);
			ex_run(be, &c);
			ref_experts(&c, ref);
			for (size_t i = 0; i < count; i++)
				scale = fmax(scale, fabs(ref[i]));
			for (size_t i = 0; i < count; i++)
				err_add(&e[di], c.out[i], ref[i], scale);
			ex_free(be, &c);
			free(ref);
		}
	}
	printf("  (hidden 64..256, inter 32..128, E 8..64, k 2..8, n 1..33; tokens 0 and 1 "
	       "share expert 3; unused experts NaN)\n");
	for (size_t di = 0; di < 3; di++) {
		snprintf(what, sizeof(what), "moe_experts %s weights vs float64 (rel to max |out|)",
			 sm70_dtype_name(dtypes[di]));
		err_report(what, &e[di], EXPERTS_TOL);
	}
	sm70_backend_destroy(be);
}

/* ---- sigmoid_scale_add ------------------------------------------------------------------ */

/* out + sigmoid(g) x in float64, the gate one column of rows ld apart (as the router's
 * extra column); tol 1e-6 of |out| + |sigmoid(g) x|, which bounds what f32 may lose. */
static void test_sigmoid_scale_add(void **state)
{
	struct sm70_backend *be = mk_backend(2);
	const int dims[] = { 1, 5, 256, 3000 };
	struct errstat e = { 0 };

	for (size_t di = 0; di < 4; di++) {
		const int n = 6, dim = dims[di], ld = 9;
		float *out = balloc(be, sizeof(float) * n * dim);
		float *out0 = malloc(sizeof(float) * n * dim);
		float *x = balloc(be, sizeof(float) * n * dim);
		float *g = balloc(be, sizeof(float) * n * ld);

		assert_non_null(out0);
		for (int i = 0; i < n * dim; i++) {
			out0[i] = out[i] = rnd_range(-4, 4);
			x[i] = rnd_range(-4, 4);
		}
		for (int i = 0; i < n * ld; i++)
			g[i] = i % ld ? NAN : rnd_range(-15, 15); /* only column 0 may be read */
		g[0] = -200.0f;
		g[(n - 1) * ld] = 200.0f;
		be->ops->sigmoid_scale_add(be, out, x, g, ld, n, dim);
		for (int i = 0; i < n; i++) {
			const double s = 1 / (1 + exp(-(double)g[i * ld]));

			for (int k = 0; k < dim; k++) {
				const double sx = s * x[i * dim + k], ref = out0[i * dim + k] + sx;

				err_add(&e, out[i * dim + k], ref,
					fabs(out0[i * dim + k]) + fabs(sx) + 1e-30);
			}
		}
		be->ops->buf_free(be, g);
		be->ops->buf_free(be, x);
		free(out0);
		be->ops->buf_free(be, out);
	}
	err_report("sigmoid_scale_add vs float64 (rel to |out| + |s x|)", &e, 1e-6);
	sm70_backend_destroy(be);
}

/* ---- thread-count independence ------------------------------------------------------ */

/*
 * Bitwise the same on 1 and 4 threads: moe_route (n = 64 and 300 rows, large enough to
 * be split), moe_experts for every dtype (and without scratch: f16/bf16 rows widened in
 * stack pieces, hidden 1100 for several pieces), sigmoid_scale_add.
 */
static void test_moe_threads(void **state)
{
	struct sm70_backend *be1 = mk_backend(1), *be4 = mk_backend(4);
	const int rc[][3] = { { 64, 512, 10 }, { 300, 128, 8 } }; /* n, E, k */
	const struct ex_shape big[] = { { 256, 128, 16, 4, 64 }, { 1100, 40, 4, 2, 3 } };
	size_t compared = 0;

	for (size_t i = 0; i < 2; i++) {
		const int n = rc[i][0], E = rc[i][1], k = rc[i][2];
		float *l = balloc(be1, sizeof(float) * (size_t)n * E);
		struct sm70_moe_route r1, r4;

		fill_logits(l, E, n, E, k);
		route_new(be1, &r1, n, k);
		route_new(be1, &r4, n, k);
		be1->ops->moe_route(be1, &r1, l, E, n, E, k, 1);
		be4->ops->moe_route(be4, &r4, l, E, n, E, k, 1);
		route_equal(&r1, &r4, (size_t)n * k);
		compared += (size_t)n * k * 3 + (size_t)r1.n_used[0] * 2 + 2;
		route_free(be1, &r4);
		route_free(be1, &r1);
		be1->ops->buf_free(be1, l);
	}
	for (size_t di = 0; di < 3; di++) {
		for (size_t si = 0; si < 2; si++) {
			struct ex_case c;

			ex_new(be1, &c, big[si], dtypes[di]);
			compared += threads_bitwise(be1, be4, ex_run_any, &c, c.out,
						    (size_t)big[si].n * big[si].hidden);
			ex_free(be1, &c);
		}
	}
	{
		const int n = 64, dim = 3000, ld = 5;
		float *o[2], *x = balloc(be1, sizeof(float) * n * dim);
		float *g = balloc(be1, sizeof(float) * n * ld);

		for (int i = 0; i < n * dim; i++)
			x[i] = rnd_range(-4, 4);
		for (int i = 0; i < n * ld; i++)
			g[i] = rnd_range(-8, 8);
		for (int run = 0; run < 2; run++) {
			rng_state = 99; /* the same starting out for both */
			o[run] = balloc(be1, sizeof(float) * n * dim);
			for (int i = 0; i < n * dim; i++)
				o[run][i] = rnd_range(-4, 4);
			(run ? be4 : be1)->ops->sigmoid_scale_add(run ? be4 : be1, o[run], x, g, ld,
								  n, dim);
		}
		assert_memory_equal(o[1], o[0], sizeof(float) * n * dim);
		compared += (size_t)n * dim;
		for (int run = 0; run < 2; run++)
			be1->ops->buf_free(be1, o[run]);
		be1->ops->buf_free(be1, g);
		be1->ops->buf_free(be1, x);
	}
	printf("  %zu values bitwise equal on 1 vs 4 threads: moe_route (n 64/E 512/k 10, "
	       "n 300/E 128/k 8), moe_experts (f32, f16, bf16; and without scratch), "
	       "sigmoid_scale_add\n", compared);
	sm70_backend_destroy(be4);
	sm70_backend_destroy(be1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_moe_route),
		cmocka_unit_test(test_moe_experts),
		cmocka_unit_test(test_sigmoid_scale_add),
		cmocka_unit_test(test_moe_threads),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
