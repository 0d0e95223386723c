/*
 * conv1d_silu.c - the CPU conv1d_silu op: the GDN layer's causal depthwise convolution
 * over the q | k | v channels, then SiLU, with the last conv_k - 1 inputs of each
 * sequence kept in its state slot.
 *
 * One task is one (sequence, block of CONV_BLOCK channels). It runs the tokens of the
 * sequence's slot in batch order (cpu_ops.h says how a shared slot is handled), reading
 * and shifting the slot's saved inputs in place. The sum over the taps is f32, oldest
 * tap first, as one f32 accumulator per channel; silu(x) = x / (1 + exp(-x)) as in
 * silu_mul.c. The slot holds exact copies of inputs, so splitting a prompt over calls
 * or chunks gives the same bits as feeding it at once.
 *
 * Non-goals: a bias (qwen3_5's conv has none), other activations, dilation.
 */
#include <math.h>

#include "kernels/cpu/cpu_ops.h"

/* Channels per task (a multiple of 16: the block's rows stay cache-line aligned). */
#define CONV_BLOCK 256

struct conv_job {
	float *out;
	const float *x;
	int ld;
	const float *w;
	float *conv;
	const struct sm70_state_layout *lay;
	const struct sm70_batch *b;
	struct sm70__cpu_units units;
	int n_blocks; /* channel blocks per sequence */
};

/* One token over channels [c0, c0 + n) of one slot's saved inputs st. */
static void conv_token(const struct conv_job *j, float *st, int t, int c0, int n)
{
	const int K = j->lay->conv_k, dim = j->lay->conv_dim;
	const float *restrict x = j->x + (size_t)t * (size_t)j->ld + c0;
	const float *restrict w = j->w + (size_t)c0 * (size_t)K;
	float *restrict o = j->out + (size_t)t * (size_t)dim + c0;
	float acc[CONV_BLOCK];

	if (j->b->tok_pos[t] == 0)
		for (int r = 0; r < K - 1; r++)
			memset(st + (size_t)r * dim + c0, 0, sizeof(float) * (size_t)n);
	for (int c = 0; c < n; c++)
		acc[c] = 0.0f;
	for (int r = 0; r < K - 1; r++) {
		const float *restrict s = st + (size_t)r * dim + c0;

		for (int c = 0; c < n; c++)
			acc[c] += w[(size_t)c * K + r] * s[c];
	}
	for (int c = 0; c < n; c++)
		acc[c] += w[(size_t)c * K + K - 1] * x[c];
	/* the window moves one input on: drop the oldest, keep x */
	for (int r = 0; r + 1 < K - 1; r++)
		memcpy(st + (size_t)r * dim + c0, st + (size_t)(r + 1) * dim + c0,
		       sizeof(float) * (size_t)n);
	if (K > 1)
		memcpy(st + (size_t)(K - 2) * dim + c0, x, sizeof(float) * (size_t)n);
	for (int c = 0; c < n; c++)
		o[c] = acc[c] / (1.0f + expf(-acc[c]));
}

static void conv_tasks(void *ctx, int begin, int end, int thread)
{
	const struct conv_job *j = ctx;
	const struct sm70_state_layout *lay = j->lay;
	const size_t slot_size = (size_t)(lay->conv_k - 1) * (size_t)lay->conv_dim;

	for (int item = begin; item < end; item++) {
		const int s = item / j->n_blocks, c0 = item % j->n_blocks * CONV_BLOCK;
		const int n = lay->conv_dim - c0 < CONV_BLOCK ? lay->conv_dim - c0 : CONV_BLOCK;
		const int slot = sm70__cpu_state_owner(j->b, lay->n_slots, s);
		float *st;

		if (slot < 0)
			continue;
		st = j->conv + (size_t)slot * slot_size;
		for (int u = 0; u < j->units.n; u++) {
			int first, len;

			sm70__cpu_unit(&j->units, u, &first, &len);
			if (sm70__cpu_token_slot(j->b, lay->n_slots, first) != slot)
				continue;
			for (int t = first; t < first + len; t++)
				conv_token(j, st, t, c0, n);
		}
	}
}

/* See backend.h. Every sequence's slot must be in [0, n_slots]; a token whose sequence
 * or slot is out of range is skipped (its output row is not written). */
void sm70__cpu_conv1d_silu(struct sm70_backend *be, void *out, const void *x, int ld,
			   const float *w, const struct sm70_state_layer *st,
			   const struct sm70_state_layout *lay, const struct sm70_batch *b)
{
	struct conv_job j = { .out = out, .x = x, .ld = ld, .w = w, .conv = st->conv,
			      .lay = lay, .b = b };
	size_t per_item;

	if (b->n_tokens <= 0 || b->n_seqs <= 0 || !b->seq_state || lay->conv_k < 1 ||
	    lay->conv_dim <= 0 || ld < lay->conv_dim)
		return;
	sm70__cpu_units_init(&j.units, b);
	j.n_blocks = (lay->conv_dim + CONV_BLOCK - 1) / CONV_BLOCK;
	per_item = ((size_t)b->n_tokens / (size_t)b->n_seqs + 1) * CONV_BLOCK *
		   (size_t)(lay->conv_k + 2);
	sm70__pool_run(sm70__cpu_of(be)->pool, b->n_seqs * j.n_blocks, sm70__cpu_grain(per_item),
		       conv_tasks, &j);
}
