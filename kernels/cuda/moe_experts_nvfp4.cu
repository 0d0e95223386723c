/*
 * moe_experts_nvfp4.cu - the CUDA moe_experts op on NVFP4 expert stacks (W4A16): its gate_up
 * and down passes, which moe_experts.cu's launcher queues before its combine, and the
 * backend's prepare_experts, which arranges ModelOpt's layout for them. Contract:
 * kernels/backend.h (struct sm70_experts, moe_experts, prepare_experts).
 *
 * Arrangement (prepare_experts). Each expert's matrix [rows][cols] is cut into tiles of 16
 * rows and steps of 64 columns; the 512 code bytes of (tile, step) are 32 lanes' 16 bytes in
 * a row: lane l holds row l / 2 of the tile, columns 32 (l % 2) .. + 31 of the step, as four
 * 32-bit words of 8 columns each, column 2j of a word in nibble j and 2j + 1 in nibble j + 4
 * (one shift and two masks give the f16 pair (2j, 2j + 1)). So the lanes of rows 0-7 of a
 * tile are its first 256 bytes, of rows 8-15 its last 256. Scales: one u16 a lane unit, its
 * two E4M3 block scales (low byte: its first 16 columns). Order: expert, tile, step, lane;
 * codes [E][tiles][steps][32][16 B], scales [E][tiles][steps][32] u16 (a ninth of the code
 * bytes), row_scale2 f32 [E][rows] as it came. Rows and columns past the matrix are zero
 * codes and zero scales. An expert's codes are one contiguous run.
 *
 * Numerics. A code's magnitude bits placed at f16 bits 9-11 and its sign at 15 are the f16
 * e2m1 * 2^-14 exactly (code exponent 0 lands on f16 subnormals the same way); an E4M3
 * byte's low 7 bits at f16 bits 7-13 (sign at 15) are e4m3 * 2^-8, times 2^15 the f16
 * e4m3 * 2^7 (at most 57344). Their product, one HMUL2 a pair, is e2m1 * e4m3 * 2^-7:
 * at most 6 significant bits and no bit below 2^-17, at most 21, so exact in f16. The
 * tensor cores (WMMA 16x16x16, f16 in, f32 accumulate: the SM70 set) multiply that by x,
 * and each f32 sum is scaled by 128 * row_scale2 of its row before SwiGLU or the routing
 * weight. No FP4/FP8 instructions: shifts, masks, f16 multiplies.
 *
 * The grouped kernel (one launch a pass; grid (tile groups, min(n k, E) expert slots),
 * fixed by n, k and E, so a captured graph serves any routing): block slot u = blockIdx.y
 * reads n_used, used[u] and used_first[u] from device memory (u >= n_used: the block exits)
 * and walks tile groups blockIdx.x, + gridDim.x, ...; a group is RT output tiles, each
 * split over ks warps by steps, ks chosen at launch (1-8: a block is RT ks warps) by the
 * f16 kernel's rule (moe_ks.h) with this kernel's occupancy, or fixed (SM70_MOE_KS, batch
 * invariance; see fx_launch). A gate_up tile is 8 intermediate indices: its lanes 0-15
 * load the gate rows i..i+7 (half of an arranged tile) and lanes 16-31 the up rows
 * inter+i..+7, so the gate and up sums of an index meet in one accumulator tile and the
 * block writes mid[a][i] = f16(silu(g) * u); a down tile is 16 hidden rows, written as
 * part[a][h] = sum * w[a] (f32). Per step a warp decodes its 32 lanes' 16 bytes into its
 * shared stage (16 x 64 f16), stages the 64 columns of the expert's tokens' x rows (up to
 * 16; rows past the count zero) and runs four MMAs: each weight byte is read once per
 * launch for every token that chose its expert (experts chosen by more than 16 tokens:
 * passes of 16, re-reading from L2). The ks warps' partial tiles are added in warp order,
 * so a split changes the sum's order, never its terms.
 *
 * Loads and bytes in flight: a warp's weight load of a step is one 16-byte load a lane
 * (512 contiguous bytes; gate_up: two runs of 256) and one 2-byte load (64 contiguous
 * bytes), both fully used sectors; it keeps PF steps of them in flight, PF * 576 bytes, in
 * 5 PF registers a lane. PF 8 (the default): 4.6 KB a warp; 12 warps an SM (the launch
 * bounds: up to 168 registers, no spills; fewer where a block's warps do not divide 12)
 * keep 55 KB an SM in flight, 7.3 MB over an H200's 132 SMs, 1.5 times what ~4.8 TB/s for
 * ~1 us of latency needs (a V100's 80 SMs: 4.4 MB for 0.9 TB/s). The weight loads need
 * only the expert, so the first PF steps go out before the tokens are looked up, and the
 * next tile group's first steps before the current group's sums are added. x (f16,
 * L1/L2-resident: n x hidden) is loaded a step at a time, 16 bytes a lane for each 4 token
 * rows, issued before the step's decode so the decode hides its latency.
 *
 * Cost model: a warp step (1024 weights, 576 bytes) is ~150 warp instructions (decode
 * ~90, x staging, four MMAs and their fragment loads), so an H200 SM (4 issues a clock at
 * ~1.98 GHz) decodes ~30 GB/s: ~4 TB/s over 132 SMs, near its HBM rate; the decode, not
 * the loads, may bound it there. A V100 decodes ~2 TB/s against 0.9 TB/s of HBM.
 *
 * Reference path (SM70_MOE=reference, or an x or mid not 16-byte aligned): one assignment
 * at a time straight from ids, a warp an output element, each element dequantised in f32 as
 * the CPU twin does ((e2m1 * e4m3) * row_scale2) from the arrangement.
 *
 * Non-goals: a ModelOpt-layout path (SM70_NVFP4=reference concerns matmul only; the named
 * switch back here is SM70_MOE=reference), a tuned prefill (n > 16 per expert), FP4 x.
 */
#include <mma.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/parallel.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/moe_ks.h"
#include "kernels/cuda/pdl.h"

#define FX_KS 64            /* columns a step */
#define FX_LD (FX_KS + 8)   /* staged row stride in halves: rows 16 bytes apart in banks */
#define FX_TOK 16           /* tokens a pass: the MMA's N */
#define FX_WARP_BYTES ((size_t)2 * 16 * FX_LD * sizeof(__half)) /* W stage + x stage */
/* Warps an SM the launch bounds ask for: 16 (128 registers a thread) with 4 steps in
 * flight, 12 (168) with 8, where 128 spill. A block has RT * ks warps, ks chosen at launch,
 * so the bound is on the threads an SM holds: one block of all of them gives the register
 * cap that 4 or 3 blocks of 4 warps had. */
#define FX_WARPS_SM(PF) ((PF) > 4 ? 12 : 16)
#define FX_MAX_KS SM70__MOE_MAX_KS
#define FX_VARIANTS 3       /* tile shapes (sm70__cuda_moe_tune's variant) */
#define FX_REF_WARPS 8

enum { FX_GATE_UP = 0, FX_DOWN = 1 };

/* What both passes read and write. */
struct fx_args {
	const __half *x;        /* gate_up: x [n][hidden]; down: mid [n k][inter] */
	const uint4 *codes;     /* the stack's arranged codes */
	const uint16_t *scales; /* its arranged block scales */
	const float *rs2;       /* its row_scale2 [E][stack rows] */
	__half *mid;            /* gate_up's output */
	float *part;            /* down's output */
	const float *rw;        /* the route's weights [n k] */
	const int32_t *order, *used, *used_first, *n_used;
	int E, k, nk;
	int rows;               /* outputs: gate_up inter (the stack has 2 inter rows); down hidden */
	int cols;               /* the dot length: hidden or inter */
	int tiles, steps;       /* one expert's arranged tiles and steps */
	int ks;                 /* warps a tile, splitting its steps (1 .. FX_MAX_KS) */
};

static __host__ __device__ __forceinline__ int fx_tiles(int rows)
{
	return (rows + 15) / 16;
}

static __host__ __device__ __forceinline__ int fx_steps(int cols)
{
	return (cols + FX_KS - 1) / FX_KS;
}

/* The lane unit holding columns 32 half .. + 31 of step s of row r of expert e: its code
 * bytes are at unit * 16, its scales at unit * 2. */
static __host__ __device__ __forceinline__ size_t fx_unit(int e, int r, int s, int half,
							  int tiles, int steps)
{
	return (((size_t)e * tiles + r / 16) * steps + s) * 32 + (size_t)(r % 16) * 2 + half;
}

/* ---- decoding --------------------------------------------------------------------------- */

static __device__ __forceinline__ __half2 fx_as_half2(uint32_t u)
{
	__half2 h;

	memcpy(&h, &u, sizeof(h));
	return h;
}

static __device__ __forceinline__ uint32_t fx_as_u32(__half2 h)
{
	uint32_t u;

	memcpy(&u, &h, sizeof(u));
	return u;
}

/* A lane's two block scales (s16: low byte first) as f16 e4m3 * 2^7 each, both halves of
 * lo from the low byte, of hi from the high one. */
static __device__ __forceinline__ void fx_scales(uint32_t s16, __half2 *lo, __half2 *hi)
{
	const uint32_t b = (s16 & 0xffu) | ((s16 & 0xff00u) << 8); /* bytes at bits 0 and 16 */
	const uint32_t f = ((b & 0x007f007fu) << 7) | ((b & 0x00800080u) << 8);
	const __half2 t = __hmul2(fx_as_half2(f), __float2half2_rn(32768.0f));

	*lo = __low2half2(t);
	*hi = __high2half2(t);
}

/* Columns 2j and 2j + 1 of word w (nibbles j and j + 4) as an f16 pair of e2m1 * 2^-14. */
template <int J> static __device__ __forceinline__ uint32_t fx_pair(uint32_t w)
{
	const uint32_t v = w >> (4 * J);

	return ((v << 9) & 0x0e000e00u) | ((v << 12) & 0x80008000u);
}

/* The 8 columns of word w as f16 e2m1 * e4m3 * 2^-7, t the block scale pair. */
static __device__ __forceinline__ uint4 fx_decode8(uint32_t w, __half2 t)
{
	uint4 r;

	r.x = fx_as_u32(__hmul2(fx_as_half2(fx_pair<0>(w)), t));
	r.y = fx_as_u32(__hmul2(fx_as_half2(fx_pair<1>(w)), t));
	r.z = fx_as_u32(__hmul2(fx_as_half2(fx_pair<2>(w)), t));
	r.w = fx_as_u32(__hmul2(fx_as_half2(fx_pair<3>(w)), t));
	return r;
}

/* ---- the grouped kernel ------------------------------------------------------------------ */

/* The unit of step 0 this lane loads for output tile `tile` of expert e; a tile past the
 * end reads the last one (valid) and is never stored. */
template <int MODE>
static __device__ __forceinline__ size_t fx_first_unit(const struct fx_args &a, int e,
						       int tile, int lane)
{
	const int per_tile = MODE == FX_GATE_UP ? 8 : 16;
	const int last = (a.rows + per_tile - 1) / per_tile - 1;
	const int t = tile < last ? tile : last, lr = lane >> 1;
	const int row = MODE == FX_GATE_UP ? (lr < 8 ? 0 : a.rows) + 8 * t + (lr & 7)
					   : 16 * t + lr;

	return fx_unit(e, row, 0, lane & 1, a.tiles, a.steps);
}

/*
 * One pass (MODE) of the grouped experts: NI groups of 4 token rows staged (tokens a pass
 * <= 4 NI), RT output tiles a block, a.ks warps a tile splitting its steps, PF steps of
 * weights in flight. See the file comment.
 */
template <int MODE, int NI, int RT, int PF>
static __global__ void __launch_bounds__(FX_WARPS_SM(PF) * 32, 1)
	fx_grouped_kernel(const struct fx_args a)
{
	/* as in moe_experts.cu: gate_up waits for the route before it reads anything; the
	 * down pass reads the (finished) routing and its first weight steps before waiting
	 * for gate_up's mid */
	if (MODE == FX_GATE_UP)
		sm70__pdl_enter();
	using namespace nvcuda;
	extern __shared__ __align__(128) unsigned char fx_smem[];
	__shared__ int tok[FX_TOK];
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	const int KS = a.ks, sub = lane >> 3, chunk = lane & 7, ks = warp % KS, rt_w = warp / KS;
	const int per_tile = MODE == FX_GATE_UP ? 8 : 16;
	const int groups = ((a.rows + per_tile - 1) / per_tile + RT - 1) / RT;
	const int s0 = ks * a.steps / KS, s1 = (ks + 1) * a.steps / KS;
	const size_t stack_rows = MODE == FX_GATE_UP ? 2 * (size_t)a.rows : (size_t)a.rows;
	__half *ws = (__half *)(fx_smem + warp * FX_WARP_BYTES);
	__half *xs = ws + 16 * FX_LD;
	uint4 *wdst = (uint4 *)(ws + (lane >> 1) * FX_LD + (lane & 1) * 32);
	const __half *xp[NI];
	uint4 wr[PF];
	uint32_t sr[PF];
	size_t unit;
	/* one round trip: slot u < n k always indexes used and used_first, stale or not */
	const int u = blockIdx.y;
	const int nu = a.n_used[0], e = a.used[u], first = a.used_first[u];
	const int count = a.used_first[u + 1] - first;

	if (u >= nu || e < 0 || e >= a.E || first < 0 || count <= 0 || first + count > a.nk)
		return; /* the whole block: nothing below has run */

	/* x rows this kernel never stages stay zero */
	for (int i = lane; i < (16 - 4 * NI) * FX_LD / 8; i += 32)
		((uint4 *)(xs + 4 * NI * FX_LD))[i] = make_uint4(0, 0, 0, 0);

	/* Weight loads of step s into register slot d. */
#define FX_ISSUE_W(d, s)                                                                 \
	do {                                                                             \
		wr[d] = __ldg(a.codes + unit + (size_t)(s) * 32);                        \
		sr[d] = __ldg(a.scales + unit + (size_t)(s) * 32);                       \
	} while (0)

	for (int g0 = 0; g0 < count; g0 += FX_TOK) {
		const int cn = count - g0 < FX_TOK ? count - g0 : FX_TOK;

		unit = fx_first_unit<MODE>(a, e, blockIdx.x * RT + rt_w, lane);
#pragma unroll
		for (int d = 0; d < PF; d++)
			if (s0 + d < s1)
				FX_ISSUE_W(d, s0 + d);
		__syncthreads(); /* the last pass is done with tok and the stages */
		if (threadIdx.x < FX_TOK) {
			const int as = threadIdx.x < cn ? a.order[first + g0 + threadIdx.x] : 0;

			tok[threadIdx.x] = as >= 0 && as < a.nk ? as : 0;
		}
		__syncthreads();
#pragma unroll
		for (int i = 0; i < NI; i++) {
			const int j = sub + 4 * i;
			const size_t xrow = MODE == FX_GATE_UP ? (size_t)(tok[j] / a.k) : tok[j];

			xp[i] = j < cn ? a.x + xrow * a.cols + chunk * 8 : NULL;
		}

		if (MODE == FX_DOWN)
			sm70__pdl_enter(); /* mid comes from gate_up */
		for (int g = blockIdx.x; g < groups; g += gridDim.x) {
			wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;

			wmma::fill_fragment(acc, 0.0f);
			for (int s = s0; s < s1; s += PF) {
#pragma unroll
				for (int d = 0; d < PF; d++) {
					const int k0 = (s + d) * FX_KS + chunk * 8;
					uint4 xr[NI];
					__half2 lo, hi;

					if (s + d >= s1)
						break;
#pragma unroll
					for (int i = 0; i < NI; i++)
						xr[i] = xp[i] && k0 < a.cols ?
								__ldg((const uint4 *)(xp[i] + (s + d) *
												  FX_KS)) :
								make_uint4(0, 0, 0, 0);
					fx_scales(sr[d], &lo, &hi);
					wdst[0] = fx_decode8(wr[d].x, lo);
					wdst[1] = fx_decode8(wr[d].y, lo);
					wdst[2] = fx_decode8(wr[d].z, hi);
					wdst[3] = fx_decode8(wr[d].w, hi);
					if (s + d + PF < s1)
						FX_ISSUE_W(d, s + d + PF);
#pragma unroll
					for (int i = 0; i < NI; i++)
						*(uint4 *)(xs + (sub + 4 * i) * FX_LD + chunk * 8) = xr[i];
					__syncwarp();
#pragma unroll
					for (int kk = 0; kk < FX_KS / 16; kk++) {
						wmma::fragment<wmma::matrix_a, 16, 16, 16, __half,
							       wmma::row_major> af;
						wmma::fragment<wmma::matrix_b, 16, 16, 16, __half,
							       wmma::col_major> bf;

						wmma::load_matrix_sync(af, ws + kk * 16, FX_LD);
						wmma::load_matrix_sync(bf, xs + kk * 16, FX_LD);
						wmma::mma_sync(acc, af, bf, acc);
					}
					__syncwarp(); /* the stages are free for the next step */
				}
			}

			/* each warp's partial tile (16 weight rows x 16 tokens, row-major) into its
			 * W stage; the next group's first weight steps go out before the sums */
			wmma::store_matrix_sync((float *)ws, acc, 16, wmma::mem_row_major);
			if (g + (int)gridDim.x < groups) {
				unit = fx_first_unit<MODE>(a, e, (g + (int)gridDim.x) * RT + rt_w, lane);
#pragma unroll
				for (int d = 0; d < PF; d++)
					if (s0 + d < s1)
						FX_ISSUE_W(d, s0 + d);
			}
			__syncthreads();
			for (int idx = threadIdx.x; idx < RT * per_tile * cn; idx += RT * KS * 32) {
				const int rt = idx / (per_tile * cn), rem = idx - rt * per_tile * cn;
				const int j = rem / per_tile, r = rem - j * per_tile;
				const int out = (g * RT + rt) * per_tile + r;
				const float *red = (const float *)(fx_smem + rt * KS * FX_WARP_BYTES);
				const size_t stride = FX_WARP_BYTES / sizeof(float);
				const float *rs2 = a.rs2 + (size_t)e * stack_rows;
				float sa = 0.0f, sb = 0.0f;

				if (out >= a.rows)
					continue;
				/* the warps' partial tiles in warp order, whatever the split */
#pragma unroll
				for (int v = 0; v < FX_MAX_KS; v++) {
					if (v == KS)
						break;
					sa += red[v * stride + r * 16 + j];
					if (MODE == FX_GATE_UP)
						sb += red[v * stride + (r + 8) * 16 + j];
				}
				sa *= 128.0f * rs2[out];
				if (MODE == FX_GATE_UP) {
					sb *= 128.0f * rs2[a.rows + out];
					a.mid[(size_t)tok[j] * a.rows + out] =
						__float2half_rn((sa / (1.0f + expf(-sa))) * sb);
				} else {
					a.part[(size_t)tok[j] * a.rows + out] = sa * a.rw[tok[j]];
				}
			}
			__syncthreads(); /* the stages are free for the next group */
		}
	}
#undef FX_ISSUE_W
}

/*
 * The split: warps a tile by moe_ks.h's rule unless SM70_MOE_KS / sm70__cuda_moe_tune_ks
 * forces it (forced > 0; -1: the rule) or the shape fixes it. The unit cost is this
 * kernel's own: a step here is 576 bytes and ~150 instructions of decode where the f16
 * kernel's is 2 KB, so its fixed work per unit is not the same number of steps. Not fitted
 * yet: 8 as on f16 stacks; on the bench shapes (E512 / k10, E128 / k8, B1-B16, an H200's
 * 132 SMs) any cost from 6 to 24 picks the same (gate_up 2 at B1, then 1; down 1), and
 * `sm70-bench moe-nvfp4` times every split to fit it by. Under batch invariance the rule
 * would follow the batch, so a shape without a split takes the one this kernel had fixed:
 * 4 for gate_up, 1 for down.
 */
#define FX_UNIT_COST 8

/* RT tiles a block, ks warps a tile (0: chosen here), PF steps in flight, at most `most` tile
 * groups a block: the grid's x covers the groups in that many rounds or fewer, with never
 * fewer blocks than the SMs hold at once over the slots. */
template <int MODE, int NI, int RT, int PF>
static void fx_launch(struct sm70__cuda *c, struct fx_args a, int slots, int ks, int most,
		      int forced)
{
	const int per_tile = MODE == FX_GATE_UP ? 8 : 16, warps_sm = FX_WARPS_SM(PF);
	const int groups = ((a.rows + per_tile - 1) / per_tile + RT - 1) / RT;
	int resident, gx;

	if (forced)
		ks = forced;
	else if (ks <= 0 && c->be.batch_invariant)
		ks = MODE == FX_GATE_UP ? 4 : 1;
	/* measured (sm70-bench moe-nvfp4, H200): at 16 tokens gate_up's rule choice, 1,
	 * took 11-18% longer than 2 on both shapes, as on f16 stacks; at 8 tokens 1 was best */
	if (ks <= 0 && MODE == FX_GATE_UP && NI >= 3)
		ks = 2;
	if (ks <= 0)
		ks = sm70__moe_pick_ks(c->n_sm, RT, warps_sm, (long)groups * slots, a.steps,
				       FX_UNIT_COST);
	if (RT * ks > warps_sm)
		ks = warps_sm / RT;
	a.ks = ks;
	if (RT * ks * FX_WARP_BYTES > 48 * 1024 &&
	    sm70__cuda_smem_optin(c, (const void *)fx_grouped_kernel<MODE, NI, RT, PF>))
		return;
	resident = warps_sm / (RT * ks) * c->n_sm;
	gx = (groups + most - 1) / most;
	if (gx < (resident + slots - 1) / slots)
		gx = (resident + slots - 1) / slots;
	if (gx > groups)
		gx = groups;
	sm70__launch_pdl(c, MODE == FX_DOWN ? SM70__PDL_EXPERTS : SM70__PDL_MOE,
			 fx_grouped_kernel<MODE, NI, RT, PF>, dim3(gx, slots), dim3(RT * ks * 32),
			 (size_t)(RT * ks * FX_WARP_BYTES), a);
}

/*
 * The tile shapes, variant 0 the default; the others are for sm70-bench moe-nvfp4 to time
 * and test_cuda_moe_nvfp4 to check. gate_up (32 steps at hidden 2048): one tile a block,
 * its steps split over the rule's warps; down (8 or 12 steps at inter 512 / 768): four
 * tiles a block, the rule's warps each (at most 3: 12 warps an SM). 1: two tiles of two
 * warps each for both; 2: variant 0 with 4 steps in flight (16 warps an SM).
 */
template <int MODE, int NI>
static void fx_pick(struct sm70__cuda *c, const struct fx_args &a, int slots, int v,
		    int forced)
{
	if constexpr (MODE == FX_GATE_UP) {
		switch (v) {
		case 1: fx_launch<MODE, NI, 2, 8>(c, a, slots, 2, 4, forced); break;
		case 2: fx_launch<MODE, NI, 1, 4>(c, a, slots, 0, 4, forced); break;
		default: fx_launch<MODE, NI, 1, 8>(c, a, slots, 0, 4, forced); break;
		}
	} else {
		switch (v) {
		case 1: fx_launch<MODE, NI, 2, 8>(c, a, slots, 2, 4, forced); break;
		case 2: fx_launch<MODE, NI, 4, 4>(c, a, slots, 0, 4, forced); break;
		default: fx_launch<MODE, NI, 4, 8>(c, a, slots, 0, 4, forced); break;
		}
	}
}

template <int MODE>
static void fx_pass(struct sm70__cuda *c, const struct fx_args &a, int slots, int n, int v,
		    int forced)
{
	switch (n <= 4 ? 1 : n <= 8 ? 2 : n <= 12 ? 3 : 4) {
	case 1: fx_pick<MODE, 1>(c, a, slots, v, forced); break;
	case 2: fx_pick<MODE, 2>(c, a, slots, v, forced); break;
	case 3: fx_pick<MODE, 3>(c, a, slots, v, forced); break;
	default: fx_pick<MODE, 4>(c, a, slots, v, forced); break;
	}
}

/* ---- the reference path ---------------------------------------------------------------- */

/* W[e][r][c] of an arranged stack in f32, as the CPU twin rounds it. */
static __device__ __forceinline__ float fx_element(const uint8_t *codes, const uint8_t *scales,
						   const float *rs2, int e, int r, int c,
						   int stack_rows, int tiles, int steps)
{
	const int s = c / FX_KS, w = c % 32;
	const size_t unit = fx_unit(e, r, s, (c % FX_KS) / 32, tiles, steps);
	const int nib = (w % 8) / 2 + 4 * (w & 1); /* nibble in its word */
	const uint32_t code = (codes[unit * 16 + (w / 8) * 4 + nib / 2] >> (4 * (nib & 1))) & 15;
	const uint32_t sc = scales[unit * 2 + w / 16];
	const uint32_t ce = (code >> 1) & 3, se = (sc >> 3) & 15, sm = sc & 7;
	const float mag = ce ? ldexpf(1.0f + 0.5f * (float)(code & 1), (int)ce - 1) :
			       0.5f * (float)(code & 1);
	const float smag = se ? ldexpf(1.0f + (float)sm / 8.0f, (int)se - 7) :
				ldexpf((float)sm, -9);

	return (((code & 8) ? -mag : mag) * ((sc & 0x80) ? -smag : smag)) *
	       rs2[(size_t)e * stack_rows + r];
}

/* A warp an intermediate index of one assignment: mid[a][i] = silu(g) * u. */
static __global__ void __launch_bounds__(FX_REF_WARPS * 32)
	fx_ref_gate_up_kernel(__half *__restrict__ mid, const __half *__restrict__ x,
			      const uint8_t *__restrict__ codes, const uint8_t *__restrict__ scales,
			      const float *__restrict__ rs2, const int32_t *__restrict__ ids,
			      int E, int k, int nk, int inter, int hidden)
{
	const int lane = threadIdx.x & 31;
	const int i = blockIdx.x * FX_REF_WARPS + (threadIdx.x >> 5);
	const int tiles = fx_tiles(2 * inter), steps = fx_steps(hidden);

	if (i >= inter)
		return;
	for (int as = blockIdx.y; as < nk; as += gridDim.y) {
		const int e = ids[as];
		const __half *xr = x + (size_t)(as / k) * hidden;
		float sg = 0.0f, su = 0.0f;

		if (e < 0 || e >= E)
			continue;
		for (int q = lane; q < hidden; q += 32) {
			const float xv = __half2float(xr[q]);

			sg += fx_element(codes, scales, rs2, e, i, q, 2 * inter, tiles, steps) * xv;
			su += fx_element(codes, scales, rs2, e, inter + i, q, 2 * inter, tiles,
					 steps) * xv;
		}
		sg = sm70__warp_sum(sg);
		su = sm70__warp_sum(su);
		if (lane == 0)
			mid[(size_t)as * inter + i] = __float2half_rn((sg / (1.0f + expf(-sg))) * su);
	}
}

/* A warp a hidden row of one assignment: part[a][h] = (down_h . mid[a]) * w[a]. */
static __global__ void __launch_bounds__(FX_REF_WARPS * 32)
	fx_ref_down_kernel(float *__restrict__ part, const __half *__restrict__ mid,
			   const uint8_t *__restrict__ codes, const uint8_t *__restrict__ scales,
			   const float *__restrict__ rs2, const int32_t *__restrict__ ids,
			   const float *__restrict__ rw, int E, int nk, int inter, int hidden)
{
	const int lane = threadIdx.x & 31;
	const int h = blockIdx.x * FX_REF_WARPS + (threadIdx.x >> 5);
	const int tiles = fx_tiles(hidden), steps = fx_steps(inter);

	if (h >= hidden)
		return;
	for (int as = blockIdx.y; as < nk; as += gridDim.y) {
		const int e = ids[as];
		const __half *m = mid + (size_t)as * inter;
		float s = 0.0f;

		if (e < 0 || e >= E)
			continue;
		for (int q = lane; q < inter; q += 32)
			s += fx_element(codes, scales, rs2, e, h, q, hidden, tiles, steps) *
			     __half2float(m[q]);
		s = sm70__warp_sum(s);
		if (lane == 0)
			part[(size_t)as * hidden + h] = s * rw[as];
	}
}

/* ---- the passes ------------------------------------------------------------------------ */

/* See cuda_check.h. */
int sm70__cuda_moe_nvfp4_passes(struct sm70__cuda *c, const __half *x,
				const struct sm70_experts *gu, const struct sm70_experts *dn,
				const struct sm70_moe_route *route, int n, int k, __half *mid,
				float *part, int ref, int variant, const int ks[2], int passes)
{
	struct sm70_backend *be = &c->be;
	const int H = gu->cols, I = gu->rows / 2, E = gu->n_experts, nk = n * k;
	const int slots = nk < E ? nk : E;

	if (I % 16 || H % 16) {
		sm70__cuda_fail(be, "moe_experts", __FILE__, __LINE__,
				"nvfp4 experts need hidden and inter multiples of 16");
		return -EIO;
	}
	if (slots > 65535) {
		sm70__cuda_fail(be, "moe_experts", __FILE__, __LINE__, "too many expert slots");
		return -EIO;
	}
	if (!ref && !(((uintptr_t)x | (uintptr_t)mid) & 15)) {
		const int v = variant >= 0 && variant < FX_VARIANTS ? variant : 0;
		struct fx_args a = { x, (const uint4 *)gu->data, (const uint16_t *)gu->scale,
				     gu->row_scale2, mid, part, route->w, route->order,
				     route->used, route->used_first, route->n_used, E, k, nk, I, H,
				     fx_tiles(2 * I), fx_steps(H), 0 };

		if (passes & 1) {
			fx_pass<FX_GATE_UP>(c, a, slots, n, v, ks[0]);
			if (SM70_CUDA_LAUNCHED(be, "fx_grouped_kernel gate_up"))
				return -EIO;
		}
		a.x = mid;
		a.codes = (const uint4 *)dn->data;
		a.scales = (const uint16_t *)dn->scale;
		a.rs2 = dn->row_scale2;
		a.rows = H;
		a.cols = I;
		a.tiles = fx_tiles(H);
		a.steps = fx_steps(I);
		if (passes & 2) {
			fx_pass<FX_DOWN>(c, a, slots, n, v, ks[1]);
			if (SM70_CUDA_LAUNCHED(be, "fx_grouped_kernel down"))
				return -EIO;
		}
		return 0;
	}
	{
		const int gy = nk < 65535 ? nk : 65535;

		if (passes & 1) {
			fx_ref_gate_up_kernel<<<dim3((I + FX_REF_WARPS - 1) / FX_REF_WARPS, gy),
						FX_REF_WARPS * 32, 0, c->stream>>>(
				mid, x, (const uint8_t *)gu->data, (const uint8_t *)gu->scale,
				gu->row_scale2, route->ids, E, k, nk, I, H);
			if (SM70_CUDA_LAUNCHED(be, "fx_ref_gate_up_kernel"))
				return -EIO;
		}
		if (passes & 2) {
			fx_ref_down_kernel<<<dim3((H + FX_REF_WARPS - 1) / FX_REF_WARPS, gy),
					     FX_REF_WARPS * 32, 0, c->stream>>>(
				part, mid, (const uint8_t *)dn->data, (const uint8_t *)dn->scale,
				dn->row_scale2, route->ids, route->w, E, nk, I, H);
			if (SM70_CUDA_LAUNCHED(be, "fx_ref_down_kernel"))
				return -EIO;
		}
	}
	return 0;
}

/* ---- prepare_experts -------------------------------------------------------------------- */

struct fx_arrange_job {
	uint8_t *codes, *scales;
	const struct sm70_experts *src;
};

/* Experts [e0, e1) of ModelOpt's stack into the arrangement (host buffers of the arranged
 * sizes, zeroed by the caller). Whole 8-column words at a time: 4 source bytes hold columns
 * 2j | 2j + 1, which become nibbles j and j + 4. */
static void fx_arrange_experts(void *ctx, size_t e0, size_t e1)
{
	const struct fx_arrange_job *j = (const struct fx_arrange_job *)ctx;
	const struct sm70_experts *src = j->src;
	uint8_t *codes = j->codes, *scales = j->scales;
	const int rows = src->rows, cols = src->cols;
	const int tiles = fx_tiles(rows), steps = fx_steps(cols);

	for (int e = (int)e0; e < (int)e1; e++) {
		for (int r = 0; r < rows; r++) {
			const size_t row = (size_t)e * rows + r;
			const uint8_t *sc = (const uint8_t *)src->data + row * (cols / 2);
			const uint8_t *ss = (const uint8_t *)src->scale + row * (cols / 16);

			for (int c0 = 0; c0 < cols; c0 += 32) {
				const size_t unit = fx_unit(e, r, c0 / FX_KS, (c0 % FX_KS) / 32,
							    tiles, steps);
				uint8_t *dst = codes + unit * 16;

				for (int q = 0; q < 4 && c0 + 8 * q < cols; q++) {
					const uint8_t *b = sc + (c0 + 8 * q) / 2;

					dst[4 * q + 0] = (uint8_t)((b[0] & 15) | (b[1] & 15) << 4);
					dst[4 * q + 1] = (uint8_t)((b[2] & 15) | (b[3] & 15) << 4);
					dst[4 * q + 2] = (uint8_t)((b[0] >> 4) | (b[1] >> 4) << 4);
					dst[4 * q + 3] = (uint8_t)((b[2] >> 4) | (b[3] >> 4) << 4);
				}
				scales[unit * 2] = ss[c0 / 16];
				if (c0 + 16 < cols)
					scales[unit * 2 + 1] = ss[c0 / 16 + 1];
			}
		}
	}
}

/* The whole stack, experts spread over the host's cores (a qwen4_exp layer's gate_up stack
 * holds 1.1e9 codes). */
static void fx_arrange(uint8_t *codes, uint8_t *scales, const struct sm70_experts *src)
{
	struct fx_arrange_job j = { codes, scales, src };

	sm70__parallel_for((size_t)src->n_experts, 1, (size_t)src->rows * src->cols / 2,
			   fx_arrange_experts, &j);
}

/* An upload of n host bytes into new backend memory at *dst; 0 or -ENOMEM / -EIO. */
static int fx_upload(struct sm70_backend *be, void **dst, const void *src, size_t n)
{
	*dst = be->ops->buf_alloc(be, n);
	if (!*dst)
		return -ENOMEM;
	return be->ops->upload(be, *dst, src, n);
}

/* See backend.h and the file comment. Host memory for the arrangement is taken and
 * released here; returns when the stack is uploaded. */
extern "C" int sm70__cuda_prepare_experts(struct sm70_backend *be, struct sm70_experts *out,
					  const struct sm70_experts *src, struct sm70_err *err)
{
	int ret = sm70__nvfp4_experts_check(src, err);
	size_t units, rows;
	uint8_t *codes = NULL, *scales = NULL;
	void *rs2 = NULL;

	sm70__cuda_enter(be);
	*out = (struct sm70_experts){};
	out->dtype = SM70_DTYPE_NVFP4;
	if (ret)
		return ret;
	units = (size_t)src->n_experts * fx_tiles(src->rows) * fx_steps(src->cols) * 32;
	rows = (size_t)src->n_experts * src->rows;
	codes = (uint8_t *)calloc(units, 16);
	scales = (uint8_t *)calloc(units, 2);
	if (!codes || !scales) {
		ret = -ENOMEM;
		goto done;
	}
	fx_arrange(codes, scales, src);
	ret = fx_upload(be, &out->data, codes, units * 16);
	if (!ret)
		ret = fx_upload(be, &out->scale, scales, units * 2);
	if (!ret)
		ret = fx_upload(be, &rs2, src->row_scale2, rows * sizeof(float));
	out->row_scale2 = (float *)rs2;
done:
	free(scales);
	free(codes);
	if (ret) {
		be->ops->buf_free(be, out->row_scale2);
		be->ops->buf_free(be, out->scale);
		be->ops->buf_free(be, out->data);
		*out = (struct sm70_experts){};
		out->dtype = SM70_DTYPE_NVFP4;
		return sm70_errf(err, ret, "nvfp4 experts [%d][%d, %d]: %s", src->n_experts,
				 src->rows, src->cols,
				 ret == -ENOMEM ? "out of memory" : "upload failed");
	}
	out->n_experts = src->n_experts;
	out->rows = src->rows;
	out->cols = src->cols;
	return 0;
}
