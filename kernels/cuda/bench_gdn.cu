/*
 * bench_gdn.cu - what `sm70-bench gdn` times (see bench.h): the gdn op on decode batches
 * and on one long prefill chunk, through the backend sm70__bench_open made, on its stream.
 *
 * Decode: `batch` tokens of `batch` sequences mid-sequence, so each reads and writes its
 * slot's whole f32 state. The state copies rotate (every launch uses other slots) over
 * three L2s' worth, so no launch finds its state in L2. A sample is `per` launches, either
 * captured into one CUDA graph and replayed (how the engine decodes) or queued one by one;
 * the figure is the median sample over its launch count, after 3 warm-up samples.
 * Prefill: one chunk of `tokens` tokens of one sequence, in the chunked form and as the
 * recurrence (chunked = 0), and the same tokens as `tokens` one-token decode calls
 * captured into one graph; the chunked and recurrent results are compared in the same run.
 * Inputs are pseudo-random, made on the device by a hash.
 *
 * Non-goals: correctness beyond that comparison (tests/gpu/test_cuda_gdn.c).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/bench_util.h"
#include "kernels/cuda/cuda_check.h"

extern "C" {
#include "kernels/cuda/bench.h"
}


/* f16 (f32 when f32 is set) values uniform in [lo, hi). */
static __global__ void gb_fill_kernel(void *p, size_t n, uint64_t seed, float lo, float hi,
				      int f32)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x) {
		const float u = (float)(sm70__bench_hash(seed + i) >> 8) * 0x1p-24f;
		const float v = lo + (hi - lo) * u;

		if (f32)
			((float *)p)[i] = v;
		else
			((__half *)p)[i] = __float2half_rn(v);
	}
}

static int gb_fill(cudaStream_t s, void *p, size_t n, uint64_t seed, float lo, float hi,
		   int f32)
{
	gb_fill_kernel<<<1024, 256, 0, s>>>(p, n, seed, lo, hi, f32);
	return cudaGetLastError() == cudaSuccess ? 0 : -EIO;
}

static int gb_cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

/* Median microseconds of one unit: launch(ctx) queues one sample of `per` units. */
typedef int (*gb_launch_fn)(void *ctx);

static int gb_time(struct sm70_backend *be, gb_launch_fn launch, void *ctx, int per, int iters,
		   double *us)
{
	struct sm70__cuda *c = (struct sm70__cuda *)be->priv;
	double *t = (double *)calloc((size_t)iters, sizeof(double));
	cudaEvent_t e0 = NULL, e1 = NULL;
	int ret = 0;

	if (!t)
		return -ENOMEM;
	SM70_BENCH_CHECK(cudaEventCreate(&e0));
	SM70_BENCH_CHECK(cudaEventCreate(&e1));
	for (int it = -3; it < iters; it++) {
		float ms = 0.0f;

		SM70_BENCH_CHECK(cudaEventRecord(e0, c->stream));
		ret = launch(ctx);
		if (ret)
			goto out;
		SM70_BENCH_CHECK(cudaEventRecord(e1, c->stream));
		SM70_BENCH_CHECK(cudaEventSynchronize(e1));
		SM70_BENCH_CHECK(cudaEventElapsedTime(&ms, e0, e1));
		if (it >= 0)
			t[it] = (double)ms * 1e3 / per;
	}
	qsort(t, (size_t)iters, sizeof(double), gb_cmp);
	*us = t[iters / 2];
	if (c->sticky)
		ret = -EIO;
out:
	if (e1)
		cudaEventDestroy(e1);
	if (e0)
		cudaEventDestroy(e0);
	free(t);
	return ret;
}

/* A layer's inputs and state on the device. */
struct gb_layer {
	struct sm70_state_layout lay;
	struct sm70_state_layer st;
	int ba_ld;
	void *qkv, *ba, *out;
	float *a_log, *dt;
};

static int gb_layer_make(cudaStream_t s, struct gb_layer *g, int n_k, int n_v, int dk, int dv,
			 int n_slots, int tokens)
{
	const size_t per_slot = (size_t)n_v * dk * dv;
	int ret = 0;

	memset(g, 0, sizeof(*g));
	g->lay = (struct sm70_state_layout){ n_slots, 4, 2 * n_k * dk + n_v * dv, n_k, n_v, dk, dv };
	g->ba_ld = 2 * n_v;
	SM70_BENCH_CHECK(cudaMalloc(&g->st.ssm, (size_t)(n_slots + 1) * per_slot * 4));
	SM70_BENCH_CHECK(cudaMalloc(&g->qkv, (size_t)tokens * g->lay.conv_dim * 2));
	SM70_BENCH_CHECK(cudaMalloc(&g->ba, (size_t)tokens * g->ba_ld * 2));
	SM70_BENCH_CHECK(cudaMalloc(&g->out, (size_t)tokens * n_v * dv * 2));
	SM70_BENCH_CHECK(cudaMalloc(&g->a_log, (size_t)n_v * 4));
	SM70_BENCH_CHECK(cudaMalloc(&g->dt, (size_t)n_v * 4));
	/* |S| ~ 0.5, q k v in [-1, 1), b in [-3, 3), a in [-4, 2), A in [1, 2.7), dt_bias
	 * in [-1, 1): decays from about 0.9 to 0.1 a token */
	ret = gb_fill(s, g->st.ssm, (size_t)(n_slots + 1) * per_slot, 11, -0.5f, 0.5f, 1) ||
	      gb_fill(s, g->qkv, (size_t)tokens * g->lay.conv_dim, 12, -1.0f, 1.0f, 0) ||
	      gb_fill(s, g->ba, (size_t)tokens * g->ba_ld, 13, -3.0f, 3.0f, 0) ||
	      gb_fill(s, g->a_log, (size_t)n_v, 14, 0.0f, 1.0f, 1) ||
	      gb_fill(s, g->dt, (size_t)n_v, 15, -1.0f, 1.0f, 1) ?
		      -EIO :
		      0;
out:
	return ret;
}

static void gb_layer_free(struct gb_layer *g)
{
	if (g->dt)
		cudaFree(g->dt);
	if (g->a_log)
		cudaFree(g->a_log);
	if (g->out)
		cudaFree(g->out);
	if (g->ba)
		cudaFree(g->ba);
	if (g->qkv)
		cudaFree(g->qkv);
	if (g->st.ssm)
		cudaFree(g->st.ssm);
	memset(g, 0, sizeof(*g));
}

/* ---- decode -------------------------------------------------------------------------------- */

struct gb_decode {
	struct sm70_backend *be;
	struct gb_layer g;
	struct sm70_batch b[64]; /* one per state copy */
	int ncopies, per;
	void *graph;
};

static int gb_decode_eager(void *ctx)
{
	struct gb_decode *d = (struct gb_decode *)ctx;
	struct sm70_backend *be = d->be;

	for (int i = 0; i < d->per; i++)
		be->ops->gdn(be, d->g.out, d->g.qkv, d->g.ba, d->g.ba_ld, d->g.a_log, d->g.dt,
			     &d->g.st, &d->g.lay, &d->b[i % d->ncopies], 1);
	return ((struct sm70__cuda *)be->priv)->sticky;
}

static int gb_decode_graph(void *ctx)
{
	struct gb_decode *d = (struct gb_decode *)ctx;

	return d->be->ops->graph_launch(d->be, d->graph);
}

extern "C" int sm70__bench_gdn_decode(int n_k_heads, int n_v_heads, int k_dim, int v_dim,
				      int batch, int cols, int hints, int iters,
				      struct sm70__bench_gdn_decode *out)
{
	struct sm70_backend *be = sm70__bench_backend();
	struct sm70__cuda *c;
	struct gb_decode *d = NULL;
	const double per_slot = (double)n_v_heads * k_dim * v_dim * 4;
	int32_t *h = NULL, *ints = NULL;
	int ret = 0, l2 = 0;

	if (!be)
		return -ENODEV;
	c = (struct sm70__cuda *)be->priv;
	d = (struct gb_decode *)calloc(1, sizeof(*d));
	if (!d)
		return -ENOMEM;
	d->be = be;
	SM70_BENCH_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, c->device));
	d->ncopies = (int)(3.0 * l2 / (batch * per_slot)) + 1;
	if (d->ncopies < 2)
		d->ncopies = 2;
	if (d->ncopies > 64)
		d->ncopies = 64;
	d->per = d->ncopies < 16 ? (16 + d->ncopies - 1) / d->ncopies * d->ncopies : d->ncopies;
	ret = gb_layer_make(c->stream, &d->g, n_k_heads, n_v_heads, k_dim, v_dim,
			    batch * d->ncopies, batch);
	if (ret)
		goto out;
	/* ints: pos [batch], seq [batch], then seq_state [ncopies][batch] */
	h = (int32_t *)malloc((size_t)(2 + d->ncopies) * batch * 4);
	if (!h) {
		ret = -ENOMEM;
		goto out;
	}
	for (int s = 0; s < batch; s++) {
		h[s] = 1000 + 37 * s;
		h[batch + s] = s;
		for (int k = 0; k < d->ncopies; k++)
			h[(2 + k) * batch + s] = k * batch + s;
	}
	SM70_BENCH_CHECK(cudaMalloc(&ints, (size_t)(2 + d->ncopies) * batch * 4));
	SM70_BENCH_CHECK(cudaMemcpy(ints, h, (size_t)(2 + d->ncopies) * batch * 4,
				    cudaMemcpyHostToDevice));
	for (int k = 0; k < d->ncopies; k++)
		d->b[k] = (struct sm70_batch){ .n_tokens = batch, .n_seqs = batch, .max_blocks = 1,
					       .max_pos = 1000 + 37 * batch, .tok_ids = ints,
					       .tok_pos = ints, .tok_seq = ints + batch,
					       .tok_slot = ints, .block_tables = ints, .n_out = 0,
					       .out_rows = NULL, .n_decode = batch, .n_chunks = 0,
					       .seq_state = ints + (2 + k) * batch };
	sm70__cuda_gdn_tune(cols, hints);
	ret = gb_time(be, gb_decode_eager, d, d->per, iters, &out->us_eager);
	if (ret)
		goto out;
	SM70_BENCH_CHECK(cudaStreamSynchronize(c->stream));
	ret = be->ops->graph_begin(be);
	if (ret)
		goto out;
	gb_decode_eager(d);
	ret = be->ops->graph_end(be, &d->graph);
	if (ret)
		goto out;
	ret = gb_time(be, gb_decode_graph, d, d->per, iters, &out->us);
	out->bytes = 2.0 * batch * per_slot;
out:
	sm70__cuda_gdn_tune(0, -1);
	if (c)
		cudaStreamSynchronize(c->stream);
	if (d && d->graph)
		be->ops->graph_destroy(be, d->graph);
	if (ints)
		cudaFree(ints);
	free(h);
	if (d) {
		gb_layer_free(&d->g);
		free(d);
	}
	return ret;
}

/* ---- prefill ------------------------------------------------------------------------------- */

struct gb_prefill {
	struct sm70_backend *be;
	struct gb_layer g;
	struct sm70_batch chunk;
	int chunked;
	void *graph; /* the token-by-token decodes */
};

static int gb_prefill_chunk(void *ctx)
{
	struct gb_prefill *p = (struct gb_prefill *)ctx;
	struct sm70_backend *be = p->be;

	be->ops->gdn(be, p->g.out, p->g.qkv, p->g.ba, p->g.ba_ld, p->g.a_log, p->g.dt, &p->g.st,
		     &p->g.lay, &p->chunk, p->chunked);
	return ((struct sm70__cuda *)be->priv)->sticky;
}

static int gb_prefill_graph(void *ctx)
{
	struct gb_prefill *p = (struct gb_prefill *)ctx;

	return p->be->ops->graph_launch(p->be, p->graph);
}

/* max |a - b| / max |b| over n values (NaN counts as infinitely far). */
static double gb_rel(const float *a, const float *b, size_t n)
{
	double md = 0.0, mr = 0.0;

	for (size_t i = 0; i < n; i++) {
		const double d = fabs((double)a[i] - (double)b[i]);

		if (!(d <= md))
			md = isnan(d) ? INFINITY : d;
		if (fabs((double)b[i]) > mr)
			mr = fabs((double)b[i]);
	}
	return mr > 0 ? md / mr : md;
}

static void gb_half_to_float(float *dst, const uint16_t *src, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		__half_raw r;

		r.x = src[i];
		dst[i] = __half2float(__half(r));
	}
}

extern "C" int sm70__bench_gdn_prefill(int n_k_heads, int n_v_heads, int k_dim, int v_dim,
				       int tokens, int iters,
				       struct sm70__bench_gdn_prefill *out)
{
	struct sm70_backend *be = sm70__bench_backend();
	struct sm70__cuda *c;
	struct gb_prefill *p = NULL;
	const size_t per_slot = (size_t)n_v_heads * k_dim * v_dim;
	const size_t n_out = (size_t)tokens * n_v_heads * v_dim;
	int32_t *h = NULL, *ints = NULL, host_first = 0, host_len = tokens;
	float *s0 = NULL, *res[2] = { NULL, NULL };
	uint16_t *o16 = NULL;
	int ret = 0;

	if (!be)
		return -ENODEV;
	c = (struct sm70__cuda *)be->priv;
	p = (struct gb_prefill *)calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	p->be = be;
	ret = gb_layer_make(c->stream, &p->g, n_k_heads, n_v_heads, k_dim, v_dim, 1, tokens);
	if (ret)
		goto out;
	/* ints: pos [tokens], seq [tokens] (zeros), seq_state {0}, chunk_first {0},
	 * chunk_len {tokens} */
	h = (int32_t *)calloc((size_t)2 * tokens + 3, 4);
	if (!h) {
		ret = -ENOMEM;
		goto out;
	}
	for (int t = 0; t < tokens; t++)
		h[t] = 1000 + t;
	h[2 * tokens + 2] = tokens;
	SM70_BENCH_CHECK(cudaMalloc(&ints, ((size_t)2 * tokens + 3) * 4));
	SM70_BENCH_CHECK(cudaMemcpy(ints, h, ((size_t)2 * tokens + 3) * 4, cudaMemcpyHostToDevice));
	p->chunk = (struct sm70_batch){ .n_tokens = tokens, .n_seqs = 1, .max_blocks = 1,
					.max_pos = 1000 + tokens, .tok_ids = ints + tokens,
					.tok_pos = ints, .tok_seq = ints + tokens,
					.tok_slot = ints + tokens, .block_tables = ints + tokens,
					.n_out = 0, .out_rows = NULL, .n_decode = 0, .n_chunks = 1,
					.chunk_first = ints + 2 * tokens + 1,
					.chunk_len = ints + 2 * tokens + 2,
					.chunk_first_host = &host_first, .chunk_len_host = &host_len,
					.seq_state = ints + 2 * tokens };

	/* chunked vs recurrent from the same state: out and final state */
	s0 = (float *)malloc(per_slot * 4);
	o16 = (uint16_t *)malloc(n_out * 2);
	res[0] = (float *)malloc((n_out + per_slot) * 4);
	res[1] = (float *)malloc((n_out + per_slot) * 4);
	if (!s0 || !o16 || !res[0] || !res[1]) {
		ret = -ENOMEM;
		goto out;
	}
	SM70_BENCH_CHECK(cudaMemcpyAsync(s0, p->g.st.ssm, per_slot * 4, cudaMemcpyDeviceToHost,
					 c->stream));
	SM70_BENCH_CHECK(cudaStreamSynchronize(c->stream));
	for (int k = 0; k < 2; k++) {
		SM70_BENCH_CHECK(cudaMemcpyAsync(p->g.st.ssm, s0, per_slot * 4, cudaMemcpyHostToDevice,
				       c->stream));
		p->chunked = k == 0;
		ret = gb_prefill_chunk(p);
		if (ret)
			goto out;
		SM70_BENCH_CHECK(cudaMemcpyAsync(o16, p->g.out, n_out * 2, cudaMemcpyDeviceToHost, c->stream));
		SM70_BENCH_CHECK(cudaMemcpyAsync(res[k] + n_out, p->g.st.ssm, per_slot * 4,
				       cudaMemcpyDeviceToHost, c->stream));
		SM70_BENCH_CHECK(cudaStreamSynchronize(c->stream));
		gb_half_to_float(res[k], o16, n_out);
	}
	out->rel_out = gb_rel(res[0], res[1], n_out);
	out->rel_state = gb_rel(res[0] + n_out, res[1] + n_out, per_slot);

	p->chunked = 1;
	ret = gb_time(be, gb_prefill_chunk, p, 1, iters, &out->us_chunked);
	if (ret)
		goto out;
	p->chunked = 0;
	ret = gb_time(be, gb_prefill_chunk, p, 1, iters, &out->us_recurrent);
	if (ret)
		goto out;

	/* the same tokens one decode call each, captured into one graph */
	SM70_BENCH_CHECK(cudaStreamSynchronize(c->stream));
	ret = be->ops->graph_begin(be);
	if (ret)
		goto out;
	for (int t = 0; t < tokens; t++) {
		struct sm70_batch b = { .n_tokens = 1, .n_seqs = 1, .max_blocks = 1,
					.max_pos = 1001 + t, .tok_ids = ints + tokens,
					.tok_pos = ints + t, .tok_seq = ints + tokens,
					.tok_slot = ints + tokens, .block_tables = ints + tokens,
					.n_out = 0, .out_rows = NULL, .n_decode = 1, .n_chunks = 0,
					.seq_state = ints + 2 * tokens };

		be->ops->gdn(be, (uint16_t *)p->g.out + (size_t)t * n_v_heads * v_dim,
			     (const uint16_t *)p->g.qkv + (size_t)t * p->g.lay.conv_dim,
			     (const uint16_t *)p->g.ba + (size_t)t * p->g.ba_ld, p->g.ba_ld,
			     p->g.a_log, p->g.dt, &p->g.st, &p->g.lay, &b, 1);
	}
	ret = be->ops->graph_end(be, &p->graph);
	if (ret)
		goto out;
	ret = gb_time(be, gb_prefill_graph, p, 1, iters, &out->us_tokens);
out:
	if (c)
		cudaStreamSynchronize(c->stream);
	if (p && p->graph)
		be->ops->graph_destroy(be, p->graph);
	free(res[1]);
	free(res[0]);
	free(o16);
	free(s0);
	if (ints)
		cudaFree(ints);
	free(h);
	if (p) {
		gb_layer_free(&p->g);
		free(p);
	}
	return ret;
}
