/*
 * bench_moe.cu - what `sm70-bench moe` times (see bench.h): one MoE layer's routed experts
 * (the moe_experts op) at decode batch sizes, on the grouped path (each tile variant) and
 * the reference path in the same run, and the moe_route op, through the backend
 * sm70__bench_open made, on its stream.
 *
 * MB_ROUTES routings come from uniform random router logits (moe_route, renormalised),
 * so a call reads the experts its tokens chose and no two consecutive calls read the same
 * set; a layer's stack is one copy, larger than L2 many times over, and even one call's
 * experts (8 x 9.4 MB at B1 on the 30B shape) exceed it. A sample is MB_ROUTES calls,
 * each on the next routing, captured into one CUDA graph and replayed (how the engine
 * decodes) or queued one by one; the figure is the median sample over its call count,
 * after 3 warm-up samples. Bytes count only the selected experts: distinct experts (the
 * route's n_used, read back after the timing) times one expert's gate_up + down bytes,
 * averaged over the routings. Inputs are pseudo-random, made on the device by a hash.
 *
 * `sm70-bench moe-nvfp4` (sm70__bench_moe_nvfp4): the same calls on NVFP4 stacks made by
 * prepare_experts from random ModelOpt bytes (once a shape), their bytes the selected
 * experts' codes, block scales and row scales, beside the f16 stacks' grouped path on the
 * same routings in the same run. Both sweep each pass over forced splits of warps a tile
 * (mb_ks_sweep), the data the splitting rules are fitted to.
 *
 * Non-goals: correctness beyond grouped vs reference on one routing
 * (tests/gpu/test_cuda_moe.c, test_cuda_moe_nvfp4.c); the router matmul and the shared
 * expert.
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

#define MB_ROUTES 16


/* f16 (f32 when f32 is set) values uniform in [-amp, amp). */
static __global__ void mb_fill_kernel(void *p, size_t n, uint64_t seed, float amp, int f32)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x) {
		const float u = (float)(sm70__bench_hash(seed + i) >> 8) * 0x1p-24f;
		const float v = (2.0f * u - 1.0f) * amp;

		if (f32)
			((float *)p)[i] = v;
		else
			((__half *)p)[i] = __float2half_rn(v);
	}
}

static int mb_fill(cudaStream_t s, void *p, size_t n, uint64_t seed, float amp, int f32)
{
	mb_fill_kernel<<<1024, 256, 0, s>>>(p, n, seed, amp, f32);
	return cudaGetLastError() == cudaSuccess ? 0 : -EIO;
}

static int mb_cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

/* One layer's experts, routings and buffers on the device. */
struct mb_ctx {
	struct sm70_backend *be;
	struct sm70_experts gu, dn;   /* f16 */
	struct sm70_experts gu4, dn4; /* NVFP4 (moe-nvfp4), from prepare_experts */
	struct sm70_moe_route r[MB_ROUTES];
	int32_t *ints;   /* every route's arrays */
	float *rw;       /* every route's weights */
	float *logits;   /* [MB_ROUTES][n][E] */
	void *x, *mid, *out;
	float *part;
	int n, k, E;
};

typedef void (*mb_op)(struct mb_ctx *m, int i);

static void mb_experts(struct mb_ctx *m, int i)
{
	m->be->ops->moe_experts(m->be, m->out, m->x, &m->gu, &m->dn, &m->r[i % MB_ROUTES], m->n,
				m->k, m->mid, m->part);
}

static void mb_experts_fp4(struct mb_ctx *m, int i)
{
	m->be->ops->moe_experts(m->be, m->out, m->x, &m->gu4, &m->dn4, &m->r[i % MB_ROUTES],
				m->n, m->k, m->mid, m->part);
}

static void mb_route(struct mb_ctx *m, int i)
{
	m->be->ops->moe_route(m->be, &m->r[i % MB_ROUTES],
			      m->logits + (size_t)(i % MB_ROUTES) * m->n * m->E, m->E, m->n,
			      m->E, m->k, 1);
}

/* Median microseconds of one call of op over samples of MB_ROUTES calls, captured into a
 * graph (graph set) or queued one by one. */
static int mb_time(struct mb_ctx *m, mb_op op, int graph, int iters, double *us)
{
	struct sm70__cuda *c = (struct sm70__cuda *)m->be->priv;
	double *t = (double *)calloc((size_t)iters, sizeof(double));
	cudaEvent_t e0 = NULL, e1 = NULL;
	void *g = NULL;
	int ret = 0;

	if (!t)
		return -ENOMEM;
	SM70_BENCH_CHECK(cudaEventCreate(&e0));
	SM70_BENCH_CHECK(cudaEventCreate(&e1));
	if (graph) {
		ret = m->be->ops->graph_begin(m->be);
		if (ret)
			goto out;
		for (int i = 0; i < MB_ROUTES; i++)
			op(m, i);
		ret = m->be->ops->graph_end(m->be, &g);
		if (ret)
			goto out;
	}
	for (int it = -3; it < iters; it++) {
		float ms = 0.0f;

		SM70_BENCH_CHECK(cudaEventRecord(e0, c->stream));
		if (graph) {
			ret = m->be->ops->graph_launch(m->be, g);
			if (ret)
				goto out;
		} else {
			for (int i = 0; i < MB_ROUTES; i++)
				op(m, i);
		}
		SM70_BENCH_CHECK(cudaEventRecord(e1, c->stream));
		SM70_BENCH_CHECK(cudaEventSynchronize(e1));
		SM70_BENCH_CHECK(cudaEventElapsedTime(&ms, e0, e1));
		if (it >= 0)
			t[it] = (double)ms * 1e3 / MB_ROUTES;
	}
	qsort(t, (size_t)iters, sizeof(double), mb_cmp);
	*us = t[iters / 2];
	if (c->sticky)
		ret = -EIO;
out:
	if (g)
		m->be->ops->graph_destroy(m->be, g);
	if (e1)
		cudaEventDestroy(e1);
	if (e0)
		cudaEventDestroy(e0);
	free(t);
	return ret;
}

/* out of route 0 as floats (host, n * hidden) from op on path/variant. */
static int mb_out(struct mb_ctx *m, mb_op op, int path, int variant, float *dst)
{
	struct sm70__cuda *c = (struct sm70__cuda *)m->be->priv;
	const size_t count = (size_t)m->n * m->gu.cols;
	__half *h = (__half *)malloc(count * sizeof(__half));
	int ret = 0;

	if (!h)
		return -ENOMEM;
	sm70__cuda_moe_tune(path, variant, 0);
	op(m, 0);
	SM70_BENCH_CHECK(cudaMemcpyAsync(h, m->out, count * sizeof(__half), cudaMemcpyDeviceToHost,
			       c->stream));
	SM70_BENCH_CHECK(cudaStreamSynchronize(c->stream));
	for (size_t i = 0; i < count; i++)
		dst[i] = __half2float(h[i]);
	ret = c->sticky;
out:
	free(h);
	return ret;
}

/* gate_up and down alone (variant 0, graph) by warps a tile: us[p][ks] with ks 1..8 forced
 * (SM70_MOE_KS=G,D; a shape caps what its block cannot hold), us[p][0] with the fitting
 * rule (SM70_MOE_KS=auto). Leaves the split to SM70_MOE_KS again, for the next batch. */
static int mb_ks_sweep(struct mb_ctx *m, mb_op op, int iters, double us[2][9])
{
	int ret = 0;

	for (int p = 0; p < 2 && !ret; p++) {
		sm70__cuda_moe_tune(0, 0, 1 << p);
		for (int ks = 0; ks <= 8 && !ret; ks++) {
			sm70__cuda_moe_tune_ks(ks ? ks : -1, ks ? ks : -1);
			ret = mb_time(m, op, 1, iters, &us[p][ks]);
		}
	}
	sm70__cuda_moe_tune_ks(-2, -2);
	return ret;
}

/* max |a - b| / max |b| over n values; a NaN anywhere sticks. */
static double mb_max_rel(const float *a, const float *b, size_t n)
{
	double md = 0.0, mr = 0.0;

	for (size_t i = 0; i < n; i++) {
		const double d = fabs((double)a[i] - (double)b[i]);

		if (!(d <= md))
			md = d;
		if (fabs((double)b[i]) > mr)
			mr = fabs((double)b[i]);
	}
	return mr > 0 ? md / mr : md;
}

/* The f16 stacks of m (E experts of gate_up [2 inter][hidden], down [hidden][inter]),
 * allocated and filled: dots of O(1), as a checkpoint's. */
static int mb_f16_stacks(struct mb_ctx *m, int hidden, int inter)
{
	struct sm70__cuda *c = (struct sm70__cuda *)m->be->priv;
	const size_t ngu = (size_t)m->E * 2 * inter * hidden, ndn = (size_t)m->E * hidden * inter;
	int ret = 0;

	m->gu = (struct sm70_experts){ .dtype = SM70_DTYPE_F16, .n_experts = m->E,
				       .rows = 2 * inter, .cols = hidden };
	m->dn = (struct sm70_experts){ .dtype = SM70_DTYPE_F16, .n_experts = m->E,
				       .rows = hidden, .cols = inter };
	SM70_BENCH_CHECK(cudaMalloc(&m->gu.data, ngu * sizeof(__half)));
	SM70_BENCH_CHECK(cudaMalloc(&m->dn.data, ndn * sizeof(__half)));
	if ((ret = mb_fill(c->stream, m->gu.data, ngu, 11, sqrtf(3.0f / hidden), 0)))
		goto out;
	ret = mb_fill(c->stream, m->dn.data, ndn, 12, sqrtf(3.0f / inter), 0);
out:
	return ret;
}

/* The batch-dependent part of m for `batch` tokens: MB_ROUTES routings from random
 * logits (moe_route, renormalised), x, mid, part, out; experts: the mean distinct experts
 * a routing reads. */
static int mb_batch_new(struct mb_ctx *m, int batch, int hidden, int inter, double *experts)
{
	struct sm70__cuda *c = (struct sm70__cuda *)m->be->priv;
	const size_t nk = (size_t)batch * m->k, per_route = 4 * nk + 2;
	int ret = 0;

	m->n = batch;
	*experts = 0.0;
	SM70_BENCH_CHECK(cudaMalloc(&m->ints, MB_ROUTES * per_route * sizeof(int32_t)));
	SM70_BENCH_CHECK(cudaMalloc(&m->rw, MB_ROUTES * nk * sizeof(float)));
	SM70_BENCH_CHECK(cudaMalloc(&m->logits, MB_ROUTES * (size_t)batch * m->E * sizeof(float)));
	SM70_BENCH_CHECK(cudaMalloc(&m->x, (size_t)batch * hidden * sizeof(__half)));
	SM70_BENCH_CHECK(cudaMalloc(&m->mid, nk * inter * sizeof(__half)));
	SM70_BENCH_CHECK(cudaMalloc(&m->part, nk * hidden * sizeof(float)));
	SM70_BENCH_CHECK(cudaMalloc(&m->out, (size_t)batch * hidden * sizeof(__half)));
	if ((ret = mb_fill(c->stream, m->logits, MB_ROUTES * (size_t)batch * m->E, 13, 4.0f, 1)) ||
	    (ret = mb_fill(c->stream, m->x, (size_t)batch * hidden, 14, 1.0f, 0)))
		goto out;
	for (int r = 0; r < MB_ROUTES; r++) {
		int32_t *p = m->ints + r * per_route;

		m->r[r] = (struct sm70_moe_route){ p, m->rw + r * nk, p + nk, p + 2 * nk, p + 3 * nk,
						   p + 4 * nk + 1 };
		mb_route(m, r);
	}
	for (int r = 0; r < MB_ROUTES; r++) {
		int32_t nu = 0;

		SM70_BENCH_CHECK(cudaMemcpyAsync(&nu, m->r[r].n_used, sizeof(nu),
						 cudaMemcpyDeviceToHost, c->stream));
		SM70_BENCH_CHECK(cudaStreamSynchronize(c->stream));
		*experts += (double)nu / MB_ROUTES;
	}
out:
	return ret;
}

static void mb_batch_free(struct mb_ctx *m)
{
	cudaFree(m->out);
	cudaFree(m->part);
	cudaFree(m->mid);
	cudaFree(m->x);
	cudaFree(m->logits);
	cudaFree(m->rw);
	cudaFree(m->ints);
	m->out = m->x = m->mid = NULL;
	m->part = m->rw = m->logits = NULL;
	m->ints = NULL;
}

extern "C" int sm70__bench_moe(int hidden, int inter, int n_experts, int top_k, int batch,
			       int iters, struct sm70__bench_moe *out)
{
	struct sm70_backend *be = sm70__bench_backend();
	struct sm70__cuda *c = be ? (struct sm70__cuda *)be->priv : NULL;
	const double expert_bytes = (double)(3 * (size_t)inter * hidden) * sizeof(__half);
	struct mb_ctx m;
	float *oa = NULL, *ob = NULL;
	int ret = 0;

	if (!be)
		return -ENODEV;
	memset(&m, 0, sizeof(m));
	memset(out, 0, sizeof(*out));
	m.be = be;
	m.k = top_k;
	m.E = n_experts;
	if ((ret = mb_f16_stacks(&m, hidden, inter)) ||
	    (ret = mb_batch_new(&m, batch, hidden, inter, &out->experts)))
		goto out;
	out->bytes = out->experts * expert_bytes;

	/* grouped vs reference on routing 0 */
	oa = (float *)malloc((size_t)batch * hidden * sizeof(float));
	ob = (float *)malloc((size_t)batch * hidden * sizeof(float));
	if (!oa || !ob) {
		ret = -ENOMEM;
		goto out;
	}
	if ((ret = mb_out(&m, mb_experts, 0, 0, oa)) || (ret = mb_out(&m, mb_experts, 1, 0, ob)))
		goto out;
	out->max_rel = mb_max_rel(oa, ob, (size_t)batch * hidden);

	sm70__cuda_moe_tune(0, 0, 0);
	if ((ret = mb_time(&m, mb_experts, 1, iters, &out->us)) ||
	    (ret = mb_time(&m, mb_experts, 0, iters, &out->us_eager)))
		goto out;
	for (int p = 0; p < 3; p++) {
		sm70__cuda_moe_tune(0, 0, 1 << p);
		if ((ret = mb_time(&m, mb_experts, 1, iters, &out->us_pass[p])))
			goto out;
	}
	for (int v = 1; v <= 4; v++) {
		sm70__cuda_moe_tune(0, v, 0);
		if ((ret = mb_time(&m, mb_experts, 1, iters, &out->us_var[v - 1])))
			goto out;
	}
	if ((ret = mb_ks_sweep(&m, mb_experts, iters, out->us_ks)))
		goto out;
	sm70__cuda_moe_tune(1, 0, 0);
	if ((ret = mb_time(&m, mb_experts, 1, iters, &out->us_ref)))
		goto out;
	ret = mb_time(&m, mb_route, 1, iters, &out->us_route);
out:
	sm70__cuda_moe_tune(-1, 0, 0);
	sm70__cuda_moe_tune_ks(-2, -2);
	if (c)
		cudaStreamSynchronize(c->stream);
	free(oa);
	free(ob);
	mb_batch_free(&m);
	cudaFree(m.dn.data);
	cudaFree(m.gu.data);
	return ret;
}

/* ---- NVFP4 stacks ------------------------------------------------------------------------ */

/* A host ModelOpt stack of E experts [rows][cols]: random codes, block scales in
 * [0.5, 7.5] (0x30..0x4f), row scales sqrt(3 / cols) / 12 (dots of O(1)), prepared on be
 * into *out. The host buffers are released here. */
static int mb_fp4_stack(struct sm70_backend *be, struct sm70_experts *out, int E, int rows,
			int cols, uint64_t seed)
{
	const size_t r = (size_t)E * rows, nc = r * cols / 2, ns = r * cols / 16;
	struct sm70_experts h = { .dtype = SM70_DTYPE_NVFP4, .n_experts = E, .rows = rows,
				  .cols = cols };
	struct sm70_err err = { { 0 } };
	uint8_t *codes = (uint8_t *)malloc(nc), *scales = (uint8_t *)malloc(ns);
	float *rs2 = (float *)malloc(r * sizeof(float));
	uint64_t z = seed;
	int ret = -ENOMEM;

	if (codes && scales && rs2) {
		for (size_t i = 0; i < nc; i += 8) {
			uint64_t v = (z += 0x9e3779b97f4a7c15ULL);

			v = (v ^ (v >> 30)) * 0xbf58476d1ce4e5b9ULL;
			v = (v ^ (v >> 27)) * 0x94d049bb133111ebULL;
			v ^= v >> 31;
			memcpy(codes + i, &v, nc - i < 8 ? nc - i : 8);
		}
		for (size_t i = 0; i < ns; i++)
			scales[i] = (uint8_t)(0x30 + (codes[i % nc] ^ (uint8_t)(i * 131)) % 0x20);
		for (size_t i = 0; i < r; i++)
			rs2[i] = sqrtf(3.0f / (float)cols) / 12.0f;
		h.data = codes;
		h.scale = scales;
		h.row_scale2 = rs2;
		ret = be->ops->prepare_experts(be, out, &h, &err);
		if (ret)
			fprintf(stderr, "sm70-bench: %s\n", err.msg);
	}
	free(rs2);
	free(scales);
	free(codes);
	return ret;
}

/* The NVFP4 bytes one expert's gate_up and down hold: codes, block scales
 * (sm70_weight_bytes of each matrix) and their row scales. */
static double mb_fp4_expert_bytes(int hidden, int inter)
{
	const struct sm70_weight gu = { .dtype = SM70_DTYPE_NVFP4, .rows = 2 * inter,
					.cols = hidden };
	const struct sm70_weight dn = { .dtype = SM70_DTYPE_NVFP4, .rows = hidden, .cols = inter };

	return (double)(sm70_weight_bytes(&gu) + sm70_weight_bytes(&dn)) +
	       (double)(2 * inter + hidden) * sizeof(float);
}

extern "C" int sm70__bench_moe_nvfp4(int hidden, int inter, int n_experts, int top_k,
				     const int *batches, int n_batches, int iters,
				     struct sm70__bench_moe_nvfp4 *out)
{
	struct sm70_backend *be = sm70__bench_backend();
	struct sm70__cuda *c = be ? (struct sm70__cuda *)be->priv : NULL;
	const double fp4_bytes = mb_fp4_expert_bytes(hidden, inter);
	const double f16_bytes = (double)(3 * (size_t)inter * hidden) * sizeof(__half);
	struct mb_ctx m;
	float *oa = NULL, *ob = NULL;
	int ret = 0;

	if (!be)
		return -ENODEV;
	memset(&m, 0, sizeof(m));
	memset(out, 0, sizeof(*out) * (size_t)n_batches);
	m.be = be;
	m.k = top_k;
	m.E = n_experts;
	if ((ret = mb_f16_stacks(&m, hidden, inter)) ||
	    (ret = mb_fp4_stack(be, &m.gu4, n_experts, 2 * inter, hidden, 21)) ||
	    (ret = mb_fp4_stack(be, &m.dn4, n_experts, hidden, inter, 22)))
		goto out;
	for (int b = 0; b < n_batches; b++) {
		struct sm70__bench_moe_nvfp4 *q = &out[b];
		const size_t count = (size_t)batches[b] * hidden;

		if ((ret = mb_batch_new(&m, batches[b], hidden, inter, &q->experts)))
			goto out;
		q->bytes = q->experts * fp4_bytes;
		q->bytes_f16 = q->experts * f16_bytes;
		oa = (float *)malloc(count * sizeof(float));
		ob = (float *)malloc(count * sizeof(float));
		if (!oa || !ob) {
			ret = -ENOMEM;
			goto out;
		}
		if ((ret = mb_out(&m, mb_experts_fp4, 0, 0, oa)) ||
		    (ret = mb_out(&m, mb_experts_fp4, 1, 0, ob)))
			goto out;
		q->max_rel = mb_max_rel(oa, ob, count);
		free(oa);
		free(ob);
		oa = ob = NULL;

		sm70__cuda_moe_tune(0, 0, 0);
		if ((ret = mb_time(&m, mb_experts_fp4, 1, iters, &q->us)) ||
		    (ret = mb_time(&m, mb_experts_fp4, 0, iters, &q->us_eager)) ||
		    (ret = mb_time(&m, mb_experts, 1, iters, &q->us_f16)))
			goto out;
		for (int p = 0; p < 2; p++) {
			sm70__cuda_moe_tune(0, 0, 1 << p);
			if ((ret = mb_time(&m, mb_experts_fp4, 1, iters, &q->us_pass[p])))
				goto out;
		}
		for (int v = 1; v <= 2; v++) {
			sm70__cuda_moe_tune(0, v, 0);
			if ((ret = mb_time(&m, mb_experts_fp4, 1, iters, &q->us_var[v - 1])))
				goto out;
		}
		if ((ret = mb_ks_sweep(&m, mb_experts_fp4, iters, q->us_ks)))
			goto out;
		sm70__cuda_moe_tune(1, 0, 0);
		if ((ret = mb_time(&m, mb_experts_fp4, 1, iters, &q->us_ref)))
			goto out;
		sm70__cuda_moe_tune(-1, 0, 0);
		mb_batch_free(&m);
	}
out:
	sm70__cuda_moe_tune(-1, 0, 0);
	sm70__cuda_moe_tune_ks(-2, -2);
	if (c)
		cudaStreamSynchronize(c->stream);
	free(oa);
	free(ob);
	mb_batch_free(&m);
	if (m.dn4.data) {
		be->ops->buf_free(be, m.dn4.row_scale2);
		be->ops->buf_free(be, m.dn4.scale);
		be->ops->buf_free(be, m.dn4.data);
	}
	if (m.gu4.data) {
		be->ops->buf_free(be, m.gu4.row_scale2);
		be->ops->buf_free(be, m.gu4.scale);
		be->ops->buf_free(be, m.gu4.data);
	}
	cudaFree(m.dn.data);
	cudaFree(m.gu.data);
	return ret;
}
