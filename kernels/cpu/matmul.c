/*
 * matmul.c - the CPU matmul op: y = x W^T with W f32, f16, bf16 (or NVFP4, through
 * matmul_nvfp4.c).
 *
 * Threads split the weight rows (output columns) into contiguous chunks. A thread
 * converts one weight row to f32 in its scratch slice, then dots it against every row
 * of x, so each weight row is read and converted once per call. Every output element
 * is one sm70__cpu_dot computed by one thread, so the result is bitwise the same for
 * any thread count.
 *
 * NVFP4 weights go to matmul_nvfp4.c, which follows the same scheme.
 *
 * Non-goals: cache blocking over x for large n (prefill on the CPU is for reference
 * runs, not speed), quantised weights other than NVFP4.
 */
#include "kernels/cpu/cpu_ops.h"

/* The no-scratch path converts weights in stack pieces of this many (a multiple of 8). */
#define MATMUL_PIECE 512

struct matmul_job {
	float *y;
	const float *x;
	const struct sm70_weight *w;
	int n;
	float *scratch; /* NULL: convert in stack pieces instead */
	size_t stride;
};

/* y[i, r] for every i, converting the weight row piece by piece for every x row: the
 * same sm70__cpu_dot8 sequence as the whole-row path, hence the same bits. */
static void matmul_row_pieces(const struct matmul_job *j, int r, size_t esz)
{
	const int cols = j->w->cols, rows = j->w->rows;
	const char *wr = (const char *)j->w->data + (size_t)r * (size_t)cols * esz;
	float buf[MATMUL_PIECE];

	for (int i = 0; i < j->n; i++) {
		const float *x = j->x + (size_t)i * (size_t)cols;
		float acc[8] = { 0 };

		/* Every piece but the last is a full MATMUL_PIECE, a multiple of 8. */
		for (int k = 0;; k += MATMUL_PIECE) {
			int m = cols - k < MATMUL_PIECE ? cols - k : MATMUL_PIECE;
			int m8 = m & ~7;

			sm70__cpu_row_to_f32(buf, wr + (size_t)k * esz, j->w->dtype, (size_t)m);
			sm70__cpu_dot8(acc, x + k, buf, m8);
			if (k + m == cols) {
				j->y[(size_t)i * rows + r] =
					sm70__cpu_dot_end(acc, x + k + m8, buf + m8, m - m8);
				break;
			}
		}
	}
}

static void matmul_rows(void *ctx, int begin, int end, int thread)
{
	const struct matmul_job *j = ctx;
	const int cols = j->w->cols, rows = j->w->rows;
	const size_t esz = sm70_dtype_size(j->w->dtype);

	for (int r = begin; r < end; r++) {
		const float *wr;

		if (j->w->dtype == SM70_DTYPE_F32) {
			wr = (const float *)j->w->data + (size_t)r * (size_t)cols;
		} else if (j->scratch) {
			float *buf = j->scratch + (size_t)thread * j->stride;

			sm70__cpu_row_to_f32(buf, (const char *)j->w->data +
						  (size_t)r * (size_t)cols * esz,
					     j->w->dtype, (size_t)cols);
			wr = buf;
		} else {
			matmul_row_pieces(j, r, esz);
			continue;
		}
		for (int i = 0; i < j->n; i++)
			j->y[(size_t)i * rows + r] =
				sm70__cpu_dot(j->x + (size_t)i * (size_t)cols, wr, cols);
	}
}

/* See backend.h. y and x are f32 on the CPU whatever y_f32 says; y must not overlap x
 * or w. */
void sm70__cpu_matmul(struct sm70_backend *be, void *y, int y_f32, const void *x,
		      const struct sm70_weight *w, int n)
{
	struct sm70__cpu *c = sm70__cpu_of(be);
	struct matmul_job j = { y, x, w, n, NULL, 0 };

	if (n <= 0 || w->rows <= 0)
		return;
	if (w->dtype == SM70_DTYPE_NVFP4) {
		sm70__cpu_matmul_nvfp4(c, y, x, w, n);
		return;
	}
	if (w->dtype != SM70_DTYPE_F32) {
		j.scratch = sm70__cpu_scratch(c, (size_t)w->cols);
		j.stride = c->scratch_stride;
	}
	sm70__pool_run(c->pool, w->rows, sm70__cpu_grain((size_t)w->cols * (size_t)n * 2),
		       matmul_rows, &j);
}
