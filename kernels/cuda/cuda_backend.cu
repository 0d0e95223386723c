/*
 * cuda_backend.cu - the CUDA backend: construction, memory, the error reporter and the op
 * table. The ops themselves live one per .cu beside this file.
 *
 * One backend drives one device through one non-blocking stream; cuBLAS is bound to the
 * same stream, so every op, upload and download is ordered by the stream alone. Memory is
 * plain cudaMalloc (zeroed, like the CPU backend's). Uploads copy through pinned staging
 * slots so that the caller may free its buffer at once without the stream being drained.
 * host_register pins and maps host ranges (PLE tables) that kernels then read in place.
 *
 * Graph capture and replay live in graph.cu; the model decides what to capture.
 * Non-goals: multi-stream overlap, memory pools, recovery from a faulted context.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/words.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/pdl.h"

void sm70__cuda_fail(struct sm70_backend *be, const char *call, const char *file, int line,
		     const char *msg)
{
	fprintf(stderr, "%s:%d: %s: %s\n", file, line, call, msg);
	if (be && be->priv) {
		struct sm70__cuda *c = (struct sm70__cuda *)be->priv;

		if (!c->sticky)
			c->sticky = -EIO;
	}
}

static void *cuda_buf_alloc(struct sm70_backend *be, size_t bytes)
{
	struct sm70__cuda *c = sm70__cuda_enter(be);
	void *p = NULL;

	/* A failed cudaMalloc is an answer (NULL), not a fault of the context: no sticky
	 * error, but clear the "last error" so the next launch check does not see it. */
	if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) {
		cudaGetLastError();
		return NULL;
	}
	if (SM70_CUDA_CHECK(be, cudaMemsetAsync(p, 0, bytes, c->stream))) {
		cudaFree(p);
		return NULL;
	}
	return p;
}

/* Waits for the stream first: work queued on it may still use p. */
static void cuda_buf_free(struct sm70_backend *be, void *p)
{
	struct sm70__cuda *c = sm70__cuda_enter(be);

	if (!p)
		return;
	SM70_CUDA_CHECK(be, cudaStreamSynchronize(c->stream));
	SM70_CUDA_CHECK(be, cudaFree(p));
}

/* Copies through the pinned slots: a slot is reused only after its last copy finished, so
 * small uploads (a step's batch arrays) never wait for the stream to drain. */
static int cuda_upload(struct sm70_backend *be, void *dst, const void *src, size_t bytes)
{
	struct sm70__cuda *c = sm70__cuda_enter(be);
	size_t off = 0;

	if (!c->stage[0]) {
		/* No pinned memory: copy straight from the caller's buffer and wait. */
		if (SM70_CUDA_CHECK(be, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice,
							 c->stream)))
			return -EIO;
		if (c->kt)
			sm70__kt_mark(c, "upload");
		if (SM70_CUDA_CHECK(be, cudaStreamSynchronize(c->stream)))
			return -EIO;
		return 0;
	}
	while (off < bytes) {
		int s = c->stage_next;
		size_t n = bytes - off < SM70__CUDA_STAGE_BYTES ? bytes - off :
								  SM70__CUDA_STAGE_BYTES;

		c->stage_next = (s + 1) % SM70__CUDA_STAGE_SLOTS;
		if (SM70_CUDA_CHECK(be, cudaEventSynchronize(c->stage_done[s])))
			return -EIO;
		memcpy(c->stage[s], (const char *)src + off, n);
		if (SM70_CUDA_CHECK(be, cudaMemcpyAsync((char *)dst + off, c->stage[s], n,
							 cudaMemcpyHostToDevice, c->stream)) ||
		    SM70_CUDA_CHECK(be, cudaEventRecord(c->stage_done[s], c->stream)))
			return -EIO;
		if (c->kt)
			sm70__kt_mark(c, "upload");
		off += n;
	}
	return 0;
}

static int cuda_download(struct sm70_backend *be, void *dst, const void *src, size_t bytes)
{
	struct sm70__cuda *c = sm70__cuda_enter(be);

	if (SM70_CUDA_CHECK(be, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost,
						 c->stream)))
		return -EIO;
	if (c->kt)
		sm70__kt_mark(c, "download");
	if (SM70_CUDA_CHECK(be, cudaStreamSynchronize(c->stream)))
		return -EIO;
	if (c->kt)
		sm70__kt_step_end(c);
	return c->sticky;
}

/* cudaHostRegister's failures as -errno; they are answers, not faults of the context. */
static int host_reg_errno(cudaError_t e)
{
	cudaGetLastError();
	switch (e) {
	case cudaErrorHostMemoryAlreadyRegistered: return -EEXIST;
	case cudaErrorMemoryAllocation: return -ENOMEM;
	case cudaErrorInvalidValue: return -EINVAL;
	default: return -EIO;
	}
}

/* Pins and maps [p, p + bytes) for every device (portable); where the device cannot read
 * it at p, remembers the mapped device pointer for sm70__cuda_host_ptr. */
static int cuda_host_register(struct sm70_backend *be, void *p, size_t bytes)
{
	struct sm70__cuda *c = sm70__cuda_enter(be);
	void *dev = NULL;
	cudaError_t e;

	if (!p || !bytes)
		return -EINVAL;
	if (!c->host_ptr_direct && c->n_host_regs == SM70__CUDA_HOST_REGS)
		return -ENOSPC;
	e = cudaHostRegister(p, bytes, cudaHostRegisterMapped | cudaHostRegisterPortable);
	if (e != cudaSuccess) {
		fprintf(stderr, "sm70 cuda: host_register of %zu bytes: %s\n", bytes,
			cudaGetErrorString(e));
		return host_reg_errno(e);
	}
	if (c->host_ptr_direct)
		return 0;
	e = cudaHostGetDevicePointer(&dev, p, 0);
	if (e != cudaSuccess) {
		fprintf(stderr, "sm70 cuda: host_register: no device pointer: %s\n",
			cudaGetErrorString(e));
		cudaHostUnregister(p);
		return host_reg_errno(e);
	}
	c->host_regs[c->n_host_regs++] = (struct sm70__cuda_host_reg){ (const char *)p, bytes,
								       (const char *)dev };
	return 0;
}

/* Waits for the stream first: queued ops may still read the range. */
static void cuda_host_unregister(struct sm70_backend *be, void *p)
{
	struct sm70__cuda *c = sm70__cuda_enter(be);

	if (!p)
		return;
	SM70_CUDA_CHECK(be, cudaStreamSynchronize(c->stream));
	for (int i = 0; i < c->n_host_regs; i++) {
		if (c->host_regs[i].host == (const char *)p) {
			c->host_regs[i] = c->host_regs[--c->n_host_regs];
			break;
		}
	}
	if (cudaHostUnregister(p) != cudaSuccess)
		cudaGetLastError(); /* not registered: nothing to undo */
}

const void *sm70__cuda_host_ptr(const struct sm70__cuda *c, const void *p)
{
	const char *q = (const char *)p;

	for (int i = 0; i < c->n_host_regs; i++) {
		const struct sm70__cuda_host_reg *r = &c->host_regs[i];

		if (q >= r->host && q < r->host + r->bytes)
			return r->dev + (q - r->host);
	}
	return p;
}

/* The remembered fact for (fn, threads, smem), or NULL: a linear search, since a process
 * launches a few dozen kernel instances. */
static struct sm70__cuda_kernel_fact *kernel_fact(struct sm70__cuda *c, const void *fn,
						  int threads, size_t smem)
{
	for (int i = 0; i < c->n_kernel_facts; i++) {
		struct sm70__cuda_kernel_fact *f = &c->kernel_facts[i];

		if (f->fn == fn && f->threads == threads && f->smem == smem)
			return f;
	}
	return NULL;
}

static void remember_fact(struct sm70__cuda *c, const void *fn, int threads, size_t smem,
			  int blocks)
{
	if (c->n_kernel_facts < SM70__CUDA_KERNEL_FACTS)
		c->kernel_facts[c->n_kernel_facts++] =
			(struct sm70__cuda_kernel_fact){ fn, threads, smem, blocks };
}

int sm70__cuda_smem_optin(struct sm70__cuda *c, const void *fn)
{
	struct cudaFuncAttributes fa;

	if (kernel_fact(c, fn, 0, 0))
		return 0;
	/* static shared memory counts against the opt-in limit too */
	if (SM70_CUDA_CHECK(&c->be, cudaFuncGetAttributes(&fa, fn)) ||
	    SM70_CUDA_CHECK(&c->be, cudaFuncSetAttribute(
					    fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
					    (int)(c->smem_optin - fa.sharedSizeBytes))))
		return -EIO;
	remember_fact(c, fn, 0, 0, 1);
	return 0;
}

int sm70__cuda_resident(struct sm70__cuda *c, const void *fn, int threads, size_t smem)
{
	const struct sm70__cuda_kernel_fact *f = kernel_fact(c, fn, threads, smem);
	int blocks = 0;

	if (f)
		return f->blocks;
	if (smem > 48 * 1024 && sm70__cuda_smem_optin(c, fn))
		return 0;
	if (SM70_CUDA_CHECK(&c->be, cudaOccupancyMaxActiveBlocksPerMultiprocessor(
					    &blocks, fn, threads, smem)))
		return 0;
	remember_fact(c, fn, threads, smem, blocks);
	return blocks;
}

static int cuda_sync(struct sm70_backend *be)
{
	struct sm70__cuda *c = sm70__cuda_enter(be);

	if (SM70_CUDA_CHECK(be, cudaStreamSynchronize(c->stream)))
		return -EIO;
	return c->sticky;
}

/* Releases whatever create got, in reverse order; safe on a partly made backend. */
static void cuda_release(struct sm70__cuda *c)
{
	struct sm70_backend *be = &c->be;

	cudaSetDevice(c->device);
	if (c->stream)
		cudaStreamSynchronize(c->stream);
	sm70__kt_destroy(c);
	for (int s = SM70__CUDA_STAGE_SLOTS - 1; s >= 0; s--) {
		if (c->stage_done[s])
			SM70_CUDA_CHECK(be, cudaEventDestroy(c->stage_done[s]));
		if (c->stage[s])
			SM70_CUDA_CHECK(be, cudaFreeHost(c->stage[s]));
	}
	if (c->sample_scratch)
		SM70_CUDA_CHECK(be, cudaFree(c->sample_scratch));
	if (c->gemv_part)
		SM70_CUDA_CHECK(be, cudaFree(c->gemv_part));
	if (c->gemv_count)
		SM70_CUDA_CHECK(be, cudaFree(c->gemv_count));
	if (c->attn_part)
		SM70_CUDA_CHECK(be, cudaFree(c->attn_part));
	if (c->attn_count)
		SM70_CUDA_CHECK(be, cudaFree(c->attn_count));
	if (c->blas)
		SM70_CUBLAS_CHECK(be, cublasDestroy(c->blas));
	if (c->blas_ws)
		SM70_CUDA_CHECK(be, cudaFree(c->blas_ws));
	if (c->side_done)
		SM70_CUDA_CHECK(be, cudaEventDestroy(c->side_done));
	if (c->side_fork)
		SM70_CUDA_CHECK(be, cudaEventDestroy(c->side_fork));
	if (c->side)
		SM70_CUDA_CHECK(be, cudaStreamDestroy(c->side));
	if (c->stream)
		SM70_CUDA_CHECK(be, cudaStreamDestroy(c->stream));
	free(c);
}

static void cuda_destroy(struct sm70_backend *be)
{
	cuda_release((struct sm70__cuda *)be->priv);
}

static const struct sm70_backend_ops cuda_ops = {
	.buf_alloc = cuda_buf_alloc,
	.buf_free = cuda_buf_free,
	.upload = cuda_upload,
	.download = cuda_download,
	.sync = cuda_sync,
	.destroy = cuda_destroy,
	.embed = sm70__cuda_embed,
	.add_rmsnorm = sm70__cuda_add_rmsnorm,
	.add = sm70__cuda_add,
	.matmul = sm70__cuda_matmul,
	.prepare_weight = sm70__cuda_prepare_weight,
	.prepare_experts = sm70__cuda_prepare_experts,
	.head_norm_rope = sm70__cuda_head_norm_rope,
	.kv_write = sm70__cuda_kv_write,
	.attention = sm70__cuda_attention,
	.silu_mul = sm70__cuda_silu_mul,
	.gather_rows = sm70__cuda_gather_rows,
	.sample = sm70__cuda_sample,
	.add_rmsnorm_matmul = sm70__cuda_add_rmsnorm_matmul,
	.matmul_glu = sm70__cuda_matmul_glu,
	.shard_summary = sm70__cuda_shard_summary,
	.qk_norm_rope_kv = sm70__cuda_qk_norm_rope_kv,
	.silu_matmul = sm70__cuda_silu_matmul,
	.conv1d_silu = sm70__cuda_conv1d_silu,
	.gdn = sm70__cuda_gdn,
	.gated_rmsnorm = sm70__cuda_gated_rmsnorm,
	.sigmoid_mul = sm70__cuda_sigmoid_mul,
	.moe_route = sm70__cuda_moe_route,
	.moe_experts = sm70__cuda_moe_experts,
	.sigmoid_scale_add = sm70__cuda_sigmoid_scale_add,
	.group_rmsnorm = sm70__cuda_group_rmsnorm,
	.hc_gates = sm70__cuda_hc_gates,
	.hc_combine = sm70__cuda_hc_combine,
	.hc_inject = sm70__cuda_hc_inject,
	.hc_mix = sm70__cuda_hc_mix,
	.ngram_hist = sm70__cuda_ngram_hist,
	.ple_embed = sm70__cuda_ple_embed,
	.ple_gate = sm70__cuda_ple_gate,
	.ple_conv = sm70__cuda_ple_conv,
	.qsa_key_write = sm70__cuda_qsa_key_write,
	.qsa_compress = sm70__cuda_qsa_compress,
	.qsa_select = sm70__cuda_qsa_select,
	.sparse_attention = sm70__cuda_sparse_attention,
	.host_register = cuda_host_register,
	.host_unregister = cuda_host_unregister,
	.side_begin = sm70__cuda_side_begin,
	.side_end = sm70__cuda_side_end,
	.side_join = sm70__cuda_side_join,
	.graph_begin = sm70__cuda_graph_begin,
	.graph_end = sm70__cuda_graph_end,
	.graph_launch = sm70__cuda_graph_launch,
	.graph_destroy = sm70__cuda_graph_destroy,
};

/* 1 when the environment variable `name` is set to exactly `value`. */
static int env_is(const char *name, const char *value)
{
	const char *v = getenv(name);

	return v && strcmp(v, value) == 0;
}

/* `bytes` of zeroed device memory, or NULL (the error cleared: the caller's op then takes
 * its plain path). */
static void *device_zeroed(size_t bytes)
{
	void *p = NULL;

	if (cudaMalloc(&p, bytes) != cudaSuccess || cudaMemset(p, 0, bytes) != cudaSuccess) {
		cudaGetLastError();
		cudaFree(p);
		return NULL;
	}
	return p;
}

/* 1 when the environment variable `name` says "reference" (the named path back). */
static int wants_reference(const char *name)
{
	if (!env_is(name, "reference"))
		return 0;
	fprintf(stderr, "sm70 cuda: %s=reference: using the reference kernel\n", name);
	return 1;
}

/* Which kinds of launch may overlap (pdl.h): SM70_PDL is a comma-separated list of kinds
 * (prefetch, experts, norm, rope, attention, merge, act, conv, moe, hc, nvfp4, misc),
 * plain (every kind that waits on entry), all, or 0 (none: every launch fully ordered).
 * Unset: prefetch and experts, the kinds measured faster (docs/PERFORMANCE.md, "Overlapped
 * launches"). */
static unsigned want_pdl(void)
{
	static const struct sm70_word kinds[] = {
		{ "prefetch", SM70__PDL_PREFETCH }, { "experts", SM70__PDL_EXPERTS },
		{ "norm", SM70__PDL_NORM },	    { "rope", SM70__PDL_ROPE },
		{ "attention", SM70__PDL_ATTN },    { "merge", SM70__PDL_MERGE },
		{ "act", SM70__PDL_ACT },	    { "conv", SM70__PDL_CONV },
		{ "moe", SM70__PDL_MOE },	    { "hc", SM70__PDL_HC },
		{ "nvfp4", SM70__PDL_NVFP4 },	    { "misc", SM70__PDL_MISC },
		{ "plain", SM70__PDL_PLAIN },	    { "all", ~0u },
		{ "0", 0 },
	};
	const char *v = getenv("SM70_PDL"), *bad;
	size_t bad_len;
	unsigned bits;

	if (!v || !*v)
		return SM70__PDL_PREFETCH | SM70__PDL_EXPERTS;
	if (sm70_words_bits(v, kinds, sizeof(kinds) / sizeof(kinds[0]), &bits, &bad, &bad_len))
		fprintf(stderr, "sm70 cuda: SM70_PDL: kind '%.*s' not known, ignored (and any "
			"after it that is not known)\n", (int)bad_len, bad);
	fprintf(stderr, "sm70 cuda: SM70_PDL=%s: %s\n", v,
		bits ? "overlapped launches for those kinds" : "every launch fully ordered");
	return bits;
}

/* SM70_NVFP4_VARIANT (0 .. 8, see matmul_nvfp4.cu), for timing the NVFP4 kernels against
 * each other; 0 (auto) when unset or out of range. */
static int nvfp4_variant(void)
{
	const char *v = getenv("SM70_NVFP4_VARIANT");
	int n = v ? atoi(v) : 0;

	if (n < 0 || n > 8)
		n = 0;
	if (n)
		fprintf(stderr, "sm70 cuda: SM70_NVFP4_VARIANT=%d\n", n);
	return n;
}

extern "C" int sm70_backend_cuda_create(struct sm70_backend **out, int device,
					struct sm70_err *err)
{
	struct sm70__cuda *c = NULL;
	cudaDeviceProp prop;
	cudaError_t e;
	int count = 0, ret = -EIO;

	*out = NULL;
	e = cudaGetDeviceCount(&count);
	if (e != cudaSuccess || count == 0) {
		cudaGetLastError();
		return sm70_errf(err, -ENODEV, "no CUDA device: %s",
				 cudaGetErrorString(e != cudaSuccess ? e : cudaErrorNoDevice));
	}
	if (device < 0 || device >= count)
		return sm70_errf(err, -ENODEV, "no CUDA device %d (%d present)", device, count);
	e = cudaSetDevice(device);
	if (e == cudaSuccess)
		e = cudaGetDeviceProperties(&prop, device);
	if (e != cudaSuccess)
		return sm70_errf(err, -ENODEV, "CUDA device %d unusable: %s", device,
				 cudaGetErrorString(e));

	c = (struct sm70__cuda *)calloc(1, sizeof(*c));
	if (!c)
		return sm70_errf(err, -ENOMEM, "cuda backend: out of memory");
	c->device = device;
	c->n_sm = prop.multiProcessorCount;
	c->smem_optin = prop.sharedMemPerBlockOptin;
	c->smem_sm = prop.sharedMemPerMultiprocessor;
	if (cudaDeviceGetAttribute(&c->host_ptr_direct,
				   cudaDevAttrCanUseHostPointerForRegisteredMem, device) !=
	    cudaSuccess) {
		cudaGetLastError();
		c->host_ptr_direct = 0; /* unknown: translate, which is right either way */
	}
	c->be.priv = c;
	e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
	if (e != cudaSuccess) {
		c->stream = NULL;
		sm70_errf(err, ret, "cuda backend: cannot create a stream: %s",
			  cudaGetErrorString(e));
		goto fail;
	}
	c->main = c->stream;
	if (cudaStreamCreateWithFlags(&c->side, cudaStreamNonBlocking) != cudaSuccess ||
	    cudaEventCreateWithFlags(&c->side_fork, cudaEventDisableTiming) != cudaSuccess ||
	    cudaEventCreateWithFlags(&c->side_done, cudaEventDisableTiming) != cudaSuccess) {
		sm70_errf(err, ret, "cuda backend: cannot create the side stream and its events");
		goto fail;
	}
	if (cublasCreate(&c->blas) != CUBLAS_STATUS_SUCCESS) {
		c->blas = NULL;
		sm70_errf(err, ret, "cuda backend: cannot create a cuBLAS handle");
		goto fail;
	}
	if (cublasSetStream(c->blas, c->stream) != CUBLAS_STATUS_SUCCESS) {
		sm70_errf(err, ret, "cuda backend: cannot bind cuBLAS to the stream");
		goto fail;
	}
	/* A fixed workspace: cuBLAS must not allocate while a graph is being captured. */
	e = cudaMalloc(&c->blas_ws, SM70__CUDA_BLAS_WS_BYTES);
	if (e != cudaSuccess ||
	    cublasSetWorkspace(c->blas, c->blas_ws, SM70__CUDA_BLAS_WS_BYTES) !=
		    CUBLAS_STATUS_SUCCESS) {
		if (e == cudaSuccess)
			e = cudaErrorUnknown;
		ret = -ENOMEM;
		sm70_errf(err, ret, "cuda backend: cannot set up the cuBLAS workspace: %s",
			  cudaGetErrorString(e));
		goto fail;
	}
	e = cudaMalloc(&c->attn_part, SM70__CUDA_ATTN_PART_BYTES);
	if (e != cudaSuccess) {
		c->attn_part = NULL;
		ret = -ENOMEM;
		sm70_errf(err, ret, "cuda backend: cannot allocate attention scratch: %s",
			  cudaGetErrorString(e));
		goto fail;
	}
	/* Pinned staging is an optimisation: without it uploads are synchronous. */
	for (int s = 0; s < SM70__CUDA_STAGE_SLOTS; s++) {
		if (cudaMallocHost(&c->stage[s], SM70__CUDA_STAGE_BYTES) != cudaSuccess ||
		    cudaEventCreateWithFlags(&c->stage_done[s], cudaEventDisableTiming) !=
			    cudaSuccess) {
			cudaGetLastError();
			for (int i = s; i >= 0; i--) {
				if (c->stage_done[i])
					cudaEventDestroy(c->stage_done[i]);
				if (c->stage[i])
					cudaFreeHost(c->stage[i]);
				c->stage_done[i] = NULL;
				c->stage[i] = NULL;
			}
			break;
		}
	}
	c->matmul_ref = wants_reference("SM70_MATMUL");
	c->nvfp4_ref = wants_reference("SM70_NVFP4");
	c->nvfp4_variant = nvfp4_variant();
	/* SM70_NVFP4_SPLIT=N: N chunks a row tile in the NVFP4 split kernel (for timing its rule,
	 * matmul_nvfp4_split.cu), where the scratch allows */
	c->nvfp4_split = getenv("SM70_NVFP4_SPLIT") ? atoi(getenv("SM70_NVFP4_SPLIT")) : 0;
	if (c->nvfp4_split < 0 || c->nvfp4_split > 32)
		c->nvfp4_split = 0;
	c->attn_ref = wants_reference("SM70_ATTENTION");
	c->sample_ref = wants_reference("SM70_SAMPLER");
	c->pdl = prop.major >= 9 ? want_pdl() : 0;
	ret = sm70__kt_create(c); /* after pdl: a profiled backend runs without overlap */
	if (ret) {
		sm70_errf(err, ret, "cuda backend: cannot set up SM70_KERNEL_TIMES's events");
		goto fail;
	}
	/* 4-warp blocks where they fit one wave: measured faster at B1 (docs/PERFORMANCE.md,
	 * "Defaults after the first measurement"); SM70_GEMV_WARPS=8 is the path back. */
	c->gemv_warps = -1;
	if (env_is("SM70_GEMV_WARPS", "4"))
		c->gemv_warps = 4;
	else if (env_is("SM70_GEMV_WARPS", "8"))
		c->gemv_warps = 8;
	if (c->gemv_warps != -1)
		fprintf(stderr, "sm70 cuda: SM70_GEMV_WARPS=%d: %d-warp GEMV blocks\n", c->gemv_warps,
			c->gemv_warps);
	/* Optional scratch: without it an op takes its plain path. The sample op's (else its
	 * reference kernel); SM70_ATTN_FOLD=1's merge counters (not yet measured, so off by
	 * default; else the separate merge); the split GEMVs' partials and counters (else
	 * every GEMV runs unsplit; SM70_GEMV_SPLIT=0 asks for that, the path back). */
	c->sample_scratch = device_zeroed(SM70__CUDA_SAMPLE_SCRATCH_BYTES);
	if (env_is("SM70_ATTN_FOLD", "1")) {
		c->attn_count =
			(int32_t *)device_zeroed(SM70__CUDA_ATTN_COUNTERS * sizeof(int32_t));
		fprintf(stderr, "sm70 cuda: SM70_ATTN_FOLD=1: %s\n",
			c->attn_count ? "attention merges in its last split block" :
					"no memory for the counters; separate merge");
	}
	if (env_is("SM70_GEMV_SPLIT", "0")) {
		fprintf(stderr, "sm70 cuda: SM70_GEMV_SPLIT=0: GEMVs never split their columns\n");
	} else {
		c->gemv_part = (float *)device_zeroed(SM70__CUDA_GEMV_PART_BYTES);
		c->gemv_count = (int32_t *)device_zeroed(SM70__CUDA_GEMV_TILES * sizeof(int32_t));
		if (!c->gemv_part || !c->gemv_count) {
			cudaFree(c->gemv_part);
			cudaFree(c->gemv_count);
			c->gemv_part = NULL;
			c->gemv_count = NULL;
		}
	}

	c->be.ops = &cuda_ops;
	c->be.name = "cuda";
	c->be.act_dtype = SM70_DTYPE_F16;
	c->be.weight_dtype = SM70_DTYPE_F16;
	c->be.kv_dtypes = (1u << SM70_DTYPE_F16) | (1u << SM70_DTYPE_F8E4M3);
	/* the kernels are instantiated for these pairs only (attention.cu) */
	c->be.kv_v_dtypes[SM70_DTYPE_F8E4M3] = 1u << SM70_DTYPE_F16;
	c->be.kv_dtype_default = SM70_DTYPE_F16;
	c->be.batch_invariant = sm70_batch_invariant_env();
	if (c->be.batch_invariant)
		fprintf(stderr, "sm70 cuda: SM70_BATCH_INVARIANT=1: one kernel and one reduction "
				"order for every batch size\n");
	*out = &c->be;
	return 0;

fail:
	cuda_release(c);
	return ret;
}
