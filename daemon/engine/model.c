/*
 * model.c - model-independent loading: config, the split over tensor-parallel ranks, KV
 * cache memory, step workspace, weight helpers shared by the architectures, and the
 * upload/forward/download of one step on every rank.
 */
#include "daemon/engine/model.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>

/* Offsets (in int32 elements) of the arrays inside the uploaded batch buffer. */
struct batch_offsets {
	size_t ids, pos, seq, slot, tables, out, chunk_first, chunk_len, total;
};

static int max_blocks_per_seq(const struct sm70_model *m)
{
	int by_pos = (m->cfg.max_position + m->opts.block_size - 1) / m->opts.block_size;
	return by_pos < m->kv_lay.n_blocks ? by_pos : m->kv_lay.n_blocks;
}

static struct batch_offsets batch_layout(const struct sm70_model *m)
{
	struct batch_offsets o;
	size_t t = (size_t)m->opts.max_tokens, s = (size_t)m->opts.max_seqs;

	o.ids = 0;
	o.pos = o.ids + t;
	o.seq = o.pos + t;
	o.slot = o.seq + t;
	o.out = o.slot + t;
	o.chunk_first = o.out + s;
	o.chunk_len = o.chunk_first + s;
	o.tables = o.chunk_len + s;
	o.total = o.tables + s * (size_t)max_blocks_per_seq(m);
	return o;
}

size_t sm70_model_kv_block_bytes(const struct sm70_model *m)
{
	return (size_t)m->cfg.n_layers * 2 * (size_t)m->opts.block_size *
	       (size_t)m->kv_lay.n_kv_heads * (size_t)m->cfg.head_dim *
	       sm70_dtype_size(m->opts.kv_dtype);
}

static const struct sm70_arch_ops *arch_for(enum sm70_arch a)
{
	switch (a) {
	case SM70_ARCH_QWEN3:
		return &sm70__arch_qwen3;
	}
	return NULL;
}

static int check_opts(const struct sm70_model_opts *o, struct sm70_err *err)
{
	if (o->max_tokens <= 0 || o->max_seqs <= 0 || o->max_seqs > o->max_tokens)
		return sm70_errf(err, -EINVAL, "max_tokens (%d) and max_seqs (%d) must be positive "
				 "with max_seqs <= max_tokens", o->max_tokens, o->max_seqs);
	if (o->block_size <= 0 || o->block_size > 4096)
		return sm70_errf(err, -EINVAL, "block_size %d out of range 1..4096", o->block_size);
	if (o->kv_dtype != SM70_DTYPE_F32 && o->kv_dtype != SM70_DTYPE_F16 &&
	    o->kv_dtype != SM70_DTYPE_F8E4M3)
		return sm70_errf(err, -EINVAL, "KV cache dtype %s is not supported",
				 sm70_dtype_name(o->kv_dtype));
	return 0;
}

/* Sizes the KV pool (the same block count on every rank: block ids are shared) and
 * allocates each rank's share of it. */
static int alloc_kv(struct sm70_model *m, struct sm70_err *err)
{
	size_t per_block, layer_bytes;
	long n = m->opts.n_blocks;

	m->kv_lay.dtype = m->opts.kv_dtype;
	m->kv_lay.block_size = m->opts.block_size;
	m->kv_lay.n_kv_heads = m->rank[0].kv_heads;
	m->kv_lay.head_dim = m->cfg.head_dim;
	per_block = sm70_model_kv_block_bytes(m);
	if (n <= 0) {
		n = (long)(m->opts.kv_bytes / per_block);
		if (n < 1)
			return sm70_errf(err, -ENOMEM, "KV cache budget of %zu bytes holds no block "
					 "(one block is %zu bytes)", m->opts.kv_bytes, per_block);
	}
	if (n > INT32_MAX / m->opts.block_size)
		n = INT32_MAX / m->opts.block_size;
	m->kv_lay.n_blocks = (int)n;
	/* one block more than the pool: the scratch block padding rows of graphs write to */
	layer_bytes = (size_t)(n + 1) * m->opts.block_size * m->kv_lay.n_kv_heads *
		      m->cfg.head_dim * sm70_dtype_size(m->opts.kv_dtype);

	for (int r = 0; r < m->tp; r++) {
		struct sm70_model_rank *rk = &m->rank[r];
		struct sm70_backend *be = rk->be;

		rk->kv = calloc((size_t)m->cfg.n_layers, sizeof(*rk->kv));
		if (!rk->kv)
			return -ENOMEM;
		for (int l = 0; l < m->cfg.n_layers; l++) {
			rk->kv[l].k = be->ops->buf_alloc(be, layer_bytes);
			rk->kv[l].v = be->ops->buf_alloc(be, layer_bytes);
			rk->kv[l].k_scale = 1.0f;
			rk->kv[l].v_scale = 1.0f;
			if (!rk->kv[l].k || !rk->kv[l].v)
				return sm70_errf(err, -ENOMEM, "cannot allocate the KV cache of "
						 "layer %d (%zu bytes for K and as many for V on %s, "
						 "rank %d)", l, layer_bytes, be->name, r);
		}
	}
	return 0;
}

/* Each rank's share of heads, intermediate rows and vocabulary (struct sm70_model_rank). */
static void split_ranks(struct sm70_model *m)
{
	const struct sm70_model_config *c = &m->cfg;
	int tp = m->tp, vshare = (c->vocab_size + tp - 1) / tp;

	for (int r = 0; r < tp; r++) {
		struct sm70_model_rank *rk = &m->rank[r];

		rk->q_heads = c->n_heads / tp;
		rk->q_head0 = r * rk->q_heads;
		if (c->n_kv_heads >= tp) {
			rk->kv_heads = c->n_kv_heads / tp;
			rk->kv_head0 = r * rk->kv_heads;
		} else {
			/* fewer KV heads than ranks: each rank keeps the one its queries read */
			rk->kv_heads = 1;
			rk->kv_head0 = r * c->n_kv_heads / tp;
		}
		rk->inter = c->intermediate_size / tp;
		rk->vocab0 = r * vshare < c->vocab_size ? r * vshare : c->vocab_size;
		rk->vocab_n = c->vocab_size - rk->vocab0 < vshare ? c->vocab_size - rk->vocab0 :
				vshare;
	}
}

static int check_tp(const struct sm70_model *m, struct sm70_err *err)
{
	const struct sm70_model_config *c = &m->cfg;
	int tp = m->tp;

	if (tp == 1)
		return 0;
	if (c->n_heads % tp)
		return sm70_errf(err, -EINVAL, "tensor parallelism %d needs the attention heads "
				 "(%d) to divide evenly", tp, c->n_heads);
	if (c->n_kv_heads % tp && tp % c->n_kv_heads)
		return sm70_errf(err, -EINVAL, "tensor parallelism %d needs the KV heads (%d) to "
				 "divide evenly or to divide %d", tp, c->n_kv_heads, tp);
	if (c->intermediate_size % tp)
		return sm70_errf(err, -EINVAL, "tensor parallelism %d needs intermediate_size "
				 "(%d) to divide evenly", tp, c->intermediate_size);
	if (c->vocab_size < tp)
		return sm70_errf(err, -EINVAL, "tensor parallelism %d exceeds the vocabulary",
				 tp);
	return m->arch->check_tp ? m->arch->check_tp(m, err) : 0;
}

/* The step buffers of rank r. */
static int alloc_rank(struct sm70_model *m, int r, struct sm70_err *err)
{
	struct sm70_model_rank *rk = &m->rank[r];
	struct sm70_backend *be = rk->be;
	struct batch_offsets bo = batch_layout(m);
	size_t S = (size_t)m->opts.max_seqs;

	rk->batch_buf = be->ops->buf_alloc(be, bo.total * sizeof(int32_t));
	rk->work = be->ops->buf_alloc(be, m->arch->workspace_bytes(m, r));
	rk->logits = be->ops->buf_alloc(be, S * (size_t)rk->vocab_n * sizeof(float));
	if (!rk->batch_buf || !rk->work || !rk->logits)
		return sm70_errf(err, -ENOMEM, "cannot allocate the step workspace on %s (rank "
				 "%d)", be->name, r);
	if ((m->tp == 1 && be->ops->sample) || (m->tp > 1 && be->ops->shard_summary)) {
		rk->sample_rows = be->ops->buf_alloc(be, sizeof(*rk->sample_rows) * S);
		if (m->tp == 1)
			rk->sample_out = be->ops->buf_alloc(be, sizeof(*rk->sample_out) * S);
		else
			rk->shards = be->ops->buf_alloc(be, sizeof(*rk->shards) * S);
		if (!rk->sample_rows || (!rk->sample_out && !rk->shards))
			return sm70_errf(err, -ENOMEM, "cannot allocate sampler buffers on %s "
					 "(rank %d)", be->name, r);
	}
	return 0;
}

int sm70_model_load_tp(struct sm70_model **out, const struct sm70_ckpt *ck,
		       struct sm70_backend *const be[], int tp, struct sm70_comm *comm,
		       const struct sm70_model_opts *opts, struct sm70_err *err)
{
	struct sm70_model *m;
	struct batch_offsets bo;
	const char *env;
	int ret;

	*out = NULL;
	ret = check_opts(opts, err);
	if (ret)
		return ret;
	if (tp < 1 || tp > SM70_MAX_TP)
		return sm70_errf(err, -EINVAL, "tensor parallelism %d out of range 1..%d", tp,
				 SM70_MAX_TP);
	if (tp > 1 && (!comm || comm->n_ranks != tp))
		return sm70_errf(err, -EINVAL, "tensor parallelism %d needs a communicator of %d "
				 "ranks", tp, tp);
	m = calloc(1, sizeof(*m));
	if (!m)
		return -ENOMEM;
	m->opts = *opts;
	m->tp = tp;
	m->comm = tp > 1 ? comm : NULL;
	for (int r = 0; r < tp; r++)
		m->rank[r].be = be[r];
	ret = sm70_model_config_parse(&m->cfg, sm70_ckpt_config(ck),
				      sm70_ckpt_generation_config(ck), err);
	if (ret)
		goto fail;
	m->arch = arch_for(m->cfg.arch);
	if (!m->arch) {
		ret = sm70_errf(err, -ENOTSUP, "no engine for model_type '%s'", m->cfg.model_type);
		goto fail;
	}
	ret = check_tp(m, err);
	if (ret)
		goto fail;
	split_ranks(m);
	ret = alloc_kv(m, err);
	if (ret)
		goto fail;
	for (int r = 0; r < tp; r++) {
		ret = alloc_rank(m, r, err);
		if (ret)
			goto fail;
	}
	for (int r = 0; r < tp; r++) {
		ret = m->arch->load(m, r, ck, &m->rank[r].arch_state, err);
		if (ret)
			goto fail;
	}
	env = getenv("SM70_FUSED");
	/* default: the q/k fusion only; the SwiGLU-into-down fusion measured slower (its
	 * GEMV reads gate and up for every block: docs/PERFORMANCE.md) */
	m->fused = !env || strcmp(env, "qk") == 0 ? SM70_FUSED_QK :
		   strcmp(env, "0") == 0 ? 0 :
		   strcmp(env, "silu") == 0 ? SM70_FUSED_SILU : SM70_FUSED_ALL;
	env = getenv("SM70_BENCH_SKIP_ALLREDUCE");
	m->bench_skip_allreduce = env && strcmp(env, "1") == 0;
	bo = batch_layout(m);
	if (be[0]->ops->graph_begin && (m->rank[0].sample_out || m->rank[0].shards)) {
		env = getenv("SM70_GRAPHS");
		m->graphs_on = !(env && strcmp(env, "0") == 0);
		m->pad_host = malloc(sizeof(int32_t) * bo.total +
				     sizeof(struct sm70_sample_row) * (size_t)opts->max_seqs);
		if (!m->pad_host) {
			ret = -ENOMEM;
			goto fail;
		}
	}
	*out = m;
	return 0;
fail:
	sm70_model_free(m);
	return ret;
}

int sm70_model_load(struct sm70_model **out, const struct sm70_ckpt *ck,
		    struct sm70_backend *be, const struct sm70_model_opts *opts,
		    struct sm70_err *err)
{
	struct sm70_backend *one[1] = { be };

	return sm70_model_load_tp(out, ck, one, 1, NULL, opts, err);
}

void sm70_model_free(struct sm70_model *m)
{
	if (!m)
		return;
	for (int i = 0; i < m->n_graphs; i++)
		for (int r = 0; r < m->tp; r++)
			m->rank[r].be->ops->graph_destroy(m->rank[r].be, m->graphs[i].exec[r]);
	free(m->pad_host);
	for (int r = 0; r < m->tp; r++) {
		struct sm70_model_rank *rk = &m->rank[r];
		struct sm70_backend *be = rk->be;

		if (!be)
			continue;
		if (m->arch && rk->arch_state)
			m->arch->unload(m, r, rk->arch_state);
		if (rk->kv) {
			for (int l = 0; l < m->cfg.n_layers; l++) {
				be->ops->buf_free(be, rk->kv[l].k);
				be->ops->buf_free(be, rk->kv[l].v);
			}
			free(rk->kv);
		}
		be->ops->buf_free(be, rk->shards);
		be->ops->buf_free(be, rk->sample_out);
		be->ops->buf_free(be, rk->sample_rows);
		be->ops->buf_free(be, rk->logits);
		be->ops->buf_free(be, rk->work);
		be->ops->buf_free(be, rk->batch_buf);
	}
	free(m);
}

size_t sm70_model_weight_bytes(const struct sm70_model *m)
{
	size_t n = 0;

	for (int r = 0; r < m->tp; r++)
		n += m->arch->weight_bytes(m, r);
	return n;
}

static int check_step(const struct sm70_model *m, const struct sm70_step *st)
{
	int covered = st->n_decode;

	if (st->n_decode < 0 || st->n_decode > st->n_tokens || st->n_chunks < 0 ||
	    st->n_chunks > m->opts.max_seqs)
		return -EINVAL;
	for (int c = 0; c < st->n_chunks; c++) {
		if (st->chunk_first[c] != covered || st->chunk_len[c] < 1)
			return -EINVAL;
		covered += st->chunk_len[c];
	}
	/* decodes and chunks together are every token, in that order */
	if (covered != st->n_tokens)
		return -EINVAL;
	if (st->n_tokens <= 0 || st->n_tokens > m->opts.max_tokens)
		return -EINVAL;
	if (st->n_seqs <= 0 || st->n_seqs > m->opts.max_seqs)
		return -EINVAL;
	if (st->n_out < 0 || st->n_out > m->opts.max_seqs)
		return -EINVAL;
	if (st->max_blocks <= 0 || st->max_blocks > max_blocks_per_seq(m))
		return -EINVAL;
	if (st->max_pos <= 0 || st->max_pos > m->cfg.max_position)
		return -EINVAL;
	return 0;
}

/* Uploads the step to every rank and runs the architecture's forward; logits stay on the
 * ranks. */
static int run_step(struct sm70_model *m, const struct sm70_step *st)
{
	struct batch_offsets bo = batch_layout(m);
	size_t tok_bytes = (size_t)st->n_tokens * sizeof(int32_t);
	int ret;

	ret = check_step(m, st);
	if (ret)
		return ret;
	for (int r = 0; r < m->tp; r++) {
		struct sm70_backend *be = m->rank[r].be;
		int32_t *base = m->rank[r].batch_buf;

		/* Several small uploads; the CUDA backend stages them on one stream. */
		be->ops->upload(be, base + bo.ids, st->tok_ids, tok_bytes);
		be->ops->upload(be, base + bo.pos, st->tok_pos, tok_bytes);
		be->ops->upload(be, base + bo.seq, st->tok_seq, tok_bytes);
		be->ops->upload(be, base + bo.slot, st->tok_slot, tok_bytes);
		be->ops->upload(be, base + bo.tables, st->block_tables,
				(size_t)st->n_seqs * st->max_blocks * sizeof(int32_t));
		if (st->n_out)
			be->ops->upload(be, base + bo.out, st->out_rows,
					(size_t)st->n_out * sizeof(int32_t));
		if (st->n_chunks) {
			be->ops->upload(be, base + bo.chunk_first, st->chunk_first,
					(size_t)st->n_chunks * sizeof(int32_t));
			be->ops->upload(be, base + bo.chunk_len, st->chunk_len,
					(size_t)st->n_chunks * sizeof(int32_t));
		}
		m->rank[r].batch = (struct sm70_batch){
			.n_tokens = st->n_tokens,
			.n_seqs = st->n_seqs,
			.max_blocks = st->max_blocks,
			.max_pos = st->max_pos,
			.tok_ids = base + bo.ids,
			.tok_pos = base + bo.pos,
			.tok_seq = base + bo.seq,
			.tok_slot = base + bo.slot,
			.block_tables = base + bo.tables,
			.n_out = st->n_out,
			.out_rows = base + bo.out,
			.n_decode = st->n_decode,
			.n_chunks = st->n_chunks,
			.chunk_first = base + bo.chunk_first,
			.chunk_len = base + bo.chunk_len,
			.chunk_first_host = st->chunk_first,
			.chunk_len_host = st->chunk_len,
		};
	}
	m->arch->forward(m);
	return 0;
}

/* Waits for every rank; returns the first error. */
static int sync_all(struct sm70_model *m)
{
	int ret = 0;

	for (int r = 0; r < m->tp; r++) {
		int e = m->rank[r].be->ops->sync(m->rank[r].be);
		if (e && !ret)
			ret = e;
	}
	return ret;
}

int sm70_model_row_logits(struct sm70_model *m, int i, float *host)
{
	for (int r = 0; r < m->tp; r++) {
		struct sm70_model_rank *rk = &m->rank[r];
		int ret = rk->be->ops->download(rk->be, host + rk->vocab0,
						rk->logits + (size_t)i * rk->vocab_n,
						(size_t)rk->vocab_n * sizeof(float));
		if (ret)
			return ret;
	}
	return sync_all(m);
}

int sm70_model_forward(struct sm70_model *m, const struct sm70_step *st, float *host_logits)
{
	int ret = run_step(m, st);

	if (ret)
		return ret;
	if (m->tp == 1 && st->n_out) {
		struct sm70_backend *be = m->rank[0].be;
		ret = be->ops->download(be, host_logits, m->rank[0].logits,
					(size_t)st->n_out * m->cfg.vocab_size * sizeof(float));
		if (ret)
			return ret;
		return be->ops->sync(be);
	}
	for (int i = 0; i < st->n_out; i++) {
		ret = sm70_model_row_logits(m, i, host_logits + (size_t)i * m->cfg.vocab_size);
		if (ret)
			return ret;
	}
	return sync_all(m);
}

/* The padded batch size a decode-only step of n sequences replays, or 0 for none. */
static int graph_batch(const struct sm70_model *m, const struct sm70_step *st)
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

/* The sampling work that follows the forward on each rank: the device sampler with one
 * rank, the slice summaries with several. */
static void queue_sampling(struct sm70_model *m, int n)
{
	for (int r = 0; r < m->tp; r++) {
		struct sm70_model_rank *rk = &m->rank[r];

		if (m->tp == 1)
			rk->be->ops->sample(rk->be, rk->sample_out, rk->logits, rk->sample_rows, n,
					    m->cfg.vocab_size);
		else
			rk->be->ops->shard_summary(rk->be, rk->shards, rk->logits,
						   rk->sample_rows, n, rk->vocab_n, rk->vocab0);
	}
}

/* Downloads the sampling results of n rows: results (one rank) or summaries (out[r * n
 * + i], one copy per rank). */
static int fetch_sampling(struct sm70_model *m, int n, void *out)
{
	int ret;

	if (m->tp == 1) {
		struct sm70_model_rank *rk = &m->rank[0];
		ret = rk->be->ops->download(rk->be, out, rk->sample_out,
					    sizeof(*rk->sample_out) * (size_t)n);
		if (ret)
			return ret;
		return sync_all(m);
	}
	for (int r = 0; r < m->tp; r++) {
		struct sm70_model_rank *rk = &m->rank[r];
		struct sm70_shard_summary *dst = out;
		ret = rk->be->ops->download(rk->be, dst + (size_t)r * n, rk->shards,
					    sizeof(*dst) * (size_t)n);
		if (ret)
			return ret;
	}
	return sync_all(m);
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
		queue_sampling(m, B);
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
static int forward_graph(struct sm70_model *m, const struct sm70_step *st, int B,
			 const struct sm70_sample_row *rows, void *out)
{
	struct batch_offsets bo = batch_layout(m);
	int32_t *h = m->pad_host;
	struct sm70_sample_row *hr = (struct sm70_sample_row *)(h + bo.total);
	int bs = m->opts.block_size, scratch = m->kv_lay.n_blocks, bucket = 512, mb, ret;
	struct sm70_graph *g = NULL;

	while (bucket < st->max_pos)
		bucket *= 2;
	if (bucket > m->cfg.max_position)
		bucket = m->cfg.max_position;
	mb = (bucket + bs - 1) / bs;
	if (mb > max_blocks_per_seq(m) || st->max_blocks > mb)
		return -EAGAIN; /* not replayable: the caller runs it eagerly */

	for (int i = 0; i < B; i++) {
		int real = i < st->n_tokens;
		int32_t *row = h + bo.tables + (size_t)i * mb;

		h[bo.ids + i] = real ? st->tok_ids[i] : 0;
		h[bo.pos + i] = real ? st->tok_pos[i] : 0;
		h[bo.seq + i] = i;
		h[bo.slot + i] = real ? st->tok_slot[i] : scratch * bs;
		h[bo.out + i] = i;
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
	return fetch_sampling(m, st->n_out, out);
}

/* A step whose sampling work runs on the ranks: replayed when it can be, else eager. */
static int forward_sampled(struct sm70_model *m, const struct sm70_step *st,
			   const struct sm70_sample_row *rows, void *out)
{
	int B, ret;

	B = graph_batch(m, st);
	if (B && check_step(m, st) == 0) {
		ret = forward_graph(m, st, B, rows, out);
		if (ret != -EAGAIN)
			return ret;
	}
	ret = run_step(m, st);
	if (ret)
		return ret;
	if (!st->n_out)
		return sync_all(m);
	for (int r = 0; r < m->tp; r++) {
		struct sm70_backend *be = m->rank[r].be;
		be->ops->upload(be, m->rank[r].sample_rows, rows, sizeof(*rows) * (size_t)st->n_out);
	}
	queue_sampling(m, st->n_out);
	return fetch_sampling(m, st->n_out, out);
}

int sm70_model_forward_sample(struct sm70_model *m, const struct sm70_step *st,
			      const struct sm70_sample_row *rows, struct sm70_sample_result *out)
{
	if (m->tp != 1 || !m->rank[0].sample_out)
		return -EOPNOTSUPP;
	return forward_sampled(m, st, rows, out);
}

int sm70_model_forward_shards(struct sm70_model *m, const struct sm70_step *st,
			      const struct sm70_sample_row *rows,
			      struct sm70_shard_summary *out)
{
	if (m->tp < 2 || !m->rank[0].shards)
		return -EOPNOTSUPP;
	return forward_sampled(m, st, rows, out);
}

/* ---- weights --------------------------------------------------------------------------- */

/* The splitmix64 finaliser. */
static uint64_t mix64(uint64_t z)
{
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static uint64_t name_seed(const char *name, uint64_t seed)
{
	uint64_t h = 0xcbf29ce484222325ull ^ seed; /* FNV-1a */

	for (; *name; name++)
		h = (h ^ (unsigned char)*name) * 0x100000001b3ull;
	return h;
}

/* The dummy value of element i of a tensor seeded with s: uniform in [-1, 1). */
static float dummy_at(uint64_t s, uint64_t i)
{
	uint64_t z = mix64(s + (i + 1) * 0x9e3779b97f4a7c15ull);

	return (float)((double)(z >> 40) * 0x1p-23 - 1.0);
}

/*
 * Dummy weights: a [rows, cols] window at (row0, col0) of a tensor with full_cols columns,
 * each value scale * dummy_at(seed, flat index), rounded to bf16 (as a real checkpoint
 * would hold) and stored as dt. Rows are spread over threads, because an 8B-parameter
 * model has 8e9 values; the values do not depend on the thread count.
 */
struct dummy_job {
	void *dst;
	enum sm70_dtype dt;
	uint64_t seed;
	float scale;
	size_t full_cols, row0, rows, col0, cols;
	size_t next_row; /* claimed in bands with __atomic_fetch_add */
};

#define DUMMY_BAND 16

static void dummy_rows(const struct dummy_job *j, size_t r0, size_t r1)
{
	for (size_t r = r0; r < r1; r++) {
		uint64_t base = (uint64_t)(j->row0 + r) * j->full_cols + j->col0;

		for (size_t c = 0; c < j->cols; c++) {
			size_t i = r * j->cols + c;
			uint16_t b = sm70_f32_to_bf16(j->scale * dummy_at(j->seed, base + c));
			float v = sm70_bf16_to_f32(b);
			if (j->dt == SM70_DTYPE_BF16)
				((uint16_t *)j->dst)[i] = b;
			else if (j->dt == SM70_DTYPE_F16)
				((uint16_t *)j->dst)[i] = sm70_f32_to_f16(v);
			else
				((float *)j->dst)[i] = v;
		}
	}
}

static void *dummy_worker(void *arg)
{
	struct dummy_job *j = arg;
	size_t r;

	while ((r = __atomic_fetch_add(&j->next_row, DUMMY_BAND, __ATOMIC_RELAXED)) < j->rows)
		dummy_rows(j, r, r + DUMMY_BAND < j->rows ? r + DUMMY_BAND : j->rows);
	return NULL;
}

static void dummy_fill(struct dummy_job *j)
{
	pthread_t th[32];
	long n = sysconf(_SC_NPROCESSORS_ONLN);
	int started = 0;

	if (n > 32)
		n = 32;
	if (j->rows * j->cols >= ((size_t)4 << 20))
		for (; started < n - 1; started++)
			if (pthread_create(&th[started], NULL, dummy_worker, j))
				break;
	dummy_worker(j); /* the caller works too; alone if threads could not start */
	for (int i = 0; i < started; i++)
		pthread_join(th[i], NULL);
}

/*
 * Converts count elements of src (src_dt) into dst (dt), in chunks through an f32
 * buffer. Values beyond the f16 range are clamped to +-65504 and counted in
 * m->clamped_values (bf16 checkpoints can hold them).
 */
static int convert_weight(struct sm70_model *m, void *dst, enum sm70_dtype dt, const void *src,
			  enum sm70_dtype src_dt, size_t count, const char *name,
			  struct sm70_err *err)
{
	enum { CHUNK = 4096 };
	float buf[CHUNK];
	size_t src_esz = sm70_dtype_size(src_dt), dst_esz = sm70_dtype_size(dt);

	for (size_t i = 0; i < count; i += CHUNK) {
		size_t n = count - i < CHUNK ? count - i : CHUNK;
		char *d = (char *)dst + i * dst_esz;

		sm70_convert_to_f32(buf, (const char *)src + i * src_esz, src_dt, n);
		for (size_t k = 0; k < n; k++) {
			float v = buf[k];
			uint16_t h;
			switch (dt) {
			case SM70_DTYPE_F32:
				memcpy(d + 4 * k, &v, 4);
				break;
			case SM70_DTYPE_F16:
				if (v > 65504.0f || v < -65504.0f) {
					v = v > 0 ? 65504.0f : -65504.0f;
					m->clamped_values++;
				}
				h = sm70_f32_to_f16(v);
				memcpy(d + 2 * k, &h, 2);
				break;
			case SM70_DTYPE_BF16:
				h = sm70_f32_to_bf16(v);
				memcpy(d + 2 * k, &h, 2);
				break;
			default:
				return sm70_errf(err, -EINVAL, "cannot store %s as %s", name,
						 sm70_dtype_name(dt));
			}
		}
	}
	return 0;
}

/* Copies the window of part p (rows x cols at col0) of tensor t into dst as dt. */
static int copy_window(struct sm70_model *m, void *dst, enum sm70_dtype dt,
		       const struct sm70_st_tensor *t, const struct sm70_weight_part *p,
		       int full_cols, int col0, int cols, struct sm70_err *err)
{
	size_t src_esz = sm70_dtype_size(t->dtype), dst_esz = sm70_dtype_size(dt);
	int whole_rows = col0 == 0 && cols == full_cols;
	/* whole rows are one contiguous run; a column window is one run per row */
	int runs = whole_rows ? 1 : p->rows;
	size_t run = whole_rows ? (size_t)p->rows * cols : (size_t)cols;

	for (int i = 0; i < runs; i++) {
		const char *src = (const char *)t->data +
				  (((size_t)p->row0 + i) * full_cols + col0) * src_esz;
		char *d = (char *)dst + (size_t)i * run * dst_esz;
		int ret;

		if (t->dtype == dt) {
			memcpy(d, src, run * dst_esz);
			continue;
		}
		ret = convert_weight(m, d, dt, src, t->dtype, run, p->name, err);
		if (ret)
			return ret;
	}
	return 0;
}

int sm70__weight_load(struct sm70_model *m, int r, const struct sm70_ckpt *ck,
		      struct sm70_weight *w, const struct sm70_weight_part *parts, int n,
		      int full_cols, int col0, int cols, struct sm70_err *err)
{
	struct sm70_backend *be = m->rank[r].be;
	const struct sm70_st_tensor *t[8];
	enum sm70_dtype dt = SM70_DTYPE_BF16;
	size_t esz, total_rows = 0, off = 0;
	uint8_t *host = NULL;
	int ret = 0;

	if (n < 1 || n > 8 || col0 < 0 || cols < 1 || col0 + cols > full_cols)
		return -EINVAL;
	for (int i = 0; i < n; i++) {
		if (parts[i].row0 < 0 || parts[i].rows < 1 ||
		    parts[i].row0 + parts[i].rows > parts[i].full_rows)
			return -EINVAL;
		total_rows += (size_t)parts[i].rows;
		if (m->opts.dummy)
			continue;
		int64_t shape[2] = { parts[i].full_rows, full_cols };
		ret = sm70_ckpt_get(ck, parts[i].name, 2, shape, &t[i], err);
		if (ret)
			return ret;
	}
	/* Stacked tensors keep their dtype when they agree, else become f32; a backend that
	 * wants one weight dtype gets that. */
	if (!m->opts.dummy) {
		dt = t[0]->dtype;
		for (int i = 1; i < n; i++)
			if (t[i]->dtype != dt)
				dt = SM70_DTYPE_F32;
	}
	if (be->weight_dtype != SM70_DTYPE_COUNT)
		dt = be->weight_dtype;
	esz = sm70_dtype_size(dt);
	host = malloc(total_rows * (size_t)cols * esz);
	if (!host)
		return sm70_errf(err, -ENOMEM, "out of host memory loading %s", parts[0].name);
	for (int i = 0; i < n; i++) {
		size_t count = (size_t)parts[i].rows * (size_t)cols;
		if (m->opts.dummy) {
			struct dummy_job j = {
				.dst = host + off, .dt = dt,
				.seed = name_seed(parts[i].name, m->opts.dummy_seed),
				.scale = 1.0f / sqrtf((float)full_cols),
				.full_cols = (size_t)full_cols, .row0 = (size_t)parts[i].row0,
				.rows = (size_t)parts[i].rows, .col0 = (size_t)col0,
				.cols = (size_t)cols,
			};
			dummy_fill(&j);
		} else {
			ret = copy_window(m, host + off, dt, t[i], &parts[i], full_cols, col0, cols,
					  err);
			if (ret)
				goto out;
		}
		off += count * esz;
	}
	w->dtype = dt;
	w->rows = (int)total_rows;
	w->cols = cols;
	w->data = be->ops->buf_alloc(be, off);
	if (!w->data) {
		ret = sm70_errf(err, -ENOMEM, "cannot allocate %zu bytes on %s (rank %d) for %s",
				off, be->name, r, parts[0].name);
		goto out;
	}
	ret = be->ops->upload(be, w->data, host, off);
out:
	free(host);
	return ret;
}

int sm70__norm_load(struct sm70_model *m, int r, const struct sm70_ckpt *ck, float **out,
		    const char *name, int dim, struct sm70_err *err)
{
	struct sm70_backend *be = m->rank[r].be;
	const struct sm70_st_tensor *t;
	float *host;
	int ret;

	host = malloc((size_t)dim * sizeof(float));
	if (!host)
		return -ENOMEM;
	if (m->opts.dummy) {
		uint64_t s = name_seed(name, m->opts.dummy_seed);
		for (int i = 0; i < dim; i++)
			host[i] = 1.0f + 0.1f * dummy_at(s, (uint64_t)i);
	} else {
		int64_t shape[1] = { dim };
		ret = sm70_ckpt_get(ck, name, 1, shape, &t, err);
		if (ret)
			goto out;
		sm70_convert_to_f32(host, t->data, t->dtype, (size_t)dim);
	}
	*out = be->ops->buf_alloc(be, (size_t)dim * sizeof(float));
	if (!*out) {
		ret = -ENOMEM;
		goto out;
	}
	ret = be->ops->upload(be, *out, host, (size_t)dim * sizeof(float));
out:
	free(host);
	return ret;
}

void sm70__weight_free(struct sm70_model *m, int r, struct sm70_weight *w)
{
	if (w->data)
		m->rank[r].be->ops->buf_free(m->rank[r].be, w->data);
	w->data = NULL;
}
