/* test_nvfp4_arrange - the host rearrangement of an NVFP4 matrix into the layout the CUDA
 * kernels read (kernels/nvfp4_arrange.h): the table-driven, threaded sm70_fp4_arrange
 * against the element-by-element sm70_fp4_arrange_reference on random codes and scales, odd shapes included
 * (rows not a multiple of 16, columns not of 64), padding left zero; and the placement of
 * a word's first two elements, which the kernels' unpacking (nvfp4_words.h: magnitudes at
 * f16 bits 9-11 and 25-27, signs rotated right by 7 into bits 15 and 31) depends on. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kernels/nvfp4_arrange.h"

static uint64_t rng = 0x243f6a8885a308d3ull;

static uint8_t next_byte(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (uint8_t)(rng >> 24);
}

static void check_shape(int rows, int cols)
{
	const size_t units = sm70_fp4_units(rows, cols);
	const size_t n_codes = (size_t)rows * cols / 2, n_scales = (size_t)rows * cols / 16;
	uint8_t *codes = malloc(n_codes), *bs = malloc(n_scales);
	uint32_t *w = calloc(units * 4, 4), *w_want = calloc(units * 4, 4);
	uint8_t *s = calloc(units * 2, 1), *s_want = calloc(units * 2, 1);

	assert_non_null(codes);
	assert_non_null(bs);
	assert_non_null(w);
	assert_non_null(w_want);
	assert_non_null(s);
	assert_non_null(s_want);
	for (size_t i = 0; i < n_codes; i++)
		codes[i] = next_byte();
	for (size_t i = 0; i < n_scales; i++)
		bs[i] = next_byte() | 1; /* nonzero, so a misplaced scale shows */
	sm70_fp4_arrange_reference(w_want, s_want, codes, bs, rows, cols);
	sm70_fp4_arrange(w, s, codes, bs, rows, cols);
	assert_memory_equal(w, w_want, units * 16);
	assert_memory_equal(s, s_want, units * 2);
	printf("%d x %d: %zu lane units equal element-by-element placement\n", rows, cols, units);
	free(codes);
	free(bs);
	free(w);
	free(w_want);
	free(s);
	free(s_want);
}

static void test_shapes(void **state)
{
	static const int shapes[][2] = {
		{ 16, 64 }, { 1, 16 }, { 17, 16 }, { 33, 80 }, { 5, 48 }, { 31, 2064 },
		{ 1000, 4160 }, /* 63 tiles of 4160 columns: enough work to start threads */
	};

	(void)state;
	for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++)
		check_shape(shapes[i][0], shapes[i][1]);
}

static void test_first_pair_placement(void **state)
{
	(void)state;
	for (int b = 0; b < 3; b++) {
		assert_int_equal(sm70_fp4_bit_at(0, b), 9 + b);  /* f16 bits 9-11 of the low half */
		assert_int_equal(sm70_fp4_bit_at(1, b), 25 + b); /* and of the high half */
	}
	/* the signs, rotated right by 7, land on bits 15 and 31 */
	assert_int_equal((sm70_fp4_bit_at(0, 3) + 32 - 7) % 32, 15);
	assert_int_equal((sm70_fp4_bit_at(1, 3) + 32 - 7) % 32, 31);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_shapes),
		cmocka_unit_test(test_first_pair_placement),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
