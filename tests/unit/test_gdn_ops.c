/* test_gdn_ops - CPU conv1d_silu, gdn, gated_rmsnorm and sigmoid_mul against float64. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#define OP_TEST_SEED 0x6d6e2024beefULL

#include "kernels/backend.h"
#include "kernels/cpu/cpu_ops.h"
#include "tests/unit/op_test.h"
#include "tests/unit/slot_batch.h"

/* ---- helpers ----------------------------------------------------------------------- */

static struct sm70_backend *mk_backend(int threads)
{
	struct sm70_backend *be = cpu_backend(threads);

	assert_non_null(be->ops->conv1d_silu);
	assert_non_null(be->ops->gdn);
	assert_non_null(be->ops->gated_rmsnorm);
	assert_non_null(be->ops->sigmoid_mul);
	return be;
}

/* Folds e into into: the larger maxima, the summed count. */
static void err_merge(struct errstat *into, const struct errstat *e)
{
	into->max_abs = fmax(into->max_abs, e->max_abs);
	into->max_rel = fmax(into->max_rel, e->max_rel);
	into->n += e->n;
}

/* cmp_vec (op_test.h), float against float. */
static void cmp_vecf(struct errstat *e, const float *got, const float *ref, size_t n)
{
	double scale = 0;

	for (size_t i = 0; i < n; i++)
		scale = fmax(scale, fabs(ref[i]));
	for (size_t i = 0; i < n; i++)
		err_add(e, got[i], ref[i], scale);
}

/* ---- the layer under test and its float64 mirror ------------------------------------ */

struct shape {
	int hk, hv, dk, dv, conv_k;
};

/* Decay regimes: how a, dt_bias and A_log are drawn (g = -A softplus(a + dt_bias)). */
enum regime {
	REG_NORMAL, /* A in [0.5, 8), a in [-4, 4): g from ~-0.1 to ~-60 */
	REG_WEAK,   /* A ~ 0.01, a ~ -8: g ~ -3e-6, the state barely decays */
	REG_STRONG, /* A in [8, 16), a in [4, 8): g ~ -100, the state is gone each token */
	REG_SOFTPLUS, /* a + dt_bias in [15, 25): both sides of softplus's threshold */
	REG_COUNT
};

static const char *const regime_names[REG_COUNT] = { "normal", "weak decay", "strong decay",
						      "softplus threshold" };

struct layer {
	struct sm70_state_layout lay;
	struct sm70_state_layer st; /* backend memory */
	float *w, *a_log, *dt_bias; /* backend memory */
	size_t conv_n, ssm_n;       /* floats in st.conv, st.ssm */
	double *rconv, *rssm;       /* the reference's state */
	enum regime reg;
};

static void layer_init(struct sm70_backend *be, struct layer *L, struct shape s, int n_slots,
		       enum regime reg)
{
	const int conv_dim = 2 * s.hk * s.dk + s.hv * s.dv;

	memset(L, 0, sizeof(*L));
	L->lay = (struct sm70_state_layout){ n_slots, s.conv_k, conv_dim, s.hk, s.hv, s.dk, s.dv };
	L->reg = reg;
	L->conv_n = (size_t)(n_slots + 1) * (size_t)(s.conv_k - 1) * (size_t)conv_dim;
	L->ssm_n = (size_t)(n_slots + 1) * (size_t)s.hv * (size_t)s.dk * (size_t)s.dv;
	L->st.conv = balloc(be, sizeof(float) * L->conv_n);
	L->st.ssm = balloc(be, sizeof(float) * L->ssm_n);
	L->rconv = malloc(sizeof(double) * (L->conv_n + 1));
	L->rssm = malloc(sizeof(double) * L->ssm_n);
	assert_non_null(L->rconv);
	assert_non_null(L->rssm);
	/* every slot starts dirty: a position-0 token must not see any of it */
	for (size_t i = 0; i < L->conv_n; i++)
		L->rconv[i] = ((float *)L->st.conv)[i] = rnd_range(-1, 1);
	for (size_t i = 0; i < L->ssm_n; i++)
		L->rssm[i] = L->st.ssm[i] = rnd_range(-1, 1);
	L->w = balloc(be, sizeof(float) * (size_t)conv_dim * s.conv_k);
	for (int i = 0; i < conv_dim * s.conv_k; i++)
		L->w[i] = rnd_range(-0.7f, 0.7f);
	L->a_log = balloc(be, sizeof(float) * s.hv);
	L->dt_bias = balloc(be, sizeof(float) * s.hv);
	for (int h = 0; h < s.hv; h++) {
		float A = reg == REG_WEAK ? rnd_range(0.005f, 0.02f)
			  : reg == REG_STRONG ? rnd_range(8, 16)
			  : reg == REG_SOFTPLUS ? rnd_range(0.001f, 0.02f)
						 : rnd_range(0.5f, 8);

		L->a_log[h] = logf(A);
		L->dt_bias[h] = reg == REG_NORMAL ? rnd_range(-1, 1) : 0.0f;
	}
}

static void layer_free(struct sm70_backend *be, struct layer *L)
{
	bfree_all(be, L->dt_bias, L->a_log, L->w, L->st.ssm, L->st.conv);
	free(L->rssm);
	free(L->rconv);
}

/* Inputs of one gdn call: qkv [T][conv_dim] and ba [T][ba_ld], in backend memory. */
struct gin {
	float *qkv, *ba;
	int ba_ld, T;
};

static void gin_new(struct sm70_backend *be, struct gin *g, const struct layer *L, int T)
{
	const int hv = L->lay.n_v_heads;

	g->T = T;
	g->ba_ld = 2 * hv + 3;
	g->qkv = balloc(be, sizeof(float) * (size_t)T * L->lay.conv_dim);
	g->ba = balloc(be, sizeof(float) * (size_t)T * g->ba_ld);
	for (size_t i = 0; i < (size_t)T * L->lay.conv_dim; i++)
		g->qkv[i] = rnd_range(-1, 1);
	for (int t = 0; t < T; t++) {
		for (int h = 0; h < hv; h++) {
			float *ba = g->ba + (size_t)t * g->ba_ld;

			ba[h] = rnd_range(-3, 3);
			ba[hv + h] = L->reg == REG_WEAK ? rnd_range(-9, -7)
				     : L->reg == REG_STRONG ? rnd_range(4, 8)
				     : L->reg == REG_SOFTPLUS ? rnd_range(15, 25)
							     : rnd_range(-4, 4);
		}
	}
}

static void gin_free(struct sm70_backend *be, struct gin *g)
{
	be->ops->buf_free(be, g->ba);
	be->ops->buf_free(be, g->qkv);
}

/* The reference gated delta rule over the batch, in float64, token by token in batch
 * order, on the mirror state; out [T][hv][dv]. */
static void ref_gdn(struct layer *L, const struct gin *g, const struct sm70_batch *b,
		    double *out)
{
	const struct sm70_state_layout *lay = &L->lay;
	const int hk = lay->n_k_heads, hv = lay->n_v_heads, dk = lay->k_dim, dv = lay->v_dim;
	double q[256], k[256], m[256];

	assert_true(dk <= 256 && dv <= 256);
	for (int t = 0; t < b->n_tokens; t++) {
		const int slot = b->seq_state[b->tok_seq[t]];
		const float *row = g->qkv + (size_t)t * lay->conv_dim;
		const float *ba = g->ba + (size_t)t * g->ba_ld;

		for (int h = 0; h < hv; h++) {
			const int kh = h / (hv / hk);
			double *S = L->rssm + ((size_t)slot * hv + h) * (size_t)dk * dv;
			const float *v = row + 2 * hk * dk + h * dv;
			double nq = 0, nk = 0, beta, x, gg, dec;

			if (b->tok_pos[t] == 0)
				for (int i = 0; i < dk * dv; i++)
					S[i] = 0;
			for (int r = 0; r < dk; r++) {
				q[r] = row[kh * dk + r];
				k[r] = row[(hk + kh) * dk + r];
				nq += q[r] * q[r];
				nk += k[r] * k[r];
			}
			nq = 1.0 / sqrt(nq + 1e-6) / sqrt((double)dk);
			nk = 1.0 / sqrt(nk + 1e-6);
			for (int r = 0; r < dk; r++) {
				q[r] *= nq;
				k[r] *= nk;
			}
			beta = 1.0 / (1.0 + exp(-(double)ba[h]));
			x = (double)ba[hv + h] + L->dt_bias[h];
			gg = -exp((double)L->a_log[h]) * (x > 20 ? x : log1p(exp(x)));
			dec = exp(gg);
			for (int c = 0; c < dv; c++)
				m[c] = 0;
			for (int r = 0; r < dk; r++)
				for (int c = 0; c < dv; c++) {
					S[r * dv + c] *= dec;
					m[c] += S[r * dv + c] * k[r];
				}
			for (int c = 0; c < dv; c++)
				m[c] = beta * (v[c] - m[c]);
			for (int r = 0; r < dk; r++)
				for (int c = 0; c < dv; c++)
					S[r * dv + c] += k[r] * m[c];
			for (int c = 0; c < dv; c++) {
				double o = 0;

				for (int r = 0; r < dk; r++)
					o += S[r * dv + c] * q[r];
				out[((size_t)t * hv + h) * dv + c] = o;
			}
		}
	}
}

/* Runs gdn on the backend: out [T][hv][dv] (backend memory). */
static void run_gdn(struct sm70_backend *be, struct layer *L, const struct gin *g,
		    const struct sm70_batch *b, float *out, int chunked)
{
	be->ops->gdn(be, out, g->qkv, g->ba, g->ba_ld, L->a_log, L->dt_bias, &L->st, &L->lay, b,
		     chunked);
}

/* The backend's state of slots [0, n_slots] against the mirror. */
static void cmp_state(struct errstat *e, const struct layer *L)
{
	cmp_vec(e, L->st.ssm, L->rssm, L->ssm_n);
}

static float *save_state(const struct layer *L)
{
	float *s = malloc(sizeof(float) * L->ssm_n);

	assert_non_null(s);
	memcpy(s, L->st.ssm, sizeof(float) * L->ssm_n);
	return s;
}

static void load_state(struct layer *L, const float *s)
{
	memcpy(L->st.ssm, s, sizeof(float) * L->ssm_n);
}

static size_t out_n(const struct layer *L, int T)
{
	return (size_t)T * L->lay.n_v_heads * L->lay.v_dim;
}

/* ---- conv1d_silu ------------------------------------------------------------------------- */

/* The reference convolution in float64 on the mirror conv state; out [T][conv_dim]. */
static void ref_conv(struct layer *L, const float *x, int ld, const struct sm70_batch *b,
		     double *out)
{
	const int K = L->lay.conv_k, dim = L->lay.conv_dim;

	for (int t = 0; t < b->n_tokens; t++) {
		double *st = L->rconv + (size_t)b->seq_state[b->tok_seq[t]] * (K - 1) * dim;

		if (b->tok_pos[t] == 0)
			for (int i = 0; i < (K - 1) * dim; i++)
				st[i] = 0;
		for (int c = 0; c < dim; c++) {
			double s = L->w[c * K + K - 1] * (double)x[(size_t)t * ld + c];

			for (int r = 0; r < K - 1; r++)
				s += L->w[c * K + r] * st[r * dim + c];
			out[(size_t)t * dim + c] = s / (1.0 + exp(-s));
			for (int r = 0; r + 1 < K - 1; r++)
				st[r * dim + c] = st[(r + 1) * dim + c];
			if (K > 1)
				st[(K - 2) * dim + c] = x[(size_t)t * ld + c];
		}
	}
}

/*
 * Two calls over batches mixing decodes (two of them padding rows in the scratch slot
 * n_slots), a position-0 chunk on a dirty slot, a chunk continuing mid-sequence and a
 * one-token chunk; x rows have ld > conv_dim. Outputs are compared to the float64
 * reference relative to the largest |output| (tol 1e-6); the saved inputs must equal
 * the reference's bitwise (they are copies).
 */
static void test_conv1d_silu(void **state)
{
	struct sm70_backend *be = mk_backend(3);
	const struct shape shapes[] = { { 2, 4, 16, 24, 4 }, { 1, 1, 8, 8, 2 },
					{ 4, 8, 32, 48, 4 }, { 1, 2, 16, 16, 3 },
					{ 1, 1, 8, 8, 1 } /* no saved inputs at all */ };
	const struct piece call1[] = { { 2, 9, 1 }, { 6, 3, 1 }, { 6, 0, 1 }, { 1, 0, 7 },
				       { 3, 5, 10 }, { 4, 0, 1 } };
	const struct piece call2[] = { { 1, 7, 1 }, { 2, 10, 1 }, { 6, 0, 1 }, { 3, 15, 70 },
				       { 4, 1, 3 } };
	struct errstat e = { 0 };
	size_t bitwise = 0;

	for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++) {
		struct layer L;

		layer_init(be, &L, shapes[si], 6, REG_NORMAL);
		for (int call = 0; call < 2; call++) {
			struct tb *tb = call ? tb_new(be, call2, 5, 3) : tb_new(be, call1, 6, 3);
			const int T = tb->b.n_tokens, dim = L.lay.conv_dim, ld = dim + 5;
			float *x = balloc(be, sizeof(float) * (size_t)T * ld);
			float *out = balloc(be, sizeof(float) * (size_t)T * dim);
			double *ref = malloc(sizeof(double) * (size_t)T * dim);

			assert_non_null(ref);
			for (size_t i = 0; i < (size_t)T * ld; i++)
				x[i] = rnd_range(-2, 2);
			be->ops->conv1d_silu(be, out, x, ld, L.w, &L.st, &L.lay, &tb->b);
			ref_conv(&L, x, ld, &tb->b, ref);
			cmp_vec(&e, out, ref, (size_t)T * dim);
			for (size_t i = 0; i < L.conv_n; i++, bitwise++)
				assert_true(((float *)L.st.conv)[i] == (float)L.rconv[i]);
			free(ref);
			bfree_all(be, out, x, tb);
		}
		layer_free(be, &L);
	}
	err_report("conv1d_silu vs float64 (rel to max |out|)", &e, 1e-6);
	printf("  conv1d_silu: %zu saved inputs bitwise equal to the reference's\n", bitwise);
	sm70_backend_destroy(be);
}

/* ---- gated_rmsnorm and sigmoid_mul ------------------------------------------------------ */

/* Per head: w * x / sqrt(mean x^2 + eps) * silu(z), or * sigmoid(z), in float64; tol 1e-6
 * of |ref| with a floor of 1e-30 (silu and sigmoid underflow for very negative z). */
static void test_gated_rmsnorm(void **state)
{
	struct sm70_backend *be = mk_backend(2);
	const int dims[] = { 1, 7, 64, 128, 130 }, heads[] = { 1, 3, 8 };
	struct errstat e = { 0 };

	for (int sig = 0; sig < 2; sig++)
	for (size_t di = 0; di < 5; di++) {
		for (size_t hi = 0; hi < 3; hi++) {
			const int n = 5, nh = heads[hi], dim = dims[di], z_ld = nh * dim + 9;
			const float eps = 1e-6f;
			float *x = balloc(be, sizeof(float) * n * nh * dim);
			float *x0 = malloc(sizeof(float) * n * nh * dim);
			float *z = balloc(be, sizeof(float) * n * z_ld);
			float *w = balloc(be, sizeof(float) * dim);

			assert_non_null(x0);
			for (int i = 0; i < n * nh * dim; i++)
				x0[i] = x[i] = rnd_range(-3, 3);
			for (int i = 0; i < n * z_ld; i++)
				z[i] = rnd_range(-12, 12);
			z[0] = -100.0f;
			for (int i = 0; i < dim; i++)
				w[i] = rnd_range(-2, 2);
			be->ops->gated_rmsnorm(be, x, z, z_ld, w, n, nh, dim, eps, sig);
			for (int i = 0; i < n; i++) {
				for (int h = 0; h < nh; h++) {
					const float *xr = x0 + (i * nh + h) * dim;
					double ss = 0, inv;

					for (int k = 0; k < dim; k++)
						ss += (double)xr[k] * xr[k];
					inv = 1.0 / sqrt(ss / dim + eps);
					for (int k = 0; k < dim; k++) {
						double zz = z[i * z_ld + h * dim + k];
						double ref = w[k] * xr[k] * inv * (sig ? 1.0 : zz) /
							     (1 + exp(-zz));

						err_add(&e, x[(i * nh + h) * dim + k], ref,
							fabs(ref) + 1e-30);
					}
				}
			}
			be->ops->buf_free(be, w);
			be->ops->buf_free(be, z);
			free(x0);
			be->ops->buf_free(be, x);
		}
	}
	err_report("gated_rmsnorm vs float64 (rel to |ref|)", &e, 1e-6);
	sm70_backend_destroy(be);
}

/* x * sigmoid(g) in float64; tol 1e-6 of |ref| with a floor of 1e-30. */
static void test_sigmoid_mul(void **state)
{
	struct sm70_backend *be = mk_backend(2);
	const int dims[] = { 1, 5, 256, 3000 };
	struct errstat e = { 0 };

	for (size_t di = 0; di < 4; di++) {
		const int n = 6, dim = dims[di], ld = 2 * dim + 1;
		float *x = balloc(be, sizeof(float) * n * dim);
		float *x0 = malloc(sizeof(float) * n * dim);
		float *g = balloc(be, sizeof(float) * n * ld);

		assert_non_null(x0);
		for (int i = 0; i < n * dim; i++)
			x0[i] = x[i] = rnd_range(-4, 4);
		for (int i = 0; i < n * ld; i++)
			g[i] = rnd_range(-15, 15);
		g[0] = -200.0f;
		g[ld - 1] = 200.0f;
		be->ops->sigmoid_mul(be, x, g, ld, n, dim);
		for (int i = 0; i < n; i++)
			for (int k = 0; k < dim; k++) {
				double ref = x0[i * dim + k] / (1 + exp(-(double)g[i * ld + k]));

				err_add(&e, x[i * dim + k], ref, fabs(ref) + 1e-30);
			}
		free(x0);
		be->ops->buf_free(be, g);
		be->ops->buf_free(be, x);
	}
	err_report("sigmoid_mul vs float64 (rel to |ref|)", &e, 1e-6);
	sm70_backend_destroy(be);
}

/* ---- gdn --------------------------------------------------------------------------------- */

/* Every gdn comparison, relative to the largest |value| compared: f32 recurrences over
 * up to 200 tokens land within ~1e-6 of float64 and of each other (measured worst:
 * 1.5e-6, chunked vs recurrent with weak decay), so this leaves 3x for other compilers
 * and targets. */
#define GDN_TOL 5e-6

static const struct shape gdn_shapes[] = {
	{ 1, 1, 16, 16, 4 },  { 2, 4, 32, 48, 4 }, /* n_v_heads = 2 n_k_heads, k_dim != v_dim */
	{ 2, 2, 24, 40, 4 },  /* k_dim not a multiple of 8 */
	{ 1, 2, 128, 128, 4 }, /* qwen3_5's head dims */
};
#define N_GDN_SHAPES (sizeof(gdn_shapes) / sizeof(gdn_shapes[0]))

/* The mixed batches of test_gdn_double and test_gdn_threads: decodes (two of them
 * padding rows sharing the scratch slot 6), a position-0 chunk on a dirty slot, chunks
 * continuing mid-sequence (one across a 64-token piece boundary), a one-token chunk. */
static const struct piece mix1[] = { { 2, 9, 1 }, { 6, 3, 1 }, { 6, 0, 1 }, { 1, 0, 7 },
				     { 3, 5, 70 }, { 4, 0, 1 }, { 0, 0, 40 } };
static const struct piece mix2[] = { { 1, 7, 1 }, { 2, 10, 1 }, { 6, 0, 1 }, { 3, 75, 64 },
				     { 4, 1, 3 }, { 5, 0, 65 } };

/*
 * gdn against the float64 recurrence, both forms, each shape and decay regime, over two
 * calls of the mixed batches. Outputs are compared relative to the largest |output| of
 * the call and states relative to the largest |state| (GDN_TOL for both: the f32
 * state carries its rounding from token to token).
 */
static void test_gdn_double(void **state)
{
	struct sm70_backend *be = mk_backend(3);
	struct errstat e[2][2] = { { { 0 } } }; /* [chunked][out, state] */
	char what[96];

	for (size_t si = 0; si < N_GDN_SHAPES; si++) {
		for (int reg = 0; reg < REG_COUNT; reg++) {
			for (int chunked = 0; chunked < 2; chunked++) {
				struct layer L;

				rng_state = 1000 + si * 10 + reg; /* same inputs for both forms */
				layer_init(be, &L, gdn_shapes[si], 6, reg);
				for (int call = 0; call < 2; call++) {
					struct tb *tb = call ? tb_new(be, mix2, 6, 3)
							     : tb_new(be, mix1, 7, 3);
					const int T = tb->b.n_tokens;
					float *out = balloc(be, sizeof(float) * out_n(&L, T));
					double *ref = malloc(sizeof(double) * out_n(&L, T));
					struct gin g;

					assert_non_null(ref);
					gin_new(be, &g, &L, T);
					run_gdn(be, &L, &g, &tb->b, out, chunked);
					ref_gdn(&L, &g, &tb->b, ref);
					cmp_vec(&e[chunked][0], out, ref, out_n(&L, T));
					gin_free(be, &g);
					free(ref);
					be->ops->buf_free(be, out);
					be->ops->buf_free(be, tb);
				}
				cmp_state(&e[chunked][1], &L);
				layer_free(be, &L);
			}
		}
	}
	for (int chunked = 0; chunked < 2; chunked++) {
		snprintf(what, sizeof(what), "gdn %s vs float64, out (rel to max |out|)",
			 chunked ? "chunked" : "recurrent");
		err_report(what, &e[chunked][0], GDN_TOL);
		snprintf(what, sizeof(what), "gdn %s vs float64, state (rel to max |S|)",
			 chunked ? "chunked" : "recurrent");
		err_report(what, &e[chunked][1], GDN_TOL);
	}
	sm70_backend_destroy(be);
}

#define PROMPT 150

/*
 * State continuity: one prompt of PROMPT tokens (on a dirty slot, so position 0 must
 * reset it) fed (a) as one chunk, (b) as chunks of 70, 1, 64, 15 over four calls, each
 * next to a decode of another sequence, (c) as PROMPT one-token decodes. With the
 * recurrence the three give the same bits (outputs and the final state); with the
 * chunked form (a) and (b) match (c) within GDN_TOL, and all of them match float64.
 */
static void test_gdn_continuity(void **state)
{
	struct sm70_backend *be = mk_backend(3);
	const int splits[] = { 70, 1, 64, 15 };
	struct errstat ed = { 0 }, ec = { 0 }, ecs = { 0 };
	size_t bitwise = 0;

	for (size_t si = 1; si < N_GDN_SHAPES; si += 2) {
		for (int reg = 0; reg < REG_COUNT; reg++) {
			struct layer L;
			struct gin g;
			float *outs[2][3], *states[2][3], *init;
			double *ref;
			struct tb *whole;
			size_t slot_n;

			rng_state = 77 + si * 10 + reg;
			layer_init(be, &L, gdn_shapes[si], 4, reg);
			ref = malloc(sizeof(double) * out_n(&L, PROMPT));
			assert_non_null(ref);
			slot_n = L.ssm_n / 5;
			gin_new(be, &g, &L, PROMPT);
			init = save_state(&L);
			for (int chunked = 0; chunked < 2; chunked++) {
				for (int way = 0; way < 3; way++) {
					float *out = balloc(be, sizeof(float) * out_n(&L, PROMPT));
					const size_t row = out_n(&L, 1);

					load_state(&L, init);
					if (way == 0) {
						struct tb *tb = tb_new(be, &(struct piece){ 2, 0, PROMPT },
								       1, 0);

						run_gdn(be, &L, &g, &tb->b, out, chunked);
						be->ops->buf_free(be, tb);
					}
					for (int c = 0, p = 0; way == 1 && c < 4; p += splits[c++]) {
						/* token 0 of the call: a decode of slot 1; then the
						 * chunk, its rows taken from the prompt's */
						const struct piece pc[2] = { { 1, 5 + c, 1 },
									     { 2, p, splits[c] } };
						struct tb *tb = tb_new(be, pc, 2, 1);
						struct gin gc;
						float *oc = balloc(be, sizeof(float) *
								   out_n(&L, 1 + splits[c]));

						gin_new(be, &gc, &L, 1 + splits[c]);
						memcpy(gc.qkv + L.lay.conv_dim,
						       g.qkv + (size_t)p * L.lay.conv_dim,
						       sizeof(float) * splits[c] * L.lay.conv_dim);
						memcpy(gc.ba + gc.ba_ld, g.ba + (size_t)p * g.ba_ld,
						       sizeof(float) * splits[c] * g.ba_ld);
						run_gdn(be, &L, &gc, &tb->b, oc, chunked);
						memcpy(out + p * row, oc + row,
						       sizeof(float) * splits[c] * row);
						gin_free(be, &gc);
						be->ops->buf_free(be, oc);
						be->ops->buf_free(be, tb);
					}
					for (int p = 0; way == 2 && p < PROMPT; p++) {
						struct tb *tb = tb_new(be, &(struct piece){ 2, p, 1 },
								       1, 1);
						struct gin gp = { g.qkv + (size_t)p * L.lay.conv_dim,
								  g.ba + (size_t)p * g.ba_ld,
								  g.ba_ld, 1 };

						run_gdn(be, &L, &gp, &tb->b, out + p * row, chunked);
						be->ops->buf_free(be, tb);
					}
					outs[chunked][way] = out;
					states[chunked][way] = save_state(&L);
				}
			}
			/* the recurrence: bitwise the same whichever way the prompt came (slot
			 * 2's state; slot 1 had decodes in (b) only) */
			for (int way = 1; way < 3; way++) {
				assert_memory_equal(outs[0][way], outs[0][0],
						    sizeof(float) * out_n(&L, PROMPT));
				assert_memory_equal(states[0][way] + 2 * slot_n,
						    states[0][0] + 2 * slot_n,
						    sizeof(float) * slot_n);
				bitwise += out_n(&L, PROMPT) + slot_n;
			}
			/* decodes are the recurrence whatever `chunked` says */
			assert_memory_equal(outs[1][2], outs[0][2], sizeof(float) * out_n(&L, PROMPT));
			for (int way = 0; way < 2; way++) {
				cmp_vecf(&ec, outs[1][way], outs[0][2], out_n(&L, PROMPT));
				cmp_vecf(&ecs, states[1][way] + 2 * slot_n,
					 states[0][2] + 2 * slot_n, slot_n);
			}
			whole = tb_new(be, &(struct piece){ 2, 0, PROMPT }, 1, 0);
			ref_gdn(&L, &g, &whole->b, ref);
			for (int chunked = 0; chunked < 2; chunked++)
				for (int way = 0; way < 3; way++)
					cmp_vec(&ed, outs[chunked][way], ref, out_n(&L, PROMPT));
			be->ops->buf_free(be, whole);
			for (int chunked = 0; chunked < 2; chunked++)
				for (int way = 0; way < 3; way++) {
					be->ops->buf_free(be, outs[chunked][way]);
					free(states[chunked][way]);
				}
			free(init);
			free(ref);
			gin_free(be, &g);
			layer_free(be, &L);
		}
	}
	printf("  gdn recurrence: one chunk, 4 calls of chunks, %d decodes: %zu values "
	       "bitwise equal\n", PROMPT, bitwise);
	err_report("gdn chunked (one chunk; 4 calls) vs decodes, out", &ec, GDN_TOL);
	err_report("gdn chunked (one chunk; 4 calls) vs decodes, state", &ecs, GDN_TOL);
	err_report("gdn all ways vs float64, out (rel to max |out|)", &ed, GDN_TOL);
	sm70_backend_destroy(be);
}

/*
 * The chunked form against the recurrence, on one chunk of 1, 63, 64, 65 and 200
 * tokens, starting at position 0 (dirty slot) or at position 37 after a 37-token
 * prefix run by the recurrence (an existing state), for every shape and decay regime.
 * Tolerance: GDN_TOL of max |out| for outputs and of max |S| for the state.
 */
static void test_gdn_chunked_vs_recurrent(void **state)
{
	struct sm70_backend *be = mk_backend(4);
	const int lens[] = { 1, 63, 64, 65, 200 };
	struct errstat eo[REG_COUNT] = { { 0 } }, es[REG_COUNT] = { { 0 } }, all = { 0 };
	char what[96];

	for (size_t si = 0; si < N_GDN_SHAPES; si++) {
		for (int reg = 0; reg < REG_COUNT; reg++) {
			for (size_t li = 0; li < 5; li++) {
				for (int start = 0; start <= 37; start += 37) {
					struct layer L;
					struct gin g;
					float *out[2], *st[2], *init;

					rng_state = 5 + si * 100 + reg * 10 + li;
					layer_init(be, &L, gdn_shapes[si], 2, reg);
					if (start) {
						struct tb *tb = tb_new(be, &(struct piece){ 1, 0, start },
								       1, 0);
						float *o = balloc(be, sizeof(float) * out_n(&L, start));

						gin_new(be, &g, &L, start);
						run_gdn(be, &L, &g, &tb->b, o, 0);
						gin_free(be, &g);
						be->ops->buf_free(be, o);
						be->ops->buf_free(be, tb);
					}
					gin_new(be, &g, &L, lens[li]);
					init = save_state(&L);
					for (int chunked = 0; chunked < 2; chunked++) {
						struct tb *tb = tb_new(
							be, &(struct piece){ 1, start, lens[li] }, 1, 0);

						load_state(&L, init);
						out[chunked] = balloc(be, sizeof(float) *
									  out_n(&L, lens[li]));
						run_gdn(be, &L, &g, &tb->b, out[chunked], chunked);
						st[chunked] = save_state(&L);
						be->ops->buf_free(be, tb);
					}
					cmp_vecf(&eo[reg], out[1], out[0], out_n(&L, lens[li]));
					cmp_vecf(&es[reg], st[1], st[0], L.ssm_n);
					for (int chunked = 0; chunked < 2; chunked++) {
						be->ops->buf_free(be, out[chunked]);
						free(st[chunked]);
					}
					free(init);
					gin_free(be, &g);
					layer_free(be, &L);
				}
			}
		}
	}
	for (int reg = 0; reg < REG_COUNT; reg++) {
		snprintf(what, sizeof(what), "gdn chunked vs recurrent, %s, out",
			 regime_names[reg]);
		err_report(what, &eo[reg], GDN_TOL);
		snprintf(what, sizeof(what), "gdn chunked vs recurrent, %s, state",
			 regime_names[reg]);
		err_report(what, &es[reg], GDN_TOL);
		err_merge(&all, &eo[reg]);
	}
	printf("  (chunks of 1, 63, 64, 65, 200 tokens from positions 0 and 37; worst out "
	       "rel %.3g)\n", all.max_rel);
	sm70_backend_destroy(be);
}

/*
 * Thread-count independence and the fallbacks: the mixed batch on backends of 1 and 4
 * threads gives the same bits in both forms of gdn and in conv1d_silu; the chunked form
 * without scratch, and a batch without its shape (n_decode = n_chunks = 0: one unit per
 * token), give the recurrence's bits.
 */
static void test_gdn_threads(void **state)
{
	struct sm70_backend *be1 = mk_backend(1), *be4 = mk_backend(4);
	size_t compared = 0;

	for (size_t si = 0; si < N_GDN_SHAPES; si++) {
		struct layer L;
		struct gin g;
		struct tb *tb;
		float *init, *outs[6], *sts[6];
		size_t n;

		rng_state = 4242 + si;
		layer_init(be1, &L, gdn_shapes[si], 6, REG_NORMAL);
		tb = tb_new(be1, mix1, 7, 3);
		gin_new(be1, &g, &L, tb->b.n_tokens);
		n = out_n(&L, tb->b.n_tokens);
		init = save_state(&L);
		/* run 0: 1 thread, recurrent; 1: 4 threads, recurrent; 2: 1 thread, chunked;
		 * 3: 4 threads, chunked; 4: chunked without scratch; 5: chunked, no shape */
		for (int run = 0; run < 6; run++) {
			struct sm70_backend *be = run % 2 ? be4 : be1;
			struct sm70_batch b = tb->b;

			load_state(&L, init);
			if (run == 5)
				b.n_decode = b.n_chunks = 0;
			outs[run] = balloc(be1, sizeof(float) * n);
			sm70__cpu_of(be)->scratch_off = run == 4;
			run_gdn(be, &L, &g, &b, outs[run], run >= 2);
			sm70__cpu_of(be)->scratch_off = 0;
			sts[run] = save_state(&L);
		}
		for (int run = 1; run < 6; run++) {
			const int want = run == 3 ? 2 : 0;

			if (run == 2)
				continue; /* the other form */
			assert_memory_equal(outs[run], outs[want], sizeof(float) * n);
			assert_memory_equal(sts[run], sts[want], sizeof(float) * L.ssm_n);
			compared += n + L.ssm_n;
		}
		for (int run = 0; run < 6; run++) {
			be1->ops->buf_free(be1, outs[run]);
			free(sts[run]);
		}
		/* conv1d_silu too, over the same batch */
		{
			const int T = tb->b.n_tokens, dim = L.lay.conv_dim;
			float *x = balloc(be1, sizeof(float) * (size_t)T * dim);
			float *co[2], *cs[2], *cinit = malloc(sizeof(float) * (L.conv_n + 1));

			assert_non_null(cinit);
			memcpy(cinit, L.st.conv, sizeof(float) * L.conv_n);
			for (size_t i = 0; i < (size_t)T * dim; i++)
				x[i] = rnd_range(-2, 2);
			for (int run = 0; run < 2; run++) {
				struct sm70_backend *be = run ? be4 : be1;

				memcpy(L.st.conv, cinit, sizeof(float) * L.conv_n);
				co[run] = balloc(be1, sizeof(float) * (size_t)T * dim);
				be->ops->conv1d_silu(be, co[run], x, dim, L.w, &L.st, &L.lay, &tb->b);
				cs[run] = malloc(sizeof(float) * (L.conv_n + 1));
				assert_non_null(cs[run]);
				memcpy(cs[run], L.st.conv, sizeof(float) * L.conv_n);
			}
			assert_memory_equal(co[1], co[0], sizeof(float) * (size_t)T * dim);
			assert_memory_equal(cs[1], cs[0], sizeof(float) * L.conv_n);
			compared += (size_t)T * dim + L.conv_n;
			for (int run = 0; run < 2; run++) {
				free(cs[run]);
				be1->ops->buf_free(be1, co[run]);
			}
			free(cinit);
			be1->ops->buf_free(be1, x);
		}
		free(init);
		gin_free(be1, &g);
		be1->ops->buf_free(be1, tb);
		layer_free(be1, &L);
	}
	printf("  %zu values bitwise equal: gdn (both forms) and conv1d_silu on 1 vs 4 threads;\n"
	       "  gdn's chunked form without scratch and a batch without its shape vs the\n"
	       "  recurrence\n", compared);
	sm70_backend_destroy(be4);
	sm70_backend_destroy(be1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_conv1d_silu),
		cmocka_unit_test(test_gated_rmsnorm),
		cmocka_unit_test(test_sigmoid_mul),
		cmocka_unit_test(test_gdn_double),
		cmocka_unit_test(test_gdn_continuity),
		cmocka_unit_test(test_gdn_chunked_vs_recurrent),
		cmocka_unit_test(test_gdn_threads),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
