/*
 * hc.c - the CPU hyper-connection ops of qwen4_exp (kernels/backend.h): hc_gates (the
 * low-rank and inject gates of a layer, from one projection), hc_combine (the streams
 * mixed into the layer's input) and hc_inject (the layer's output added back into every
 * stream, scaled per stream).
 *
 * All f32, one rounding per operation, in the order backend.h writes each formula:
 * v = f / S; silu(v) = v / (1 + expf(-v)) as silu_mul.c has it; 2 * sigmoid(v) =
 * 2 / (1 + expf(-v)); hc_combine sums the S products s ascending and divides by S at the
 * end; hc_inject rounds the product, then the sum.
 *
 * Non-goals: the projections themselves (matmul), dynamic stream counts, any other
 * hyper-connection variant (static alpha/beta matrices).
 */
#include <math.h>

#include "kernels/cpu/cpu_ops.h"

struct gates_job {
	float *z;
	float *inj;
	const float *f;
	int ld;
	int rank;
	int streams;
};

static void gates_rows(void *ctx, int begin, int end, int thread)
{
	const struct gates_job *j = ctx;
	const float S = (float)j->streams;

	for (int i = begin; i < end; i++) {
		const float *restrict f = j->f + (size_t)i * j->ld;
		float *restrict z = j->z + (size_t)i * j->rank;

		for (int k = 0; k < j->rank; k++) {
			const float v = f[k] / S;

			z[k] = v / (1.0f + expf(-v));
		}
		if (!j->inj)
			continue;
		for (int s = 0; s < j->streams; s++)
			j->inj[(size_t)i * j->streams + s] =
				2.0f / (1.0f + expf(-(f[j->rank + s] / S)));
	}
}

/* See backend.h. z and inj must not overlap f. */
void sm70__cpu_hc_gates(struct sm70_backend *be, void *z, float *inj, const float *f, int ld,
			int n, int rank, int streams)
{
	struct gates_job j = { z, inj, f, ld, rank, streams };

	if (n <= 0 || rank < 0 || streams <= 0)
		return;
	sm70__pool_run(sm70__cpu_of(be)->pool, n,
		       sm70__cpu_grain((size_t)(rank + streams) * 16), gates_rows, &j);
}

struct combine_job {
	float *y;
	const float *u;
	const float *xn;
	int streams;
	int dim;
};

static void combine_rows(void *ctx, int begin, int end, int thread)
{
	const struct combine_job *j = ctx;
	const size_t dim = (size_t)j->dim, row = (size_t)j->streams * dim;
	const float S = (float)j->streams;

	for (int i = begin; i < end; i++) {
		float *restrict y = j->y + (size_t)i * dim;
		const float *restrict u = j->u + (size_t)i * row;
		const float *restrict xn = j->xn + (size_t)i * row;

		/* y is the f32 accumulator: streams outer keeps every pass a contiguous row */
		for (size_t k = 0; k < dim; k++)
			y[k] = 0.0f;
		for (int s = 0; s < j->streams; s++) {
			const float *restrict us = u + (size_t)s * dim;
			const float *restrict xs = xn + (size_t)s * dim;

			for (size_t k = 0; k < dim; k++)
				y[k] += (1.0f / (1.0f + expf(-us[k]))) * xs[k];
		}
		for (size_t k = 0; k < dim; k++)
			y[k] /= S;
	}
}

/* See backend.h. y must not overlap u or xn. */
void sm70__cpu_hc_combine(struct sm70_backend *be, void *y, const void *u, const void *xn,
			  int n, int streams, int dim)
{
	struct combine_job j = { y, u, xn, streams, dim };

	if (n <= 0 || streams <= 0 || dim <= 0)
		return;
	sm70__pool_run(sm70__cpu_of(be)->pool, n,
		       sm70__cpu_grain((size_t)streams * (size_t)dim * 16), combine_rows, &j);
}

struct inject_job {
	float *x;
	const float *delta;
	const float *inj;
	int streams;
	int dim;
};

/* One item is one (row, stream). */
static void inject_items(void *ctx, int begin, int end, int thread)
{
	const struct inject_job *j = ctx;
	const size_t dim = (size_t)j->dim;

	for (int item = begin; item < end; item++) {
		float *restrict x = j->x + (size_t)item * dim;
		const float *restrict d = j->delta + (size_t)(item / j->streams) * dim;
		const float g = j->inj[item];

		for (size_t k = 0; k < dim; k++)
			x[k] += d[k] * g;
	}
}

/* See backend.h. x must not overlap delta or inj. */
void sm70__cpu_hc_inject(struct sm70_backend *be, float *x, const void *delta,
			 const float *inj, int n, int streams, int dim)
{
	struct inject_job j = { x, delta, inj, streams, dim };

	if (n <= 0 || streams <= 0 || dim <= 0)
		return;
	sm70__pool_run(sm70__cpu_of(be)->pool, n * streams, sm70__cpu_grain((size_t)dim * 2),
		       inject_items, &j);
}
