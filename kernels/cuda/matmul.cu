/*
 * matmul.cu - the CUDA matmul op: y[n, rows] = x[n, cols] W^T, W f16 [rows, cols], x f16,
 * y f16 or f32, fp32 accumulation everywhere.
 *
 * Four paths:
 * - n <= 16 (decode), cols a multiple of 8 and 16-byte aligned x and W: a skinny GEMM on
 *   the tensor cores (WMMA 16x16x16, f16 in, f32 accumulate: the SM70 feature set). The
 *   fp32 FMA version below runs out of FMA issue at about n = 4 on an H200 (every W
 *   element costs n FMAs), while the tensor cores make the FMA cost vanish, so the kernel
 *   is bound by reading W alone. Each warp streams a 16*MT-row band of W over its share
 *   of the columns with coalesced 16-byte loads, two 64-column steps ahead in registers,
 *   stages each step (and the matching x tile, zero-padded to 16 rows) in its own shared
 *   memory, and multiplies there; the block's warps split the columns and add their
 *   partial tiles at the end. No block barrier inside the loop.
 * - the same shapes with SM70_MATMUL=simt, or any other n <= 16: the fp32-FMA skinny
 *   kernel (lanes read W in 16-byte vectors and apply each W element to all n rows, which
 *   the block stages in shared memory a column chunk at a time).
 * - n > 16 (prefill), and 9..16 on matrices with more rows than columns (there cuBLAS
 *   measured faster: every block of ours re-reads the x tile): cuBLAS cublasGemmEx, f16
 *   inputs, CUBLAS_COMPUTE_32F.
 * - SM70_MATMUL=reference: one thread per output element, a plain dot product; the named
 *   path back when the fast paths are suspect.
 * - batch invariance (matmul_invariant below): the tensor-core kernel at every n, in
 *   slices of 16 rows of x, 8 warps, no column split.
 *
 * The tensor-core kernel also serves silu_matmul.cu (sm70__cuda_gemv_tc_silu): the same
 * tiles with x = silu(gate) * up made while each step is staged; add_rmsnorm_matmul (x
 * the RMSNorm of the residual plus an update, made by each block); and matmul_glu (a
 * block's two tiles are gate and up rows, and it writes silu(gate) * up). Where the row
 * tiles leave the last wave of blocks mostly empty, the columns are split over blocks
 * too (gemv_split), the last block of a tile adding the partial sums.
 *
 * NVFP4 weights go to matmul_nvfp4.cu.
 *
 * Non-goals: other quantised weights.
 */
#include <mma.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/pdl.h"

#define GEMV_WARPS 8  /* warps per block */
#define GEMV_ROWS 2   /* output rows per warp: that many W loads in flight per step */
#define GEMV_UNROLL 2 /* column steps per iteration: more loads in flight */
#define GEMV_SMEM 32768 /* bytes of x staged per block */

template <int VW> struct wvec;
template <> struct wvec<8> {
	uint4 v;
	__device__ __forceinline__ void load(const __half *p)
	{
		v = __ldg((const uint4 *)p);
	}
	__device__ __forceinline__ float get(int j) const
	{
		const __half *h = (const __half *)&v;

		return __half2float(h[j]);
	}
};
template <> struct wvec<1> {
	__half v;
	__device__ __forceinline__ void load(const __half *p)
	{
		v = __ldg(p);
	}
	__device__ __forceinline__ float get(int j) const
	{
		return __half2float(v);
	}
};

/*
 * N input rows (the template size), VW halves per lane load. Columns are taken kc at a
 * time (kc a multiple of 32 * VW); xs holds x[0..N, c0..c0+kc).
 */
template <int N, int VW>
static __global__ void __launch_bounds__(GEMV_WARPS * 32)
	gemv_kernel(void *__restrict__ y, int y_f32, const __half *__restrict__ x,
		    const __half *__restrict__ w, int rows, int cols, int kc)
{
	extern __shared__ uint4 xs_raw[];
	__half *xs = (__half *)xs_raw;
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	const int r0 = (blockIdx.x * GEMV_WARPS + warp) * GEMV_ROWS;
	const __half *wr[GEMV_ROWS];
	float acc[GEMV_ROWS][N];

#pragma unroll
	for (int rr = 0; rr < GEMV_ROWS; rr++) {
		/* A row past the end reads row r0 again (always valid) and is not stored. */
		wr[rr] = w + (size_t)(r0 + rr < rows ? r0 + rr : (r0 < rows ? r0 : 0)) * cols;
#pragma unroll
		for (int i = 0; i < N; i++)
			acc[rr][i] = 0.0f;
	}

	for (int c0 = 0; c0 < cols; c0 += kc) {
		const int cw = cols - c0 < kc ? cols - c0 : kc;

		__syncthreads(); /* the previous chunk is consumed */
		if (VW == 8) {
			const int nv = cw / 8;

			for (int idx = threadIdx.x; idx < N * nv; idx += blockDim.x) {
				int i = idx / nv, v = idx - i * nv;

				((uint4 *)(xs + (size_t)i * kc))[v] =
					__ldg((const uint4 *)(x + (size_t)i * cols + c0) + v);
			}
		} else {
			for (int idx = threadIdx.x; idx < N * cw; idx += blockDim.x) {
				int i = idx / cw, v = idx - i * cw;

				xs[(size_t)i * kc + v] = x[(size_t)i * cols + c0 + v];
			}
		}
		__syncthreads();
		if (r0 >= rows)
			continue; /* still takes part in the barriers */

		for (int k = lane * VW; k < cw; k += 32 * VW * GEMV_UNROLL) {
			wvec<VW> wv[GEMV_UNROLL][GEMV_ROWS];

#pragma unroll
			for (int u = 0; u < GEMV_UNROLL; u++)
#pragma unroll
				for (int rr = 0; rr < GEMV_ROWS; rr++)
					if (k + u * 32 * VW < cw)
						wv[u][rr].load(wr[rr] + c0 + k + u * 32 * VW);
#pragma unroll
			for (int u = 0; u < GEMV_UNROLL; u++) {
				const int kk = k + u * 32 * VW;

				if (kk >= cw)
					break;
#pragma unroll
				for (int i = 0; i < N; i++) {
					wvec<VW> xv;

					xv.v = *(const decltype(xv.v) *)(xs + (size_t)i * kc + kk);
#pragma unroll
					for (int j = 0; j < VW; j++) {
						float xf = xv.get(j);

#pragma unroll
						for (int rr = 0; rr < GEMV_ROWS; rr++)
							acc[rr][i] += wv[u][rr].get(j) * xf;
					}
				}
			}
		}
	}
	if (r0 >= rows)
		return;
#pragma unroll
	for (int rr = 0; rr < GEMV_ROWS; rr++) {
#pragma unroll
		for (int i = 0; i < N; i++) {
			float s = sm70__warp_sum(acc[rr][i]);

			if (lane == (i & 31) && r0 + rr < rows) {
				size_t o = (size_t)i * rows + r0 + rr;

				if (y_f32)
					((float *)y)[o] = s;
				else
					((__half *)y)[o] = __float2half_rn(s);
			}
		}
	}
}

/* One thread per output element: the reference path. */
static __global__ void matmul_ref_kernel(void *__restrict__ y, int y_f32,
					 const __half *__restrict__ x,
					 const __half *__restrict__ w, int rows, int cols)
{
	const int r = blockIdx.x * blockDim.x + threadIdx.x, i = blockIdx.y;
	const __half *xr = x + (size_t)i * cols, *wrow = w + (size_t)r * cols;
	float s = 0.0f;

	if (r >= rows)
		return;
	for (int k = 0; k < cols; k++)
		s += __half2float(xr[k]) * __half2float(wrow[k]);
	if (y_f32)
		((float *)y)[(size_t)i * rows + r] = s;
	else
		((__half *)y)[(size_t)i * rows + r] = __float2half_rn(s);
}

template <int N, int VW>
static void gemv_launch(struct sm70__cuda *c, void *y, int y_f32, const __half *x,
			const __half *w, int rows, int cols)
{
	const int step = 32 * VW * GEMV_UNROLL;
	int kc = GEMV_SMEM / 2 / N / step * step;
	int per_block = GEMV_WARPS * GEMV_ROWS;
	int ceil_cols = (cols + step - 1) / step * step;

	if (kc > ceil_cols)
		kc = ceil_cols;
	gemv_kernel<N, VW><<<(rows + per_block - 1) / per_block, GEMV_WARPS * 32,
			     (size_t)N * kc * sizeof(__half), c->stream>>>(y, y_f32, x, w, rows,
									    cols, kc);
}

template <int VW>
static void gemv_dispatch(struct sm70__cuda *c, void *y, int y_f32, const __half *x,
			  const __half *w, int rows, int cols, int n)
{
	switch (n) {
#define CASE(N) \
	case N: \
		gemv_launch<N, VW>(c, y, y_f32, x, w, rows, cols); \
		break;
		CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6) CASE(7) CASE(8)
		CASE(9) CASE(10) CASE(11) CASE(12) CASE(13) CASE(14) CASE(15) CASE(16)
#undef CASE
	}
}


/* ---- tensor-core skinny GEMM ------------------------------------------------------ */

#define TC_KS 64           /* columns per step: each W row gives 128 bytes, a full line */
#define TC_LD (TC_KS + 8)  /* staged row stride in halves: rows 16 bytes apart in banks */

/* Shared memory of one warp: its W rows and the x tile, both TC_LD halves a row. */
template <int MT> struct tc_warp {
	static constexpr size_t bytes = (size_t)(16 * MT + 16) * TC_LD * sizeof(__half);
};

/* x[k] = silu(g[k]) * u[k] for 8 packed halves, rounded to f16 with silu_mul.cu's very
 * expression (PyTorch's x / (1 + exp(-x)) in f32), so a fused x tile holds the bits the
 * separate silu_mul op would have written. Zeros (padding) give +0. */
static __device__ __forceinline__ uint4 silu_mul8(uint4 g, uint4 u)
{
	union {
		uint4 v;
		__half h[8];
	} gg, uu, r;

	gg.v = g;
	uu.v = u;
#pragma unroll
	for (int j = 0; j < 8; j++) {
		float a = __half2float(gg.h[j]);

		r.h[j] = __float2half_rn((a / (1.0f + expf(-a))) * __half2float(uu.h[j]));
	}
	return r.v;
}

/*
 * MT 16-row tiles per warp, NI = ceil(n / 4) x row groups loaded, WARPS splitting the
 * columns, PF steps loaded ahead in registers. Lane l loads 16 bytes (8 columns, chunk
 * l % 8) of rows l / 8 + 4 i of the band and of x, so a warp's load instruction reads four
 * full 128-byte lines.
 *
 * SILU (silu_matmul.cu): x is gate_up [n, 2 * cols], gate then up in each row; both halves
 * are loaded ahead like x and combined by silu_mul8 only when the step is staged, so the
 * loads stay in flight and the tile, the tiles' order and the sums are the plain kernel's.
 * The up halves cost 4 * NI * PF more registers, so SILU runs with MT = 1 only, PF = 3 only
 * at NI = 1, and one block an SM at NI = 4 (145 registers on sm_90; capped at 128 it
 * spills).
 */
/* Element idx (row rr * 16 + x row j) of a block's tile summed over its WARPS warps'
 * stages, in warp order. */
template <int MT, int WARPS>
static __device__ __forceinline__ float tc_block_sum(const unsigned char *smem, int rr, int j)
{
	float sum = 0.0f;

#pragma unroll
	for (int v = 0; v < WARPS; v++)
		sum += ((const float *)(smem + v * tc_warp<MT>::bytes))[rr * 16 + j];
	return sum;
}

/* What a GEMV's x is: the input as it is, silu(gate) * up of a gate_up input (silu_matmul.cu),
 * or the RMSNorm of the residual plus an update (add_rmsnorm_matmul, n = 1). */
enum { XF_PLAIN = 0, XF_SILU = 1, XF_NORM = 2 };

/* XF_NORM's inputs (zero for the other forms): r = resid_in + delta (delta may be NULL),
 * r into resid_out (each block a slice; NULL: not kept), x = f16(r * inv_rms * norm_w). */
struct gemv_norm {
	const float *resid_in;
	const __half *delta;
	float *resid_out;
	const float *norm_w;
	float eps;
};

/* add_rmsnorm.cu's vector kernel sums squares over 256 threads, four values a chunk,
 * chunks t, t + 256, ...; XF_NORM blocks sum as those 256 threads would (each of
 * NT threads standing for 256 / NT of them), so inv_rms and x are its bits exactly. */
#define NORM_VT 256

/* XF_NORM's prologue: the block's x row (cols halves at xn) and resid_out's slice, from
 * resid_in, delta and norm_w through rs (cols floats) and red (8 floats). */
template <int NT>
static __device__ __forceinline__ void gemv_norm_row(const struct gemv_norm &nm, int cols,
						     float *rs, __half *xn, float *red)
{
	constexpr int VPT = NORM_VT / NT; /* the virtual threads a thread stands for */
	const int n4 = cols / 4, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	float ss[VPT];

	static_assert(NORM_VT % NT == 0, "threads a block");
#pragma unroll
	for (int vt = 0; vt < VPT; vt++) {
		ss[vt] = 0.0f;
		for (int i = threadIdx.x + vt * NT; i < n4; i += NORM_VT) {
			float4 v = __ldg((const float4 *)nm.resid_in + i);

			if (nm.delta) {
				const uint2 dv = __ldg((const uint2 *)nm.delta + i);
				const float2 lo = __half22float2(*(const __half2 *)&dv.x);
				const float2 hi = __half22float2(*(const __half2 *)&dv.y);

				v.x += lo.x, v.y += lo.y, v.z += hi.x, v.w += hi.y;
			}
			((float4 *)rs)[i] = v;
			ss[vt] += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
		}
	}
#pragma unroll
	for (int vt = 0; vt < VPT; vt++) {
		const float t = sm70__warp_sum(ss[vt]);

		if (lane == 0)
			red[warp + vt * (NT / 32)] = t;
	}
	__syncthreads();
	{
		float t = lane < NORM_VT / 32 ? red[lane] : 0.0f;
		const float inv = 1.0f / sqrtf(sm70__warp_sum(t) / (float)cols + nm.eps);

		for (int i = threadIdx.x; i < n4; i += NT) {
			const float4 v = ((const float4 *)rs)[i];
			const float4 wv = __ldg((const float4 *)nm.norm_w + i);
			const __half2 lo = __floats2half2_rn((v.x * inv) * wv.x, (v.y * inv) * wv.y);
			const __half2 hi = __floats2half2_rn((v.z * inv) * wv.z, (v.w * inv) * wv.w);

			((__half2 *)xn)[2 * i] = lo;
			((__half2 *)xn)[2 * i + 1] = hi;
		}
	}
	if (nm.resid_out && blockIdx.y == 0) {
		const int per = (n4 + (int)gridDim.x - 1) / (int)gridDim.x;
		const int i0 = (int)blockIdx.x * per, i1 = min(i0 + per, n4);

		for (int i = i0 + (int)threadIdx.x; i < i1; i += NT)
			((float4 *)nm.resid_out)[i] = ((const float4 *)rs)[i];
	}
	__syncthreads();
}

/* Dynamic shared memory XF_NORM adds to a block: r (f32), x (f16), the 8 partial sums. */
static inline size_t gemv_norm_smem(int cols)
{
	return (size_t)cols * 6 + 8 * sizeof(float);
}

/* x = f16(silu(f16(g)) * f16(u)) with silu_mul.cu's very expression: the bits the
 * separate matmul and silu_mul ops would have written (GLU epilogue). */
static __device__ __forceinline__ __half glu_out(float g, float u)
{
	const float a = __half2float(__float2half_rn(g));

	return __float2half_rn((a / (1.0f + expf(-a))) * __half2float(__float2half_rn(u)));
}

/* One output of a block: the plain form stores sum tile row rr (of 16 * MT) for x row j;
 * the GLU form pairs the gate row rr (tile 0) with the up row rr (tile 1). get(rr, j)
 * gives a tile element's sum. */
template <int MT, bool GLU, typename Get>
static __device__ __forceinline__ void gemv_store(void *y, int y_f32, int rows, int r0, int rr,
						  int j, Get get)
{
	if (GLU) {
		const int half = rows / 2;

		if (r0 + rr < half)
			((__half *)y)[(size_t)j * half + r0 + rr] =
				glu_out(get(rr, j), get(16 + rr, j));
		return;
	}
	if (r0 + rr >= rows)
		return;
	if (y_f32)
		((float *)y)[(size_t)j * rows + r0 + rr] = get(rr, j);
	else
		((__half *)y)[(size_t)j * rows + r0 + rr] = __float2half_rn(get(rr, j));
}

/*
 * GLU (matmul_glu, add_rmsnorm_matmul's glu): W is [gate; up], rows / 2 each, and the
 * block's two 16-row tiles (MT = 2) are gate rows g0.. and the up rows half + g0.., so
 * the block ends with both halves of its 16 outputs and writes silu(g) * u [n, rows / 2]
 * (f16) instead of the rows. The k-sums are the plain kernel's.
 */
template <int MT, int NI, int WARPS, int PF, int XF, bool GLU>
static __global__ void __launch_bounds__(WARPS * 32,
					 (MT == 1 ? (XF == XF_SILU && NI >= 4 ? 1 : 2) :
						    NI >= 3 ? 1 : 2) *
						 8 / WARPS)
	gemv_tc_kernel(void *__restrict__ y, int y_f32, const __half *__restrict__ x,
		       const __half *__restrict__ w, int rows, int cols, int n,
		       float *__restrict__ part, int32_t *__restrict__ count, struct gemv_norm nm)
{
	using namespace nvcuda;
	constexpr bool SILU = XF == XF_SILU, NORM = XF == XF_NORM;
	static_assert(!NORM || NI == 1, "the norm form takes one row of x");
	static_assert(!GLU || (MT == 2 && !SILU), "the GLU form pairs two tiles of plain x");
	extern __shared__ __align__(128) unsigned char tc_smem[];
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	const int sub = lane >> 3, chunk = lane & 7;
	/* GLU: the first gate row (its up row is half further); else the first row */
	const int r0 = blockIdx.x * (GLU ? 16 : 16 * MT);
	constexpr int OUTS = GLU ? 16 : 16 * MT; /* outputs a block writes for each row of x */
	/* split (gridDim.y) > 1: this block takes split blockIdx.y of the column steps */
	const int split = (int)gridDim.y, nsteps = (cols + TC_KS - 1) / TC_KS;
	const int q0 = (int)blockIdx.y * nsteps / split;
	const int q1 = ((int)blockIdx.y + 1) * nsteps / split;
	const int s0 = q0 + warp * (q1 - q0) / WARPS, s1 = q0 + (warp + 1) * (q1 - q0) / WARPS;
	const size_t ldx = SILU ? 2 * (size_t)cols : (size_t)cols; /* x row stride */
	__half *ws = (__half *)(tc_smem + warp * tc_warp<MT>::bytes);
	__half *xs = ws + 16 * MT * TC_LD;
	/* XF_NORM: the residual row (f32), the normed x row and the partial sums */
	float *rs = (float *)(tc_smem + WARPS * tc_warp<MT>::bytes);
	__half *xn = (__half *)(rs + (NORM ? cols : 0));
	const __half *wp[4 * MT];
	wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[MT];
	/* xu: the up halves (SILU only; a dead array otherwise) */
	uint4 wr[PF][4 * MT], xr[PF][NI], xu[SILU ? PF : 1][SILU ? NI : 1];

#pragma unroll
	for (int i = 0; i < 4 * MT; i++) {
		const int half = rows / 2, k = r0 + sub + 4 * (GLU ? i & 3 : i);
		const int r = GLU ? (i < 4 ? k : half + k) : k;

		/* a row past the end reads the last row (valid) and is never stored */
		wp[i] = w + (size_t)((GLU ? k < half : r < rows) ? r : rows - 1) * cols + chunk * 8;
	}
#pragma unroll
	for (int m = 0; m < MT; m++)
		wmma::fill_fragment(acc[m], 0.0f);
	/* x rows this warp never loads stay zero */
	for (int i = lane; i < (16 - 4 * NI) * TC_LD / 8; i += 32)
		((uint4 *)(xs + 4 * NI * TC_LD))[i] = make_uint4(0, 0, 0, 0);

	/* Loads of step s into register slot d; columns past the end and x rows past n read
	 * as zero. The W half reads only weights, so the prologue issues it before the
	 * launch-overlap wait (pdl.h) and the x half after it. */
#define TC_ISSUE_W(d, s)                                                                \
	do {                                                                            \
		const bool in_ = (s) * TC_KS + chunk * 8 < cols;                        \
		_Pragma("unroll") for (int i = 0; i < 4 * MT; i++) wr[d][i] =           \
			in_ ? __ldg((const uint4 *)(wp[i] + (s) * TC_KS)) :             \
			      make_uint4(0, 0, 0, 0);                                   \
	} while (0)
#define TC_ISSUE_X(d, s)                                                                \
	do {                                                                            \
		const int k_ = (s) * TC_KS + chunk * 8;                                 \
		const bool in_ = k_ < cols;                                             \
		_Pragma("unroll") for (int i = 0; i < NI; i++) {                        \
			const int j_ = sub + 4 * i;                                     \
			const __half *xp_ = x + (size_t)j_ * ldx + k_;                  \
			if (NORM)                                                       \
				xr[d][i] = in_ && j_ < n ? *(const uint4 *)(xn + k_) :  \
							   make_uint4(0, 0, 0, 0);      \
			else                                                            \
				xr[d][i] = in_ && j_ < n ? __ldg((const uint4 *)xp_) :  \
							   make_uint4(0, 0, 0, 0);      \
			if (SILU)                                                       \
				xu[SILU ? d : 0][SILU ? i : 0] =                        \
					in_ && j_ < n ?                                 \
						__ldg((const uint4 *)(xp_ + cols)) :    \
						make_uint4(0, 0, 0, 0);                 \
		}                                                                       \
	} while (0)
#define TC_ISSUE(d, s)                                                                  \
	do {                                                                            \
		TC_ISSUE_W(d, s);                                                       \
		TC_ISSUE_X(d, s);                                                       \
	} while (0)

#pragma unroll
	for (int d = 0; d < PF; d++)
		if (s0 + d < s1)
			TC_ISSUE_W(d, s0 + d);
	sm70__pdl_enter();
	if constexpr (NORM)
		gemv_norm_row<WARPS * 32>(nm, cols, rs, xn, (float *)(xn + cols));
#pragma unroll
	for (int d = 0; d < PF; d++)
		if (s0 + d < s1)
			TC_ISSUE_X(d, s0 + d);
	for (int s = s0; s < s1; s += PF) {
#pragma unroll
		for (int d = 0; d < PF; d++) {
			if (s + d >= s1)
				break;
#pragma unroll
			for (int i = 0; i < 4 * MT; i++)
				*(uint4 *)(ws + (sub + 4 * i) * TC_LD + chunk * 8) = wr[d][i];
#pragma unroll
			for (int i = 0; i < NI; i++)
				*(uint4 *)(xs + (sub + 4 * i) * TC_LD + chunk * 8) =
					SILU ? silu_mul8(xr[d][i], xu[SILU ? d : 0][SILU ? i : 0]) :
					       xr[d][i];
			if (s + d + PF < s1)
				TC_ISSUE(d, s + d + PF);
			__syncwarp();
#pragma unroll
			for (int kk = 0; kk < TC_KS / 16; kk++) {
				wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major>
					b;

				wmma::load_matrix_sync(b, xs + kk * 16, TC_LD);
#pragma unroll
				for (int m = 0; m < MT; m++) {
					wmma::fragment<wmma::matrix_a, 16, 16, 16, __half,
						       wmma::row_major> af;

					wmma::load_matrix_sync(af, ws + m * 16 * TC_LD + kk * 16,
							       TC_LD);
					wmma::mma_sync(acc[m], af, b, acc[m]);
				}
			}
			__syncwarp(); /* the stage is free for the next step */
		}
	}
#undef TC_ISSUE
#undef TC_ISSUE_W
#undef TC_ISSUE_X

	/* Each warp's partial tiles (rows x 16 x columns, row-major) into its own stage,
	 * then the block adds them. */
	{
		float *red = (float *)ws;

#pragma unroll
		for (int m = 0; m < MT; m++)
			wmma::store_matrix_sync(red + m * 256, acc[m], 16, wmma::mem_row_major);
	}
	__syncthreads();
	if (split > 1) {
		/* Split columns: the block's sums go to its slot of part; the last of the
		 * tile's blocks to arrive adds the slots in split order (the same sums
		 * whatever the order of arrival) and leaves the counter at zero again. */
		__shared__ int last;
		float *mine = part + ((size_t)blockIdx.x * split + blockIdx.y) * (256 * MT);

		for (int idx = threadIdx.x; idx < n * 16 * MT; idx += WARPS * 32) {
			const int j = idx / (16 * MT), rr = idx - j * (16 * MT);

			mine[idx] = tc_block_sum<MT, WARPS>(tc_smem, rr, j);
		}
		__threadfence();
		__syncthreads();
		if (threadIdx.x == 0)
			last = atomicAdd(&count[blockIdx.x], 1) == split - 1;
		__syncthreads();
		if (!last)
			return;
		__threadfence();
		/* GLU: an output takes two partial sums (gate, up), so 16 outputs a row */
		for (int idx = threadIdx.x; idx < n * OUTS; idx += WARPS * 32) {
			const int j = idx / OUTS, rr = idx - j * OUTS;

			gemv_store<MT, GLU>(y, y_f32, rows, r0, rr, j, [&](int t, int jj) {
				float sum = 0.0f;

				for (int z = 0; z < split; z++)
					sum += __ldcg(part +
						      ((size_t)blockIdx.x * split + z) * (256 * MT) +
						      jj * 16 * MT + t);
				return sum;
			});
		}
		if (threadIdx.x == 0)
			count[blockIdx.x] = 0;
		return;
	}
	for (int idx = threadIdx.x; idx < n * OUTS; idx += WARPS * 32) {
		const int j = idx / OUTS, rr = idx - j * OUTS;

		gemv_store<MT, GLU>(y, y_f32, rows, r0, rr, j, [&](int t, int jj) {
			return tc_block_sum<MT, WARPS>(tc_smem, t, jj);
		});
	}
}

/*
 * How many column splits a launch of `tiles` row tiles should use (1: none). A grid a
 * little over a whole number of waves of resident blocks leaves most SMs idle for the
 * last one: Qwen3.5-27B's 5120-row projections make 320 tiles for 264 slots, and ran at
 * 66% of bandwidth against 85-90% for matrices that fill their waves (ncu, docs/
 * PERFORMANCE.md, "Where a step goes"). Splitting the columns S ways multiplies the
 * blocks; S is the smallest that brings the last wave within 5% of full (or the best up to
 * 8), keeping every warp at least eight 64-column steps: with fewer, the pipeline's ramp
 * and the partials cost more than the wave saves (measured: the 27B down projection,
 * 17408 columns, 58 -> 52 us at S = 4; its 6144- and 5120-column matrices lost 15-30% at
 * S = 2-4). The partials need the backend's scratch and counters, which a side stream may
 * not share (only the main stream splits).
 */
static int gemv_split(const struct sm70__cuda *c, int tiles, int slots, int nsteps, int warps,
		      int mt, int silu)
{
	double best_waste = 1e9;
	int best = 1;

	/* batch invariance: slots come from the occupancy of the instance, which depends on
	 * the rows of x, and the split moves a row's k-sum boundaries */
	if (silu || !c->gemv_part || c->stream != c->main || tiles > SM70__CUDA_GEMV_TILES ||
	    slots <= 0 || c->be.batch_invariant)
		return 1;
	for (int sp = 1; sp <= 8; sp++) {
		const double waves = (double)tiles * sp / slots;
		/* under one wave every block is resident from the start: no tail */
		const double waste = waves <= 1.0 ? 1.0 : (double)(long)(waves + 0.999999) / waves;

		if (sp > 1 && (nsteps / sp < 8 * warps ||
			       (size_t)tiles * sp * 256 * mt * sizeof(float) >
				       SM70__CUDA_GEMV_PART_BYTES))
			break;
		if (waste < best_waste - 0.02) {
			best_waste = waste;
			best = sp;
		}
		if (best_waste < 1.05)
			break;
	}
	return best;
}

template <int MT, int NI, int XF, int WARPS, bool GLU = false>
static void gemv_tc_launch(struct sm70__cuda *c, void *y, int y_f32, const __half *x,
			   const __half *w, int rows, int cols, int n, const struct gemv_norm &nm)
{
	/* Three steps ahead when registers allow: a 4096-row matrix gives an SM only two
	 * blocks, so each warp must keep more bytes in flight. (SILU at NI = 2 would spill.) */
	constexpr int PF = MT == 1 && NI <= (XF == XF_SILU ? 1 : 2) ? 3 : 2;
	const size_t smem = WARPS * tc_warp<MT>::bytes + (XF == XF_NORM ? gemv_norm_smem(cols) : 0);
	const int tiles = GLU ? (rows / 2 + 15) / 16 : (rows + 16 * MT - 1) / (16 * MT);
	const int res = sm70__cuda_resident(
		c, (const void *)gemv_tc_kernel<MT, NI, WARPS, PF, XF, GLU>, WARPS * 32, smem);

	int sp;

	if (c->sticky)
		return;
	sp = gemv_split(c, tiles, res * c->n_sm, (cols + TC_KS - 1) / TC_KS, WARPS, MT,
			XF == XF_SILU);
	sm70__launch_pdl(c, SM70__PDL_PREFETCH, gemv_tc_kernel<MT, NI, WARPS, PF, XF, GLU>,
			 dim3((unsigned)tiles, (unsigned)sp), dim3(WARPS * 32), smem, y, y_f32, x,
			 w, rows, cols, n, c->gemv_part, c->gemv_count, nm);
}

/* Warps per block. By default (auto) 4 for the plain GEMVs of one tile a warp and up to 8
 * rows of x whose row tiles fit one wave of 4-warp blocks but not of 8-warp ones (the
 * 5120-row matrices of Qwen3.5-27B, the 8B qkv): twice as many resident, measured 1.6-2%
 * faster end to end at B1. SM70_GEMV_WARPS=8 (the path back) or =4 forces one size. */
static int gemv_warps(const struct sm70__cuda *c, int tiles)
{
	/* batch invariance: 4-warp blocks exist only up to 8 rows of x, and the warps split
	 * a row's k-sum */
	if (c->be.batch_invariant)
		return 8;
	if (c->gemv_warps == 4)
		return 4;
	if (c->gemv_warps == -1) /* auto: the one-wave rule, at two and four blocks an SM */
		return tiles > 2 * c->n_sm && tiles <= 4 * c->n_sm ? 4 : 8;
	return 8;
}

/* 4-warp blocks exist only where the experiment above can pick them (one tile a warp, up
 * to 8 rows of x): each instance of the kernel is compiled for every target. */
template <int MT, int NI, int XF>
static void gemv_tc_pick(struct sm70__cuda *c, int four, void *y, int y_f32, const __half *x,
			 const __half *w, int rows, int cols, int n, const struct gemv_norm &nm)
{
	if constexpr (XF != XF_SILU && MT == 1 && NI <= 2) {
		if (four) {
			gemv_tc_launch<MT, NI, XF, 4>(c, y, y_f32, x, w, rows, cols, n, nm);
			return;
		}
	}
	gemv_tc_launch<MT, NI, XF, 8>(c, y, y_f32, x, w, rows, cols, n, nm);
}

/* Two 16-row tiles a warp (half the x re-reads) when that still gives four blocks an SM;
 * one otherwise, so that 4096-row matrices fill the GPU. SILU: one always (see above). */
template <bool SILU>
static void gemv_tc_dispatch(struct sm70__cuda *c, void *y, int y_f32, const __half *x,
			     const __half *w, int rows, int cols, int n)
{
	const int mt2 = (rows + 31) / 32 >= 4 * c->n_sm;
	const int four = !SILU && gemv_warps(c, mt2 ? (rows + 31) / 32 : (rows + 15) / 16) == 4;
	const struct gemv_norm none = {};
	constexpr int XF = SILU ? XF_SILU : XF_PLAIN;

#define GEMV_TC(MT, NI) gemv_tc_pick<MT, NI, XF>(c, four, y, y_f32, x, w, rows, cols, n, none)
	switch ((n + 3) / 4 + (mt2 ? 4 : 0)) {
	case 1: GEMV_TC(1, 1); break;
	case 2: GEMV_TC(1, 2); break;
	case 3: GEMV_TC(1, 3); break;
	case 4: GEMV_TC(1, 4); break;
	case 5: GEMV_TC(SILU ? 1 : 2, 1); break;
	case 6: GEMV_TC(SILU ? 1 : 2, 2); break;
	case 7: GEMV_TC(SILU ? 1 : 2, 3); break;
	case 8: GEMV_TC(SILU ? 1 : 2, 4); break;
	}
#undef GEMV_TC
}

/* See silu_matmul.cu, which declares it: y [n, rows] f16 = x W^T with x = silu(g) * u of
 * gate_up [n, 2 * cols] rounded to f16, on the tensor-core kernel above. Requires
 * 1 <= n <= 16, cols % 8 == 0 and 16-byte aligned gate_up and W. Queues on c's stream;
 * the caller checks the launch. */
void sm70__cuda_gemv_tc_silu(struct sm70__cuda *c, __half *y, const __half *gate_up,
			     const __half *w, int rows, int cols, int n)
{
	gemv_tc_dispatch<true>(c, y, 0, gate_up, w, rows, cols, n);
}

/* SM70_MATMUL=simt keeps decode on the fp32-FMA skinny kernel (for comparison); read once. */
static int want_simt(void)
{
	static int cached = -1;

	if (cached < 0) {
		const char *v = getenv("SM70_MATMUL");

		cached = v && strcmp(v, "simt") == 0;
	}
	return cached;
}

/* Whether the GLU form takes W and n: f16 [gate; up] (even rows), cols a multiple of 8,
 * up to 8 rows of x (where matmul runs the tensor-core GEMV on a tall matrix), on a
 * backend that is neither the reference, SIMT nor batch-invariant. */
static bool glu_takes(const struct sm70__cuda *c, const struct sm70_weight *w, int n)
{
	return n >= 1 && n <= 8 && w->dtype == SM70_DTYPE_F16 && w->rows > 0 && w->rows % 2 == 0 &&
	       w->cols > 0 && w->cols % 8 == 0 && !c->matmul_ref && !c->be.batch_invariant &&
	       !want_simt() && ((uintptr_t)w->data & 15) == 0;
}

/* See backend.h (matmul_glu): the tensor-core GEMV's GLU form, two tiles a warp (gate
 * and up), 8 warps. -EOPNOTSUPP, with nothing queued, for what glu_takes refuses. */
extern "C" int sm70__cuda_matmul_glu(struct sm70_backend *be, void *y, const void *x,
				     const struct sm70_weight *w, int n)
{
	struct sm70__cuda *c = sm70__cuda_enter(be);
	const struct gemv_norm none = {};

	if (!glu_takes(c, w, n) || ((uintptr_t)x & 15))
		return -EOPNOTSUPP;
	if (c->kt)
		sm70__kt_label(c, "%dx%d glu", w->rows, w->cols);
	if (n <= 4)
		gemv_tc_launch<2, 1, XF_PLAIN, 8, true>(c, y, 0, (const __half *)x,
							 (const __half *)w->data, w->rows, w->cols,
							 n, none);
	else
		gemv_tc_launch<2, 2, XF_PLAIN, 8, true>(c, y, 0, (const __half *)x,
							 (const __half *)w->data, w->rows, w->cols,
							 n, none);
	SM70_CUDA_LAUNCHED(be, "gemv_tc_kernel (glu)");
	if (c->kt)
		sm70__kt_label(c, NULL);
	return c->sticky ? -EIO : 0;
}

/* See backend.h (add_rmsnorm_matmul): the tensor-core GEMV in its XF_NORM form, whose
 * blocks each make the normed row themselves while their first weight loads are in
 * flight (with glu, its GLU form too). Takes one row of x, f16 W with cols a multiple
 * of 8 up to 8192, and the alignments add_rmsnorm's vector kernel needs; anything else
 * (or a reference, SIMT or batch-invariant backend) gets -EOPNOTSUPP with nothing
 * queued. */
extern "C" int sm70__cuda_add_rmsnorm_matmul(struct sm70_backend *be, void *y, float *resid_out,
					     const float *resid_in, const void *delta,
					     const float *norm_w, float eps,
					     const struct sm70_weight *w, int n, int glu)
{
	struct sm70__cuda *c = sm70__cuda_enter(be);
	const int rows = w->rows, cols = w->cols;
	const __half *wh = (const __half *)w->data;
	const struct gemv_norm nm = { resid_in, (const __half *)delta, resid_out, norm_w, eps };
	int mt2, four;

	if (n != 1 || w->dtype != SM70_DTYPE_F16 || rows <= 0 || cols <= 0 || cols % 8 ||
	    cols > 8192 || c->matmul_ref || c->be.batch_invariant || want_simt() ||
	    (glu && !glu_takes(c, w, n)) || ((uintptr_t)w->data & 15) ||
	    ((uintptr_t)resid_in & 15) || ((uintptr_t)resid_out & 15) ||
	    ((uintptr_t)norm_w & 15) || ((uintptr_t)delta & 7))
		return -EOPNOTSUPP;
	if (resid_out && resid_out == resid_in)
		return -EINVAL;
	mt2 = (rows + 31) / 32 >= 4 * c->n_sm;
	four = gemv_warps(c, mt2 ? (rows + 31) / 32 : (rows + 15) / 16) == 4;
	if (c->kt)
		sm70__kt_label(c, glu ? "%dx%d glu" : "%dx%d", rows, cols);
	if (glu)
		gemv_tc_launch<2, 1, XF_NORM, 8, true>(c, y, 0, NULL, wh, rows, cols, 1, nm);
	else if (mt2)
		gemv_tc_pick<2, 1, XF_NORM>(c, four, y, 0, NULL, wh, rows, cols, 1, nm);
	else
		gemv_tc_pick<1, 1, XF_NORM>(c, four, y, 0, NULL, wh, rows, cols, 1, nm);
	if (glu)
		SM70_CUDA_LAUNCHED(be, "gemv_tc_kernel (norm, glu)");
	else
		SM70_CUDA_LAUNCHED(be, "gemv_tc_kernel (norm)");
	if (c->kt)
		sm70__kt_label(c, NULL);
	return c->sticky ? -EIO : 0;
}

/*
 * Batch invariance (the backend's batch_invariant): one kernel for every n, so that row j
 * of y has the same bits whatever the other rows are. The tensor-core GEMV with 8 warps
 * and no column split, over x in slices of 16 rows: an output's k-sum is then fixed by
 * the matrix alone (each warp's share of the 64-column steps, the mma's own order, the
 * warps added in order), and an mma's output column depends on its x row alone, so
 * neither the slice's other rows nor the MT / NI / PF instance picked for its size
 * change it. Shapes the GEMV does not take (cols not a multiple of 8, unaligned
 * buffers) run the reference kernel, one thread an output, at every n.
 */
static void matmul_invariant(struct sm70__cuda *c, void *y, int y_f32, const __half *x,
			     const __half *w, int rows, int cols, int n)
{
	const size_t ysz = y_f32 ? sizeof(float) : sizeof(__half);

	if (cols % 8 || ((uintptr_t)x & 15) || ((uintptr_t)w & 15)) {
		for (int i0 = 0; i0 < n; i0 += 65535) {
			const int m = n - i0 < 65535 ? n - i0 : 65535;

			matmul_ref_kernel<<<dim3((rows + 127) / 128, m), 128, 0, c->stream>>>(
				(char *)y + (size_t)i0 * rows * ysz, y_f32, x + (size_t)i0 * cols,
				w, rows, cols);
			if (SM70_CUDA_LAUNCHED(&c->be, "matmul_ref_kernel"))
				return;
		}
		return;
	}
	/* a slice's x stays 16-byte aligned: cols % 8 == 0 */
	for (int i0 = 0; i0 < n; i0 += 16) {
		const int m = n - i0 < 16 ? n - i0 : 16;

		gemv_tc_dispatch<false>(c, (char *)y + (size_t)i0 * rows * ysz, y_f32,
					x + (size_t)i0 * cols, w, rows, cols, m);
		if (SM70_CUDA_LAUNCHED(&c->be, "gemv_tc_kernel"))
			return;
	}
}

/* sm70__cuda_matmul's body. */
static void matmul(struct sm70_backend *be, void *y, int y_f32, const void *x,
		   const struct sm70_weight *w, int n)
{
	struct sm70__cuda *c = sm70__cuda_enter(be);
	const __half *xh = (const __half *)x, *wh = (const __half *)w->data;
	const int rows = w->rows, cols = w->cols;

	if (n <= 0 || rows <= 0)
		return;
	if (w->dtype == SM70_DTYPE_NVFP4) {
		sm70__cuda_matmul_nvfp4(be, y, y_f32, x, w, n);
		return;
	}
	if (w->dtype != SM70_DTYPE_F16) {
		sm70__cuda_fail(be, "matmul", __FILE__, __LINE__, "weights must be f16 or nvfp4");
		return;
	}
	if (c->matmul_ref) {
		matmul_ref_kernel<<<dim3((rows + 127) / 128, n), 128, 0, c->stream>>>(
			y, y_f32, xh, wh, rows, cols);
		SM70_CUDA_LAUNCHED(be, "matmul_ref_kernel");
		return;
	}
	if (c->be.batch_invariant) {
		matmul_invariant(c, y, y_f32, xh, wh, rows, cols, n);
		return;
	}
	/* Measured (docs/PERFORMANCE.md, GEMV table): above 8 rows of x, cuBLAS beats the
	 * tensor-core GEMV on tall matrices (qkv, gate_up, the LM head), whose x tile every
	 * block re-reads; ours stays ahead on square and wide ones (o_proj, down_proj). */
	if (n <= 16 && !(n > 8 && rows > cols)) {
		int aligned = cols % 8 == 0 && ((uintptr_t)x & 15) == 0 &&
			      ((uintptr_t)w->data & 15) == 0;

		if (aligned && !want_simt()) {
			gemv_tc_dispatch<false>(c, y, y_f32, xh, wh, rows, cols, n);
			SM70_CUDA_LAUNCHED(be, "gemv_tc_kernel");
			return;
		}
		if (aligned)
			gemv_dispatch<8>(c, y, y_f32, xh, wh, rows, cols, n);
		else
			gemv_dispatch<1>(c, y, y_f32, xh, wh, rows, cols, n);
		SM70_CUDA_LAUNCHED(be, "gemv_kernel");
		return;
	}
	{
		const float alpha = 1.0f, beta = 0.0f;

		/* Column-major view: y^T [rows, n] = (W^T)^T [rows, cols] x^T [cols, n]. */
		SM70_CUBLAS_CHECK(be, cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, rows, n,
						   cols, &alpha, wh, CUDA_R_16F, cols, xh,
						   CUDA_R_16F, cols, &beta, y,
						   y_f32 ? CUDA_R_32F : CUDA_R_16F, rows,
						   CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
		if (c->kt)
			sm70__kt_mark(c, "cublasGemmEx");
	}
}

/* See backend.h. w->dtype must be f16 (the backend's weight_dtype) or NVFP4 (then
 * matmul_nvfp4.cu computes it); y must not overlap x or W. A profiled backend's rows
 * name the matrix shape. */
extern "C" void sm70__cuda_matmul(struct sm70_backend *be, void *y, int y_f32, const void *x,
				  const struct sm70_weight *w, int n)
{
	struct sm70__cuda *c = (struct sm70__cuda *)be->priv;

	if (c->kt)
		sm70__kt_label(c, "%dx%d", w->rows, w->cols);
	matmul(be, y, y_f32, x, w, n);
	if (c->kt)
		sm70__kt_label(c, NULL);
}
