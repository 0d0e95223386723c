/*
 * hc.cu - the CUDA hyper-connection ops of qwen4_exp (kernels/backend.h): hc_gates (the
 * low-rank gate z and the per-stream inject gates from one f32 projection), hc_combine
 * (the f16 streams mixed into the layer's input) and hc_inject (the layer's f16 output
 * added into every f32 stream, scaled per stream).
 *
 * Element-wise, one thread an output value (two when the sizes and pointers allow), the
 * formulas in f32 exactly as the CPU twin orders them: v = f / S; silu(v) = v / (1 +
 * expf(-v)); 2 / (1 + expf(-v)); hc_combine adds the S products s ascending and divides
 * by S; hc_inject rounds the product, then the sum (__fmul_rn / __fadd_rn keep nvcc from
 * fusing them), which makes it bit-exact with the CPU on the same inputs.
 *
 * Non-goals: the projections themselves (matmul), other hyper-connection variants.
 */
#include <stdint.h>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/pdl.h"

#define THREADS 256

/* Blocks for count threads, at least one. */
static unsigned hc_blocks(size_t count)
{
	return (unsigned)((count + THREADS - 1) / THREADS);
}

static __device__ __forceinline__ float hc_sigmoid(float v)
{
	return 1.0f / (1.0f + expf(-v));
}

/* One thread per value of a row of width = rank (+ S when inj is set). */
static __global__ void hc_gates_kernel(__half *__restrict__ z, float *__restrict__ inj,
				       const float *__restrict__ f, int ld, int n, int rank,
				       int streams, int width)
{
	sm70__pdl_enter();
	const size_t idx = (size_t)blockIdx.x * THREADS + threadIdx.x;
	const int i = (int)(idx / width), k = (int)(idx % width);
	float v;

	if (i >= n)
		return;
	v = f[(size_t)i * ld + k] / (float)streams;
	if (k < rank)
		z[(size_t)i * rank + k] = __float2half_rn(v / (1.0f + expf(-v)));
	else
		inj[(size_t)i * streams + k - rank] = 2.0f / (1.0f + expf(-v));
}

/* See backend.h. z and inj must not overlap f. */
extern "C" void sm70__cuda_hc_gates(struct sm70_backend *be, void *z, float *inj,
				    const float *f, int ld, int n, int rank, int streams)
{
	struct sm70__cuda *c = sm70__cuda_enter(be);
	const int width = rank + (inj ? streams : 0);

	if (n <= 0 || streams <= 0 || width <= 0)
		return;
	if (rank < 0 || ld < width) {
		sm70__cuda_fail(be, "hc_gates", __FILE__, __LINE__, "bad rank or ld");
		return;
	}
	sm70__launch_pdl(c, SM70__PDL_HC, hc_gates_kernel, dim3(hc_blocks((size_t)n * width)),
			 dim3(THREADS), 0, (__half *)z, inj, f, ld, n, rank, streams, width);
	SM70_CUDA_LAUNCHED(be, "hc_gates_kernel");
}

/* One thread per V consecutive values of y (V 2: dim even, u, xn and y 4-byte aligned). */
template <int V>
static __global__ void hc_combine_kernel(__half *__restrict__ y, const __half *__restrict__ u,
					 const __half *__restrict__ xn, int n, int streams, int dim)
{
	sm70__pdl_enter();
	const size_t idx = ((size_t)blockIdx.x * THREADS + threadIdx.x) * V;
	const size_t i = idx / dim, k = idx % dim;
	const size_t row = (size_t)streams * dim;
	float acc[V];

	if (i >= (size_t)n)
		return;
	for (int e = 0; e < V; e++)
		acc[e] = 0.0f;
	for (int s = 0; s < streams; s++) {
		const size_t o = i * row + (size_t)s * dim + k;
		float uv[V], xv[V];

		if (V == 2) {
			const float2 a = __half22float2(*(const __half2 *)(u + o));
			const float2 b = __half22float2(*(const __half2 *)(xn + o));

			uv[0] = a.x, uv[V - 1] = a.y, xv[0] = b.x, xv[V - 1] = b.y;
		} else {
			uv[0] = __half2float(u[o]);
			xv[0] = __half2float(xn[o]);
		}
		for (int e = 0; e < V; e++)
			acc[e] = __fadd_rn(acc[e], __fmul_rn(hc_sigmoid(uv[e]), xv[e]));
	}
	if (V == 2)
		*(__half2 *)(y + idx) = __floats2half2_rn(acc[0] / (float)streams,
							  acc[V - 1] / (float)streams);
	else
		y[idx] = __float2half_rn(acc[0] / (float)streams);
}

/* See backend.h. y must not overlap u or xn. */
extern "C" void sm70__cuda_hc_combine(struct sm70_backend *be, void *y, const void *u,
				      const void *xn, int n, int streams, int dim)
{
	struct sm70__cuda *c = sm70__cuda_enter(be);
	const uintptr_t align = (uintptr_t)y | (uintptr_t)u | (uintptr_t)xn;
	const size_t count = (size_t)n * dim;

	if (n <= 0 || streams <= 0 || dim <= 0)
		return;
	if (dim % 2 == 0 && align % 4 == 0)
		sm70__launch_pdl(c, SM70__PDL_HC, hc_combine_kernel<2>, dim3(hc_blocks(count / 2)),
				 dim3(THREADS), 0, (__half *)y, (const __half *)u,
				 (const __half *)xn, n, streams, dim);
	else
		sm70__launch_pdl(c, SM70__PDL_HC, hc_combine_kernel<1>, dim3(hc_blocks(count)),
				 dim3(THREADS), 0, (__half *)y, (const __half *)u,
				 (const __half *)xn, n, streams, dim);
	SM70_CUDA_LAUNCHED(be, "hc_combine_kernel");
}

/* One thread per V consecutive values of x (V 2: dim even, x 8-byte and delta 4-byte
 * aligned). */
template <int V>
static __global__ void hc_inject_kernel(float *__restrict__ x, const __half *__restrict__ delta,
					const float *__restrict__ inj, int n, int streams, int dim)
{
	sm70__pdl_enter();
	const size_t idx = ((size_t)blockIdx.x * THREADS + threadIdx.x) * V;
	const size_t item = idx / dim, k = idx % dim; /* item: row * streams + stream */
	const __half *d;
	float g;

	if (item >= (size_t)n * streams)
		return;
	d = delta + item / streams * dim + k;
	g = inj[item];
	if (V == 2) {
		float2 xv = *(float2 *)(x + idx);
		const float2 dv = __half22float2(*(const __half2 *)d);

		xv.x = __fadd_rn(xv.x, __fmul_rn(dv.x, g));
		xv.y = __fadd_rn(xv.y, __fmul_rn(dv.y, g));
		*(float2 *)(x + idx) = xv;
	} else {
		x[idx] = __fadd_rn(x[idx], __fmul_rn(__half2float(*d), g));
	}
}

/* See backend.h. x must not overlap delta or inj. */
extern "C" void sm70__cuda_hc_inject(struct sm70_backend *be, float *x, const void *delta,
				     const float *inj, int n, int streams, int dim)
{
	struct sm70__cuda *c = sm70__cuda_enter(be);
	const size_t count = (size_t)n * streams * dim;

	if (n <= 0 || streams <= 0 || dim <= 0)
		return;
	if (dim % 2 == 0 && (uintptr_t)x % 8 == 0 && (uintptr_t)delta % 4 == 0)
		sm70__launch_pdl(c, SM70__PDL_HC, hc_inject_kernel<2>, dim3(hc_blocks(count / 2)),
				 dim3(THREADS), 0, x, (const __half *)delta, inj, n, streams, dim);
	else
		sm70__launch_pdl(c, SM70__PDL_HC, hc_inject_kernel<1>, dim3(hc_blocks(count)),
				 dim3(THREADS), 0, x, (const __half *)delta, inj, n, streams, dim);
	SM70_CUDA_LAUNCHED(be, "hc_inject_kernel");
}
