/* backend.c - what both backends share: destroying one through its op table, the batch
 * invariance switch from the environment, the KV dtypes a backend reads, weight and expert
 * byte counts, and the checks of an NVFP4 matrix handed to prepare_weight and of an NVFP4
 * expert stack handed to prepare_experts. */
#include "kernels/backend.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

void sm70_backend_destroy(struct sm70_backend *be)
{
	if (be)
		be->ops->destroy(be);
}

int sm70_batch_invariant_env(void)
{
	const char *v = getenv("SM70_BATCH_INVARIANT");

	return v && strcmp(v, "1") == 0;
}

int sm70_backend_reads_kv(const struct sm70_backend *be, enum sm70_dtype k, enum sm70_dtype v)
{
	if ((unsigned)k >= SM70_DTYPE_COUNT || (unsigned)v >= SM70_DTYPE_COUNT)
		return 0;
	if (!(be->kv_dtypes & (1u << k)))
		return 0;
	return v == k || (be->kv_v_dtypes[k] & (1u << v)) != 0;
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

size_t sm70_expert_bytes(const struct sm70_experts *s)
{
	const size_t elems = (size_t)s->rows * (size_t)s->cols;

	if (s->rows <= 0 || s->cols <= 0)
		return 0;
	if (s->dtype == SM70_DTYPE_NVFP4)
		return elems / 2 + elems / 16 + (size_t)s->rows * sizeof(float);
	return elems * sm70_dtype_size(s->dtype);
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

int sm70__nvfp4_experts_check(const struct sm70_experts *s, struct sm70_err *err)
{
	const uint8_t *sc = s->scale;
	size_t blocks, rows;

	if (s->dtype != SM70_DTYPE_NVFP4)
		return sm70_errf(err, -EINVAL, "prepare_experts: dtype %s is not nvfp4",
				 sm70_dtype_name(s->dtype));
	if (s->n_experts < 1 || s->rows < 1 || s->cols < 16 || s->cols % 16)
		return sm70_errf(err, -EINVAL,
				 "nvfp4 experts [%d][%d, %d]: need at least one expert and cols a "
				 "positive multiple of 16 (one E4M3 scale per 16 elements)",
				 s->n_experts, s->rows, s->cols);
	if (!s->data || !s->scale || !s->row_scale2)
		return sm70_errf(err, -EINVAL, "nvfp4 experts [%d][%d, %d]: no %s", s->n_experts,
				 s->rows, s->cols,
				 !s->data ? "packed weight" : !s->scale ? "weight_scale" :
					    "weight_scale_2");
	rows = (size_t)s->n_experts * (size_t)s->rows;
	for (size_t i = 0; i < rows; i++)
		if (!isfinite(s->row_scale2[i]) || s->row_scale2[i] < 0.0f)
			return sm70_errf(err, -EINVAL,
					 "nvfp4 experts [%d][%d, %d]: expert %zu row %zu: "
					 "weight_scale_2 is %g (must be finite and >= 0)",
					 s->n_experts, s->rows, s->cols, i / (size_t)s->rows,
					 i % (size_t)s->rows, (double)s->row_scale2[i]);
	blocks = (size_t)(s->cols / 16);
	for (size_t i = 0; i < rows * blocks; i++)
		if ((sc[i] & 0x7f) == 0x7f)
			return sm70_errf(err, -EINVAL,
					 "nvfp4 experts [%d][%d, %d]: expert %zu row %zu: "
					 "weight_scale[%zu] is an E4M3 NaN (0x%02x)", s->n_experts,
					 s->rows, s->cols, i / blocks / (size_t)s->rows,
					 i / blocks % (size_t)s->rows, i % blocks, sc[i]);
	return 0;
}
