/*
 * embed.c - the CPU embed op: rows of the embedding table, converted to f32.
 *
 * Non-goals: quantised tables (f32, f16 and bf16 only, like every CPU weight).
 */
#include "kernels/cpu/cpu_ops.h"

struct embed_job {
	float *x;
	const struct sm70_weight *table;
	const int32_t *ids;
};

static void embed_rows(void *ctx, int begin, int end, int thread)
{
	const struct embed_job *j = ctx;
	const struct sm70_weight *t = j->table;
	size_t dim = (size_t)t->cols, esz = sm70_dtype_size(t->dtype);

	for (int i = begin; i < end; i++) {
		float *x = j->x + (size_t)i * dim;
		int32_t id = j->ids[i];

		/* Ids are validated before they get here; a stray one yields a zero row
		 * rather than a read outside the table. */
		if (id < 0 || id >= t->rows) {
			memset(x, 0, dim * sizeof(float));
			continue;
		}
		sm70__cpu_row_to_f32(x, (const char *)t->data + (size_t)id * dim * esz, t->dtype,
				     dim);
	}
}

/* See backend.h. A token id outside [0, table->rows) gives a row of zeros. */
void sm70__cpu_embed(struct sm70_backend *be, float *x, const struct sm70_weight *table,
		     const int32_t *ids, int n)
{
	struct embed_job j = { x, table, ids };

	sm70__pool_run(sm70__cpu_of(be)->pool, n, sm70__cpu_grain((size_t)table->cols), embed_rows,
		       &j);
}
