/*
 * model.h - a loaded model on a backend: weights, KV cache memory and the workspace of
 * one forward step, behind one model-independent interface.
 *
 * Each architecture (qwen3.c, ...) supplies a struct sm70_arch_ops: how to bind its
 * weights from a checkpoint (or make dummy ones) and how to run one step. The engine
 * only sees sm70_model_forward: tokens in (struct sm70_batch, host arrays), f32 logits
 * out for the rows asked for.
 *
 * Ownership: the model owns its backend buffers; the backend and the checkpoint are the
 * caller's and must outlive the model (the CPU backend may point into the mapping).
 * Not thread-safe.
 */
#ifndef SM70_ENGINE_MODEL_H
#define SM70_ENGINE_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "daemon/engine/checkpoint.h"
#include "daemon/engine/model_config.h"
#include "kernels/backend.h"

struct sm70_model_opts {
	int max_tokens;       /* most tokens one step may carry (prefill chunks + decodes) */
	int max_seqs;         /* most sequences one step may carry */
	int block_size;       /* KV cache tokens per block */
	int n_blocks;         /* KV cache blocks; 0: size from kv_bytes */
	size_t kv_bytes;      /* KV cache budget when n_blocks is 0 */
	enum sm70_dtype kv_dtype;
	int dummy;            /* make deterministic pseudo-random weights, read no tensors */
	uint64_t dummy_seed;
};

/* Host-side description of one step; the model uploads it. Same meaning as
 * struct sm70_batch in backend.h. */
struct sm70_step {
	int n_tokens;
	int n_seqs;
	int max_blocks;
	int max_pos;
	const int32_t *tok_ids;
	const int32_t *tok_pos;
	const int32_t *tok_seq;
	const int32_t *tok_slot;
	const int32_t *block_tables; /* [n_seqs][max_blocks] */
	int n_out;
	const int32_t *out_rows;
	/* decodes first, then prefill chunks: see struct sm70_batch */
	int n_decode;
	int n_chunks;
	const int32_t *chunk_first;
	const int32_t *chunk_len;
};

struct sm70_model;

struct sm70_arch_ops {
	const char *name;
	/* Allocates and fills the architecture's weights (arch-private state in *state). */
	int (*load)(struct sm70_model *m, const struct sm70_ckpt *ck, void **state,
		    struct sm70_err *err);
	void (*unload)(struct sm70_model *m, void *state);
	/* Bytes of workspace one step of max_tokens tokens and max_seqs sequences needs. */
	size_t (*workspace_bytes)(const struct sm70_model *m);
	/* Runs the step already uploaded to m->batch; writes f32 logits [n_out, vocab] to
	 * m->logits (backend memory). */
	void (*forward)(struct sm70_model *m, void *state);
	/* Bytes of weights, for roofline figures. */
	size_t (*weight_bytes)(const struct sm70_model *m, void *state);
};

struct sm70_model {
	struct sm70_model_config cfg;
	struct sm70_model_opts opts;
	struct sm70_backend *be;
	const struct sm70_arch_ops *arch;
	void *arch_state;

	struct sm70_kv_layout kv_lay;
	struct sm70_kv_layer *kv; /* [n_layers] */

	struct sm70_batch batch;  /* device copy of the current step */
	void *batch_buf;          /* backend memory holding the batch arrays */
	void *work;               /* forward workspace */
	float *logits;            /* backend memory [max_seqs, vocab] */
	struct sm70_sample_row *sample_rows;     /* backend memory [max_seqs], when the */
	struct sm70_sample_result *sample_out;   /* backend samples on the device */
	uint64_t clamped_values;  /* weights clamped to the f16 range while loading */

	/* Decode-only steps replayed as captured graphs (backends with graph ops, unless
	 * SM70_GRAPHS=0): one per (padded batch, context bucket), made on first use. Padding
	 * rows write their K/V into a scratch block past the pool (id kv_lay.n_blocks). */
	int graphs_on;
	int n_graphs;
	struct sm70_graph {
		int batch;
		int bucket;
		void *exec;
	} graphs[128];
	uint64_t graph_replays, graph_captures;
	int32_t *pad_host;        /* host staging for a padded step */
};

/* Loads a model from an open checkpoint onto be. Returns 0 or -errno with err set. */
int sm70_model_load(struct sm70_model **out, const struct sm70_ckpt *ck,
		    struct sm70_backend *be, const struct sm70_model_opts *opts,
		    struct sm70_err *err);
void sm70_model_free(struct sm70_model *m);

/* Runs one step and copies the logits of st->out_rows to host_logits [n_out, vocab].
 * Returns 0 or -errno (-EINVAL when the step exceeds the sizes given at load). */
int sm70_model_forward(struct sm70_model *m, const struct sm70_step *st, float *host_logits);

/* Runs one step and samples on the device (only when m->be->ops->sample exists): row i
 * of rows (host) goes with out_rows[i]; out (host) receives n_out results. Returns 0 or
 * -errno. */
int sm70_model_forward_sample(struct sm70_model *m, const struct sm70_step *st,
			      const struct sm70_sample_row *rows, struct sm70_sample_result *out);

/* Bytes of one KV block across all layers (K and V). */
size_t sm70_model_kv_block_bytes(const struct sm70_model *m);

/*
 * Weight helpers for architectures. sm70__weight_load copies a checkpoint tensor (shape
 * [rows, cols]) into backend memory, keeping its dtype; several tensors with the same
 * cols may be stacked into one matrix (e.g. q|k|v) by passing n > 1. sm70__norm_load
 * loads a 1-D tensor as f32. In dummy mode both make deterministic pseudo-random values
 * seeded by the tensor name: uniform in +-1/sqrt(cols) for matrices, 1 +- 0.1 for norms.
 */
int sm70__weight_load(struct sm70_model *m, const struct sm70_ckpt *ck, struct sm70_weight *w,
		      const char *const *names, const int *rows, int n, int cols,
		      struct sm70_err *err);
int sm70__norm_load(struct sm70_model *m, const struct sm70_ckpt *ck, float **out,
		    const char *name, int dim, struct sm70_err *err);
void sm70__weight_free(struct sm70_model *m, struct sm70_weight *w);

extern const struct sm70_arch_ops sm70__arch_qwen3;

#endif
