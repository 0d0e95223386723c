/*
 * cpu_backend.c - the CPU backend: construction, memory, and the op table.
 *
 * The CPU backend is the numerical reference: f32 activations, weights read as f32,
 * f16, bf16 or NVFP4, all math in f32 with the long reductions done carefully (see each op's
 * file). "Backend memory" is ordinary host memory, so upload/download are memcpy and
 * sync has nothing to wait for. Ops run on a persistent thread pool.
 *
 * Non-goals: NUMA placement, SIMD intrinsics, running two callers on one backend.
 */
#include "kernels/cpu/cpu_ops.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

float sm70__f16_lut[65536];
float sm70__e4m3_lut[256];

static pthread_once_t tables_once = PTHREAD_ONCE_INIT;

static void tables_fill(void)
{
	for (uint32_t i = 0; i < 65536; i++)
		sm70__f16_lut[i] = sm70_f16_to_f32((uint16_t)i);
	for (uint32_t i = 0; i < 256; i++)
		sm70__e4m3_lut[i] = sm70_e4m3_to_f32((uint8_t)i);
}

void sm70__cpu_tables_init(void)
{
	pthread_once(&tables_once, tables_fill);
}

float *sm70__cpu_scratch(struct sm70__cpu *c, size_t floats)
{
	size_t stride, bytes;
	float *p;

	if (c->scratch_off)
		return NULL;
	if (floats <= c->scratch_stride)
		return c->scratch;
	/* Round to 64 bytes so that slices never share a cache line; grow by at least half
	 * again so that a slowly rising max_pos does not reallocate every step. */
	stride = (floats + 15) & ~(size_t)15;
	if (stride < c->scratch_stride + c->scratch_stride / 2)
		stride = (c->scratch_stride + c->scratch_stride / 2 + 15) & ~(size_t)15;
	if (stride > SIZE_MAX / sizeof(float) / (size_t)c->n_threads)
		return NULL;
	bytes = stride * sizeof(float) * (size_t)c->n_threads;
	p = aligned_alloc(64, bytes);
	if (!p)
		return NULL;
	free(c->scratch);
	c->scratch = p;
	c->scratch_stride = stride;
	return p;
}

/*
 * Zeroed, 64-byte aligned memory. calloc, not aligned_alloc + memset: for large blocks
 * (KV caches, workspaces: tens of MiB) glibc hands out fresh mmap pages that are
 * already zero, so only the pages a model actually touches are ever faulted in. The
 * pointer calloc returned is kept just below the aligned one, for buf_free.
 */
static void *cpu_buf_alloc(struct sm70_backend *be, size_t bytes)
{
	const size_t extra = 64 + sizeof(void *);
	uintptr_t base, p;

	if (bytes > SIZE_MAX - extra)
		return NULL;
	base = (uintptr_t)calloc(1, bytes + extra);
	if (!base)
		return NULL;
	p = (base + sizeof(void *) + 63) & ~(uintptr_t)63;
	memcpy((void *)(p - sizeof(void *)), &base, sizeof(base));
	return (void *)p;
}

static void cpu_buf_free(struct sm70_backend *be, void *p)
{
	uintptr_t base;

	if (!p)
		return;
	memcpy(&base, (char *)p - sizeof(void *), sizeof(base));
	free((void *)base);
}

static int cpu_upload(struct sm70_backend *be, void *dst, const void *src, size_t bytes)
{
	if (bytes)
		memcpy(dst, src, bytes);
	return 0;
}

static int cpu_download(struct sm70_backend *be, void *dst, const void *src, size_t bytes)
{
	if (bytes)
		memcpy(dst, src, bytes);
	return 0;
}

/* Ops finish before they return, so there is never anything to wait for. */
static int cpu_sync(struct sm70_backend *be)
{
	return 0;
}

static void cpu_destroy(struct sm70_backend *be)
{
	struct sm70__cpu *c = sm70__cpu_of(be);

	sm70__pool_destroy(c->pool);
	free(c->scratch);
	free(c);
}

static const struct sm70_backend_ops cpu_ops = {
	.buf_alloc = cpu_buf_alloc,
	.buf_free = cpu_buf_free,
	.upload = cpu_upload,
	.download = cpu_download,
	.sync = cpu_sync,
	.destroy = cpu_destroy,
	.embed = sm70__cpu_embed,
	.add_rmsnorm = sm70__cpu_add_rmsnorm,
	.add = sm70__cpu_add,
	.matmul = sm70__cpu_matmul,
	.add_rmsnorm_matmul = sm70__cpu_add_rmsnorm_matmul,
	.matmul_glu = sm70__cpu_matmul_glu,
	.prepare_weight = sm70__cpu_prepare_weight,
	.prepare_experts = sm70__cpu_prepare_experts,
	.head_norm_rope = sm70__cpu_head_norm_rope,
	.kv_write = sm70__cpu_kv_write,
	.attention = sm70__cpu_attention,
	.silu_mul = sm70__cpu_silu_mul,
	.gather_rows = sm70__cpu_gather_rows,
	.shard_summary = sm70__cpu_shard_summary,
	.conv1d_silu = sm70__cpu_conv1d_silu,
	.gdn = sm70__cpu_gdn,
	.gated_rmsnorm = sm70__cpu_gated_rmsnorm,
	.sigmoid_mul = sm70__cpu_sigmoid_mul,
	.moe_route = sm70__cpu_moe_route,
	.moe_experts = sm70__cpu_moe_experts,
	.sigmoid_scale_add = sm70__cpu_sigmoid_scale_add,
	.group_rmsnorm = sm70__cpu_group_rmsnorm,
	.hc_gates = sm70__cpu_hc_gates,
	.hc_combine = sm70__cpu_hc_combine,
	.hc_inject = sm70__cpu_hc_inject,
	.ngram_hist = sm70__cpu_ngram_hist,
	.ple_embed = sm70__cpu_ple_embed,
	.ple_gate = sm70__cpu_ple_gate,
	.ple_conv = sm70__cpu_ple_conv,
	.qsa_key_write = sm70__cpu_qsa_key_write,
	.qsa_compress = sm70__cpu_qsa_compress,
	.qsa_select = sm70__cpu_qsa_select,
	.sparse_attention = sm70__cpu_sparse_attention,
};

int sm70_backend_cpu_create(struct sm70_backend **out, int n_threads, struct sm70_err *err)
{
	struct sm70__cpu *c;
	int ret;

	*out = NULL;
	if (n_threads < 0)
		return sm70_errf(err, -EINVAL, "cpu backend: n_threads %d is negative", n_threads);
	if (n_threads == 0) {
		long online = sysconf(_SC_NPROCESSORS_ONLN);

		n_threads = online < 1 ? 1 : online > 256 ? 256 : (int)online;
	}
	sm70__cpu_tables_init();

	c = calloc(1, sizeof(*c));
	if (!c)
		return sm70_errf(err, -ENOMEM, "cpu backend: out of memory");
	c->n_threads = n_threads;
	ret = sm70__pool_create(&c->pool, n_threads);
	if (ret < 0) {
		sm70_errf(err, ret, "cpu backend: cannot start %d threads (error %d)", n_threads,
			  -ret);
		goto fail;
	}
	c->be.ops = &cpu_ops;
	c->be.name = "cpu";
	c->be.act_dtype = SM70_DTYPE_F32;
	c->be.weight_dtype = SM70_DTYPE_COUNT; /* matmul reads f32, f16 and bf16 as stored */
	c->be.kv_dtypes = (1u << SM70_DTYPE_F32) | (1u << SM70_DTYPE_F16) |
			  (1u << SM70_DTYPE_F8E4M3);
	/* row conversions are per tensor: any V dtype goes with any K dtype */
	for (int t = 0; t < SM70_DTYPE_COUNT; t++)
		if (c->be.kv_dtypes & (1u << t))
			c->be.kv_v_dtypes[t] = c->be.kv_dtypes & ~(1u << t);
	c->be.kv_dtype_default = SM70_DTYPE_F32;
	c->be.batch_invariant = sm70_batch_invariant_env();
	c->be.priv = c;
	*out = &c->be;
	return 0;

fail:
	free(c);
	return ret;
}
