/*
 * qsa.c - the CPU QSA indexer ops (backend.h): qsa_key_write, qsa_compress and qsa_select,
 * which choose the positions sparse_attention (sparse_attention.c) reads.
 *
 * qsa_key_write copies each token's indexer key (f32 on the CPU) to its slot.
 *
 * qsa_compress runs in the caller, not the pool: a step completes at most n_tokens /
 * ratio + n_seqs blocks, each a sum of ratio rows, which is noise beside the step's
 * projections. The mean is summed in f32 in position order and divided by ratio; the norm
 * and rotation are head_norm_rope itself (head_norm_rope.c) on the finished row, so they
 * are that op's bits.
 *
 * qsa_select, one token per task: the scores into the caller's scratch row, then the
 * k-th largest score by a radix select on the f32 bits (scores are sums of relus, >= +0,
 * so their bits order like their values), 8 bits a pass; every block above it is taken
 * and, of the blocks equal to it, the lowest-numbered ones until k are taken (torch.topk's
 * tie rule on CUDA). A scan in block order then writes the positions ascending.
 *
 * Non-goals: checking block tables or slots beyond skipping negative slots (padding rows);
 * NaN inputs (a NaN dot counts as a negative one, as relu's comparison leaves it).
 */
#include <math.h>

#include "kernels/cpu/cpu_ops.h"

/* The cache slot of position p through a sequence's block table. */
static size_t qsa_slot(const int32_t *bt, int bs, int p)
{
	return (size_t)bt[p / bs] * bs + p % bs;
}

struct key_job {
	const struct sm70_qsa_layer *ql;
	const float *k;
	int ld;
	int dim;
	const int32_t *slots;
};

static void key_rows(void *ctx, int begin, int end, int thread)
{
	const struct key_job *j = ctx;

	for (int i = begin; i < end; i++) {
		int32_t slot = j->slots[i];

		if (slot < 0) /* a padding row */
			continue;
		memcpy(j->ql->keys + (size_t)slot * j->dim, j->k + (size_t)i * j->ld,
		       sizeof(float) * (size_t)j->dim);
	}
}

/* See backend.h. Rows with a negative slot are skipped. */
void sm70__cpu_qsa_key_write(struct sm70_backend *be, const struct sm70_qsa_layer *ql,
			     const void *k, int ld, int dim, const struct sm70_batch *b)
{
	struct key_job j = { ql, k, ld, dim, b->tok_slot };

	sm70__pool_run(sm70__cpu_of(be)->pool, b->n_tokens, sm70__cpu_grain((size_t)dim * 8),
		       key_rows, &j);
}

/* The mean of the keys at positions p0 .. p0 + ratio - 1 through bt, into out. */
static void block_mean(float *out, const float *keys, const int32_t *bt, int bs, int p0,
		       int ratio, int dim)
{
	for (int d = 0; d < dim; d++)
		out[d] = 0.0f;
	for (int i = 0; i < ratio; i++) {
		const float *row = keys + qsa_slot(bt, bs, p0 + i) * dim;

		for (int d = 0; d < dim; d++)
			out[d] += row[d];
	}
	for (int d = 0; d < dim; d++)
		out[d] /= (float)ratio;
}

/* See backend.h. Tokens with a negative slot are skipped; rot_dim even and <= dim. */
void sm70__cpu_qsa_compress(struct sm70_backend *be, const struct sm70_qsa_layer *ql,
			    const float *k_norm, float eps, int dim, int ratio, int rot_dim,
			    double theta, int block_size, const struct sm70_batch *b)
{
	if (ratio < 1)
		return;
	for (int t = 0; t < b->n_tokens; t++) {
		const int32_t pos = b->tok_pos[t], slot = b->tok_slot[t];
		const int32_t p0 = pos + 1 - ratio;
		float *row;

		if ((pos + 1) % ratio != 0 || slot < 0)
			continue;
		row = ql->comp + (size_t)slot * dim;
		block_mean(row, ql->keys, b->block_tables + (size_t)b->tok_seq[t] * b->max_blocks,
			   block_size, p0, ratio, dim);
		sm70__cpu_head_norm_rope(be, row, dim, 1, 1, dim, k_norm, eps, &p0, rot_dim, theta);
	}
}

struct select_job {
	int32_t *sel;
	int32_t *n_sel;
	int sel_ld;
	const float *q;
	int q_ld;
	const float *comp;
	int n_heads;
	int dim;
	int ratio;
	int top_blocks;
	int bs;
	float *scores;     /* the caller's scratch */
	size_t scores_ld;  /* ceil(max_pos / ratio) */
	float sqrt_dim;
	const struct sm70_batch *b;
};

static uint32_t score_bits(float s)
{
	uint32_t u;

	memcpy(&u, &s, sizeof(u));
	return u;
}

/*
 * The k-th largest (1 <= k <= n) of n scores as f32 bits, and in *take_eq how many of
 * the scores equal to it are in the top k. Each pass histograms the next 8 bits of the
 * scores that match the bits found so far and keeps the bin where the count from the top
 * reaches the rank still wanted.
 */
static uint32_t kth_largest(const float *s, int n, int k, int *take_eq)
{
	uint32_t prefix = 0, mask = 0;
	int want = k;

	for (int shift = 24; shift >= 0; shift -= 8) {
		int hist[256] = { 0 }, bin = 255;

		for (int i = 0; i < n; i++) {
			uint32_t u = score_bits(s[i]);

			if ((u & mask) == prefix)
				hist[(u >> shift) & 255]++;
		}
		for (; hist[bin] < want; bin--)
			want -= hist[bin];
		prefix |= (uint32_t)bin << shift;
		mask |= 255u << shift;
	}
	*take_eq = want;
	return prefix;
}

/* score[c] for c < nb, as backend.h states it. */
static void block_scores(float *score, const struct select_job *j, const float *q,
			 const int32_t *bt, int nb)
{
	for (int c = 0; c < nb; c++) {
		const float *kc = j->comp + qsa_slot(bt, j->bs, c * j->ratio + j->ratio - 1) * j->dim;
		float acc = 0.0f;

		for (int h = 0; h < j->n_heads; h++) {
			float d = sm70__cpu_dot(q + (size_t)h * j->dim, kc, j->dim);

			acc += d > 0.0f ? d : 0.0f;
		}
		score[c] = acc / j->sqrt_dim;
	}
}

/* Writes into row the positions of the k best of the nb blocks whose scores are in score,
 * ascending; returns how many. */
static int chosen_positions(int32_t *row, const float *score, int nb, int k, int ratio)
{
	int take_eq, n = 0;
	uint32_t kth = kth_largest(score, nb, k, &take_eq);

	for (int c = 0; c < nb; c++) {
		uint32_t u = score_bits(score[c]);

		if (u < kth)
			continue;
		if (u == kth) {
			if (take_eq == 0)
				continue;
			take_eq--;
		}
		for (int i = 0; i < ratio; i++)
			row[n++] = c * ratio + i;
	}
	return n;
}

static void select_tokens(void *ctx, int begin, int end, int thread)
{
	const struct select_job *j = ctx;
	const struct sm70_batch *b = j->b;

	for (int t = begin; t < end; t++) {
		const int p = b->tok_pos[t], nb = (p + 1) / j->ratio;
		const int32_t *bt = b->block_tables + (size_t)b->tok_seq[t] * b->max_blocks;
		int32_t *row = j->sel + (size_t)t * j->sel_ld;
		float *score = j->scores + (size_t)t * j->scores_ld;
		int n = 0, first_tail = nb * j->ratio;

		if (nb <= j->top_blocks) {
			first_tail = 0; /* every block: the positions are 0..p */
		} else if (j->top_blocks > 0) {
			block_scores(score, j, j->q + (size_t)t * j->q_ld, bt, nb);
			n = chosen_positions(row, score, nb, j->top_blocks, j->ratio);
		}
		for (int pos = first_tail; pos <= p; pos++)
			row[n++] = pos;
		j->n_sel[t] = n;
	}
}

/* See backend.h. sel_ld must be at least min(top_blocks, nb) * ratio + ratio - 1 for
 * every token; top_blocks below 0 counts as 0. */
void sm70__cpu_qsa_select(struct sm70_backend *be, int32_t *sel, int32_t *n_sel, int sel_ld,
			  const void *q, int q_ld, const struct sm70_qsa_layer *ql, int n_heads,
			  int dim, int ratio, int top_blocks, int block_size, float *scratch,
			  const struct sm70_batch *b)
{
	struct select_job j = { sel, n_sel, sel_ld, q, q_ld, ql->comp, n_heads, dim, ratio,
				top_blocks > 0 ? top_blocks : 0, block_size, scratch, 0,
				(float)sqrt((double)dim), b };
	size_t per_token;

	if (ratio < 1 || b->n_tokens <= 0)
		return;
	j.scores_ld = ((size_t)(b->max_pos > 0 ? b->max_pos : 0) + ratio - 1) / ratio;
	per_token = j.scores_ld * ((size_t)n_heads * dim * 2 + 8);
	sm70__pool_run(sm70__cpu_of(be)->pool, b->n_tokens, sm70__cpu_grain(per_token),
		       select_tokens, &j);
}
