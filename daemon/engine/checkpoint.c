/*
 * checkpoint.c - opens a Hugging Face checkpoint directory: config.json, the optional
 * generation_config.json, and the weights (one model.safetensors, or the shards that
 * model.safetensors.index.json lists), and indexes every tensor under its text-model name.
 *
 * Vision-language checkpoints store the text model under "model.language_model."; those
 * names are mapped to "model." so that architecture code asks for one set of names. Vision
 * tower ("visual.") and multi-token-prediction ("mtp.") tensors are not used and are left
 * out of the index. Everything is validated at open so that later lookups cannot fail on a
 * malformed file.
 *
 * Non-goals: pickle (.bin) checkpoints, GGUF, remote downloads, writing.
 */
#include "daemon/engine/checkpoint.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define INDEX_NAME "model.safetensors.index.json"
#define SINGLE_NAME "model.safetensors"

struct ckpt_name {
	char *name;                        /* canonical (text-model) name, owned */
	const struct sm70_st_tensor *t;    /* inside one of files[] */
};

struct sm70_ckpt {
	char *dir;
	json_t *config;
	json_t *gen;                       /* NULL when generation_config.json is absent */
	json_t *hf_quant;                  /* NULL when hf_quant_config.json is absent */
	size_t n_files;
	struct sm70_st_file **files;
	size_t n_names;
	struct ckpt_name *names;           /* sorted by name */
};

/* Returns "dir/name" in a new allocation, or NULL when out of memory. */
static char *path_join(const char *dir, const char *name)
{
	size_t dl = strlen(dir), nl = strlen(name);
	char *p = malloc(dl + 1 + nl + 1);

	if (!p)
		return NULL;
	memcpy(p, dir, dl);
	p[dl] = '/';
	memcpy(p + dl + 1, name, nl + 1);
	return p;
}

/*
 * Loads dir/name as a JSON object into *out. When the file does not exist and required is
 * false, sets *out to NULL and returns 0. Returns -ENOENT, -EINVAL (not JSON, not an
 * object), other -errno, with err naming the file (and jansson's line and column).
 */
static int load_json(json_t **out, const char *dir, const char *name, int required,
		     struct sm70_err *err)
{
	json_error_t jerr;
	json_t *root = NULL;
	char *path;
	FILE *fp = NULL;
	int ret = 0;

	*out = NULL;
	path = path_join(dir, name);
	if (!path)
		return sm70_errf(err, -ENOMEM, "%s/%s: out of memory", dir, name);
	fp = fopen(path, "re");
	if (!fp) {
		ret = -errno;
		if (ret == -ENOENT && !required)
			ret = 0;
		else
			sm70_errf(err, ret, "%s: cannot open: %s", path, strerror(-ret));
		goto out;
	}
	root = json_loadf(fp, JSON_REJECT_DUPLICATES, &jerr);
	if (!root) {
		ret = sm70_errf(err, -EINVAL, "%s: invalid JSON at line %d, column %d: %s", path,
				jerr.line, jerr.column, jerr.text);
		goto out;
	}
	if (!json_is_object(root)) {
		ret = sm70_errf(err, -EINVAL, "%s: top level is not a JSON object", path);
		goto out;
	}
	*out = root;
	root = NULL;
out:
	json_decref(root);
	if (fp)
		fclose(fp);
	free(path);
	return ret;
}

/* Opens dir/name as one more weight file; *out (optional) receives it. */
static int add_file(struct sm70_ckpt *c, const char *name, struct sm70_st_file **out,
		    struct sm70_err *err)
{
	struct sm70_st_file **files, *f;
	char *path;
	int ret;

	files = realloc(c->files, (c->n_files + 1) * sizeof(*files));
	if (!files)
		return sm70_errf(err, -ENOMEM, "%s: out of memory", c->dir);
	c->files = files;
	path = path_join(c->dir, name);
	if (!path)
		return sm70_errf(err, -ENOMEM, "%s: out of memory", c->dir);
	ret = sm70_st_open(&f, path, err);
	free(path);
	if (ret)
		return ret;
	c->files[c->n_files++] = f;
	if (out)
		*out = f;
	return 0;
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/*
 * Shard names come from a file we do not trust: a name with a slash could reach outside
 * the checkpoint directory, so only plain file names are accepted.
 */
static int check_shard_name(const char *index_path, const char *tensor, const char *shard,
			    struct sm70_err *err)
{
	if (!shard[0] || strchr(shard, '/') || strcmp(shard, ".") == 0 ||
	    strcmp(shard, "..") == 0)
		return sm70_errf(err, -EINVAL,
				 "%s: tensor '%s' names shard '%s', which is not a plain file name",
				 index_path, tensor, shard);
	return 0;
}

/*
 * Opens every distinct shard named by the index's weight_map once, then checks that each
 * listed tensor is in the shard the index names.
 */
static int load_sharded(struct sm70_ckpt *c, json_t *index, struct sm70_err *err)
{
	const char **shards = NULL;
	struct sm70_st_file **shard_files = NULL;
	size_t n_map, n = 0, n_unique = 0;
	json_t *map, *v;
	const char *key;
	char *index_path;
	int ret = 0;

	index_path = path_join(c->dir, INDEX_NAME);
	if (!index_path)
		return sm70_errf(err, -ENOMEM, "%s: out of memory", c->dir);
	map = json_object_get(index, "weight_map");
	if (!json_is_object(map) || json_object_size(map) == 0) {
		ret = sm70_errf(err, -EINVAL, "%s: no non-empty 'weight_map' object", index_path);
		goto out;
	}
	n_map = json_object_size(map);
	shards = calloc(n_map, sizeof(*shards));
	shard_files = calloc(n_map, sizeof(*shard_files));
	if (!shards || !shard_files) {
		ret = sm70_errf(err, -ENOMEM, "%s: out of memory", index_path);
		goto out;
	}
	json_object_foreach(map, key, v) {
		if (!json_is_string(v)) {
			ret = sm70_errf(err, -EINVAL,
					"%s: weight_map entry for '%s' is not a file name string",
					index_path, key);
			goto out;
		}
		ret = check_shard_name(index_path, key, json_string_value(v), err);
		if (ret)
			goto out;
		shards[n++] = json_string_value(v);
	}
	qsort(shards, n, sizeof(*shards), cmp_str);
	for (size_t i = 0; i < n; i++)
		if (i == 0 || strcmp(shards[i], shards[n_unique - 1]) != 0)
			shards[n_unique++] = shards[i];
	for (size_t i = 0; i < n_unique; i++) {
		struct sm70_err shard_err = { { 0 } };

		ret = add_file(c, shards[i], &shard_files[i], &shard_err);
		if (ret) {
			/* say where the shard's name came from */
			sm70_errf(err, ret, "%s (a shard named by %s)", shard_err.msg, INDEX_NAME);
			goto out;
		}
	}
	json_object_foreach(map, key, v) {
		const char *shard = json_string_value(v);
		const char **pos = bsearch(&shard, shards, n_unique, sizeof(*shards), cmp_str);
		struct sm70_st_file *f = shard_files[pos - shards];

		if (!sm70_st_find(f, key)) {
			ret = sm70_errf(err, -EINVAL,
					"%s: tensor '%s' is listed in %s but missing from its shard %s",
					c->dir, key, INDEX_NAME, f->path);
			goto out;
		}
	}
out:
	free(shard_files);
	free(shards);
	free(index_path);
	return ret;
}

static int has_prefix(const char *s, const char *prefix)
{
	return strncmp(s, prefix, strlen(prefix)) == 0;
}

/*
 * The text-model name of a stored tensor name, in a new allocation; *skip is set (and NULL
 * returned) for tensors the text model does not use. NULL without *skip means no memory.
 */
static char *canonical_name(const char *stored, int *skip)
{
	static const char *const ignored[] = { "visual.", "model.visual.", "mtp.", "model.mtp." };
	static const char nested[] = "model.language_model.";
	char *s;

	*skip = 0;
	for (size_t i = 0; i < sizeof(ignored) / sizeof(ignored[0]); i++) {
		if (has_prefix(stored, ignored[i])) {
			*skip = 1;
			return NULL;
		}
	}
	if (!has_prefix(stored, nested))
		return strdup(stored);
	s = malloc(strlen("model.") + strlen(stored + sizeof(nested) - 1) + 1);
	if (s) {
		strcpy(s, "model.");
		strcat(s, stored + sizeof(nested) - 1);
	}
	return s;
}

static int cmp_name(const void *a, const void *b)
{
	const struct ckpt_name *na = a, *nb = b;

	return strcmp(na->name, nb->name);
}

/* Builds c->names from every tensor of every file; a name seen twice is an error. */
static int build_index(struct sm70_ckpt *c, struct sm70_err *err)
{
	size_t total = 0;

	for (size_t i = 0; i < c->n_files; i++)
		total += c->files[i]->n_tensors;
	c->names = calloc(total ? total : 1, sizeof(*c->names));
	if (!c->names)
		return sm70_errf(err, -ENOMEM, "%s: out of memory", c->dir);
	for (size_t i = 0; i < c->n_files; i++) {
		const struct sm70_st_file *f = c->files[i];

		for (size_t j = 0; j < f->n_tensors; j++) {
			int skip;
			char *name = canonical_name(f->tensors[j].name, &skip);

			if (skip)
				continue;
			if (!name)
				return sm70_errf(err, -ENOMEM, "%s: out of memory", c->dir);
			c->names[c->n_names].name = name;
			c->names[c->n_names].t = &f->tensors[j];
			c->n_names++;
		}
	}
	qsort(c->names, c->n_names, sizeof(*c->names), cmp_name);
	for (size_t i = 1; i < c->n_names; i++) {
		const struct ckpt_name *a = &c->names[i - 1], *b = &c->names[i];

		if (strcmp(a->name, b->name) == 0)
			return sm70_errf(err, -EINVAL,
					 "%s: tensor '%s' is stored twice: as '%s' in %s and as '%s' in %s",
					 c->dir, a->name, a->t->name, a->t->file, b->t->name,
					 b->t->file);
	}
	return 0;
}

static int load_weights(struct sm70_ckpt *c, struct sm70_err *err)
{
	json_t *index = NULL;
	struct stat st;
	char *path = NULL;
	int ret;

	ret = load_json(&index, c->dir, INDEX_NAME, 0, err);
	if (ret)
		goto out;
	if (index) {
		ret = load_sharded(c, index, err);
		if (ret)
			goto out;
	} else {
		path = path_join(c->dir, SINGLE_NAME);
		if (!path) {
			ret = sm70_errf(err, -ENOMEM, "%s: out of memory", c->dir);
			goto out;
		}
		if (stat(path, &st) != 0 && errno == ENOENT) {
			ret = sm70_errf(err, -ENOENT, "%s: no %s or %s", c->dir, SINGLE_NAME,
					INDEX_NAME);
			goto out;
		}
		ret = add_file(c, SINGLE_NAME, NULL, err);
		if (ret)
			goto out;
	}
	ret = build_index(c, err);
out:
	free(path);
	json_decref(index);
	return ret;
}

static int ckpt_open(struct sm70_ckpt **out, const char *dir, int weights,
		     struct sm70_err *err)
{
	struct sm70_ckpt *c;
	int ret;

	*out = NULL;
	c = calloc(1, sizeof(*c));
	if (!c)
		return sm70_errf(err, -ENOMEM, "%s: out of memory", dir);
	c->dir = strdup(dir);
	if (!c->dir) {
		ret = sm70_errf(err, -ENOMEM, "%s: out of memory", dir);
		goto fail;
	}
	ret = load_json(&c->config, dir, "config.json", 1, err);
	if (ret)
		goto fail;
	ret = load_json(&c->gen, dir, "generation_config.json", 0, err);
	if (ret)
		goto fail;
	ret = load_json(&c->hf_quant, dir, "hf_quant_config.json", 0, err);
	if (ret)
		goto fail;
	if (weights) {
		ret = load_weights(c, err);
		if (ret)
			goto fail;
	}
	*out = c;
	return 0;
fail:
	sm70_ckpt_close(c);
	return ret;
}

int sm70_ckpt_open(struct sm70_ckpt **out, const char *dir, struct sm70_err *err)
{
	return ckpt_open(out, dir, 1, err);
}

int sm70_ckpt_open_config_only(struct sm70_ckpt **out, const char *dir, struct sm70_err *err)
{
	return ckpt_open(out, dir, 0, err);
}

void sm70_ckpt_close(struct sm70_ckpt *c)
{
	if (!c)
		return;
	for (size_t i = 0; i < c->n_names; i++)
		free(c->names[i].name);
	free(c->names);
	for (size_t i = 0; i < c->n_files; i++)
		sm70_st_close(c->files[i]);
	free(c->files);
	json_decref(c->hf_quant);
	json_decref(c->gen);
	json_decref(c->config);
	free(c->dir);
	free(c);
}

json_t *sm70_ckpt_config(const struct sm70_ckpt *c)
{
	return c->config;
}

json_t *sm70_ckpt_generation_config(const struct sm70_ckpt *c)
{
	return c->gen;
}

json_t *sm70_ckpt_hf_quant_config(const struct sm70_ckpt *c)
{
	return c->hf_quant;
}

const char *sm70_ckpt_dir(const struct sm70_ckpt *c)
{
	return c->dir;
}

size_t sm70_ckpt_n_files(const struct sm70_ckpt *c)
{
	return c->n_files;
}

const struct sm70_st_file *sm70_ckpt_file(const struct sm70_ckpt *c, size_t i)
{
	return i < c->n_files ? c->files[i] : NULL;
}

const struct sm70_st_tensor *sm70_ckpt_find(const struct sm70_ckpt *c, const char *name)
{
	struct ckpt_name key = { .name = (char *)name };
	const struct ckpt_name *hit;

	if (!c->n_names)
		return NULL;
	hit = bsearch(&key, c->names, c->n_names, sizeof(*c->names), cmp_name);
	return hit ? hit->t : NULL;
}

int sm70_ckpt_get(const struct sm70_ckpt *c, const char *name, int ndim, const int64_t *shape,
		  const struct sm70_st_tensor **out, struct sm70_err *err)
{
	const struct sm70_st_tensor *t;
	char have[160], want[160];
	int same;

	*out = NULL;
	t = sm70_ckpt_find(c, name);
	if (!t)
		return sm70_errf(err, -ENOENT, "missing tensor %s in %s", name, c->dir);
	same = t->ndim == ndim;
	for (int i = 0; same && i < ndim; i++)
		same = t->shape[i] == shape[i];
	if (!same) {
		sm70_st_format_shape(have, sizeof(have), t->ndim, t->shape);
		sm70_st_format_shape(want, sizeof(want), ndim < 0 ? 0 : ndim, shape);
		return sm70_errf(err, -EINVAL, "tensor %s in %s has shape %s, expected %s", name,
				 t->file, have, want);
	}
	if (t->dtype != SM70_DTYPE_F32 && t->dtype != SM70_DTYPE_F16 &&
	    t->dtype != SM70_DTYPE_BF16)
		return sm70_errf(err, -EINVAL,
				 "tensor %s in %s has dtype %s, expected f32, f16 or bf16", name,
				 t->file, sm70_dtype_name(t->dtype));
	*out = t;
	return 0;
}
