/*
 * embed.cu - the CUDA embed op: rows of the embedding table into the f32 residual stream.
 *
 * The table is normally f16 (the backend's weight_dtype); bf16 and f32 tables are read
 * too so that a table kept in its checkpoint dtype still works. One block per token.
 *
 * Non-goals: quantised tables, pinned-host tables (the daemon's large-vocab path).
 */
#include <cuda_bf16.h>

#include "kernels/cuda/cuda_check.h"

template <typename T> static __device__ __forceinline__ float to_f32(T v);
template <> __device__ __forceinline__ float to_f32<__half>(__half v)
{
	return __half2float(v);
}
template <> __device__ __forceinline__ float to_f32<__nv_bfloat16>(__nv_bfloat16 v)
{
	return __bfloat162float(v);
}
template <> __device__ __forceinline__ float to_f32<float>(float v)
{
	return v;
}

/* A token id outside [0, rows) gives a row of zeros, as on the CPU. */
template <typename T>
static __global__ void embed_kernel(float *__restrict__ x, const T *__restrict__ table,
				    const int32_t *__restrict__ ids, int rows, int dim)
{
	const int32_t id = ids[blockIdx.x];
	float *xr = x + (size_t)blockIdx.x * dim;

	if (id < 0 || id >= rows) {
		for (int k = threadIdx.x; k < dim; k += blockDim.x)
			xr[k] = 0.0f;
		return;
	}
	const T *tr = table + (size_t)id * dim;
	for (int k = threadIdx.x; k < dim; k += blockDim.x)
		xr[k] = to_f32<T>(tr[k]);
}

/* See backend.h. table->dtype f16, bf16 or f32; anything else is reported and skipped. */
extern "C" void sm70__cuda_embed(struct sm70_backend *be, float *x,
				 const struct sm70_weight *table, const int32_t *ids, int n)
{
	struct sm70__cuda *c = sm70__cuda_enter(be);
	const int threads = 256;

	if (n <= 0 || table->cols <= 0)
		return;
	switch (table->dtype) {
	case SM70_DTYPE_F16:
		embed_kernel<__half><<<n, threads, 0, c->stream>>>(
			x, (const __half *)table->data, ids, table->rows, table->cols);
		break;
	case SM70_DTYPE_BF16:
		embed_kernel<__nv_bfloat16><<<n, threads, 0, c->stream>>>(
			x, (const __nv_bfloat16 *)table->data, ids, table->rows, table->cols);
		break;
	case SM70_DTYPE_F32:
		embed_kernel<float><<<n, threads, 0, c->stream>>>(
			x, (const float *)table->data, ids, table->rows, table->cols);
		break;
	default:
		sm70__cuda_fail(be, "embed", __FILE__, __LINE__, "unsupported table dtype");
		return;
	}
	SM70_CUDA_LAUNCHED(be, "embed_kernel");
}
