/*
 * add_rmsnorm.cu - the CUDA add_rmsnorm op: resid (f32) += delta (f16), then the RMSNorm
 * of the row into y (f16), all math in fp32.
 *
 * One block per row. Each thread adds and squares the same elements it later normalises,
 * and the block-wide sum's barriers sit between every read of delta and every write of y,
 * so y may be the same buffer as delta. The sum of squares is fp32 (a tree over threads);
 * the CPU twin sums in double, which agrees to ~1e-7 relative at these lengths.
 *
 * Rows of a multiple of 4 up to 8192 (every model's hidden size) take the vector kernel:
 * each thread issues every load it needs (16-byte resid and w, 8-byte delta) before it
 * uses any, so a row costs one memory latency. The plain loop it replaced stored each
 * resid element before loading the next (the compiler may not move a load of resid past
 * a store to it), which made a decode row four to five dependent DRAM round trips: 5.6 us
 * a call on an H200, measured with ncu (docs/PERFORMANCE.md, "Where a step goes").
 *
 * Non-goals: the (1 + w) weight form (the model folds it into w); rows longer than fit
 * int.
 */
#include <stdint.h>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/pdl.h"

static __global__ void add_rmsnorm_kernel(__half *y, float *__restrict__ resid,
					  const __half *delta, const float *__restrict__ w,
					  int dim, float eps)
{
	sm70__pdl_enter();
	__shared__ float part[32];
	float *r = resid + (size_t)blockIdx.x * dim;
	const __half *d = delta ? delta + (size_t)blockIdx.x * dim : NULL;
	__half *yr = y + (size_t)blockIdx.x * dim;
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	float ss = 0.0f, inv;

	for (int k = threadIdx.x; k < dim; k += blockDim.x) {
		float v = r[k];

		if (d) {
			v += __half2float(d[k]);
			r[k] = v;
		}
		ss += v * v;
	}
	ss = sm70__warp_sum(ss);
	if (lane == 0)
		part[warp] = ss;
	__syncthreads();
	if (warp == 0) {
		ss = lane < (int)(blockDim.x >> 5) ? part[lane] : 0.0f;
		ss = sm70__warp_sum(ss);
		if (lane == 0)
			part[0] = ss;
	}
	__syncthreads();
	inv = 1.0f / sqrtf(part[0] / (float)dim + eps);
	for (int k = threadIdx.x; k < dim; k += blockDim.x)
		yr[k] = __float2half_rn((r[k] * inv) * w[k]);
}

#define VEC_THREADS 256
#define VEC_MAX_CHUNKS 8 /* 4-element chunks a thread: rows up to 8192 */

/* NCH chunks of 4 a thread; dim % 4 == 0 and dim <= 4 * NCH * VEC_THREADS. */
template <int NCH>
static __global__ void __launch_bounds__(VEC_THREADS)
	add_rmsnorm_vec_kernel(__half *y, float *__restrict__ resid, const __half *delta,
			       const float *__restrict__ w, int dim, float eps)
{
	__shared__ float part[VEC_THREADS / 32];
	const int n4 = dim / 4, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	float4 *r = (float4 *)(resid + (size_t)blockIdx.x * dim);
	const uint2 *d = delta ? (const uint2 *)(delta + (size_t)blockIdx.x * dim) : NULL;
	uint2 *yr = (uint2 *)(y + (size_t)blockIdx.x * dim);
	float4 v[NCH], wv[NCH];
	float ss = 0.0f, inv;

	/* w is a weight: it may load while the op ahead drains (pdl.h) */
#pragma unroll
	for (int c = 0; c < NCH; c++) {
		const int i = threadIdx.x + c * VEC_THREADS;

		if (i < n4)
			wv[c] = __ldg((const float4 *)w + i);
	}
	sm70__pdl_enter();
#pragma unroll
	for (int c = 0; c < NCH; c++) {
		const int i = threadIdx.x + c * VEC_THREADS;

		if (i < n4)
			v[c] = r[i];
	}
	if (d) {
		uint2 dv[NCH];

#pragma unroll
		for (int c = 0; c < NCH; c++) {
			const int i = threadIdx.x + c * VEC_THREADS;

			if (i < n4)
				dv[c] = d[i];
		}
#pragma unroll
		for (int c = 0; c < NCH; c++) {
			const int i = threadIdx.x + c * VEC_THREADS;

			if (i < n4) {
				const float2 lo = __half22float2(*(const __half2 *)&dv[c].x);
				const float2 hi = __half22float2(*(const __half2 *)&dv[c].y);

				v[c].x += lo.x, v[c].y += lo.y, v[c].z += hi.x, v[c].w += hi.y;
				r[i] = v[c];
			}
		}
	}
#pragma unroll
	for (int c = 0; c < NCH; c++)
		if (threadIdx.x + c * VEC_THREADS < n4)
			ss += v[c].x * v[c].x + v[c].y * v[c].y + v[c].z * v[c].z +
			      v[c].w * v[c].w;
	ss = sm70__warp_sum(ss);
	if (lane == 0)
		part[warp] = ss;
	__syncthreads();
	ss = lane < VEC_THREADS / 32 ? part[lane] : 0.0f;
	ss = sm70__warp_sum(ss);
	inv = 1.0f / sqrtf(ss / (float)dim + eps);
#pragma unroll
	for (int c = 0; c < NCH; c++) {
		const int i = threadIdx.x + c * VEC_THREADS;

		if (i < n4) {
			const __half2 lo = __floats2half2_rn((v[c].x * inv) * wv[c].x,
							     (v[c].y * inv) * wv[c].y);
			const __half2 hi = __floats2half2_rn((v[c].z * inv) * wv[c].z,
							     (v[c].w * inv) * wv[c].w);
			uint2 o;

			o.x = *(const uint32_t *)&lo;
			o.y = *(const uint32_t *)&hi;
			yr[i] = o;
		}
	}
}

/* See backend.h. y may be the same buffer as delta; w is f32 [dim]. */
extern "C" void sm70__cuda_add_rmsnorm(struct sm70_backend *be, void *y, float *resid,
				       const void *delta, const float *w, int n, int dim,
				       float eps)
{
	struct sm70__cuda *c = sm70__cuda_enter(be);
	int threads = dim >= 2048 ? 1024 : dim >= 512 ? 256 : 128;
	const int nch = (dim / 4 + VEC_THREADS - 1) / VEC_THREADS;

	if (n <= 0 || dim <= 0)
		return;
	if (dim % 4 == 0 && nch <= VEC_MAX_CHUNKS && ((uintptr_t)resid & 15) == 0 &&
	    ((uintptr_t)w & 15) == 0 && ((uintptr_t)y & 7) == 0 && ((uintptr_t)delta & 7) == 0) {
		switch (nch) {
#define CASE(N)                                                                          \
	case N:                                                                          \
		sm70__launch_pdl(c, SM70__PDL_NORM, add_rmsnorm_vec_kernel<N>, dim3(n),   \
				 dim3(VEC_THREADS), 0, (__half *)y, resid,                \
				 (const __half *)delta, w, dim, eps);                     \
		break;
			CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6) CASE(7) CASE(8)
#undef CASE
		}
		SM70_CUDA_LAUNCHED(be, "add_rmsnorm_vec_kernel");
		return;
	}
	sm70__launch_pdl(c, SM70__PDL_NORM, add_rmsnorm_kernel, dim3(n), dim3(threads), 0,
			 (__half *)y, resid, (const __half *)delta, w, dim, eps);
	SM70_CUDA_LAUNCHED(be, "add_rmsnorm_kernel");
}
