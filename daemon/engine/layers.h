/*
 * layers.h - the layer library: the blocks decoder models are composed of, written once
 * against the op table, and the decoder forward that walks a model's per-layer plan.
 *
 * An architecture file (qwen3.c, qwen3_5.c) only reads its checkpoint into a struct
 * sm70_decoder (names, layouts, tensor-parallel bands); the forward, the workspace, the
 * weight accounting and the unload are shared. A layer is a token mixer (attention,
 * gated attention or Gated DeltaNet) and an MLP, each wrapped by the residual:
 *   before a block  sm70__residual_in: add the pending update, norm into the block input
 *   after a block   the block's output is the pending update (all-reduced over ranks)
 * so a residual of several streams (hyper-connections) is another implementation of
 * those two calls, not a change to every block.
 *
 * Ownership: the decoder's weights are backend memory of its rank, freed by
 * sm70__decoder_free. Not thread-safe (one model, one caller).
 */
#ifndef SM70_ENGINE_LAYERS_H
#define SM70_ENGINE_LAYERS_H

#include "daemon/engine/model.h"

/* Attention: qkv stacks q | k | v (| the output gate when gated), this rank's heads, and
 * for QSA (qwen4_exp) then the indexer's queries and key (every rank: replicated), whose
 * per-head norms are idx_q_norm and idx_k_norm. */
struct sm70_attn_weights {
	struct sm70_weight qkv, o;
	float *q_norm, *k_norm;
	float *idx_q_norm, *idx_k_norm;
};

/* A hyper-connection mixer (qwen4_exp): the group norm over the streams, the low-rank
 * down projection stacked with the stream-inject logits (none in the final mixer), and
 * the up projection. Replicated on every rank. */
struct sm70_hc_weights {
	float *norm;
	struct sm70_weight mix, up;
};

/* A layer's n-gram embeddings (qwen4_exp PLE): the hash (its parameter arrays in backend
 * memory, its table in the model's pinned host memory), key and value projections, the
 * key / query / conv group norms and the dilated conv. Replicated on every rank. */
struct sm70_ple_weights {
	struct sm70_ple_hash hash;
	struct sm70_weight key, value;
	float *norm_key, *norm_query, *norm_conv, *conv;
};

/* Gated DeltaNet: in_proj stacks q | k | v | z | b | a (the conv channels first); conv
 * f32 [conv_dim][conv_k]; a_log, dt_bias f32 [n_v_heads]; norm f32 [v_dim] (plain). */
struct sm70_gdn_weights {
	struct sm70_weight in_proj, out;
	float *conv, *a_log, *dt_bias, *norm;
};

/* Dense SwiGLU MLP: gate | up stacked. */
struct sm70_mlp_weights {
	struct sm70_weight gate_up, down;
};

/* Mixture of experts: the router's rows (and, with a shared expert, its gate's one row
 * after them: one f32 matmul gives both), the stacked experts (this rank's rows of each),
 * and the shared expert as a dense MLP. */
struct sm70_moe_weights {
	struct sm70_weight router;
	struct sm70_experts gate_up, down;
	struct sm70_mlp_weights shared;
};

struct sm70_layer_weights {
	float *mixer_norm, *mlp_norm;
	struct sm70_attn_weights attn; /* SM70_LAYER_ATTENTION */
	struct sm70_gdn_weights gdn;   /* SM70_LAYER_GDN */
	struct sm70_mlp_weights mlp;   /* dense layers */
	struct sm70_moe_weights moe;   /* cfg.layer_moe[l] */
	struct sm70_hc_weights hc_attn, hc_mlp; /* qwen4_exp */
	struct sm70_ple_weights ple;   /* qwen4_exp, cfg.q4.ple_index[l] >= 0 */
};

struct sm70_decoder {
	struct sm70_weight embed;
	struct sm70_weight lm_head; /* aliases embed when tied */
	int tied;
	float *final_norm;             /* NULL in qwen4_exp: its final mixer norms */
	struct sm70_hc_weights hc_final; /* qwen4_exp */
	int32_t *hc_rep;               /* qwen4_exp: [max_tokens * hc] row i / hc (embedding
					* rows repeated per stream by gather_rows) */
	int n_layers;
	struct sm70_layer_weights *layers;
};

/* How an architecture loads layer l's token mixer at name prefix p ("model.layers.L."). */
typedef int (*sm70__mixer_load_fn)(struct sm70_model *m, int r, const struct sm70_ckpt *ck,
				   const char *p, int l, struct sm70_layer_weights *w,
				   struct sm70_err *err);

/*
 * Loads rank r's share of a whole decoder named model.*: embedding, LM head, final norm,
 * and per layer its input and post-attention norms, its mixer (through load_mixer) and
 * its MLP (sm70__load_ffn). *state gets the decoder. Returns 0 or -errno with err set;
 * nothing is left allocated on failure.
 */
int sm70__load_decoder(struct sm70_model *m, int r, const struct sm70_ckpt *ck,
		       sm70__mixer_load_fn load_mixer, void **state, struct sm70_err *err);

/* Allocates an empty decoder of n_layers layers (NULL when out of memory). */
struct sm70_decoder *sm70__decoder_new(int n_layers);

/* Frees every weight of rank r's decoder (unloaded parts are NULL and skipped). */
void sm70__decoder_free(struct sm70_model *m, int r, void *state);

/* The shared loads: the embedding (replicated), the LM head (this rank's vocabulary rows,
 * or a view into the embedding when tied) and, with final_norm, the final norm; prefix is
 * the text model's name prefix ("model." or "model.language_model."). */
int sm70__load_embed_head(struct sm70_model *m, int r, const struct sm70_ckpt *ck,
			  struct sm70_decoder *d, const char *prefix, int final_norm,
			  struct sm70_err *err);

/* Gated DeltaNet of a layer at name prefix p, both checkpoint layouts (qwen3_5.c). */
int sm70__load_gdn(struct sm70_model *m, int r, const struct sm70_ckpt *ck, const char *p,
		   struct sm70_gdn_weights *w, struct sm70_err *err);

/* The dense MLP of layer l at name prefix p ("...layers.L."): column-parallel gate/up,
 * row-parallel down. */
int sm70__load_mlp(struct sm70_model *m, int r, const struct sm70_ckpt *ck, const char *p,
		   struct sm70_mlp_weights *w, struct sm70_err *err);

/* The layer's MLP: sm70__load_mlp, or the mixture of experts (router, experts in the fused
 * or per-expert layout, shared expert and its gate) when cfg.layer_moe[l] says so. */
int sm70__load_ffn(struct sm70_model *m, int r, const struct sm70_ckpt *ck, const char *p,
		   int l, struct sm70_layer_weights *w, struct sm70_err *err);

/* The attention of a layer at name prefix p: q/k/v (and, when the config says gated,
 * the per-head output gate that q_proj interleaves with the query, moved behind v),
 * o_proj and the q/k norms. */
int sm70__load_attention(struct sm70_model *m, int r, const struct sm70_ckpt *ck,
			 const char *p, struct sm70_attn_weights *w, struct sm70_err *err);

/* Workspace bytes of one step on rank r, and the forward of the step uploaded to every
 * rank (the arch ops' workspace_bytes and forward). */
size_t sm70__decoder_workspace_bytes(const struct sm70_model *m, int r);
void sm70__decoder_forward(struct sm70_model *m);

/* Bytes of weights one decode step reads on rank r, experts aside; and the bytes of the
 * experts the last step read (distinct experts per MoE layer, downloaded: a sync). */
size_t sm70__decoder_weight_bytes(const struct sm70_model *m, int r);
size_t sm70__decoder_expert_bytes(struct sm70_model *m, int r);

/* A layer-name prefix: "<prefix>layers.<l>." into buf. */
const char *sm70__layer_prefix(char *buf, size_t n, const char *prefix, int l);

#endif
