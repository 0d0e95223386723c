/*
 * null_backend.c - the null backend: a test double that computes nothing, so that the
 * daemon's transport (scheduler, event rings, wakeups, the SDK) can be measured alone
 * (`sm70-bench ipc`) and driven at rates no real model reaches.
 *
 * Memory is calloc'd host memory (so `--load-format dummy` loads a model's shapes, and
 * the KV cache costs only the pages something touches: nothing does), upload/download
 * are memcpy, every compute op returns at once, and `sample` emits a token at once:
 *
 *   token     = floor(sm70_sample_uniform(seed, n) * vocab)   (deterministic per row)
 *   logprob   = -1.0
 *   n_top     = min(top_logprobs, 20, vocab); top_ids[i] = (token + i) % vocab (distinct)
 *   top_logprobs[0] = -1.0, and for n_top >= 4 slots 1..3 carry the emit timestamp:
 *   top_logprobs[k] = -(1 + ((t >> (22 * (k - 1))) & 0x3fffff)), k = 1, 2, 3,
 *   t = CLOCK_MONOTONIC nanoseconds taken once per sample call (one engine step);
 *   other slots are -1.0 - k.
 * Each chunk is an integer below 2^22 + 1, so the f32 holds it exactly; the daemon copies
 * top alternatives verbatim, so a client on the same host recovers t and subtracts it
 * from its own CLOCK_MONOTONIC reading at receipt (docs/PERFORMANCE.md, "ipc").
 *
 * Non-goals: any numerics (logits are never written), real use of any kind.
 */
#include "kernels/backend.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void *null_buf_alloc(struct sm70_backend *be, size_t bytes)
{
	/* calloc of a large block maps fresh zero pages lazily: a 256 MiB KV cache that the
	 * null ops never touch costs nothing. */
	return calloc(1, bytes ? bytes : 1);
}

static void null_buf_free(struct sm70_backend *be, void *p)
{
	free(p);
}

static int null_copy(struct sm70_backend *be, void *dst, const void *src, size_t bytes)
{
	if (bytes)
		memcpy(dst, src, bytes);
	return 0;
}

static int null_sync(struct sm70_backend *be)
{
	return 0;
}

static void null_destroy(struct sm70_backend *be)
{
	free(be);
}

static void null_embed(struct sm70_backend *be, float *x, const struct sm70_weight *table,
		       const int32_t *ids, int n)
{
}

static void null_add_rmsnorm(struct sm70_backend *be, void *y, float *resid, const void *delta,
			     const float *w, int n, int dim, float eps)
{
}

static void null_add(struct sm70_backend *be, float *resid, const void *x, size_t count)
{
}

static void null_matmul(struct sm70_backend *be, void *y, int y_f32, const void *x,
			const struct sm70_weight *w, int n)
{
}

static void null_head_norm_rope(struct sm70_backend *be, void *qk, int ld, int n, int n_heads,
				int head_dim, const float *norm_w, float eps, const int32_t *pos,
				int rot_dim, double theta)
{
}

static void null_kv_write(struct sm70_backend *be, const struct sm70_kv_layer *kv,
			  const struct sm70_kv_layout *lay, const void *k, const void *v, int ld,
			  const int32_t *slots, int n)
{
}

static void null_attention(struct sm70_backend *be, void *out, const void *q, int q_ld,
			   const struct sm70_kv_layer *kv, const struct sm70_kv_layout *lay,
			   const struct sm70_batch *b, int n_heads, float scale)
{
}

static void null_silu_mul(struct sm70_backend *be, void *out, const void *gate_up, int n,
			  int inter)
{
}

static void null_gather_rows(struct sm70_backend *be, void *dst, const void *src,
			     const int32_t *rows, int n, int dim, int is_f32)
{
}

/* The emit stamp is one 22-bit chunk per slot, stored as -(1 + chunk): a finite logprob
 * below the token's own -1.0 that an f32 represents exactly. */
static float stamp_chunk(uint64_t t, int k)
{
	return -(float)(1u + (uint32_t)((t >> (22 * (k - 1))) & 0x3fffffu));
}

/* See the file comment for what each output field holds. logits are ignored. */
static void null_sample(struct sm70_backend *be, struct sm70_sample_result *out,
			const float *logits, const struct sm70_sample_row *rows, int n, int vocab)
{
	struct timespec ts;
	uint64_t t;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	t = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
	for (int r = 0; r < n; r++) {
		struct sm70_sample_result *o = &out[r];
		double u = sm70_sample_uniform(rows[r].seed, rows[r].n);
		int32_t tok = vocab > 0 ? (int32_t)(u * (double)vocab) : -1;
		int n_top = rows[r].top_logprobs;

		if (tok >= vocab)
			tok = vocab - 1; /* u < 1, but keep rounding from ever reaching vocab */
		if (n_top < 0)
			n_top = 0;
		if (n_top > SM70_MAX_TOP_LOGPROBS)
			n_top = SM70_MAX_TOP_LOGPROBS;
		if (n_top > vocab)
			n_top = vocab > 0 ? vocab : 0; /* ids must stay distinct */
		o->token = tok;
		o->logprob = -1.0f;
		o->n_top = n_top;
		for (int k = 0; k < n_top; k++) {
			o->top_ids[k] = (int32_t)(((int64_t)tok + k) % vocab);
			o->top_logprobs[k] = (n_top >= 4 && k >= 1 && k <= 3) ?
					     stamp_chunk(t, k) : -1.0f - (float)k;
		}
	}
}

static const struct sm70_backend_ops null_ops = {
	.buf_alloc = null_buf_alloc,
	.buf_free = null_buf_free,
	.upload = null_copy,
	.download = null_copy,
	.sync = null_sync,
	.destroy = null_destroy,
	.embed = null_embed,
	.add_rmsnorm = null_add_rmsnorm,
	.add = null_add,
	.matmul = null_matmul,
	.head_norm_rope = null_head_norm_rope,
	.kv_write = null_kv_write,
	.attention = null_attention,
	.silu_mul = null_silu_mul,
	.gather_rows = null_gather_rows,
	.sample = null_sample,
};

int sm70_backend_null_create(struct sm70_backend **out, struct sm70_err *err)
{
	struct sm70_backend *be;

	*out = NULL;
	be = calloc(1, sizeof(*be));
	if (!be)
		return sm70_errf(err, -ENOMEM, "null backend: out of memory");
	be->ops = &null_ops;
	be->name = "null";
	be->act_dtype = SM70_DTYPE_F32;
	be->weight_dtype = SM70_DTYPE_COUNT; /* nothing reads them: keep what is stored */
	be->kv_dtypes = 1u << SM70_DTYPE_F32;
	be->kv_dtype_default = SM70_DTYPE_F32;
	be->priv = NULL;
	*out = be;
	return 0;
}
