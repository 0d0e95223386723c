/*
 * attn_decode.h - the decode kernels attention.cu and sparse_attention.cu share: one
 * split-KV kernel body and one reference kernel, each templated on a row source that says
 * which cache slots a token's rows are. attention.cu's rows are the positions 0..tok_pos,
 * sparse_attention.cu's the positions its QSA selection lists; each file defines its row
 * source (the contract is below) and launches these kernels with it.
 *
 * Split kernel: one block per (token, KV head, split) computes every query head of the GQA
 * group, so each K/V row is read once per group. A tile's rows are copied (FP8 decoded:
 * sm70__e4m3x8_to_f16_scaled; K and V each in its own dtype, kv_pair.h's pairs) into
 * shared memory as f16, then the scores in fp32 FMAs, an online softmax by one warp per
 * head and P V in fp32, two dims a thread. The rows are split over enough blocks to fill
 * the GPU twice; splits write the partials cuda_check.h describes and
 * sm70__cuda_attn_merge combines them.
 *
 * Reference kernel: one block per (token, head), one thread per output dim, one row at a
 * time through the same online softmax, FP8 decoded the plain way (the NaN code stays
 * NaN) and scaled per element. Slow and plain on purpose.
 *
 * C++ (nvcc) only. Non-goals: tensor cores and prefill tiling (attention.cu's own kernels).
 */
#ifndef SM70_KERNELS_CUDA_ATTN_DECODE_H
#define SM70_KERNELS_CUDA_ATTN_DECODE_H

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/kv_pair.h"

#define SM70__ATTN_THREADS 128
#define SM70__ATTN_WARPS (SM70__ATTN_THREADS / 32)

/* One decode launch of either op; attention.cu's tensor-core kernel takes it too. A row
 * source may extend it with what its rows need (Rows::args). */
struct sm70__attn_args {
	__half *out;
	const __half *q;
	int q_ld;
	const void *kc;
	const void *vc;
	float k_mul; /* scale, times k_scale * 2^8 for FP8 K tiles */
	float v_mul; /* 1, or v_scale * 2^8 for FP8 V tiles */
	int n_kv;
	int bs;
	int max_blocks;
	const int32_t *tok_pos;
	const int32_t *tok_seq;
	const int32_t *block_tables;
	int n_heads;
	int group;
	int chunk;  /* rows per split (a multiple of the tile) */
	int nsplit; /* 1: write out directly; else partials into part */
	/* 1: each token's own rows cut into nsplit even spans of whole tiles, at least span
	 * rows each (sm70__attn_split_rows); 0: spans of chunk rows from row 0 */
	int even;
	int span;
	float *part;
	/* the tensor-core decode kernel only: non-NULL, the last split block of each (token,
	 * KV head) to finish merges the partials itself (counters that start and end at 0) */
	int32_t *count;
};

/*
 * A row source Rows names its kernel argument type args (struct sm70__attn_args or one
 * derived from it); constructed in a kernel as Rows(a, tok), it holds n (the token's row
 * count) and size_t slot(int i) (the cache slot of row i, 0 <= i < n). It states:
 * - staged: a tile's slots are made once into shared memory before its loads (worth it
 *   when a slot costs a gather); otherwise each load computes its row's slot.
 * - may_be_empty: n may be 0; such a token gets zeros. Otherwise the output divides by l
 *   unguarded (a NaN stays a NaN).
 * - split_tiles: the fewest tiles a split keeps.
 * - op, split_call, ref_call: the names errors are reported under.
 */

/* Rows per tile: 64 rows of K and V fit shared memory up to head_dim 128, 32 at 256. */
template <int D> struct sm70__attn_tile {
	static constexpr int TP = D >= 256 ? 32 : 64;
	static constexpr int KS = D + 8; /* row stride in halves: 16-byte pad, no bank clash */
};

/* Floats before the tiles: q and acc [G][D], scores [G][TP], m, l, alpha [G]; rounded to
 * 16 bytes. */
template <int D> static __host__ __device__ size_t sm70__attn_floats(int group)
{
	return ((size_t)group * (2 * D + sm70__attn_tile<D>::TP + 3) + 3) & ~(size_t)3;
}

/* Dynamic shared memory of the split kernel: the floats, the K and V tiles (f16), then the
 * tile's slots when staged. */
template <int D> static size_t sm70__attn_smem(int group, bool staged)
{
	constexpr int TP = sm70__attn_tile<D>::TP, KS = sm70__attn_tile<D>::KS;

	return sm70__attn_floats<D>(group) * sizeof(float) +
	       2 * (size_t)TP * KS * sizeof(__half) + (staged ? (size_t)TP * sizeof(size_t) : 0);
}

/* The split kernel's shared memory, carved for group G. */
struct sm70__attn_shared {
	float *q, *acc, *s, *m, *l, *al;
	__half *k, *v;
	size_t *slot;
};

template <int D>
static __device__ __forceinline__ struct sm70__attn_shared sm70__attn_carve(float4 *raw, int G)
{
	constexpr int TP = sm70__attn_tile<D>::TP, KS = sm70__attn_tile<D>::KS;
	struct sm70__attn_shared sh;

	sh.q = (float *)raw;
	sh.acc = sh.q + G * D;
	sh.s = sh.acc + G * D;
	sh.m = sh.s + G * TP;
	sh.l = sh.m + G;
	sh.al = sh.l + G;
	sh.k = (__half *)(sh.q + sm70__attn_floats<D>(G));
	sh.v = sh.k + TP * KS;
	sh.slot = (size_t *)(sh.v + TP * KS);
	return sh;
}

/* 8 dims of a cache row at element off as 8 f16 (FP8: decoded, 2^-8 times the value). */
template <bool FP8>
static __device__ __forceinline__ uint4 sm70__attn_load8(const void *cache, size_t off)
{
	if (FP8) {
		const uint2 b = __ldg((const uint2 *)((const uint8_t *)cache + off));

		return sm70__e4m3x8_to_f16_scaled(b);
	}
	return __ldg((const uint4 *)((const __half *)cache + off));
}

/* Rows [t0, t0 + nt) of KV head kvh into the K and V tiles, 16 bytes (8 dims) a thread. */
template <int D, bool KF8, bool VF8, class Rows>
static __device__ __forceinline__ void sm70__attn_tile_load(const struct sm70__attn_args &a,
							    const Rows &rows,
							    const struct sm70__attn_shared &sh,
							    int t0, int nt, int kvh)
{
	constexpr int KS = sm70__attn_tile<D>::KS, VPR = D / 8;

	for (int idx = threadIdx.x; idx < nt * VPR; idx += SM70__ATTN_THREADS) {
		const int r = idx / VPR, cv = idx - r * VPR;
		const size_t slot = Rows::staged ? sh.slot[r] : rows.slot(t0 + r);
		const size_t off = (slot * a.n_kv + kvh) * D + (size_t)cv * 8;
		const uint4 kv4 = sm70__attn_load8<KF8>(a.kc, off);
		const uint4 vv4 = sm70__attn_load8<VF8>(a.vc, off);

		*(uint4 *)(sh.k + r * KS + cv * 8) = kv4;
		*(uint4 *)(sh.v + r * KS + cv * 8) = vv4;
	}
}

/* Scores (times k_mul) of every group head against the tile's nt rows; 16-byte reads of
 * the padded rows keep a quarter warp's rows in different banks. */
template <int D>
static __device__ __forceinline__ void sm70__attn_tile_scores(const struct sm70__attn_shared &sh,
							      int G, int nt, float k_mul)
{
	constexpr int TP = sm70__attn_tile<D>::TP, KS = sm70__attn_tile<D>::KS, VPR = D / 8;

	for (int idx = threadIdx.x; idx < G * nt; idx += SM70__ATTN_THREADS) {
		const int g = idx / nt, r = idx - g * nt;
		const __half *kr = sh.k + r * KS;
		const float *qg = sh.q + g * D;
		float s = 0.0f;

#pragma unroll 4
		for (int cv = 0; cv < VPR; cv++) {
			const uint4 k8 = *(const uint4 *)(kr + cv * 8);
			const __half2 *kh = (const __half2 *)&k8;
			const float4 qa = *(const float4 *)(qg + cv * 8);
			const float4 qb = *(const float4 *)(qg + cv * 8 + 4);
			const float2 f0 = __half22float2(kh[0]), f1 = __half22float2(kh[1]);
			const float2 f2 = __half22float2(kh[2]), f3 = __half22float2(kh[3]);

			s += qa.x * f0.x + qa.y * f0.y + qa.z * f1.x + qa.w * f1.y +
			     qb.x * f2.x + qb.y * f2.y + qb.z * f3.x + qb.w * f3.y;
		}
		sh.s[g * TP + r] = s * k_mul;
	}
}

/* The online softmax step over the tile's scores, one warp per head: the scores become
 * exp(s - m_new), and each head's m, l and rescale factor alpha are updated. */
template <int D>
static __device__ __forceinline__ void sm70__attn_tile_softmax(const struct sm70__attn_shared &sh,
							       int G, int nt)
{
	constexpr int TP = sm70__attn_tile<D>::TP;
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

	for (int g = warp; g < G; g += SM70__ATTN_WARPS) {
		float v[TP / 32], mx = -INFINITY, sum = 0.0f;

#pragma unroll
		for (int j = 0; j < TP / 32; j++) {
			const int r = lane + 32 * j;

			v[j] = r < nt ? sh.s[g * TP + r] : -INFINITY;
			mx = fmaxf(mx, v[j]);
		}
		mx = sm70__warp_max(mx);
		const float m_old = sh.m[g], m_new = fmaxf(m_old, mx);
#pragma unroll
		for (int j = 0; j < TP / 32; j++) {
			const int r = lane + 32 * j;

			if (r < nt) {
				const float e = expf(v[j] - m_new);

				sh.s[g * TP + r] = e;
				sum += e;
			}
		}
		sum = sm70__warp_sum(sum);
		if (lane == 0) {
			const float alpha = expf(m_old - m_new);

			sh.l[g] = sh.l[g] * alpha + sum;
			sh.m[g] = m_new;
			sh.al[g] = alpha;
		}
	}
}

/* acc = acc * alpha + P V over the tile's nt rows, two dims a thread. */
template <int D>
static __device__ __forceinline__ void sm70__attn_tile_pv(const struct sm70__attn_shared &sh,
							  int G, int nt)
{
	constexpr int TP = sm70__attn_tile<D>::TP, KS = sm70__attn_tile<D>::KS;

	for (int i = threadIdx.x; i < G * D / 2; i += SM70__ATTN_THREADS) {
		const int g = i / (D / 2), d = (i - g * (D / 2)) * 2;
		const float *pg = sh.s + g * TP;
		float2 acc = *(float2 *)(sh.acc + g * D + d);
		const float al = sh.al[g];

		acc.x *= al;
		acc.y *= al;
		for (int r = 0; r < nt; r++) {
			const float2 vf = __half22float2(*(const __half2 *)(sh.v + r * KS + d));
			const float p = pg[r];

			acc.x += p * vf.x;
			acc.y += p * vf.y;
		}
		*(float2 *)(sh.acc + g * D + d) = acc;
	}
}

/* The block's result: the group's output rows (one split), else its partials. A token
 * with no rows (Rows::may_be_empty) gets zeros: its split 0 holds an empty sum of weight
 * 1, so the merge gives zeros (every split empty would give 0 / 0). */
template <int D, class Rows>
static __device__ __forceinline__ void sm70__attn_split_out(const struct sm70__attn_args &a,
							    const struct sm70__attn_shared &sh,
							    int tok, int kvh, int split, int n)
{
	const int G = a.group;

	if (a.nsplit == 1) {
		__half *o = a.out + ((size_t)tok * a.n_heads + (size_t)kvh * G) * D;

		for (int i = threadIdx.x; i < G * D; i += SM70__ATTN_THREADS) {
			const float l = sh.l[i / D];

			o[i] = __float2half_rn(Rows::may_be_empty && !(l > 0.0f) ?
						       0.0f :
						       sh.acc[i] * a.v_mul / l);
		}
		return;
	}
	const bool none = Rows::may_be_empty && n <= 0 && split == 0;

	for (int i = threadIdx.x; i < G * (D + 2); i += SM70__ATTN_THREADS) {
		const int g = i / (D + 2), j = i - g * (D + 2);
		const int h = kvh * G + g;
		float *pp = a.part +
			    (((size_t)tok * a.n_heads + h) * a.nsplit + split) * SM70__ATTN_PR(D);

		pp[j] = j == D	   ? (none ? 0.0f : sh.m[g]) :
			j == D + 1 ? (none ? 1.0f : sh.l[g]) :
				     sh.acc[g * D + j] * a.v_mul;
	}
}

/*
 * The rows [*i0, *i1) split `split` of a token with n rows takes. Fixed spans (a.even 0,
 * batch invariance) start at split * chunk. Otherwise the token's own rows are cut into
 * a.nsplit even spans of whole tiles of TP rows (at least a.span): the host sizes the
 * split by a bound on the rows (a graph's context bucket, a power of two: graphs.c), and
 * spans of that bound's share would leave up to half the splits past every token's last
 * row, idle, while the others take twice their share. A token shorter than the bound, in
 * a batch of mixed lengths, gets its splits filled the same way.
 */
template <int TP>
static __device__ __forceinline__ void sm70__attn_split_rows(const struct sm70__attn_args &a,
							     int n, int split, int &i0, int &i1)
{
	int chunk = a.chunk;

	if (a.even) {
		chunk = (n + a.nsplit - 1) / a.nsplit;
		chunk = (chunk + TP - 1) / TP * TP;
		if (chunk < a.span)
			chunk = a.span;
	}
	i0 = split * chunk;
	i1 = min(i0 + chunk, n);
}

/* One block per (token, KV head, split): the rows sm70__attn_split_rows gives it. */
template <int D, bool KF8, bool VF8, class Rows>
static __global__ void __launch_bounds__(SM70__ATTN_THREADS)
	sm70__attn_split_kernel(typename Rows::args a)
{
	constexpr int TP = sm70__attn_tile<D>::TP;
	extern __shared__ float4 smem_raw[];
	const int G = a.group;
	const struct sm70__attn_shared sh = sm70__attn_carve<D>(smem_raw, G);
	const int tid = threadIdx.x;
	const int tok = blockIdx.x / a.n_kv, kvh = blockIdx.x - tok * a.n_kv;
	const int split = blockIdx.y;
	const Rows rows(a, tok);
	int i0, i1;
	sm70__attn_split_rows<TP>(a, rows.n, split, i0, i1);
	const __half *qt = a.q + (size_t)tok * a.q_ld + (size_t)kvh * G * D;

	for (int i = tid; i < G * D; i += SM70__ATTN_THREADS) {
		sh.q[i] = __half2float(qt[i]);
		sh.acc[i] = 0.0f;
	}
	for (int g = tid; g < G; g += SM70__ATTN_THREADS) {
		sh.m[g] = -INFINITY;
		sh.l[g] = 0.0f;
	}
	for (int t0 = i0; t0 < i1; t0 += TP) {
		const int nt = min(TP, i1 - t0);

		if constexpr (Rows::staged)
			for (int r = tid; r < nt; r += SM70__ATTN_THREADS)
				sh.slot[r] = rows.slot(t0 + r);
		__syncthreads(); /* q, slots made; the last tile's readers are done */
		sm70__attn_tile_load<D, KF8, VF8>(a, rows, sh, t0, nt, kvh);
		__syncthreads();
		sm70__attn_tile_scores<D>(sh, G, nt, a.k_mul);
		__syncthreads();
		sm70__attn_tile_softmax<D>(sh, G, nt);
		__syncthreads();
		sm70__attn_tile_pv<D>(sh, G, nt);
	}
	__syncthreads();
	sm70__attn_split_out<D, Rows>(a, sh, tok, kvh, split, rows.n);
}

/*
 * Batch invariance (the backend's batch_invariant): splits of SM70__ATTN_BI_SPAN positions
 * whatever the batch, and at least two, so that a token's tiles, its splits' partials and
 * their merge are the same however many tokens and positions share the launch (a split
 * past a token's position is empty and adds nothing: weight 0). A one-split launch would
 * write the output directly, in other rounding, hence two. The span is a multiple of
 * every kernel's tile (64, 32 at head_dim 256) and of the SIMT kernel's two tiles.
 */
#define SM70__ATTN_BI_SPAN 256

static inline long sm70__attn_bi_splits(int most)
{
	const long spans = ((long)most + SM70__ATTN_BI_SPAN - 1) / SM70__ATTN_BI_SPAN;

	return spans < 2 ? 2 : spans;
}

/* SM70_ATTN_EVEN=0 (read once): splits in spans of chunk rows from row 0, as before
 * sm70__attn_split_rows cut each token's own rows evenly. */
static inline int sm70__attn_even_off(void)
{
	static int cached = -1;

	if (cached < 0) {
		const char *v = getenv("SM70_ATTN_EVEN");

		cached = v && strcmp(v, "0") == 0;
	}
	return cached;
}

/*
 * Sizes the split of rows bounded by most (n_tokens tokens of head_dim D): up to want
 * splits (the caller's fill target), each of at least span rows, no more than the partials
 * have room for; a split's chunk is whole tiles of TP rows. Sets a->chunk, a->nsplit and
 * a->part. attention.cu's tensor-core launch sizes its split here too.
 */
static inline void sm70__attn_size_split(struct sm70__cuda *c, struct sm70__attn_args *a,
					 int n_tokens, int D, int most, long want, int span,
					 int TP)
{
	const size_t per_split = (size_t)n_tokens * a->n_heads * SM70__ATTN_PR(D) * sizeof(float);
	int nsplit = 1;

	if (c->be.batch_invariant) {
		const long spans = sm70__attn_bi_splits(most);

		static_assert(SM70__ATTN_BI_SPAN % 128 == 0, "spans of whole tiles");
		if (spans <= (long)(SM70__CUDA_ATTN_PART_BYTES / per_split)) {
			a->chunk = SM70__ATTN_BI_SPAN;
			a->nsplit = (int)spans;
			a->part = c->attn_part;
			a->even = 0;
			return;
		}
		/* no room (the attention op's caller keeps within it): sized as below */
	}

	if (want > 1 && most > span) {
		const long spans = (most + span - 1) / span;
		const long room = (long)(SM70__CUDA_ATTN_PART_BYTES / per_split);

		nsplit = (int)(want < spans ? want : spans);
		if (nsplit > room)
			nsplit = (int)room;
		if (nsplit < 1)
			nsplit = 1;
	}
	a->chunk = (most + nsplit - 1) / nsplit;
	a->chunk = (a->chunk + TP - 1) / TP * TP;
	a->nsplit = (most + a->chunk - 1) / a->chunk;
	a->part = c->attn_part;
	/* SM70_ATTN_EVEN=0: spans of chunk rows from row 0 (the path back, for timing) */
	a->even = !sm70__attn_even_off();
	a->span = span;
}

/* Queues the split kernel over rows bounded by most (and the merge when split); -ENOSPC
 * when the shape does not fit this device (nothing queued), -EIO when a launch failed. */
template <int D, bool KF8, bool VF8, class Rows>
static int sm70__attn_split_launch(struct sm70__cuda *c, typename Rows::args a, int n_tokens,
				   int most)
{
	constexpr int TP = sm70__attn_tile<D>::TP;
	const size_t smem = sm70__attn_smem<D>(a.group, Rows::staged);
	const long blocks = (long)n_tokens * a.n_kv;

	if (smem > c->smem_optin)
		return -ENOSPC;
	if (smem > 48 * 1024 &&
	    SM70_CUDA_CHECK(&c->be,
			    cudaFuncSetAttribute(sm70__attn_split_kernel<D, KF8, VF8, Rows>,
						 cudaFuncAttributeMaxDynamicSharedMemorySize,
						 (int)smem)))
		return -EIO;
	/* Split the rows while the (token, KV head) pairs fill less than two waves; a split
	 * keeps at least split_tiles tiles. */
	sm70__attn_size_split(c, &a, n_tokens, D, most, (2L * c->n_sm + blocks - 1) / blocks,
			      Rows::split_tiles * TP, TP);
	sm70__attn_split_kernel<D, KF8, VF8, Rows><<<dim3((unsigned)blocks, (unsigned)a.nsplit),
						     SM70__ATTN_THREADS, smem, c->stream>>>(a);
	if (sm70__cuda_check(&c->be, cudaGetLastError(), Rows::split_call, __FILE__, __LINE__))
		return -EIO;
	if (a.nsplit > 1)
		return sm70__cuda_attn_merge(c, a.out, a.part, n_tokens * a.n_heads, a.nsplit, D);
	return 0;
}

/* The split kernel over tokens [0, n_tokens) of a (K/V dtypes pair), rows bounded by
 * most; -ENOSPC when head_dim D is none of its sizes or the shape does not fit (nothing
 * queued). */
template <class Rows>
static int sm70__attn_split(struct sm70__cuda *c, const typename Rows::args &a, int D,
			    enum sm70__kv_pair pair, int n_tokens, int most)
{
	return sm70__kv_pair_call(pair, [&](auto kf8, auto vf8) {
		constexpr bool K8 = decltype(kf8)::value, V8 = decltype(vf8)::value;

		switch (D) {
		case 32:
			return sm70__attn_split_launch<32, K8, V8, Rows>(c, a, n_tokens, most);
		case 64:
			return sm70__attn_split_launch<64, K8, V8, Rows>(c, a, n_tokens, most);
		case 128:
			return sm70__attn_split_launch<128, K8, V8, Rows>(c, a, n_tokens, most);
		case 256:
			return sm70__attn_split_launch<256, K8, V8, Rows>(c, a, n_tokens, most);
		}
		return -ENOSPC;
	});
}

/* e4m3 decoded the plain way, for the reference kernel. */
static __device__ float sm70__attn_e4m3_to_f32(uint8_t v)
{
	const int e = (v >> 3) & 0xf, m = v & 7;
	float f;

	if (e == 0xf && m == 7)
		return NAN;
	f = e == 0 ? (float)m * 0x1p-9f : ldexpf(1.0f + (float)m / 8.0f, e - 7);
	return (v & 0x80) ? -f : f;
}

/* One block per (token, head); thread d owns output dim d. k_fp8, v_fp8: K, V stored as
 * FP8 (else f16). */
template <class Rows>
static __global__ void sm70__attn_ref_kernel(typename Rows::args a, int D, int k_fp8,
					     int v_fp8, float k_scale, float v_scale, float scale)
{
	__shared__ float red[2][32];
	const int tok = blockIdx.x / a.n_heads, h = blockIdx.x - tok * a.n_heads;
	const int kvh = h / a.group, d = threadIdx.x;
	const int lane = d & 31, warp = d >> 5, nw = (blockDim.x + 31) >> 5;
	const Rows rows(a, tok);
	const float qd =
		d < D ? __half2float(a.q[(size_t)tok * a.q_ld + (size_t)h * D + d]) : 0.0f;
	float m = -INFINITY, l = 0.0f, acc = 0.0f;

	for (int i = 0; i < rows.n; i++) {
		const size_t off = (rows.slot(i) * a.n_kv + kvh) * D + d;
		float kd = 0.0f, vd = 0.0f, s = 0.0f;

		if (d < D) {
			const uint8_t *k8 = (const uint8_t *)a.kc, *v8 = (const uint8_t *)a.vc;

			kd = k_fp8 ? sm70__attn_e4m3_to_f32(k8[off]) * k_scale :
				     __half2float(((const __half *)a.kc)[off]);
			vd = v_fp8 ? sm70__attn_e4m3_to_f32(v8[off]) * v_scale :
				     __half2float(((const __half *)a.vc)[off]);
		}
		s = sm70__warp_sum(qd * kd);
		if (lane == 0)
			red[i & 1][warp] = s;
		__syncthreads(); /* red[i & 1] is next written two rows on, after the barrier
				  * of the row between */
		s = 0.0f;
		for (int w = 0; w < nw; w++)
			s += red[i & 1][w];
		s *= scale;
		const float m_new = fmaxf(m, s);
		const float alpha = expf(m - m_new), e = expf(s - m_new);

		l = l * alpha + e;
		acc = acc * alpha + e * vd;
		m = m_new;
	}
	if (d < D)
		a.out[((size_t)tok * a.n_heads + h) * D + d] =
			__float2half_rn(Rows::may_be_empty && !(l > 0.0f) ? 0.0f : acc / l);
}

/* Queues the reference kernel over tokens [0, n_tokens) of a; failures are reported. */
template <class Rows>
static void sm70__attn_ref(struct sm70__cuda *c, const typename Rows::args &a,
			   const struct sm70_kv_layer *kv, const struct sm70_kv_layout *lay,
			   float scale, int n_tokens)
{
	const int D = lay->head_dim;
	const enum sm70__kv_pair pair = sm70__kv_pair_of(lay);

	if (D > 1024) {
		sm70__cuda_fail(&c->be, Rows::op, __FILE__, __LINE__, "head_dim above 1024");
		return;
	}
	sm70__attn_ref_kernel<Rows><<<n_tokens * a.n_heads, (D + 31) / 32 * 32, 0, c->stream>>>(
		a, D, sm70__kv_pair_k_fp8(pair), sm70__kv_pair_v_fp8(pair), kv->k_scale,
		kv->v_scale, scale);
	sm70__cuda_check(&c->be, cudaGetLastError(), Rows::ref_call, __FILE__, __LINE__);
}

/*
 * a for one call of op over batch b: the cache, heads and block tables, the fast kernels'
 * scales (k_mul, v_mul; 2^8 folded in for FP8, each for its own tensor), no split yet.
 * Returns 0; -EINVAL when there is nothing to do (no tokens, or n_heads not a multiple of
 * the KV heads); -ENOTSUP for K/V dtypes none of kv_pair.h's pairs (reported under op).
 */
static inline int sm70__attn_args_make(struct sm70__attn_args *a, struct sm70__cuda *c,
				       const char *op, void *out, const void *q, int q_ld,
				       const struct sm70_kv_layer *kv,
				       const struct sm70_kv_layout *lay,
				       const struct sm70_batch *b, int n_heads, float scale)
{
	const enum sm70__kv_pair pair = sm70__kv_pair_of(lay);
	const int k_fp8 = sm70__kv_pair_k_fp8(pair), v_fp8 = sm70__kv_pair_v_fp8(pair);
	const float fp8_mul = 256.0f;

	if (b->n_tokens <= 0 || lay->n_kv_heads <= 0 || n_heads % lay->n_kv_heads)
		return -EINVAL;
	if (pair == SM70__KV_NONE) {
		sm70__cuda_fail(&c->be, op, __FILE__, __LINE__, "unsupported KV dtypes");
		return -ENOTSUP;
	}
	a->out = (__half *)out;
	a->q = (const __half *)q;
	a->q_ld = q_ld;
	a->kc = kv->k;
	a->vc = kv->v;
	a->k_mul = scale * (k_fp8 ? kv->k_scale * fp8_mul : 1.0f);
	a->v_mul = v_fp8 ? kv->v_scale * fp8_mul : 1.0f;
	a->n_kv = lay->n_kv_heads;
	a->bs = lay->block_size;
	a->max_blocks = b->max_blocks;
	a->tok_pos = b->tok_pos;
	a->tok_seq = b->tok_seq;
	a->block_tables = b->block_tables;
	a->n_heads = n_heads;
	a->group = n_heads / lay->n_kv_heads;
	a->chunk = 0;
	a->nsplit = 1;
	a->even = 0;
	a->span = 0;
	a->part = NULL;
	a->count = NULL;
	return 0;
}

#endif
