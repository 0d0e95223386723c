/*
 * matmul_nvfp4.c - the CPU matmul op on NVFP4 weights (backend.h, struct sm70_weight),
 * and the CPU's prepare_weight: the ModelOpt layout kept as is.
 *
 * The reference twin of kernels/cuda/matmul_nvfp4.cu: every element is dequantised in
 * f32 as (e2m1 * e4m3) * scale2 (row r's row_scale2[r] when the weight has one), the
 * first product exact (at most 6 significant bits),
 * so each element is the correctly rounded W[r][k]; then the f32 dots of matmul.c. Like
 * matmul.c, threads split the weight rows, a row is dequantised into the thread's scratch
 * once per call and dotted against every row of x, and every output is one dot of one
 * thread, so the result is the same for any thread count. Without scratch a row is
 * dequantised piece by piece for each x row, giving the same bits.
 *
 * Non-goals: speed beyond that (the CPU is the reference), other 4-bit formats.
 */
#include <errno.h>

#include "kernels/cpu/cpu_ops.h"

/* Elements per dequantised stack piece on the no-scratch path: whole 16-element blocks
 * and a multiple of 8, as sm70__cpu_dot8 needs. */
#define NVFP4_PIECE 512

static const float e2m1_mag[8] = { 0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f };

/* dst[0..n) = elements k0 .. k0 + n of row r (k0 and n multiples of 16). */
static void nvfp4_dequant(float *restrict dst, const struct sm70_weight *w, int r, int k0,
			  int n)
{
	const uint8_t *codes = (const uint8_t *)w->data + (size_t)r * (size_t)(w->cols / 2);
	const uint8_t *scales = (const uint8_t *)w->scale + (size_t)r * (size_t)(w->cols / 16);
	const float scale2 = w->row_scale2 ? w->row_scale2[r] : w->scale2;

	for (int b = k0 / 16; b < (k0 + n) / 16; b++) {
		const float s = sm70__e4m3_lut[scales[b]];

		for (int j = 0; j < 16; j++) {
			const uint8_t c = (uint8_t)(codes[b * 8 + j / 2] >> (4 * (j & 1)));
			const float e = (c & 8) ? -e2m1_mag[c & 7] : e2m1_mag[c & 7];

			dst[(b - k0 / 16) * 16 + j] = (e * s) * scale2;
		}
	}
}

struct nvfp4_job {
	float *y;
	const float *x;
	const struct sm70_weight *w;
	int n;
	float *scratch; /* NULL: dequantise in stack pieces instead */
	size_t stride;
};

/* y[i, r] for every i, dequantising the row piece by piece for every x row: the same
 * sm70__cpu_dot8 sequence as the whole-row path, hence the same bits. */
static void nvfp4_row_pieces(const struct nvfp4_job *j, int r)
{
	const int cols = j->w->cols;
	float buf[NVFP4_PIECE];

	for (int i = 0; i < j->n; i++) {
		const float *x = j->x + (size_t)i * (size_t)cols;
		float acc[8] = { 0 };

		for (int k = 0; k < cols; k += NVFP4_PIECE) {
			int m = cols - k < NVFP4_PIECE ? cols - k : NVFP4_PIECE;

			nvfp4_dequant(buf, j->w, r, k, m);
			sm70__cpu_dot8(acc, x + k, buf, m);
		}
		j->y[(size_t)i * j->w->rows + r] = sm70__cpu_dot_end(acc, NULL, NULL, 0);
	}
}

static void nvfp4_rows(void *ctx, int begin, int end, int thread)
{
	const struct nvfp4_job *j = ctx;
	const int cols = j->w->cols, rows = j->w->rows;

	float *buf = j->scratch ? j->scratch + (size_t)thread * j->stride : NULL;

	for (int r = begin; r < end; r++) {
		if (!buf) {
			nvfp4_row_pieces(j, r);
			continue;
		}
		nvfp4_dequant(buf, j->w, r, 0, cols);
		for (int i = 0; i < j->n; i++)
			j->y[(size_t)i * rows + r] =
				sm70__cpu_dot(j->x + (size_t)i * (size_t)cols, buf, cols);
	}
}

/* Called by sm70__cpu_matmul for NVFP4 weights (w as sm70__cpu_prepare_weight made it;
 * cols a multiple of 16). y, x f32. */
void sm70__cpu_matmul_nvfp4(struct sm70__cpu *c, float *y, const float *x,
			    const struct sm70_weight *w, int n)
{
	struct nvfp4_job j = { y, x, w, n, NULL, 0 };

	j.scratch = sm70__cpu_scratch(c, (size_t)w->cols);
	j.stride = c->scratch_stride; /* read after the scratch has grown */
	sm70__pool_run(c->pool, w->rows, sm70__cpu_grain((size_t)w->cols * (size_t)n * 2),
		       nvfp4_rows, &j);
}

/* See backend.h: the CPU keeps ModelOpt's layout (and row_scale2), copied into new
 * backend memory. */
int sm70__cpu_prepare_weight(struct sm70_backend *be, struct sm70_weight *w_out,
			     const struct sm70_weight *src, struct sm70_err *err)
{
	int ret = sm70__nvfp4_check(src, err);
	size_t n_codes, n_scales, n_row_s2;

	*w_out = (struct sm70_weight){ .dtype = SM70_DTYPE_NVFP4 };
	if (ret)
		return ret;
	n_codes = (size_t)src->rows * (size_t)(src->cols / 2);
	n_scales = (size_t)src->rows * (size_t)(src->cols / 16);
	n_row_s2 = src->row_scale2 ? (size_t)src->rows * sizeof(float) : 0;
	w_out->data = be->ops->buf_alloc(be, n_codes);
	w_out->scale = be->ops->buf_alloc(be, n_scales);
	w_out->row_scale2 = n_row_s2 ? be->ops->buf_alloc(be, n_row_s2) : NULL;
	if (!w_out->data || !w_out->scale || (n_row_s2 && !w_out->row_scale2)) {
		be->ops->buf_free(be, w_out->row_scale2);
		be->ops->buf_free(be, w_out->scale);
		be->ops->buf_free(be, w_out->data);
		*w_out = (struct sm70_weight){ .dtype = SM70_DTYPE_NVFP4 };
		return sm70_errf(err, -ENOMEM, "nvfp4 weight [%d, %d]: out of memory", src->rows,
				 src->cols);
	}
	memcpy(w_out->data, src->data, n_codes);
	memcpy(w_out->scale, src->scale, n_scales);
	if (n_row_s2)
		memcpy(w_out->row_scale2, src->row_scale2, n_row_s2);
	w_out->rows = src->rows;
	w_out->cols = src->cols;
	w_out->scale2 = src->scale2;
	return 0;
}
