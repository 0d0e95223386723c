/*
 * silu_mul.c - the CPU silu_mul op: the gated MLP's silu(gate) * up.
 *
 * silu(x) = x / (1 + exp(-x)), PyTorch's formula; exp(-x) overflowing to +inf for very
 * negative x gives the right limit, -0.
 *
 * Non-goals: other activations (gelu variants are not in the Qwen family's MLPs).
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>

#include "kernels/cpu/cpu_ops.h"

struct silu_job {
	float *out;
	const float *gate_up;
	int inter;
};

static void silu_rows(void *ctx, int begin, int end, int thread)
{
	const struct silu_job *j = ctx;
	const size_t inter = (size_t)j->inter;

	for (int i = begin; i < end; i++) {
		const float *restrict g = j->gate_up + (size_t)i * 2 * inter;
		const float *restrict u = g + inter;
		float *restrict o = j->out + (size_t)i * inter;

		for (size_t k = 0; k < inter; k++)
			o[k] = (g[k] / (1.0f + expf(-g[k]))) * u[k];
	}
}

/* See backend.h. out must not overlap gate_up. */
void sm70__cpu_silu_mul(struct sm70_backend *be, void *out, const void *gate_up, int n,
			int inter)
{
	struct silu_job j = { out, gate_up, inter };

	sm70__pool_run(sm70__cpu_of(be)->pool, n, sm70__cpu_grain((size_t)inter * 16), silu_rows,
		       &j);
}

/* See backend.h (matmul_glu): the CPU's twin is the two ops in turn through a scratch
 * gate_up, so its result is theirs exactly. Takes every call with an even row count. */
int sm70__cpu_matmul_glu(struct sm70_backend *be, void *y, const void *x,
			 const struct sm70_weight *w, int n)
{
	float *gate_up;

	if (w->rows % 2)
		return -EOPNOTSUPP;
	if (n <= 0 || w->rows <= 0)
		return 0;
	gate_up = calloc((size_t)n * (size_t)w->rows, sizeof(float)); /* see add_rmsnorm.c */
	if (!gate_up)
		return -EOPNOTSUPP; /* the caller runs the two ops, which need no memory */
	sm70__cpu_matmul(be, gate_up, 0, x, w, n);
	sm70__cpu_silu_mul(be, y, gate_up, n, w->rows / 2);
	free(gate_up);
	return 0;
}
