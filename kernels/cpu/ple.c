/*
 * ple.c - the CPU per-layer n-gram embedding ops of qwen4_exp (kernels/backend.h):
 * ngram_hist (each token's previous tokens, carried across steps in a per-slot context),
 * ple_embed (the table rows of a token's hashed n-grams), ple_gate (the key/query gate on
 * the embedding's value) and ple_conv (a dilated causal depthwise convolution with
 * per-slot state, added into the streams with the gated value).
 *
 * The batch walk is the linear-attention ops' (cpu_ops.h): units in batch order, a slot's
 * units run by one task, so a sequence's context or state moves on unit by unit and any
 * order of tokens the fallback allows is right. Within a unit, earlier tokens come from
 * the batch; older ones from the slot.
 *
 * Numerics: ple_embed is a copy (rows converted to f32 exactly); ple_gate's dot product
 * is summed in double and rounded once to f32, the rest f32 as backend.h writes it;
 * ple_conv sums its taps in f32, oldest first, as conv1d_silu.c does, and the slot holds
 * exact copies of inputs. Hashes are uint64 arithmetic, wrapping.
 *
 * Non-goals: computing the hash parameters (daemon/engine), tables in other dtypes than
 * f32, f16 and bf16, a bias in the convolution.
 */
#include <limits.h>
#include <math.h>

#include "kernels/cpu/cpu_ops.h"

/* struct sm70_dconv and ngram_hist's ctx carry no slot count: only a negative slot (or a
 * sequence outside the batch) is out of range. */
#define NO_SLOT_BOUND INT_MAX

/* Channels per ple_conv task (a multiple of 16, as in conv1d_silu.c). */
#define PCONV_BLOCK 256

/* ---- ngram_hist ------------------------------------------------------------------------ */

/* hist of the tokens of one unit (p0 the position of its first token), then ctx (NULL:
 * no slot) moves on to the unit's newest n_hist tokens. */
static void hist_unit(int32_t *hist, int32_t *ctx, int n_hist, const struct sm70_batch *b,
		      int first, int len)
{
	const int p0 = b->tok_pos[first], last = first + len - 1;

	for (int t = first; t <= last; t++) {
		int32_t *h = hist + (size_t)t * n_hist;

		for (int i = 0; i < n_hist; i++) {
			const int q = b->tok_pos[t] - 1 - i; /* the position h[i] names */

			if (q < 0)
				h[i] = -1;
			else if (q >= p0)
				h[i] = b->tok_ids[first + q - p0];
			else
				h[i] = ctx ? ctx[p0 - 1 - q] : -1;
		}
	}
	if (!ctx)
		return;
	/* the newest n_hist tokens are the last token and its own history */
	for (int i = n_hist - 1; i > 0; i--)
		ctx[i] = hist[(size_t)last * n_hist + i - 1];
	ctx[0] = b->tok_ids[last];
}

/* See backend.h. Serial: a few integer copies per token cost less than waking the pool.
 * A token whose sequence has no valid slot (or b->seq_state is NULL) sees -1 where ctx
 * would be read, and no ctx is written for it. */
void sm70__cpu_ngram_hist(struct sm70_backend *be, int32_t *hist, int32_t *ctx, int n_hist,
			  const struct sm70_batch *b)
{
	struct sm70__cpu_units units;

	if (b->n_tokens <= 0 || n_hist <= 0)
		return;
	sm70__cpu_units_init(&units, b);
	for (int u = 0; u < units.n; u++) {
		int first, len, slot;

		sm70__cpu_unit(&units, u, &first, &len);
		slot = b->seq_state ? sm70__cpu_token_slot(b, NO_SLOT_BOUND, first) : -1;
		hist_unit(hist, slot < 0 ? NULL : ctx + (size_t)slot * n_hist, n_hist, b, first,
			  len);
	}
}

/* ---- ple_embed ------------------------------------------------------------------------- */

struct embed_job {
	float *out;
	const struct sm70_ple_hash *ph;
	const int32_t *hist;
	const int32_t *tok_ids;
	size_t esz; /* bytes per table element */
};

/* Row r of the table into out as f32; a row outside the table gives zeros. */
static void embed_row(const struct embed_job *j, float *out, uint64_t r)
{
	const struct sm70_ple_hash *ph = j->ph;
	const size_t dim = (size_t)ph->row_dim;

	if (r >= (uint64_t)ph->rows) {
		memset(out, 0, dim * sizeof(float));
		return;
	}
	sm70__cpu_row_to_f32(out, (const char *)ph->table + (size_t)r * dim * j->esz,
			     ph->table_dtype, dim);
}

static void embed_tokens(void *ctx, int begin, int end, int thread)
{
	const struct embed_job *j = ctx;
	const struct sm70_ple_hash *ph = j->ph;
	const int N = ph->ngram, hpn = ph->heads_per_ngram;

	for (int t = begin; t < end; t++) {
		const int32_t *h = j->hist + (size_t)t * (N - 1);
		float *out = j->out + (size_t)t * (N - 1) * hpn * ph->row_dim;
		uint64_t m = (uint64_t)j->tok_ids[t] * ph->mult[0];
		int open = 1; /* no -1 or eos seen yet, walking back */

		for (int n = 2; n <= N; n++) {
			const int32_t prev = h[n - 2];

			if (prev == -1 || prev == ph->eos)
				open = 0;
			m ^= (uint64_t)(open ? prev : ph->eos) * ph->mult[n - 1];
			for (int k = 0; k < hpn; k++) {
				const int g = (n - 2) * hpn + k;
				const uint64_t r = ph->size[g] ? m % ph->size[g] + ph->offset[g] :
								 UINT64_MAX;

				embed_row(j, out + (size_t)g * ph->row_dim, r);
			}
		}
	}
}

/* See backend.h. table_dtype must be f32, f16 or bf16 (otherwise out is not written); a
 * head with size 0 or a row past the table gives zeros. */
void sm70__cpu_ple_embed(struct sm70_backend *be, void *out, const struct sm70_ple_hash *ph,
			 const int32_t *hist, const struct sm70_batch *b)
{
	struct embed_job j = { out, ph, hist, b->tok_ids, sm70_dtype_size(ph->table_dtype) };
	const size_t per_token = (size_t)(ph->ngram - 1) * ph->heads_per_ngram * ph->row_dim;

	if (b->n_tokens <= 0 || ph->ngram < 2 || ph->heads_per_ngram <= 0 || ph->row_dim <= 0)
		return;
	if (ph->table_dtype != SM70_DTYPE_F32 && ph->table_dtype != SM70_DTYPE_F16 &&
	    ph->table_dtype != SM70_DTYPE_BF16)
		return;
	sm70__pool_run(sm70__cpu_of(be)->pool, b->n_tokens, sm70__cpu_grain(per_token),
		       embed_tokens, &j);
}

/* ---- ple_gate -------------------------------------------------------------------------- */

struct gate_job {
	float *gv;
	const float *kn;
	const float *qn;
	const float *v;
	int v_ld;
	int streams;
	int dim;
};

/* sign(g) * sqrt(max(|g|, 1e-6)): 0 stays 0 and NaN stays NaN, as torch.sign has it. */
static float gate_shape(float g)
{
	const float r = sqrtf(fmaxf(fabsf(g), 1e-6f));

	return g > 0.0f ? r : g < 0.0f ? -r : g;
}

/* One item is one (row, stream). */
static void gate_items(void *ctx, int begin, int end, int thread)
{
	const struct gate_job *j = ctx;
	const size_t dim = (size_t)j->dim;
	const float scale = sqrtf((float)j->dim);

	for (int item = begin; item < end; item++) {
		const float *restrict kn = j->kn + (size_t)item * dim;
		const float *restrict qn = j->qn + (size_t)item * dim;
		const float *restrict v = j->v + (size_t)(item / j->streams) * j->v_ld;
		float *restrict gv = j->gv + (size_t)item * dim;
		double dot = 0.0;
		float s;

		for (size_t k = 0; k < dim; k++)
			dot += (double)kn[k] * qn[k];
		s = gate_shape((float)dot / scale);
		s = 1.0f / (1.0f + expf(-s));
		for (size_t k = 0; k < dim; k++)
			gv[k] = s * v[k];
	}
}

/* See backend.h. gv must not overlap the inputs. */
void sm70__cpu_ple_gate(struct sm70_backend *be, void *gv, const void *kn, const void *qn,
			const void *v, int v_ld, int n, int streams, int dim)
{
	struct gate_job j = { gv, kn, qn, v, v_ld, streams, dim };

	if (n <= 0 || streams <= 0 || dim <= 0)
		return;
	sm70__pool_run(sm70__cpu_of(be)->pool, n * streams, sm70__cpu_grain((size_t)dim * 3),
		       gate_items, &j);
}

/* ---- ple_conv -------------------------------------------------------------------------- */

struct pconv_job {
	float *x;
	const float *gv;
	const float *gvn;
	const struct sm70_dconv *dc;
	const struct sm70_batch *b;
	struct sm70__cpu_units units;
	int R;        /* (k - 1) * dilation: inputs a slot keeps */
	int n_blocks; /* channel blocks per sequence */
};

/*
 * Channels [c0, c0 + n) of the input m positions before token t, r earlier tokens of its
 * unit being in the batch (st: the slot, still as the unit found it): a row of gvn, a row
 * of the slot, or NULL for the zeros before position 0.
 */
static const float *pconv_input(const struct pconv_job *j, const float *st, int t, int r,
				int m, int c0)
{
	const size_t C = (size_t)j->dc->channels;

	if (m <= r)
		return j->gvn + (size_t)(t - m) * C + c0;
	if (j->b->tok_pos[t] - m < 0)
		return NULL;
	return st + (size_t)(j->R - m + r) * C + c0;
}

/* One token (r earlier tokens of its unit in the batch) over channels [c0, c0 + n). */
static void pconv_token(const struct pconv_job *j, const float *st, int t, int r, int c0,
			int n)
{
	const struct sm70_dconv *dc = j->dc;
	const size_t C = (size_t)dc->channels;
	const int K = dc->k;
	const float *restrict w = dc->w + (size_t)c0 * K;
	const float *restrict gv = j->gv + (size_t)t * C + c0;
	float *restrict x = j->x + (size_t)t * C + c0;
	float acc[PCONV_BLOCK];

	for (int c = 0; c < n; c++)
		acc[c] = 0.0f;
	for (int tap = 0; tap < K; tap++) {
		const int m = (K - 1 - tap) * dc->dilation; /* the tap reads position p - m */
		const float *restrict in = pconv_input(j, st, t, r, m, c0);

		/* a zero input adds nothing (acc never is -0, so no sign can change) */
		if (!in)
			continue;
		for (int c = 0; c < n; c++)
			acc[c] += w[(size_t)c * K + tap] * in[c];
	}
	for (int c = 0; c < n; c++)
		x[c] += gv[c] + acc[c] / (1.0f + expf(-acc[c]));
}

/* After a unit of len tokens ending at token last: the slot keeps its newest R inputs.
 * Row q moves on by len rows (ascending q reads only rows not yet written). */
static void pconv_keep(const struct pconv_job *j, float *st, int last, int len, int c0, int n)
{
	const size_t C = (size_t)j->dc->channels, bytes = sizeof(float) * (size_t)n;

	for (int q = 0; q < j->R; q++) {
		const int m = j->R - 1 - q; /* row q is the input m positions before last */
		float *row = st + (size_t)q * C + c0;

		if (m < len)
			memcpy(row, j->gvn + (size_t)(last - m) * C + c0, bytes);
		else if (j->b->tok_pos[last] - m < 0)
			memset(row, 0, bytes);
		else
			memcpy(row, st + (size_t)(q + len) * C + c0, bytes);
	}
}

static void pconv_tasks(void *ctx, int begin, int end, int thread)
{
	const struct pconv_job *j = ctx;
	const int C = j->dc->channels;
	const size_t slot_size = (size_t)j->R * (size_t)C;

	for (int item = begin; item < end; item++) {
		const int s = item / j->n_blocks, c0 = item % j->n_blocks * PCONV_BLOCK;
		const int n = C - c0 < PCONV_BLOCK ? C - c0 : PCONV_BLOCK;
		const int slot = sm70__cpu_state_owner(j->b, NO_SLOT_BOUND, s);
		float *st;

		if (slot < 0)
			continue;
		st = (float *)j->dc->state + (size_t)slot * slot_size;
		for (int u = 0; u < j->units.n; u++) {
			int first, len;

			sm70__cpu_unit(&j->units, u, &first, &len);
			if (sm70__cpu_token_slot(j->b, NO_SLOT_BOUND, first) != slot)
				continue;
			for (int t = first; t < first + len; t++)
				pconv_token(j, st, t, t - first, c0, n);
			pconv_keep(j, st, first + len - 1, len, c0, n);
		}
	}
}

/* See backend.h. A token whose sequence has no valid slot is skipped (its row of x is
 * not changed). x must not overlap gv, gvn or the state. */
void sm70__cpu_ple_conv(struct sm70_backend *be, float *x, const void *gv, const void *gvn,
			const struct sm70_dconv *dc, const struct sm70_batch *b)
{
	struct pconv_job j = { .x = x, .gv = gv, .gvn = gvn, .dc = dc, .b = b };
	size_t per_item;

	if (b->n_tokens <= 0 || b->n_seqs <= 0 || !b->seq_state || dc->channels <= 0 ||
	    dc->k < 1 || dc->dilation < 1)
		return;
	sm70__cpu_units_init(&j.units, b);
	j.R = (dc->k - 1) * dc->dilation;
	j.n_blocks = (dc->channels + PCONV_BLOCK - 1) / PCONV_BLOCK;
	per_item = ((size_t)b->n_tokens / (size_t)b->n_seqs + 1) * PCONV_BLOCK *
		   (size_t)(dc->k + 2);
	sm70__pool_run(sm70__cpu_of(be)->pool, b->n_seqs * j.n_blocks, sm70__cpu_grain(per_item),
		       pconv_tasks, &j);
}
