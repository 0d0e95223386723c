/*
 * comm_nccl.cu - the communicator of CUDA ranks (comm.h): NCCL, plus a one-shot
 * peer-to-peer all-reduce for the small messages of a decode step.
 *
 * One host thread drives every rank, so NCCL's communicators come from ncclCommInitAll
 * and every collective is one ncclGroupStart/End around the ranks' calls. Everything is
 * queued on the ranks' backend streams, so a collective may be captured into the ranks'
 * graphs like any op.
 *
 * The P2P path (name "nccl+p2p"; SM70_ALLREDUCE=nccl turns it off, =p2p insists on it):
 * every pair of GPUs has peer access, so rank r's kernel writes its input straight into a
 * staging area in each peer's memory, raises a flag there, waits for the peers' flags in
 * its own memory and sums the ranks' values in rank order into its buffer (in fp32, from
 * 0.0f, as comm_cpu.c does), so every rank gets the same bits. One launch per rank and one
 * crossing of the links per value; NCCL's ring needs several steps, which costs more than
 * the transfer itself below a few hundred KiB. Messages above SM70_ALLREDUCE_P2P_MAX bytes
 * (default 1 MiB) take NCCL.
 *
 * The protocol, per rank j's memory (one allocation): stage[2][n][P2P_MAX] bytes, written
 * by the peers (stage[s][src] is what rank src sent for a call of slot parity s);
 * flags[n][G] (flags[src][b]: the last call for which block b of rank src delivered its
 * chunk here); epoch[G] (how many calls block b of rank j has finished). Every call
 * launches the same G blocks on every rank and block b moves the same chunk (elements
 * [units*b/G, units*(b+1)/G)) everywhere, so it only has to meet block b of the peers:
 *   e = epoch[b] + 1; s = e & 1
 *   push my chunk into stage[s][me] of every peer; bar.sync; fence.sys; flag[me][b] = e there
 *   wait until my flags[src][b] >= e for every peer src (acquire)
 *   out = 0 + x_0 + x_1 + ... (my own x from my buffer, the others from my stage[s])
 *   epoch[b] = e
 * The epoch lives on the device, so a graph replay advances it like an eager call, and
 * eager calls and replays may mix as long as every rank runs the same sequence (the
 * contract of any collective).
 * Why two slots are enough: a peer writes into my stage[s] for call e only after it passed
 * the barrier of call e-1, i.e. after it saw my flag of call e-1 for that block; I raise
 * that flag from inside my kernel of call e-1, which starts only after my whole kernel of
 * call e-2 (the last one to read stage[s]) has finished: stream order. So a peer is at most
 * one call ahead of me, in the other slot, and flags only grow, which is why waiting is
 * ">= e" and not "== e".
 * A rank whose peer never arrives (a launch failed on another rank, or the caller queued
 * the collective on some ranks only) would spin for ever; after P2P_TIMEOUT_NS it traps,
 * which faults that context: the caller sees an error instead of a hang.
 *
 * Non-goals: several processes (no IPC handles), NVLS/multimem, reductions other than sum.
 * Destroying the communicator while graphs that contain its collectives still exist is
 * the caller's bug (they point at the freed staging).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nccl.h>

#include "kernels/cuda/cuda_check.h"

extern "C" {
#include "kernels/comm.h"
}

#define P2P_THREADS 512
#define P2P_MAX_BLOCKS 32                 /* G: at most this, at most the SM count */
#define P2P_DEFAULT_MAX (1u << 20)        /* bytes; the default threshold and slot size */
#define P2P_LIMIT_MAX ((size_t)256 << 20) /* the largest SM70_ALLREDUCE_P2P_MAX accepted */
#define P2P_TIMEOUT_NS 30000000000ull     /* 30 s waiting for a peer: trap */

/* What rank r's kernel needs; stage[] and flags[] are rank j's areas as rank r sees them
 * (peer pointers through unified addressing). */
struct p2p_args {
	char *stage[SM70_MAX_TP];
	uint32_t *flags[SM70_MAX_TP];
	char *my_stage;     /* stage[rank], flags[rank]: what this rank reads */
	uint32_t *my_flags;
	uint32_t *epoch;
	void *buf;
	size_t units;      /* of 16 bytes (vector kernel) or of one element */
	size_t slot_bytes; /* one sender's slot: the threshold */
	int rank;
	int n;
};

struct nccl_comm {
	struct sm70_comm c;
	ncclComm_t nc[SM70_MAX_TP];
	int p2p;            /* the fast path is set up */
	size_t p2p_max;     /* messages of at most this many bytes take it */
	int blocks;         /* G */
	void *mem[SM70_MAX_TP];
	struct p2p_args args[SM70_MAX_TP];
};

/* ---- device side ----------------------------------------------------------------- */

static __device__ __forceinline__ void st_release_sys(uint32_t *p, uint32_t v)
{
	asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

static __device__ __forceinline__ uint32_t ld_acquire_sys(const uint32_t *p)
{
	uint32_t v;

	asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
	return v;
}

static __device__ __forceinline__ uint64_t global_ns(void)
{
	uint64_t t;

	asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
	return t;
}

/* E elements of T moved as one unit: 16 bytes on the vector kernel, one element else. */
template <typename T, int E> struct pack {
	T v[E];
};

template <typename T, int E> static __device__ __forceinline__ pack<T, E> ld_plain(const void *p)
{
	pack<T, E> r;

	if constexpr (sizeof(r) == 16) {
		uint4 x = *(const uint4 *)p;

		memcpy(&r, &x, 16);
	} else {
		r.v[0] = *(const T *)p;
	}
	return r;
}

/* Staged data arrives from other GPUs: read it at L2, never from a stale L1 line. */
template <typename T, int E> static __device__ __forceinline__ pack<T, E> ld_cg(const void *p)
{
	pack<T, E> r;

	if constexpr (sizeof(r) == 16) {
		uint4 x = __ldcg((const uint4 *)p);

		memcpy(&r, &x, 16);
	} else {
		r.v[0] = __ldcg((const T *)p);
	}
	return r;
}

template <typename T, int E> static __device__ __forceinline__ void st_plain(void *p,
									    const pack<T, E> &v)
{
	if constexpr (sizeof(v) == 16) {
		uint4 x;

		memcpy(&x, &v, 16);
		*(uint4 *)p = x;
	} else {
		*(T *)p = v.v[0];
	}
}

static __device__ __forceinline__ float to_f(float x)
{
	return x;
}

static __device__ __forceinline__ float to_f(__half x)
{
	return __half2float(x);
}

template <typename T> static __device__ __forceinline__ T from_f(float x);

template <> __device__ __forceinline__ float from_f<float>(float x)
{
	return x;
}

template <> __device__ __forceinline__ __half from_f<__half>(float x)
{
	return __float2half_rn(x);
}

/* One rank's share of a one-shot all-reduce; see the protocol at the top. */
template <typename T, int E>
static __global__ void __launch_bounds__(P2P_THREADS) p2p_allreduce_kernel(struct p2p_args a)
{
	const int b = blockIdx.x, tid = threadIdx.x, G = gridDim.x;
	const size_t lo = a.units * b / G, hi = a.units * (b + 1) / G;
	const size_t ub = sizeof(pack<T, E>);
	char *own = (char *)a.buf;
	__shared__ uint32_t s_epoch;
	uint32_t e;
	int slot;

	if (tid == 0)
		s_epoch = a.epoch[b] + 1;
	__syncthreads();
	e = s_epoch;
	slot = (int)(e & 1u);

	/* push: my chunk into stage[slot][me] of every peer */
	for (size_t i = lo + tid; i < hi; i += P2P_THREADS) {
		pack<T, E> v = ld_plain<T, E>(own + i * ub);

#pragma unroll
		for (int j = 0; j < SM70_MAX_TP; j++) {
			if (j >= a.n || j == a.rank)
				continue;
			st_plain<T, E>(a.stage[j] + ((size_t)slot * a.n + a.rank) * a.slot_bytes +
					       i * ub, v);
		}
	}
	/* The barrier orders every thread's stores before the release of the flag writers;
	 * the system fence makes the remote stores visible before the flag, whatever path
	 * (NVLink or PCIe) they took. */
	__syncthreads();
	if (tid < a.n && tid != a.rank) {
		uint32_t *peer_flags = NULL;

		/* constant indices keep the arguments in the parameter bank, not local memory */
#pragma unroll
		for (int j = 0; j < SM70_MAX_TP; j++)
			if (j == tid)
				peer_flags = a.flags[j];
		__threadfence_system();
		st_release_sys(peer_flags + (size_t)a.rank * G + b, e);
	}

	/* wait: one thread per peer; flags only grow (a peer may already be one call on) */
	if (tid < a.n && tid != a.rank) {
		const uint32_t *f = a.my_flags + (size_t)tid * G + b;
		uint64_t t0 = 0;
		unsigned spins = 0;

		while ((int32_t)(ld_acquire_sys(f) - e) < 0) {
			if ((++spins & 4095u) != 0)
				continue;
			if (!t0) {
				t0 = global_ns();
			} else if (global_ns() - t0 > P2P_TIMEOUT_NS) {
				printf("sm70 p2p all-reduce: rank %d block %d waited 30 s for rank "
				       "%d (call %u): a rank did not join the collective\n",
				       a.rank, b, tid, e);
				__trap();
			}
		}
	}
	__syncthreads();

	/* reduce in rank order, in fp32 from 0.0f: the same bits on every rank */
	{
		const char *mine = a.my_stage + (size_t)slot * a.n * a.slot_bytes;

		for (size_t i = lo + tid; i < hi; i += P2P_THREADS) {
			float acc[E];
			pack<T, E> o;

#pragma unroll
			for (int k = 0; k < E; k++)
				acc[k] = 0.0f;
#pragma unroll
			for (int j = 0; j < SM70_MAX_TP; j++) {
				pack<T, E> v;

				if (j >= a.n)
					break;
				if (j == a.rank)
					v = ld_plain<T, E>(own + i * ub);
				else
					v = ld_cg<T, E>(mine + (size_t)j * a.slot_bytes + i * ub);
#pragma unroll
				for (int k = 0; k < E; k++)
					acc[k] += to_f(v.v[k]);
			}
			for (int k = 0; k < E; k++)
				o.v[k] = from_f<T>(acc[k]);
			st_plain<T, E>(own + i * ub, o);
		}
	}
	/* Only this thread touches epoch[b]; the next call reads it after this kernel ends. */
	if (tid == 0)
		a.epoch[b] = e;
}

/* ---- host side ------------------------------------------------------------------- */

static struct sm70__cuda *rank_cuda(const struct nccl_comm *p, int r)
{
	return (struct sm70__cuda *)p->c.be[r]->priv;
}

/* Logs a failed NCCL call and makes it the sticky error of be. Returns -EIO. */
static int nccl_fail(struct sm70_backend *be, ncclResult_t res, const char *call,
		     const char *file, int line)
{
	char msg[256];
	const char *last = ncclGetLastError(NULL);

	snprintf(msg, sizeof(msg), "%s%s%s", ncclGetErrorString(res),
		 last && *last ? ": " : "", last ? last : "");
	sm70__cuda_fail(be, call, file, line, msg);
	return -EIO;
}

#define NCCL_CALL_FAILED(be, res, call) nccl_fail((be), (res), (call), __FILE__, __LINE__)

static int p2p_all_reduce(struct nccl_comm *p, void *const bufs[], size_t count,
			  enum sm70_dtype dt)
{
	const size_t esz = dt == SM70_DTYPE_F32 ? 4 : 2, bytes = count * esz;
	int vec = bytes % 16 == 0;
	int ret = 0;

	/* Every rank must move the same units, so the vector kernel only when all can. */
	for (int r = 0; r < p->c.n_ranks; r++)
		if ((uintptr_t)bufs[r] % 16)
			vec = 0;
	for (int r = 0; r < p->c.n_ranks; r++) {
		struct sm70_backend *be = p->c.be[r];
		cudaStream_t s = sm70__cuda_enter(be)->stream;
		struct p2p_args a = p->args[r];
		const int G = p->blocks;

		a.buf = bufs[r];
		a.units = vec ? bytes / 16 : count;
		if (dt == SM70_DTYPE_F32 && vec)
			p2p_allreduce_kernel<float, 4><<<G, P2P_THREADS, 0, s>>>(a);
		else if (dt == SM70_DTYPE_F32)
			p2p_allreduce_kernel<float, 1><<<G, P2P_THREADS, 0, s>>>(a);
		else if (vec)
			p2p_allreduce_kernel<__half, 8><<<G, P2P_THREADS, 0, s>>>(a);
		else
			p2p_allreduce_kernel<__half, 1><<<G, P2P_THREADS, 0, s>>>(a);
		/* A rank that failed to launch leaves the others waiting until they trap. */
		if (SM70_CUDA_LAUNCHED(be, "p2p_allreduce_kernel"))
			ret = -EIO;
	}
	return ret;
}

static int nccl_all_reduce(struct sm70_comm *cm, void *const bufs[], size_t count,
			   enum sm70_dtype dt)
{
	struct nccl_comm *p = (struct nccl_comm *)cm->priv;
	const int n = cm->n_ranks;
	ncclDataType_t ndt;
	ncclResult_t res;
	int ret = 0;

	if (dt == SM70_DTYPE_F32)
		ndt = ncclFloat32;
	else if (dt == SM70_DTYPE_F16)
		ndt = ncclFloat16;
	else
		return -EINVAL;
	/* Queue nothing unless every rank can take it: a collective queued on some ranks
	 * only would leave the others waiting. */
	for (int r = 0; r < n; r++)
		if (rank_cuda(p, r)->sticky)
			return rank_cuda(p, r)->sticky;
	if (count == 0 || n == 1)
		return 0;
	if (p->p2p && count * (dt == SM70_DTYPE_F32 ? 4 : 2) <= p->p2p_max)
		return p2p_all_reduce(p, bufs, count, dt);

	res = ncclGroupStart();
	if (res != ncclSuccess)
		return NCCL_CALL_FAILED(cm->be[0], res, "ncclGroupStart");
	for (int r = 0; r < n; r++) {
		struct sm70__cuda *c = sm70__cuda_enter(cm->be[r]);

		res = ncclAllReduce(bufs[r], bufs[r], count, ndt, ncclSum, p->nc[r], c->stream);
		if (res != ncclSuccess)
			ret = NCCL_CALL_FAILED(cm->be[r], res, "ncclAllReduce");
	}
	res = ncclGroupEnd();
	if (res != ncclSuccess) {
		/* what was queued, if anything, is unknown on every rank */
		for (int r = 0; r < n; r++)
			ret = NCCL_CALL_FAILED(cm->be[r], res, "ncclGroupEnd");
	}
	return ret;
}

/* Waits for every rank's stream, frees the P2P areas, destroys NCCL's communicators. */
static void nccl_comm_destroy(struct sm70_comm *cm)
{
	struct nccl_comm *p;

	if (!cm)
		return;
	p = (struct nccl_comm *)cm->priv;
	for (int r = cm->n_ranks - 1; r >= 0; r--) {
		struct sm70__cuda *c = sm70__cuda_enter(cm->be[r]);

		SM70_CUDA_CHECK(cm->be[r], cudaStreamSynchronize(c->stream));
		if (p->mem[r])
			SM70_CUDA_CHECK(cm->be[r], cudaFree(p->mem[r]));
	}
	/* Peer access stays enabled: it belongs to the contexts, and NCCL may use it too. */
	for (int r = cm->n_ranks - 1; r >= 0; r--) {
		if (p->nc[r]) {
			ncclResult_t res = ncclCommDestroy(p->nc[r]);

			if (res != ncclSuccess)
				NCCL_CALL_FAILED(cm->be[r], res, "ncclCommDestroy");
		}
	}
	free(p);
}

static const struct sm70_comm_ops nccl_comm_ops = {
	.all_reduce = nccl_all_reduce,
	.destroy = nccl_comm_destroy,
};

/*
 * Sets up the P2P path: peer access between every pair, each rank's staging/flags/epochs
 * zeroed. Returns 0 (p->p2p set), or -ENODEV / -ENOMEM / -EIO with why in `why` (the
 * caller decides whether that is fatal). Leaves CUDA's last error clear.
 */
static int p2p_setup(struct nccl_comm *p, char *why, size_t why_len)
{
	const int n = p->c.n_ranks;
	size_t stage_bytes, flag_bytes, total;
	int blocks = P2P_MAX_BLOCKS;
	cudaError_t e;

	for (int i = 0; i < n; i++) {
		if (rank_cuda(p, i)->n_sm < blocks)
			blocks = rank_cuda(p, i)->n_sm;
		for (int j = 0; j < n; j++) {
			int ok = 0;

			if (i == j)
				continue;
			e = cudaDeviceCanAccessPeer(&ok, rank_cuda(p, i)->device,
						    rank_cuda(p, j)->device);
			if (e != cudaSuccess || !ok) {
				cudaGetLastError();
				snprintf(why, why_len, "GPU %d cannot access GPU %d directly%s%s",
					 rank_cuda(p, i)->device, rank_cuda(p, j)->device,
					 e != cudaSuccess ? ": " : "",
					 e != cudaSuccess ? cudaGetErrorString(e) : "");
				return -ENODEV;
			}
		}
	}
	for (int i = 0; i < n; i++) {
		sm70__cuda_enter(p->c.be[i]);
		for (int j = 0; j < n; j++) {
			if (i == j)
				continue;
			e = cudaDeviceEnablePeerAccess(rank_cuda(p, j)->device, 0);
			/* "already enabled" (by NCCL, or an earlier communicator) is fine, but it
			 * is left as the last error: clear it so no later launch check sees it */
			if (e == cudaErrorPeerAccessAlreadyEnabled) {
				cudaGetLastError();
			} else if (e != cudaSuccess) {
				cudaGetLastError();
				snprintf(why, why_len,
					 "cudaDeviceEnablePeerAccess(GPU %d -> GPU %d): %s",
					 rank_cuda(p, i)->device, rank_cuda(p, j)->device,
					 cudaGetErrorString(e));
				return -ENODEV;
			}
		}
	}
	p->blocks = blocks;
	stage_bytes = 2 * (size_t)n * p->p2p_max;
	flag_bytes = ((size_t)n * blocks + blocks) * sizeof(uint32_t);
	total = stage_bytes + flag_bytes;
	for (int r = 0; r < n; r++) {
		sm70__cuda_enter(p->c.be[r]);
		e = cudaMalloc(&p->mem[r], total);
		if (e != cudaSuccess) {
			p->mem[r] = NULL;
			cudaGetLastError();
			snprintf(why, why_len,
				 "cannot allocate %zu bytes of P2P staging on GPU %d: %s", total,
				 rank_cuda(p, r)->device, cudaGetErrorString(e));
			return -ENOMEM;
		}
		/* the flags and epochs must start at 0 before any stream can use them */
		e = cudaMemset(p->mem[r], 0, total);
		if (e == cudaSuccess)
			e = cudaDeviceSynchronize();
		if (e != cudaSuccess) {
			cudaGetLastError();
			snprintf(why, why_len, "cannot clear the P2P staging on GPU %d: %s",
				 rank_cuda(p, r)->device, cudaGetErrorString(e));
			return -EIO;
		}
	}
	for (int r = 0; r < n; r++) {
		struct p2p_args *a = &p->args[r];

		memset(a, 0, sizeof(*a));
		for (int j = 0; j < n; j++) {
			a->stage[j] = (char *)p->mem[j];
			a->flags[j] = (uint32_t *)((char *)p->mem[j] + stage_bytes);
		}
		a->my_stage = a->stage[r];
		a->my_flags = a->flags[r];
		a->epoch = a->flags[r] + (size_t)n * blocks;
		a->slot_bytes = p->p2p_max;
		a->rank = r;
		a->n = n;
	}
	p->p2p = 1;
	return 0;
}

/* SM70_ALLREDUCE: 0 auto (P2P when possible), 1 NCCL only, 2 P2P required; -1 unknown. */
static int env_mode(void)
{
	const char *v = getenv("SM70_ALLREDUCE");

	if (!v || !*v || !strcmp(v, "auto"))
		return 0;
	if (!strcmp(v, "nccl"))
		return 1;
	if (!strcmp(v, "p2p"))
		return 2;
	return -1;
}

extern "C" int sm70_comm_nccl_create(struct sm70_comm **out, struct sm70_backend *const be[],
				     int n, struct sm70_err *err)
{
	struct nccl_comm *p = NULL;
	int devs[SM70_MAX_TP];
	const char *max_env = getenv("SM70_ALLREDUCE_P2P_MAX");
	int mode = env_mode(), ret = 0;
	ncclResult_t res;

	*out = NULL;
	if (n < 1 || n > SM70_MAX_TP)
		return sm70_errf(err, -EINVAL, "tensor parallelism of %d ranks: expected 1..%d",
				 n, SM70_MAX_TP);
	if (mode < 0)
		return sm70_errf(err, -EINVAL, "SM70_ALLREDUCE=%s: expected auto, nccl or p2p",
				 getenv("SM70_ALLREDUCE"));
	for (int r = 0; r < n; r++) {
		if (!be[r] || !be[r]->name || strcmp(be[r]->name, "cuda") != 0)
			return sm70_errf(err, -EINVAL,
					 "NCCL communicator: rank %d is not a CUDA backend (%s)", r,
					 be[r] && be[r]->name ? be[r]->name : "none");
		devs[r] = ((struct sm70__cuda *)be[r]->priv)->device;
		for (int q = 0; q < r; q++)
			if (devs[q] == devs[r])
				return sm70_errf(err, -EINVAL,
						 "NCCL communicator: ranks %d and %d are both on "
						 "GPU %d (one rank per GPU)", q, r, devs[r]);
	}
	p = (struct nccl_comm *)calloc(1, sizeof(*p));
	if (!p)
		return sm70_errf(err, -ENOMEM, "NCCL communicator: out of memory");
	p->c.ops = &nccl_comm_ops;
	p->c.name = "nccl";
	p->c.n_ranks = n;
	p->c.priv = p;
	for (int r = 0; r < n; r++)
		p->c.be[r] = be[r];
	p->p2p_max = P2P_DEFAULT_MAX;
	if (max_env && *max_env) {
		char *end;
		unsigned long long v = strtoull(max_env, &end, 10);

		if (*end || v < 16 || v > P2P_LIMIT_MAX) {
			ret = sm70_errf(err, -EINVAL,
					"SM70_ALLREDUCE_P2P_MAX=%s: expected bytes in 16..%zu",
					max_env, P2P_LIMIT_MAX);
			goto fail;
		}
		p->p2p_max = (size_t)v & ~(size_t)15; /* slots stay 16-byte aligned */
	}

	res = ncclCommInitAll(p->nc, n, devs);
	if (res != ncclSuccess) {
		const char *last = ncclGetLastError(NULL);
		char list[64] = "";

		for (int r = 0; r < n; r++)
			snprintf(list + strlen(list), sizeof(list) - strlen(list), "%s%d",
				 r ? "," : "", devs[r]);
		memset(p->nc, 0, sizeof(p->nc));
		ret = sm70_errf(err, -EIO, "ncclCommInitAll over GPUs %s: %s%s%s", list,
				ncclGetErrorString(res), last && *last ? ": " : "",
				last ? last : "");
		goto fail;
	}
	if (mode != 1 && n > 1) {
		char why[256] = "";
		int r = p2p_setup(p, why, sizeof(why));

		if (r && mode == 2) {
			ret = sm70_errf(err, r, "SM70_ALLREDUCE=p2p: %s", why);
			goto fail;
		}
		if (r) {
			/* auto: NCCL alone is correct, only slower for small messages */
			for (int q = 0; q < n; q++) {
				if (p->mem[q]) {
					sm70__cuda_enter(be[q]);
					cudaFree(p->mem[q]);
					p->mem[q] = NULL;
				}
			}
			fprintf(stderr, "sm70 comm: P2P all-reduce off (%s); using NCCL alone\n",
				why);
		}
	}
	if (p->p2p)
		p->c.name = "nccl+p2p";
	*out = &p->c;
	return 0;

fail:
	nccl_comm_destroy(&p->c);
	return ret;
}
