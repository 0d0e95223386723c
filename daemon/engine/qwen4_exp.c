/*
 * qwen4_exp.c - the qwen4_exp family ("Flash Next": qwen4_exp_text and the
 * vision-language qwen4_exp layout) read from its checkpoint into the layer library's
 * decoder: Gated DeltaNet and QSA attention layers, MoE on every layer, the
 * hyper-connection mixers around each block and the final one, and the n-gram
 * embeddings (PLE) of the layers in ple_layer_ids. The forward is layers_hc.c's.
 *
 * The n-gram tables of every PLE layer share one page-locked host allocation the model
 * owns (m->pinned), filled once by rank 0 and registered with each rank's backend; a
 * table's rows may be stored in split_ngram_parts shards (ngram_embedding.shard_<i>),
 * concatenated in shard order, or as one tensor. The hash buffers transformers saves
 * (layer_multipliers, ngram_heads_vocab_sizes, ngram_heads_offsets) must equal what the
 * config derives, or the checkpoint is refused.
 *
 * Non-goals: the vision tower, multi-token prediction.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/engine/layers.h"
#include "daemon/engine/ple.h"

static const char *cat(char *buf, size_t n, const char *p, const char *suffix)
{
	snprintf(buf, n, "%s%s", p, suffix);
	return buf;
}

static int qwen4_check_tp(const struct sm70_model *m, struct sm70_err *err)
{
	return m->cfg.hybrid.gdn.n_k_heads % m->tp ?
		       sm70_errf(err, -EINVAL, "tensor parallelism %d needs the DeltaNet key "
				 "heads (%d) to divide evenly", m->tp, m->cfg.hybrid.gdn.n_k_heads) :
		       0;
}

/* A mixer at name prefix p ("...attn_hyper_connection."): norm, down (| inject), up. */
static int load_hc(struct sm70_model *m, int r, const struct sm70_ckpt *ck, const char *p,
		   int inject, struct sm70_hc_weights *w, struct sm70_err *err)
{
	const struct sm70_qwen4_config *q = &m->cfg.q4;
	int SH = q->hc * m->cfg.hidden_size, R = q->hc_rank, ret;
	char nn[192], nd[192], ni[192], nu[192];

	ret = sm70__norm_load(m, r, ck, &w->norm, cat(nn, sizeof(nn), p, "hc_norm.weight"), SH,
			      err);
	if (ret)
		return ret;
	{
		struct sm70_weight_part parts[2] = {
			{ cat(nd, sizeof(nd), p, "input_mix_weight_down.weight"), R, 0, R },
			{ cat(ni, sizeof(ni), p, "block_inject_weight.weight"), q->hc, 0, q->hc },
		};
		ret = sm70__weight_load(m, r, ck, &w->mix, parts, inject ? 2 : 1, SH, 0, SH, err);
		if (ret)
			return ret;
	}
	{
		struct sm70_weight_part up[1] = {
			{ cat(nu, sizeof(nu), p, "input_mix_weight_up.weight"), SH, 0, SH },
		};
		return sm70__weight_load(m, r, ck, &w->up, up, 1, R, 0, R, err);
	}
}

/* A stored hash buffer (int64 [n]) must equal the derived one. */
static int check_hash_buffer(const struct sm70_ckpt *ck, const char *name, const uint64_t *want,
			     int n, struct sm70_err *err)
{
	const struct sm70_st_tensor *t = sm70_ckpt_find(ck, name);
	int64_t v;

	if (!t)
		return 0;
	if (t->dtype != SM70_DTYPE_I64 || t->ndim != 1 || t->shape[0] != n)
		return sm70_errf(err, -EINVAL, "tensor %s in %s must be int64 [%d]", name, t->file,
				 n);
	for (int i = 0; i < n; i++) {
		/* through memcpy: a safetensors tensor starts at any byte offset */
		memcpy(&v, (const char *)t->data + (size_t)i * sizeof(v), sizeof(v));
		if ((uint64_t)v != want[i])
			return sm70_errf(err, -EINVAL, "tensor %s in %s holds %lld at %d, but the "
					 "config (seed, ngram_size, ngram_vocab_size_base, "
					 "ple_layer_ids) gives %llu", name, t->file, (long long)v, i,
					 (unsigned long long)want[i]);
	}
	return 0;
}

/* The shards of one table, in order: how many, and their total rows. Checks each. */
static int table_shards(const struct sm70_model *m, const struct sm70_ckpt *ck, const char *p,
			int row_dim, const struct sm70_st_tensor **sh, int max, int *n,
			struct sm70_err *err)
{
	char name[224];

	*n = 0;
	for (int i = 0; i < max; i++) {
		snprintf(name, sizeof(name), "%sple.ple_embedding.ngram_embedding.shard_%d.weight",
			 p, i);
		if (!(sh[*n] = sm70_ckpt_find(ck, name)))
			break;
		(*n)++;
	}
	if (*n == 0) {
		snprintf(name, sizeof(name), "%sple.ple_embedding.ngram_embedding.weight", p);
		if (!(sh[0] = sm70_ckpt_find(ck, name)))
			return sm70_errf(err, -ENOENT, "missing tensor %s (or its shards "
					 "%sple.ple_embedding.ngram_embedding.shard_<i>.weight) in %s",
					 name, p, sm70_ckpt_dir(ck));
		*n = 1;
	}
	for (int i = 0; i < *n; i++) {
		const struct sm70_st_tensor *t = sh[i];
		if (t->ndim != 2 || t->shape[1] != row_dim ||
		    (t->dtype != SM70_DTYPE_F32 && t->dtype != SM70_DTYPE_F16 &&
		     t->dtype != SM70_DTYPE_BF16) || t->dtype != sh[0]->dtype)
			return sm70_errf(err, -EINVAL, "tensor %s in %s must be a 2-D f32/f16/bf16 "
					 "table of %d columns, of one dtype with its other shards",
					 t->name, t->file, row_dim);
	}
	return 0;
}

/*
 * Rank 0: the n-gram tables of every PLE layer into one page-locked allocation (dummy
 * mode: deterministic bf16 values), their places recorded in each layer's hash.
 */
static int load_tables(struct sm70_model *m, const struct sm70_ckpt *ck, struct sm70_decoder *d,
		       struct sm70_err *err)
{
	const struct sm70_model_config *c = &m->cfg;
	const struct sm70_qwen4_config *q = &c->q4;
	int row_dim = q->ple_dim / ((q->ngram - 1) * q->heads_per_ngram);
	enum { MAX_SHARDS = 65536 };
	const struct sm70_st_tensor **sh = calloc(MAX_SHARDS, sizeof(*sh));
	size_t off[SM70_MAX_LAYERS], total = 0;
	int ret = 0;

	if (!sh)
		return -ENOMEM;
	/* first the layout: every table's rows and dtype */
	for (int l = 0; l < c->n_layers && !ret; l++) {
		struct sm70_ple_hash *h = &d->layers[l].ple.hash;
		struct sm70_ple_params pp;
		char p[96];
		int n = 0;

		if (q->ple_index[l] < 0)
			continue;
		ret = sm70__ple_params(c, q->ple_index[l], &pp, err);
		if (ret)
			break;
		h->rows = (int64_t)pp.rows;
		h->row_dim = row_dim;
		h->table_dtype = SM70_DTYPE_BF16;
		sm70__ple_params_free(&pp);
		sm70__layer_prefix(p, sizeof(p), "model.", l);
		if (!m->opts.dummy) {
			int64_t rows = 0;
			ret = table_shards(m, ck, p, row_dim, sh, MAX_SHARDS, &n, err);
			for (int i = 0; !ret && i < n; i++)
				rows += sh[i]->shape[0];
			if (!ret && rows != h->rows)
				ret = sm70_errf(err, -EINVAL, "the n-gram table of layer %d has %lld "
						"rows in %d shard(s), the config's hash needs %lld", l,
						(long long)rows, n, (long long)h->rows);
			if (!ret)
				h->table_dtype = sh[0]->dtype;
		}
		off[l] = total;
		total += (size_t)h->rows * (size_t)row_dim * sm70_dtype_size(h->table_dtype);
	}
	if (m->opts.check_only) { /* the shards' names, shapes and dtypes are checked */
		free(sh);
		return ret;
	}
	if (!ret && !(m->pinned = sm70__pinned_alloc(total, err)))
		ret = -ENOMEM;
	if (!ret)
		m->pinned_bytes = total;
	/* then the rows */
	for (int l = 0; l < c->n_layers && !ret; l++) {
		struct sm70_ple_hash *h = &d->layers[l].ple.hash;
		char p[96], *dst;
		int n = 0;

		if (q->ple_index[l] < 0)
			continue;
		dst = (char *)m->pinned + off[l];
		h->table = dst;
		if (m->opts.dummy) {
			sm70__ple_dummy_fill(dst, h->table_dtype, (size_t)h->rows * row_dim,
					     m->opts.dummy_seed ^ (uint64_t)(l + 1) * 0x9E3779B9ull,
					     0.08f);
			continue;
		}
		sm70__layer_prefix(p, sizeof(p), "model.", l);
		ret = table_shards(m, ck, p, row_dim, sh, MAX_SHARDS, &n, err);
		for (int i = 0; !ret && i < n; i++) {
			memcpy(dst, sh[i]->data, sh[i]->nbytes);
			dst += sh[i]->nbytes;
		}
	}
	free(sh);
	return ret;
}

/* Layer l's PLE: projections, norms, conv, and the hash parameters in backend memory. */
static int load_ple(struct sm70_model *m, int r, const struct sm70_ckpt *ck, const char *p,
		    int l, struct sm70_ple_weights *w, const struct sm70_ple_hash *table,
		    struct sm70_err *err)
{
	const struct sm70_qwen4_config *q = &m->cfg.q4;
	struct sm70_backend *be = m->rank[r].be;
	int H = m->cfg.hidden_size, SH = q->hc * H, E = q->ple_dim, ret;
	struct sm70_ple_params pp;
	char n1[192], n2[192], n3[192];

	{
		struct sm70_weight_part k[1] = { { cat(n1, sizeof(n1), p, "ple.key_proj.weight"),
						   SH, 0, SH } };
		struct sm70_weight_part v[1] = { { cat(n2, sizeof(n2), p, "ple.value_proj.weight"),
						   H, 0, H } };
		if ((ret = sm70__weight_load(m, r, ck, &w->key, k, 1, E, 0, E, err)) ||
		    (ret = sm70__weight_load(m, r, ck, &w->value, v, 1, E, 0, E, err)))
			return ret;
	}
	if ((ret = sm70__norm_load(m, r, ck, &w->norm_key, cat(n1, sizeof(n1), p,
							       "ple.norm_key.weight"), SH, err)) ||
	    (ret = sm70__norm_load(m, r, ck, &w->norm_query, cat(n1, sizeof(n1), p,
								 "ple.norm_query.weight"), SH,
				   err)) ||
	    (ret = sm70__norm_load(m, r, ck, &w->norm_conv, cat(n1, sizeof(n1), p,
								"ple.norm_conv.weight"), SH, err)))
		return ret;
	{
		int64_t shape[3] = { SH, 1, q->ple_conv_k };
		struct sm70_row_band all = { 0, SH };
		ret = sm70__f32_load(m, r, ck, &w->conv, cat(n1, sizeof(n1), p, "ple.conv1d.weight"),
				     3, shape, &all, 1, 0.0f, 0.0f, 0.3f, err);
		if (ret)
			return ret;
	}
	ret = sm70__ple_params(&m->cfg, q->ple_index[l], &pp, err);
	if (ret)
		return ret;
	if (!m->opts.dummy &&
	    ((ret = check_hash_buffer(ck, cat(n1, sizeof(n1), p,
					      "ple.ple_embedding.layer_multipliers"), pp.mult,
				      q->ngram, err)) ||
	     (ret = check_hash_buffer(ck, cat(n2, sizeof(n2), p,
					      "ple.ple_embedding.ngram_heads_vocab_sizes"), pp.size,
				      pp.n_heads, err)) ||
	     (ret = check_hash_buffer(ck, cat(n3, sizeof(n3), p,
					      "ple.ple_embedding.ngram_heads_offsets"), pp.offset,
				      pp.n_heads, err)))) {
		sm70__ple_params_free(&pp);
		return ret;
	}
	w->hash = *table;
	w->hash.ngram = q->ngram;
	w->hash.heads_per_ngram = q->heads_per_ngram;
	w->hash.eos = q->ple_eos;
	{
		size_t nm = sizeof(uint64_t) * (size_t)q->ngram, nh = sizeof(uint64_t) * pp.n_heads;
		uint64_t *mult = be->ops->buf_alloc(be, nm), *size = be->ops->buf_alloc(be, nh);
		uint64_t *offset = be->ops->buf_alloc(be, nh);

		w->hash.mult = mult;
		w->hash.size = size;
		w->hash.offset = offset;
		if (!mult || !size || !offset)
			ret = sm70_errf(err, -ENOMEM, "cannot allocate the n-gram hash of layer %d "
					"on %s", l, be->name);
		if (!ret && ((ret = be->ops->upload(be, mult, pp.mult, nm)) ||
			     (ret = be->ops->upload(be, size, pp.size, nh)) ||
			     (ret = be->ops->upload(be, offset, pp.offset, nh))))
			sm70_errf(err, ret, "cannot upload the n-gram hash of layer %d", l);
	}
	sm70__ple_params_free(&pp);
	return ret;
}

/* The rows gather_rows reads to repeat each token's embedding into every stream. */
static int load_rep(struct sm70_model *m, int r, struct sm70_decoder *d, struct sm70_err *err)
{
	struct sm70_backend *be = m->rank[r].be;
	size_t n = (size_t)m->opts.max_tokens * m->cfg.q4.hc;
	int32_t *h = malloc(n * sizeof(*h));
	int ret;

	d->hc_rep = be->ops->buf_alloc(be, n * sizeof(int32_t));
	if (!h || !d->hc_rep) {
		free(h);
		return sm70_errf(err, -ENOMEM, "cannot allocate the stream map on %s", be->name);
	}
	for (size_t i = 0; i < n; i++)
		h[i] = (int32_t)(i / (size_t)m->cfg.q4.hc);
	ret = be->ops->upload(be, d->hc_rep, h, n * sizeof(*h));
	free(h);
	return ret;
}

static int qwen4_load_layers(struct sm70_model *m, int r, const struct sm70_ckpt *ck,
			     struct sm70_decoder *d, struct sm70_err *err)
{
	const struct sm70_model_config *c = &m->cfg;
	const struct sm70_decoder *d0 = m->rank[0].arch_state; /* rank 0's tables */
	char p[96], n[192];
	int ret = 0;

	for (int l = 0; !ret && l < c->n_layers; l++) {
		struct sm70_layer_weights *L = &d->layers[l];

		sm70__layer_prefix(p, sizeof(p), "model.", l);
		ret = load_hc(m, r, ck, cat(n, sizeof(n), p, "attn_hyper_connection."), 1,
			      &L->hc_attn, err);
		if (!ret)
			ret = load_hc(m, r, ck, cat(n, sizeof(n), p, "mlp_hyper_connection."), 1,
				      &L->hc_mlp, err);
		if (!ret)
			ret = c->layer_kind[l] == SM70_LAYER_GDN ?
				      sm70__load_gdn(m, r, ck, p, &L->gdn, err) :
				      sm70__load_attention(m, r, ck, p, &L->attn, err);
		if (!ret)
			ret = sm70__load_ffn(m, r, ck, p, l, L, err);
		if (!ret && c->q4.ple_index[l] >= 0)
			ret = load_ple(m, r, ck, p, l, &L->ple,
				       r == 0 ? &L->ple.hash : &d0->layers[l].ple.hash, err);
	}
	return ret;
}

static int qwen4_load(struct sm70_model *m, int r, const struct sm70_ckpt *ck, void **state,
		      struct sm70_err *err)
{
	struct sm70_backend *be = m->rank[r].be;
	struct sm70_decoder *d = sm70__decoder_new(m->cfg.n_layers);
	int ret;

	if (!d)
		return -ENOMEM;
	ret = sm70__load_embed_head(m, r, ck, d, "model.", 0, err);
	if (!ret)
		ret = load_hc(m, r, ck, "model.hyper_connection_mixer.", 0, &d->hc_final, err);
	if (!ret)
		ret = load_rep(m, r, d, err);
	if (!ret && r == 0 && m->cfg.q4.n_ple)
		ret = load_tables(m, ck, d, err);
	if (!ret && m->pinned && be->ops->host_register &&
	    (ret = be->ops->host_register(be, m->pinned, m->pinned_bytes)))
		sm70_errf(err, ret, "cannot register the n-gram tables (%zu MiB of host memory) "
			  "with %s (rank %d)", m->pinned_bytes >> 20, be->name, r);
	if (!ret)
		ret = qwen4_load_layers(m, r, ck, d, err);
	if (ret) {
		if (m->pinned && be->ops->host_unregister)
			be->ops->host_unregister(be, m->pinned);
		sm70__decoder_free(m, r, d);
		return ret;
	}
	*state = d;
	return 0;
}

static void qwen4_unload(struct sm70_model *m, int r, void *state)
{
	struct sm70_backend *be = m->rank[r].be;

	if (m->pinned && be->ops->host_unregister)
		be->ops->host_unregister(be, m->pinned);
	sm70__decoder_free(m, r, state);
}

const struct sm70_arch_ops sm70__arch_qwen4_exp = {
	.name = "qwen4_exp",
	.check_tp = qwen4_check_tp,
	.load = qwen4_load,
	.unload = qwen4_unload,
	.workspace_bytes = sm70__decoder_workspace_bytes,
	.forward = sm70__decoder_forward,
	.weight_bytes = sm70__decoder_weight_bytes,
	.expert_bytes = sm70__decoder_expert_bytes,
};
