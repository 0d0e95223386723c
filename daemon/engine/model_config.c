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
 * Non-goals: fields sm70 does not use; architectures other than qwen3 (for now).
 */
#include "daemon/engine/model_config.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#define CFG "config.json"
#define GEN "generation_config.json"

struct cfg {
	json_t *top;
	json_t *text; /* "text_config" object, or NULL */
};

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
 * default (unscaled, full-width) rotation is implemented. Sets *theta when it holds one.
 */
static int parse_rope_object(json_t *obj, const char *key, double *theta, struct sm70_err *err)
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
		if (json_number_value(v) != 1.0)
			return sm70_errf(err, -ENOTSUP,
					 CFG ": '%s.partial_rotary_factor' %g is not supported "
					 "(supported: 1)", key, json_number_value(v));
	}
	return 0;
}

static int parse_rope(const struct cfg *c, struct sm70_model_config *mc, struct sm70_err *err)
{
	const char *where;
	double theta;
	json_t *v;
	int ret;

	ret = get_number(c, "rope_theta", 10000.0, &theta, err);
	if (ret)
		return ret;
	/* transformers 5 writes rope_parameters; when present it is the newer truth. */
	for (int i = 0; i < 2; i++) {
		const char *key = i ? "rope_parameters" : "rope_scaling";
		char name[48];

		v = cfg_get(c, key, &where);
		if (!v)
			continue;
		snprintf(name, sizeof(name), "%s%s", where, key);
		ret = parse_rope_object(v, name, &theta, err);
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

int sm70_model_config_parse(struct sm70_model_config *mc, json_t *config,
			    json_t *generation_config, struct sm70_err *err)
{
	struct cfg c = { .top = config };
	const char *where, *type;
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

	v = cfg_get(&c, "model_type", &where);
	if (!v)
		return sm70_errf(err, -EINVAL, CFG ": missing required key 'model_type'");
	if (!json_is_string(v))
		return sm70_errf(err, -EINVAL, CFG ": '%smodel_type' must be a string", where);
	type = json_string_value(v);
	if (strcmp(type, "qwen3") != 0)
		return sm70_errf(err, -ENOTSUP,
				 CFG ": unsupported model_type '%s' (supported: qwen3)", type);
	mc->arch = SM70_ARCH_QWEN3;
	snprintf(mc->model_type, sizeof(mc->model_type), "%s", type);

	if ((ret = get_int(&c, "vocab_size", 1, 0, 1, 1 << 24, &mc->vocab_size, err)) ||
	    (ret = get_int(&c, "hidden_size", 1, 0, 1, 1 << 16, &mc->hidden_size, err)) ||
	    (ret = get_int(&c, "intermediate_size", 1, 0, 1, 1 << 20, &mc->intermediate_size,
			   err)) ||
	    (ret = get_int(&c, "num_hidden_layers", 1, 0, 1, 1024, &mc->n_layers, err)) ||
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

	/* generation_config.json is what transformers' generate() stops on, so it wins. */
	v = generation_config ? json_object_get(generation_config, "eos_token_id") : NULL;
	if (v && !json_is_null(v))
		return parse_eos(v, GEN, mc, err);
	v = cfg_get(&c, "eos_token_id", &where);
	if (v)
		return parse_eos(v, CFG, mc, err);
	return 0;
}
