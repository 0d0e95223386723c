/*
 * add_rmsnorm.cu - the CUDA add_rmsnorm op: resid (f32) += delta (f16), then the RMSNorm
 * of the row into y (f16), all math in fp32.
 *
 * One block per row. Each thread adds and squares the same elements it later normalises,
 * and the block-wide sum's barriers sit between every read of delta and every write of y,
 * so y may be the same buffer as delta. The sum of squares is fp32 (a tree over threads);
 * the CPU twin sums in double, which agrees to ~1e-7 relative at these lengths.
 *
 * Non-goals: the (1 + w) weight form (the model folds it into w); rows longer than fit
 * int.
 */
#include "kernels/cuda/cuda_check.h"

static __global__ void add_rmsnorm_kernel(__half *y, float *__restrict__ resid,
					  const __half *delta, const float *__restrict__ w,
					  int dim, float eps)
{
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

/* See backend.h. y may be the same buffer as delta; w is f32 [dim]. */
extern "C" void sm70__cuda_add_rmsnorm(struct sm70_backend *be, void *y, float *resid,
				       const void *delta, const float *w, int n, int dim,
				       float eps)
{
	struct sm70__cuda *c = sm70__cuda_enter(be);
	int threads = dim >= 2048 ? 1024 : dim >= 512 ? 256 : 128;

	if (n <= 0 || dim <= 0)
		return;
	add_rmsnorm_kernel<<<n, threads, 0, c->stream>>>((__half *)y, resid,
							 (const __half *)delta, w, dim, eps);
	SM70_CUDA_LAUNCHED(be, "add_rmsnorm_kernel");
}
