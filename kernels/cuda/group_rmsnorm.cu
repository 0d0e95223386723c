/*
 * group_rmsnorm.cu - the CUDA group_rmsnorm op (kernels/backend.h): an RMSNorm over each
 * group of dim values of a row (qwen4_exp's hyper-connection streams, one group each),
 * from f32 streams or f16 activations, into f16.
 *
 * One warp per (row, group), four per block. The sum of squares is f32 (lane partials,
 * then the warp's tree), inv = 1 / sqrtf(mean + eps), y = f16((x * inv) * w) as the CPU
 * twin orders it. A lane takes 4 consecutive values when dim and the pointers allow
 * (16-byte loads of f32, 8-byte of f16), else single values; x is read twice, the second
 * time from L1.
 *
 * Non-goals: the zero-centred (1 + w) weight, a fused residual add, groups so wide that
 * one warp a group is slow (tuned for qwen4_exp's hidden sizes).
 */
#include <stdint.h>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/pdl.h"

#define WARPS 4

static __device__ __forceinline__ float4 load4(const float *p)
{
	return *(const float4 *)p;
}

static __device__ __forceinline__ float4 load4(const __half *p)
{
	const uint2 u = *(const uint2 *)p;
	const float2 a = __half22float2(*(const __half2 *)&u.x);
	const float2 b = __half22float2(*(const __half2 *)&u.y);

	return make_float4(a.x, a.y, b.x, b.y);
}

static __device__ __forceinline__ float load1(const float *p)
{
	return *p;
}

static __device__ __forceinline__ float load1(const __half *p)
{
	return __half2float(*p);
}

/* T: float or __half; V: values a lane takes at once, 4 or 1. */
template <typename T, int V>
static __global__ void group_rmsnorm_kernel(__half *y, const T *x, const float *__restrict__ w,
					    int n_items, int groups, int dim, float eps)
{
	sm70__pdl_enter();
	const int item = blockIdx.x * WARPS + (threadIdx.x >> 5);
	const int lane = threadIdx.x & 31;
	const T *xg;
	const float *wg;
	__half *yg;
	float ss = 0.0f, inv;

	if (item >= n_items)
		return;
	/* no __restrict__ on x and y: in place is allowed. Rows are groups * dim apart, so
	 * item row * groups + g starts item * dim in. */
	xg = x + (size_t)item * dim;
	yg = y + (size_t)item * dim;
	wg = w + (size_t)(item % groups) * dim;
	for (int k = lane * V; k < dim; k += 32 * V) {
		if (V == 4) {
			const float4 a = load4(xg + k);

			ss += a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w;
		} else {
			const float a = load1(xg + k);

			ss += a * a;
		}
	}
	ss = sm70__warp_sum(ss);
	inv = 1.0f / sqrtf(ss / (float)dim + eps);
	for (int k = lane * V; k < dim; k += 32 * V) {
		if (V == 4) {
			const float4 a = load4(xg + k);
			const __half2 lo = __floats2half2_rn((a.x * inv) * wg[k],
							     (a.y * inv) * wg[k + 1]);
			const __half2 hi = __floats2half2_rn((a.z * inv) * wg[k + 2],
							     (a.w * inv) * wg[k + 3]);
			uint2 u;

			u.x = *(const uint32_t *)&lo;
			u.y = *(const uint32_t *)&hi;
			*(uint2 *)(yg + k) = u;
		} else {
			yg[k] = __float2half_rn((load1(xg + k) * inv) * wg[k]);
		}
	}
}

template <typename T>
static void group_rmsnorm_launch(struct sm70__cuda *c, void *y, const void *x, const float *w,
				 int items, int groups, int dim, float eps)
{
	const unsigned blocks = (unsigned)((items + WARPS - 1) / WARPS);
	const uintptr_t x_align = sizeof(T) * 4;

	if (dim % 4 == 0 && (uintptr_t)x % x_align == 0 && (uintptr_t)y % 8 == 0)
		sm70__launch_pdl(c, SM70__PDL_NORM, group_rmsnorm_kernel<T, 4>, dim3(blocks),
				 dim3(WARPS * 32), 0, (__half *)y, (const T *)x, w, items, groups,
				 dim, eps);
	else
		sm70__launch_pdl(c, SM70__PDL_NORM, group_rmsnorm_kernel<T, 1>, dim3(blocks),
				 dim3(WARPS * 32), 0, (__half *)y, (const T *)x, w, items, groups,
				 dim, eps);
	SM70_CUDA_LAUNCHED(&c->be, "group_rmsnorm_kernel");
}

/* See backend.h. y may be x (f16; a lane reads each value before it writes it, and the
 * sum is complete before any write), but must not overlap it otherwise. */
extern "C" void sm70__cuda_group_rmsnorm(struct sm70_backend *be, void *y, const void *x,
					 int x_f32, const float *w, int n, int groups, int dim,
					 float eps)
{
	struct sm70__cuda *c = sm70__cuda_enter(be);
	const long items = (long)n * groups;

	if (n <= 0 || groups <= 0 || dim <= 0)
		return;
	if (items > 0x7fffffffL) {
		sm70__cuda_fail(be, "group_rmsnorm", __FILE__, __LINE__, "too many rows");
		return;
	}
	if (x_f32)
		group_rmsnorm_launch<float>(c, y, x, w, (int)items, groups, dim, eps);
	else
		group_rmsnorm_launch<__half>(c, y, x, w, (int)items, groups, dim, eps);
}
