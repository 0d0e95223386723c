/*
 * arch.h - the architecture registry: one row per Hugging Face model_type the engine
 * knows, saying how its config is read, which arch ops run it, which backend ops it
 * needs and what it can do. Everything that used to ask "is this qwen3?" asks the row.
 *
 * A model_type can be known and still refused (a family not built yet): its row has no
 * ops and a reason, so the error names both the type and the missing feature.
 */
#ifndef SM70_ENGINE_ARCH_H
#define SM70_ENGINE_ARCH_H

#include "common/err.h"
#include "daemon/engine/model_config.h"

struct sm70_arch_ops;
struct sm70_backend;
struct sm70__cfg; /* model_config.c's view of config.json */

enum {
	SM70_CAP_TP = 1u << 0,           /* tensor parallelism */
	SM70_CAP_PREFIX_CACHE = 1u << 1, /* prefix caching is exact for it */
	SM70_CAP_RECURRENT = 1u << 2,    /* per-sequence recurrent state slots */
};

struct sm70_arch_entry {
	const char *model_type;
	enum sm70_arch arch;
	/* Reads the family's own fields after the shared ones (model_config.c). */
	int (*parse)(const struct sm70__cfg *c, struct sm70_model_config *mc,
		     struct sm70_err *err);
	const struct sm70_arch_ops *ops;   /* NULL: known but not served (refused) */
	const char *refused;               /* why, when ops is NULL */
	const char *const *required_ops;   /* backend ops it calls that may be NULL */
	unsigned caps;
	const char *no_prefix_cache;       /* why prefix caching is off, without the cap */
};

/* The row of model_type, or NULL when the type is unknown. */
const struct sm70_arch_entry *sm70__arch_find(const char *model_type);

/* The row of a parsed config (never NULL after a successful parse). */
const struct sm70_arch_entry *sm70__arch_of(const struct sm70_model_config *mc);

/* "qwen3, qwen3_5, ...": the types that are served, for messages. */
const char *sm70__arch_supported(void);

/* 0 when be has every op the architecture (and, with MoE layers, mc) needs, else -ENOTSUP
 * naming the first one missing, the backend and the architecture. */
int sm70__arch_check_ops(const struct sm70_arch_entry *a, const struct sm70_model_config *mc,
			 const struct sm70_backend *be, struct sm70_err *err);

/* Family config parsers (model_config.c). */
int sm70__parse_qwen3(const struct sm70__cfg *c, struct sm70_model_config *mc,
		      struct sm70_err *err);
int sm70__parse_qwen3_moe(const struct sm70__cfg *c, struct sm70_model_config *mc,
			  struct sm70_err *err);
int sm70__parse_qwen3_5(const struct sm70__cfg *c, struct sm70_model_config *mc,
			struct sm70_err *err);
int sm70__parse_qwen4_exp(const struct sm70__cfg *c, struct sm70_model_config *mc,
			  struct sm70_err *err);

#endif
