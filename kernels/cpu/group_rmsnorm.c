/*
 * group_rmsnorm.c - the CPU group_rmsnorm op (kernels/backend.h): an RMSNorm over each
 * group of dim values of a row, with a weight per value of the row (qwen4_exp norms each
 * hyper-connection stream on its own: one group per stream).
 *
 * As add_rmsnorm.c, in f32 with transformers' order of operations: x * rsqrt(mean(x^2) +
 * eps), then times the weight; the sum of squares in double, so the variance is correctly
 * rounded to f32. On the CPU act is f32, so x is f32 whatever x_f32 says.
 *
 * Non-goals: the zero-centred (1 + w) weight (the model folds it into w), a residual add.
 */
#include <math.h>

#include "kernels/cpu/cpu_ops.h"

struct group_norm_job {
	float *y;
	const float *x;
	const float *w;
	int groups;
	int dim;
	float eps;
};

/* One item is one (row, group). */
static void group_norm_items(void *ctx, int begin, int end, int thread)
{
	const struct group_norm_job *j = ctx;
	const size_t dim = (size_t)j->dim;

	for (int item = begin; item < end; item++) {
		/* rows are groups * dim apart in x and in y: item is row * groups + group */
		const float *x = j->x + (size_t)item * dim;
		const float *restrict w = j->w + (size_t)(item % j->groups) * dim;
		float *y = j->y + (size_t)item * dim;
		double ss = 0.0;
		float inv;

		for (size_t k = 0; k < dim; k++)
			ss += (double)x[k] * x[k];
		inv = 1.0f / sqrtf((float)(ss / (double)dim) + j->eps);
		for (size_t k = 0; k < dim; k++)
			y[k] = (x[k] * inv) * w[k];
	}
}

/* See backend.h. y may be x (each group is read before it is written). */
void sm70__cpu_group_rmsnorm(struct sm70_backend *be, void *y, const void *x, int x_f32,
			     const float *w, int n, int groups, int dim, float eps)
{
	struct group_norm_job j = { y, x, w, groups, dim, eps };

	if (n <= 0 || groups <= 0 || dim <= 0)
		return;
	sm70__pool_run(sm70__cpu_of(be)->pool, n * groups, sm70__cpu_grain((size_t)dim * 4),
		       group_norm_items, &j);
}
