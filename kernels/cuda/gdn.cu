/*
 * gdn.cu - the CUDA gdn op: the gated delta rule of Gated DeltaNet (backend.h states the
 * math), as a recurrence for decodes and a chunked (WY / UT-transform) form for prefill.
 *
 * Both kernels rest on one fact: the columns of the state S [k_dim][v_dim] evolve
 * independently. Per token, m = S^T k, the update k (beta (v - m))^T and o = S^T q treat
 * each value column j alone, given k, q, beta and g. So a block owns one value head and a
 * band of value columns of one sequence's state, for all k_dim rows, and nothing is
 * shared between blocks.
 *
 * Recurrence (decodes; prefill chunks too when chunked is 0 or the chunked kernel does not
 * apply). 128 threads own a band of J = 16, 32 or 64 columns: lane (ir, jq) of warp w holds
 * four consecutive columns (a float4) of rows r * 4 RW + w * RW + ir, so one warp access
 * reads RW whole row segments, and the band's state sits in registers (32 floats a thread
 * at k_dim 128) while the block walks the segment's tokens: the state is read and written
 * once per segment, which is once per token for a decode; the state's loads go out before
 * anything else (a reset at position 0 discards what came), and a chunk's next token's
 * inputs load while the current one computes. Per token, warps 0 and 1
 * L2-normalise k and q into shared memory and warp 2 makes beta and exp(g); the dots over
 * rows reduce with shuffles inside a warp, then across the four warps through shared
 * memory. Bandwidth-bound on the state: Qwen3.5-27B's layer is 48 heads of 128 x 128,
 * 3 MiB of f32 per sequence, read and written per token.
 *
 * Chunked (prefill chunks when chunked is set). A block of 256 threads owns 32 columns of
 * one head of one chunk's sequence and walks the chunk in pieces of C = 64 tokens,
 * with the state band S0 [k_dim][32] in shared memory. With G the cumulative sum of g
 * over the piece (summed in double, so that G_c - G_c' keeps the precision of a sum over
 * just the tokens between), Gam[c][c'] = exp(G_c - G_c') (c >= c'), k, q normalised:
 *   L   = strictly lower (beta_c k_c . k_c' Gam)        the UT system, I + L
 *   Y   = (I + L)^-1 beta (V - exp(G) (K S0))           the new values ("v_new")
 *   O   = exp(G) (Q S0) + lower (q_c . k_c' Gam) Y
 *   S1  = exp(G_last) S0 + (exp(G_last - G) K)^T Y
 * which is transformers' torch_chunk_gated_delta_rule with its k_cumdecay @ S folded
 * into T (beta exp(G) K S0), so only [64][32] matrices depend on the state. Every
 * exponent is <= 0 (g <= 0), so nothing overflows where the recurrence would not.
 * q and k stay as their f16 input in shared memory (exact) with their f32 norms as row
 * scalars; Q K^T and K K^T are f16 x f16 products with f32 accumulation on WMMA
 * (exact products, as f32 FMA would give); Q S0, K S0, the solve, O and S1 are f32
 * FMA. (I + L) Y = X is solved by forward substitution in registers, each warp owning
 * four columns and each lane two rows: a step is a shuffle broadcast of the finished row
 * and one FMA per held value, with L stored transposed so that a step's loads are
 * consecutive words. Every load of a piece's inputs is issued before the first is
 * used. Shared memory: 86.75 KiB at k_dim 128
 * (fits a V100's 96 KiB); two blocks fit an SM of 228 KiB.
 *
 * Slots: the segment's first token names its sequence's slot; a first token at position 0
 * starts from zeros instead of reading it. A batch without the decode/chunk shape runs
 * every token in batch order through one block per (head, band) (slow, right for any
 * order and for shared slots); in the shaped path sequences that share a slot (padding
 * rows on the scratch slot) race on it and their outputs are unspecified.
 *
 * Batch invariance (the backend's batch_invariant): every token takes the recurrence, in
 * bands of 32 columns (16 where v_dim is not a multiple of 32) whatever the batch, so a
 * token's output does not depend on how its prompt was cut or what else ran.
 *
 * Non-goals: k_dim other than 32/64/128/256 (chunked: up to 128), v_dim not a multiple
 * of 16 (chunked: 32), a separate (multi-kernel) WY precompute as in FLA: the ops may not
 * allocate scratch for it, and the per-piece work is cheap next to the state traffic.
 */
#include <mma.h>
#include <stdint.h>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/pdl.h"

#define REC_THREADS 128
#define CH_THREADS 256
#define CH 64        /* tokens per piece of the chunked form */
#define CJ 32        /* value columns per chunked block */
#define L2_EPS 1e-6f /* the l2norm's eps (transformers, FLA) */

struct gdn_args {
	__half *out;
	const __half *qkv;
	const __half *ba;
	int ba_ld;
	const float *a_log, *dt_bias;
	float *ssm;
	int n_slots, n_k, n_v, dv, conv_dim, ratio;
	const int32_t *tok_pos, *tok_seq, *seq_state;
	int n_seqs, n_tokens;
	const int32_t *chunk_first, *chunk_len;
	int n_decode; /* segments [0, n_decode) are decode tokens, the rest chunks */
	float q_scale;
};

static int gdn_tune_cols, gdn_tune_hints = -1; /* sm70__cuda_gdn_tune */

extern "C" void sm70__cuda_gdn_tune(int cols, int hints)
{
	gdn_tune_cols = cols;
	gdn_tune_hints = hints;
}

/* The state slot of token t, or -1 when its sequence or slot is out of range. */
static __device__ __forceinline__ int gdn_slot(const struct gdn_args &a, int t)
{
	int s = a.tok_seq[t], slot;

	if (s < 0 || s >= a.n_seqs)
		return -1;
	slot = a.seq_state[s];
	return slot < 0 || slot > a.n_slots ? -1 : slot;
}

/* beta = sigmoid(b) and the log-decay g = -exp(a_log) * softplus(a + dt_bias), from the
 * token's raw b and a of head h. */
static __device__ __forceinline__ void gdn_gate(const struct gdn_args &a, float bv, float av,
						int h, float *beta, float *g)
{
	const float x = av + a.dt_bias[h];
	const float sp = x > 20.0f ? x : log1pf(expf(x));

	*beta = 1.0f / (1.0f + expf(-bv));
	*g = -expf(a.a_log[h]) * sp;
}

/* A segment: decode token seg, or chunk seg - n_decode. */
static __device__ __forceinline__ void gdn_segment(const struct gdn_args &a, int seg,
						   int *first, int *len)
{
	if (seg < a.n_decode) {
		*first = seg;
		*len = 1;
	} else {
		*first = a.chunk_first[seg - a.n_decode];
		*len = a.chunk_len[seg - a.n_decode];
	}
}

/* ---- the recurrence -------------------------------------------------------------------- */

/* What one token gives a thread of the recurrence, read one token ahead: warps 0 and 1 the
 * raw k and q values of their lanes, warp 2 lane 0 the raw b and a, every thread its four
 * v values. */
template <int DK>
struct rec_in {
	float x[DK / 32];
	uint2 v;
	float b, a;
};

template <int DK>
static __device__ __forceinline__ void rec_fetch(const struct gdn_args &a, int t, int w, int lane,
						 int kh, int h, int j0, struct rec_in<DK> *in)
{
	const __half *row = a.qkv + (size_t)t * a.conv_dim;
	const int kd = a.n_k * DK;

	if (w < 2) {
		const __half *src = row + (w == 0 ? kd : 0) + kh * DK;

#pragma unroll
		for (int e = 0; e < DK / 32; e++)
			in->x[e] = __half2float(src[lane + 32 * e]);
	} else if (w == 2 && lane == 0) {
		const __half *r = a.ba + (size_t)t * a.ba_ld;

		in->b = __half2float(r[h]);
		in->a = __half2float(r[a.n_v + h]);
	}
	in->v = *(const uint2 *)(row + 2 * kd + h * a.dv + j0);
}

/*
 * grid (v_dim / J, n_v, segments), or (v_dim / J, n_v, 1) with serial set: then the block
 * runs every token of the batch in order, each as its own segment. CS: streaming cache
 * hints on the state's loads and stores (it is read and written once).
 */
template <int DK, int JQ, bool CS>
static __global__ void __launch_bounds__(REC_THREADS)
	gdn_rec_kernel(struct gdn_args a, int serial)
{
	constexpr int RW = 32 / JQ;      /* rows one warp access covers */
	constexpr int R = DK / (4 * RW); /* rows a thread holds */
	constexpr int J = 4 * JQ;        /* columns of the block's band */
	__shared__ float ks[DK], qs[DK], gsh[2];
	__shared__ float red_m[4][J], red_o[4][J];
	const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
	const int ir = lane / JQ, jq = lane % JQ;
	const int h = blockIdx.y, kh = h / a.ratio;
	const int j0 = blockIdx.x * J + jq * 4;
	const int n_units = serial ? a.n_tokens : 1;
	float4 s[R];

	if (serial)
		sm70__pdl_enter();
	for (int u = 0; u < n_units; u++) {
		struct rec_in<DK> in;
		int first, len, slot;
		float *S;

		if (serial) {
			first = u;
			len = 1;
		} else {
			gdn_segment(a, blockIdx.z, &first, &len);
		}
		slot = gdn_slot(a, first);
		if (slot < 0)
			continue; /* the whole block: no barrier is split */
		/* the state first (the longest wait), whatever the position: a reset only
		 * discards it */
		S = a.ssm + ((size_t)slot * a.n_v + h) * DK * a.dv + j0;
#pragma unroll
		for (int r = 0; r < R; r++) {
			const float4 *p = (const float4 *)(S + (size_t)(r * 4 * RW + w * RW + ir) * a.dv);

			s[r] = CS ? __ldcs(p) : *p;
		}
		/* Only this op writes the state, and the batch arrays are uploads: both may be
		 * read while the kernel ahead drains (pdl.h); its output (the conv's) may not.
		 * When that kernel is this op's chunked form, it writes other sequences'
		 * slots (a sequence is a decode or a chunk in a step, never both). */
		if (!serial)
			sm70__pdl_enter();
		rec_fetch<DK>(a, first, w, lane, kh, h, j0, &in);
		if (a.tok_pos[first] == 0) {
#pragma unroll
			for (int r = 0; r < R; r++)
				s[r] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
		}
		for (int t = first; t < first + len; t++) {
			float v[4], m[4] = { 0.0f, 0.0f, 0.0f, 0.0f }, o[4] = { 0.0f, 0.0f, 0.0f, 0.0f };
			float beta, eg;

			if (w < 2) {
				/* k (warp 0) or q (warp 1): L2-normalised into shared memory */
				float ss = 0.0f, inv;

#pragma unroll
				for (int e = 0; e < DK / 32; e++)
					ss += in.x[e] * in.x[e];
				ss = sm70__warp_sum(ss);
				inv = 1.0f / sqrtf(ss + L2_EPS);
				if (w == 0) {
#pragma unroll
					for (int e = 0; e < DK / 32; e++)
						ks[lane + 32 * e] = in.x[e] * inv;
				} else {
#pragma unroll
					for (int e = 0; e < DK / 32; e++)
						qs[lane + 32 * e] = (in.x[e] * inv) * a.q_scale;
				}
			} else if (w == 2 && lane == 0) {
				float b, g;

				gdn_gate(a, in.b, in.a, h, &b, &g);
				gsh[0] = b;
				gsh[1] = expf(g);
			}
			{
				const float2 lo = __half22float2(*(const __half2 *)&in.v.x);
				const float2 hi = __half22float2(*(const __half2 *)&in.v.y);

				v[0] = lo.x, v[1] = lo.y, v[2] = hi.x, v[3] = hi.y;
			}
			/* the next token's inputs load while this one computes */
			if (t + 1 < first + len)
				rec_fetch<DK>(a, t + 1, w, lane, kh, h, j0, &in);
			__syncthreads(); /* ks, qs, gsh ready */
			beta = gsh[0];
			eg = gsh[1];
#pragma unroll
			for (int r = 0; r < R; r++) {
				const float kr = ks[r * 4 * RW + w * RW + ir];

				s[r].x *= eg, s[r].y *= eg, s[r].z *= eg, s[r].w *= eg;
				m[0] += s[r].x * kr, m[1] += s[r].y * kr;
				m[2] += s[r].z * kr, m[3] += s[r].w * kr;
			}
#pragma unroll
			for (int off = JQ; off < 32; off <<= 1)
				for (int e = 0; e < 4; e++)
					m[e] += __shfl_xor_sync(0xffffffffu, m[e], off);
			if (ir == 0)
				for (int e = 0; e < 4; e++)
					red_m[w][jq * 4 + e] = m[e];
			__syncthreads(); /* red_m ready */
			for (int e = 0; e < 4; e++) {
				const int j = jq * 4 + e;

				v[e] = beta * (v[e] - (red_m[0][j] + red_m[1][j] + red_m[2][j] +
						       red_m[3][j]));
			}
#pragma unroll
			for (int r = 0; r < R; r++) {
				const int i = r * 4 * RW + w * RW + ir;
				const float kr = ks[i], qr = qs[i];

				s[r].x += kr * v[0], s[r].y += kr * v[1];
				s[r].z += kr * v[2], s[r].w += kr * v[3];
				o[0] += s[r].x * qr, o[1] += s[r].y * qr;
				o[2] += s[r].z * qr, o[3] += s[r].w * qr;
			}
#pragma unroll
			for (int off = JQ; off < 32; off <<= 1)
				for (int e = 0; e < 4; e++)
					o[e] += __shfl_xor_sync(0xffffffffu, o[e], off);
			if (ir == 0)
				for (int e = 0; e < 4; e++)
					red_o[w][jq * 4 + e] = o[e];
			/* red_o ready; also orders this token's reads of ks, qs, gsh and red_m
			 * before the next token's writes */
			__syncthreads();
			if (w == 0 && ir == 0) {
				float r4[4];
				__half2 lo, hi;
				uint2 raw;

				for (int e = 0; e < 4; e++) {
					const int j = jq * 4 + e;

					r4[e] = red_o[0][j] + red_o[1][j] + red_o[2][j] + red_o[3][j];
				}
				lo = __floats2half2_rn(r4[0], r4[1]);
				hi = __floats2half2_rn(r4[2], r4[3]);
				raw.x = *(const uint32_t *)&lo;
				raw.y = *(const uint32_t *)&hi;
				*(uint2 *)(a.out + ((size_t)t * a.n_v + h) * a.dv + j0) = raw;
			}
		}
#pragma unroll
		for (int r = 0; r < R; r++) {
			float4 *p = (float4 *)(S + (size_t)(r * 4 * RW + w * RW + ir) * a.dv);

			if (CS)
				__stcs(p, s[r]);
			else
				*p = s[r];
		}
	}
}

/* ---- the chunked form ------------------------------------------------------------------- */

/* Shared-memory layout of the chunked kernel for k_dim DK (byte offsets, 128-aligned
 * pieces: WMMA wants 32-byte aligned tiles). */
template <int DK>
struct chunk_smem {
	static constexpr int KH_LD = DK + 8;  /* halfs per q/k row (16-byte rows, fewer conflicts) */
	static constexpr int A_LD = CH + 4;   /* floats per row of A and L */
	static constexpr int PX_LD = CJ + 4;  /* floats per row of P and X */
	static constexpr int KH_BYTES = CH * KH_LD * 2;
	static constexpr int A_BYTES = CH * A_LD * 4;
	static constexpr int QL_BYTES = KH_BYTES > A_BYTES ? KH_BYTES : A_BYTES;
	static constexpr int OFF_KH = 0;
	static constexpr int OFF_QL = OFF_KH + KH_BYTES;      /* q rows, later L */
	static constexpr int OFF_A = OFF_QL + QL_BYTES;
	static constexpr int OFF_S = OFF_A + A_BYTES;
	static constexpr int OFF_P = OFF_S + DK * CJ * 4;
	static constexpr int OFF_X = OFF_P + CH * PX_LD * 4;
	static constexpr int OFF_ROWS = OFF_X + CH * PX_LD * 4; /* G (double), kn qn beta eG kc */
	static constexpr int BYTES = OFF_ROWS + CH * 8 + 5 * CH * 4;
};

/* The 10 lower 16 x 16 tiles (row tile >= column tile) of a 64 x 64 matrix. */
static __device__ __forceinline__ void lower_tile(int k, int *tr, int *tc)
{
	const int r = k < 1 ? 0 : k < 3 ? 1 : k < 6 ? 2 : 3;

	*tr = r;
	*tc = k - r * (r + 1) / 2;
}

/* grid (v_dim / CJ, n_v, n_chunks), CH_THREADS threads, chunk_smem<DK>::BYTES dynamic. */
template <int DK>
static __global__ void __launch_bounds__(CH_THREADS) gdn_chunk_kernel(struct gdn_args a)
{
	using namespace nvcuda;
	typedef chunk_smem<DK> L_;
	extern __shared__ __align__(128) unsigned char smem[];
	__half *Kh = (__half *)(smem + L_::OFF_KH);
	__half *Qh = (__half *)(smem + L_::OFF_QL);
	float *Lm = (float *)(smem + L_::OFF_QL); /* after Q's last use */
	float *A = (float *)(smem + L_::OFF_A);
	float *S = (float *)(smem + L_::OFF_S); /* [DK][CJ] */
	float *P = (float *)(smem + L_::OFF_P);
	float *X = (float *)(smem + L_::OFF_X);
	double *G = (double *)(smem + L_::OFF_ROWS);
	float *kn = (float *)(G + CH), *qn = kn + CH, *bt = qn + CH, *eG = bt + CH, *kc = eG + CH;
	const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
	const int h = blockIdx.y, kh = h / a.ratio;
	const int jb = blockIdx.x * CJ; /* the band's first column */
	const int kd = a.n_k * DK;
	const int c_idx = blockIdx.z;
	const int first = a.chunk_first[c_idx], len = a.chunk_len[c_idx];
	const int slot = gdn_slot(a, first);
	float *Sg;

	if (slot < 0)
		return;
	Sg = a.ssm + ((size_t)slot * a.n_v + h) * DK * a.dv + jb;
	{
		const bool fresh = a.tok_pos[first] == 0;

		for (int idx = tid; idx < DK * CJ / 4; idx += CH_THREADS) {
			const int i = idx / (CJ / 4), q4 = idx % (CJ / 4);

			((float4 *)S)[idx] = fresh ? make_float4(0.0f, 0.0f, 0.0f, 0.0f) :
					     *(const float4 *)(Sg + (size_t)i * a.dv + q4 * 4);
		}
	}
	for (int c0 = 0; c0 < len; c0 += CH) {
		const int n = len - c0 < CH ? len - c0 : CH;
		const int t0 = first + c0;
		float acc[4][4];

		__syncthreads(); /* the last piece is done with every buffer */
		/* P1: raw q, k rows (zeros past n), v band into X, gates; every load of the
		 * piece is issued before the first store */
		{
			constexpr int NQK = 2 * CH * (DK / 8) / CH_THREADS;
			const int vc = tid / 4, vp = tid % 4; /* CH * CJ / 8 == CH_THREADS */
			uint4 qk[NQK], vv = make_uint4(0u, 0u, 0u, 0u);
			float bv = 0.0f, av = 0.0f;

#pragma unroll
			for (int it = 0; it < NQK; it++) {
				const int idx = tid + it * CH_THREADS;
				const int mat = idx / (CH * (DK / 8)), rem = idx % (CH * (DK / 8));
				const int c = rem / (DK / 8), part = rem % (DK / 8);

				qk[it] = make_uint4(0u, 0u, 0u, 0u);
				if (c < n)
					qk[it] = *(const uint4 *)(a.qkv + (size_t)(t0 + c) * a.conv_dim +
								  (mat ? kd : 0) + kh * DK + part * 8);
			}
			if (vc < n)
				vv = *(const uint4 *)(a.qkv + (size_t)(t0 + vc) * a.conv_dim + 2 * kd +
						      h * a.dv + jb + vp * 8);
			if (tid < n) {
				const __half *r = a.ba + (size_t)(t0 + tid) * a.ba_ld;

				bv = __half2float(r[h]);
				av = __half2float(r[a.n_v + h]);
			}
#pragma unroll
			for (int it = 0; it < NQK; it++) {
				const int idx = tid + it * CH_THREADS;
				const int mat = idx / (CH * (DK / 8)), rem = idx % (CH * (DK / 8));
				const int c = rem / (DK / 8), part = rem % (DK / 8);

				*(uint4 *)((mat ? Kh : Qh) + c * L_::KH_LD + part * 8) = qk[it];
			}
			{
				const __half2 *h2 = (const __half2 *)&vv;
				const float2 p0 = __half22float2(h2[0]), p1 = __half22float2(h2[1]);
				const float2 p2 = __half22float2(h2[2]), p3 = __half22float2(h2[3]);

				*(float4 *)(X + vc * L_::PX_LD + vp * 8) = make_float4(p0.x, p0.y, p1.x, p1.y);
				*(float4 *)(X + vc * L_::PX_LD + vp * 8 + 4) =
					make_float4(p2.x, p2.y, p3.x, p3.y);
			}
			if (tid < CH) {
				float b = 0.0f, g = 0.0f;

				if (tid < n)
					gdn_gate(a, bv, av, h, &b, &g);
				bt[tid] = b;
				G[tid] = g; /* the cumulative sum comes in P2 */
			}
		}
		__syncthreads();

		/* P2: row norms, cumulative decay, Q K^T and K K^T (WMMA), Q S0 and K S0 */
		for (int c = w; c < CH; c += CH_THREADS / 32) {
			float sk = 0.0f, sq = 0.0f;

			for (int i = lane; i < DK; i += 32) {
				const float kv = __half2float(Kh[c * L_::KH_LD + i]);
				const float qv = __half2float(Qh[c * L_::KH_LD + i]);

				sk += kv * kv;
				sq += qv * qv;
			}
			sk = sm70__warp_sum(sk);
			sq = sm70__warp_sum(sq);
			if (lane == 0) {
				kn[c] = 1.0f / sqrtf(sk + L2_EPS);
				qn[c] = (1.0f / sqrtf(sq + L2_EPS)) * a.q_scale;
			}
		}
		if (w == 0) {
			/* inclusive scan of g, two per lane, in double: a decay between two
			 * tokens is exp(G_c - G_c'), and an f32 G would lose ~|G| ulps of that
			 * difference once early tokens decay hard (g of -50 happens) */
			const double g0 = G[2 * lane], g1 = G[2 * lane + 1];
			double run = g0 + g1;

			for (int off = 1; off < 32; off <<= 1) {
				const double up = __shfl_up_sync(0xffffffffu, run, off);

				if (lane >= off)
					run += up;
			}
			run -= g0 + g1; /* exclusive */
			G[2 * lane] = run + g0;
			G[2 * lane + 1] = run + g0 + g1;
			eG[2 * lane] = expf((float)(run + g0));
			eG[2 * lane + 1] = expf((float)(run + g0 + g1));
		}
		wmma::fragment<wmma::accumulator, 16, 16, 16, float> kk[2];
#pragma unroll
		for (int idx = 0; idx < 2; idx++) {
			const int k = w + 8 * idx;
			int tr, tc;

			if (k >= 10)
				continue;
			lower_tile(k, &tr, &tc);
			wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fq, fk;
			wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> fb;
			wmma::fragment<wmma::accumulator, 16, 16, 16, float> fa;

			wmma::fill_fragment(fa, 0.0f);
			wmma::fill_fragment(kk[idx], 0.0f);
#pragma unroll
			for (int k0 = 0; k0 < DK; k0 += 16) {
				wmma::load_matrix_sync(fb, Kh + tc * 16 * L_::KH_LD + k0, L_::KH_LD);
				wmma::load_matrix_sync(fq, Qh + tr * 16 * L_::KH_LD + k0, L_::KH_LD);
				wmma::load_matrix_sync(fk, Kh + tr * 16 * L_::KH_LD + k0, L_::KH_LD);
				wmma::mma_sync(fa, fq, fb, fa);
				wmma::mma_sync(kk[idx], fk, fb, kk[idx]);
			}
			wmma::store_matrix_sync(A + tr * 16 * L_::A_LD + tc * 16, fa, L_::A_LD,
						wmma::mem_row_major);
		}
		{
			/* warps 0-3: Q S0, warps 4-7: K S0; rows rg + 16 rr, columns 4 cg.. */
			const __half *M = w < 4 ? Qh : Kh;
			const int t = tid & 127, cg = t & 7, rg = t >> 3;
			const float4 *S4 = (const float4 *)S;

			for (int rr = 0; rr < 4; rr++)
				for (int e = 0; e < 4; e++)
					acc[rr][e] = 0.0f;
#pragma unroll 4
			for (int i = 0; i < DK; i += 2) {
				const float4 s0 = S4[i * (CJ / 4) + cg], s1 = S4[(i + 1) * (CJ / 4) + cg];

#pragma unroll
				for (int rr = 0; rr < 4; rr++) {
					const float2 m2 = __half22float2(
						*(const __half2 *)(M + (rg + 16 * rr) * L_::KH_LD + i));

					acc[rr][0] += m2.x * s0.x + m2.y * s1.x;
					acc[rr][1] += m2.x * s0.y + m2.y * s1.y;
					acc[rr][2] += m2.x * s0.z + m2.y * s1.z;
					acc[rr][3] += m2.x * s0.w + m2.y * s1.w;
				}
			}
		}
		__syncthreads(); /* Q is dead; norms, G, raw A ready */

		/* P3: L gets K K^T (raw); A, P, X scaled; kc */
#pragma unroll
		for (int idx = 0; idx < 2; idx++) {
			const int k = w + 8 * idx;
			int tr, tc;

			if (k >= 10)
				continue;
			lower_tile(k, &tr, &tc);
			/* transposed: Lm[c'][c] = L[c][c'], so that P5's lanes (rows c) read a
			 * column of L as consecutive words */
			wmma::store_matrix_sync(Lm + tc * 16 * L_::A_LD + tr * 16, kk[idx], L_::A_LD,
						wmma::mem_col_major);
		}
		{
			const int t = tid & 127, cg = t & 7, rg = t >> 3;

			for (int rr = 0; rr < 4; rr++) {
				const int c = rg + 16 * rr;
				float *dst = (w < 4 ? P : X) + c * L_::PX_LD + cg * 4;

				if (w < 4) {
					const float f = qn[c] * eG[c];

					for (int e = 0; e < 4; e++)
						dst[e] = f * acc[rr][e];
				} else {
					const float f = eG[c] * kn[c];

					for (int e = 0; e < 4; e++)
						dst[e] = bt[c] * (dst[e] - f * acc[rr][e]);
				}
			}
		}
		for (int idx = tid; idx < CH * CH; idx += CH_THREADS) {
			const int c = idx / CH, cp = idx % CH;
			float *p = A + c * L_::A_LD + cp;

			*p = cp <= c ? *p * (qn[c] * kn[cp] * expf((float)(G[c] - G[cp]))) : 0.0f;
		}
		if (tid < CH)
			kc[tid] = kn[tid] * expf((float)(G[CH - 1] - G[tid]));
		__syncthreads();

		/* P4: L scaled (strictly lower part; the rest is never read) */
		for (int idx = tid; idx < CH * CH; idx += CH_THREADS) {
			const int cp = idx / CH, c = idx % CH;

			if (c > cp)
				Lm[cp * L_::A_LD + c] *=
					bt[c] * kn[c] * kn[cp] * expf((float)(G[c] - G[cp]));
		}
		__syncthreads();

		/* P5: (I + L) Y = X by forward substitution in registers: warp w owns
		 * columns 4w..4w+3, lane l rows l and l + 32; row cp, final once its turn
		 * comes, is broadcast by shuffle and taken off every later row */
		{
			float x0[4], x1[4];
			float4 r0 = *(const float4 *)(X + lane * L_::PX_LD + 4 * w);
			float4 r1 = *(const float4 *)(X + (lane + 32) * L_::PX_LD + 4 * w);

			x0[0] = r0.x, x0[1] = r0.y, x0[2] = r0.z, x0[3] = r0.w;
			x1[0] = r1.x, x1[1] = r1.y, x1[2] = r1.z, x1[3] = r1.w;
			for (int cp = 0; cp + 1 < n; cp++) {
				const float l0 = Lm[cp * L_::A_LD + lane];
				const float l1 = Lm[cp * L_::A_LD + lane + 32];
				float y[4];

#pragma unroll
				for (int e = 0; e < 4; e++)
					y[e] = __shfl_sync(0xffffffffu, cp < 32 ? x0[e] : x1[e], cp & 31);
				if (lane > cp)
#pragma unroll
					for (int e = 0; e < 4; e++)
						x0[e] -= l0 * y[e];
				if (lane + 32 > cp)
#pragma unroll
					for (int e = 0; e < 4; e++)
						x1[e] -= l1 * y[e];
			}
			r0 = make_float4(x0[0], x0[1], x0[2], x0[3]);
			r1 = make_float4(x1[0], x1[1], x1[2], x1[3]);
			*(float4 *)(X + lane * L_::PX_LD + 4 * w) = r0;
			*(float4 *)(X + (lane + 32) * L_::PX_LD + 4 * w) = r1;
		}
		__syncthreads();

		/* P6: O = P + A Y to out; S1 = exp(G_last) S0 + (kc K)^T Y */
		{
			const int cg = tid & 7, rg = tid >> 3; /* rows rg and rg + 32 */
			const float4 *X4 = (const float4 *)X;
			float4 o1 = *(const float4 *)(P + rg * L_::PX_LD + cg * 4);
			float4 o2 = *(const float4 *)(P + (rg + 32) * L_::PX_LD + cg * 4);
			const int last = rg + 32 < n ? rg + 32 : n - 1;

			for (int cp = 0; cp <= last; cp++) {
				const float4 y = X4[cp * (L_::PX_LD / 4) + cg];
				const float a1 = A[rg * L_::A_LD + cp], a2 = A[(rg + 32) * L_::A_LD + cp];

				o1.x += a1 * y.x, o1.y += a1 * y.y, o1.z += a1 * y.z, o1.w += a1 * y.w;
				o2.x += a2 * y.x, o2.y += a2 * y.y, o2.z += a2 * y.z, o2.w += a2 * y.w;
			}
			for (int half = 0; half < 2; half++) {
				const int c = rg + 32 * half;
				const float4 o = half ? o2 : o1;
				__half2 lo = __floats2half2_rn(o.x, o.y), hi = __floats2half2_rn(o.z, o.w);
				uint2 raw;

				if (c >= n)
					continue;
				raw.x = *(const uint32_t *)&lo;
				raw.y = *(const uint32_t *)&hi;
				*(uint2 *)(a.out + ((size_t)(t0 + c) * a.n_v + h) * a.dv + jb + cg * 4) =
					raw;
			}
		}
		if (tid < 2 * DK) {
			const int cg = tid & 7, ig = tid >> 3; /* rows 4 ig .. 4 ig + 3 */
			const float4 *X4 = (const float4 *)X;
			float4 *S4 = (float4 *)S;
			const float dec = eG[CH - 1];
			float4 st[4];

			for (int e = 0; e < 4; e++) {
				st[e] = S4[(4 * ig + e) * (CJ / 4) + cg];
				st[e].x *= dec, st[e].y *= dec, st[e].z *= dec, st[e].w *= dec;
			}
			for (int c = 0; c < n; c++) {
				const float4 y = X4[c * (L_::PX_LD / 4) + cg];
				const uint2 raw = *(const uint2 *)(Kh + c * L_::KH_LD + 4 * ig);
				const float2 k01 = __half22float2(*(const __half2 *)&raw.x);
				const float2 k23 = __half22float2(*(const __half2 *)&raw.y);
				const float f = kc[c];
				const float kv[4] = { f * k01.x, f * k01.y, f * k23.x, f * k23.y };

				for (int e = 0; e < 4; e++) {
					st[e].x += kv[e] * y.x, st[e].y += kv[e] * y.y;
					st[e].z += kv[e] * y.z, st[e].w += kv[e] * y.w;
				}
			}
			for (int e = 0; e < 4; e++)
				S4[(4 * ig + e) * (CJ / 4) + cg] = st[e];
		}
	}
	__syncthreads();
	for (int idx = tid; idx < DK * CJ / 4; idx += CH_THREADS) {
		const int i = idx / (CJ / 4), q4 = idx % (CJ / 4);

		*(float4 *)(Sg + (size_t)i * a.dv + q4 * 4) = ((const float4 *)S)[idx];
	}
}

/* ---- launchers --------------------------------------------------------------------------- */

template <int DK>
static void rec_launch(struct sm70__cuda *c, const struct gdn_args &a, int cols, int segs,
		       int serial, int cs)
{
	const dim3 grid((unsigned)(a.dv / cols), (unsigned)a.n_v, (unsigned)(serial ? 1 : segs));

	if (cols == 16 && cs)
		sm70__launch_pdl(c, SM70__PDL_PREFETCH, gdn_rec_kernel<DK, 4, true>, grid,
				 dim3(REC_THREADS), 0, a, serial);
	else if (cols == 16)
		sm70__launch_pdl(c, SM70__PDL_PREFETCH, gdn_rec_kernel<DK, 4, false>, grid,
				 dim3(REC_THREADS), 0, a, serial);
	else if (cols == 64 && cs)
		sm70__launch_pdl(c, SM70__PDL_PREFETCH, gdn_rec_kernel<DK, 16, true>, grid,
				 dim3(REC_THREADS), 0, a, serial);
	else if (cols == 64)
		sm70__launch_pdl(c, SM70__PDL_PREFETCH, gdn_rec_kernel<DK, 16, false>, grid,
				 dim3(REC_THREADS), 0, a, serial);
	else if (cs)
		sm70__launch_pdl(c, SM70__PDL_PREFETCH, gdn_rec_kernel<DK, 8, true>, grid,
				 dim3(REC_THREADS), 0, a, serial);
	else
		sm70__launch_pdl(c, SM70__PDL_PREFETCH, gdn_rec_kernel<DK, 8, false>, grid,
				 dim3(REC_THREADS), 0, a, serial);
	SM70_CUDA_LAUNCHED(&c->be, "gdn_rec_kernel");
}

/* -ENOSPC when the device lacks the shared memory; nothing queued then. */
template <int DK>
static int chunk_launch(struct sm70__cuda *c, const struct gdn_args &a, int n_chunks)
{
	const size_t smem = chunk_smem<DK>::BYTES;

	if (smem > c->smem_optin)
		return -ENOSPC;
	if (smem > 48 * 1024 && sm70__cuda_smem_optin(c, (const void *)gdn_chunk_kernel<DK>))
		return -EIO;
	gdn_chunk_kernel<DK><<<dim3((unsigned)(a.dv / CJ), (unsigned)a.n_v, (unsigned)n_chunks),
			       CH_THREADS, smem, c->stream>>>(a);
	return SM70_CUDA_LAUNCHED(&c->be, "gdn_chunk_kernel");
}

static int chunk_dispatch(struct sm70__cuda *c, const struct gdn_args &a, int dk, int n_chunks)
{
	switch (dk) {
	case 32: return chunk_launch<32>(c, a, n_chunks);
	case 64: return chunk_launch<64>(c, a, n_chunks);
	case 128: return chunk_launch<128>(c, a, n_chunks);
	default: return -ENOSPC;
	}
}

static void rec_dispatch(struct sm70__cuda *c, const struct gdn_args &a, int dk, int cols,
			 int segs, int serial, int cs)
{
	switch (dk) {
	case 32: rec_launch<32>(c, a, cols, segs, serial, cs); break;
	case 64: rec_launch<64>(c, a, cols, segs, serial, cs); break;
	case 128: rec_launch<128>(c, a, cols, segs, serial, cs); break;
	default: rec_launch<256>(c, a, cols, segs, serial, cs); break;
	}
}

/*
 * See backend.h. Sizes come from the batch's host fields only (n_tokens, n_decode,
 * n_chunks, chunk_first_host, chunk_len_host), so a decode step can be captured in a graph.
 * k_dim must be 32, 64, 128 or 256, v_dim a multiple of 16, conv_dim 2 n_k k_dim + n_v v_dim,
 * qkv and out 8-byte aligned. The chunked kernel takes the chunks when chunked is set,
 * k_dim <= 128, v_dim % 32 == 0, qkv is 16-byte aligned and the device has its shared
 * memory; otherwise (and for decodes) the recurrence runs.
 */
extern "C" void sm70__cuda_gdn(struct sm70_backend *be, void *out, const void *qkv,
			       const void *ba, int ba_ld, const float *a_log,
			       const float *dt_bias, const struct sm70_state_layer *st,
			       const struct sm70_state_layout *lay, const struct sm70_batch *b,
			       int chunked)
{
	struct sm70__cuda *c = sm70__cuda_enter(be);
	const int dk = lay->k_dim, dv = lay->v_dim;
	int covered = b->n_decode, shaped, cols, segs, cs;
	struct gdn_args a;
	long bands32;

	if (b->n_tokens <= 0 || b->n_seqs <= 0)
		return;
	if (!b->seq_state || lay->n_k_heads <= 0 || lay->n_v_heads <= 0 ||
	    lay->n_v_heads % lay->n_k_heads || lay->n_v_heads > 65535 ||
	    (dk != 32 && dk != 64 && dk != 128 && dk != 256) || dv <= 0 || dv % 16 ||
	    lay->conv_dim != 2 * lay->n_k_heads * dk + lay->n_v_heads * dv ||
	    ba_ld < 2 * lay->n_v_heads || lay->n_slots < 0 ||
	    ((uintptr_t)qkv | (uintptr_t)out) % 8 || b->n_decode > 65535 ||
	    b->n_chunks > 65535) {
		sm70__cuda_fail(be, "gdn", __FILE__, __LINE__, "bad layout or batch");
		return;
	}
	shaped = b->n_decode >= 0 && b->n_chunks >= 0 &&
		 (b->n_chunks == 0 || (b->chunk_first_host && b->chunk_len_host));
	for (int i = 0; shaped && i < b->n_chunks; i++) {
		if (b->chunk_first_host[i] != covered || b->chunk_len_host[i] < 1)
			shaped = 0;
		else
			covered += b->chunk_len_host[i];
	}
	if (covered != b->n_tokens || b->n_decode + b->n_chunks > 65535)
		shaped = 0;
	a = (struct gdn_args){ (__half *)out, (const __half *)qkv, (const __half *)ba, ba_ld,
			       a_log, dt_bias, st->ssm, lay->n_slots, lay->n_k_heads,
			       lay->n_v_heads, dv, lay->conv_dim,
			       lay->n_v_heads / lay->n_k_heads, b->tok_pos, b->tok_seq,
			       b->seq_state, b->n_seqs, b->n_tokens, b->chunk_first,
			       b->chunk_len, shaped ? b->n_decode : 0,
			       (float)(1.0 / sqrt((double)dk)) };
	/* streaming hints by default: never slower in sm70-bench gdn, up to 1.5x faster */
	cs = gdn_tune_hints >= 0 ? gdn_tune_hints : 1;
	if (!shaped) {
		rec_dispatch(c, a, dk, dv % 32 ? 16 : 32, 1, 1, cs);
		return;
	}
	segs = b->n_decode + b->n_chunks;
	/* batch invariance: the chunked form's pieces start where the scheduler cut the
	 * prompt; the recurrence gives a token the same bits however it was cut */
	if (c->be.batch_invariant)
		chunked = 0;
	if (chunked && b->n_chunks > 0 && dk <= 128 && dv % CJ == 0 && (uintptr_t)qkv % 16 == 0) {
		int ret = chunk_dispatch(c, a, dk, b->n_chunks);

		if (ret == -EIO)
			return;
		if (ret == 0)
			segs = b->n_decode; /* the chunks are done */
	}
	if (segs == 0)
		return;
	/* The widest band that still gives every SM two blocks: 16 columns below that (B1 on
	 * the 27B shape), 64 (256-byte row segments) from B4 or so; measured on an H200 by
	 * sm70-bench gdn */
	bands32 = (long)(dv / 32) * lay->n_v_heads * segs;
	if (dv % 32 == 0 && bands32 < 2L * c->n_sm && (c->pdl & SM70__PDL_PREFETCH))
		cols = 32; /* the state loads start under the op ahead: fewer, wider blocks */
	else if (dv % 32 || bands32 < 2L * c->n_sm)
		cols = 16;
	else if (dv % 64 == 0 && bands32 / 2 >= 2L * c->n_sm)
		cols = 64;
	else
		cols = 32;
	if (gdn_tune_cols == 16 || (gdn_tune_cols == 32 && dv % 32 == 0) ||
	    (gdn_tune_cols == 64 && dv % 64 == 0))
		cols = gdn_tune_cols;
	/* batch invariance: the band sets which rows a thread sums and the shuffle tree of
	 * m and o, so it must not follow the segment count; the serial path's band */
	if (c->be.batch_invariant)
		cols = dv % 32 ? 16 : 32;
	rec_dispatch(c, a, dk, cols, segs, 0, cs);
}
