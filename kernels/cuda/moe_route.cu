/*
 * moe_route.cu - the CUDA moe_route op: a mixture-of-experts router's softmax, top-k and
 * renormalisation, and the grouping of the step's assignments by expert, all on the
 * device, so that nothing is read back and one captured graph serves any routing.
 *
 * Rows: one warp a row. Lane l holds the logits of experts l, l + 32, ... in registers
 * (VPL of them: E <= 32 * VPL); m and s are warp reductions (a fixed shuffle tree, so
 * the same bits every run); p_e = expf(l_e - m) / s as the CPU twin writes it. The k
 * picks are k rounds of a warp arg-max under the CPU's rule (larger p first, equal p by
 * the lower id, kernels/cpu/moe_route.c's route_before): ties of p are ties, as there.
 * The rule is made total (NaN: the lower id) so every lane of the butterfly agrees and
 * the ids stay valid and distinct whatever the logits. Lane j keeps pick j; with renorm
 * the picks are summed in pick order (the CPU's order) and divided by the sum.
 *
 * Grouping: one block of GROUP_WARPS warps. Warp w counts the experts of its contiguous
 * segment of assignments in shared memory; a prefix over warps and then over experts
 * gives each expert's start, used[] (the non-empty experts, ascending), used_first[] and
 * n_used; then each warp walks its segment in assignment order, 32 at a time, placing
 * each assignment at its expert's running cursor (peers found with __match_any_sync, an
 * SM70 instruction). Assignment order within an expert is token order, as backend.h asks,
 * and the result is independent of scheduling. At decode (n <= ROUTE_FUSE_MAX rows) the
 * grouping block routes the rows itself first: one launch a layer. Larger batches route
 * in a grid of row blocks, then group.
 *
 * Non-goals: more than ROUTE_MAX_E experts or ROUTE_MAX_K picks a token (refused at
 * launch), other scoring functions (sigmoid routers, group-limited routing, biases).
 */
#include <stdint.h>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/pdl.h"

#define ROUTE_MAX_E 512    /* 16 logits a lane */
#define ROUTE_MAX_K 32     /* a lane a pick */
#define GROUP_WARPS 16
#define GROUP_THREADS (GROUP_WARPS * 32) /* == ROUTE_MAX_E: a thread an expert */
#define ROUTE_FUSE_MAX 32  /* rows the grouping block routes itself (two a warp) */
#define ROUTE_ROW_WARPS 8  /* rows a block of the row kernel */

/*
 * Whether (pa, ea) is picked before (pb, eb): the CPU's route_before (larger p first,
 * equal p by the lower id) where it decides; where neither p is larger (NaN) the lower
 * id; an empty candidate (id < 0) never first. Over distinct ids exactly one of
 * pick_before(a, b) and pick_before(b, a) holds, so "keep the better of the two" gives
 * both lanes of a shuffle the same answer.
 */
static __device__ __forceinline__ bool pick_before(float pa, int ea, float pb, int eb)
{
	if (ea < 0)
		return false;
	if (eb < 0)
		return true;
	if (pa > pb)
		return true;
	if (pb > pa)
		return false;
	return ea < eb;
}

/* Routes row t of logits with the calling warp: ids/w [k] of the row. */
template <int VPL>
static __device__ void route_row(const float *__restrict__ l, int E, int k, int renorm,
				 int32_t *__restrict__ ids, float *__restrict__ w)
{
	const int lane = threadIdx.x & 31;
	float p[VPL], m = -INFINITY, s = 0.0f, my_w = 0.0f;
	unsigned taken = 0; /* bit i: expert lane + 32 i is picked or past E */
	int my_id = 0;

#pragma unroll
	for (int i = 0; i < VPL; i++) {
		const int e = lane + 32 * i;

		p[i] = e < E ? l[e] : -INFINITY;
		if (e < E)
			m = fmaxf(m, p[i]);
		else
			taken |= 1u << i;
	}
	m = sm70__warp_max(m);
#pragma unroll
	for (int i = 0; i < VPL; i++) {
		p[i] = taken >> i & 1 ? 0.0f : expf(p[i] - m);
		s += p[i];
	}
	s = sm70__warp_sum(s);
#pragma unroll
	for (int i = 0; i < VPL; i++)
		p[i] = p[i] / s;

	for (int j = 0; j < k; j++) {
		float bp = -INFINITY;
		int be = -1;

#pragma unroll
		for (int i = 0; i < VPL; i++)
			if (!(taken >> i & 1) && pick_before(p[i], lane + 32 * i, bp, be)) {
				bp = p[i];
				be = lane + 32 * i;
			}
#pragma unroll
		for (int o = 16; o > 0; o >>= 1) {
			const float op = __shfl_xor_sync(0xffffffffu, bp, o);
			const int oe = __shfl_xor_sync(0xffffffffu, be, o);

			if (pick_before(op, oe, bp, be)) {
				bp = op;
				be = oe;
			}
		}
		/* k <= E, so be >= 0 here */
		if ((be & 31) == lane)
			taken |= 1u << (be >> 5);
		if (lane == j) {
			my_w = bp;
			my_id = be;
		}
	}
	if (renorm) {
		float sum = 0.0f;

		for (int j = 0; j < k; j++)
			sum += __shfl_sync(0xffffffffu, my_w, j);
		my_w = my_w / sum;
	}
	if (lane < k) {
		ids[lane] = my_id;
		w[lane] = my_w;
	}
}

/* One warp a row, ROUTE_ROW_WARPS rows a block (batches past ROUTE_FUSE_MAX rows). */
template <int VPL>
static __global__ void __launch_bounds__(ROUTE_ROW_WARPS * 32)
	route_rows_kernel(const float *__restrict__ logits, int ld, int n, int E, int k,
			  int renorm, int32_t *__restrict__ ids, float *__restrict__ w)
{
	sm70__pdl_enter();
	const int t = blockIdx.x * ROUTE_ROW_WARPS + (threadIdx.x >> 5);

	if (t >= n)
		return;
	route_row<VPL>(logits + (size_t)t * ld, E, k, renorm, ids + (size_t)t * k,
		       w + (size_t)t * k);
}

/* Exclusive prefix sums of a and b over the block's threads (in thread order); *ta and
 * *tb get the totals. Every thread must call it. */
static __device__ void block_scan2(int a, int b, int *ea, int *eb, int *ta, int *tb)
{
	__shared__ int wa[GROUP_WARPS], wb[GROUP_WARPS];
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	int ia = a, ib = b, pa = 0, pb = 0, sa = 0, sb = 0;

#pragma unroll
	for (int o = 1; o < 32; o <<= 1) {
		const int xa = __shfl_up_sync(0xffffffffu, ia, o);
		const int xb = __shfl_up_sync(0xffffffffu, ib, o);

		if (lane >= o) {
			ia += xa;
			ib += xb;
		}
	}
	if (lane == 31) {
		wa[warp] = ia;
		wb[warp] = ib;
	}
	__syncthreads();
	for (int v = 0; v < GROUP_WARPS; v++) {
		if (v == warp) {
			pa = sa;
			pb = sb;
		}
		sa += wa[v];
		sb += wb[v];
	}
	*ea = pa + ia - a;
	*eb = pb + ib - b;
	*ta = sa;
	*tb = sb;
	__syncthreads(); /* wa/wb may be reused */
}

/*
 * The grouping of nk = n * k assignments (ids already written), by one block of
 * GROUP_THREADS threads; with VPL > 0 the block first routes the n rows itself.
 */
template <int VPL>
static __global__ void __launch_bounds__(GROUP_THREADS)
	route_group_kernel(const float *__restrict__ logits, int ld, int n, int E, int k,
			   int renorm, int32_t *__restrict__ ids, float *__restrict__ w,
			   int32_t *__restrict__ order, int32_t *__restrict__ used,
			   int32_t *__restrict__ used_first, int32_t *__restrict__ n_used)
{
	sm70__pdl_enter();
	/* cnt[w][e]: warp w's count of expert e, then where its first one goes */
	__shared__ int cnt[GROUP_WARPS][ROUTE_MAX_E];
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, e = threadIdx.x;
	const int nk = n * k, seg = (nk + GROUP_WARPS - 1) / GROUP_WARPS;
	const int a0 = warp * seg, a1 = a0 + seg < nk ? a0 + seg : nk;
	int tot = 0, start, uidx, sum_tot, sum_used;

	if constexpr (VPL > 0) {
		for (int t = warp; t < n; t += GROUP_WARPS)
			route_row<VPL>(logits + (size_t)t * ld, E, k, renorm, ids + (size_t)t * k,
				       w + (size_t)t * k);
	}
	for (int v = 0; v < GROUP_WARPS; v++)
		cnt[v][e] = 0;
	__syncthreads(); /* also makes this block's ids writes visible to the block */

	for (int a = a0 + lane; a < a1; a += 32)
		atomicAdd(&cnt[warp][ids[a]], 1);
	__syncthreads();

	if (e < E) {
		for (int v = 0; v < GROUP_WARPS; v++) {
			const int c = cnt[v][e];

			cnt[v][e] = tot;
			tot += c;
		}
	}
	block_scan2(tot, tot > 0, &start, &uidx, &sum_tot, &sum_used);
	if (e < E) {
		if (tot > 0) {
			used[uidx] = e;
			used_first[uidx] = start;
		}
		for (int v = 0; v < GROUP_WARPS; v++)
			cnt[v][e] += start;
	}
	if (threadIdx.x == 0) {
		used_first[sum_used] = sum_tot; /* == nk */
		n_used[0] = sum_used;
	}
	__syncthreads();

	for (int base = a0; base < a1; base += 32) {
		const int a = base + lane;
		const bool live = a < a1;
		const unsigned act = __ballot_sync(0xffffffffu, live);
		unsigned peers = 0;
		int ex = 0;

		if (live) {
			ex = ids[a];
			peers = __match_any_sync(act, ex);
			order[cnt[warp][ex] + __popc(peers & ((1u << lane) - 1))] = a;
		}
		__syncwarp();
		/* the highest lane of each group moves the cursor past the group */
		if (live && lane == 31 - __clz(peers))
			cnt[warp][ex] += __popc(peers);
		__syncwarp();
	}
}

/* The empty grouping (what the CPU op writes for arguments it does not take). */
static __global__ void route_empty_kernel(int32_t *used_first, int32_t *n_used)
{
	sm70__pdl_enter();
	used_first[0] = 0;
	n_used[0] = 0;
}

template <int VPL>
static void route_launch(struct sm70__cuda *c, const struct sm70_moe_route *r,
			 const float *logits, int ld, int n, int E, int k, int renorm)
{
	if (n <= ROUTE_FUSE_MAX) {
		sm70__launch_pdl(c, SM70__PDL_MOE, route_group_kernel<VPL>, dim3(1),
				 dim3(GROUP_THREADS), 0, logits, ld, n, E, k, renorm, r->ids, r->w,
				 r->order, r->used, r->used_first, r->n_used);
		return;
	}
	sm70__launch_pdl(c, SM70__PDL_MOE, route_rows_kernel<VPL>,
			 dim3((n + ROUTE_ROW_WARPS - 1) / ROUTE_ROW_WARPS),
			 dim3(ROUTE_ROW_WARPS * 32), 0, logits, ld, n, E, k, renorm, r->ids, r->w);
	sm70__launch_pdl(c, SM70__PDL_MOE, route_group_kernel<0>, dim3(1), dim3(GROUP_THREADS), 0,
			 logits, ld, n, E, k, renorm, r->ids, r->w, r->order, r->used,
			 r->used_first, r->n_used);
}

/* See backend.h. Takes n_experts <= 512 and k <= 32 (other sizes are refused through
 * the sticky error); arguments the CPU op does not take (k < 1, k > n_experts,
 * ld < n_experts, n <= 0) write the empty grouping, as it does. logits must not overlap
 * the route's arrays. */
extern "C" void sm70__cuda_moe_route(struct sm70_backend *be, const struct sm70_moe_route *route,
				     const float *logits, int ld, int n, int n_experts, int k,
				     int renorm)
{
	struct sm70__cuda *c = sm70__cuda_enter(be);
	const int E = n_experts;

	if (n <= 0 || k < 1 || k > E || ld < E) {
		sm70__launch_pdl(c, SM70__PDL_MOE, route_empty_kernel, dim3(1), dim3(1), 0,
				 route->used_first, route->n_used);
		SM70_CUDA_LAUNCHED(be, "route_empty_kernel");
		return;
	}
	if (E > ROUTE_MAX_E || k > ROUTE_MAX_K || (int64_t)n * k > INT32_MAX / 2) {
		sm70__cuda_fail(be, "moe_route", __FILE__, __LINE__,
				"at most 512 experts, 32 picks a token");
		return;
	}
	if (E <= 64)
		route_launch<2>(c, route, logits, ld, n, E, k, renorm);
	else if (E <= 128)
		route_launch<4>(c, route, logits, ld, n, E, k, renorm);
	else if (E <= 256)
		route_launch<8>(c, route, logits, ld, n, E, k, renorm);
	else
		route_launch<16>(c, route, logits, ld, n, E, k, renorm);
	SM70_CUDA_LAUNCHED(be, "route_group_kernel");
}
