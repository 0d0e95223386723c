/*
 * attention.c - the CPU attention op: causal attention of each new token over its
 * sequence's paged KV cache, one (token, head) pair per task.
 *
 * A task computes the scores q.k * scale for positions 0..tok_pos into its thread's
 * scratch slice, the max-subtracted softmax (exp in f32, the normaliser summed in
 * double), then the probability-weighted sum of V rows into the output row. That is
 * eager PyTorch's order: matmul, scale, softmax, matmul. K/V stored as f16 or FP8 are
 * converted element by element on the way in (FP8 as e4m3 * scale); K and V may differ
 * in dtype (the layout's dtype and sm70_kv_v_dtype).
 *
 * If scratch could not be had (or a token's position is past b->max_pos), the task
 * recomputes the scores in two passes instead: max first, then exp, sum and the V sum
 * together. Same math, one more pass over K.
 *
 * The per-(token, head) work is attend_head, over positions 0..tok_pos here and over a
 * token's list of positions for sparse_attention (sparse_attention.c, through
 * sm70__cpu_attend_tokens), so that the two give the same bits when the list is every
 * position.
 *
 * Non-goals: sliding windows, ALiBi, soft-capping, sinks; speed beyond what the
 * compiler gives plain loops (this is the reference).
 */
#include <math.h>

#include "kernels/cpu/cpu_ops.h"

/* K/V rows of f16/FP8 are converted on the stack this many elements (a multiple of 8)
 * at a time. */
#define KV_PIECE 64

struct attn_job {
	float *out;
	const float *q;
	int q_ld;
	const struct sm70_kv_layer *kv;
	const struct sm70_kv_layout *lay;
	const struct sm70_batch *b;
	const int32_t *sel; /* NULL: token t attends to 0..tok_pos; else to sel[t * sel_ld] */
	const int32_t *n_sel;
	int sel_ld;
	int n_heads;
	float scale;
	float *scratch; /* NULL: two-pass path */
	size_t stride;  /* floats per thread slice, at least the rows asked for with scratch */
};

/* n cache elements from element index off, as f32 (FP8 times its scale). */
static void kv_load(float *restrict dst, const void *cache, size_t off, enum sm70_dtype t,
		    float scale, int n)
{
	if (t == SM70_DTYPE_F8E4M3) {
		const uint8_t *restrict s = (const uint8_t *)cache + off;

		for (int i = 0; i < n; i++)
			dst[i] = sm70__e4m3_lut[s[i]] * scale;
	} else {
		sm70__cpu_row_to_f32(dst, (const char *)cache + off * sm70_dtype_size(t), t,
				     (size_t)n);
	}
}

/* q . row, for the cache row at element index off. */
static float kv_dot(const float *q, const void *cache, size_t off, enum sm70_dtype t,
		    float scale, int n)
{
	float buf[KV_PIECE], acc[8] = { 0 };

	if (t == SM70_DTYPE_F32)
		return sm70__cpu_dot(q, (const float *)cache + off, n);
	for (int k = 0;; k += KV_PIECE) {
		int m = n - k < KV_PIECE ? n - k : KV_PIECE;
		int m8 = m & ~7;

		kv_load(buf, cache, off + (size_t)k, t, scale, m);
		sm70__cpu_dot8(acc, q + k, buf, m8);
		if (k + m == n)
			return sm70__cpu_dot_end(acc, q + k + m8, buf + m8, m - m8);
	}
}

/* out += p * row, for the cache row at element index off. */
static void kv_axpy(float *restrict out, float p, const void *cache, size_t off,
		    enum sm70_dtype t, float scale, int n)
{
	float buf[KV_PIECE];

	if (t == SM70_DTYPE_F32) {
		const float *restrict v = (const float *)cache + off;

		for (int d = 0; d < n; d++)
			out[d] += p * v[d];
		return;
	}
	for (int k = 0; k < n; k += KV_PIECE) {
		int m = n - k < KV_PIECE ? n - k : KV_PIECE;

		kv_load(buf, cache, off + (size_t)k, t, scale, m);
		for (int d = 0; d < m; d++)
			out[k + d] += p * buf[d];
	}
}

/* The cache slot of position p through a sequence's block table. */
static size_t attn_slot(const int32_t *bt, int bs, int p)
{
	return (size_t)bt[p / bs] * bs + p % bs;
}

/*
 * Attention of one query head q (head_dim floats) over n positions of a sequence whose
 * block table is bt: positions pos[0..n) (NULL: 0..n-1), KV head kv_head; writes head_dim
 * floats to out (zeros when n <= 0). scores is scratch of at least n floats, or NULL for
 * the two-pass form.
 */
static void attend_head(float *out, const float *q, const struct sm70_kv_layer *kv,
			const struct sm70_kv_layout *lay, const int32_t *bt, int kv_head,
			const int32_t *pos, int n, float scale, float *scores)
{
	const int hd = lay->head_dim, bs = lay->block_size;
	const enum sm70_dtype t = lay->dtype, vt = sm70_kv_v_dtype(lay);
	const float ks = kv->k_scale, vs = kv->v_scale;
	const size_t head_off = (size_t)kv_head * hd;
	const size_t row = (size_t)lay->n_kv_heads * hd;
	float mx = -INFINITY, norm;
	double sum = 0.0;

	for (int d = 0; d < hd; d++)
		out[d] = 0.0f;
	if (n <= 0)
		return;
	if (scores) {
		for (int i = 0; i < n; i++) {
			size_t slot = attn_slot(bt, bs, pos ? pos[i] : i);
			float s = kv_dot(q, kv->k, slot * row + head_off, t, ks, hd) * scale;

			scores[i] = s;
			mx = s > mx ? s : mx;
		}
		for (int i = 0; i < n; i++) {
			scores[i] = expf(scores[i] - mx);
			sum += scores[i];
		}
		norm = (float)sum;
		for (int i = 0; i < n; i++) {
			size_t slot = attn_slot(bt, bs, pos ? pos[i] : i);
			float pr = scores[i] / norm;

			kv_axpy(out, pr, kv->v, slot * row + head_off, vt, vs, hd);
		}
		return;
	}
	/* Two passes, no scratch: the max, then exp, normaliser and V sum together. */
	for (int i = 0; i < n; i++) {
		size_t slot = attn_slot(bt, bs, pos ? pos[i] : i);
		float s = kv_dot(q, kv->k, slot * row + head_off, t, ks, hd) * scale;

		mx = s > mx ? s : mx;
	}
	for (int i = 0; i < n; i++) {
		size_t slot = attn_slot(bt, bs, pos ? pos[i] : i);
		float s = kv_dot(q, kv->k, slot * row + head_off, t, ks, hd) * scale;
		float e = expf(s - mx);

		sum += e;
		kv_axpy(out, e, kv->v, slot * row + head_off, vt, vs, hd);
	}
	norm = (float)sum;
	for (int d = 0; d < hd; d++)
		out[d] /= norm;
}

static void attn_tasks(void *ctx, int begin, int end, int thread)
{
	const struct attn_job *j = ctx;
	const struct sm70_batch *b = j->b;
	const int hd = j->lay->head_dim;
	const int group = j->n_heads / j->lay->n_kv_heads;
	float *scores = j->scratch ? j->scratch + (size_t)thread * j->stride : NULL;

	for (int task = begin; task < end; task++) {
		const int tok = task / j->n_heads, h = task % j->n_heads;
		const int n = j->sel ? j->n_sel[tok] : b->tok_pos[tok] + 1;
		const int32_t *pos = j->sel ? j->sel + (size_t)tok * j->sel_ld : NULL;
		const int32_t *bt = b->block_tables + (size_t)b->tok_seq[tok] * b->max_blocks;

		attend_head(j->out + ((size_t)tok * j->n_heads + h) * hd,
			    j->q + (size_t)tok * j->q_ld + (size_t)h * hd, j->kv, j->lay, bt,
			    h / group, pos, n, j->scale, (size_t)n <= j->stride ? scores : NULL);
	}
}

/* See cpu_ops.h. */
void sm70__cpu_attend_tokens(struct sm70_backend *be, void *out, const void *q, int q_ld,
			     const struct sm70_kv_layer *kv, const struct sm70_kv_layout *lay,
			     const struct sm70_batch *b, const int32_t *sel,
			     const int32_t *n_sel, int sel_ld, int n_heads, float scale,
			     size_t most)
{
	struct sm70__cpu *c = sm70__cpu_of(be);
	struct attn_job j = { out, q, q_ld, kv, lay, b, sel, n_sel, sel_ld, n_heads, scale,
			      NULL, 0 };
	long tasks = (long)b->n_tokens * n_heads;

	if (tasks <= 0 || lay->n_kv_heads <= 0 || n_heads % lay->n_kv_heads)
		return;
	j.scratch = sm70__cpu_scratch(c, most);
	j.stride = c->scratch_stride;
	sm70__pool_run(c->pool, (int)tasks,
		       sm70__cpu_grain(most * (size_t)lay->head_dim * 4), attn_tasks, &j);
}

/* See backend.h. out must not overlap q or the cache; n_heads must be a multiple of
 * n_kv_heads; block_tables must hold valid blocks for every position attended to (the
 * engine's allocator builds them; they never come from a client). */
void sm70__cpu_attention(struct sm70_backend *be, void *out, const void *q, int q_ld,
			 const struct sm70_kv_layer *kv, const struct sm70_kv_layout *lay,
			 const struct sm70_batch *b, int n_heads, float scale)
{
	size_t max_pos = b->max_pos > 0 ? (size_t)b->max_pos : 1;

	sm70__cpu_attend_tokens(be, out, q, q_ld, kv, lay, b, NULL, NULL, 0, n_heads, scale,
				max_pos);
}
