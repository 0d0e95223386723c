/*
 * quant_config.h - the quantized format a checkpoint declares: config.json's
 * "quantization_config" and ModelOpt's hf_quant_config.json, read once at load, with the
 * list of modules they leave unquantized.
 *
 * Served: ModelOpt NVFP4 (quant_method "modelopt", quant_algo "NVFP4") and
 * compressed-tensors' "nvfp4-pack-quantized", both in blocks of 16 elements. Any other
 * method, algorithm, format, bit width or group size is refused with -ENOTSUP naming the
 * key and value; two declarations that disagree, or a malformed one, with -EINVAL.
 * docs/NVFP4.md ("Loading") lists every key read.
 *
 * Non-goals: activation quantization (input scales are not read: weights are W4A16),
 * KV-cache quantization from the checkpoint (the KV dtype is sm70's kv_dtype option; a
 * declared kv_cache_quant_algo or kv_cache_scheme is accepted and not applied).
 */
#ifndef SM70_ENGINE_QUANT_CONFIG_H
#define SM70_ENGINE_QUANT_CONFIG_H

#include <jansson.h>
#include <regex.h>
#include <stddef.h>

#include "common/err.h"

enum sm70_quant_format {
	SM70_QUANT_NONE = 0,       /* no quantization declared: float weights only */
	SM70_QUANT_MODELOPT_NVFP4, /* X.weight u8, X.weight_scale e4m3, X.weight_scale_2 f32 */
	SM70_QUANT_CT_NVFP4,       /* X.weight_packed, X.weight_scale, X.weight_global_scale */
};

/* One entry of the ignore list: a module name or fnmatch glob (a stored
 * "model.language_model." prefix read as "model.", checkpoint.h's text-model names), or
 * a "re:" regular expression, compiled once. */
struct sm70_quant_ignore {
	char *pattern; /* owned; without "re:" for an expression */
	int is_re;
	regex_t re;    /* is_re: ^(pattern), POSIX extended */
};

struct sm70_quant_config {
	enum sm70_quant_format format;
	size_t n_ignore;
	struct sm70_quant_ignore *ignore; /* owned */
};

/*
 * Reads the declaration from config (config.json, required) and hf_quant (the parsed
 * hf_quant_config.json, NULL when the checkpoint has none); dir names the checkpoint in
 * messages. When both declare, they must agree; their ignore lists are joined. *q is
 * zeroed first and owns its list afterwards, also on failure (free it with
 * sm70_quant_config_free). Returns 0 (format NONE when nothing is declared), or -ENOTSUP /
 * -EINVAL / -ENOMEM with err naming the file and key.
 */
int sm70_quant_config_parse(struct sm70_quant_config *q, json_t *config, json_t *hf_quant,
			    const char *dir, struct sm70_err *err);

void sm70_quant_config_free(struct sm70_quant_config *q);

/* "none", "modelopt NVFP4", "compressed-tensors nvfp4-pack-quantized". */
const char *sm70_quant_format_name(enum sm70_quant_format f);

/* 1 when module (a text-model module name, "model.layers.0.mlp.up_proj") is on q's
 * ignore list: equal to an entry or inside one ("model.layers.0.mlp" holds it), matched
 * by a glob, or by a "re:" expression at its start (as vLLM reads these lists). */
int sm70_quant_ignored(const struct sm70_quant_config *q, const char *module);

/* 1 when a checkpoint of q's format made by sm70-quantize holds module's weight of
 * cols columns as NVFP4: a quantized format, a projection (the module's last name ends
 * in "proj"), cols a multiple of 16, and not on the ignore list. Dummy weights follow
 * this. */
int sm70_quant_module_quantized(const struct sm70_quant_config *q, const char *module,
				int cols);

#endif
