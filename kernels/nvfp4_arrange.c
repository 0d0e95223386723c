/*
 * nvfp4_arrange.c - sm70_fp4_arrange (nvfp4_arrange.h). A word is 8 consecutive columns of
 * one row, which ModelOpt keeps in 4 consecutive bytes (2 codes a byte), so each word is
 * four lookups in a table of each source byte's bits in place (4 KB), OR-ed: about a
 * nanosecond a word, where placing element by element took 8 ns an element (a 27B model:
 * minutes of load). Row tiles go to threads.
 */
#include "kernels/nvfp4_arrange.h"
#include "common/parallel.h"

struct fp4_arrange_job {
	uint32_t *words;
	uint8_t *scales;
	const uint8_t *codes, *block_scales;
	int rows, cols, nsteps;
	uint32_t byte_bits[4][256]; /* source byte q of a word (elements 2q, 2q + 1), placed */
};

static void arrange_tiles(void *ctx, size_t t0, size_t t1)
{
	const struct fp4_arrange_job *j = ctx;
	const int cols = j->cols;

	for (size_t t = t0; t < t1; t++) {
		for (int r = 16 * (int)t; r < 16 * (int)t + 16 && r < j->rows; r++) {
			const uint8_t *src = j->codes + (size_t)r * (cols / 2);
			const uint8_t *ssrc = j->block_scales + (size_t)r * (cols / 16);

			for (int k0 = 0; k0 < cols; k0 += 32) { /* a lane unit: 32 columns */
				const size_t unit = (t * j->nsteps + k0 / SM70_FP4_KS) * 32 +
						    (size_t)(r % 16) * 2 + (k0 % SM70_FP4_KS) / 32;

				/* cols is a multiple of 16: blocks and words are whole or absent */
				for (int w = 0; w < 4 && k0 + 8 * w < cols; w++) {
					const uint8_t *b = src + (k0 + 8 * w) / 2;

					j->words[unit * 4 + w] =
						j->byte_bits[0][b[0]] | j->byte_bits[1][b[1]] |
						j->byte_bits[2][b[2]] | j->byte_bits[3][b[3]];
				}
				for (int h = 0; h < 2 && k0 + 16 * h < cols; h++)
					j->scales[unit * 2 + h] = ssrc[(k0 + 16 * h) / 16];
			}
		}
	}
}

void sm70_fp4_arrange(uint32_t *words, uint8_t *scales, const uint8_t *codes,
		      const uint8_t *block_scales, int rows, int cols)
{
	struct fp4_arrange_job local = {
		.words = words, .scales = scales, .codes = codes, .block_scales = block_scales,
		.rows = rows, .cols = cols, .nsteps = (cols + SM70_FP4_KS - 1) / SM70_FP4_KS,
	};

	for (int q = 0; q < 4; q++) {
		for (int v = 0; v < 256; v++) {
			uint32_t bits = 0;

			for (int b = 0; b < 4; b++) {
				bits |= (uint32_t)((v >> b) & 1) << sm70_fp4_bit_at(2 * q, b);
				bits |= (uint32_t)((v >> (4 + b)) & 1) << sm70_fp4_bit_at(2 * q + 1, b);
			}
			local.byte_bits[q][v] = bits;
		}
	}
	sm70__parallel_for((size_t)(rows + 15) / 16, 1, (size_t)16 * cols / 2, arrange_tiles,
			   &local);
}

void sm70_fp4_arrange_reference(uint32_t *words, uint8_t *scales, const uint8_t *codes,
				const uint8_t *block_scales, int rows, int cols)
{
	const int nsteps = (cols + SM70_FP4_KS - 1) / SM70_FP4_KS;

	for (int r = 0; r < rows; r++) {
		for (int k = 0; k < cols; k++) {
			const int code = (codes[(size_t)r * (cols / 2) + k / 2] >> (4 * (k & 1))) & 15;
			size_t wi, so;
			int e;

			sm70_fp4_arranged_at(r, k, nsteps, &wi, &e, &so);
			for (int b = 0; b < 4; b++)
				words[wi] |= (uint32_t)((code >> b) & 1) << sm70_fp4_bit_at(e, b);
			if (k % 16 == 0)
				scales[so] = block_scales[(size_t)r * (cols / 16) + k / 16];
		}
	}
}
