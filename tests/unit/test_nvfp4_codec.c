/* test_nvfp4_codec - the NVFP4 codec: E2M1 codes, ties to even, saturation, E4M3 block
 * scales, nibble order, and the dequantisation error bound of a block. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>

#include "common/dtype.h"
#include "common/nvfp4.h"

static const float magnitudes[8] = { 0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f };

/* The nearest magnitude index by brute force; at equal distance the even index. */
static int nearest_index(float a)
{
	int best = 0;

	for (int i = 1; i < 8; i++) {
		float d = fabsf(a - magnitudes[i]), db = fabsf(a - magnitudes[best]);

		if (d < db || (d == db && !(i & 1)))
			best = i;
	}
	return best;
}

static void test_decode_every_code(void **state)
{
	for (int c = 0; c < 16; c++) {
		float want = (c & 8) ? -magnitudes[c & 7] : magnitudes[c & 7];

		assert_true(sm70_e2m1_to_f32((uint8_t)c) == want);
		assert_int_equal(!!signbit(sm70_e2m1_to_f32((uint8_t)c)), c >= 8);
		/* every code but negative zero comes back from its own value */
		if (c != 8)
			assert_int_equal(sm70_f32_to_e2m1(want), c);
	}
	assert_int_equal(sm70_f32_to_e2m1(-0.0f), 0);
	assert_int_equal(sm70_f32_to_e2m1(-0.1f), 8);
	assert_true(sm70_e2m1_to_f32(0xf7) == 6.0f); /* high bits ignored */
	printf("  16 codes decode to {0, .5, 1, 1.5, 2, 3, 4, 6} with sign, 15 round-trip\n");
}

static void test_ties_to_even(void **state)
{
	static const struct { float x; int code; } ties[] = {
		{ 0.25f, 0 }, { 0.75f, 2 }, { 1.25f, 2 }, { 1.75f, 4 },
		{ 2.5f, 4 }, { 3.5f, 6 }, { 5.0f, 6 },
	};

	for (size_t i = 0; i < sizeof(ties) / sizeof(ties[0]); i++) {
		float x = ties[i].x;

		assert_int_equal(sm70_f32_to_e2m1(x), ties[i].code);
		assert_int_equal(sm70_f32_to_e2m1(-x), ties[i].code | 8);
		/* one ulp either side leaves the tie: the nearer neighbour wins */
		assert_int_equal(sm70_f32_to_e2m1(nextafterf(x, 0.0f)),
				 nearest_index(nextafterf(x, 0.0f)));
		assert_int_equal(sm70_f32_to_e2m1(nextafterf(x, 10.0f)),
				 nearest_index(nextafterf(x, 10.0f)));
		assert_int_not_equal(nearest_index(nextafterf(x, 0.0f)),
				     nearest_index(nextafterf(x, 10.0f)));
	}
	printf("  7 midpoints go to the even code, one ulp off them to the nearer code\n");
}

static void test_saturation_and_sweep(void **state)
{
	int n = 0;

	assert_int_equal(sm70_f32_to_e2m1(6.5f), 7);
	assert_int_equal(sm70_f32_to_e2m1(1e30f), 7);
	assert_int_equal(sm70_f32_to_e2m1(INFINITY), 7);
	assert_int_equal(sm70_f32_to_e2m1(-1e30f), 15);
	for (int k = -8 * 4096; k <= 8 * 4096; k++) {
		float x = (float)k / 4096.0f;
		int want = nearest_index(fabsf(x)) | (x < 0.0f ? 8 : 0);

		assert_int_equal(sm70_f32_to_e2m1(x), want);
		n++;
	}
	printf("  saturation at 6; %d values in [-8, 8] equal the brute-force nearest code\n", n);
}

static void test_scale_2(void **state)
{
	assert_true(sm70_nvfp4_scale_2(2688.0f) == 1.0f);
	assert_true(sm70_nvfp4_scale_2(1.0f) == 1.0f / 2688.0f);
	assert_true(sm70_nvfp4_scale_2(0.0f) == 1.0f);
	printf("  scale_2 = amax / 2688; 1 for an all-zero tensor\n");
}

/* A block of 16 zeros with x[0] = v. */
static void one_value_block(float *x, float v)
{
	for (int i = 0; i < SM70_NVFP4_BLOCK; i++)
		x[i] = 0.0f;
	x[0] = v;
}

static void test_block_scale_rounding(void **state)
{
	float x[SM70_NVFP4_BLOCK];
	uint8_t packed[8], scale;

	/* scale_2 0.25: 6 * scale_2 = 1.5 exactly, so block amax 1.5 * s gives scale s */
	one_value_block(x, 1.5f * 1.0625f); /* E4M3 tie between 1 and 1.125: even is 1 */
	sm70_nvfp4_quantize_block(x, 0.25f, packed, &scale);
	assert_int_equal(scale, 0x38);
	one_value_block(x, 1.5f * 1.1875f); /* tie between 1.125 and 1.25: even is 1.25 */
	sm70_nvfp4_quantize_block(x, 0.25f, packed, &scale);
	assert_int_equal(scale, 0x3a);
	one_value_block(x, 1.5f * 1000.0f); /* past 448: saturates */
	sm70_nvfp4_quantize_block(x, 0.25f, packed, &scale);
	assert_int_equal(scale, 0x7e);
	assert_int_equal(packed[0] & 0xf, 7);
	for (int i = 0; i < SM70_NVFP4_BLOCK; i++)
		x[i] = 0.0f;
	sm70_nvfp4_quantize_block(x, 0.25f, packed, &scale);
	assert_int_equal(scale, sm70_f32_to_e4m3(1.0f)); /* ModelOpt's scale for a zero block */
	for (int j = 0; j < 8; j++)
		assert_int_equal(packed[j], 0);
	/* a block far below the tensor's maximum: its scale rounds to E4M3 zero */
	one_value_block(x, 1e-7f);
	x[5] = -1e-7f;
	sm70_nvfp4_quantize_block(x, 1.0f, packed, &scale);
	assert_int_equal(scale, 0);
	for (int j = 0; j < 8; j++)
		assert_int_equal(packed[j], 0);
	printf("  block scales: E4M3 ties to even (1.0625 -> 1, 1.1875 -> 1.25), 448 saturates,"
	       " zero block 1, vanishing scale -> zero codes\n");
}

static void test_nibble_order(void **state)
{
	float x[SM70_NVFP4_BLOCK] = { 6.0f, -0.5f, 1.0f, 0.0f, -6.0f, 3.0f };
	uint8_t packed[8], scale;

	/* block amax 6 with scale_2 1: the block scale is 1 and the values are the codes */
	sm70_nvfp4_quantize_block(x, 1.0f, packed, &scale);
	assert_int_equal(scale, 0x38);
	assert_int_equal(packed[0], 0x97); /* element 0 (6 -> 7) low, element 1 (-0.5 -> 9) high */
	assert_int_equal(packed[1], 0x02);
	assert_int_equal(packed[2], 0x5f);
	for (int i = 0; i < SM70_NVFP4_BLOCK; i++)
		assert_true(sm70_nvfp4_dequant(packed, scale, 1.0f, i) == x[i]);
	printf("  element 2j in the low nibble, 2j+1 in the high one; exact values decode exactly\n");
}

/* Half the distance between the E2M1 magnitudes around a (a in [0, 6]). */
static float half_gap(float a)
{
	return a <= 2.0f ? 0.25f : a <= 4.0f ? 0.5f : 1.0f;
}

/* A deterministic uniform value in [-1, 1). */
static float uniform(uint64_t *s)
{
	*s = *s * 6364136223846793005ull + 1442695040888963407ull;
	return (float)((double)(*s >> 11) / 4503599627370496.0 - 1.0);
}

static void test_block_error_bound(void **state)
{
	uint64_t seed = 42;
	double worst = 0.0;
	int blocks = 0;

	for (int b = 0; b < 20000; b++) {
		float x[SM70_NVFP4_BLOCK], mag = powf(2.0f, (float)(b % 40) - 20.0f);
		float tensor_amax = mag * (1.0f + 8.0f * fabsf(uniform(&seed))), scale_2, step;
		uint8_t packed[8], scale;

		for (int i = 0; i < SM70_NVFP4_BLOCK; i++)
			x[i] = mag * uniform(&seed);
		scale_2 = sm70_nvfp4_scale_2(tensor_amax);
		sm70_nvfp4_quantize_block(x, scale_2, packed, &scale);
		step = sm70_e4m3_to_f32(scale) * scale_2;
		if (scale < 0x08)
			continue; /* subnormal block scales are checked by the scale test */
		for (int i = 0; i < SM70_NVFP4_BLOCK; i++) {
			float t = fabsf(x[i]) / step, err = fabsf(sm70_nvfp4_dequant(packed, scale,
								scale_2, i) - x[i]);
			/* a normal E4M3 scale is within 2^-4 of its value: t stays below 6.4,
			 * and clipping at 6 costs at most 0.4 steps */
			float bound = t <= 6.0f ? half_gap(t) : t - 6.0f;

			assert_true(t <= 6.0f * 16.0f / 15.0f);
			/* plus a few f32 roundings of x */
			assert_true(err <= bound * step + fabsf(x[i]) * 0x1p-21f);
			if (err / step > worst)
				worst = err / step;
		}
		blocks++;
	}
	printf("  %d random blocks over 40 octaves: error <= half an E2M1 step * scale "
	       "(worst %.3f steps)\n", blocks, worst);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_decode_every_code),
		cmocka_unit_test(test_ties_to_even),
		cmocka_unit_test(test_saturation_and_sweep),
		cmocka_unit_test(test_scale_2),
		cmocka_unit_test(test_block_scale_rounding),
		cmocka_unit_test(test_nibble_order),
		cmocka_unit_test(test_block_error_bound),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
