/*
 * head_norm_rope.c - the CPU head_norm_rope op: per-head RMSNorm (Qwen3's q_norm and
 * k_norm) and rotate-half RoPE, in place on the q or k rows.
 *
 * The rotation angles are computed the way transformers does, in f32: inv_freq[j] =
 * 1 / theta^(2j / rot_dim) with the exponent a float division, angle = (float)pos *
 * inv_freq[j] rounded to f32, then cos and sin of that f32 angle. At position 4000 the
 * rounding of the angle alone moves it by ~1e-4 radians, so computing it in double
 * would disagree with the reference far more than any other error here.
 *
 * Non-goals: rope scaling (yarn, dynamic, linear), interleaved (GPT-J) pairs.
 */
#include <math.h>

#include "kernels/cpu/cpu_ops.h"

/* cos/sin are made on the stack for this many pairs at a time. */
#define ROPE_PIECE 128

struct rope_job {
	float *qk;
	int ld;
	int n_heads;
	int head_dim;
	const float *norm_w;
	float eps;
	const int32_t *pos;
	int rot_dim;
	float theta;
};

/* x = x * rsqrt(mean(x^2) + eps) * w, in transformers' order (see add_rmsnorm.c). */
static void head_rmsnorm(float *x, const float *w, int n, float eps)
{
	double ss = 0.0;
	float inv;

	for (int k = 0; k < n; k++)
		ss += (double)x[k] * x[k];
	inv = 1.0f / sqrtf((float)(ss / (double)n) + eps);
	for (int k = 0; k < n; k++)
		x[k] = (x[k] * inv) * w[k];
}

static void rope_rows(void *ctx, int begin, int end, int thread)
{
	const struct rope_job *j = ctx;
	const int half = j->rot_dim / 2;
	float cs[ROPE_PIECE], sn[ROPE_PIECE];

	for (int i = begin; i < end; i++) {
		float *row = j->qk + (size_t)i * (size_t)j->ld;
		const float fpos = (float)j->pos[i];

		if (j->norm_w)
			for (int h = 0; h < j->n_heads; h++)
				head_rmsnorm(row + (size_t)h * j->head_dim, j->norm_w, j->head_dim,
					     j->eps);
		for (int j0 = 0; j0 < half; j0 += ROPE_PIECE) {
			const int m = half - j0 < ROPE_PIECE ? half - j0 : ROPE_PIECE;

			for (int p = 0; p < m; p++) {
				float e = (float)(2 * (j0 + p)) / (float)j->rot_dim;
				float inv_freq = 1.0f / powf(j->theta, e);
				float angle = fpos * inv_freq;

				cs[p] = cosf(angle);
				sn[p] = sinf(angle);
			}
			for (int h = 0; h < j->n_heads; h++) {
				float *restrict x1 = row + (size_t)h * j->head_dim + j0;
				float *restrict x2 = x1 + half;

				for (int p = 0; p < m; p++) {
					float a = x1[p], b = x2[p];

					x1[p] = a * cs[p] - b * sn[p];
					x2[p] = b * cs[p] + a * sn[p];
				}
			}
		}
	}
}

/* See backend.h. rot_dim must be even and <= head_dim; theta is rounded to f32 first,
 * as PyTorch does with the rope_theta scalar. */
void sm70__cpu_head_norm_rope(struct sm70_backend *be, void *qk, int ld, int n, int n_heads,
			      int head_dim, const float *norm_w, float eps, const int32_t *pos,
			      int rot_dim, double theta)
{
	struct rope_job j = { qk, ld, n_heads, head_dim, norm_w, eps, pos, rot_dim, (float)theta };
	size_t per_row = (size_t)n_heads * (size_t)head_dim * 8 + (size_t)rot_dim * 16;

	sm70__pool_run(sm70__cpu_of(be)->pool, n, sm70__cpu_grain(per_row), rope_rows, &j);
}
