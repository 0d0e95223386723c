/*
 * sparse_attention.cu - the CUDA sparse_attention op (backend.h): each token attends to
 * the positions of its QSA selection (qsa_select), over the paged KV cache (K and V each
 * f16 or FP8-E4M3: kv_pair.h's pairs), f16 q and out, fp32 softmax.
 *
 * Decode kernel (head_dim 32/64/128/256): attn_decode.h's split kernel, the dense op's
 * SIMT body, with sparse_rows below as its row source: a tile of selected positions is
 * first turned into cache slots (through the block table) in shared memory, then the rows
 * are gathered. The selected list is split over enough blocks to fill the GPU twice (a
 * budget of a few thousand positions at B1 is otherwise a handful of blocks), a split
 * keeping one tile; splits write attention.cu's partials and its merge combines them. The
 * host sizes the splits from min(sel_ld, b->max_pos), a bound on every n_sel, so the grid
 * needs nothing from device memory and a captured graph serves any selection; splits past
 * a token's n_sel write empty partials.
 *
 * Reference kernel (SM70_ATTENTION=reference, another head_dim, or q not 16-byte aligned):
 * attn_decode.h's, one block per (token, head), one thread per dim, one position at a
 * time through the same online softmax.
 *
 * A token with n_sel 0 gets zeros (its first split writes the partial of an empty sum with
 * weight 1). Non-goals: tensor cores (the selection is a gather; the dense op's WMMA
 * kernel is for contiguous tiles), prefill-specific tiling (a chunk's tokens select
 * different blocks, so there is little K/V to share between them).
 */
#include "kernels/cuda/attn_decode.h"

/* The decode kernels' arguments with the selection: token t's positions at
 * sel[t * sel_ld], n_sel[t] of them. */
struct sparse_args : sm70__attn_args {
	const int32_t *sel;
	const int32_t *n_sel;
	int sel_ld;
};

/* The rows of token tok: the positions its selection lists; a tile's slots are made once
 * (a gather) before its loads. */
struct sparse_rows {
	typedef struct sparse_args args;
	static constexpr bool staged = true;
	static constexpr bool may_be_empty = true;
	static constexpr int split_tiles = 1;
	static constexpr const char *op = "sparse_attention";
	static constexpr const char *split_call = "launch attn_split_kernel (sparse_attention)";
	static constexpr const char *ref_call = "launch attn_ref_kernel (sparse_attention)";
	const int32_t *bt, *sel;
	int bs, n;

	__device__ sparse_rows(const struct sparse_args &a, int tok)
		: bt(a.block_tables + (size_t)a.tok_seq[tok] * a.max_blocks),
		  sel(a.sel + (size_t)tok * a.sel_ld), bs(a.bs), n(a.n_sel[tok])
	{
	}
	__device__ size_t slot(int i) const
	{
		const int p = sel[i];

		return (size_t)bt[p / bs] * bs + p % bs;
	}
};

/* See backend.h. As sm70__cuda_attention for the cache, heads and block tables; every
 * n_sel must be at most min(sel_ld, b->max_pos) (it bounds the split). */
extern "C" void sm70__cuda_sparse_attention(struct sm70_backend *be, void *out, const void *q,
					    int q_ld, const struct sm70_kv_layer *kv,
					    const struct sm70_kv_layout *lay,
					    const struct sm70_batch *b, const int32_t *sel,
					    const int32_t *n_sel, int sel_ld, int n_heads,
					    float scale)
{
	struct sm70__cuda *c = sm70__cuda_enter(be);
	const int D = lay->head_dim;
	const enum sm70__kv_pair pair = sm70__kv_pair_of(lay);
	const int most = sel_ld < b->max_pos ? sel_ld : b->max_pos;
	struct sparse_args a;

	if (sm70__attn_args_make(&a, c, sparse_rows::op, out, q, q_ld, kv, lay, b, n_heads,
				 scale))
		return;
	a.sel = sel;
	a.n_sel = n_sel;
	a.sel_ld = sel_ld;
	/* the decode kernel reads q and the cache 16 bytes at a time */
	if (!c->attn_ref && (q_ld % 8) == 0 && ((uintptr_t)q & 15) == 0 &&
	    sm70__attn_split<sparse_rows>(c, a, D, pair, b->n_tokens, most > 0 ? most : 1) !=
		    -ENOSPC)
		return;
	sm70__attn_ref<sparse_rows>(c, a, kv, lay, scale, b->n_tokens);
}
