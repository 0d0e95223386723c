/*
 * plan.c - decides what sm70-quantize does with each tensor of a checkpoint: which become
 * NVFP4, under which names and shapes the outputs are stored in each format, and which
 * output shard holds them.
 *
 * Quantized: float tensors that are the weight of a projection (a 2-D "*proj.weight":
 * q/k/v/o, gate/up/down, the DeltaNet in/out projections, ...) or a fused 3-D expert tensor
 * ("experts.gate_up_proj" [E, 2I, H], "experts.down_proj" [E, H, I]). Everything else is
 * copied byte for byte: embeddings, lm_head, norms, routers ("mlp.gate",
 * "shared_expert_gate"), conv1d, A_log, dt_bias, hyper-connection mixers, PLE tables,
 * integer tensors, the vision tower and MTP heads (which sm70 does not run).
 *
 * Non-goals: reading tensors' values (convert.c does), writing files.
 */
#include <errno.h>
#include <fnmatch.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/nvfp4.h"
#include "tools/quantize/quantize.h"

int sm70__q_parse_format(const char *s)
{
	if (strcmp(s, "modelopt") == 0)
		return SM70_Q_MODELOPT;
	if (strcmp(s, "compressed-tensors") == 0)
		return SM70_Q_COMPRESSED_TENSORS;
	return -1;
}

static int has_suffix(const char *s, const char *suffix)
{
	size_t n = strlen(s), m = strlen(suffix);

	return n >= m && strcmp(s + n - m, suffix) == 0;
}

static int has_prefix(const char *s, const char *prefix)
{
	return strncmp(s, prefix, strlen(prefix)) == 0;
}

static int is_float(enum sm70_dtype t)
{
	return t == SM70_DTYPE_F32 || t == SM70_DTYPE_F16 || t == SM70_DTYPE_BF16;
}

static int is_fused_experts(const struct sm70_st_tensor *t)
{
	return t->ndim == 3 && (has_suffix(t->name, ".experts.gate_up_proj") ||
				has_suffix(t->name, ".experts.down_proj"));
}

/* Vision towers and multi-token-prediction heads: not run by sm70, kept as they are. */
static int is_outside_text_model(const char *name)
{
	static const char *const prefixes[] = { "visual.", "model.visual.", "mtp.",
						"model.mtp." };

	for (size_t i = 0; i < sizeof(prefixes) / sizeof(prefixes[0]); i++)
		if (has_prefix(name, prefixes[i]))
			return 1;
	return 0;
}

/* "a.b.q_proj" -> 1: the last component of the module names a projection. */
static int is_projection(const char *module)
{
	const char *last = strrchr(module, '.');

	return has_suffix(last ? last + 1 : module, "proj");
}

/* The module name of a tensor: without ".weight" for a 2-D weight, the whole name for a
 * fused expert tensor (whose parameter is the projection itself). */
static char *module_name(const struct sm70_st_tensor *t)
{
	size_t n = strlen(t->name);

	if (t->ndim == 2 && has_suffix(t->name, ".weight"))
		return strndup(t->name, n - strlen(".weight"));
	return strdup(t->name);
}

static void classify(struct sm70__q_item *it, char *const *excludes, int n_excludes)
{
	const struct sm70_st_tensor *t = it->in;

	it->linear = is_float(t->dtype) &&
		     ((t->ndim == 2 && has_suffix(t->name, ".weight")) || is_fused_experts(t));
	if (!it->linear || !t->nbytes || is_outside_text_model(t->name))
		return;
	if (t->ndim == 2 && !is_projection(it->module))
		return;
	for (int i = 0; i < n_excludes; i++) {
		if (fnmatch(excludes[i], it->module, 0) == 0) {
			it->excluded_by = excludes[i];
			return;
		}
	}
	if (t->shape[t->ndim - 1] % SM70_NVFP4_BLOCK != 0) {
		it->bad_k = 1;
		return;
	}
	it->quantize = 1;
}

static char *concat(const char *a, const char *b)
{
	char *s = malloc(strlen(a) + strlen(b) + 1);

	if (s) {
		strcpy(s, a);
		strcat(s, b);
	}
	return s;
}

/* Fills out with name, dtype and shape; the byte count follows from them. */
static int set_out(struct sm70__q_out *o, char *name, enum sm70_dtype dtype, int ndim,
		   const int64_t *shape)
{
	o->name = name;
	o->dtype = dtype;
	o->ndim = ndim;
	o->nbytes = sm70_dtype_size(dtype);
	for (int i = 0; i < ndim; i++) {
		o->shape[i] = shape[i];
		o->nbytes *= (size_t)shape[i];
	}
	return name ? 0 : -ENOMEM;
}

/*
 * The three outputs of a quantized tensor. Attribute names follow ModelOpt's rule: "X." +
 * "weight_scale" for a tensor "X.weight", "P_weight_scale" for a fused parameter P.
 * ModelOpt keeps the codes under the input's name; compressed-tensors names them
 * "weight_packed" and stores the reciprocal global scale as "weight_global_scale".
 */
static int plan_quantized(struct sm70__q_item *it, enum sm70__q_format format)
{
	const struct sm70_st_tensor *t = it->in;
	int nd = t->ndim, ret = 0;
	int64_t packed[3], scales[3], global[1] = { nd == 3 ? t->shape[0] : 1 };
	char *stem;

	for (int i = 0; i < nd; i++)
		packed[i] = scales[i] = t->shape[i];
	packed[nd - 1] = t->shape[nd - 1] / 2;
	scales[nd - 1] = t->shape[nd - 1] / SM70_NVFP4_BLOCK;
	stem = has_suffix(t->name, ".weight") ? strndup(t->name, strlen(t->name) - 6)
					      : concat(t->name, "_");
	if (!stem)
		return -ENOMEM;
	it->n_out = 3;
	if (format == SM70_Q_MODELOPT) {
		ret |= set_out(&it->out[0], strdup(t->name), SM70_DTYPE_U8, nd, packed);
		ret |= set_out(&it->out[1], concat(stem, "weight_scale"), SM70_DTYPE_F8E4M3, nd,
			       scales);
		/* one scalar for a matrix (shape [] as ModelOpt squeezes it), one per expert */
		ret |= set_out(&it->out[2], concat(stem, "weight_scale_2"), SM70_DTYPE_F32,
			       nd == 3 ? 1 : 0, global);
	} else {
		ret |= set_out(&it->out[0], concat(stem, "weight_packed"), SM70_DTYPE_U8, nd,
			       packed);
		ret |= set_out(&it->out[1], concat(stem, "weight_scale"), SM70_DTYPE_F8E4M3, nd,
			       scales);
		/* shape [1] as llm-compressor writes it; one per expert */
		ret |= set_out(&it->out[2], concat(stem, "weight_global_scale"), SM70_DTYPE_F32,
			       1, global);
	}
	free(stem);
	return ret ? -ENOMEM : 0;
}

static int plan_copied(struct sm70__q_item *it)
{
	const struct sm70_st_tensor *t = it->in;

	it->n_out = 1;
	if (set_out(&it->out[0], strdup(t->name), t->dtype, t->ndim, t->shape))
		return -ENOMEM;
	it->out[0].nbytes = t->nbytes;
	it->out[0].data = t->data;
	return 0;
}

static int cmp_item(const void *a, const void *b)
{
	const struct sm70__q_item *x = a, *y = b;

	return strcmp(x->in->name, y->in->name);
}

static size_t item_bytes(const struct sm70__q_item *it)
{
	size_t n = 0;

	for (int i = 0; i < it->n_out; i++)
		n += it->out[i].nbytes;
	return n;
}

/* Tensors in name order fill shards up to max_shard_bytes (a larger tensor gets one of its
 * own). */
static void assign_shards(struct sm70__q_plan *p, uint64_t max_shard_bytes)
{
	uint64_t used = 0;
	int shard = 0;

	for (size_t i = 0; i < p->n_items; i++) {
		uint64_t n = item_bytes(&p->items[i]);

		if (used && used + n > max_shard_bytes) {
			shard++;
			used = 0;
		}
		p->items[i].shard = shard;
		used += n;
	}
	p->n_shards = shard + 1;
}

int sm70__q_plan_build(struct sm70__q_plan *p, enum sm70__q_format format,
		       const struct sm70_st_file *const *files, size_t n_files,
		       char *const *excludes, int n_excludes, uint64_t max_shard_bytes,
		       struct sm70_err *err)
{
	size_t n = 0;

	memset(p, 0, sizeof(*p));
	p->format = format;
	for (size_t f = 0; f < n_files; f++)
		n += files[f]->n_tensors;
	if (!n)
		return sm70_errf(err, -EINVAL, "the checkpoint holds no tensors");
	p->items = calloc(n, sizeof(*p->items));
	if (!p->items)
		return sm70_errf(err, -ENOMEM, "out of memory");
	for (size_t f = 0; f < n_files; f++)
		for (size_t i = 0; i < files[f]->n_tensors; i++)
			p->items[p->n_items++].in = &files[f]->tensors[i];
	qsort(p->items, p->n_items, sizeof(*p->items), cmp_item);
	for (size_t i = 0; i < p->n_items; i++) {
		struct sm70__q_item *it = &p->items[i];
		int ret;

		it->module = module_name(it->in);
		if (!it->module)
			return sm70_errf(err, -ENOMEM, "out of memory");
		classify(it, excludes, n_excludes);
		ret = it->quantize ? plan_quantized(it, format) : plan_copied(it);
		if (ret)
			return sm70_errf(err, ret, "out of memory");
		p->n_quantized += (size_t)it->quantize;
	}
	assign_shards(p, max_shard_bytes);
	return 0;
}

void sm70__q_release(struct sm70__q_item *it)
{
	for (int i = 0; i < it->n_out; i++) {
		if (!it->out[i].owned)
			continue;
		free(it->out[i].owned);
		it->out[i].owned = NULL;
		it->out[i].data = NULL;
	}
}

void sm70__q_plan_free(struct sm70__q_plan *p)
{
	for (size_t i = 0; i < p->n_items; i++) {
		struct sm70__q_item *it = &p->items[i];

		sm70__q_release(it);
		for (int j = 0; j < it->n_out; j++)
			free(it->out[j].name);
		free(it->module);
	}
	free(p->items);
	memset(p, 0, sizeof(*p));
}

void sm70__q_shard_name(const struct sm70__q_plan *p, int i, char *buf, size_t size)
{
	if (p->n_shards == 1)
		snprintf(buf, size, "model.safetensors");
	else
		snprintf(buf, size, "model-%05d-of-%05d.safetensors", i + 1, p->n_shards);
}
