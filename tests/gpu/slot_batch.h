/*
 * slot_batch.h - the batches the GPU tests of stateful ops (test_cuda_gdn, test_cuda_hc_ple)
 * run: sequences on recurrent-state slots, decodes first and then prefill chunks, as a host
 * description and its backend copy. Include it after gpu_test.h (up_bytes, bfree).
 *
 * Header-only (static inline). Token ids are zero; a test that needs ids writes them.
 * Non-goals: KV block tables (test_cuda_qsa keeps its own paged batches).
 */
#ifndef SM70_TESTS_GPU_SLOT_BATCH_H
#define SM70_TESTS_GPU_SLOT_BATCH_H

#include <string.h>

#define SLOT_MAXT 1024
#define SLOT_MAXS 32

/* One sequence of a step: its slot, the position of its first token here, its tokens
 * (1 for a decode). */
struct seqspec {
	int slot, pos0, len;
};

struct hbatch {
	int n_tokens, n_seqs, n_decode, n_chunks, max_pos;
	int32_t ids[SLOT_MAXT], pos[SLOT_MAXT], seq[SLOT_MAXT], zero[SLOT_MAXT];
	int32_t seq_state[SLOT_MAXS], first[SLOT_MAXS], len[SLOT_MAXS];
};

/* Decodes sp[0..n_dec) (one token each) first, then chunks sp[n_dec..n_dec+n_ch). With
 * shaped = 0 the batch carries no decode/chunk shape (the tokens stay grouped by
 * sequence: the ops' fallback). */
static inline void hb_make(struct hbatch *hb, const struct seqspec *sp, int n_dec, int n_ch,
			   int shaped)
{
	int t = 0;

	memset(hb, 0, sizeof(*hb));
	hb->n_seqs = n_dec + n_ch;
	assert_true(hb->n_seqs <= SLOT_MAXS);
	for (int s = 0; s < hb->n_seqs; s++) {
		const int len = s < n_dec ? 1 : sp[s].len;

		hb->seq_state[s] = sp[s].slot;
		if (s >= n_dec) {
			hb->first[s - n_dec] = t;
			hb->len[s - n_dec] = len;
		}
		for (int i = 0; i < len; i++, t++) {
			assert_true(t < SLOT_MAXT);
			hb->pos[t] = sp[s].pos0 + i;
			hb->seq[t] = s;
			if (hb->pos[t] + 1 > hb->max_pos)
				hb->max_pos = hb->pos[t] + 1;
		}
	}
	hb->n_tokens = t;
	hb->n_decode = shaped ? n_dec : 0;
	hb->n_chunks = shaped ? n_ch : 0;
}

/* A batch in backend memory: b points into buf, which db_free releases. */
struct dbatch {
	struct sm70_batch b;
	int32_t *buf;
};

static inline void db_up(struct sm70_backend *be, const struct hbatch *hb, struct dbatch *d)
{
	const int T = hb->n_tokens, S = hb->n_seqs, C = hb->n_chunks;
	const size_t n = 4 * (size_t)T + S + 2 * (size_t)(C ? C : 1);
	int32_t *h = calloc(n, sizeof(int32_t));

	assert_non_null(h);
	memcpy(h, hb->ids, T * 4);
	memcpy(h + T, hb->pos, T * 4);
	memcpy(h + 2 * T, hb->seq, T * 4);
	memcpy(h + 3 * T, hb->zero, T * 4); /* KV slots: unused by these ops */
	memcpy(h + 4 * T, hb->seq_state, S * 4);
	memcpy(h + 4 * T + S, hb->first, C * 4);
	memcpy(h + 4 * T + S + C, hb->len, C * 4);
	d->buf = up_bytes(be, h, n * 4);
	d->b = (struct sm70_batch){
		.n_tokens = T, .n_seqs = S, .max_blocks = 1, .max_pos = hb->max_pos,
		.tok_ids = d->buf, .tok_pos = d->buf + T, .tok_seq = d->buf + 2 * T,
		.tok_slot = d->buf + 3 * T, .block_tables = d->buf + 3 * T, .n_out = 0,
		.out_rows = NULL, .n_decode = hb->n_decode, .n_chunks = C,
		.chunk_first = d->buf + 4 * T + S, .chunk_len = d->buf + 4 * T + S + C,
		.chunk_first_host = hb->first, .chunk_len_host = hb->len,
		.seq_state = d->buf + 4 * T,
	};
	free(h);
}

static inline void db_free(struct sm70_backend *be, struct dbatch *d)
{
	bfree(be, d->buf);
}

#endif
