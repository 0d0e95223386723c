/*
 * nvfp4_words.h - the arranged NVFP4 word that the dense NVFP4 kernels read
 * (matmul_nvfp4.cu, which arranges it and whose file comment describes the layout, and
 * matmul_nvfp4_split.cu): an element's code read back from its word, and the unpacking of
 * a word into four f16 pairs (where each code keeps its bits: kernels/nvfp4_arrange.h).
 * Included by .cu files only.
 */
#ifndef SM70_KERNELS_CUDA_NVFP4_WORDS_H
#define SM70_KERNELS_CUDA_NVFP4_WORDS_H

#include <cuda_fp16.h>
#include <stdint.h>

#include "kernels/nvfp4_arrange.h"

#define FP4_KS SM70_FP4_KS

#define FP4S_ROWS_MAX 4 /* rows of x the split kernel (matmul_nvfp4_split.cu) takes */

/* Element e's 4-bit E2M1 code in an arranged word. */
static __host__ __device__ __forceinline__ uint32_t fp4_word_code(uint32_t w, int e)
{
	uint32_t code = 0;

	for (int b = 0; b < 4; b++)
		code |= ((w >> sm70_fp4_bit_at(e, b)) & 1u) << b;
	return code;
}

static __device__ __forceinline__ __half2 u32_as_half2(uint32_t u)
{
	union {
		uint32_t u;
		__half2 h;
	} v;

	v.u = u;
	return v.h;
}

static __device__ __forceinline__ uint32_t half2_as_u32(__half2 h)
{
	union {
		uint32_t u;
		__half2 h;
	} v;

	v.h = h;
	return v.u;
}

static __device__ __forceinline__ uint32_t rotr(uint32_t w, int r)
{
	return __funnelshift_r(w, w, r);
}

/* The four f16 pairs of an arranged word, e2m1 * 2^-14 each, exactly: v[p] holds
 * elements 2p (low half) and 2p + 1. Eleven integer instructions. */
static __device__ __forceinline__ void fp4_unpack(uint32_t w, __half2 v[4])
{
	v[0] = u32_as_half2((w & 0x0e000e00u) | (rotr(w, 7) & 0x80008000u));
	v[1] = u32_as_half2((rotr(w, 3) & 0x0e000e00u) | (rotr(w, 8) & 0x80008000u));
	v[2] = u32_as_half2(rotr(w, 6) & 0x8e008e00u);
	v[3] = u32_as_half2(rotr(w, 9) & 0x8e008e00u);
}

struct sm70__cuda;
struct sm70_weight;

/* The split kernel (matmul_nvfp4_split.cu) on n rows of x when it takes them (n at most
 * FP4S_ROWS_MAX, x 16-byte aligned): 1 when it queued the launch (errors recorded in the
 * backend as for any launch), 0 when the caller must run another kernel. xs: x staged in
 * shared memory (where it fits), else read through L1. */
int sm70__cuda_fp4_split(struct sm70__cuda *c, void *y, int y_f32, const __half *x,
			 const struct sm70_weight *w, int n, int xs);

/* The tile kernel (matmul_nvfp4_split.cu, SM70_NVFP4_VARIANT=8) on n = 1 or 2 rows of x,
 * x 16-byte aligned and fitting a block's shared memory: 1 when it queued the launch, 0
 * when the caller must run another kernel. */
int sm70__cuda_fp4_tile(struct sm70__cuda *c, void *y, int y_f32, const __half *x,
			const struct sm70_weight *w, int n);

#endif
