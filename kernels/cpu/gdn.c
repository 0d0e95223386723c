/*
 * gdn.c - the CPU gdn op: the gated delta rule of Gated DeltaNet layers, as the
 * token-by-token recurrence (decodes; every token when `chunked` is 0) and as the
 * chunked form for prefill chunks. Also the batch walk the linear-attention ops share
 * (sm70__cpu_units_init, see cpu_ops.h).
 *
 * One task is one (sequence, value head): it owns that head's state S [k_dim][v_dim]
 * in the sequence's slot and runs the slot's tokens in batch order, so every result is
 * independent of the thread count, bitwise, in both forms.
 *
 * The chunked form, per piece of n <= GDN_PIECE tokens (pieces start at a chunk's first
 * token; S is zeroed first when that token is at position 0), with k', q' the
 * normalised rows below and G_i = g_0 + ... + g_i the piece's cumulative log-decay:
 *   A_ij = beta_i (k'_i . k'_j) e^(G_i - G_j), j < i   strictly lower triangular
 *   (I + A) U = [beta_i v_i] and (I + A) W = [beta_i e^G_i k'_i]   forward substitution
 *   V_i  = U_i - W_i S                                 new values, after the state read
 *   o_i  = e^G_i (q'_i S) + sum_{j <= i} (q'_i . k'_j) e^(G_i - G_j) V_j
 *   S    = e^G_last S + sum_i e^(G_last - G_i) k'_i V_i^T
 * which is the recurrence unrolled over the piece (the UT transform of the WY form).
 * Without scratch for it (tests: scratch_off) chunks take the recurrence.
 *
 * Numerics: all f32; double only for the sums of squares of the L2 norms.
 *  - Per token and value head, shared bitwise by both forms: r = 1 / sqrtf(sum x^2 +
 *    1e-6) with the sum in double rounded to f32; k' = k * rk; q' = (q * rq) * s, with
 *    s = (float)k_dim^-0.5 (transformers' recurrent path divides by sqrt(k_dim), its
 *    chunked path multiplies: an ulp either way); beta = 1 / (1 + expf(-b)); g =
 *    -expf(a_log) * softplus(a + dt_bias), softplus = log1pf(expf(x)), x above 20.
 *  - Recurrence: S = expf(g) S; m = S^T k'; S += k' (beta (v - m))^T; o = S^T q'; each
 *    sum over k_dim in order, one f32 accumulator per value column. A prompt split
 *    over calls or chunks gives the same bits as one call.
 *  - Chunked: the same quantities in another order. Dot products over k_dim use
 *    sm70__cpu_dot's 8-lane tree; the triangular solve and the state read accumulate
 *    in row order (|A_ij| <= 1). The decays are expf of a sum of g in f32, not a
 *    product of expf(g): e^G_i from the running sum, and e^(G_i - G_j), e^(G_last -
 *    G_i) as sums over just the tokens between, nearest first. FLA and transformers
 *    subtract cumulative sums instead, which loses ~|G_i| ulps of the exponent: with
 *    g near -50 (it happens) a decay between neighbours is then 1e-4 off; here it is
 *    as good as the recurrence's. The forms agree within ~1e-6 of max |o| and |S|
 *    (tests/unit/test_gdn_ops.c prints the figures), each as close to float64.
 *
 * Under the backend's batch_invariant every token takes the recurrence: the chunked form
 * depends on where a prompt's chunks start, which the scheduler decides by what else runs.
 *
 * Non-goals: speed beyond what plain loops give (this is the reference); other chunk
 * sizes; qwen3_next's interleaved projections (the model code lays out q | k | v).
 */
#include <math.h>

#include "kernels/cpu/cpu_ops.h"

/* Tokens per piece of the chunked form (the chunk size FLA and transformers use). */
#define GDN_PIECE 64
/* Value columns per pass of the recurrence (its stack arrays). */
#define GDN_VCOLS 64

void sm70__cpu_units_init(struct sm70__cpu_units *u, const struct sm70_batch *b)
{
	int covered = b->n_decode;

	*u = (struct sm70__cpu_units){ b->n_tokens, b->n_tokens, NULL, NULL };
	if (b->n_decode < 0 || b->n_decode > b->n_tokens || b->n_chunks < 0 ||
	    (b->n_chunks > 0 && (!b->chunk_first_host || !b->chunk_len_host)))
		return;
	for (int c = 0; c < b->n_chunks; c++) {
		int f = b->chunk_first_host[c], n = b->chunk_len_host[c];

		if (f != covered || n < 1 || n > b->n_tokens - covered)
			return;
		for (int t = f + 1; t < f + n; t++)
			if (b->tok_seq[t] != b->tok_seq[f] || b->tok_pos[t] != b->tok_pos[t - 1] + 1)
				return;
		covered += n;
	}
	if (covered != b->n_tokens)
		return;
	*u = (struct sm70__cpu_units){ b->n_decode + b->n_chunks, b->n_decode,
				       b->chunk_first_host, b->chunk_len_host };
}

struct gdn_job {
	float *out;
	const float *qkv;
	const float *ba;
	int ba_ld;
	const float *a_log;
	const float *dt_bias;
	float *ssm;
	const struct sm70_state_layout *lay;
	const struct sm70_batch *b;
	struct sm70__cpu_units units;
	int chunked;
	float q_scale;
	float *scratch; /* NULL: chunks take the recurrence */
	size_t stride;  /* floats per thread slice */
};

/* What one token gives one value head, before the state: its q, k, v rows and the
 * scalars. q' = (q[r] * rq) * q_scale and k' = k[r] * rk are formed where used, in
 * that order in both forms. */
struct gdn_tok {
	const float *q;
	const float *k;
	const float *v;
	float rq;
	float rk;
	float beta;
	float g;
};

static void gdn_tok(const struct gdn_job *j, int t, int h, struct gdn_tok *p)
{
	const struct sm70_state_layout *lay = j->lay;
	const int dk = lay->k_dim, kh = h / (lay->n_v_heads / lay->n_k_heads);
	const float *row = j->qkv + (size_t)t * (size_t)lay->conv_dim;
	const float *ba = j->ba + (size_t)t * (size_t)j->ba_ld;
	double sq = 0.0, sk = 0.0;
	float x;

	p->q = row + (size_t)kh * dk;
	p->k = row + (size_t)(lay->n_k_heads + kh) * dk;
	p->v = row + (size_t)2 * lay->n_k_heads * dk + (size_t)h * lay->v_dim;
	for (int r = 0; r < dk; r++) {
		sq += (double)p->q[r] * p->q[r];
		sk += (double)p->k[r] * p->k[r];
	}
	p->rq = 1.0f / sqrtf((float)sq + 1e-6f);
	p->rk = 1.0f / sqrtf((float)sk + 1e-6f);
	p->beta = 1.0f / (1.0f + expf(-ba[h]));
	x = ba[lay->n_v_heads + h] + j->dt_bias[h];
	p->g = -expf(j->a_log[h]) * (x > 20.0f ? x : log1pf(expf(x)));
}

/* Token t through value head h's state S by the recurrence. */
static void gdn_recurrent(const struct gdn_job *j, float *S, int h, int t)
{
	const int dk = j->lay->k_dim, dv = j->lay->v_dim;
	float *o = j->out + ((size_t)t * j->lay->n_v_heads + h) * (size_t)dv;
	struct gdn_tok p;
	float decay;

	gdn_tok(j, t, h, &p);
	decay = expf(p.g);
	if (j->b->tok_pos[t] == 0)
		memset(S, 0, sizeof(float) * (size_t)dk * (size_t)dv);
	/* value columns are independent: each pass does GDN_VCOLS of them start to end */
	for (int c0 = 0; c0 < dv; c0 += GDN_VCOLS) {
		const int n = dv - c0 < GDN_VCOLS ? dv - c0 : GDN_VCOLS;
		float d[GDN_VCOLS], acc[GDN_VCOLS];

		for (int c = 0; c < n; c++)
			d[c] = acc[c] = 0.0f;
		for (int r = 0; r < dk; r++) {
			float *restrict s = S + (size_t)r * dv + c0;
			const float kr = p.k[r] * p.rk;

			for (int c = 0; c < n; c++) {
				s[c] *= decay;
				d[c] += s[c] * kr;
			}
		}
		for (int c = 0; c < n; c++)
			d[c] = p.beta * (p.v[c0 + c] - d[c]);
		for (int r = 0; r < dk; r++) {
			float *restrict s = S + (size_t)r * dv + c0;
			const float kr = p.k[r] * p.rk, qr = (p.q[r] * p.rq) * j->q_scale;

			for (int c = 0; c < n; c++) {
				s[c] += kr * d[c];
				acc[c] += s[c] * qr;
			}
		}
		for (int c = 0; c < n; c++)
			o[c0 + c] = acc[c];
	}
}

/* Floats of one thread's scratch for the chunked form. */
static size_t gdn_piece_floats(const struct sm70_state_layout *lay)
{
	const size_t P = GDN_PIECE;

	return P * (3 * (size_t)lay->k_dim + (size_t)lay->v_dim) + 2 * P * P + 4 * P;
}

/* Tokens [t0, t0 + n) of one chunk, n <= GDN_PIECE, through head h's state S by the
 * chunked form (the file header has the formulas). scr: gdn_piece_floats floats. */
static void gdn_piece(const struct gdn_job *j, float *S, float *scr, int h, int t0, int n)
{
	const int dk = j->lay->k_dim, dv = j->lay->v_dim, P = GDN_PIECE;
	float *Q = scr;                       /* [P][dk] q' */
	float *K = Q + (size_t)P * dk;        /* [P][dk] k' */
	float *W = K + (size_t)P * dk;        /* [P][dk] beta e^G k', then solved */
	float *U = W + (size_t)P * dk;        /* [P][dv] beta v, solved, then V */
	float *A = U + (size_t)P * dv;        /* [P][P] the UT system, strictly lower */
	float *QK = A + (size_t)P * P;        /* [P][P] decayed q'.k', lower */
	float *g = QK + (size_t)P * P;        /* [P] log-decays */
	float *beta = g + P;                  /* [P] */
	float *eg = beta + P;                 /* [P] e^G_i */
	float *el = eg + P;                   /* [P] e^(G_last - G_i) */
	float gsum = 0.0f;

	for (int i = 0; i < n; i++) {
		struct gdn_tok p;

		gdn_tok(j, t0 + i, h, &p);
		gsum += p.g;
		g[i] = p.g;
		beta[i] = p.beta;
		eg[i] = expf(gsum);
		for (int r = 0; r < dk; r++) {
			Q[(size_t)i * dk + r] = (p.q[r] * p.rq) * j->q_scale;
			K[(size_t)i * dk + r] = p.k[r] * p.rk;
			W[(size_t)i * dk + r] = (p.beta * K[(size_t)i * dk + r]) * eg[i];
		}
		for (int c = 0; c < dv; c++)
			U[(size_t)i * dv + c] = p.beta * p.v[c];
	}
	if (j->b->tok_pos[t0] == 0)
		memset(S, 0, sizeof(float) * (size_t)dk * (size_t)dv);

	/* G_i - G_l summed over the tokens between, nearest first (see the header) */
	for (int i = 0; i < n; i++) {
		float gap = 0.0f;

		for (int l = i; l >= 0; l--) {
			const float dec = expf(gap);
			const float *ki = K + (size_t)i * dk, *kl = K + (size_t)l * dk;

			QK[(size_t)i * P + l] = sm70__cpu_dot(Q + (size_t)i * dk, kl, dk) * dec;
			if (l < i)
				A[(size_t)i * P + l] = (beta[i] * sm70__cpu_dot(ki, kl, dk)) * dec;
			gap += g[l];
		}
	}
	/* (I + A) X = B by forward substitution, row i from the solved rows before it */
	for (int i = 1; i < n; i++) {
		float *restrict ui = U + (size_t)i * dv, *restrict wi = W + (size_t)i * dk;

		for (int l = 0; l < i; l++) {
			const float a = A[(size_t)i * P + l];
			const float *restrict ul = U + (size_t)l * dv, *restrict wl = W + (size_t)l * dk;

			for (int c = 0; c < dv; c++)
				ui[c] -= a * ul[c];
			for (int r = 0; r < dk; r++)
				wi[r] -= a * wl[r];
		}
	}
	/* V = U - W S: what the old state already predicts is taken out */
	for (int i = 0; i < n; i++) {
		float *restrict vi = U + (size_t)i * dv;

		for (int r = 0; r < dk; r++) {
			const float w = W[(size_t)i * dk + r];
			const float *restrict s = S + (size_t)r * dv;

			for (int c = 0; c < dv; c++)
				vi[c] -= w * s[c];
		}
	}
	/* o_i: the old state's read, decayed to token i, plus the piece's own tokens */
	for (int i = 0; i < n; i++) {
		float *restrict o = j->out + ((size_t)(t0 + i) * j->lay->n_v_heads + h) * dv;

		for (int c = 0; c < dv; c++)
			o[c] = 0.0f;
		for (int r = 0; r < dk; r++) {
			const float q = Q[(size_t)i * dk + r];
			const float *restrict s = S + (size_t)r * dv;

			for (int c = 0; c < dv; c++)
				o[c] += q * s[c];
		}
		for (int c = 0; c < dv; c++)
			o[c] *= eg[i];
		for (int l = 0; l <= i; l++) {
			const float a = QK[(size_t)i * P + l];
			const float *restrict vl = U + (size_t)l * dv;

			for (int c = 0; c < dv; c++)
				o[c] += a * vl[c];
		}
	}
	/* the state after the piece */
	gsum = 0.0f;
	for (int i = n - 1; i >= 0; i--) {
		el[i] = expf(gsum);
		gsum += g[i];
	}
	for (int r = 0; r < dk; r++) {
		float *restrict s = S + (size_t)r * dv;

		for (int c = 0; c < dv; c++)
			s[c] *= eg[n - 1];
		for (int i = 0; i < n; i++) {
			const float kr = K[(size_t)i * dk + r] * el[i];
			const float *restrict vi = U + (size_t)i * dv;

			for (int c = 0; c < dv; c++)
				s[c] += kr * vi[c];
		}
	}
}

static void gdn_tasks(void *ctx, int begin, int end, int thread)
{
	const struct gdn_job *j = ctx;
	const struct sm70_state_layout *lay = j->lay;
	const size_t head_size = (size_t)lay->k_dim * (size_t)lay->v_dim;
	float *scr = j->scratch ? j->scratch + (size_t)thread * j->stride : NULL;

	for (int item = begin; item < end; item++) {
		const int s = item / lay->n_v_heads, h = item % lay->n_v_heads;
		const int slot = sm70__cpu_state_owner(j->b, lay->n_slots, s);
		float *S;

		if (slot < 0)
			continue;
		S = j->ssm + ((size_t)slot * lay->n_v_heads + h) * head_size;
		for (int u = 0; u < j->units.n; u++) {
			int first, len;

			sm70__cpu_unit(&j->units, u, &first, &len);
			if (sm70__cpu_token_slot(j->b, lay->n_slots, first) != slot)
				continue;
			if (j->chunked && scr && u >= j->units.n_decode) {
				for (int t = first; t < first + len; t += GDN_PIECE)
					gdn_piece(j, S, scr, h, t,
						  first + len - t < GDN_PIECE ? first + len - t
									      : GDN_PIECE);
			} else {
				for (int t = first; t < first + len; t++)
					gdn_recurrent(j, S, h, t);
			}
		}
	}
}

/* See backend.h. n_v_heads must be a multiple of n_k_heads and conv_dim equal to
 * 2 * n_k_heads * k_dim + n_v_heads * v_dim (otherwise nothing is computed); every
 * sequence's slot must be in [0, n_slots] (a token whose slot is not is skipped). out
 * must not overlap qkv, ba or the state. */
void sm70__cpu_gdn(struct sm70_backend *be, void *out, const void *qkv, const void *ba,
		   int ba_ld, const float *a_log, const float *dt_bias,
		   const struct sm70_state_layer *st, const struct sm70_state_layout *lay,
		   const struct sm70_batch *b, int chunked)
{
	struct sm70__cpu *c = sm70__cpu_of(be);
	struct gdn_job j = { .out = out, .qkv = qkv, .ba = ba, .ba_ld = ba_ld, .a_log = a_log,
			     .dt_bias = dt_bias, .ssm = st->ssm, .lay = lay, .b = b };
	size_t per_item;

	if (b->n_tokens <= 0 || b->n_seqs <= 0 || !b->seq_state || lay->n_k_heads <= 0 ||
	    lay->n_v_heads <= 0 || lay->n_v_heads % lay->n_k_heads || lay->k_dim <= 0 ||
	    lay->v_dim <= 0 || ba_ld < 2 * lay->n_v_heads ||
	    (long)lay->conv_dim != 2L * lay->n_k_heads * lay->k_dim +
					   (long)lay->n_v_heads * lay->v_dim)
		return;
	sm70__cpu_units_init(&j.units, b);
	/* batch invariance: the chunked form's pieces start where the scheduler cut the
	 * prompt, so only the recurrence gives a token the same bits however it was cut */
	j.chunked = chunked && !be->batch_invariant;
	j.q_scale = (float)(1.0 / sqrt((double)lay->k_dim));
	if (chunked && j.units.n > j.units.n_decode) {
		j.scratch = sm70__cpu_scratch(c, gdn_piece_floats(lay));
		j.stride = c->scratch_stride;
	}
	per_item = ((size_t)b->n_tokens / (size_t)b->n_seqs + 1) * (size_t)lay->k_dim *
		   (size_t)lay->v_dim * 4;
	sm70__pool_run(c->pool, b->n_seqs * lay->n_v_heads, sm70__cpu_grain(per_item), gdn_tasks,
		       &j);
}
