/*
 * silu_mul.cu - the CUDA silu_mul op: the gated MLP's silu(gate) * up, f16 in and out,
 * fp32 math with PyTorch's formula x / (1 + exp(-x)).
 *
 * Non-goals: other activations; fusing into the down projection.
 */
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/pdl.h"

static __global__ void silu_mul_kernel(__half *__restrict__ out,
				       const __half *__restrict__ gate_up, int inter)
{
	sm70__pdl_enter();
	const __half *g = gate_up + (size_t)blockIdx.y * 2 * inter;
	const __half *u = g + inter;
	__half *o = out + (size_t)blockIdx.y * inter;

	for (int k = blockIdx.x * blockDim.x + threadIdx.x; k < inter;
	     k += gridDim.x * blockDim.x) {
		float a = __half2float(g[k]);

		o[k] = __float2half_rn((a / (1.0f + expf(-a))) * __half2float(u[k]));
	}
}

/* See backend.h. out must not overlap gate_up. */
extern "C" void sm70__cuda_silu_mul(struct sm70_backend *be, void *out, const void *gate_up,
				    int n, int inter)
{
	struct sm70__cuda *c = sm70__cuda_enter(be);
	const int threads = 256;
	int bx = (inter + threads - 1) / threads;

	if (n <= 0 || inter <= 0)
		return;
	if (bx > 64)
		bx = 64;
	sm70__launch_pdl(c, SM70__PDL_ACT, silu_mul_kernel, dim3(bx, n), dim3(threads), 0,
			 (__half *)out, (const __half *)gate_up, inter);
	SM70_CUDA_LAUNCHED(be, "silu_mul_kernel");
}
