/*
 * test_qsa_ops - the CPU QSA ops (qsa_key_write, qsa_compress, qsa_select,
 * sparse_attention) against float64 references, on sequences in a shuffled paged cache of
 * 7-token blocks, so that blocks of `ratio` tokens straddle KV blocks.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#define OP_TEST_SEED 0x05a5e1ec7a11ULL

#include "common/dtype.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_ops.h"
#include "tests/unit/op_test.h"

#define BS 7 /* odd, so that no ratio but 1 and 7 divides it */
#define MAXS 8
#define MAXT 512
#define SENTINEL 12345.0f

/* ---- sequences in a paged cache, and batches over them ---------------------------------- */

/* n_seqs sequences of len[s] positions in a shuffled pool of BS-token blocks; row n_seqs of
 * the block table is the engine's padding sequence, whose one block is the scratch block
 * (the pool's last). bt is backend memory. */
struct world {
	int n_seqs, max_blocks, n_blocks;
	int len[MAXS];
	int32_t *bt;
};

static void world_init(struct sm70_backend *be, struct world *w, const int *len, int n_seqs)
{
	int total = 0, k = 0, *perm;

	assert_true(n_seqs < MAXS);
	memset(w, 0, sizeof(*w));
	w->n_seqs = n_seqs;
	w->max_blocks = 1;
	for (int s = 0; s < n_seqs; s++) {
		int nb = (len[s] + BS - 1) / BS;

		w->len[s] = len[s];
		total += nb;
		w->max_blocks = nb > w->max_blocks ? nb : w->max_blocks;
	}
	w->n_blocks = total + 1;
	perm = malloc(sizeof(int) * w->n_blocks);
	assert_non_null(perm);
	for (int i = 0; i < w->n_blocks; i++)
		perm[i] = i;
	for (int i = total - 1; i > 0; i--) {
		int j = rnd_int(i + 1), t = perm[i];

		perm[i] = perm[j];
		perm[j] = t;
	}
	w->bt = balloc(be, sizeof(int32_t) * (n_seqs + 1) * w->max_blocks);
	for (int s = 0; s < n_seqs; s++)
		for (int j = 0; j < (len[s] + BS - 1) / BS; j++)
			w->bt[s * w->max_blocks + j] = perm[k++];
	w->bt[n_seqs * w->max_blocks] = total; /* the scratch block */
	free(perm);
}

static int slot_of(const struct world *w, int s, int p)
{
	return w->bt[s * w->max_blocks + p / BS] * BS + p % BS;
}

/* One sequence's tokens in a step: len tokens from position pos (a decode when len is 1
 * and the piece is among the first n_dec). seq n_seqs is the padding sequence. */
struct piece {
	int seq, pos, len;
};

/* A batch in backend memory. */
struct tb {
	struct sm70_batch b;
	int32_t pos[MAXT], seq[MAXT], slot[MAXT], first[MAXS], len[MAXS];
};

static struct tb *tb_new(struct sm70_backend *be, const struct world *w, const struct piece *p,
			 int n, int n_dec)
{
	struct tb *tb = balloc(be, sizeof(*tb));
	int T = 0, max_pos = 0;

	for (int i = 0; i < n; i++) {
		if (i < n_dec) {
			assert_int_equal(p[i].len, 1);
		} else {
			tb->first[i - n_dec] = T;
			tb->len[i - n_dec] = p[i].len;
		}
		for (int k = 0; k < p[i].len; k++, T++) {
			assert_true(T < MAXT);
			tb->pos[T] = p[i].pos + k;
			tb->seq[T] = p[i].seq;
			tb->slot[T] = slot_of(w, p[i].seq, p[i].pos + k);
		}
		if (p[i].pos + p[i].len > max_pos)
			max_pos = p[i].pos + p[i].len;
	}
	tb->b = (struct sm70_batch){ .n_tokens = T, .n_seqs = w->n_seqs + 1,
				     .max_blocks = w->max_blocks, .max_pos = max_pos,
				     .tok_pos = tb->pos, .tok_seq = tb->seq, .tok_slot = tb->slot,
				     .block_tables = w->bt, .n_decode = n_dec,
				     .n_chunks = n - n_dec, .chunk_first = tb->first,
				     .chunk_len = tb->len, .chunk_first_host = tb->first,
				     .chunk_len_host = tb->len };
	return tb;
}

/* ---- qsa_key_write and qsa_compress ------------------------------------------------------ */

#define KDIM 20   /* not a multiple of 8: the dot products' tails run too */
#define KROT 12
#define KTHETA 10000.0

/* The compressed key of positions p0 .. p0 + ratio - 1 of keys (rows of KDIM) in float64:
 * mean, RMS norm with w and eps, rotate-half RoPE at p0 with transformers' f32 angles. */
static void ref_compress(double *out, const float *keys, int p0, int ratio, const float *w,
			 float eps)
{
	double ss = 0.0, inv, x[KDIM];

	for (int d = 0; d < KDIM; d++) {
		double sum = 0.0;

		for (int i = 0; i < ratio; i++)
			sum += keys[(size_t)(p0 + i) * KDIM + d];
		x[d] = sum / ratio;
		ss += x[d] * x[d];
	}
	inv = 1.0 / sqrt(ss / KDIM + eps);
	for (int d = 0; d < KDIM; d++)
		x[d] *= inv * w[d];
	memcpy(out, x, sizeof(x));
	for (int j = 0; j < KROT / 2; j++) {
		float inv_freq = 1.0f / powf((float)KTHETA, (float)(2 * j) / (float)KROT);
		double angle = (float)p0 * inv_freq;

		out[j] = x[j] * cos(angle) - x[j + KROT / 2] * sin(angle);
		out[j + KROT / 2] = x[j + KROT / 2] * cos(angle) + x[j] * sin(angle);
	}
}

/* Keys of the step's tokens into a k buffer of rows ld apart (the key inside a wider
 * projection row), from each sequence's key table (rows of KDIM a position). */
static float *step_keys(struct sm70_backend *be, const struct tb *tb, float *const *seq_keys,
			int ld)
{
	float *k = balloc(be, sizeof(float) * (size_t)tb->b.n_tokens * ld);

	for (int t = 0; t < tb->b.n_tokens; t++)
		memcpy(k + (size_t)t * ld, seq_keys[tb->seq[t]] + (size_t)tb->pos[t] * KDIM,
		       sizeof(float) * KDIM);
	return k;
}

/*
 * Two steps over five sequences: prefill chunks from position 0, then decodes and chunks
 * that finish blocks begun in the first step, with two padding rows (the engine's, at the
 * scratch block, and one with slot -1 at the end of a block, which must write nothing).
 * Every key must be stored bitwise, every complete block's compressed key must match the
 * float64 reference, and every other slot must keep its sentinel.
 */
static void compress_case(int ratio, struct errstat *e, size_t *exact)
{
	struct sm70_backend *be = cpu_backend(4);
	const int len[5] = { 3, 30, 47, 61, 9 }, split[5] = { 2, 17, 46, 30, 4 };
	const int ld = KDIM + 5;
	const float eps = 1e-6f;
	struct world w;
	struct sm70_qsa_layer ql;
	float *keys[MAXS], *k_norm = balloc(be, sizeof(float) * KDIM);
	int n_slots, written[MAXT * 4] = { 0 };

	world_init(be, &w, len, 5);
	n_slots = w.n_blocks * BS;
	assert_true(n_slots <= MAXT * 4);
	ql.keys = balloc(be, sizeof(float) * n_slots * KDIM);
	ql.comp = balloc(be, sizeof(float) * n_slots * KDIM);
	for (int i = 0; i < n_slots * KDIM; i++)
		ql.keys[i] = ql.comp[i] = SENTINEL;
	for (int d = 0; d < KDIM; d++)
		k_norm[d] = 1.0f + rnd(0.25f); /* the (1 + w) already folded in */
	for (int s = 0; s <= 5; s++) {
		int n = s < 5 ? len[s] : BS;

		keys[s] = malloc(sizeof(float) * n * KDIM);
		assert_non_null(keys[s]);
		for (int i = 0; i < n * KDIM; i++)
			keys[s][i] = rnd(1.0f) + (i % KDIM == 3 ? 0.5f : 0.0f);
	}

	for (int step = 0; step < 2; step++) {
		struct piece p[8];
		int n = 0, n_dec = 0;
		struct tb *tb;
		float *k;

		if (step == 0) {
			for (int s = 0; s < 5; s++)
				p[n++] = (struct piece){ s, 0, split[s] };
		} else {
			for (int s = 0; s < 5; s++)
				if (len[s] - split[s] == 1)
					p[n++] = (struct piece){ s, split[s], 1 };
			p[n++] = (struct piece){ 5, 0, 1 };          /* engine padding */
			p[n++] = (struct piece){ 5, ratio - 1, 1 }; /* slot -1 below */
			n_dec = n;
			for (int s = 0; s < 5; s++)
				if (len[s] - split[s] > 1)
					p[n++] = (struct piece){ s, split[s], len[s] - split[s] };
		}
		tb = tb_new(be, &w, p, n, n_dec);
		if (step == 1)
			tb->slot[n_dec - 1] = -1;
		for (int t = 0; t < tb->b.n_tokens; t++)
			if (tb->slot[t] >= 0)
				written[tb->slot[t]] = 1;
		k = step_keys(be, tb, keys, ld);
		be->ops->qsa_key_write(be, &ql, k, ld, KDIM, &tb->b);
		be->ops->qsa_compress(be, &ql, k_norm, eps, KDIM, ratio, KROT, KTHETA, BS, &tb->b);
		be->ops->buf_free(be, k);
		be->ops->buf_free(be, tb);
	}

	for (int s = 0; s < 5; s++) {
		for (int pos = 0; pos < len[s]; pos++) {
			const float *row = ql.keys + (size_t)slot_of(&w, s, pos) * KDIM;
			const float *crow = ql.comp + (size_t)slot_of(&w, s, pos) * KDIM;

			assert_memory_equal(row, keys[s] + (size_t)pos * KDIM, sizeof(float) * KDIM);
			*exact += KDIM;
			if ((pos + 1) % ratio == 0) {
				double ref[KDIM];

				ref_compress(ref, keys[s], pos + 1 - ratio, ratio, k_norm, eps);
				for (int d = 0; d < KDIM; d++)
					err_add(e, crow[d], ref[d], 1.0);
			} else {
				for (int d = 0; d < KDIM; d++)
					assert_true(crow[d] == SENTINEL);
				*exact += KDIM;
			}
		}
	}
	/* slots no token wrote (the -1 row's included) hold their sentinels in both caches */
	for (int sl = 0; sl < n_slots; sl++) {
		if (written[sl])
			continue;
		for (int d = 0; d < KDIM; d++) {
			assert_true(ql.keys[(size_t)sl * KDIM + d] == SENTINEL);
			assert_true(ql.comp[(size_t)sl * KDIM + d] == SENTINEL);
		}
		*exact += 2 * KDIM;
	}
	for (int s = 0; s <= 5; s++)
		free(keys[s]);
	bfree_all(be, ql.comp, ql.keys, k_norm, w.bt);
	sm70_backend_destroy(be);
}

static void test_key_write_compress(void **state)
{
	const int ratios[] = { 1, 3, 4, 5 };
	struct errstat e = { 0 };
	size_t exact = 0;

	for (int i = 0; i < 4; i++)
		compress_case(ratios[i], &e, &exact);
	printf("  qsa_key_write: keys bitwise; untouched slots keep their sentinel: %zu values\n",
	       exact);
	/* f32 mean of <= 5 rows, the f32 norm and a rotation by libm's f32 cos/sin: a few ulps
	 * of values near 1 */
	err_report("qsa_compress, ratio 1/3/4/5 (rel to 1; values ~1)", &e, 2e-6);
}

/* ---- qsa_select --------------------------------------------------------------------------- */

#define SHEADS 3
#define SDIM 20
#define SQLD (SHEADS * SDIM + 5)

/* How a select case draws q and the compressed keys. */
enum draw {
	DRAW_INT,   /* small integers: every f32 sum is exact, ties and zero scores are many */
	DRAW_FLOAT, /* uniform floats: ties only by accident */
};

struct ranked {
	double score;
	int block;
};

/* Higher score first, then the lower block (torch.topk on CUDA). */
static int ranked_cmp(const void *a, const void *b)
{
	const struct ranked *x = a, *y = b;

	if (x->score != y->score)
		return x->score > y->score ? -1 : 1;
	return x->block - y->block;
}

/* Block c's score in float64. */
static double ref_score(const float *q, const float *kc)
{
	double acc = 0.0;

	for (int h = 0; h < SHEADS; h++) {
		double d = 0.0;

		for (int k = 0; k < SDIM; k++)
			d += (double)q[h * SDIM + k] * kc[k];
		acc += d > 0.0 ? d : 0.0;
	}
	return acc / sqrt((double)SDIM);
}

/* The positions a row of chosen[nb] blocks and the tail nb*ratio..p make, ascending; the
 * count. */
static int canonical_row(int32_t *row, const char *chosen, int nb, int ratio, int p)
{
	int n = 0;

	for (int c = 0; c < nb; c++)
		for (int i = 0; chosen[c] && i < ratio; i++)
			row[n++] = c * ratio + i;
	for (int pos = nb * ratio; pos <= p; pos++)
		row[n++] = pos;
	return n;
}

struct select_stats {
	int tokens, all, tail_only, empty_tail, ties_at_k, zero_ties_at_k, near_ties;
};

/* Checks token t's selection against the float64 ranking of its nb blocks. */
static void check_selection(struct select_stats *st, const int32_t *row, int n, int p,
			    int ratio, int top, const struct ranked *rk_sorted, int nb, enum draw dr)
{
	char chosen[MAXT] = { 0 };
	int32_t want[MAXT];
	int k = top < nb ? top : nb;

	/* the row must be whole blocks then the tail, ascending: rebuild it from its blocks */
	for (int i = 0; i < n; i++)
		if (row[i] < nb * ratio)
			chosen[row[i] / ratio] = 1;
	assert_int_equal(n, canonical_row(want, chosen, nb, ratio, p));
	assert_memory_equal(row, want, sizeof(int32_t) * n);
	st->tokens++;
	st->all += nb > 0 && k == nb;
	st->tail_only += nb == 0;
	st->empty_tail += (p + 1) % ratio == 0;
	if (k == nb) {
		for (int c = 0; c < nb; c++)
			assert_true(chosen[c]);
		return;
	}
	{
		const double kth = rk_sorted[k - 1].score;
		int got = 0;

		if (rk_sorted[k].score == kth) {
			st->ties_at_k++;
			st->zero_ties_at_k += kth == 0.0;
		}
		for (int i = 0; i < nb; i++) {
			const struct ranked *r = &rk_sorted[i];

			got += chosen[r->block];
			if (dr == DRAW_INT || kth == 0.0) {
				/* exact (integers, or zeros: relu's): the first k of the ranking,
				 * ties to the lower block */
				assert_int_equal(chosen[r->block], i < k);
			} else if (fabs(r->score - kth) <= 1e-6 * kth) {
				/* either side of the cut may hold it */
				st->near_ties += i != k - 1;
			} else {
				assert_int_equal(chosen[r->block], r->score > kth);
			}
		}
		assert_int_equal(got, k);
	}
}

/*
 * A batch of decodes (p + 1 < ratio, p + 1 a multiple of ratio, a long context) and
 * prefill chunks (every position of a 97-token prompt: from the tail only to many more
 * blocks than top_blocks; a chunk far into a 150-token sequence), compressed keys written
 * straight into the cache at every slot (only block ends are read).
 */
static void select_case(enum draw dr, int ratio, int top, struct select_stats *st)
{
	struct sm70_backend *be = cpu_backend(4);
	const int len[6] = { 1, 3, 4, 40, 97, 150 };
	struct world w;
	struct sm70_qsa_layer ql = { NULL, NULL };
	struct piece p[7];
	struct tb *tb;
	float *q, *scratch;
	int32_t *sel, *n_sel;
	int n_slots, n = 0, sel_ld, nbmax;
	struct ranked *rk;

	world_init(be, &w, len, 6);
	n_slots = w.n_blocks * BS;
	ql.comp = balloc(be, sizeof(float) * n_slots * SDIM);
	for (int i = 0; i < n_slots * SDIM; i++)
		ql.comp[i] = dr == DRAW_INT ? (float)(rnd_int(4) - 2) : rnd(1.0f);
	for (int s = 0; s < 4; s++)
		p[n++] = (struct piece){ s, len[s] - 1, 1 };
	p[n++] = (struct piece){ 6, 0, 1 }; /* engine padding */
	p[n++] = (struct piece){ 4, 0, 97 };
	p[n++] = (struct piece){ 5, 100, 50 };
	tb = tb_new(be, &w, p, n, 5);
	q = balloc(be, sizeof(float) * tb->b.n_tokens * SQLD);
	for (int i = 0; i < tb->b.n_tokens * SQLD; i++)
		q[i] = dr == DRAW_INT ? (float)rnd_int(3) : rnd(1.0f);
	nbmax = (tb->b.max_pos + ratio - 1) / ratio;
	sel_ld = top * ratio + ratio - 1 + 3;
	sel = balloc(be, sizeof(int32_t) * tb->b.n_tokens * sel_ld);
	n_sel = balloc(be, sizeof(int32_t) * tb->b.n_tokens);
	scratch = balloc(be, sizeof(float) * tb->b.n_tokens * nbmax);
	rk = malloc(sizeof(*rk) * (nbmax + 1));
	assert_non_null(rk);

	be->ops->qsa_select(be, sel, n_sel, sel_ld, q, SQLD, &ql, SHEADS, SDIM, ratio, top, BS,
			    scratch, &tb->b);
	for (int t = 0; t < tb->b.n_tokens; t++) {
		const int pos = tb->pos[t], nb = (pos + 1) / ratio, s = tb->seq[t];

		for (int c = 0; c < nb; c++) {
			const float *kc = ql.comp + (size_t)slot_of(&w, s, c * ratio + ratio - 1) *
							    SDIM;

			rk[c] = (struct ranked){ ref_score(q + (size_t)t * SQLD, kc), c };
		}
		qsort(rk, nb, sizeof(*rk), ranked_cmp);
		assert_true(n_sel[t] <= sel_ld);
		check_selection(st, sel + (size_t)t * sel_ld, n_sel[t], pos, ratio, top, rk, nb,
				dr);
	}
	free(rk);
	bfree_all(be, scratch, n_sel, sel, q, tb, ql.comp, w.bt);
	sm70_backend_destroy(be);
}

static void print_stats(const char *what, const struct select_stats *st)
{
	printf("  %s: %d tokens (%d all blocks, %d tail only, %d empty tail), %d ties at the\n"
	       "    k-th score (%d of them 0), %d within 1e-6 of it\n", what, st->tokens, st->all,
	       st->tail_only, st->empty_tail, st->ties_at_k, st->zero_ties_at_k, st->near_ties);
}

/* Small integers: the selection must be the float64 ranking's first k exactly, and the
 * cases the tie rule decides must have come up, at zero and above it. */
static void test_select_ties(void **state)
{
	struct select_stats st = { 0 };
	const int ratios[] = { 4, 3, 5 }, tops[] = { 6, 9, 2 };

	for (int i = 0; i < 3; i++)
		select_case(DRAW_INT, ratios[i], tops[i], &st);
	print_stats("qsa_select, integer q and keys", &st);
	assert_true(st.all > 0 && st.tail_only > 0 && st.empty_tail > 0);
	assert_true(st.zero_ties_at_k >= 10);
	assert_true(st.ties_at_k > st.zero_ties_at_k);
}

/* Uniform floats: every block clearly above the k-th score is chosen, every one clearly
 * below is not, and exactly k are. */
static void test_select_random(void **state)
{
	struct select_stats st = { 0 };

	select_case(DRAW_FLOAT, 4, 6, &st);
	select_case(DRAW_FLOAT, 5, 1, &st);
	select_case(DRAW_FLOAT, 1, 16, &st);
	print_stats("qsa_select, uniform q and keys", &st);
	assert_true(st.tokens > 0);
}

/* ---- sparse_attention ----------------------------------------------------------------------- */

#define AHD 24
#define AKV 2
#define AHEADS 4
#define AQLD (AHEADS * AHD + 8)

/* Random cache contents in dtype t (FP8 as x / scale). */
static void fill_cache(void *cache, size_t n, enum sm70_dtype t, float scale)
{
	for (size_t i = 0; i < n; i++) {
		float x = rnd(1.0f);

		if (t == SM70_DTYPE_F16)
			((uint16_t *)cache)[i] = sm70_f32_to_f16(x);
		else if (t == SM70_DTYPE_F8E4M3)
			((uint8_t *)cache)[i] = sm70_f32_to_e4m3(x / scale);
		else
			((float *)cache)[i] = x;
	}
}

/* out[AHD] = softmax(q . K^T * scale) V over the n positions pos of sequence s, float64. */
static void ref_attend(double *out, const float *q, const struct world *w, int s, int h,
		       const struct sm70_kv_layer *kv, enum sm70_dtype t, enum sm70_dtype vt,
		       const int32_t *pos, int n, float scale)
{
	const int kvh = h / (AHEADS / AKV);
	double *sc = malloc(sizeof(double) * (n + 1)), mx = -INFINITY, sum = 0.0;

	assert_non_null(sc);
	for (int d = 0; d < AHD; d++)
		out[d] = 0.0;
	for (int i = 0; i < n; i++) {
		size_t base = ((size_t)slot_of(w, s, pos[i]) * AKV + kvh) * AHD;

		sc[i] = 0.0;
		for (int d = 0; d < AHD; d++)
			sc[i] += (double)q[d] * kv_value(kv->k, base + d, t, kv->k_scale);
		sc[i] *= scale;
		mx = fmax(mx, sc[i]);
	}
	for (int i = 0; i < n; i++)
		sum += exp(sc[i] - mx);
	for (int i = 0; i < n; i++) {
		size_t base = ((size_t)slot_of(w, s, pos[i]) * AKV + kvh) * AHD;
		double pr = exp(sc[i] - mx) / sum;

		for (int d = 0; d < AHD; d++)
			out[d] += pr * kv_value(kv->v, base + d, vt, kv->v_scale);
	}
	free(sc);
}

/*
 * Decodes of four sequences (one a single token) and a prefill chunk, over a random
 * ascending subset of each token's positions (always its own), against float64; then
 * every position selected must give the dense attention's bits; then the same without
 * scratch (the two-pass form); a token with n_sel 0 gets zeros. K in t, V in vt.
 */
static void sparse_case(enum sm70_dtype t, enum sm70_dtype vt, struct errstat *e,
			size_t *bitwise)
{
	struct sm70_backend *be = cpu_backend(4);
	const int len[4] = { 1, 30, 61, 200 };
	const float scale = 1.0f / sqrtf((float)AHD);
	struct sm70_kv_layout lay = { .dtype = t, .block_size = BS, .n_kv_heads = AKV,
				      .head_dim = AHD,
				      .v_dtype = vt == t ? SM70_KV_V_AS_K : SM70_KV_V(vt) };
	struct sm70_kv_layer kv = { NULL, NULL, 0.009f, 0.011f };
	struct piece p[4] = { { 0, 0, 1 }, { 1, 29, 1 }, { 3, 199, 1 }, { 2, 40, 21 } };
	struct world w;
	struct tb *tb;
	size_t n_el, nout, esz = sm70_dtype_size(t), vsz = sm70_dtype_size(vt);
	const int sel_ld = 210;
	int32_t *sel, *n_sel;
	float *q, *out, *dense;

	world_init(be, &w, len, 4);
	lay.n_blocks = w.n_blocks;
	n_el = (size_t)w.n_blocks * BS * AKV * AHD;
	kv.k = balloc(be, esz * n_el);
	kv.v = balloc(be, vsz * n_el);
	fill_cache(kv.k, n_el, t, kv.k_scale);
	fill_cache(kv.v, n_el, vt, kv.v_scale);
	tb = tb_new(be, &w, p, 4, 3);
	nout = (size_t)tb->b.n_tokens * AHEADS * AHD;
	q = balloc(be, sizeof(float) * tb->b.n_tokens * AQLD);
	for (int i = 0; i < tb->b.n_tokens * AQLD; i++)
		q[i] = rnd(2.5f);
	sel = balloc(be, sizeof(int32_t) * tb->b.n_tokens * sel_ld);
	n_sel = balloc(be, sizeof(int32_t) * tb->b.n_tokens);
	out = balloc(be, sizeof(float) * nout);
	dense = balloc(be, sizeof(float) * nout);

	for (int run = 0; run < 2; run++) {
		sm70__cpu_of(be)->scratch_off = run;
		for (int tk = 0; tk < tb->b.n_tokens; tk++) {
			int32_t *row = sel + (size_t)tk * sel_ld;

			n_sel[tk] = 0;
			for (int pos = 0; pos <= tb->pos[tk]; pos++)
				if (pos == tb->pos[tk] || rnd_int(10) < 3)
					row[n_sel[tk]++] = pos;
		}
		be->ops->sparse_attention(be, out, q, AQLD, &kv, &lay, &tb->b, sel, n_sel, sel_ld,
					  AHEADS, scale);
		for (int tk = 0; tk < tb->b.n_tokens; tk++) {
			for (int h = 0; h < AHEADS; h++) {
				double ref[AHD];
				const float *o = out + ((size_t)tk * AHEADS + h) * AHD;

				ref_attend(ref, q + (size_t)tk * AQLD + h * AHD, &w, tb->seq[tk], h,
					   &kv, t, vt, sel + (size_t)tk * sel_ld, n_sel[tk],
					   scale);
				for (int d = 0; d < AHD; d++)
					err_add(e, o[d], ref[d], 1.0);
			}
		}
		/* every position: the dense op's bits */
		for (int tk = 0; tk < tb->b.n_tokens; tk++) {
			n_sel[tk] = tb->pos[tk] + 1;
			for (int pos = 0; pos <= tb->pos[tk]; pos++)
				sel[(size_t)tk * sel_ld + pos] = pos;
		}
		be->ops->sparse_attention(be, out, q, AQLD, &kv, &lay, &tb->b, sel, n_sel, sel_ld,
					  AHEADS, scale);
		be->ops->attention(be, dense, q, AQLD, &kv, &lay, &tb->b, AHEADS, scale);
		assert_memory_equal(out, dense, sizeof(float) * nout);
		*bitwise += nout;
	}
	sm70__cpu_of(be)->scratch_off = 0;
	n_sel[1] = 0;
	be->ops->sparse_attention(be, out, q, AQLD, &kv, &lay, &tb->b, sel, n_sel, sel_ld, AHEADS,
				  scale);
	for (int i = 0; i < AHEADS * AHD; i++)
		assert_true(out[(size_t)AHEADS * AHD + i] == 0.0f);

	bfree_all(be, dense, out, n_sel, sel, q, tb, kv.v, kv.k, w.bt);
	sm70_backend_destroy(be);
}

static void test_sparse_attention(void **state)
{
	/* K dtype, V dtype: V like K, and the "fp8" mode's K FP8 with V f16 */
	const enum sm70_dtype kts[] = { SM70_DTYPE_F32, SM70_DTYPE_F16, SM70_DTYPE_F8E4M3,
					SM70_DTYPE_F8E4M3 };
	const enum sm70_dtype vts[] = { SM70_DTYPE_F32, SM70_DTYPE_F16, SM70_DTYPE_F8E4M3,
					SM70_DTYPE_F16 };
	static const char *const names[] = { "f32", "f16", "f8e4m3", "K f8e4m3 V f16" };

	for (int i = 0; i < 4; i++) {
		struct errstat e = { 0 };
		size_t bitwise = 0;
		char what[96];

		sparse_case(kts[i], vts[i], &e, &bitwise);
		snprintf(what, sizeof(what), "sparse_attention, %s KV, with and without scratch",
			 names[i]);
		/* |V| <= 1: f32 dots of 24 terms and a normaliser summed in double */
		err_report(what, &e, 1e-6);
		printf("  sparse_attention, %s KV, every position: %zu values bitwise the dense "
		       "op's\n", names[i], bitwise);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_key_write_compress),
		cmocka_unit_test(test_select_ties),
		cmocka_unit_test(test_select_random),
		cmocka_unit_test(test_sparse_attention),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
