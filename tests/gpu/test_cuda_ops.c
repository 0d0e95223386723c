/* test_cuda_ops - every CUDA backend op against its CPU twin, and fast paths against their
 * reference switches (SM70_MATMUL / SM70_ATTENTION=reference). */
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

#define GPU_TEST_SEED 0x5eedc0da1234ULL
#include "tests/gpu/gpu_test.h"

/*
 * Errors are reported as max |got - ref| and that divided by max |ref| over the tensor
 * ("rel"); tolerances bound rel. Outputs stored as f16 on the GPU carry up to 2^-11
 * relative rounding on top of fp32 differences, so f16 outputs get a few 1e-3; f32
 * outputs from the same f16 inputs differ only by summation order.
 */
#define TOL_EXACT 0.0
#define TOL_F16_OUT 1.5e-3 /* rounding to f16 (<= 4.9e-4 of the max) plus fp32 noise */
#define TOL_F32_DOT 3e-5   /* fp32 dots of up to 4096 terms in a different order */
#define TOL_ROPE 2e-3      /* f16 out; angles up to 4000 rad through two libms */
#define TOL_ATTN 1.5e-3    /* f16 out; online vs two-pass softmax, fp32 */

static struct sm70_backend *gpu, *gpu_ref, *cpu;

/* ---- helpers ----------------------------------------------------------------------- */

/* ---- tests ------------------------------------------------------------------------- */

static void test_basics(void **state)
{
	const size_t n = (10u << 20) / 4 + 77; /* > two 4 MiB staging slots */
	float *a = fvec(n), *b = fvec(n), *keep = fvec(n);
	void *d;

	assert_int_equal(gpu->act_dtype, SM70_DTYPE_F16);
	assert_int_equal(gpu->weight_dtype, SM70_DTYPE_F16);
	assert_true(gpu->kv_dtypes & (1u << SM70_DTYPE_F16));
	assert_true(gpu->kv_dtypes & (1u << SM70_DTYPE_F8E4M3));
	/* the pairs kv_pair.h builds, and not the one it does not */
	assert_true(sm70_backend_reads_kv(gpu, SM70_DTYPE_F8E4M3, SM70_DTYPE_F16));
	assert_true(sm70_backend_reads_kv(gpu, SM70_DTYPE_F8E4M3, SM70_DTYPE_F8E4M3));
	assert_true(sm70_backend_reads_kv(gpu, SM70_DTYPE_F16, SM70_DTYPE_F16));
	assert_false(sm70_backend_reads_kv(gpu, SM70_DTYPE_F16, SM70_DTYPE_F8E4M3));
	assert_int_equal(gpu->kv_dtype_default, SM70_DTYPE_F16);
	for (size_t i = 0; i < n; i++)
		a[i] = rnd(1.0f);
	memcpy(keep, a, n * sizeof(float));
	d = up_bytes(gpu, a, n * sizeof(float));
	/* the caller may reuse its buffer as soon as upload returns */
	memset(a, 0xff, n * sizeof(float));
	get_f32(gpu, b, d, n);
	assert_memory_equal(keep, b, n * sizeof(float));
	assert_int_equal(gpu->ops->sync(gpu), 0);
	printf("  upload/download round trip of %zu bytes: equal\n", n * sizeof(float));
	bfree(gpu, d);
	free(a);
	free(b);
	free(keep);
}

static void test_embed(void **state)
{
	const int dims[] = { 64, 130, 4096 }, ns[] = { 1, 3, 17 }, vocab = 300;

	for (int di = 0; di < 3; di++) {
		for (int ni = 0; ni < 3; ni++) {
			int dim = dims[di], n = ns[ni];
			float *tab = rvec16((size_t)vocab * dim, 1.0f);
			int32_t *ids = malloc(n * sizeof(*ids));
			float *gc = fvec((size_t)n * dim), *gg = fvec((size_t)n * dim);
			struct sm70_weight tc = mk_weight(cpu, tab, vocab, dim);
			struct sm70_weight tg = mk_weight(gpu, tab, vocab, dim);
			void *ic, *ig;
			float *xc = balloc(cpu, (size_t)n * dim * 4);
			float *xg = balloc(gpu, (size_t)n * dim * 4);
			char what[64];

			for (int i = 0; i < n; i++)
				ids[i] = rnd_int(vocab);
			if (n > 1)
				ids[n - 1] = vocab; /* out of range: a zero row on both */
			ic = up_bytes(cpu, ids, n * sizeof(*ids));
			ig = up_bytes(gpu, ids, n * sizeof(*ids));
			cpu->ops->embed(cpu, xc, &tc, ic, n);
			gpu->ops->embed(gpu, xg, &tg, ig, n);
			get_f32(cpu, gc, xc, (size_t)n * dim);
			get_f32(gpu, gg, xg, (size_t)n * dim);
			snprintf(what, sizeof(what), "embed f16 n=%d dim=%d", n, dim);
			/* f16 -> f32 is exact: bitwise equal */
			compare_values(what, gg, gc, (size_t)n * dim, TOL_EXACT);
			bfree(cpu, ic), bfree(gpu, ig), bfree(cpu, xc), bfree(gpu, xg);
			bfree(cpu, tc.data), bfree(gpu, tg.data);
			free(tab), free(ids), free(gc), free(gg);
		}
	}
	{
		/* a bf16 table (a checkpoint dtype kept as is) */
		const int dim = 130, n = 5;
		uint16_t *h = malloc((size_t)vocab * dim * 2);
		float *ref = fvec((size_t)n * dim), *got = fvec((size_t)n * dim);
		int32_t ids[5] = { 0, 299, 7, 150, 42 };
		struct sm70_weight tg = { .dtype = SM70_DTYPE_BF16, .rows = vocab, .cols = dim };
		float *xg = balloc(gpu, (size_t)n * dim * 4);
		void *ig = up_bytes(gpu, ids, sizeof(ids));

		for (size_t i = 0; i < (size_t)vocab * dim; i++)
			h[i] = sm70_f32_to_bf16(rnd(2.0f));
		tg.data = up_bytes(gpu, h, (size_t)vocab * dim * 2);
		for (int i = 0; i < n; i++)
			for (int k = 0; k < dim; k++)
				ref[i * dim + k] = sm70_bf16_to_f32(h[(size_t)ids[i] * dim + k]);
		gpu->ops->embed(gpu, xg, &tg, ig, n);
		get_f32(gpu, got, xg, (size_t)n * dim);
		compare_values("embed bf16 n=5 dim=130", got, ref, (size_t)n * dim, TOL_EXACT);
		bfree(gpu, tg.data), bfree(gpu, xg), bfree(gpu, ig);
		free(h), free(ref), free(got);
	}
}

static void test_add_rmsnorm(void **state)
{
	/* 64, 4096, 5120: the vector kernel with 1, 4 and 5 chunks a thread (8192: its
	 * widest); 130 and 8196: the plain one */
	const int dims[] = { 64, 130, 4096, 5120, 8192, 8196 }, ns[] = { 1, 3, 16, 17, 33 };

	for (int di = 0; di < 6; di++) {
		for (int ni = 0; ni < 5; ni++) {
			for (int mode = 0; mode < 3; mode++) { /* 0 no delta, 1 delta, 2 y==delta */
				int dim = dims[di], n = ns[ni];
				size_t cnt = (size_t)n * dim;
				float *r = fvec(cnt), *d = rvec16(cnt, 2.0f), *w = fvec(dim);
				float *yc = fvec(cnt), *yg = fvec(cnt);
				float *rc = fvec(cnt), *rg = fvec(cnt);
				float *wc, *wg, *resc, *resg;
				void *dc = NULL, *dg = NULL, *ybc, *ybg;
				char what[80];

				for (size_t i = 0; i < cnt; i++)
					r[i] = rnd(3.0f);
				for (int k = 0; k < dim; k++)
					w[k] = 1.0f + rnd(0.5f);
				wc = up_bytes(cpu, w, dim * 4);
				wg = up_bytes(gpu, w, dim * 4);
				resc = up_bytes(cpu, r, cnt * 4);
				resg = up_bytes(gpu, r, cnt * 4);
				if (mode) {
					dc = up_act(cpu, d, cnt);
					dg = up_act(gpu, d, cnt);
				}
				ybc = mode == 2 ? dc : balloc(cpu, cnt * 4);
				ybg = mode == 2 ? dg : balloc(gpu, cnt * 2);
				cpu->ops->add_rmsnorm(cpu, ybc, resc, dc, wc, n, dim, 1e-6f);
				gpu->ops->add_rmsnorm(gpu, ybg, resg, dg, wg, n, dim, 1e-6f);
				get_act(cpu, yc, ybc, cnt);
				get_act(gpu, yg, ybg, cnt);
				get_f32(cpu, rc, resc, cnt);
				get_f32(gpu, rg, resg, cnt);
				snprintf(what, sizeof(what),
					 "add_rmsnorm resid n=%d dim=%d mode=%d", n, dim, mode);
				/* the same single f32 add on both: bitwise */
				compare_values(what, rg, rc, cnt, TOL_EXACT);
				snprintf(what, sizeof(what), "add_rmsnorm y n=%d dim=%d mode=%d", n,
					 dim, mode);
				compare_values(what, yg, yc, cnt, TOL_F16_OUT);
				if (mode != 2) {
					bfree(cpu, ybc);
					bfree(gpu, ybg);
				}
				if (mode) {
					bfree(cpu, dc);
					bfree(gpu, dg);
				}
				bfree(cpu, wc), bfree(gpu, wg), bfree(cpu, resc), bfree(gpu, resg);
				free(r), free(d), free(w), free(yc), free(yg), free(rc), free(rg);
			}
		}
	}
}

static void test_add(void **state)
{
	const size_t cnt = 3 * 4096 + 5;
	float *r = fvec(cnt), *x = rvec16(cnt, 1.0f), *rc = fvec(cnt), *rg = fvec(cnt);
	float *resc, *resg;
	void *xc, *xg;

	for (size_t i = 0; i < cnt; i++)
		r[i] = rnd(4.0f);
	resc = up_bytes(cpu, r, cnt * 4);
	resg = up_bytes(gpu, r, cnt * 4);
	xc = up_act(cpu, x, cnt);
	xg = up_act(gpu, x, cnt);
	cpu->ops->add(cpu, resc, xc, cnt);
	gpu->ops->add(gpu, resg, xg, cnt);
	get_f32(cpu, rc, resc, cnt);
	get_f32(gpu, rg, resg, cnt);
	compare_values("add count=12293", rg, rc, cnt, TOL_EXACT);
	bfree(cpu, resc), bfree(gpu, resg), bfree(cpu, xc), bfree(gpu, xg);
	free(r), free(x), free(rc), free(rg);
}

/* One matmul shape on cpu, gpu and gpu_ref; both y dtypes. */
static void matmul_case(int rows, int cols, int n)
{
	size_t nx = (size_t)n * cols, ny = (size_t)n * rows;
	float *wv = rvec16((size_t)rows * cols, 1.0f / sqrtf((float)cols) * 1.7f);
	float *x = rvec16(nx, 1.0f);
	float *yc = fvec(ny), *yg = fvec(ny), *yr = fvec(ny);
	struct sm70_weight wc = mk_weight(cpu, wv, rows, cols);
	struct sm70_weight wg = mk_weight(gpu, wv, rows, cols);
	struct sm70_weight wr = mk_weight(gpu_ref, wv, rows, cols);
	void *xc = up_act(cpu, x, nx), *xg = up_act(gpu, x, nx), *xr = up_act(gpu_ref, x, nx);
	void *oc = balloc(cpu, ny * 4), *og = balloc(gpu, ny * 4), *orf = balloc(gpu_ref, ny * 4);
	char what[96];

	cpu->ops->matmul(cpu, oc, 1, xc, &wc, n);
	get_f32(cpu, yc, oc, ny);
	for (int f32 = 0; f32 < 2; f32++) {
		const char *path = n <= 16 ? "gemv" : "cublas";

		gpu->ops->matmul(gpu, og, f32, xg, &wg, n);
		gpu_ref->ops->matmul(gpu_ref, orf, f32, xr, &wr, n);
		if (f32) {
			get_f32(gpu, yg, og, ny);
			get_f32(gpu_ref, yr, orf, ny);
		} else {
			get_act(gpu, yg, og, ny);
			get_act(gpu_ref, yr, orf, ny);
		}
		snprintf(what, sizeof(what), "matmul %s %dx%d n=%d y=%s vs cpu", path, rows, cols,
			 n, f32 ? "f32" : "f16");
		compare_values(what, yg, yc, ny, f32 ? TOL_F32_DOT : TOL_F16_OUT);
		snprintf(what, sizeof(what), "matmul reference %dx%d n=%d y=%s vs cpu", rows, cols,
			 n, f32 ? "f32" : "f16");
		compare_values(what, yr, yc, ny, f32 ? TOL_F32_DOT : TOL_F16_OUT);
		snprintf(what, sizeof(what), "matmul %s vs reference %dx%d n=%d y=%s", path, rows,
			 cols, n, f32 ? "f32" : "f16");
		compare_values(what, yg, yr, ny, f32 ? TOL_F32_DOT : TOL_F16_OUT);
	}
	bfree(cpu, wc.data), bfree(gpu, wg.data), bfree(gpu_ref, wr.data);
	bfree(cpu, xc), bfree(gpu, xg), bfree(gpu_ref, xr);
	bfree(cpu, oc), bfree(gpu, og), bfree(gpu_ref, orf);
	free(wv), free(x), free(yc), free(yg), free(yr);
}

static void test_matmul(void **state)
{
	const int shapes[][2] = { { 64, 64 }, { 130, 130 }, { 4096, 64 }, { 130, 4096 },
				  { 1000, 4096 }, { 77, 136 } };
	const int ns[] = { 1, 3, 8, 16, 17, 33 };

	/* the tensor-core skinny path: every x row group, a partial last 64-column step
	 * (520) and a partial last row tile (33), and bands wide enough for two tiles a
	 * warp (the 20000-row case); and long rows in grids a little over one wave of
	 * blocks, which split their columns on an H200 (5000 x 8192: two ways, a partial
	 * last tile; 5120 x 16400: four ways, a partial last step) */
	const int tc_shapes[][2] = { { 512, 4096 }, { 4096, 1024 }, { 33, 520 },
				     { 20000, 256 }, { 5000, 8192 }, { 5120, 16400 } };
	const int tc_ns[] = { 2, 4, 5, 12, 16 };

	for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++)
		for (int ni = 0; ni < 6; ni++)
			matmul_case(shapes[s][0], shapes[s][1], ns[ni]);
	for (size_t s = 0; s < sizeof(tc_shapes) / sizeof(tc_shapes[0]); s++)
		for (int ni = 0; ni < 5; ni++)
			matmul_case(tc_shapes[s][0], tc_shapes[s][1], tc_ns[ni]);
}

static void test_head_norm_rope(void **state)
{
	const int hds[] = { 64, 128, 256 }, ns[] = { 1, 3, 17 };

	for (int hi = 0; hi < 3; hi++) {
		for (int ni = 0; ni < 3; ni++) {
			for (int variant = 0; variant < 3; variant++) {
				/* 0: norm + full rope, 1: no norm, 2: norm + half rotary */
				const int D = hds[hi], n = ns[ni], hq = 6, hkv = 2;
				const int ld = (hq + 2 * hkv) * D, rot = variant == 2 ? D / 2 : D;
				size_t cnt = (size_t)n * ld;
				float *v = rvec16(cnt, 2.0f), *w = fvec(D);
				float *oc = fvec(cnt), *og = fvec(cnt);
				int32_t *pos = malloc(n * sizeof(*pos));
				void *qc, *qg, *pc, *pg;
				float *wc = NULL, *wg = NULL;
				char what[96];

				for (int k = 0; k < D; k++)
					w[k] = 1.0f + rnd(0.3f);
				for (int i = 0; i < n; i++)
					pos[i] = i == 0 ? 4000 : rnd_int(4096);
				qc = up_act(cpu, v, cnt);
				qg = up_act(gpu, v, cnt);
				pc = up_bytes(cpu, pos, n * 4);
				pg = up_bytes(gpu, pos, n * 4);
				if (variant != 1) {
					wc = up_bytes(cpu, w, D * 4);
					wg = up_bytes(gpu, w, D * 4);
				}
				/* q heads, then the k heads that follow them in the qkv row */
				cpu->ops->head_norm_rope(cpu, qc, ld, n, hq, D, wc, 1e-6f, pc, rot,
							 1e6);
				gpu->ops->head_norm_rope(gpu, qg, ld, n, hq, D, wg, 1e-6f, pg, rot,
							 1e6);
				cpu->ops->head_norm_rope(cpu, (float *)qc + hq * D, ld, n, hkv,
							 D, wc, 1e-6f, pc, rot, 1e6);
				gpu->ops->head_norm_rope(gpu, (uint16_t *)qg + hq * D, ld, n,
							 hkv, D, wg, 1e-6f, pg, rot, 1e6);
				get_act(cpu, oc, qc, cnt);
				get_act(gpu, og, qg, cnt);
				snprintf(what, sizeof(what), "head_norm_rope D=%d n=%d %s", D, n,
					 variant == 0 ? "norm+rope" :
					 variant == 1 ? "rope only" : "norm+half rot");
				/* the whole row: the V part must come back untouched */
				compare_values(what, og, oc, cnt, TOL_ROPE);
				if (wc) {
					bfree(cpu, wc);
					bfree(gpu, wg);
				}
				bfree(cpu, qc), bfree(gpu, qg), bfree(cpu, pc), bfree(gpu, pg);
				free(v), free(w), free(oc), free(og), free(pos);
			}
		}
	}
}

static void test_kv_write(void **state)
{
	for (int kvm = 0; kvm < GPU_KV_MODES; kvm++) {
		const int D = 128, hkv = 2, hq = 4, n = 17, ld = (hq + 2 * hkv) * D;
		struct sm70_kv_layout lay = kv_mode_layout(kvm, 8, 16, hkv, D);
		size_t row = (size_t)hkv * D, slots_n = (size_t)lay.n_blocks * lay.block_size;
		size_t kbytes = slots_n * row * (kv_mode_k_fp8(kvm) ? 1 : 2);
		size_t vbytes = slots_n * row * (kv_mode_v_fp8(kvm) ? 1 : 2);
		size_t cnt = (size_t)n * ld;
		float *v = rvec16(cnt, 3.0f);
		int32_t slots[17];
		struct sm70_kv_layer kc = { NULL, NULL, 0.02f, 0.015f }, kg = kc;
		uint8_t *bc = malloc(kbytes > vbytes ? kbytes : vbytes);
		uint8_t *bg = malloc(kbytes > vbytes ? kbytes : vbytes);
		void *xc, *xg, *sc, *sg;
		size_t diff = 0;

		/* big values saturate at 448 * scale; a few exact ties too */
		v[5] = 1000.0f;
		v[6] = -1000.0f;
		v[ld + 3] = 0.0f;
		for (int i = 0; i < n; i++)
			slots[i] = (i * 37 + 5) % (lay.n_blocks * lay.block_size);
		slots[3] = -1;                                 /* padding row: skipped */
		slots[4] = lay.n_blocks * lay.block_size + 2; /* out of range: skipped */
		kc.k = balloc(cpu, kbytes), kc.v = balloc(cpu, vbytes);
		kg.k = balloc(gpu, kbytes), kg.v = balloc(gpu, vbytes);
		xc = up_act(cpu, v, cnt);
		xg = up_act(gpu, v, cnt);
		sc = up_bytes(cpu, slots, sizeof(slots));
		sg = up_bytes(gpu, slots, sizeof(slots));
		cpu->ops->kv_write(cpu, &kc, &lay, (float *)xc + hq * D,
				   (float *)xc + (hq + hkv) * D, ld, sc, n);
		gpu->ops->kv_write(gpu, &kg, &lay, (uint16_t *)xg + hq * D,
				   (uint16_t *)xg + (hq + hkv) * D, ld, sg, n);
		for (int kv = 0; kv < 2; kv++) {
			size_t bytes = kv ? vbytes : kbytes;

			assert_int_equal(cpu->ops->download(cpu, bc, kv ? kc.v : kc.k, bytes), 0);
			assert_int_equal(gpu->ops->download(gpu, bg, kv ? kg.v : kg.k, bytes), 0);
			for (size_t i = 0; i < bytes; i++)
				diff += bc[i] != bg[i];
		}
		/* the same encoding on both sides: the caches must be byte-identical */
		printf("  kv_write %-7s n=17 (2 skipped rows): %zu of %zu cache bytes differ "
		       "(tol 0)\n", kv_mode_name(kvm), diff, kbytes + vbytes);
		assert_int_equal(diff, 0);
		bfree(cpu, kc.k), bfree(cpu, kc.v), bfree(gpu, kg.k), bfree(gpu, kg.v);
		bfree(cpu, xc), bfree(gpu, xg), bfree(cpu, sc), bfree(gpu, sg);
		free(v), free(bc), free(bg);
	}
	{
		/* every f32 bit pattern class through the FP8 encoder: a row of specials */
		const int D = 64, n = 1;
		struct sm70_kv_layout lay = { SM70_DTYPE_F8E4M3, 1, 16, 1, D, SM70_KV_V_AS_K };
		struct sm70_kv_layer kg = { NULL, NULL, 1.0f, 1.0f };
		float v[64];
		uint16_t h[64];
		uint8_t got[64], want[64];
		int32_t slot = 0;
		void *xg, *sg;

		for (int i = 0; i < D; i++) {
			/* spans subnormals, ties, the top of the range and beyond */
			float x = ldexpf(1.0f + (float)(i % 8) / 16.0f, i / 3 - 12);

			v[i] = (i & 1) ? -x : x;
			h[i] = sm70_f32_to_f16(v[i]);
			want[i] = sm70_f32_to_e4m3(sm70_f16_to_f32(h[i]));
		}
		kg.k = balloc(gpu, 16 * D), kg.v = balloc(gpu, 16 * D);
		xg = up_bytes(gpu, h, sizeof(h));
		sg = up_bytes(gpu, &slot, 4);
		gpu->ops->kv_write(gpu, &kg, &lay, xg, xg, D, sg, n);
		assert_int_equal(gpu->ops->download(gpu, got, kg.k, D), 0);
		printf("  kv_write fp8 encoder over 64 magnitudes 2^-12..2^9.5: %s\n",
		       memcmp(got, want, D) ? "MISMATCH" : "bitwise equal to common/dtype.c");
		assert_memory_equal(got, want, D);
		bfree(gpu, kg.k), bfree(gpu, kg.v), bfree(gpu, xg), bfree(gpu, sg);
	}
}

/* A sequence of an attention batch: len positions cached; chunk 0 means one decode token
 * at len - 1, chunk > 0 a prefill chunk of that many tokens at positions len - chunk ..
 * len - 1 (so len - chunk positions were cached before it). */
struct attn_seq {
	int len;
	int chunk;
};

/*
 * One attention batch over seqs[0..n_seqs) in a shuffled block table, all positions' K/V
 * already in the cache (the same bytes on every backend), laid out as the engine does:
 * the decodes first (one token each), then the chunks in order, with n_decode, n_chunks
 * and chunk_first / chunk_len (device and host copies) filled in so that backends with a
 * prefill path take it. The GPU (fast and reference) is compared with the CPU twin. KV in
 * mode kvm (gpu_test.h's GPU_KV_MODES).
 */
static void attention_batch_bound(int D, int group, int kvm, const struct attn_seq *seqs,
				  int n_seqs, int bound)
{
	const int n_kv = 2, n_heads = n_kv * group, bs = 16;
	const int q_ld = (n_heads + 2 * n_kv) * D;
	const char *mode = kv_mode_name(kvm);
	struct sm70_kv_layout lay = kv_mode_layout(kvm, 0, bs, n_kv, D);
	struct sm70_kv_layer kl[3] = { { NULL, NULL, 0.011f, 0.009f } };
	struct sm70_backend *bes[3] = { cpu, gpu, gpu_ref };
	int max_blocks = 1, total_blocks = 0, n_tok = 0, max_pos = 0, n_decode = 0, n_chunks = 0;
	int32_t *bt, *perm, *tok_pos, *tok_seq, *tok_slot, *chunk_first, *chunk_len;
	uint8_t *kbytes, *vbytes;
	float *q, *out[3];
	size_t kc_bytes, vc_bytes, row = (size_t)n_kv * D, nq, nout, n_el;
	void *dq[3], *dout[3], *dpos[3], *dseq[3], *dslot[3], *dbt[3], *dcf[3], *dcl[3];
	struct sm70_batch b[3];
	char what[160];

	for (int s = 0; s < n_seqs; s++) {
		int nb = (seqs[s].len + bs - 1) / bs;

		total_blocks += nb;
		if (nb > max_blocks)
			max_blocks = nb;
		n_tok += seqs[s].chunk > 0 ? seqs[s].chunk : 1;
	}
	lay.n_blocks = total_blocks;
	tok_pos = malloc(n_tok * sizeof(*tok_pos));
	tok_seq = malloc(n_tok * sizeof(*tok_seq));
	tok_slot = malloc(n_tok * sizeof(*tok_slot));
	chunk_first = calloc(n_seqs, sizeof(*chunk_first));
	chunk_len = calloc(n_seqs, sizeof(*chunk_len));
	/* A shuffled pool: sequence blocks land anywhere in the cache. */
	perm = malloc(total_blocks * sizeof(*perm));
	bt = calloc((size_t)n_seqs * max_blocks, sizeof(*bt));
	assert_true(tok_pos && tok_seq && tok_slot && chunk_first && chunk_len && perm && bt);
	for (int i = 0; i < total_blocks; i++)
		perm[i] = i;
	for (int i = total_blocks - 1; i > 0; i--) {
		int j = rnd_int(i + 1), t = perm[i];

		perm[i] = perm[j];
		perm[j] = t;
	}
	for (int s = 0, k = 0; s < n_seqs; s++)
		for (int j = 0; j < (seqs[s].len + bs - 1) / bs; j++)
			bt[s * max_blocks + j] = perm[k++];
	/* decodes first, then the chunks */
	n_tok = 0;
	for (int s = 0; s < n_seqs; s++) {
		if (seqs[s].chunk > 0)
			continue;
		tok_seq[n_tok] = s;
		tok_pos[n_tok++] = seqs[s].len - 1;
	}
	n_decode = n_tok;
	for (int s = 0; s < n_seqs; s++) {
		if (seqs[s].chunk <= 0)
			continue;
		assert_true(seqs[s].chunk <= seqs[s].len);
		chunk_first[n_chunks] = n_tok;
		chunk_len[n_chunks++] = seqs[s].chunk;
		for (int p = seqs[s].len - seqs[s].chunk; p < seqs[s].len; p++) {
			tok_seq[n_tok] = s;
			tok_pos[n_tok++] = p;
		}
	}
	for (int t = 0; t < n_tok; t++) {
		int s = tok_seq[t], p = tok_pos[t];

		tok_slot[t] = bt[s * max_blocks + p / bs] * bs + p % bs;
		if (p + 1 > max_pos)
			max_pos = p + 1;
	}
	if (bound > max_pos)
		max_pos = bound; /* a bound past every position, as a graph's context bucket */

	/* Random cache bytes, K and V each in its dtype (FP8 as x / scale). */
	n_el = (size_t)total_blocks * bs * row;
	kc_bytes = n_el * (kv_mode_k_fp8(kvm) ? 1 : 2);
	vc_bytes = n_el * (kv_mode_v_fp8(kvm) ? 1 : 2);
	kbytes = malloc(kc_bytes);
	vbytes = malloc(vc_bytes);
	assert_true(kbytes && vbytes);
	kv_fill_random(kbytes, n_el, kv_mode_k_fp8(kvm), kl[0].k_scale);
	kv_fill_random(vbytes, n_el, kv_mode_v_fp8(kvm), kl[0].v_scale);
	nq = (size_t)n_tok * q_ld;
	nout = (size_t)n_tok * n_heads * D;
	/* q a little larger than unit so that the softmax is not flat */
	q = rvec16(nq, 2.5f);

	for (int i = 0; i < 3; i++) {
		struct sm70_backend *be = bes[i];

		kl[i] = kl[0];
		kl[i].k = up_bytes(be, kbytes, kc_bytes);
		kl[i].v = up_bytes(be, vbytes, vc_bytes);
		dq[i] = up_act(be, q, nq);
		dout[i] = balloc(be, nout * 4);
		dpos[i] = up_bytes(be, tok_pos, n_tok * 4);
		dseq[i] = up_bytes(be, tok_seq, n_tok * 4);
		dslot[i] = up_bytes(be, tok_slot, n_tok * 4);
		dbt[i] = up_bytes(be, bt, (size_t)n_seqs * max_blocks * 4);
		dcf[i] = up_bytes(be, chunk_first, (size_t)n_seqs * 4);
		dcl[i] = up_bytes(be, chunk_len, (size_t)n_seqs * 4);
		b[i] = (struct sm70_batch){ .n_tokens = n_tok, .n_seqs = n_seqs,
					    .max_blocks = max_blocks, .max_pos = max_pos,
					    .tok_ids = NULL, .tok_pos = dpos[i], .tok_seq = dseq[i],
					    .tok_slot = dslot[i], .block_tables = dbt[i],
					    .n_out = 0, .out_rows = NULL, .n_decode = n_decode,
					    .n_chunks = n_chunks, .chunk_first = dcf[i],
					    .chunk_len = dcl[i], .chunk_first_host = chunk_first,
					    .chunk_len_host = chunk_len };
		be->ops->attention(be, dout[i], dq[i], q_ld, &kl[i], &lay, &b[i], n_heads,
				   1.0f / sqrtf((float)D));
		out[i] = fvec(nout);
		get_act(be, out[i], dout[i], nout);
	}
	snprintf(what, sizeof(what), "attention D=%d G=%d %s tokens=%d (%d dec, %d chunks) "
		 "max_pos=%d vs cpu", D, group, mode, n_tok, n_decode, n_chunks, max_pos);
	compare_values(what, out[1], out[0], nout, TOL_ATTN);
	snprintf(what, sizeof(what), "attention reference D=%d G=%d %s vs cpu", D, group, mode);
	compare_values(what, out[2], out[0], nout, TOL_ATTN);
	snprintf(what, sizeof(what), "attention fast vs reference D=%d G=%d %s", D, group, mode);
	compare_values(what, out[1], out[2], nout, TOL_ATTN);

	for (int i = 0; i < 3; i++) {
		struct sm70_backend *be = bes[i];

		bfree(be, kl[i].k), bfree(be, kl[i].v), bfree(be, dq[i]), bfree(be, dout[i]);
		bfree(be, dpos[i]), bfree(be, dseq[i]), bfree(be, dslot[i]), bfree(be, dbt[i]);
		bfree(be, dcf[i]), bfree(be, dcl[i]);
		free(out[i]);
	}
	free(perm), free(bt), free(kbytes), free(vbytes), free(q);
	free(tok_pos), free(tok_seq), free(tok_slot), free(chunk_first), free(chunk_len);
}

static void attention_batch(int D, int group, int kvm, const struct attn_seq *seqs,
			    int n_seqs)
{
	attention_batch_bound(D, group, kvm, seqs, n_seqs, 0);
}

/*
 * 4 sequences of lengths {1, 37, 300, ctx}: decodes at the last position of sequences 0,
 * 1 and 3, and sequence 2 a decode too when chunk is 0, else a prefill chunk of `chunk`
 * tokens ending at its last position.
 */
static void attention_case(int D, int group, int kvm, int ctx, int chunk)
{
	const struct attn_seq seqs[4] = { { 1, 0 }, { 37, 0 }, { 300, chunk }, { ctx, 0 } };

	attention_batch(D, group, kvm, seqs, 4);
}

static void test_attention(void **state)
{
	const int hds[] = { 32, 64, 128, 256 }, groups[] = { 1, 2, 6 };

	for (int hi = 0; hi < 4; hi++)
		for (int gi = 0; gi < 3; gi++)
			for (int kvm = 0; kvm < GPU_KV_MODES; kvm++) {
				/* decodes only: few blocks, long context -> split-KV */
				attention_case(hds[hi], groups[gi], kvm, 2048, 0);
				/* a 150-token prefill chunk beside the decodes */
				attention_case(hds[hi], groups[gi], kvm, 1000, 150);
			}
	/* a context that is not a multiple of anything */
	attention_case(128, 6, 0, 1237, 33);
	attention_case(64, 2, 1, 17, 3);
	attention_case(64, 2, 2, 17, 3);
	/* prefill chunks beside split decodes; GQA 8 */
	attention_case(256, 6, 1, 600, 40);
	attention_case(256, 6, 2, 600, 40);
	attention_case(64, 8, 0, 700, 30);
	/* long contexts: many splits, every cache mode, the decode shape that is benched */
	for (int kvm = 0; kvm < GPU_KV_MODES; kvm++)
		attention_case(256, 6, kvm, 16384, 0);
	/* max_pos a power-of-two bucket far past the positions (graph replays): the splits
	 * cut each token's own positions; one token alone and a batch of mixed lengths */
	{
		const struct attn_seq one[] = { { 16400, 0 } };
		const struct attn_seq mixed[] = { { 1, 0 }, { 37, 0 }, { 3000, 0 }, { 9000, 0 } };

		for (int kvm = 0; kvm < GPU_KV_MODES; kvm++) {
			attention_batch_bound(128, 4, kvm, one, 1, 32768);
			attention_batch_bound(128, 4, kvm, mixed, 4, 16384);
			attention_batch_bound(64, 2, kvm, mixed, 4, 65536);
		}
	}
}

/* The prefill path: decodes beside chunks of 1, 17, 64, 200, 513 and 100 tokens, fresh
 * prompts and chunks that start mid-context (300 positions cached, then 100), contexts up
 * to 2048, over every head_dim and GQA width it takes; then chunks with no decodes, and a
 * head_dim it does not take (the decode kernels run the chunks). */
static void test_attention_prefill(void **state)
{
	const struct attn_seq mixed[] = { { 1, 0 },     { 700, 0 },     { 50, 1 },
					  { 17, 17 },   { 130, 64 },    { 2048, 200 },
					  { 513, 513 }, { 400, 100 },   { 2048, 0 } };
	const struct attn_seq chunks_only[] = { { 300, 300 }, { 1000, 37 }, { 64, 64 } };
	const struct attn_seq one_token[] = { { 5, 0 }, { 1, 1 } };
	const int n_mixed = sizeof(mixed) / sizeof(mixed[0]);
	const int hds[] = { 64, 128, 256 }, groups[] = { 1, 2, 6, 8 };

	for (int hi = 0; hi < 3; hi++)
		for (int gi = 0; gi < 4; gi++)
			for (int kvm = 0; kvm < GPU_KV_MODES; kvm++)
				attention_batch(hds[hi], groups[gi], kvm, mixed, n_mixed);
	attention_batch(128, 6, 0, chunks_only, 3);
	attention_batch(256, 8, 1, chunks_only, 3);
	attention_batch(128, 8, 2, chunks_only, 3);
	attention_batch(64, 1, 0, one_token, 2);
	attention_batch(32, 6, 0, mixed, n_mixed);
}

static void test_silu_mul(void **state)
{
	const int inters[] = { 64, 130, 4096 }, ns[] = { 1, 17 };

	for (int ii = 0; ii < 3; ii++) {
		for (int ni = 0; ni < 2; ni++) {
			int inter = inters[ii], n = ns[ni];
			size_t cin = (size_t)n * 2 * inter, cout = (size_t)n * inter;
			float *gu = rvec16(cin, 6.0f), *oc = fvec(cout), *og = fvec(cout);
			void *ic = up_act(cpu, gu, cin), *ig = up_act(gpu, gu, cin);
			void *bc = balloc(cpu, cout * 4), *bg = balloc(gpu, cout * 2);
			char what[64];

			cpu->ops->silu_mul(cpu, bc, ic, n, inter);
			gpu->ops->silu_mul(gpu, bg, ig, n, inter);
			get_act(cpu, oc, bc, cout);
			get_act(gpu, og, bg, cout);
			snprintf(what, sizeof(what), "silu_mul n=%d inter=%d", n, inter);
			compare_values(what, og, oc, cout, TOL_F16_OUT);
			bfree(cpu, ic), bfree(gpu, ig), bfree(cpu, bc), bfree(gpu, bg);
			free(gu), free(oc), free(og);
		}
	}
}

static void test_gather_rows(void **state)
{
	const int dim = 130, n_src = 33, n = 5;
	int32_t rows[5] = { 32, 0, 17, 17, 5 };
	float *src = rvec16((size_t)n_src * dim, 1.0f);
	float *oc = fvec((size_t)n * dim), *og = fvec((size_t)n * dim);

	for (int is_f32 = 0; is_f32 < 2; is_f32++) {
		void *sc = is_f32 ? up_bytes(cpu, src, (size_t)n_src * dim * 4) :
				    up_act(cpu, src, (size_t)n_src * dim);
		void *sg = is_f32 ? up_bytes(gpu, src, (size_t)n_src * dim * 4) :
				    up_act(gpu, src, (size_t)n_src * dim);
		void *rc = up_bytes(cpu, rows, sizeof(rows));
		void *rg = up_bytes(gpu, rows, sizeof(rows));
		void *dc = balloc(cpu, (size_t)n * dim * 4), *dg = balloc(gpu, (size_t)n * dim * 4);

		cpu->ops->gather_rows(cpu, dc, sc, rc, n, dim, is_f32);
		gpu->ops->gather_rows(gpu, dg, sg, rg, n, dim, is_f32);
		if (is_f32) {
			get_f32(cpu, oc, dc, (size_t)n * dim);
			get_f32(gpu, og, dg, (size_t)n * dim);
		} else {
			get_act(cpu, oc, dc, (size_t)n * dim);
			get_act(gpu, og, dg, (size_t)n * dim);
		}
		compare_values(is_f32 ? "gather_rows f32 n=5 dim=130" :
					"gather_rows f16 n=5 dim=130",
			       og, oc, (size_t)n * dim, TOL_EXACT);
		bfree(cpu, sc), bfree(gpu, sg), bfree(cpu, rc), bfree(gpu, rg);
		bfree(cpu, dc), bfree(gpu, dg);
	}
	assert_int_equal(gpu->ops->sync(gpu), 0);
	free(src), free(oc), free(og);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_basics),
		cmocka_unit_test(test_embed),
		cmocka_unit_test(test_add_rmsnorm),
		cmocka_unit_test(test_add),
		cmocka_unit_test(test_matmul),
		cmocka_unit_test(test_head_norm_rope),
		cmocka_unit_test(test_kv_write),
		cmocka_unit_test(test_attention),
		cmocka_unit_test(test_attention_prefill),
		cmocka_unit_test(test_silu_mul),
		cmocka_unit_test(test_gather_rows),
	};

	return gpu_test_main("test_cuda_ops", tests, sizeof(tests) / sizeof(tests[0]), &gpu,
			     &gpu_ref, &cpu);
}
