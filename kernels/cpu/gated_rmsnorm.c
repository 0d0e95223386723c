/*
 * gated_rmsnorm.c - the CPU gated_rmsnorm op: the GDN output norm, a per-head RMSNorm
 * with a plain weight, times silu (or, for qwen4_exp's output_gate_type "sigmoid", sigmoid)
 * of the gate z.
 *
 * transformers' order, in f32: x * rsqrt(mean(x^2) + eps), then times the weight, then
 * times silu(z) = z / (1 + exp(-z)) or sigmoid(z) = 1 / (1 + exp(-z)). The sum of squares is in double, as in
 * add_rmsnorm.c, so the variance is correctly rounded to f32.
 *
 * Non-goals: the zero-centred (1 + w) weight (the GDN norm does not use it), other gate
 * activations.
 */
#include <math.h>

#include "kernels/cpu/cpu_ops.h"

struct gnorm_job {
	float *x;
	const float *z;
	int z_ld;
	const float *w;
	int n_heads;
	int dim;
	float eps;
	int sig;
};

/* One item is one (row, head). */
static void gnorm_heads(void *ctx, int begin, int end, int thread)
{
	const struct gnorm_job *j = ctx;
	const size_t dim = (size_t)j->dim;

	for (int item = begin; item < end; item++) {
		const int i = item / j->n_heads, h = item % j->n_heads;
		float *restrict x = j->x + ((size_t)i * j->n_heads + h) * dim;
		const float *restrict z = j->z + (size_t)i * j->z_ld + (size_t)h * dim;
		const float *restrict w = j->w;
		double ss = 0.0;
		float inv;

		for (size_t k = 0; k < dim; k++)
			ss += (double)x[k] * x[k];
		inv = 1.0f / sqrtf((float)(ss / (double)dim) + j->eps);
		for (size_t k = 0; k < dim; k++)
			x[k] = (w[k] * (x[k] * inv)) *
			       ((j->sig ? 1.0f : z[k]) / (1.0f + expf(-z[k])));
	}
}

/* See backend.h. z must not overlap x. */
void sm70__cpu_gated_rmsnorm(struct sm70_backend *be, void *x, const void *z, int z_ld,
			     const float *w, int n, int n_heads, int dim, float eps,
			     int gate_sigmoid)
{
	struct gnorm_job j = { x, z, z_ld, w, n_heads, dim, eps, gate_sigmoid != 0 };

	if (n <= 0 || n_heads <= 0 || dim <= 0)
		return;
	sm70__pool_run(sm70__cpu_of(be)->pool, n * n_heads, sm70__cpu_grain((size_t)dim * 16),
		       gnorm_heads, &j);
}
