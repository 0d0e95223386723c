/*
 * gather_rows.c - the CPU gather_rows op: picks rows (the tokens whose logits are
 * wanted, usually each sequence's last) into a dense matrix.
 *
 * On the CPU act and f32 are both 4-byte floats, so is_f32 does not change anything.
 *
 * Non-goals: scatter, strided sources.
 */
#include "kernels/cpu/cpu_ops.h"

struct gather_job {
	float *dst;
	const float *src;
	const int32_t *rows;
	int dim;
};

static void gather(void *ctx, int begin, int end, int thread)
{
	const struct gather_job *j = ctx;
	const size_t dim = (size_t)j->dim;

	for (int i = begin; i < end; i++)
		memcpy(j->dst + (size_t)i * dim, j->src + (size_t)j->rows[i] * dim,
		       dim * sizeof(float));
}

/* See backend.h. rows[i] must be a row of src; dst must not overlap src. */
void sm70__cpu_gather_rows(struct sm70_backend *be, void *dst, const void *src,
			   const int32_t *rows, int n, int dim, int is_f32)
{
	struct gather_job j = { dst, src, rows, dim };

	if (dim <= 0)
		return;
	sm70__pool_run(sm70__cpu_of(be)->pool, n, sm70__cpu_grain((size_t)dim), gather, &j);
}
