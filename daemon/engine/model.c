/*
 * model.c - model-independent loading: config, KV cache memory, step workspace, weight
 * helpers shared by the architectures, and the upload/forward/download of one step.
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
	       (size_t)m->cfg.n_kv_heads * (size_t)m->cfg.head_dim *
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

static int alloc_kv(struct sm70_model *m, struct sm70_err *err)
{
	size_t per_block = sm70_model_kv_block_bytes(m);
	size_t layer_bytes;
	long n = m->opts.n_blocks;

	if (n <= 0) {
		n = (long)(m->opts.kv_bytes / per_block);
		if (n < 1)
			return sm70_errf(err, -ENOMEM, "KV cache budget of %zu bytes holds no block "
					 "(one block is %zu bytes)", m->opts.kv_bytes, per_block);
	}
	if (n > INT32_MAX / m->opts.block_size)
		n = INT32_MAX / m->opts.block_size;
	m->kv_lay.dtype = m->opts.kv_dtype;
	m->kv_lay.n_blocks = (int)n;
	m->kv_lay.block_size = m->opts.block_size;
	m->kv_lay.n_kv_heads = m->cfg.n_kv_heads;
	m->kv_lay.head_dim = m->cfg.head_dim;
	/* one block more than the pool: the scratch block padding rows of graphs write to */
	layer_bytes = (size_t)(n + 1) * m->opts.block_size * m->cfg.n_kv_heads * m->cfg.head_dim *
		      sm70_dtype_size(m->opts.kv_dtype);

	m->kv = calloc((size_t)m->cfg.n_layers, sizeof(*m->kv));
	if (!m->kv)
		return -ENOMEM;
	for (int l = 0; l < m->cfg.n_layers; l++) {
		m->kv[l].k = m->be->ops->buf_alloc(m->be, layer_bytes);
		m->kv[l].v = m->be->ops->buf_alloc(m->be, layer_bytes);
		m->kv[l].k_scale = 1.0f;
		m->kv[l].v_scale = 1.0f;
		if (!m->kv[l].k || !m->kv[l].v)
			return sm70_errf(err, -ENOMEM, "cannot allocate the KV cache of layer %d "
					 "(%zu bytes for K and as many for V on %s)", l,
					 layer_bytes, m->be->name);
	}
	return 0;
}

int sm70_model_load(struct sm70_model **out, const struct sm70_ckpt *ck,
		    struct sm70_backend *be, const struct sm70_model_opts *opts,
		    struct sm70_err *err)
{
	struct sm70_model *m;
	struct batch_offsets bo;
	int ret;

	*out = NULL;
	ret = check_opts(opts, err);
	if (ret)
		return ret;
	m = calloc(1, sizeof(*m));
	if (!m)
		return -ENOMEM;
	m->opts = *opts;
	m->be = be;
	ret = sm70_model_config_parse(&m->cfg, sm70_ckpt_config(ck),
				      sm70_ckpt_generation_config(ck), err);
	if (ret)
		goto fail;
	m->arch = arch_for(m->cfg.arch);
	if (!m->arch) {
		ret = sm70_errf(err, -ENOTSUP, "no engine for model_type '%s'", m->cfg.model_type);
		goto fail;
	}
	ret = alloc_kv(m, err);
	if (ret)
		goto fail;
	bo = batch_layout(m);
	m->batch_buf = be->ops->buf_alloc(be, bo.total * sizeof(int32_t));
	m->work = be->ops->buf_alloc(be, m->arch->workspace_bytes(m));
	m->logits = be->ops->buf_alloc(be, (size_t)opts->max_seqs * m->cfg.vocab_size *
					   sizeof(float));
	if (be->ops->sample) {
		m->sample_rows = be->ops->buf_alloc(be, sizeof(*m->sample_rows) *
						    (size_t)opts->max_seqs);
		m->sample_out = be->ops->buf_alloc(be, sizeof(*m->sample_out) *
						   (size_t)opts->max_seqs);
		if (!m->sample_rows || !m->sample_out) {
			ret = sm70_errf(err, -ENOMEM, "cannot allocate sampler buffers on %s",
					be->name);
			goto fail;
		}
	}
	if (!m->batch_buf || !m->work || !m->logits) {
		ret = sm70_errf(err, -ENOMEM, "cannot allocate the step workspace on %s",
				be->name);
		goto fail;
	}
	ret = m->arch->load(m, ck, &m->arch_state, err);
	if (ret)
		goto fail;
	if (be->ops->graph_begin && be->ops->sample) {
		const char *g = getenv("SM70_GRAPHS");
		m->graphs_on = !(g && strcmp(g, "0") == 0);
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

void sm70_model_free(struct sm70_model *m)
{
	struct sm70_backend *be;

	if (!m)
		return;
	be = m->be;
	for (int i = 0; i < m->n_graphs; i++)
		be->ops->graph_destroy(be, m->graphs[i].exec);
	free(m->pad_host);
	if (m->arch && m->arch_state)
		m->arch->unload(m, m->arch_state);
	if (m->kv) {
		for (int l = 0; l < m->cfg.n_layers; l++) {
			be->ops->buf_free(be, m->kv[l].k);
			be->ops->buf_free(be, m->kv[l].v);
		}
		free(m->kv);
	}
	be->ops->buf_free(be, m->sample_out);
	be->ops->buf_free(be, m->sample_rows);
	be->ops->buf_free(be, m->logits);
	be->ops->buf_free(be, m->work);
	be->ops->buf_free(be, m->batch_buf);
	free(m);
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

/* Uploads the step and runs the architecture's forward; logits stay on the backend. */
static int run_step(struct sm70_model *m, const struct sm70_step *st)
{
	struct sm70_backend *be = m->be;
	struct batch_offsets bo = batch_layout(m);
	int32_t *base = m->batch_buf;
	size_t tok_bytes = (size_t)st->n_tokens * sizeof(int32_t);
	int ret;

	ret = check_step(m, st);
	if (ret)
		return ret;
	/* Several small uploads; the CUDA backend stages them on one stream. */
	be->ops->upload(be, base + bo.ids, st->tok_ids, tok_bytes);
	be->ops->upload(be, base + bo.pos, st->tok_pos, tok_bytes);
	be->ops->upload(be, base + bo.seq, st->tok_seq, tok_bytes);
	be->ops->upload(be, base + bo.slot, st->tok_slot, tok_bytes);
	be->ops->upload(be, base + bo.tables, st->block_tables,
			(size_t)st->n_seqs * st->max_blocks * sizeof(int32_t));
	if (st->n_out)
		be->ops->upload(be, base + bo.out, st->out_rows, (size_t)st->n_out * sizeof(int32_t));
	if (st->n_chunks) {
		be->ops->upload(be, base + bo.chunk_first, st->chunk_first,
				(size_t)st->n_chunks * sizeof(int32_t));
		be->ops->upload(be, base + bo.chunk_len, st->chunk_len,
				(size_t)st->n_chunks * sizeof(int32_t));
	}

	m->batch = (struct sm70_batch){
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
	m->arch->forward(m, m->arch_state);
	return 0;
}

int sm70_model_forward(struct sm70_model *m, const struct sm70_step *st, float *host_logits)
{
	struct sm70_backend *be = m->be;
	int ret = run_step(m, st);

	if (ret)
		return ret;
	if (st->n_out) {
		ret = be->ops->download(be, host_logits, m->logits,
					(size_t)st->n_out * m->cfg.vocab_size * sizeof(float));
		if (ret)
			return ret;
	}
	return be->ops->sync(be);
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

/*
 * A decode-only step as a graph replay: the step is padded to B rows (padding rows are
 * greedy, at position 0 of a scratch block) and its context rounded up to a power-of-two
 * bucket, so that every scalar the kernels see is the same at each replay of (B, bucket);
 * only buffer contents change.
 */
static int forward_sample_graph(struct sm70_model *m, const struct sm70_step *st, int B,
				const struct sm70_sample_row *rows,
				struct sm70_sample_result *out)
{
	struct sm70_backend *be = m->be;
	struct batch_offsets bo = batch_layout(m);
	int32_t *h = m->pad_host, *base = m->batch_buf;
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
	be->ops->upload(be, base + bo.ids, h + bo.ids, sizeof(int32_t) * (size_t)B);
	be->ops->upload(be, base + bo.pos, h + bo.pos, sizeof(int32_t) * (size_t)B);
	be->ops->upload(be, base + bo.seq, h + bo.seq, sizeof(int32_t) * (size_t)B);
	be->ops->upload(be, base + bo.slot, h + bo.slot, sizeof(int32_t) * (size_t)B);
	be->ops->upload(be, base + bo.out, h + bo.out, sizeof(int32_t) * (size_t)B);
	be->ops->upload(be, base + bo.tables, h + bo.tables, sizeof(int32_t) * (size_t)B * mb);
	be->ops->upload(be, m->sample_rows, hr, sizeof(*hr) * (size_t)B);

	for (int i = 0; i < m->n_graphs; i++)
		if (m->graphs[i].batch == B && m->graphs[i].bucket == bucket)
			g = &m->graphs[i];
	if (!g) {
		void *exec = NULL;
		if (m->n_graphs == (int)(sizeof(m->graphs) / sizeof(m->graphs[0])))
			return -EAGAIN;
		m->batch = (struct sm70_batch){
			.n_tokens = B, .n_seqs = B, .max_blocks = mb, .max_pos = bucket,
			.tok_ids = base + bo.ids, .tok_pos = base + bo.pos, .tok_seq = base + bo.seq,
			.tok_slot = base + bo.slot, .block_tables = base + bo.tables,
			.n_out = B, .out_rows = base + bo.out, .n_decode = B,
		};
		ret = be->ops->graph_begin(be);
		if (ret)
			return ret;
		m->arch->forward(m, m->arch_state);
		be->ops->sample(be, m->sample_out, m->logits, m->sample_rows, B, m->cfg.vocab_size);
		ret = be->ops->graph_end(be, &exec);
		if (ret)
			return ret;
		g = &m->graphs[m->n_graphs++];
		*g = (struct sm70_graph){ .batch = B, .bucket = bucket, .exec = exec };
		m->graph_captures++;
	}
	ret = be->ops->graph_launch(be, g->exec);
	if (ret)
		return ret;
	m->graph_replays++;
	ret = be->ops->download(be, out, m->sample_out, sizeof(*out) * (size_t)st->n_out);
	if (ret)
		return ret;
	return be->ops->sync(be);
}

int sm70_model_forward_sample(struct sm70_model *m, const struct sm70_step *st,
			      const struct sm70_sample_row *rows, struct sm70_sample_result *out)
{
	struct sm70_backend *be = m->be;
	int B, ret;

	if (!be->ops->sample)
		return -EOPNOTSUPP;
	B = graph_batch(m, st);
	if (B && check_step(m, st) == 0) {
		ret = forward_sample_graph(m, st, B, rows, out);
		if (ret != -EAGAIN)
			return ret;
	}
	ret = run_step(m, st);
	if (ret)
		return ret;
	if (st->n_out) {
		size_t rb = sizeof(*rows) * (size_t)st->n_out;
		be->ops->upload(be, m->sample_rows, rows, rb);
		be->ops->sample(be, m->sample_out, m->logits, m->sample_rows, st->n_out,
				m->cfg.vocab_size);
		ret = be->ops->download(be, out, m->sample_out, sizeof(*out) * (size_t)st->n_out);
		if (ret)
			return ret;
	}
	return be->ops->sync(be);
}

/* ---- weights --------------------------------------------------------------------------- */

static uint64_t splitmix64(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);

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

/* Uniform in [-1, 1). */
static float uniform_pm1(uint64_t *s)
{
	return (float)((double)(splitmix64(s) >> 40) * 0x1p-23 - 1.0);
}

/*
 * Dummy weights: uniform in +-scale, rounded to bf16 (as a real checkpoint would hold),
 * stored as dt. Generated in chunks of DUMMY_CHUNK elements, each seeded by (tensor name,
 * seed, chunk index), so the values do not depend on how many threads made them; the
 * chunks are spread over threads because an 8B-parameter model has 8e9 of them.
 */
#define DUMMY_CHUNK ((size_t)1 << 20)

struct dummy_job {
	void *dst;
	enum sm70_dtype dt;
	size_t count;
	uint64_t seed;
	float scale;
	size_t next_chunk; /* claimed with __atomic_fetch_add */
};

static void dummy_chunk(const struct dummy_job *j, size_t c)
{
	uint64_t s = j->seed ^ (c * 0xd1b54a32d192ed03ull);
	size_t begin = c * DUMMY_CHUNK;
	size_t end = begin + DUMMY_CHUNK < j->count ? begin + DUMMY_CHUNK : j->count;

	for (size_t i = begin; i < end; i++) {
		uint16_t b = sm70_f32_to_bf16(j->scale * uniform_pm1(&s));
		float v = sm70_bf16_to_f32(b);
		if (j->dt == SM70_DTYPE_BF16)
			((uint16_t *)j->dst)[i] = b;
		else if (j->dt == SM70_DTYPE_F16)
			((uint16_t *)j->dst)[i] = sm70_f32_to_f16(v);
		else
			((float *)j->dst)[i] = v;
	}
}

static void *dummy_worker(void *arg)
{
	struct dummy_job *j = arg;
	size_t n_chunks = (j->count + DUMMY_CHUNK - 1) / DUMMY_CHUNK, c;

	while ((c = __atomic_fetch_add(&j->next_chunk, 1, __ATOMIC_RELAXED)) < n_chunks)
		dummy_chunk(j, c);
	return NULL;
}

static void dummy_fill(void *dst, enum sm70_dtype dt, size_t count, const char *name,
		       uint64_t seed, float scale)
{
	struct dummy_job j = { dst, dt, count, name_seed(name, seed), scale, 0 };
	pthread_t th[32];
	long n = sysconf(_SC_NPROCESSORS_ONLN);
	int started = 0;

	if (n > 32)
		n = 32;
	if (count >= 4 * DUMMY_CHUNK)
		for (; started < n - 1; started++)
			if (pthread_create(&th[started], NULL, dummy_worker, &j))
				break;
	dummy_worker(&j); /* the caller works too; alone if threads could not start */
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

int sm70__weight_load(struct sm70_model *m, const struct sm70_ckpt *ck, struct sm70_weight *w,
		      const char *const *names, const int *rows, int n, int cols,
		      struct sm70_err *err)
{
	const struct sm70_st_tensor *t[8];
	enum sm70_dtype dt = SM70_DTYPE_BF16;
	size_t esz, total_rows = 0, off = 0;
	uint8_t *host = NULL;
	int ret = 0;

	if (n < 1 || n > 8)
		return -EINVAL;
	for (int i = 0; i < n; i++) {
		total_rows += (size_t)rows[i];
		if (m->opts.dummy)
			continue;
		int64_t shape[2] = { rows[i], cols };
		ret = sm70_ckpt_get(ck, names[i], 2, shape, &t[i], err);
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
	if (m->be->weight_dtype != SM70_DTYPE_COUNT)
		dt = m->be->weight_dtype;
	esz = sm70_dtype_size(dt);
	host = malloc(total_rows * (size_t)cols * esz);
	if (!host)
		return sm70_errf(err, -ENOMEM, "out of host memory loading %s", names[0]);
	for (int i = 0; i < n; i++) {
		size_t count = (size_t)rows[i] * (size_t)cols;
		if (m->opts.dummy) {
			dummy_fill(host + off, dt, count, names[i], m->opts.dummy_seed,
				   1.0f / sqrtf((float)cols));
		} else if (t[i]->dtype != dt) {
			ret = convert_weight(m, host + off, dt, t[i]->data, t[i]->dtype, count,
					     names[i], err);
			if (ret)
				goto out;
		} else {
			memcpy(host + off, t[i]->data, count * esz);
		}
		off += count * esz;
	}
	w->dtype = dt;
	w->rows = (int)total_rows;
	w->cols = cols;
	w->data = m->be->ops->buf_alloc(m->be, off);
	if (!w->data) {
		ret = sm70_errf(err, -ENOMEM, "cannot allocate %zu bytes on %s for %s", off,
				m->be->name, names[0]);
		goto out;
	}
	ret = m->be->ops->upload(m->be, w->data, host, off);
out:
	free(host);
	return ret;
}

int sm70__norm_load(struct sm70_model *m, const struct sm70_ckpt *ck, float **out,
		    const char *name, int dim, struct sm70_err *err)
{
	const struct sm70_st_tensor *t;
	float *host;
	int ret;

	host = malloc((size_t)dim * sizeof(float));
	if (!host)
		return -ENOMEM;
	if (m->opts.dummy) {
		uint64_t s = name_seed(name, m->opts.dummy_seed);
		for (int i = 0; i < dim; i++)
			host[i] = 1.0f + 0.1f * uniform_pm1(&s);
	} else {
		int64_t shape[1] = { dim };
		ret = sm70_ckpt_get(ck, name, 1, shape, &t, err);
		if (ret)
			goto out;
		sm70_convert_to_f32(host, t->data, t->dtype, (size_t)dim);
	}
	*out = m->be->ops->buf_alloc(m->be, (size_t)dim * sizeof(float));
	if (!*out) {
		ret = -ENOMEM;
		goto out;
	}
	ret = m->be->ops->upload(m->be, *out, host, (size_t)dim * sizeof(float));
out:
	free(host);
	return ret;
}

void sm70__weight_free(struct sm70_model *m, struct sm70_weight *w)
{
	if (w->data)
		m->be->ops->buf_free(m->be, w->data);
	w->data = NULL;
}
