/*
 * model.c - model-independent loading: config, the split over tensor-parallel ranks, the
 * sequence memory (paged KV for attention layers, state slots for recurrent ones), step
 * workspace, and the upload/forward/download of one eager step on every rank. Weights
 * are weights.c's, captured decode steps graphs.c's, the layers layers.c's.
 */
#include "common/words.h"
#include "daemon/engine/model_internal.h"
#include "daemon/engine/ple.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>

int sm70__max_blocks_per_seq(const struct sm70_model *m)
{
	int by_pos = (m->cfg.max_position + m->opts.block_size - 1) / m->opts.block_size;
	return by_pos < m->kv_lay.n_blocks ? by_pos : m->kv_lay.n_blocks;
}

struct sm70__batch_offsets sm70__batch_layout(const struct sm70_model *m)
{
	struct sm70__batch_offsets o;
	size_t t = (size_t)m->opts.max_tokens, s = (size_t)m->opts.max_seqs;

	o.ids = 0;
	o.pos = o.ids + t;
	o.seq = o.pos + t;
	o.slot = o.seq + t;
	o.out = o.slot + t;
	o.chunk_first = o.out + s;
	o.chunk_len = o.chunk_first + s;
	o.state = o.chunk_len + s;
	o.tables = o.state + s;
	o.total = o.tables + s * (size_t)sm70__max_blocks_per_seq(m);
	return o;
}

/* QSA's indexer cache per token and attention layer: raw and compressed keys, f32. */
static size_t qsa_token_bytes(const struct sm70_model *m)
{
	return m->cfg.arch == SM70_ARCH_QWEN4_EXP ? 2 * (size_t)m->cfg.q4.idx_dim * sizeof(float) :
						    0;
}

/* One token's K and V bytes on one rank, for one attention layer. */
static size_t kv_token_bytes(const struct sm70_model *m)
{
	size_t el = sm70_dtype_size(m->kv_lay.dtype) + sm70_dtype_size(sm70_kv_v_dtype(&m->kv_lay));

	return (size_t)m->kv_lay.n_kv_heads * (size_t)m->cfg.head_dim * el;
}

size_t sm70_model_kv_block_bytes(const struct sm70_model *m)
{
	return (size_t)m->cfg.n_attn_layers * (size_t)m->opts.block_size *
	       (kv_token_bytes(m) + qsa_token_bytes(m));
}

/* One slot of rank r's recurrent layers: conv window (act) and delta-rule state (f32). */
static size_t rank_slot_bytes(const struct sm70_model *m, int r)
{
	const struct sm70_state_layout *L = &m->rank[r].state_lay;
	size_t act = sm70_dtype_size(m->rank[r].be->act_dtype);

	const struct sm70_qwen4_config *q = &m->cfg.q4;
	size_t ple = (size_t)(q->ple_conv_k - 1) * q->ngram * q->hc * m->cfg.hidden_size * act;

	return (size_t)m->cfg.hybrid.n_gdn_layers *
		       ((size_t)(L->conv_k - 1) * L->conv_dim * act +
			(size_t)L->n_v_heads * L->k_dim * L->v_dim * sizeof(float)) +
	       (q->n_ple ? (size_t)q->n_ple * ple + (size_t)(q->ngram - 1) * sizeof(int32_t) : 0);
}

size_t sm70_model_state_slot_bytes(const struct sm70_model *m)
{
	size_t n = 0;

	if (!m->n_state_slots)
		return 0;
	for (int r = 0; r < m->tp; r++)
		n += rank_slot_bytes(m, r);
	return n;
}

size_t sm70_model_state_bytes(const struct sm70_model *m)
{
	return sm70_model_state_slot_bytes(m) * (size_t)(m->n_state_slots + 1);
}

static int kv_dtype_ok(enum sm70_dtype t)
{
	return t == SM70_DTYPE_F32 || t == SM70_DTYPE_F16 || t == SM70_DTYPE_F8E4M3;
}

static int check_opts(const struct sm70_model_opts *o, struct sm70_err *err)
{
	if (o->max_tokens <= 0 || o->max_seqs <= 0 || o->max_seqs > o->max_tokens)
		return sm70_errf(err, -EINVAL, "max_tokens (%d) and max_seqs (%d) must be positive "
				 "with max_seqs <= max_tokens", o->max_tokens, o->max_seqs);
	if (o->block_size <= 0 || o->block_size > 4096)
		return sm70_errf(err, -EINVAL, "block_size %d out of range 1..4096", o->block_size);
	if (!kv_dtype_ok(o->kv_dtype))
		return sm70_errf(err, -EINVAL, "KV cache dtype %s is not supported",
				 sm70_dtype_name(o->kv_dtype));
	if (o->kv_v_dtype != SM70_KV_V_AS_K && (o->kv_v_dtype >= SM70__KV_V_END ||
						!kv_dtype_ok((enum sm70_dtype)(o->kv_v_dtype - 1))))
		return sm70_errf(err, -EINVAL, "KV cache V dtype code %d is not supported",
				 (int)o->kv_v_dtype);
	return 0;
}

/* QSA's indexer caches of rank r's attention layers, slots tokens each (the pool and the
 * scratch block, like the KV cache). */
static int alloc_qsa(struct sm70_model *m, int r, size_t slots, struct sm70_err *err)
{
	struct sm70_model_rank *rk = &m->rank[r];
	struct sm70_backend *be = rk->be;
	size_t bytes = slots * (size_t)m->cfg.q4.idx_dim * sizeof(float);

	rk->qsa = calloc((size_t)m->cfg.n_layers, sizeof(*rk->qsa));
	if (!rk->qsa)
		return -ENOMEM;
	for (int l = 0; l < m->cfg.n_layers; l++) {
		if (m->cfg.layer_kind[l] != SM70_LAYER_ATTENTION)
			continue;
		rk->qsa[l].keys = be->ops->buf_alloc(be, bytes);
		rk->qsa[l].comp = be->ops->buf_alloc(be, bytes);
		if (!rk->qsa[l].keys || !rk->qsa[l].comp)
			return sm70_errf(err, -ENOMEM, "cannot allocate the QSA indexer cache of "
					 "layer %d (2 x %zu bytes on %s, rank %d)", l, bytes,
					 be->name, r);
	}
	return 0;
}

/* Sizes the KV pool (the same block count on every rank: block ids are shared) and
 * allocates each rank's share of it. */
static int alloc_kv(struct sm70_model *m, struct sm70_err *err)
{
	size_t per_block, elems, k_bytes, v_bytes;
	long n = m->opts.n_blocks;

	m->kv_lay.dtype = m->opts.kv_dtype;
	m->kv_lay.v_dtype = m->opts.kv_v_dtype;
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
	elems = (size_t)(n + 1) * m->opts.block_size * m->kv_lay.n_kv_heads * m->cfg.head_dim;
	k_bytes = elems * sm70_dtype_size(m->kv_lay.dtype);
	v_bytes = elems * sm70_dtype_size(sm70_kv_v_dtype(&m->kv_lay));

	for (int r = 0; r < m->tp; r++) {
		struct sm70_model_rank *rk = &m->rank[r];
		struct sm70_backend *be = rk->be;

		rk->kv = calloc((size_t)m->cfg.n_layers, sizeof(*rk->kv));
		if (!rk->kv)
			return -ENOMEM;
		for (int l = 0; l < m->cfg.n_layers; l++) {
			if (m->cfg.layer_kind[l] != SM70_LAYER_ATTENTION)
				continue;
			rk->kv[l].k = be->ops->buf_alloc(be, k_bytes);
			rk->kv[l].v = be->ops->buf_alloc(be, v_bytes);
			rk->kv[l].k_scale = 1.0f;
			rk->kv[l].v_scale = 1.0f;
			if (!rk->kv[l].k || !rk->kv[l].v)
				return sm70_errf(err, -ENOMEM, "cannot allocate the KV cache of "
						 "layer %d (%zu bytes for K and %zu for V on %s, "
						 "rank %d)", l, k_bytes, v_bytes, be->name, r);
		}
		if (qsa_token_bytes(m)) {
			int ret = alloc_qsa(m, r, (size_t)(n + 1) * m->opts.block_size, err);
			if (ret)
				return ret;
		}
	}
	return 0;
}

/* Zeroes n bytes of backend memory through a host buffer of zeros. */
static int zero_fill(struct sm70_backend *be, void *dst, size_t n)
{
	enum { CHUNK = 1 << 20 };
	static const char zeros[CHUNK];
	int ret = 0;

	for (size_t off = 0; off < n && !ret; off += CHUNK)
		ret = be->ops->upload(be, (char *)dst + off, zeros, n - off < CHUNK ? n - off : CHUNK);
	return ret ? ret : be->ops->sync(be);
}

/* qwen4_exp's PLE state of rank r: each PLE layer's dilated-conv window and the slot's
 * last ngram - 1 tokens (ngram_hist). */
static int alloc_ple_state(struct sm70_model *m, int r, size_t slots, struct sm70_err *err)
{
	const struct sm70_qwen4_config *q = &m->cfg.q4;
	struct sm70_model_rank *rk = &m->rank[r];
	struct sm70_backend *be = rk->be;
	size_t conv = slots * (size_t)(q->ple_conv_k - 1) * q->ngram * q->hc *
		      m->cfg.hidden_size * sm70_dtype_size(be->act_dtype);
	size_t ctx = slots * (size_t)(q->ngram - 1) * sizeof(int32_t);
	int ret;

	for (int l = 0; l < m->cfg.n_layers; l++) {
		if (q->ple_index[l] < 0)
			continue;
		if (conv && !(rk->state[l].ple = be->ops->buf_alloc(be, conv)))
			return sm70_errf(err, -ENOMEM, "cannot allocate the PLE state of layer %d "
					 "(%zu bytes on %s, rank %d)", l, conv, be->name, r);
		if (conv && (ret = zero_fill(be, rk->state[l].ple, conv)))
			return sm70_errf(err, ret, "cannot clear the PLE state of layer %d", l);
	}
	rk->ngram_ctx = be->ops->buf_alloc(be, ctx);
	if (!rk->ngram_ctx || (ret = zero_fill(be, rk->ngram_ctx, ctx)))
		return sm70_errf(err, -ENOMEM, "cannot allocate the n-gram context on %s (rank "
				 "%d)", be->name, r);
	return 0;
}

/*
 * The state slots of the recurrent layers: opts.state_slots (default max_seqs, the most
 * sequences that can run at once) plus the scratch slot padding rows write to. Zeroed
 * once so that even a benchmark that skips the prefill reads finite numbers; the ops
 * reset a slot at a sequence's position 0 themselves.
 */
static int alloc_state(struct sm70_model *m, struct sm70_err *err)
{
	const struct sm70_gdn_config *g = &m->cfg.hybrid.gdn;

	if (!m->cfg.hybrid.n_gdn_layers)
		return 0;
	m->n_state_slots = m->opts.state_slots > 0 ? m->opts.state_slots : m->opts.max_seqs;
	for (int r = 0; r < m->tp; r++) {
		struct sm70_model_rank *rk = &m->rank[r];
		struct sm70_backend *be = rk->be;
		struct sm70_state_layout *L = &rk->state_lay;
		size_t slots = (size_t)m->n_state_slots + 1, conv_bytes, ssm_bytes;

		L->n_slots = m->n_state_slots;
		L->conv_k = g->conv_k;
		L->k_dim = g->k_dim;
		L->v_dim = g->v_dim;
		L->n_k_heads = g->n_k_heads / m->tp;
		L->n_v_heads = g->n_v_heads / m->tp;
		L->conv_dim = 2 * L->n_k_heads * L->k_dim + L->n_v_heads * L->v_dim;
		conv_bytes = slots * (size_t)(L->conv_k - 1) * L->conv_dim *
			     sm70_dtype_size(be->act_dtype);
		ssm_bytes = slots * (size_t)L->n_v_heads * L->k_dim * L->v_dim * sizeof(float);
		rk->state = calloc((size_t)m->cfg.n_layers, sizeof(*rk->state));
		if (!rk->state)
			return -ENOMEM;
		for (int l = 0; l < m->cfg.n_layers; l++) {
			struct sm70_state_layer *s = &rk->state[l];
			int ret;

			if (m->cfg.layer_kind[l] != SM70_LAYER_GDN)
				continue;
			s->conv = conv_bytes ? be->ops->buf_alloc(be, conv_bytes) : NULL;
			s->ssm = be->ops->buf_alloc(be, ssm_bytes);
			if ((conv_bytes && !s->conv) || !s->ssm)
				return sm70_errf(err, -ENOMEM, "cannot allocate the recurrent state "
						 "of layer %d (%d slots: %zu + %zu bytes on %s, rank "
						 "%d)", l, m->n_state_slots, conv_bytes, ssm_bytes,
						 be->name, r);
			if ((conv_bytes && (ret = zero_fill(be, s->conv, conv_bytes))) ||
			    (ret = zero_fill(be, s->ssm, ssm_bytes)))
				return sm70_errf(err, ret, "cannot clear the recurrent state of "
						 "layer %d on %s", l, be->name);
		}
		if (m->cfg.q4.n_ple) {
			int ret = alloc_ple_state(m, r, slots, err);
			if (ret)
				return ret;
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
		rk->gdn_k0 = r * (c->hybrid.gdn.n_k_heads / tp);
		rk->moe_inter = c->moe.inter / tp;
		rk->shared_inter = c->moe.shared_inter / tp;
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
	if (c->moe.n_moe_layers && (c->moe.inter % tp || c->moe.shared_inter % tp))
		return sm70_errf(err, -EINVAL, "tensor parallelism %d needs moe_intermediate_size "
				 "(%d) and shared_expert_intermediate_size (%d) to divide evenly",
				 tp, c->moe.inter, c->moe.shared_inter);
	if (!(m->entry->caps & SM70_CAP_TP))
		return sm70_errf(err, -ENOTSUP, "tensor parallelism is not supported for %s "
				 "models", c->model_type);
	return m->arch->check_tp ? m->arch->check_tp(m, err) : 0;
}

/* The step buffers of rank r. */
static int alloc_rank(struct sm70_model *m, int r, struct sm70_err *err)
{
	struct sm70_model_rank *rk = &m->rank[r];
	struct sm70_backend *be = rk->be;
	struct sm70__batch_offsets bo = sm70__batch_layout(m);
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

/*
 * SM70_FUSED: which of the backend's fused ops the engine uses, a comma-separated list
 * of qk (q/k norm + RoPE + cache write), hc (the one-token hyper-connection mixer), silu
 * (SwiGLU inside the down projection), norm (the residual add + RMSNorm inside the next
 * GEMV at one token), glu (SwiGLU as the gate/up GEMV's epilogue), default (qk, hc and
 * glu), 1 (all) and 0 (none). Unset: default. Measured (docs/PERFORMANCE.md): glu 2-4%
 * faster at B1-B8, the SwiGLU-into-down fusion much slower (its GEMV reads gate and up
 * for every block; glu supersedes it), norm +0.5% on Qwen3-8B and 3% slower on
 * Qwen3-32B (every block of every wave makes the norm before its x loads).
 */
static int parse_fused(const char *env, int *out, struct sm70_err *err)
{
	static const struct sm70_word words[] = {
		{ "default", SM70_FUSED_DEFAULT }, { "qk", SM70_FUSED_QK },
		{ "hc", SM70_FUSED_HC },	   { "silu", SM70_FUSED_SILU },
		{ "norm", SM70_FUSED_NORM },	   { "glu", SM70_FUSED_GLU },
		{ "1", SM70_FUSED_ALL },	   { "0", 0 },
	};
	const char *bad;
	size_t bad_len;
	unsigned bits;

	if (!env) {
		*out = SM70_FUSED_DEFAULT;
		return 0;
	}
	if (sm70_words_bits(env, words, sizeof(words) / sizeof(words[0]), &bits, &bad, &bad_len))
		return sm70_errf(err, -EINVAL, "SM70_FUSED=%s: unknown fusion '%.*s' (a "
				 "comma-separated list of default, qk, hc, silu, norm, glu, 1, 0)",
				 env, (int)bad_len, bad);
	*out = (int)bits;
	return 0;
}

int sm70_model_load_tp(struct sm70_model **out, const struct sm70_ckpt *ck,
		       struct sm70_backend *const be[], int tp, struct sm70_comm *comm,
		       const struct sm70_model_opts *opts, struct sm70_err *err)
{
	struct sm70_model *m;
	struct sm70__batch_offsets bo;
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
	/* parsed before the workspace is sized: the norm fusion needs a second residual */
	ret = parse_fused(getenv("SM70_FUSED"), &m->fused, err);
	if (ret) {
		free(m);
		return ret;
	}
	/* batch invariance: the fusions taken only at some step sizes would give a row other
	 * bits at others (the q/k fusion is taken at every size) */
	if (opts->batch_invariant)
		m->fused &= ~(SM70_FUSED_SILU | SM70_FUSED_HC | SM70_FUSED_NORM | SM70_FUSED_GLU);
	m->comm = tp > 1 ? comm : NULL;
	for (int r = 0; r < tp; r++)
		m->rank[r].be = be[r];
	ret = sm70_model_config_parse(&m->cfg, sm70_ckpt_config(ck),
				      sm70_ckpt_generation_config(ck), err);
	if (ret)
		goto fail;
	ret = sm70_quant_config_parse(&m->quant, sm70_ckpt_config(ck),
				      sm70_ckpt_hf_quant_config(ck), sm70_ckpt_dir(ck), err);
	if (ret)
		goto fail;
	m->entry = sm70__arch_of(&m->cfg);
	m->arch = m->entry ? m->entry->ops : NULL;
	if (!m->arch) {
		ret = sm70_errf(err, -ENOTSUP, "no engine for model_type '%s'", m->cfg.model_type);
		goto fail;
	}
	/* an op the architecture needs but a backend lacks is refused here, by name */
	for (int r = 0; r < tp; r++) {
		ret = sm70__arch_check_ops(m->entry, &m->cfg, be[r], err);
		if (ret)
			goto fail;
	}
	ret = check_tp(m, err);
	if (ret)
		goto fail;
	split_ranks(m);
	ret = alloc_kv(m, err);
	if (ret)
		goto fail;
	ret = alloc_state(m, err);
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
	/* qwen4_exp's PLE row gathers on the backend's side stream (0: in line) */
	env = getenv("SM70_PLE_OVERLAP");
	m->ple_overlap = !(env && strcmp(env, "0") == 0);
	env = getenv("SM70_BENCH_SKIP_ALLREDUCE");
	m->bench_skip_allreduce = env && strcmp(env, "1") == 0;
	bo = sm70__batch_layout(m);
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
		if (rk->state) {
			for (int l = 0; l < m->cfg.n_layers; l++) {
				be->ops->buf_free(be, rk->state[l].conv);
				be->ops->buf_free(be, rk->state[l].ssm);
				be->ops->buf_free(be, rk->state[l].ple);
			}
			free(rk->state);
		}
		if (rk->qsa) {
			for (int l = 0; l < m->cfg.n_layers; l++) {
				be->ops->buf_free(be, rk->qsa[l].keys);
				be->ops->buf_free(be, rk->qsa[l].comp);
			}
			free(rk->qsa);
		}
		be->ops->buf_free(be, rk->ngram_ctx);
		be->ops->buf_free(be, rk->shards);
		be->ops->buf_free(be, rk->sample_out);
		be->ops->buf_free(be, rk->sample_rows);
		be->ops->buf_free(be, rk->logits);
		be->ops->buf_free(be, rk->work);
		be->ops->buf_free(be, rk->batch_buf);
	}
	sm70__pinned_free(m->pinned, m->pinned_bytes);
	sm70_quant_config_free(&m->quant);
	free(m);
}

size_t sm70_model_expert_bytes(struct sm70_model *m)
{
	size_t n = 0;

	for (int r = 0; r < m->tp && m->arch->expert_bytes; r++)
		n += m->arch->expert_bytes(m, r);
	return n;
}

size_t sm70_model_weight_bytes(const struct sm70_model *m)
{
	size_t n = 0;

	for (int r = 0; r < m->tp; r++)
		n += m->arch->weight_bytes(m, r);
	return n;
}

int sm70__check_step(const struct sm70_model *m, const struct sm70_step *st)
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
	if (st->max_blocks <= 0 || st->max_blocks > sm70__max_blocks_per_seq(m))
		return -EINVAL;
	if (st->max_pos <= 0 || st->max_pos > m->cfg.max_position)
		return -EINVAL;
	if (m->n_state_slots) {
		if (!st->seq_state)
			return -EINVAL;
		for (int s = 0; s < st->n_seqs; s++)
			if (st->seq_state[s] < 0 || st->seq_state[s] >= m->n_state_slots)
				return -EINVAL;
	}
	return 0;
}

/* Uploads the step to every rank and runs the architecture's forward; logits stay on the
 * ranks. */
static int run_step(struct sm70_model *m, const struct sm70_step *st)
{
	struct sm70__batch_offsets bo = sm70__batch_layout(m);
	size_t tok_bytes = (size_t)st->n_tokens * sizeof(int32_t);
	int ret;

	ret = sm70__check_step(m, st);
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
		if (m->n_state_slots)
			be->ops->upload(be, base + bo.state, st->seq_state,
					(size_t)st->n_seqs * sizeof(int32_t));
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
			.seq_state = m->n_state_slots ? base + bo.state : NULL,
		};
	}
	m->arch->forward(m);
	return 0;
}

int sm70__sync_all(struct sm70_model *m)
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
	return sm70__sync_all(m);
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
	return sm70__sync_all(m);
}

/* The sampling work that follows the forward on each rank: the device sampler with one
 * rank, the slice summaries with several. */
void sm70__queue_sampling(struct sm70_model *m, int n)
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
int sm70__fetch_sampling(struct sm70_model *m, int n, void *out)
{
	int ret;

	if (m->tp == 1) {
		struct sm70_model_rank *rk = &m->rank[0];
		ret = rk->be->ops->download(rk->be, out, rk->sample_out,
					    sizeof(*rk->sample_out) * (size_t)n);
		if (ret)
			return ret;
		return sm70__sync_all(m);
	}
	for (int r = 0; r < m->tp; r++) {
		struct sm70_model_rank *rk = &m->rank[r];
		struct sm70_shard_summary *dst = out;
		ret = rk->be->ops->download(rk->be, dst + (size_t)r * n, rk->shards,
					    sizeof(*dst) * (size_t)n);
		if (ret)
			return ret;
	}
	return sm70__sync_all(m);
}

/* A step whose sampling work runs on the ranks: replayed when it can be, else eager. */
static int forward_sampled(struct sm70_model *m, const struct sm70_step *st,
			   const struct sm70_sample_row *rows, void *out)
{
	int B, ret;

	B = sm70__graph_batch(m, st);
	if (B && sm70__check_step(m, st) == 0) {
		ret = sm70__forward_graph(m, st, B, rows, out);
		if (ret != -EAGAIN)
			return ret;
	}
	ret = run_step(m, st);
	if (ret)
		return ret;
	if (!st->n_out)
		return sm70__sync_all(m);
	for (int r = 0; r < m->tp; r++) {
		struct sm70_backend *be = m->rank[r].be;
		be->ops->upload(be, m->rank[r].sample_rows, rows, sizeof(*rows) * (size_t)st->n_out);
	}
	sm70__queue_sampling(m, st->n_out);
	return sm70__fetch_sampling(m, st->n_out, out);
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

