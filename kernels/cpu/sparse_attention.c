/*
 * sparse_attention.c - the CPU sparse_attention op (backend.h): each new token attends to
 * the positions its QSA selection lists (qsa_select) instead of every earlier position.
 *
 * A task is one (token, head) pair through sm70__cpu_attend_head, the dense attention's
 * own core (attention.c) with the selection as its position list: the same scores, softmax
 * and V sum in the same order, so a selection of every position 0..tok_pos gives the
 * dense op's bits. Score scratch is min(sel_ld, b->max_pos) floats a thread (a selection
 * fits its row and, ascending up to tok_pos, holds at most tok_pos + 1 positions); a
 * longer list, or no scratch, takes the two-pass form.
 *
 * Non-goals: checking the selection (the engine's qsa_select writes it); everything the
 * dense op does not do.
 */
#include "kernels/cpu/cpu_ops.h"

struct sparse_job {
	float *out;
	const float *q;
	int q_ld;
	const struct sm70_kv_layer *kv;
	const struct sm70_kv_layout *lay;
	const struct sm70_batch *b;
	const int32_t *sel;
	const int32_t *n_sel;
	int sel_ld;
	int n_heads;
	float scale;
	float *scratch; /* NULL: two-pass path */
	size_t stride;  /* floats per thread slice */
};

static void sparse_tasks(void *ctx, int begin, int end, int thread)
{
	const struct sparse_job *j = ctx;
	const struct sm70_batch *b = j->b;
	const int hd = j->lay->head_dim;
	const int group = j->n_heads / j->lay->n_kv_heads;
	float *scores = j->scratch ? j->scratch + (size_t)thread * j->stride : NULL;

	for (int task = begin; task < end; task++) {
		const int tok = task / j->n_heads, h = task % j->n_heads;
		const int n = j->n_sel[tok];
		const int32_t *bt = b->block_tables + (size_t)b->tok_seq[tok] * b->max_blocks;

		sm70__cpu_attend_head(j->out + ((size_t)tok * j->n_heads + h) * hd,
				      j->q + (size_t)tok * j->q_ld + (size_t)h * hd, j->kv, j->lay,
				      bt, h / group, j->sel + (size_t)tok * j->sel_ld, n, j->scale,
				      (size_t)n <= j->stride ? scores : NULL);
	}
}

/* See backend.h. As sm70__cpu_attention (attention.c) for the cache, the heads and the
 * block tables; a token whose n_sel is 0 gets zeros. */
void sm70__cpu_sparse_attention(struct sm70_backend *be, void *out, const void *q, int q_ld,
				const struct sm70_kv_layer *kv, const struct sm70_kv_layout *lay,
				const struct sm70_batch *b, const int32_t *sel,
				const int32_t *n_sel, int sel_ld, int n_heads, float scale)
{
	struct sm70__cpu *c = sm70__cpu_of(be);
	struct sparse_job j = { out, q, q_ld, kv, lay, b, sel, n_sel, sel_ld, n_heads, scale,
				NULL, 0 };
	size_t max_pos = b->max_pos > 0 ? (size_t)b->max_pos : 1;
	size_t most = (size_t)sel_ld < max_pos ? (size_t)sel_ld : max_pos;
	long tasks = (long)b->n_tokens * n_heads;

	if (tasks <= 0 || lay->n_kv_heads <= 0 || n_heads % lay->n_kv_heads)
		return;
	if (most < 1)
		most = 1;
	j.scratch = sm70__cpu_scratch(c, most);
	j.stride = c->scratch_stride;
	sm70__pool_run(c->pool, (int)tasks,
		       sm70__cpu_grain(most * (size_t)lay->head_dim * 4), sparse_tasks, &j);
}
