/*
 * outdir.c - the output directory of sm70-quantize: checks before anything is written,
 * config.json with its quantization_config (and ModelOpt's hf_quant_config.json), the
 * tokenizer and other small files copied from the input, and the shard index.
 *
 * The JSON written is what ModelOpt's export and llm-compressor write for NVFP4 weights;
 * docs/NVFP4.md lists the keys and where they come from.
 * Non-goals: tensor data (sm70-quantize.c writes the shards), model cards.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/nvfp4.h"
#include "tools/quantize/quantize.h"

/* Files larger than this are not "small side files"; they are left out with a notice. */
#define SIDE_FILE_MAX (64u << 20)

static int has_suffix(const char *s, const char *suffix)
{
	size_t n = strlen(s), m = strlen(suffix);

	return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* The weight and quantization files a run writes (and --force replaces). */
static int is_output_file(const char *name)
{
	return (strncmp(name, "model", 5) == 0 &&
		(has_suffix(name, ".safetensors") || has_suffix(name, ".safetensors.tmp"))) ||
	       strcmp(name, "model.safetensors.index.json") == 0 ||
	       strcmp(name, "hf_quant_config.json") == 0;
}

/* Removes what a previous run left in dir, or says why it is not empty. */
static int clear_or_refuse(const char *dir, int force, struct sm70_err *err)
{
	DIR *d = opendir(dir);
	struct dirent *de;
	int ret = 0;

	if (!d) {
		ret = -errno;
		return sm70_errf(err, ret, "%s: cannot read: %s", dir, strerror(-ret));
	}
	while (!ret && (de = readdir(d))) {
		char path[4096];

		if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
			continue;
		if (!force) {
			ret = sm70_errf(err, -ENOTEMPTY, "%s: output directory is not empty (it "
					"holds %s); --force writes into it", dir, de->d_name);
			break;
		}
		if (!is_output_file(de->d_name))
			continue;
		snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
		if (unlink(path) != 0) {
			ret = -errno;
			sm70_errf(err, ret, "%s: cannot remove: %s", path, strerror(-ret));
		}
	}
	closedir(d);
	return ret;
}

int sm70__q_prepare_outdir(const char *in_dir, const char *out_dir, int force,
			   struct sm70_err *err)
{
	struct stat in_st, out_st;
	int ret;

	if (stat(out_dir, &out_st) != 0) {
		if (errno != ENOENT || mkdir(out_dir, 0755) != 0) {
			ret = -errno;
			return sm70_errf(err, ret, "%s: cannot create the output directory: %s",
					 out_dir, strerror(-ret));
		}
		return 0;
	}
	if (!S_ISDIR(out_st.st_mode))
		return sm70_errf(err, -ENOTDIR, "%s: output path is not a directory", out_dir);
	if (stat(in_dir, &in_st) == 0 && in_st.st_dev == out_st.st_dev &&
	    in_st.st_ino == out_st.st_ino)
		return sm70_errf(err, -EINVAL, "%s: the output directory is the input directory",
				 out_dir);
	return clear_or_refuse(out_dir, force, err);
}

static int write_json(const char *dir, const char *name, json_t *obj, struct sm70_err *err)
{
	char path[4096];

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	if (json_dump_file(obj, path, JSON_INDENT(2)) != 0)
		return sm70_errf(err, -EIO, "%s: cannot write", path);
	return 0;
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The modules left unquantized that a loader could take for quantized Linear layers:
 * every kept Linear weight, and lm_head whether or not it is stored (a tied one is still
 * a Linear). Sorted, without duplicates. */
static json_t *ignore_list(const struct sm70__q_plan *p)
{
	const char **names = calloc(p->n_items + 1, sizeof(*names));
	json_t *list = json_array();
	size_t n = 0;

	if (!names || !list)
		goto fail;
	names[n++] = "lm_head";
	for (size_t i = 0; i < p->n_items; i++)
		if (p->items[i].linear && !p->items[i].quantize)
			names[n++] = p->items[i].module;
	qsort(names, n, sizeof(*names), cmp_str);
	for (size_t i = 0; i < n; i++)
		if ((i == 0 || strcmp(names[i], names[i - 1]) != 0) &&
		    json_array_append_new(list, json_string(names[i])) != 0)
			goto fail;
	free(names);
	return list;
fail:
	free(names);
	json_decref(list);
	return NULL;
}

/* hf_quant_config.json: the file ModelOpt writes beside the weights. */
static json_t *modelopt_hf_quant_config(json_t *ignore)
{
	return json_pack("{s:{s:s,s:s},s:{s:s,s:n,s:i,s:O}}",
			 "producer", "name", "modelopt", "version", "sm70-quantize",
			 "quantization", "quant_algo", "NVFP4", "kv_cache_quant_algo",
			 "group_size", SM70_NVFP4_BLOCK, "exclude_modules", ignore);
}

/* config.json's quantization_config as ModelOpt's export converts it; weight-only, so no
 * input_activations. */
static json_t *modelopt_quantization_config(json_t *ignore)
{
	return json_pack("{s:{s:{s:{s:b,s:i,s:s,s:i},s:n,s:[s]}},s:O,s:s,s:i,s:n,"
			 "s:{s:s,s:s},s:s}",
			 "config_groups", "group_0", "weights", "dynamic", 0, "num_bits", 4,
			 "type", "float", "group_size", SM70_NVFP4_BLOCK, "input_activations",
			 "targets", "Linear",
			 "ignore", ignore, "quant_algo", "NVFP4", "group_size", SM70_NVFP4_BLOCK,
			 "kv_cache_quant_algo",
			 "producer", "name", "modelopt", "version", "sm70-quantize",
			 "quant_method", "modelopt");
}

/* config.json's quantization_config as llm-compressor saves its NVFP4A16 scheme. */
static json_t *compressed_tensors_config(json_t *ignore)
{
	json_t *weights = json_pack("{s:i,s:s,s:b,s:i,s:s,s:n,s:b,s:n,s:s,s:{}}",
				    "num_bits", 4, "type", "float", "symmetric", 1,
				    "group_size", SM70_NVFP4_BLOCK, "strategy", "tensor_group",
				    "block_structure", "dynamic", 0, "actorder",
				    "observer", "minmax", "observer_kwargs");

	if (!weights)
		return NULL;
	return json_pack("{s:s,s:s,s:s,s:{s:{s:[s],s:o,s:n,s:n,s:s}},s:O,s:n,s:{}}",
			 "quant_method", "compressed-tensors", "format", "nvfp4-pack-quantized",
			 "quantization_status", "compressed",
			 "config_groups", "group_0", "targets", "Linear", "weights", weights,
			 "input_activations", "output_activations", "format",
			 "nvfp4-pack-quantized",
			 "ignore", ignore, "kv_cache_scheme", "sparsity_config");
}

int sm70__q_write_configs(const struct sm70__q_plan *p, json_t *config, const char *out_dir,
			  struct sm70_err *err)
{
	json_t *ignore = ignore_list(p), *qc = NULL, *hf = NULL, *out = NULL;
	int ret = 0;

	if (!ignore)
		return sm70_errf(err, -ENOMEM, "out of memory");
	out = json_deep_copy(config);
	if (p->format == SM70_Q_MODELOPT) {
		qc = modelopt_quantization_config(ignore);
		hf = modelopt_hf_quant_config(ignore);
	} else {
		qc = compressed_tensors_config(ignore);
	}
	if (!out || !qc || (p->format == SM70_Q_MODELOPT && !hf) ||
	    json_object_set(out, "quantization_config", qc) != 0) {
		ret = sm70_errf(err, -ENOMEM, "out of memory");
		goto out;
	}
	ret = write_json(out_dir, "config.json", out, err);
	if (!ret && hf)
		ret = write_json(out_dir, "hf_quant_config.json", hf, err);
out:
	json_decref(out);
	json_decref(hf);
	json_decref(qc);
	json_decref(ignore);
	return ret;
}

/* Weights and files this tool writes itself are not copied. */
static int is_weight_or_written(const char *name)
{
	static const char *const suffixes[] = { ".safetensors", ".safetensors.index.json",
						".bin", ".pt", ".pth", ".gguf", ".tmp" };

	if (strcmp(name, "config.json") == 0 || strcmp(name, "hf_quant_config.json") == 0)
		return 1;
	for (size_t i = 0; i < sizeof(suffixes) / sizeof(suffixes[0]); i++)
		if (has_suffix(name, suffixes[i]))
			return 1;
	return 0;
}

static int copy_file(const char *from, const char *to, struct sm70_err *err)
{
	char buf[1 << 16];
	int in = open(from, O_RDONLY | O_CLOEXEC), out = -1, ret = 0;
	ssize_t n;

	if (in < 0) {
		ret = -errno;
		return sm70_errf(err, ret, "%s: cannot open: %s", from, strerror(-ret));
	}
	out = open(to, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (out < 0) {
		ret = -errno;
		sm70_errf(err, ret, "%s: cannot create: %s", to, strerror(-ret));
		goto out;
	}
	while ((n = read(in, buf, sizeof(buf))) > 0) {
		if (write(out, buf, (size_t)n) != n) {
			ret = errno ? -errno : -EIO;
			sm70_errf(err, ret, "%s: write failed: %s", to, strerror(-ret));
			goto out;
		}
	}
	if (n < 0) {
		ret = -errno;
		sm70_errf(err, ret, "%s: read failed: %s", from, strerror(-ret));
	}
out:
	if (out >= 0 && close(out) != 0 && !ret) {
		ret = -errno;
		sm70_errf(err, ret, "%s: write failed: %s", to, strerror(-ret));
	}
	close(in);
	return ret;
}

int sm70__q_copy_side_files(const char *in_dir, const char *out_dir, struct sm70_err *err)
{
	DIR *d = opendir(in_dir);
	struct dirent *de;
	int ret = 0;

	if (!d) {
		ret = -errno;
		return sm70_errf(err, ret, "%s: cannot read: %s", in_dir, strerror(-ret));
	}
	while (!ret && (de = readdir(d))) {
		char from[4096], to[4096];
		struct stat st;

		if (de->d_name[0] == '.' || is_weight_or_written(de->d_name))
			continue;
		snprintf(from, sizeof(from), "%s/%s", in_dir, de->d_name);
		if (lstat(from, &st) != 0 || !S_ISREG(st.st_mode))
			continue;
		if (st.st_size > SIDE_FILE_MAX) {
			fprintf(stderr, "sm70-quantize: note: %s is not copied (%lld bytes; side "
				"files are copied up to %u)\n", from, (long long)st.st_size,
				SIDE_FILE_MAX);
			continue;
		}
		snprintf(to, sizeof(to), "%s/%s", out_dir, de->d_name);
		ret = copy_file(from, to, err);
	}
	closedir(d);
	return ret;
}

int sm70__q_write_index(const struct sm70__q_plan *p, const char *out_dir,
			struct sm70_err *err)
{
	json_t *map = json_object(), *index;
	json_int_t total = 0;
	int ret;

	if (p->n_shards == 1) {
		json_decref(map);
		return 0;
	}
	if (!map)
		return sm70_errf(err, -ENOMEM, "out of memory");
	for (size_t i = 0; i < p->n_items; i++) {
		const struct sm70__q_item *it = &p->items[i];
		char shard[64];

		sm70__q_shard_name(p, it->shard, shard, sizeof(shard));
		for (int j = 0; j < it->n_out; j++) {
			total += (json_int_t)it->out[j].nbytes;
			if (json_object_set_new(map, it->out[j].name, json_string(shard)) != 0) {
				json_decref(map);
				return sm70_errf(err, -ENOMEM, "out of memory");
			}
		}
	}
	index = json_pack("{s:{s:I},s:o}", "metadata", "total_size", total, "weight_map", map);
	if (!index)
		return sm70_errf(err, -ENOMEM, "out of memory");
	ret = write_json(out_dir, "model.safetensors.index.json", index, err);
	json_decref(index);
	return ret;
}
