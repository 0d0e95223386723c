/*
 * attention.cu - the CUDA attention op: causal attention of each new token over its
 * sequence's paged KV cache (K and V each f16 or FP8-E4M3: kv_pair.h's three pairs), f16
 * q and out, fp32 softmax.
 *
 * Fast path (tensor cores, head_dim 32/64/128/256, up to 16 query heads per KV head): one
 * block of 8 warps per (token, KV head, split) computes every query head of the GQA group,
 * so each K/V element is read from memory once per group. The group's q rows, padded with
 * zeros to 16, are the A operand of WMMA 16x16x16 products (f16 in, fp32 accumulate, the
 * SM70 feature set): S = Q K^T for a tile of 64 positions, an online softmax over S by one
 * warp per head (P rounded to f16, as flash attention does), then O += P V, the running
 * O held in accumulator fragments and rescaled by a fragment loaded from a 16x16 matrix of
 * each row's factor (the fragment layout is opaque; this keeps no row map in registers).
 * The next tile's K and V are loaded into registers (FP8: two tiles ahead; K FP8 with V
 * f16 mostly two as well, see attn_tc_npf) while the current one is multiplied, so memory
 * stays busy; the first tiles' loads go out before q is staged. Positions are split over
 * enough blocks to fill every SM once (split-KV), each token's own positions cut evenly
 * over its splits (attn_decode.h's sm70__attn_split_rows; SM70_ATTN_EVEN=0 is the path
 * back to spans sized by the batch's bound); each split writes (unnormalised sum,
 * max, normaliser) to the backend's scratch and a merge kernel combines them (weights in
 * one pass, then 16-byte loads of every split at once).
 *
 * The fp32 SIMT kernel (SM70_ATTENTION=simt, or shapes the tensor-core path does not
 * take): one block per (token, KV head, split) as above, tiles copied (FP8 decoded) into
 * shared memory as f16, scores and P V in fp32 FMAs. Its body is attn_decode.h's, shared
 * with sparse_attention.cu; dense_rows below makes its rows the positions 0..tok_pos.
 *
 * Reference path (SM70_ATTENTION=reference, or a shape the fast path does not take): one
 * block per (token, head), one thread per output dim, one position at a time through the
 * same online softmax (attn_decode.h's reference kernel). Slow and plain on purpose.
 *
 * FP8 decode is integer work: an e4m3 byte's magnitude shifted left by 7 is an f16 whose
 * value is 2^-8 times the e4m3 value (subnormals included), so the tile holds those f16s
 * and the 2^8 goes into the scale. The NaN code 0x7f (never written by kv_write but for a
 * NaN input) decodes as 480 on the fast path.
 *
 * Prefill path (batches with chunks, head_dim 64/128/256, GQA up to 16): the decodes
 * [0, n_decode) run as above, and one block per (tile of 64 / group consecutive tokens of
 * a chunk, KV head) takes the tile's tokens times the group's heads as 64 query rows: each
 * K/V tile of the paged cache is loaded into shared memory once for all of them, S = Q K^T
 * and O += P V are WMMA products, the online softmax is fp32 with the causal mask by
 * position. A prompt's context is then read once per tile, not once per token. Blocks find
 * their chunk by scanning chunk_first / chunk_len, so the grid needs nothing uploaded (the
 * host sums the tiles from the host copies); prefill steps are never graph-captured.
 *
 * Batch invariance (the backend's batch_invariant): attn_invariant below; every token takes
 * the decode kernels with splits of a fixed span.
 *
 * Non-goals: sliding windows, ALiBi, soft-capping, sinks; split-KV for prefill (a short
 * chunk at a long context has few blocks); head_dim 32 or above 256 on the prefill path.
 */
#include <math.h>
#include <mma.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/attn_decode.h"
#include "kernels/cuda/pdl.h"

/* A split's partial for one head (cuda_check.h states the layout). */
#define ATTN_PR(D) SM70__ATTN_PR(D)

/* The decode kernels' rows (attn_decode.h's row source): positions 0..tok_pos, each slot
 * computed where it is loaded (a block table lookup). */
struct dense_rows {
	typedef struct sm70__attn_args args;
	static constexpr bool staged = false;
	static constexpr bool may_be_empty = false; /* a token sees its own position */
	static constexpr int split_tiles = 2;
	static constexpr const char *op = "attention";
	static constexpr const char *split_call = "launch attn_split_kernel (attention)";
	static constexpr const char *ref_call = "launch attn_ref_kernel (attention)";
	const int32_t *bt;
	int bs, n;

	__device__ dense_rows(const struct sm70__attn_args &a, int tok)
		: bt(a.block_tables + (size_t)a.tok_seq[tok] * a.max_blocks), bs(a.bs),
		  n(a.tok_pos[tok] + 1)
	{
	}
	__device__ size_t slot(int i) const { return (size_t)bt[i / bs] * bs + i % bs; }
};

/* Normalised merge weights of one (token, head)'s ns partials (row stride PR floats, m at
 * D, l at D + 1) into w_s[0, ns), by one warp, using w_s[ns, 2 ns) for the l's: one pass
 * over the partials. Each lane reads back only what it wrote, so no barrier inside. */
static __device__ void attn_merge_weights(const float *pb, int ns, int D, float *w_s)
{
	const int lane = threadIdx.x & 31, PR = ATTN_PR(D);
	float mx = -INFINITY, l = 0.0f;

	for (int z = lane; z < ns; z += 32) {
		const float2 ml = __ldcg((const float2 *)(pb + (size_t)z * PR + D));

		w_s[z] = ml.x;
		w_s[ns + z] = ml.y;
		mx = fmaxf(mx, ml.x);
	}
	mx = sm70__warp_max(mx);
	for (int z = lane; z < ns; z += 32) {
		const float lz = w_s[ns + z];
		/* an empty split (past this token's position) has l = 0, m = -inf */
		const float w = lz > 0.0f ? expf(w_s[z] - mx) : 0.0f;

		w_s[z] = w;
		l += w * lz;
	}
	l = 1.0f / sm70__warp_sum(l);
	for (int z = lane; z < ns; z += 32)
		w_s[z] *= l;
}

/* o += w * v: the merge's one accumulation, shared by the merge kernel and the folded
 * merge so that both give the same bits. */
static __device__ __forceinline__ void attn_merge_add(float4 &o, float w, float4 v)
{
	o.x += w * v.x;
	o.y += w * v.y;
	o.z += w * v.z;
	o.w += w * v.w;
}

static __device__ __forceinline__ void attn_store4(__half *o, float4 v)
{
	((__half2 *)o)[0] = __floats2half2_rn(v.x, v.y);
	((__half2 *)o)[1] = __floats2half2_rn(v.z, v.w);
}

#define MERGE_PF 16 /* partials a thread loads before the weights are known */

/* Merges the nsplit partials of each (token, head): one block each, one thread per 4 dims;
 * the first warp computes the weights. Each thread's first MERGE_PF partials load while
 * that warp reads the m's and l's, so a merge costs one L2 latency instead of two. The
 * partials come through L2 (__ldcg): other blocks wrote them. The sum runs over z in order. */
static __global__ void attn_merge_kernel(__half *__restrict__ out,
					 const float *__restrict__ part, int nsplit, int D)
{
	sm70__pdl_enter();
	extern __shared__ float w_s[]; /* 2 * nsplit */
	const float *pp = part + (size_t)blockIdx.x * nsplit * ATTN_PR(D);
	const int tid = threadIdx.x;
	const bool mine = tid < D / 4;
	float4 pre[MERGE_PF], o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);

#pragma unroll
	for (int z = 0; z < MERGE_PF; z++)
		if (mine && z < nsplit)
			pre[z] = __ldcg((const float4 *)(pp + tid * 4 + (size_t)z * ATTN_PR(D)));
	if (tid < 32)
		attn_merge_weights(pp, nsplit, D, w_s);
	__syncthreads();
	if (!mine)
		return;
#pragma unroll
	for (int z = 0; z < MERGE_PF; z++) {
		if (z < nsplit)
			attn_merge_add(o, w_s[z], pre[z]);
	}
	for (int z = MERGE_PF; z < nsplit; z++)
		attn_merge_add(o, w_s[z],
			       __ldcg((const float4 *)(pp + tid * 4 + (size_t)z * ATTN_PR(D))));
	attn_store4(out + (size_t)blockIdx.x * D + tid * 4, o);
}

/* See cuda_check.h. */
int sm70__cuda_attn_merge(struct sm70__cuda *c, __half *out, const float *part, int rows,
			  int nsplit, int D)
{
	sm70__launch_pdl(c, SM70__PDL_MERGE, attn_merge_kernel, dim3(rows),
			 dim3((D / 4 + 31) / 32 * 32), (size_t)nsplit * 2 * sizeof(float), out,
			 part, nsplit, D);
	if (SM70_CUDA_LAUNCHED(&c->be, "attn_merge_kernel"))
		return -EIO;
	return 0;
}

/* Queues the merge of a's a.nsplit partials per (token, head) into a.out. */
static int attn_merge_launch(struct sm70__cuda *c, const struct sm70__attn_args &a,
			     int n_tokens, int D)
{
	return sm70__cuda_attn_merge(c, a.out, a.part, n_tokens * a.n_heads, a.nsplit, D);
}

/* ---- tensor-core path -------------------------------------------------------------- */

#define TC_THREADS 256
#define TC_WARPS 8

/* Byte offsets of the tensor-core kernel's shared memory: q (16 rows), K and V tiles (f16,
 * rows padded by 16 bytes so ldmatrix rows fall in different banks), the S partials of
 * the NSPL warps that split head_dim, P (f16), each head's alpha repeated 16 times (an
 * accumulator fragment loaded from it holds, element for element, the factor of the O
 * fragment's element: no row map held in registers), then m and l per head. */
template <int D, int TP> struct tcl {
	static constexpr int QS = D + 8;                  /* halves */
	static constexpr int NSPL = TC_WARPS / (TP / 16); /* warps per S column tile */
	static constexpr int SS = TP + 4;                 /* floats */
	static constexpr int PS = TP + 8;                 /* halves */
	static constexpr size_t q_off = 0;
	static constexpr size_t k_off = q_off + (size_t)16 * QS * 2;
	static constexpr size_t v_off = k_off + (size_t)TP * QS * 2;
	static constexpr size_t s_off = v_off + (size_t)TP * QS * 2;
	static constexpr size_t p_off = s_off + (size_t)NSPL * 16 * SS * 4;
	static constexpr size_t a_off = p_off + (size_t)16 * PS * 2;
	static constexpr size_t f_off = a_off + (size_t)16 * 16 * 4;
	static constexpr size_t bytes = f_off + 2 * 16 * 4;
	static_assert((D / 16) % NSPL == 0, "head_dim too small for this tile");
	static_assert((size_t)16 * (D + 4) * 4 <= (size_t)TP * QS * 2, "O staging");
};

/* 16 e4m3 bytes to 16 f16 holding 2^-8 times their values: the magnitude bits shifted
 * left by 7 land in the f16 exponent and mantissa, and the sign, one bit low, is moved up
 * by adding it to itself. Four integer operations per two values. */
static __device__ __forceinline__ void e4m3x16_to_f16_scaled(uint4 in, uint4 &lo, uint4 &hi)
{
	const uint32_t src[4] = { in.x, in.y, in.z, in.w };
	uint32_t dst[8];

#pragma unroll
	for (int i = 0; i < 4; i++) {
		uint32_t a = __byte_perm(src[i], 0, 0x4140) << 7;
		uint32_t b = __byte_perm(src[i], 0, 0x4342) << 7;

		dst[2 * i] = a + (a & 0x40004000u);
		dst[2 * i + 1] = b + (b & 0x40004000u);
	}
	lo = make_uint4(dst[0], dst[1], dst[2], dst[3]);
	hi = make_uint4(dst[4], dst[5], dst[6], dst[7]);
}

/* ---- the tensor-core decode kernel's tile steps ------------------------------------- */

typedef nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float> atc_acc;

/* S = Q K^T of one tile into s_s: warp w takes column tile w % (TP/16) over its share of
 * D (NSPL warps a column tile, their partial sums added by the softmax). */
template <int D, int TP>
static __device__ __forceinline__ void atc_scores(const __half *q_s, const __half *k_s,
						  float *s_s, int warp)
{
	using namespace nvcuda;
	using L = tcl<D, TP>;
	constexpr int QS = L::QS, SS = L::SS, KST = D / 16 / L::NSPL;
	const int ct = warp % (TP / 16), sp = warp / (TP / 16);
	atc_acc sf;

	wmma::fill_fragment(sf, 0.0f);
#pragma unroll
	for (int kk = 0; kk < KST; kk++) {
		const int k0 = (sp * KST + kk) * 16;
		wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> qa;
		wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> kb;

		wmma::load_matrix_sync(qa, q_s + k0, QS);
		wmma::load_matrix_sync(kb, k_s + ct * 16 * QS + k0, QS);
		wmma::mma_sync(sf, qa, kb, sf);
	}
	wmma::store_matrix_sync(s_s + sp * 16 * SS + ct * 16, sf, SS, wmma::mem_row_major);
}

/* The online softmax over a tile's nt scores, one warp per head (TC_WARPS warps): P
 * rounded to f16 into p_s, each head's alpha repeated 16 times into al_m, m and l
 * updated. kmul folds the scale and log2(e): scores in log2 units. */
template <int D, int TP>
static __device__ __forceinline__ void atc_softmax(const float *s_s, __half *p_s, float *al_m,
						   float *m_s, float *l_s, int G, int nt,
						   float kmul, int warp, int lane)
{
	using L = tcl<D, TP>;
	constexpr int SS = L::SS, PS = L::PS, NSPL = L::NSPL;

	for (int g = warp; g < G; g += TC_WARPS) {
		float v[TP / 32], mx = -INFINITY, sum = 0.0f;

#pragma unroll
		for (int j = 0; j < TP / 32; j++) {
			const int r = lane + 32 * j;
			float sc = 0.0f;

#pragma unroll
			for (int sp = 0; sp < NSPL; sp++)
				sc += s_s[sp * 16 * SS + g * SS + r];
			v[j] = r < nt ? sc * kmul : -INFINITY;
			mx = fmaxf(mx, v[j]);
		}
		mx = sm70__warp_max(mx);
		const float m_old = m_s[g], m_new = fmaxf(m_old, mx);
#pragma unroll
		for (int j = 0; j < TP / 32; j++) {
			const __half e = __float2half_rn(exp2f(v[j] - m_new));

			p_s[g * PS + lane + 32 * j] = e;
			sum += __half2float(e);
		}
		sum = sm70__warp_sum(sum);
		const float alpha = exp2f(m_old - m_new);

		if (lane < 16)
			al_m[g * 16 + lane] = alpha;
		if (lane == 0) {
			l_s[g] = l_s[g] * alpha + sum;
			m_s[g] = m_new;
		}
	}
}

/* O = O * alpha + P V: warp w owns O column tiles w, w + TC_WARPS, ... */
template <int D, int TP, int NCT>
static __device__ __forceinline__ void atc_pv(atc_acc (&acc)[NCT], const float *al_m,
					      const __half *p_s, const __half *v_s, int warp)
{
	using namespace nvcuda;
	using L = tcl<D, TP>;
	constexpr int QS = L::QS, PS = L::PS;
	atc_acc af;

	wmma::load_matrix_sync(af, al_m, 16, wmma::mem_row_major);
#pragma unroll
	for (int ci = 0; ci < NCT; ci++)
#pragma unroll
		for (int e = 0; e < atc_acc::num_elements; e++)
			acc[ci].x[e] *= af.x[e];
#pragma unroll
	for (int ci = 0; ci < NCT; ci++) {
		const int ct = warp + ci * TC_WARPS;

		if (ct >= D / 16)
			break;
#pragma unroll
		for (int ks = 0; ks < TP / 16; ks++) {
			wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> pa;
			wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> vb;

			wmma::load_matrix_sync(pa, p_s + ks * 16, PS);
			wmma::load_matrix_sync(vb, v_s + ks * 16 * QS + ct * 16, QS);
			wmma::mma_sync(acc[ci], pa, vb, acc[ci]);
		}
	}
}

/* The block's result from its O fragments: staged through o_s (free shared memory of at
 * least 16 (D + 4) floats) to the group's output rows when the block is the only split,
 * else to its partials. */
template <int D, int NCT>
static __device__ __forceinline__ void atc_finish(const struct sm70__attn_args &a,
						  atc_acc (&acc)[NCT], float *o_s,
						  const float *m_s, const float *l_s, int tok, int kvh,
						  int split)
{
	using namespace nvcuda;
	constexpr int OS = D + 4, n = TC_THREADS;
	const int tid = threadIdx.x, warp = tid >> 5, G = a.group;

	__syncthreads(); /* every warp done with the tiles o_s overlays */
#pragma unroll
	for (int ci = 0; ci < NCT; ci++) {
		const int ct = warp + ci * TC_WARPS;

		if (ct < D / 16)
			wmma::store_matrix_sync(o_s + ct * 16, acc[ci], OS, wmma::mem_row_major);
	}
	__syncthreads();
	if (a.nsplit == 1) {
		__half *o = a.out + ((size_t)tok * a.n_heads + (size_t)kvh * G) * D;

		for (int i = tid; i < G * D; i += n) {
			const int g = i / D, dd = i - g * D;

			o[i] = __float2half_rn(o_s[g * OS + dd] * a.v_mul / l_s[g]);
		}
		return;
	}
	for (int i = tid; i < G * (D + 2); i += n) {
		const int g = i / (D + 2), j = i - g * (D + 2);
		const int h = kvh * G + g;
		float *pp = a.part + (((size_t)tok * a.n_heads + h) * a.nsplit + split) * ATTN_PR(D);

		/* the merge works in natural-log units */
		pp[j] = j == D ? m_s[g] * 0.6931471805599453f :
			j == D + 1 ? l_s[g] : o_s[g * OS + j] * a.v_mul;
	}
}

/* The merge folded into the split kernel (SM70_ATTN_FOLD=1): called by every thread of a
 * split block after its partials are written. The last of the (token, KV head)'s blocks
 * to arrive merges that head group's G rows with attn_merge_kernel's arithmetic in its
 * order (so the output is the same bits), using w_s (2 G nsplit floats of the block's
 * shared memory, free by then), and puts the counter back to 0. One launch less a
 * layer; the counters are zeroed once at backend creation, not per call. */
template <int D>
static __device__ void attn_fold_merge(const struct sm70__attn_args &a, int tok, int kvh,
				       float *w_s)
{
	__shared__ int last;
	const int G = a.group, ns = a.nsplit, tid = threadIdx.x;
	const size_t row0 = (size_t)tok * a.n_heads + (size_t)kvh * G;

	__threadfence();
	__syncthreads();
	if (tid == 0)
		last = atomicAdd(&a.count[blockIdx.x], 1) == ns - 1;
	__syncthreads();
	if (!last)
		return;
	__threadfence();
	for (int g = tid >> 5; g < G; g += TC_WARPS)
		attn_merge_weights(a.part + (row0 + g) * ns * ATTN_PR(D), ns, D, w_s + 2 * g * ns);
	__syncthreads();
	for (int i = tid; i < G * (D / 4); i += TC_THREADS) {
		const int g = i / (D / 4), d4 = i - g * (D / 4);
		const float *pp = a.part + (row0 + g) * ns * ATTN_PR(D) + d4 * 4;
		const float *w = w_s + 2 * g * ns;
		float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);

		for (int z = 0; z < ns; z++)
			attn_merge_add(o, w[z],
				       __ldcg((const float4 *)(pp + (size_t)z * ATTN_PR(D))));
		attn_store4(a.out + (row0 + g) * D + d4 * 4, o);
	}
	if (tid == 0)
		a.count[blockIdx.x] = 0;
}

/* The cache slot of position p through block table bt (bs positions a block; bsh its log2
 * when a power of two, else -1: a shift instead of a division on every load). */
static __device__ __forceinline__ size_t atc_slot(const int32_t *bt, int p, int bs, int bsh)
{
	if (bsh >= 0)
		return ((size_t)bt[p >> bsh] << bsh) + (size_t)(p & (bs - 1));
	return (size_t)bt[p / bs] * bs + p % bs;
}

/* K FP8 with V f16 (the loads of the two differ in size): thread tid takes row tid / TPR
 * of tile t (positions p0 + t*TP ...), TPR = TC_THREADS / TP threads a row, so its slot,
 * block-table entry and divisions are worked out once for both tensors; its K loads are
 * chunks j, j + TPR, ... of the row's CPK (j = tid % TPR), its V loads the same of CPV.
 * (Mapping each tensor's loads over the block on its own made every load compute its own
 * row: 1.5 times the integer work and dependent block-table loads of the one-dtype
 * kernels, and slower than f16.) Rows past the range read as zero so that 0 * garbage
 * never reaches P V. attn_tc_kernel's, in its scope. */
#define ATC_LOAD_ROW(kregs, vregs, t)                                                     \
	do {                                                                              \
		const int t0_ = p0 + (t) * TP, r_ = tid / TPR, j_ = tid - r_ * TPR;       \
		_Pragma("unroll") for (int c = 0; c < CHK; c++)                           \
			(kregs)[c] = make_uint4(0, 0, 0, 0);                              \
		_Pragma("unroll") for (int c = 0; c < CHV; c++)                           \
			(vregs)[c] = make_uint4(0, 0, 0, 0);                              \
		if (r_ < p1 - t0_) {                                                      \
			const int p_ = t0_ + r_;                                          \
			const size_t row_ = atc_slot(bt, p_, a.bs, bsh) *                 \
					    a.n_kv + kvh;                                 \
			const uint4 *kp_ =                                                \
				(const uint4 *)((const char *)a.kc + row_ * D * KSZ);     \
			const uint4 *vp_ =                                                \
				(const uint4 *)((const char *)a.vc + row_ * D * VSZ);     \
			_Pragma("unroll") for (int c = 0; c < CHK; c++)                   \
				if (j_ + c * TPR < CPK)                                   \
					(kregs)[c] = __ldg(kp_ + j_ + c * TPR);           \
			_Pragma("unroll") for (int c = 0; c < CHV; c++)                   \
				if (j_ + c * TPR < CPV)                                   \
					(vregs)[c] = __ldg(vp_ + j_ + c * TPR);           \
		}                                                                         \
	} while (0)

/* ATC_LOAD_ROW's registers into the f16 tiles, K decoded from FP8. */
#define ATC_STAGE_ROW(kregs, vregs)                                                       \
	do {                                                                              \
		const int r_ = tid / TPR, j_ = tid - r_ * TPR;                            \
		_Pragma("unroll") for (int c = 0; c < CHK; c++) {                         \
			if (j_ + c * TPR < CPK) {                                         \
				uint4 lo_, hi_;                                           \
				e4m3x16_to_f16_scaled((kregs)[c], lo_, hi_);              \
				*(uint4 *)(k_s + r_ * QS + (j_ + c * TPR) * 16) = lo_;    \
				*(uint4 *)(k_s + r_ * QS + (j_ + c * TPR) * 16 + 8) =     \
					hi_;                                              \
			}                                                                 \
		}                                                                         \
		_Pragma("unroll") for (int c = 0; c < CHV; c++)                           \
			if (j_ + c * TPR < CPV)                                           \
				*(uint4 *)(v_s + r_ * QS + (j_ + c * TPR) * 8) =          \
					(vregs)[c];                                       \
	} while (0)

/* One block of 8 warps per (token, KV head, split), TP positions a tile, NPF tiles loaded
 * ahead into registers; K in FP8 when KF8, V when VF8 (else f16). */
template <int D, bool KF8, bool VF8, int TP, int NPF>
static __global__ void __launch_bounds__(TC_THREADS, 2) attn_tc_kernel(struct sm70__attn_args a)
{
	sm70__pdl_enter();
	using namespace nvcuda;
	using L = tcl<D, TP>;
	constexpr int QS = L::QS, PS = L::PS;
	constexpr int EPK = KF8 ? 16 : 8, EPV = VF8 ? 16 : 8; /* values per 16-byte load */
	constexpr int CPK = D / EPK, CPV = D / EPV;           /* loads per row */
	constexpr int CHK = (TP * CPK + TC_THREADS - 1) / TC_THREADS; /* loads a thread */
	constexpr int CHV = (TP * CPV + TC_THREADS - 1) / TC_THREADS;
	constexpr int TPR = TC_THREADS / TP; /* threads a row (K FP8 with V f16) */
	constexpr size_t KSZ = KF8 ? 1 : 2, VSZ = VF8 ? 1 : 2; /* bytes a value */
	constexpr int NCT = (D / 16 + TC_WARPS - 1) / TC_WARPS; /* O column tiles a warp */
	constexpr float LOG2E = 1.4426950408889634f;
	extern __shared__ __align__(128) unsigned char sm[];
	__half *q_s = (__half *)(sm + L::q_off);
	__half *k_s = (__half *)(sm + L::k_off);
	__half *v_s = (__half *)(sm + L::v_off);
	float *s_s = (float *)(sm + L::s_off);
	__half *p_s = (__half *)(sm + L::p_off);
	float *al_m = (float *)(sm + L::a_off); /* [16][16] */
	float *m_s = (float *)(sm + L::f_off), *l_s = m_s + 16;

	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
	const int G = a.group;
	const int tok = blockIdx.x / a.n_kv, kvh = blockIdx.x - tok * a.n_kv;
	const int split = blockIdx.y;
	const int npos = a.tok_pos[tok] + 1;
	int p0, p1;
	sm70__attn_split_rows<TP>(a, npos, split, p0, p1);
	const int ntiles = p1 > p0 ? (p1 - p0 + TP - 1) / TP : 0;
	const int32_t *bt = a.block_tables + (size_t)a.tok_seq[tok] * a.max_blocks;
	const int bsh = (a.bs & (a.bs - 1)) ? -1 : __ffs(a.bs) - 1;
	const __half *qt = a.q + (size_t)tok * a.q_ld + (size_t)kvh * G * D;
	const float kmul = a.k_mul * LOG2E; /* scores in log2 units: exp2f below */
	uint4 kr[NPF][CHK], vr[NPF][CHV];
	atc_acc acc[NCT];

	/* K and V of tile t into register slot d. One dtype: each load's slot serves K and V;
	 * K FP8 with V f16: a row's K is half the loads of its V, so each has its own. */
#define ATC_LOAD(d, t)                                                                    \
	do {                                                                              \
		if constexpr (KF8 == VF8) {                                               \
			const int t0_ = p0 + (t) * TP, nt_ = min(TP, p1 - t0_);           \
			_Pragma("unroll") for (int c = 0; c < CHK; c++) {                 \
				const int idx_ = tid + c * TC_THREADS, r_ = idx_ / CPK;   \
				kr[d][c] = vr[d][c] = make_uint4(0, 0, 0, 0);             \
				if (idx_ < TP * CPK && r_ < nt_) {                        \
					const int p_ = t0_ + r_;                          \
					const size_t slot_ =                              \
						atc_slot(bt, p_, a.bs, bsh);      \
					const size_t off_ = ((slot_ * a.n_kv + kvh) * D + \
							     (size_t)(idx_ - r_ * CPK) * EPK) * \
							    KSZ;                          \
					kr[d][c] = __ldg((const uint4 *)((const char *)a.kc +     \
									 off_));                  \
					vr[d][c] = __ldg((const uint4 *)((const char *)a.vc +     \
									 off_));                  \
				}                                                         \
			}                                                                 \
		} else {                                                                  \
			ATC_LOAD_ROW(kr[d], vr[d], t);                                    \
		}                                                                         \
	} while (0)

	/* the first tiles' loads go out before q is staged: their latency covers it */
#pragma unroll
	for (int d = 0; d < NPF; d++)
		if (d < ntiles)
			ATC_LOAD(d, d);

	for (int i = tid; i < 16 * (D / 8); i += TC_THREADS) {
		const int g = i / (D / 8), c8 = i - g * (D / 8);

		*(uint4 *)(q_s + g * QS + c8 * 8) =
			g < G ? __ldg((const uint4 *)(qt + (size_t)g * D) + c8) :
				make_uint4(0, 0, 0, 0);
	}
	for (int i = tid; i < 16 * PS / 8; i += TC_THREADS)
		((uint4 *)p_s)[i] = make_uint4(0, 0, 0, 0);
	if (tid < 16) {
		m_s[tid] = -INFINITY;
		l_s[tid] = 0.0f;
	}
	for (int i = tid; i < 256; i += TC_THREADS)
		al_m[i] = 1.0f; /* rows past the group keep 1: their O is 0 */
#pragma unroll
	for (int ci = 0; ci < NCT; ci++)
		wmma::fill_fragment(acc[ci], 0.0f);

	for (int t = 0; t < ntiles; t += NPF) {
#pragma unroll
		for (int d = 0; d < NPF; d++) {
			const int tt = t + d;

			if (tt >= ntiles)
				break;
			const int nt = min(TP, p1 - (p0 + tt * TP));

			__syncthreads(); /* the last tile's readers are done */
			if constexpr (KF8 == VF8) {
				/* K's and V's loads in one loop, as they were made */
#pragma unroll
				for (int c = 0; c < CHK; c++) {
					const int idx = tid + c * TC_THREADS, r = idx / CPK;
					const int col = (idx - r * CPK) * EPK;

					if (idx >= TP * CPK)
						break;
					if (KF8) {
						uint4 lo, hi;

						e4m3x16_to_f16_scaled(kr[d][c], lo, hi);
						*(uint4 *)(k_s + r * QS + col) = lo;
						*(uint4 *)(k_s + r * QS + col + 8) = hi;
						e4m3x16_to_f16_scaled(vr[d][c], lo, hi);
						*(uint4 *)(v_s + r * QS + col) = lo;
						*(uint4 *)(v_s + r * QS + col + 8) = hi;
					} else {
						*(uint4 *)(k_s + r * QS + col) = kr[d][c];
						*(uint4 *)(v_s + r * QS + col) = vr[d][c];
					}
				}
			} else {
				ATC_STAGE_ROW(kr[d], vr[d]);
			}
			if (tt + NPF < ntiles)
				ATC_LOAD(d, tt + NPF);
			__syncthreads();

			atc_scores<D, TP>(q_s, k_s, s_s, warp);
			__syncthreads();
			atc_softmax<D, TP>(s_s, p_s, al_m, m_s, l_s, G, nt, kmul, warp, lane);
			__syncthreads();
			atc_pv<D, TP, NCT>(acc, al_m, p_s, v_s, warp);
		}
	}
#undef ATC_LOAD
#undef ATC_LOAD_ROW
#undef ATC_STAGE_ROW

	/* O through shared memory (the K tile's space) to plain rows */
	atc_finish<D, NCT>(a, acc, (float *)k_s, m_s, l_s, tok, kvh, split);
	if (a.nsplit > 1 && a.count)
		attn_fold_merge<D>(a, tok, kvh, (float *)sm);
}

/* Queues the tensor-core kernel (and the merge when split). -ENOSPC: the shape does not
 * fit this device; the caller falls back. */
template <int D, bool KF8, bool VF8, int TP, int NPF>
static int attn_tc_launch(struct sm70__cuda *c, struct sm70__attn_args a, int n_tokens, int max_pos)
{
	const size_t smem = tcl<D, TP>::bytes;
	const long blocks = (long)n_tokens * a.n_kv;
	int resident;

	if (a.group > 16 || smem > c->smem_optin)
		return -ENOSPC;
	resident = sm70__cuda_resident(c, (const void *)attn_tc_kernel<D, KF8, VF8, TP, NPF>,
				       TC_THREADS, smem);
	if (c->sticky)
		return -EIO;
	if (resident < 1)
		return -ENOSPC;
	/* Split positions until the blocks fill every SM's resident slots once (never more:
	 * a second partial wave would cost a whole block's time). */
	sm70__attn_size_split(c, &a, n_tokens, D, max_pos, (long)resident * c->n_sm / blocks, TP,
			      TP);
	/* fold the merge in when asked and the counters and the weights' shared memory hold */
	if (c->attn_count && a.nsplit > 1 && blocks <= SM70__CUDA_ATTN_COUNTERS &&
	    (size_t)2 * a.group * a.nsplit * sizeof(float) <= smem)
		a.count = c->attn_count;
	sm70__launch_pdl(c, SM70__PDL_ATTN, attn_tc_kernel<D, KF8, VF8, TP, NPF>,
			 dim3((unsigned)blocks, a.nsplit), dim3(TC_THREADS), smem, a);
	if (SM70_CUDA_LAUNCHED(&c->be, "attn_tc_kernel"))
		return -EIO;
	if (a.nsplit > 1 && !a.count)
		return attn_merge_launch(c, a, n_tokens, D);
	return 0;
}

/*
 * Tiles loaded ahead (NPF). 64-position tiles: f16 one, FP8 two (the same bytes in flight,
 * in the same registers); 32-position tiles (head_dim 256 where shared memory is small,
 * before sm_80: less work a tile to cover a load) twice that. A tile of K FP8 with V f16
 * is 3/4 of an f16 tile: two ahead keep 1.5 f16 tiles' bytes in flight (one would leave
 * 0.75), in 48 registers of prefetch a thread at head_dim 128 (f16 and FP8: 32), 121 in
 * all, no spills (sm_90, -Xptxas -v). At head_dim 256 with 64-position tiles two would be
 * 96 registers and spill (412 bytes), so one; with 32-position tiles two (48 registers;
 * three spill).
 */
template <int D, bool KF8, bool VF8, int TP> static constexpr int attn_tc_npf()
{
	if (TP == 128)
		return 1; /* FP8 K and V: the registers of two 64-position tiles (attn_wide_tile) */
	if (KF8 && !VF8)
		return D == 256 && TP == 64 ? 1 : 2;
	return (KF8 ? 2 : 1) * (TP == 64 ? 1 : 2);
}

/*
 * 128-position tiles for K and V both FP8 (head_dim 64 and 128). A tile's steps (scores,
 * softmax, P V, four barriers) take the same time whatever its bytes, so with half of
 * f16's bytes a tile the kernel is bound by those steps, not by memory; tiles twice as
 * long halve the steps per byte. Prefetched one ahead they hold what two 64-position
 * tiles did. Measured (docs/PERFORMANCE.md, "FP8 KV: 128-position tiles"): 1.14x at 16K
 * B8 and B16, about level at 1K B1; for K FP8 with V f16 they lost (0.82x at 16K B16), so
 * that pair keeps 64. They halve the blocks a context fills, so they are taken where each
 * resident block slot still gets at least SM70_ATTN_WIDE_MIN positions (256 unless set)
 * of the bound; SM70_ATTN_TILE=64 or 128 forces either. Never under batch invariance (its
 * kernel choice may not depend on the batch).
 */
static int attn_wide_tile(struct sm70__cuda *c, int n_tokens, int n_kv, int max_pos)
{
	static int forced = -1, min_pos = 256;

	if (forced < 0) {
		const char *v = getenv("SM70_ATTN_TILE"), *m = getenv("SM70_ATTN_WIDE_MIN");

		forced = v && !strcmp(v, "64") ? 64 : v && !strcmp(v, "128") ? 128 : 0;
		if (m && atoi(m) > 0)
			min_pos = atoi(m);
	}
	if (c->be.batch_invariant || forced == 64)
		return 0;
	if (forced == 128)
		return 1;
	return (long)n_tokens * n_kv * max_pos >= (long)min_pos * 2 * c->n_sm;
}

/* 64-position tiles; 32 for head_dim 256 where shared memory is small (before sm_80); 128
 * for FP8 K and V where attn_wide_tile says. */
template <int D, bool KF8, bool VF8>
static int attn_tc_pick(struct sm70__cuda *c, const struct sm70__attn_args &a, int n_tokens,
			int max_pos)
{
	if (D == 256 && tcl<256, 64>::bytes > c->smem_optin)
		return attn_tc_launch<256, KF8, VF8, 32, attn_tc_npf<256, KF8, VF8, 32>()>(
			c, a, n_tokens, max_pos);
	if constexpr (KF8 && VF8 && D <= 128 && D >= 64) {
		if (attn_wide_tile(c, n_tokens, a.n_kv, max_pos) &&
		    tcl<D, 128>::bytes <= c->smem_optin)
			return attn_tc_launch<D, KF8, VF8, 128, attn_tc_npf<D, KF8, VF8, 128>()>(
				c, a, n_tokens, max_pos);
	}
	return attn_tc_launch<D, KF8, VF8, 64, attn_tc_npf<D, KF8, VF8, 64>()>(c, a, n_tokens,
										max_pos);
}

/* ---- prefill path ------------------------------------------------------------------ */

/* Query rows per prefill block: PF_ROWS / group consecutive tokens of one chunk times the
 * group's heads, row r being token r / group, head r % group (padded with zero rows). */
#define PF_ROWS 64

/* Byte offsets of the prefill kernel's shared memory: q (PF_ROWS rows), the K and V tiles
 * (f16, rows padded by 16 bytes), S (fp32), P (f16), then m, l and the position of each
 * row, and each row's alpha repeated 16 times: an accumulator fragment loaded from that
 * holds, element for element, the factor of the O fragment's element (no row map held in
 * registers). S doubles as the per-warp O staging at the end. */
template <int D, int TP> struct pfl {
	static constexpr int QS = D + 8; /* halves */
	static constexpr int SS = TP + 4; /* floats */
	static constexpr int PS = TP + 8; /* halves */
	static constexpr size_t q_off = 0;
	static constexpr size_t k_off = q_off + (size_t)PF_ROWS * QS * 2;
	static constexpr size_t v_off = k_off + (size_t)TP * QS * 2;
	static constexpr size_t s_off = v_off + (size_t)TP * QS * 2;
	static constexpr size_t p_off = s_off + (size_t)PF_ROWS * SS * 4;
	static constexpr size_t f_off = p_off + (size_t)PF_ROWS * PS * 2;
	static constexpr size_t a_off = f_off + 3 * PF_ROWS * 4;
	static constexpr size_t bytes = a_off + (size_t)PF_ROWS * 16 * 4;
	static_assert(PF_ROWS * SS >= TC_WARPS * 256, "O staging: 16x16 floats a warp");
	static_assert(TC_WARPS % (PF_ROWS / 16) == 0, "warps per row tile");
	static_assert((D / 16) % (TC_WARPS / (PF_ROWS / 16)) == 0, "O column tiles per warp");
};

struct pf_args {
	__half *out;
	const __half *q;
	int q_ld;
	const void *kc;
	const void *vc;
	float k_mul; /* as attn_args */
	float v_mul;
	int n_kv;
	int bs;
	int max_blocks;
	const int32_t *tok_pos;
	const int32_t *tok_seq;
	const int32_t *block_tables;
	const int32_t *chunk_first; /* device copies: the kernel finds its chunk there */
	const int32_t *chunk_len;
	int n_chunks;
	int n_heads;
	int group;
	int qt;      /* tokens per tile: PF_ROWS / group */
	int n_tiles; /* sum over chunks of ceil(len / qt) = gridDim.x */
};

/* Rows [t0, t0 + TP) of KV head kvh of one cache tensor (FP8 decoded when FP8) into its f16
 * tile, for the prefill kernel; rows at or past kv_end are zero. */
template <int D, bool FP8, int TP>
static __device__ __forceinline__ void pf_tile_load(__half *tile, const void *cache,
						    const struct pf_args &a, const int32_t *bt,
						    int kvh, int t0, int kv_end)
{
	constexpr int QS = D + 8, EPC = FP8 ? 16 : 8, CPR = D / EPC;
	constexpr size_t esz = FP8 ? 1 : 2;

	for (int idx = threadIdx.x; idx < TP * CPR; idx += TC_THREADS) {
		const int r = idx / CPR, col = (idx - r * CPR) * EPC, p = t0 + r;
		uint4 x = make_uint4(0, 0, 0, 0);

		if (p < kv_end) {
			const size_t slot = (size_t)bt[p / a.bs] * a.bs + p % a.bs;

			x = __ldg((const uint4 *)((const char *)cache +
						  ((slot * a.n_kv + kvh) * D + col) * esz));
		}
		if (FP8) {
			uint4 lo, hi;

			e4m3x16_to_f16_scaled(x, lo, hi);
			*(uint4 *)(tile + r * QS + col) = lo;
			*(uint4 *)(tile + r * QS + col + 8) = hi;
		} else {
			*(uint4 *)(tile + r * QS + col) = x;
		}
	}
}

/*
 * One block of 8 warps per (tile of qt consecutive tokens of one chunk, KV head): the tile's
 * PF_ROWS query rows (every head of the group for each token) against the sequence's
 * cache, positions 0..last position of the tile, TP positions a step. S = Q K^T by WMMA
 * (one or two 16x16 tiles a warp), an online softmax in fp32 by one warp per row with the
 * causal mask by position (P rounded to f16), then O += P V: warp w owns row tile w % 4
 * and half of the head_dim column tiles, accumulators in registers, rescaled by a fragment
 * of the rows' alphas. Blocks are taken last tile first, so the longest (latest
 * positions) start first. K in FP8 when KF8, V when VF8 (else f16).
 */
template <int D, bool KF8, bool VF8, int TP>
static __global__ void __launch_bounds__(TC_THREADS, 2) attn_prefill_kernel(struct pf_args a)
{
	using namespace nvcuda;
	using L = pfl<D, TP>;
	typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc_t;
	constexpr int QS = L::QS, SS = L::SS, PS = L::PS, M = PF_ROWS;
	constexpr int RT = M / 16;          /* row tiles */
	constexpr int CW = TC_WARPS / RT;   /* warps sharing a row tile's O columns */
	constexpr int NCW = D / 16 / CW;    /* O column tiles a warp */
	constexpr int EPC = KF8 ? 16 : 8;   /* values per 16-byte load (one dtype) */
	constexpr int CPR = D / EPC;        /* loads per row (one dtype) */
	constexpr float LOG2E = 1.4426950408889634f;
	extern __shared__ __align__(128) unsigned char sm[];
	__half *q_s = (__half *)(sm + L::q_off);
	__half *k_s = (__half *)(sm + L::k_off);
	__half *v_s = (__half *)(sm + L::v_off);
	float *s_s = (float *)(sm + L::s_off);
	__half *p_s = (__half *)(sm + L::p_off);
	float *m_s = (float *)(sm + L::f_off), *l_s = m_s + M;
	int *qp_s = (int *)(l_s + M);
	float *al_m = (float *)(sm + L::a_off); /* [M][16] */

	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
	const int G = a.group, kvh = blockIdx.y;
	const size_t esz = KF8 ? 1 : 2;
	int j = a.n_tiles - 1 - (int)blockIdx.x, ch = 0;

	/* this block's chunk and tile within it: a linear scan (at most max_seqs chunks) */
	for (;; ch++) {
		const int nt = (a.chunk_len[ch] + a.qt - 1) / a.qt;

		if (j < nt || ch == a.n_chunks - 1)
			break;
		j -= nt;
	}
	const int tok0 = a.chunk_first[ch] + j * a.qt;
	const int ntok = min(a.qt, a.chunk_len[ch] - j * a.qt);
	const int nrows = ntok * G;
	/* positions in a chunk are consecutive: the last token sees the most */
	const int kv_end = a.tok_pos[tok0 + ntok - 1] + 1;
	const int ntiles = (kv_end + TP - 1) / TP;
	const int32_t *bt = a.block_tables + (size_t)a.tok_seq[tok0] * a.max_blocks;
	const float kmul = a.k_mul * LOG2E; /* scores in log2 units: exp2f below */
	const int rt = warp % RT, cw = warp / RT;
	acc_t acc[NCW];

	for (int i = tid; i < M * (D / 8); i += TC_THREADS) {
		const int r = i / (D / 8), c8 = i - r * (D / 8);
		uint4 v = make_uint4(0, 0, 0, 0);

		if (r < nrows) {
			const int tl = r / G, g = r - tl * G;

			v = __ldg((const uint4 *)(a.q + (size_t)(tok0 + tl) * a.q_ld +
						  (size_t)(kvh * G + g) * D) + c8);
		}
		*(uint4 *)(q_s + r * QS + c8 * 8) = v;
	}
	for (int r = tid; r < M; r += TC_THREADS) {
		m_s[r] = -INFINITY;
		l_s[r] = 0.0f;
		/* padding rows (zero q) see every loaded position: finite, never written */
		qp_s[r] = r < nrows ? a.tok_pos[tok0 + r / G] : kv_end - 1;
	}
#pragma unroll
	for (int ci = 0; ci < NCW; ci++)
		wmma::fill_fragment(acc[ci], 0.0f);

	for (int t = 0; t < ntiles; t++) {
		const int t0 = t * TP;

		__syncthreads(); /* the last tile's readers (S, P, V) are done */
		/* K and V rows of the tile; rows past kv_end are zero so that 0 * garbage never
		 * reaches P V. One dtype: one slot serves K's and V's loads; else each its own
		 * (a K row in FP8 is half the loads of a V row in f16). */
		if constexpr (KF8 != VF8) {
			pf_tile_load<D, KF8, TP>(k_s, a.kc, a, bt, kvh, t0, kv_end);
			pf_tile_load<D, VF8, TP>(v_s, a.vc, a, bt, kvh, t0, kv_end);
		} else {
			for (int idx = tid; idx < TP * CPR; idx += TC_THREADS) {
				const int r = idx / CPR, col = (idx - r * CPR) * EPC, p = t0 + r;
				uint4 kx = make_uint4(0, 0, 0, 0), vx = kx;

				if (p < kv_end) {
					const size_t slot = (size_t)bt[p / a.bs] * a.bs + p % a.bs;
					const size_t off = ((slot * a.n_kv + kvh) * D + col) * esz;

					kx = __ldg((const uint4 *)((const char *)a.kc + off));
					vx = __ldg((const uint4 *)((const char *)a.vc + off));
				}
				if (KF8) {
					uint4 lo, hi;

					e4m3x16_to_f16_scaled(kx, lo, hi);
					*(uint4 *)(k_s + r * QS + col) = lo;
					*(uint4 *)(k_s + r * QS + col + 8) = hi;
					e4m3x16_to_f16_scaled(vx, lo, hi);
					*(uint4 *)(v_s + r * QS + col) = lo;
					*(uint4 *)(v_s + r * QS + col + 8) = hi;
				} else {
					*(uint4 *)(k_s + r * QS + col) = kx;
					*(uint4 *)(v_s + r * QS + col) = vx;
				}
			}
		}
		__syncthreads();

		/* S = Q K^T, one 16x16 tile at a time */
		for (int i = warp; i < RT * (TP / 16); i += TC_WARPS) {
			const int srt = i % RT, sct = i / RT;
			acc_t sf;

			wmma::fill_fragment(sf, 0.0f);
#pragma unroll
			for (int kk = 0; kk < D / 16; kk++) {
				wmma::fragment<wmma::matrix_a, 16, 16, 16, __half,
					       wmma::row_major> qa;
				wmma::fragment<wmma::matrix_b, 16, 16, 16, __half,
					       wmma::col_major> kb;

				wmma::load_matrix_sync(qa, q_s + srt * 16 * QS + kk * 16, QS);
				wmma::load_matrix_sync(kb, k_s + sct * 16 * QS + kk * 16, QS);
				wmma::mma_sync(sf, qa, kb, sf);
			}
			wmma::store_matrix_sync(s_s + srt * 16 * SS + sct * 16, sf, SS,
						wmma::mem_row_major);
		}
		__syncthreads();

		/* online softmax, one warp per row, causal by position */
		for (int r = warp; r < M; r += TC_WARPS) {
			const int qp = qp_s[r];
			float v[TP / 32], mx = -INFINITY, sum = 0.0f;

#pragma unroll
			for (int jj = 0; jj < TP / 32; jj++) {
				const int col = lane + 32 * jj;

				v[jj] = t0 + col <= qp ? s_s[r * SS + col] * kmul : -INFINITY;
				mx = fmaxf(mx, v[jj]);
			}
			mx = sm70__warp_max(mx);
			const float m_old = m_s[r], m_new = fmaxf(m_old, mx);
			/* a row that has seen nothing yet keeps m = -inf without NaNs */
			const float m_use = m_new == -INFINITY ? 0.0f : m_new;
#pragma unroll
			for (int jj = 0; jj < TP / 32; jj++) {
				const __half e = __float2half_rn(exp2f(v[jj] - m_use));

				p_s[r * PS + lane + 32 * jj] = e;
				sum += __half2float(e);
			}
			sum = sm70__warp_sum(sum);
			const float alpha = exp2f(m_old - m_use);

			if (lane < 16)
				al_m[r * 16 + lane] = alpha;
			if (lane == 0) {
				l_s[r] = l_s[r] * alpha + sum;
				m_s[r] = m_new;
			}
		}
		__syncthreads();

		/* O = O * alpha + P V over this warp's row tile and column tiles */
		{
			acc_t af;

			wmma::load_matrix_sync(af, al_m + rt * 256, 16, wmma::mem_row_major);
#pragma unroll
			for (int ci = 0; ci < NCW; ci++)
#pragma unroll
				for (int e = 0; e < acc_t::num_elements; e++)
					acc[ci].x[e] *= af.x[e];
		}
#pragma unroll
		for (int ks = 0; ks < TP / 16; ks++) {
			wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> pa;

			wmma::load_matrix_sync(pa, p_s + rt * 16 * PS + ks * 16, PS);
#pragma unroll
			for (int ci = 0; ci < NCW; ci++) {
				const int ct = cw * NCW + ci;
				wmma::fragment<wmma::matrix_b, 16, 16, 16, __half,
					       wmma::row_major> vb;

				wmma::load_matrix_sync(vb, v_s + ks * 16 * QS + ct * 16, QS);
				wmma::mma_sync(acc[ci], pa, vb, acc[ci]);
			}
		}
	}

	/* O out through a 16x16 staging square per warp (in S, free now) */
	__syncthreads();
	{
		float *st = s_s + warp * 256;

#pragma unroll
		for (int ci = 0; ci < NCW; ci++) {
			wmma::store_matrix_sync(st, acc[ci], 16, wmma::mem_row_major);
			__syncwarp();
			for (int i = lane; i < 256; i += 32) {
				const int row = rt * 16 + (i >> 4);
				const int col = (cw * NCW + ci) * 16 + (i & 15);

				if (row < nrows) {
					const int tl = row / G, h = kvh * G + row - tl * G;
					const size_t o =
						((size_t)(tok0 + tl) * a.n_heads + h) * D + col;

					a.out[o] = __float2half_rn(st[i] * a.v_mul / l_s[row]);
				}
			}
			__syncwarp();
		}
	}
}

/* Queues the prefill kernel. -ENOSPC: this device lacks the shared memory. */
template <int D, bool KF8, bool VF8, int TP>
static int attn_prefill_launch(struct sm70__cuda *c, const struct pf_args &a)
{
	const size_t smem = pfl<D, TP>::bytes;

	if (smem > c->smem_optin)
		return -ENOSPC;
	if (smem > 48 * 1024 &&
	    sm70__cuda_smem_optin(c, (const void *)attn_prefill_kernel<D, KF8, VF8, TP>))
		return -EIO;
	attn_prefill_kernel<D, KF8, VF8, TP><<<dim3((unsigned)a.n_tiles, (unsigned)a.n_kv),
					       TC_THREADS, smem, c->stream>>>(a);
	if (SM70_CUDA_LAUNCHED(&c->be, "attn_prefill_kernel"))
		return -EIO;
	return 0;
}

/* 64-position tiles where they fit beside two blocks' worth of q, else 32 (head_dim 256:
 * 81 KB a block keeps two blocks on an SM of 228 KB; sm_75's 64 KB takes D <= 128 only). */
template <int D, bool KF8, bool VF8>
static int attn_prefill_pick(struct sm70__cuda *c, const struct pf_args &a)
{
	if constexpr (D < 256) {
		if (pfl<D, 64>::bytes <= c->smem_optin)
			return attn_prefill_launch<D, KF8, VF8, 64>(c, a);
	}
	return attn_prefill_launch<D, KF8, VF8, 32>(c, a);
}

/*
 * The chunks of b (tokens [n_decode, n_tokens)) through the prefill kernel. Returns 0,
 * -EIO (a launch failed; reported), or -ENOSPC when the shape or the batch description is
 * not one the kernel takes (nothing queued; the caller runs every token the decode way).
 */
static int attn_prefill(struct sm70__cuda *c, const struct sm70__attn_args &d,
			const struct sm70_batch *b, int D, enum sm70__kv_pair pair)
{
	struct pf_args a;
	long tiles = 0;
	int next = b->n_decode;

	if (!b->chunk_first_host || !b->chunk_len_host || !b->chunk_first || !b->chunk_len ||
	    b->n_decode < 0 || d.group < 1 || d.group > 16)
		return -ENOSPC;
	a.qt = PF_ROWS / d.group;
	for (int i = 0; i < b->n_chunks; i++) {
		const int len = b->chunk_len_host[i];

		if (b->chunk_first_host[i] != next || len < 1)
			return -ENOSPC;
		next += len;
		tiles += (len + a.qt - 1) / a.qt;
	}
	if (next != b->n_tokens || tiles > 0x7fffffffL)
		return -ENOSPC;
	a.out = d.out;
	a.q = d.q;
	a.q_ld = d.q_ld;
	a.kc = d.kc;
	a.vc = d.vc;
	a.k_mul = d.k_mul;
	a.v_mul = d.v_mul;
	a.n_kv = d.n_kv;
	a.bs = d.bs;
	a.max_blocks = d.max_blocks;
	a.tok_pos = d.tok_pos;
	a.tok_seq = d.tok_seq;
	a.block_tables = d.block_tables;
	a.chunk_first = b->chunk_first;
	a.chunk_len = b->chunk_len;
	a.n_chunks = b->n_chunks;
	a.n_heads = d.n_heads;
	a.group = d.group;
	a.n_tiles = (int)tiles;
	return sm70__kv_pair_call(pair, [&](auto kf8, auto vf8) {
		constexpr bool K8 = decltype(kf8)::value, V8 = decltype(vf8)::value;

		switch (D) {
		case 64:
			return attn_prefill_pick<64, K8, V8>(c, a);
		case 128:
			return attn_prefill_pick<128, K8, V8>(c, a);
		case 256:
			return attn_prefill_pick<256, K8, V8>(c, a);
		}
		return -ENOSPC;
	});
}

/* SM70_ATTENTION=simt keeps the fp32 SIMT kernel (for comparison); read once. */
static int attn_want_simt(void)
{
	static int cached = -1;

	if (cached < 0) {
		const char *v = getenv("SM70_ATTENTION");

		cached = v && strcmp(v, "simt") == 0;
	}
	return cached;
}

/* The tensor-core kernel over tokens [0, n_tokens) of a; -ENOSPC when head_dim is none of
 * its sizes or the shape does not fit (nothing queued). */
static int attn_tc(struct sm70__cuda *c, const struct sm70__attn_args &a, int D,
		   enum sm70__kv_pair pair, int n_tokens, int max_pos)
{
	return sm70__kv_pair_call(pair, [&](auto kf8, auto vf8) {
		constexpr bool K8 = decltype(kf8)::value, V8 = decltype(vf8)::value;

		switch (D) {
		case 32:
			return attn_tc_pick<32, K8, V8>(c, a, n_tokens, max_pos);
		case 64:
			return attn_tc_pick<64, K8, V8>(c, a, n_tokens, max_pos);
		case 128:
			return attn_tc_pick<128, K8, V8>(c, a, n_tokens, max_pos);
		case 256:
			return attn_tc_pick<256, K8, V8>(c, a, n_tokens, max_pos);
		}
		return -ENOSPC;
	});
}

/* The decode kernels (tensor-core, else SIMT) over tokens [0, n_tokens) of a; -ENOSPC when
 * head_dim is none of theirs or the shape does not fit (nothing queued). */
static int attn_fast(struct sm70__cuda *c, const struct sm70__attn_args &a, int D,
		     enum sm70__kv_pair pair, int n_tokens, int max_pos)
{
	int ret = -ENOSPC;

	if (!attn_want_simt())
		ret = attn_tc(c, a, D, pair, n_tokens, max_pos);
	if (ret != -ENOSPC)
		return ret;
	return sm70__attn_split<dense_rows>(c, a, D, pair, n_tokens, max_pos);
}

/* Batch invariance: every token through the decode kernels (the prefill kernel's tiles of
 * a chunk's tokens sum in another order), split in fixed spans (attn_decode.h), in groups
 * of tokens whose partials fit the scratch: launched alone or beside others, a token
 * gets the same bits. The reference kernel where the fast ones do not take the shape (a
 * shape-only choice), or where one token's partials alone would not fit (contexts past
 * the scratch: there invariance is lost). */
static void attn_invariant(struct sm70__cuda *c, const struct sm70__attn_args &a,
			   const struct sm70_kv_layer *kv, const struct sm70_kv_layout *lay,
			   const struct sm70_batch *b, int D, enum sm70__kv_pair pair,
			   float scale)
{
	const size_t per_tok = (size_t)a.n_heads * ATTN_PR(D) * sizeof(float) *
			       (size_t)sm70__attn_bi_splits(b->max_pos);
	const long group = (long)(SM70__CUDA_ATTN_PART_BYTES / per_tok);

	if (c->attn_ref || (a.q_ld % 8) || ((uintptr_t)a.q & 15) || b->max_pos <= 0 ||
	    group < 1) {
		sm70__attn_ref<dense_rows>(c, a, kv, lay, scale, b->n_tokens);
		return;
	}
	for (int t0 = 0; t0 < b->n_tokens; t0 += (int)group) {
		const int m = b->n_tokens - t0 < group ? b->n_tokens - t0 : (int)group;
		struct sm70__attn_args g = a;
		int ret;

		g.out += (size_t)t0 * a.n_heads * D;
		g.q += (size_t)t0 * a.q_ld;
		g.tok_pos += t0;
		g.tok_seq += t0;
		ret = attn_fast(c, g, D, pair, m, b->max_pos);
		if (ret == -EIO)
			return;
		if (ret == -ENOSPC)
			sm70__attn_ref<dense_rows>(c, g, kv, lay, scale, m);
	}
}

/* See backend.h. out must not overlap q or the cache; n_heads must be a multiple of
 * n_kv_heads; b->max_pos must be at least every tok_pos + 1 (it sizes the split); block
 * tables must hold valid blocks for every position attended to. With prefill chunks
 * (b->n_chunks > 0) the decodes [0, n_decode) take the decode kernels and the chunks the
 * prefill kernel; a batch without chunks (every graph-captured step) is launched exactly
 * as before there was a prefill path. SM70_ATTENTION=simt or =reference send every token
 * through those kernels. */
extern "C" void sm70__cuda_attention(struct sm70_backend *be, void *out, const void *q,
				     int q_ld, const struct sm70_kv_layer *kv,
				     const struct sm70_kv_layout *lay, const struct sm70_batch *b,
				     int n_heads, float scale)
{
	struct sm70__cuda *c = sm70__cuda_enter(be);
	const int D = lay->head_dim;
	const enum sm70__kv_pair pair = sm70__kv_pair_of(lay);
	struct sm70__attn_args a;
	int ret = -ENOSYS;

	if (sm70__attn_args_make(&a, c, dense_rows::op, out, q, q_ld, kv, lay, b, n_heads,
				 scale))
		return;
	if (c->be.batch_invariant) {
		attn_invariant(c, a, kv, lay, b, D, pair, scale);
		return;
	}
	/* The fast kernels read q and the cache 16 bytes at a time. */
	if (!c->attn_ref && (q_ld % 8) == 0 && ((uintptr_t)q & 15) == 0 && b->max_pos > 0) {
		if (b->n_chunks > 0 && b->n_decode <= b->n_tokens && !attn_want_simt()) {
			ret = attn_prefill(c, a, b, D, pair);
			if (ret == -EIO)
				return;
			if (ret == 0) {
				/* the decodes alone; max_pos still bounds their positions */
				if (b->n_decode > 0 &&
				    attn_fast(c, a, D, pair, b->n_decode, b->max_pos) == -ENOSPC)
					sm70__attn_ref<dense_rows>(c, a, kv, lay, scale,
								   b->n_decode);
				return;
			}
		}
		ret = attn_fast(c, a, D, pair, b->n_tokens, b->max_pos);
		if (ret == 0 || ret == -EIO)
			return;
	}
	sm70__attn_ref<dense_rows>(c, a, kv, lay, scale, b->n_tokens);
}
