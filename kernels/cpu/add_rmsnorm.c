/*
 * add_rmsnorm.c - the CPU add_rmsnorm and add ops: the residual update and the RMSNorm
 * that reads it.
 *
 * RMSNorm follows transformers' order of operations in fp32: variance = mean(x^2),
 * x * rsqrt(variance + eps), then times the weight. The sum of squares is accumulated
 * in double, which makes the variance correctly rounded to f32 (PyTorch's own
 * pairwise f32 sum lands within an ulp or two of it).
 *
 * Non-goals: the (1 + w) "zero-centred" weight form; the model code folds that into w.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu_ops.h"

struct add_rmsnorm_job {
	float *y;
	float *resid;
	const float *delta;
	const float *w;
	int dim;
	float eps;
};

static void add_rmsnorm_rows(void *ctx, int begin, int end, int thread)
{
	const struct add_rmsnorm_job *j = ctx;
	size_t dim = (size_t)j->dim;

	for (int i = begin; i < end; i++) {
		/* No restrict: y may alias delta (an in-place caller) or resid. Each row is
		 * read completely before any of it is written. */
		float *r = j->resid + (size_t)i * dim;
		float *y = j->y + (size_t)i * dim;
		double ss = 0.0;
		float inv;

		if (j->delta) {
			const float *d = j->delta + (size_t)i * dim;

			for (size_t k = 0; k < dim; k++)
				r[k] += d[k];
		}
		for (size_t k = 0; k < dim; k++)
			ss += (double)r[k] * r[k];
		inv = 1.0f / sqrtf((float)(ss / (double)dim) + j->eps);
		for (size_t k = 0; k < dim; k++)
			y[k] = (r[k] * inv) * j->w[k];
	}
}

/* See backend.h. y may be the same buffer as delta or resid. */
void sm70__cpu_add_rmsnorm(struct sm70_backend *be, void *y, float *resid, const void *delta,
			   const float *w, int n, int dim, float eps)
{
	struct add_rmsnorm_job j = { y, resid, delta, w, dim, eps };

	if (dim <= 0)
		return;
	sm70__pool_run(sm70__cpu_of(be)->pool, n, sm70__cpu_grain((size_t)dim * 4),
		       add_rmsnorm_rows, &j);
}

/* See backend.h: the CPU's twin of the fused op is the ops in turn (through a scratch x,
 * a scratch gate_up with glu and, when resid_out is NULL, a scratch residual), so its
 * results are theirs exactly; it takes every call (with glu, an even row count). */
int sm70__cpu_add_rmsnorm_matmul(struct sm70_backend *be, void *y, float *resid_out,
				 const float *resid_in, const void *delta, const float *norm_w,
				 float eps, const struct sm70_weight *w, int n, int glu)
{
	const size_t count = (size_t)n * (size_t)w->cols;
	float *x, *r, *gate_up = NULL;

	if (resid_out && resid_out == resid_in)
		return -EINVAL;
	if (glu && w->rows % 2)
		return -EOPNOTSUPP;
	if (n <= 0 || w->cols <= 0)
		return 0;
	/* calloc: gcc cannot see the pool jobs fill them */
	x = calloc(count, sizeof(float));
	r = resid_out ? resid_out : malloc(count * sizeof(float));
	if (glu)
		gate_up = calloc((size_t)n * (size_t)w->rows, sizeof(float));
	if (!x || !r || (glu && !gate_up)) {
		free(x);
		free(gate_up);
		if (!resid_out)
			free(r);
		return -EOPNOTSUPP; /* the caller runs the ops, which need no memory */
	}
	memcpy(r, resid_in, count * sizeof(float));
	sm70__cpu_add_rmsnorm(be, x, r, delta, norm_w, n, w->cols, eps);
	if (glu) {
		sm70__cpu_matmul(be, gate_up, 0, x, w, n);
		sm70__cpu_silu_mul(be, y, gate_up, n, w->rows / 2);
	} else {
		sm70__cpu_matmul(be, y, 0, x, w, n);
	}
	free(x);
	free(gate_up);
	if (!resid_out)
		free(r);
	return 0;
}

/* The add op works in blocks of this many elements (pool items are ints). */
#define ADD_BLOCK 4096

struct add_job {
	float *resid;
	const float *x;
	size_t count;
};

static void add_blocks(void *ctx, int begin, int end, int thread)
{
	const struct add_job *j = ctx;
	size_t lo = (size_t)begin * ADD_BLOCK;
	size_t hi = (size_t)end * ADD_BLOCK;
	float *restrict r = j->resid;
	const float *restrict x = j->x;

	if (hi > j->count)
		hi = j->count;
	for (size_t k = lo; k < hi; k++)
		r[k] += x[k];
}

/* See backend.h. resid and x must not overlap. */
void sm70__cpu_add(struct sm70_backend *be, float *resid, const void *x, size_t count)
{
	struct add_job j = { resid, x, count };
	size_t blocks = (count + ADD_BLOCK - 1) / ADD_BLOCK;

	/* Pool items are ints; more than INT_MAX blocks (8 TiB) is no real activation, but
	 * stay correct for it anyway, serially. */
	if (blocks > 0x7fffffff) {
		for (size_t k = 0; k < count; k++)
			resid[k] += ((const float *)x)[k];
		return;
	}
	sm70__pool_run(sm70__cpu_of(be)->pool, (int)blocks, sm70__cpu_grain(ADD_BLOCK), add_blocks,
		       &j);
}
