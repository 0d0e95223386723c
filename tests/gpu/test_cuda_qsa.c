/* test_cuda_qsa - the CUDA QSA ops (qsa_key_write, qsa_compress, qsa_select,
 * sparse_attention) against their CPU twins, and a captured decode step's replay against
 * eager runs. */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/dtype.h"
#include "kernels/backend.h"
#include "kernels/cuda/cuda_ops.h"

#define GPU_TEST_SEED 0x05a5e1ec7c0deULL
#include "tests/gpu/gpu_test.h"

/*
 * Errors are max |got - ref| over max |ref| ("rel").
 * - keys: f16 widened to f32 on both sides: exact.
 * - compressed keys: the mean has the same bits (f32, same order); the sum of squares is
 *   double on both (order differs: the f32 norm factor almost always agrees); the rotation
 *   goes through each side's cosf/sinf of the same f32 angle (an ulp or two): ~1e-7.
 * - qsa_select: integer inputs make every dot exact in f32 whatever the order, so scores
 *   and selections must be bitwise the CPU's; float inputs may differ only where two scores
 *   are within 1e-6 (f32 dots of <= 128 terms in another order differ by a few ulps).
 * - sparse_attention: f16 out (up to 4.9e-4 of the max) plus fp32 noise, as the dense op.
 */
#define TOL_EXACT 0.0
#define TOL_COMP 2e-6
#define TOL_NEAR_TIE 1e-6
#define TOL_ATTN 1.5e-3

static struct sm70_backend *gpu, *gpu_ref, *cpu;

/* ---- sequences, batches and their backend copies --------------------------------------- */

#define MAXT 1024
#define MAXS 32

/* Block tables of n_seqs sequences over a pool of n_blocks blocks of bs tokens: each
 * sequence's blocks are distinct, in random order; sequences may share blocks (shared:
 * long contexts without a cache per sequence; the ops never write through the tables
 * but at tok_slot). Row n_seqs is the padding sequence, on the pool's last block (the
 * engine's scratch block), which no sequence uses. */
struct hworld {
	int n_seqs, max_blocks, n_blocks, bs;
	int32_t *bt;
};

static void hw_make(struct hworld *w, const int *len, int n_seqs, int bs, int shared_pool)
{
	int total = 0, next = 0, pool, *perm;

	w->n_seqs = n_seqs;
	w->bs = bs;
	w->max_blocks = 1;
	for (int s = 0; s < n_seqs; s++) {
		int nb = (len[s] + bs - 1) / bs;

		total += nb;
		w->max_blocks = nb > w->max_blocks ? nb : w->max_blocks;
	}
	pool = shared_pool > 0 ? shared_pool : total;
	w->n_blocks = pool + 1;
	assert_true(w->max_blocks <= pool);
	w->bt = calloc((size_t)(n_seqs + 1) * w->max_blocks, sizeof(int32_t));
	perm = malloc(sizeof(int) * pool);
	assert_true(w->bt && perm);
	for (int i = 0; i < pool; i++)
		perm[i] = i;
	for (int s = 0; s < n_seqs; s++) {
		const int nb = (len[s] + bs - 1) / bs;

		for (int j = 0; j < nb; j++) {
			/* shared: a fresh partial shuffle per sequence; else the next unused */
			int i = shared_pool > 0 ? j : next++;
			int r = i + rnd_int(pool - i), tmp = perm[i];

			perm[i] = perm[r];
			perm[r] = tmp;
			w->bt[s * w->max_blocks + j] = perm[i];
		}
	}
	w->bt[n_seqs * w->max_blocks] = pool;
	free(perm);
}

static int hw_slot(const struct hworld *w, int s, int p)
{
	return w->bt[s * w->max_blocks + p / w->bs] * w->bs + p % w->bs;
}

/* One sequence's tokens in a step: len tokens from position pos; decodes come first. */
struct piece {
	int seq, pos, len;
};

struct hbatch {
	int n_tokens, n_seqs, n_decode, n_chunks, max_pos;
	int32_t pos[MAXT], seq[MAXT], slot[MAXT], first[MAXS], len[MAXS];
};

static void hb_make(struct hbatch *hb, const struct hworld *w, const struct piece *p, int n,
		    int n_dec)
{
	memset(hb, 0, sizeof(*hb));
	hb->n_seqs = w->n_seqs + 1;
	hb->n_decode = n_dec;
	hb->n_chunks = n - n_dec;
	for (int i = 0; i < n; i++) {
		if (i >= n_dec) {
			hb->first[i - n_dec] = hb->n_tokens;
			hb->len[i - n_dec] = p[i].len;
		}
		for (int k = 0; k < p[i].len; k++) {
			const int t = hb->n_tokens++;

			assert_true(t < MAXT);
			hb->pos[t] = p[i].pos + k;
			hb->seq[t] = p[i].seq;
			hb->slot[t] = hw_slot(w, p[i].seq, p[i].pos + k);
			if (hb->pos[t] + 1 > hb->max_pos)
				hb->max_pos = hb->pos[t] + 1;
		}
	}
}

/* A batch in one backend's memory. */
struct dbatch {
	struct sm70_batch b;
	void *pos, *seq, *slot, *bt, *first, *len;
};

static void db_up(struct sm70_backend *be, struct dbatch *d, const struct hbatch *hb,
		  const struct hworld *w)
{
	const size_t tbl = sizeof(int32_t) * (size_t)(w->n_seqs + 1) * w->max_blocks;

	d->pos = up_bytes(be, hb->pos, sizeof(int32_t) * MAXT);
	d->seq = up_bytes(be, hb->seq, sizeof(int32_t) * MAXT);
	d->slot = up_bytes(be, hb->slot, sizeof(int32_t) * MAXT);
	d->bt = up_bytes(be, w->bt, tbl);
	d->first = up_bytes(be, hb->first, sizeof(int32_t) * MAXS);
	d->len = up_bytes(be, hb->len, sizeof(int32_t) * MAXS);
	d->b = (struct sm70_batch){ .n_tokens = hb->n_tokens, .n_seqs = hb->n_seqs,
				    .max_blocks = w->max_blocks, .max_pos = hb->max_pos,
				    .tok_pos = d->pos, .tok_seq = d->seq, .tok_slot = d->slot,
				    .block_tables = d->bt, .n_decode = hb->n_decode,
				    .n_chunks = hb->n_chunks, .chunk_first = d->first,
				    .chunk_len = d->len, .chunk_first_host = hb->first,
				    .chunk_len_host = hb->len };
}

static void db_free(struct sm70_backend *be, struct dbatch *d)
{
	bfree(be, d->pos), bfree(be, d->seq), bfree(be, d->slot), bfree(be, d->bt);
	bfree(be, d->first), bfree(be, d->len);
}

/* ---- qsa_key_write and qsa_compress ---------------------------------------------------- */

/*
 * Two steps over six sequences (7-token KV blocks): prefill chunks from position 0, then
 * decodes and chunks that finish blocks begun in the first step, plus a padding row. The
 * stored keys must be the CPU's bits, the compressed keys within TOL_COMP.
 */
static void compress_case(int dim, int rot_dim, int ratio, double theta)
{
	const int len[6] = { 3, 30, 47, 61, 9, 700 }, split[6] = { 2, 17, 46, 30, 4, 513 };
	const int bs = 7, ld = dim + 8;
	struct sm70_backend *bes[2] = { cpu, gpu };
	struct sm70_qsa_layer ql[2];
	struct hworld w;
	float *keys[7], *k_norm = fvec(dim), *got[2][2];
	size_t n_cache;
	char what[128];

	hw_make(&w, len, 6, bs, 0);
	n_cache = (size_t)w.n_blocks * bs * dim;
	for (int s = 0; s <= 6; s++)
		keys[s] = rvec16((size_t)(s < 6 ? len[s] : 1) * dim, 1.0f);
	for (int d = 0; d < dim; d++)
		k_norm[d] = 1.0f + rnd(0.25f);
	for (int i = 0; i < 2; i++) {
		ql[i].keys = balloc(bes[i], sizeof(float) * n_cache);
		ql[i].comp = balloc(bes[i], sizeof(float) * n_cache);
	}
	for (int step = 0; step < 2; step++) {
		struct piece p[16];
		struct hbatch hb;
		float *k;
		int n = 0, n_dec = 0;

		if (step == 0) {
			for (int s = 0; s < 6; s++)
				p[n++] = (struct piece){ s, 0, split[s] };
		} else {
			for (int s = 0; s < 6; s++)
				if (len[s] - split[s] == 1)
					p[n++] = (struct piece){ s, split[s], 1 };
			p[n++] = (struct piece){ 6, 0, 1 }; /* padding */
			n_dec = n;
			for (int s = 0; s < 6; s++)
				if (len[s] - split[s] > 1)
					p[n++] = (struct piece){ s, split[s], len[s] - split[s] };
		}
		hb_make(&hb, &w, p, n, n_dec);
		k = fvec((size_t)hb.n_tokens * ld);
		for (int t = 0; t < hb.n_tokens; t++)
			memcpy(k + (size_t)t * ld, keys[hb.seq[t]] + (size_t)hb.pos[t] * dim,
			       sizeof(float) * dim);
		for (int i = 0; i < 2; i++) {
			struct sm70_backend *be = bes[i];
			struct dbatch db;
			void *dk = up_act(be, k, (size_t)hb.n_tokens * ld);
			float *dn = up_bytes(be, k_norm, sizeof(float) * dim);

			db_up(be, &db, &hb, &w);
			be->ops->qsa_key_write(be, &ql[i], dk, ld, dim, &db.b);
			be->ops->qsa_compress(be, &ql[i], dn, 1e-6f, dim, ratio, rot_dim, theta, bs,
					      &db.b);
			assert_int_equal(be->ops->sync(be), 0);
			db_free(be, &db);
			bfree(be, dk), bfree(be, dn);
		}
		free(k);
	}
	for (int i = 0; i < 2; i++) {
		got[i][0] = fvec(n_cache);
		got[i][1] = fvec(n_cache);
		get_f32(bes[i], got[i][0], ql[i].keys, n_cache);
		get_f32(bes[i], got[i][1], ql[i].comp, n_cache);
	}
	snprintf(what, sizeof(what), "qsa_key_write dim=%d vs cpu", dim);
	compare_values(what, got[1][0], got[0][0], n_cache, TOL_EXACT);
	snprintf(what, sizeof(what), "qsa_compress dim=%d rot=%d ratio=%d vs cpu", dim, rot_dim,
		 ratio);
	compare_values(what, got[1][1], got[0][1], n_cache, TOL_COMP);
	for (int i = 0; i < 2; i++) {
		free(got[i][0]), free(got[i][1]);
		bfree(bes[i], ql[i].keys), bfree(bes[i], ql[i].comp);
	}
	for (int s = 0; s <= 6; s++)
		free(keys[s]);
	free(k_norm), free(w.bt);
}

static void test_key_write_compress(void **state)
{
	compress_case(128, 64, 4, 1e6);
	compress_case(32, 8, 5, 1e4);
	compress_case(64, 64, 1, 1e6);
}

/* ---- qsa_select ---------------------------------------------------------------------------- */

struct sel_shape {
	int heads, dim, ratio, top;
};

/* The outputs of one qsa_select run, on the host. */
struct sel_out {
	int32_t *sel, *n_sel;
	float *scores;
};

/*
 * Runs qsa_select on both backends over decodes at 1, 3, 4, 40, 9000 and 20000 tokens
 * (tail only, an empty tail, more blocks than the pick kernel's threads) and prefill chunks
 * (every position of a 97-token prompt; 100 positions far into a 1500-token sequence),
 * 7-token KV blocks. Integer draws (ints): q in {0, 1, 2} and, per block, keys in
 * {-2, -1, 0} (3 blocks in 4: every dot <= 0, a score of exactly 0) or {-1, 0, 1}.
 */
static void select_run(const struct sel_shape *sh, int ints, struct sel_out out[2],
		       struct hbatch *hb, int *sel_ld, int *scores_ld)
{
	const int len[8] = { 1, 3, 4, 40, 97, 1500, 9000, 20000 }, bs = 7;
	const int q_ld = sh->heads * sh->dim + 8;
	struct sm70_backend *bes[2] = { cpu, gpu };
	const struct piece p[8] = { { 0, 0, 1 }, { 1, 2, 1 }, { 2, 3, 1 }, { 3, 39, 1 },
				    { 6, 8999, 1 }, { 7, 19999, 1 }, { 4, 0, 97 },
				    { 5, 1400, 100 } };
	struct hworld w;
	float *comp, *q;
	size_t n_cache;

	hw_make(&w, len, 8, bs, 0);
	hb_make(hb, &w, p, 8, 6);
	n_cache = (size_t)w.n_blocks * bs * sh->dim;
	comp = fvec(n_cache);
	for (size_t r = 0; r < n_cache / sh->dim; r++) {
		const int dead = rnd_int(4) != 0;

		for (int d = 0; d < sh->dim; d++)
			comp[r * sh->dim + d] = ints ? (float)(rnd_int(3) - 1 - dead) : rnd(1.0f);
	}
	q = fvec((size_t)hb->n_tokens * q_ld);
	for (size_t i = 0; i < (size_t)hb->n_tokens * q_ld; i++)
		q[i] = ints ? (float)rnd_int(3) : sm70_f16_to_f32(sm70_f32_to_f16(rnd(1.0f)));
	*sel_ld = sh->top * sh->ratio + sh->ratio - 1;
	*scores_ld = (hb->max_pos + sh->ratio - 1) / sh->ratio;
	for (int i = 0; i < 2; i++) {
		struct sm70_backend *be = bes[i];
		const size_t n_sel_all = (size_t)hb->n_tokens * *sel_ld;
		const size_t n_scores = (size_t)hb->n_tokens * *scores_ld;
		struct sm70_qsa_layer ql = { NULL, up_bytes(be, comp, sizeof(float) * n_cache) };
		void *dq = up_act(be, q, (size_t)hb->n_tokens * q_ld);
		int32_t *dsel = balloc(be, sizeof(int32_t) * n_sel_all);
		int32_t *dn = balloc(be, sizeof(int32_t) * hb->n_tokens);
		float *dsc = balloc(be, sizeof(float) * n_scores);
		struct dbatch db;

		db_up(be, &db, hb, &w);
		be->ops->qsa_select(be, dsel, dn, *sel_ld, dq, q_ld, &ql, sh->heads, sh->dim,
				    sh->ratio, sh->top, bs, dsc, &db.b);
		out[i].sel = calloc(n_sel_all, sizeof(int32_t));
		out[i].n_sel = calloc(hb->n_tokens, sizeof(int32_t));
		out[i].scores = fvec(n_scores);
		assert_true(out[i].sel && out[i].n_sel);
		assert_int_equal(be->ops->download(be, out[i].sel, dsel, sizeof(int32_t) * n_sel_all),
				 0);
		assert_int_equal(be->ops->download(be, out[i].n_sel, dn,
						   sizeof(int32_t) * hb->n_tokens), 0);
		get_f32(be, out[i].scores, dsc, n_scores);
		db_free(be, &db);
		bfree(be, ql.comp), bfree(be, dq), bfree(be, dsel), bfree(be, dn), bfree(be, dsc);
	}
	free(comp), free(q), free(w.bt);
}

static void sel_out_free(struct sel_out out[2])
{
	for (int i = 0; i < 2; i++)
		free(out[i].sel), free(out[i].n_sel), free(out[i].scores);
}

/* Integer draws: n_sel, every selected position and every score the pick read must be
 * the CPU's bits, and some token must have had a tie at the k-th score. Returns how many
 * of those ties were at 0. */
static int select_exact_case(const struct sel_shape *sh)
{
	struct sel_out out[2];
	struct hbatch hb;
	int sel_ld, scores_ld, ties = 0, zero_ties = 0, scored = 0;

	select_run(sh, 1, out, &hb, &sel_ld, &scores_ld);
	assert_memory_equal(out[1].n_sel, out[0].n_sel, sizeof(int32_t) * hb.n_tokens);
	for (int t = 0; t < hb.n_tokens; t++) {
		const int nb = (hb.pos[t] + 1) / sh->ratio;
		const float *sc = out[0].scores + (size_t)t * scores_ld;

		assert_memory_equal(out[1].sel + (size_t)t * sel_ld, out[0].sel + (size_t)t * sel_ld,
				    sizeof(int32_t) * out[0].n_sel[t]);
		if (nb <= sh->top)
			continue;
		scored++;
		assert_memory_equal(out[1].scores + (size_t)t * scores_ld, sc, sizeof(float) * nb);
	}
	for (int t = 0; t < hb.n_tokens; t++) {
		const int nb = (hb.pos[t] + 1) / sh->ratio;
		const float *sc = out[0].scores + (size_t)t * scores_ld;
		float kth = -1.0f;
		int n_ge;

		if (nb <= sh->top)
			continue;
		/* the k-th largest: the smallest score among the chosen blocks */
		for (int i = 0; i < out[0].n_sel[t]; i += sh->ratio) {
			const int c = out[0].sel[(size_t)t * sel_ld + i] / sh->ratio;

			if (c < nb && (kth < 0 || sc[c] < kth))
				kth = sc[c];
		}
		n_ge = 0;
		for (int c = 0; c < nb; c++)
			n_ge += sc[c] >= kth;
		ties += n_ge > sh->top;
		zero_ties += n_ge > sh->top && kth == 0.0f;
	}
	printf("  qsa_select heads=%d dim=%d ratio=%d top=%d: %d tokens (%d scored) bitwise the "
	       "cpu's; %d ties at the k-th score, %d at 0\n", sh->heads, sh->dim, sh->ratio,
	       sh->top, hb.n_tokens, scored, ties, zero_ties);
	assert_true(ties > 0);
	sel_out_free(out);
	return zero_ties;
}

static void test_select_exact(void **state)
{
	const struct sel_shape shapes[] = { { 2, 32, 4, 4 }, { 16, 128, 4, 128 },
					    { 8, 64, 5, 40 }, { 4, 96, 16, 7 } };

	int zero_ties = 0;

	for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++)
		zero_ties += select_exact_case(&shapes[i]);
	assert_true(zero_ties > 0);
}

/* Float draws: the same counts and tails; the scores within TOL_NEAR_TIE of the CPU's;
 * a block chosen on one side only must score within TOL_NEAR_TIE of the k-th score. */
static void select_random_case(const struct sel_shape *sh)
{
	struct sel_out out[2];
	struct hbatch hb;
	int sel_ld, scores_ld, differ = 0;
	char what[128];

	select_run(sh, 0, out, &hb, &sel_ld, &scores_ld);
	assert_memory_equal(out[1].n_sel, out[0].n_sel, sizeof(int32_t) * hb.n_tokens);
	for (int t = 0; t < hb.n_tokens; t++) {
		const int nb = (hb.pos[t] + 1) / sh->ratio, n = out[0].n_sel[t];
		const int32_t *r0 = out[0].sel + (size_t)t * sel_ld, *r1 = out[1].sel + (size_t)t * sel_ld;
		const float *s0 = out[0].scores + (size_t)t * scores_ld;
		const float *s1 = out[1].scores + (size_t)t * scores_ld;
		char *chosen[2];
		float kth = -1.0f;
		int blocks_end = 0;

		if (nb <= sh->top) {
			assert_memory_equal(r1, r0, sizeof(int32_t) * n);
			continue;
		}
		snprintf(what, sizeof(what), "qsa_select scores heads=%d dim=%d token %d vs cpu",
			 sh->heads, sh->dim, t);
		if (t == hb.n_tokens - 1 || hb.pos[t] > 8000)
			compare_values(what, s1, s0, nb, TOL_NEAR_TIE);
		chosen[0] = calloc(nb, 1);
		chosen[1] = calloc(nb, 1);
		assert_true(chosen[0] && chosen[1]);
		for (int i = 0; i < n; i++) {
			if (r0[i] < nb * sh->ratio)
				chosen[0][r0[i] / sh->ratio] = 1;
			if (r1[i] < nb * sh->ratio) {
				chosen[1][r1[i] / sh->ratio] = 1;
				blocks_end = i + 1;
			}
		}
		/* the tail after the blocks is the same positions */
		assert_memory_equal(r1 + blocks_end, r0 + blocks_end,
				    sizeof(int32_t) * (n - blocks_end));
		for (int c = 0; c < nb; c++)
			if (chosen[0][c] && (kth < 0 || s0[c] < kth))
				kth = s0[c];
		for (int c = 0; c < nb; c++) {
			if (chosen[0][c] == chosen[1][c])
				continue;
			differ++;
			assert_true(fabs((double)s0[c] - kth) <= TOL_NEAR_TIE * kth);
		}
		free(chosen[0]), free(chosen[1]);
	}
	printf("  qsa_select heads=%d dim=%d ratio=%d top=%d, uniform draws: %d tokens, %d blocks "
	       "chosen on one side only (near ties)\n", sh->heads, sh->dim, sh->ratio, sh->top,
	       hb.n_tokens, differ);
	sel_out_free(out);
}

static void test_select_random(void **state)
{
	const struct sel_shape shapes[] = { { 2, 32, 4, 4 }, { 16, 128, 4, 128 },
					    { 8, 64, 5, 40 } };

	for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++)
		select_random_case(&shapes[i]);
}

/* ---- sparse_attention ---------------------------------------------------------------------- */

/* A selection as qsa_select makes one: k = min(top, nb) distinct random blocks of ratio
 * positions, ascending, then the tail; every position 0..p when every is set. */
static int make_selection(int32_t *row, int p, int ratio, int top, int every)
{
	const int nb = (p + 1) / ratio;
	int n = 0, first_tail = 0;

	if (!every && nb > top) {
		char *pick = calloc(nb, 1);

		assert_non_null(pick);
		for (int k = 0; k < top;) {
			int c = rnd_int(nb);

			k += !pick[c];
			pick[c] = 1;
		}
		for (int c = 0; c < nb; c++)
			for (int i = 0; pick[c] && i < ratio; i++)
				row[n++] = c * ratio + i;
		first_tail = nb * ratio;
		free(pick);
	}
	for (int pos = first_tail; pos <= p; pos++)
		row[n++] = pos;
	return n;
}

struct sp_case {
	int D, group, kvm; /* kvm: the KV mode (gpu_test.h), 0 f16, 1 fp8-all, 2 fp8 */
	int ratio, top; /* the selection's shape */
	int every;      /* select every position (and compare with the dense op too) */
	int n_seqs;
	const int *len; /* decodes at len - 1; the last sequence is a chunk of 24 */
};

/*
 * Sparse attention over a shared pool of 16-token blocks (sequences share blocks, so long
 * contexts need one pool, not a cache each), on the CPU, the GPU and the GPU's reference
 * kernel. The second token selects nothing when `every` is not set (zeros).
 */
static void sparse_case(const struct sp_case *sc)
{
	const int n_kv = 2, n_heads = n_kv * sc->group, bs = 16, D = sc->D;
	const int q_ld = (n_heads + 2 * n_kv) * D;
	struct sm70_kv_layout lay = kv_mode_layout(sc->kvm, 0, bs, n_kv, D);
	const char *mode = kv_mode_name(sc->kvm);
	struct sm70_kv_layer kl = { NULL, NULL, 0.011f, 0.009f };
	struct sm70_backend *bes[3] = { cpu, gpu, gpu_ref };
	struct piece p[MAXS];
	struct hworld w;
	struct hbatch hb;
	int max_len = 0, sel_ld, n = 0;
	int32_t *sel, *n_sel;
	uint8_t *kbytes, *vbytes;
	size_t row = (size_t)n_kv * D, n_el, kc_bytes, vc_bytes, nq, nout;
	float *q, *out[4];
	char what[192];

	for (int s = 0; s < sc->n_seqs; s++)
		max_len = sc->len[s] > max_len ? sc->len[s] : max_len;
	hw_make(&w, sc->len, sc->n_seqs, bs, (max_len + bs - 1) / bs + 8);
	lay.n_blocks = w.n_blocks;
	for (int s = 0; s < sc->n_seqs - 1; s++)
		p[n++] = (struct piece){ s, sc->len[s] - 1, 1 };
	p[n++] = (struct piece){ sc->n_seqs - 1, sc->len[sc->n_seqs - 1] - 24, 24 };
	hb_make(&hb, &w, p, n, n - 1);
	sel_ld = sc->every ? hb.max_pos : sc->top * sc->ratio + sc->ratio - 1;
	sel = malloc(sizeof(int32_t) * hb.n_tokens * sel_ld);
	n_sel = malloc(sizeof(int32_t) * hb.n_tokens);
	assert_true(sel && n_sel);
	for (int t = 0; t < hb.n_tokens; t++)
		n_sel[t] = make_selection(sel + (size_t)t * sel_ld, hb.pos[t], sc->ratio, sc->top,
					  sc->every);
	if (!sc->every)
		n_sel[1] = 0;

	/* random cache bytes, K and V each in its dtype (FP8 as x / scale) */
	n_el = (size_t)w.n_blocks * bs * row;
	kc_bytes = n_el * (kv_mode_k_fp8(sc->kvm) ? 1 : 2);
	vc_bytes = n_el * (kv_mode_v_fp8(sc->kvm) ? 1 : 2);
	kbytes = malloc(kc_bytes);
	vbytes = malloc(vc_bytes);
	assert_true(kbytes && vbytes);
	kv_fill_random(kbytes, n_el, kv_mode_k_fp8(sc->kvm), kl.k_scale);
	kv_fill_random(vbytes, n_el, kv_mode_v_fp8(sc->kvm), kl.v_scale);
	nq = (size_t)hb.n_tokens * q_ld;
	nout = (size_t)hb.n_tokens * n_heads * D;
	q = rvec16(nq, 2.5f); /* a little larger than unit so that the softmax is not flat */

	for (int i = 0; i < (sc->every ? 4 : 3); i++) {
		struct sm70_backend *be = bes[i < 3 ? i : 1];
		struct sm70_kv_layer k = kl;
		struct dbatch db;
		void *dq = up_act(be, q, nq), *dout = balloc(be, nout * 4);
		void *dsel = up_bytes(be, sel, sizeof(int32_t) * hb.n_tokens * sel_ld);
		void *dn = up_bytes(be, n_sel, sizeof(int32_t) * hb.n_tokens);

		k.k = up_bytes(be, kbytes, kc_bytes);
		k.v = up_bytes(be, vbytes, vc_bytes);
		db_up(be, &db, &hb, &w);
		if (i < 3)
			be->ops->sparse_attention(be, dout, dq, q_ld, &k, &lay, &db.b, dsel, dn,
						  sel_ld, n_heads, 1.0f / sqrtf((float)D));
		else /* every position: the dense op on the GPU */
			be->ops->attention(be, dout, dq, q_ld, &k, &lay, &db.b, n_heads,
					   1.0f / sqrtf((float)D));
		out[i] = fvec(nout);
		get_act(be, out[i], dout, nout);
		db_free(be, &db);
		bfree(be, k.k), bfree(be, k.v), bfree(be, dq), bfree(be, dout);
		bfree(be, dsel), bfree(be, dn);
	}
	snprintf(what, sizeof(what), "sparse_attention D=%d G=%d %s B%d max_pos=%d sel<=%d vs cpu",
		 D, sc->group, mode, hb.n_tokens, hb.max_pos, sel_ld);
	compare_values(what, out[1], out[0], nout, TOL_ATTN);
	snprintf(what, sizeof(what), "sparse_attention reference D=%d G=%d %s vs cpu", D,
		 sc->group, mode);
	compare_values(what, out[2], out[0], nout, TOL_ATTN);
	snprintf(what, sizeof(what), "sparse_attention fast vs reference D=%d G=%d %s", D,
		 sc->group, mode);
	compare_values(what, out[1], out[2], nout, TOL_ATTN);
	if (sc->every) {
		snprintf(what, sizeof(what), "sparse_attention every position vs dense attention "
			 "D=%d G=%d %s", D, sc->group, mode);
		/* each within TOL_ATTN of the CPU (the dense op's tensor-core path rounds P to
		 * f16), so within twice that of each other */
		compare_values(what, out[1], out[3], nout, 2 * TOL_ATTN);
		free(out[3]);
	} else {
		for (size_t i = 0; i < (size_t)n_heads * D; i++)
			assert_true(out[1][(size_t)n_heads * D + i] == 0.0f &&
				    out[2][(size_t)n_heads * D + i] == 0.0f);
	}
	for (int i = 0; i < 3; i++)
		free(out[i]);
	free(q), free(kbytes), free(vbytes), free(sel), free(n_sel), free(w.bt);
}

static void test_sparse_attention(void **state)
{
	static const int small[] = { 1, 37, 300, 1000 };
	static const int b1[] = { 32768, 600 };
	static const int b16[] = { 8192,  9000,  10007, 11111, 12288, 13000, 14001, 15555,
				   16384, 18000, 20000, 22222, 24576, 27000, 30000, 32768, 9999 };
	const struct sp_case cases[] = {
		{ 64, 2, 0, 4, 16, 0, 4, small },
		{ 32, 1, 1, 4, 16, 0, 4, small },
		{ 256, 6, 1, 5, 40, 0, 4, small },
		{ 128, 4, 0, 4, 8, 1, 4, small },
		{ 256, 8, 1, 16, 4, 1, 4, small },
		/* K FP8 with V f16: split and reference kernels, and every position vs dense */
		{ 64, 2, 2, 4, 16, 0, 4, small },
		{ 256, 6, 2, 5, 40, 0, 4, small },
		{ 128, 4, 2, 4, 8, 1, 4, small },
		/* decode at 32K with a 2048-token budget (512 blocks of 4), B1 and B16 */
		{ 128, 4, 0, 4, 512, 0, 2, b1 },
		{ 128, 4, 1, 4, 512, 0, 2, b1 },
		{ 256, 8, 0, 64, 32, 0, 17, b16 },
		{ 128, 8, 1, 4, 512, 0, 17, b16 },
		{ 128, 4, 2, 4, 512, 0, 2, b1 },
		{ 128, 8, 2, 4, 512, 0, 17, b16 },
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		sparse_case(&cases[i]);
}

/* ---- a captured decode step ----------------------------------------------------------------- */

/* The decode step a graph holds: qsa_select, then sparse_attention over its selection. */
struct step {
	struct dbatch db;
	struct sm70_qsa_layer ql;
	struct sm70_kv_layer kv;
	struct sm70_kv_layout lay;
	void *q, *iq, *out;
	int32_t *sel, *n_sel;
	float *scratch;
	int sel_ld, q_ld, iq_ld, n_heads;
};

#define G_HEADS 4
#define G_DIM 64
#define G_RATIO 4
#define G_TOP 64

static void step_ops(struct step *s)
{
	gpu->ops->qsa_select(gpu, s->sel, s->n_sel, s->sel_ld, s->iq, s->iq_ld, &s->ql, G_HEADS,
			     G_DIM, G_RATIO, G_TOP, s->lay.block_size, s->scratch, &s->db.b);
	gpu->ops->sparse_attention(gpu, s->out, s->q, s->q_ld, &s->kv, &s->lay, &s->db.b, s->sel,
				   s->n_sel, s->sel_ld, s->n_heads, 0.125f);
}

/* The step's outputs (out, then n_sel, then sel as floats) on the host. */
static float *step_result(struct step *s, size_t *n)
{
	const size_t nout = (size_t)s->db.b.n_tokens * s->n_heads * s->lay.head_dim;
	const size_t nsel = (size_t)s->db.b.n_tokens * s->sel_ld;
	int32_t *ints = malloc(sizeof(int32_t) * (nsel + s->db.b.n_tokens));
	float *r = fvec(nout + nsel + s->db.b.n_tokens);

	assert_non_null(ints);
	get_act(gpu, r, s->out, nout);
	assert_int_equal(gpu->ops->download(gpu, ints, s->n_sel,
					    sizeof(int32_t) * s->db.b.n_tokens), 0);
	assert_int_equal(gpu->ops->download(gpu, ints + s->db.b.n_tokens, s->sel,
					    sizeof(int32_t) * nsel), 0);
	for (size_t i = 0; i < nsel + s->db.b.n_tokens; i++)
		r[nout + i] = (float)ints[i];
	free(ints);
	*n = nout + nsel + s->db.b.n_tokens;
	return r;
}

/*
 * B4 decodes at up to 12,000 positions in a 16,384-position bucket, captured once: the
 * replay must give the eager run's bits, first on the captured inputs, then after new
 * positions (blocks completed, tails changed), queries and keys are written into the
 * same buffers.
 */
static void test_graph_replay(void **state)
{
	const int len[4] = { 100, 5000, 9000, 12000 }, bs = 16, D = 128, n_kv = 2;
	const struct piece p[4] = { { 0, 99, 1 }, { 1, 4999, 1 }, { 2, 8999, 1 },
				    { 3, 11999, 1 } };
	struct step s;
	struct hworld w;
	struct hbatch hb;
	size_t cache_el, n_comp, n_eager, n_graph;
	float *kv_host, *comp, *qh, *iqh, *r_eager, *r_graph;
	void *graph = NULL;

	memset(&s, 0, sizeof(s));
	hw_make(&w, len, 4, bs, 0);
	hb_make(&hb, &w, p, 4, 4);
	hb.max_pos = 16384; /* the graph's bucket: a fixed scalar */
	s.n_heads = 8;
	s.q_ld = s.n_heads * D;
	s.iq_ld = G_HEADS * G_DIM;
	s.sel_ld = G_TOP * G_RATIO + G_RATIO - 1;
	s.lay = (struct sm70_kv_layout){ SM70_DTYPE_F16, w.n_blocks, bs, n_kv, D,
					 SM70_KV_V_AS_K };
	cache_el = (size_t)w.n_blocks * bs * n_kv * D;
	n_comp = (size_t)w.n_blocks * bs * G_DIM;
	kv_host = rvec16(cache_el, 1.0f);
	s.kv = (struct sm70_kv_layer){ up_act(gpu, kv_host, cache_el), NULL, 1.0f, 1.0f };
	free(kv_host);
	kv_host = rvec16(cache_el, 1.0f);
	s.kv.v = up_act(gpu, kv_host, cache_el);
	free(kv_host);
	comp = fvec(n_comp);
	for (size_t i = 0; i < n_comp; i++)
		comp[i] = rnd(1.0f);
	s.ql.comp = up_bytes(gpu, comp, sizeof(float) * n_comp);
	qh = rvec16((size_t)4 * s.q_ld, 2.5f);
	iqh = rvec16((size_t)4 * s.iq_ld, 1.0f);
	s.q = up_act(gpu, qh, (size_t)4 * s.q_ld);
	s.iq = up_act(gpu, iqh, (size_t)4 * s.iq_ld);
	s.out = balloc(gpu, (size_t)4 * s.n_heads * D * 2);
	s.sel = balloc(gpu, sizeof(int32_t) * 4 * s.sel_ld);
	s.n_sel = balloc(gpu, sizeof(int32_t) * 4);
	s.scratch = balloc(gpu, sizeof(float) * 4 * (16384 / G_RATIO));
	db_up(gpu, &s.db, &hb, &w);

	step_ops(&s);
	r_eager = step_result(&s, &n_eager);
	assert_int_equal(gpu->ops->sync(gpu), 0);
	assert_int_equal(gpu->ops->graph_begin(gpu), 0);
	step_ops(&s);
	assert_int_equal(gpu->ops->graph_end(gpu, &graph), 0);
	assert_int_equal(gpu->ops->graph_launch(gpu, graph), 0);
	r_graph = step_result(&s, &n_graph);
	compare_values("qsa_select + sparse_attention B4: graph vs eager", r_graph, r_eager,
		       n_eager, TOL_EXACT);
	free(r_graph), free(r_eager);

	/* new contents in the same buffers: earlier positions, other queries and keys */
	for (int t = 0; t < 4; t++)
		hb.pos[t] -= 1 + rnd_int(50);
	assert_int_equal(gpu->ops->upload(gpu, s.db.pos, hb.pos, sizeof(int32_t) * 4), 0);
	free(qh), free(iqh);
	qh = rvec16((size_t)4 * s.q_ld, 2.5f);
	iqh = rvec16((size_t)4 * s.iq_ld, 1.0f);
	set_act(gpu, s.q, qh, (size_t)4 * s.q_ld);
	set_act(gpu, s.iq, iqh, (size_t)4 * s.iq_ld);
	for (size_t i = 0; i < n_comp; i++)
		comp[i] = rnd(1.0f);
	assert_int_equal(gpu->ops->upload(gpu, s.ql.comp, comp, sizeof(float) * n_comp), 0);
	step_ops(&s);
	r_eager = step_result(&s, &n_eager);
	assert_int_equal(gpu->ops->sync(gpu), 0);
	assert_int_equal(gpu->ops->graph_launch(gpu, graph), 0);
	r_graph = step_result(&s, &n_graph);
	compare_values("qsa_select + sparse_attention B4, new inputs: replay vs eager", r_graph,
		       r_eager, n_eager, TOL_EXACT);
	gpu->ops->graph_destroy(gpu, graph);
	free(r_graph), free(r_eager), free(qh), free(iqh), free(comp), free(w.bt);
	db_free(gpu, &s.db);
	bfree(gpu, s.kv.k), bfree(gpu, s.kv.v), bfree(gpu, s.ql.comp), bfree(gpu, s.q);
	bfree(gpu, s.iq), bfree(gpu, s.out), bfree(gpu, s.sel), bfree(gpu, s.n_sel);
	bfree(gpu, s.scratch);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_key_write_compress),
		cmocka_unit_test(test_select_exact),
		cmocka_unit_test(test_select_random),
		cmocka_unit_test(test_sparse_attention),
		cmocka_unit_test(test_graph_replay),
	};

	return gpu_test_main("test_cuda_qsa", tests, sizeof(tests) / sizeof(tests[0]), &gpu,
			     &gpu_ref, &cpu);
}
