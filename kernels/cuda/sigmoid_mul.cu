/*
 * sigmoid_mul.cu - the CUDA sigmoid_mul op: gated attention's output gate, x *= sigmoid(g),
 * in place on f16 x with the gate read from f16 rows ld elements apart (inside the q_proj
 * output), fp32 math, sigmoid(g) = 1 / (1 + exp(-g)).
 *
 * Element-wise and memory-bound: each thread takes 8, 2 or 1 consecutive values (16-, 4-
 * or 2-byte accesses), the widest that dim, ld and the pointers' alignment allow.
 *
 * Non-goals: other activations; fusing into the o projection.
 */
#include <stdint.h>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/pdl.h"

static __device__ __forceinline__ float sm_gate(float x, float g)
{
	return x * (1.0f / (1.0f + expf(-g)));
}

/* V consecutive halfs per thread, V in {1, 2, 8}; dim % V == 0, ld % V == 0. */
template <int V>
static __global__ void sigmoid_mul_kernel(__half *__restrict__ x, const __half *__restrict__ gate,
					  int ld, int dim)
{
	sm70__pdl_enter();
	__half *xr = x + (size_t)blockIdx.y * dim;
	const __half *gr = gate + (size_t)blockIdx.y * ld;

	for (int k = (blockIdx.x * blockDim.x + threadIdx.x) * V; k < dim;
	     k += gridDim.x * blockDim.x * V) {
		if (V == 8) {
			uint4 xv = *(const uint4 *)(xr + k), gv = *(const uint4 *)(gr + k);
			__half2 *xh = (__half2 *)&xv;
			const __half2 *gh = (const __half2 *)&gv;

			for (int e = 0; e < 4; e++) {
				float2 a = __half22float2(xh[e]), g = __half22float2(gh[e]);

				xh[e] = __floats2half2_rn(sm_gate(a.x, g.x), sm_gate(a.y, g.y));
			}
			*(uint4 *)(xr + k) = xv;
		} else if (V == 2) {
			float2 a = __half22float2(*(const __half2 *)(xr + k));
			float2 g = __half22float2(*(const __half2 *)(gr + k));

			*(__half2 *)(xr + k) = __floats2half2_rn(sm_gate(a.x, g.x), sm_gate(a.y, g.y));
		} else {
			xr[k] = __float2half_rn(sm_gate(__half2float(xr[k]), __half2float(gr[k])));
		}
	}
}

/* See backend.h. x may not overlap the gate. */
extern "C" void sm70__cuda_sigmoid_mul(struct sm70_backend *be, void *x, const void *gate,
				       int ld, int n, int dim)
{
	struct sm70__cuda *c = sm70__cuda_enter(be);
	const int threads = 256;
	const uintptr_t align = (uintptr_t)x | (uintptr_t)gate;
	int v = 1, bx;

	if (n <= 0 || dim <= 0)
		return;
	if (ld < dim || n > 65535) {
		sm70__cuda_fail(be, "sigmoid_mul", __FILE__, __LINE__, "bad ld or n");
		return;
	}
	if (dim % 8 == 0 && ld % 8 == 0 && align % 16 == 0)
		v = 8;
	else if (dim % 2 == 0 && ld % 2 == 0 && align % 4 == 0)
		v = 2;
	bx = (dim / v + threads - 1) / threads;
	if (bx > 64)
		bx = 64;
	if (v == 8)
		sm70__launch_pdl(c, SM70__PDL_ACT, sigmoid_mul_kernel<8>, dim3(bx, n),
				 dim3(threads), 0, (__half *)x, (const __half *)gate, ld, dim);
	else if (v == 2)
		sm70__launch_pdl(c, SM70__PDL_ACT, sigmoid_mul_kernel<2>, dim3(bx, n),
				 dim3(threads), 0, (__half *)x, (const __half *)gate, ld, dim);
	else
		sm70__launch_pdl(c, SM70__PDL_ACT, sigmoid_mul_kernel<1>, dim3(bx, n),
				 dim3(threads), 0, (__half *)x, (const __half *)gate, ld, dim);
	SM70_CUDA_LAUNCHED(be, "sigmoid_mul_kernel");
}
