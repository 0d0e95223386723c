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

#include "common/err.h"

#define SM70_MAX_EOS 8

enum sm70_arch {
	SM70_ARCH_QWEN3 = 1,
};

struct sm70_model_config {
	enum sm70_arch arch;
	char model_type[32];
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
	int rot_dim; /* dims rotated by RoPE (head_dim for qwen3) */
	int n_eos;
	int eos_ids[SM70_MAX_EOS];
};

/* Parses config (and generation_config, may be NULL, which wins for eos_token_id).
 * Returns 0 or -EINVAL / -ENOTSUP (unsupported model_type) with err naming the key. */
int sm70_model_config_parse(struct sm70_model_config *mc, json_t *config,
			    json_t *generation_config, struct sm70_err *err);

#endif
