/*
 * gated_rmsnorm.cu - the CUDA gated_rmsnorm op: the GDN output norm, per head of dim values
 * x = w * x * rsqrt(mean(x^2) + eps) * g(z), in place on f16 x, the gate z read from f16
 * rows z_ld elements apart (inside the in_proj_z output). All math in fp32, rounded to f16
 * once at the end; g(z) = silu(z) = z / (1 + exp(-z)) as silu_mul.cu has it, or sigmoid(z)
 * = 1 / (1 + exp(-z)) (qwen4_exp's output_gate_type "sigmoid"). The weight is plain
 * (w, not 1 + w: this norm is the exception among qwen3_5's norms).
 *
 * One warp per (row, head), four per block. A lane takes 4 consecutive values (8-byte
 * accesses) when dim, z_ld and the pointers allow, else single values; it reads x twice
 * (the sum of squares, then the output), the second time from L1.
 *
 * Non-goals: heads wider than the warp can hold in flight efficiently (any dim works, but
 * it is tuned for the 128 of Qwen3.5).
 */
#include <stdint.h>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/pdl.h"

#define WARPS 4

template <int V>
static __global__ void gated_rmsnorm_kernel(__half *__restrict__ x, const __half *__restrict__ z,
					    int z_ld, const float *__restrict__ w, int n_items,
					    int n_heads, int dim, float eps, int sig)
{
	sm70__pdl_enter();
	const int item = blockIdx.x * WARPS + (threadIdx.x >> 5);
	const int lane = threadIdx.x & 31;
	__half *xh;
	const __half *zh;
	float ss = 0.0f, inv;

	if (item >= n_items)
		return;
	xh = x + (size_t)item * dim; /* rows of n_heads * dim: head h of row i is item i*H+h */
	zh = z + (size_t)(item / n_heads) * z_ld + (size_t)(item % n_heads) * dim;
	for (int k = lane * V; k < dim; k += 32 * V) {
		if (V == 4) {
			uint2 u = *(const uint2 *)(xh + k);
			float2 a = __half22float2(*(const __half2 *)&u.x);
			float2 b = __half22float2(*(const __half2 *)&u.y);

			ss += a.x * a.x + a.y * a.y + b.x * b.x + b.y * b.y;
		} else {
			float a = __half2float(xh[k]);

			ss += a * a;
		}
	}
	ss = sm70__warp_sum(ss);
	inv = 1.0f / sqrtf(ss / (float)dim + eps);
	for (int k = lane * V; k < dim; k += 32 * V) {
		if (V == 4) {
			uint2 u = *(const uint2 *)(xh + k), g = *(const uint2 *)(zh + k);
			float v[4], gv[4];
			float2 t;

			t = __half22float2(*(const __half2 *)&u.x);
			v[0] = t.x, v[1] = t.y;
			t = __half22float2(*(const __half2 *)&u.y);
			v[2] = t.x, v[3] = t.y;
			t = __half22float2(*(const __half2 *)&g.x);
			gv[0] = t.x, gv[1] = t.y;
			t = __half22float2(*(const __half2 *)&g.y);
			gv[2] = t.x, gv[3] = t.y;
			for (int e = 0; e < 4; e++)
				v[e] = w[k + e] * (v[e] * inv) *
				       ((sig ? 1.0f : gv[e]) / (1.0f + expf(-gv[e])));
			__half2 lo = __floats2half2_rn(v[0], v[1]), hi = __floats2half2_rn(v[2], v[3]);

			u.x = *(const uint32_t *)&lo;
			u.y = *(const uint32_t *)&hi;
			*(uint2 *)(xh + k) = u;
		} else {
			float a = __half2float(xh[k]), g = __half2float(zh[k]);

			xh[k] = __float2half_rn(w[k] * (a * inv) *
						((sig ? 1.0f : g) / (1.0f + expf(-g))));
		}
	}
}

/* See backend.h. z may not overlap x. */
extern "C" void sm70__cuda_gated_rmsnorm(struct sm70_backend *be, void *x, const void *z,
					 int z_ld, const float *w, int n, int n_heads, int dim,
					 float eps, int gate_sigmoid)
{
	struct sm70__cuda *c = sm70__cuda_enter(be);
	const uintptr_t align = (uintptr_t)x | (uintptr_t)z;
	long items = (long)n * n_heads;
	unsigned blocks;

	if (n <= 0 || n_heads <= 0 || dim <= 0)
		return;
	if (z_ld < n_heads * dim) {
		sm70__cuda_fail(be, "gated_rmsnorm", __FILE__, __LINE__, "z_ld below a row");
		return;
	}
	blocks = (unsigned)((items + WARPS - 1) / WARPS);
	if (dim % 4 == 0 && z_ld % 4 == 0 && align % 8 == 0)
		sm70__launch_pdl(c, SM70__PDL_NORM, gated_rmsnorm_kernel<4>, dim3(blocks),
				 dim3(WARPS * 32), 0, (__half *)x, (const __half *)z, z_ld, w,
				 (int)items, n_heads, dim, eps, gate_sigmoid != 0);
	else
		sm70__launch_pdl(c, SM70__PDL_NORM, gated_rmsnorm_kernel<1>, dim3(blocks),
				 dim3(WARPS * 32), 0, (__half *)x, (const __half *)z, z_ld, w,
				 (int)items, n_heads, dim, eps, gate_sigmoid != 0);
	SM70_CUDA_LAUNCHED(be, "gated_rmsnorm_kernel");
}
