/*
 * quantize.h - the parts of sm70-quantize: which tensors become NVFP4 and under what names
 * (plan.c), the quantization of one tensor (convert.c), and the output directory: its
 * checks, config files, copied files and shard index (outdir.c). tools/sm70-quantize.c
 * ties them together with a thread pool.
 *
 * Ownership: a plan borrows the input checkpoint's tensors (memory-mapped) and owns every
 * name and buffer it makes; sm70__q_plan_free releases them.
 * Non-goals: calibration, activation scales, other quantization formats.
 */
#ifndef SM70_TOOLS_QUANTIZE_H
#define SM70_TOOLS_QUANTIZE_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "daemon/engine/safetensors.h"

enum sm70__q_format {
	SM70_Q_MODELOPT,
	SM70_Q_COMPRESSED_TENSORS,
};

/* One output tensor: borrowed input bytes (data) or a buffer of its own (owned). */
struct sm70__q_out {
	char *name;
	enum sm70_dtype dtype;
	int ndim;
	int64_t shape[SM70_ST_MAX_DIMS];
	size_t nbytes;
	const void *data;
	void *owned;
};

/* One input tensor and what becomes of it. */
struct sm70__q_item {
	const struct sm70_st_tensor *in;
	char *module;            /* the name exclude patterns and ignore lists use */
	int quantize;            /* 1: NVFP4 (3 outputs); 0: copied as is (1 output) */
	int linear;              /* a 2-D float "*.weight" or fused expert tensor: listed as
				  * ignored in the quantization config when kept */
	const char *excluded_by; /* the --exclude pattern that kept it, or NULL */
	int bad_k;               /* kept: its rows are not a multiple of 16 long */
	int all_zero;            /* set by the conversion: scale_2 was defined as 1 */
	int shard;
	int n_out;
	struct sm70__q_out out[3];
};

struct sm70__q_plan {
	enum sm70__q_format format;
	size_t n_items;
	struct sm70__q_item *items; /* sorted by input name */
	int n_shards;
	size_t n_quantized;
};

/* The option strings of --format; -1 for another. */
int sm70__q_parse_format(const char *s);

/*
 * Builds the plan for every tensor of the n_files files: which are quantized (2-D
 * "*_proj.weight" and fused 3-D "experts.gate_up_proj" / "experts.down_proj" float tensors
 * whose module matches no exclude pattern and whose rows are a multiple of 16 long), the
 * output names and shapes of each, and the output shard of each (a new shard starts when
 * the next tensor would take one past max_shard_bytes). Returns 0 or -errno with err set.
 */
int sm70__q_plan_build(struct sm70__q_plan *p, enum sm70__q_format format,
		       const struct sm70_st_file *const *files, size_t n_files,
		       char *const *excludes, int n_excludes, uint64_t max_shard_bytes,
		       struct sm70_err *err);

void sm70__q_plan_free(struct sm70__q_plan *p);

/* Quantizes item (quantize == 1) into its owned outputs. Refuses NaN and infinite values
 * naming the tensor, file and element. Thread-safe for distinct items. */
int sm70__q_convert(struct sm70__q_item *item, enum sm70__q_format format,
		    struct sm70_err *err);

/* Frees the owned output buffers of item (after its shard is written). */
void sm70__q_release(struct sm70__q_item *item);

/* Checks OUT_DIR: created when absent; refused when it is IN_DIR, or not empty unless
 * force (which then removes the weight and quantization files a previous run left). */
int sm70__q_prepare_outdir(const char *in_dir, const char *out_dir, int force,
			   struct sm70_err *err);

/* Writes OUT_DIR/config.json (config with quantization_config) and, for ModelOpt,
 * hf_quant_config.json. config is not modified. */
int sm70__q_write_configs(const struct sm70__q_plan *p, json_t *config, const char *out_dir,
			  struct sm70_err *err);

/* Copies the small non-weight files of IN_DIR (tokenizer, generation config, ...) to
 * OUT_DIR; prints a notice for each file it leaves out. */
int sm70__q_copy_side_files(const char *in_dir, const char *out_dir, struct sm70_err *err);

/* The file name of shard i ("model.safetensors" when there is one shard). */
void sm70__q_shard_name(const struct sm70__q_plan *p, int i, char *buf, size_t size);

/* Writes model.safetensors.index.json when there is more than one shard. */
int sm70__q_write_index(const struct sm70__q_plan *p, const char *out_dir,
			struct sm70_err *err);

#endif
