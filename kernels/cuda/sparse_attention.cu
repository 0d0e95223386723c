/*
 * sparse_attention.cu - the CUDA sparse_attention op (backend.h): each token attends to
 * the positions of its QSA selection (qsa_select), over the paged KV cache (f16 or
 * FP8-E4M3), f16 q and out, fp32 softmax.
 *
 * Decode kernel (head_dim 32/64/128/256): one block per (token, KV head, split) computes
 * every query head of the GQA group, so each gathered K/V row is read once per group. A
 * tile of selected positions is turned into cache slots (through the block table), the
 * rows are copied (FP8 decoded: sm70__e4m3x8_to_f16_scaled) into shared memory as f16,
 * then scores in fp32 FMAs, an online softmax by one warp per head and P V in fp32, as the
 * dense op's SIMT kernel does. The selected list is split over enough blocks to fill the
 * GPU twice (a budget of a few thousand positions at B1 is otherwise a handful of blocks);
 * splits write attention.cu's partials and its merge combines them. The host sizes the
 * splits from min(sel_ld, b->max_pos), a bound on every n_sel, so the grid needs nothing
 * from device memory and a captured graph serves any selection; splits past a token's
 * n_sel write empty partials.
 *
 * Reference kernel (SM70_ATTENTION=reference, another head_dim, or q not 16-byte aligned):
 * one block per (token, head), one thread per dim, one position at a time through the same
 * online softmax.
 *
 * A token with n_sel 0 gets zeros (its first split writes the partial of an empty sum with
 * weight 1). Non-goals: tensor cores (the selection is a gather; the dense op's WMMA
 * kernel is for contiguous tiles), prefill-specific tiling (a chunk's tokens select
 * different blocks, so there is little K/V to share between them).
 */
#include <math.h>

#include "kernels/cuda/cuda_check.h"

#define SP_THREADS 128
#define SP_WARPS (SP_THREADS / 32)

struct sparse_args {
	__half *out;
	const __half *q;
	int q_ld;
	const void *kc;
	const void *vc;
	float k_mul; /* scale * k_scale (times 2^8 for FP8 tiles) */
	float v_mul; /* v_scale (times 2^8 for FP8 tiles) */
	int n_kv;
	int bs;
	int max_blocks;
	const int32_t *tok_seq;
	const int32_t *block_tables;
	const int32_t *sel;
	const int32_t *n_sel;
	int sel_ld;
	int n_heads;
	int group;
	int chunk;  /* selected positions per split (a multiple of the tile) */
	int nsplit; /* 1: write out directly; else partials into part */
	float *part;
};

/* Positions per tile: 64 rows of K and V up to head_dim 128, 32 at 256. */
template <int D> struct sp_tile {
	static constexpr int TP = D >= 256 ? 32 : 64;
	static constexpr int KS = D + 8; /* row stride in halves: 16-byte pad */
};

/* Floats before the tiles: q and acc [G][D], scores [G][TP], m, l, alpha [G]; rounded to
 * 16 bytes. */
template <int D> static __host__ __device__ size_t sp_floats(int group)
{
	return ((size_t)group * (2 * D + sp_tile<D>::TP + 3) + 3) & ~(size_t)3;
}

/* Dynamic shared memory: the floats, the K and V tiles (f16), the tile's slots. */
template <int D> static size_t sp_smem(int group)
{
	constexpr int TP = sp_tile<D>::TP, KS = sp_tile<D>::KS;

	return sp_floats<D>(group) * sizeof(float) + 2 * (size_t)TP * KS * sizeof(__half) +
	       (size_t)TP * sizeof(long long);
}

template <int D, bool FP8>
static __global__ void __launch_bounds__(SP_THREADS) sparse_kernel(struct sparse_args a)
{
	constexpr int TP = sp_tile<D>::TP, KS = sp_tile<D>::KS, VPR = D / 8;
	extern __shared__ float4 smem_raw[];
	const int G = a.group;
	float *q_s = (float *)smem_raw;
	float *acc_s = q_s + G * D;
	float *s_s = acc_s + G * D;
	float *m_s = s_s + G * TP;
	float *l_s = m_s + G;
	float *al_s = l_s + G;
	__half *k_s = (__half *)(q_s + sp_floats<D>(G));
	__half *v_s = k_s + TP * KS;
	long long *slot_s = (long long *)(v_s + TP * KS);

	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
	const int tok = blockIdx.x / a.n_kv, kvh = blockIdx.x - tok * a.n_kv;
	const int split = blockIdx.y;
	const int n = a.n_sel[tok];
	const int i0 = split * a.chunk, i1 = min(i0 + a.chunk, n);
	const int32_t *bt = a.block_tables + (size_t)a.tok_seq[tok] * a.max_blocks;
	const int32_t *sel = a.sel + (size_t)tok * a.sel_ld;
	const __half *qt = a.q + (size_t)tok * a.q_ld + (size_t)kvh * G * D;

	for (int i = tid; i < G * D; i += SP_THREADS) {
		q_s[i] = __half2float(qt[i]);
		acc_s[i] = 0.0f;
	}
	for (int g = tid; g < G; g += SP_THREADS) {
		m_s[g] = -INFINITY;
		l_s[g] = 0.0f;
	}

	for (int t0 = i0; t0 < i1; t0 += TP) {
		const int nt = min(TP, i1 - t0);

		for (int r = tid; r < nt; r += SP_THREADS) {
			const int p = sel[t0 + r];

			slot_s[r] = (long long)bt[p / a.bs] * a.bs + p % a.bs;
		}
		__syncthreads(); /* slots made; the last tile's readers are done */

		/* the gathered K and V rows, 16 bytes (8 dims) a thread */
		for (int idx = tid; idx < nt * VPR; idx += SP_THREADS) {
			const int r = idx / VPR, cv = idx - r * VPR;
			const size_t off = ((size_t)slot_s[r] * a.n_kv + kvh) * D + (size_t)cv * 8;
			uint4 kv4, vv4;

			if (FP8) {
				kv4 = sm70__e4m3x8_to_f16_scaled(
					__ldg((const uint2 *)((const uint8_t *)a.kc + off)));
				vv4 = sm70__e4m3x8_to_f16_scaled(
					__ldg((const uint2 *)((const uint8_t *)a.vc + off)));
			} else {
				kv4 = __ldg((const uint4 *)((const __half *)a.kc + off));
				vv4 = __ldg((const uint4 *)((const __half *)a.vc + off));
			}
			*(uint4 *)(k_s + r * KS + cv * 8) = kv4;
			*(uint4 *)(v_s + r * KS + cv * 8) = vv4;
		}
		__syncthreads();

		/* scores of every group head against every tile row; 16-byte reads of the
		 * padded rows keep a quarter warp's rows in different banks */
		for (int idx = tid; idx < G * nt; idx += SP_THREADS) {
			const int g = idx / nt, r = idx - g * nt;
			const __half *kr = k_s + r * KS;
			const float *qg = q_s + g * D;
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
			s_s[g * TP + r] = s * a.k_mul;
		}
		__syncthreads();

		/* online softmax, one warp per head */
		for (int g = warp; g < G; g += SP_WARPS) {
			float v[TP / 32], mx = -INFINITY, sum = 0.0f;

#pragma unroll
			for (int j = 0; j < TP / 32; j++) {
				const int r = lane + 32 * j;

				v[j] = r < nt ? s_s[g * TP + r] : -INFINITY;
				mx = fmaxf(mx, v[j]);
			}
			mx = sm70__warp_max(mx);
			const float m_old = m_s[g], m_new = fmaxf(m_old, mx);

#pragma unroll
			for (int j = 0; j < TP / 32; j++) {
				const int r = lane + 32 * j;

				if (r < nt) {
					const float e = expf(v[j] - m_new);

					s_s[g * TP + r] = e;
					sum += e;
				}
			}
			sum = sm70__warp_sum(sum);
			if (lane == 0) {
				const float alpha = expf(m_old - m_new);

				l_s[g] = l_s[g] * alpha + sum;
				m_s[g] = m_new;
				al_s[g] = alpha;
			}
		}
		__syncthreads();

		/* acc = acc * alpha + P V, two dims a thread */
		for (int i = tid; i < G * D / 2; i += SP_THREADS) {
			const int g = i / (D / 2), d = (i - g * (D / 2)) * 2;
			const float *pg = s_s + g * TP;
			float2 acc = *(float2 *)(acc_s + g * D + d);
			const float al = al_s[g];

			acc.x *= al;
			acc.y *= al;
			for (int r = 0; r < nt; r++) {
				const float2 vf = __half22float2(*(const __half2 *)(v_s + r * KS + d));
				const float pr = pg[r];

				acc.x += pr * vf.x;
				acc.y += pr * vf.y;
			}
			*(float2 *)(acc_s + g * D + d) = acc;
		}
	}
	__syncthreads();

	if (a.nsplit == 1) {
		__half *o = a.out + ((size_t)tok * a.n_heads + (size_t)kvh * G) * D;

		for (int i = tid; i < G * D; i += SP_THREADS) {
			const float l = l_s[i / D];

			o[i] = __float2half_rn(l > 0.0f ? acc_s[i] * a.v_mul / l : 0.0f);
		}
		return;
	}
	for (int i = tid; i < G * (D + 2); i += SP_THREADS) {
		const int g = i / (D + 2), j = i - g * (D + 2);
		const int h = kvh * G + g;
		float *pp = a.part +
			    (((size_t)tok * a.n_heads + h) * a.nsplit + split) * SM70__ATTN_PR(D);
		/* an empty selection: split 0 holds an empty sum of weight 1, so the merge
		 * gives zeros (every split empty would give 0 / 0) */
		const bool none = n <= 0 && split == 0;

		pp[j] = j == D	   ? (none ? 0.0f : m_s[g]) :
			j == D + 1 ? (none ? 1.0f : l_s[g]) :
				     acc_s[g * D + j] * a.v_mul;
	}
}

/* Queues the decode kernel over positions bounded by most (and the merge when split);
 * -ENOSPC when the shape does not fit this device (nothing queued). */
template <int D, bool FP8>
static int sparse_launch(struct sm70__cuda *c, struct sparse_args a, int n_tokens, int most)
{
	constexpr int TP = sp_tile<D>::TP;
	const size_t smem = sp_smem<D>(a.group);
	const long blocks = (long)n_tokens * a.n_kv;
	const size_t per_split = (size_t)n_tokens * a.n_heads * SM70__ATTN_PR(D) * sizeof(float);
	int nsplit = 1;

	if (smem > c->smem_optin)
		return -ENOSPC;
	if (smem > 48 * 1024 &&
	    SM70_CUDA_CHECK(&c->be,
			    cudaFuncSetAttribute(sparse_kernel<D, FP8>,
						 cudaFuncAttributeMaxDynamicSharedMemorySize,
						 (int)smem)))
		return -EIO;
	/* Split the list while the (token, KV head) pairs fill less than two waves; a split
	 * keeps at least one tile. */
	if (blocks < 2L * c->n_sm && most > TP) {
		const long want = (2L * c->n_sm + blocks - 1) / blocks;
		const long tiles = (most + TP - 1) / TP;
		const long room = (long)(SM70__CUDA_ATTN_PART_BYTES / per_split);

		nsplit = (int)(want < tiles ? want : tiles);
		if (nsplit > room)
			nsplit = (int)room;
		if (nsplit < 1)
			nsplit = 1;
	}
	a.chunk = (most + nsplit - 1) / nsplit;
	a.chunk = (a.chunk + TP - 1) / TP * TP;
	a.nsplit = (most + a.chunk - 1) / a.chunk;
	a.part = c->attn_part;
	sparse_kernel<D, FP8><<<dim3((unsigned)blocks, (unsigned)a.nsplit), SP_THREADS, smem,
				c->stream>>>(a);
	if (SM70_CUDA_LAUNCHED(&c->be, "sparse_kernel"))
		return -EIO;
	if (a.nsplit > 1)
		return sm70__cuda_attn_merge(c, a.out, a.part, n_tokens * a.n_heads, a.nsplit, D);
	return 0;
}

template <int D>
static int sparse_fp8(struct sm70__cuda *c, const struct sparse_args &a, int fp8,
		      int n_tokens, int most)
{
	return fp8 ? sparse_launch<D, true>(c, a, n_tokens, most) :
		     sparse_launch<D, false>(c, a, n_tokens, most);
}

/* The decode kernel for head_dim D; -ENOSPC when D is none of its sizes. */
static int sparse_fast(struct sm70__cuda *c, const struct sparse_args &a, int D, int fp8,
		       int n_tokens, int most)
{
	switch (D) {
	case 32:
		return sparse_fp8<32>(c, a, fp8, n_tokens, most);
	case 64:
		return sparse_fp8<64>(c, a, fp8, n_tokens, most);
	case 128:
		return sparse_fp8<128>(c, a, fp8, n_tokens, most);
	case 256:
		return sparse_fp8<256>(c, a, fp8, n_tokens, most);
	}
	return -ENOSPC;
}

/* An e4m3 byte as f32, through the f16 the decode kernel's tiles hold (2^-8 of it). */
static __device__ __forceinline__ float e4m3_scaled_to_f32(uint8_t v)
{
	const unsigned short h = (unsigned short)(((v & 0x7fu) << 7) | ((v & 0x80u) << 8));

	return __half2float(__ushort_as_half(h)) * 256.0f;
}

/* One block per (token, head); thread d owns output dim d. */
static __global__ void sparse_ref_kernel(struct sparse_args a, int D, int fp8)
{
	__shared__ float red[2][32];
	const int tok = blockIdx.x / a.n_heads, h = blockIdx.x - tok * a.n_heads;
	const int kvh = h / a.group, d = threadIdx.x;
	const int lane = d & 31, warp = d >> 5, nw = (blockDim.x + 31) >> 5;
	const int n = a.n_sel[tok];
	const int32_t *bt = a.block_tables + (size_t)a.tok_seq[tok] * a.max_blocks;
	const int32_t *sel = a.sel + (size_t)tok * a.sel_ld;
	const float qd = d < D ? __half2float(a.q[(size_t)tok * a.q_ld + (size_t)h * D + d]) : 0.0f;
	float m = -INFINITY, l = 0.0f, acc = 0.0f;

	for (int i = 0; i < n; i++) {
		const int p = sel[i];
		const size_t slot = (size_t)bt[p / a.bs] * a.bs + p % a.bs;
		const size_t off = (slot * a.n_kv + kvh) * D + d;
		float kd = 0.0f, vd = 0.0f, s;

		if (d < D) {
			if (fp8) {
				kd = e4m3_scaled_to_f32(((const uint8_t *)a.kc)[off]);
				vd = e4m3_scaled_to_f32(((const uint8_t *)a.vc)[off]);
			} else {
				kd = __half2float(((const __half *)a.kc)[off]);
				vd = __half2float(((const __half *)a.vc)[off]);
			}
		}
		s = sm70__warp_sum(qd * kd);
		if (lane == 0)
			red[i & 1][warp] = s;
		__syncthreads(); /* red[i & 1] is written again two positions on, after the
				  * barrier of the position between */
		s = 0.0f;
		for (int w = 0; w < nw; w++)
			s += red[i & 1][w];
		s *= a.k_mul;
		const float m_new = fmaxf(m, s);
		const float alpha = expf(m - m_new), e = expf(s - m_new);

		l = l * alpha + e;
		acc = acc * alpha + e * vd;
		m = m_new;
	}
	if (d < D)
		a.out[((size_t)tok * a.n_heads + h) * D + d] =
			__float2half_rn(l > 0.0f ? acc * a.v_mul / l : 0.0f);
}

/* See backend.h. As sm70__cuda_attention for the cache, heads and block tables; every
 * n_sel must be at most min(sel_ld, b->max_pos) (it bounds the split). */
extern "C" void sm70__cuda_sparse_attention(struct sm70_backend *be, void *out, const void *q,
					    int q_ld, const struct sm70_kv_layer *kv,
					    const struct sm70_kv_layout *lay,
					    const struct sm70_batch *b, const int32_t *sel,
					    const int32_t *n_sel, int sel_ld, int n_heads,
					    float scale)
{
	struct sm70__cuda *c = sm70__cuda_enter(be);
	const int D = lay->head_dim, fp8 = lay->dtype == SM70_DTYPE_F8E4M3;
	const int most = sel_ld < b->max_pos ? sel_ld : b->max_pos;
	struct sparse_args a;
	int ret = -ENOSPC;

	if (b->n_tokens <= 0 || lay->n_kv_heads <= 0 || n_heads % lay->n_kv_heads)
		return;
	if (lay->dtype != SM70_DTYPE_F16 && !fp8) {
		sm70__cuda_fail(be, "sparse_attention", __FILE__, __LINE__,
				"unsupported KV dtype");
		return;
	}
	a.out = (__half *)out;
	a.q = (const __half *)q;
	a.q_ld = q_ld;
	a.kc = kv->k;
	a.vc = kv->v;
	a.n_kv = lay->n_kv_heads;
	a.bs = lay->block_size;
	a.max_blocks = b->max_blocks;
	a.tok_seq = b->tok_seq;
	a.block_tables = b->block_tables;
	a.sel = sel;
	a.n_sel = n_sel;
	a.sel_ld = sel_ld;
	a.n_heads = n_heads;
	a.group = n_heads / lay->n_kv_heads;
	a.chunk = most > 0 ? most : 1;
	a.nsplit = 1;
	a.part = NULL;

	/* the decode kernel reads q and the cache 16 bytes at a time */
	if (!c->attn_ref && (q_ld % 8) == 0 && ((uintptr_t)q & 15) == 0) {
		a.k_mul = scale * (fp8 ? kv->k_scale * 256.0f : 1.0f);
		a.v_mul = fp8 ? kv->v_scale * 256.0f : 1.0f;
		ret = sparse_fast(c, a, D, fp8, b->n_tokens, a.chunk);
		if (ret != -ENOSPC)
			return;
	}
	if (D > 1024) {
		sm70__cuda_fail(be, "sparse_attention", __FILE__, __LINE__, "head_dim above 1024");
		return;
	}
	/* the reference kernel decodes FP8 bytes to their values */
	a.k_mul = scale * (fp8 ? kv->k_scale : 1.0f);
	a.v_mul = fp8 ? kv->v_scale : 1.0f;
	sparse_ref_kernel<<<b->n_tokens * n_heads, (D + 31) / 32 * 32, 0, c->stream>>>(a, D, fp8);
	SM70_CUDA_LAUNCHED(be, "sparse_ref_kernel");
}
