/* dtype.c - element types and scalar conversions; see dtype.h. */
#include "common/dtype.h"

#include <errno.h>
#include <math.h>

static const struct {
	const char *name;
	const char *st_name;
	size_t size;
} dtypes[SM70_DTYPE_COUNT] = {
	[SM70_DTYPE_F32] = { "f32", "F32", 4 },
	[SM70_DTYPE_F16] = { "f16", "F16", 2 },
	[SM70_DTYPE_BF16] = { "bf16", "BF16", 2 },
	[SM70_DTYPE_F8E4M3] = { "f8e4m3", "F8_E4M3", 1 },
	[SM70_DTYPE_U8] = { "u8", "U8", 1 },
	[SM70_DTYPE_I32] = { "i32", "I32", 4 },
	[SM70_DTYPE_I64] = { "i64", "I64", 8 },
	/* no safetensors name: a checkpoint stores NVFP4 as U8 codes + F8_E4M3 scales */
	[SM70_DTYPE_NVFP4] = { "nvfp4", NULL, 0 },
};

size_t sm70_dtype_size(enum sm70_dtype t)
{
	return (unsigned)t < SM70_DTYPE_COUNT ? dtypes[t].size : 0;
}

const char *sm70_dtype_name(enum sm70_dtype t)
{
	return (unsigned)t < SM70_DTYPE_COUNT ? dtypes[t].name : "?";
}

const char *sm70_dtype_safetensors_name(enum sm70_dtype t)
{
	return (unsigned)t < SM70_DTYPE_COUNT ? dtypes[t].st_name : NULL;
}

int sm70_dtype_from_safetensors(const char *s, enum sm70_dtype *out)
{
	for (int i = 0; i < SM70_DTYPE_COUNT; i++) {
		if (dtypes[i].st_name && strcmp(s, dtypes[i].st_name) == 0) {
			*out = (enum sm70_dtype)i;
			return 0;
		}
	}
	return -EINVAL;
}

float sm70_f16_to_f32(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000) << 16;
	uint32_t exp = (h >> 10) & 0x1f;
	uint32_t man = h & 0x3ff;
	uint32_t u;
	float f;

	if (exp == 0) {
		/* zero or subnormal: man * 2^-24, exact in f32 */
		f = (float)man * 0x1p-24f;
		return sign ? -f : f;
	}
	if (exp == 31)
		u = sign | 0x7f800000u | (man << 13);
	else
		u = sign | ((exp + 112) << 23) | (man << 13);
	memcpy(&f, &u, sizeof(f));
	return f;
}

uint16_t sm70_f32_to_f16(float f)
{
	uint32_t u, sign, absu;

	memcpy(&u, &f, sizeof(u));
	sign = (u >> 16) & 0x8000;
	absu = u & 0x7fffffffu;
	if (absu > 0x7f800000u)
		return (uint16_t)(sign | 0x7e00);
	if (absu >= 0x477ff000u) /* rounds to >= 65520: overflow to infinity */
		return (uint16_t)(sign | 0x7c00);
	if (absu < 0x38800000u) {
		/* result is subnormal (or zero): round absu * 2^24 to an integer, RNE */
		float a;
		memcpy(&a, &absu, sizeof(a));
		return (uint16_t)(sign | (uint16_t)lrintf(a * 0x1p24f));
	}
	/* normal: rebias exponent, round mantissa 23 -> 10 bits, RNE */
	absu += 0xfffu + ((absu >> 13) & 1u);
	return (uint16_t)(sign | ((absu - 0x38000000u) >> 13));
}

float sm70_e4m3_to_f32(uint8_t v)
{
	uint32_t exp = (v >> 3) & 0xf, man = v & 7;
	float f;

	if (exp == 0xf && man == 7)
		return NAN;
	if (exp == 0)
		f = (float)man * 0x1p-9f;
	else
		f = ldexpf(1.0f + (float)man / 8.0f, (int)exp - 7);
	return (v & 0x80) ? -f : f;
}

uint8_t sm70_f32_to_e4m3(float f)
{
	uint8_t sign = signbit(f) ? 0x80 : 0;
	float a = fabsf(f);
	int e;

	if (isnan(f))
		return 0x7f;
	if (a >= 448.0f)
		return sign | 0x7e; /* saturate to the largest finite value */
	if (a < 0x1p-6f) {
		/* subnormal range: steps of 2^-9 */
		long q = lrintf(a * 0x1p9f);
		return sign | (uint8_t)q; /* q == 8 encodes 2^-6, the first normal */
	}
	e = ilogbf(a);
	{
		/* mantissa with 3 bits, RNE; a carry moves into the exponent correctly */
		long q = lrintf(ldexpf(a, 3 - e)); /* in [8, 16] */
		uint32_t code = (uint32_t)((e + 7) << 3) + (uint32_t)(q - 8);
		if (code > 0x7e)
			code = 0x7e;
		return sign | (uint8_t)code;
	}
}

/* src may be unaligned (safetensors promises no alignment): elements are read through
 * memcpy, which compiles to plain loads. */
int sm70_convert_to_f32(float *dst, const void *src, enum sm70_dtype t, size_t n)
{
	const uint8_t *b = src;
	uint16_t h;

	switch (t) {
	case SM70_DTYPE_F32:
		memcpy(dst, src, n * sizeof(float));
		return 0;
	case SM70_DTYPE_F16:
		for (size_t i = 0; i < n; i++) {
			memcpy(&h, b + 2 * i, 2);
			dst[i] = sm70_f16_to_f32(h);
		}
		return 0;
	case SM70_DTYPE_BF16:
		for (size_t i = 0; i < n; i++) {
			memcpy(&h, b + 2 * i, 2);
			dst[i] = sm70_bf16_to_f32(h);
		}
		return 0;
	case SM70_DTYPE_F8E4M3:
		for (size_t i = 0; i < n; i++)
			dst[i] = sm70_e4m3_to_f32(b[i]);
		return 0;
	default:
		return -EINVAL;
	}
}
