/*
 * convert.c - quantizes one tensor to NVFP4: per matrix (per expert of a fused 3-D tensor)
 * one scale_2 from the largest magnitude, then each row in blocks of 16 (common/nvfp4.h).
 *
 * Rows are converted to f32 one at a time from the memory-mapped input (which has no
 * alignment), twice: once for the maximum and the finiteness check, once to quantize, so a
 * worker holds one row of floats, not a matrix.
 *
 * Non-goals: output I/O (the caller writes the buffers), tensors of other layouts.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/dtype.h"
#include "common/nvfp4.h"
#include "tools/quantize/quantize.h"

struct matrix {
	const unsigned char *data; /* rows of the input dtype */
	enum sm70_dtype dtype;
	int64_t rows, cols;
	int64_t expert;            /* for messages; -1 for a 2-D tensor */
};

/* Row r of m as f32 into row. */
static void load_row(const struct matrix *m, int64_t r, float *row)
{
	size_t esz = sm70_dtype_size(m->dtype);

	sm70_convert_to_f32(row, m->data + (size_t)r * (size_t)m->cols * esz, m->dtype,
			    (size_t)m->cols);
}

/* The largest magnitude of m, or -EINVAL naming the first NaN or infinity. */
static int matrix_amax(const struct matrix *m, const struct sm70_st_tensor *t, float *row,
		       float *amax, struct sm70_err *err)
{
	float a = 0.0f;

	for (int64_t r = 0; r < m->rows; r++) {
		load_row(m, r, row);
		for (int64_t c = 0; c < m->cols; c++) {
			if (!isfinite(row[c])) {
				char where[64];

				if (m->expert >= 0)
					snprintf(where, sizeof(where), "[%" PRId64 ", %" PRId64
						 ", %" PRId64 "]", m->expert, r, c);
				else
					snprintf(where, sizeof(where), "[%" PRId64 ", %" PRId64
						 "]", r, c);
				return sm70_errf(err, -EINVAL,
						 "%s: tensor '%s' element %s is %s; refusing to "
						 "quantize it", t->file, t->name, where,
						 isnan(row[c]) ? "NaN" : "infinite");
			}
			a = fmaxf(a, fabsf(row[c]));
		}
	}
	*amax = a;
	return 0;
}

/* Quantizes every row of m with scale_2 into packed (cols / 2 bytes a row) and scales
 * (cols / 16 a row). */
static void quantize_matrix(const struct matrix *m, float scale_2, float *row,
			    uint8_t *packed, uint8_t *scales)
{
	int64_t blocks = m->cols / SM70_NVFP4_BLOCK;

	for (int64_t r = 0; r < m->rows; r++) {
		load_row(m, r, row);
		for (int64_t b = 0; b < blocks; b++)
			sm70_nvfp4_quantize_block(row + b * SM70_NVFP4_BLOCK, scale_2,
						  packed + (r * blocks + b) * 8,
						  scales + r * blocks + b);
	}
}

int sm70__q_convert(struct sm70__q_item *it, enum sm70__q_format format,
		    struct sm70_err *err)
{
	const struct sm70_st_tensor *t = it->in;
	int64_t experts = t->ndim == 3 ? t->shape[0] : 1;
	struct matrix m = { .data = t->data, .dtype = t->dtype,
			    .rows = t->shape[t->ndim - 2], .cols = t->shape[t->ndim - 1] };
	size_t esz = sm70_dtype_size(t->dtype), matrix_bytes = (size_t)(m.rows * m.cols) * esz;
	size_t packed_step = (size_t)(m.rows * m.cols / 2);
	size_t scales_step = (size_t)(m.rows * m.cols / SM70_NVFP4_BLOCK);
	float *row = malloc((size_t)m.cols * sizeof(float));
	int ret = 0;

	for (int i = 0; i < 3; i++) {
		it->out[i].owned = malloc(it->out[i].nbytes);
		it->out[i].data = it->out[i].owned;
	}
	if (!row || !it->out[0].owned || !it->out[1].owned || !it->out[2].owned) {
		ret = sm70_errf(err, -ENOMEM, "%s: out of memory quantizing tensor '%s'",
				t->file, t->name);
		goto out;
	}
	for (int64_t e = 0; e < experts; e++) {
		float amax = 0.0f, scale_2, *global = it->out[2].owned;

		m.data = (const unsigned char *)t->data + (size_t)e * matrix_bytes;
		m.expert = t->ndim == 3 ? e : -1;
		ret = matrix_amax(&m, t, row, &amax, err);
		if (ret)
			goto out;
		if (amax == 0.0f)
			it->all_zero = 1;
		scale_2 = sm70_nvfp4_scale_2(amax);
		quantize_matrix(&m, scale_2, row,
				(uint8_t *)it->out[0].owned + (size_t)e * packed_step,
				(uint8_t *)it->out[1].owned + (size_t)e * scales_step);
		/* compressed-tensors stores the reciprocal: w = code * scale / global */
		global[e] = format == SM70_Q_MODELOPT ? scale_2 : 1.0f / scale_2;
	}
out:
	free(row);
	if (ret)
		sm70__q_release(it);
	return ret;
}
