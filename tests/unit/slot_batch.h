/*
 * slot_batch.h - the batches the CPU tests of stateful ops (test_gdn_ops, test_hc_ple_ops)
 * run: sequences on recurrent-state slots, decodes first and then prefill chunks, or the
 * sequences' tokens interleaved without that shape. Include it after op_test.h (balloc).
 *
 * Header-only (static inline). Non-goals: KV block tables (test_qsa_ops and test_cpu_ops
 * keep their own paged batches).
 */
#ifndef SM70_TESTS_UNIT_SLOT_BATCH_H
#define SM70_TESTS_UNIT_SLOT_BATCH_H

#define SLOT_MAXT 512
#define SLOT_MAXS 16

/* One sequence of a batch: `len` tokens from position `pos` in state slot `slot`. */
struct piece {
	int slot;
	int pos;
	int len;
};

/* A test batch, in backend memory (the caller frees it with buf_free). b points into it;
 * b.tok_ids at ids, which a test that needs token ids writes. */
struct tb {
	struct sm70_batch b;
	int32_t ids[SLOT_MAXT], pos[SLOT_MAXT], seq[SLOT_MAXT], state[SLOT_MAXS];
	int32_t first[SLOT_MAXS], len[SLOT_MAXS];
};

/* Appends token i of piece s to tb. */
static inline void tb_add(struct tb *tb, const struct piece *p, int s, int i, int *T)
{
	assert_true(*T < SLOT_MAXT);
	tb->pos[*T] = p[s].pos + i;
	tb->seq[*T] = s;
	(*T)++;
}

/* pieces p[0..n), the first n_dec decodes (one token each); with interleave the pieces'
 * tokens alternate (round robin) and the batch has no decode/chunk shape, which the ops
 * take as one unit per token. */
static inline struct tb *tb_build(struct sm70_backend *be, const struct piece *p, int n,
				  int n_dec, int interleave)
{
	struct tb *tb = balloc(be, sizeof(*tb));
	int T = 0, max_pos = 0, max_len = 0;

	assert_true(n <= SLOT_MAXS);
	for (int s = 0; s < n; s++) {
		assert_true(s >= n_dec || p[s].len == 1);
		tb->state[s] = p[s].slot;
		if (p[s].pos + p[s].len > max_pos)
			max_pos = p[s].pos + p[s].len;
		if (p[s].len > max_len)
			max_len = p[s].len;
	}
	if (interleave) {
		for (int i = 0; i < max_len; i++)
			for (int s = 0; s < n; s++)
				if (i < p[s].len)
					tb_add(tb, p, s, i, &T);
	} else {
		for (int s = 0; s < n; s++) {
			if (s >= n_dec) {
				tb->first[s - n_dec] = T;
				tb->len[s - n_dec] = p[s].len;
			}
			for (int i = 0; i < p[s].len; i++)
				tb_add(tb, p, s, i, &T);
		}
	}
	tb->b = (struct sm70_batch){ .n_tokens = T, .n_seqs = n, .max_pos = max_pos,
				     .tok_ids = tb->ids, .tok_pos = tb->pos, .tok_seq = tb->seq,
				     .n_decode = interleave ? 0 : n_dec,
				     .n_chunks = interleave ? 0 : n - n_dec,
				     .chunk_first = tb->first, .chunk_len = tb->len,
				     .chunk_first_host = tb->first, .chunk_len_host = tb->len,
				     .seq_state = tb->state };
	return tb;
}

/* Decodes p[0..n_dec), then chunks p[n_dec..n). */
static inline struct tb *tb_new(struct sm70_backend *be, const struct piece *p, int n,
				int n_dec)
{
	return tb_build(be, p, n, n_dec, 0);
}

/* The tokens of p[0..n) interleaved, no shape. */
static inline struct tb *tb_new_interleaved(struct sm70_backend *be, const struct piece *p,
					    int n)
{
	return tb_build(be, p, n, 0, 1);
}

/* The slot of token t of a test batch (each test sequence keeps its slot). */
static inline int tb_slot(const struct tb *tb, int t)
{
	return tb->state[tb->seq[t]];
}

/* The newest position sequence s reaches in tb, -1 when it has no token there. */
static inline int tb_last_pos(const struct tb *tb, int s)
{
	int last = -1;

	for (int t = 0; t < tb->b.n_tokens; t++)
		if (tb->seq[t] == s && tb->pos[t] > last)
			last = tb->pos[t];
	return last;
}

#endif
