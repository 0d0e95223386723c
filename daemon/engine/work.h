/*
 * work.h - what the layer library's files share (layers.c: the blocks every family
 * composes; layers_hc.c: qwen4_exp's hyper-connection residual, PLE and its forward):
 * the buffers of one step on one rank, carved from the rank's work buffer, and the blocks.
 * Not for architecture files: they see layers.h.
 */
#ifndef SM70_ENGINE_WORK_H
#define SM70_ENGINE_WORK_H

#include "daemon/engine/layers.h"

/* The buffers of one step on one rank. T = max_tokens, S = max_seqs. With hyper-connections
 * (qwen4_exp) the residual holds hc streams: resid is f32 [T, hc * H]. */
struct sm70__work {
	float *resid;       /* f32 [T, H] the residual stream (or [T, hc * H]) */
	/* SM70_FUSED=norm: the other residual buffer (the fused op writes the updated
	 * stream there and the two swap), and the norm a block's first matmul still owes
	 * (NULL: none; first: no update to add) */
	float *resid_alt;
	const float *pend_norm;
	int pend_first;
	void *y;            /* act [T, H] a block's normed input */
	void *delta;        /* act [T, H] a block's (partial) update */
	void *qkv;          /* act [T, qkv_ld] attention projections (+ the QSA indexer's) */
	void *attn;         /* act [T, Hq * D] attention output */
	void *gate_up, *mid;/* act [T, 2I], [T, I] MLP */
	void *gdn_proj;     /* act [T, proj_ld] DeltaNet input projection */
	void *gdn_conv;     /* act [T, conv_dim] after the convolution */
	void *gdn_core;     /* act [T, Hv * v_dim] delta-rule output, then gated-normed */
	float *sel_resid;   /* f32 [S, H] (or [S, hc * H]) rows that need logits */
	void *sel_delta, *sel_y;
	float *router;      /* f32 [T, router_ld] router logits (+ the shared expert's gate) */
	struct sm70_moe_route route; /* [T * k] each */
	int32_t *moe_used;  /* [n_layers] distinct experts each MoE layer read last step */
	void *moe_mid;      /* act [T * k, moe_inter] */
	float *moe_part;    /* f32 [T * k, H] */
	void *sh_gate_up, *sh_mid, *sh_out; /* act: the shared expert */
	/* hyper-connections */
	float *emb;         /* f32 [T, H] the embedding, before it is repeated per stream */
	void *hc_xn;        /* act [T, hc * H] the normed streams */
	float *hc_f;        /* f32 [T, rank + hc] low-rank mix and inject logits */
	void *hc_z;         /* act [T, rank] */
	void *hc_u;         /* act [T, hc * H] the mix weights before the sigmoid */
	float *hc_inj;      /* f32 [T, hc] the pending block's per-stream inject weights */
	float *hc_part;     /* f32 [hc, rank + hc] hc_mix's per-stream partial sums */
	/* PLE */
	int32_t *hist;      /* [T, ngram - 1] each token's previous tokens */
	void *ple_e;        /* act [n_ple][T, ple_dim] the n-gram embeddings, per PLE layer */
	int ple_pending;    /* the embeddings' side section is not joined yet */
	void *ple_k, *ple_kn, *ple_qn, *ple_gv, *ple_gvn; /* act [T, hc * H] */
	void *ple_v;        /* act [T, H] */
	/* QSA */
	int32_t *qsa_sel;   /* [T, qsa_sel_ld] selected positions */
	int32_t *qsa_n;     /* [T] */
	float *qsa_scores;  /* f32 [T, ceil(max_position / ratio)] */
	int qkv_ld, proj_ld, router_ld, qsa_sel_ld;
	int idx_off;        /* where the indexer's queries start in a qkv row (elements) */
};

/* Carves rank r's buffers (base NULL: measures only); returns the bytes. */
size_t sm70__carve_work(const struct sm70_model *m, int r, struct sm70__work *w);

const struct sm70_layer_weights *sm70__layer_of(const struct sm70_model *m, int r, int l);

/* Sums the ranks' partial updates in w[r].delta (row-parallel outputs) over T tokens. */
void sm70__reduce_delta(struct sm70_model *m, struct sm70__work *w, int T);

/* The blocks: from a block's input w->y to its (partial) update in w->delta. */
void sm70__attention_block(struct sm70_model *m, int r, int l, struct sm70__work *w);
void sm70__gdn_block(struct sm70_model *m, int r, int l, struct sm70__work *w);
void sm70__ffn_block(struct sm70_model *m, int r, int l, struct sm70__work *w);

/* qwen4_exp's forward (layers_hc.c): hyper-connection streams around the same blocks. */
void sm70__hc_forward(struct sm70_model *m);

#endif
