/*
 * nvfp4.h - the NVFP4 weight codec: E2M1 4-bit codes in blocks of 16 along a row, one
 * FP8-E4M3 scale per block and one f32 scale per tensor (ModelOpt's `weight_scale_2`).
 *
 *   w = e2m1(code) * e4m3(block_scale) * scale_2
 *
 * The arithmetic follows NVIDIA ModelOpt's NVFP4QTensor step by step in f32, so that a
 * checkpoint made here holds the codes and scales ModelOpt would write for the same weights
 * (docs/NVFP4.md has the recipe and where each rule comes from). Scalar and exact: this is
 * the reference the quantizer and the decoders are tested against.
 *
 * Non-goals: activation quantization, calibration (scales come from the weights alone),
 * swizzled scale layouts of particular GEMM kernels, vectorised bulk paths.
 */
#ifndef SM70_COMMON_NVFP4_H
#define SM70_COMMON_NVFP4_H

#include <stddef.h>
#include <stdint.h>

#define SM70_NVFP4_BLOCK 16   /* elements per block scale */
#define SM70_E2M1_MAX 6.0f    /* largest E2M1 magnitude */
#define SM70_E4M3_MAX 448.0f  /* largest finite FP8-E4M3 value */

/* The value of a 4-bit E2M1 code (bit 3 sign, bits 0-2 index into
 * {0, 0.5, 1, 1.5, 2, 3, 4, 6}); bits above the low four are ignored. */
float sm70_e2m1_to_f32(uint8_t code);

/* The E2M1 code nearest to x; a value halfway between two codes goes to the one with an
 * even index (0.25 -> 0, 0.75 -> 1, 2.5 -> 2, 5 -> 4); |x| > 6 saturates to 6. The sign
 * bit is set for x < 0, so a small negative value that rounds to zero gives code 8 (as
 * ModelOpt writes it); -0.0 gives 0. x must not be NaN. */
uint8_t sm70_f32_to_e2m1(float x);

/* The per-tensor scale of a tensor whose largest magnitude is amax: amax / (6 * 448), so
 * the largest block scale lands on E4M3's maximum. An all-zero tensor (amax == 0) gets 1:
 * any value decodes its zeros, and 1 keeps the scale and its reciprocal finite. */
float sm70_nvfp4_scale_2(float amax);

/*
 * Quantizes one block of SM70_NVFP4_BLOCK finite values x with the tensor's scale_2:
 * writes the E4M3 block scale to *scale and the codes to packed[0..7], element 2j in the
 * low nibble of packed[j] and 2j+1 in the high one. The block scale is
 * e4m3(amax_block / (6 * scale_2)), or e4m3(1) for an all-zero block; each code is
 * sm70_f32_to_e2m1(x / (e4m3_to_f32(scale) * scale_2)). A block whose scale rounds to
 * E4M3 zero (amax_block below 2^-10 * 6 * scale_2) decodes to zero whatever its codes, and
 * gets codes 0.
 */
void sm70_nvfp4_quantize_block(const float *x, float scale_2, uint8_t packed[8],
			       uint8_t *scale);

/* Element i of a block: e2m1(code i of packed) * e4m3(scale) * scale_2. */
float sm70_nvfp4_dequant(const uint8_t packed[8], uint8_t scale, float scale_2, int i);

#endif
