/*
 * backend.h - the op table every compute backend implements.
 *
 * The model code (daemon/engine/qwen3.c, ...) is written once against this table; the
 * CPU backend (kernels/cpu, fp32, threaded) is the numerical reference and the CUDA
 * backend (kernels/cuda) the product. Every op has one contract, stated here, that both
 * implement; tests compare them op by op.
 *
 * Memory: every pointer passed to an op is backend memory from buf_alloc (host memory
 * for the CPU backend, device memory for CUDA). Activations ("act") are in the
 * backend's act_dtype (f32 on the CPU; f16 on CUDA); the residual stream and logits are
 * always f32. Ops are asynchronous on backends that can be (CUDA: one stream per
 * backend); sync() waits. Ops never allocate. Not thread-safe: one backend, one caller.
 *
 * Non-goals: autograd, general tensors. Shapes are spelt out in each signature.
 */
#ifndef SM70_KERNELS_BACKEND_H
#define SM70_KERNELS_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "common/dtype.h"
#include "common/err.h"
#include "common/sampling.h"

/*
 * A 2-D weight matrix [rows, cols] in backend memory. y = x W^T multiplies by it.
 * dtype f32, f16 or bf16: data is row-major (the CPU reads all three; CUDA holds f16);
 * scale and scale2 are unused.
 *
 * dtype NVFP4 (../shared/ARCHITECTURES.md, "Weight and cache formats"): element
 * W[r][k] = e2m1(code[r][k]) * e4m3(block scale of r, k / 16) * scale2, cols a
 * multiple of 16. data holds the 4-bit codes, scale the E4M3 block-scale bytes, both
 * in the backend's own arrangement, which only prepare_weight makes (so an NVFP4 weight
 * is used only on the backend that prepared it); scale2 is the f32 per-matrix scale.
 * Only matmul reads NVFP4 weights. Its byte count is sm70_weight_bytes', never
 * rows * cols * sm70_dtype_size (which is 0 for NVFP4).
 */
struct sm70_weight {
	enum sm70_dtype dtype;
	int rows;
	int cols;
	void *data;
	void *scale;  /* NVFP4: the E4M3 block scales (backend memory); else NULL */
	float scale2; /* NVFP4: the per-matrix scale (ModelOpt's weight_scale_2) */
	/* NVFP4, optional: f32 [rows] in backend memory, row r's scale2 (it supersedes
	 * scale2 when set). A matrix stacked from parts quantized separately (q | k | v,
	 * gate | up) keeps each part's own scale this way, exactly. prepare_weight copies
	 * it from the host matrix. */
	float *row_scale2;
};

/* The bytes of backend memory w's matrix occupies as matmul reads it: rows * cols *
 * element size for f32/f16/bf16; for NVFP4 the ModelOpt count rows * cols / 2 code bytes
 * plus rows * cols / 16 scale bytes (a backend may pad its arrangement beyond that; the
 * count is what one matmul must read). 0 for other dtypes. Every weight-byte sum (the
 * engine's resident-bytes figure, sm70-bench) goes through this. */
size_t sm70_weight_bytes(const struct sm70_weight *w);

/* A stack of expert matrices [n_experts][rows][cols], row-major, in backend memory; the
 * dtypes of struct sm70_weight. Expert e's matrix starts at data + e * rows * cols
 * elements. NVFP4 stacks (made only by prepare_experts, in the backend's arrangement):
 * data the codes, scale the E4M3 block scales, row_scale2 f32 [n_experts][rows] each
 * expert row's scale2 (an expert's gate and up halves may carry different ones). */
struct sm70_experts {
	enum sm70_dtype dtype;
	int n_experts;
	int rows;
	int cols;
	void *data;
	void *scale;
	float *row_scale2;
};

/* The bytes of one expert of s as moe_experts reads it: rows * cols * element size for
 * float stacks; for NVFP4 the ModelOpt count rows * cols / 2 code bytes, rows * cols / 16
 * scale bytes and rows f32 row scales (a backend's arrangement may pad beyond that). 0
 * for other dtypes. Every expert-byte sum (the engine's per-step figure) goes through
 * this. */
size_t sm70_expert_bytes(const struct sm70_experts *s);

/*
 * The routing of n tokens, each to k of n_experts experts (moe_route writes it; backend
 * memory, sized for the most tokens a step carries):
 *   ids [n * k], w [n * k] (f32): token t's j-th expert and its weight, j in descending
 *     probability (ties: the lower expert id first);
 *   order [n * k]: the assignments t * k + j grouped by expert, experts ascending, tokens
 *     ascending within an expert;
 *   used [n * k]: the distinct experts, ascending, in the first n_used[0] entries;
 *   used_first [n * k + 1]: where used[u]'s assignments start in order
 *     (used_first[n_used[0]] = n * k);
 *   n_used [1]: how many distinct experts the step reads (graph-safe: kernels read it
 *     from device memory, so one captured graph serves any routing).
 */
struct sm70_moe_route {
	int32_t *ids;
	float *w;
	int32_t *order;
	int32_t *used;
	int32_t *used_first;
	int32_t *n_used;
};

/* One layer's paged KV cache: n_blocks blocks of block_size tokens; within a block,
 * token-major then head then dim: k[((blk * block_size + off) * n_kv_heads + h) * head_dim
 * + d], v the same in V's dtype. A "slot" is blk * block_size + off. K and V dtypes:
 * any of f32, f16, f8e4m3 each (CPU); f16/f16, f8e4m3/f8e4m3 or f8e4m3/f16 (CUDA). FP8
 * values are stored as x / scale (k_scale for K, v_scale for V). */
struct sm70_kv_layer {
	void *k;
	void *v;
	float k_scale;
	float v_scale;
};

/* V's dtype in a layout. SM70_KV_V_AS_K (0: what an omitted initialiser gives) stores V in
 * K's dtype; SM70_KV_V(t) stores it as t. Read it with sm70_kv_v_dtype. A distinct type so
 * that assigning a plain enum sm70_dtype here draws -Wenum-conversion. */
enum sm70_kv_v_dtype {
	SM70_KV_V_AS_K = 0,
	SM70__KV_V_END = SM70_DTYPE_COUNT + 1 /* spans SM70_KV_V's values (C++ needs it) */
};
#define SM70_KV_V(t) ((enum sm70_kv_v_dtype)((int)(t) + 1))

struct sm70_kv_layout {
	enum sm70_dtype dtype; /* K's (and V's, unless v_dtype says otherwise) */
	int n_blocks;
	int block_size;
	int n_kv_heads;
	int head_dim;
	enum sm70_kv_v_dtype v_dtype;
};

/* V's element dtype in lay. */
static inline enum sm70_dtype sm70_kv_v_dtype(const struct sm70_kv_layout *lay)
{
	return lay->v_dtype == SM70_KV_V_AS_K ? lay->dtype :
						(enum sm70_dtype)((int)lay->v_dtype - 1);
}

/*
 * The recurrent state of one linear-attention (Gated DeltaNet) layer for n_slots
 * sequence slots plus one scratch slot (index n_slots, written by padding rows):
 *   conv: act [n_slots + 1][conv_k - 1][conv_dim], the last conv_k - 1 pre-conv inputs
 *         of the slot's sequence, oldest first (a token's channels are contiguous);
 *   ssm:  f32 [n_slots + 1][n_v_heads][k_dim][v_dim], the delta-rule state S.
 * conv_dim = 2 * n_k_heads * k_dim + n_v_heads * v_dim (the q | k | v channels).
 * A sequence's state is whatever its previous tokens left; a token at position 0 starts
 * from zeros (the ops reset the slot first), so a new or recomputed sequence never needs
 * its slot cleared. Several padding sequences of a batch may share the scratch slot;
 * their outputs and its contents are then unspecified.
 */
struct sm70_state_layer {
	void *conv;
	float *ssm;
	void *ple; /* qwen4_exp PLE layers: the dilated conv's state (struct sm70_dconv) */
};

struct sm70_state_layout {
	int n_slots;
	int conv_k;
	int conv_dim;
	int n_k_heads;
	int n_v_heads;
	int k_dim;
	int v_dim;
};

/*
 * What one forward step computes, flattened to tokens. Token t belongs to sequence
 * tok_seq[t], sits at position tok_pos[t] and writes its K/V into cache slot tok_slot[t].
 * It attends to positions 0..tok_pos[t] of its sequence, found through that sequence's
 * row of block_tables ([n_seqs][max_blocks]). All arrays are backend memory.
 */
struct sm70_batch {
	int n_tokens;
	int n_seqs;
	int max_blocks;
	int max_pos; /* largest tok_pos + 1 in this batch (bounds attention scratch) */
	const int32_t *tok_ids;
	const int32_t *tok_pos;
	const int32_t *tok_seq;
	const int32_t *tok_slot;
	const int32_t *block_tables;
	int n_out;             /* rows whose logits are wanted */
	const int32_t *out_rows; /* [n_out] token indices */

	/*
	 * The batch's shape, for backends with a separate prefill path (on the CPU only the
	 * linear-attention ops read it; gdn's chunked form follows it):
	 * tokens [0, n_decode) are decodes, one per sequence; the rest form n_chunks prefill
	 * chunks, chunk c being tokens [chunk_first[c], chunk_first[c] + chunk_len[c]) of one
	 * sequence at consecutive positions. Host copies are in chunk_first_host /
	 * chunk_len_host so launchers can size grids without reading device memory.
	 */
	int n_decode;
	int n_chunks;
	const int32_t *chunk_first;
	const int32_t *chunk_len;
	const int32_t *chunk_first_host;
	const int32_t *chunk_len_host;

	/* [n_seqs] the recurrent-state slot of each sequence (models with recurrent layers;
	 * NULL otherwise). */
	const int32_t *seq_state;
};

/* One row for the device sampler (backend memory). n counts the request's generated
 * tokens so far: the draw is sm70_sample_uniform(seed, n). */
struct sm70_sample_row {
	float temperature;
	int32_t top_k;
	float top_p;
	int32_t top_logprobs;
	uint64_t seed;
	uint64_t n;
};

/*
 * qwen4_exp's per-layer n-gram embeddings (PLE): how layer l hashes a token's n-grams
 * into rows of its table (daemon/engine/ple.c computes the parameters; docs/QWEN4_EXP.md
 * says where each comes from). mult [ngram], size and offset [(ngram - 1) *
 * heads_per_ngram] are backend memory; the table is host memory the backend can read
 * (CUDA: registered, mapped), [rows][row_dim] in table_dtype (f32, f16 or bf16).
 */
struct sm70_ple_hash {
	int ngram;           /* ngram_size N: n-grams of 2..N tokens */
	int heads_per_ngram;
	int32_t eos;         /* the token that ends a document and resets the window */
	const uint64_t *mult;
	const uint64_t *size;
	const uint64_t *offset;
	const void *table;
	enum sm70_dtype table_dtype;
	int64_t rows;
	int row_dim;
};

/* A depthwise causal convolution with dilation and its per-slot state: state act
 * [n_slots + 1][(k - 1) * dilation][channels], the slot's newest (k - 1) * dilation
 * inputs, oldest first; w f32 [channels][k]. */
struct sm70_dconv {
	void *state;
	const float *w;
	int channels;
	int k;
	int dilation;
};

/* One QSA layer's indexer cache, slot-indexed like the KV cache (struct sm70_kv_layer):
 * keys f32 [slots][dim], the raw indexer key of each token; comp f32 [slots][dim], at the
 * slot of the last token of each complete block of `ratio` tokens, that block's
 * compressed key. */
struct sm70_qsa_layer {
	float *keys;
	float *comp;
};

struct sm70_backend;

struct sm70_backend_ops {
	/* memory */
	void *(*buf_alloc)(struct sm70_backend *be, size_t bytes);
	void (*buf_free)(struct sm70_backend *be, void *p);
	int (*upload)(struct sm70_backend *be, void *dst, const void *src, size_t bytes);
	int (*download)(struct sm70_backend *be, void *dst, const void *src, size_t bytes);
	int (*sync)(struct sm70_backend *be);
	void (*destroy)(struct sm70_backend *be);

	/* x[i, :] = table[ids[i], :] as f32, i < n. table is [vocab, dim]. (It writes the
	 * residual stream, which is always f32.) */
	void (*embed)(struct sm70_backend *be, float *x, const struct sm70_weight *table,
		      const int32_t *ids, int n);

	/* resid (f32, [n, dim]) += delta (act) when delta is non-NULL; then
	 * y (act) = resid * rsqrt(mean(resid^2) + eps) * w, w f32 [dim]. */
	void (*add_rmsnorm)(struct sm70_backend *be, void *y, float *resid, const void *delta,
			    const float *w, int n, int dim, float eps);

	/* resid (f32) += x (act), element-wise over n*dim values. */
	void (*add)(struct sm70_backend *be, float *resid, const void *x, size_t count);

	/* y[n, w->rows] (act, or f32 when y_f32) = x[n, w->cols] (act) W^T. An NVFP4 w must
	 * come from this backend's prepare_weight; its elements are dequantised exactly (the
	 * CPU in f32; CUDA: e2m1 * e4m3 exactly in f16, scale2 applied to the f32 sum). */
	void (*matmul)(struct sm70_backend *be, void *y, int y_f32, const void *x,
		       const struct sm70_weight *w, int n);

	/*
	 * Optional (NULL: the backend takes no NVFP4 weights; a model that has them is
	 * refused at load). From host_modelopt, an NVFP4 matrix in host memory in ModelOpt's
	 * layout (dtype SM70_DTYPE_NVFP4, rows >= 1, cols >= 16 a multiple of 16; data uint8
	 * [rows][cols / 2], byte j of a row holding element 2j in its low nibble and 2j + 1
	 * in its high nibble; scale E4M3 [rows][cols / 16], byte b scaling elements
	 * 16b .. 16b + 15; scale2 the f32 weight_scale_2), makes *w_out: the same matrix in
	 * this backend's arrangement in new backend memory (w_out->data and w_out->scale from
	 * buf_alloc; the caller releases both with buf_free), scale2 copied. The host buffers
	 * are only read and may be freed on return. Not for use while a graph is captured.
	 * Returns 0, or -EINVAL (not NVFP4, cols not a multiple of 16, a NaN scale byte
	 * 0x7f / 0xff, a non-finite scale2), -ENOMEM or -EIO; err says which, w_out->data
	 * and w_out->scale are then NULL and nothing is left allocated.
	 * CPU: the ModelOpt layout as is. CUDA: see kernels/cuda/matmul_nvfp4.cu.
	 */
	int (*prepare_weight)(struct sm70_backend *be, struct sm70_weight *w_out,
			      const struct sm70_weight *host_modelopt, struct sm70_err *err);

	/*
	 * Optional (NULL: the backend takes no NVFP4 experts). From host_modelopt, an NVFP4
	 * expert stack in host memory in ModelOpt's layout per expert (data uint8
	 * [n_experts][rows][cols / 2], scale E4M3 [n_experts][rows][cols / 16], row_scale2
	 * f32 [n_experts][rows]; the rules of prepare_weight), makes *out in this backend's
	 * arrangement in new backend memory (data, scale, row_scale2 from buf_alloc; the
	 * caller frees all three). moe_experts then reads it like any other stack. Returns
	 * 0 or -errno with err set and nothing left allocated.
	 */
	int (*prepare_experts)(struct sm70_backend *be, struct sm70_experts *out,
			       const struct sm70_experts *host_modelopt, struct sm70_err *err);

	/* In place on qk (act; row i starts at qk + i*ld elements and holds n_heads heads of
	 * head_dim): optional per-head RMSNorm with weight norm_w (f32 [head_dim], NULL to
	 * skip), then rotate-half RoPE on the first rot_dim dims at position pos[i], pairs
	 * (j, j + rot_dim/2), inv_freq[j] = theta^(-2j/rot_dim). */
	void (*head_norm_rope)(struct sm70_backend *be, void *qk, int ld, int n, int n_heads,
			       int head_dim, const float *norm_w, float eps, const int32_t *pos,
			       int rot_dim, double theta);

	/* Writes row i of k and v (act; rows ld elements apart, each n_kv_heads * head_dim
	 * values) into the cache at slots[i]. */
	void (*kv_write)(struct sm70_backend *be, const struct sm70_kv_layer *kv,
			 const struct sm70_kv_layout *lay, const void *k, const void *v, int ld,
			 const int32_t *slots, int n);

	/* Causal paged attention: out[t, h, :] (act, contiguous [n_tokens, n_heads, head_dim])
	 * = softmax(q[t, h] . K^T * scale) V over positions 0..tok_pos[t] of the token's
	 * sequence, with KV head h / (n_heads / n_kv_heads). Row t of q starts at q + t*q_ld. */
	void (*attention)(struct sm70_backend *be, void *out, const void *q, int q_ld,
			  const struct sm70_kv_layer *kv, const struct sm70_kv_layout *lay,
			  const struct sm70_batch *b, int n_heads, float scale);

	/* out[i] = silu(gate[i]) * up[i]; gate_up is act [n, 2*inter] with the gate in the
	 * first inter columns of each row; out is act [n, inter]. */
	void (*silu_mul)(struct sm70_backend *be, void *out, const void *gate_up, int n,
			 int inter);

	/* dst[i, :] = src[rows[i], :] for i < n; f32 when is_f32 else act. */
	void (*gather_rows)(struct sm70_backend *be, void *dst, const void *src,
			    const int32_t *rows, int n, int dim, int is_f32);

	/* Optional (NULL: the engine downloads logits and samples on the host). For each
	 * r < n: out[r] = what sm70_sample() (daemon/engine/sampler.h) returns for
	 * logits[r, 0..vocab) and rows[r] (see common/sampling.h for the semantics). rows and
	 * out are backend memory. A row with no finite distribution (NaN, +inf, all -inf)
	 * gets token -1. */
	void (*sample)(struct sm70_backend *be, struct sm70_sample_result *out,
		       const float *logits, const struct sm70_sample_row *rows, int n, int vocab);

	/*
	 * Optional (NULL: the caller runs add_rmsnorm, then matmul). Both in one: r =
	 * resid_in (f32 [n, w->cols]) + delta (act, when non-NULL) is written to resid_out
	 * (f32, not resid_in; NULL: not kept), x = add_rmsnorm's y of r (bit for bit) and
	 * y = x W^T as matmul computes it (glu: y as matmul_glu makes it from x). A backend
	 * may take only some shapes: it returns 0 when it queued the work, -EOPNOTSUPP when
	 * it did not take this call (nothing queued: the caller runs the ops), -EINVAL for
	 * resid_out == resid_in.
	 */
	int (*add_rmsnorm_matmul)(struct sm70_backend *be, void *y, float *resid_out,
				  const float *resid_in, const void *delta, const float *norm_w,
				  float eps, const struct sm70_weight *w, int n, int glu);

	/*
	 * Optional (NULL: the caller runs matmul, then silu_mul). The gated MLP's input half
	 * in one op: w is the gate rows, then as many up rows ([gate; up], w->rows even), and
	 * y (act [n, w->rows / 2]) = silu_mul of x W^T, bit for bit the two ops' result (the
	 * matmul's output rounded to act first). Returns 0 when it queued the work,
	 * -EOPNOTSUPP when it did not take this call (nothing queued).
	 */
	int (*matmul_glu)(struct sm70_backend *be, void *y, const void *x,
			  const struct sm70_weight *w, int n);

	/* Optional (tensor parallelism; NULL: the model gathers whole rows). For each
	 * r < n: out[r] summarises row r of logits [n, vocab], this rank's slice of the
	 * vocabulary whose first id is id0, as struct sm70_shard_summary says
	 * (common/sampling.h); rows[r].temperature is the T of sum_temp. out and rows are
	 * backend memory. */
	void (*shard_summary)(struct sm70_backend *be, struct sm70_shard_summary *out,
			      const float *logits, const struct sm70_sample_row *rows, int n,
			      int vocab, int id0);

	/* Optional fusion (NULL, or SM70_FUSED=0: the model calls head_norm_rope on q, then
	 * on k, then kv_write). Row i of qkv (act, rows ld elements apart) holds n_heads q
	 * heads, then n_kv_heads k heads, then n_kv_heads v heads, head_dim each: q and k
	 * heads are normed (q_norm / k_norm) and rotated in place exactly as head_norm_rope
	 * does, then the rotated k and the v of row i go to the cache at slots[i]. */
	void (*qk_norm_rope_kv)(struct sm70_backend *be, void *qkv, int ld, int n, int n_heads,
				int n_kv_heads, int head_dim, const float *q_norm,
				const float *k_norm, float eps, const int32_t *pos, int rot_dim,
				double theta, const struct sm70_kv_layer *kv,
				const struct sm70_kv_layout *lay, const int32_t *slots);

	/* Optional fusion, used only when SM70_FUSED is silu or 1 (otherwise, or NULL:
	 * silu_mul, then matmul): y[n, w->rows] (act) = (silu(gate) * up) W^T, where gate_up
	 * is act [n, 2 * w->cols] with the gate in the first w->cols columns of each row. */
	void (*silu_matmul)(struct sm70_backend *be, void *y, const void *gate_up,
			    const struct sm70_weight *w, int n);

	/*
	 * Linear attention (Gated DeltaNet, ../shared/ARCHITECTURES.md). Optional: NULL
	 * unless the backend serves recurrent models; a model that needs one a backend lacks
	 * is refused at load.
	 *
	 * conv1d_silu: causal depthwise convolution over each sequence's tokens in batch
	 * order, then SiLU. Row t of x (act, rows ld elements apart) holds lay->conv_dim
	 * channels; w is f32 [conv_dim][conv_k]. With window = (the slot's conv_k - 1 saved
	 * inputs, then x[t]) oldest first: out[t][c] = silu(sum_j w[c][j] * window[j][c]),
	 * out act [n_tokens][conv_dim] contiguous (not aliasing x); the slot then keeps the
	 * newest conv_k - 1 inputs. Slots come from b->seq_state[b->tok_seq[t]].
	 */
	void (*conv1d_silu)(struct sm70_backend *be, void *out, const void *x, int ld,
			    const float *w, const struct sm70_state_layer *st,
			    const struct sm70_state_layout *lay, const struct sm70_batch *b);

	/*
	 * gdn: the gated delta rule. Row t of qkv (act [n_tokens][conv_dim], the conv
	 * output) is q [n_k_heads][k_dim] | k [n_k_heads][k_dim] | v [n_v_heads][v_dim]; row t
	 * of ba (act, rows ba_ld apart) is b [n_v_heads] then a [n_v_heads]. In f32, per
	 * token and value head h (key head h / (n_v_heads / n_k_heads)):
	 *   q, k = x * rsqrt(sum(x^2) + 1e-6) per head; q *= k_dim^-0.5;
	 *   beta = sigmoid(b[h]); g = -exp(a_log[h]) * softplus(a[h] + dt_bias[h])
	 *   (softplus(x) = x above 20, else log1p(exp(x)));
	 *   S = exp(g) S; m = S^T k; S += k (beta (v - m))^T; out[t][h] = S^T q
	 * out act [n_tokens][n_v_heads][v_dim]; the slot keeps S. With chunked set, a
	 * backend may compute prefill chunks in the chunked (WY) form, equal to the
	 * recurrence within f32 rounding; 0 forces the recurrence (the reference path).
	 */
	void (*gdn)(struct sm70_backend *be, void *out, const void *qkv, const void *ba,
		    int ba_ld, const float *a_log, const float *dt_bias,
		    const struct sm70_state_layer *st, const struct sm70_state_layout *lay,
		    const struct sm70_batch *b, int chunked);

	/* gated_rmsnorm: for each of n rows and n_heads heads of dim values, in place on x
	 * (act [n][n_heads * dim]): x = w * x * rsqrt(mean(x^2) + eps) * g(z), g = silu, or
	 * sigmoid when gate_sigmoid (qwen4_exp's output_gate_type); w f32 [dim], z act with
	 * rows z_ld elements apart (head h at z + h * dim). */
	void (*gated_rmsnorm)(struct sm70_backend *be, void *x, const void *z, int z_ld,
			      const float *w, int n, int n_heads, int dim, float eps,
			      int gate_sigmoid);

	/* sigmoid_mul: x[i][j] *= sigmoid(gate[i * ld + j]) for i < n, j < dim; x act [n][dim]
	 * contiguous, gate act (the output gate of gated attention). */
	void (*sigmoid_mul)(struct sm70_backend *be, void *x, const void *gate, int ld, int n,
			    int dim);

	/*
	 * Mixture of experts. Optional: NULL unless the backend serves MoE models.
	 *
	 * moe_route: for each of n rows of logits (f32, rows ld floats apart, the first
	 * n_experts of each the router's logits): p = softmax(logits) in f32, the k largest
	 * (ties: lower expert id first, as torch.topk on these sizes), divided by their sum
	 * when renorm is set; fills *route as struct sm70_moe_route says.
	 */
	void (*moe_route)(struct sm70_backend *be, const struct sm70_moe_route *route,
			  const float *logits, int ld, int n, int n_experts, int k, int renorm);

	/*
	 * moe_experts: out[t] (act [n][gate_up->cols]) = sum over j < k, in order of j, of
	 * w[t * k + j] * down_e (silu(g) * u), e = ids[t * k + j], where g | u (act) = the
	 * first and second halves of gate_up_e x[t] (gate_up rows = 2 * inter, gate first;
	 * down: [hidden][inter]); f32 accumulation. mid (act [n * k][inter]) and part (f32
	 * [n * k][hidden]) are the caller's scratch. Only the experts in route->used are read.
	 * NVFP4 stacks (gate_up and down both, from this backend's prepare_experts) are
	 * dequantised exactly: element (e, r, c) =
	 * e2m1 * e4m3 * row_scale2[e][r] (the CPU in f32; CUDA: e2m1 * e4m3 exactly in f16,
	 * row_scale2 applied to the f32 sums).
	 */
	void (*moe_experts)(struct sm70_backend *be, void *out, const void *x,
			    const struct sm70_experts *gate_up, const struct sm70_experts *down,
			    const struct sm70_moe_route *route, int n, int k, void *mid,
			    float *part);

	/* sigmoid_scale_add: out[i][j] += sigmoid(gate[i * ld]) * x[i][j], i < n, j < dim;
	 * out and x act [n][dim], gate f32 (the shared expert's gate logit). */
	void (*sigmoid_scale_add)(struct sm70_backend *be, void *out, const void *x,
				  const float *gate, int ld, int n, int dim);

	/*
	 * qwen4_exp: hyper-connections, PLE and QSA (docs/QWEN4_EXP.md). Optional: NULL
	 * unless the backend serves qwen4_exp. n tokens; S streams of H values make a
	 * token's f32 stream row [S * H].
	 *
	 * group_rmsnorm: for each row i < n and group g < groups, over dim values:
	 * y[i][g*dim + j] = x * rsqrt(mean_j(x^2) + eps) * w[g*dim + j], x f32 (x_f32) or
	 * act, rows groups * dim apart; y act [n][groups * dim]; w f32 [groups * dim].
	 */
	void (*group_rmsnorm)(struct sm70_backend *be, void *y, const void *x, int x_f32,
			      const float *w, int n, int groups, int dim, float eps);

	/* hc_gates: from f (f32, rows ld apart: rank low-rank values, then, when inj is
	 * not NULL, S inject logits): z (act [n][rank]) = silu(f / S); inj (f32 [n][S]) =
	 * 2 * sigmoid(f[rank + s] / S). */
	void (*hc_gates)(struct sm70_backend *be, void *z, float *inj, const float *f, int ld,
			 int n, int rank, int streams);

	/* hc_combine: y[i][j] (act [n][dim]) = sum_s sigmoid(u[i][s*dim + j]) *
	 * xn[i][s*dim + j], divided by S (the mean over streams; s ascending in f32); u and
	 * xn act [n][S * dim]. */
	void (*hc_combine)(struct sm70_backend *be, void *y, const void *u, const void *xn,
			   int n, int streams, int dim);

	/* hc_inject: x[i][s*dim + j] (f32 streams) += delta[i][j] (act) * inj[i][s]. */
	void (*hc_inject)(struct sm70_backend *be, float *x, const void *delta,
			  const float *inj, int n, int streams, int dim);

	/*
	 * hc_mix (optional, a fast path): one token's whole mixer in two passes, equal (up to
	 * the order of f32 sums) to group_rmsnorm(xn, x, f32, norm, 1, S, dim) ->
	 * matmul(f, f32, xn, mix) -> hc_gates(z, inj, f, mix->rows, 1, rank, S) ->
	 * matmul(u, act, z, up) -> hc_combine(y, u, xn, 1, S, dim). x f32 [S * dim]; xn act
	 * [S * dim] is written too; inj (f32 [S]) may be NULL (the final mixer); part f32
	 * [S * mix->rows] is scratch. Returns -ENOTSUP with nothing queued when the shapes or
	 * dtypes are not its own (the caller composes the ops then).
	 */
	int (*hc_mix)(struct sm70_backend *be, void *y, float *inj, void *xn, float *part,
		      const float *x, const float *norm, const struct sm70_weight *mix,
		      const struct sm70_weight *up, int streams, int dim, int rank, float eps);

	/*
	 * ngram_hist: hist[t][i] (int32 [n_tokens][n_hist]) = the token at position
	 * tok_pos[t] - 1 - i of token t's sequence, or -1 before position 0; earlier tokens
	 * of the same decode or chunk come from the batch, older ones from ctx (int32
	 * [n_slots + 1][n_hist], a slot's newest n_hist tokens, newest first, through
	 * b->seq_state). Then each sequence's ctx becomes its newest n_hist tokens (-1 where
	 * none). A sequence's tokens in a batch are at consecutive positions.
	 */
	void (*ngram_hist)(struct sm70_backend *be, int32_t *hist, int32_t *ctx, int n_hist,
			   const struct sm70_batch *b);

	/*
	 * ple_embed: out[t] (act [n_tokens][G * row_dim], G = (N - 1) * heads_per_ngram) =
	 * the table rows of token t's hashed n-grams. With w_0 = tok_ids[t] and, for
	 * i = 1..N-1, w_i = hist[t][i - 1] when none of hist[t][0..i-1] is -1 or eos, else
	 * eos: for n = 2..N, m = XOR over i < n of (uint64) w_i * mult[i] (mod 2^64); head
	 * g = (n - 2) * heads_per_ngram + h takes row m % size[g] + offset[g], copied to
	 * out[t][g * row_dim ...]. hist as ngram_hist wrote it (n_hist = N - 1).
	 */
	void (*ple_embed)(struct sm70_backend *be, void *out, const struct sm70_ple_hash *ph,
			  const int32_t *hist, const struct sm70_batch *b);

	/* ple_gate: per token i and stream s, g = sum_j kn[i][s*dim + j] * qn[i][s*dim + j]
	 * / sqrt(dim) (f32), g = sign(g) * sqrt(max(|g|, 1e-6)), and gv[i][s*dim + j] (act
	 * [n][S * dim]) = sigmoid(g) * v[i * v_ld + j]; kn, qn act [n][S * dim]. */
	void (*ple_gate)(struct sm70_backend *be, void *gv, const void *kn, const void *qn,
			 const void *v, int v_ld, int n, int streams, int dim);

	/* ple_conv: x[t][c] (f32 streams, C = dc->channels) += gv[t][c] + silu(conv[t][c]),
	 * conv[t][c] = sum_j w[c][j] * in[p - (k - 1 - j) * dilation][c] over the sequence's
	 * inputs in = gvn (act [n_tokens][C]) at positions p = tok_pos[t] and before (from
	 * the batch or the slot's state; 0 before position 0); the slot then keeps its
	 * newest (k - 1) * dilation inputs. gv act [n_tokens][C]. */
	void (*ple_conv)(struct sm70_backend *be, float *x, const void *gv, const void *gvn,
			 const struct sm70_dconv *dc, const struct sm70_batch *b);

	/* qsa_key_write: row i of k (act, rows ld apart, dim values) to ql->keys at
	 * b->tok_slot[i], for i < n_tokens. */
	void (*qsa_key_write)(struct sm70_backend *be, const struct sm70_qsa_layer *ql,
			      const void *k, int ld, int dim, const struct sm70_batch *b);

	/* qsa_compress: for each token t with (tok_pos[t] + 1) % ratio == 0: the mean (f32)
	 * of ql->keys at positions p0 = tok_pos[t] + 1 - ratio .. tok_pos[t] of its sequence
	 * (through its block table; block_size tokens per block), RMS-normed with k_norm
	 * (f32 [dim]) and eps, rotate-half RoPE on the first rot_dim dims at position p0
	 * (as head_norm_rope), written to ql->comp at tok_slot[t]. Keys of the same batch
	 * are already written (qsa_key_write). */
	void (*qsa_compress)(struct sm70_backend *be, const struct sm70_qsa_layer *ql,
			     const float *k_norm, float eps, int dim, int ratio, int rot_dim,
			     double theta, int block_size, const struct sm70_batch *b);

	/*
	 * qsa_select: for each token t at position p with nb = (p + 1) / ratio complete
	 * blocks: score[c] = (sum over heads h ascending of relu(q[t][h] . comp(c))) /
	 * (float)sqrt(dim) in f32 for block c < nb, comp(c) the compressed key at the slot of
	 * position c * ratio + ratio - 1; the top min(top_blocks, nb) blocks by score (ties:
	 * the lower block first); sel[t] (int32, rows sel_ld apart) = the positions of the
	 * chosen blocks' tokens in ascending order, then the tail nb * ratio .. p; n_sel[t]
	 * their count. q act (rows q_ld apart, n_heads heads of dim, normed and rotated).
	 * scratch f32 [n_tokens][ceil(b->max_pos / ratio)].
	 */
	void (*qsa_select)(struct sm70_backend *be, int32_t *sel, int32_t *n_sel, int sel_ld,
			   const void *q, int q_ld, const struct sm70_qsa_layer *ql, int n_heads,
			   int dim, int ratio, int top_blocks, int block_size, float *scratch,
			   const struct sm70_batch *b);

	/* sparse_attention: as attention, over the positions sel[t][0..n_sel[t]) of token
	 * t's sequence (ascending, each <= tok_pos[t]) instead of 0..tok_pos[t]. */
	void (*sparse_attention)(struct sm70_backend *be, void *out, const void *q, int q_ld,
				 const struct sm70_kv_layer *kv, const struct sm70_kv_layout *lay,
				 const struct sm70_batch *b, const int32_t *sel,
				 const int32_t *n_sel, int sel_ld, int n_heads, float scale);

	/* Optional (NULL: host memory the CPU reads directly). Makes host memory
	 * [p, p + bytes) readable by this backend's ops (a PLE table); 0 or -errno.
	 * host_unregister undoes it. */
	int (*host_register)(struct sm70_backend *be, void *p, size_t bytes);
	void (*host_unregister)(struct sm70_backend *be, void *p);

	/* Optional (all NULL: one stream, everything in order). side_begin: the ops called
	 * until side_end go to a second queue that starts after everything queued so far, so
	 * they overlap what is queued next; side_join: everything queued after it waits for
	 * the second queue's work. A side_begin ... side_end section is followed by exactly
	 * one side_join before the next side_begin, a sync or graph_end; it also works while a
	 * graph is captured (a fork and a join). Only ops that read host memory or run their
	 * own kernels belong in a section (the PLE row gathers: not matmul). */
	void (*side_begin)(struct sm70_backend *be);
	void (*side_end)(struct sm70_backend *be);
	void (*side_join)(struct sm70_backend *be);

	/* Optional graph capture (NULL: not supported). Between graph_begin and graph_end the
	 * ops called are recorded, not run; graph_end returns a handle that graph_launch
	 * replays. A replay runs the same ops with the same scalar arguments over the same
	 * buffers, whose contents may have changed. No upload, download or sync may happen
	 * while capturing. Each returns 0 or -errno. */
	int (*graph_begin)(struct sm70_backend *be);
	int (*graph_end)(struct sm70_backend *be, void **graph);
	int (*graph_launch)(struct sm70_backend *be, void *graph);
	void (*graph_destroy)(struct sm70_backend *be, void *graph);
};

struct sm70_backend {
	const struct sm70_backend_ops *ops;
	const char *name;
	enum sm70_dtype act_dtype;
	/* The dtype matrices must be stored in on this backend, or SM70_DTYPE_COUNT to keep
	 * the checkpoint's (the CPU reads f32, f16 and bf16; CUDA wants f16). */
	enum sm70_dtype weight_dtype;
	/* KV cache dtypes this backend's kernels read, as a mask of 1u << dtype: K's, with V
	 * in the same dtype. kv_v_dtypes[k]: the other V dtypes they read beside a K of
	 * dtype k (mask of 1u << dtype; 0: none). Ask through sm70_backend_reads_kv. The
	 * default (V like K) is used unless the configuration asks for another mode. */
	unsigned kv_dtypes;
	unsigned kv_v_dtypes[SM70_DTYPE_COUNT];
	enum sm70_dtype kv_dtype_default;
	/* Batch invariance (docs/ENGINE.md, "Batch invariance"): when set, what every op
	 * computes for a token's row is bitwise the same whatever other rows share the call
	 * (their number, positions, and whether they are decodes or prefill chunks): one
	 * kernel and one reduction order for every batch size. Creation sets it from
	 * SM70_BATCH_INVARIANT=1; the owner may change it before the ops it governs are
	 * queued (a captured graph keeps what it was captured with). */
	int batch_invariant;
	void *priv;
};

/* Creates the CPU backend with n_threads workers (0: one per online core).
 * Returns 0 or -errno. */
int sm70_backend_cpu_create(struct sm70_backend **out, int n_threads, struct sm70_err *err);

/* Creates the CUDA backend on device `device`. Returns -ENODEV when sm70 was built
 * without CUDA or no device is usable (err says which). */
int sm70_backend_cuda_create(struct sm70_backend **out, int device, struct sm70_err *err);

/* One row of the CUDA backend's kernel timeline (kernels/cuda/kernel_times.cu). */
#define SM70_KERNEL_TIME_NAME 96
struct sm70_kernel_time {
	char name[SM70_KERNEL_TIME_NAME]; /* kernel name, a label (a GEMV's rows x cols) */
	int device;
	long calls;
	double us; /* summed: each call's time since the event before it on its stream */
};

/* With SM70_KERNEL_TIMES=1 set when a CUDA backend is made, every launch on it is timed by
 * CUDA events (kernels/cuda/kernel_times.cu says how). Copies up to max rows of the
 * process's totals since the last reset into out, most time first, and resets them when
 * reset is set. Returns the number of rows: 0 when nothing was profiled or sm70 was
 * built without CUDA. */
int sm70_kernel_times(struct sm70_kernel_time *out, int max, int reset);

/* The last complete step (launches between two downloads) of the lowest profiled device,
 * one row a launch in stream order (calls 1): copies up to max rows, returns how many. */
int sm70_kernel_timeline(struct sm70_kernel_time *out, int max);

/* Creates the null backend: a test double that computes nothing. Every op is a no-op and
 * `sample` emits a deterministic token (a function of the row's seed and n) at once, so
 * the daemon's transport can be measured alone (sm70-bench ipc). Never for real use. */
int sm70_backend_null_create(struct sm70_backend **out, struct sm70_err *err);

/* For prepare_weight implementations: 0 when host_modelopt is an NVFP4 matrix
 * prepare_weight accepts (see there), else -EINVAL with err naming the reason. Reads
 * every scale byte. */
int sm70__nvfp4_check(const struct sm70_weight *host_modelopt, struct sm70_err *err);

/* For prepare_experts implementations: 0 when host_modelopt is an NVFP4 expert stack
 * prepare_experts accepts (n_experts >= 1 and each expert a matrix prepare_weight accepts;
 * every row_scale2 finite and >= 0), else -EINVAL with err naming the expert, row or block.
 * Reads every scale byte and row scale. */
int sm70__nvfp4_experts_check(const struct sm70_experts *host_modelopt, struct sm70_err *err);

/* 1 when the environment asks for batch invariance (SM70_BATCH_INVARIANT=1), else 0: what
 * every backend's constructor puts in struct sm70_backend's batch_invariant. */
int sm70_batch_invariant_env(void);

/* 1 when be's kernels read a KV cache of K dtype k and V dtype v, else 0. */
int sm70_backend_reads_kv(const struct sm70_backend *be, enum sm70_dtype k, enum sm70_dtype v);

/* Destroys a backend made by any constructor (NULL is fine). */
void sm70_backend_destroy(struct sm70_backend *be);

#endif
