/*
 * model_config.h - the architecture hyper-parameters sm70 reads from config.json.
 *
 * Parsing validates every field it uses (type, range, consistency such as
 * heads % kv_heads == 0) and names the key in its error. Fields may sit at the top level
 * or, for vision-language checkpoints, under "text_config".
 *
 * Non-goals: fields sm70 does not use; rope scaling types other than "default".
 */
#ifndef SM70_ENGINE_MODEL_CONFIG_H
#define SM70_ENGINE_MODEL_CONFIG_H

#include <jansson.h>
#include <stdint.h>

#include "common/err.h"

#define SM70_MAX_EOS 8
#define SM70_MAX_LAYERS 1024

/* The families the engine serves (daemon/engine/arch.c holds one row per model_type). */
enum sm70_arch {
	SM70_ARCH_QWEN3 = 1,   /* dense qwen3 */
	SM70_ARCH_QWEN3_5,     /* qwen3_5 / qwen3_5_text / qwen3_next (dense MLPs): hybrid */
	SM70_ARCH_QWEN4_EXP,   /* qwen4_exp: hybrid MoE + hyper-connections, QSA, PLE */
};

/* What a layer's token mixer is (transformers' layer_types). */
enum sm70_layer_kind {
	SM70_LAYER_ATTENTION = 0, /* "full_attention": paged KV */
	SM70_LAYER_GDN = 1,       /* "linear_attention": Gated DeltaNet, a recurrent state slot */
};

/* Gated DeltaNet dimensions (the linear_* keys). */
struct sm70_gdn_config {
	int conv_k;    /* linear_conv_kernel_dim */
	int n_k_heads; /* linear_num_key_heads */
	int n_v_heads; /* linear_num_value_heads, a multiple of n_k_heads */
	int k_dim;     /* linear_key_head_dim */
	int v_dim;     /* linear_value_head_dim */
	int gate_sigmoid; /* qwen4_exp output_gate_type "sigmoid": the output norm's gate */
};

/* Mixture-of-experts MLPs (qwen3_moe, qwen3_5_moe, qwen3_next). */
struct sm70_moe_config {
	int n_experts;     /* num_experts */
	int top_k;         /* num_experts_per_tok */
	int inter;         /* moe_intermediate_size: rows of one expert's gate (and up) */
	int shared_inter;  /* shared_expert_intermediate_size; 0: no shared expert */
	int renorm;        /* norm_topk_prob: the k weights are divided by their sum */
	int n_moe_layers;
};

/* Fields only the hybrid family has. */
struct sm70_hybrid_config {
	struct sm70_gdn_config gdn;
	/* qwen3_next: in_proj_qkvz / in_proj_ba, interleaved per key head, instead of
	 * qwen3_5's in_proj_qkv, in_proj_z, in_proj_b, in_proj_a */
	int fused_proj;
	int n_gdn_layers;
};

/* qwen4_exp's own fields (docs/QWEN4_EXP.md). */
struct sm70_qwen4_config {
	int hc;          /* hc_count: residual streams */
	int hc_rank;     /* hc_lowrank */
	/* QSA, on every attention layer */
	int idx_heads;   /* indexer_n_heads */
	int idx_dim;     /* indexer_head_dim */
	int idx_budget;  /* indexer_budget: tokens of complete blocks a query may select */
	int idx_ratio;   /* indexer_compress_ratio: tokens per compressed block */
	/* PLE */
	int n_ple;       /* layers with n-gram embeddings */
	int16_t ple_index[SM70_MAX_LAYERS]; /* layer l's index in ple_layer_ids order, or -1 */
	int ple_dim;     /* ple_embed_dim */
	int ple_conv_k;  /* ple_conv_kernel_size (dilation ngram) */
	int ngram;       /* ngram_size */
	int heads_per_ngram;
	long long ngram_base;  /* ngram_vocab_size_base */
	int ngram_div;   /* make_ngram_vocab_size_divisible_by */
	long long seed;
	int split_parts; /* split_ngram_parts: checkpoint shards of each table */
	int32_t ple_eos; /* config.json's (first) eos_token_id: where the n-gram window resets */
};

struct sm70_model_config {
	enum sm70_arch arch;
	char model_type[32];
	/* Shared by every family. */
	int vocab_size;
	int hidden_size;
	int intermediate_size;
	int n_layers;
	int n_heads;
	int n_kv_heads;
	int head_dim;
	int max_position;
	int tie_word_embeddings;
	float rms_norm_eps;
	double rope_theta;
	int rot_dim; /* dims rotated by RoPE (head_dim * partial_rotary_factor) */
	int n_eos;
	int eos_ids[SM70_MAX_EOS];
	/* RMSNorm weights are stored centred on zero: the norm scales by 1 + w (qwen3_5,
	 * qwen3_next; not the DeltaNet output norm). The loader adds the 1. */
	int zero_centred_norms;
	/* q_proj emits a query and an output gate per head: o_proj(attn * sigmoid(gate)) */
	int attn_gate;
	int n_attn_layers;
	uint8_t layer_kind[SM70_MAX_LAYERS]; /* enum sm70_layer_kind per layer */
	uint8_t layer_moe[SM70_MAX_LAYERS];  /* 1: the layer's MLP is a mixture of experts */
	struct sm70_moe_config moe;          /* when any layer_moe is set */
	struct sm70_hybrid_config hybrid;    /* SM70_ARCH_QWEN3_5 and QWEN4_EXP */
	struct sm70_qwen4_config q4;         /* SM70_ARCH_QWEN4_EXP only */
};

/* Parses config (and generation_config, may be NULL, which wins for eos_token_id).
 * Returns 0 or -EINVAL / -ENOTSUP (unsupported model_type) with err naming the key. */
int sm70_model_config_parse(struct sm70_model_config *mc, json_t *config,
			    json_t *generation_config, struct sm70_err *err);

#endif
