/*
 * qwen3.c - the dense Qwen3 architecture (see ARCHITECTURES.md) as a composition of the
 * layer library: every layer is attention (per-head q/k RMSNorm, RoPE, paged KV) and a
 * dense SwiGLU MLP; plain RMSNorm weights. This file only reads the checkpoint: the
 * forward, workspace and accounting are layers.c's.
 *
 * Non-goals: sliding-window attention, rope scaling.
 */
#include <errno.h>
#include <stdio.h>

#include "daemon/engine/layers.h"

static int qwen3_load(struct sm70_model *m, int r, const struct sm70_ckpt *ck, void **state,
		      struct sm70_err *err)
{
	const struct sm70_model_config *c = &m->cfg;
	struct sm70_decoder *d = sm70__decoder_new(c->n_layers);
	char p[96], n[160];
	int ret;

	if (!d)
		return -ENOMEM;
	ret = sm70__load_embed_head(m, r, ck, d, "model.", err);
	for (int l = 0; !ret && l < c->n_layers; l++) {
		struct sm70_layer_weights *L = &d->layers[l];

		sm70__layer_prefix(p, sizeof(p), "model.", l);
		snprintf(n, sizeof(n), "%sinput_layernorm.weight", p);
		ret = sm70__norm_load(m, r, ck, &L->mixer_norm, n, c->hidden_size, err);
		if (ret)
			break;
		snprintf(n, sizeof(n), "%spost_attention_layernorm.weight", p);
		ret = sm70__norm_load(m, r, ck, &L->mlp_norm, n, c->hidden_size, err);
		if (!ret)
			ret = sm70__load_attention(m, r, ck, p, &L->attn, err);
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

const struct sm70_arch_ops sm70__arch_qwen3 = {
	.name = "qwen3",
	.load = qwen3_load,
	.unload = sm70__decoder_free,
	.workspace_bytes = sm70__decoder_workspace_bytes,
	.forward = sm70__decoder_forward,
	.weight_bytes = sm70__decoder_weight_bytes,
	.expert_bytes = sm70__decoder_expert_bytes,
};
