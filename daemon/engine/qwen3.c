/*
 * qwen3.c - the dense Qwen3 architecture (see ARCHITECTURES.md) as a composition of the
 * layer library: every layer is attention (per-head q/k RMSNorm, RoPE, paged KV) and a
 * dense SwiGLU MLP; plain RMSNorm weights. This file only reads the checkpoint: the
 * forward, workspace and accounting are layers.c's.
 *
 * Non-goals: sliding-window attention, rope scaling.
 */
#include "daemon/engine/layers.h"

static int qwen3_mixer(struct sm70_model *m, int r, const struct sm70_ckpt *ck, const char *p,
		       int l, struct sm70_layer_weights *w, struct sm70_err *err)
{
	return sm70__load_attention(m, r, ck, p, &w->attn, err);
}

static int qwen3_load(struct sm70_model *m, int r, const struct sm70_ckpt *ck, void **state,
		      struct sm70_err *err)
{
	return sm70__load_decoder(m, r, ck, qwen3_mixer, state, err);
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
