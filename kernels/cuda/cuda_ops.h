/*
 * cuda_ops.h - the CUDA backend's op launchers, one per slot of struct sm70_backend_ops
 * (kernels/backend.h states each contract; every .cu adds only what is GPU-specific).
 *
 * A plain C header (no CUDA types) so that C code and tests may name the launchers; .cu
 * files include it inside extern "C" { }. On CUDA act_dtype is f16: every `void *`
 * activation is an array of IEEE half. Every launcher queues work on the backend's one
 * stream and returns at once; failures go to the backend's sticky error (cuda_check.h).
 *
 * Non-goals: ops beyond backend.h.
 */
#ifndef SM70_KERNELS_CUDA_CUDA_OPS_H
#define SM70_KERNELS_CUDA_CUDA_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/backend.h"

void sm70__cuda_embed(struct sm70_backend *be, float *x, const struct sm70_weight *table,
		      const int32_t *ids, int n);
void sm70__cuda_add_rmsnorm(struct sm70_backend *be, void *y, float *resid, const void *delta,
			    const float *w, int n, int dim, float eps);
void sm70__cuda_add(struct sm70_backend *be, float *resid, const void *x, size_t count);
void sm70__cuda_matmul(struct sm70_backend *be, void *y, int y_f32, const void *x,
		       const struct sm70_weight *w, int n);
int sm70__cuda_add_rmsnorm_matmul(struct sm70_backend *be, void *y, float *resid_out,
				  const float *resid_in, const void *delta, const float *norm_w,
				  float eps, const struct sm70_weight *w, int n, int glu);
int sm70__cuda_matmul_glu(struct sm70_backend *be, void *y, const void *x,
			  const struct sm70_weight *w, int n);
/* matmul_nvfp4.cu: matmul on an NVFP4 weight (sm70__cuda_matmul routes there), and the
 * backend's prepare_weight (host work and uploads; returns when the weight is uploaded). */
void sm70__cuda_matmul_nvfp4(struct sm70_backend *be, void *y, int y_f32, const void *x,
			     const struct sm70_weight *w, int n);
int sm70__cuda_prepare_weight(struct sm70_backend *be, struct sm70_weight *w_out,
			      const struct sm70_weight *host_modelopt, struct sm70_err *err);
void sm70__cuda_head_norm_rope(struct sm70_backend *be, void *qk, int ld, int n, int n_heads,
			       int head_dim, const float *norm_w, float eps, const int32_t *pos,
			       int rot_dim, double theta);
void sm70__cuda_kv_write(struct sm70_backend *be, const struct sm70_kv_layer *kv,
			 const struct sm70_kv_layout *lay, const void *k, const void *v, int ld,
			 const int32_t *slots, int n);
void sm70__cuda_attention(struct sm70_backend *be, void *out, const void *q, int q_ld,
			  const struct sm70_kv_layer *kv, const struct sm70_kv_layout *lay,
			  const struct sm70_batch *b, int n_heads, float scale);
void sm70__cuda_silu_mul(struct sm70_backend *be, void *out, const void *gate_up, int n,
			 int inter);
void sm70__cuda_gather_rows(struct sm70_backend *be, void *dst, const void *src,
			    const int32_t *rows, int n, int dim, int is_f32);
int sm70__cuda_graph_begin(struct sm70_backend *be);
int sm70__cuda_graph_end(struct sm70_backend *be, void **graph);
int sm70__cuda_graph_launch(struct sm70_backend *be, void *graph);
void sm70__cuda_graph_destroy(struct sm70_backend *be, void *graph);
void sm70__cuda_sample(struct sm70_backend *be, struct sm70_sample_result *out,
		       const float *logits, const struct sm70_sample_row *rows, int n, int vocab);
void sm70__cuda_shard_summary(struct sm70_backend *be, struct sm70_shard_summary *out,
			      const float *logits, const struct sm70_sample_row *rows, int n,
			      int vocab, int id0);
void sm70__cuda_qk_norm_rope_kv(struct sm70_backend *be, void *qkv, int ld, int n, int n_heads,
				int n_kv_heads, int head_dim, const float *q_norm,
				const float *k_norm, float eps, const int32_t *pos, int rot_dim,
				double theta, const struct sm70_kv_layer *kv,
				const struct sm70_kv_layout *lay, const int32_t *slots);
void sm70__cuda_silu_matmul(struct sm70_backend *be, void *y, const void *gate_up,
			    const struct sm70_weight *w, int n);
void sm70__cuda_conv1d_silu(struct sm70_backend *be, void *out, const void *x, int ld,
			    const float *w, const struct sm70_state_layer *st,
			    const struct sm70_state_layout *lay, const struct sm70_batch *b);
void sm70__cuda_gdn(struct sm70_backend *be, void *out, const void *qkv, const void *ba,
		    int ba_ld, const float *a_log, const float *dt_bias,
		    const struct sm70_state_layer *st, const struct sm70_state_layout *lay,
		    const struct sm70_batch *b, int chunked);
/* Benchmark hook (sm70-bench gdn) for the gdn recurrence kernel: cols, its value columns
 * per block (16, 32 or 64; 0, the default: the launcher's own choice); hints, streaming
 * cache hints on the state (1), plain accesses (0), or the default (-1). Process-wide, not
 * thread-safe; the engine never calls it. */
void sm70__cuda_gdn_tune(int cols, int hints);
void sm70__cuda_gated_rmsnorm(struct sm70_backend *be, void *x, const void *z, int z_ld,
			      const float *w, int n, int n_heads, int dim, float eps,
				 int gate_sigmoid);
void sm70__cuda_sigmoid_mul(struct sm70_backend *be, void *x, const void *gate, int ld, int n,
			    int dim);
void sm70__cuda_moe_route(struct sm70_backend *be, const struct sm70_moe_route *route,
			  const float *logits, int ld, int n, int n_experts, int k, int renorm);
void sm70__cuda_moe_experts(struct sm70_backend *be, void *out, const void *x,
			    const struct sm70_experts *gate_up, const struct sm70_experts *down,
			    const struct sm70_moe_route *route, int n, int k, void *mid,
			    float *part);
/* moe_experts_nvfp4.cu: the backend's prepare_experts (host work and uploads; returns when
 * the stack is uploaded); moe_experts routes NVFP4 stacks to that file's kernels. */
int sm70__cuda_prepare_experts(struct sm70_backend *be, struct sm70_experts *out,
			       const struct sm70_experts *host_modelopt, struct sm70_err *err);
/* Benchmark and test hook (sm70-bench moe and moe-nvfp4, test_cuda_moe and
 * test_cuda_moe_nvfp4) for moe_experts: path 1 the reference kernels, 0 the grouped ones,
 * -1 (the default) SM70_MOE from the environment; variant, the grouped kernels' tile shapes
 * (0, the default, to 4 on f16 stacks, to 2 on NVFP4 ones); passes, a mask of the
 * launches to queue (1 gate_up, 2 down, 4 combine; 0, the default: all), for timing them
 * apart. Process-wide, read when an op is queued (a captured graph keeps what it was
 * captured with); not thread-safe; the engine never calls it. */
void sm70__cuda_moe_tune(int path, int variant, int passes);
/* Warps a tile of the grouped gate_up and down passes, f16 and NVFP4 (0: each shape's;
 * -1: the fitting rule; a value above what a shape's block can hold is capped there), as
 * SM70_MOE_KS; both -2: SM70_MOE_KS's again (the default). moe_experts.cu. */
void sm70__cuda_moe_tune_ks(int gate_up_ks, int down_ks);
void sm70__cuda_sigmoid_scale_add(struct sm70_backend *be, void *out, const void *x,
				  const float *gate, int ld, int n, int dim);
void sm70__cuda_group_rmsnorm(struct sm70_backend *be, void *y, const void *x, int x_f32,
			      const float *w, int n, int groups, int dim, float eps);
void sm70__cuda_hc_gates(struct sm70_backend *be, void *z, float *inj, const float *f, int ld,
			 int n, int rank, int streams);
void sm70__cuda_hc_combine(struct sm70_backend *be, void *y, const void *u, const void *xn,
			   int n, int streams, int dim);
void sm70__cuda_hc_inject(struct sm70_backend *be, float *x, const void *delta,
			  const float *inj, int n, int streams, int dim);
void sm70__cuda_side_begin(struct sm70_backend *be);
void sm70__cuda_side_end(struct sm70_backend *be);
void sm70__cuda_side_join(struct sm70_backend *be);
int sm70__cuda_hc_mix(struct sm70_backend *be, void *y, float *inj, void *xn, float *part,
		      const float *x, const float *norm, const struct sm70_weight *mix,
		      const struct sm70_weight *up, int streams, int dim, int rank, float eps);
void sm70__cuda_ngram_hist(struct sm70_backend *be, int32_t *hist, int32_t *ctx, int n_hist,
			   const struct sm70_batch *b);
void sm70__cuda_ple_embed(struct sm70_backend *be, void *out, const struct sm70_ple_hash *ph,
			  const int32_t *hist, const struct sm70_batch *b);
void sm70__cuda_ple_gate(struct sm70_backend *be, void *gv, const void *kn, const void *qn,
			 const void *v, int v_ld, int n, int streams, int dim);
void sm70__cuda_ple_conv(struct sm70_backend *be, float *x, const void *gv, const void *gvn,
			 const struct sm70_dconv *dc, const struct sm70_batch *b);
void sm70__cuda_qsa_key_write(struct sm70_backend *be, const struct sm70_qsa_layer *ql,
			      const void *k, int ld, int dim, const struct sm70_batch *b);
void sm70__cuda_qsa_compress(struct sm70_backend *be, const struct sm70_qsa_layer *ql,
			     const float *k_norm, float eps, int dim, int ratio, int rot_dim,
			     double theta, int block_size, const struct sm70_batch *b);
void sm70__cuda_qsa_select(struct sm70_backend *be, int32_t *sel, int32_t *n_sel, int sel_ld,
			   const void *q, int q_ld, const struct sm70_qsa_layer *ql, int n_heads,
			   int dim, int ratio, int top_blocks, int block_size, float *scratch,
			   const struct sm70_batch *b);
void sm70__cuda_sparse_attention(struct sm70_backend *be, void *out, const void *q, int q_ld,
				 const struct sm70_kv_layer *kv, const struct sm70_kv_layout *lay,
				 const struct sm70_batch *b, const int32_t *sel,
				 const int32_t *n_sel, int sel_ld, int n_heads, float scale);
/* Benchmark helper (tests/gpu): median microseconds of `iters` sample calls, timed with
 * CUDA events on the backend's stream. Returns 0 or -errno. */
int sm70__cuda_sample_time(struct sm70_backend *be, struct sm70_sample_result *out,
			   const float *logits, const struct sm70_sample_row *rows, int n,
			   int vocab, int iters, double *us_median);

#endif
