/*
 * cpu_ops.h - internals shared by the CPU backend's files: its private state, the
 * element-conversion tables, a few inline helpers, and one function per op with the
 * signature of the matching slot in struct sm70_backend_ops (kernels/backend.h states
 * each contract; the .c files add only what is CPU-specific).
 *
 * On the CPU act_dtype is f32, so every `void *` activation is a float array.
 *
 * Non-goals: SIMD intrinsics (loops are written for the auto-vectoriser), ops of their
 * own beyond backend.h.
 */
#ifndef SM70_KERNELS_CPU_CPU_OPS_H
#define SM70_KERNELS_CPU_CPU_OPS_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kernels/backend.h"
#include "kernels/cpu/threadpool.h"

/*
 * The backend's private state (be->priv). Ops run on the pool; per-thread scratch is
 * grown by the calling thread before it starts a job (never inside one), and without a
 * lock because backend.h allows one caller per backend at a time.
 */
struct sm70__cpu {
	struct sm70_backend be;
	struct sm70__pool *pool;
	int n_threads;
	float *scratch;        /* n_threads slices of scratch_stride floats, 64-byte aligned */
	size_t scratch_stride; /* floats per slice, a multiple of 16 */
	int scratch_off;       /* tests: sm70__cpu_scratch fails, forcing the no-scratch paths */
};

static inline struct sm70__cpu *sm70__cpu_of(struct sm70_backend *be)
{
	return be->priv;
}

/*
 * Makes sure every thread has a scratch slice of at least `floats` floats and returns
 * the base of slice 0 (thread i's slice starts scratch_stride floats further per i), or
 * NULL when it could not grow (the old scratch is kept; ops then take a path that needs
 * none). Called by the op's caller thread only, before sm70__pool_run.
 */
float *sm70__cpu_scratch(struct sm70__cpu *c, size_t floats);

/* Items per pool chunk so that one chunk does at least ~work_min units of work when one
 * item does `per_item` units: small ops then run inline in the caller. */
static inline int sm70__cpu_grain(size_t per_item)
{
	const size_t work_min = 16384;

	if (per_item == 0)
		return 1 << 30;
	if (per_item >= work_min)
		return 1;
	return (int)((work_min + per_item - 1) / per_item);
}

/* f16 -> f32 and e4m3 -> f32 for every bit pattern, filled once by
 * sm70__cpu_tables_init() (sm70_backend_cpu_create calls it). */
extern float sm70__f16_lut[65536];
extern float sm70__e4m3_lut[256];
void sm70__cpu_tables_init(void);

/* A uint32_t that may alias a float: bf16 -> f32 is a 16-bit shift into the float's bits,
 * which the vectoriser handles when written as integer stores. */
typedef uint32_t __attribute__((may_alias)) sm70__u32_alias;

/* Converts n elements of type t (f32, f16, bf16 or f8e4m3) to f32; dst and src must not
 * overlap. */
static inline void sm70__cpu_row_to_f32(float *restrict dst, const void *restrict src,
					enum sm70_dtype t, size_t n)
{
	const uint16_t *restrict h = src;
	const uint8_t *restrict b = src;
	sm70__u32_alias *restrict du = (sm70__u32_alias *)dst;
	size_t i = 0;

	switch (t) {
	case SM70_DTYPE_F16:
		/* a table lookup beats the bit arithmetic without F16C (measured: 0.6 vs
		 * 1.4 ns an element on SSE2) */
		for (; i < n; i++)
			dst[i] = sm70__f16_lut[h[i]];
		break;
	case SM70_DTYPE_BF16:
		/* unrolled by hand: GCC's -O2 vectoriser takes this form, not the plain loop
		 * (4x faster); same bits as sm70_bf16_to_f32 */
		for (; i + 8 <= n; i += 8)
			for (int l = 0; l < 8; l++)
				du[i + l] = (uint32_t)h[i + l] << 16;
		for (; i < n; i++)
			du[i] = (uint32_t)h[i] << 16;
		break;
	case SM70_DTYPE_F8E4M3:
		for (; i < n; i++)
			dst[i] = sm70__e4m3_lut[b[i]];
		break;
	default:
		memcpy(dst, src, n * sizeof(float));
		break;
	}
}

/*
 * f32 dot products with 8 partial sums combined in a fixed tree at the end: the compiler
 * keeps the partial sums in vector registers (no reassociation is needed for that), and
 * the result depends only on the operands, never on which thread computes it.
 *
 * sm70__cpu_dot8 adds a[k] * b[k] into acc[k % 8] for k < n (n a multiple of 8), so a
 * long dot can be fed in pieces; sm70__cpu_dot_end folds acc and adds the tail k < n
 * (n < 8 here). sm70__cpu_dot is the two in one and gives the same bits as any split
 * of the same operands into multiple-of-8 pieces.
 */
static inline void sm70__cpu_dot8(float *restrict acc, const float *restrict a,
				  const float *restrict b, int n)
{
	float l[8];

	for (int i = 0; i < 8; i++)
		l[i] = acc[i];
	for (int k = 0; k + 8 <= n; k += 8)
		for (int i = 0; i < 8; i++)
			l[i] += a[k + i] * b[k + i];
	for (int i = 0; i < 8; i++)
		acc[i] = l[i];
}

static inline float sm70__cpu_dot_end(const float *restrict acc, const float *restrict a,
				      const float *restrict b, int n)
{
	float s = ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));

	for (int k = 0; k < n; k++)
		s += a[k] * b[k];
	return s;
}

static inline float sm70__cpu_dot(const float *restrict a, const float *restrict b, int n)
{
	float acc[8] = { 0 };
	int n8 = n & ~7;

	sm70__cpu_dot8(acc, a, b, n8);
	return sm70__cpu_dot_end(acc, a + n8, b + n8, n - n8);
}

/*
 * How the linear-attention ops (conv1d_silu, gdn) walk a batch. Tokens of one state slot
 * must run in batch order, so work is split by slot, never by token: the task of a
 * sequence runs the tokens of its slot, and a sequence whose slot an earlier sequence
 * of the batch already has (padding rows all share the scratch slot n_slots) has no
 * work of its own, since that earlier sequence's task runs its tokens too. That keeps
 * a shared slot race-free and every result independent of the thread count.
 *
 * Tokens are found through units: unit u < n_decode is decode token u; the units after
 * it are the prefill chunks (chunk_first_host / chunk_len_host). A batch without that
 * shape (n_decode + the chunk lengths must cover every token in order) falls back to
 * one unit per token, which the ops then run as the recurrence.
 */
struct sm70__cpu_units {
	int n;        /* units */
	int n_decode; /* units [0, n_decode) are single tokens, decodes */
	const int32_t *first; /* NULL: unit u is token u */
	const int32_t *len;
};

/* Fills u for batch b (reads the host shape arrays and tok_seq / tok_pos: host memory
 * on the CPU). A chunk must be tokens of one sequence at consecutive positions, or the
 * whole batch takes the one-unit-per-token fallback. Defined in gdn.c. */
void sm70__cpu_units_init(struct sm70__cpu_units *u, const struct sm70_batch *b);

/* The first token and the length of unit i. */
static inline void sm70__cpu_unit(const struct sm70__cpu_units *u, int i, int *first,
				  int *len)
{
	if (i < u->n_decode) {
		*first = i;
		*len = 1;
	} else {
		*first = u->first[i - u->n_decode];
		*len = u->len[i - u->n_decode];
	}
}

/* The slot whose tokens the task of sequence s runs, or -1 when it has none to run:
 * an earlier sequence has the same slot, or the slot is outside [0, n_slots]. */
static inline int sm70__cpu_state_owner(const struct sm70_batch *b, int n_slots, int s)
{
	int slot = b->seq_state[s];

	if (slot < 0 || slot > n_slots)
		return -1;
	for (int i = 0; i < s; i++)
		if (b->seq_state[i] == slot)
			return -1;
	return slot;
}

/* The slot of token t, or -1 when it is outside [0, n_slots]. */
static inline int sm70__cpu_token_slot(const struct sm70_batch *b, int n_slots, int t)
{
	int s = b->tok_seq[t], slot;

	if (s < 0 || s >= b->n_seqs)
		return -1;
	slot = b->seq_state[s];
	return slot < 0 || slot > n_slots ? -1 : slot;
}

/*
 * The attention op's body (attention.c), which sparse_attention.c shares: every token of b
 * attends, one (token, head) task at a time, to positions 0..tok_pos (sel NULL) or to the
 * n_sel[t] positions at sel[t * sel_ld]. Score scratch is sized for most rows a task (a
 * task with more takes the two-pass form). Arguments as the attention op's (backend.h).
 */
void sm70__cpu_attend_tokens(struct sm70_backend *be, void *out, const void *q, int q_ld,
			     const struct sm70_kv_layer *kv, const struct sm70_kv_layout *lay,
			     const struct sm70_batch *b, const int32_t *sel,
			     const int32_t *n_sel, int sel_ld, int n_heads, float scale,
			     size_t most);

void sm70__cpu_embed(struct sm70_backend *be, float *x, const struct sm70_weight *table,
		     const int32_t *ids, int n);
void sm70__cpu_add_rmsnorm(struct sm70_backend *be, void *y, float *resid, const void *delta,
			   const float *w, int n, int dim, float eps);
int sm70__cpu_matmul_glu(struct sm70_backend *be, void *y, const void *x,
			 const struct sm70_weight *w, int n);
int sm70__cpu_add_rmsnorm_matmul(struct sm70_backend *be, void *y, float *resid_out,
				 const float *resid_in, const void *delta, const float *norm_w,
				 float eps, const struct sm70_weight *w, int n, int glu);
void sm70__cpu_add(struct sm70_backend *be, float *resid, const void *x, size_t count);
void sm70__cpu_matmul(struct sm70_backend *be, void *y, int y_f32, const void *x,
		      const struct sm70_weight *w, int n);
/* matmul_nvfp4.c: matmul on an NVFP4 weight (called by sm70__cpu_matmul; y, x f32), and
 * the backend's prepare_weight. */
void sm70__cpu_matmul_nvfp4(struct sm70__cpu *c, float *y, const float *x,
			    const struct sm70_weight *w, int n);
int sm70__cpu_prepare_weight(struct sm70_backend *be, struct sm70_weight *w_out,
			     const struct sm70_weight *host_modelopt, struct sm70_err *err);
void sm70__cpu_head_norm_rope(struct sm70_backend *be, void *qk, int ld, int n, int n_heads,
			      int head_dim, const float *norm_w, float eps, const int32_t *pos,
			      int rot_dim, double theta);
void sm70__cpu_kv_write(struct sm70_backend *be, const struct sm70_kv_layer *kv,
			const struct sm70_kv_layout *lay, const void *k, const void *v, int ld,
			const int32_t *slots, int n);
void sm70__cpu_attention(struct sm70_backend *be, void *out, const void *q, int q_ld,
			 const struct sm70_kv_layer *kv, const struct sm70_kv_layout *lay,
			 const struct sm70_batch *b, int n_heads, float scale);
void sm70__cpu_silu_mul(struct sm70_backend *be, void *out, const void *gate_up, int n,
			int inter);
void sm70__cpu_gather_rows(struct sm70_backend *be, void *dst, const void *src,
			   const int32_t *rows, int n, int dim, int is_f32);
void sm70__cpu_shard_summary(struct sm70_backend *be, struct sm70_shard_summary *out,
			     const float *logits, const struct sm70_sample_row *rows, int n,
			     int vocab, int id0);
void sm70__cpu_conv1d_silu(struct sm70_backend *be, void *out, const void *x, int ld,
			   const float *w, const struct sm70_state_layer *st,
			   const struct sm70_state_layout *lay, const struct sm70_batch *b);
void sm70__cpu_gdn(struct sm70_backend *be, void *out, const void *qkv, const void *ba,
		   int ba_ld, const float *a_log, const float *dt_bias,
		   const struct sm70_state_layer *st, const struct sm70_state_layout *lay,
		   const struct sm70_batch *b, int chunked);
void sm70__cpu_gated_rmsnorm(struct sm70_backend *be, void *x, const void *z, int z_ld,
			     const float *w, int n, int n_heads, int dim, float eps,
				 int gate_sigmoid);
void sm70__cpu_sigmoid_mul(struct sm70_backend *be, void *x, const void *gate, int ld, int n,
			   int dim);
void sm70__cpu_moe_route(struct sm70_backend *be, const struct sm70_moe_route *route,
			 const float *logits, int ld, int n, int n_experts, int k, int renorm);
void sm70__cpu_moe_experts(struct sm70_backend *be, void *out, const void *x,
			   const struct sm70_experts *gate_up, const struct sm70_experts *down,
			   const struct sm70_moe_route *route, int n, int k, void *mid,
			   float *part);
int sm70__cpu_prepare_experts(struct sm70_backend *be, struct sm70_experts *out,
			      const struct sm70_experts *host_modelopt, struct sm70_err *err);
void sm70__cpu_sigmoid_scale_add(struct sm70_backend *be, void *out, const void *x,
				 const float *gate, int ld, int n, int dim);
void sm70__cpu_group_rmsnorm(struct sm70_backend *be, void *y, const void *x, int x_f32,
			     const float *w, int n, int groups, int dim, float eps);
void sm70__cpu_hc_gates(struct sm70_backend *be, void *z, float *inj, const float *f, int ld,
			int n, int rank, int streams);
void sm70__cpu_hc_combine(struct sm70_backend *be, void *y, const void *u, const void *xn,
			  int n, int streams, int dim);
void sm70__cpu_hc_inject(struct sm70_backend *be, float *x, const void *delta,
			 const float *inj, int n, int streams, int dim);
void sm70__cpu_ngram_hist(struct sm70_backend *be, int32_t *hist, int32_t *ctx, int n_hist,
			  const struct sm70_batch *b);
void sm70__cpu_ple_embed(struct sm70_backend *be, void *out, const struct sm70_ple_hash *ph,
			 const int32_t *hist, const struct sm70_batch *b);
void sm70__cpu_ple_gate(struct sm70_backend *be, void *gv, const void *kn, const void *qn,
			const void *v, int v_ld, int n, int streams, int dim);
void sm70__cpu_ple_conv(struct sm70_backend *be, float *x, const void *gv, const void *gvn,
			const struct sm70_dconv *dc, const struct sm70_batch *b);
void sm70__cpu_qsa_key_write(struct sm70_backend *be, const struct sm70_qsa_layer *ql,
			     const void *k, int ld, int dim, const struct sm70_batch *b);
void sm70__cpu_qsa_compress(struct sm70_backend *be, const struct sm70_qsa_layer *ql,
			    const float *k_norm, float eps, int dim, int ratio, int rot_dim,
			    double theta, int block_size, const struct sm70_batch *b);
void sm70__cpu_qsa_select(struct sm70_backend *be, int32_t *sel, int32_t *n_sel, int sel_ld,
			  const void *q, int q_ld, const struct sm70_qsa_layer *ql, int n_heads,
			  int dim, int ratio, int top_blocks, int block_size, float *scratch,
			  const struct sm70_batch *b);
void sm70__cpu_sparse_attention(struct sm70_backend *be, void *out, const void *q, int q_ld,
				const struct sm70_kv_layer *kv, const struct sm70_kv_layout *lay,
				const struct sm70_batch *b, const int32_t *sel,
				const int32_t *n_sel, int sel_ld, int n_heads, float scale);

#endif
