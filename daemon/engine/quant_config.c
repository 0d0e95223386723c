/*
 * quant_config.c - reads a checkpoint's quantization declaration (see quant_config.h):
 * config.json's quantization_config in ModelOpt's or compressed-tensors' form, and
 * ModelOpt's hf_quant_config.json.
 *
 * The keys follow what the writers put there and what vLLM's loaders read
 * (ModelOptQuantConfigBase.from_config, CompressedTensorsConfig): ModelOpt's quant_algo,
 * group_size, kv_cache_quant_algo and exclude_modules / ignore, either flat or under
 * "quantization"; compressed-tensors' format, quantization_status, config_groups.*.weights
 * (num_bits, type, group_size, strategy), sparsity_config and ignore. Anything that would
 * change how the weights decode if misread is checked; a key sm70 has no use for (producer,
 * targets, observer) is not.
 *
 * Non-goals: the tensors themselves (weights_nvfp4.c checks those), other formats.
 */
#include "daemon/engine/quant_config.h"

#include <errno.h>
#include <fnmatch.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/nvfp4.h"

#define CT_FORMAT "nvfp4-pack-quantized"
#define SERVED "sm70 loads NVFP4 weights in ModelOpt's layout (quant_method 'modelopt', " \
	       "quant_algo 'NVFP4') and compressed-tensors' ('" CT_FORMAT "')"

/* One declaration as one file states it. */
struct decl {
	enum sm70_quant_format format;
	json_t *list; /* borrowed: the ignore / exclude_modules array, or NULL */
	char where[600]; /* "DIR/config.json: quantization_config" and the like, for messages */
};

const char *sm70_quant_format_name(enum sm70_quant_format f)
{
	switch (f) {
	case SM70_QUANT_NONE:
		return "none";
	case SM70_QUANT_MODELOPT_NVFP4:
		return "modelopt NVFP4";
	case SM70_QUANT_CT_NVFP4:
		return "compressed-tensors " CT_FORMAT;
	}
	return "?";
}

/* A present, non-null value of key in obj, or NULL. */
static json_t *get(json_t *obj, const char *key)
{
	json_t *v = json_object_get(obj, key);

	return v && !json_is_null(v) ? v : NULL;
}

/* group_size, where present, must be the integer 16 (NVFP4's block). */
static int check_group_size(json_t *obj, const char *where, struct sm70_err *err)
{
	json_t *v = get(obj, "group_size");

	if (!v)
		return 0;
	if (!json_is_integer(v))
		return sm70_errf(err, -EINVAL, "%s.group_size must be an integer", where);
	if (json_integer_value(v) != SM70_NVFP4_BLOCK)
		return sm70_errf(err, -ENOTSUP, "%s.group_size is %lld: NVFP4 scales blocks of "
				 "%d elements, and sm70 reads no other size", where,
				 (long long)json_integer_value(v), SM70_NVFP4_BLOCK);
	return 0;
}

/* A string-valued key that must equal want where present (or always, when required). */
static int check_string(json_t *obj, const char *key, const char *want, int required,
			const char *where, struct sm70_err *err)
{
	json_t *v = get(obj, key);

	if (!v)
		return required ? sm70_errf(err, -EINVAL, "%s has no '%s' (expected '%s')", where,
					    key, want) : 0;
	if (!json_is_string(v))
		return sm70_errf(err, -EINVAL, "%s.%s must be a string", where, key);
	if (strcmp(json_string_value(v), want))
		return sm70_errf(err, -ENOTSUP, "%s.%s is '%s', not '%s': %s", where, key,
				 json_string_value(v), want, SERVED);
	return 0;
}

/* One config group's "weights": 4-bit floats in blocks of 16 (and, for
 * compressed-tensors, the tensor_group strategy: a global scale and block scales). */
static int check_weights(json_t *group, const char *where, const char *name, int ct,
			 struct sm70_err *err)
{
	char at[700];
	json_t *w = get(group, "weights"), *bits;
	int ret;

	snprintf(at, sizeof(at), "%s.config_groups.%s.weights", where, name);
	if (!w)
		return ct ? sm70_errf(err, -EINVAL, "%s is missing", at) : 0;
	if (!json_is_object(w))
		return sm70_errf(err, -EINVAL, "%s must be an object", at);
	bits = get(w, "num_bits");
	if (bits && (!json_is_integer(bits) || json_integer_value(bits) != 4))
		return sm70_errf(err, -ENOTSUP, "%s.num_bits must be 4 (NVFP4): %s", at, SERVED);
	if ((ret = check_string(w, "type", "float", 0, at, err)) ||
	    (ret = check_group_size(w, at, err)))
		return ret;
	return ct ? check_string(w, "strategy", "tensor_group", 0, at, err) : 0;
}

/* config_groups, where present (required for compressed-tensors): every group's weights
 * are NVFP4 and, for compressed-tensors, a group's own format is the packed one. */
static int check_groups(json_t *obj, const char *where, int ct, struct sm70_err *err)
{
	json_t *groups = get(obj, "config_groups"), *g;
	const char *name;
	int ret;

	if (!groups)
		return ct ? sm70_errf(err, -EINVAL, "%s has no config_groups", where) : 0;
	if (!json_is_object(groups) || (ct && json_object_size(groups) == 0))
		return sm70_errf(err, -EINVAL, "%s.config_groups must be a non-empty object",
				 where);
	json_object_foreach(groups, name, g) {
		char at[700];

		if (!json_is_object(g))
			return sm70_errf(err, -EINVAL, "%s.config_groups.%s must be an object",
					 where, name);
		if ((ret = check_weights(g, where, name, ct, err)))
			return ret;
		snprintf(at, sizeof(at), "%s.config_groups.%s", where, name);
		if (ct && (ret = check_string(g, "format", CT_FORMAT, 0, at, err)))
			return ret;
	}
	return 0;
}

/* The ignore list under key (absent: none): an array of strings. */
static int take_list(json_t *obj, const char *key, struct decl *d, struct sm70_err *err)
{
	json_t *l = get(obj, key), *v;
	size_t i;

	if (!l)
		return 0;
	if (!json_is_array(l))
		return sm70_errf(err, -EINVAL, "%s.%s must be an array of module names", d->where,
				 key);
	json_array_foreach(l, i, v)
		if (!json_is_string(v))
			return sm70_errf(err, -EINVAL, "%s.%s[%zu] is not a string", d->where, key,
					 i);
	d->list = l;
	return 0;
}

/*
 * ModelOpt, in either of its forms: hf_quant_config.json's {"quantization": {quant_algo,
 * group_size, kv_cache_quant_algo, exclude_modules}}, or config.json's flat
 * quantization_config (quant_algo, group_size, config_groups, ignore).
 */
static int parse_modelopt(json_t *obj, struct decl *d, struct sm70_err *err)
{
	json_t *nested = get(obj, "quantization"), *kv;
	int ret;

	if (nested) {
		if (!json_is_object(nested))
			return sm70_errf(err, -EINVAL, "%s.quantization must be an object",
					 d->where);
		obj = nested;
		strncat(d->where, ".quantization", sizeof(d->where) - strlen(d->where) - 1);
	}
	if ((ret = check_string(obj, "quant_algo", "NVFP4", 1, d->where, err)) ||
	    (ret = check_group_size(obj, d->where, err)) ||
	    (ret = check_groups(obj, d->where, 0, err)))
		return ret;
	kv = get(obj, "kv_cache_quant_algo");
	if (kv && !json_is_string(kv))
		return sm70_errf(err, -EINVAL, "%s.kv_cache_quant_algo must be a string or null",
				 d->where);
	ret = take_list(obj, get(obj, "exclude_modules") ? "exclude_modules" : "ignore", d, err);
	d->format = SM70_QUANT_MODELOPT_NVFP4;
	return ret;
}

/* compressed-tensors' nvfp4-pack-quantized: packed (compressed) weights, NVFP4 groups,
 * no sparsity compressor. */
static int parse_ct(json_t *qc, struct decl *d, struct sm70_err *err)
{
	json_t *sparse = get(qc, "sparsity_config"), *kv = get(qc, "kv_cache_scheme");
	int ret;

	if ((ret = check_string(qc, "format", CT_FORMAT, 1, d->where, err)))
		return ret;
	if ((ret = check_string(qc, "quantization_status", "compressed", 0, d->where, err)))
		return ret;
	if ((ret = check_groups(qc, d->where, 1, err)))
		return ret;
	if (sparse) {
		char at[700];

		snprintf(at, sizeof(at), "%s.sparsity_config", d->where);
		if (!json_is_object(sparse))
			return sm70_errf(err, -EINVAL, "%s must be an object", at);
		/* {} is no sparsity; a compressor other than dense changes the layout */
		if (json_object_size(sparse) &&
		    (ret = check_string(sparse, "format", "dense", 1, at, err)))
			return ret;
	}
	if (kv && !json_is_object(kv))
		return sm70_errf(err, -EINVAL, "%s.kv_cache_scheme must be an object or null",
				 d->where);
	ret = take_list(qc, "ignore", d, err);
	d->format = SM70_QUANT_CT_NVFP4;
	return ret;
}

/* config.json's quantization_config, if any. */
static int parse_config_json(json_t *config, const char *dir, struct decl *d,
			     struct sm70_err *err)
{
	json_t *qc = get(config, "quantization_config"), *method;

	snprintf(d->where, sizeof(d->where), "%s/config.json: quantization_config", dir);
	if (!qc)
		return 0;
	if (!json_is_object(qc))
		return sm70_errf(err, -EINVAL, "%s must be an object", d->where);
	method = get(qc, "quant_method");
	if (!method || !json_is_string(method))
		return sm70_errf(err, -EINVAL, "%s has no quant_method string", d->where);
	if (strcmp(json_string_value(method), "modelopt") == 0)
		return parse_modelopt(qc, d, err);
	if (strcmp(json_string_value(method), "compressed-tensors") == 0)
		return parse_ct(qc, d, err);
	return sm70_errf(err, -ENOTSUP, "%s.quant_method is '%s': %s", d->where,
			 json_string_value(method), SERVED);
}

/* hf_quant_config.json: ModelOpt's own file, {"quantization": {...}}. */
static int parse_hf_quant(json_t *hf, const char *dir, struct decl *d, struct sm70_err *err)
{
	snprintf(d->where, sizeof(d->where), "%s/hf_quant_config.json", dir);
	if (!json_is_object(get(hf, "quantization")))
		return sm70_errf(err, -EINVAL, "%s has no 'quantization' object", d->where);
	return parse_modelopt(hf, d, err);
}

/* An entry as matched against text-model names. */
static int add_entry(struct sm70_quant_config *q, const char *s, struct sm70_err *err)
{
	static const char nested[] = "model.language_model.";
	struct sm70_quant_ignore *e = &q->ignore[q->n_ignore];
	int is_re = strncmp(s, "re:", 3) == 0;
	char *p;

	if (is_re) {
		p = malloc(strlen(s) + 3);
		if (p)
			sprintf(p, "^(%s)", s + 3);
	} else if (strncmp(s, nested, sizeof(nested) - 1) == 0) {
		p = malloc(strlen(s) + 1);
		if (p)
			sprintf(p, "model.%s", s + sizeof(nested) - 1);
	} else {
		p = strdup(s);
	}
	if (!p)
		return sm70_errf(err, -ENOMEM, "out of memory");
	if (is_re && regcomp(&e->re, p, REG_EXTENDED | REG_NOSUB)) {
		free(p);
		return sm70_errf(err, -EINVAL, "quantization ignore entry '%s' is not a regular "
				 "expression sm70 can read (POSIX extended)", s);
	}
	e->pattern = p;
	e->is_re = is_re;
	q->n_ignore++;
	return 0;
}

static int add_list(struct sm70_quant_config *q, json_t *list, struct sm70_err *err)
{
	size_t i;
	json_t *v;
	int ret;

	json_array_foreach(list, i, v)
		if ((ret = add_entry(q, json_string_value(v), err)))
			return ret;
	return 0;
}

int sm70_quant_config_parse(struct sm70_quant_config *q, json_t *config, json_t *hf_quant,
			    const char *dir, struct sm70_err *err)
{
	struct decl c = { 0 }, h = { 0 };
	size_t n;
	int ret;

	memset(q, 0, sizeof(*q));
	if ((ret = parse_config_json(config, dir, &c, err)))
		return ret;
	if (hf_quant && (ret = parse_hf_quant(hf_quant, dir, &h, err)))
		return ret;
	if (c.format && h.format && c.format != h.format)
		return sm70_errf(err, -EINVAL, "%s declares %s, but %s declares %s: conflicting "
				 "quantization configs", c.where, sm70_quant_format_name(c.format),
				 h.where, sm70_quant_format_name(h.format));
	q->format = c.format ? c.format : h.format;
	n = (c.list ? json_array_size(c.list) : 0) + (h.list ? json_array_size(h.list) : 0);
	if (!n)
		return 0;
	q->ignore = calloc(n, sizeof(*q->ignore));
	if (!q->ignore)
		return sm70_errf(err, -ENOMEM, "out of memory");
	if ((c.list && (ret = add_list(q, c.list, err))) ||
	    (h.list && (ret = add_list(q, h.list, err))))
		return ret;
	return 0;
}

void sm70_quant_config_free(struct sm70_quant_config *q)
{
	for (size_t i = 0; i < q->n_ignore; i++) {
		if (q->ignore[i].is_re)
			regfree(&q->ignore[i].re);
		free(q->ignore[i].pattern);
	}
	free(q->ignore);
	memset(q, 0, sizeof(*q));
}

static int entry_matches(const struct sm70_quant_ignore *e, const char *module)
{
	size_t n = strlen(e->pattern);

	if (e->is_re)
		return regexec(&e->re, module, 0, NULL, 0) == 0;
	if (fnmatch(e->pattern, module, 0) == 0)
		return 1;
	return strncmp(module, e->pattern, n) == 0 && module[n] == '.';
}

int sm70_quant_ignored(const struct sm70_quant_config *q, const char *module)
{
	for (size_t i = 0; i < q->n_ignore; i++)
		if (entry_matches(&q->ignore[i], module))
			return 1;
	return 0;
}

int sm70_quant_module_quantized(const struct sm70_quant_config *q, const char *module,
				int cols)
{
	const char *last = strrchr(module, '.');
	size_t n;

	last = last ? last + 1 : module;
	n = strlen(last);
	if (q->format == SM70_QUANT_NONE || n < 4 || strcmp(last + n - 4, "proj") ||
	    cols % SM70_NVFP4_BLOCK)
		return 0;
	return !sm70_quant_ignored(q, module);
}
