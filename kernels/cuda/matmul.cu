/*
 * matmul.cu - the CUDA matmul op: y[n, rows] = x[n, cols] W^T, W f16 [rows, cols], x f16,
 * y f16 or f32, fp32 accumulation everywhere.
 *
 * Three paths:
 * - n <= 16 (decode): a skinny GEMM that streams W once. Each warp owns GEMV_ROWS output
 *   rows; its lanes read W in 16-byte vectors (8 halves; scalar halves when cols or a
 *   pointer is not 16-byte aligned) and apply each W element to all n input rows, which
 *   the block stages in shared memory one column chunk at a time. Lane partial sums are
 *   folded with warp shuffles at the end.
 * - n > 16 (prefill): cuBLAS cublasGemmEx, f16 inputs, CUBLAS_COMPUTE_32F.
 * - SM70_MATMUL=reference: one thread per output element, a plain dot product; the named
 *   path back when the fast paths are suspect.
 *
 * Non-goals: quantised weights, split-K for very short row counts, tensor cores in the
 * skinny path (decode is bound by reading W, which this does once at full width).
 */
#include <stdint.h>

#include "kernels/cuda/cuda_check.h"

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

/* See backend.h. w->dtype must be f16 (the backend's weight_dtype); y must not overlap x
 * or W. */
extern "C" void sm70__cuda_matmul(struct sm70_backend *be, void *y, int y_f32, const void *x,
				  const struct sm70_weight *w, int n)
{
	struct sm70__cuda *c = sm70__cuda_enter(be);
	const __half *xh = (const __half *)x, *wh = (const __half *)w->data;
	const int rows = w->rows, cols = w->cols;

	if (n <= 0 || rows <= 0)
		return;
	if (w->dtype != SM70_DTYPE_F16) {
		sm70__cuda_fail(be, "matmul", __FILE__, __LINE__, "weights must be f16");
		return;
	}
	if (c->matmul_ref) {
		matmul_ref_kernel<<<dim3((rows + 127) / 128, n), 128, 0, c->stream>>>(
			y, y_f32, xh, wh, rows, cols);
		SM70_CUDA_LAUNCHED(be, "matmul_ref_kernel");
		return;
	}
	if (n <= 16) {
		int aligned = cols % 8 == 0 && ((uintptr_t)x & 15) == 0 &&
			      ((uintptr_t)w->data & 15) == 0;

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
	}
}
