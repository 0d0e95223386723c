/*
 * nvfp4_arrange.h - the arranged NVFP4 layout the CUDA backend's dense kernels read
 * (kernels/cuda/matmul_nvfp4.cu's file comment describes it and why), as the host makes it
 * at load: where each element's code and block scale go, and the whole rearrangement of a
 * ModelOpt matrix. Plain C, so the CPU tests check it (tests/unit/test_nvfp4_arrange.c);
 * the placement functions are also compiled for the device (nvfp4_words.h).
 */
#ifndef SM70_KERNELS_NVFP4_ARRANGE_H
#define SM70_KERNELS_NVFP4_ARRANGE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __CUDACC__
#define SM70_FP4_HD __host__ __device__ __forceinline__
#else
#define SM70_FP4_HD inline
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define SM70_FP4_KS 64 /* columns a step: 16 rows x 64 columns = 32 lanes x 16 bytes */

/* Pair p's sign rotation in nibble p (its magnitudes rotate by 3p). */
#define SM70_FP4_SIGN_ROT 0x9687u

/* Bit b of an arranged word that holds element e (0..7) of its eight: the magnitude's
 * bits 0-2 (b = 0..2) and the sign (b = 3). */
static SM70_FP4_HD int sm70_fp4_bit_at(int e, int b)
{
	const int p = e >> 1, h = e & 1;

	if (b < 3)
		return (9 + 16 * h + 3 * p + b) & 31;
	return (15 + 16 * h + (int)((SM70_FP4_SIGN_ROT >> (4 * p)) & 15)) & 31;
}

/* Where element (r, k) of a matrix of nsteps column steps goes: its 32-bit word, its
 * place e in the word, and its block scale's byte. */
static SM70_FP4_HD void sm70_fp4_arranged_at(int r, int k, int nsteps, size_t *word, int *e,
					     size_t *scale)
{
	const int lane = (r % 16) * 2 + (k % SM70_FP4_KS) / 32, col = k % 32;
	const size_t unit = ((size_t)(r / 16) * nsteps + k / SM70_FP4_KS) * 32 + lane;

	*word = unit * 4 + (size_t)(col / 8);
	*e = col % 8;
	*scale = unit * 2 + col / 16;
}

/* The lane units (16 code bytes and 2 scale bytes each) of an arranged rows x cols matrix. */
static inline size_t sm70_fp4_units(int rows, int cols)
{
	return (size_t)((rows + 15) / 16) * (size_t)((cols + SM70_FP4_KS - 1) / SM70_FP4_KS) * 32;
}

/* ModelOpt's rows x cols matrix (codes [rows][cols / 2], low nibble first; E4M3 scales
 * [rows][cols / 16]; cols a multiple of 16) into the arrangement: words [units * 4] and
 * scales [units * 2] (sm70_fp4_units), zeroed by the caller (rows and columns past the
 * matrix stay zero). Row tiles spread over the host's cores. */
void sm70_fp4_arrange(uint32_t *words, uint8_t *scales, const uint8_t *codes,
		      const uint8_t *block_scales, int rows, int cols);

/* The same, element by element on the calling thread: the definition the fast one is
 * tested against (tests/unit/test_nvfp4_arrange.c) and timed beside (sm70-bench arrange). */
void sm70_fp4_arrange_reference(uint32_t *words, uint8_t *scales, const uint8_t *codes,
				const uint8_t *block_scales, int rows, int cols);

#ifdef __cplusplus
}
#endif

#endif
