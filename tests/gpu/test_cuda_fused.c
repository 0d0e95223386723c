/* test_cuda_fused - the fused CUDA ops (qk_norm_rope_kv, silu_matmul, add_rmsnorm_matmul,
 * matmul_glu) against the CPU backend's separate ops and against the CUDA backend's own
 * unfused ops. */
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

#define GPU_TEST_SEED 0xf05edc0de5eedULL
#include "tests/gpu/gpu_test.h"

/*
 * Against the CPU (fp32 throughout) errors are max |got - ref| over max |ref| ("rel"), as in
 * test_cuda_ops.c. Against the unfused CUDA ops, which do the same arithmetic, values are
 * compared as codes: the ordered distance between f16 (or FP8) bit patterns, in ulps; the
 * fused ops are built to give 0, the assertion allows 1.
 */
#define TOL_ROPE 2e-3     /* f16 out; angles up to 4000 rad through two libms */
#define TOL_SILU_MM 2e-3  /* x rounded to f16 on the GPU only (2^-11 each, mostly averaging
			   * out), y rounded to f16 (<= 4.9e-4 of the max), fp32 order */
#define TOL_F16_OUT 1.5e-3 /* the same f16 x, sums in another order, y rounded to f16 */
#define TOL_ULP 1         /* fused vs unfused CUDA: codes at most this far apart */

static struct sm70_backend *gpu, *gpu_ref, *cpu;

/* ---- helpers ----------------------------------------------------------------------- */


static void get_bytes(struct sm70_backend *be, void *dst, const void *src, size_t bytes)
{
	assert_int_equal(be->ops->download(be, dst, src, bytes), 0);
}

/* n raw f16 codes of a CUDA buffer (caller frees) */
static uint16_t *get_f16_codes(struct sm70_backend *be, const void *src, size_t n)
{
	uint16_t *h = malloc((n ? n : 1) * sizeof(*h));

	assert_non_null(h);
	get_bytes(be, h, src, n * sizeof(*h));
	return h;
}

/* f16 and FP8 codes on one ordered integer line (sign-magnitude to two's complement), so
 * that neighbouring values are one apart and +0 equals -0 */
static long ord16(uint16_t h)
{
	long m = h & 0x7fff;

	return (h & 0x8000) ? -m : m;
}

static long ord8(uint8_t v)
{
	long m = v & 0x7f;

	return (v & 0x80) ? -m : m;
}

/* Prints and checks that codes got and ref (f16 when !fp8, else FP8 bytes) are at most tol
 * apart, with how many differ at all. */
static void compare_codes(const char *what, const void *got, const void *ref, size_t n, int fp8,
			  long tol)
{
	const uint8_t *g8 = got, *r8 = ref;
	const uint16_t *g16 = got, *r16 = ref;
	long max = 0;
	size_t n_diff = 0, worst = 0;

	for (size_t i = 0; i < n; i++) {
		long d = labs(fp8 ? ord8(g8[i]) - ord8(r8[i]) : ord16(g16[i]) - ord16(r16[i]));

		n_diff += d != 0;
		if (d > max) {
			max = d;
			worst = i;
		}
	}
	printf("  %-52s max %ld %s apart, %zu of %zu differ (tol %ld)\n", what, max,
	       fp8 ? "fp8 codes" : "f16 ulps", n_diff, n, tol);
	if (max > tol)
		printf("  worst at %zu: got 0x%x ref 0x%x\n", worst,
		       (unsigned)(fp8 ? g8[worst] : g16[worst]),
		       (unsigned)(fp8 ? r8[worst] : r16[worst]));
	assert_true(max <= tol);
}

/* The value of cache element i (f16 or FP8 times scale). */
static float cache_val(const uint8_t *c, size_t i, int fp8, float scale)
{
	uint16_t h;

	if (fp8)
		return sm70_e4m3_to_f32(c[i]) * scale;
	memcpy(&h, c + 2 * i, 2);
	return sm70_f16_to_f32(h);
}

/*
 * A cache written from GPU values against one written from CPU values that agree within
 * tol_rel (of the largest): each element must be within tol_rel * max |ref| or one code of
 * the cache dtype away (rounding to f16 or FP8 may land on either side of a tie point).
 */
static void compare_cache(const char *what, const uint8_t *got, const uint8_t *ref, size_t n,
			  int fp8, float scale, double tol_rel)
{
	double max_ref = 0.0, max_abs = 0.0, slack;
	long max_codes = 0;
	size_t n_diff = 0, n_bad = 0;

	for (size_t i = 0; i < n; i++)
		max_ref = fmax(max_ref, fabs((double)cache_val(ref, i, fp8, scale)));
	slack = tol_rel * max_ref;
	for (size_t i = 0; i < n; i++) {
		double a = fabs((double)cache_val(got, i, fp8, scale) -
				(double)cache_val(ref, i, fp8, scale));
		long d;

		if (fp8) {
			d = labs(ord8(got[i]) - ord8(ref[i]));
		} else {
			uint16_t g, r;

			memcpy(&g, got + 2 * i, 2);
			memcpy(&r, ref + 2 * i, 2);
			d = labs(ord16(g) - ord16(r));
		}
		n_diff += d != 0;
		max_codes = d > max_codes ? d : max_codes;
		max_abs = a > max_abs ? a : max_abs;
		n_bad += !(a <= slack || d <= 1);
	}
	printf("  %-52s max abs %.3g  rel %.3g  max %ld codes apart, %zu of %zu differ "
	       "(tol: 1 code or rel %.1g)\n", what, max_abs, max_ref > 0 ? max_abs / max_ref : 0.0,
	       max_codes, n_diff, n, tol_rel);
	assert_int_equal(n_bad, 0);
}

/* ---- qk_norm_rope_kv --------------------------------------------------------------- */

struct qk_case {
	int D;     /* head_dim */
	int n_kv;  /* KV heads */
	int group; /* q heads per KV head */
	int rot;   /* rot_dim */
	int n;     /* rows */
	int kvm;   /* KV mode (gpu_test.h): 0 f16, 1 fp8-all, 2 fp8 (K FP8, V f16) */
	int bs;    /* block_size */
	int norm;  /* q_norm / k_norm given, else NULL */
	int pad;   /* elements past the heads in each row (ld - heads * D) */
};

/* What each backend holds for one case. */
struct qk_bufs {
	void *qkv, *qn, *kn, *pos, *slots;
	struct sm70_kv_layer kv;
};

static void qk_bufs_make(struct qk_bufs *b, struct sm70_backend *be, const float *qkv,
			 size_t cnt, const float *qn, const float *kn, int D, const int32_t *pos,
			 const int32_t *slots, int n, size_t k_bytes, size_t v_bytes,
			 float k_scale, float v_scale)
{
	b->qkv = up_act(be, qkv, cnt);
	b->qn = qn ? up_bytes(be, qn, (size_t)D * sizeof(float)) : NULL;
	b->kn = kn ? up_bytes(be, kn, (size_t)D * sizeof(float)) : NULL;
	b->pos = up_bytes(be, pos, (size_t)n * sizeof(*pos));
	b->slots = up_bytes(be, slots, (size_t)n * sizeof(*slots));
	/* buf_alloc zeroes: slots no row writes stay zero on every backend */
	b->kv = (struct sm70_kv_layer){ balloc(be, k_bytes), balloc(be, v_bytes), k_scale,
					v_scale };
}

static void qk_bufs_free(struct qk_bufs *b, struct sm70_backend *be)
{
	bfree(be, b->kv.v), bfree(be, b->kv.k), bfree(be, b->slots), bfree(be, b->pos);
	if (b->kn)
		bfree(be, b->kn);
	if (b->qn)
		bfree(be, b->qn);
	bfree(be, b->qkv);
}

/* The unfused sequence the model runs with SM70_FUSED=0: q heads, k heads, then the cache. */
static void qk_unfused(struct sm70_backend *be, struct qk_bufs *b, const struct qk_case *t,
		       int ld, const struct sm70_kv_layout *lay, double theta, float eps)
{
	const size_t esz = be->act_dtype == SM70_DTYPE_F32 ? 4 : 2;
	const int hq = t->n_kv * t->group;
	char *base = b->qkv;

	be->ops->head_norm_rope(be, base, ld, t->n, hq, t->D, b->qn, eps, b->pos, t->rot, theta);
	be->ops->head_norm_rope(be, base + (size_t)hq * t->D * esz, ld, t->n, t->n_kv, t->D,
				b->kn, eps, b->pos, t->rot, theta);
	be->ops->kv_write(be, &b->kv, lay, base + (size_t)hq * t->D * esz,
			  base + (size_t)(hq + t->n_kv) * t->D * esz, ld, b->slots, t->n);
}

/*
 * One case: the CPU's separate ops, the CUDA backend's separate ops and its fused op on the
 * same inputs. v_special, when non-NULL, replaces every row's V heads (n_kv * D values).
 */
static void qk_case_run(const struct qk_case *t, const float *v_special, float v_scale)
{
	const int hq = t->n_kv * t->group, row = t->n_kv * t->D;
	const int ld = (hq + 2 * t->n_kv) * t->D + t->pad;
	const double theta = 1e6;
	const float eps = 1e-6f, k_scale = 0.02f;
	const int n_blocks = (2 * t->n + t->bs - 1) / t->bs + 1;
	const int n_slots = n_blocks * t->bs;
	struct sm70_kv_layout lay = kv_mode_layout(t->kvm, n_blocks, t->bs, t->n_kv, t->D);
	const int kf8 = kv_mode_k_fp8(t->kvm), vf8 = kv_mode_v_fp8(t->kvm);
	const size_t cnt = (size_t)t->n * ld, cache_vals = (size_t)n_slots * row;
	const size_t cache_bytes[2] = { cache_vals * (kf8 ? 1 : 2), cache_vals * (vf8 ? 1 : 2) };
	float *qkv = rvec16(cnt, 2.0f), *qn = NULL, *kn = NULL;
	float *oc = fvec(cnt), *of = fvec(cnt);
	int32_t *pos = malloc((size_t)t->n * sizeof(*pos));
	int32_t *slots = malloc((size_t)t->n * sizeof(*slots));
	int32_t *perm = malloc((size_t)n_slots * sizeof(*perm));
	uint8_t *cache[3][2]; /* [cpu, unfused, fused][k, v] */
	uint16_t *qf, *qu;
	struct qk_bufs bc, bu, bf;
	char what[160], tag[96];

	assert_true(pos && slots && perm);
	if (t->norm) {
		qn = fvec(t->D);
		kn = fvec(t->D);
		for (int k = 0; k < t->D; k++) {
			qn[k] = 1.0f + rnd(0.3f);
			kn[k] = 1.0f + rnd(0.3f);
		}
	}
	for (int i = 0; i < t->n; i++) {
		pos[i] = i == 0 ? 4000 : rnd_int(4096);
		if (v_special)
			memcpy(qkv + (size_t)i * ld + (size_t)(hq + t->n_kv) * t->D, v_special,
			       (size_t)row * sizeof(float));
	}
	/* V values beyond the FP8 range saturate; a zero and a tie-free small value too */
	if (!v_special) {
		qkv[(size_t)(hq + t->n_kv) * t->D] = 1000.0f;
		qkv[(size_t)(hq + t->n_kv) * t->D + 1] = -1000.0f;
		qkv[(size_t)(hq + t->n_kv) * t->D + 2] = 0.0f;
	}
	/* scattered slots: a random injection into the cache, with a padding row (-1) and
	 * one past the cache, which both ops skip */
	for (int i = 0; i < n_slots; i++)
		perm[i] = i;
	for (int i = n_slots - 1; i > 0; i--) {
		int j = rnd_int(i + 1), x = perm[i];

		perm[i] = perm[j];
		perm[j] = x;
	}
	for (int i = 0; i < t->n; i++)
		slots[i] = perm[i];
	if (t->n >= 3) {
		slots[1] = -1;
		slots[2] = n_slots + 3;
	}

	qk_bufs_make(&bc, cpu, qkv, cnt, qn, kn, t->D, pos, slots, t->n, cache_bytes[0],
		     cache_bytes[1], k_scale, v_scale);
	qk_bufs_make(&bu, gpu, qkv, cnt, qn, kn, t->D, pos, slots, t->n, cache_bytes[0],
		     cache_bytes[1], k_scale, v_scale);
	qk_bufs_make(&bf, gpu, qkv, cnt, qn, kn, t->D, pos, slots, t->n, cache_bytes[0],
		     cache_bytes[1], k_scale, v_scale);
	qk_unfused(cpu, &bc, t, ld, &lay, theta, eps);
	qk_unfused(gpu, &bu, t, ld, &lay, theta, eps);
	gpu->ops->qk_norm_rope_kv(gpu, bf.qkv, ld, t->n, hq, t->n_kv, t->D, bf.qn, bf.kn, eps,
				  bf.pos, t->rot, theta, &bf.kv, &lay, bf.slots);

	get_act(cpu, oc, bc.qkv, cnt);
	get_act(gpu, of, bf.qkv, cnt);
	qf = get_f16_codes(gpu, bf.qkv, cnt);
	qu = get_f16_codes(gpu, bu.qkv, cnt);
	for (int s = 0; s < 3; s++) {
		struct qk_bufs *b = s == 0 ? &bc : s == 1 ? &bu : &bf;
		struct sm70_backend *be = s == 0 ? cpu : gpu;

		for (int kv = 0; kv < 2; kv++) {
			cache[s][kv] = malloc(cache_bytes[kv]);
			assert_non_null(cache[s][kv]);
			get_bytes(be, cache[s][kv], kv ? b->kv.v : b->kv.k, cache_bytes[kv]);
		}
	}

	snprintf(tag, sizeof(tag), "D=%d hq=%d hkv=%d rot=%d n=%d %s bs=%d%s%s", t->D, hq,
		 t->n_kv, t->rot, t->n, kv_mode_name(t->kvm), t->bs, t->norm ? "" : " no-norm",
		 t->pad ? " padded" : "");
	printf(" qk_norm_rope_kv %s\n", tag);
	/* q and k heads against the CPU's rotation; V and the padding must come back as
	 * they went in (split, so that the saturating V values do not set the scale) */
	{
		const size_t nqk = (size_t)(hq + t->n_kv) * t->D, nrest = (size_t)ld - nqk;
		float *qkf = fvec(t->n * nqk), *qkc = fvec(t->n * nqk);
		float *rf = fvec(t->n * nrest), *rc = fvec(t->n * nrest);

		for (int i = 0; i < t->n; i++) {
			memcpy(qkf + i * nqk, of + (size_t)i * ld, nqk * sizeof(float));
			memcpy(qkc + i * nqk, oc + (size_t)i * ld, nqk * sizeof(float));
			memcpy(rf + i * nrest, of + (size_t)i * ld + nqk, nrest * sizeof(float));
			memcpy(rc + i * nrest, oc + (size_t)i * ld + nqk, nrest * sizeof(float));
		}
		compare_values("q, k heads fused vs cpu", qkf, qkc, t->n * nqk, TOL_ROPE);
		compare_values("v heads + padding fused vs cpu (untouched)", rf, rc, t->n * nrest,
			       0.0);
		free(rc), free(rf), free(qkc), free(qkf);
	}
	compare_codes("qkv fused vs unfused cuda", qf, qu, cnt, 0, TOL_ULP);
	compare_codes("K cache fused vs unfused cuda", cache[2][0], cache[1][0], cache_vals,
		      kf8, TOL_ULP);
	compare_codes("V cache fused vs unfused cuda", cache[2][1], cache[1][1], cache_vals,
		      vf8, TOL_ULP);
	compare_cache("K cache fused vs cpu", cache[2][0], cache[0][0], cache_vals, kf8,
		      k_scale, TOL_ROPE);
	/* V is the input copied (f16) or encoded from the same f16 value: byte-identical */
	snprintf(what, sizeof(what), "V cache fused vs cpu (%zu bytes, tol 0 differing)",
		 cache_bytes[1]);
	compare_codes(what, cache[2][1], cache[0][1], cache_vals, vf8, 0);

	for (int s = 0; s < 3; s++)
		free(cache[s][0]), free(cache[s][1]);
	qk_bufs_free(&bf, gpu), qk_bufs_free(&bu, gpu), qk_bufs_free(&bc, cpu);
	free(qu), free(qf), free(perm), free(slots), free(pos);
	free(of), free(oc), free(kn), free(qn), free(qkv);
}

static void test_qk_norm_rope_kv(void **state)
{
	const int hds[] = { 64, 128, 256 }, ns[] = { 1, 3, 16, 37 };
	const int kvs[] = { 1, 2, 4, 8, 3 };
	int k = 0;

	assert_non_null(gpu->ops->qk_norm_rope_kv);
	/* Every head_dim x row count x KV mode, with the rest cycling through its values
	 * so that every GQA width 1..8, both block sizes with every mode, a partial rotary
	 * (rot_dim < head_dim, twice, once without norm: k copied past rot_dim as is), no
	 * rotary at all, no norm and padded rows all occur. */
	for (int hi = 0; hi < 3; hi++) {
		for (int ni = 0; ni < 4; ni++) {
			for (int kvm = 0; kvm < GPU_KV_MODES; kvm++, k++) {
				const int D = hds[hi];
				struct qk_case t = {
					.D = D, .n_kv = kvs[k % 5], .group = 1 + k % 8,
					.rot = k == 5 ? D / 2 : k == 18 ? D / 4 + 2 :
					       k == 11 ? 0 : D,
					.n = ns[ni], .kvm = kvm, .bs = (k / 2) % 2 ? 7 : 16,
					.norm = k % 7 != 3 && k != 18,
					.pad = k % 3 == 1 ? 8 : 0,
				};

				qk_case_run(&t, NULL, 0.015f);
			}
		}
	}
	/* the Qwen3-8B decode shape */
	{
		struct qk_case t = { 128, 8, 4, 128, 1, 0, 16, 1, 0 };

		for (t.kvm = 0; t.kvm < GPU_KV_MODES; t.kvm++)
			qk_case_run(&t, NULL, 0.015f);
	}
}

/* The FP8 encoder of the fused op over special values, through the V heads (which reach
 * the cache unchanged): against common/dtype.c and kv_write.cu. */
static void test_qk_fp8_encoder(void **state)
{
	const int D = 64;
	float v[64];
	struct qk_case t = { D, 1, 1, D, 1, 1, 16, 1, 0 };

	for (int i = 0; i < D; i++) {
		/* subnormals, ties, the top of the range and beyond, both signs */
		float x = ldexpf(1.0f + (float)(i % 8) / 16.0f, i / 3 - 12);

		v[i] = sm70_f16_to_f32(sm70_f32_to_f16((i & 1) ? -x : x));
	}
	v[60] = INFINITY;
	v[61] = -INFINITY;
	v[62] = NAN;
	v[63] = -0.0f;
	printf(" fp8 encoder: 64 magnitudes 2^-12..2^9.5, +-inf, NaN, -0 (v_scale 1)\n");
	/* compare_codes(V vs cpu, tol 0) inside is the check; cpu uses sm70_f32_to_e4m3 */
	qk_case_run(&t, v, 1.0f);
}

/* ---- silu_matmul ------------------------------------------------------------------- */

/* One weight shape, every n: fused vs the CPU's silu_mul + matmul, vs the CUDA backend's
 * silu_mul + matmul, on the fast backend and on SM70_MATMUL=reference. */
static void silu_matmul_shape(int rows, int cols, const int *ns, int n_ns)
{
	float *wv = rvec16((size_t)rows * cols, 1.7f / sqrtf((float)cols));
	struct sm70_weight wc = mk_weight(cpu, wv, rows, cols);
	struct sm70_weight wg = mk_weight(gpu, wv, rows, cols);
	struct sm70_weight wr = mk_weight(gpu_ref, wv, rows, cols);
	const int tc = cols % 8 == 0; /* the fast backend's tensor-core path (buffers aligned) */

	free(wv);
	for (int ni = 0; ni < n_ns; ni++) {
		const int n = ns[ni];
		const size_t nin = (size_t)n * 2 * cols, nx = (size_t)n * cols;
		const size_t ny = (size_t)n * rows;
		float *gu = rvec16(nin, 4.0f), *yc = fvec(ny), *yf = fvec(ny);
		void *ic = up_act(cpu, gu, nin), *ig = up_act(gpu, gu, nin);
		void *ir = up_act(gpu_ref, gu, nin);
		void *xc = balloc(cpu, nx * 4), *xg = balloc(gpu, nx * 2);
		void *xr = balloc(gpu_ref, nx * 2);
		void *oc = balloc(cpu, ny * 4);
		void *of = balloc(gpu, ny * 2), *ou = balloc(gpu, ny * 2);
		void *orf = balloc(gpu_ref, ny * 2), *oru = balloc(gpu_ref, ny * 2);
		uint16_t *hf, *hu, *hrf, *hru;
		char what[160];

		cpu->ops->silu_mul(cpu, xc, ic, n, cols);
		cpu->ops->matmul(cpu, oc, 1, xc, &wc, n);
		gpu->ops->silu_matmul(gpu, of, ig, &wg, n);
		gpu->ops->silu_mul(gpu, xg, ig, n, cols);
		gpu->ops->matmul(gpu, ou, 0, xg, &wg, n);
		gpu_ref->ops->silu_matmul(gpu_ref, orf, ir, &wr, n);
		gpu_ref->ops->silu_mul(gpu_ref, xr, ir, n, cols);
		gpu_ref->ops->matmul(gpu_ref, oru, 0, xr, &wr, n);
		get_bytes(cpu, yc, oc, ny * 4);
		get_act(gpu, yf, of, ny);
		hf = get_f16_codes(gpu, of, ny);
		hu = get_f16_codes(gpu, ou, ny);
		hrf = get_f16_codes(gpu_ref, orf, ny);
		hru = get_f16_codes(gpu_ref, oru, ny);

		printf(" silu_matmul %dx%d n=%d (%s)\n", rows, cols, n,
		       !tc ? "cols % 8 != 0: reference kernel" :
		       n <= 16 ? "tensor cores" : "tensor cores in 16-row pieces");
		compare_values("fused vs cpu silu_mul+matmul", yf, yc, ny, TOL_SILU_MM);
		if (tc && n <= 16) {
			compare_codes("fused vs cuda silu_mul+matmul (same tiles)", hf, hu, ny, 0,
				      TOL_ULP);
		} else {
			float *yu = fvec(ny);

			for (size_t i = 0; i < ny; i++)
				yu[i] = sm70_f16_to_f32(hu[i]);
			snprintf(what, sizeof(what), "fused vs cuda silu_mul+matmul (%s)",
				 n > 16 ? "cublas" : "simt gemv");
			compare_values(what, yf, yu, ny, TOL_F16_OUT);
			free(yu);
		}
		for (size_t i = 0; i < ny; i++)
			yf[i] = sm70_f16_to_f32(hrf[i]);
		compare_values("reference: fused vs cpu", yf, yc, ny, TOL_SILU_MM);
		compare_codes("reference: fused vs silu_mul+matmul", hrf, hru, ny, 0, TOL_ULP);

		free(hru), free(hrf), free(hu), free(hf);
		bfree(gpu_ref, oru), bfree(gpu_ref, orf), bfree(gpu, ou), bfree(gpu, of);
		bfree(cpu, oc), bfree(gpu_ref, xr), bfree(gpu, xg), bfree(cpu, xc);
		bfree(gpu_ref, ir), bfree(gpu, ig), bfree(cpu, ic);
		free(yf), free(yc), free(gu);
	}
	bfree(gpu_ref, wr.data), bfree(gpu, wg.data), bfree(cpu, wc.data);
}

static void test_silu_matmul(void **state)
{
	const int ns[] = { 1, 5, 16, 37 }, ns_big[] = { 1, 5, 16, 20 };

	assert_non_null(gpu->ops->silu_matmul);
	/* Qwen3-8B's down projection (hidden 4096, intermediate 12288) */
	silu_matmul_shape(4096, 12288, ns_big, 4);
	/* odd sizes: a partial 64-column step and a partial 16-row tile */
	silu_matmul_shape(100, 136, ns, 4);
	silu_matmul_shape(33, 520, ns, 4);
	/* every x row group of the tensor-core kernel (n 1..16 in groups of 4) */
	{
		const int groups[] = { 2, 3, 4, 7, 8, 11, 12, 13 };

		silu_matmul_shape(1000, 1024, groups, 8);
	}
	/* cols not a multiple of 8: the fused op's reference kernel on the fast backend */
	silu_matmul_shape(77, 100, ns, 4);
}

/*
 * add_rmsnorm_matmul at one row of x: y and the updated residual against add_rmsnorm +
 * matmul on the CPU (values) and on the CUDA backend (y bit for bit up to TOL_ULP, the
 * residual exactly), with and without an update and a kept residual; then the calls the
 * op must decline with nothing queued (two rows, an NVFP4-less reference backend).
 */
static void norm_matmul_shape(int rows, int cols, int with_delta, int keep, int glu)
{
	const int ny = glu ? rows / 2 : rows; /* outputs */
	float *wv = rvec16((size_t)rows * cols, 1.7f / sqrtf((float)cols));
	float *res = rvec16(cols, 3.0f), *dl = rvec16(cols, 1.0f), *nw = rvec16(cols, 1.0f);
	struct sm70_weight wc = mk_weight(cpu, wv, rows, cols);
	struct sm70_weight wg = mk_weight(gpu, wv, rows, cols);
	void *rc = up_bytes(cpu, res, cols * 4), *rg = up_bytes(gpu, res, cols * 4);
	void *rg2 = up_bytes(gpu, res, cols * 4), *ro = balloc(gpu, cols * 4);
	void *dc = up_act(cpu, dl, cols), *dg = up_act(gpu, dl, cols);
	void *nc, *ng, *xc = balloc(cpu, cols * 4), *xg = balloc(gpu, cols * 2);
	void *oc = balloc(cpu, rows * 4), *of = balloc(gpu, rows * 2), *ou = balloc(gpu, rows * 2);
	void *gc = balloc(cpu, ny * 4), *gu = balloc(gpu, ny * 2);
	float *yc = fvec(rows), *yf = fvec(rows), *r_c = fvec(cols), *r_f = fvec(cols);
	float *r_u = fvec(cols);
	uint16_t *hf, *hu;
	char what[160];

	for (int i = 0; i < cols; i++) /* a norm weight near 1, as trained ones are */
		nw[i] = 1.0f + 0.25f * nw[i];
	nc = up_bytes(cpu, nw, cols * 4);
	ng = up_bytes(gpu, nw, cols * 4);
	cpu->ops->add_rmsnorm(cpu, xc, rc, with_delta ? dc : NULL, nc, 1, cols, 1e-6f);
	cpu->ops->matmul(cpu, oc, 1, xc, &wc, 1);
	assert_int_equal(gpu->ops->add_rmsnorm_matmul(gpu, of, keep ? ro : NULL, rg,
						      with_delta ? dg : NULL, ng, 1e-6f, &wg, 1,
						      glu),
			 0);
	gpu->ops->add_rmsnorm(gpu, xg, rg2, with_delta ? dg : NULL, ng, 1, cols, 1e-6f);
	gpu->ops->matmul(gpu, ou, 0, xg, &wg, 1);
	if (glu) { /* the separate ops' silu_mul: the CPU's in f32, CUDA's of the f16 rows */
		cpu->ops->silu_mul(cpu, gc, oc, 1, ny);
		gpu->ops->silu_mul(gpu, gu, ou, 1, ny);
	}
	get_bytes(cpu, yc, glu ? gc : oc, ny * 4);
	get_act(gpu, yf, of, ny);
	hf = get_f16_codes(gpu, of, ny);
	hu = get_f16_codes(gpu, glu ? gu : ou, ny);
	printf(" add_rmsnorm_matmul %dx%d %s%s%s\n", rows, cols,
	       with_delta ? "with an update" : "first block (no update)",
	       keep ? ", residual kept" : "", glu ? ", glu" : "");
	snprintf(what, sizeof(what), "fused vs cpu add_rmsnorm+matmul%s", glu ? "+silu_mul" : "");
	compare_values(what, yf, yc, ny, glu ? TOL_SILU_MM : TOL_F16_OUT);
	/* the GLU form runs two tiles a warp, as the plain kernel does on tall matrices */
	if (!glu || rows >= 24576)
		compare_codes(glu ? "fused vs cuda add_rmsnorm+matmul+silu_mul (same tiles)" :
				    "fused vs cuda add_rmsnorm+matmul (same x, same tiles)",
			      hf, hu, ny, 0, TOL_ULP);
	if (keep) {
		get_bytes(cpu, r_c, rc, cols * 4);
		get_bytes(gpu, r_f, ro, cols * 4);
		get_bytes(gpu, r_u, rg2, cols * 4);
		assert_memory_equal(r_f, r_u, cols * 4); /* the same f32 adds */
		compare_values("kept residual vs cpu", r_f, r_c, cols, 1e-6);
	}
	{
		/* resid_in untouched */
		float *r_in = fvec(cols);

		get_bytes(gpu, r_in, rg, cols * 4);
		assert_memory_equal(r_in, res, cols * 4);
		free(r_in);
	}
	free(hu), free(hf);
	free(r_u), free(r_f), free(r_c), free(yf), free(yc);
	bfree(gpu, gu), bfree(cpu, gc), bfree(gpu, ou), bfree(gpu, of), bfree(cpu, oc);
	bfree(gpu, xg), bfree(cpu, xc);
	bfree(gpu, ng), bfree(cpu, nc), bfree(gpu, dg), bfree(cpu, dc);
	bfree(gpu, ro), bfree(gpu, rg2), bfree(gpu, rg), bfree(cpu, rc);
	bfree(gpu, wg.data), bfree(cpu, wc.data);
	free(nw), free(dl), free(res), free(wv);
}

static void test_add_rmsnorm_matmul(void **state)
{
	float *v = rvec16(64 * 64, 0.1f);
	struct sm70_weight w = mk_weight(gpu, v, 64, 64);
	void *r = balloc(gpu, 2 * 64 * 4), *o = balloc(gpu, 2 * 64 * 4), *y = balloc(gpu, 128 * 2);
	void *nw = balloc(gpu, 64 * 4);

	assert_non_null(gpu->ops->add_rmsnorm_matmul);
	/* Qwen3-8B's qkv and gate_up (two tiles a warp), Qwen3.5-27B's hidden, odd shapes: a
	 * partial 64-column step and a partial row tile */
	norm_matmul_shape(6144, 4096, 1, 1, 0);
	norm_matmul_shape(24576, 4096, 1, 1, 0);
	norm_matmul_shape(6144, 4096, 0, 1, 0);
	norm_matmul_shape(1000, 5120, 1, 0, 0);
	norm_matmul_shape(33, 520, 1, 1, 0);
	norm_matmul_shape(100, 8192, 1, 1, 0);
	/* with the GLU epilogue: Qwen3-8B's gate_up, a partial tile in each half */
	norm_matmul_shape(24576, 4096, 1, 1, 1);
	norm_matmul_shape(24576, 4096, 0, 0, 1);
	norm_matmul_shape(2 * 1000, 520, 1, 1, 1);
	/* declined with nothing queued: two rows, cols past 8192 or not a multiple of 8,
	 * the residual written over itself */
	assert_int_equal(gpu->ops->add_rmsnorm_matmul(gpu, y, o, r, NULL, nw, 1e-6f, &w, 2, 0),
			 -EOPNOTSUPP);
	w.cols = 60;
	assert_int_equal(gpu->ops->add_rmsnorm_matmul(gpu, y, o, r, NULL, nw, 1e-6f, &w, 1, 0),
			 -EOPNOTSUPP);
	w.cols = 64;
	assert_int_equal(gpu->ops->add_rmsnorm_matmul(gpu, y, r, r, NULL, nw, 1e-6f, &w, 1, 0),
			 -EINVAL);
	/* the reference backend's matmul is the plain kernel: it declines, the caller runs
	 * the two ops */
	assert_true(!gpu_ref->ops->add_rmsnorm_matmul ||
		    gpu_ref->ops->add_rmsnorm_matmul(gpu_ref, y, o, r, NULL, nw, 1e-6f, &w, 1, 0) ==
			    -EOPNOTSUPP);
	/* glu needs an even row count */
	w.rows = 63;
	assert_int_equal(gpu->ops->add_rmsnorm_matmul(gpu, y, o, r, NULL, nw, 1e-6f, &w, 1, 1),
			 -EOPNOTSUPP);
	w.rows = 64;
	assert_int_equal(gpu->ops->sync(gpu), 0);
	bfree(gpu, nw), bfree(gpu, y), bfree(gpu, o), bfree(gpu, r), bfree(gpu, w.data);
	free(v);
}

/* ---- matmul_glu -------------------------------------------------------------------- */

/*
 * matmul_glu on one [gate; up] weight at each n: against the CPU's matmul + silu_mul
 * (values) and against CUDA's (codes, where the plain GEMV also runs two 16-row tiles a
 * warp: the same k-sums, so the same f16 rows before silu_mul; values elsewhere).
 */
static void glu_shape(int rows, int cols, const int *ns, int n_ns)
{
	const int inter = rows / 2;
	float *wv = rvec16((size_t)rows * cols, 1.7f / sqrtf((float)cols));
	struct sm70_weight wc = mk_weight(cpu, wv, rows, cols);
	struct sm70_weight wg = mk_weight(gpu, wv, rows, cols);

	free(wv);
	for (int ni = 0; ni < n_ns; ni++) {
		const int n = ns[ni];
		const size_t nx = (size_t)n * cols, ng = (size_t)n * rows, ny = (size_t)n * inter;
		float *xv = rvec16(nx, 1.0f), *yc = fvec(ny), *yf = fvec(ny), *yu = fvec(ny);
		void *xc = up_act(cpu, xv, nx), *xg = up_act(gpu, xv, nx);
		void *guc = balloc(cpu, ng * 4), *gug = balloc(gpu, ng * 2);
		void *oc = balloc(cpu, ny * 4), *of = balloc(gpu, ny * 2), *ou = balloc(gpu, ny * 2);
		const int same = rows >= 24576;
		uint16_t *hf, *hu;

		cpu->ops->matmul(cpu, guc, 0, xc, &wc, n);
		cpu->ops->silu_mul(cpu, oc, guc, n, inter);
		assert_int_equal(gpu->ops->matmul_glu(gpu, of, xg, &wg, n), 0);
		gpu->ops->matmul(gpu, gug, 0, xg, &wg, n);
		gpu->ops->silu_mul(gpu, ou, gug, n, inter);
		get_bytes(cpu, yc, oc, ny * 4);
		get_act(gpu, yf, of, ny);
		get_act(gpu, yu, ou, ny);
		hf = get_f16_codes(gpu, of, ny);
		hu = get_f16_codes(gpu, ou, ny);
		printf(" matmul_glu %dx%d n=%d\n", rows, cols, n);
		compare_values("fused vs cpu matmul+silu_mul", yf, yc, ny, TOL_SILU_MM);
		if (same)
			compare_codes("fused vs cuda matmul+silu_mul (same tiles)", hf, hu, ny, 0,
				      TOL_ULP);
		else
			compare_values("fused vs cuda matmul+silu_mul (other tiles)", yf, yu, ny,
				       TOL_SILU_MM);
		free(hu), free(hf);
		bfree(gpu, ou), bfree(gpu, of), bfree(cpu, oc), bfree(gpu, gug), bfree(cpu, guc);
		bfree(gpu, xg), bfree(cpu, xc);
		free(yu), free(yf), free(yc), free(xv);
	}
	bfree(gpu, wg.data), bfree(cpu, wc.data);
}

static void test_matmul_glu(void **state)
{
	const int ns[] = { 1, 2, 4, 5, 8 };
	float *v = rvec16(64 * 64, 0.1f);
	struct sm70_weight w = mk_weight(gpu, v, 64, 64);
	void *x = balloc(gpu, 16 * 64 * 2), *y = balloc(gpu, 16 * 64 * 2);

	assert_non_null(gpu->ops->matmul_glu);
	/* Qwen3-8B's and Qwen3-32B's gate_up (the column split on the 32B's), a partial
	 * 64-column step and a partial row tile in each half */
	glu_shape(24576, 4096, ns, 5);
	glu_shape(51200, 5120, ns, 2);
	glu_shape(2 * 1000, 520, ns, 5);
	glu_shape(2 * 40, 136, ns, 5);
	/* declined with nothing queued: more than 8 rows of x, an odd row count, the
	 * reference backend */
	assert_int_equal(gpu->ops->matmul_glu(gpu, y, x, &w, 9), -EOPNOTSUPP);
	w.rows = 63;
	assert_int_equal(gpu->ops->matmul_glu(gpu, y, x, &w, 1), -EOPNOTSUPP);
	w.rows = 64;
	assert_true(!gpu_ref->ops->matmul_glu ||
		    gpu_ref->ops->matmul_glu(gpu_ref, y, x, &w, 1) == -EOPNOTSUPP);
	assert_int_equal(gpu->ops->sync(gpu), 0);
	bfree(gpu, y), bfree(gpu, x), bfree(gpu, w.data);
	free(v);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_qk_norm_rope_kv),
		cmocka_unit_test(test_qk_fp8_encoder),
		cmocka_unit_test(test_silu_matmul),
		cmocka_unit_test(test_add_rmsnorm_matmul),
		cmocka_unit_test(test_matmul_glu),
	};

	return gpu_test_main("test_cuda_fused", tests, sizeof(tests) / sizeof(tests[0]), &gpu,
			     &gpu_ref, &cpu);
}
