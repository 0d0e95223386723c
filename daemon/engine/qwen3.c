/*
 * qwen3.c - the dense Qwen3 architecture (see ARCHITECTURES.md): weights and one
 * forward step over a flattened batch of prefill chunks and decodes.
 *
 * Per layer: x = norm1(h); q|k|v = x Wqkv^T (one stacked matmul); per-head RMSNorm of q
 * and k, RoPE; k, v into the paged cache; causal attention; h += o_proj;
 * x = norm2(h); h += down(silu(gate(x)) * up(x)) with gate|up stacked. The last hidden
 * state of the rows that need logits goes through the final norm and the LM head.
 *
 * Tensor parallelism (Megatron-style): q/k/v and gate/up are split by output rows
 * (heads, intermediate rows), o_proj and down_proj by input columns, so each rank's
 * o_proj and down_proj give a partial sum of h's update that one all-reduce completes;
 * the LM head is split by vocabulary rows and sampling merges the slices
 * (sampler_tp.h). The residual stream is replicated and stays identical on every rank.
 *
 * Non-goals: sliding-window attention, rope scaling.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "daemon/engine/model.h"

struct qwen3_layer {
	float *attn_norm, *mlp_norm, *q_norm, *k_norm;
	struct sm70_weight qkv, o, gate_up, down;
};

struct qwen3 {
	struct sm70_weight embed;
	struct sm70_weight lm_head; /* aliases embed when tied */
	int tied;
	float *final_norm;
	struct qwen3_layer *layers;
	int n_layers;
};

/* The workspace of one rank, carved out of its work buffer in this order. */
struct qwen3_work {
	float *resid;
	void *y, *qkv, *attn, *delta, *gate_up, *mid;
	float *sel_resid;
	void *sel_delta, *sel_y;
};

static size_t align64(size_t n)
{
	return (n + 63) & ~(size_t)63;
}

static size_t carve(const struct sm70_model *m, int r, struct qwen3_work *w)
{
	const struct sm70_model_config *c = &m->cfg;
	const struct sm70_model_rank *rk = &m->rank[r];
	size_t a = sm70_dtype_size(rk->be->act_dtype);
	size_t t = (size_t)m->opts.max_tokens, s = (size_t)m->opts.max_seqs;
	size_t qkv = (size_t)(rk->q_heads + 2 * rk->kv_heads) * c->head_dim;
	size_t sizes[10] = {
		t * c->hidden_size * sizeof(float),
		t * c->hidden_size * a,
		t * qkv * a,
		t * (size_t)rk->q_heads * c->head_dim * a,
		t * c->hidden_size * a,
		t * 2 * (size_t)rk->inter * a,
		t * (size_t)rk->inter * a,
		s * c->hidden_size * sizeof(float),
		s * c->hidden_size * a,
		s * c->hidden_size * a,
	};
	void **slots[10] = {
		(void **)&w->resid, &w->y, &w->qkv, &w->attn, &w->delta, &w->gate_up, &w->mid,
		(void **)&w->sel_resid, &w->sel_delta, &w->sel_y,
	};
	char *base = rk->work;
	size_t off = 0;

	for (int i = 0; i < 10; i++) {
		if (slots[i])
			*slots[i] = base ? base + off : NULL;
		off += align64(sizes[i]);
	}
	return off;
}

static size_t qwen3_workspace_bytes(const struct sm70_model *m, int r)
{
	struct qwen3_work w;

	return carve(m, r, &w);
}

/* Rank r's share of layer l (struct sm70_model_rank says which share). */
static int load_layer(struct sm70_model *m, int r, const struct sm70_ckpt *ck, int l,
		      struct qwen3_layer *L, struct sm70_err *err)
{
	const struct sm70_model_config *c = &m->cfg;
	const struct sm70_model_rank *rk = &m->rank[r];
	int D = c->head_dim, H = c->hidden_size, I = c->intermediate_size;
	char n[8][96];
	int ret;

#define NAME(i, fmt) snprintf(n[i], sizeof(n[i]), "model.layers.%d." fmt, l)
	NAME(0, "input_layernorm.weight");
	NAME(1, "post_attention_layernorm.weight");
	NAME(2, "self_attn.q_norm.weight");
	NAME(3, "self_attn.k_norm.weight");
	if ((ret = sm70__norm_load(m, r, ck, &L->attn_norm, n[0], H, err)) ||
	    (ret = sm70__norm_load(m, r, ck, &L->mlp_norm, n[1], H, err)) ||
	    (ret = sm70__norm_load(m, r, ck, &L->q_norm, n[2], D, err)) ||
	    (ret = sm70__norm_load(m, r, ck, &L->k_norm, n[3], D, err)))
		return ret;

	NAME(0, "self_attn.q_proj.weight");
	NAME(1, "self_attn.k_proj.weight");
	NAME(2, "self_attn.v_proj.weight");
	NAME(3, "self_attn.o_proj.weight");
	NAME(4, "mlp.gate_proj.weight");
	NAME(5, "mlp.up_proj.weight");
	NAME(6, "mlp.down_proj.weight");
#undef NAME
	{
		/* column-parallel: this rank's query heads and the KV heads they read */
		struct sm70_weight_part p[3] = {
			{ n[0], c->n_heads * D, rk->q_head0 * D, rk->q_heads * D },
			{ n[1], c->n_kv_heads * D, rk->kv_head0 * D, rk->kv_heads * D },
			{ n[2], c->n_kv_heads * D, rk->kv_head0 * D, rk->kv_heads * D },
		};
		ret = sm70__weight_load(m, r, ck, &L->qkv, p, 3, H, 0, H, err);
		if (ret)
			return ret;
	}
	{
		/* row-parallel: the columns that read this rank's heads */
		struct sm70_weight_part p[1] = { { n[3], H, 0, H } };
		ret = sm70__weight_load(m, r, ck, &L->o, p, 1, c->n_heads * D, rk->q_head0 * D,
					rk->q_heads * D, err);
		if (ret)
			return ret;
	}
	{
		struct sm70_weight_part p[2] = {
			{ n[4], I, r * rk->inter, rk->inter },
			{ n[5], I, r * rk->inter, rk->inter },
		};
		ret = sm70__weight_load(m, r, ck, &L->gate_up, p, 2, H, 0, H, err);
		if (ret)
			return ret;
	}
	{
		struct sm70_weight_part p[1] = { { n[6], H, 0, H } };
		ret = sm70__weight_load(m, r, ck, &L->down, p, 1, I, r * rk->inter, rk->inter,
					err);
	}
	return ret;
}

static void qwen3_unload(struct sm70_model *m, int r, void *state)
{
	struct qwen3 *q = state;
	struct sm70_backend *be = m->rank[r].be;

	if (!q)
		return;
	for (int l = 0; l < q->n_layers; l++) {
		struct qwen3_layer *L = &q->layers[l];
		be->ops->buf_free(be, L->attn_norm);
		be->ops->buf_free(be, L->mlp_norm);
		be->ops->buf_free(be, L->q_norm);
		be->ops->buf_free(be, L->k_norm);
		sm70__weight_free(m, r, &L->qkv);
		sm70__weight_free(m, r, &L->o);
		sm70__weight_free(m, r, &L->gate_up);
		sm70__weight_free(m, r, &L->down);
	}
	free(q->layers);
	if (!q->tied)
		sm70__weight_free(m, r, &q->lm_head);
	sm70__weight_free(m, r, &q->embed);
	be->ops->buf_free(be, q->final_norm);
	free(q);
}

static int qwen3_load(struct sm70_model *m, int r, const struct sm70_ckpt *ck, void **state,
		      struct sm70_err *err)
{
	const struct sm70_model_config *c = &m->cfg;
	const struct sm70_model_rank *rk = &m->rank[r];
	int H = c->hidden_size, V = c->vocab_size;
	struct qwen3 *q;
	int ret;

	q = calloc(1, sizeof(*q));
	if (!q)
		return -ENOMEM;
	q->layers = calloc((size_t)c->n_layers, sizeof(*q->layers));
	if (!q->layers) {
		free(q);
		return -ENOMEM;
	}
	q->n_layers = c->n_layers;
	{
		/* replicated: every rank embeds every token */
		struct sm70_weight_part p[1] = { { "model.embed_tokens.weight", V, 0, V } };
		ret = sm70__weight_load(m, r, ck, &q->embed, p, 1, H, 0, H, err);
		if (ret)
			goto fail;
	}
	/* A checkpoint that says "tied" but still stores lm_head.weight: use what it stores,
	 * as transformers would after loading. */
	q->tied = c->tie_word_embeddings && (m->opts.dummy || !sm70_ckpt_find(ck, "lm_head.weight"));
	if (q->tied) {
		/* this rank's vocabulary rows of the embedding, without a copy */
		q->lm_head = q->embed;
		q->lm_head.rows = rk->vocab_n;
		q->lm_head.data = (char *)q->embed.data +
				  (size_t)rk->vocab0 * H * sm70_dtype_size(q->embed.dtype);
	} else {
		struct sm70_weight_part p[1] = { { "lm_head.weight", V, rk->vocab0, rk->vocab_n } };
		ret = sm70__weight_load(m, r, ck, &q->lm_head, p, 1, H, 0, H, err);
		if (ret)
			goto fail;
	}
	ret = sm70__norm_load(m, r, ck, &q->final_norm, "model.norm.weight", H, err);
	if (ret)
		goto fail;
	for (int l = 0; l < c->n_layers; l++) {
		ret = load_layer(m, r, ck, l, &q->layers[l], err);
		if (ret)
			goto fail;
	}
	*state = q;
	return 0;
fail:
	qwen3_unload(m, r, q);
	return ret;
}

/* Sums the ranks' partial deltas (row-parallel outputs) so every rank holds the total. */
static void reduce_delta(struct sm70_model *m, struct qwen3_work *w, int T)
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

/* Rank r's attention block of layer l up to its (partial) o_proj output in w->delta. */
static void attention_block(struct sm70_model *m, int r, int l, struct qwen3_work *w)
{
	const struct sm70_model_config *c = &m->cfg;
	struct sm70_model_rank *rk = &m->rank[r];
	struct sm70_backend *be = rk->be;
	const struct sm70_backend_ops *op = be->ops;
	const struct sm70_batch *b = &rk->batch;
	const struct qwen3_layer *L = &((struct qwen3 *)rk->arch_state)->layers[l];
	int T = b->n_tokens, D = c->head_dim, Hq = rk->q_heads, Hk = rk->kv_heads;
	int qkv_ld = (Hq + 2 * Hk) * D;
	size_t a = sm70_dtype_size(be->act_dtype);
	char *k_in = (char *)w->qkv + (size_t)Hq * D * a;
	char *v_in = k_in + (size_t)Hk * D * a;

	op->add_rmsnorm(be, w->y, w->resid, l ? w->delta : NULL, L->attn_norm, T,
			c->hidden_size, c->rms_norm_eps);
	op->matmul(be, w->qkv, 0, w->y, &L->qkv, T);
	if ((m->fused & SM70_FUSED_QK) && op->qk_norm_rope_kv) {
		op->qk_norm_rope_kv(be, w->qkv, qkv_ld, T, Hq, Hk, D, L->q_norm, L->k_norm,
				    c->rms_norm_eps, b->tok_pos, c->rot_dim, c->rope_theta,
				    &rk->kv[l], &m->kv_lay, b->tok_slot);
	} else {
		op->head_norm_rope(be, w->qkv, qkv_ld, T, Hq, D, L->q_norm, c->rms_norm_eps,
				   b->tok_pos, c->rot_dim, c->rope_theta);
		op->head_norm_rope(be, k_in, qkv_ld, T, Hk, D, L->k_norm, c->rms_norm_eps,
				   b->tok_pos, c->rot_dim, c->rope_theta);
		op->kv_write(be, &rk->kv[l], &m->kv_lay, k_in, v_in, qkv_ld, b->tok_slot, T);
	}
	op->attention(be, w->attn, w->qkv, qkv_ld, &rk->kv[l], &m->kv_lay, b, Hq,
		      1.0f / sqrtf((float)D));
	op->matmul(be, w->delta, 0, w->attn, &L->o, T);
}

/* Rank r's MLP block of layer l: its (partial) down_proj output in w->delta. */
static void mlp_block(struct sm70_model *m, int r, int l, struct qwen3_work *w)
{
	const struct sm70_model_config *c = &m->cfg;
	struct sm70_model_rank *rk = &m->rank[r];
	struct sm70_backend *be = rk->be;
	const struct sm70_backend_ops *op = be->ops;
	const struct qwen3_layer *L = &((struct qwen3 *)rk->arch_state)->layers[l];
	int T = rk->batch.n_tokens;

	op->add_rmsnorm(be, w->y, w->resid, w->delta, L->mlp_norm, T, c->hidden_size,
			c->rms_norm_eps);
	op->matmul(be, w->gate_up, 0, w->y, &L->gate_up, T);
	/* the fused form re-reads W for every 16 rows: decode-sized steps only */
	if ((m->fused & SM70_FUSED_SILU) && op->silu_matmul && T <= 16) {
		op->silu_matmul(be, w->delta, w->gate_up, &L->down, T);
	} else {
		op->silu_mul(be, w->mid, w->gate_up, T, rk->inter);
		op->matmul(be, w->delta, 0, w->mid, &L->down, T);
	}
}

/* Rank r's head: the rows that need logits finish the last residual add, the final
 * norm and this rank's slice of the LM head. */
static void head_block(struct sm70_model *m, int r, struct qwen3_work *w)
{
	const struct sm70_model_config *c = &m->cfg;
	struct sm70_model_rank *rk = &m->rank[r];
	struct sm70_backend *be = rk->be;
	const struct sm70_backend_ops *op = be->ops;
	const struct sm70_batch *b = &rk->batch;
	struct qwen3 *q = rk->arch_state;
	int H = c->hidden_size;

	op->gather_rows(be, w->sel_resid, w->resid, b->out_rows, b->n_out, H, 1);
	op->gather_rows(be, w->sel_delta, w->delta, b->out_rows, b->n_out, H, 0);
	op->add_rmsnorm(be, w->sel_y, w->sel_resid, w->sel_delta, q->final_norm, b->n_out, H,
			c->rms_norm_eps);
	op->matmul(be, rk->logits, 1, w->sel_y, &q->lm_head, b->n_out);
}

/*
 * One step on every rank. The ranks run the same ops on their shares, queued rank by rank
 * (device backends run them concurrently), and meet at the two all-reduces per layer.
 */
static void qwen3_forward(struct sm70_model *m)
{
	struct qwen3_work w[SM70_MAX_TP];
	int T = m->rank[0].batch.n_tokens;

	for (int r = 0; r < m->tp; r++) {
		struct sm70_model_rank *rk = &m->rank[r];
		carve(m, r, &w[r]);
		rk->be->ops->embed(rk->be, w[r].resid, &((struct qwen3 *)rk->arch_state)->embed,
				   rk->batch.tok_ids, T);
	}
	for (int l = 0; l < m->cfg.n_layers; l++) {
		for (int r = 0; r < m->tp; r++)
			attention_block(m, r, l, &w[r]);
		reduce_delta(m, w, T);
		for (int r = 0; r < m->tp; r++)
			mlp_block(m, r, l, &w[r]);
		reduce_delta(m, w, T);
	}
	if (m->rank[0].batch.n_out == 0)
		return;
	for (int r = 0; r < m->tp; r++)
		head_block(m, r, &w[r]);
}

static size_t qwen3_weight_bytes(const struct sm70_model *m, int r)
{
	const struct qwen3 *q = m->rank[r].arch_state;
	size_t n = 0;

#define WB(wt) ((size_t)(wt).rows * (wt).cols * sm70_dtype_size((wt).dtype))
	for (int l = 0; l < q->n_layers; l++)
		n += WB(q->layers[l].qkv) + WB(q->layers[l].o) + WB(q->layers[l].gate_up) +
		     WB(q->layers[l].down);
	n += WB(q->lm_head);
#undef WB
	return n;
}

const struct sm70_arch_ops sm70__arch_qwen3 = {
	.name = "qwen3",
	.load = qwen3_load,
	.unload = qwen3_unload,
	.workspace_bytes = qwen3_workspace_bytes,
	.forward = qwen3_forward,
	.weight_bytes = qwen3_weight_bytes,
};
