/*
 * test_hc_ple_ops - the CPU qwen4_exp ops (group_rmsnorm, hc_gates, hc_combine, hc_inject,
 * ngram_hist, ple_embed, ple_gate, ple_conv) against float64 and integer references that
 * follow backend.h's formulas directly. The stateful ops run two steps of batches mixing
 * decodes and prefill chunks of several sequences, from dirty slots; their references
 * keep each sequence's whole history by position instead of a window.
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

#define OP_TEST_SEED 0x9c4e11b0a5e5ULL

#include "common/dtype.h"
#include "kernels/backend.h"
#include "tests/unit/op_test.h"
#include "tests/unit/slot_batch.h"

/* ---- helpers ----------------------------------------------------------------------- */

static struct sm70_backend *mk_backend(int threads)
{
	struct sm70_backend *be = cpu_backend(threads);

	assert_non_null(be->ops->group_rmsnorm);
	assert_non_null(be->ops->hc_gates);
	assert_non_null(be->ops->hc_combine);
	assert_non_null(be->ops->hc_inject);
	assert_non_null(be->ops->ngram_hist);
	assert_non_null(be->ops->ple_embed);
	assert_non_null(be->ops->ple_gate);
	assert_non_null(be->ops->ple_conv);
	return be;
}

/* n random floats in [-amp, amp) into backend memory. */
static float *rand_buf(struct sm70_backend *be, size_t n, float amp)
{
	float *p = balloc(be, sizeof(float) * n);

	for (size_t i = 0; i < n; i++)
		p[i] = rnd(amp);
	return p;
}

static double *dvec(size_t n)
{
	double *p = calloc(n ? n : 1, sizeof(double));

	assert_non_null(p);
	return p;
}

static double sigmoid(double v)
{
	return 1.0 / (1.0 + exp(-v));
}

/* ---- group_rmsnorm ------------------------------------------------------------------- */

/* Groups of one row drawn at very different scales, so a norm over the whole row (not
 * the group) would show; odd sizes; x_f32 both ways (on the CPU both are f32); in place. */
static void test_group_rmsnorm(void **state)
{
	struct sm70_backend *be = mk_backend(3);
	const int shapes[][3] = { { 5, 3, 37 }, { 2, 4, 64 }, { 1, 1, 1 }, { 7, 2, 129 } };
	struct errstat e = { 0 };

	for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++) {
		const int n = shapes[si][0], G = shapes[si][1], D = shapes[si][2];
		const size_t cnt = (size_t)n * G * D;
		float *x = balloc(be, sizeof(float) * cnt), *y = balloc(be, sizeof(float) * cnt);
		float *w = rand_buf(be, (size_t)G * D, 1.5f);
		double *ref = dvec(cnt);
		const float eps = 1e-6f;

		for (size_t i = 0; i < cnt; i++)
			x[i] = rnd(1.0f) * (i / D % 3 == 0 ? 1e-3f : i / D % 3 == 1 ? 1.0f : 40.0f);
		for (int i = 0; i < n; i++) {
			for (int g = 0; g < G; g++) {
				const float *xr = x + ((size_t)i * G + g) * D;
				double ss = 0, inv;

				for (int k = 0; k < D; k++)
					ss += (double)xr[k] * xr[k];
				inv = 1.0 / sqrt(ss / D + eps);
				double *r = ref + ((size_t)i * G + g) * D;

				for (int k = 0; k < D; k++)
					r[k] = xr[k] * inv * w[g * D + k];
			}
		}
		be->ops->group_rmsnorm(be, y, x, (int)(si & 1), w, n, G, D, eps);
		cmp_vec(&e, y, ref, cnt);
		be->ops->group_rmsnorm(be, x, x, 1, w, n, G, D, eps);
		assert_memory_equal(x, y, sizeof(float) * cnt);
		free(ref);
		bfree_all(be, w, y, x);
	}
	err_report("group_rmsnorm vs float64 (rel to max |y|)", &e, 1e-6);
	sm70_backend_destroy(be);
}

/* ---- hyper-connections ------------------------------------------------------------------ */

/* hc_gates with and without inject logits; f rows wider than rank + S; logits up to
 * +-30 (silu's tails). */
static void test_hc_gates(void **state)
{
	struct sm70_backend *be = mk_backend(3);
	const int n = 9, rank = 13, S = 3, ld = rank + S + 4;
	float *f = rand_buf(be, (size_t)n * ld, 30.0f);
	float *z = balloc(be, sizeof(float) * (size_t)n * rank);
	float *z2 = balloc(be, sizeof(float) * (size_t)n * rank);
	float *inj = balloc(be, sizeof(float) * (size_t)n * S);
	double *rz = dvec((size_t)n * rank), *ri = dvec((size_t)n * S);
	struct errstat ez = { 0 }, ei = { 0 };

	for (int i = 0; i < n; i++) {
		for (int k = 0; k < rank; k++) {
			const double v = (double)f[i * ld + k] / S;

			rz[i * rank + k] = v * sigmoid(v);
		}
		for (int s = 0; s < S; s++)
			ri[i * S + s] = 2.0 * sigmoid((double)f[i * ld + rank + s] / S);
	}
	be->ops->hc_gates(be, z, inj, f, ld, n, rank, S);
	be->ops->hc_gates(be, z2, NULL, f, ld, n, rank, S);
	cmp_vec(&ez, z, rz, (size_t)n * rank);
	cmp_vec(&ei, inj, ri, (size_t)n * S);
	err_report("hc_gates z vs float64 (rel to max |z|)", &ez, 1e-6);
	err_report("hc_gates inj vs float64 (rel to max |inj|)", &ei, 1e-6);
	assert_memory_equal(z, z2, sizeof(float) * (size_t)n * rank);
	free(rz), free(ri);
	be->ops->buf_free(be, inj), be->ops->buf_free(be, z2), be->ops->buf_free(be, z);
	be->ops->buf_free(be, f);
	sm70_backend_destroy(be);
}

static void test_hc_combine_inject(void **state)
{
	struct sm70_backend *be = mk_backend(3);
	const int shapes[][3] = { { 4, 3, 45 }, { 1, 4, 64 }, { 6, 1, 7 } };
	struct errstat ec = { 0 }, ei = { 0 };

	for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++) {
		const int n = shapes[si][0], S = shapes[si][1], D = shapes[si][2];
		const size_t row = (size_t)S * D, cnt = (size_t)n * row;
		float *u = rand_buf(be, cnt, 8.0f), *xn = rand_buf(be, cnt, 3.0f);
		float *y = balloc(be, sizeof(float) * (size_t)n * D);
		float *x = rand_buf(be, cnt, 4.0f), *inj = rand_buf(be, (size_t)n * S, 2.0f);
		double *ry = dvec((size_t)n * D), *rx = dvec(cnt);

		for (int i = 0; i < n; i++) {
			for (int k = 0; k < D; k++) {
				double acc = 0;

				for (int s = 0; s < S; s++) {
					const size_t e = i * row + s * D + k;

					acc += sigmoid(u[e]) * xn[e];
				}
				ry[(size_t)i * D + k] = acc / S;
			}
		}
		/* the combined row is the injected delta, as in a layer */
		be->ops->hc_combine(be, y, u, xn, n, S, D);
		for (int i = 0; i < n; i++) {
			for (int s = 0; s < S; s++) {
				const double g = inj[i * S + s];

				for (int k = 0; k < D; k++) {
					const size_t e = i * row + s * D + k;

					rx[e] = (double)x[e] + (double)y[i * D + k] * g;
				}
			}
		}
		be->ops->hc_inject(be, x, y, inj, n, S, D);
		cmp_vec(&ec, y, ry, (size_t)n * D);
		cmp_vec(&ei, x, rx, cnt);
		free(ry), free(rx);
		be->ops->buf_free(be, inj), be->ops->buf_free(be, x), be->ops->buf_free(be, y);
		be->ops->buf_free(be, xn), be->ops->buf_free(be, u);
	}
	err_report("hc_combine vs float64 (rel to max |y|)", &ec, 1e-6);
	err_report("hc_inject vs float64 (rel to max |x|)", &ei, 1e-6);
	sm70_backend_destroy(be);
}

/* ---- batches and the sequences behind them ------------------------------------------- */

#define MAXP 128 /* positions a sequence reaches in these tests */
#define N_SLOTS 6

/*
 * Step 1: decodes mid-sequence, at position 0 over a dirty slot and at position 2 (its
 * window reaches before the start); chunks from position 0 over a dirty slot, one shorter
 * than the window mid-sequence, one near the start. Step 2: every sequence goes on, one as
 * a chunk.
 */
static const struct piece step1[] = { { 0, 17, 1 }, { 1, 0, 1 }, { 2, 2, 1 },
				      { 3, 0, 20 }, { 4, 40, 2 }, { 5, 6, 3 } };
static const struct piece step2[] = { { 0, 18, 1 }, { 1, 1, 1 }, { 2, 3, 1 },
				      { 3, 20, 1 }, { 4, 42, 1 }, { 5, 9, 12 } };
/* Two sequences interleaved token by token (no shape: one unit per token). */
static const struct piece step3[] = { { 0, 19, 5 }, { 3, 21, 4 } };

/* The batch of step 0, 1 or 2 above (slot_batch.h), within the references' MAXP. */
static struct tb *step_tb(struct sm70_backend *be, int step)
{
	struct tb *tb = step == 0 ? tb_new(be, step1, 6, 3) :
			step == 1 ? tb_new(be, step2, 6, 5) :
				    tb_new_interleaved(be, step3, 2);

	assert_true(tb->b.max_pos <= MAXP);
	return tb;
}

/* ---- ngram_hist and ple_embed ------------------------------------------------------------ */

#define EOS 49
#define VOCAB 50

/* Every sequence's tokens by position (slot s's sequence is seq_toks[s]). */
static int32_t seq_toks[N_SLOTS + 1][MAXP];

/* A token, EOS about one time in six. */
static int32_t draw_token(void)
{
	return rnd_int(6) == 0 ? EOS : rnd_int(VOCAB - 1);
}

/* Draws the batch's tokens into the sequences and the batch ids. */
static void draw_ids(struct tb *tb)
{
	for (int t = 0; t < tb->b.n_tokens; t++)
		tb->ids[t] = seq_toks[tb_slot(tb, t)][tb->pos[t]] = draw_token();
}

/* The window of the token at position p of toks: w[i] for i < N as backend.h defines it
 * (from the sequence itself, not from hist). */
static void ref_window(const int32_t *toks, int p, int N, int64_t *w)
{
	int open = 1;

	w[0] = toks[p];
	for (int i = 1; i < N; i++) {
		if (p - i < 0 || toks[p - i] == EOS)
			open = 0;
		w[i] = open ? toks[p - i] : EOS;
	}
}

/* The low 64 bits of a * b, through a 128-bit product. */
static uint64_t mul_mod64(uint64_t a, uint64_t b)
{
	return (uint64_t)((unsigned __int128)a * b);
}

/* A PLE table of row_dim values per row in dtype and hash parameters for N and hpn; the
 * last head's rows run past the table. ref: the values as the table holds them. */
struct ple_table {
	struct sm70_ple_hash ph;
	double *ref; /* [rows][row_dim] */
};

static void table_new(struct sm70_backend *be, struct ple_table *pt, int N, int hpn,
		      int row_dim, enum sm70_dtype dt)
{
	static const uint64_t sizes[] = { 37, 41, 43, 47, 53, 59, 61, 67, 71 };
	const int G = (N - 1) * hpn;
	uint64_t *mult = balloc(be, sizeof(uint64_t) * N);
	uint64_t *size = balloc(be, sizeof(uint64_t) * G), *off = balloc(be, sizeof(uint64_t) * G);
	int64_t rows = 0;
	size_t esz = sm70_dtype_size(dt);
	char *tab;

	assert_true(G <= (int)(sizeof(sizes) / sizeof(sizes[0])));
	for (int i = 0; i < N; i++)
		mult[i] = rng_next() | 1; /* large: the products wrap */
	for (int g = 0; g < G; g++) {
		size[g] = sizes[g];
		off[g] = (uint64_t)rows;
		rows += (int64_t)sizes[g];
	}
	rows -= 20; /* the last head's last 20 rows are past the table: zeros */
	pt->ref = dvec((size_t)rows * row_dim);
	tab = balloc(be, (size_t)rows * row_dim * esz);
	for (size_t i = 0; i < (size_t)rows * row_dim; i++) {
		const float v = rnd(2.0f);

		if (dt == SM70_DTYPE_F16) {
			uint16_t h = sm70_f32_to_f16(v);

			memcpy(tab + i * 2, &h, 2);
			pt->ref[i] = sm70_f16_to_f32(h);
		} else if (dt == SM70_DTYPE_BF16) {
			uint16_t h = sm70_f32_to_bf16(v);

			memcpy(tab + i * 2, &h, 2);
			pt->ref[i] = sm70_bf16_to_f32(h);
		} else {
			memcpy(tab + i * 4, &v, 4);
			pt->ref[i] = v;
		}
	}
	pt->ph = (struct sm70_ple_hash){ .ngram = N, .heads_per_ngram = hpn, .eos = EOS,
					 .mult = mult, .size = size, .offset = off, .table = tab,
					 .table_dtype = dt, .rows = rows, .row_dim = row_dim };
}

static void table_free(struct sm70_backend *be, struct ple_table *pt)
{
	bfree_all(be, (void *)pt->ph.table, (void *)pt->ph.offset, (void *)pt->ph.size,
		  (void *)pt->ph.mult);
	free(pt->ref);
}

/* ple_embed of the batch against the rows the sequences' windows hash to; returns how
 * many rows were past the table. */
static int check_embed(struct sm70_backend *be, const struct ple_table *pt, const int32_t *hist,
		       const struct tb *tb)
{
	const struct sm70_ple_hash *ph = &pt->ph;
	const int N = ph->ngram, G = (N - 1) * ph->heads_per_ngram, D = ph->row_dim;
	const int T = tb->b.n_tokens;
	float *out = balloc(be, sizeof(float) * (size_t)T * G * D);
	int past = 0;

	for (size_t i = 0; i < (size_t)T * G * D; i++)
		out[i] = NAN;
	be->ops->ple_embed(be, out, ph, hist, &tb->b);
	for (int t = 0; t < T; t++) {
		int64_t w[8];

		ref_window(seq_toks[tb_slot(tb, t)], tb->pos[t], N, w);
		for (int n = 2; n <= N; n++) {
			uint64_t m = 0;

			for (int i = 0; i < n; i++)
				m ^= mul_mod64((uint64_t)w[i], ph->mult[i]);
			for (int h = 0; h < ph->heads_per_ngram; h++) {
				const int g = (n - 2) * ph->heads_per_ngram + h;
				const uint64_t r = m % ph->size[g] + ph->offset[g];
				const float *o = out + ((size_t)t * G + g) * D;

				past += r >= (uint64_t)ph->rows;
				for (int k = 0; k < D; k++) {
					const double want = r < (uint64_t)ph->rows ?
								    pt->ref[r * D + k] : 0.0;

					/* a copy: exactly the table's value */
					assert_true((double)o[k] == want);
				}
			}
		}
	}
	be->ops->buf_free(be, out);
	return past;
}

/* hist and ctx after a step, against the sequences: hist[t][i] the token at position
 * pos - 1 - i (-1 before 0), ctx the newest n_hist tokens of every slot the batch ran. */
static void check_hist(const int32_t *hist, const int32_t *ctx, int n_hist, const struct tb *tb)
{
	for (int t = 0; t < tb->b.n_tokens; t++) {
		const int32_t *toks = seq_toks[tb_slot(tb, t)];

		for (int i = 0; i < n_hist; i++) {
			const int q = tb->pos[t] - 1 - i;

			assert_int_equal(hist[t * n_hist + i], q < 0 ? -1 : toks[q]);
		}
	}
	for (int s = 0; s < tb->b.n_seqs; s++) {
		const int slot = tb->state[s], last = tb_last_pos(tb, s);

		for (int i = 0; i < n_hist; i++)
			assert_int_equal(ctx[slot * n_hist + i],
					 last - i < 0 ? -1 : seq_toks[slot][last - i]);
	}
}

/*
 * ngram_hist over three steps (two shaped, one interleaved without shape), from contexts
 * that are dirty where a sequence starts at position 0 and hold the sequence's earlier
 * tokens elsewhere; after each step ple_embed for f32, f16 and bf16 tables, N = 3 and 4.
 * Tokens are EOS one time in six, so EOS lands at every place of the windows.
 */
static void test_ngram_hist_ple_embed(void **state)
{
	struct sm70_backend *be = mk_backend(3);
	const struct { int N, hpn, row_dim; } cfg[] = { { 3, 2, 13 }, { 4, 2, 8 }, { 2, 3, 5 } };
	const enum sm70_dtype dts[] = { SM70_DTYPE_F32, SM70_DTYPE_F16, SM70_DTYPE_BF16 };
	int past = 0, eos_in_hist = 0, before_start = 0;

	for (size_t ci = 0; ci < sizeof(cfg) / sizeof(cfg[0]); ci++) {
		const int N = cfg[ci].N, n_hist = N - 1;
		int32_t *ctx = balloc(be, sizeof(int32_t) * (N_SLOTS + 1) * n_hist);
		struct ple_table pt[3];

		for (int d = 0; d < 3; d++)
			table_new(be, &pt[d], N, cfg[ci].hpn, cfg[ci].row_dim, dts[d]);
		/* the sequences' earlier tokens, and ctx as a previous step left it; slots
		 * whose sequence starts at 0 here hold another sequence's tokens */
		for (int s = 0; s <= N_SLOTS; s++) {
			for (int p = 0; p < MAXP; p++)
				seq_toks[s][p] = draw_token();
			for (int i = 0; i < n_hist; i++)
				ctx[s * n_hist + i] = 1000 + rnd_int(1000);
		}
		for (size_t k = 0; k < sizeof(step1) / sizeof(step1[0]); k++) {
			const int slot = step1[k].slot, q0 = step1[k].pos - 1;

			for (int i = 0; i < n_hist && q0 >= 0; i++)
				ctx[slot * n_hist + i] = q0 - i < 0 ? -1 : seq_toks[slot][q0 - i];
		}
		for (int step = 0; step < 3; step++) {
			struct tb *tb = step_tb(be, step);
			const int T = tb->b.n_tokens;
			int32_t *hist = balloc(be, sizeof(int32_t) * (size_t)T * n_hist);

			draw_ids(tb);
			be->ops->ngram_hist(be, hist, ctx, n_hist, &tb->b);
			check_hist(hist, ctx, n_hist, tb);
			for (int i = 0; i < T * n_hist; i++) {
				eos_in_hist += hist[i] == EOS;
				before_start += hist[i] == -1;
			}
			for (int d = 0; d < 3; d++)
				past += check_embed(be, &pt[d], hist, tb);
			be->ops->buf_free(be, hist);
			be->ops->buf_free(be, tb);
		}
		for (int d = 0; d < 3; d++)
			table_free(be, &pt[d]);
		be->ops->buf_free(be, ctx);
	}
	printf("  ngram_hist + ple_embed: %d EOS and %d -1 in the histories, %d rows past the "
	       "table; all exact\n", eos_in_hist, before_start, past);
	assert_true(eos_in_hist > 0 && before_start > 0 && past > 0);
	sm70_backend_destroy(be);
}

/* ---- ple_gate ---------------------------------------------------------------------------- */

/*
 * Random rows, plus streams made to hit the shaping's corners: g == 0 exactly (sigmoid
 * 0.5), tiny g of either sign (clamped to +-sqrt(1e-6) = +-1e-3), g just above the clamp,
 * and a large g.
 */
static void test_ple_gate(void **state)
{
	struct sm70_backend *be = mk_backend(3);
	const int n = 6, S = 3, D = 37, v_ld = 50;
	const size_t cnt = (size_t)n * S * D;
	float *kn = rand_buf(be, cnt, 1.0f), *qn = rand_buf(be, cnt, 1.0f);
	float *v = rand_buf(be, (size_t)n * v_ld, 2.0f), *gv = balloc(be, sizeof(float) * cnt);
	double *ref = dvec(cnt);
	struct errstat e = { 0 };
	const float sd = sqrtf((float)D);

	/* (row, stream) -> the single nonzero product kn * qn at index 0 (0: none) */
	const struct { int i, s; float k, q; } special[] = {
		{ 0, 0, 0.0f, 0.0f },              /* g == 0 */
		{ 1, 1, 1e-5f, 1e-4f },            /* g ~ +1.6e-10 */
		{ 2, 2, -1e-5f, 1e-4f },           /* g ~ -1.6e-10 */
		{ 3, 0, 4e-3f * 1.0f, 1e-3f * sd }, /* g = 4e-6: sqrt -> 2e-3 */
		{ 4, 1, 12.0f, 12.0f },            /* g ~ 23.7 */
	};

	for (size_t k = 0; k < sizeof(special) / sizeof(special[0]); k++) {
		float *kr = kn + ((size_t)special[k].i * S + special[k].s) * D;
		float *qr = qn + ((size_t)special[k].i * S + special[k].s) * D;

		memset(kr, 0, sizeof(float) * D);
		memset(qr, 0, sizeof(float) * D);
		kr[0] = special[k].k;
		qr[0] = special[k].q;
	}
	for (int i = 0; i < n; i++) {
		for (int s = 0; s < S; s++) {
			const size_t o = ((size_t)i * S + s) * D;
			double g = 0, sh;

			for (int k = 0; k < D; k++)
				g += (double)kn[o + k] * qn[o + k];
			g /= sqrt((double)D);
			sh = g > 0 ? sqrt(fmax(g, 1e-6)) : g < 0 ? -sqrt(fmax(-g, 1e-6)) : 0.0;
			for (int k = 0; k < D; k++)
				ref[o + k] = sigmoid(sh) * v[(size_t)i * v_ld + k];
		}
	}
	be->ops->ple_gate(be, gv, kn, qn, v, v_ld, n, S, D);
	cmp_vec(&e, gv, ref, cnt);
	err_report("ple_gate vs float64 (rel to max |gv|)", &e, 1e-6);
	/* g == 0: sigmoid is 0.5 exactly; tiny g is not treated as 0 */
	for (int k = 0; k < D; k++) {
		assert_true(gv[k] == 0.5f * v[k]);
		assert_true(fabs(gv[(1 * S + 1) * D + k] - sigmoid(1e-3) * v[v_ld + k]) <=
			    1e-6 * fabs(v[v_ld + k]));
		assert_true(fabs(gv[(2 * S + 2) * D + k] - sigmoid(-1e-3) * v[2 * v_ld + k]) <=
			    1e-6 * fabs(v[2 * v_ld + k]));
	}
	free(ref);
	be->ops->buf_free(be, gv), be->ops->buf_free(be, v), be->ops->buf_free(be, qn);
	be->ops->buf_free(be, kn);
	sm70_backend_destroy(be);
}

/* ---- ple_conv ---------------------------------------------------------------------------- */

/* A convolution and its float64 mirror: every input of every sequence by position. */
struct conv_case {
	struct sm70_dconv dc; /* state and w in backend memory */
	int R;
	double *in; /* [N_SLOTS + 1][MAXP][C] */
};

static double *case_in(struct conv_case *cc, int slot, int p)
{
	return cc->in + ((size_t)slot * MAXP + p) * cc->dc.channels;
}

static void conv_new(struct sm70_backend *be, struct conv_case *cc, int C, int K, int dil)
{
	const int R = (K - 1) * dil;
	float *st;

	cc->R = R;
	cc->in = dvec((size_t)(N_SLOTS + 1) * MAXP * C);
	cc->dc = (struct sm70_dconv){ .state = NULL, .w = rand_buf(be, (size_t)C * K, 0.7f),
				      .channels = C, .k = K, .dilation = dil };
	st = balloc(be, sizeof(float) * ((size_t)(N_SLOTS + 1) * R * C + 1));
	cc->dc.state = st;
	/* the sequences' earlier inputs; each slot as a previous step left it, except those
	 * of a sequence starting at position 0 in step 1: garbage */
	for (size_t i = 0; i < (size_t)(N_SLOTS + 1) * MAXP * C; i++)
		cc->in[i] = rnd(2.0f);
	for (int s = 0; s <= N_SLOTS; s++) {
		int p0 = -1;

		for (size_t k = 0; k < sizeof(step1) / sizeof(step1[0]); k++)
			if (step1[k].slot == s)
				p0 = step1[k].pos;
		for (int q = 0; q < R; q++) {
			const int p = p0 - R + q; /* the position row q holds */

			for (int c = 0; c < C; c++)
				st[((size_t)s * R + q) * C + c] =
					p0 <= 0 ? 1000.0f + rnd(1.0f) :
					p < 0	? 0.0f : (float)case_in(cc, s, p)[c];
		}
	}
}

static void conv_free(struct sm70_backend *be, struct conv_case *cc)
{
	be->ops->buf_free(be, cc->dc.state);
	be->ops->buf_free(be, (void *)cc->dc.w);
	free(cc->in);
}

/* Draws the batch's inputs (gvn) into the sequences; gv random. */
static void conv_inputs(struct conv_case *cc, const struct tb *tb, float *gv, float *gvn)
{
	const int C = cc->dc.channels;

	for (int t = 0; t < tb->b.n_tokens; t++) {
		double *in = case_in(cc, tb_slot(tb, t), tb->pos[t]);

		for (int c = 0; c < C; c++) {
			gvn[(size_t)t * C + c] = rnd(2.0f);
			in[c] = gvn[(size_t)t * C + c];
			gv[(size_t)t * C + c] = rnd(1.0f);
		}
	}
}

/* x of the batch after the op (ref, from x before it) and the slots it must leave. */
static void conv_ref(struct conv_case *cc, const struct tb *tb, const float *x, const float *gv,
		     double *ref)
{
	const struct sm70_dconv *dc = &cc->dc;
	const int C = dc->channels, K = dc->k;

	for (int t = 0; t < tb->b.n_tokens; t++) {
		for (int c = 0; c < C; c++) {
			double acc = 0;

			for (int j = 0; j < K; j++) {
				const int p = tb->pos[t] - (K - 1 - j) * dc->dilation;

				if (p >= 0)
					acc += dc->w[c * K + j] * case_in(cc, tb_slot(tb, t), p)[c];
			}
			ref[(size_t)t * C + c] = (double)x[(size_t)t * C + c] +
						 gv[(size_t)t * C + c] + acc * sigmoid(acc);
		}
	}
}

/* Every slot the batch ran holds its newest R inputs, exactly. */
static void conv_check_state(struct conv_case *cc, const struct tb *tb)
{
	const int C = cc->dc.channels, R = cc->R;
	const float *st = cc->dc.state;

	for (int s = 0; s < tb->b.n_seqs; s++) {
		const int slot = tb->state[s], last = tb_last_pos(tb, s);

		for (int q = 0; q < R; q++) {
			const int p = last - R + 1 + q;

			for (int c = 0; c < C; c++)
				assert_true((double)st[((size_t)slot * R + q) * C + c] ==
					    (p < 0 ? 0.0 : case_in(cc, slot, p)[c]));
		}
	}
}

/*
 * Three steps (two shaped, one interleaved without shape) for several channel counts
 * (inside one task's block, and across blocks with a partial last one), kernel widths and
 * dilations (window 9 wider than some chunks, 1, and none); x against float64, the slots
 * exactly. The same steps on 1 and 4 threads give the same bits.
 */
static void test_ple_conv(void **state)
{
	struct sm70_backend *be = mk_backend(3), *be1 = mk_backend(1), *be4 = mk_backend(4);
	const int cfg[][3] = { { 77, 4, 3 }, { 300, 4, 3 }, { 16, 2, 1 }, { 9, 1, 1 },
			       { 40, 3, 5 } };
	struct errstat e = { 0 };
	size_t same = 0;

	for (size_t ci = 0; ci < sizeof(cfg) / sizeof(cfg[0]); ci++) {
		const int C = cfg[ci][0];
		struct conv_case cc;

		conv_new(be, &cc, C, cfg[ci][1], cfg[ci][2]);
		for (int step = 0; step < 3; step++) {
			struct tb *tb = step_tb(be, step);
			const size_t cnt = (size_t)tb->b.n_tokens * C;
			const size_t st_bytes = sizeof(float) * (size_t)(N_SLOTS + 1) * cc.R * C;
			float *x = rand_buf(be, cnt, 3.0f), *gv = balloc(be, sizeof(float) * cnt);
			float *gvn = balloc(be, sizeof(float) * cnt);
			float *x1 = balloc(be, sizeof(float) * cnt), *st0 = malloc(st_bytes + 1);
			float *st1 = malloc(st_bytes + 1);
			struct sm70_dconv dc1 = cc.dc;
			double *ref = dvec(cnt);

			assert_non_null(st0);
			assert_non_null(st1);
			conv_inputs(&cc, tb, gv, gvn);
			conv_ref(&cc, tb, x, gv, ref);
			memcpy(x1, x, sizeof(float) * cnt);
			memcpy(st0, cc.dc.state, st_bytes);
			be->ops->ple_conv(be, x, gv, gvn, &cc.dc, &tb->b);
			cmp_vec(&e, x, ref, cnt);
			conv_check_state(&cc, tb);
			/* the same from the same slots on one and on four threads */
			for (int k = 0; k < 2; k++) {
				struct sm70_backend *bt = k ? be4 : be1;
				float *xt = balloc(bt, sizeof(float) * cnt);

				memcpy(xt, x1, sizeof(float) * cnt);
				memcpy(st1, st0, st_bytes);
				dc1.state = st1;
				bt->ops->ple_conv(bt, xt, gv, gvn, &dc1, &tb->b);
				assert_memory_equal(xt, x, sizeof(float) * cnt);
				assert_memory_equal(st1, cc.dc.state, st_bytes);
				same += cnt;
				bt->ops->buf_free(bt, xt);
			}
			free(ref), free(st1), free(st0);
			bfree_all(be, x1, gvn, gv, x, tb);
		}
		conv_free(be, &cc);
	}
	err_report("ple_conv x vs float64 (rel to max |x|)", &e, 1e-6);
	printf("  ple_conv: slots exact; %zu values bitwise equal on 1, 3 and 4 threads\n", same);
	sm70_backend_destroy(be4);
	sm70_backend_destroy(be1);
	sm70_backend_destroy(be);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_group_rmsnorm),
		cmocka_unit_test(test_hc_gates),
		cmocka_unit_test(test_hc_combine_inject),
		cmocka_unit_test(test_ngram_hist_ple_embed),
		cmocka_unit_test(test_ple_gate),
		cmocka_unit_test(test_ple_conv),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
