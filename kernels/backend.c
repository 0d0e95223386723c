/* backend.c - what both backends share: destroying one through its op table, weight byte
 * counts, and the check of an NVFP4 matrix handed to prepare_weight. */
#include "kernels/backend.h"

#include <errno.h>
#include <math.h>

void sm70_backend_destroy(struct sm70_backend *be)
{
	if (be)
		be->ops->destroy(be);
}

size_t sm70_weight_bytes(const struct sm70_weight *w)
{
	const size_t elems = (size_t)w->rows * (size_t)w->cols;

	if (w->rows <= 0 || w->cols <= 0)
		return 0;
	if (w->dtype == SM70_DTYPE_NVFP4)
		return elems / 2 + elems / 16;
	return elems * sm70_dtype_size(w->dtype);
}

int sm70__nvfp4_check(const struct sm70_weight *w, struct sm70_err *err)
{
	const uint8_t *sc = w->scale;
	size_t n_scales;

	if (w->dtype != SM70_DTYPE_NVFP4)
		return sm70_errf(err, -EINVAL, "prepare_weight: dtype %s is not nvfp4",
				 sm70_dtype_name(w->dtype));
	if (w->rows < 1 || w->cols < 16 || w->cols % 16)
		return sm70_errf(err, -EINVAL,
				 "nvfp4 weight [%d, %d]: cols must be a positive multiple of 16 "
				 "(one E4M3 scale per 16 elements)", w->rows, w->cols);
	if (!w->data || !w->scale)
		return sm70_errf(err, -EINVAL, "nvfp4 weight [%d, %d]: no %s", w->rows, w->cols,
				 w->data ? "weight_scale" : "packed weight");
	if (!isfinite(w->scale2))
		return sm70_errf(err, -EINVAL, "nvfp4 weight [%d, %d]: weight_scale_2 is %g",
				 w->rows, w->cols, (double)w->scale2);
	for (int r = 0; w->row_scale2 && r < w->rows; r++)
		if (!isfinite(w->row_scale2[r]))
			return sm70_errf(err, -EINVAL, "nvfp4 weight [%d, %d]: row_scale2[%d] is %g",
					 w->rows, w->cols, r, (double)w->row_scale2[r]);
	n_scales = (size_t)w->rows * (size_t)(w->cols / 16);
	for (size_t i = 0; i < n_scales; i++)
		if ((sc[i] & 0x7f) == 0x7f)
			return sm70_errf(err, -EINVAL,
					 "nvfp4 weight [%d, %d]: weight_scale[%zu][%zu] is an E4M3 "
					 "NaN (0x%02x)", w->rows, w->cols, i / (size_t)(w->cols / 16),
					 i % (size_t)(w->cols / 16), sc[i]);
	return 0;
}
