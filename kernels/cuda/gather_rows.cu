/*
 * gather_rows.cu - the CUDA gather_rows op: picks rows (the tokens whose logits are
 * wanted) into a dense matrix, f32 or f16 elements.
 *
 * Non-goals: scatter, strided sources.
 */
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/pdl.h"

template <typename T>
static __global__ void gather_kernel(T *__restrict__ dst, const T *__restrict__ src,
				     const int32_t *__restrict__ rows, int dim)
{
	sm70__pdl_enter();
	const T *s = src + (size_t)rows[blockIdx.x] * dim;
	T *d = dst + (size_t)blockIdx.x * dim;

	for (int k = threadIdx.x; k < dim; k += blockDim.x)
		d[k] = s[k];
}

/* See backend.h. rows[i] must be a row of src; dst must not overlap src. */
extern "C" void sm70__cuda_gather_rows(struct sm70_backend *be, void *dst, const void *src,
				       const int32_t *rows, int n, int dim, int is_f32)
{
	struct sm70__cuda *c = sm70__cuda_enter(be);
	const int threads = 256;

	if (n <= 0 || dim <= 0)
		return;
	if (is_f32)
		sm70__launch_pdl(c, SM70__PDL_MISC, gather_kernel<float>, dim3(n), dim3(threads), 0,
				 (float *)dst, (const float *)src, rows, dim);
	else
		sm70__launch_pdl(c, SM70__PDL_MISC, gather_kernel<__half>, dim3(n), dim3(threads),
				 0, (__half *)dst, (const __half *)src, rows, dim);
	SM70_CUDA_LAUNCHED(be, "gather_kernel");
}
