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
#include "common/parallel.h"
#include "daemon/engine/arch.h"
#include "daemon/engine/checkpoint.h"
#include "daemon/engine/model_config.h"
#include "daemon/engine/quant_config.h"
#include "kernels/backend.h"
#include "kernels/comm.h"

struct sm70_model_opts {
	int max_tokens;       /* most tokens one step may carry (prefill chunks + decodes) */
	int max_seqs;         /* most sequences one step may carry */
	int state_slots;      /* recurrent-state slots (models with recurrent layers); 0: max_seqs */
	int gdn_recurrent;    /* 1: the DeltaNet ops run the recurrence for prefill too (the
			       * reference path of the chunked form) */
	/* 1: no fused op whose use depends on the step's size (silu_matmul at up to 16 rows,
	 * hc_mix at one), so every row takes one path (docs/ENGINE.md, "Batch invariance");
	 * the backends' own batch_invariant flags fix the kernels */
	int batch_invariant;
	int block_size;       /* KV cache tokens per block */
	int n_blocks;         /* KV cache blocks; 0: size from kv_bytes */
	size_t kv_bytes;      /* KV cache budget when n_blocks is 0 */
	enum sm70_dtype kv_dtype;       /* K's (and V's unless kv_v_dtype says otherwise) */
	enum sm70_kv_v_dtype kv_v_dtype; /* as struct sm70_kv_layout's; 0: V like K */
	int dummy;            /* make deterministic pseudo-random weights, read no tensors */
	uint64_t dummy_seed;
	/* check only (sm70d --check-config): every lookup and every name, shape and dtype
	 * rule of the load, but no weight data read or converted (nor its finiteness
	 * checked) and no n-gram tables mapped; the caller gives the backends an op table
	 * that allocates and copies nothing (load_check.h) */
	int check_only;
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
	const int32_t *seq_state; /* [n_seqs] state slots (models with recurrent layers) */
};

struct sm70_model;

/*
 * One tensor-parallel rank: a backend and this rank's share of the model. With tp ranks
 * rank r holds query heads [q_head0, q_head0 + q_heads), the KV heads they read, rows
 * [r * inter, (r+1) * inter) of gate and up (and those columns of down), and vocabulary
 * rows [vocab0, vocab0 + vocab_n) of the LM head; norms and the embedding are replicated.
 * With one rank it is the whole model.
 */
struct sm70_model_rank {
	struct sm70_backend *be;
	void *arch_state;
	struct sm70_kv_layer *kv;  /* [n_layers]; set for attention layers only */
	struct sm70_state_layer *state; /* [n_layers]; set for recurrent layers only */
	struct sm70_state_layout state_lay; /* this rank's share of a recurrent layer */
	struct sm70_qsa_layer *qsa; /* [n_layers]; QSA indexer caches (qwen4_exp attention) */
	int32_t *ngram_ctx;        /* qwen4_exp PLE: [n_slots + 1][ngram - 1] (ngram_hist) */
	struct sm70_batch batch;   /* device copy of the current step */
	void *batch_buf;           /* backend memory holding the batch arrays */
	void *work;                /* forward workspace */
	float *logits;             /* backend memory [max_seqs, vocab_n] */
	struct sm70_sample_row *sample_rows;    /* [max_seqs], when sampling on the device */
	struct sm70_sample_result *sample_out;  /* one rank with a device sampler */
	struct sm70_shard_summary *shards;      /* several ranks: [max_seqs] */
	int q_head0, q_heads, kv_head0, kv_heads, inter, vocab0, vocab_n;
	/* DeltaNet: key heads [gdn_k0, gdn_k0 + state_lay.n_k_heads) and the value heads
	 * that read them */
	int gdn_k0;
	/* MoE: rows [r * moe_inter, (r+1) * moe_inter) of every expert, and of the shared
	 * expert [r * shared_inter, ...) */
	int moe_inter, shared_inter;
};

struct sm70_arch_ops {
	const char *name;
	/* Checks that the architecture can be split over m->tp ranks (err says why not). */
	int (*check_tp)(const struct sm70_model *m, struct sm70_err *err);
	/* Allocates and fills rank r's share of the weights (arch-private state in *state). */
	int (*load)(struct sm70_model *m, int r, const struct sm70_ckpt *ck, void **state,
		    struct sm70_err *err);
	void (*unload)(struct sm70_model *m, int r, void *state);
	/* Bytes of workspace one step of max_tokens tokens and max_seqs sequences needs on
	 * rank r. */
	size_t (*workspace_bytes)(const struct sm70_model *m, int r);
	/* Runs the step already uploaded to every rank's batch; writes f32 logits
	 * [n_out, vocab_n] to each rank's logits (backend memory). */
	void (*forward)(struct sm70_model *m);
	/* Bytes of weights one decode step reads on rank r, for roofline figures, without
	 * the experts of MoE layers: those are what the last step read (NULL: none). */
	size_t (*weight_bytes)(const struct sm70_model *m, int r);
	size_t (*expert_bytes)(struct sm70_model *m, int r);
};

enum { SM70_FUSED_QK = 1, SM70_FUSED_SILU = 2, SM70_FUSED_HC = 4, SM70_FUSED_NORM = 8,
       SM70_FUSED_GLU = 16, SM70_FUSED_ALL = 31,
       SM70_FUSED_DEFAULT = SM70_FUSED_QK | SM70_FUSED_HC | SM70_FUSED_GLU };

struct sm70_model {
	struct sm70_model_config cfg;
	/* The checkpoint's quantized format (config.json / hf_quant_config.json), read at
	 * load; weights_nvfp4.c loads what it declares. */
	struct sm70_quant_config quant;
	struct sm70_model_opts opts;
	const struct sm70_arch_ops *arch;
	int tp;                    /* ranks */
	struct sm70_comm *comm;    /* NULL with one rank */
	struct sm70_model_rank rank[SM70_MAX_TP];
	const struct sm70_arch_entry *entry; /* the registry row (arch.h) */
	struct sm70_kv_layout kv_lay; /* every rank's (n_kv_heads is per rank) */
	int n_state_slots;         /* recurrent-state slots; 0 for models without state */
	/* Which of the backend's fused ops to use (SM70_FUSED_*: the qk_norm_rope_kv,
	 * silu_matmul, hc_mix, add_rmsnorm_matmul and matmul_glu slots of backend.h), from
	 * SM70_FUSED (model.c, parse_fused). */
	int fused;
	int ple_overlap; /* SM70_PLE_OVERLAP: PLE rows gathered on the side stream */
	/* Benchmarks only: SM70_BENCH_SKIP_ALLREDUCE=1 leaves the all-reduces out, so that
	 * sm70-bench decode can time what they cost (the tokens are then wrong). */
	int bench_skip_allreduce;
	uint64_t clamped_values;   /* weights clamped to the f16 range while loading */
	/* Page-locked host memory the model owns, shared by every rank (qwen4_exp's n-gram
	 * tables): registered with each rank's backend by the architecture's load. */
	void *pinned;
	size_t pinned_bytes;

	/* Decode-only steps replayed as captured graphs (backends with graph ops, unless
	 * SM70_GRAPHS=0): one per (padded batch, context bucket), made on first use, one
	 * executable per rank. Padding rows write their K/V into a scratch block past the
	 * pool (id kv_lay.n_blocks). */
	int graphs_on;
	int n_graphs;
	struct sm70_graph {
		int batch;
		int bucket;
		void *exec[SM70_MAX_TP];
	} graphs[128];
	uint64_t graph_replays, graph_captures;
	int32_t *pad_host;        /* host staging for a padded step */
};

/* Loads a model from an open checkpoint onto be (one rank). Returns 0 or -errno with err
 * set. */
int sm70_model_load(struct sm70_model **out, const struct sm70_ckpt *ck,
		    struct sm70_backend *be, const struct sm70_model_opts *opts,
		    struct sm70_err *err);

/* Loads a model split over tp ranks (tensor parallelism): rank r on be[r] (entries may
 * repeat for CPU ranks that simulate several), collectives through comm (NULL when tp is
 * 1). The backends and comm must outlive the model. */
int sm70_model_load_tp(struct sm70_model **out, const struct sm70_ckpt *ck,
		       struct sm70_backend *const be[], int tp, struct sm70_comm *comm,
		       const struct sm70_model_opts *opts, struct sm70_err *err);
void sm70_model_free(struct sm70_model *m);

/* Runs one step and copies the logits of st->out_rows to host_logits [n_out, vocab]
 * (gathered from every rank). Returns 0 or -errno (-EINVAL when the step exceeds the
 * sizes given at load). */
int sm70_model_forward(struct sm70_model *m, const struct sm70_step *st, float *host_logits);

/* Runs one step and samples on the device (one rank whose backend has `sample`): row i
 * of rows (host) goes with out_rows[i]; out (host) receives n_out results. Returns 0 or
 * -errno. */
int sm70_model_forward_sample(struct sm70_model *m, const struct sm70_step *st,
			      const struct sm70_sample_row *rows, struct sm70_sample_result *out);

/* Runs one step and summarises each out row's logits on every rank (several ranks whose
 * backends have `shard_summary`): out[r * n_out + i] is rank r's summary of row i. The
 * logits stay on the ranks until the next step, for sm70_model_row_logits. Returns 0 or
 * -errno. */
int sm70_model_forward_shards(struct sm70_model *m, const struct sm70_step *st,
			      const struct sm70_sample_row *rows,
			      struct sm70_shard_summary *out);

/* Copies out row i of the last step's logits, gathered from every rank, into
 * host [vocab]. Returns 0 or -errno. */
int sm70_model_row_logits(struct sm70_model *m, int i, float *host);

/* Bytes of weights one decode step reads, over all ranks, experts aside; and the bytes of
 * the experts the last step read over all ranks (a download and sync of small counts). */
size_t sm70_model_weight_bytes(const struct sm70_model *m);
size_t sm70_model_expert_bytes(struct sm70_model *m);

/* Bytes of one KV block across all attention layers (K and V). */
size_t sm70_model_kv_block_bytes(const struct sm70_model *m);

/* Bytes of one recurrent-state slot across all recurrent layers and ranks (0 for models
 * without recurrent layers), and of all slots (the scratch slot included). */
size_t sm70_model_state_slot_bytes(const struct sm70_model *m);
size_t sm70_model_state_bytes(const struct sm70_model *m);

/*
 * Weight helpers for architectures. A weight is loaded as a stack of parts (e.g. q|k|v),
 * each a band of rows [row0, row0 + rows) of a checkpoint tensor of shape
 * [full_rows, full_cols], all cut to the same columns [col0, col0 + cols): what a rank of
 * a tensor-parallel split holds. The checkpoint's dtype is kept (the backend may ask for
 * another). sm70__norm_load loads a 1-D tensor as f32. In dummy mode both make
 * deterministic pseudo-random values, each a function of (tensor name, seed, element
 * index) so that any slice is the same slice of the same whole tensor: uniform in
 * +-1/sqrt(full_cols) for matrices, 1 +- 0.1 for norms.
 */
struct sm70_weight_part {
	const char *name;
	int full_rows;
	int row0;
	int rows;
};

int sm70__weight_load(struct sm70_model *m, int r, const struct sm70_ckpt *ck,
		      struct sm70_weight *w, const struct sm70_weight_part *parts, int n,
		      int full_cols, int col0, int cols, struct sm70_err *err);

/*
 * weights_nvfp4.c, for sm70__weight_load. sm70__nvfp4_parts says what the parts are:
 * 1 NVFP4 (their companion tensors are in the checkpoint, or, in dummy mode, m->quant
 * would quantize them), 0 float, or -EINVAL when the parts mix the two or the checkpoint
 * stores a module its quantization config lists as unquantized. sm70__nvfp4_weight_load
 * then loads them as one NVFP4 matrix through the backend's prepare_weight (each row
 * keeping its part's scale2, in row_scale2 when the parts' differ), or refuses by name:
 * a backend without prepare_weight, a malformed tensor, a column band that does not
 * start and end on a block of 16.
 */
int sm70__nvfp4_parts(const struct sm70_model *m, const struct sm70_ckpt *ck,
		      const struct sm70_weight_part *parts, int n, int full_cols,
		      struct sm70_err *err);
int sm70__nvfp4_weight_load(struct sm70_model *m, int r, const struct sm70_ckpt *ck,
			    struct sm70_weight *w, const struct sm70_weight_part *parts, int n,
			    int full_cols, int col0, int cols, struct sm70_err *err);
/*
 * For sm70__load_experts. sm70__nvfp4_experts says what the n_experts experts of the MoE
 * MLP at name prefix p are: 1 NVFP4 (their companion tensors are in the checkpoint, fused
 * or one set per expert; in dummy mode, m->quant would quantize the fused
 * mlp.experts.gate_up_proj and down_proj), 0 float, or -EINVAL / -ENOTSUP naming the
 * tensor when the checkpoint contradicts its quantization config, or stores some expert
 * matrices as NVFP4 and others as float (moe_experts takes gate_up and down stacks of one
 * kind). sm70__nvfp4_experts_load then loads rank r's share (rows [i0, i0 + ni) of gate
 * and up, those columns of down: a multiple of 16 elements at both ends) as one host
 * stack in ModelOpt's layout each (row_scale2: every row its matrix's scale2) and hands
 * both to the backend's prepare_experts; the host stacks are freed before it returns.
 * Returns 0 or -errno with err naming the backend, tensor, expert or rank.
 */
int sm70__nvfp4_experts(const struct sm70_model *m, const struct sm70_ckpt *ck, const char *p,
			int n_experts, int inter, int hidden, struct sm70_err *err);
int sm70__nvfp4_experts_load(struct sm70_model *m, int r, const struct sm70_ckpt *ck,
			     const char *p, int n_experts, int inter, int i0, int ni, int hidden,
			     struct sm70_experts *gate_up, struct sm70_experts *down,
			     struct sm70_err *err);
/* A norm weight [dim] as f32; the family's zero-centred norms get their 1 added here. */
int sm70__norm_load(struct sm70_model *m, int r, const struct sm70_ckpt *ck, float **out,
		    const char *name, int dim, struct sm70_err *err);
/* A norm weight that is always plain (the DeltaNet output norm). */
int sm70__plain_norm_load(struct sm70_model *m, int r, const struct sm70_ckpt *ck,
			  float **out, const char *name, int dim, struct sm70_err *err);

/* Rows [row0, row0 + rows) of a tensor's first dimension. */
struct sm70_row_band {
	int row0;
	int rows;
};

/*
 * Loads bands of rows (first dimension) of an ndim tensor of shape `shape` as one f32
 * array in band order, adding `add` to every value. Dummy mode makes dummy_base +
 * dummy_scale * u, u uniform in [-1, 1) as a function of (name, element index).
 */
int sm70__f32_load(struct sm70_model *m, int r, const struct sm70_ckpt *ck, float **out,
		   const char *name, int ndim, const int64_t *shape,
		   const struct sm70_row_band *bands, int n_bands, float add, float dummy_base,
		   float dummy_scale, struct sm70_err *err);
/* Frees w's buffers (data, and an NVFP4 matrix's scale and row_scale2). */
void sm70__weight_free(struct sm70_model *m, int r, struct sm70_weight *w);

/* The dummy weights' hashing (weights.c): the splitmix64 finaliser, and the seed of a
 * tensor from its name and opts.dummy_seed. */
uint64_t sm70__mix64(uint64_t z);
uint64_t sm70__name_seed(const char *name, uint64_t seed);

/*
 * Loads rank r's share of the n_experts experts of the MoE MLP at name prefix p: rows
 * [i0, i0 + ni) of every expert's gate and up (gate_up: [E][2 * ni][hidden], gate first)
 * and those columns of its down (down: [E][hidden][ni]). Reads the fused layout
 * (mlp.experts.gate_up_proj [E, 2I, H], mlp.experts.down_proj [E, H, I]) when the
 * checkpoint has it, else one tensor per expert (mlp.experts.<e>.{gate,up,down}_proj),
 * one expert at a time; NVFP4 experts (sm70__nvfp4_experts) through
 * sm70__nvfp4_experts_load. Returns 0 or -errno with err naming the tensor.
 */
int sm70__load_experts(struct sm70_model *m, int r, const struct sm70_ckpt *ck, const char *p,
		       int n_experts, int inter, int i0, int ni, int hidden,
		       struct sm70_experts *gate_up, struct sm70_experts *down,
		       struct sm70_err *err);
void sm70__experts_free(struct sm70_model *m, int r, struct sm70_experts *w);

extern const struct sm70_arch_ops sm70__arch_qwen3;
extern const struct sm70_arch_ops sm70__arch_qwen3_5;
extern const struct sm70_arch_ops sm70__arch_qwen4_exp;

#endif
