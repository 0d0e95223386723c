/* test_cuda_hc_ple - the CUDA qwen4_exp ops (group_rmsnorm, hc_gates, hc_combine,
 * hc_inject, ngram_hist, ple_embed, ple_gate, ple_conv; the fused hc_mix) against their
 * CPU twins on the same inputs: odd and vector-friendly sizes, two steps of batches mixing
 * decodes and prefill chunks from dirty slots, the PLE table in host memory registered
 * through host_register; and a captured decode step (its PLE gather on the side stream)
 * replayed against eager runs. */
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

#define GPU_TEST_SEED 0x4c9e0ff1ce5eedULL
#include "tests/gpu/gpu_test.h"
#include "tests/gpu/slot_batch.h"

/*
 * Errors are max |got - ref| over max |ref| ("rel"); both backends see the same f16-rounded
 * inputs.
 *  - f16 outputs (group_rmsnorm, hc_gates' z, hc_combine, ple_gate) carry up to 2^-11 of
 *    rounding on top of f32 differences (sums in another order, expf an ulp or two apart).
 *  - hc_gates' inj is f32: 2 * sigmoid, the two libms' expf within a few ulps.
 *  - ple_conv's x is f32: the taps are the same f32 operations in the same order on both
 *    (f16 inputs exact in f32, products and sums rounded apart), so only silu's expf
 *    differs, a few ulps of the increment.
 *  - Exact: hc_inject (one product and one sum, rounded apart, on identical values),
 *    ngram_hist (integers), ple_embed (a copy; compared as f16 bits), ple_conv's slots
 *    (copies of inputs), and graph replays against eager runs.
 */
#define TOL_EXACT 0.0
#define TOL_F16_OUT 1.5e-3
#define TOL_F32_GATE 1e-6
#define TOL_F32_X 1e-6
/* hc_mix: its f16 intermediates (xn, z, u) round like the composed GPU ops', but sums in
 * another order can flip a rounding, and the CPU keeps them f32: a few f16 ulps of y. Its
 * inject gates come from f32 dots over the f16 xn: against the GPU's composed ops only the
 * order of the sums differs (2.7e-7 seen on the H200), against the CPU also xn's f16
 * rounding (9.4e-5 seen at dim 64) */
#define TOL_MIX 4e-3
#define TOL_MIX_INJ 1e-5
#define TOL_MIX_INJ_CPU 1e-3

static struct sm70_backend *gpu, *gpu_ref, *cpu;

/* ---- helpers --------------------------------------------------------------------------- */

static size_t act_size(const struct sm70_backend *be)
{
	return be->act_dtype == SM70_DTYPE_F32 ? 4 : 2;
}

/* n int32 of a backend buffer into dst. */
static void get_i32(struct sm70_backend *be, int32_t *dst, const void *src, size_t n)
{
	assert_int_equal(be->ops->download(be, dst, src, n * sizeof(int32_t)), 0);
}

/* Compares n int32 and prints what was compared. */
static void compare_i32(const char *what, const int32_t *got, const int32_t *ref, size_t n)
{
	size_t bad = 0;

	for (size_t i = 0; i < n; i++)
		bad += got[i] != ref[i];
	printf("  %-52s %zu of %zu values differ\n", what, bad, n);
	assert_true(bad == 0);
}

/* ---- element-wise and per-row ops -------------------------------------------------------- */

/* Both x dtypes, odd and vector-friendly dims, groups at very different scales; on the GPU
 * the f16 form in place gives the bits of the out-of-place one. */
static void test_group_rmsnorm(void **state)
{
	const int shapes[][3] = { { 5, 3, 37 }, { 4, 4, 64 }, { 1, 2, 4096 }, { 17, 1, 6 } };

	for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++) {
		for (int x_f32 = 0; x_f32 < 2; x_f32++) {
			const int n = shapes[si][0], G = shapes[si][1], D = shapes[si][2];
			const size_t cnt = (size_t)n * G * D;
			float *x = rvec16(cnt, 1.0f), *w = fvec((size_t)G * D);
			float *yc = fvec(cnt), *yg = fvec(cnt), *yi = fvec(cnt);
			void *xc, *xg, *dyc, *dyg;
			float *wc, *wg;
			char what[96];

			for (size_t i = 0; i < cnt; i++)
				x[i] *= i / D % 2 ? 32.0f : 0.01f;
			for (size_t i = 0; i < cnt; i++)
				x[i] = sm70_f16_to_f32(sm70_f32_to_f16(x[i]));
			for (int k = 0; k < G * D; k++)
				w[k] = 1.0f + rnd(0.5f);
			xc = up_act(cpu, x, cnt);
			xg = x_f32 ? up_bytes(gpu, x, cnt * 4) : up_act(gpu, x, cnt);
			wc = up_bytes(cpu, w, (size_t)G * D * 4);
			wg = up_bytes(gpu, w, (size_t)G * D * 4);
			dyc = balloc(cpu, cnt * act_size(cpu));
			dyg = balloc(gpu, cnt * act_size(gpu));
			cpu->ops->group_rmsnorm(cpu, dyc, xc, 1, wc, n, G, D, 1e-6f);
			gpu->ops->group_rmsnorm(gpu, dyg, xg, x_f32, wg, n, G, D, 1e-6f);
			get_act(cpu, yc, dyc, cnt);
			get_act(gpu, yg, dyg, cnt);
			snprintf(what, sizeof(what), "group_rmsnorm n=%d groups=%d dim=%d x %s", n,
				 G, D, x_f32 ? "f32" : "f16");
			compare_values(what, yg, yc, cnt, TOL_F16_OUT);
			if (!x_f32) {
				gpu->ops->group_rmsnorm(gpu, xg, xg, 0, wg, n, G, D, 1e-6f);
				get_act(gpu, yi, xg, cnt);
				compare_values("  the same in place vs out of place", yi, yg, cnt,
					       TOL_EXACT);
			}
			bfree(cpu, dyc), bfree(gpu, dyg), bfree(cpu, wc), bfree(gpu, wg);
			bfree(cpu, xc), bfree(gpu, xg);
			free(x), free(w), free(yc), free(yg), free(yi);
		}
	}
}

/* With and without inject logits; logits up to +-30. */
static void test_hc_gates(void **state)
{
	const int shapes[][2] = { { 13, 3 }, { 16, 4 } }; /* rank, streams */

	for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++) {
		for (int with_inj = 0; with_inj < 2; with_inj++) {
			const int n = 9, rank = shapes[si][0], S = shapes[si][1], ld = rank + S + 5;
			float *f = rvec16((size_t)n * ld, 30.0f);
			float *zc = fvec((size_t)n * rank), *zg = fvec((size_t)n * rank);
			float *ic = fvec((size_t)n * S), *ig = fvec((size_t)n * S);
			float *fc = up_bytes(cpu, f, (size_t)n * ld * 4);
			float *fg = up_bytes(gpu, f, (size_t)n * ld * 4);
			void *dzc = balloc(cpu, (size_t)n * rank * act_size(cpu));
			void *dzg = balloc(gpu, (size_t)n * rank * act_size(gpu));
			float *dic = balloc(cpu, (size_t)n * S * 4);
			float *dig = balloc(gpu, (size_t)n * S * 4);
			char what[96];

			cpu->ops->hc_gates(cpu, dzc, with_inj ? dic : NULL, fc, ld, n, rank, S);
			gpu->ops->hc_gates(gpu, dzg, with_inj ? dig : NULL, fg, ld, n, rank, S);
			get_act(cpu, zc, dzc, (size_t)n * rank);
			get_act(gpu, zg, dzg, (size_t)n * rank);
			snprintf(what, sizeof(what), "hc_gates z rank=%d S=%d%s", rank, S,
				 with_inj ? "" : " (no inj)");
			compare_values(what, zg, zc, (size_t)n * rank, TOL_F16_OUT);
			if (with_inj) {
				get_f32(cpu, ic, dic, (size_t)n * S);
				get_f32(gpu, ig, dig, (size_t)n * S);
				snprintf(what, sizeof(what), "hc_gates inj rank=%d S=%d", rank, S);
				compare_values(what, ig, ic, (size_t)n * S, TOL_F32_GATE);
			}
			bfree(cpu, dzc), bfree(gpu, dzg), bfree(cpu, dic), bfree(gpu, dig);
			bfree(cpu, fc), bfree(gpu, fg);
			free(f), free(zc), free(zg), free(ic), free(ig);
		}
	}
}

/* hc_combine, then hc_inject of its result (as a layer does), odd and even dims. */
static void test_hc_combine_inject(void **state)
{
	const int shapes[][3] = { { 4, 3, 45 }, { 7, 4, 64 }, { 1, 4, 2048 } };

	for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++) {
		const int n = shapes[si][0], S = shapes[si][1], D = shapes[si][2];
		const size_t cnt = (size_t)n * S * D, ny = (size_t)n * D;
		float *u = rvec16(cnt, 8.0f), *xn = rvec16(cnt, 3.0f), *x = rvec16(cnt, 4.0f);
		float *inj = rvec16((size_t)n * S, 2.0f);
		float *yc = fvec(ny), *yg = fvec(ny), *xc = fvec(cnt), *xg = fvec(cnt);
		void *uc = up_act(cpu, u, cnt), *ug = up_act(gpu, u, cnt);
		void *nc = up_act(cpu, xn, cnt), *ng = up_act(gpu, xn, cnt);
		void *dyc = balloc(cpu, ny * act_size(cpu)), *dyg = balloc(gpu, ny * act_size(gpu));
		float *dxc = up_bytes(cpu, x, cnt * 4), *dxg = up_bytes(gpu, x, cnt * 4);
		float *jc = up_bytes(cpu, inj, (size_t)n * S * 4);
		float *jg = up_bytes(gpu, inj, (size_t)n * S * 4);
		void *delta_c;
		char what[96];

		cpu->ops->hc_combine(cpu, dyc, uc, nc, n, S, D);
		gpu->ops->hc_combine(gpu, dyg, ug, ng, n, S, D);
		get_act(cpu, yc, dyc, ny);
		get_act(gpu, yg, dyg, ny);
		snprintf(what, sizeof(what), "hc_combine n=%d S=%d dim=%d", n, S, D);
		compare_values(what, yg, yc, ny, TOL_F16_OUT);
		/* inject the GPU's (f16) combination on both, so the inputs are identical */
		delta_c = up_act(cpu, yg, ny);
		cpu->ops->hc_inject(cpu, dxc, delta_c, jc, n, S, D);
		gpu->ops->hc_inject(gpu, dxg, dyg, jg, n, S, D);
		get_f32(cpu, xc, dxc, cnt);
		get_f32(gpu, xg, dxg, cnt);
		snprintf(what, sizeof(what), "hc_inject n=%d S=%d dim=%d", n, S, D);
		compare_values(what, xg, xc, cnt, TOL_EXACT);
		bfree(cpu, delta_c), bfree(cpu, uc), bfree(gpu, ug), bfree(cpu, nc), bfree(gpu, ng);
		bfree(cpu, dyc), bfree(gpu, dyg), bfree(cpu, dxc), bfree(gpu, dxg);
		bfree(cpu, jc), bfree(gpu, jg);
		free(u), free(xn), free(x), free(inj), free(yc), free(yg), free(xc), free(xg);
	}
}

/* Random rows plus the shaping's corners: g == 0 exactly, tiny g of either sign (clamped
 * to +-1e-3), and a large g; dim odd (one value a lane) and even (two). */
static void test_ple_gate(void **state)
{
	const int shapes[][4] = { { 6, 3, 37, 50 }, { 5, 4, 64, 64 } }; /* n, S, dim, v_ld */

	for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++) {
		const int n = shapes[si][0], S = shapes[si][1], D = shapes[si][2];
		const int v_ld = shapes[si][3];
		const size_t cnt = (size_t)n * S * D;
		float *kn = rvec16(cnt, 1.0f), *qn = rvec16(cnt, 1.0f);
		float *v = rvec16((size_t)n * v_ld, 2.0f);
		float *oc = fvec(cnt), *og = fvec(cnt);
		const float special[][2] = { { 0.0f, 0.0f }, { 1e-4f, 1e-4f }, { -1e-4f, 1e-4f },
					     { 12.0f, 12.0f } };
		void *kc, *kg, *qc, *qg, *vc, *vg, *dc, *dg;
		char what[96];

		for (int k = 0; k < 4; k++) {
			float *kr = kn + ((size_t)k * S + (size_t)k % S) * D;
			float *qr = qn + ((size_t)k * S + (size_t)k % S) * D;

			memset(kr, 0, sizeof(float) * D);
			memset(qr, 0, sizeof(float) * D);
			kr[1] = sm70_f16_to_f32(sm70_f32_to_f16(special[k][0]));
			qr[1] = sm70_f16_to_f32(sm70_f32_to_f16(special[k][1]));
		}
		kc = up_act(cpu, kn, cnt), kg = up_act(gpu, kn, cnt);
		qc = up_act(cpu, qn, cnt), qg = up_act(gpu, qn, cnt);
		vc = up_act(cpu, v, (size_t)n * v_ld), vg = up_act(gpu, v, (size_t)n * v_ld);
		dc = balloc(cpu, cnt * act_size(cpu)), dg = balloc(gpu, cnt * act_size(gpu));
		cpu->ops->ple_gate(cpu, dc, kc, qc, vc, v_ld, n, S, D);
		gpu->ops->ple_gate(gpu, dg, kg, qg, vg, v_ld, n, S, D);
		get_act(cpu, oc, dc, cnt);
		get_act(gpu, og, dg, cnt);
		snprintf(what, sizeof(what), "ple_gate n=%d S=%d dim=%d v_ld=%d", n, S, D, v_ld);
		compare_values(what, og, oc, cnt, TOL_F16_OUT);
		/* g == 0: sigmoid 0.5 exactly on both */
		for (int k = 0; k < D; k++)
			assert_true(og[k] == sm70_f16_to_f32(sm70_f32_to_f16(0.5f * v[k])));
		bfree(cpu, kc), bfree(gpu, kg), bfree(cpu, qc), bfree(gpu, qg);
		bfree(cpu, vc), bfree(gpu, vg), bfree(cpu, dc), bfree(gpu, dg);
		free(kn), free(qn), free(v), free(oc), free(og);
	}
}

/* ---- batches ------------------------------------------------------------------------------ */

#define N_SLOTS 6
#define EOS 499
#define VOCAB 500

/* hb_make (slot_batch.h) with token ids, EOS about one time in six. */
static void hb_make_ids(struct hbatch *hb, const struct seqspec *sp, int n_dec, int n_ch,
			int shaped)
{
	hb_make(hb, sp, n_dec, n_ch, shaped);
	for (int t = 0; t < hb->n_tokens; t++)
		hb->ids[t] = rnd_int(6) == 0 ? EOS : rnd_int(VOCAB - 1);
}

/*
 * Step 1: decodes mid-sequence, at position 0 and 2 over dirty slots, a padding decode on
 * the scratch slot; chunks from position 0 (150 tokens), short mid-sequence (2) and near
 * the start (3). Step 2: every sequence goes on, one as a 70-token chunk.
 */
static const struct seqspec step1[] = { { 0, 17, 1 }, { 1, 0, 1 }, { 2, 2, 1 }, { 6, 5, 1 },
					{ 3, 0, 150 }, { 4, 40, 2 }, { 5, 6, 3 } };
static const struct seqspec step2[] = { { 0, 18, 1 }, { 1, 1, 1 }, { 2, 3, 1 }, { 3, 150, 1 },
					{ 4, 42, 1 }, { 5, 9, 70 } };

static void step_batch(struct hbatch *hb, int step, int shaped)
{
	if (step == 0)
		hb_make_ids(hb, step1, 4, 3, shaped);
	else
		hb_make_ids(hb, step2, 5, 1, shaped);
}

/* ---- ngram_hist and ple_embed --------------------------------------------------------- */

/* One ngram_hist call on be: ctx in/out (host), hist out (host, [T][n_hist]). */
static void hist_once(struct sm70_backend *be, const struct hbatch *hb, int n_hist, int32_t *ctx,
		      int32_t *hist)
{
	const size_t n_ctx = (size_t)(N_SLOTS + 1) * n_hist, n_h = (size_t)hb->n_tokens * n_hist;
	struct dbatch d;
	int32_t *dctx, *dh;

	db_up(be, hb, &d);
	dctx = up_bytes(be, ctx, n_ctx * 4);
	dh = balloc(be, n_h * 4);
	be->ops->ngram_hist(be, dh, dctx, n_hist, &d.b);
	get_i32(be, hist, dh, n_h);
	get_i32(be, ctx, dctx, n_ctx);
	bfree(be, dh), bfree(be, dctx);
	db_free(be, &d);
}

/* Two steps, shaped and not, n_hist 2 and 3; contexts start as a mix of tokens, EOS and
 * -1. hist and ctx must be equal. */
static void test_ngram_hist(void **state)
{
	for (int n_hist = 2; n_hist <= 3; n_hist++) {
		for (int shaped = 0; shaped < 2; shaped++) {
			const size_t n_ctx = (size_t)(N_SLOTS + 1) * n_hist;
			int32_t *cc = calloc(n_ctx, 4), *gc = calloc(n_ctx, 4);

			assert_non_null(cc);
			assert_non_null(gc);
			for (size_t i = 0; i < n_ctx; i++)
				cc[i] = gc[i] = rnd_int(4) == 0 ? -1 :
						rnd_int(4) == 0 ? EOS : rnd_int(VOCAB);
			for (int step = 0; step < 2; step++) {
				struct hbatch hb;
				int32_t *hc, *hg;
				char what[96];

				step_batch(&hb, step, shaped);
				hc = calloc((size_t)hb.n_tokens * n_hist, 4);
				hg = calloc((size_t)hb.n_tokens * n_hist, 4);
				assert_non_null(hc);
				assert_non_null(hg);
				hist_once(cpu, &hb, n_hist, cc, hc);
				hist_once(gpu, &hb, n_hist, gc, hg);
				snprintf(what, sizeof(what), "ngram_hist n_hist=%d %s step %d hist",
					 n_hist, shaped ? "shaped" : "unshaped", step + 1);
				compare_i32(what, hg, hc, (size_t)hb.n_tokens * n_hist);
				/* one sequence on the scratch slot: its ctx is exact too */
				snprintf(what, sizeof(what), "ngram_hist n_hist=%d %s step %d ctx",
					 n_hist, shaped ? "shaped" : "unshaped", step + 1);
				compare_i32(what, gc, cc, n_ctx);
				free(hc), free(hg);
			}
			free(cc), free(gc);
		}
	}
}

/* A PLE table in host memory (page-aligned, the table elem_off elements in) and its hash
 * parameters on both backends. */
struct ple_table {
	void *host;
	size_t bytes;
	struct sm70_ple_hash pc, pg; /* cpu's and gpu's */
};

static void table_new(struct ple_table *pt, int N, int hpn, int row_dim, enum sm70_dtype dt,
		      int elem_off)
{
	static const uint64_t sizes[] = { 1009, 1013, 1019, 1021, 1031, 1033 };
	const int G = (N - 1) * hpn;
	const size_t esz = sm70_dtype_size(dt);
	uint64_t mult[8], size[8], off[8];
	int64_t rows = 0;
	char *tab;

	assert_true(G <= 6 && N <= 8);
	for (int i = 0; i < N; i++)
		mult[i] = rng_next() | 1;
	for (int g = 0; g < G; g++) {
		size[g] = sizes[g];
		off[g] = (uint64_t)rows;
		rows += (int64_t)sizes[g];
	}
	rows -= 100; /* the last head's last 100 rows are past the table */
	pt->bytes = ((size_t)rows * row_dim + (size_t)elem_off) * esz;
	pt->bytes = (pt->bytes + 4095) & ~(size_t)4095;
	pt->host = aligned_alloc(4096, pt->bytes);
	assert_non_null(pt->host);
	tab = (char *)pt->host + (size_t)elem_off * esz;
	for (size_t i = 0; i < (size_t)rows * row_dim; i++) {
		const float v = rnd(2.0f);

		if (dt == SM70_DTYPE_F32) {
			memcpy(tab + i * 4, &v, 4);
		} else {
			const uint16_t h = dt == SM70_DTYPE_F16 ? sm70_f32_to_f16(v) :
								  sm70_f32_to_bf16(v);

			memcpy(tab + i * 2, &h, 2);
		}
	}
	assert_int_equal(gpu->ops->host_register(gpu, pt->host, pt->bytes), 0);
	pt->pc = (struct sm70_ple_hash){ .ngram = N, .heads_per_ngram = hpn, .eos = EOS,
					 .table = tab, .table_dtype = dt, .rows = rows,
					 .row_dim = row_dim };
	pt->pg = pt->pc;
	pt->pc.mult = up_bytes(cpu, mult, N * 8);
	pt->pc.size = up_bytes(cpu, size, G * 8);
	pt->pc.offset = up_bytes(cpu, off, G * 8);
	pt->pg.mult = up_bytes(gpu, mult, N * 8);
	pt->pg.size = up_bytes(gpu, size, G * 8);
	pt->pg.offset = up_bytes(gpu, off, G * 8);
}

static void table_free(struct ple_table *pt)
{
	gpu->ops->host_unregister(gpu, pt->host);
	bfree(cpu, (void *)pt->pc.mult), bfree(cpu, (void *)pt->pc.size);
	bfree(cpu, (void *)pt->pc.offset), bfree(gpu, (void *)pt->pg.mult);
	bfree(gpu, (void *)pt->pg.size), bfree(gpu, (void *)pt->pg.offset);
	free(pt->host);
}

/* ple_embed of one batch (hist as the CPU's ngram_hist made it) on both; the GPU's f16
 * must be the CPU's f32 rounded to f16, bit for bit. */
static void embed_compare(const struct ple_table *pt, const struct hbatch *hb,
			  const int32_t *hist, const char *what)
{
	const int n_hist = pt->pc.ngram - 1, G = n_hist * pt->pc.heads_per_ngram;
	const size_t n_out = (size_t)hb->n_tokens * G * pt->pc.row_dim;
	const size_t n_h = (size_t)hb->n_tokens * n_hist;
	float *oc = fvec(n_out);
	uint16_t *og = calloc(n_out, 2);
	struct dbatch dc, dg;
	int32_t *hc, *hg;
	void *doc, *dog;
	size_t bad = 0;

	assert_non_null(og);
	db_up(cpu, hb, &dc);
	db_up(gpu, hb, &dg);
	hc = up_bytes(cpu, hist, n_h * 4);
	hg = up_bytes(gpu, hist, n_h * 4);
	doc = balloc(cpu, n_out * 4);
	dog = balloc(gpu, n_out * 2);
	cpu->ops->ple_embed(cpu, doc, &pt->pc, hc, &dc.b);
	gpu->ops->ple_embed(gpu, dog, &pt->pg, hg, &dg.b);
	get_f32(cpu, oc, doc, n_out);
	assert_int_equal(gpu->ops->download(gpu, og, dog, n_out * 2), 0);
	for (size_t i = 0; i < n_out; i++)
		bad += og[i] != sm70_f32_to_f16(oc[i]);
	printf("  %-52s %zu of %zu f16 values differ\n", what, bad, n_out);
	assert_true(bad == 0);
	bfree(cpu, doc), bfree(gpu, dog), bfree(cpu, hc), bfree(gpu, hg);
	db_free(cpu, &dc), db_free(gpu, &dg);
	free(oc), free(og);
}

/*
 * ple_embed over both steps' batches (histories from the CPU's ngram_hist, EOS and -1 in
 * them), for f32, f16 and bf16 tables: rows of 64 (16-byte loads), 13 and 8 (one value a
 * lane; 8 with N = 2), and 64 at an unaligned table address.
 */
static void test_ple_embed(void **state)
{
	const enum sm70_dtype dts[] = { SM70_DTYPE_F32, SM70_DTYPE_F16, SM70_DTYPE_BF16 };
	const struct { int N, hpn, row_dim, elem_off; } cfg[] = {
		{ 3, 2, 64, 0 }, { 3, 2, 13, 0 }, { 4, 2, 64, 1 }, { 2, 3, 8, 0 }
	};

	for (size_t ci = 0; ci < sizeof(cfg) / sizeof(cfg[0]); ci++) {
		for (int di = 0; di < 3; di++) {
			const int N = cfg[ci].N, n_hist = N - 1;
			int32_t *ctx = calloc((size_t)(N_SLOTS + 1) * n_hist, 4);
			struct ple_table pt;

			assert_non_null(ctx);
			for (int i = 0; i < (N_SLOTS + 1) * n_hist; i++)
				ctx[i] = rnd_int(VOCAB);
			table_new(&pt, N, cfg[ci].hpn, cfg[ci].row_dim, dts[di], cfg[ci].elem_off);
			for (int step = 0; step < 2; step++) {
				struct hbatch hb;
				int32_t *hist;
				char what[96];

				step_batch(&hb, step, 1);
				hist = calloc((size_t)hb.n_tokens * n_hist, 4);
				assert_non_null(hist);
				hist_once(cpu, &hb, n_hist, ctx, hist);
				snprintf(what, sizeof(what), "ple_embed %s N=%d hpn=%d dim=%d%s "
					 "step %d", sm70_dtype_name(dts[di]), N, cfg[ci].hpn,
					 cfg[ci].row_dim, cfg[ci].elem_off ? " unaligned" : "",
					 step + 1);
				embed_compare(&pt, &hb, hist, what);
				free(hist);
			}
			table_free(&pt);
			free(ctx);
		}
	}
}

/* ---- ple_conv ------------------------------------------------------------------------------ */

struct conv_shape {
	int C, K, dil;
};

/* One ple_conv call on be: x and state (host, as floats) in and out. */
static void conv_once(struct sm70_backend *be, const struct conv_shape *cs,
		      const struct hbatch *hb, const float *w, const float *gv, const float *gvn,
		      float *x, float *st)
{
	const size_t cnt = (size_t)hb->n_tokens * cs->C;
	const size_t n_st = (size_t)(N_SLOTS + 1) * (cs->K - 1) * cs->dil * cs->C;
	struct sm70_dconv dc = { NULL, NULL, cs->C, cs->K, cs->dil };
	struct dbatch d;
	void *dgv, *dgvn;
	float *dx;

	db_up(be, hb, &d);
	dgv = up_act(be, gv, cnt);
	dgvn = up_act(be, gvn, cnt);
	dx = up_bytes(be, x, cnt * 4);
	dc.w = up_bytes(be, w, (size_t)cs->C * cs->K * 4);
	dc.state = up_act(be, st, n_st ? n_st : 1);
	be->ops->ple_conv(be, dx, dgv, dgvn, &dc, &d.b);
	get_f32(be, x, dx, cnt);
	if (n_st)
		get_act(be, st, dc.state, n_st);
	bfree(be, dc.state), bfree(be, (void *)dc.w), bfree(be, dx), bfree(be, dgvn);
	bfree(be, dgv);
	db_free(be, &d);
}

/* Two steps of one shape (shaped or not) from the slots st0 on both backends. */
static void conv_case(const struct conv_shape *cs, int shaped, const float *st0)
{
	const size_t n_st = (size_t)(N_SLOTS + 1) * (cs->K - 1) * cs->dil * cs->C;
	float *sc = fvec(n_st ? n_st : 1), *sg = fvec(n_st ? n_st : 1);
	float *w = fvec((size_t)cs->C * cs->K);

	memcpy(sc, st0, n_st * 4);
	memcpy(sg, st0, n_st * 4);
	for (size_t i = 0; i < (size_t)cs->C * cs->K; i++)
		w[i] = rnd(0.7f);
	for (int step = 0; step < 2; step++) {
		struct hbatch hb;
		float *gv, *gvn, *xc, *xg;
		size_t cnt;
		char tag[64], what[96];

		step_batch(&hb, step, shaped);
		snprintf(tag, sizeof(tag), "ple_conv C=%d k=%d dil=%d %s step %d", cs->C, cs->K,
			 cs->dil, shaped ? "shaped" : "unshaped", step + 1);
		cnt = (size_t)hb.n_tokens * cs->C;
		gv = rvec16(cnt, 1.0f);
		gvn = rvec16(cnt, 2.0f);
		xc = rvec16(cnt, 3.0f);
		xg = fvec(cnt);
		memcpy(xg, xc, cnt * 4);
		conv_once(cpu, cs, &hb, w, gv, gvn, xc, sc);
		conv_once(gpu, cs, &hb, w, gv, gvn, xg, sg);
		snprintf(what, sizeof(what), "%s x", tag);
		compare_values(what, xg, xc, cnt, TOL_F32_X);
		if (n_st) {
			snprintf(what, sizeof(what), "%s state", tag);
			compare_values(what, sg, sc, n_st, TOL_EXACT);
		}
		free(gv), free(gvn), free(xc), free(xg);
	}
	free(sc), free(sg), free(w);
}

/*
 * Channel counts within one block, across blocks and up to 32768; windows (k - 1) *
 * dilation of 9 (wider than some chunks), 64, 1 and none; from dirty slots; batches with
 * the decode/chunk shape and without it (the slot update then goes token by token).
 */
static void test_ple_conv(void **state)
{
	const struct conv_shape shapes[] = { { 77, 4, 3 }, { 300, 4, 3 }, { 512, 5, 16 },
					     { 32768, 4, 2 }, { 40, 2, 1 }, { 9, 1, 1 } };

	for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++) {
		const struct conv_shape *cs = &shapes[si];
		const size_t n_st = (size_t)(N_SLOTS + 1) * (cs->K - 1) * cs->dil * cs->C;
		float *st0 = rvec16(n_st ? n_st : 1, 4.0f);

		conv_case(cs, 1, st0);
		/* the widest shape runs shaped only (its rows are 128 kB of x each) */
		if (cs->C <= 4096)
			conv_case(cs, 0, st0);
		free(st0);
	}
}

/*
 * hc_mix (the fused one-token mixer) against the composed ops on the CPU and on the GPU:
 * the real scale (4 streams of 2048, rank 320) with and without inject rows, the fixture's
 * (64, rank 16) and 3 streams of 24; and the shapes it must refuse, with nothing queued.
 */
static void mix_composed(struct sm70_backend *be, void *y, float *inj, void *xn, float *f,
			 void *z, void *u, const float *x, const float *norm,
			 const struct sm70_weight *mix, const struct sm70_weight *up, int S, int D,
			 int rank)
{
	be->ops->group_rmsnorm(be, xn, x, 1, norm, 1, S, D, 1e-6f);
	be->ops->matmul(be, f, 1, xn, mix, 1);
	be->ops->hc_gates(be, z, inj, f, mix->rows, 1, rank, S);
	be->ops->matmul(be, u, 0, z, up, 1);
	be->ops->hc_combine(be, y, u, xn, 1, S, D);
}

static void test_hc_mix(void **state)
{
	const int shapes[][4] = { { 4, 2048, 320, 1 }, { 4, 2048, 320, 0 }, { 4, 64, 16, 1 },
				  { 3, 24, 8, 1 } }; /* S, dim, rank, inject */

	for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++) {
		const int S = shapes[si][0], D = shapes[si][1], R = shapes[si][2];
		const int inj_on = shapes[si][3], W = R + (inj_on ? S : 0), C = S * D;
		float *x = fvec(C), *nw = fvec(C), *mv = fvec((size_t)W * C), *uv = fvec((size_t)C * R);
		float *yc = fvec(D), *yk = fvec(D), *yg = fvec(D), *ic = fvec(S), *ig = fvec(S);
		struct sm70_weight mc, mg, uc, ug;
		struct sm70_backend *be[2] = { cpu, gpu };
		void *dy[3], *dxn[3], *dz[3], *du[3];
		float *dx[2], *dn[2], *df[3], *di[3], *part;
		char what[96];

		for (int k = 0; k < C; k++) {
			x[k] = rnd(1.0f) * (k / D % 2 ? 8.0f : 0.05f);
			nw[k] = 1.0f + rnd(0.5f);
		}
		for (size_t k = 0; k < (size_t)W * C; k++)
			mv[k] = rnd(1.0f) / sqrtf((float)C) * 4.0f;
		for (size_t k = 0; k < (size_t)C * R; k++)
			uv[k] = rnd(1.0f) / sqrtf((float)R) * 4.0f;
		mc = mk_weight(cpu, mv, W, C), mg = mk_weight(gpu, mv, W, C);
		uc = mk_weight(cpu, uv, C, R), ug = mk_weight(gpu, uv, C, R);
		for (int b = 0; b < 3; b++) {
			struct sm70_backend *k = b ? gpu : cpu;

			dy[b] = balloc(k, (size_t)D * act_size(k));
			dxn[b] = balloc(k, (size_t)C * act_size(k));
			dz[b] = balloc(k, (size_t)R * act_size(k));
			du[b] = balloc(k, (size_t)C * act_size(k));
			df[b] = balloc(k, (size_t)W * 4);
			di[b] = balloc(k, (size_t)S * 4);
			if (b < 2) {
				dx[b] = up_bytes(be[b], x, (size_t)C * 4);
				dn[b] = up_bytes(be[b], nw, (size_t)C * 4);
			}
		}
		part = balloc(gpu, (size_t)S * W * 4);
		/* [0] CPU composed, [1] GPU composed, [2] GPU fused */
		mix_composed(cpu, dy[0], inj_on ? di[0] : NULL, dxn[0], df[0], dz[0], du[0], dx[0],
			     dn[0], &mc, &uc, S, D, R);
		mix_composed(gpu, dy[1], inj_on ? di[1] : NULL, dxn[1], df[1], dz[1], du[1], dx[1],
			     dn[1], &mg, &ug, S, D, R);
		assert_int_equal(gpu->ops->hc_mix(gpu, dy[2], inj_on ? di[2] : NULL, dxn[2], part,
						  dx[1], dn[1], &mg, &ug, S, D, R, 1e-6f), 0);
		get_act(cpu, yc, dy[0], D);
		get_act(gpu, yk, dy[1], D);
		get_act(gpu, yg, dy[2], D);
		snprintf(what, sizeof(what), "hc_mix y S=%d dim=%d rank=%d%s vs CPU", S, D, R,
			 inj_on ? "" : " (no inj)");
		compare_values(what, yg, yc, D, TOL_MIX);
		snprintf(what, sizeof(what), "  the same vs the GPU's composed ops");
		compare_values(what, yg, yk, D, TOL_MIX);
		if (inj_on) {
			get_f32(cpu, ic, di[0], S);
			get_f32(gpu, ig, di[2], S);
			compare_values("  inject gates vs CPU", ig, ic, S, TOL_MIX_INJ_CPU);
			get_f32(gpu, ic, di[1], S);
			compare_values("  inject gates vs the GPU's composed ops", ig, ic, S,
				       TOL_MIX_INJ);
		}
		{
			float *xc = fvec(C), *xg = fvec(C);

			get_act(cpu, xc, dxn[0], C);
			get_act(gpu, xg, dxn[2], C);
			compare_values("  xn vs CPU", xg, xc, C, TOL_F16_OUT);
			free(xc), free(xg);
		}
		for (int b = 0; b < 3; b++) {
			struct sm70_backend *k = b ? gpu : cpu;

			bfree(k, dy[b]), bfree(k, dxn[b]), bfree(k, dz[b]), bfree(k, du[b]);
			bfree(k, df[b]), bfree(k, di[b]);
			if (b < 2)
				bfree(be[b], dx[b]), bfree(be[b], dn[b]);
		}
		bfree(gpu, part);
		bfree(cpu, mc.data), bfree(gpu, mg.data), bfree(cpu, uc.data), bfree(gpu, ug.data);
		free(x), free(nw), free(mv), free(uv), free(yc), free(yk), free(yg), free(ic);
		free(ig);
	}
	{
		/* refused shapes: 5 streams, a dim not a multiple of 8, f32 weights */
		struct sm70_weight m5 = { SM70_DTYPE_F16, 5 * 16 + 5, 5 * 16, NULL, NULL, 0, NULL };
		struct sm70_weight u5 = { SM70_DTYPE_F16, 5 * 16, 16, NULL, NULL, 0, NULL };
		struct sm70_weight m3 = { SM70_DTYPE_F16, 16 + 3, 3 * 12, NULL, NULL, 0, NULL };
		struct sm70_weight u3 = { SM70_DTYPE_F16, 3 * 12, 16, NULL, NULL, 0, NULL };
		struct sm70_weight mf = { SM70_DTYPE_F32, 16 + 4, 4 * 16, NULL, NULL, 0, NULL };
		struct sm70_weight uf = { SM70_DTYPE_F16, 4 * 16, 16, NULL, NULL, 0, NULL };

		assert_int_equal(gpu->ops->hc_mix(gpu, NULL, NULL, NULL, NULL, NULL, NULL, &m5, &u5,
						  5, 16, 16, 1e-6f), -ENOTSUP);
		assert_int_equal(gpu->ops->hc_mix(gpu, NULL, NULL, NULL, NULL, NULL, NULL, &m3, &u3,
						  3, 12, 16, 1e-6f), -ENOTSUP);
		assert_int_equal(gpu->ops->hc_mix(gpu, NULL, NULL, NULL, NULL, NULL, NULL, &mf, &uf,
						  4, 16, 16, 1e-6f), -ENOTSUP);
		printf("  hc_mix refuses 5 streams, dim 12, f32 weights: -ENOTSUP\n");
	}
}

/* ---- graph replay ---------------------------------------------------------------------------- */

/* One qwen4_exp decode step's new ops on persistent GPU buffers, as a captured step would
 * run them. */
struct hc_decode {
	struct hbatch hb;
	struct dbatch d;
	struct ple_table pt;
	struct sm70_dconv dc;
	int B, S, H, rank, n_hist, row_dim;
	int32_t *ctx, *hist;
	float *streams, *f, *inj, *w;
	void *xn, *z, *u, *y, *emb, *gv;
};

static void dec_ops(struct hc_decode *e)
{
	const struct sm70_backend_ops *op = gpu->ops;
	const int C = e->S * e->H;

	op->group_rmsnorm(gpu, e->xn, e->streams, 1, e->w, e->B, e->S, e->H, 1e-6f);
	op->hc_gates(gpu, e->z, e->inj, e->f, e->rank + e->S, e->B, e->rank, e->S);
	op->hc_combine(gpu, e->y, e->xn, e->xn, e->B, e->S, e->H);
	op->ngram_hist(gpu, e->hist, e->ctx, e->n_hist, &e->d.b);
	/* the row gather on the side stream, as the engine queues it */
	op->side_begin(gpu);
	op->ple_embed(gpu, e->emb, &e->pt.pg, e->hist, &e->d.b);
	op->side_end(gpu);
	op->side_join(gpu);
	/* the embedding's rows ((N - 1) * hpn * row_dim = S * H values) as k and v of the
	 * gate */
	op->ple_gate(gpu, e->gv, e->emb, e->xn, e->emb, C, e->B, e->S, e->H);
	op->ple_conv(gpu, e->streams, e->gv, e->gv, &e->dc, &e->d.b);
	op->hc_inject(gpu, e->streams, e->y, e->inj, e->B, e->S, e->H);
}

/* Everything the step writes, as floats (ints converted). */
static float *dec_result(struct hc_decode *e, size_t *n)
{
	const int C = e->S * e->H;
	const size_t n_x = (size_t)e->B * C, n_ctx = (size_t)(N_SLOTS + 1) * e->n_hist;
	const size_t n_st = (size_t)(N_SLOTS + 1) * (e->dc.k - 1) * e->dc.dilation * C;
	const size_t n_h = (size_t)e->B * e->n_hist;
	float *r = fvec(2 * n_x + n_st + n_ctx + n_h);
	int32_t *iv = calloc(n_ctx + n_h, 4);

	assert_non_null(iv);
	get_f32(gpu, r, e->streams, n_x);
	get_act(gpu, r + n_x, e->emb, n_x);
	get_act(gpu, r + 2 * n_x, e->dc.state, n_st);
	get_i32(gpu, iv, e->ctx, n_ctx);
	get_i32(gpu, iv + n_ctx, e->hist, n_h);
	for (size_t i = 0; i < n_ctx + n_h; i++)
		r[2 * n_x + n_st + i] = (float)iv[i];
	free(iv);
	*n = 2 * n_x + n_st + n_ctx + n_h;
	return r;
}

/* Puts the step's state and inputs back to s0 (streams, state, ctx) and ids. */
static void dec_reset(struct hc_decode *e, const float *x0, const float *st0, const int32_t *ctx0)
{
	const int C = e->S * e->H;
	const size_t n_st = (size_t)(N_SLOTS + 1) * (e->dc.k - 1) * e->dc.dilation * C;

	assert_int_equal(gpu->ops->upload(gpu, e->streams, x0, (size_t)e->B * C * 4), 0);
	set_act(gpu, e->dc.state, st0, n_st);
	assert_int_equal(gpu->ops->upload(gpu, e->ctx, ctx0, (size_t)(N_SLOTS + 1) * e->n_hist * 4),
			 0);
	assert_int_equal(gpu->ops->upload(gpu, e->d.buf, e->hb.ids, (size_t)e->B * 4), 0);
	assert_int_equal(gpu->ops->sync(gpu), 0);
}

static void test_graph_replay(void **state)
{
	struct hc_decode e;
	const struct seqspec seqs[] = { { 2, 33, 1 }, { 0, 0, 1 }, { 3, 1000, 1 }, { 1, 7, 1 } };
	const int C = 4 * 64;
	float *x0, *st0, *r_eager, *r_graph;
	int32_t *ctx0;
	size_t n_st, n;
	void *graph = NULL;

	memset(&e, 0, sizeof(e));
	e.B = 4, e.S = 4, e.H = 64, e.rank = 16, e.n_hist = 2, e.row_dim = 64;
	hb_make_ids(&e.hb, seqs, e.B, 0, 1);
	db_up(gpu, &e.hb, &e.d);
	table_new(&e.pt, 3, 2, e.row_dim, SM70_DTYPE_F16, 0);
	e.dc = (struct sm70_dconv){ NULL, NULL, C, 4, 3 };
	n_st = (size_t)(N_SLOTS + 1) * 9 * C;
	{
		float *w = fvec((size_t)C * 4), *f = rvec16((size_t)e.B * (e.rank + e.S), 4.0f);
		float *nw = fvec((size_t)C);

		for (int i = 0; i < C * 4; i++)
			w[i] = rnd(0.7f);
		for (int i = 0; i < C; i++)
			nw[i] = 1.0f + rnd(0.3f);
		e.dc.w = up_bytes(gpu, w, (size_t)C * 16);
		e.f = up_bytes(gpu, f, (size_t)e.B * (e.rank + e.S) * 4);
		e.w = up_bytes(gpu, nw, (size_t)C * 4);
		free(w), free(f), free(nw);
	}
	x0 = rvec16((size_t)e.B * C, 2.0f);
	st0 = rvec16(n_st, 2.0f);
	ctx0 = calloc((size_t)(N_SLOTS + 1) * e.n_hist, 4);
	assert_non_null(ctx0);
	for (int i = 0; i < (N_SLOTS + 1) * e.n_hist; i++)
		ctx0[i] = rnd_int(VOCAB);
	e.streams = up_bytes(gpu, x0, (size_t)e.B * C * 4);
	e.dc.state = up_act(gpu, st0, n_st);
	e.ctx = up_bytes(gpu, ctx0, (size_t)(N_SLOTS + 1) * e.n_hist * 4);
	e.hist = balloc(gpu, (size_t)e.B * e.n_hist * 4);
	e.inj = balloc(gpu, (size_t)e.B * e.S * 4);
	e.xn = balloc(gpu, (size_t)e.B * C * act_size(gpu));
	e.z = balloc(gpu, (size_t)e.B * e.rank * act_size(gpu));
	e.y = balloc(gpu, (size_t)e.B * e.H * act_size(gpu));
	e.emb = balloc(gpu, (size_t)e.B * C * act_size(gpu));
	e.gv = balloc(gpu, (size_t)e.B * C * act_size(gpu));

	/* eager, then the same from the same state through a captured graph */
	dec_ops(&e);
	r_eager = dec_result(&e, &n);
	dec_reset(&e, x0, st0, ctx0);
	assert_int_equal(gpu->ops->graph_begin(gpu), 0);
	dec_ops(&e);
	assert_int_equal(gpu->ops->graph_end(gpu, &graph), 0);
	assert_int_equal(gpu->ops->graph_launch(gpu, graph), 0);
	r_graph = dec_result(&e, &n);
	compare_values("hc + PLE decode B4: graph vs eager", r_graph, r_eager, n, TOL_EXACT);
	free(r_graph), free(r_eager);

	/* new token ids in the same buffer: a replay hashes them */
	for (int t = 0; t < e.B; t++)
		e.hb.ids[t] = rnd_int(VOCAB);
	dec_reset(&e, x0, st0, ctx0);
	dec_ops(&e);
	r_eager = dec_result(&e, &n);
	dec_reset(&e, x0, st0, ctx0);
	assert_int_equal(gpu->ops->graph_launch(gpu, graph), 0);
	r_graph = dec_result(&e, &n);
	compare_values("hc + PLE decode B4, new ids: graph replay vs eager", r_graph, r_eager, n,
		       TOL_EXACT);
	gpu->ops->graph_destroy(gpu, graph);
	free(r_graph), free(r_eager), free(x0), free(st0), free(ctx0);
	bfree(gpu, e.gv), bfree(gpu, e.emb), bfree(gpu, e.y), bfree(gpu, e.z), bfree(gpu, e.xn);
	bfree(gpu, e.inj), bfree(gpu, e.hist), bfree(gpu, e.ctx), bfree(gpu, e.dc.state);
	bfree(gpu, e.streams), bfree(gpu, e.w), bfree(gpu, e.f), bfree(gpu, (void *)e.dc.w);
	table_free(&e.pt);
	db_free(gpu, &e.d);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_group_rmsnorm),
		cmocka_unit_test(test_hc_gates),
		cmocka_unit_test(test_hc_combine_inject),
		cmocka_unit_test(test_hc_mix),
		cmocka_unit_test(test_ple_gate),
		cmocka_unit_test(test_ngram_hist),
		cmocka_unit_test(test_ple_embed),
		cmocka_unit_test(test_ple_conv),
		cmocka_unit_test(test_graph_replay),
	};

	return gpu_test_main("cuda_hc_ple", tests, sizeof(tests) / sizeof(tests[0]), &gpu,
			     &gpu_ref, &cpu);
}
