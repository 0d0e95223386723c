/*
 * model_config.c - reads the hyper-parameters sm70 uses from a Hugging Face config.json
 * (and eos_token_id from generation_config.json), checking type, range and consistency of
 * each so that the engine can size buffers from them without further checks.
 *
 * A key is looked up at the top level first, then under "text_config" (the layout of
 * vision-language checkpoints). Features that would silently change the model's output if
 * ignored (rope scaling, partial rotary, sliding windows, attention biases) are refused
 * with -ENOTSUP rather than skipped.
 *
 * The shared fields are read here once; each family's own fields by its parser
 * (sm70__parse_qwen3, sm70__parse_qwen3_5), chosen by the registry row of model_type
 * (arch.c).
 *
 * Non-goals: fields sm70 does not use.
 */
#include "daemon/engine/model_config.h"

#include <errno.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "daemon/engine/arch.h"

#define CFG "config.json"
#define GEN "generation_config.json"

struct sm70__cfg {
	json_t *top;
	json_t *text; /* "text_config" object, or NULL */
	double partial_rotary; /* partial_rotary_factor, from wherever it was found (1.0) */
	char partial_key[96];  /* the key it came from, for messages ("" when absent) */
};
#define cfg sm70__cfg

/* The value of key (NULL when absent or null); *where gets "" or "text_config." so that
 * messages name the key where it was found. */
static json_t *cfg_get(const struct cfg *c, const char *key, const char **where)
{
	json_t *v = json_object_get(c->top, key);

	*where = "";
	if (v && !json_is_null(v))
		return v;
	if (c->text) {
		v = json_object_get(c->text, key);
		if (v && !json_is_null(v)) {
			*where = "text_config.";
			return v;
		}
	}
	return NULL;
}

/*
 * Reads integer key into *out, which must lie in [lo, hi]. When the key is absent,
 * required keys fail and optional ones take def. Returns 0 or -EINVAL naming the key.
 */
static int get_int(const struct cfg *c, const char *key, int required, int def, long long lo,
		   long long hi, int *out, struct sm70_err *err)
{
	const char *where;
	json_t *v = cfg_get(c, key, &where);
	long long x;

	if (!v) {
		if (required)
			return sm70_errf(err, -EINVAL, CFG ": missing required key '%s'", key);
		*out = def;
		return 0;
	}
	if (!json_is_integer(v))
		return sm70_errf(err, -EINVAL, CFG ": '%s%s' must be an integer", where, key);
	x = json_integer_value(v);
	if (x < lo || x > hi)
		return sm70_errf(err, -EINVAL, CFG ": '%s%s' (%lld) must be between %lld and %lld",
				 where, key, x, lo, hi);
	*out = (int)x;
	return 0;
}

/* Reads number key (integer or real) into *out; absent keys take def. */
static int get_number(const struct cfg *c, const char *key, double def, double *out,
		      struct sm70_err *err)
{
	const char *where;
	json_t *v = cfg_get(c, key, &where);

	if (!v) {
		*out = def;
		return 0;
	}
	if (!json_is_number(v))
		return sm70_errf(err, -EINVAL, CFG ": '%s%s' must be a number", where, key);
	*out = json_number_value(v);
	return 0;
}

/* Reads boolean key into *out (0/1); absent keys take def. */
static int get_bool(const struct cfg *c, const char *key, int def, int *out,
		    struct sm70_err *err)
{
	const char *where;
	json_t *v = cfg_get(c, key, &where);

	if (!v) {
		*out = def;
		return 0;
	}
	if (!json_is_boolean(v))
		return sm70_errf(err, -EINVAL, CFG ": '%s%s' must be true or false", where, key);
	*out = json_is_true(v);
	return 0;
}

/*
 * Checks a rope parameter object ("rope_parameters" or the older "rope_scaling"): only the
 * default (unscaled) rotation is implemented. Sets *theta and *partial (with the key it
 * came from) when it holds them; the family decides whether a partial rotation is
 * allowed. (mrope sections only matter for image/video positions: for text all three
 * position streams are the token's position, which is plain RoPE.)
 */
static int parse_rope_object(json_t *obj, const char *key, double *theta, struct cfg *c,
			     struct sm70_err *err)
{
	json_t *type, *v;

	if (!json_is_object(obj))
		return sm70_errf(err, -EINVAL, CFG ": '%s' must be an object", key);
	type = json_object_get(obj, "rope_type");
	if (!type || json_is_null(type))
		type = json_object_get(obj, "type");
	if (type && !json_is_null(type)) {
		if (!json_is_string(type))
			return sm70_errf(err, -EINVAL, CFG ": '%s.rope_type' must be a string", key);
		if (strcmp(json_string_value(type), "default") != 0)
			return sm70_errf(err, -ENOTSUP,
					 CFG ": %s rope_type '%s' is not supported "
					 "(supported: default)", key, json_string_value(type));
	}
	v = json_object_get(obj, "rope_theta");
	if (v && !json_is_null(v)) {
		if (!json_is_number(v))
			return sm70_errf(err, -EINVAL, CFG ": '%s.rope_theta' must be a number",
					 key);
		*theta = json_number_value(v);
	}
	v = json_object_get(obj, "partial_rotary_factor");
	if (v && !json_is_null(v)) {
		if (!json_is_number(v))
			return sm70_errf(err, -EINVAL,
					 CFG ": '%s.partial_rotary_factor' must be a number", key);
		c->partial_rotary = json_number_value(v);
		snprintf(c->partial_key, sizeof(c->partial_key), "%s.partial_rotary_factor", key);
	}
	return 0;
}

static int parse_rope(struct cfg *c, struct sm70_model_config *mc, struct sm70_err *err)
{
	const char *where;
	double theta;
	json_t *v;
	int ret;

	ret = get_number(c, "rope_theta", 10000.0, &theta, err);
	if (ret)
		return ret;
	ret = get_number(c, "partial_rotary_factor", 1.0, &c->partial_rotary, err);
	if (ret)
		return ret;
	if (cfg_get(c, "partial_rotary_factor", &where))
		snprintf(c->partial_key, sizeof(c->partial_key), "%spartial_rotary_factor", where);
	/* transformers 5 writes rope_parameters; when present it is the newer truth. */
	for (int i = 0; i < 2; i++) {
		const char *key = i ? "rope_parameters" : "rope_scaling";
		char name[48];

		v = cfg_get(c, key, &where);
		if (!v)
			continue;
		snprintf(name, sizeof(name), "%s%s", where, key);
		ret = parse_rope_object(v, name, &theta, c, err);
		if (ret)
			return ret;
	}
	if (!isfinite(theta) || theta <= 0.0)
		return sm70_errf(err, -EINVAL, CFG ": 'rope_theta' (%g) must be a positive number",
				 theta);
	mc->rope_theta = theta;
	mc->rot_dim = mc->head_dim;
	return 0;
}

/* Reads eos ids from v (an int or an array of ints) found in file src. */
static int parse_eos(json_t *v, const char *src, struct sm70_model_config *mc,
		     struct sm70_err *err)
{
	size_t n = json_is_array(v) ? json_array_size(v) : 1;

	if (!json_is_integer(v) && !json_is_array(v))
		return sm70_errf(err, -EINVAL,
				 "%s: 'eos_token_id' must be an integer or an array of integers",
				 src);
	if (n > SM70_MAX_EOS)
		return sm70_errf(err, -EINVAL, "%s: 'eos_token_id' lists %zu ids (at most %d)",
				 src, n, SM70_MAX_EOS);
	for (size_t i = 0; i < n; i++) {
		json_t *e = json_is_array(v) ? json_array_get(v, i) : v;
		long long id;

		if (!json_is_integer(e))
			return sm70_errf(err, -EINVAL,
					 "%s: 'eos_token_id' must be an integer or an array of "
					 "integers", src);
		id = json_integer_value(e);
		if (id < 0 || id >= mc->vocab_size)
			return sm70_errf(err, -EINVAL,
					 "%s: 'eos_token_id' %lld is outside the vocabulary "
					 "(%d tokens)", src, id, mc->vocab_size);
		mc->eos_ids[i] = (int)id;
	}
	mc->n_eos = (int)n;
	return 0;
}

/* Flags whose "true" changes the computation in ways the engine does not implement. */
static int refuse_flags(const struct cfg *c, struct sm70_err *err)
{
	static const char *const flags[] = { "use_sliding_window", "attention_bias" };
	int on, ret;

	for (size_t i = 0; i < sizeof(flags) / sizeof(flags[0]); i++) {
		ret = get_bool(c, flags[i], 0, &on, err);
		if (ret)
			return ret;
		if (on)
			return sm70_errf(err, -ENOTSUP, CFG ": '%s' true is not supported",
					 flags[i]);
	}
	return 0;
}

/* The model_type that decides the family: the top level's, unless it names a wrapper whose
 * text_config says more (both are in the registry; the top level wins, as transformers
 * builds the top-level class). */
static int model_type(const struct cfg *c, const struct sm70_arch_entry **row,
		      struct sm70_model_config *mc, struct sm70_err *err)
{
	const char *where, *type;
	json_t *v = cfg_get(c, "model_type", &where);

	if (!v)
		return sm70_errf(err, -EINVAL, CFG ": missing required key 'model_type'");
	if (!json_is_string(v))
		return sm70_errf(err, -EINVAL, CFG ": '%smodel_type' must be a string", where);
	type = json_string_value(v);
	*row = sm70__arch_find(type);
	if (!*row)
		return sm70_errf(err, -ENOTSUP, CFG ": unsupported model_type '%s' (supported: %s)",
				 type, sm70__arch_supported());
	if (!(*row)->ops)
		return sm70_errf(err, -ENOTSUP, CFG ": model_type '%s' is not supported yet: %s "
				 "(supported: %s)", type, (*row)->refused, sm70__arch_supported());
	mc->arch = (*row)->arch;
	snprintf(mc->model_type, sizeof(mc->model_type), "%s", type);
	return 0;
}

int sm70_model_config_parse(struct sm70_model_config *mc, json_t *config,
			    json_t *generation_config, struct sm70_err *err)
{
	struct cfg c = { .top = config, .partial_rotary = 1.0 };
	const struct sm70_arch_entry *row = NULL;
	const char *where;
	json_t *v;
	double eps;
	int ret;

	memset(mc, 0, sizeof(*mc));
	if (!json_is_object(config))
		return sm70_errf(err, -EINVAL, CFG ": top level is not a JSON object");
	if (generation_config && !json_is_object(generation_config))
		return sm70_errf(err, -EINVAL, GEN ": top level is not a JSON object");
	v = json_object_get(config, "text_config");
	if (v && !json_is_null(v)) {
		if (!json_is_object(v))
			return sm70_errf(err, -EINVAL, CFG ": 'text_config' must be an object");
		c.text = v;
	}
	ret = model_type(&c, &row, mc, err);
	if (ret)
		return ret;

	if ((ret = get_int(&c, "vocab_size", 1, 0, 1, 1 << 24, &mc->vocab_size, err)) ||
	    (ret = get_int(&c, "hidden_size", 1, 0, 1, 1 << 16, &mc->hidden_size, err)) ||
	    /* checked below: only models with a dense MLP layer need it */
	    (ret = get_int(&c, "intermediate_size", 0, 0, 1, 1 << 20, &mc->intermediate_size,
			   err)) ||
	    (ret = get_int(&c, "num_hidden_layers", 1, 0, 1, SM70_MAX_LAYERS, &mc->n_layers,
			   err)) ||
	    (ret = get_int(&c, "num_attention_heads", 1, 0, 1, 1024, &mc->n_heads, err)) ||
	    (ret = get_int(&c, "num_key_value_heads", 0, mc->n_heads, 1, 1024, &mc->n_kv_heads,
			   err)))
		return ret;
	if (mc->n_heads % mc->n_kv_heads)
		return sm70_errf(err, -EINVAL,
				 CFG ": 'num_attention_heads' (%d) is not a multiple of "
				 "'num_key_value_heads' (%d)", mc->n_heads, mc->n_kv_heads);

	if (!cfg_get(&c, "head_dim", &where) && mc->hidden_size % mc->n_heads)
		return sm70_errf(err, -EINVAL,
				 CFG ": no 'head_dim', and 'hidden_size' (%d) is not a multiple of "
				 "'num_attention_heads' (%d)", mc->hidden_size, mc->n_heads);
	ret = get_int(&c, "head_dim", 0, mc->hidden_size / mc->n_heads, 1, 4096, &mc->head_dim,
		      err);
	if (ret)
		return ret;
	/* RoPE rotates pairs of dimensions. */
	if (mc->head_dim % 2)
		return sm70_errf(err, -EINVAL, CFG ": 'head_dim' (%d) must be even", mc->head_dim);

	if ((ret = get_int(&c, "max_position_embeddings", 0, 32768, 1, 1 << 24,
			   &mc->max_position, err)) ||
	    (ret = get_bool(&c, "tie_word_embeddings", 0, &mc->tie_word_embeddings, err)) ||
	    (ret = get_number(&c, "rms_norm_eps", 1e-6, &eps, err)))
		return ret;
	/* The kernels add eps in f32: it must stay a positive f32, and a large one is a typo. */
	if (!isfinite(eps) || eps <= 0.0 || eps >= 1.0 || (float)eps <= 0.0f)
		return sm70_errf(err, -EINVAL, CFG ": 'rms_norm_eps' (%g) must be in (0, 1)", eps);
	mc->rms_norm_eps = (float)eps;

	ret = parse_rope(&c, mc, err);
	if (ret)
		return ret;
	ret = refuse_flags(&c, err);
	if (ret)
		return ret;
	/* every layer is attention unless the family says otherwise */
	mc->n_attn_layers = mc->n_layers;
	ret = row->parse(&c, mc, err);
	if (ret)
		return ret;
	if (mc->moe.n_moe_layers < mc->n_layers && !mc->intermediate_size)
		return sm70_errf(err, -EINVAL, CFG ": missing required key 'intermediate_size'");

	/* generation_config.json is what transformers' generate() stops on, so it wins. */
	v = generation_config ? json_object_get(generation_config, "eos_token_id") : NULL;
	if (v && !json_is_null(v))
		return parse_eos(v, GEN, mc, err);
	v = cfg_get(&c, "eos_token_id", &where);
	if (v)
		return parse_eos(v, CFG, mc, err);
	return 0;
}

/* ---- families ----------------------------------------------------------------------- */

int sm70__parse_qwen3(const struct cfg *c, struct sm70_model_config *mc, struct sm70_err *err)
{
	if (c->partial_rotary != 1.0)
		return sm70_errf(err, -ENOTSUP, CFG ": '%s' %g is not supported for %s "
				 "(supported: 1)", c->partial_key, c->partial_rotary,
				 mc->model_type);
	return 0;
}

/* Reads layer_types (or the full_attention_interval pattern it defaults to). */
static int parse_layer_types(const struct cfg *c, struct sm70_model_config *mc,
			     struct sm70_err *err)
{
	const char *where;
	json_t *v = cfg_get(c, "layer_types", &where);
	int interval, ret;

	mc->n_attn_layers = 0;
	if (!v) {
		ret = get_int(c, "full_attention_interval", 0, 4, 1, SM70_MAX_LAYERS, &interval,
			      err);
		if (ret)
			return ret;
		for (int l = 0; l < mc->n_layers; l++)
			mc->layer_kind[l] = (l + 1) % interval ? SM70_LAYER_GDN :
								  SM70_LAYER_ATTENTION;
	} else {
		if (!json_is_array(v))
			return sm70_errf(err, -EINVAL, CFG ": '%slayer_types' must be an array of "
					 "strings", where);
		if (json_array_size(v) != (size_t)mc->n_layers)
			return sm70_errf(err, -EINVAL, CFG ": '%slayer_types' lists %zu layers, "
					 "'num_hidden_layers' is %d", where, json_array_size(v),
					 mc->n_layers);
		for (int l = 0; l < mc->n_layers; l++) {
			json_t *e = json_array_get(v, (size_t)l);
			const char *k = json_is_string(e) ? json_string_value(e) : NULL;

			/* qwen4_exp: every full-attention layer is QSA (transformers renames
			 * the "full_attention" of real checkpoints) */
			if (k && (strcmp(k, "full_attention") == 0 ||
				  (mc->arch == SM70_ARCH_QWEN4_EXP &&
				   strcmp(k, "qwen_sparse_attention") == 0)))
				mc->layer_kind[l] = SM70_LAYER_ATTENTION;
			else if (k && strcmp(k, "linear_attention") == 0)
				mc->layer_kind[l] = SM70_LAYER_GDN;
			else
				return sm70_errf(err, -ENOTSUP, CFG ": '%slayer_types[%d]' %s%s%s is "
						 "not supported (supported: full_attention, "
						 "linear_attention%s)", where, l, k ? "'" : "",
						 k ? k : "(not a string)", k ? "'" : "",
						 mc->arch == SM70_ARCH_QWEN4_EXP ?
							 ", qwen_sparse_attention" : "");
		}
	}
	for (int l = 0; l < mc->n_layers; l++)
		mc->n_attn_layers += mc->layer_kind[l] == SM70_LAYER_ATTENTION;
	mc->hybrid.n_gdn_layers = mc->n_layers - mc->n_attn_layers;
	if (mc->n_attn_layers == 0)
		return sm70_errf(err, -ENOTSUP, CFG ": '%slayer_types' has no full_attention "
				 "layer; a model of DeltaNet layers only is not supported", where);
	return 0;
}

/* A family's MoE defaults: what transformers assumes for an absent key. */
struct moe_defaults {
	int all_sparse;  /* every layer is MoE (qwen3_5_moe, qwen4_exp): no mlp_only_layers,
			  * no step */
	int keep_renorm; /* all_sparse, but norm_topk_prob is honoured (qwen4_exp) */
	int experts, top_k, inter, shared_inter; /* shared_inter 0: no shared expert */
	int renorm;
};

/*
 * Which layers are mixture-of-experts and their sizes. With all_sparse (qwen3_5_moe)
 * every layer is; otherwise (qwen3_moe, qwen3_next) layer l is unless it is listed in
 * mlp_only_layers, num_experts is 0, or (l + 1) is not a multiple of decoder_sparse_step.
 * The expert count is "num_experts", which transformers 5 saves as "num_local_experts".
 */
static int parse_moe(const struct cfg *c, struct sm70_model_config *mc,
		     const struct moe_defaults *d, struct sm70_err *err)
{
	struct sm70_moe_config *e = &mc->moe;
	const char *where;
	json_t *only = cfg_get(c, "mlp_only_layers", &where);
	int all_sparse = d->all_sparse, step = 1, ret;
	const char *n_key = cfg_get(c, "num_experts", &where) || !cfg_get(c, "num_local_experts",
									  &where) ?
			    "num_experts" : "num_local_experts";

	only = cfg_get(c, "mlp_only_layers", &where);
	if ((ret = get_int(c, n_key, 0, d->experts, 0, 1 << 16, &e->n_experts, err)) ||
	    (!all_sparse &&
	     (ret = get_int(c, "decoder_sparse_step", 0, 1, 1, SM70_MAX_LAYERS, &step, err))) ||
	    (ret = get_bool(c, "norm_topk_prob", d->renorm, &e->renorm, err)))
		return ret;
	if (all_sparse && !d->keep_renorm)
		e->renorm = 1; /* qwen3_5_moe always renormalises */
	if (only && !json_is_array(only))
		return sm70_errf(err, -EINVAL, CFG ": '%smlp_only_layers' must be an array of "
				 "layer indices", where);
	for (size_t i = 0; only && i < json_array_size(only); i++) {
		json_t *v = json_array_get(only, i);
		if (!json_is_integer(v) || json_integer_value(v) < 0 ||
		    json_integer_value(v) >= mc->n_layers)
			return sm70_errf(err, -EINVAL, CFG ": '%smlp_only_layers[%zu]' must be a "
					 "layer index below %d", where, i, mc->n_layers);
	}
	for (int l = 0; l < mc->n_layers; l++) {
		int dense = !all_sparse && (e->n_experts == 0 || (l + 1) % step != 0);

		for (size_t i = 0; !all_sparse && only && i < json_array_size(only); i++)
			dense |= json_integer_value(json_array_get(only, i)) == l;
		mc->layer_moe[l] = !dense;
		e->n_moe_layers += !dense;
	}
	if (!e->n_moe_layers)
		return 0;
	if (e->n_experts < 1)
		return sm70_errf(err, -EINVAL, CFG ": '%s' must be at least 1 for "
				 "mixture-of-experts layers", n_key);
	if ((ret = get_int(c, "num_experts_per_tok", 0, d->top_k, 1, 64, &e->top_k, err)) ||
	    (ret = get_int(c, "moe_intermediate_size", 0, d->inter, 1, 1 << 20, &e->inter,
			   err)))
		return ret;
	if (e->top_k > e->n_experts)
		return sm70_errf(err, -EINVAL, CFG ": 'num_experts_per_tok' (%d) exceeds "
				 "'num_experts' (%d)", e->top_k, e->n_experts);
	if (d->shared_inter) {
		ret = get_int(c, "shared_expert_intermediate_size", 0, d->shared_inter, 1, 1 << 20,
			      &e->shared_inter, err);
		if (ret)
			return ret;
	}
	return 0;
}

int sm70__parse_qwen3_moe(const struct cfg *c, struct sm70_model_config *mc,
			  struct sm70_err *err)
{
	static const struct moe_defaults d = { 0, 0, 128, 8, 768, 0, 0 };
	int ret = sm70__parse_qwen3(c, mc, err);

	return ret ? ret : parse_moe(c, mc, &d, err);
}

int sm70__parse_qwen3_5(const struct cfg *c, struct sm70_model_config *mc,
			struct sm70_err *err)
{
	struct sm70_gdn_config *g = &mc->hybrid.gdn;
	const char *where;
	json_t *act;
	double rot;
	int ret;

	mc->zero_centred_norms = 1;
	mc->attn_gate = 1;
	mc->hybrid.fused_proj = strcmp(mc->model_type, "qwen3_next") == 0;
	/* transformers' default for the family when the key is absent */
	rot = cfg_get(c, "partial_rotary_factor", &where) || c->partial_key[0] ?
		      c->partial_rotary : 0.25;
	if (!(rot > 0.0 && rot <= 1.0))
		return sm70_errf(err, -EINVAL, CFG ": '%s' (%g) must be in (0, 1]",
				 c->partial_key[0] ? c->partial_key : "partial_rotary_factor", rot);
	mc->rot_dim = (int)(mc->head_dim * rot);
	if (mc->rot_dim < 2 || mc->rot_dim % 2)
		return sm70_errf(err, -EINVAL, CFG ": 'partial_rotary_factor' %g of head_dim %d "
				 "rotates %d dimensions; that must be a positive even number", rot,
				 mc->head_dim, mc->rot_dim);
	act = cfg_get(c, "hidden_act", &where);
	if (act && (!json_is_string(act) || strcmp(json_string_value(act), "silu")))
		return sm70_errf(err, -ENOTSUP, CFG ": '%shidden_act' must be \"silu\"", where);
	if ((ret = get_int(c, "linear_conv_kernel_dim", 0, 4, 1, 16, &g->conv_k, err)) ||
	    (ret = get_int(c, "linear_key_head_dim", 0, 128, 1, 1024, &g->k_dim, err)) ||
	    (ret = get_int(c, "linear_value_head_dim", 0, 128, 1, 1024, &g->v_dim, err)) ||
	    (ret = get_int(c, "linear_num_key_heads", 0, 16, 1, 1024, &g->n_k_heads, err)) ||
	    (ret = get_int(c, "linear_num_value_heads", 0, 32, 1, 1024, &g->n_v_heads, err)))
		return ret;
	if (g->n_v_heads % g->n_k_heads)
		return sm70_errf(err, -EINVAL, CFG ": 'linear_num_value_heads' (%d) is not a "
				 "multiple of 'linear_num_key_heads' (%d)", g->n_v_heads,
				 g->n_k_heads);
	ret = parse_layer_types(c, mc, err);
	if (ret)
		return ret;
	if (mc->hybrid.fused_proj) { /* qwen3_next: sparse by the rule */
		static const struct moe_defaults next = { 0, 0, 512, 10, 512, 512, 1 };
		return parse_moe(c, mc, &next, err);
	}
	if (strncmp(mc->model_type, "qwen3_5_moe", 11) == 0) {
		static const struct moe_defaults q35 = { 1, 0, 256, 8, 512, 512, 1 };
		return parse_moe(c, mc, &q35, err);
	}
	return 0;
}

/* get_int over a long long range (the n-gram vocabulary base and the seed). */
static int get_ll(const struct cfg *c, const char *key, long long def, long long lo,
		  long long hi, long long *out, struct sm70_err *err)
{
	const char *where;
	json_t *v = cfg_get(c, key, &where);

	if (!v) {
		*out = def;
		return 0;
	}
	if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
		return sm70_errf(err, -EINVAL, CFG ": '%s%s' must be an integer between %lld and "
				 "%lld", where, key, lo, hi);
	*out = json_integer_value(v);
	return 0;
}

/* ple_layer_ids: one-indexed DeltaNet layers, as a set (transformers sorts and dedups). */
static int parse_ple_layers(const struct cfg *c, struct sm70_model_config *mc,
			    struct sm70_err *err)
{
	struct sm70_qwen4_config *q = &mc->q4;
	const char *where;
	json_t *v = cfg_get(c, "ple_layer_ids", &where);
	uint8_t on[SM70_MAX_LAYERS] = { 0 };

	for (int l = 0; l < mc->n_layers; l++)
		q->ple_index[l] = -1;
	if (v && !json_is_array(v))
		return sm70_errf(err, -EINVAL, CFG ": '%sple_layer_ids' must be an array of "
				 "layer ids", where);
	for (size_t i = 0; v && i < json_array_size(v); i++) {
		json_t *e = json_array_get(v, i);
		long long id = json_is_integer(e) ? json_integer_value(e) : 0;

		if (id < 1 || id > mc->n_layers)
			return sm70_errf(err, -EINVAL, CFG ": '%sple_layer_ids[%zu]' must be a "
					 "one-indexed layer id in 1..%d", where, i, mc->n_layers);
		if (mc->layer_kind[id - 1] != SM70_LAYER_GDN)
			return sm70_errf(err, -EINVAL, CFG ": '%sple_layer_ids[%zu]' (%lld) names "
					 "an attention layer; PLE is only defined on "
					 "linear_attention layers", where, i, id);
		on[id - 1] = 1;
	}
	for (int l = 0; l < mc->n_layers; l++)
		if (on[l])
			q->ple_index[l] = (int16_t)q->n_ple++;
	return 0;
}

int sm70__parse_qwen4_exp(const struct cfg *c, struct sm70_model_config *mc,
			  struct sm70_err *err)
{
	static const struct moe_defaults d = { 1, 1, 512, 10, 512, 512, 1 };
	static const char *const qsa_keys[] = { "indexer_n_heads", "indexer_kv_heads",
						"indexer_head_dim", "indexer_budget",
						"indexer_compress_ratio" };
	struct sm70_qwen4_config *q = &mc->q4;
	const char *where;
	json_t *gate;
	const char *gate_key;
	int kv_heads, ret;

	ret = sm70__parse_qwen3_5(c, mc, err);
	if (ret)
		return ret;
	mc->moe.n_moe_layers = 0;
	memset(mc->layer_moe, 0, sizeof(mc->layer_moe));
	ret = parse_moe(c, mc, &d, err);
	if (ret)
		return ret;
	/* the DeltaNet output norm's gate: output_gate_type, else hidden_act (as transformers
	 * takes it; it was checked to be silu above), silu or sigmoid */
	gate_key = "output_gate_type";
	gate = cfg_get(c, gate_key, &where);
	if (!gate || json_is_null(gate)) {
		gate_key = "hidden_act";
		gate = cfg_get(c, gate_key, &where);
	}
	if (gate && (!json_is_string(gate) || (strcmp(json_string_value(gate), "silu") &&
						strcmp(json_string_value(gate), "sigmoid"))))
		return sm70_errf(err, -EINVAL, CFG ": '%s%s' must be \"silu\" or \"sigmoid\" "
				 "(the DeltaNet output gate)", where, gate_key);
	mc->hybrid.gdn.gate_sigmoid = gate && strcmp(json_string_value(gate), "sigmoid") == 0;
	if ((ret = get_int(c, "hc_count", 0, 4, 2, 64, &q->hc, err)) ||
	    (ret = get_int(c, "hc_lowrank", 0, 320, 1, 1 << 16, &q->hc_rank, err)))
		return ret;
	/* QSA: transformers builds an indexer on every attention layer, so the keys are
	 * required (it fails without them too) */
	for (size_t i = 0; i < sizeof(qsa_keys) / sizeof(qsa_keys[0]); i++)
		if (!cfg_get(c, qsa_keys[i], &where))
			return sm70_errf(err, -EINVAL, CFG ": missing required key '%s' (qwen4_exp "
					 "attention layers are QSA)", qsa_keys[i]);
	if ((ret = get_int(c, "indexer_n_heads", 1, 0, 1, 1024, &q->idx_heads, err)) ||
	    (ret = get_int(c, "indexer_kv_heads", 1, 0, 1, 1, &kv_heads, err)) ||
	    (ret = get_int(c, "indexer_head_dim", 1, 0, 2, 4096, &q->idx_dim, err)) ||
	    (ret = get_int(c, "indexer_budget", 1, 0, 1, 1 << 20, &q->idx_budget, err)) ||
	    (ret = get_int(c, "indexer_compress_ratio", 1, 0, 1, 4096, &q->idx_ratio, err)))
		return ret;
	if (q->idx_budget % q->idx_ratio)
		return sm70_errf(err, -EINVAL, CFG ": 'indexer_budget' (%d) must be a multiple of "
				 "'indexer_compress_ratio' (%d)", q->idx_budget, q->idx_ratio);
	if (mc->rot_dim > q->idx_dim)
		return sm70_errf(err, -EINVAL, CFG ": the attention's RoPE rotates %d dimensions, "
				 "more than 'indexer_head_dim' (%d)", mc->rot_dim, q->idx_dim);
	ret = parse_ple_layers(c, mc, err);
	if (ret)
		return ret;
	if ((ret = get_int(c, "ple_embed_dim", 0, mc->hidden_size, 1, 1 << 20, &q->ple_dim,
			   err)) ||
	    (ret = get_int(c, "ple_conv_kernel_size", 0, 4, 1, 64, &q->ple_conv_k, err)) ||
	    (ret = get_int(c, "ngram_size", 0, 3, 2, 16, &q->ngram, err)) ||
	    (ret = get_int(c, "heads_per_ngram", 0, 8, 1, 1024, &q->heads_per_ngram, err)) ||
	    (ret = get_ll(c, "ngram_vocab_size_base", 20000000, 2, 1LL << 40, &q->ngram_base,
			  err)) ||
	    (ret = get_int(c, "make_ngram_vocab_size_divisible_by", 0, 128, 1, 1 << 20,
			   &q->ngram_div, err)) ||
	    (ret = get_ll(c, "seed", 1234, 0, INT64_MAX, &q->seed, err)) ||
	    (ret = get_int(c, "split_ngram_parts", 0, 512, 1, 1 << 20, &q->split_parts, err)))
		return ret;
	if (q->n_ple) {
		int heads = (q->ngram - 1) * q->heads_per_ngram;

		if (q->ple_dim % heads)
			return sm70_errf(err, -EINVAL, CFG ": 'ple_embed_dim' (%d) must be a multiple "
					 "of the n-gram heads ((ngram_size - 1) * heads_per_ngram "
					 "= %d)", q->ple_dim, heads);
		json_t *eos = cfg_get(c, "eos_token_id", &where);

		/* config.json's, not generation_config's: the model reads its own config */
		if (eos && json_is_array(eos))
			eos = json_array_get(eos, 0);
		if (!eos || !json_is_integer(eos) || json_integer_value(eos) < 0 ||
		    json_integer_value(eos) >= mc->vocab_size)
			return sm70_errf(err, -EINVAL, CFG ": 'eos_token_id' must be a token id when "
					 "'ple_layer_ids' is set (the n-gram window resets at EOS)");
		q->ple_eos = (int32_t)json_integer_value(eos);
	}
	return 0;
}
