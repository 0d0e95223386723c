/*
 * sparse_attention.c - the CPU sparse_attention op (backend.h): each new token attends to
 * the positions its QSA selection lists (qsa_select) instead of every earlier position.
 *
 * The work is the dense op's own (sm70__cpu_attend_tokens, attention.c) with the
 * selection as each token's position list: the same scores, softmax and V sum in the same
 * order, so a selection of every position 0..tok_pos gives the dense op's bits. Score
 * scratch is min(sel_ld, b->max_pos) floats a thread (a selection fits its row and,
 * ascending up to tok_pos, holds at most tok_pos + 1 positions); a longer list, or no
 * scratch, takes the two-pass form.
 *
 * Non-goals: checking the selection (the engine's qsa_select writes it); everything the
 * dense op does not do.
 */
#include "kernels/cpu/cpu_ops.h"

/* See backend.h. As sm70__cpu_attention (attention.c) for the cache, the heads and the
 * block tables; a token whose n_sel is 0 gets zeros. */
void sm70__cpu_sparse_attention(struct sm70_backend *be, void *out, const void *q, int q_ld,
				const struct sm70_kv_layer *kv, const struct sm70_kv_layout *lay,
				const struct sm70_batch *b, const int32_t *sel,
				const int32_t *n_sel, int sel_ld, int n_heads, float scale)
{
	size_t max_pos = b->max_pos > 0 ? (size_t)b->max_pos : 1;
	size_t most = (size_t)sel_ld < max_pos ? (size_t)sel_ld : max_pos;

	sm70__cpu_attend_tokens(be, out, q, q_ld, kv, lay, b, sel, n_sel, sel_ld, n_heads, scale,
				most < 1 ? 1 : most);
}
