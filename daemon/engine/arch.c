/*
 * arch.c - the architecture registry (see arch.h).
 */
#include "daemon/engine/arch.h"

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "daemon/engine/model.h"
#include "kernels/backend.h"

/* Backend op slots by name, for the required-ops check. */
static const struct {
	const char *name;
	size_t off;
} op_slots[] = {
	{ "conv1d_silu", offsetof(struct sm70_backend_ops, conv1d_silu) },
	{ "gdn", offsetof(struct sm70_backend_ops, gdn) },
	{ "gated_rmsnorm", offsetof(struct sm70_backend_ops, gated_rmsnorm) },
	{ "sigmoid_mul", offsetof(struct sm70_backend_ops, sigmoid_mul) },
	{ "moe_route", offsetof(struct sm70_backend_ops, moe_route) },
	{ "moe_experts", offsetof(struct sm70_backend_ops, moe_experts) },
	{ "sigmoid_scale_add", offsetof(struct sm70_backend_ops, sigmoid_scale_add) },
	{ "group_rmsnorm", offsetof(struct sm70_backend_ops, group_rmsnorm) },
	{ "hc_gates", offsetof(struct sm70_backend_ops, hc_gates) },
	{ "hc_combine", offsetof(struct sm70_backend_ops, hc_combine) },
	{ "hc_inject", offsetof(struct sm70_backend_ops, hc_inject) },
	{ "ngram_hist", offsetof(struct sm70_backend_ops, ngram_hist) },
	{ "ple_embed", offsetof(struct sm70_backend_ops, ple_embed) },
	{ "ple_gate", offsetof(struct sm70_backend_ops, ple_gate) },
	{ "ple_conv", offsetof(struct sm70_backend_ops, ple_conv) },
	{ "qsa_key_write", offsetof(struct sm70_backend_ops, qsa_key_write) },
	{ "qsa_compress", offsetof(struct sm70_backend_ops, qsa_compress) },
	{ "qsa_select", offsetof(struct sm70_backend_ops, qsa_select) },
	{ "sparse_attention", offsetof(struct sm70_backend_ops, sparse_attention) },
};

/* What any model with mixture-of-experts layers needs besides its family's ops. */
static const char *const moe_ops[] = { "moe_route", "moe_experts", "sigmoid_scale_add",
				       NULL };

static const char *const hybrid_ops[] = { "conv1d_silu", "gdn", "gated_rmsnorm",
					  "sigmoid_mul", NULL };

/* qwen4_exp: the hybrid ops, hyper-connections, PLE and QSA (its MoE ops come with every
 * model that has MoE layers) */
static const char *const qwen4_ops[] = { "conv1d_silu", "gdn", "gated_rmsnorm",
					 "sigmoid_mul", "group_rmsnorm", "hc_gates",
					 "hc_combine", "hc_inject", "ngram_hist", "ple_embed",
					 "ple_gate", "ple_conv", "qsa_key_write", "qsa_compress",
					 "qsa_select", "sparse_attention", NULL };

#define HYBRID_NO_PREFIX "its recurrent (DeltaNet) state at a cached prefix is not kept"

static const struct sm70_arch_entry arches[] = {
	{ "qwen3", SM70_ARCH_QWEN3, sm70__parse_qwen3, &sm70__arch_qwen3, NULL, NULL,
	  SM70_CAP_TP | SM70_CAP_PREFIX_CACHE, NULL },
	{ "qwen3_5_text", SM70_ARCH_QWEN3_5, sm70__parse_qwen3_5, &sm70__arch_qwen3_5, NULL,
	  hybrid_ops, SM70_CAP_TP | SM70_CAP_RECURRENT, HYBRID_NO_PREFIX },
	/* the vision-language layout: text weights under model.language_model. */
	{ "qwen3_5", SM70_ARCH_QWEN3_5, sm70__parse_qwen3_5, &sm70__arch_qwen3_5, NULL,
	  hybrid_ops, SM70_CAP_TP | SM70_CAP_RECURRENT, HYBRID_NO_PREFIX },
	/* MoE layers (with a shared expert) where decoder_sparse_step and mlp_only_layers
	 * say, dense MLPs elsewhere */
	{ "qwen3_next", SM70_ARCH_QWEN3_5, sm70__parse_qwen3_5, &sm70__arch_qwen3_5, NULL,
	  hybrid_ops, SM70_CAP_TP | SM70_CAP_RECURRENT, HYBRID_NO_PREFIX },
	{ "qwen3_moe", SM70_ARCH_QWEN3, sm70__parse_qwen3_moe, &sm70__arch_qwen3, NULL, NULL,
	  SM70_CAP_TP | SM70_CAP_PREFIX_CACHE, NULL },
	{ "qwen3_5_moe_text", SM70_ARCH_QWEN3_5, sm70__parse_qwen3_5, &sm70__arch_qwen3_5, NULL,
	  hybrid_ops, SM70_CAP_TP | SM70_CAP_RECURRENT, HYBRID_NO_PREFIX },
	{ "qwen3_5_moe", SM70_ARCH_QWEN3_5, sm70__parse_qwen3_5, &sm70__arch_qwen3_5, NULL,
	  hybrid_ops, SM70_CAP_TP | SM70_CAP_RECURRENT, HYBRID_NO_PREFIX },
	{ "qwen4_exp_text", SM70_ARCH_QWEN4_EXP, sm70__parse_qwen4_exp, &sm70__arch_qwen4_exp,
	  NULL, qwen4_ops, SM70_CAP_TP | SM70_CAP_RECURRENT, HYBRID_NO_PREFIX },
	{ "qwen4_exp", SM70_ARCH_QWEN4_EXP, sm70__parse_qwen4_exp, &sm70__arch_qwen4_exp, NULL,
	  qwen4_ops, SM70_CAP_TP | SM70_CAP_RECURRENT, HYBRID_NO_PREFIX },
};

#define N_ARCHES (sizeof(arches) / sizeof(arches[0]))

const struct sm70_arch_entry *sm70__arch_find(const char *model_type)
{
	for (size_t i = 0; i < N_ARCHES; i++)
		if (strcmp(arches[i].model_type, model_type) == 0)
			return &arches[i];
	return NULL;
}

const struct sm70_arch_entry *sm70__arch_of(const struct sm70_model_config *mc)
{
	return sm70__arch_find(mc->model_type);
}

const char *sm70__arch_supported(void)
{
	static char list[256];

	if (!list[0]) {
		size_t n = 0;
		for (size_t i = 0; i < N_ARCHES; i++) {
			if (!arches[i].ops)
				continue;
			n += (size_t)snprintf(list + n, sizeof(list) - n, "%s%s", n ? ", " : "",
					      arches[i].model_type);
		}
	}
	return list;
}

static int check_list(const struct sm70_arch_entry *a, const char *const *list,
		      const struct sm70_backend *be, struct sm70_err *err)
{
	for (const char *const *name = list; list && *name; name++)
		for (size_t i = 0; i < sizeof(op_slots) / sizeof(op_slots[0]); i++) {
			void (*fn)(void);
			if (strcmp(op_slots[i].name, *name))
				continue;
			/* every slot is a function pointer; all have one size and representation */
			memcpy(&fn, (const char *)be->ops + op_slots[i].off, sizeof(fn));
			if (!fn)
				return sm70_errf(err, -ENOTSUP, "the %s backend has no '%s' op, which "
						 "%s models need", be->name, *name, a->model_type);
		}
	return 0;
}

int sm70__arch_check_ops(const struct sm70_arch_entry *a, const struct sm70_model_config *mc,
			 const struct sm70_backend *be, struct sm70_err *err)
{
	int ret = check_list(a, a->required_ops, be, err);

	return ret ? ret : mc->moe.n_moe_layers ? check_list(a, moe_ops, be, err) : 0;
}
