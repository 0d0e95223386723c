/* test_cuda_gdn - the CUDA linear-attention ops (conv1d_silu, gdn, gated_rmsnorm,
 * sigmoid_mul) against their CPU twins, gdn's chunked form against its recurrence, and a
 * captured decode replay against eager runs. */
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

#define GPU_TEST_SEED 0x9d7a11e5c0ffeeULL
#include "tests/gpu/gpu_test.h"
#include "tests/gpu/slot_batch.h"

/*
 * Errors are max |got - ref| over max |ref| ("rel"). f16 outputs carry up to 2^-11 of
 * rounding on top of f32 differences. The recurrent state is f32 on both backends; the
 * two recurrences differ only in summation order (a few ulps a token), the chunked form
 * in the order of everything (the CPU file states ~1e-6 for its own two forms).
 */
#define TOL_EXACT 0.0
#define TOL_F16_OUT 1.5e-3
#define TOL_STATE 2e-5  /* recurrence vs recurrence, f32 state after up to 200 tokens */
#define TOL_CHUNK 1e-4  /* chunked vs recurrence, f32 state */

static struct sm70_backend *gpu, *gpu_ref, *cpu;

/* ---- batches ------------------------------------------------------------------------- */

/* Two sequences' tokens interleaved (a, b, a, b, ...): only a batch without the shape can
 * say this. */
static void hb_interleaved(struct hbatch *hb, int slot_a, int pos_a, int slot_b, int pos_b,
			   int per_seq)
{
	memset(hb, 0, sizeof(*hb));
	hb->n_seqs = 2;
	hb->seq_state[0] = slot_a;
	hb->seq_state[1] = slot_b;
	for (int i = 0; i < 2 * per_seq; i++) {
		hb->seq[i] = i & 1;
		hb->pos[i] = (i & 1 ? pos_b : pos_a) + i / 2;
		if (hb->pos[i] + 1 > hb->max_pos)
			hb->max_pos = hb->pos[i] + 1;
	}
	hb->n_tokens = 2 * per_seq;
}

/* ---- gdn ------------------------------------------------------------------------------ */

/* One layer's shape and weights (host). */
struct gdn_layer {
	struct sm70_state_layout lay;
	int ba_ld;
	float *a_log, *dt_bias; /* [n_v] */
};

static struct gdn_layer mk_layer(int n_slots, int n_k, int n_v, int dk, int dv)
{
	struct gdn_layer g;

	g.lay = (struct sm70_state_layout){ n_slots, 4, 2 * n_k * dk + n_v * dv, n_k, n_v, dk, dv };
	g.ba_ld = 2 * n_v + 6; /* b | a inside a wider row */
	g.a_log = fvec(n_v);
	g.dt_bias = fvec(n_v);
	for (int h = 0; h < n_v; h++) {
		/* A in [0.5, 16): decays from gentle to hard */
		g.a_log[h] = logf(0.5f + 15.5f * (0.5f + 0.5f * rnd(1.0f)));
		g.dt_bias[h] = rnd(1.0f);
	}
	g.a_log[0] = logf(16.0f); /* head 0: the hardest decay (g down to about -100) */
	return g;
}

static void free_layer(struct gdn_layer *g)
{
	free(g->a_log);
	free(g->dt_bias);
}

static size_t state_floats(const struct sm70_state_layout *l)
{
	return (size_t)(l->n_slots + 1) * l->n_v_heads * l->k_dim * l->v_dim;
}

/* Random inputs for T tokens: qkv [T][conv_dim] (conv outputs), ba [T][ba_ld]. Head 0's
 * a is pushed up on some tokens so that its decay reaches exp(-100). */
static void mk_inputs(const struct gdn_layer *g, int T, float **qkv, float **ba)
{
	const int n_v = g->lay.n_v_heads;

	*qkv = rvec16((size_t)T * g->lay.conv_dim, 1.0f);
	*ba = fvec((size_t)T * g->ba_ld);
	for (int t = 0; t < T; t++) {
		float *r = *ba + (size_t)t * g->ba_ld;

		for (int h = 0; h < n_v; h++) {
			r[h] = rnd(4.0f);
			r[n_v + h] = rnd(5.0f);
		}
		if (t % 3 == 0)
			r[n_v] = 6.0f;
		for (int k = 0; k < g->ba_ld; k++)
			r[k] = sm70_f16_to_f32(sm70_f32_to_f16(r[k]));
	}
}

/* One gdn call on be: state in/out through ssm (host), out [T][n_v * dv] (host). */
static void gdn_once(struct sm70_backend *be, const struct gdn_layer *g, const struct hbatch *hb,
		     const float *qkv, const float *ba, float *ssm, float *out, int chunked)
{
	const struct sm70_state_layout *l = &g->lay;
	const int T = hb->n_tokens;
	const size_t n_out = (size_t)T * l->n_v_heads * l->v_dim, n_st = state_floats(l);
	struct sm70_state_layer st = { .conv = NULL };
	struct dbatch d;
	void *dq, *dba, *dout;
	float *dal, *ddt;

	db_up(be, hb, &d);
	dq = up_act(be, qkv, (size_t)T * l->conv_dim);
	dba = up_act(be, ba, (size_t)T * g->ba_ld);
	dal = up_bytes(be, g->a_log, l->n_v_heads * 4);
	ddt = up_bytes(be, g->dt_bias, l->n_v_heads * 4);
	st.ssm = up_bytes(be, ssm, n_st * 4);
	dout = balloc(be, n_out * (be->act_dtype == SM70_DTYPE_F32 ? 4 : 2));
	be->ops->gdn(be, dout, dq, dba, g->ba_ld, dal, ddt, &st, l, &d.b, chunked);
	get_act(be, out, dout, n_out);
	get_f32(be, ssm, st.ssm, n_st);
	bfree(be, dout), bfree(be, st.ssm), bfree(be, ddt), bfree(be, dal), bfree(be, dba);
	bfree(be, dq);
	db_free(be, &d);
}

/* Random initial state; slot `garbage` (or -1) full of large values that a position-0
 * reset must ignore. */
static float *mk_state(const struct sm70_state_layout *l, int garbage)
{
	const size_t per = (size_t)l->n_v_heads * l->k_dim * l->v_dim;
	float *s = fvec(state_floats(l));

	for (size_t i = 0; i < state_floats(l); i++)
		s[i] = rnd(0.5f);
	if (garbage >= 0)
		for (size_t i = 0; i < per; i++)
			s[(size_t)garbage * per + i] = 1000.0f;
	return s;
}

/*
 * One step of a case on cpu (chunked = 0: the reference) and on gpu both ways; checks
 * outputs and states and carries the states on (host copies: cpu_st, rec_st, chk_st).
 */
static void gdn_step(const struct gdn_layer *g, const struct hbatch *hb, float *cpu_st,
		     float *rec_st, float *chk_st, const char *what)
{
	const struct sm70_state_layout *l = &g->lay;
	const int T = hb->n_tokens;
	const size_t n_out = (size_t)T * l->n_v_heads * l->v_dim, n_st = state_floats(l);
	float *qkv, *ba, *oc = fvec(n_out), *orc = fvec(n_out), *ock = fvec(n_out);
	char name[128];

	mk_inputs(g, T, &qkv, &ba);
	gdn_once(cpu, g, hb, qkv, ba, cpu_st, oc, 0);
	gdn_once(gpu, g, hb, qkv, ba, rec_st, orc, 0);
	gdn_once(gpu, g, hb, qkv, ba, chk_st, ock, 1);
	snprintf(name, sizeof(name), "gdn %s out, recurrence vs cpu", what);
	compare_values(name, orc, oc, n_out, TOL_F16_OUT);
	snprintf(name, sizeof(name), "gdn %s state, recurrence vs cpu", what);
	compare_values(name, rec_st, cpu_st, n_st, TOL_STATE);
	snprintf(name, sizeof(name), "gdn %s out, chunked vs cpu", what);
	compare_values(name, ock, oc, n_out, TOL_F16_OUT);
	snprintf(name, sizeof(name), "gdn %s out, chunked vs recurrence", what);
	compare_values(name, ock, orc, n_out, TOL_F16_OUT);
	snprintf(name, sizeof(name), "gdn %s state, chunked vs recurrence", what);
	compare_values(name, chk_st, rec_st, n_st, TOL_CHUNK);
	free(qkv), free(ba), free(oc), free(orc), free(ock);
}

/* Two steps: decodes mid-sequence and at position 0 (a reset over garbage), a padding
 * decode on the scratch slot, chunks from position 0 (three pieces, the last partial) and
 * from mid-sequence; then every sequence decodes on. */
static void gdn_case(int n_k, int n_v, int dk, int dv, const char *what)
{
	struct gdn_layer g = mk_layer(6, n_k, n_v, dk, dv);
	const struct sm70_state_layout *l = &g.lay;
	const struct seqspec step1[] = {
		{ 0, 17, 1 }, { 1, 400, 1 }, { 2, 0, 1 }, { 6, 3, 1 }, /* decodes; 6: scratch */
		{ 3, 0, 150 }, { 4, 50, 37 }, { 5, 9, 1 },             /* chunks */
	};
	const struct seqspec step2[] = {
		{ 0, 18, 1 }, { 1, 401, 1 }, { 2, 1, 1 }, { 3, 150, 1 }, { 4, 87, 1 },
		{ 5, 10, 70 },
	};
	float *cs = mk_state(l, 2), *rs, *ks;
	struct hbatch hb;
	char name[96];

	/* slot 3 starts at position 0 too: garbage there as well */
	for (size_t i = 0; i < (size_t)l->n_v_heads * l->k_dim * l->v_dim; i++)
		cs[(size_t)3 * l->n_v_heads * l->k_dim * l->v_dim + i] = -1000.0f;
	rs = fvec(state_floats(l));
	ks = fvec(state_floats(l));
	memcpy(rs, cs, state_floats(l) * 4);
	memcpy(ks, cs, state_floats(l) * 4);
	hb_make(&hb, step1, 4, 3, 1);
	snprintf(name, sizeof(name), "%s step 1 (T=%d)", what, hb.n_tokens);
	gdn_step(&g, &hb, cs, rs, ks, name);
	hb_make(&hb, step2, 5, 1, 1);
	snprintf(name, sizeof(name), "%s step 2 (T=%d)", what, hb.n_tokens);
	gdn_step(&g, &hb, cs, rs, ks, name);
	free(cs), free(rs), free(ks);
	free_layer(&g);
}

static void test_gdn_small(void **state)
{
	gdn_case(2, 6, 128, 128, "Hk2 Hv6 128x128");
	gdn_case(1, 3, 64, 32, "Hk1 Hv3 64x32");
	gdn_case(2, 6, 32, 48, "Hk2 Hv6 32x48"); /* v_dim % 32 != 0: 16-column bands only */
	gdn_case(1, 3, 256, 64, "Hk1 Hv3 256x64"); /* k_dim 256: no chunked kernel */
}

/* Qwen3.5-27B's layer (16 key heads, 48 value heads, 128 x 128) at a small batch. */
static void test_gdn_27b(void **state)
{
	struct gdn_layer g = mk_layer(4, 16, 48, 128, 128);
	const struct sm70_state_layout *l = &g.lay;
	const struct seqspec step[] = { { 0, 100, 1 }, { 1, 2000, 1 }, { 2, 0, 70 },
					{ 3, 64, 129 } };
	float *cs = mk_state(l, -1), *rs = fvec(state_floats(l)), *ks = fvec(state_floats(l));
	struct hbatch hb;

	memcpy(rs, cs, state_floats(l) * 4);
	memcpy(ks, cs, state_floats(l) * 4);
	hb_make(&hb, step, 2, 2, 1);
	gdn_step(&g, &hb, cs, rs, ks, "27B B2 + chunks 70, 129");
	free(cs), free(rs), free(ks);
	free_layer(&g);
}

/* Every band width and cache-hint variant of the recurrence kernel (sm70-bench gdn times
 * them all; the launcher picks one by batch size) on the 27B shape. */
static void test_gdn_variants(void **state)
{
	static const int variants[][2] = { { 16, 0 }, { 16, 1 }, { 32, 0 }, { 32, 1 },
					   { 64, 0 }, { 64, 1 } };
	struct gdn_layer g = mk_layer(4, 16, 48, 128, 128);
	const struct sm70_state_layout *l = &g.lay;
	const struct seqspec step[] = { { 0, 100, 1 }, { 1, 0, 1 }, { 2, 5, 1 }, { 3, 9, 33 } };
	const size_t n_st = state_floats(l);
	float *s0 = mk_state(l, 1), *cs = fvec(n_st), *gs = fvec(n_st), *qkv, *ba, *oc, *og;
	struct hbatch hb;
	size_t n_out;

	hb_make(&hb, step, 3, 1, 1);
	n_out = (size_t)hb.n_tokens * l->n_v_heads * l->v_dim;
	oc = fvec(n_out);
	og = fvec(n_out);
	mk_inputs(&g, hb.n_tokens, &qkv, &ba);
	memcpy(cs, s0, n_st * 4);
	gdn_once(cpu, &g, &hb, qkv, ba, cs, oc, 0);
	for (size_t v = 0; v < sizeof(variants) / sizeof(variants[0]); v++) {
		char what[96];

		memcpy(gs, s0, n_st * 4);
		sm70__cuda_gdn_tune(variants[v][0], variants[v][1]);
		gdn_once(gpu, &g, &hb, qkv, ba, gs, og, 0);
		sm70__cuda_gdn_tune(0, -1);
		snprintf(what, sizeof(what), "gdn 27B %d-col%s out vs cpu", variants[v][0],
			 variants[v][1] ? " cs" : "");
		compare_values(what, og, oc, n_out, TOL_F16_OUT);
		snprintf(what, sizeof(what), "gdn 27B %d-col%s state vs cpu", variants[v][0],
			 variants[v][1] ? " cs" : "");
		compare_values(what, gs, cs, n_st, TOL_STATE);
	}
	free(s0), free(cs), free(gs), free(qkv), free(ba), free(oc), free(og);
	free_layer(&g);
}

/* A batch without the decode/chunk shape: two sequences interleaved token by token. */
static void test_gdn_unshaped(void **state)
{
	struct gdn_layer g = mk_layer(3, 2, 6, 64, 64);
	const struct sm70_state_layout *l = &g.lay;
	const size_t n_st = state_floats(l);
	float *cs = mk_state(l, 1), *gs = fvec(n_st), *qkv, *ba, *oc, *og;
	struct hbatch hb;
	size_t n_out;

	memcpy(gs, cs, n_st * 4);
	hb_interleaved(&hb, 0, 30, 1, 0, 9);
	n_out = (size_t)hb.n_tokens * l->n_v_heads * l->v_dim;
	oc = fvec(n_out);
	og = fvec(n_out);
	mk_inputs(&g, hb.n_tokens, &qkv, &ba);
	gdn_once(cpu, &g, &hb, qkv, ba, cs, oc, 0);
	gdn_once(gpu, &g, &hb, qkv, ba, gs, og, 1);
	compare_values("gdn unshaped (interleaved) out vs cpu", og, oc, n_out, TOL_F16_OUT);
	compare_values("gdn unshaped (interleaved) state vs cpu", gs, cs, n_st, TOL_STATE);
	free(cs), free(gs), free(qkv), free(ba), free(oc), free(og);
	free_layer(&g);
}

/* ---- conv1d_silu ------------------------------------------------------------------------ */

static void conv_once(struct sm70_backend *be, const struct sm70_state_layout *l,
		      const struct hbatch *hb, const float *x, int ld, const float *w,
		      float *conv, float *out)
{
	const int T = hb->n_tokens;
	const size_t n_conv = (size_t)(l->n_slots + 1) * (l->conv_k - 1) * l->conv_dim;
	struct sm70_state_layer st = { .conv = NULL };
	struct dbatch d;
	void *dx, *dout;
	float *dw;

	db_up(be, hb, &d);
	dx = up_act(be, x, (size_t)T * ld);
	dw = up_bytes(be, w, (size_t)l->conv_dim * l->conv_k * 4);
	st.conv = up_act(be, conv, n_conv ? n_conv : 1);
	dout = balloc(be, (size_t)T * l->conv_dim * 4);
	be->ops->conv1d_silu(be, dout, dx, ld, dw, &st, l, &d.b);
	get_act(be, out, dout, (size_t)T * l->conv_dim);
	if (n_conv)
		get_act(be, conv, st.conv, n_conv);
	bfree(be, dout), bfree(be, st.conv), bfree(be, dw), bfree(be, dx);
	db_free(be, &d);
}

static void conv_case(int conv_k, int shaped)
{
	struct sm70_state_layout l = { 6, conv_k, 2 * 2 * 32 + 6 * 32, 2, 6, 32, 32 };
	const int ld = l.conv_dim + 40;
	const struct seqspec step1[] = {
		{ 0, 17, 1 }, { 1, 0, 1 }, { 6, 5, 1 },                  /* decodes */
		{ 2, 0, 150 }, { 3, 40, 2 }, { 4, 7, 65 }, { 5, 0, 3 }, /* chunks */
	};
	const struct seqspec step2[] = {
		{ 0, 18, 1 }, { 1, 1, 1 }, { 2, 150, 1 }, { 3, 42, 1 }, { 4, 72, 130 },
	};
	const size_t n_conv = (size_t)(l.n_slots + 1) * (conv_k - 1) * l.conv_dim;
	float *cc = rvec16(n_conv ? n_conv : 1, 2.0f), *gc = fvec(n_conv ? n_conv : 1);
	float *w = fvec((size_t)l.conv_dim * conv_k);
	char what[96];

	memcpy(gc, cc, (n_conv ? n_conv : 1) * 4);
	for (size_t i = 0; i < (size_t)l.conv_dim * conv_k; i++)
		w[i] = rnd(0.8f);
	for (int step = 0; step < 2; step++) {
		struct hbatch hb;
		float *x, *oc, *og;
		size_t n_out;

		if (step == 0)
			hb_make(&hb, step1, 3, 4, shaped);
		else
			hb_make(&hb, step2, 4, 1, shaped);
		n_out = (size_t)hb.n_tokens * l.conv_dim;
		x = rvec16((size_t)hb.n_tokens * ld, 2.0f);
		oc = fvec(n_out);
		og = fvec(n_out);
		conv_once(cpu, &l, &hb, x, ld, w, cc, oc);
		conv_once(gpu, &l, &hb, x, ld, w, gc, og);
		snprintf(what, sizeof(what), "conv1d_silu K=%d %s step %d out (T=%d)", conv_k,
			 shaped ? "shaped" : "unshaped", step + 1, hb.n_tokens);
		compare_values(what, og, oc, n_out, TOL_F16_OUT);
		if (n_conv) {
			/* the slots hold exact copies of inputs on both */
			snprintf(what, sizeof(what), "conv1d_silu K=%d %s step %d state", conv_k,
				 shaped ? "shaped" : "unshaped", step + 1);
			compare_values(what, gc, cc, n_conv, TOL_EXACT);
		}
		free(x), free(oc), free(og);
	}
	free(cc), free(gc), free(w);
}

static void test_conv1d_silu(void **state)
{
	conv_case(4, 1);
	conv_case(4, 0);
	conv_case(2, 1);
	conv_case(6, 1);
}

/* ---- gated_rmsnorm, sigmoid_mul ------------------------------------------------------------ */

static void test_gated_rmsnorm(void **state)
{
	const int shapes[][2] = { { 48, 128 }, { 6, 128 }, { 3, 98 }, { 2, 256 } };
	const int ns[] = { 1, 5, 17 };

	for (int sig = 0; sig < 2; sig++)
	for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
		for (int ni = 0; ni < 3; ni++) {
			const int H = shapes[s][0], D = shapes[s][1], n = ns[ni];
			const int z_ld = H * D + 8 + (D % 4 ? 1 : 0);
			const size_t cnt = (size_t)n * H * D;
			float *x = rvec16(cnt, 3.0f), *z = rvec16((size_t)n * z_ld, 4.0f);
			float *w = fvec(D), *rc = fvec(cnt), *rg = fvec(cnt);
			void *xc = up_act(cpu, x, cnt), *xg = up_act(gpu, x, cnt);
			void *zc = up_act(cpu, z, (size_t)n * z_ld), *zg = up_act(gpu, z, (size_t)n * z_ld);
			float *wc, *wg;
			char what[96];

			for (int k = 0; k < D; k++)
				w[k] = 1.0f + rnd(0.5f);
			wc = up_bytes(cpu, w, D * 4);
			wg = up_bytes(gpu, w, D * 4);
			cpu->ops->gated_rmsnorm(cpu, xc, zc, z_ld, wc, n, H, D, 1e-6f, sig);
			gpu->ops->gated_rmsnorm(gpu, xg, zg, z_ld, wg, n, H, D, 1e-6f, sig);
			get_act(cpu, rc, xc, cnt);
			get_act(gpu, rg, xg, cnt);
			snprintf(what, sizeof(what), "gated_rmsnorm %s n=%d heads=%d dim=%d z_ld=%d",
				 sig ? "sigmoid" : "silu", n, H, D, z_ld);
			compare_values(what, rg, rc, cnt, TOL_F16_OUT);
			bfree(cpu, xc), bfree(gpu, xg), bfree(cpu, zc), bfree(gpu, zg);
			bfree(cpu, wc), bfree(gpu, wg);
			free(x), free(z), free(w), free(rc), free(rg);
		}
	}
}

static void test_sigmoid_mul(void **state)
{
	const int shapes[][2] = { { 6144, 12288 }, { 130, 262 }, { 77, 80 } }; /* dim, ld */
	const int ns[] = { 1, 3, 17 };

	for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
		for (int ni = 0; ni < 3; ni++) {
			const int dim = shapes[s][0], ld = shapes[s][1], n = ns[ni];
			const size_t cnt = (size_t)n * dim;
			float *x = rvec16(cnt, 3.0f), *gt = rvec16((size_t)n * ld, 6.0f);
			float *rc = fvec(cnt), *rg = fvec(cnt);
			void *xc = up_act(cpu, x, cnt), *xg = up_act(gpu, x, cnt);
			void *gc = up_act(cpu, gt, (size_t)n * ld), *gg = up_act(gpu, gt, (size_t)n * ld);
			char what[96];

			cpu->ops->sigmoid_mul(cpu, xc, gc, ld, n, dim);
			gpu->ops->sigmoid_mul(gpu, xg, gg, ld, n, dim);
			get_act(cpu, rc, xc, cnt);
			get_act(gpu, rg, xg, cnt);
			snprintf(what, sizeof(what), "sigmoid_mul n=%d dim=%d ld=%d", n, dim, ld);
			compare_values(what, rg, rc, cnt, TOL_F16_OUT);
			bfree(cpu, xc), bfree(gpu, xg), bfree(cpu, gc), bfree(gpu, gg);
			free(x), free(gt), free(rc), free(rg);
		}
	}
}

/* ---- graph replay --------------------------------------------------------------------------- */

/* The GDN decode ops of one layer on persistent buffers, as a captured step would run them. */
struct gdn_decode {
	struct gdn_layer g;
	struct dbatch d;
	struct sm70_state_layer st;
	int x_ld, B;
	void *x, *qkv, *out, *gate;
	float *w, *a_log, *dt, *nw;
};

static void dec_ops(struct gdn_decode *e)
{
	const struct sm70_state_layout *l = &e->g.lay;
	const int vd = l->n_v_heads * l->v_dim;
	const size_t esz = gpu->act_dtype == SM70_DTYPE_F32 ? 4 : 2;
	/* x row: qkv | z | b a (+ pad), the in_proj outputs side by side */
	const char *x = e->x;

	gpu->ops->conv1d_silu(gpu, e->qkv, e->x, e->x_ld, e->w, &e->st, l, &e->d.b);
	gpu->ops->gdn(gpu, e->out, e->qkv, x + esz * (l->conv_dim + vd), e->x_ld, e->a_log,
		      e->dt, &e->st, l, &e->d.b, 1);
	gpu->ops->gated_rmsnorm(gpu, e->out, x + esz * l->conv_dim, e->x_ld, e->nw, e->B,
				l->n_v_heads, l->v_dim, 1e-6f, 0);
	gpu->ops->sigmoid_mul(gpu, e->out, e->gate, vd, e->B, vd);
}

/* Downloads out, ssm and conv of e into one host vector (as floats). */
static float *dec_result(struct gdn_decode *e, size_t *n)
{
	const struct sm70_state_layout *l = &e->g.lay;
	const size_t no = (size_t)e->B * l->n_v_heads * l->v_dim, ns = state_floats(l);
	const size_t nc = (size_t)(l->n_slots + 1) * (l->conv_k - 1) * l->conv_dim;
	const size_t nq = (size_t)e->B * l->conv_dim;
	float *r = fvec(no + ns + nc + nq);

	get_act(gpu, r, e->out, no);
	get_f32(gpu, r + no, e->st.ssm, ns);
	get_act(gpu, r + no + ns, e->st.conv, nc);
	get_act(gpu, r + no + ns + nc, e->qkv, nq);
	*n = no + ns + nc + nq;
	return r;
}

static void test_graph_replay(void **state)
{
	struct gdn_decode e;
	const int B = 4;
	const struct seqspec seqs[] = { { 2, 33, 1 }, { 0, 0, 1 }, { 3, 1000, 1 }, { 1, 7, 1 } };
	struct sm70_state_layout *l;
	struct hbatch hb;
	float *s0, *c0, *xin, *r_eager, *r_graph;
	size_t nconv, n;
	void *graph = NULL;

	memset(&e, 0, sizeof(e));
	e.g = mk_layer(4, 16, 48, 128, 128);
	l = &e.g.lay;
	e.B = B;
	e.x_ld = l->conv_dim + l->n_v_heads * l->v_dim + 2 * l->n_v_heads + 8;
	nconv = (size_t)(l->n_slots + 1) * (l->conv_k - 1) * l->conv_dim;
	hb_make(&hb, seqs, B, 0, 1);
	db_up(gpu, &hb, &e.d);
	s0 = mk_state(l, 0);
	c0 = rvec16(nconv, 1.0f);
	e.st.ssm = up_bytes(gpu, s0, state_floats(l) * 4);
	e.st.conv = up_act(gpu, c0, nconv);
	{
		float *w = fvec((size_t)l->conv_dim * l->conv_k);

		for (size_t i = 0; i < (size_t)l->conv_dim * l->conv_k; i++)
			w[i] = rnd(0.8f);
		e.w = up_bytes(gpu, w, (size_t)l->conv_dim * l->conv_k * 4);
		free(w);
	}
	e.a_log = up_bytes(gpu, e.g.a_log, l->n_v_heads * 4);
	e.dt = up_bytes(gpu, e.g.dt_bias, l->n_v_heads * 4);
	{
		float *nw = fvec(l->v_dim);

		for (int k = 0; k < l->v_dim; k++)
			nw[k] = 1.0f + rnd(0.3f);
		e.nw = up_bytes(gpu, nw, l->v_dim * 4);
		free(nw);
	}
	xin = rvec16((size_t)B * e.x_ld, 1.5f);
	e.x = up_act(gpu, xin, (size_t)B * e.x_ld);
	e.qkv = balloc(gpu, (size_t)B * l->conv_dim * 4);
	e.out = balloc(gpu, (size_t)B * l->n_v_heads * l->v_dim * 4);
	{
		float *gv = rvec16((size_t)B * l->n_v_heads * l->v_dim, 4.0f);

		e.gate = up_act(gpu, gv, (size_t)B * l->n_v_heads * l->v_dim);
		free(gv);
	}

	/* eager, then the same from the same state through a captured graph */
	dec_ops(&e);
	r_eager = dec_result(&e, &n);
	assert_int_equal(gpu->ops->upload(gpu, e.st.ssm, s0, state_floats(l) * 4), 0);
	set_act(gpu, e.st.conv, c0, nconv);
	assert_int_equal(gpu->ops->sync(gpu), 0);
	assert_int_equal(gpu->ops->graph_begin(gpu), 0);
	dec_ops(&e);
	assert_int_equal(gpu->ops->graph_end(gpu, &graph), 0);
	assert_int_equal(gpu->ops->graph_launch(gpu, graph), 0);
	r_graph = dec_result(&e, &n);
	compare_values("decode B4 27B conv+gdn+norm+gate: graph vs eager", r_graph, r_eager, n,
		       TOL_EXACT);
	free(r_graph);
	free(r_eager);

	/* new inputs in the same buffers: a replay reads them */
	free(xin);
	xin = rvec16((size_t)B * e.x_ld, 1.5f);
	set_act(gpu, e.x, xin, (size_t)B * e.x_ld);
	assert_int_equal(gpu->ops->upload(gpu, e.st.ssm, s0, state_floats(l) * 4), 0);
	set_act(gpu, e.st.conv, c0, nconv);
	dec_ops(&e);
	r_eager = dec_result(&e, &n);
	assert_int_equal(gpu->ops->upload(gpu, e.st.ssm, s0, state_floats(l) * 4), 0);
	set_act(gpu, e.st.conv, c0, nconv);
	assert_int_equal(gpu->ops->sync(gpu), 0);
	assert_int_equal(gpu->ops->graph_launch(gpu, graph), 0);
	r_graph = dec_result(&e, &n);
	compare_values("decode B4 27B, new inputs: graph replay vs eager", r_graph, r_eager, n,
		       TOL_EXACT);
	gpu->ops->graph_destroy(gpu, graph);
	free(r_graph), free(r_eager), free(xin), free(s0), free(c0);
	bfree(gpu, e.gate), bfree(gpu, e.out), bfree(gpu, e.qkv), bfree(gpu, e.x);
	bfree(gpu, e.nw), bfree(gpu, e.dt), bfree(gpu, e.a_log), bfree(gpu, e.w);
	bfree(gpu, e.st.conv), bfree(gpu, e.st.ssm);
	db_free(gpu, &e.d);
	free_layer(&e.g);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_conv1d_silu),
		cmocka_unit_test(test_gated_rmsnorm),
		cmocka_unit_test(test_sigmoid_mul),
		cmocka_unit_test(test_gdn_small),
		cmocka_unit_test(test_gdn_27b),
		cmocka_unit_test(test_gdn_variants),
		cmocka_unit_test(test_gdn_unshaped),
		cmocka_unit_test(test_graph_replay),
	};

	return gpu_test_main("cuda_gdn", tests, sizeof(tests) / sizeof(tests[0]), &gpu, &gpu_ref,
			     &cpu);
}
