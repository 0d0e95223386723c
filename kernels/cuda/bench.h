/*
 * bench.h - device-side helpers of the sm70-bench tool: a read-bandwidth kernel, timed
 * runs of the CUDA backend's matmul and attention ops on decode shapes (and attention on a
 * prefill chunk), cuBLAS as the GEMV baseline, the matmul op on NVFP4 weights, the GDN
 * recurrence (gdn op) on decode and prefill shapes (kernels/cuda/bench_gdn.cu), and an
 * MoE layer's routed experts (moe_experts, moe_route; kernels/cuda/bench_moe.cu), on f16
 * and on NVFP4 stacks.
 *
 * A plain C header (tools are compiled by gcc without SM70_HAVE_CUDA): CUDA builds get the
 * implementation in kernels/cuda/bench.cu, CPU-only builds the versions in
 * kernels/cuda_absent/bench_absent.c, whose sm70__bench_available() returns 0 and whose
 * other functions return -ENODEV.
 *
 * Times are medians over `iters` samples of CUDA-event-timed launches on the backend's
 * stream, after warm-up; inputs are rotated over enough copies that every launch reads
 * from device memory, not from L2. Not thread-safe: one bench session per process.
 * Non-goals: end-to-end model timing (that is sm70-run's job).
 */
#ifndef SM70_KERNELS_CUDA_BENCH_H
#define SM70_KERNELS_CUDA_BENCH_H

#include <stddef.h>

/* 1 when this build has the CUDA backend, else 0. */
int sm70__bench_available(void);

/* Opens a CUDA backend on `device` for the helpers below and writes a one-line
 * description (name, SMs, L2, clocks) into desc. Returns 0 or -errno (msg says why). */
int sm70__bench_open(int device, char *desc, size_t desc_len, char *msg, size_t msg_len);

/* Releases what sm70__bench_open and the helpers allocated. Safe to call twice. */
void sm70__bench_close(void);

struct sm70_backend;

/* The backend sm70__bench_open made (NULL before it or after close), for the sections in
 * other files (bench_gdn.cu). */
struct sm70_backend *sm70__bench_backend(void);

/* Read bandwidth (a kernel that reads `bytes` once, 16 bytes a thread) and device-to-device
 * copy bandwidth (cudaMemcpyAsync of bytes/2, counting bytes read plus written), both in
 * GB/s. Returns 0 or -errno. */
int sm70__bench_bw(size_t bytes, int iters, double *read_gbs, double *copy_gbs);

struct sm70__bench_gemv {
	double us;          /* the backend's matmul op (its fast path for n <= 16) */
	double us_cublas;   /* cublasGemmEx, f16 in, fp32 compute, f16 out */
	double bytes;       /* W + x + y bytes of one call */
	double max_rel;     /* max |ours - cublas| / max |cublas| over y (f32 out) */
};

/* y[n, rows] = x[n, cols] W^T with f16 W, f16 y. Returns 0 or -errno. */
int sm70__bench_gemv(int rows, int cols, int n, int iters, struct sm70__bench_gemv *out);

struct sm70__bench_nvfp4 {
	double us;      /* the backend's matmul op on an NVFP4 weight (prepare_weight's) */
	double bytes;   /* the packed codes + E4M3 scales one call reads (sm70_weight_bytes) */
	double max_rel; /* max |fast - reference kernel| / max |reference| over y (f32 out) */
};

/* y[n, rows] = x[n, cols] W^T with a random NVFP4 W, f16 y, for each kernel variant of
 * variants[0..n_var) (SM70_NVFP4_VARIANT's values, kernels/cuda/matmul_nvfp4.cu) and each
 * n of ns[0..n_ns): out[v * n_ns + i] for variants[v], ns[i] (past n = 4, where every
 * variant is the WMMA kernel, the first variant's figures); the weight is prepared once
 * for all of them. Returns 0 or -errno. */
int sm70__bench_nvfp4(int rows, int cols, const int *ns, int n_ns, const int *variants,
		      int n_var, int iters, struct sm70__bench_nvfp4 *out);

struct sm70__bench_attn {
	double us;          /* the backend's attention op, one layer */
	double bytes;       /* KV bytes read (every token's context once) + q + out */
};

/* The KV cache an attention bench reads, by engine.kv_dtype's words: f16; fp8-all (K and V
 * FP8-E4M3); fp8 (K FP8-E4M3, V f16). */
enum sm70__bench_kv { SM70__BENCH_KV_F16, SM70__BENCH_KV_FP8_ALL, SM70__BENCH_KV_FP8 };

/* Decode attention of `batch` sequences at context `ctx` (each token at position ctx-1),
 * n_heads query heads over n_kv KV heads of head_dim D, KV as kv (enum sm70__bench_kv) in a
 * paged cache of 16-token blocks whose order is shuffled. Returns 0 or -errno. */
int sm70__bench_attention(int n_heads, int n_kv, int D, int kv, int batch, int ctx,
			  int iters, struct sm70__bench_attn *out);

/* The walks of sm70__bench_kv_read: how a read-only kernel goes through the attention
 * op's cache. HEADS: a block per (token, KV head, position range), as the op's kernels
 * read, eight blocks an SM; OP_GRID: the same with the op's grid (two blocks an SM, filled
 * once); ROWS: a block per (token, position range) reading every head of each position
 * (whole rows); PAGE_HEADS: HEADS over the same bytes taken as pages of [head][position]
 * (each head's rows of a 16-position page contiguous). */
enum sm70__bench_kv_walk {
	SM70__BENCH_KV_WALK_HEADS,
	SM70__BENCH_KV_WALK_OP_GRID,
	SM70__BENCH_KV_WALK_ROWS,
	SM70__BENCH_KV_WALK_PAGE_HEADS,
	SM70__BENCH_KV_WALKS
};

/* The cache of sm70__bench_attention(n_heads, n_kv, D, kv, batch, ctx) read by a plain
 * kernel along walk, no attention math: what the layout and the grid allow the op. Bytes
 * as the op's (q and out included). Returns 0 or -errno. */
int sm70__bench_kv_read(int n_heads, int n_kv, int D, int kv, int batch, int ctx, int walk,
			int iters, struct sm70__bench_attn *out);

struct sm70__bench_prefill {
	double us;        /* the attention op, the chunk on the prefill path */
	double us_decode; /* the same tokens in a batch without chunks: the decode kernels */
	double flops;     /* 4 * n_heads * D * (sum over the tokens of their context length) */
};

/* Prefill attention of one chunk of `chunk` tokens at positions ctx - chunk .. ctx - 1 of
 * one sequence (ctx >= chunk), shapes and cache as sm70__bench_attention. Returns 0 or
 * -errno. */
int sm70__bench_prefill(int n_heads, int n_kv, int D, int kv, int chunk, int ctx,
			int iters, struct sm70__bench_prefill *out);

struct sm70__bench_gdn_decode {
	double us;        /* the gdn op on `batch` decode tokens, replayed from a CUDA graph */
	double us_eager;  /* the same launches queued one by one from the host */
	double bytes;     /* recurrent state bytes read + written (f32, every slot once) */
};

/* One GDN layer's decode update (the gdn op) for `batch` sequences in separate state slots,
 * n_k_heads / n_v_heads heads of k_dim / v_dim, every token mid-sequence (the state is
 * read and written). State copies rotate so that no launch finds its state in L2. cols:
 * 0 for the op's own choice of value columns per block, 16, 32 or 64 to force one; hints:
 * -1 for the op's default, 0 plain state accesses, 1 streaming cache hints (see
 * sm70__cuda_gdn_tune). Returns 0 or -errno. */
int sm70__bench_gdn_decode(int n_k_heads, int n_v_heads, int k_dim, int v_dim, int batch,
			   int cols, int hints, int iters, struct sm70__bench_gdn_decode *out);

struct sm70__bench_gdn_prefill {
	double us_chunked;   /* one gdn call over one chunk of `tokens` tokens, chunked form */
	double us_recurrent; /* the same call with chunked = 0: the recurrence in one launch */
	double us_tokens;    /* `tokens` one-token decode calls in order, replayed from a graph */
	double rel_out;      /* chunked vs recurrent: max |diff| / max |ref| over out (f16) */
	double rel_state;    /* the same over the final f32 state */
};

/* A `tokens`-token prompt through the gdn op of one layer, from a state left by earlier
 * tokens (positions 1000..), shapes as sm70__bench_gdn_decode. Returns 0 or -errno. */
int sm70__bench_gdn_prefill(int n_k_heads, int n_v_heads, int k_dim, int v_dim, int tokens,
			    int iters, struct sm70__bench_gdn_prefill *out);

struct sm70__bench_moe {
	double us;        /* moe_experts on the grouped path, calls replayed from a CUDA graph */
	double us_eager;  /* the same calls queued one by one */
	double us_var[4]; /* the grouped path's tile variants 1 to 4 (graph) */
	double us_pass[3]; /* the grouped path's gate_up, down and combine launches alone */
	double us_ks[2][9]; /* gate_up [0] and down [1] alone with 1..8 warps a tile ([ks]),
			     * and [0] with the fitting rule (SM70_MOE_KS's choices) */
	double us_ref;    /* the reference path (SM70_MOE=reference), graph */
	double us_route;  /* moe_route alone on the same logits, graph */
	double experts;   /* distinct experts a call reads, the mean over the routings */
	double bytes;     /* those experts' gate_up + down bytes (f16), the same mean */
	double max_rel;   /* grouped vs reference on one routing: max |diff| / max |ref| */
};

/* One MoE layer's routed experts (moe_experts) for `batch` tokens of `hidden`, experts of
 * `inter`, top_k of n_experts, over 16 routings from random router logits (a call each, in
 * turn), with every path timed in the same run. Returns 0 or -errno. */
int sm70__bench_moe(int hidden, int inter, int n_experts, int top_k, int batch, int iters,
		    struct sm70__bench_moe *out);

struct sm70__bench_moe_nvfp4 {
	double us;         /* moe_experts on NVFP4 stacks, grouped path, graph */
	double us_eager;   /* the same calls queued one by one */
	double us_var[2];  /* the NVFP4 grouped path's tile variants 1 and 2 (graph) */
	double us_pass[2]; /* its gate_up and down launches alone (graph) */
	double us_ks[2][9]; /* those launches by warps a tile, as sm70__bench_moe's us_ks */
	double us_ref;     /* the reference path (SM70_MOE=reference), graph */
	double us_f16;     /* the f16 stacks' grouped path on the same routings, graph */
	double experts;    /* distinct experts a call reads, the mean over the routings */
	double bytes;      /* their NVFP4 bytes: codes + block scales + row scales */
	double bytes_f16;  /* their f16 gate_up + down bytes */
	double max_rel;    /* NVFP4 grouped vs reference on one routing */
};

/* moe_experts as sm70__bench_moe, on NVFP4 stacks (prepare_experts from random ModelOpt
 * bytes, once for all batches) beside f16 stacks of the same shape, for each batch of
 * batches[0..n_batches) (out[i] for batches[i]). Returns 0 or -errno. */
int sm70__bench_moe_nvfp4(int hidden, int inter, int n_experts, int top_k, const int *batches,
			  int n_batches, int iters, struct sm70__bench_moe_nvfp4 *out);

#endif
