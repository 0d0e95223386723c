/*
 * pdl.h - programmatic dependent launch: a kernel that may start before the kernel ahead
 * of it on the stream has finished, so its launch, its blocks' start and the first loads
 * of bytes nothing upstream writes (weights, a layer's own recurrent state) overlap the
 * previous op's drain. A decode step is a few hundred short, dependent kernels; each used
 * to pay its launch and load latency in series (docs/PERFORMANCE.md, "Overlapped
 * launches").
 *
 * The contract of a kernel launched with sm70__launch_pdl or sm70__launch_pdl_prefetch:
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
 * serves the SM70 feature set. The kinds of kernel (below) ask for the overlap
 * separately: by default only the prefetching ones that were measured; SM70_PDL=experts
 * adds the MoE down pass, =all every kind, =plain takes the plain ones alone, and
 * SM70_PDL=0 turns the overlap off on any device, every launch then fully ordered (the
 * path back).
 *
 * Non-goals: overlap across graph launches (each replay starts after the previous one);
 * programmatic events between streams.
 */
#ifndef SM70_KERNELS_CUDA_PDL_H
#define SM70_KERNELS_CUDA_PDL_H

#include "kernels/cuda/cuda_check.h"

/* c->pdl bits: which launches ask for the overlap (SM70_PDL, cuda_backend.cu) */
#define SM70__PDL_PLAIN 1u    /* kernels that only wait on entry (sm70__pdl_enter) */
#define SM70__PDL_PREFETCH 2u /* kernels that load weights or state before the wait */
#define SM70__PDL_EXPERTS 4u  /* the MoE down pass, which prefetches too: not measured yet */

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

template <typename... P, typename... A>
static inline void sm70__launch_overlap(const struct sm70__cuda *c, unsigned kind,
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

/* kernel<<<grid, block, smem, c->stream>>>(args...) for a kernel that obeys the contract
 * and waits on entry, asking for the overlap when c->pdl allows plain kernels. The caller
 * reports the result as for <<<...>>> (SM70_CUDA_LAUNCHED). */
template <typename... P, typename... A>
static inline void sm70__launch_pdl(const struct sm70__cuda *c, void (*kernel)(P...), dim3 grid,
				    dim3 block, size_t smem, A &&...args)
{
	sm70__launch_overlap(c, SM70__PDL_PLAIN, kernel, grid, block, smem,
			     static_cast<A &&>(args)...);
}

/* The same for a kernel that loads before its wait. */
template <typename... P, typename... A>
static inline void sm70__launch_pdl_prefetch(const struct sm70__cuda *c, void (*kernel)(P...),
					     dim3 grid, dim3 block, size_t smem, A &&...args)
{
	sm70__launch_overlap(c, SM70__PDL_PREFETCH, kernel, grid, block, smem,
			     static_cast<A &&>(args)...);
}

#endif
