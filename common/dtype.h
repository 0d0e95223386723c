/*
 * dtype.h - element types of weights, activations and caches, and the scalar
 * conversions between them (round to nearest even where narrowing).
 *
 * The conversions are exact software routines: they are the reference for the GPU
 * code and work on any CPU. Not vectorised on purpose; bulk paths convert in loops the
 * compiler can vectorise around them.
 */
#ifndef SM70_COMMON_DTYPE_H
#define SM70_COMMON_DTYPE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

enum sm70_dtype {
	SM70_DTYPE_F32 = 0,
	SM70_DTYPE_F16,
	SM70_DTYPE_BF16,
	SM70_DTYPE_F8E4M3,
	SM70_DTYPE_U8,
	SM70_DTYPE_I32,
	SM70_DTYPE_I64,
	/* NVFP4 (ModelOpt) matrices: 4-bit E2M1 codes with an FP8-E4M3 scale per 16
	 * elements and an f32 scale per matrix. Not a whole number of bytes an element:
	 * its size is 0 here; byte counts of such a matrix come from sm70_weight_bytes
	 * (kernels/backend.h). Appended, so the values before it keep their numbers. */
	SM70_DTYPE_NVFP4,
	SM70_DTYPE_COUNT,
};

/* Bytes per element; 0 for an out-of-range value and for NVFP4 (not whole bytes). */
size_t sm70_dtype_size(enum sm70_dtype t);
/* Lower-case name ("f32", "bf16", ...); "?" for an out-of-range value. */
const char *sm70_dtype_name(enum sm70_dtype t);
/* The safetensors dtype string ("F32", "BF16", "F8_E4M3", ...); NULL for an out-of-range
 * value. */
const char *sm70_dtype_safetensors_name(enum sm70_dtype t);
/* Parses a safetensors dtype string ("F32", "BF16", "F8_E4M3", ...). Returns 0 and sets
 * *out, or -EINVAL for a type sm70 does not read. */
int sm70_dtype_from_safetensors(const char *s, enum sm70_dtype *out);

static inline float sm70_bf16_to_f32(uint16_t h)
{
	uint32_t u = (uint32_t)h << 16;
	float f;
	memcpy(&f, &u, sizeof(f));
	return f;
}

static inline uint16_t sm70_f32_to_bf16(float f)
{
	uint32_t u;
	memcpy(&u, &f, sizeof(u));
	if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep it a quiet NaN */
		return (uint16_t)((u >> 16) | 0x40);
	u += 0x7fffu + ((u >> 16) & 1u);
	return (uint16_t)(u >> 16);
}

float sm70_f16_to_f32(uint16_t h);
uint16_t sm70_f32_to_f16(float f);
/* FP8-E4M3 (no infinities, max 448): decode, and saturating encode with RNE. */
float sm70_e4m3_to_f32(uint8_t v);
uint8_t sm70_f32_to_e4m3(float f);

/* Converts n elements of type t at src to f32. Returns -EINVAL for an integer type and
 * for NVFP4 (a matrix format, not an element type: see sm70_weight_bytes). */
int sm70_convert_to_f32(float *dst, const void *src, enum sm70_dtype t, size_t n);

#endif
