/*
 * checkpoint.h - a Hugging Face checkpoint directory: config.json, optional
 * generation_config.json and hf_quant_config.json, and safetensors weights (model.safetensors, or the shards
 * listed in model.safetensors.index.json).
 *
 * Tensor names are looked up by their text-model name ("model.layers.0.mlp.up_proj.weight",
 * "lm_head.weight"); checkpoints of vision-language models that nest the text model under
 * "model.language_model." are found under the same names, and their "visual." / "mtp."
 * tensors are ignored. Every tensor the index names must exist in the shard it names.
 *
 * Non-goals: pickle (.bin) checkpoints, GGUF, remote downloads.
 */
#ifndef SM70_ENGINE_CHECKPOINT_H
#define SM70_ENGINE_CHECKPOINT_H

#include <jansson.h>
#include <stdint.h>

#include "common/err.h"
#include "daemon/engine/safetensors.h"

struct sm70_ckpt;

/* Opens dir: parses config.json (required) and generation_config.json (optional), maps
 * and validates every weight file. Returns 0 or -errno with err naming the file. */
int sm70_ckpt_open(struct sm70_ckpt **out, const char *dir, struct sm70_err *err);

/* Opens a checkpoint that has a config.json but no weights (for --load-format dummy). */
int sm70_ckpt_open_config_only(struct sm70_ckpt **out, const char *dir, struct sm70_err *err);

void sm70_ckpt_close(struct sm70_ckpt *c);

/* Borrowed: valid until sm70_ckpt_close. generation config and ModelOpt's
 * hf_quant_config.json are NULL when absent. */
json_t *sm70_ckpt_config(const struct sm70_ckpt *c);
json_t *sm70_ckpt_generation_config(const struct sm70_ckpt *c);
json_t *sm70_ckpt_hf_quant_config(const struct sm70_ckpt *c);
const char *sm70_ckpt_dir(const struct sm70_ckpt *c);

/* The weight files in the order they were opened, borrowed: their tensors carry the names
 * as stored (for tools that rewrite a checkpoint whole). */
size_t sm70_ckpt_n_files(const struct sm70_ckpt *c);
const struct sm70_st_file *sm70_ckpt_file(const struct sm70_ckpt *c, size_t i);

/* The tensor with text-model name `name`, or NULL when absent. */
const struct sm70_st_tensor *sm70_ckpt_find(const struct sm70_ckpt *c, const char *name);

/*
 * Looks up `name` and checks its shape equals shape[0..ndim). Returns 0 and sets *out,
 * or -ENOENT ("missing tensor NAME in DIR") / -EINVAL ("tensor NAME in FILE has shape
 * [a, b], expected [c, d]" or an unsupported dtype) with err set. Only float dtypes
 * (f32, f16, bf16) are accepted here.
 */
int sm70_ckpt_get(const struct sm70_ckpt *c, const char *name, int ndim, const int64_t *shape,
		  const struct sm70_st_tensor **out, struct sm70_err *err);

#endif
