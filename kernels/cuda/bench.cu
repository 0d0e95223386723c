/*
 * bench.cu - what sm70-bench times on the GPU (see bench.h): a read-bandwidth kernel, the
 * D2D copy, the backend's matmul op (f16 and NVFP4 weights) and attention op on decode
 * shapes, and cuBLAS.
 *
 * Every measurement launches on the backend's own stream (the ops are timed exactly as the
 * engine calls them) between CUDA events; one sample is a run of back-to-back launches that
 * walks once through enough copies of the inputs to exceed three times the L2, so no launch
 * finds its weights or cache in L2. The time of a launch is the sample's time over its
 * launch count; the figure reported is the median sample after a few warm-up samples.
 * Inputs are pseudo-random (never zeros), made on the device by a hash so that gigabytes
 * need no host upload.
 *
 * Non-goals: correctness beyond a sanity comparison with cuBLAS (tests/gpu does that).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/bench_util.h"
#include "kernels/cuda/cuda_check.h"

extern "C" {
#include "kernels/cuda/bench.h"
}

static struct {
	struct sm70_backend *be;
	struct sm70__cuda *c;
	cudaEvent_t ev0, ev1;
	size_t l2;
	unsigned *sink;
} bench;


extern "C" int sm70__bench_available(void)
{
	return 1;
}

extern "C" int sm70__bench_open(int device, char *desc, size_t desc_len, char *msg,
				size_t msg_len)
{
	struct sm70_err err = { { 0 } };
	cudaDeviceProp p;
	int ret, clk = 0, mclk = 0;

	ret = sm70_backend_cuda_create(&bench.be, device, &err);
	if (ret) {
		snprintf(msg, msg_len, "%s", err.msg);
		return ret;
	}
	bench.c = (struct sm70__cuda *)bench.be->priv;
	ret = 0;
	SM70_BENCH_CHECK(cudaGetDeviceProperties(&p, device));
	cudaDeviceGetAttribute(&clk, cudaDevAttrClockRate, device);
	cudaDeviceGetAttribute(&mclk, cudaDevAttrMemoryClockRate, device);
	bench.l2 = (size_t)p.l2CacheSize;
	snprintf(desc, desc_len,
		 "%s, sm_%d%d, %d SMs, L2 %.0f MB, %.1f GiB, max SM clock %d MHz, "
		 "memory clock %d MHz, bus %d bit",
		 p.name, p.major, p.minor, p.multiProcessorCount, p.l2CacheSize / 1e6,
		 p.totalGlobalMem / 1073741824.0, clk / 1000, mclk / 1000, p.memoryBusWidth);
	SM70_BENCH_CHECK(cudaEventCreate(&bench.ev0));
	SM70_BENCH_CHECK(cudaEventCreate(&bench.ev1));
	SM70_BENCH_CHECK(cudaMalloc(&bench.sink, 4 << 20));
out:
	if (ret)
		snprintf(msg, msg_len, "CUDA setup failed");
	return ret;
}

extern "C" void sm70__bench_close(void)
{
	if (!bench.be)
		return;
	cudaStreamSynchronize(bench.c->stream);
	if (bench.sink)
		cudaFree(bench.sink);
	if (bench.ev1)
		cudaEventDestroy(bench.ev1);
	if (bench.ev0)
		cudaEventDestroy(bench.ev0);
	sm70_backend_destroy(bench.be);
	memset(&bench, 0, sizeof(bench));
}

extern "C" struct sm70_backend *sm70__bench_backend(void)
{
	return bench.be;
}

/* ---- inputs ------------------------------------------------------------------------ */

/* f16 values uniform in [-amp, amp). */
static __global__ void fill_f16_kernel(__half *p, size_t n, uint64_t seed, float amp)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x) {
		float u = (float)(sm70__bench_hash(seed + i) >> 8) * 0x1p-24f;

		p[i] = __float2half_rn((2.0f * u - 1.0f) * amp);
	}
}

/* e4m3 bytes of magnitude below 2^3 (no NaN codes), random sign. */
static __global__ void fill_e4m3_kernel(uint8_t *p, size_t n, uint64_t seed)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x) {
		uint32_t h = sm70__bench_hash(seed + i);

		p[i] = (uint8_t)((h & 0x80u) | ((h >> 8) % 0x50u));
	}
}

static int fill_f16(void *p, size_t n, uint64_t seed, float amp)
{
	fill_f16_kernel<<<1024, 256, 0, bench.c->stream>>>((__half *)p, n, seed, amp);
	return cudaGetLastError() == cudaSuccess ? 0 : -EIO;
}

static int fill_e4m3(void *p, size_t n, uint64_t seed)
{
	fill_e4m3_kernel<<<1024, 256, 0, bench.c->stream>>>((uint8_t *)p, n, seed);
	return cudaGetLastError() == cudaSuccess ? 0 : -EIO;
}

/* ---- timing ------------------------------------------------------------------------ */

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

/*
 * Median microseconds of one launch: `launch(ctx, i)` queues launch i (i walks 0..
 * per_sample-1); a sample times per_sample launches. 3 warm-up samples, then iters.
 */
typedef int (*launch_fn)(void *ctx, int i);

static int time_median(launch_fn launch, void *ctx, int per_sample, int iters, double *us)
{
	double *t = (double *)calloc((size_t)iters, sizeof(double));
	cudaStream_t s = bench.c->stream;
	int ret = 0;

	if (!t)
		return -ENOMEM;
	for (int it = -3; it < iters; it++) {
		float ms = 0.0f;

		SM70_BENCH_CHECK(cudaEventRecord(bench.ev0, s));
		for (int i = 0; i < per_sample; i++) {
			ret = launch(ctx, i);
			if (ret)
				goto out;
		}
		SM70_BENCH_CHECK(cudaEventRecord(bench.ev1, s));
		SM70_BENCH_CHECK(cudaEventSynchronize(bench.ev1));
		SM70_BENCH_CHECK(cudaEventElapsedTime(&ms, bench.ev0, bench.ev1));
		if (it >= 0)
			t[it] = (double)ms * 1e3 / per_sample;
	}
	qsort(t, (size_t)iters, sizeof(double), cmp_double);
	*us = t[iters / 2];
	if (bench.c->sticky)
		ret = -EIO;
out:
	free(t);
	return ret;
}

/* How many copies of `bytes` of input make every launch miss L2: three L2s' worth. */
static int copies_for(double bytes, int most)
{
	int n = (int)(3.0 * (double)bench.l2 / bytes) + 1;

	if (n < 2)
		n = 2;
	return n < most ? n : most;
}

/* ---- bandwidth ------------------------------------------------------------------------ */

/* Reads n uint4 (4 in flight a thread) and folds them so the loads stay. */
static __global__ void read_kernel(const uint4 *__restrict__ p, size_t n, unsigned *sink)
{
	const size_t stride = (size_t)gridDim.x * blockDim.x;
	size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
	unsigned acc = 0;

	for (; i + 3 * stride < n; i += 4 * stride) {
		uint4 a = __ldcs(p + i), b = __ldcs(p + i + stride);
		uint4 c = __ldcs(p + i + 2 * stride), d = __ldcs(p + i + 3 * stride);

		acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w;
		acc ^= c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
	}
	for (; i < n; i += stride) {
		uint4 a = __ldcs(p + i);

		acc ^= a.x ^ a.y ^ a.z ^ a.w;
	}
	if (acc == 0x9e3779b9u) /* practically never: keeps the loads */
		sink[threadIdx.x] = acc;
}

struct bw_ctx {
	void *buf;
	size_t bytes;
	int grid;
};

static int launch_read(void *vctx, int i)
{
	struct bw_ctx *x = (struct bw_ctx *)vctx;

	read_kernel<<<x->grid, 512, 0, bench.c->stream>>>((const uint4 *)x->buf, x->bytes / 16,
							   bench.sink);
	return cudaGetLastError() == cudaSuccess ? 0 : -EIO;
}

static int launch_copy(void *vctx, int i)
{
	struct bw_ctx *x = (struct bw_ctx *)vctx;
	size_t half = x->bytes / 2;

	return cudaMemcpyAsync((char *)x->buf + half, x->buf, half, cudaMemcpyDeviceToDevice,
			       bench.c->stream) == cudaSuccess ? 0 : -EIO;
}

extern "C" int sm70__bench_bw(size_t bytes, int iters, double *read_gbs, double *copy_gbs)
{
	struct bw_ctx x = { NULL, bytes & ~(size_t)4095, bench.c->n_sm * 4 };
	double us = 0.0;
	int ret = 0;

	SM70_BENCH_CHECK(cudaMalloc(&x.buf, x.bytes));
	ret = fill_f16(x.buf, x.bytes / 2, 1, 1.0f);
	if (!ret)
		ret = time_median(launch_read, &x, 4, iters, &us);
	if (ret)
		goto out;
	*read_gbs = (double)x.bytes / us * 1e-3;
	ret = time_median(launch_copy, &x, 4, iters, &us);
	if (ret)
		goto out;
	*copy_gbs = (double)x.bytes / us * 1e-3; /* bytes/2 read + bytes/2 written */
out:
	if (x.buf)
		cudaFree(x.buf);
	return ret;
}

/* ---- GEMV ------------------------------------------------------------------------ */

struct gemv_ctx {
	int ncopies;
	struct sm70_weight *w;
	void *x, *y;
	int n;
};

static int launch_gemv(void *vctx, int i)
{
	struct gemv_ctx *g = (struct gemv_ctx *)vctx;

	bench.be->ops->matmul(bench.be, g->y, 0, g->x, &g->w[i % g->ncopies], g->n);
	return bench.c->sticky;
}

static int launch_cublas(void *vctx, int i)
{
	struct gemv_ctx *g = (struct gemv_ctx *)vctx;
	const struct sm70_weight *w = &g->w[i % g->ncopies];
	const float alpha = 1.0f, beta = 0.0f;

	return cublasGemmEx(bench.c->blas, CUBLAS_OP_T, CUBLAS_OP_N, w->rows, g->n, w->cols,
			    &alpha, w->data, CUDA_R_16F, w->cols, g->x, CUDA_R_16F, w->cols,
			    &beta, g->y, CUDA_R_16F, w->rows, CUBLAS_COMPUTE_32F,
			    CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS ? 0 : -EIO;
}

extern "C" int sm70__bench_gemv(int rows, int cols, int n, int iters,
				struct sm70__bench_gemv *out)
{
	const size_t wbytes = (size_t)rows * cols * 2;
	struct sm70_weight w[64];
	struct gemv_ctx g = { 0, w, NULL, NULL, n };
	float *ya = NULL, *yb = NULL;
	const size_t ny = (size_t)n * rows;
	int ret = 0, per;

	memset(w, 0, sizeof(w));
	g.ncopies = copies_for((double)wbytes, 64);
	for (int i = 0; i < g.ncopies; i++) {
		w[i] = (struct sm70_weight){ SM70_DTYPE_F16, rows, cols, NULL };
		SM70_BENCH_CHECK(cudaMalloc(&w[i].data, wbytes));
		ret = fill_f16(w[i].data, wbytes / 2, 1000 + 77 * i, 0.03f);
		if (ret)
			goto out;
	}
	SM70_BENCH_CHECK(cudaMalloc(&g.x, (size_t)n * cols * 2));
	SM70_BENCH_CHECK(cudaMalloc(&g.y, ny * 4));
	ret = fill_f16(g.x, (size_t)n * cols, 7, 1.0f);
	if (ret)
		goto out;

	/* sanity: ours vs cuBLAS in f32 */
	ya = (float *)malloc(ny * 4);
	yb = (float *)malloc(ny * 4);
	if (!ya || !yb) {
		ret = -ENOMEM;
		goto out;
	}
	bench.be->ops->matmul(bench.be, g.y, 1, g.x, &w[0], n);
	SM70_BENCH_CHECK(cudaMemcpyAsync(ya, g.y, ny * 4, cudaMemcpyDeviceToHost, bench.c->stream));
	{
		const float alpha = 1.0f, beta = 0.0f;

		if (cublasGemmEx(bench.c->blas, CUBLAS_OP_T, CUBLAS_OP_N, rows, n, cols, &alpha,
				 w[0].data, CUDA_R_16F, cols, g.x, CUDA_R_16F, cols, &beta, g.y,
				 CUDA_R_32F, rows, CUBLAS_COMPUTE_32F,
				 CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS) {
			ret = -EIO;
			goto out;
		}
	}
	SM70_BENCH_CHECK(cudaMemcpyAsync(yb, g.y, ny * 4, cudaMemcpyDeviceToHost, bench.c->stream));
	SM70_BENCH_CHECK(cudaStreamSynchronize(bench.c->stream));
	{
		double md = 0.0, mr = 0.0;

		for (size_t i = 0; i < ny; i++) {
			double d = fabs((double)ya[i] - (double)yb[i]);

			if (!(d <= md))
				md = d; /* NaN sticks */
			if (fabs((double)yb[i]) > mr)
				mr = fabs((double)yb[i]);
		}
		out->max_rel = mr > 0 ? md / mr : md;
	}

	per = g.ncopies < 8 ? 8 / g.ncopies * g.ncopies : g.ncopies;
	ret = time_median(launch_gemv, &g, per, iters, &out->us);
	if (!ret)
		ret = time_median(launch_cublas, &g, per, iters, &out->us_cublas);
	out->bytes = (double)wbytes + (double)n * cols * 2 + (double)n * rows * 2;
out:
	free(ya);
	free(yb);
	if (g.y)
		cudaFree(g.y);
	if (g.x)
		cudaFree(g.x);
	for (int i = 0; i < g.ncopies; i++)
		if (w[i].data)
			cudaFree(w[i].data);
	return ret;
}

/* ---- NVFP4 GEMV ------------------------------------------------------------------------ */

/* A random ModelOpt-layout NVFP4 matrix in host memory: every code byte, positive scales
 * from 2^-6 to 448, scale2 putting |W| at most ~0.05 (a checkpoint's range). */
static int nvfp4_host(struct sm70_weight *h, int rows, int cols)
{
	const size_t nc = (size_t)rows * cols / 2, ns = (size_t)rows * cols / 16;
	uint8_t *c = (uint8_t *)malloc(nc), *sc = (uint8_t *)malloc(ns);
	uint64_t x = 0x9e3779b97f4a7c15ULL;

	if (!c || !sc) {
		free(c);
		free(sc);
		return -ENOMEM;
	}
	for (size_t i = 0; i < nc; i++) {
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		c[i] = (uint8_t)(x >> 32);
	}
	for (size_t i = 0; i < ns; i++) {
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		sc[i] = (uint8_t)(0x08 + (x >> 33) % (0x7e - 0x08 + 1));
	}
	*h = (struct sm70_weight){};
	h->dtype = SM70_DTYPE_NVFP4;
	h->rows = rows;
	h->cols = cols;
	h->data = c;
	h->scale = sc;
	h->scale2 = 0.05f / 2688.0f;
	return 0;
}

/* max |a - b| / max |b| over n values (NaN sticks). */
static double max_rel(const float *a, const float *b, size_t n)
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

/* The fast path against the reference kernel (SM70_MATMUL=reference's, on the same
 * arranged weight), f32 y. */
static int nvfp4_check(struct gemv_ctx *g, int rows, double *rel)
{
	const size_t ny = (size_t)g->n * rows;
	float *ya = (float *)malloc(ny * 4), *yb = (float *)malloc(ny * 4);
	const int was_ref = bench.c->matmul_ref;
	int ret = 0;

	if (!ya || !yb) {
		ret = -ENOMEM;
		goto out;
	}
	bench.be->ops->matmul(bench.be, g->y, 1, g->x, &g->w[0], g->n);
	SM70_BENCH_CHECK(cudaMemcpyAsync(ya, g->y, ny * 4, cudaMemcpyDeviceToHost, bench.c->stream));
	bench.c->matmul_ref = 1;
	bench.be->ops->matmul(bench.be, g->y, 1, g->x, &g->w[0], g->n);
	bench.c->matmul_ref = was_ref;
	SM70_BENCH_CHECK(cudaMemcpyAsync(yb, g->y, ny * 4, cudaMemcpyDeviceToHost, bench.c->stream));
	SM70_BENCH_CHECK(cudaStreamSynchronize(bench.c->stream));
	*rel = max_rel(ya, yb, ny);
	ret = bench.c->sticky;
out:
	free(ya);
	free(yb);
	return ret;
}

extern "C" int sm70__bench_nvfp4(int rows, int cols, const int *ns, int n_ns,
				 const int *variants, int n_var, int iters,
				 struct sm70__bench_nvfp4 *out)
{
	struct sm70_weight w[64], host = {};
	struct gemv_ctx g = { 0, w, NULL, NULL, 0 };
	struct sm70_err err = { { 0 } };
	const int was_variant = bench.c->nvfp4_variant;
	int ret, n_max = 0;
	double wbytes;

	memset(w, 0, sizeof(w));
	for (int k = 0; k < n_ns; k++)
		n_max = ns[k] > n_max ? ns[k] : n_max;
	ret = nvfp4_host(&host, rows, cols);
	if (ret)
		return ret;
	wbytes = (double)sm70_weight_bytes(&host);
	/* every copy through prepare_weight: the arrangement is the backend's business */
	g.ncopies = copies_for(wbytes, 64);
	for (int i = 0; i < g.ncopies && !ret; i++) {
		ret = bench.be->ops->prepare_weight(bench.be, &w[i], &host, &err);
		if (ret)
			fprintf(stderr, "sm70-bench: nvfp4: %s\n", err.msg);
	}
	if (ret)
		goto out;
	SM70_BENCH_CHECK(cudaMalloc(&g.x, (size_t)n_max * cols * 2));
	SM70_BENCH_CHECK(cudaMalloc(&g.y, (size_t)n_max * rows * 4));
	ret = fill_f16(g.x, (size_t)n_max * cols, 7, 1.0f);
	for (int v = 0; v < n_var && !ret; v++) {
		bench.c->nvfp4_variant = variants[v];
		for (int k = 0; k < n_ns && !ret; k++) {
			struct sm70__bench_nvfp4 *o = &out[v * n_ns + k];
			int per = g.ncopies < 8 ? 8 / g.ncopies * g.ncopies : g.ncopies;

			g.n = ns[k];
			/* past the dot kernel's rows every variant runs WMMA: timed once */
			if (v > 0 && g.n > 4) {
				*o = out[k];
				continue;
			}
			o->bytes = wbytes;
			ret = nvfp4_check(&g, rows, &o->max_rel);
			if (!ret)
				ret = time_median(launch_gemv, &g, per, iters, &o->us);
		}
	}
out:
	bench.c->nvfp4_variant = was_variant;
	if (g.y)
		cudaFree(g.y);
	if (g.x)
		cudaFree(g.x);
	for (int i = 0; i < g.ncopies; i++) {
		bench.be->ops->buf_free(bench.be, w[i].scale);
		bench.be->ops->buf_free(bench.be, w[i].data);
	}
	free(host.scale);
	free(host.data);
	return ret;
}

/* ---- attention ------------------------------------------------------------------------ */

struct attn_ctx {
	int ncopies;
	struct sm70_kv_layer kv[128];
	struct sm70_kv_layout lay;
	struct sm70_batch b;
	void *q, *out;
	int n_heads, q_ld;
	float scale;
	int walk; /* -1: the attention op; else a read walk (enum sm70__bench_kv_walk) */
};

/* An attention bench's cache layout for kv (enum sm70__bench_kv), and its K or V bytes. */
static struct sm70_kv_layout bench_kv_layout(int kv, int n_blocks, int bs, int n_kv, int D)
{
	struct sm70_kv_layout lay = { kv == SM70__BENCH_KV_F16 ? SM70_DTYPE_F16 : SM70_DTYPE_F8E4M3,
				      n_blocks, bs, n_kv, D, SM70_KV_V_AS_K };

	if (kv == SM70__BENCH_KV_FP8)
		lay.v_dtype = SM70_KV_V(SM70_DTYPE_F16);
	return lay;
}

static size_t bench_kv_bytes(const struct sm70_kv_layout *lay, int v)
{
	return (size_t)lay->n_blocks * lay->block_size * lay->n_kv_heads * lay->head_dim *
	       sm70_dtype_size(v ? sm70_kv_v_dtype(lay) : lay->dtype);
}

/* Allocates and fills layer i's K and V of a (random e4m3 or f16 values). */
static int bench_kv_fill(struct attn_ctx *a, int i)
{
	for (int v = 0; v < 2; v++) {
		const size_t bytes = bench_kv_bytes(&a->lay, v);
		void **p = v ? &a->kv[i].v : &a->kv[i].k;
		const uint64_t seed = 31 * (uint64_t)i + 1 + v;

		if (cudaMalloc(p, bytes) != cudaSuccess)
			return -ENOMEM;
		if ((v ? sm70_kv_v_dtype(&a->lay) : a->lay.dtype) == SM70_DTYPE_F8E4M3 ?
			    fill_e4m3(*p, bytes, seed) :
			    fill_f16(*p, bytes / 2, seed, 1.0f))
			return -EIO;
	}
	return 0;
}

/*
 * The KV read ceiling: the attention op's cache bytes read with no attention math, in the
 * ways a decode kernel could walk them (enum sm70__bench_kv_walk), so that the op's time
 * splits into what the layout and the grid cost and what its own work costs. A block takes
 * a range of positions; each thread keeps 8 16-byte loads in flight (the tensor-core
 * kernel's count at head_dim 128 f16) and folds them so they stay.
 */
#define KVR_THREADS 256
#define KVR_UNROLL 4

struct kvr_args {
	const uint4 *k, *v;
	const int32_t *bt; /* one sequence per token: row tok of max_blocks entries */
	int max_blocks, bs, n_kv, ctx;
	int kb, vb;   /* bytes of one head's row: K, V */
	int chunk;    /* positions a block */
	int walk;     /* enum sm70__bench_kv_walk */
	unsigned *sink;
};

/* Byte offset of (position p, head h) of a cache tensor with rb-byte head rows. */
static __device__ __forceinline__ size_t kvr_off(const struct kvr_args &a, const int32_t *bt,
						 int p, int h, int rb)
{
	const size_t blk = (size_t)bt[p / a.bs], in = (size_t)(p % a.bs);

	if (a.walk == SM70__BENCH_KV_WALK_PAGE_HEADS) /* [block][head][position] */
		return ((blk * a.n_kv + h) * a.bs + in) * rb;
	return ((blk * a.bs + in) * a.n_kv + h) * rb; /* [block][position][head] */
}

/* blockIdx.x = (token, head) or, for WALK_ROWS, the token; blockIdx.y = position range. A
 * unit is one 16-byte load of K or V: (row, head, chunk of 16 bytes). */
static __global__ void __launch_bounds__(KVR_THREADS) kvr_kernel(struct kvr_args a)
{
	const bool rows = a.walk == SM70__BENCH_KV_WALK_ROWS;
	const int tok = rows ? blockIdx.x : blockIdx.x / a.n_kv;
	const int h0 = rows ? 0 : blockIdx.x - tok * a.n_kv, nh = rows ? a.n_kv : 1;
	const int ck = a.kb / 16, cv = a.vb / 16, per_row = nh * (ck + cv);
	const int p0 = blockIdx.y * a.chunk, p1 = min(p0 + a.chunk, a.ctx);
	const int32_t *bt = a.bt + (size_t)tok * a.max_blocks;
	const int units = (p1 - p0) * per_row;
	unsigned acc = 0;

	for (int u0 = threadIdx.x; u0 < units; u0 += KVR_UNROLL * 2 * KVR_THREADS) {
		uint4 x[KVR_UNROLL * 2];

#pragma unroll
		for (int j = 0; j < KVR_UNROLL * 2; j++) {
			const int u = u0 + j * KVR_THREADS;
			const int r = u / per_row, w = u - r * per_row;
			const int h = h0 + w / (ck + cv), c = w % (ck + cv);

			x[j] = make_uint4(0, 0, 0, 0);
			if (u < units)
				x[j] = c < ck ? __ldg((const uint4 *)((const char *)a.k +
							      kvr_off(a, bt, p0 + r, h, a.kb)) + c) :
						__ldg((const uint4 *)((const char *)a.v +
							      kvr_off(a, bt, p0 + r, h, a.vb)) +
						      (c - ck));
		}
#pragma unroll
		for (int j = 0; j < KVR_UNROLL * 2; j++)
			acc ^= x[j].x ^ x[j].y ^ x[j].z ^ x[j].w;
	}
	if (acc == 0x9e3779b9u) /* practically never: keeps the loads */
		a.sink[threadIdx.x] = acc;
}

static int launch_attn(void *vctx, int i)
{
	struct attn_ctx *a = (struct attn_ctx *)vctx;
	const struct sm70_kv_layer *kv = &a->kv[i % a->ncopies];

	if (a->walk < 0) {
		bench.be->ops->attention(bench.be, a->out, a->q, a->q_ld, kv, &a->lay, &a->b,
					 a->n_heads, a->scale);
		return bench.c->sticky;
	}
	{
		struct kvr_args r;
		const int D = a->lay.head_dim, n_kv = a->lay.n_kv_heads, n = a->b.n_tokens;
		const int ctx = a->b.max_pos, units = a->walk == SM70__BENCH_KV_WALK_ROWS ? n :
											     n * n_kv;
		/* the op's grid: two blocks an SM, filled once; else eight an SM */
		const int slots = (a->walk == SM70__BENCH_KV_WALK_OP_GRID ? 2 : 8) * bench.c->n_sm;
		int splits = (slots + units - 1) / units, smem = 0;

		if (splits > ctx / 64)
			splits = ctx / 64 > 0 ? ctx / 64 : 1;
		r.k = (const uint4 *)kv->k;
		r.v = (const uint4 *)kv->v;
		r.bt = a->b.block_tables;
		r.max_blocks = a->b.max_blocks;
		r.bs = a->lay.block_size;
		r.n_kv = n_kv;
		r.ctx = ctx;
		r.kb = D * (int)sm70_dtype_size(a->lay.dtype);
		r.vb = D * (int)sm70_dtype_size(sm70_kv_v_dtype(&a->lay));
		r.chunk = (ctx + splits - 1) / splits;
		r.walk = a->walk;
		r.sink = bench.sink;
		/* shared memory nobody uses, so that no more than two blocks fit an SM */
		if (a->walk == SM70__BENCH_KV_WALK_OP_GRID)
			smem = (int)(bench.c->smem_optin / 2 - 8 * 1024);
		kvr_kernel<<<dim3((unsigned)units, (unsigned)((ctx + r.chunk - 1) / r.chunk)),
			     KVR_THREADS, smem, bench.c->stream>>>(r);
		return cudaGetLastError() == cudaSuccess ? 0 : -EIO;
	}
}

/* The attention op (walk < 0) or a read walk over the same cache. */
static int attn_bench(int n_heads, int n_kv, int D, int kv, int batch, int ctx, int walk,
		      int iters, struct sm70__bench_attn *out)
{
	const int bs = 16, per_seq = (ctx + bs - 1) / bs, n_blocks = per_seq * batch;
	const struct sm70_kv_layout lay = bench_kv_layout(kv, n_blocks, bs, n_kv, D);
	const size_t cache = bench_kv_bytes(&lay, 0) + bench_kv_bytes(&lay, 1); /* K + V */
	struct attn_ctx *a = (struct attn_ctx *)calloc(1, sizeof(*a));
	int32_t *h_pos = NULL, *h_seq = NULL, *h_bt = NULL, *perm = NULL;
	int32_t *d_ints = NULL;
	uint64_t rng = 0x1234567ULL;
	int ret = 0, per;

	if (!a)
		return -ENOMEM;
	h_pos = (int32_t *)malloc(batch * 4);
	h_seq = (int32_t *)malloc(batch * 4);
	h_bt = (int32_t *)malloc((size_t)n_blocks * 4);
	perm = (int32_t *)malloc((size_t)n_blocks * 4);
	if (!h_pos || !h_seq || !h_bt || !perm) {
		ret = -ENOMEM;
		goto out;
	}
	/* A shuffled pool, as after some churn of the block allocator. */
	for (int i = 0; i < n_blocks; i++)
		perm[i] = i;
	for (int i = n_blocks - 1; i > 0; i--) {
		int j, t;

		rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
		j = (int)((rng >> 33) % (uint64_t)(i + 1));
		t = perm[i];
		perm[i] = perm[j];
		perm[j] = t;
	}
	for (int s = 0; s < batch; s++) {
		h_pos[s] = ctx - 1;
		h_seq[s] = s;
		for (int j = 0; j < per_seq; j++)
			h_bt[s * per_seq + j] = perm[s * per_seq + j];
	}
	SM70_BENCH_CHECK(cudaMalloc(&d_ints, (size_t)(2 * batch + n_blocks) * 4));
	SM70_BENCH_CHECK(cudaMemcpy(d_ints, h_pos, batch * 4, cudaMemcpyHostToDevice));
	SM70_BENCH_CHECK(cudaMemcpy(d_ints + batch, h_seq, batch * 4, cudaMemcpyHostToDevice));
	SM70_BENCH_CHECK(cudaMemcpy(d_ints + 2 * batch, h_bt, (size_t)n_blocks * 4,
			  cudaMemcpyHostToDevice));

	a->lay = lay;
	a->b = (struct sm70_batch){ .n_tokens = batch, .n_seqs = batch, .max_blocks = per_seq,
				    .max_pos = ctx, .tok_ids = NULL, .tok_pos = d_ints,
				    .tok_seq = d_ints + batch, .tok_slot = NULL,
				    .block_tables = d_ints + 2 * batch, .n_out = 0,
				    .out_rows = NULL };
	a->n_heads = n_heads;
	a->walk = walk;
	a->q_ld = (n_heads + 2 * n_kv) * D;
	a->scale = 1.0f / sqrtf((float)D);
	a->ncopies = copies_for((double)cache, 128);
	for (int i = 0; i < a->ncopies; i++) {
		a->kv[i].k_scale = 0.05f;
		a->kv[i].v_scale = 0.04f;
		ret = bench_kv_fill(a, i);
		if (ret)
			goto out;
	}
	SM70_BENCH_CHECK(cudaMalloc(&a->q, (size_t)batch * a->q_ld * 2));
	SM70_BENCH_CHECK(cudaMalloc(&a->out, (size_t)batch * n_heads * D * 2));
	ret = fill_f16(a->q, (size_t)batch * a->q_ld, 99, 2.0f);
	if (ret)
		goto out;
	per = a->ncopies < 8 ? 8 / a->ncopies * a->ncopies : a->ncopies;
	ret = time_median(launch_attn, a, per, iters, &out->us);
	/* K and V: cache / n_blocks bytes a block, ctx positions a sequence */
	out->bytes = (double)cache / ((double)n_blocks * bs) * batch * ctx +
		     (double)batch * n_heads * D * 2 * 2;
out:
	if (a->out)
		cudaFree(a->out);
	if (a->q)
		cudaFree(a->q);
	for (int i = a->ncopies - 1; i >= 0; i--) {
		if (a->kv[i].v)
			cudaFree(a->kv[i].v);
		if (a->kv[i].k)
			cudaFree(a->kv[i].k);
	}
	if (d_ints)
		cudaFree(d_ints);
	free(perm);
	free(h_bt);
	free(h_seq);
	free(h_pos);
	free(a);
	return ret;
}

extern "C" int sm70__bench_attention(int n_heads, int n_kv, int D, int kv, int batch, int ctx,
				     int iters, struct sm70__bench_attn *out)
{
	return attn_bench(n_heads, n_kv, D, kv, batch, ctx, -1, iters, out);
}

extern "C" int sm70__bench_kv_read(int n_heads, int n_kv, int D, int kv, int batch, int ctx,
				   int walk, int iters, struct sm70__bench_attn *out)
{
	int ret;

	if (walk < 0 || walk >= SM70__BENCH_KV_WALKS)
		return -EINVAL;
	if (walk == SM70__BENCH_KV_WALK_OP_GRID &&
	    cudaFuncSetAttribute(kvr_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
				 (int)(bench.c->smem_optin / 2)) != cudaSuccess)
		return -EIO;
	ret = attn_bench(n_heads, n_kv, D, kv, batch, ctx, walk, iters, out);
	return ret;
}

/* ---- prefill attention ------------------------------------------------------------ */

/* A prefill launch: the batch with its chunk, or (decode_path) the same tokens described
 * as a batch without chunks, which the backend runs through the decode kernels. */
struct prefill_ctx {
	struct attn_ctx *a;
	int decode_path;
};

static int launch_prefill(void *vctx, int i)
{
	struct prefill_ctx *x = (struct prefill_ctx *)vctx;
	struct sm70_batch b = x->a->b;

	if (x->decode_path) {
		b.n_chunks = 0;
		b.n_decode = 0;
	}
	bench.be->ops->attention(bench.be, x->a->out, x->a->q, x->a->q_ld,
				 &x->a->kv[i % x->a->ncopies], &x->a->lay, &b, x->a->n_heads,
				 x->a->scale);
	return bench.c->sticky;
}

extern "C" int sm70__bench_prefill(int n_heads, int n_kv, int D, int kv, int chunk, int ctx,
				   int iters, struct sm70__bench_prefill *out)
{
	const int bs = 16, n_blocks = (ctx + bs - 1) / bs;
	const struct sm70_kv_layout lay = bench_kv_layout(kv, n_blocks, bs, n_kv, D);
	const size_t cache = bench_kv_bytes(&lay, 0) + bench_kv_bytes(&lay, 1); /* K + V */
	struct attn_ctx *a = (struct attn_ctx *)calloc(1, sizeof(*a));
	struct prefill_ctx x = { a, 0 };
	/* ints: pos[chunk], seq[chunk], chunk_first, chunk_len, block table */
	const size_t n_ints = 2 * (size_t)chunk + 2 + n_blocks;
	int32_t *h = NULL, *d_ints = NULL;
	int32_t host_first = 0, host_len = chunk;
	uint64_t rng = 0x7654321ULL;
	int ret = 0;

	if (!a)
		return -ENOMEM;
	if (chunk < 1 || ctx < chunk) {
		ret = -EINVAL;
		goto out;
	}
	h = (int32_t *)malloc(n_ints * 4);
	if (!h) {
		ret = -ENOMEM;
		goto out;
	}
	for (int t = 0; t < chunk; t++) {
		h[t] = ctx - chunk + t;
		h[chunk + t] = 0;
	}
	h[2 * chunk] = 0;
	h[2 * chunk + 1] = chunk;
	/* a shuffled block table, as after some churn of the block allocator */
	for (int i = 0; i < n_blocks; i++)
		h[2 * chunk + 2 + i] = i;
	for (int i = n_blocks - 1; i > 0; i--) {
		int32_t *bt = h + 2 * chunk + 2, j, t;

		rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
		j = (int32_t)((rng >> 33) % (uint64_t)(i + 1));
		t = bt[i];
		bt[i] = bt[j];
		bt[j] = t;
	}
	SM70_BENCH_CHECK(cudaMalloc(&d_ints, n_ints * 4));
	SM70_BENCH_CHECK(cudaMemcpy(d_ints, h, n_ints * 4, cudaMemcpyHostToDevice));

	a->lay = lay;
	a->b = (struct sm70_batch){ .n_tokens = chunk, .n_seqs = 1, .max_blocks = n_blocks,
				    .max_pos = ctx, .tok_ids = NULL, .tok_pos = d_ints,
				    .tok_seq = d_ints + chunk, .tok_slot = NULL,
				    .block_tables = d_ints + 2 * chunk + 2, .n_out = 0,
				    .out_rows = NULL, .n_decode = 0, .n_chunks = 1,
				    .chunk_first = d_ints + 2 * chunk,
				    .chunk_len = d_ints + 2 * chunk + 1,
				    .chunk_first_host = &host_first, .chunk_len_host = &host_len };
	a->n_heads = n_heads;
	a->walk = -1;
	a->q_ld = (n_heads + 2 * n_kv) * D;
	a->scale = 1.0f / sqrtf((float)D);
	/* compute-bound: copies only so that the first tiles do not start in L2 */
	a->ncopies = copies_for((double)cache, 8);
	for (int i = 0; i < a->ncopies; i++) {
		a->kv[i].k_scale = 0.05f;
		a->kv[i].v_scale = 0.04f;
		ret = bench_kv_fill(a, i);
		if (ret)
			goto out;
	}
	SM70_BENCH_CHECK(cudaMalloc(&a->q, (size_t)chunk * a->q_ld * 2));
	SM70_BENCH_CHECK(cudaMalloc(&a->out, (size_t)chunk * n_heads * D * 2));
	ret = fill_f16(a->q, (size_t)chunk * a->q_ld, 99, 2.0f);
	if (ret)
		goto out;
	x.decode_path = 0;
	ret = time_median(launch_prefill, &x, a->ncopies, iters, &out->us);
	if (ret)
		goto out;
	x.decode_path = 1;
	ret = time_median(launch_prefill, &x, a->ncopies, iters, &out->us_decode);
	/* token t sees ctx - chunk + t + 1 positions */
	out->flops = 4.0 * n_heads * D *
		     ((double)chunk * (ctx - chunk) + (double)chunk * (chunk + 1) / 2.0);
out:
	if (a->out)
		cudaFree(a->out);
	if (a->q)
		cudaFree(a->q);
	for (int i = a->ncopies - 1; i >= 0; i--) {
		if (a->kv[i].v)
			cudaFree(a->kv[i].v);
		if (a->kv[i].k)
			cudaFree(a->kv[i].k);
	}
	if (d_ints)
		cudaFree(d_ints);
	free(h);
	free(a);
	return ret;
}
