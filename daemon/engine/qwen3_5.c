/*
 * qwen3_5.c - the hybrid Qwen3.5 family (qwen3_5_text, the vision-language qwen3_5
 * layout, and qwen3_next with dense MLPs) as a composition of the layer library: each
 * layer is either Gated DeltaNet ("linear_attention": a recurrent state slot per
 * sequence) or gated full attention ("full_attention": paged KV, a per-head output gate,
 * partial RoPE), then a dense SwiGLU MLP. Every RMSNorm weight is zero-centred (the
 * loader adds 1) except the DeltaNet output norm. See ../shared/ARCHITECTURES.md.
 *
 * Checkpoint layouts of the DeltaNet input projection, both loaded into one stacked
 * matrix q | k | v | z | b | a (the conv channels first, as the ops expect):
 *   qwen3_5:    in_proj_qkv (q | k | v, each flat over heads), in_proj_z, in_proj_b,
 *               in_proj_a;
 *   qwen3_next: in_proj_qkvz and in_proj_ba, interleaved per key head g: rows
 *               [q_g, k_g, v_g (r heads), z_g (r heads)] and [b_g (r), a_g (r)], r the
 *               value heads per key head.
 * Tensor parallelism splits DeltaNet by key heads (and the value heads that read them)
 * like attention heads: in_proj by output rows, out_proj by input columns.
 *
 * Non-goals here: the MoE MLPs of qwen3_next / qwen3_5_moe (refused by the config
 * parser), multi-token prediction (mtp.*), the vision tower (model.visual.*).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "daemon/engine/layers.h"

static int qwen3_5_check_tp(const struct sm70_model *m, struct sm70_err *err)
{
	const struct sm70_gdn_config *g = &m->cfg.hybrid.gdn;

	if (g->n_k_heads % m->tp)
		return sm70_errf(err, -EINVAL, "tensor parallelism %d needs the DeltaNet key "
				 "heads (%d) to divide evenly", m->tp, g->n_k_heads);
	return 0;
}

/* The input projection q | k | v | z | b | a of rank r's DeltaNet heads. */
static int load_in_proj(struct sm70_model *m, int r, const struct sm70_ckpt *ck,
			const char *p, struct sm70_weight *w, struct sm70_err *err)
{
	const struct sm70_gdn_config *g = &m->cfg.hybrid.gdn;
	const struct sm70_state_layout *L = &m->rank[r].state_lay;
	int H = m->cfg.hidden_size, dk = g->k_dim, dv = g->v_dim, Hk = g->n_k_heads;
	int Hv = g->n_v_heads, rep = Hv / Hk, k0 = m->rank[r].gdn_k0, kh = L->n_k_heads;
	int v0 = k0 * rep, vh = L->n_v_heads;
	char n1[160], n2[160], n3[160], n4[160];
	struct sm70_weight_part *parts;
	int n = 0, ret;

	parts = calloc((size_t)(6 * kh + 6), sizeof(*parts));
	if (!parts)
		return -ENOMEM;
	if (!m->cfg.hybrid.fused_proj) {
		int rows = 2 * Hk * dk + Hv * dv;

		snprintf(n1, sizeof(n1), "%slinear_attn.in_proj_qkv.weight", p);
		snprintf(n2, sizeof(n2), "%slinear_attn.in_proj_z.weight", p);
		snprintf(n3, sizeof(n3), "%slinear_attn.in_proj_b.weight", p);
		snprintf(n4, sizeof(n4), "%slinear_attn.in_proj_a.weight", p);
		parts[n++] = (struct sm70_weight_part){ n1, rows, k0 * dk, kh * dk };
		parts[n++] = (struct sm70_weight_part){ n1, rows, Hk * dk + k0 * dk, kh * dk };
		parts[n++] = (struct sm70_weight_part){ n1, rows, 2 * Hk * dk + v0 * dv, vh * dv };
		parts[n++] = (struct sm70_weight_part){ n2, Hv * dv, v0 * dv, vh * dv };
		parts[n++] = (struct sm70_weight_part){ n3, Hv, v0, vh };
		parts[n++] = (struct sm70_weight_part){ n4, Hv, v0, vh };
	} else {
		int G = 2 * dk + 2 * rep * dv, rows = Hk * G;

		snprintf(n1, sizeof(n1), "%slinear_attn.in_proj_qkvz.weight", p);
		snprintf(n2, sizeof(n2), "%slinear_attn.in_proj_ba.weight", p);
		for (int part = 0; part < 4; part++) /* q, k, v, z over the rank's groups */
			for (int k = k0; k < k0 + kh; k++) {
				int off = part == 0 ? 0 : part == 1 ? dk :
					  part == 2 ? 2 * dk : 2 * dk + rep * dv;
				int len = part < 2 ? dk : rep * dv;
				parts[n++] = (struct sm70_weight_part){ n1, rows, k * G + off, len };
			}
		for (int part = 0; part < 2; part++) /* b, a */
			for (int k = k0; k < k0 + kh; k++)
				parts[n++] = (struct sm70_weight_part){ n2, Hk * 2 * rep,
									k * 2 * rep + part * rep,
									rep };
	}
	ret = sm70__weight_load(m, r, ck, w, parts, n, H, 0, H, err);
	free(parts);
	return ret;
}

int sm70__load_gdn(struct sm70_model *m, int r, const struct sm70_ckpt *ck, const char *p,
		   struct sm70_gdn_weights *w, struct sm70_err *err)
{
	const struct sm70_gdn_config *g = &m->cfg.hybrid.gdn;
	const struct sm70_state_layout *L = &m->rank[r].state_lay;
	int dk = g->k_dim, dv = g->v_dim, Hk = g->n_k_heads, Hv = g->n_v_heads;
	int k0 = m->rank[r].gdn_k0, v0 = k0 * (Hv / Hk), kh = L->n_k_heads, vh = L->n_v_heads;
	int C = 2 * Hk * dk + Hv * dv, H = m->cfg.hidden_size;
	char n[160];
	int ret;

	ret = load_in_proj(m, r, ck, p, &w->in_proj, err);
	if (ret)
		return ret;
	{
		/* the conv channels are q | k | v flat over heads in both layouts */
		int64_t shape[3] = { C, 1, g->conv_k };
		struct sm70_row_band bands[3] = {
			{ k0 * dk, kh * dk }, { Hk * dk + k0 * dk, kh * dk },
			{ 2 * Hk * dk + v0 * dv, vh * dv },
		};
		snprintf(n, sizeof(n), "%slinear_attn.conv1d.weight", p);
		ret = sm70__f32_load(m, r, ck, &w->conv, n, 3, shape, bands, 3, 0.0f, 0.0f, 0.5f,
				     err);
		if (ret)
			return ret;
	}
	{
		int64_t shape[1] = { Hv };
		struct sm70_row_band band = { v0, vh };
		snprintf(n, sizeof(n), "%slinear_attn.A_log", p);
		ret = sm70__f32_load(m, r, ck, &w->a_log, n, 1, shape, &band, 1, 0.0f, 0.0f, 0.5f,
				     err);
		if (ret)
			return ret;
		snprintf(n, sizeof(n), "%slinear_attn.dt_bias", p);
		ret = sm70__f32_load(m, r, ck, &w->dt_bias, n, 1, shape, &band, 1, 0.0f, 0.0f,
				     0.5f, err);
		if (ret)
			return ret;
	}
	snprintf(n, sizeof(n), "%slinear_attn.norm.weight", p);
	ret = sm70__plain_norm_load(m, r, ck, &w->norm, n, dv, err);
	if (ret)
		return ret;
	{
		/* row-parallel: the columns of this rank's value heads */
		struct sm70_weight_part po[1] = { { n, H, 0, H } };
		snprintf(n, sizeof(n), "%slinear_attn.out_proj.weight", p);
		return sm70__weight_load(m, r, ck, &w->out, po, 1, Hv * dv, v0 * dv, vh * dv, err);
	}
}

/* A layer's mixer: Gated DeltaNet or gated attention, as layer_types says. */
static int qwen3_5_mixer(struct sm70_model *m, int r, const struct sm70_ckpt *ck,
			 const char *p, int l, struct sm70_layer_weights *w,
			 struct sm70_err *err)
{
	return m->cfg.layer_kind[l] == SM70_LAYER_GDN ? sm70__load_gdn(m, r, ck, p, &w->gdn, err) :
							  sm70__load_attention(m, r, ck, p,
									       &w->attn, err);
}

static int qwen3_5_load(struct sm70_model *m, int r, const struct sm70_ckpt *ck,
			void **state, struct sm70_err *err)
{
	return sm70__load_decoder(m, r, ck, qwen3_5_mixer, state, err);
}

const struct sm70_arch_ops sm70__arch_qwen3_5 = {
	.name = "qwen3_5",
	.check_tp = qwen3_5_check_tp,
	.load = qwen3_5_load,
	.unload = sm70__decoder_free,
	.workspace_bytes = sm70__decoder_workspace_bytes,
	.forward = sm70__decoder_forward,
	.weight_bytes = sm70__decoder_weight_bytes,
	.expert_bytes = sm70__decoder_expert_bytes,
};
