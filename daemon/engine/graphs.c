/*
 * graphs.c - decode-only steps replayed as captured graphs: one per (padded batch,
 * context bucket) and rank, made on first use. Every scalar a kernel sees is fixed by
 * (batch, bucket); a replay only changes buffer contents (the batch arrays, the sampler
 * rows), so padding rows must be harmless: greedy, at position 0 of the scratch KV block,
 * in the scratch state slot.
 */
#include <errno.h>
#include <string.h>

#include "daemon/engine/model_internal.h"

/* The padded batch size a decode-only step of n sequences replays, or 0 for none. */
int sm70__graph_batch(const struct sm70_model *m, const struct sm70_step *st)
{
	int b = 1;

	if (!m->graphs_on || st->n_tokens != st->n_seqs || st->n_out != st->n_tokens)
		return 0;
	for (int i = 0; i < st->n_out; i++)
		if (st->out_rows[i] != i || st->tok_seq[i] != i)
			return 0;
	while (b < st->n_tokens)
		b *= 2;
	return b <= 16 && b <= m->opts.max_seqs ? b : 0;
}

/* Captures the forward and the sampling work of the batch now in every rank's batch. */
static int capture(struct sm70_model *m, int B, void *exec[])
{
	int ret = 0, begun = 0;

	for (; begun < m->tp; begun++) {
		struct sm70_backend *be = m->rank[begun].be;
		ret = be->ops->graph_begin(be);
		if (ret)
			break;
	}
	if (!ret) {
		m->arch->forward(m);
		sm70__queue_sampling(m, B);
	}
	for (int r = 0; r < begun; r++) {
		struct sm70_backend *be = m->rank[r].be;
		int e = be->ops->graph_end(be, &exec[r]);
		if (e && !ret)
			ret = e;
	}
	return ret;
}

/*
 * A decode-only step as a graph replay: the step is padded to B rows (padding rows are
 * greedy, at position 0 of a scratch block) and its context rounded up to a power-of-two
 * bucket, so that every scalar the kernels see is the same at each replay of (B, bucket);
 * only buffer contents change.
 */
int sm70__forward_graph(struct sm70_model *m, const struct sm70_step *st, int B,
			const struct sm70_sample_row *rows, void *out)
{
	struct sm70__batch_offsets bo = sm70__batch_layout(m);
	int32_t *h = m->pad_host;
	struct sm70_sample_row *hr = (struct sm70_sample_row *)(h + bo.total);
	int bs = m->opts.block_size, scratch = m->kv_lay.n_blocks, bucket = 512, mb, ret;
	struct sm70_graph *g = NULL;

	while (bucket < st->max_pos)
		bucket *= 2;
	if (bucket > m->cfg.max_position)
		bucket = m->cfg.max_position;
	mb = (bucket + bs - 1) / bs;
	if (mb > sm70__max_blocks_per_seq(m) || st->max_blocks > mb)
		return -EAGAIN; /* not replayable: the caller runs it eagerly */

	for (int i = 0; i < B; i++) {
		int real = i < st->n_tokens;
		int32_t *row = h + bo.tables + (size_t)i * mb;

		h[bo.ids + i] = real ? st->tok_ids[i] : 0;
		h[bo.pos + i] = real ? st->tok_pos[i] : 0;
		h[bo.seq + i] = i;
		h[bo.slot + i] = real ? st->tok_slot[i] : scratch * bs;
		h[bo.out + i] = i;
		/* padding rows use the scratch state slot (index n_state_slots) */
		h[bo.state + i] = real && st->seq_state ? st->seq_state[i] : m->n_state_slots;
		memset(row, 0, sizeof(int32_t) * (size_t)mb);
		if (real)
			memcpy(row, st->block_tables + (size_t)i * st->max_blocks,
			       sizeof(int32_t) * (size_t)st->max_blocks);
		else
			row[0] = scratch;
		hr[i] = real ? rows[i] : (struct sm70_sample_row){ .top_p = 1.0f };
	}
	for (int r = 0; r < m->tp; r++) {
		struct sm70_backend *be = m->rank[r].be;
		int32_t *base = m->rank[r].batch_buf;

		be->ops->upload(be, base + bo.ids, h + bo.ids, sizeof(int32_t) * (size_t)B);
		be->ops->upload(be, base + bo.pos, h + bo.pos, sizeof(int32_t) * (size_t)B);
		be->ops->upload(be, base + bo.seq, h + bo.seq, sizeof(int32_t) * (size_t)B);
		be->ops->upload(be, base + bo.slot, h + bo.slot, sizeof(int32_t) * (size_t)B);
		be->ops->upload(be, base + bo.out, h + bo.out, sizeof(int32_t) * (size_t)B);
		if (m->n_state_slots)
			be->ops->upload(be, base + bo.state, h + bo.state,
					sizeof(int32_t) * (size_t)B);
		be->ops->upload(be, base + bo.tables, h + bo.tables,
				sizeof(int32_t) * (size_t)B * mb);
		be->ops->upload(be, m->rank[r].sample_rows, hr, sizeof(*hr) * (size_t)B);
	}

	for (int i = 0; i < m->n_graphs; i++)
		if (m->graphs[i].batch == B && m->graphs[i].bucket == bucket)
			g = &m->graphs[i];
	if (!g) {
		void *exec[SM70_MAX_TP] = { 0 };
		if (m->n_graphs == (int)(sizeof(m->graphs) / sizeof(m->graphs[0])))
			return -EAGAIN;
		for (int r = 0; r < m->tp; r++) {
			int32_t *base = m->rank[r].batch_buf;
			m->rank[r].batch = (struct sm70_batch){
				.n_tokens = B, .n_seqs = B, .max_blocks = mb, .max_pos = bucket,
				.tok_ids = base + bo.ids, .tok_pos = base + bo.pos,
				.tok_seq = base + bo.seq, .tok_slot = base + bo.slot,
				.block_tables = base + bo.tables,
				.n_out = B, .out_rows = base + bo.out, .n_decode = B,
				.seq_state = m->n_state_slots ? base + bo.state : NULL,
			};
		}
		ret = capture(m, B, exec);
		if (ret) {
			for (int r = 0; r < m->tp; r++)
				if (exec[r])
					m->rank[r].be->ops->graph_destroy(m->rank[r].be, exec[r]);
			return ret;
		}
		g = &m->graphs[m->n_graphs++];
		g->batch = B;
		g->bucket = bucket;
		memcpy(g->exec, exec, sizeof(exec));
		m->graph_captures++;
	}
	for (int r = 0; r < m->tp; r++) {
		ret = m->rank[r].be->ops->graph_launch(m->rank[r].be, g->exec[r]);
		if (ret)
			return ret;
	}
	m->graph_replays++;
	return sm70__fetch_sampling(m, st->n_out, out);
}

