/*
 * engine.c - continuous batching over one model; see engine.h for the policy.
 *
 * A sequence's tokens are its prompt followed by what it generated; n_cached of them
 * have their K/V in the cache. While running it always has at least one pending token
 * (n_toks - n_cached >= 1): a decode has exactly one, a prefill more. Each step feeds
 * every decode and as much prefill as the token budget allows, and samples for every
 * sequence whose pending tokens all went in.
 */
#include "daemon/engine/engine.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "daemon/engine/block_pool.h"
#include "daemon/engine/checkpoint.h"
#include "daemon/engine/load_check.h"
#include "daemon/engine/model.h"
#include "daemon/engine/sampler_tp.h"
#include "kernels/backend.h"
#include "kernels/comm.h"

struct seq {
	uint64_t id;
	struct sm70_request req; /* prompt pointer cleared: tokens live in toks */
	int32_t *toks;
	int n_toks, cap_toks;
	int n_prompt;
	int n_gen;
	int n_cached;
	int32_t *blocks;
	int n_blocks, cap_blocks;
	int state_slot;               /* recurrent-state slot while running, else -1 */
	int cancelled;
	int finished;
	int no_publish;               /* never share its blocks (warm-up, skipped prefill) */
	int cached_tokens;            /* prompt tokens found in the prefix cache */
	int n_keyed;                  /* leading full blocks whose prefix key is known */
	struct sm70_block_key key;    /* key of the prefix of those blocks */
	uint64_t serial;              /* the publication holding the last of them (0: none
				       * yet; SM70_BLOCK_NO_SERIAL: this chain is unpublished) */
	struct seq *next; /* waiting queue link */
};

struct sm70_engine {
	struct sm70_engine_opts opts;
	struct sm70_backend *be;         /* rank 0's */
	struct sm70_backend *ranks[SM70_MAX_TP]; /* distinct backends own; repeats borrow */
	int n_owned;                     /* ranks[0..n_owned) are destroyed at close */
	struct sm70_comm *comm;
	struct sm70_ckpt *ck;
	struct sm70_model *model;
	struct sm70_sampler *sampler;
	struct sm70_block_pool pool;
	int bs;
	int32_t *free_slots;             /* recurrent-state slots not held by a sequence */
	int n_free_slots;

	struct seq **running; /* admission order, oldest first */
	int n_running;
	struct seq *wait_head, *wait_tail;
	int n_waiting;
	struct seq *parked; /* sm70_engine_park: out of scheduling, linked by next */
	int n_parked;
	uint64_t next_id;

	/* step scratch, sized at open */
	int32_t *tok_ids, *tok_pos, *tok_seq, *tok_slot, *tables, *out_rows, *seq_state;
	int32_t *hit_ids;
	int32_t *chunk_first, *chunk_len;    /* prefill chunks of the step being built */
	struct sm70_sample_row *rows;        /* device sampling: one per out row */
	struct sm70_sample_result *results;
	struct sm70_shard_summary *shards;   /* several ranks: [tp][step_n_out] */
	int step_n_out;                      /* rows sampled in the current step */
	int expert_bytes_tokens;             /* the step size stats.expert_bytes was taken at */
	struct seq **step_seqs;
	int *step_take;
	float *logits;
	int max_blocks;

	struct sm70_engine_stats stats;
	struct sm70_backend_ops load_ops; /* the backends' ops while a watched load runs */
	char msg[256]; /* a FINISH_ERROR event's message */
};

void sm70_engine_opts_default(struct sm70_engine_opts *o)
{
	const char *env;

	memset(o, 0, sizeof(*o));
	o->backend = "cpu";
	o->tp = 1;
	o->max_seqs = 16;
	o->max_batch_tokens = 512;
	o->block_size = 16;
	o->kv_bytes = (size_t)256 << 20;
	o->kv_dtype = SM70_DTYPE_COUNT;
	o->kv_v_dtype = SM70_DTYPE_COUNT;
	/* the switch back to the DeltaNet reference path; callers may still override it */
	env = getenv("SM70_GDN");
	o->gdn_recurrent = env && strcmp(env, "reference") == 0;
	o->batch_invariant = sm70_batch_invariant_env();
}

static int blocks_for(const struct sm70_engine *e, int n_tokens)
{
	return (n_tokens + e->bs - 1) / e->bs;
}

/* Returns what s holds of the sequence memory: its KV blocks and its state slot (whose
 * contents mean nothing once n_cached is 0: a readmitted sequence starts at position 0). */
static void seq_free_blocks(struct sm70_engine *e, struct seq *s)
{
	if (s->state_slot >= 0) {
		e->free_slots[e->n_free_slots++] = s->state_slot;
		s->state_slot = -1;
	}
	/* Release in reverse so a prefix's tail blocks are evicted before its head. */
	for (int i = s->n_blocks - 1; i >= 0; i--)
		sm70_block_pool_unref(&e->pool, s->blocks[i]);
	s->n_blocks = 0;
	s->n_cached = 0;
	s->n_keyed = 0;
	s->key = (struct sm70_block_key){ 0, 0 };
	s->serial = 0;
}

static void seq_destroy(struct sm70_engine *e, struct seq *s)
{
	seq_free_blocks(e, s);
	free(s->toks);
	free(s->blocks);
	free(s);
}

static int seq_add_block(struct sm70_engine *e, struct seq *s)
{
	int32_t b;

	if (s->n_blocks == s->cap_blocks)
		return -ENOSPC; /* cap_blocks is the per-sequence maximum */
	b = sm70_block_pool_alloc(&e->pool);
	if (b < 0)
		return b;
	s->blocks[s->n_blocks++] = b;
	return 0;
}

static int warm_up(struct sm70_engine *e);

/*
 * Makes the ranks' backends and, with several ranks, their communicator. CUDA ranks get
 * a GPU each (opts.gpus, default 0, 1, ...); CPU ranks share one backend, which simulates
 * every rank in turn (what CI runs the sharded model on).
 */
static int open_backends(struct sm70_engine *e, struct sm70_err *err)
{
	const struct sm70_engine_opts *o = &e->opts;
	const char *name = o->backend ? o->backend : "cpu";
	int tp = o->tp, ret = 0;

	if (tp < 1 || tp > SM70_MAX_TP)
		return sm70_errf(err, -EINVAL, "tp %d out of range 1..%d", tp, SM70_MAX_TP);
	if (strcmp(name, "cuda") == 0) {
		if (o->n_gpus && o->n_gpus < tp)
			return sm70_errf(err, -EINVAL, "tp %d needs %d GPUs but %d %s listed", tp,
					 tp, o->n_gpus, o->n_gpus == 1 ? "is" : "are");
		for (int r = 0; r < tp; r++)
			for (int q = 0; q < r; q++)
				if (o->n_gpus && o->gpus[q] == o->gpus[r])
					return sm70_errf(err, -EINVAL, "GPU %d is listed for two "
							 "ranks", o->gpus[r]);
		for (int r = 0; r < tp && !ret; r++) {
			ret = sm70_backend_cuda_create(&e->ranks[r], o->n_gpus ? o->gpus[r] : r,
						       err);
			if (!ret)
				e->n_owned = r + 1;
		}
	} else if (strcmp(name, "cpu") == 0 || strcmp(name, "null") == 0) {
		if (name[0] == 'c')
			ret = sm70_backend_cpu_create(&e->ranks[0], o->n_threads, err);
		else if (tp > 1)
			ret = sm70_errf(err, -EINVAL, "the null backend runs one rank only");
		else
			ret = sm70_backend_null_create(&e->ranks[0], err);
		if (!ret) {
			e->n_owned = 1;
			for (int r = 1; r < tp; r++)
				e->ranks[r] = e->ranks[0];
		}
	} else {
		ret = sm70_errf(err, -EINVAL, "unknown backend '%s' (expected cpu or cuda)", name);
	}
	if (ret)
		return ret;
	/* the switch reaches the ops through their backends (CPU ranks share one) */
	for (int r = 0; r < e->n_owned; r++)
		e->ranks[r]->batch_invariant = o->batch_invariant != 0;
	e->be = e->ranks[0];
	if (tp == 1)
		return 0;
	if (strcmp(name, "cuda") == 0)
		return sm70_comm_nccl_create(&e->comm, e->ranks, tp, err);
	return sm70_comm_cpu_create(&e->comm, e->ranks, tp, err);
}

/* ---- load progress (sm70_engine_opts.progress) ------------------------------------- */

/*
 * Every weight reaches its backend through the upload op, so while a watched load runs the
 * ranks' backends get a copy of their op table whose upload counts the bytes and checks for
 * cancellation: the loaders of every architecture are measured without knowing it. The op
 * has no context argument, hence the thread-local state: the load runs on the thread that
 * called sm70_engine_open, and another engine may load on another thread meanwhile.
 */
static _Thread_local struct {
	struct sm70_load_progress *p;
	const struct sm70_backend_ops *orig;
} watched;

static int counting_upload(struct sm70_backend *be, void *dst, const void *src, size_t bytes)
{
	int ret;

	if (__atomic_load_n(&watched.p->cancel, __ATOMIC_RELAXED))
		return -ECANCELED;
	ret = watched.orig->upload(be, dst, src, bytes);
	if (!ret)
		__atomic_fetch_add(&watched.p->done, (uint64_t)bytes, __ATOMIC_RELAXED);
	return ret;
}

/* Bytes of the *.safetensors files in dir. */
static uint64_t safetensors_bytes(const char *dir)
{
	struct dirent *de;
	uint64_t sum = 0;
	DIR *dp = opendir(dir);

	if (!dp)
		return 0;
	while ((de = readdir(dp))) {
		size_t n = strlen(de->d_name);
		struct stat st;

		if (n > 12 && strcmp(de->d_name + n - 12, ".safetensors") == 0 &&
		    fstatat(dirfd(dp), de->d_name, &st, 0) == 0)
			sum += (uint64_t)st.st_size;
	}
	closedir(dp);
	return sum;
}

/* What the load will upload: the checkpoint's files, or for dummy weights (16-bit values,
 * no files) the weights of a dense decoder of config.json's sizes. 0 if unknown. */
static uint64_t load_total(const struct sm70_engine *e, const char *model_dir)
{
	struct sm70_model_config mc;
	uint64_t H, q, kv, layer;

	if (!e->opts.dummy_weights)
		return safetensors_bytes(model_dir);
	if (sm70_model_config_parse(&mc, sm70_ckpt_config(e->ck),
				    sm70_ckpt_generation_config(e->ck), NULL))
		return 0;
	H = (uint64_t)mc.hidden_size;
	q = (uint64_t)mc.n_heads * (uint64_t)mc.head_dim * (mc.attn_gate ? 2 : 1);
	kv = (uint64_t)mc.n_kv_heads * (uint64_t)mc.head_dim;
	layer = H * q + 2 * H * kv + (uint64_t)mc.n_heads * mc.head_dim * H +
		3 * H * (uint64_t)mc.intermediate_size;
	return 2 * ((uint64_t)mc.vocab_size * H * (mc.tie_word_embeddings ? 1 : 2) +
		    (uint64_t)mc.n_layers * layer);
}

/* Points the owned backends at the counting op table (watch 1) or back (watch 0). */
static void watch_uploads(struct sm70_engine *e, int watch)
{
	if (!e->opts.progress || !e->n_owned)
		return;
	if (watch) {
		watched.p = e->opts.progress;
		watched.orig = e->ranks[0]->ops;
		e->load_ops = *watched.orig;
		e->load_ops.upload = counting_upload;
	}
	for (int r = 0; r < e->n_owned; r++)
		if (e->ranks[r]->ops == (watch ? watched.orig : &e->load_ops))
			e->ranks[r]->ops = watch ? &e->load_ops : watched.orig;
	if (!watch)
		watched.p = NULL;
}

/* The KV cache's K and V dtypes: the options', or the backend's default (V like K). */
static enum sm70_dtype kv_k_dtype(const struct sm70_engine *e)
{
	return e->opts.kv_dtype != SM70_DTYPE_COUNT ? e->opts.kv_dtype : e->be->kv_dtype_default;
}

static enum sm70_dtype kv_v_dtype(const struct sm70_engine *e)
{
	return e->opts.kv_v_dtype != SM70_DTYPE_COUNT ? e->opts.kv_v_dtype : kv_k_dtype(e);
}

/* The first steps of sm70_engine_open and sm70_engine_check: the backends, the
 * checkpoint (config.json, the weight files' headers and index), the KV dtypes. */
static int open_parts(struct sm70_engine *e, const char *model_dir, struct sm70_err *err)
{
	const struct sm70_engine_opts *opts = &e->opts;
	int ret = open_backends(e, err);

	if (ret)
		return ret;
	if (opts->dummy_weights)
		ret = sm70_ckpt_open_config_only(&e->ck, model_dir, err);
	else
		ret = sm70_ckpt_open(&e->ck, model_dir, err);
	if (ret)
		return ret;
	if (opts->kv_dtype != SM70_DTYPE_COUNT || opts->kv_v_dtype != SM70_DTYPE_COUNT) {
		enum sm70_dtype k = kv_k_dtype(e), v = kv_v_dtype(e);

		if (!sm70_backend_reads_kv(e->be, k, v))
			return sm70_errf(err, -EINVAL, "the %s backend cannot hold the KV cache as "
					 "K %s, V %s", e->be->name, sm70_dtype_name(k),
					 sm70_dtype_name(v));
	}
	return 0;
}

static struct sm70_model_opts model_opts(const struct sm70_engine *e)
{
	const struct sm70_engine_opts *opts = &e->opts;

	return (struct sm70_model_opts){
		.max_tokens = opts->max_batch_tokens,
		.max_seqs = opts->max_seqs,
		.block_size = opts->block_size,
		.n_blocks = opts->kv_blocks,
		.kv_bytes = opts->kv_bytes,
		.kv_dtype = kv_k_dtype(e),
		.kv_v_dtype = kv_v_dtype(e) == kv_k_dtype(e) ? SM70_KV_V_AS_K :
							       SM70_KV_V(kv_v_dtype(e)),
		.dummy = opts->dummy_weights,
		.dummy_seed = opts->dummy_seed,
		.state_slots = opts->state_slots,
		.gdn_recurrent = opts->gdn_recurrent,
		.batch_invariant = opts->batch_invariant,
	};
}

int sm70_engine_check(const char *model_dir, const struct sm70_engine_opts *opts,
		      char *summary, size_t summary_size, struct sm70_err *err)
{
	const struct sm70_backend_ops *orig[SM70_MAX_TP];
	struct sm70_backend_ops check_ops;
	struct sm70_model *m = NULL;
	struct sm70_model_opts mo;
	struct sm70_engine *e;
	int ret;

	if (summary_size)
		summary[0] = '\0';
	e = calloc(1, sizeof(*e));
	if (!e)
		return -ENOMEM;
	e->opts = *opts;
	e->opts.progress = NULL;
	e->bs = opts->block_size;
	ret = open_parts(e, model_dir, err);
	if (ret)
		goto out;
	mo = model_opts(e);
	mo.check_only = 1;
	/* the ranks' backends are of one kind (a watched load assumes so too), and the
	 * no-op table calls none of their ops */
	sm70__load_check_ops(&check_ops, e->ranks[0]->ops);
	for (int r = 0; r < e->n_owned; r++) {
		orig[r] = e->ranks[r]->ops;
		e->ranks[r]->ops = &check_ops;
	}
	ret = sm70_model_load_tp(&m, e->ck, e->ranks, e->opts.tp, e->comm, &mo, err);
	if (!ret && summary_size)
		snprintf(summary, summary_size, "%s, %d layers, %zu weight file%s",
			 m->cfg.model_type, m->cfg.n_layers, sm70_ckpt_n_files(e->ck),
			 sm70_ckpt_n_files(e->ck) == 1 ? "" : "s");
	sm70_model_free(m);
	for (int r = 0; r < e->n_owned; r++)
		e->ranks[r]->ops = orig[r];
out:
	sm70_engine_close(e);
	return ret;
}

int sm70_engine_open(struct sm70_engine **out, const char *model_dir,
		     const struct sm70_engine_opts *opts, struct sm70_err *err)
{
	struct sm70_engine *e;
	struct sm70_model_opts mo;
	int ret, S, T, V;

	*out = NULL;
	e = calloc(1, sizeof(*e));
	if (!e)
		return -ENOMEM;
	e->opts = *opts;
	e->bs = opts->block_size;
	ret = open_parts(e, model_dir, err);
	if (ret)
		goto fail;
	mo = model_opts(e);
	if (opts->progress)
		__atomic_store_n(&opts->progress->total, load_total(e, model_dir),
				 __ATOMIC_RELAXED);
	watch_uploads(e, 1);
	ret = sm70_model_load_tp(&e->model, e->ck, e->ranks, e->opts.tp, e->comm, &mo, err);
	watch_uploads(e, 0);
	if (ret && (ret == -ECANCELED || (opts->progress &&
			__atomic_load_n(&opts->progress->cancel, __ATOMIC_RELAXED)))) {
		sm70_err_clear(err);
		ret = sm70_errf(err, -ECANCELED, "the load was cancelled");
	}
	if (ret)
		goto fail;

	S = opts->max_seqs;
	T = opts->max_batch_tokens;
	V = e->model->cfg.vocab_size;
	e->max_blocks = blocks_for(e, e->model->cfg.max_position);
	if (e->max_blocks > e->model->kv_lay.n_blocks)
		e->max_blocks = e->model->kv_lay.n_blocks;
	/* Prefix caching needs the architecture's word that a cached prefix is all a
	 * sequence needs to go on (not so with a recurrent state: arch.h). */
	e->stats.prefix_cache_off = opts->no_prefix_cache ? "turned off by configuration" :
				    !(e->model->entry->caps & SM70_CAP_PREFIX_CACHE) ?
				    e->model->entry->no_prefix_cache : NULL;
	ret = sm70_block_pool_init(&e->pool, e->model->kv_lay.n_blocks, e->bs,
				   !e->stats.prefix_cache_off);
	if (ret)
		goto fail;
	if (e->model->n_state_slots) {
		e->free_slots = malloc(sizeof(int32_t) * (size_t)e->model->n_state_slots);
		if (!e->free_slots) {
			ret = -ENOMEM;
			goto fail;
		}
		/* handed out lowest first */
		for (int i = 0; i < e->model->n_state_slots; i++)
			e->free_slots[i] = e->model->n_state_slots - 1 - i;
		e->n_free_slots = e->model->n_state_slots;
	}
	ret = sm70_sampler_create(&e->sampler, V);
	if (ret)
		goto fail;
	e->running = calloc((size_t)S, sizeof(*e->running));
	e->tok_ids = malloc(sizeof(int32_t) * (size_t)T);
	e->tok_pos = malloc(sizeof(int32_t) * (size_t)T);
	e->tok_seq = malloc(sizeof(int32_t) * (size_t)T);
	e->tok_slot = malloc(sizeof(int32_t) * (size_t)T);
	e->out_rows = malloc(sizeof(int32_t) * (size_t)S);
	e->seq_state = malloc(sizeof(int32_t) * (size_t)S);
	e->tables = malloc(sizeof(int32_t) * (size_t)S * (size_t)e->max_blocks);
	e->step_seqs = malloc(sizeof(*e->step_seqs) * (size_t)S);
	e->hit_ids = malloc(sizeof(int32_t) * (size_t)e->max_blocks);
	e->rows = malloc(sizeof(*e->rows) * (size_t)S);
	e->chunk_first = malloc(sizeof(int32_t) * (size_t)S);
	e->chunk_len = malloc(sizeof(int32_t) * (size_t)S);
	e->results = malloc(sizeof(*e->results) * (size_t)S);
	if (e->opts.tp > 1)
		e->shards = malloc(sizeof(*e->shards) * (size_t)S * (size_t)e->opts.tp);
	e->step_take = malloc(sizeof(int) * (size_t)S);
	e->logits = malloc(sizeof(float) * (size_t)S * (size_t)V);
	if (!e->running || !e->tok_ids || !e->tok_pos || !e->tok_seq || !e->tok_slot ||
	    !e->out_rows || !e->seq_state || !e->tables || !e->step_seqs || !e->step_take || !e->logits ||
	    !e->hit_ids || !e->rows || !e->results || !e->chunk_first || !e->chunk_len ||
	    (e->opts.tp > 1 && !e->shards)) {
		ret = -ENOMEM;
		goto fail;
	}
	e->stats.kv_blocks_total = e->pool.n_blocks;
	e->stats.state_slots_total = e->model->n_state_slots;
	e->next_id = 1;
	if (e->be->ops->graph_begin) {
		/* Devices load kernels (ours and cuBLAS's) lazily on first use: pay that here,
		 * at load, rather than in the first request's time to first token. */
		ret = warm_up(e);
		if (ret) {
			sm70_errf(err, ret, "warm-up step on %s failed: %s", e->be->name,
				  strerror(-ret));
			goto fail;
		}
	}
	*out = e;
	return 0;
fail:
	sm70_engine_close(e);
	return ret;
}

void sm70_engine_close(struct sm70_engine *e)
{
	struct seq *s, *n;

	if (!e)
		return;
	for (int i = 0; i < e->n_running; i++)
		seq_destroy(e, e->running[i]);
	for (s = e->wait_head; s; s = n) {
		n = s->next;
		seq_destroy(e, s);
	}
	for (s = e->parked; s; s = n) {
		n = s->next;
		seq_destroy(e, s);
	}
	sm70_block_pool_fini(&e->pool);
	sm70_sampler_destroy(e->sampler);
	sm70_model_free(e->model);
	sm70_ckpt_close(e->ck);
	sm70_comm_destroy(e->comm);
	for (int r = 0; r < e->n_owned; r++)
		sm70_backend_destroy(e->ranks[r]);
	free(e->shards);
	free(e->running);
	free(e->tok_ids);
	free(e->tok_pos);
	free(e->tok_seq);
	free(e->tok_slot);
	free(e->out_rows);
	free(e->seq_state);
	free(e->free_slots);
	free(e->tables);
	free(e->step_seqs);
	free(e->hit_ids);
	free(e->rows);
	free(e->results);
	free(e->chunk_first);
	free(e->chunk_len);
	free(e->step_take);
	free(e->logits);
	free(e);
}

const struct sm70_model_config *sm70_engine_model_config(const struct sm70_engine *e)
{
	return &e->model->cfg;
}

static void wait_push_back(struct sm70_engine *e, struct seq *s)
{
	s->next = NULL;
	if (e->wait_tail)
		e->wait_tail->next = s;
	else
		e->wait_head = s;
	e->wait_tail = s;
	e->n_waiting++;
}

static void wait_push_front(struct sm70_engine *e, struct seq *s)
{
	s->next = e->wait_head;
	e->wait_head = s;
	if (!e->wait_tail)
		e->wait_tail = s;
	e->n_waiting++;
}

static struct seq *wait_pop(struct sm70_engine *e)
{
	struct seq *s = e->wait_head;

	if (s) {
		e->wait_head = s->next;
		if (!e->wait_head)
			e->wait_tail = NULL;
		s->next = NULL;
		e->n_waiting--;
	}
	return s;
}

int sm70_engine_submit(struct sm70_engine *e, const struct sm70_request *r, uint64_t *id,
		       struct sm70_err *err)
{
	const struct sm70_model_config *c = &e->model->cfg;
	struct seq *s;
	int cap;

	if (r->n_prompt < 1)
		return sm70_errf(err, -EINVAL, "the prompt is empty");
	if (r->max_new_tokens < 1)
		return sm70_errf(err, -EINVAL, "max_new_tokens must be at least 1 (got %d)",
				 r->max_new_tokens);
	if (r->n_stop < 0 || r->n_stop > SM70_MAX_STOP_TOKENS)
		return sm70_errf(err, -EINVAL, "at most %d stop tokens (got %d)",
				 SM70_MAX_STOP_TOKENS, r->n_stop);
	if (sm70_sampling_check(&r->sampling))
		return sm70_errf(err, -EINVAL, "bad sampling parameters (temperature %g, top_k %d, "
				 "top_p %g, top_logprobs %d)", r->sampling.temperature,
				 r->sampling.top_k, r->sampling.top_p, r->sampling.top_logprobs);
	for (int i = 0; i < r->n_prompt; i++)
		if (r->prompt[i] < 0 || r->prompt[i] >= c->vocab_size)
			return sm70_errf(err, -EINVAL, "prompt token %d at index %d is outside the "
					 "vocabulary (0..%d)", r->prompt[i], i, c->vocab_size - 1);
	for (int i = 0; i < r->n_stop; i++)
		if (r->stop_ids[i] < 0 || r->stop_ids[i] >= c->vocab_size)
			return sm70_errf(err, -EINVAL, "stop token %d is outside the vocabulary",
					 r->stop_ids[i]);
	if (r->n_prompt >= c->max_position)
		return sm70_errf(err, -E2BIG, "the prompt has %d tokens; the context holds %d",
				 r->n_prompt, c->max_position);
	if (blocks_for(e, r->n_prompt + 1) > e->pool.n_blocks)
		return sm70_errf(err, -E2BIG, "the prompt has %d tokens; the KV cache holds %d",
				 r->n_prompt, e->pool.n_blocks * e->bs);

	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	cap = r->n_prompt + r->max_new_tokens;
	if (cap > c->max_position)
		cap = c->max_position;
	s->toks = malloc(sizeof(int32_t) * (size_t)cap);
	s->cap_blocks = e->max_blocks;
	s->blocks = malloc(sizeof(int32_t) * (size_t)s->cap_blocks);
	if (!s->toks || !s->blocks) {
		free(s->toks);
		free(s->blocks);
		free(s);
		return -ENOMEM;
	}
	memcpy(s->toks, r->prompt, sizeof(int32_t) * (size_t)r->n_prompt);
	s->n_toks = s->n_prompt = r->n_prompt;
	s->cap_toks = cap;
	s->state_slot = -1;
	s->req = *r;
	s->req.prompt = NULL;
	s->id = e->next_id++;
	if (r->front)
		wait_push_front(e, s);
	else
		wait_push_back(e, s);
	e->stats.prompt_tokens += (uint64_t)r->n_prompt;
	*id = s->id;
	return 0;
}

/* Takes request id out of the parked list. NULL if it is not parked. */
static struct seq *parked_take(struct sm70_engine *e, uint64_t id)
{
	for (struct seq **pp = &e->parked; *pp; pp = &(*pp)->next)
		if ((*pp)->id == id) {
			struct seq *s = *pp;

			*pp = s->next;
			s->next = NULL;
			e->n_parked--;
			return s;
		}
	return NULL;
}

int sm70_engine_cancel(struct sm70_engine *e, uint64_t id)
{
	struct seq *p;

	for (int i = 0; i < e->n_running; i++)
		if (e->running[i]->id == id) {
			e->running[i]->cancelled = 1;
			return 0;
		}
	for (struct seq *s = e->wait_head; s; s = s->next)
		if (s->id == id) {
			s->cancelled = 1;
			return 0;
		}
	/* a parked one goes back where the next step reaps it */
	p = parked_take(e, id);
	if (!p)
		return -ENOENT;
	p->cancelled = 1;
	wait_push_front(e, p);
	return 0;
}

static void preempt(struct sm70_engine *e, int i);

int sm70_engine_park(struct sm70_engine *e, uint64_t id)
{
	struct seq **pp, *s = NULL;

	for (int i = 0; i < e->n_running && !s; i++)
		if (e->running[i]->id == id && !e->running[i]->cancelled) {
			s = e->running[i];
			preempt(e, i); /* frees its memory; it is now the waiting queue's head */
		}
	for (pp = &e->wait_head; !s && *pp; pp = &(*pp)->next)
		if ((*pp)->id == id && !(*pp)->cancelled)
			s = *pp;
	if (!s)
		return -ENOENT;
	/* out of the waiting queue (where preempt just put it, or where it was) */
	for (pp = &e->wait_head; *pp != s; pp = &(*pp)->next)
		;
	*pp = s->next;
	e->n_waiting--;
	e->wait_tail = NULL;
	for (struct seq *w = e->wait_head; w; w = w->next)
		e->wait_tail = w;
	s->next = e->parked;
	e->parked = s;
	e->n_parked++;
	e->stats.parks++;
	return 0;
}

int sm70_engine_unpark(struct sm70_engine *e, uint64_t id, int front)
{
	struct seq *s = parked_take(e, id);

	if (!s)
		return -ENOENT;
	if (front)
		wait_push_front(e, s);
	else
		wait_push_back(e, s);
	return 0;
}

int sm70_engine_is_running(const struct sm70_engine *e, uint64_t id)
{
	for (int i = 0; i < e->n_running; i++)
		if (e->running[i]->id == id)
			return 1;
	return 0;
}

int sm70_engine_busy(const struct sm70_engine *e)
{
	return e->n_running > 0 || e->n_waiting > 0;
}

void sm70_engine_get_stats(const struct sm70_engine *e, struct sm70_engine_stats *s)
{
	*s = e->stats;
	s->running = e->n_running;
	s->waiting = e->n_waiting;
	s->parked = e->n_parked;
	s->kv_blocks_free = sm70_block_pool_available(&e->pool);
	s->state_slots_free = e->n_free_slots;
	s->state_bytes = sm70_model_state_bytes(e->model);
	s->pinned_bytes = e->model->pinned_bytes;
	s->kv_bytes = (uint64_t)sm70_model_kv_block_bytes(e->model) * (uint64_t)e->pool.n_blocks;
	s->prefix_evictions = e->pool.evictions;
	s->prefix_key_mismatches = e->pool.key_mismatches;
	s->weight_bytes = sm70_model_weight_bytes(e->model);
	/* expert_bytes is the step's (sm70_engine_step keeps it): reading the counts here
	 * would download from the device, a synchronisation on every status call */
	s->tp = e->model->tp;
	s->clamped_weights = e->model->clamped_values;
	s->graph_replays = e->model->graph_replays;
	s->graph_captures = e->model->graph_captures;
}

/*
 * Samples out row o of a step run over several ranks from the ranks' summaries; when they
 * cannot decide (sampler_tp.h), from the row gathered whole. Returns 0 or -errno.
 */
static int sample_sharded(struct sm70_engine *e, int o, const struct seq *s,
			  struct sm70_sample_result *res)
{
	const struct sm70_shard_summary *sh[SM70_MAX_TP];
	int tp = e->model->tp, ret;

	for (int r = 0; r < tp; r++)
		sh[r] = &e->shards[(size_t)r * e->step_n_out + o];
	ret = sm70_sample_shards(sh, tp, e->model->cfg.vocab_size, &s->req.sampling,
				 (uint64_t)s->n_gen, res);
	if (ret != -ERANGE)
		return ret;
	e->stats.shard_fallbacks++;
	ret = sm70_model_row_logits(e->model, o, e->logits);
	if (ret)
		return ret;
	return sm70_sample(e->sampler, e->logits, &s->req.sampling, (uint64_t)s->n_gen, res);
}

static void emit_final(struct sm70_engine *e, struct seq *s, enum sm70_finish f,
		       sm70_event_fn fn, void *ctx)
{
	struct sm70_event ev = {
		.id = s->id,
		.tag = s->req.tag,
		.sample = { .token = -1 },
		.finish = f,
		.prompt_tokens = s->n_prompt,
		.completion_tokens = s->n_gen,
		.cached_tokens = s->cached_tokens,
	};
	fn(ctx, &ev);
}

/*
 * Why out row o of the step could not be sampled, into e->msg: the step, the sequence and,
 * where the logits are on the host, how many are NaN or infinite. Only on the error path:
 * a model whose weights are finite can still overflow in its activations.
 */
static const char *describe_sampling_error(struct sm70_engine *e, const struct seq *s, int o,
					   int ret)
{
	int len = snprintf(e->msg, sizeof(e->msg), "no token could be sampled at engine step "
			   "%llu (request %llu, position %d, %d tokens generated): ",
			   (unsigned long long)e->stats.steps, (unsigned long long)s->id,
			   s->n_toks, s->n_gen);
	size_t left = len > 0 && (size_t)len < sizeof(e->msg) ? sizeof(e->msg) - (size_t)len : 0;

	if (!e->model->rank[0].shards && !e->model->rank[0].sample_out) {
		const float *row = e->logits + (size_t)o * e->model->cfg.vocab_size;
		int nan = 0, pinf = 0, ninf = 0, V = e->model->cfg.vocab_size;

		for (int i = 0; i < V; i++) {
			nan += isnan(row[i]) != 0;
			pinf += isinf(row[i]) && row[i] > 0;
			ninf += isinf(row[i]) && row[i] < 0;
		}
		if (nan || pinf || ninf)
			snprintf(e->msg + len, left, "non-finite logits: %d NaN, %d +inf, %d -inf "
				 "of %d (the model overflowed)", nan, pinf, ninf, V);
		else
			snprintf(e->msg + len, left, "the sampler refused the row: %s",
				 strerror(-ret));
	} else if (e->model->rank[0].sample_out) {
		snprintf(e->msg + len, left, "the device sampler returned no token (non-finite "
			 "logits?)");
	} else {
		snprintf(e->msg + len, left, "sampling the ranks' shards failed: %s (non-finite "
			 "logits?)", strerror(-ret));
	}
	return e->msg;
}

static void running_remove(struct sm70_engine *e, int i)
{
	memmove(&e->running[i], &e->running[i + 1],
		sizeof(*e->running) * (size_t)(e->n_running - i - 1));
	e->n_running--;
}

/* Ends cancelled requests, running or waiting. Returns the events emitted. */
static int reap_cancelled(struct sm70_engine *e, sm70_event_fn fn, void *ctx)
{
	int n = 0;
	struct seq **pp, *s;

	for (int i = e->n_running - 1; i >= 0; i--) {
		s = e->running[i];
		if (!s->cancelled)
			continue;
		running_remove(e, i);
		emit_final(e, s, SM70_FINISH_CANCELLED, fn, ctx);
		seq_destroy(e, s);
		n++;
	}
	for (pp = &e->wait_head; (s = *pp);) {
		if (!s->cancelled) {
			e->wait_tail = s;
			pp = &s->next;
			continue;
		}
		*pp = s->next;
		e->n_waiting--;
		emit_final(e, s, SM70_FINISH_CANCELLED, fn, ctx);
		seq_destroy(e, s);
		n++;
	}
	if (!e->wait_head)
		e->wait_tail = NULL;
	return n;
}

/* Finds the longest cached prefix of s in its domain: fills e->hit_ids and returns the
 * count, with the key and publication serial of the last hit. Each hit's tokens are
 * compared with s's (in the pool's lookup), so a key never stands in for the prompt. Only
 * blocks that end before the last token count: that token must be computed to get the
 * logits of the next one. */
static int find_prefix(struct sm70_engine *e, const struct seq *s, struct sm70_block_key *key,
		       uint64_t *serial, int *parked)
{
	struct sm70_block_key k = { 0, 0 };
	uint64_t ser = 0;
	int n = 0;

	*parked = 0;
	if (e->pool.caching) {
		while ((n + 1) * e->bs <= s->n_toks - 1 && n < s->cap_blocks) {
			const int32_t *t = s->toks + n * e->bs;
			struct sm70_block_key next = sm70_block_key_next(&e->pool,
									 s->req.cache_domain, k,
									 t, e->bs);
			uint64_t next_ser;
			int32_t id = sm70_block_pool_lookup(&e->pool, next, s->req.cache_domain,
							    ser, t, &next_ser);
			if (id < 0)
				break;
			*parked += e->pool.refs[id] == 0;
			e->hit_ids[n++] = id;
			k = next;
			ser = next_ser;
		}
	}
	*key = k;
	*serial = ser;
	return n;
}

/* FCFS admission: the queue head goes in when all its tokens' blocks fit (counting those
 * the prefix cache already holds); nobody jumps the queue, so a long prompt is never
 * starved by short ones. */
static int admit(struct sm70_engine *e, sm70_event_fn fn, void *ctx)
{
	int n_ev = 0;

	while (e->wait_head && e->n_running < e->opts.max_seqs &&
	       (!e->model->n_state_slots || e->n_free_slots > 0)) {
		struct seq *s = e->wait_head;
		int need = blocks_for(e, s->n_toks), hits, parked;
		struct sm70_block_key key;
		uint64_t serial;

		if (need > e->pool.n_blocks || need > s->cap_blocks) {
			/* Only a preempted request that outgrew the whole cache gets here (one
			 * that reached the context ends with LENGTH before it needs the block). */
			wait_pop(e);
			emit_final(e, s, SM70_FINISH_NO_MEMORY, fn, ctx);
			seq_destroy(e, s);
			n_ev++;
			continue;
		}
		hits = find_prefix(e, s, &key, &serial, &parked);
		/* Parked hits stop being available once taken. */
		if (need - hits > sm70_block_pool_available(&e->pool) - parked)
			break;
		wait_pop(e);
		if (e->model->n_state_slots)
			s->state_slot = e->free_slots[--e->n_free_slots];
		for (int i = 0; i < hits; i++) {
			sm70_block_pool_ref(&e->pool, e->hit_ids[i]);
			s->blocks[s->n_blocks++] = e->hit_ids[i];
		}
		s->n_cached = s->n_keyed = hits;
		s->n_cached *= e->bs;
		s->key = key;
		s->serial = serial;
		if (s->n_gen == 0) /* first admission, not a recompute after preemption */
			s->cached_tokens = s->n_cached < s->n_prompt ? s->n_cached : s->n_prompt;
		if (e->pool.caching) {
			e->stats.prefix_queries++;
			e->stats.prefix_query_tokens += (uint64_t)s->n_toks;
			e->stats.prefix_hits += hits > 0;
			e->stats.prefix_hit_blocks += (uint64_t)hits;
		}
		e->stats.prefix_hit_tokens += (uint64_t)s->n_cached;
		for (int i = hits; i < need; i++)
			seq_add_block(e, s); /* cannot fail: checked above */
		if (s->req.bench_skip_prefill) {
			s->n_cached = s->n_toks - 1;
			s->no_publish = 1;
		}
		e->running[e->n_running++] = s;
	}
	return n_ev;
}

/* Publishes the blocks s has filled since the last call under their prefix keys. */
static void publish_full_blocks(struct sm70_engine *e, struct seq *s)
{
	/* A skipped prefill left whatever the cache held, and a warm-up prompt is no one's:
	 * never share those blocks. */
	if (!e->pool.caching || s->no_publish)
		return;
	while ((s->n_keyed + 1) * e->bs <= s->n_cached) {
		const int32_t *t = s->toks + s->n_keyed * e->bs;

		s->key = sm70_block_key_next(&e->pool, s->req.cache_domain, s->key, t, e->bs);
		/* the next block's parent: this block's publication, or an equal one's */
		s->serial = sm70_block_pool_publish(&e->pool, s->blocks[s->n_keyed], s->key,
						    s->req.cache_domain, s->serial, t);
		s->n_keyed++;
	}
}

static void preempt(struct sm70_engine *e, int i)
{
	struct seq *s = e->running[i];

	running_remove(e, i);
	seq_free_blocks(e, s);
	wait_push_front(e, s);
	e->stats.preemptions++;
}

/* Makes sure every decode has a block for its next position, preempting the newest
 * running sequences when the pool is empty. */
static void reserve_decode_blocks(struct sm70_engine *e)
{
	for (int i = 0; i < e->n_running; i++) {
		struct seq *s = e->running[i];

		while (blocks_for(e, s->n_toks) > s->n_blocks) {
			if (s->n_blocks >= s->cap_blocks) {
				/* It outgrew what the cache can ever give one sequence: only it
				 * leaves, and admit() ends it with NO_MEMORY. */
				preempt(e, i--);
				break;
			}
			if (seq_add_block(e, s) == 0)
				continue;
			preempt(e, e->n_running - 1);
			if (i >= e->n_running)
				return; /* s itself was the newest */
		}
	}
}

static int is_stop(const struct sm70_engine *e, const struct seq *s, int32_t tok)
{
	const struct sm70_model_config *c = &e->model->cfg;

	if (!s->req.ignore_eos)
		for (int i = 0; i < c->n_eos; i++)
			if (c->eos_ids[i] == tok)
				return 1;
	for (int i = 0; i < s->req.n_stop; i++)
		if (s->req.stop_ids[i] == tok)
			return 1;
	return 0;
}

/* CLOCK_MONOTONIC in nanoseconds, for the step statistics. */
static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

int sm70_engine_step(struct sm70_engine *e, sm70_event_fn fn, void *ctx)
{
	const struct sm70_model_config *c = &e->model->cfg;
	int n_ev, T = 0, S = 0, n_out = 0, max_blocks = 1, max_pos = 0;
	int budget = e->opts.max_batch_tokens;
	const uint64_t t_step = now_ns();
	uint64_t t_fwd;
	struct sm70_step st;
	int ret;

	n_ev = reap_cancelled(e, fn, ctx);
	n_ev += admit(e, fn, ctx);
	reserve_decode_blocks(e);
	if (e->n_running == 0)
		return n_ev;

	/* Decodes first (one token each), then prefill chunks in admission order. */
	int n_decode = 0, n_chunks = 0;
	for (int pass = 0; pass < 2; pass++) {
		for (int i = 0; i < e->n_running && budget > 0; i++) {
			struct seq *s = e->running[i];
			int pending = s->n_toks - s->n_cached;
			int take;

			if ((pass == 0) != (pending == 1))
				continue;
			take = pending < budget ? pending : budget;
			if (pass == 0) {
				n_decode++;
			} else {
				e->chunk_first[n_chunks] = T;
				e->chunk_len[n_chunks++] = take;
			}
			for (int k = 0; k < take; k++) {
				int pos = s->n_cached + k;
				e->tok_ids[T] = s->toks[pos];
				e->tok_pos[T] = pos;
				e->tok_seq[T] = S;
				e->tok_slot[T] = s->blocks[pos / e->bs] * e->bs + pos % e->bs;
				T++;
			}
			if (s->n_cached + take > max_pos)
				max_pos = s->n_cached + take;
			if (s->n_cached + take == s->n_toks) {
				e->rows[n_out] = (struct sm70_sample_row){
					.temperature = s->req.sampling.temperature,
					.top_k = s->req.sampling.top_k,
					.top_p = s->req.sampling.top_p,
					.top_logprobs = s->req.sampling.top_logprobs,
					.seed = s->req.sampling.seed,
					.n = (uint64_t)s->n_gen,
				};
				e->out_rows[n_out++] = T - 1;
			}
			if (s->n_blocks > max_blocks)
				max_blocks = s->n_blocks;
			e->seq_state[S] = s->state_slot;
			e->step_seqs[S] = s;
			e->step_take[S] = take;
			S++;
			budget -= take;
		}
	}
	for (int j = 0; j < S; j++) {
		struct seq *s = e->step_seqs[j];
		int32_t *row = e->tables + (size_t)j * max_blocks;
		memcpy(row, s->blocks, sizeof(int32_t) * (size_t)s->n_blocks);
		for (int k = s->n_blocks; k < max_blocks; k++)
			row[k] = 0; /* never read: positions stop at the sequence's length */
	}

	st = (struct sm70_step){
		.n_tokens = T, .n_seqs = S, .max_blocks = max_blocks, .max_pos = max_pos,
		.tok_ids = e->tok_ids, .tok_pos = e->tok_pos, .tok_seq = e->tok_seq,
		.tok_slot = e->tok_slot, .block_tables = e->tables,
		.n_out = n_out, .out_rows = e->out_rows,
		.n_decode = n_decode, .n_chunks = n_chunks,
		.chunk_first = e->chunk_first, .chunk_len = e->chunk_len,
		.seq_state = e->model->n_state_slots ? e->seq_state : NULL,
	};
	e->step_n_out = n_out;
	t_fwd = now_ns();
	if (e->model->rank[0].shards)
		ret = sm70_model_forward_shards(e->model, &st, e->rows, e->shards);
	else if (e->model->rank[0].sample_out)
		ret = sm70_model_forward_sample(e->model, &st, e->rows, e->results);
	else
		ret = sm70_model_forward(e->model, &st, e->logits);
	if (ret)
		return ret;
	e->stats.forward_ns += now_ns() - t_fwd;
	e->stats.steps++;
	/* The experts this step's routing read: the counts are on the device, and the step
	 * has waited for it already (its sampled tokens), so the download waits for nothing
	 * but the copy; still, a copy and a sync cost ~15 us, 0.4% of a 30B-A3B step at B1,
	 * so they are taken every 16th step and whenever the step's size changes. Kept here
	 * so that sm70_engine_get_stats never touches the device. */
	if (c->moe.n_moe_layers && (e->stats.steps % 16 == 1 || T != e->expert_bytes_tokens)) {
		e->stats.expert_bytes = sm70_model_expert_bytes(e->model);
		e->expert_bytes_tokens = T;
	}

	/* Sample in batch order; finished sequences leave the running set afterwards. */
	for (int j = 0, o = 0; j < S; j++) {
		struct seq *s = e->step_seqs[j];
		struct sm70_event ev = { .id = s->id, .tag = s->req.tag };
		int32_t tok;

		s->n_cached += e->step_take[j];
		e->stats.computed_tokens += (uint64_t)e->step_take[j];
		publish_full_blocks(e, s);
		if (s->n_cached < s->n_toks)
			continue; /* mid-prefill: no token yet */
		if (e->model->rank[0].shards) {
			ret = sample_sharded(e, o, s, &ev.sample);
		} else if (e->model->rank[0].sample_out) {
			ev.sample = e->results[o];
			ret = ev.sample.token >= 0 && ev.sample.token < c->vocab_size ? 0 : -EINVAL;
		} else {
			ret = sm70_sample(e->sampler, e->logits + (size_t)o * c->vocab_size,
					  &s->req.sampling, (uint64_t)s->n_gen, &ev.sample);
		}
		if (ret) {
			/* NaN/inf logits: nothing to sample from; end this request, not others */
			struct sm70_event fin = {
				.id = s->id, .tag = s->req.tag, .sample = { .token = -1 },
				.finish = SM70_FINISH_ERROR, .prompt_tokens = s->n_prompt,
				.completion_tokens = s->n_gen, .cached_tokens = s->cached_tokens,
				.message = describe_sampling_error(e, s, o, ret),
			};
			o++;
			s->finished = 1;
			e->stats.errors++;
			fn(ctx, &fin);
			n_ev++;
			continue;
		}
		o++;
		tok = ev.sample.token;
		s->toks[s->n_toks++] = tok;
		s->n_gen++;
		e->stats.generated_tokens++;
		if (is_stop(e, s, tok))
			ev.finish = SM70_FINISH_STOP;
		else if (s->n_gen >= s->req.max_new_tokens || s->n_toks >= s->cap_toks)
			ev.finish = SM70_FINISH_LENGTH;
		ev.prompt_tokens = s->n_prompt;
		ev.completion_tokens = s->n_gen;
		ev.cached_tokens = s->cached_tokens;
		s->finished = ev.finish != SM70_FINISH_NONE;
		fn(ctx, &ev);
		n_ev++;
	}
	for (int i = e->n_running - 1; i >= 0; i--) {
		struct seq *s = e->running[i];
		if (s->finished) {
			running_remove(e, i);
			seq_destroy(e, s);
		}
	}
	e->stats.step_ns += now_ns() - t_step;
	return n_ev;
}

static void ignore_event(void *ctx, const struct sm70_event *ev)
{
}

/* Runs one throw-away request through a prefill chunk and a decode step (which also
 * captures the batch-1 graph), then forgets it: its blocks are never published and the
 * statistics start from zero. Returns 0 or -errno. */
static int warm_up(struct sm70_engine *e)
{
	int n = e->opts.max_batch_tokens < 256 ? e->opts.max_batch_tokens : 256;
	struct sm70_request r = { .max_new_tokens = 2, .ignore_eos = 1,
				  .sampling = { .top_p = 1.0f } };
	struct sm70_err err = { { 0 } };
	int32_t *prompt;
	uint64_t id;
	int ret;

	if (n > e->model->cfg.max_position - 3)
		n = e->model->cfg.max_position - 3;
	if (n < 1 || blocks_for(e, n + 2) > e->pool.n_blocks)
		return 0; /* too small a cache to bother */
	prompt = calloc((size_t)n, sizeof(*prompt));
	if (!prompt)
		return -ENOMEM;
	r.prompt = prompt;
	r.n_prompt = n;
	ret = sm70_engine_submit(e, &r, &id, &err);
	free(prompt);
	if (ret)
		return ret;
	e->wait_tail->no_publish = 1;
	while (sm70_engine_busy(e)) {
		ret = sm70_engine_step(e, ignore_event, NULL);
		if (ret < 0)
			return ret;
	}
	e->stats = (struct sm70_engine_stats){ .kv_blocks_total = e->pool.n_blocks };
	e->next_id = 1;
	return 0;
}
