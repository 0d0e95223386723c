/*
 * cuda_check.h - what the CUDA backend's .cu files share: the backend's private state and
 * the one error reporter every CUDA and cuBLAS call goes through.
 *
 * A failed call is logged as "file:line: call: message" on stderr and recorded as the
 * backend's sticky error; sync() then returns -EIO and the daemon exits non-zero (a CUDA
 * context that has faulted cannot be trusted again). Ops return void (backend.h), so the
 * sticky error is how a failed launch reaches the caller.
 *
 * C++ (nvcc) only: it includes the CUDA headers, which public and C headers never do.
 * Non-goals: recovering from a sticky error; more than one caller per backend.
 */
#ifndef SM70_KERNELS_CUDA_CUDA_CHECK_H
#define SM70_KERNELS_CUDA_CUDA_CHECK_H

#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <errno.h>

extern "C" {
#include "kernels/backend.h"
#include "kernels/cuda/cuda_ops.h"
}

/* Pinned staging slots for upload(): the caller's host buffer may be freed as soon as
 * upload returns, so bytes go through these (memcpy, then an async copy whose event says
 * when the slot may be reused). */
#define SM70__CUDA_STAGE_SLOTS 2
#define SM70__CUDA_STAGE_BYTES (4u << 20)

/* Split-KV attention keeps its partial results here; allocated once at create because
 * ops never allocate. Attention uses fewer splits when a batch would need more. */
#define SM70__CUDA_ATTN_PART_BYTES (16u << 20)

/* Arrival counters of the folded attention merge (SM70_ATTN_FOLD=1, attention.cu), one
 * per (token, KV head) of a launch; zeroed once at create, every call leaves them at 0. */
#define SM70__CUDA_ATTN_COUNTERS 16384

/* The sample op's row barriers, partial lists and histograms (sample.cu); zeroed once at
 * create, and each call leaves its barrier counters at zero again. */
#define SM70__CUDA_SAMPLE_SCRATCH_BYTES (8u << 20)

/* Column-split GEMV partials and their per-tile arrival counters (matmul.cu); the counters
 * are zeroed once at create and every call leaves them at zero. A launch that would need
 * more than this does not split. */
#define SM70__CUDA_GEMV_PART_BYTES (8u << 20)
#define SM70__CUDA_GEMV_TILES 65536

/* cuBLAS workspace, fixed so captured graphs never make cuBLAS allocate */
#define SM70__CUDA_BLAS_WS_BYTES (32u << 20)

/* Host ranges host_register mapped, remembered only on devices that cannot read a
 * registered host pointer as it is (cudaDevAttrCanUseHostPointerForRegisteredMem 0):
 * ple_embed then reads a table through the device pointer of its range. */
#define SM70__CUDA_HOST_REGS 64

struct sm70__cuda_host_reg {
	const char *host;
	size_t bytes;
	const char *dev;
};

/* Kernel instances whose launch facts (shared memory opt-in, blocks an SM holds) a backend
 * remembers; past this many they are asked again at each launch, which is only slower. */
#define SM70__CUDA_KERNEL_FACTS 256

/* One remembered fact: threads 0 marks fn's shared memory opt-in (blocks 1: done). */
struct sm70__cuda_kernel_fact {
	const void *fn;
	int threads;
	size_t smem;
	int blocks;
};

/* The backend's private state (be->priv). */
struct sm70__cuda {
	struct sm70_backend be;
	int device;
	int n_sm;                 /* multiprocessors, for sizing grids */
	size_t smem_optin;        /* most dynamic shared memory one block may ask for */
	size_t smem_sm;           /* shared memory of an SM; each block also takes 1 KB of it
				   * for the driver (ncu: "Driver Shared Memory Per Block") */
	cudaStream_t stream;      /* every op and copy is queued here */
	cudaStream_t main;        /* stream outside a side section (side_stream.cu) */
	cudaStream_t side;        /* stream inside one */
	cudaEvent_t side_fork, side_done;
	cublasHandle_t blas;      /* bound to stream */
	void *blas_ws;            /* its workspace, SM70__CUDA_BLAS_WS_BYTES */
	int sticky;               /* first error seen (-EIO), 0 while healthy */
	int matmul_ref;           /* SM70_MATMUL=reference */
	int nvfp4_ref;            /* SM70_NVFP4=reference: ModelOpt layout, reference kernel */
	int nvfp4_variant;        /* SM70_NVFP4_VARIANT: matmul_nvfp4.cu's kernel choice, 0 auto */
	int nvfp4_split;          /* SM70_NVFP4_SPLIT: the split kernel's chunks a tile, 0 auto */
	int attn_ref;             /* SM70_ATTENTION=reference */
	float *attn_part;         /* split-KV partials, SM70__CUDA_ATTN_PART_BYTES */
	int32_t *attn_count;      /* SM70_ATTN_FOLD=1: SM70__CUDA_ATTN_COUNTERS, else NULL */
	void *sample_scratch;     /* SM70__CUDA_SAMPLE_SCRATCH_BYTES, zeroed; NULL: reference */
	int sample_ref;           /* SM70_SAMPLER=reference */
	float *gemv_part;         /* SM70__CUDA_GEMV_PART_BYTES; NULL (or SM70_GEMV_SPLIT=0):
				   * GEMVs never split their columns */
	int32_t *gemv_count;      /* SM70__CUDA_GEMV_TILES counters, zero between calls */
	int gemv_warps;           /* SM70_GEMV_WARPS: -1 (auto, default), 4 or 8, matmul.cu */
	unsigned pdl;             /* SM70__PDL_* kinds whose launches may overlap (pdl.h) */
	void *stage[SM70__CUDA_STAGE_SLOTS];
	cudaEvent_t stage_done[SM70__CUDA_STAGE_SLOTS];
	int stage_next;
	int host_ptr_direct;      /* registered host memory is read through its own address */
	int n_host_regs;          /* used entries of host_regs (host_ptr_direct 0 only) */
	struct sm70__cuda_host_reg host_regs[SM70__CUDA_HOST_REGS];
	int n_kernel_facts;
	struct sm70__cuda_kernel_fact kernel_facts[SM70__CUDA_KERNEL_FACTS];
	struct sm70__kt *kt;      /* SM70_KERNEL_TIMES=1: kernel_times.cu's state, else NULL */
};

/* kernel_times.cu: create (0, or -errno; leaves c->kt NULL unless SM70_KERNEL_TIMES=1),
 * destroy, an event after the op just queued (named name, plus the label while one is
 * set), the end of a step (after the stream was waited for), and the label (NULL clears
 * it). Call the last three only when c->kt is set. */
int sm70__kt_create(struct sm70__cuda *c);
void sm70__kt_destroy(struct sm70__cuda *c);
void sm70__kt_mark(struct sm70__cuda *c, const char *name);
void sm70__kt_step_end(struct sm70__cuda *c);
void sm70__kt_label(struct sm70__cuda *c, const char *fmt, ...);

/* The private state of a CUDA backend, with its device made current for this thread (a
 * cheap call; it keeps one backend per GPU usable from any thread). */
static inline struct sm70__cuda *sm70__cuda_enter(struct sm70_backend *be)
{
	struct sm70__cuda *c = (struct sm70__cuda *)be->priv;

	cudaSetDevice(c->device);
	return c;
}

/* The address kernels read host memory p (in a range host_register mapped) through: p
 * itself unless the device needs the mapped device pointer. A pointer outside every
 * remembered range is returned as it is (device memory, say). Defined in
 * cuda_backend.cu. */
const void *sm70__cuda_host_ptr(const struct sm70__cuda *c, const void *p);

/* Lets kernel fn take all the dynamic shared memory a block may have beside its static
 * part (cudaFuncAttributeMaxDynamicSharedMemorySize: needed past 48 KB), once per backend.
 * 0 or -EIO. Defined in cuda_backend.cu, as is the next. */
int sm70__cuda_smem_optin(struct sm70__cuda *c, const void *fn);

/* Blocks of `threads` threads with `smem` dynamic shared bytes that one SM holds of kernel
 * fn (its registers, static and dynamic shared memory), opted in first where smem is past
 * 48 KB; asked once per backend and kept. 0 on a CUDA error (recorded) or when none fits. */
int sm70__cuda_resident(struct sm70__cuda *c, const void *fn, int threads, size_t smem);

/* Logs "file:line: call: msg" and records the sticky error in be (be may be NULL while
 * the backend is being made). Defined in cuda_backend.cu. */
void sm70__cuda_fail(struct sm70_backend *be, const char *call, const char *file, int line,
		     const char *msg);

static inline int sm70__cuda_check(struct sm70_backend *be, cudaError_t e, const char *call,
				   const char *file, int line)
{
	if (e == cudaSuccess)
		return 0;
	sm70__cuda_fail(be, call, file, line, cudaGetErrorString(e));
	return -EIO;
}

static inline int sm70__cublas_check(struct sm70_backend *be, cublasStatus_t s,
				     const char *call, const char *file, int line)
{
	if (s == CUBLAS_STATUS_SUCCESS)
		return 0;
	sm70__cuda_fail(be, call, file, line, cublasGetStatusString(s));
	return -EIO;
}

/* Both evaluate to 0 or -EIO. `be` is the struct sm70_backend the call works for. */
#define SM70_CUDA_CHECK(be, call) sm70__cuda_check((be), (call), #call, __FILE__, __LINE__)
#define SM70_CUBLAS_CHECK(be, call) sm70__cublas_check((be), (call), #call, __FILE__, __LINE__)
/* After a <<<...>>> launch: reports a bad configuration under the kernel's name (and, on
 * a profiled backend, marks the launch: kernel_times.cu). */
#define SM70_CUDA_LAUNCHED(be, kernel) \
	sm70__cuda_launched((be), cudaGetLastError(), "launch " kernel, kernel, __FILE__, __LINE__)

static inline int sm70__cuda_launched(struct sm70_backend *be, cudaError_t e, const char *call,
				      const char *kernel, const char *file, int line)
{
	struct sm70__cuda *c = be ? (struct sm70__cuda *)be->priv : NULL;

	if (e != cudaSuccess)
		return sm70__cuda_check(be, e, call, file, line);
	if (c && c->kt)
		sm70__kt_mark(c, kernel);
	return 0;
}

/* f32 -> e4m3 with RNE and saturation; mirrors sm70_f32_to_e4m3. */
static __device__ __forceinline__ uint8_t sm70__f32_to_e4m3(float f)
{
	uint32_t u = __float_as_uint(f);
	uint8_t sign = (uint8_t)((u >> 24) & 0x80);
	uint32_t a = u & 0x7fffffffu;

	if (a > 0x7f800000u)
		return 0x7f;
	if (__uint_as_float(a) >= 448.0f)
		return sign | 0x7e;
	if (a < 0x3c800000u) {
		/* below 2^-6: steps of 2^-9; a * 2^9 is exact, rintf rounds half to even */
		return sign | (uint8_t)rintf(__uint_as_float(a) * 512.0f);
	}
	{
		/* normal: keep 3 mantissa bits, RNE on the 20 dropped; a carry moves into
		 * the exponent, which the code arithmetic below absorbs */
		int e = (int)(a >> 23) - 127;
		uint32_t m = a & 0x7fffffu;
		uint32_t q = 8u + (m >> 20);
		uint32_t rest = m & 0xfffffu;
		uint32_t code;

		if (rest > 0x80000u || (rest == 0x80000u && (q & 1u)))
			q++;
		code = (uint32_t)((e + 7) << 3) + (q - 8u);
		if (code > 0x7e)
			code = 0x7e;
		return sign | (uint8_t)code;
	}
}

/* Defined in matmul.cu (the kernel's home), used by silu_matmul.cu: y [n, rows] f16 =
 * silu(g) * u of gate_up [n, 2 * cols] times W^T; 1 <= n <= 16, cols % 8 == 0, gate_up and
 * w 16-byte aligned. Queues on c's stream. */
void sm70__cuda_gemv_tc_silu(struct sm70__cuda *c, __half *y, const __half *gate_up,
			     const __half *w, int rows, int cols, int n);

/* Defined in moe_experts_nvfp4.cu, called by moe_experts.cu's launcher for NVFP4 stacks
 * (gu and dn both from prepare_experts, hidden and inter multiples of 16): queues the
 * gate_up (passes & 1: mid) and down (passes & 2: part) passes on c's stream, the grouped
 * kernels in tile variant `variant` (out of range: 0) with ks[0] and ks[1] warps a tile
 * (SM70_MOE_KS's values: 0 the shape's or the rule's, -1 the rule's) or, with ref set, the
 * reference ones; the caller queues the combine. Returns 0 or -EIO (reported, sticky). */
int sm70__cuda_moe_nvfp4_passes(struct sm70__cuda *c, const __half *x,
				const struct sm70_experts *gu, const struct sm70_experts *dn,
				const struct sm70_moe_route *route, int n, int k, __half *mid,
				float *part, int ref, int variant, const int ks[2], int passes);

/*
 * Split-KV attention partials (attention.cu writes them, and sparse_attention.cu): per
 * (token * n_heads + head, split), SM70__ATTN_PR(D) floats: D unnormalised sums (v scale
 * applied), then m (natural-log units) and l; rows 16-byte aligned for the merge's vector
 * loads. An empty split has m = -inf and l = 0. sm70__cuda_attn_merge (attention.cu)
 * queues the merge of nsplit such partials per row into out [rows][D] (f16); D % 4 == 0.
 * Returns 0 or -EIO.
 */
#define SM70__ATTN_PR(D) ((D) + 4)
int sm70__cuda_attn_merge(struct sm70__cuda *c, __half *out, const float *part, int rows,
			  int nsplit, int D);

/* 8 e4m3 bytes to 8 f16 holding 2^-8 times their values (the magnitude shifted left by 7
 * is an f16 of 2^-8 the e4m3 value, subnormals included; the caller folds 2^8 into its
 * scale). The NaN code 0x7f decodes as 480. */
static __device__ __forceinline__ uint4 sm70__e4m3x8_to_f16_scaled(uint2 in)
{
	uint32_t src[2] = { in.x, in.y };
	uint32_t dst[4];

#pragma unroll
	for (int i = 0; i < 4; i++) {
		uint32_t w = src[i >> 1] >> ((i & 1) * 16);
		uint32_t lo = ((w & 0x7fu) << 7) | ((w & 0x80u) << 8);
		uint32_t hi = (((w >> 8) & 0x7fu) << 7) | (((w >> 8) & 0x80u) << 8);

		dst[i] = lo | (hi << 16);
	}
	return make_uint4(dst[0], dst[1], dst[2], dst[3]);
}

/* Sum and max over the 32 lanes of a warp; every lane gets the result. */
static __device__ __forceinline__ float sm70__warp_sum(float v)
{
	for (int o = 16; o > 0; o >>= 1)
		v += __shfl_xor_sync(0xffffffffu, v, o);
	return v;
}

static __device__ __forceinline__ float sm70__warp_max(float v)
{
	for (int o = 16; o > 0; o >>= 1)
		v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
	return v;
}

/*
 * RoPE's cos/sin table for one position, made by the whole block in shared memory
 * (tab: cos [half], then sin [half]) the way the CPU twin (and transformers) does, in f32:
 * inv_freq = 1 / theta^(2j / rot_dim) with an f32 exponent, angle = pos * inv_freq rounded
 * to f32, then cosf/sinf. theta^e is taken in double and rounded, which gives the correctly
 * rounded powf the CPU's libm returns. The caller synchronises the block afterwards.
 */
static __device__ __forceinline__ void sm70__rope_table(float *tab, int rot_dim, float fpos,
							float theta)
{
	const int half = rot_dim / 2;

	for (int j = threadIdx.x; j < half; j += blockDim.x) {
		float e = (float)(2 * j) / (float)rot_dim;
		float inv_freq = 1.0f / (float)pow((double)theta, (double)e);
		float angle = fpos * inv_freq;

		tab[j] = cosf(angle);
		tab[half + j] = sinf(angle);
	}
}

/* 1 / RMS of one head's head_dim f16 values (plus eps), by the 32 lanes of a warp; every
 * lane gets it. The shuffles also order every lane's reads before any lane's writes. */
static __device__ __forceinline__ float sm70__head_rms_inv(const __half *x, int head_dim,
							   float eps)
{
	float ss = 0.0f;

	for (int k = (int)(threadIdx.x & 31); k < head_dim; k += 32) {
		float v = __half2float(x[k]);

		ss += v * v;
	}
	ss = sm70__warp_sum(ss);
	return 1.0f / sqrtf(ss / (float)head_dim + eps);
}

#endif
