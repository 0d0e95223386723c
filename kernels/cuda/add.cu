/*
 * add.cu - the CUDA add op: the f32 residual stream plus an f16 activation.
 *
 * Non-goals: fusing with anything (add_rmsnorm.cu does the fused form the model uses).
 */
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/pdl.h"

static __global__ void add_kernel(float *__restrict__ resid, const __half *__restrict__ x,
				  size_t count)
{
	size_t stride = (size_t)gridDim.x * blockDim.x;

	sm70__pdl_enter();
	for (size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x; k < count; k += stride)
		resid[k] += __half2float(x[k]);
}

/* See backend.h. resid and x must not overlap. */
extern "C" void sm70__cuda_add(struct sm70_backend *be, float *resid, const void *x,
			       size_t count)
{
	struct sm70__cuda *c = sm70__cuda_enter(be);
	const int threads = 256;
	size_t blocks = (count + threads - 1) / threads;
	size_t cap = (size_t)c->n_sm * 8;

	if (count == 0)
		return;
	sm70__launch_pdl(c, SM70__PDL_ACT, add_kernel,
			 dim3((unsigned)(blocks < cap ? blocks : cap)), dim3(threads), 0, resid,
			 (const __half *)x, count);
	SM70_CUDA_LAUNCHED(be, "add_kernel");
}
