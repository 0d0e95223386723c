/*
 * sigmoid_scale_add.c - the CPU sigmoid_scale_add op: the shared expert of an MoE block,
 * scaled per token by sigmoid of its gate logit, added into the block's output.
 *
 * s = 1 / (1 + expf(-g)) in f32, once per row (exp overflowing to +inf for very negative
 * g gives the right limit, 0); then out += s * x, one rounding of the product and one of
 * the sum per element.
 *
 * Non-goals: per-element gates (sigmoid_mul), other gate functions.
 */
#include <math.h>

#include "kernels/cpu/cpu_ops.h"

struct scale_add_job {
	float *out;
	const float *x;
	const float *gate;
	int ld;
	int dim;
};

static void scale_add_rows(void *ctx, int begin, int end, int thread)
{
	const struct scale_add_job *j = ctx;
	const size_t dim = (size_t)j->dim;

	for (int i = begin; i < end; i++) {
		float *restrict o = j->out + (size_t)i * dim;
		const float *restrict x = j->x + (size_t)i * dim;
		const float s = 1.0f / (1.0f + expf(-j->gate[(size_t)i * j->ld]));

		for (size_t c = 0; c < dim; c++)
			o[c] += s * x[c];
	}
}

/* See backend.h. out must not overlap x or gate. */
void sm70__cpu_sigmoid_scale_add(struct sm70_backend *be, void *out, const void *x,
				 const float *gate, int ld, int n, int dim)
{
	struct scale_add_job j = { out, x, gate, ld, dim };

	if (n <= 0 || dim <= 0)
		return;
	sm70__pool_run(sm70__cpu_of(be)->pool, n, sm70__cpu_grain((size_t)dim * 2),
		       scale_add_rows, &j);
}
