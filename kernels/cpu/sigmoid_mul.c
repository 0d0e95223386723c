/*
 * sigmoid_mul.c - the CPU sigmoid_mul op: gated attention's output gate, x *=
 * sigmoid(gate), in place.
 *
 * sigmoid(g) = 1 / (1 + exp(-g)) in f32; exp(-g) overflowing to +inf for very negative
 * g gives the right limit, 0.
 *
 * Non-goals: other gate functions.
 */
#include <math.h>

#include "kernels/cpu/cpu_ops.h"

struct sigmoid_job {
	float *x;
	const float *gate;
	int ld;
	int dim;
};

static void sigmoid_rows(void *ctx, int begin, int end, int thread)
{
	const struct sigmoid_job *j = ctx;
	const size_t dim = (size_t)j->dim;

	for (int i = begin; i < end; i++) {
		float *restrict x = j->x + (size_t)i * dim;
		const float *restrict g = j->gate + (size_t)i * j->ld;

		for (size_t k = 0; k < dim; k++)
			x[k] *= 1.0f / (1.0f + expf(-g[k]));
	}
}

/* See backend.h. gate must not overlap x. */
void sm70__cpu_sigmoid_mul(struct sm70_backend *be, void *x, const void *gate, int ld, int n,
			   int dim)
{
	struct sigmoid_job j = { x, gate, ld, dim };

	if (n <= 0 || dim <= 0)
		return;
	sm70__pool_run(sm70__cpu_of(be)->pool, n, sm70__cpu_grain((size_t)dim * 16), sigmoid_rows,
		       &j);
}
