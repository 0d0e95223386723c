/*
 * layers.c - the layer library (see layers.h): shared loaders, the workspace of one step,
 * the blocks, and the decoder forward over the per-layer plan (cfg.layer_kind).
 *
 * Tensor parallelism (Megatron-style) is the blocks' business: q/k/v, gate/up and the
 * DeltaNet input projection are split by output rows (heads, intermediate rows), o_proj,
 * down_proj and the DeltaNet out_proj by input columns, so each of those gives a partial
 * sum of the residual update that one all-reduce completes; the LM head is split by
 * vocabulary rows. The residual stream is replicated and identical on every rank.
 */
#include "daemon/engine/layers.h"
#include "daemon/engine/work.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- workspace ---------------------------------------------------------------------- */

/* A bump allocator over a rank's work buffer: each call names the buffer it carves, so
 * sizes and pointers cannot drift apart. With base NULL it only measures. */
struct carver {
	char *base;
	size_t off;
};

static void *carve(struct carver *c, size_t bytes)
{
	void *p = c->base ? c->base + c->off : NULL;

	c->off += (bytes + 63) & ~(size_t)63;
	return p;
}

/* Elements of a qkv row before the QSA indexer's part: q | k | v (| gate). */
static int attn_heads_ld(const struct sm70_model *m, int r)
{
	const struct sm70_model_rank *rk = &m->rank[r];

	return (rk->q_heads * (m->cfg.attn_gate ? 2 : 1) + 2 * rk->kv_heads) * m->cfg.head_dim;
}

static int attn_ld(const struct sm70_model *m, int r)
{
	const struct sm70_qwen4_config *q = &m->cfg.q4;
	int idx = m->cfg.arch == SM70_ARCH_QWEN4_EXP ? (q->idx_heads + 1) * q->idx_dim : 0;

	return attn_heads_ld(m, r) + idx;
}

/* qwen4_exp's buffers: the streams' mixers, PLE and QSA. */
static void carve_hc(const struct sm70_model *m, int r, struct carver *cv,
		     struct sm70__work *w)
{
	const struct sm70_model_config *c = &m->cfg;
	const struct sm70_qwen4_config *q = &c->q4;
	size_t a = sm70_dtype_size(m->rank[r].be->act_dtype);
	size_t T = (size_t)m->opts.max_tokens, H = c->hidden_size, SH = (size_t)q->hc * H;
	size_t ple = q->n_ple > 0, nb = ((size_t)c->max_position + q->idx_ratio - 1) /
				       q->idx_ratio;

	w->emb = carve(cv, T * H * sizeof(float));
	w->hc_xn = carve(cv, T * SH * a);
	w->hc_f = carve(cv, T * (size_t)(q->hc_rank + q->hc) * sizeof(float));
	w->hc_z = carve(cv, T * (size_t)q->hc_rank * a);
	w->hc_u = carve(cv, T * SH * a);
	w->hc_inj = carve(cv, T * (size_t)q->hc * sizeof(float));
	w->hc_part = carve(cv, (size_t)q->hc * (q->hc_rank + q->hc) * sizeof(float));
	w->hist = carve(cv, ple * T * (size_t)(q->ngram - 1) * sizeof(int32_t));
	w->ple_e = carve(cv, (size_t)q->n_ple * T * (size_t)q->ple_dim * a);
	w->ple_pending = 0;
	w->ple_k = carve(cv, ple * T * SH * a);
	w->ple_kn = carve(cv, ple * T * SH * a);
	w->ple_qn = carve(cv, ple * T * SH * a);
	w->ple_gv = carve(cv, ple * T * SH * a);
	w->ple_gvn = carve(cv, ple * T * SH * a);
	w->ple_v = carve(cv, ple * T * H * a);
	w->qsa_sel_ld = q->idx_budget + q->idx_ratio - 1;
	w->qsa_sel = carve(cv, T * (size_t)w->qsa_sel_ld * sizeof(int32_t));
	w->qsa_n = carve(cv, T * sizeof(int32_t));
	w->qsa_scores = carve(cv, T * nb * sizeof(float));
	w->idx_off = attn_heads_ld(m, r);
}

static int gdn_proj_ld(const struct sm70_model *m, int r)
{
	const struct sm70_state_layout *L = &m->rank[r].state_lay;

	return L->conv_dim + L->n_v_heads * L->v_dim + 2 * L->n_v_heads;
}

size_t sm70__carve_work(const struct sm70_model *m, int r, struct sm70__work *w)
{
	const struct sm70_model_config *c = &m->cfg;
	const struct sm70_model_rank *rk = &m->rank[r];
	const struct sm70_state_layout *L = &rk->state_lay;
	size_t a = sm70_dtype_size(rk->be->act_dtype);
	size_t T = (size_t)m->opts.max_tokens, S = (size_t)m->opts.max_seqs, H = c->hidden_size;
	int gdn = c->hybrid.n_gdn_layers > 0, hc = c->arch == SM70_ARCH_QWEN4_EXP;
	size_t streams = hc ? (size_t)c->q4.hc : 1;
	struct carver cv = { rk->work, 0 };

	memset(w, 0, sizeof(*w));
	w->qkv_ld = attn_ld(m, r);
	w->proj_ld = gdn ? gdn_proj_ld(m, r) : 0;
	w->resid = carve(&cv, T * streams * H * sizeof(float));
	if ((m->fused & SM70_FUSED_NORM) && !hc)
		w->resid_alt = carve(&cv, T * H * sizeof(float));
	w->y = carve(&cv, T * H * a);
	w->qkv = carve(&cv, T * (size_t)w->qkv_ld * a);
	w->attn = carve(&cv, T * (size_t)rk->q_heads * c->head_dim * a);
	w->delta = carve(&cv, T * H * a);
	w->gate_up = carve(&cv, T * 2 * (size_t)rk->inter * a);
	w->mid = carve(&cv, T * (size_t)rk->inter * a);
	w->sel_resid = carve(&cv, S * streams * H * sizeof(float));
	w->sel_delta = carve(&cv, S * H * a);
	w->sel_y = carve(&cv, S * H * a);
	w->gdn_proj = carve(&cv, gdn ? T * (size_t)w->proj_ld * a : 0);
	w->gdn_conv = carve(&cv, gdn ? T * (size_t)L->conv_dim * a : 0);
	w->gdn_core = carve(&cv, gdn ? T * (size_t)L->n_v_heads * L->v_dim * a : 0);
	if (c->moe.n_moe_layers) {
		size_t TK = T * (size_t)c->moe.top_k, sh = (size_t)rk->shared_inter;

		w->router_ld = c->moe.n_experts + (c->moe.shared_inter > 0);
		w->router = carve(&cv, T * (size_t)w->router_ld * sizeof(float));
		w->route.ids = carve(&cv, TK * sizeof(int32_t));
		w->route.w = carve(&cv, TK * sizeof(float));
		w->route.order = carve(&cv, TK * sizeof(int32_t));
		w->route.used = carve(&cv, TK * sizeof(int32_t));
		w->route.used_first = carve(&cv, (TK + 1) * sizeof(int32_t));
		w->route.n_used = NULL; /* per layer: moe_used + l */
		w->moe_used = carve(&cv, (size_t)c->n_layers * sizeof(int32_t));
		w->moe_mid = carve(&cv, TK * (size_t)rk->moe_inter * a);
		w->moe_part = carve(&cv, TK * H * sizeof(float));
		w->sh_gate_up = carve(&cv, T * 2 * sh * a);
		w->sh_mid = carve(&cv, T * sh * a);
		w->sh_out = carve(&cv, sh ? T * H * a : 0);
	}
	if (hc)
		carve_hc(m, r, &cv, w);
	return cv.off;
}

size_t sm70__decoder_workspace_bytes(const struct sm70_model *m, int r)
{
	struct sm70__work w;

	return sm70__carve_work(m, r, &w);
}

/* ---- blocks ------------------------------------------------------------------------- */

const struct sm70_layer_weights *sm70__layer_of(const struct sm70_model *m, int r, int l)
{
	return &((const struct sm70_decoder *)m->rank[r].arch_state)->layers[l];
}

/* Sums the ranks' partial updates (row-parallel outputs) so every rank holds the total. */
void sm70__reduce_delta(struct sm70_model *m, struct sm70__work *w, int T)
{
	void *bufs[SM70_MAX_TP];

	if (m->tp == 1 || m->bench_skip_allreduce)
		return;
	for (int r = 0; r < m->tp; r++)
		bufs[r] = w[r].delta;
	/* a failure is sticky in the backends and comes back from their sync */
	(void)m->comm->ops->all_reduce(m->comm, bufs, (size_t)T * m->cfg.hidden_size,
				       m->rank[0].be->act_dtype);
}

/* w->resid += delta (when non-NULL), then the block input w->y = its norm. */
static void norm_into_y(struct sm70_model *m, int r, struct sm70__work *w, const void *delta,
			const float *norm)
{
	struct sm70_backend *be = m->rank[r].be;

	be->ops->add_rmsnorm(be, w->y, w->resid, delta, norm, m->rank[r].batch.n_tokens,
			     m->cfg.hidden_size, m->cfg.rms_norm_eps);
}

/* Before a block: the pending update (none before the first block) joins the residual
 * and the block's input is its norm. With SM70_FUSED=norm, a one-token step and a block
 * whose input feeds only its first matmul (alone), the work is left to that matmul
 * (block_matmul_in). */
static void residual_in(struct sm70_model *m, int r, struct sm70__work *w, int first,
			const float *norm, int alone)
{
	if (alone && w->resid_alt && m->rank[r].be->ops->add_rmsnorm_matmul &&
	    m->rank[r].batch.n_tokens == 1) {
		w->pend_norm = norm;
		w->pend_first = first;
		return;
	}
	norm_into_y(m, r, w, first ? NULL : w->delta, norm);
}

/* After a fused add_rmsnorm_matmul: the updated residual is in the other buffer. */
static void swap_residual(struct sm70__work *w)
{
	float *t = w->resid;

	w->resid = w->resid_alt;
	w->resid_alt = t;
}

/* A block's first matmul, y_out = norm(input) W^T, and with glu_out (the gated MLP's
 * gate_up, SM70_FUSED=glu) glu_out = silu_mul(y_out) too. With the norm still owed, one
 * fused op that also writes the updated residual to the other buffer (the two then
 * swap); then the GLU fusion; the separate ops wherever the backend does not take the
 * call (y_out is written only then). */
static void block_matmul_in(struct sm70_model *m, int r, struct sm70__work *w, void *y_out,
			    const struct sm70_weight *W, void *glu_out)
{
	struct sm70_backend *be = m->rank[r].be;
	const struct sm70_backend_ops *op = be->ops;
	int T = m->rank[r].batch.n_tokens;

	if (w->pend_norm) {
		const float *norm = w->pend_norm;
		const void *delta = w->pend_first ? NULL : w->delta;
		float eps = m->cfg.rms_norm_eps;

		w->pend_norm = NULL;
		if (glu_out && op->add_rmsnorm_matmul(be, glu_out, w->resid_alt, w->resid, delta,
						      norm, eps, W, T, 1) == 0) {
			swap_residual(w);
			return;
		}
		if (op->add_rmsnorm_matmul(be, y_out, w->resid_alt, w->resid, delta, norm, eps, W,
					   T, 0) == 0) {
			swap_residual(w);
		} else {
			norm_into_y(m, r, w, delta, norm);
			op->matmul(be, y_out, 0, w->y, W, T);
		}
	} else if (glu_out && op->matmul_glu && op->matmul_glu(be, glu_out, w->y, W, T) == 0) {
		return;
	} else {
		op->matmul(be, y_out, 0, w->y, W, T);
	}
	if (glu_out)
		op->silu_mul(be, glu_out, y_out, T, W->rows / 2);
}

/*
 * QSA (qwen4_exp): the indexer's queries (normed, rotated) and raw key from the same qkv
 * rows, the key cache and the compressed block keys updated, the blocks each token may
 * see chosen, and the attention over those positions only.
 */
static void qsa_attention(struct sm70_model *m, int r, int l, struct sm70__work *w)
{
	const struct sm70_model_config *c = &m->cfg;
	const struct sm70_qwen4_config *q = &c->q4;
	struct sm70_model_rank *rk = &m->rank[r];
	struct sm70_backend *be = rk->be;
	const struct sm70_backend_ops *op = be->ops;
	const struct sm70_batch *b = &rk->batch;
	const struct sm70_attn_weights *A = &sm70__layer_of(m, r, l)->attn;
	size_t a = sm70_dtype_size(be->act_dtype);
	char *iq = (char *)w->qkv + (size_t)w->idx_off * a;
	char *ik = iq + (size_t)q->idx_heads * q->idx_dim * a;
	int T = b->n_tokens;

	op->head_norm_rope(be, iq, w->qkv_ld, T, q->idx_heads, q->idx_dim, A->idx_q_norm,
			   c->rms_norm_eps, b->tok_pos, c->rot_dim, c->rope_theta);
	op->qsa_key_write(be, &rk->qsa[l], ik, w->qkv_ld, q->idx_dim, b);
	op->qsa_compress(be, &rk->qsa[l], A->idx_k_norm, c->rms_norm_eps, q->idx_dim,
			 q->idx_ratio, c->rot_dim, c->rope_theta, m->kv_lay.block_size, b);
	op->qsa_select(be, w->qsa_sel, w->qsa_n, w->qsa_sel_ld, iq, w->qkv_ld, &rk->qsa[l],
		       q->idx_heads, q->idx_dim, q->idx_ratio, q->idx_budget / q->idx_ratio,
		       m->kv_lay.block_size, w->qsa_scores, b);
	op->sparse_attention(be, w->attn, w->qkv, w->qkv_ld, &rk->kv[l], &m->kv_lay, b,
			     w->qsa_sel, w->qsa_n, w->qsa_sel_ld, rk->q_heads,
			     1.0f / sqrtf((float)c->head_dim));
}

/* Rank r's attention of layer l, from its normed input to its (partial) o_proj output in
 * w->delta. Gated attention multiplies the output by sigmoid(gate) first. */
void sm70__attention_block(struct sm70_model *m, int r, int l, struct sm70__work *w)
{
	const struct sm70_model_config *c = &m->cfg;
	struct sm70_model_rank *rk = &m->rank[r];
	struct sm70_backend *be = rk->be;
	const struct sm70_backend_ops *op = be->ops;
	const struct sm70_batch *b = &rk->batch;
	const struct sm70_attn_weights *A = &sm70__layer_of(m, r, l)->attn;
	int T = b->n_tokens, D = c->head_dim, Hq = rk->q_heads, Hk = rk->kv_heads;
	int ld = w->qkv_ld;
	size_t a = sm70_dtype_size(be->act_dtype);
	char *k_in = (char *)w->qkv + (size_t)Hq * D * a;
	char *v_in = k_in + (size_t)Hk * D * a;

	block_matmul_in(m, r, w, w->qkv, &A->qkv, NULL);
	if ((m->fused & SM70_FUSED_QK) && op->qk_norm_rope_kv) {
		op->qk_norm_rope_kv(be, w->qkv, ld, T, Hq, Hk, D, A->q_norm, A->k_norm,
				    c->rms_norm_eps, b->tok_pos, c->rot_dim, c->rope_theta,
				    &rk->kv[l], &m->kv_lay, b->tok_slot);
	} else {
		op->head_norm_rope(be, w->qkv, ld, T, Hq, D, A->q_norm, c->rms_norm_eps,
				   b->tok_pos, c->rot_dim, c->rope_theta);
		op->head_norm_rope(be, k_in, ld, T, Hk, D, A->k_norm, c->rms_norm_eps,
				   b->tok_pos, c->rot_dim, c->rope_theta);
		op->kv_write(be, &rk->kv[l], &m->kv_lay, k_in, v_in, ld, b->tok_slot, T);
	}
	if (c->arch == SM70_ARCH_QWEN4_EXP)
		qsa_attention(m, r, l, w);
	else
		op->attention(be, w->attn, w->qkv, ld, &rk->kv[l], &m->kv_lay, b, Hq,
			      1.0f / sqrtf((float)D));
	if (c->attn_gate)
		op->sigmoid_mul(be, w->attn, v_in + (size_t)Hk * D * a, ld, T, Hq * D);
	op->matmul(be, w->delta, 0, w->attn, &A->o, T);
}

/* Rank r's Gated DeltaNet of layer l: projections, causal conv with its state, the delta
 * rule with its state, the gated norm, and the (partial) out_proj output in w->delta. */
void sm70__gdn_block(struct sm70_model *m, int r, int l, struct sm70__work *w)
{
	struct sm70_model_rank *rk = &m->rank[r];
	struct sm70_backend *be = rk->be;
	const struct sm70_backend_ops *op = be->ops;
	const struct sm70_batch *b = &rk->batch;
	const struct sm70_state_layout *L = &rk->state_lay;
	const struct sm70_gdn_weights *G = &sm70__layer_of(m, r, l)->gdn;
	int T = b->n_tokens, vd = L->n_v_heads * L->v_dim;
	size_t a = sm70_dtype_size(be->act_dtype);
	const char *z = (const char *)w->gdn_proj + (size_t)L->conv_dim * a;
	const char *ba = z + (size_t)vd * a;

	block_matmul_in(m, r, w, w->gdn_proj, &G->in_proj, NULL);
	op->conv1d_silu(be, w->gdn_conv, w->gdn_proj, w->proj_ld, G->conv, &rk->state[l], L, b);
	op->gdn(be, w->gdn_core, w->gdn_conv, ba, w->proj_ld, G->a_log, G->dt_bias,
		&rk->state[l], L, b, !m->opts.gdn_recurrent);
	op->gated_rmsnorm(be, w->gdn_core, z, w->proj_ld, G->norm, T, L->n_v_heads, L->v_dim,
			  m->cfg.rms_norm_eps, m->cfg.hybrid.gdn.gate_sigmoid);
	op->matmul(be, w->delta, 0, w->gdn_core, &G->out, T);
}

/* Rank r's MLP of layer l: its (partial) down_proj output in w->delta. */
static void mlp_block(struct sm70_model *m, int r, int l, struct sm70__work *w)
{
	struct sm70_model_rank *rk = &m->rank[r];
	struct sm70_backend *be = rk->be;
	const struct sm70_backend_ops *op = be->ops;
	const struct sm70_mlp_weights *M = &sm70__layer_of(m, r, l)->mlp;
	int T = rk->batch.n_tokens;

	if (m->fused & SM70_FUSED_GLU) {
		block_matmul_in(m, r, w, w->gate_up, &M->gate_up, w->mid);
		op->matmul(be, w->delta, 0, w->mid, &M->down, T);
		return;
	}
	block_matmul_in(m, r, w, w->gate_up, &M->gate_up, NULL);
	/* the fused form re-reads W for every 16 rows: decode-sized steps only; it reads
	 * float weights only (backend.h: only matmul takes NVFP4) */
	if ((m->fused & SM70_FUSED_SILU) && op->silu_matmul && T <= 16 &&
	    M->down.dtype != SM70_DTYPE_NVFP4) {
		op->silu_matmul(be, w->delta, w->gate_up, &M->down, T);
	} else {
		op->silu_mul(be, w->mid, w->gate_up, T, rk->inter);
		op->matmul(be, w->delta, 0, w->mid, &M->down, T);
	}
}

/* Rank r's mixture of experts of layer l: router (+ shared gate) logits in f32, the
 * routing, the chosen experts' SwiGLU MLPs weighted and summed, and the shared expert
 * scaled by sigmoid of its gate; the (partial) sum in w->delta. */
static void moe_block(struct sm70_model *m, int r, int l, struct sm70__work *w)
{
	const struct sm70_moe_config *c = &m->cfg.moe;
	struct sm70_model_rank *rk = &m->rank[r];
	struct sm70_backend *be = rk->be;
	const struct sm70_backend_ops *op = be->ops;
	const struct sm70_moe_weights *E = &sm70__layer_of(m, r, l)->moe;
	int T = rk->batch.n_tokens, H = m->cfg.hidden_size;
	struct sm70_moe_route route = w->route;

	/* each layer keeps its count of distinct experts, for the bytes a step reads */
	route.n_used = w->moe_used + l;
	op->matmul(be, w->router, 1, w->y, &E->router, T);
	op->moe_route(be, &route, w->router, w->router_ld, T, c->n_experts, c->top_k,
		      c->renorm);
	op->moe_experts(be, w->delta, w->y, &E->gate_up, &E->down, &route, T, c->top_k,
			w->moe_mid, w->moe_part);
	if (!c->shared_inter)
		return;
	op->matmul(be, w->sh_gate_up, 0, w->y, &E->shared.gate_up, T);
	op->silu_mul(be, w->sh_mid, w->sh_gate_up, T, rk->shared_inter);
	op->matmul(be, w->sh_out, 0, w->sh_mid, &E->shared.down, T);
	op->sigmoid_scale_add(be, w->delta, w->sh_out, w->router + c->n_experts, w->router_ld, T,
			      H);
}

void sm70__ffn_block(struct sm70_model *m, int r, int l, struct sm70__work *w)
{
	if (m->cfg.layer_moe[l])
		moe_block(m, r, l, w);
	else
		mlp_block(m, r, l, w);
}

/* Rank r's head: the rows that need logits finish the last residual add, the final
 * norm and this rank's slice of the LM head. */
static void head_block(struct sm70_model *m, int r, struct sm70__work *w)
{
	const struct sm70_model_config *c = &m->cfg;
	struct sm70_model_rank *rk = &m->rank[r];
	struct sm70_backend *be = rk->be;
	const struct sm70_backend_ops *op = be->ops;
	const struct sm70_batch *b = &rk->batch;
	const struct sm70_decoder *d = rk->arch_state;
	int H = c->hidden_size;

	op->gather_rows(be, w->sel_resid, w->resid, b->out_rows, b->n_out, H, 1);
	op->gather_rows(be, w->sel_delta, w->delta, b->out_rows, b->n_out, H, 0);
	op->add_rmsnorm(be, w->sel_y, w->sel_resid, w->sel_delta, d->final_norm, b->n_out, H,
			c->rms_norm_eps);
	op->matmul(be, rk->logits, 1, w->sel_y, &d->lm_head, b->n_out);
}

/*
 * One step on every rank. The ranks run the same ops on their shares, queued rank by rank
 * (device backends run them concurrently), and meet at the two all-reduces per layer.
 */
void sm70__decoder_forward(struct sm70_model *m)
{
	struct sm70__work w[SM70_MAX_TP];
	int T = m->rank[0].batch.n_tokens;

	if (m->cfg.arch == SM70_ARCH_QWEN4_EXP) {
		sm70__hc_forward(m);
		return;
	}
	for (int r = 0; r < m->tp; r++) {
		struct sm70_model_rank *rk = &m->rank[r];
		const struct sm70_decoder *d = rk->arch_state;

		sm70__carve_work(m, r, &w[r]);
		rk->be->ops->embed(rk->be, w[r].resid, &d->embed, rk->batch.tok_ids, T);
	}
	for (int l = 0; l < m->cfg.n_layers; l++) {
		int gdn = m->cfg.layer_kind[l] == SM70_LAYER_GDN;

		for (int r = 0; r < m->tp; r++) {
			residual_in(m, r, &w[r], l == 0, sm70__layer_of(m, r, l)->mixer_norm, 1);
			if (gdn)
				sm70__gdn_block(m, r, l, &w[r]);
			else
				sm70__attention_block(m, r, l, &w[r]);
		}
		sm70__reduce_delta(m, w, T);
		for (int r = 0; r < m->tp; r++) {
			/* an MoE block reads its input in the router, the experts and the
			 * shared expert: never fused */
			residual_in(m, r, &w[r], 0, sm70__layer_of(m, r, l)->mlp_norm,
				    !m->cfg.layer_moe[l]);
			sm70__ffn_block(m, r, l, &w[r]);
		}
		sm70__reduce_delta(m, w, T);
	}
	if (m->rank[0].batch.n_out == 0)
		return;
	for (int r = 0; r < m->tp; r++)
		head_block(m, r, &w[r]);
}

/* ---- weights ------------------------------------------------------------------------ */

/* through sm70_weight_bytes: NVFP4 matrices are not rows * cols * an element size */
#define WBYTES(wt) sm70_weight_bytes(&(wt))

size_t sm70__decoder_weight_bytes(const struct sm70_model *m, int r)
{
	const struct sm70_decoder *d = m->rank[r].arch_state;
	size_t n = 0;

	for (int l = 0; l < d->n_layers; l++) {
		const struct sm70_layer_weights *L = &d->layers[l];
		n += WBYTES(L->attn.qkv) + WBYTES(L->attn.o) + WBYTES(L->gdn.in_proj) +
		     WBYTES(L->gdn.out) + WBYTES(L->mlp.gate_up) + WBYTES(L->mlp.down) +
		     WBYTES(L->moe.router) + WBYTES(L->moe.shared.gate_up) +
		     WBYTES(L->moe.shared.down) + WBYTES(L->hc_attn.mix) + WBYTES(L->hc_attn.up) +
		     WBYTES(L->hc_mlp.mix) + WBYTES(L->hc_mlp.up) + WBYTES(L->ple.key) +
		     WBYTES(L->ple.value);
		/* the experts a decode step reads are counted per step (sm70__expert_bytes) */
	}
	/* the PLE rows a step reads are host memory, not counted here */
	return n + WBYTES(d->hc_final.mix) + WBYTES(d->hc_final.up) + WBYTES(d->lm_head);
}

size_t sm70__decoder_expert_bytes(struct sm70_model *m, int r)
{
	const struct sm70_decoder *d = m->rank[r].arch_state;
	struct sm70_backend *be = m->rank[r].be;
	int32_t *used;
	struct sm70__work w;
	size_t n = 0;

	if (!m->cfg.moe.n_moe_layers)
		return 0;
	sm70__carve_work(m, r, &w);
	used = calloc((size_t)d->n_layers, sizeof(*used));
	if (!used || be->ops->download(be, used, w.moe_used, sizeof(*used) * d->n_layers) ||
	    be->ops->sync(be)) {
		free(used);
		return 0;
	}
	for (int l = 0; l < d->n_layers; l++) {
		const struct sm70_moe_weights *E = &d->layers[l].moe;
		size_t one = sm70_expert_bytes(&E->gate_up) + sm70_expert_bytes(&E->down);
		if (m->cfg.layer_moe[l] && used[l] > 0 && used[l] <= m->cfg.moe.n_experts)
			n += (size_t)used[l] * one;
	}
	free(used);
	return n;
}

struct sm70_decoder *sm70__decoder_new(int n_layers)
{
	struct sm70_decoder *d = calloc(1, sizeof(*d));

	if (!d)
		return NULL;
	d->layers = calloc((size_t)n_layers, sizeof(*d->layers));
	if (!d->layers) {
		free(d);
		return NULL;
	}
	d->n_layers = n_layers;
	return d;
}

void sm70__decoder_free(struct sm70_model *m, int r, void *state)
{
	struct sm70_decoder *d = state;
	struct sm70_backend *be = m->rank[r].be;

	if (!d)
		return;
	for (int l = 0; l < d->n_layers; l++) {
		struct sm70_layer_weights *L = &d->layers[l];
		void *vecs[] = { L->mixer_norm, L->mlp_norm, L->attn.q_norm, L->attn.k_norm,
				 L->attn.idx_q_norm, L->attn.idx_k_norm, L->gdn.conv, L->gdn.a_log,
				 L->gdn.dt_bias, L->gdn.norm, L->hc_attn.norm, L->hc_mlp.norm,
				 L->ple.norm_key, L->ple.norm_query, L->ple.norm_conv, L->ple.conv,
				 (void *)L->ple.hash.mult, (void *)L->ple.hash.size,
				 (void *)L->ple.hash.offset };
		struct sm70_weight *mats[] = { &L->attn.qkv, &L->attn.o, &L->gdn.in_proj,
					       &L->gdn.out, &L->mlp.gate_up, &L->mlp.down,
					       &L->moe.router, &L->moe.shared.gate_up,
					       &L->moe.shared.down, &L->hc_attn.mix, &L->hc_attn.up,
					       &L->hc_mlp.mix, &L->hc_mlp.up, &L->ple.key,
					       &L->ple.value };

		for (size_t i = 0; i < sizeof(vecs) / sizeof(vecs[0]); i++)
			if (vecs[i])
				be->ops->buf_free(be, vecs[i]);
		for (size_t i = 0; i < sizeof(mats) / sizeof(mats[0]); i++)
			sm70__weight_free(m, r, mats[i]);
		sm70__experts_free(m, r, &L->moe.gate_up);
		sm70__experts_free(m, r, &L->moe.down);
	}
	free(d->layers);
	if (d->hc_final.norm)
		be->ops->buf_free(be, d->hc_final.norm);
	sm70__weight_free(m, r, &d->hc_final.mix);
	sm70__weight_free(m, r, &d->hc_final.up);
	if (d->hc_rep)
		be->ops->buf_free(be, d->hc_rep);
	if (!d->tied)
		sm70__weight_free(m, r, &d->lm_head);
	sm70__weight_free(m, r, &d->embed);
	if (d->final_norm)
		be->ops->buf_free(be, d->final_norm);
	free(d);
}

const char *sm70__layer_prefix(char *buf, size_t n, const char *prefix, int l)
{
	snprintf(buf, n, "%slayers.%d.", prefix, l);
	return buf;
}

/* "<p><suffix>" into buf. */
static const char *name(char *buf, size_t n, const char *p, const char *suffix)
{
	snprintf(buf, n, "%s%s", p, suffix);
	return buf;
}

int sm70__load_decoder(struct sm70_model *m, int r, const struct sm70_ckpt *ck,
		       sm70__mixer_load_fn load_mixer, void **state, struct sm70_err *err)
{
	const struct sm70_model_config *c = &m->cfg;
	struct sm70_decoder *d = sm70__decoder_new(c->n_layers);
	char p[96], n[160];
	int ret;

	if (!d)
		return -ENOMEM;
	/* checkpoint.c maps model.language_model.* (the VL layouts) to model.* */
	ret = sm70__load_embed_head(m, r, ck, d, "model.", 1, err);
	for (int l = 0; !ret && l < c->n_layers; l++) {
		struct sm70_layer_weights *L = &d->layers[l];

		sm70__layer_prefix(p, sizeof(p), "model.", l);
		ret = sm70__norm_load(m, r, ck, &L->mixer_norm,
				      name(n, sizeof(n), p, "input_layernorm.weight"),
				      c->hidden_size, err);
		if (!ret)
			ret = sm70__norm_load(m, r, ck, &L->mlp_norm,
					      name(n, sizeof(n), p, "post_attention_layernorm.weight"),
					      c->hidden_size, err);
		if (!ret)
			ret = load_mixer(m, r, ck, p, l, L, err);
		if (!ret)
			ret = sm70__load_ffn(m, r, ck, p, l, L, err);
	}
	if (ret) {
		sm70__decoder_free(m, r, d);
		return ret;
	}
	*state = d;
	return 0;
}

int sm70__load_embed_head(struct sm70_model *m, int r, const struct sm70_ckpt *ck,
			  struct sm70_decoder *d, const char *prefix, int final_norm,
			  struct sm70_err *err)
{
	const struct sm70_model_config *c = &m->cfg;
	const struct sm70_model_rank *rk = &m->rank[r];
	int H = c->hidden_size, V = c->vocab_size;
	char n_embed[128], n_norm[128];
	int ret;

	name(n_embed, sizeof(n_embed), prefix, "embed_tokens.weight");
	{
		/* replicated: every rank embeds every token */
		struct sm70_weight_part p[1] = { { n_embed, V, 0, V } };
		ret = sm70__weight_load(m, r, ck, &d->embed, p, 1, H, 0, H, err);
		if (ret)
			return ret;
		/* the embed op reads whole rows of a float table (so does a tied head's view) */
		if (d->embed.dtype == SM70_DTYPE_NVFP4)
			return sm70_errf(err, -ENOTSUP, "%s is stored as NVFP4: sm70 reads the "
					 "embedding as f32, f16 or bf16 only", n_embed);
	}
	/* A checkpoint that says "tied" but still stores lm_head.weight: use what it stores,
	 * as transformers would after loading. */
	d->tied = c->tie_word_embeddings && (m->opts.dummy || !sm70_ckpt_find(ck, "lm_head.weight"));
	if (d->tied) {
		/* this rank's vocabulary rows of the embedding, without a copy */
		d->lm_head = d->embed;
		d->lm_head.rows = rk->vocab_n;
		d->lm_head.data = (char *)d->embed.data +
				  (size_t)rk->vocab0 * H * sm70_dtype_size(d->embed.dtype);
	} else {
		struct sm70_weight_part p[1] = { { "lm_head.weight", V, rk->vocab0, rk->vocab_n } };
		ret = sm70__weight_load(m, r, ck, &d->lm_head, p, 1, H, 0, H, err);
		if (ret)
			return ret;
	}
	if (!final_norm)
		return 0;
	return sm70__norm_load(m, r, ck, &d->final_norm, name(n_norm, sizeof(n_norm), prefix,
							      "norm.weight"), H, err);
}

/* A SwiGLU MLP named <p><mlp>{gate,up,down}_proj.weight of intermediate size I, rank r
 * holding rows [r * ri, (r+1) * ri) of gate and up and those columns of down. */
static int load_swiglu(struct sm70_model *m, int r, const struct sm70_ckpt *ck, const char *p,
		       const char *mlp, int I, int ri, struct sm70_mlp_weights *w,
		       struct sm70_err *err)
{
	int H = m->cfg.hidden_size;
	char ng[192], nu[192], nd[192];
	int ret;

	snprintf(ng, sizeof(ng), "%s%sgate_proj.weight", p, mlp);
	snprintf(nu, sizeof(nu), "%s%sup_proj.weight", p, mlp);
	snprintf(nd, sizeof(nd), "%s%sdown_proj.weight", p, mlp);
	{
		struct sm70_weight_part parts[2] = {
			{ ng, I, r * ri, ri },
			{ nu, I, r * ri, ri },
		};
		ret = sm70__weight_load(m, r, ck, &w->gate_up, parts, 2, H, 0, H, err);
		if (ret)
			return ret;
	}
	{
		struct sm70_weight_part parts[1] = { { nd, H, 0, H } };
		return sm70__weight_load(m, r, ck, &w->down, parts, 1, I, r * ri, ri, err);
	}
}

int sm70__load_mlp(struct sm70_model *m, int r, const struct sm70_ckpt *ck, const char *p,
		   struct sm70_mlp_weights *w, struct sm70_err *err)
{
	return load_swiglu(m, r, ck, p, "mlp.", m->cfg.intermediate_size, m->rank[r].inter, w,
			   err);
}

static int load_moe(struct sm70_model *m, int r, const struct sm70_ckpt *ck, const char *p,
		    struct sm70_moe_weights *w, struct sm70_err *err)
{
	const struct sm70_moe_config *c = &m->cfg.moe;
	const struct sm70_model_rank *rk = &m->rank[r];
	int H = m->cfg.hidden_size, ret;
	char nr[192], ng[192];

	/* replicated: every rank routes every token, identically */
	snprintf(nr, sizeof(nr), "%smlp.gate.weight", p);
	snprintf(ng, sizeof(ng), "%smlp.shared_expert_gate.weight", p);
	{
		struct sm70_weight_part parts[2] = { { nr, c->n_experts, 0, c->n_experts },
						     { ng, 1, 0, 1 } };
		ret = sm70__weight_load(m, r, ck, &w->router, parts, c->shared_inter ? 2 : 1, H, 0,
					H, err);
		if (ret)
			return ret;
	}
	ret = sm70__load_experts(m, r, ck, p, c->n_experts, c->inter, r * rk->moe_inter,
				 rk->moe_inter, H, &w->gate_up, &w->down, err);
	if (ret || !c->shared_inter)
		return ret;
	return load_swiglu(m, r, ck, p, "mlp.shared_expert.", c->shared_inter, rk->shared_inter,
			   &w->shared, err);
}

int sm70__load_ffn(struct sm70_model *m, int r, const struct sm70_ckpt *ck, const char *p,
		   int l, struct sm70_layer_weights *w, struct sm70_err *err)
{
	return m->cfg.layer_moe[l] ? load_moe(m, r, ck, p, &w->moe, err) :
				     sm70__load_mlp(m, r, ck, p, &w->mlp, err);
}

int sm70__load_attention(struct sm70_model *m, int r, const struct sm70_ckpt *ck,
			 const char *p, struct sm70_attn_weights *w, struct sm70_err *err)
{
	const struct sm70_model_config *c = &m->cfg;
	const struct sm70_model_rank *rk = &m->rank[r];
	int D = c->head_dim, H = c->hidden_size, Hq = rk->q_heads, g = c->attn_gate;
	char nq[160], nk[160], nv[160], no[160], nqn[160], nkn[160], ni[160];
	struct sm70_weight_part *parts;
	int n = 0, ret;

	name(nq, sizeof(nq), p, "self_attn.q_proj.weight");
	name(nk, sizeof(nk), p, "self_attn.k_proj.weight");
	name(nv, sizeof(nv), p, "self_attn.v_proj.weight");
	name(no, sizeof(no), p, "self_attn.o_proj.weight");
	name(nqn, sizeof(nqn), p, "self_attn.q_norm.weight");
	name(nkn, sizeof(nkn), p, "self_attn.k_norm.weight");
	if ((ret = sm70__norm_load(m, r, ck, &w->q_norm, nqn, D, err)) ||
	    (ret = sm70__norm_load(m, r, ck, &w->k_norm, nkn, D, err)))
		return ret;

	/* column-parallel: this rank's query heads and the KV heads they read. A gated
	 * q_proj holds [query, gate] per head (2D rows each): the queries are gathered
	 * first and the gates moved behind v, so q | k | v stay contiguous for the cache
	 * and the gate is one more band of the same matmul. */
	parts = calloc((size_t)(2 * Hq + 3), sizeof(*parts));
	if (!parts)
		return -ENOMEM;
	if (g) {
		for (int h = 0; h < Hq; h++)
			parts[n++] = (struct sm70_weight_part){ nq, 2 * c->n_heads * D,
								(rk->q_head0 + h) * 2 * D, D };
	} else {
		parts[n++] = (struct sm70_weight_part){ nq, c->n_heads * D, rk->q_head0 * D,
							Hq * D };
	}
	parts[n++] = (struct sm70_weight_part){ nk, c->n_kv_heads * D, rk->kv_head0 * D,
						rk->kv_heads * D };
	parts[n++] = (struct sm70_weight_part){ nv, c->n_kv_heads * D, rk->kv_head0 * D,
						rk->kv_heads * D };
	for (int h = 0; g && h < Hq; h++)
		parts[n++] = (struct sm70_weight_part){ nq, 2 * c->n_heads * D,
							(rk->q_head0 + h) * 2 * D + D, D };
	if (c->arch == SM70_ARCH_QWEN4_EXP) {
		/* QSA: the indexer's queries and key, whole on every rank */
		int rows = (c->q4.idx_heads + 1) * c->q4.idx_dim;

		name(ni, sizeof(ni), p, "self_attn.indexer.index_qk_proj.weight");
		parts[n++] = (struct sm70_weight_part){ ni, rows, 0, rows };
		if ((ret = sm70__norm_load(m, r, ck, &w->idx_q_norm,
					   name(nqn, sizeof(nqn), p,
						"self_attn.indexer.q_layernorm.weight"),
					   c->q4.idx_dim, err)) ||
		    (ret = sm70__norm_load(m, r, ck, &w->idx_k_norm,
					   name(nkn, sizeof(nkn), p,
						"self_attn.indexer.k_layernorm.weight"),
					   c->q4.idx_dim, err))) {
			free(parts);
			return ret;
		}
	}
	ret = sm70__weight_load(m, r, ck, &w->qkv, parts, n, H, 0, H, err);
	free(parts);
	if (ret)
		return ret;
	{
		/* row-parallel: the columns that read this rank's heads */
		struct sm70_weight_part po[1] = { { no, H, 0, H } };
		return sm70__weight_load(m, r, ck, &w->o, po, 1, c->n_heads * D,
					 rk->q_head0 * D, Hq * D, err);
	}
}
