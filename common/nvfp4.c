/*
 * nvfp4.c - the NVFP4 weight codec; see nvfp4.h for the contract and docs/NVFP4.md for
 * where each rounding rule comes from.
 *
 * Non-goals: speed (the quantizer runs once per checkpoint; decoding on the hot path is
 * the backends' business).
 */
#include "common/nvfp4.h"

#include <math.h>

#include "common/dtype.h"

static const float e2m1_magnitudes[8] = { 0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f };

float sm70_e2m1_to_f32(uint8_t code)
{
	float m = e2m1_magnitudes[code & 7];

	return (code & 8) ? -m : m;
}

/*
 * Midpoints between neighbouring magnitudes. At a midpoint the even index wins: the upper
 * neighbour for the midpoints below an even index (0.75, 1.75, 3.5), the lower one for the
 * rest (0.25, 1.25, 2.5, 5).
 */
static uint8_t e2m1_magnitude_code(float a)
{
	static const float midpoint[7] = { 0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f };
	uint8_t i = 0;

	while (i < 7 && a > midpoint[i])
		i++;
	/* a == midpoint[i]: rounded down so far; an odd i means the upper neighbour is even */
	if (i < 7 && a == midpoint[i] && (i & 1))
		i++;
	return i;
}

uint8_t sm70_f32_to_e2m1(float x)
{
	uint8_t sign = x < 0.0f ? 8 : 0;

	return sign | e2m1_magnitude_code(fabsf(x));
}

float sm70_nvfp4_scale_2(float amax)
{
	return amax > 0.0f ? amax / (SM70_E2M1_MAX * SM70_E4M3_MAX) : 1.0f;
}

void sm70_nvfp4_quantize_block(const float *x, float scale_2, uint8_t packed[8],
			       uint8_t *scale)
{
	float amax = 0.0f, block_scale, step;
	uint8_t codes[SM70_NVFP4_BLOCK];

	for (int i = 0; i < SM70_NVFP4_BLOCK; i++)
		amax = fmaxf(amax, fabsf(x[i]));
	/* the same two f32 roundings as ModelOpt: 6 * scale_2, then the quotient */
	block_scale = amax / (SM70_E2M1_MAX * scale_2);
	if (block_scale == 0.0f)
		block_scale = 1.0f;
	*scale = sm70_f32_to_e4m3(block_scale);
	step = sm70_e4m3_to_f32(*scale) * scale_2;
	for (int i = 0; i < SM70_NVFP4_BLOCK; i++)
		codes[i] = step > 0.0f ? sm70_f32_to_e2m1(x[i] / step) : 0;
	for (int j = 0; j < SM70_NVFP4_BLOCK / 2; j++)
		packed[j] = (uint8_t)(codes[2 * j] | (codes[2 * j + 1] << 4));
}

float sm70_nvfp4_dequant(const uint8_t packed[8], uint8_t scale, float scale_2, int i)
{
	uint8_t code = (uint8_t)(packed[i / 2] >> (4 * (i & 1)));

	/* ModelOpt's order: the two scales first, then the code */
	return sm70_e2m1_to_f32(code) * (sm70_e4m3_to_f32(scale) * scale_2);
}
