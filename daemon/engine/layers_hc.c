/*
 * layers_hc.c - qwen4_exp's residual: hyper-connections (hc streams of H values per token)
 * around the layer library's blocks, the per-layer n-gram embeddings (PLE) added to the
 * streams, and the forward of a step (docs/QWEN4_EXP.md has the math).
 *
 * A layer is: [PLE into the streams] -> mixer (norm the streams, mix them into the
 * block's input, the DeltaNet or QSA attention block, the output injected into every
 * stream with its own weight) -> the same around the MoE block. The final mixer collapses
 * the streams into the LM head's input (there is no separate final norm).
 *
 * Tensor parallelism: the mixers and PLE are replicated (every rank computes them whole,
 * identically; their weights are small next to the experts), the blocks split as usual
 * and their partial updates are all-reduced before the injection.
 */
#include "daemon/engine/work.h"

/*
 * Before a block: w->y (act [T, H]) = the streams x mixed by mixer hw; the per-stream
 * inject weights of the block's output go to w->hc_inj (when the mixer has them).
 */
static void hc_pre(struct sm70_model *m, int r, struct sm70__work *w,
		   const struct sm70_hc_weights *hw, const float *x, void *y, int n, int inject)
{
	const struct sm70_qwen4_config *q = &m->cfg.q4;
	struct sm70_backend *be = m->rank[r].be;
	const struct sm70_backend_ops *op = be->ops;
	int H = m->cfg.hidden_size;

	/* one token: the fused two-pass mixer when the backend has it for these shapes */
	if (n == 1 && (m->fused & SM70_FUSED_HC) && op->hc_mix &&
	    op->hc_mix(be, y, inject ? w->hc_inj : NULL, w->hc_xn, w->hc_part, x, hw->norm,
		       &hw->mix, &hw->up, q->hc, H, q->hc_rank, m->cfg.rms_norm_eps) == 0)
		return;
	op->group_rmsnorm(be, w->hc_xn, x, 1, hw->norm, n, q->hc, H, m->cfg.rms_norm_eps);
	op->matmul(be, w->hc_f, 1, w->hc_xn, &hw->mix, n);
	op->hc_gates(be, w->hc_z, inject ? w->hc_inj : NULL, w->hc_f, hw->mix.rows, n,
		     q->hc_rank, q->hc);
	op->matmul(be, w->hc_u, 0, w->hc_z, &hw->up, n);
	op->hc_combine(be, y, w->hc_u, w->hc_xn, n, q->hc, H);
}

/* After a block: its (all-reduced) update joins every stream with the stream's weight. */
static void hc_post(struct sm70_model *m, int r, struct sm70__work *w)
{
	struct sm70_backend *be = m->rank[r].be;

	be->ops->hc_inject(be, w->resid, w->delta, w->hc_inj, m->rank[r].batch.n_tokens,
			   m->cfg.q4.hc, m->cfg.hidden_size);
}

/* Layer l's n-gram embeddings [T, ple_dim] in the workspace. */
static void *ple_rows(struct sm70_model *m, int r, int l, struct sm70__work *w)
{
	size_t a = sm70_dtype_size(m->rank[r].be->act_dtype);

	return (char *)w->ple_e + (size_t)m->cfg.q4.ple_index[l] * m->opts.max_tokens *
					  m->cfg.q4.ple_dim * a;
}

/*
 * Every PLE layer's table rows for the step, gathered at its start: they depend only on
 * the tokens, so on a backend with side sections the host-memory reads (latency-bound
 * over PCIe) overlap the layers before the first PLE layer, which joins them.
 */
static void ple_gather(struct sm70_model *m, int r, struct sm70__work *w)
{
	struct sm70_backend *be = m->rank[r].be;
	const struct sm70_backend_ops *op = be->ops;
	int side = op->side_begin && m->ple_overlap;

	if (side)
		op->side_begin(be);
	for (int l = 0; l < m->cfg.n_layers; l++)
		if (m->cfg.q4.ple_index[l] >= 0)
			op->ple_embed(be, ple_rows(m, r, l, w), &sm70__layer_of(m, r, l)->ple.hash,
				      w->hist, &m->rank[r].batch);
	if (side) {
		op->side_end(be);
		w->ple_pending = 1;
	}
}

static void ple_join(struct sm70_model *m, int r, struct sm70__work *w)
{
	if (w->ple_pending) {
		m->rank[r].be->ops->side_join(m->rank[r].be);
		w->ple_pending = 0;
	}
}

/* PLE of layer l: the n-gram rows, gated against each normed stream, plus their dilated
 * convolution, added to the streams. */
static void ple_block(struct sm70_model *m, int r, int l, struct sm70__work *w)
{
	const struct sm70_qwen4_config *q = &m->cfg.q4;
	struct sm70_model_rank *rk = &m->rank[r];
	struct sm70_backend *be = rk->be;
	const struct sm70_backend_ops *op = be->ops;
	const struct sm70_batch *b = &rk->batch;
	const struct sm70_ple_weights *P = &sm70__layer_of(m, r, l)->ple;
	int T = b->n_tokens, H = m->cfg.hidden_size, S = q->hc;
	float eps = m->cfg.rms_norm_eps;
	struct sm70_dconv dc = { rk->state[l].ple, P->conv, S * H, q->ple_conv_k, q->ngram };
	void *e = ple_rows(m, r, l, w);

	ple_join(m, r, w);
	op->matmul(be, w->ple_k, 0, e, &P->key, T);
	op->matmul(be, w->ple_v, 0, e, &P->value, T);
	op->group_rmsnorm(be, w->ple_kn, w->ple_k, 0, P->norm_key, T, S, H, eps);
	op->group_rmsnorm(be, w->ple_qn, w->resid, 1, P->norm_query, T, S, H, eps);
	op->ple_gate(be, w->ple_gv, w->ple_kn, w->ple_qn, w->ple_v, H, T, S, H);
	op->group_rmsnorm(be, w->ple_gvn, w->ple_gv, 0, P->norm_conv, T, S, H, eps);
	op->ple_conv(be, w->resid, w->ple_gv, w->ple_gvn, &dc, b);
}

/* The rows that need logits: the final mixer over their streams, then the LM head. */
static void hc_head(struct sm70_model *m, int r, struct sm70__work *w)
{
	struct sm70_model_rank *rk = &m->rank[r];
	struct sm70_backend *be = rk->be;
	const struct sm70_batch *b = &rk->batch;
	const struct sm70_decoder *d = rk->arch_state;
	int SH = m->cfg.q4.hc * m->cfg.hidden_size;

	be->ops->gather_rows(be, w->sel_resid, w->resid, b->out_rows, b->n_out, SH, 1);
	hc_pre(m, r, w, &d->hc_final, w->sel_resid, w->sel_y, b->n_out, 0);
	be->ops->matmul(be, rk->logits, 1, w->sel_y, &d->lm_head, b->n_out);
}

void sm70__hc_forward(struct sm70_model *m)
{
	const struct sm70_model_config *c = &m->cfg;
	struct sm70__work w[SM70_MAX_TP];
	int T = m->rank[0].batch.n_tokens, S = c->q4.hc, H = c->hidden_size;

	for (int r = 0; r < m->tp; r++) {
		struct sm70_model_rank *rk = &m->rank[r];
		struct sm70_backend *be = rk->be;
		const struct sm70_decoder *d = rk->arch_state;

		sm70__carve_work(m, r, &w[r]);
		/* the embedding, repeated into every stream */
		be->ops->embed(be, w[r].emb, &d->embed, rk->batch.tok_ids, T);
		be->ops->gather_rows(be, w[r].resid, w[r].emb, d->hc_rep, T * S, H, 1);
		if (c->q4.n_ple) {
			be->ops->ngram_hist(be, w[r].hist, rk->ngram_ctx, c->q4.ngram - 1,
					    &rk->batch);
			ple_gather(m, r, &w[r]);
		}
	}
	for (int l = 0; l < c->n_layers; l++) {
		int gdn = c->layer_kind[l] == SM70_LAYER_GDN;

		for (int r = 0; r < m->tp; r++) {
			const struct sm70_layer_weights *L = sm70__layer_of(m, r, l);

			if (c->q4.ple_index[l] >= 0)
				ple_block(m, r, l, &w[r]);
			hc_pre(m, r, &w[r], &L->hc_attn, w[r].resid, w[r].y, T, 1);
			if (gdn)
				sm70__gdn_block(m, r, l, &w[r]);
			else
				sm70__attention_block(m, r, l, &w[r]);
		}
		sm70__reduce_delta(m, w, T);
		for (int r = 0; r < m->tp; r++) {
			hc_post(m, r, &w[r]);
			hc_pre(m, r, &w[r], &sm70__layer_of(m, r, l)->hc_mlp, w[r].resid, w[r].y,
			       T, 1);
			sm70__ffn_block(m, r, l, &w[r]);
		}
		sm70__reduce_delta(m, w, T);
		for (int r = 0; r < m->tp; r++)
			hc_post(m, r, &w[r]);
	}
	for (int r = 0; r < m->tp; r++)
		ple_join(m, r, &w[r]); /* no PLE layer ran (cannot happen with n_ple > 0) */
	if (m->rank[0].batch.n_out == 0)
		return;
	for (int r = 0; r < m->tp; r++)
		hc_head(m, r, &w[r]);
}
