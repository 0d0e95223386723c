/*
 * qwen3.c - the dense Qwen3 architecture (see ARCHITECTURES.md): weights and one
 * forward step over a flattened batch of prefill chunks and decodes.
 *
 * Per layer: x = norm1(h); q|k|v = x Wqkv^T (one stacked matmul); per-head RMSNorm of q
 * and k, RoPE; k, v into the paged cache; causal attention; h += o_proj;
 * x = norm2(h); h += down(silu(gate(x)) * up(x)) with gate|up stacked. The last hidden
 * state of the rows that need logits goes through the final norm and the LM head.
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

/* The workspace, carved out of m->work in this order. */
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

static size_t carve(const struct sm70_model *m, struct qwen3_work *w)
{
	const struct sm70_model_config *c = &m->cfg;
	size_t a = sm70_dtype_size(m->be->act_dtype);
	size_t t = (size_t)m->opts.max_tokens, s = (size_t)m->opts.max_seqs;
	size_t qkv = (size_t)(c->n_heads + 2 * c->n_kv_heads) * c->head_dim;
	size_t sizes[10] = {
		t * c->hidden_size * sizeof(float),
		t * c->hidden_size * a,
		t * qkv * a,
		t * (size_t)c->n_heads * c->head_dim * a,
		t * c->hidden_size * a,
		t * 2 * (size_t)c->intermediate_size * a,
		t * (size_t)c->intermediate_size * a,
		s * c->hidden_size * sizeof(float),
		s * c->hidden_size * a,
		s * c->hidden_size * a,
	};
	void **slots[10] = {
		(void **)&w->resid, &w->y, &w->qkv, &w->attn, &w->delta, &w->gate_up, &w->mid,
		(void **)&w->sel_resid, &w->sel_delta, &w->sel_y,
	};
	char *base = m->work;
	size_t off = 0;

	for (int i = 0; i < 10; i++) {
		if (slots[i])
			*slots[i] = base ? base + off : NULL;
		off += align64(sizes[i]);
	}
	return off;
}

static size_t qwen3_workspace_bytes(const struct sm70_model *m)
{
	struct qwen3_work w;

	return carve(m, &w);
}

static int load_layer(struct sm70_model *m, const struct sm70_ckpt *ck, int l,
		      struct qwen3_layer *L, struct sm70_err *err)
{
	const struct sm70_model_config *c = &m->cfg;
	char n[8][96];
	int ret;
	int q = c->n_heads * c->head_dim, kv = c->n_kv_heads * c->head_dim;

#define NAME(i, fmt) snprintf(n[i], sizeof(n[i]), "model.layers.%d." fmt, l)
	NAME(0, "input_layernorm.weight");
	NAME(1, "post_attention_layernorm.weight");
	NAME(2, "self_attn.q_norm.weight");
	NAME(3, "self_attn.k_norm.weight");
	if ((ret = sm70__norm_load(m, ck, &L->attn_norm, n[0], c->hidden_size, err)) ||
	    (ret = sm70__norm_load(m, ck, &L->mlp_norm, n[1], c->hidden_size, err)) ||
	    (ret = sm70__norm_load(m, ck, &L->q_norm, n[2], c->head_dim, err)) ||
	    (ret = sm70__norm_load(m, ck, &L->k_norm, n[3], c->head_dim, err)))
		return ret;

	NAME(0, "self_attn.q_proj.weight");
	NAME(1, "self_attn.k_proj.weight");
	NAME(2, "self_attn.v_proj.weight");
	{
		const char *names[3] = { n[0], n[1], n[2] };
		int rows[3] = { q, kv, kv };
		ret = sm70__weight_load(m, ck, &L->qkv, names, rows, 3, c->hidden_size, err);
		if (ret)
			return ret;
	}
	NAME(3, "self_attn.o_proj.weight");
	{
		const char *names[1] = { n[3] };
		int rows[1] = { c->hidden_size };
		ret = sm70__weight_load(m, ck, &L->o, names, rows, 1, q, err);
		if (ret)
			return ret;
	}
	NAME(4, "mlp.gate_proj.weight");
	NAME(5, "mlp.up_proj.weight");
	{
		const char *names[2] = { n[4], n[5] };
		int rows[2] = { c->intermediate_size, c->intermediate_size };
		ret = sm70__weight_load(m, ck, &L->gate_up, names, rows, 2, c->hidden_size, err);
		if (ret)
			return ret;
	}
	NAME(6, "mlp.down_proj.weight");
	{
		const char *names[1] = { n[6] };
		int rows[1] = { c->hidden_size };
		ret = sm70__weight_load(m, ck, &L->down, names, rows, 1, c->intermediate_size,
					err);
	}
#undef NAME
	return ret;
}

static void qwen3_unload(struct sm70_model *m, void *state)
{
	struct qwen3 *q = state;
	struct sm70_backend *be = m->be;

	if (!q)
		return;
	for (int l = 0; l < q->n_layers; l++) {
		struct qwen3_layer *L = &q->layers[l];
		be->ops->buf_free(be, L->attn_norm);
		be->ops->buf_free(be, L->mlp_norm);
		be->ops->buf_free(be, L->q_norm);
		be->ops->buf_free(be, L->k_norm);
		sm70__weight_free(m, &L->qkv);
		sm70__weight_free(m, &L->o);
		sm70__weight_free(m, &L->gate_up);
		sm70__weight_free(m, &L->down);
	}
	free(q->layers);
	if (!q->tied)
		sm70__weight_free(m, &q->lm_head);
	sm70__weight_free(m, &q->embed);
	be->ops->buf_free(be, q->final_norm);
	free(q);
}

static int qwen3_load(struct sm70_model *m, const struct sm70_ckpt *ck, void **state,
		      struct sm70_err *err)
{
	const struct sm70_model_config *c = &m->cfg;
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
		const char *names[1] = { "model.embed_tokens.weight" };
		int rows[1] = { c->vocab_size };
		ret = sm70__weight_load(m, ck, &q->embed, names, rows, 1, c->hidden_size, err);
		if (ret)
			goto fail;
	}
	/* A checkpoint that says "tied" but still stores lm_head.weight: use what it stores,
	 * as transformers would after loading. */
	q->tied = c->tie_word_embeddings && (m->opts.dummy || !sm70_ckpt_find(ck, "lm_head.weight"));
	if (q->tied) {
		q->lm_head = q->embed;
	} else {
		const char *names[1] = { "lm_head.weight" };
		int rows[1] = { c->vocab_size };
		ret = sm70__weight_load(m, ck, &q->lm_head, names, rows, 1, c->hidden_size, err);
		if (ret)
			goto fail;
	}
	ret = sm70__norm_load(m, ck, &q->final_norm, "model.norm.weight", c->hidden_size, err);
	if (ret)
		goto fail;
	for (int l = 0; l < c->n_layers; l++) {
		ret = load_layer(m, ck, l, &q->layers[l], err);
		if (ret)
			goto fail;
	}
	*state = q;
	return 0;
fail:
	qwen3_unload(m, q);
	return ret;
}

static void qwen3_forward(struct sm70_model *m, void *state)
{
	const struct sm70_model_config *c = &m->cfg;
	const struct sm70_backend_ops *op = m->be->ops;
	struct sm70_backend *be = m->be;
	const struct sm70_batch *b = &m->batch;
	struct qwen3 *q = state;
	struct qwen3_work w;
	int T = b->n_tokens, D = c->head_dim, H = c->hidden_size;
	int qkv_ld = (c->n_heads + 2 * c->n_kv_heads) * D;
	size_t a = sm70_dtype_size(be->act_dtype);
	char *k_in, *v_in;
	float scale = 1.0f / sqrtf((float)D);

	carve(m, &w);
	k_in = (char *)w.qkv + (size_t)c->n_heads * D * a;
	v_in = k_in + (size_t)c->n_kv_heads * D * a;

	op->embed(be, w.resid, &q->embed, b->tok_ids, T);
	for (int l = 0; l < c->n_layers; l++) {
		const struct qwen3_layer *L = &q->layers[l];

		op->add_rmsnorm(be, w.y, w.resid, l ? w.delta : NULL, L->attn_norm, T, H,
				c->rms_norm_eps);
		op->matmul(be, w.qkv, 0, w.y, &L->qkv, T);
		op->head_norm_rope(be, w.qkv, qkv_ld, T, c->n_heads, D, L->q_norm,
				   c->rms_norm_eps, b->tok_pos, c->rot_dim, c->rope_theta);
		op->head_norm_rope(be, k_in, qkv_ld, T, c->n_kv_heads, D, L->k_norm,
				   c->rms_norm_eps, b->tok_pos, c->rot_dim, c->rope_theta);
		op->kv_write(be, &m->kv[l], &m->kv_lay, k_in, v_in, qkv_ld, b->tok_slot, T);
		op->attention(be, w.attn, w.qkv, qkv_ld, &m->kv[l], &m->kv_lay, b, c->n_heads,
			      scale);
		op->matmul(be, w.delta, 0, w.attn, &L->o, T);

		op->add_rmsnorm(be, w.y, w.resid, w.delta, L->mlp_norm, T, H, c->rms_norm_eps);
		op->matmul(be, w.gate_up, 0, w.y, &L->gate_up, T);
		op->silu_mul(be, w.mid, w.gate_up, T, c->intermediate_size);
		op->matmul(be, w.delta, 0, w.mid, &L->down, T);
	}
	if (b->n_out == 0)
		return;
	/* Only the rows that need logits finish the last residual add and the head. */
	op->gather_rows(be, w.sel_resid, w.resid, b->out_rows, b->n_out, H, 1);
	op->gather_rows(be, w.sel_delta, w.delta, b->out_rows, b->n_out, H, 0);
	op->add_rmsnorm(be, w.sel_y, w.sel_resid, w.sel_delta, q->final_norm, b->n_out, H,
			c->rms_norm_eps);
	op->matmul(be, m->logits, 1, w.sel_y, &q->lm_head, b->n_out);
}

static size_t qwen3_weight_bytes(const struct sm70_model *m, void *state)
{
	const struct qwen3 *q = state;
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
