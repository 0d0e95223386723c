/*
 * pdl.h - programmatic dependent launch: a kernel that may start before the kernel ahead
 * of it on the stream has finished, so its launch, its blocks' start and the first loads
 * of bytes nothing upstream writes (weights, a layer's own recurrent state) overlap the
 * previous op's drain. A decode step is a few hundred short, dependent kernels; each used
 * to pay its launch and load latency in series (docs/PERFORMANCE.md, "Overlapped
 * launches").
 *
 * The contract of a kernel launched with sm70__launch_pdl:
 * - every thread that touches global memory the kernel ahead of it may write, or writes
 *   anything, calls sm70__pdl_wait() first (a thread that returns untouched need not);
 *   the wait returns when the kernel ahead has finished and its writes are visible;
 * - sm70__pdl_release(), which lets the next kernel launch, comes only after the wait.
 *   So at most one kernel runs ahead of any kernel's pre-wait part, and that part may
 *   read whatever the kernel just ahead does not write: weights, and a recurrent layer's
 *   state in the op that alone owns it.
 * A kernel launched with <<<...>>> keeps the full stream order whatever ran before it, so
 * a kernel that was never audited simply keeps launching that way.
 *
 * The wait and the release are instructions of compute capability 9.0; below it they
 * compile to nothing and the launcher never asks for the overlap, so one source still
 * serves the SM70 feature set. Each kind of kernel (below) asks for the overlap
 * separately; SM70_PDL=0 turns it off on any device, every launch then fully ordered
 * (the path back).
 *
 * Non-goals: overlap across graph launches (each replay starts after the previous one);
 * programmatic events between streams.
 */
#ifndef SM70_KERNELS_CUDA_PDL_H
#define SM70_KERNELS_CUDA_PDL_H

#include "kernels/cuda/cuda_check.h"

/* c->pdl bits, one per kind of kernel (SM70_PDL names them, cuda_backend.cu): which
 * launches ask for the overlap. On by default: PREFETCH and EXPERTS, the kernels that load
 * weights or state before their wait, measured faster. The others, the "plain" kinds, wait on entry
 * and gain only their launch latency; together they measured 4% slower at B16, so each
 * can be turned on alone to find which (docs/PERFORMANCE.md, "Overlapped launches"). */
#define SM70__PDL_PREFETCH (1u << 0) /* GEMVs, the DeltaNet update, the NVFP4 dot kernel */
#define SM70__PDL_EXPERTS (1u << 1)  /* the MoE down pass (prefetches its experts) */
#define SM70__PDL_NORM (1u << 2)     /* add_rmsnorm, gated_rmsnorm, group_rmsnorm */
#define SM70__PDL_ROPE (1u << 3)     /* qk_norm_rope_kv, head_norm_rope, kv_write */
#define SM70__PDL_ATTN (1u << 4)     /* decode attention */
#define SM70__PDL_MERGE (1u << 5)    /* its split merge */
#define SM70__PDL_ACT (1u << 6)      /* silu_mul, sigmoid_mul, sigmoid_scale_add, add */
#define SM70__PDL_CONV (1u << 7)     /* conv1d_silu */
#define SM70__PDL_MOE (1u << 8)      /* moe_route, the gate_up pass, the combine */
#define SM70__PDL_HC (1u << 9)       /* hyper-connection ops, hc_mix */
#define SM70__PDL_NVFP4 (1u << 10)   /* the NVFP4 WMMA GEMV (n >= 2) */
#define SM70__PDL_MISC (1u << 11)    /* gather_rows */
#define SM70__PDL_PLAIN (0xffcu)     /* every kind that waits on entry */

/* Blocks until the kernel ahead has finished and its writes are visible. */
static __device__ __forceinline__ void sm70__pdl_wait(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
	asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/* Lets the next kernel on the stream launch once every block of this one has said so. */
static __device__ __forceinline__ void sm70__pdl_release(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
	asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

/* The common case: nothing to do before the inputs, so wait, then let the next start. */
static __device__ __forceinline__ void sm70__pdl_enter(void)
{
	sm70__pdl_wait();
	sm70__pdl_release();
}

/* kernel<<<grid, block, smem, c->stream>>>(args...) for a kernel of `kind` that obeys the
 * contract above, asking for the overlap when c->pdl has that kind. The caller reports
 * the result as for <<<...>>> (SM70_CUDA_LAUNCHED). */
template <typename... P, typename... A>
static inline void sm70__launch_pdl(const struct sm70__cuda *c, unsigned kind,
				    void (*kernel)(P...), dim3 grid, dim3 block, size_t smem,
				    A &&...args)
{
	cudaLaunchConfig_t cfg{};
	cudaLaunchAttribute at[1]{};

	cfg.gridDim = grid;
	cfg.blockDim = block;
	cfg.dynamicSmemBytes = smem;
	cfg.stream = c->stream;
	at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
	at[0].val.programmaticStreamSerializationAllowed = 1;
	cfg.attrs = at;
	cfg.numAttrs = (c->pdl & kind) ? 1 : 0;
	/* an error stays for cudaGetLastError, as after <<<...>>> */
	(void)cudaLaunchKernelEx(&cfg, kernel, static_cast<A &&>(args)...);
}

#endif
