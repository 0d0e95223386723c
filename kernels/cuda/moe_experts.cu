/*
 * moe_experts.cu - the CUDA moe_experts op: each token's k routed SwiGLU experts, weighted
 * and summed; f16 x, weights, mid and out, f32 accumulation and f32 part.
 *
 * Grouped path (the default; decode and prefill alike): three launches whose grids are
 * fixed by (n, k, E) alone, so a captured graph serves any routing.
 *  1. gate_up: grid (groups of intermediate tiles, min(n k, E) expert slots). A block
 *     takes used expert u = blockIdx.y (u >= n_used[0], read on the device: the block
 *     exits) and, for each tile of 8 indices i..i+7 it walks, reads that expert's gate rows
 *     i..i+7 and up rows inter+i..inter+i+7 once, as one 16-row tile, for every assignment
 *     of the expert (order[used_first[u]..], up to 16 tokens a pass): the tile times the
 *     gathered x rows on the tensor cores (WMMA 16x16x16, f16 in, f32 accumulate), so a
 *     weight costs the same whether one token or sixteen chose its expert. The gate and
 *     up sums of an index meet in the block, which writes mid[a][i] = f16(silu(g) * u)
 *     (SwiGLU fused: no gate_up buffer, no pass).
 *  2. down: grid (groups of hidden tiles of 16, the same slots): each expert's down rows
 *     once for its assignments' mid rows; part[a][h] = (down_h . mid[a]) * w[a], the
 *     routing weight folded in, f32.
 *     Both grids give a block a few tile groups (at most `most` of them, and never fewer
 *     blocks than fill every SM's resident places when every slot is used), so the
 *     lookups a block makes before its first load are paid once for several tiles. How
 *     many warps share a tile's columns is chosen at launch from the pass's shape
 *     (ex_pick_ks): at B1 the split that fills the SMs' places in one round, with many
 *     tiles a whole row a warp.
 *  3. combine: out[t] = f16(part[t k] + part[t k + 1] + ...), j in order: deterministic,
 *     no atomics, the CPU twin's sum order.
 * The tile kernel is matmul.cu's tensor-core GEMV reshaped: lanes stream 16-byte loads of
 * the band, PF 64-column steps ahead in registers, each warp stages a step in its own
 * shared memory and multiplies there; the block's warps split the columns (KS of them a
 * tile) and RT tiles share a block; the partial tiles are added in a fixed order at the
 * end. An expert chosen by more than 16 of the batch's tokens (prefill) is done in passes
 * of 16, re-reading its rows (from L2, mostly): correct, not tuned.
 *
 * Reference path (SM70_MOE=reference, or shapes the tiles do not take: hidden or inter
 * not a multiple of 8, unaligned buffers): one assignment at a time, straight from ids,
 * a warp an output element (gate_up dot pair, then down dot), then the same combine.
 *
 * Numerics against the CPU twin: the same f32 formulas (silu(g) = g / (1 + expf(-g)),
 * then * u; * w after the down dot; the j-ordered sum), other summation orders inside the
 * dots, and mid rounded to f16 (the act dtype) between the passes.
 *
 * NVFP4 stacks (both, from prepare_experts): moe_experts_nvfp4.cu queues their gate_up and
 * down passes (grouped or reference, by the same switch and tune hooks; its split of warps
 * a tile by the same rule and SM70_MOE_KS), then the combine here.
 *
 * Non-goals: other quantised experts, expert parallelism, a tuned prefill (n > 16) path.
 */
#include <mma.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <stdio.h>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/moe_ks.h"
#include "kernels/cuda/pdl.h"

#define EX_KS 64           /* columns a step: 128 bytes of each weight row */
#define EX_LD (EX_KS + 8)  /* staged row stride in halves (rows 16 bytes apart in banks) */
#define EX_TOK 16          /* tokens a pass: the MMA's N */
#define EX_WARP_BYTES ((size_t)2 * 16 * EX_LD * sizeof(__half)) /* W stage + x stage */
#define REF_WARPS 8        /* warps a block of the reference kernels */

enum { EX_GATE_UP = 0, EX_DOWN = 1 };

/* What both tile passes read and write. */
struct ex_args {
	const __half *x;      /* gate_up: x [n][hidden]; down: mid [n k][inter] */
	const __half *w;      /* gate_up [E][2 inter][hidden] or down [E][hidden][inter] */
	__half *mid;          /* gate_up's output */
	float *part;          /* down's output */
	const float *rw;      /* the route's weights [n k] */
	const int32_t *order, *used, *used_first, *n_used;
	int E, k, nk;
	int rows;             /* gate_up: inter (the stack holds 2 inter rows); down: hidden */
	int cols;             /* the dot length: hidden or inter */
	int ks;               /* warps a tile, splitting its columns (1 .. EX_MAX_KS) */
};

/* Launch bounds: 16 warps an SM (128 registers a thread) while the loads in flight,
 * PF * (4 + NI) 16-byte registers a lane, are at most 12; 8 otherwise (capped at 128
 * those spill). A block has RT * ks warps, ks chosen at launch (ex_pick_ks), so the bound
 * is on the threads an SM holds: one block of all of them gives the same register cap. */
#define EX_WARPS_SM(NI, PF) ((PF) * (4 + (NI)) > 12 ? 8 : 16)
#define EX_MAX_KS SM70__MOE_MAX_KS

/*
 * One pass of the grouped experts (MODE), NI x row groups of 4 loaded (tokens a pass
 * <= 4 NI), RT row tiles a block, a.ks warps a tile splitting the columns, PF steps ahead.
 * Lane l loads 16 bytes (8 columns, chunk l % 8) of tile rows l / 8 + 4 i, so one load
 * instruction of a warp reads four whole 128-byte lines. A block keeps its expert and its
 * tokens and walks tile groups blockIdx.x, + gridDim.x, ...: the lookups (n_used, used,
 * used_first, order) are paid once a block, and the next group's first weight steps are
 * in flight while the block adds up and stores the current one.
 */
template <int MODE, int NI, int RT, int PF>
static __global__ void __launch_bounds__(EX_WARPS_SM(NI, PF) * 32, 1)
	experts_tc_kernel(const struct ex_args a)
{
	/* The routing was written by the route op. For gate_up it is the kernel just ahead,
	 * so the block waits before it reads anything; the down pass runs after gate_up,
	 * when the route has finished (pdl.h: nothing older than the kernel ahead still
	 * runs), so it reads the routing and starts its first weight steps before waiting
	 * for gate_up's mid. */
	if (MODE == EX_GATE_UP)
		sm70__pdl_enter();
	using namespace nvcuda;
	extern __shared__ __align__(128) unsigned char ex_smem[];
	__shared__ int tok[EX_TOK];
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	const int KS = a.ks, ks = warp % KS, rt_w = warp / KS;
	const int sub = lane >> 3, chunk = lane & 7;
	const int per_tile = MODE == EX_GATE_UP ? 8 : 16; /* outputs (rows) a tile */
	const int groups = ((a.rows + per_tile - 1) / per_tile + RT - 1) / RT;
	const int u = blockIdx.y;
	const int nsteps = (a.cols + EX_KS - 1) / EX_KS;
	const int s0 = ks * nsteps / KS, s1 = (ks + 1) * nsteps / KS;
	const size_t stack_rows = MODE == EX_GATE_UP ? 2 * (size_t)a.rows : a.rows;
	__half *ws = (__half *)(ex_smem + warp * EX_WARP_BYTES);
	__half *xs = ws + 16 * EX_LD;
	const __half *wp[4], *xp[NI];
	uint4 wr[PF][4], xr[PF][NI];
	/* one round trip: slot u < n k always indexes used and used_first, stale or not */
	const int nu = a.n_used[0], e = a.used[u], first = a.used_first[u];
	const int count = a.used_first[u + 1] - first;

	if (u >= nu || e < 0 || e >= a.E || first < 0 || count <= 0 || first + count > a.nk)
		return; /* the whole block: nothing below has run */

	/* x rows this kernel never loads stay zero */
	for (int i = lane; i < (16 - 4 * NI) * EX_LD / 8; i += 32)
		((uint4 *)(xs + 4 * NI * EX_LD))[i] = make_uint4(0, 0, 0, 0);

	/* This warp's weight rows in tile group g; a row past the end reads the last one
	 * (valid) and is never stored. */
#define EX_ROWS(g)                                                                       \
	do {                                                                             \
		const int tile_ = (g) * RT + rt_w;                                       \
		_Pragma("unroll") for (int i = 0; i < 4; i++) {                          \
			const int r_ = sub + 4 * i;                                      \
			size_t row_;                                                     \
			if (MODE == EX_GATE_UP) {                                        \
				int idx_ = tile_ * 8 + (r_ & 7);                         \
				idx_ = idx_ < a.rows ? idx_ : a.rows - 1;                \
				row_ = (r_ < 8 ? 0 : (size_t)a.rows) + idx_;             \
			} else {                                                         \
				const int idx_ = tile_ * 16 + r_;                        \
				row_ = idx_ < a.rows ? idx_ : a.rows - 1;                \
			}                                                                \
			wp[i] = a.w + ((size_t)e * stack_rows + row_) * a.cols + chunk * 8; \
		}                                                                        \
	} while (0)
	/* Loads of step s into register slot d: the weights (they need only e, so the first
	 * steps are in flight while the tokens are looked up), then x, whose rows past cn
	 * read as zero. */
#define EX_ISSUE_W(d, s)                                                                 \
	do {                                                                             \
		const bool in_ = (s) * EX_KS + chunk * 8 < a.cols;                       \
		_Pragma("unroll") for (int i = 0; i < 4; i++) wr[d][i] =                \
			in_ ? __ldg((const uint4 *)(wp[i] + (s) * EX_KS)) :              \
			      make_uint4(0, 0, 0, 0);                                    \
	} while (0)
#define EX_ISSUE_X(d, s)                                                                 \
	do {                                                                             \
		const bool in_ = (s) * EX_KS + chunk * 8 < a.cols;                       \
		_Pragma("unroll") for (int i = 0; i < NI; i++) xr[d][i] =               \
			in_ && xp[i] ? __ldg((const uint4 *)(xp[i] + (s) * EX_KS)) :     \
				       make_uint4(0, 0, 0, 0);                           \
	} while (0)

	for (int g0 = 0; g0 < count; g0 += EX_TOK) {
		const int cn = count - g0 < EX_TOK ? count - g0 : EX_TOK;

		EX_ROWS(blockIdx.x);
#pragma unroll
		for (int d = 0; d < PF; d++)
			if (s0 + d < s1)
				EX_ISSUE_W(d, s0 + d);
		__syncthreads(); /* the last pass is done with tok and the partial tiles */
		if (threadIdx.x < EX_TOK) {
			int as = threadIdx.x < cn ? a.order[first + g0 + threadIdx.x] : 0;

			tok[threadIdx.x] = as >= 0 && as < a.nk ? as : 0;
		}
		__syncthreads();
#pragma unroll
		for (int i = 0; i < NI; i++) {
			const int j = sub + 4 * i;
			const size_t xrow = MODE == EX_GATE_UP ? (size_t)(tok[j] / a.k) : tok[j];

			xp[i] = j < cn ? a.x + xrow * a.cols + chunk * 8 : NULL;
		}

		if (MODE == EX_DOWN)
			sm70__pdl_enter(); /* mid comes from gate_up (later passes: a no-op) */
		for (int g = blockIdx.x; g < groups; g += gridDim.x) {
			wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;

			wmma::fill_fragment(acc, 0.0f);
#pragma unroll
			for (int d = 0; d < PF; d++)
				if (s0 + d < s1)
					EX_ISSUE_X(d, s0 + d);
			for (int s = s0; s < s1; s += PF) {
#pragma unroll
				for (int d = 0; d < PF; d++) {
					if (s + d >= s1)
						break;
#pragma unroll
					for (int i = 0; i < 4; i++)
						*(uint4 *)(ws + (sub + 4 * i) * EX_LD + chunk * 8) =
							wr[d][i];
#pragma unroll
					for (int i = 0; i < NI; i++)
						*(uint4 *)(xs + (sub + 4 * i) * EX_LD + chunk * 8) =
							xr[d][i];
					if (s + d + PF < s1) {
						EX_ISSUE_W(d, s + d + PF);
						EX_ISSUE_X(d, s + d + PF);
					}
					__syncwarp();
#pragma unroll
					for (int kk = 0; kk < EX_KS / 16; kk++) {
						wmma::fragment<wmma::matrix_b, 16, 16, 16, __half,
							       wmma::col_major> b;
						wmma::fragment<wmma::matrix_a, 16, 16, 16, __half,
							       wmma::row_major> af;

						wmma::load_matrix_sync(b, xs + kk * 16, EX_LD);
						wmma::load_matrix_sync(af, ws + kk * 16, EX_LD);
						wmma::mma_sync(acc, af, b, acc);
					}
					__syncwarp(); /* the stage is free for the next step */
				}
			}

			/* each warp's partial tile (16 rows x 16 tokens, row-major) into its W
			 * stage; the next group's first weight steps go out before the sums */
			wmma::store_matrix_sync((float *)ws, acc, 16, wmma::mem_row_major);
			if (g + (int)gridDim.x < groups) {
				EX_ROWS(g + gridDim.x);
#pragma unroll
				for (int d = 0; d < PF; d++)
					if (s0 + d < s1)
						EX_ISSUE_W(d, s0 + d);
			}
			__syncthreads();
			for (int idx = threadIdx.x; idx < RT * per_tile * cn;
			     idx += RT * KS * 32) {
				const int rt = idx / (per_tile * cn), rem = idx - rt * per_tile * cn;
				const int j = rem / per_tile, r = rem - j * per_tile;
				const int out = (g * RT + rt) * per_tile + r;
				const float *red =
					(const float *)(ex_smem + rt * KS * EX_WARP_BYTES);
				const size_t stride = EX_WARP_BYTES / sizeof(float);
				float sa = 0.0f, sb = 0.0f;

				if (out >= a.rows)
					continue;
#pragma unroll
				for (int v = 0; v < EX_MAX_KS; v++) {
					if (v == KS)
						break;
					sa += red[v * stride + r * 16 + j];
					if (MODE == EX_GATE_UP)
						sb += red[v * stride + (r + 8) * 16 + j];
				}
				if (MODE == EX_GATE_UP)
					a.mid[(size_t)tok[j] * a.rows + out] =
						__float2half_rn((sa / (1.0f + expf(-sa))) * sb);
				else
					a.part[(size_t)tok[j] * a.rows + out] = sa * a.rw[tok[j]];
			}
			__syncthreads(); /* the stages are free for the next group */
		}
	}
#undef EX_ISSUE_X
#undef EX_ISSUE_W
#undef EX_ROWS
}

/* The tile shapes of one pass: RT tiles a block, KS warps a tile (0: ex_pick_ks), PF steps
 * ahead, and at most `most` tile groups a block (the grid's x then covers the groups in
 * that many rounds or fewer, with never fewer blocks than the SMs hold at once over the
 * slots). */
struct ex_shape {
	int rt, ks, pf, most;
};

/*
 * Variant 0 is the default; the others exist for sm70-bench moe to time (and
 * test_cuda_moe to check): { gate_up, down } shapes. Measured on an H200 (sm70-bench moe,
 * both shapes, B1-B16): 4-warp blocks (0) were the fastest or within 2% of it; 8 warps
 * splitting gate_up's 32 steps (4) took up to 18% longer at B16, one tile group a block
 * (1) up to 30%, four steps ahead (2) 1.7-1.9x (one block an SM).
 */
#define EX_VARIANTS 5
static const struct ex_shape ex_variants[EX_VARIANTS][2] = {
	{ { 1, 0, 2, 4 }, { 1, 0, 2, 4 } },
	{ { 1, 8, 2, 1 }, { 2, 4, 2, 1 } },
	{ { 1, 8, 4, 4 }, { 2, 4, 3, 4 } },
	{ { 2, 4, 2, 4 }, { 4, 2, 2, 4 } },
	{ { 1, 8, 2, 4 }, { 2, 4, 2, 4 } },
};

/* Set by sm70__cuda_moe_tune_ks or SM70_MOE_KS=G,D (read at the first launch, and again
 * after sm70__cuda_moe_tune_ks(-2, -2); told once): each pass's warps a tile instead of its
 * shape's (0: the shape's; -1: the fitting rule of ex_pick_ks), on f16 and NVFP4 stacks
 * alike. */
static int tune_ks[2] = { -2, -2 };

static int ex_forced_ks(int mode)
{
	static int told;

	if (tune_ks[0] == -2) {
		const char *v = getenv("SM70_MOE_KS");
		int g = 0, d = 0;

		tune_ks[0] = tune_ks[1] = 0;
		if (v && strcmp(v, "auto") == 0) {
			tune_ks[0] = tune_ks[1] = -1;
		} else if (v && sscanf(v, "%d,%d", &g, &d) == 2 && g >= 1 && g <= EX_MAX_KS &&
			   d >= 1 && d <= EX_MAX_KS) {
			tune_ks[0] = g;
			tune_ks[1] = d;
		} else if (v && !told) {
			fprintf(stderr, "sm70 cuda: SM70_MOE_KS=%s: not auto or G,D (1..%d), "
					"ignored\n", v, EX_MAX_KS);
		}
		if (tune_ks[0] && !told)
			fprintf(stderr, "sm70 cuda: SM70_MOE_KS=%s\n", v);
		told = 1;
	}
	return tune_ks[mode];
}

extern "C" void sm70__cuda_moe_tune_ks(int gate_up_ks, int down_ks)
{
	if (gate_up_ks == -2 && down_ks == -2) {
		tune_ks[0] = tune_ks[1] = -2; /* SM70_MOE_KS again */
		return;
	}
	tune_ks[0] = gate_up_ks >= -1 && gate_up_ks <= EX_MAX_KS ? gate_up_ks : 0;
	tune_ks[1] = down_ks >= -1 && down_ks <= EX_MAX_KS ? down_ks : 0;
}

/*
 * The fitting rule (moe_ks.h): the warps a tile (1 .. 8) that make the pass shortest when
 * each of the units (tile groups x expert slots) takes ceil(steps / ks) + EX_UNIT_COST
 * steps of its warps and the SMs hold floor(warps / (RT ks)) blocks each. At B1 a pass has
 * few units (Qwen3-Next's gate_up 640 for 528 4-warp places: two rounds, the second a fifth
 * full), so the split that fills the places matters more than the steps a warp keeps. The
 * unit cost was fitted to the sweep in docs/PERFORMANCE.md ("MoE: warps a tile"). The model
 * fails for gate_up at 9-16 tokens (8 warps an SM: it picks 1, which measured 15-17% slower
 * than 2 or 3), so that case takes 2. With it the choice was the fastest or within 2.3% of
 * it in 14 of the 16 cases of the sweep, 4.4 and 6.3% in the other two (Qwen3-Next's down
 * pass at B8 and B1).
 */
#define EX_UNIT_COST 8 /* steps' worth of lookups, staging and the sum a unit costs */

static int ex_pick_ks(const struct sm70__cuda *c, int mode, int rt, int warps_sm, int groups,
		      int slots, int nsteps)
{
	if (mode == EX_GATE_UP && warps_sm < 16)
		return 2;
	return sm70__moe_pick_ks(c->n_sm, rt, warps_sm, (long)groups * slots, nsteps,
				 EX_UNIT_COST);
}

template <int MODE, int NI, int RT, int PF>
static void ex_launch(struct sm70__cuda *c, struct ex_args a, int slots, int ks, int most)
{
	const int per_tile = MODE == EX_GATE_UP ? 8 : 16;
	const int groups = ((a.rows + per_tile - 1) / per_tile + RT - 1) / RT;
	const int forced = ex_forced_ks(MODE), warps_sm = EX_WARPS_SM(NI, PF);
	int resident, gx;

	if (forced)
		ks = forced;
	else if (ks <= 0 && c->be.batch_invariant)
		ks = MODE == EX_GATE_UP ? 2 : 1; /* the rule's choice depends on the batch */
	if (ks <= 0)
		ks = ex_pick_ks(c, MODE, RT, warps_sm, groups, slots, (a.cols + EX_KS - 1) / EX_KS);
	if (RT * ks > warps_sm)
		ks = warps_sm / RT;
	a.ks = ks;
	resident = warps_sm / (RT * ks) * c->n_sm;
	gx = (groups + most - 1) / most;
	/* enough blocks for the resident ones when every slot is used */
	if (gx < (resident + slots - 1) / slots)
		gx = (resident + slots - 1) / slots;
	if (gx > groups)
		gx = groups;
	sm70__launch_pdl(c, MODE == EX_DOWN ? SM70__PDL_EXPERTS : SM70__PDL_MOE,
			 experts_tc_kernel<MODE, NI, RT, PF>, dim3(gx, slots), dim3(RT * ks * 32),
			 (size_t)(RT * ks * EX_WARP_BYTES), a);
}

template <int MODE, int NI>
static void ex_pick_shape(struct sm70__cuda *c, const struct ex_args &a, int slots, int v)
{
	const struct ex_shape s = ex_variants[v][MODE];

#define EX_SHAPE(RT, PF)                                                                 \
	if (s.rt == RT && s.pf == PF) {                                                  \
		ex_launch<MODE, NI, RT, PF>(c, a, slots, s.ks, s.most);                  \
		return;                                                                  \
	}
	if constexpr (MODE == EX_GATE_UP) {
		EX_SHAPE(1, 2) EX_SHAPE(1, 4) EX_SHAPE(2, 2)
	} else {
		EX_SHAPE(2, 2) EX_SHAPE(2, 3) EX_SHAPE(4, 2) EX_SHAPE(1, 2)
	}
#undef EX_SHAPE
}

template <int MODE>
static void ex_pass(struct sm70__cuda *c, const struct ex_args &a, int slots, int n, int v)
{
	switch (n <= 4 ? 1 : n <= 8 ? 2 : n <= 12 ? 3 : 4) {
	case 1: ex_pick_shape<MODE, 1>(c, a, slots, v); break;
	case 2: ex_pick_shape<MODE, 2>(c, a, slots, v); break;
	case 3: ex_pick_shape<MODE, 3>(c, a, slots, v); break;
	default: ex_pick_shape<MODE, 4>(c, a, slots, v); break;
	}
}

/* ---- the reference path ---------------------------------------------------------------- */

/* A warp an intermediate index of one assignment: mid[a][i] = silu(g) * u. */
static __global__ void __launch_bounds__(REF_WARPS * 32)
	ref_gate_up_kernel(__half *__restrict__ mid, const __half *__restrict__ x,
			   const __half *__restrict__ gu, const int32_t *__restrict__ ids, int E,
			   int k, int nk, int inter, int hidden)
{
	const int lane = threadIdx.x & 31;
	const int i = blockIdx.x * REF_WARPS + (threadIdx.x >> 5);

	if (i >= inter)
		return;
	for (int as = blockIdx.y; as < nk; as += gridDim.y) {
		const int e = ids[as];
		const __half *xr = x + (size_t)(as / k) * hidden;
		const __half *g, *u;
		float sg = 0.0f, su = 0.0f;

		if (e < 0 || e >= E)
			continue;
		g = gu + ((size_t)e * 2 * inter + i) * hidden;
		u = g + (size_t)inter * hidden;
		for (int q = lane; q < hidden; q += 32) {
			const float xv = __half2float(xr[q]);

			sg += __half2float(g[q]) * xv;
			su += __half2float(u[q]) * xv;
		}
		sg = sm70__warp_sum(sg);
		su = sm70__warp_sum(su);
		if (lane == 0)
			mid[(size_t)as * inter + i] = __float2half_rn((sg / (1.0f + expf(-sg))) * su);
	}
}

/* A warp a hidden row of one assignment: part[a][h] = (down_h . mid[a]) * w[a]. */
static __global__ void __launch_bounds__(REF_WARPS * 32)
	ref_down_kernel(float *__restrict__ part, const __half *__restrict__ mid,
			const __half *__restrict__ dn, const int32_t *__restrict__ ids,
			const float *__restrict__ rw, int E, int nk, int inter, int hidden)
{
	const int lane = threadIdx.x & 31;
	const int h = blockIdx.x * REF_WARPS + (threadIdx.x >> 5);

	if (h >= hidden)
		return;
	for (int as = blockIdx.y; as < nk; as += gridDim.y) {
		const int e = ids[as];
		const __half *m = mid + (size_t)as * inter;
		const __half *d;
		float s = 0.0f;

		if (e < 0 || e >= E)
			continue;
		d = dn + ((size_t)e * hidden + h) * inter;
		for (int q = lane; q < inter; q += 32)
			s += __half2float(d[q]) * __half2float(m[q]);
		s = sm70__warp_sum(s);
		if (lane == 0)
			part[(size_t)as * hidden + h] = s * rw[as];
	}
}

/* out[t][h] = f16(part[t k][h] + part[t k + 1][h] + ...), in j order. */
static __global__ void combine_kernel(__half *__restrict__ out, const float *__restrict__ part,
				      int n, int k, int hidden)
{
	sm70__pdl_enter();
	const size_t count = (size_t)n * hidden;

	for (size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x; idx < count;
	     idx += (size_t)gridDim.x * blockDim.x) {
		const size_t t = idx / hidden, h = idx - t * hidden;
		const float *p = part + t * k * hidden + h;
		float s = p[0];

		for (int j = 1; j < k; j++)
			s += p[(size_t)j * hidden];
		out[idx] = __float2half_rn(s);
	}
}

/* ---- the launcher ------------------------------------------------------------------------ */

/* Set by sm70__cuda_moe_tune; path -1: SM70_MOE from the environment; passes 0: all. */
static int tune_path = -1, tune_variant = 0, tune_passes = 0;

extern "C" void sm70__cuda_moe_tune(int path, int variant, int passes)
{
	tune_path = path;
	tune_variant = variant >= 0 && variant < EX_VARIANTS ? variant : 0;
	tune_passes = passes & 7;
}

/* SM70_MOE=reference: the reference path; read once. */
static int moe_want_reference(void)
{
	static int cached = -1;

	if (tune_path >= 0)
		return tune_path;
	if (cached < 0) {
		const char *v = getenv("SM70_MOE");

		cached = v && strcmp(v, "reference") == 0;
		if (cached)
			fprintf(stderr, "sm70 cuda: SM70_MOE=reference: using the reference "
					"kernel\n");
	}
	return cached;
}

/* See backend.h. gate_up and down must be f16 stacks, or NVFP4 stacks both, of the same
 * n_experts, gate_up rows even, down [hidden][inter] with hidden = gate_up->cols
 * (otherwise nothing is queued, as on the CPU; other dtypes are refused through the sticky
 * error). The route must be
 * one moe_route wrote for these n and k; ids or groups out of range are skipped, never
 * followed. out must not overlap x, mid or part. */
extern "C" void sm70__cuda_moe_experts(struct sm70_backend *be, void *out, const void *x,
				       const struct sm70_experts *gate_up,
				       const struct sm70_experts *down,
				       const struct sm70_moe_route *route, int n, int k, void *mid,
				       float *part)
{
	struct sm70__cuda *c = sm70__cuda_enter(be);
	const int H = gate_up->cols, I = gate_up->rows / 2, E = gate_up->n_experts;
	const int64_t nk64 = (int64_t)n * k;
	const uintptr_t align = (uintptr_t)x | (uintptr_t)mid | (uintptr_t)gate_up->data |
				(uintptr_t)down->data;
	const int passes = tune_passes ? tune_passes : 7;
	int nk, slots, blocks, fp4;

	if (n <= 0 || k < 1 || gate_up->rows < 2 || gate_up->rows % 2 || H < 1 ||
	    down->rows != H || down->cols != I || down->n_experts != E || E < 1)
		return;
	fp4 = gate_up->dtype == SM70_DTYPE_NVFP4 && down->dtype == SM70_DTYPE_NVFP4;
	if (!fp4 && (gate_up->dtype != SM70_DTYPE_F16 || down->dtype != SM70_DTYPE_F16)) {
		sm70__cuda_fail(be, "moe_experts", __FILE__, __LINE__,
				"experts must be f16 or nvfp4 (both stacks)");
		return;
	}
	if (nk64 > INT32_MAX / 2) {
		sm70__cuda_fail(be, "moe_experts", __FILE__, __LINE__, "too many assignments");
		return;
	}
	nk = (int)nk64;
	slots = nk < E ? nk : E; /* the most distinct experts a step can read */
	if (fp4) {
		const int ks[2] = { ex_forced_ks(EX_GATE_UP), ex_forced_ks(EX_DOWN) };

		if (sm70__cuda_moe_nvfp4_passes(c, (const __half *)x, gate_up, down, route, n, k,
						(__half *)mid, part, moe_want_reference(),
						tune_variant, ks, passes))
			return;
	} else if (!moe_want_reference() && H % 8 == 0 && I % 8 == 0 && align % 16 == 0) {
		struct ex_args a = { (const __half *)x, (const __half *)gate_up->data,
				     (__half *)mid, part, route->w, route->order, route->used,
				     route->used_first, route->n_used, E, k, nk, I, H };

		if (passes & 1) {
			ex_pass<EX_GATE_UP>(c, a, slots, n, tune_variant);
			if (SM70_CUDA_LAUNCHED(be, "experts_tc_kernel gate_up"))
				return;
		}
		a.x = (const __half *)mid;
		a.w = (const __half *)down->data;
		a.rows = H;
		a.cols = I;
		if (passes & 2) {
			ex_pass<EX_DOWN>(c, a, slots, n, tune_variant);
			if (SM70_CUDA_LAUNCHED(be, "experts_tc_kernel down"))
				return;
		}
	} else {
		const int gy = nk < 65535 ? nk : 65535;

		if (passes & 1) {
			ref_gate_up_kernel<<<dim3((I + REF_WARPS - 1) / REF_WARPS, gy),
					     REF_WARPS * 32, 0, c->stream>>>(
				(__half *)mid, (const __half *)x, (const __half *)gate_up->data,
				route->ids, E, k, nk, I, H);
			if (SM70_CUDA_LAUNCHED(be, "ref_gate_up_kernel"))
				return;
		}
		if (passes & 2) {
			ref_down_kernel<<<dim3((H + REF_WARPS - 1) / REF_WARPS, gy),
					  REF_WARPS * 32, 0, c->stream>>>(
				part, (const __half *)mid, (const __half *)down->data, route->ids,
				route->w, E, nk, I, H);
			if (SM70_CUDA_LAUNCHED(be, "ref_down_kernel"))
				return;
		}
	}
	if (!(passes & 4))
		return;
	blocks = (int)(((size_t)n * H + 255) / 256);
	if (blocks > 4 * c->n_sm)
		blocks = 4 * c->n_sm;
	sm70__launch_pdl(c, SM70__PDL_MOE, combine_kernel, dim3(blocks), dim3(256), 0,
			 (__half *)out, part, n, k, H);
	SM70_CUDA_LAUNCHED(be, "combine_kernel");
}
