/*
 * sigmoid_scale_add.cu - the CUDA sigmoid_scale_add op: an MoE block's shared expert,
 * scaled per token by sigmoid of its gate logit (f32, one column of the router's output),
 * added into the block's f16 output.
 *
 * s = 1 / (1 + expf(-g)) once per row, then out = f16(out + s * x) with the product and
 * the sum rounded separately (no fused multiply-add), as the CPU twin's f32 expression.
 * Element-wise and memory-bound: a block-row of threads a token, two values a thread when
 * dim and the pointers allow.
 *
 * Non-goals: per-element gates (sigmoid_mul), other gate functions.
 */
#include <stdint.h>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/pdl.h"

static __device__ __forceinline__ float ssa_one(float o, float s, float x)
{
	return __fadd_rn(o, __fmul_rn(s, x));
}

/* V consecutive halves a thread, V in {1, 2}; dim % V == 0. */
template <int V>
static __global__ void sigmoid_scale_add_kernel(__half *__restrict__ out,
						const __half *__restrict__ x,
						const float *__restrict__ gate, int ld, int dim)
{
	sm70__pdl_enter();
	const float s = 1.0f / (1.0f + expf(-gate[(size_t)blockIdx.y * ld]));
	__half *o = out + (size_t)blockIdx.y * dim;
	const __half *xr = x + (size_t)blockIdx.y * dim;

	for (int k = (blockIdx.x * blockDim.x + threadIdx.x) * V; k < dim;
	     k += gridDim.x * blockDim.x * V) {
		if (V == 2) {
			const float2 a = __half22float2(*(const __half2 *)(o + k));
			const float2 b = __half22float2(*(const __half2 *)(xr + k));

			*(__half2 *)(o + k) = __floats2half2_rn(ssa_one(a.x, s, b.x),
								ssa_one(a.y, s, b.y));
		} else {
			o[k] = __float2half_rn(ssa_one(__half2float(o[k]), s, __half2float(xr[k])));
		}
	}
}

/* See backend.h. out must not overlap x or gate; n <= 65535 rows a call. */
extern "C" void sm70__cuda_sigmoid_scale_add(struct sm70_backend *be, void *out, const void *x,
					     const float *gate, int ld, int n, int dim)
{
	struct sm70__cuda *c = sm70__cuda_enter(be);
	const int threads = 256;
	const int v = dim % 2 == 0 && (((uintptr_t)out | (uintptr_t)x) & 3) == 0 ? 2 : 1;
	int bx;

	if (n <= 0 || dim <= 0)
		return;
	if (ld < 0 || n > 65535) {
		sm70__cuda_fail(be, "sigmoid_scale_add", __FILE__, __LINE__, "bad ld or n");
		return;
	}
	bx = (dim / v + threads - 1) / threads;
	if (bx > 64)
		bx = 64;
	if (v == 2)
		sm70__launch_pdl(c, SM70__PDL_ACT, sigmoid_scale_add_kernel<2>, dim3(bx, n),
				 dim3(threads), 0, (__half *)out, (const __half *)x, gate, ld, dim);
	else
		sm70__launch_pdl(c, SM70__PDL_ACT, sigmoid_scale_add_kernel<1>, dim3(bx, n),
				 dim3(threads), 0, (__half *)out, (const __half *)x, gate, ld, dim);
	SM70_CUDA_LAUNCHED(be, "sigmoid_scale_add_kernel");
}
