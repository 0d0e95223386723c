/*
 * matmul_nvfp4_split.cu - the f16-sum kernels of the NVFP4 matmul op, y[n, rows] = x[n, cols]
 * W^T for a few rows of x, on prepare_weight's arrangement (matmul_nvfp4.cu's file comment;
 * the words as nvfp4_words.h unpacks them): the tile kernel (n = 1-2, the default there,
 * SM70_NVFP4_VARIANT=8) and the split kernel (n = 1..FP4S_ROWS_MAX; variants 6 and 7, and
 * the default at n = 2 where the tile kernel's x does not fit its shared memory).
 *
 * Why. matmul_nvfp4.cu's dot kernel (n = 1) spends 4.1 instructions a weight in exact f32
 * chains at 106 registers, and its WMMA path (n >= 2) decodes into shared memory for tensor
 * cores that use a sixteenth of their width; ncu found both bound by their own latency, not
 * memory (docs/PERFORMANCE.md, "NVFP4 at B1"). These kernels multiply in f16 pairs:
 * - a word's codes unpacked (e2m1 * 2^-14, exact), times the block scale t = e4m3 * 4 in one
 *   HMUL2 (e2m1 * e4m3 * 2^-12: a multiple of 2^-22 with at most 6 significant bits, at most
 *   0.66, exact in f16), then HFMA2 with x into a pair of f16 sums over the 16-column block
 *   (8 terms a half); the block's two halves go to f32 and into the lane's f32 sum. About 3
 *   instructions a weight at n = 1 (the unpack is 11 a word of 8), and the decode is shared
 *   by the rows of x.
 * - the weights are loaded past L1 (ld.global.nc.L1::no_allocate): each byte is read once,
 *   and in L1 it pushed x out (ncu: x's loads hit 75%).
 *
 * The split kernel: one warp a task, a task being one row tile's chunk of 64-column steps;
 * the chunks a tile chosen at launch so the tasks fill whole waves of resident warps
 * (fp4s_split; SM70_NVFP4_SPLIT forces it). Blocks of 4 warps at 64 registers at n = 1 (32
 * warps an SM), 80 at n = 2-4; x read through L1 (variant 6) or from the block's copy in
 * shared memory (variant 7, the default's). The chunks of a tile meet in the backend's split
 * scratch (gemv_part / gemv_count, which matmul.cu's split GEMVs share; the main stream
 * only): a warp stores its tile's 16 row sums in its task's slot, and the last of the
 * tile's warps to arrive adds the slots in chunk order and sets the counter back to zero.
 * The sums do not depend on the order of arrival, so a call's output is the same bit for
 * bit every time on a given GPU. Measured on an H100: at n = 2 1.02-1.29x the WMMA path on
 * every Qwen3-8B shape (lm_head at 89% of read bandwidth), the default there until the tile
 * kernel measured faster still (below); at n = 1
 * slower than the dot kernel (its tasks are one short burst of loads each, ending in three
 * L2 round trips), at n = 4 slower than WMMA (docs/PERFORMANCE.md, "NVFP4 at B1-B4").
 *
 * Numerics (the price of the f16 pairs; test_cuda_nvfp4 checks these bounds). A block half's
 * sum is one HMUL2 and 7 HFMA2, each rounding once to f16 (unit 2^-11), so against the exact
 * dot, |err| <= 8 * 2^-11 * sum_k |x_k w_k| (3.9e-3 of the terms' size, at worst; random
 * roundings give ~sqrt(8) times less) plus the f32 sums' ~2^-24 each, plus underflow: f16
 * sums below 2^-14 round to multiples of 2^-24, an absolute error of at most 2^-25 a rounding
 * in units of 2^12 * scale2, at most cols * scale2 * 2^-13 in all. That floor matters only for
 * rows whose block scales are tiny against the matrix's (E4M3 subnormal scales): such rows
 * keep less relative precision here than on WMMA's f32 sums and the dot kernel's f32 chains
 * (SM70_NVFP4_VARIANT=5: the dot kernel at n = 1, WMMA at n = 2).
 * Overflow: one product never overflows (|w| <= 0.66, |x| <= 65504); a block half of 8 terms
 * overflows only if its terms pass 65504 together (x above ~12000 on all of them at the
 * largest weights).
 *
 * Nothing here needs FP4/FP8 hardware: bit operations and f16/f32 arithmetic of SM70.
 */
#include <limits.h>
#include <stdint.h>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/nvfp4_words.h"
#include "kernels/cuda/pdl.h"

#define FP4S_WARPS 4          /* warps a block */
/* blocks an SM the launch bounds ask for: 8 (<= 64 registers) at one row of x, 6 (<= 80)
 * at two to four, where 64 spill */
#define FP4S_MINB(NR) ((NR) == 1 ? 8 : 6)
/* steps loaded ahead a warp: 4 (2.3 KB) at one or two rows of x, 2 at three or four (their
 * registers) */
#define FP4S_PF(NR) ((NR) <= 2 ? 4 : 2)
#define FP4S_OUT 4096.0f      /* 2^12: the scale of the f16 products, undone on f32 sums */
#define FP4S_SPLIT_MAX 32     /* most chunks a tile */
#define FP4T_THREADS_MAX 512  /* the tile kernel's largest block (16 warps) */
#define FP4T_MINB 2           /* its blocks an SM at that size: <= 64 registers */
#define FP4S_RAMP 2           /* a task's start and end, in steps, for fp4s_split */

/* A lane's two block scales (low byte: its first 16 columns) as f16 pairs of e4m3 * 4,
 * exactly (the byte's low seven bits at f16 bits 7-13 are e4m3 * 2^-8, subnormals
 * included): lo for words 0-1 of its codes, hi for words 2-3. */
static __device__ __forceinline__ void fp4s_scales(uint32_t s16, __half2 *lo, __half2 *hi)
{
	const uint32_t spread = (s16 & 0xffu) | ((s16 & 0xff00u) << 8);
	const uint32_t bits = ((spread & 0x007f007fu) << 7) | ((spread & 0x00800080u) << 8);
	const __half2 t = __hmul2(u32_as_half2(bits), __float2half2_rn(1024.0f));

	*lo = __low2half2(t);
	*hi = __high2half2(t);
}

/* Weight loads that skip L1 (each byte is read once; kept out of L1 they do not push x out
 * of it), read-only. volatile: the callers guard them with the step range, and an asm the
 * compiler took for free of effects could be hoisted past that guard, past the end of W. */
static __device__ __forceinline__ uint4 fp4s_ld_codes(const uint4 *p)
{
	uint4 v;

	asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
		     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
		     : "l"(p));
	return v;
}

static __device__ __forceinline__ uint32_t fp4s_ld_scales(const uint16_t *p)
{
	unsigned short v;

	asm volatile("ld.global.nc.L1::no_allocate.u16 %0, [%1];" : "=h"(v) : "l"(p));
	return v;
}

/*
 * One step of a lane: its 32 columns (four words) of one row against NR rows of x at xk
 * (row i at xk + i * cols), each 16-column block summed in f16 pairs, then into acc[i] in
 * f32. EDGE: the step passes cols, and words at or past `left` columns read x as zero (the
 * arranged codes there are zero; a zero x keeps even an infinite x out of the sum).
 */
template <int NR, bool EDGE, bool XS>
static __device__ __forceinline__ void fp4s_step(uint4 w, uint32_t s16, const __half *xk,
						 int cols, int left, float acc[NR])
{
	__half2 tlo, thi, sum[NR][2];

	fp4s_scales(s16, &tlo, &thi);
#pragma unroll
	for (int q = 0; q < 4; q++) {
		const uint32_t word = q == 0 ? w.x : q == 1 ? w.y : q == 2 ? w.z : w.w;
		const __half2 t = q < 2 ? tlo : thi;
		__half2 v[4];

		fp4_unpack(word, v);
#pragma unroll
		for (int j = 0; j < 4; j++)
			v[j] = __hmul2(v[j], t);
#pragma unroll
		for (int i = 0; i < NR; i++) {
			uint4 xv = make_uint4(0, 0, 0, 0);
			__half2 *s = &sum[i][q >> 1];

			if (!EDGE || 8 * q < left)
				xv = XS ? *(const uint4 *)(xk + (size_t)i * cols + 8 * q) :
					  __ldg((const uint4 *)(xk + (size_t)i * cols + 8 * q));
			*s = (q & 1) ? __hfma2(v[0], u32_as_half2(xv.x), *s) :
				       __hmul2(v[0], u32_as_half2(xv.x));
			*s = __hfma2(v[1], u32_as_half2(xv.y), *s);
			*s = __hfma2(v[2], u32_as_half2(xv.z), *s);
			*s = __hfma2(v[3], u32_as_half2(xv.w), *s);
		}
	}
#pragma unroll
	for (int i = 0; i < NR; i++) {
#pragma unroll
		for (int b = 0; b < 2; b++) {
			const float2 f = __half22float2(sum[i][b]);

			acc[i] += f.x + f.y;
		}
	}
}

static __device__ __forceinline__ void fp4s_store(void *y, int y_f32, size_t at, float v)
{
	if (y_f32)
		((float *)y)[at] = v;
	else
		((__half *)y)[at] = __float2half_rn(v);
}

/* A lane's first PF steps of [s0, s1) into wr / sr (none when !live). */
template <int PF>
static __device__ __forceinline__ void fp4s_first(uint4 wr[PF], uint32_t sr[PF], const uint4 *cp,
						  const uint16_t *sp, int s0, int s1, bool live)
{
#pragma unroll
	for (int d = 0; d < PF; d++) {
		if (live && s0 + d < s1) {
			wr[d] = fp4s_ld_codes(cp + (size_t)(s0 + d) * 32);
			sr[d] = fp4s_ld_scales(sp + (size_t)(s0 + d) * 32);
		}
	}
}

/* The block's copy of x's NR rows (contiguous: NR * cols / 8 16-byte pieces) in xs; the
 * caller's barrier makes it visible. */
template <int NR>
static __device__ __forceinline__ void fp4s_stage_x(__half *xs, const __half *x, int cols)
{
	for (int e = threadIdx.x; e < NR * cols / 8; e += blockDim.x)
		((uint4 *)xs)[e] = __ldg((const uint4 *)x + e);
}

/*
 * A lane's steps [s, s1) of its tile (codes at cp, scales at sp, its x columns at xl), the
 * first PF already in wr / sr: each step multiplied into acc as it is used, and the step PF
 * ahead loaded into its place. full: the steps inside cols (the rest pass its end).
 */
template <int NR, int PF, bool XS>
static __device__ __forceinline__ void fp4s_walk(uint4 wr[PF], uint32_t sr[PF], const uint4 *cp,
						 const uint16_t *sp, const __half *xl, int s,
						 int s1, int full, int cols, int half, float acc[NR])
{
	for (; s < s1; s += PF) {
#pragma unroll
		for (int d = 0; d < PF; d++) {
			const int sd = s + d;

			if (sd >= s1)
				break;
			if (sd < full)
				fp4s_step<NR, false, XS>(wr[d], sr[d], xl + (size_t)sd * FP4_KS,
							 cols, 0, acc);
			else
				fp4s_step<NR, true, XS>(wr[d], sr[d], xl + (size_t)sd * FP4_KS,
							cols, cols - sd * FP4_KS - half * 32, acc);
			if (sd + PF < s1) {
				wr[d] = fp4s_ld_codes(cp + (size_t)(sd + PF) * 32);
				sr[d] = fp4s_ld_scales(sp + (size_t)(sd + PF) * 32);
			}
		}
	}
}

/*
 * Task blockIdx.x * FP4S_WARPS + warp: row tile task / split, chunk task % split of its
 * column steps. Lane l multiplies row l / 2 of the tile, columns 32 (l % 2) .. + 31 of each
 * step (the arrangement's lane unit), PF steps loaded ahead. out_scale is 2^12 * scale2;
 * a row's own scale2 takes its place when the weight has them.
 */
template <int NR, int PF, bool XS>
static __global__ void __launch_bounds__(FP4S_WARPS * 32, FP4S_MINB(NR))
	fp4_split_kernel(void *__restrict__ y, int y_f32, const __half *__restrict__ x,
			 const uint4 *__restrict__ codes, const uint16_t *__restrict__ scales,
			 int rows, int cols, int split, float out_scale,
			 const float *__restrict__ row_scale2, float *__restrict__ part,
			 int32_t *__restrict__ count)
{
	extern __shared__ __align__(16) __half fp4s_xs[]; /* XS: the block's copy of x */
	const int lane = threadIdx.x & 31, half = lane & 1;
	const int task = (int)blockIdx.x * FP4S_WARPS + (int)(threadIdx.x >> 5);
	const int n_tiles = (rows + 15) / 16, nsteps = (cols + FP4_KS - 1) / FP4_KS;
	const int tile = task / split, chunk = task - tile * split, full = cols / FP4_KS;
	const int s0 = chunk * nsteps / split, s1 = (chunk + 1) * nsteps / split;
	const uint4 *cp = codes + (size_t)tile * nsteps * 32 + lane;
	const uint16_t *sp = scales + (size_t)tile * nsteps * 32 + lane;
	const __half *xl = (XS ? fp4s_xs : x) + half * 32;
	/* the grid's last block may have warps past the last task (XS: they stage x too) */
	const bool live = tile < n_tiles;
	uint4 wr[PF];
	uint32_t sr[PF];
	float acc[NR];

	if (!XS && !live)
		return;
	fp4s_first<PF>(wr, sr, cp, sp, s0, s1, live);
#pragma unroll
	for (int i = 0; i < NR; i++)
		acc[i] = 0.0f;
	/* codes and scales are weights (pdl.h): x waits for the op ahead */
	sm70__pdl_enter();
	if (XS) {
		fp4s_stage_x<NR>(fp4s_xs, x, cols);
		__syncthreads();
		if (!live)
			return;
	}
	fp4s_walk<NR, PF, XS>(wr, sr, cp, sp, xl, s0, s1, full, cols, half, acc);

	/* the lane pair's halves of a row, then the row's sum or the task's slot */
	{
		const int rr = lane >> 1, r = tile * 16 + rr;
		float v[NR];
		int last = 0;

#pragma unroll
		for (int i = 0; i < NR; i++)
			v[i] = acc[i] + __shfl_xor_sync(0xffffffffu, acc[i], 1);
		if (split == 1) {
			if (!half && r < rows) {
				const float sc = row_scale2 ? FP4S_OUT * row_scale2[r] : out_scale;

#pragma unroll
				for (int i = 0; i < NR; i++)
					fp4s_store(y, y_f32, (size_t)i * rows + r, v[i] * sc);
			}
			return;
		}
		if (!half) {
			float *mine = part + (size_t)task * 16 * NR;

#pragma unroll
			for (int i = 0; i < NR; i++)
				mine[i * 16 + rr] = v[i];
		}
		__threadfence();
		__syncwarp();
		if (lane == 0)
			last = atomicAdd(&count[tile], 1) == split - 1;
		if (!__shfl_sync(0xffffffffu, last, 0))
			return;
		__threadfence();
		for (int idx = lane; idx < 16 * NR; idx += 32) {
			const float *p = part + (size_t)tile * split * 16 * NR + idx;
			const int r2 = tile * 16 + (idx & 15);
			float sum = 0.0f;

			/* eight slots' loads in flight at once, added in chunk order (a slot
			 * past split adds 0, which leaves the sum as it is) */
			for (int z0 = 0; z0 < split; z0 += 8) {
				float v8[8];

#pragma unroll
				for (int j = 0; j < 8; j++)
					v8[j] = z0 + j < split ?
							__ldcg(p + (size_t)(z0 + j) * 16 * NR) :
							0.0f;
#pragma unroll
				for (int j = 0; j < 8; j++)
					sum += v8[j];
			}
			if (r2 < rows)
				fp4s_store(y, y_f32, (size_t)(idx >> 4) * rows + r2,
					   sum * (row_scale2 ? FP4S_OUT * row_scale2[r2] : out_scale));
		}
		if (lane == 0)
			count[tile] = 0;
	}
}

/*
 * The chunks a row tile's columns split into (1: none). Tasks run in waves of `slots`
 * resident warps; a wave takes about its chunk's steps plus FP4S_RAMP steps of start and
 * finish, so the count with the fewest wave-steps wins (the smallest on a tie): the 8B qkv
 * shape's 384 tiles take 11 chunks of 6 steps, one wave of 4224 warps on an H200, where one
 * warp a tile would leave 90% of the warps idle. Splitting needs the backend's scratch and
 * counters, which only the main stream uses, and room in them.
 */
static int fp4s_split(const struct sm70__cuda *c, int n_tiles, int nsteps, int slots, int nr)
{
	long best_cost = LONG_MAX;
	int best = 1;

	if (!c->gemv_part || !c->gemv_count || c->stream != c->main ||
	    n_tiles > SM70__CUDA_GEMV_TILES || slots <= 0)
		return 1;
	if (c->nvfp4_split > 0) /* SM70_NVFP4_SPLIT, within the scratch */
		return c->nvfp4_split <= nsteps &&
				       (size_t)n_tiles * c->nvfp4_split * 16 * nr * sizeof(float) <=
					       SM70__CUDA_GEMV_PART_BYTES ?
			       c->nvfp4_split :
			       1;
	for (int sp = 1; sp <= nsteps && sp <= FP4S_SPLIT_MAX; sp++) {
		const long tasks = (long)n_tiles * sp;
		const long cost = (tasks + slots - 1) / slots * ((nsteps + sp - 1) / sp + FP4S_RAMP);

		if (sp > 1 && (size_t)tasks * 16 * nr * sizeof(float) > SM70__CUDA_GEMV_PART_BYTES)
			break;
		if (cost < best_cost) {
			best_cost = cost;
			best = sp;
		}
	}
	return best;
}

template <int NR, bool XS>
static void fp4s_launch(struct sm70__cuda *c, void *y, int y_f32, const __half *x,
			const struct sm70_weight *w)
{
	const int n_tiles = (w->rows + 15) / 16, nsteps = (w->cols + FP4_KS - 1) / FP4_KS;
	const size_t smem = XS ? (size_t)NR * w->cols * sizeof(__half) : 0;
	const int res = sm70__cuda_resident(c, (const void *)fp4_split_kernel<NR, FP4S_PF(NR), XS>,
					    FP4S_WARPS * 32, smem);
	int split;
	long tasks;

	if (!res)
		return;
	split = fp4s_split(c, n_tiles, nsteps, res * FP4S_WARPS * c->n_sm, NR);
	tasks = (long)n_tiles * split;
	sm70__launch_pdl(c, SM70__PDL_PREFETCH, fp4_split_kernel<NR, FP4S_PF(NR), XS>,
			 dim3((unsigned)((tasks + FP4S_WARPS - 1) / FP4S_WARPS)),
			 dim3(FP4S_WARPS * 32), smem, y, y_f32, x, (const uint4 *)w->data,
			 (const uint16_t *)w->scale, w->rows, w->cols, split, FP4S_OUT * w->scale2,
			 w->row_scale2, c->gemv_part, c->gemv_count);
}

/*
 * The tile kernel (variant 8, the default at n = 1-2): the dot kernel's structure
 * (matmul_nvfp4.cu) with this file's f16 arithmetic, for n = 1-2. One block a row tile;
 * its W warps (blockDim.x / 32) split the tile's steps; x in shared memory behind the warps'
 * row sums, which meet there and are added in warp order: no global scratch, no atomics, no
 * fence. The split kernel's n = 1 tasks are one short burst of loads each and end in three
 * L2 round trips (its partial, the counter, the other partials); this keeps the burst but
 * ends in a block barrier. Measured on an H200 (8B shapes, docs/PERFORMANCE.md, "NVFP4: the
 * tile kernel becomes the B1-B2 default"): at n = 2 faster than the split kernel on every
 * shape (o 7.24 against 9.54 us, down 15.28 against 19.70); at n = 1, against the dot
 * kernel, 13% faster on lm_head and 10-16% slower on qkv and o in the op bench, yet 4.1%
 * faster end to end.
 */
template <int NR, int PF>
static __global__ void __launch_bounds__(FP4T_THREADS_MAX, FP4T_MINB)
	fp4_tile_kernel(void *__restrict__ y, int y_f32, const __half *__restrict__ x,
			const uint4 *__restrict__ codes, const uint16_t *__restrict__ scales,
			int rows, int cols, float out_scale, const float *__restrict__ row_scale2)
{
	extern __shared__ __align__(16) unsigned char fp4t_smem[];
	const int lane = threadIdx.x & 31, half = lane & 1;
	const int warp = (int)(threadIdx.x >> 5), nw = (int)(blockDim.x >> 5);
	const int tile = (int)blockIdx.x, nsteps = (cols + FP4_KS - 1) / FP4_KS;
	const int s0 = warp * nsteps / nw, s1 = (warp + 1) * nsteps / nw, full = cols / FP4_KS;
	const uint4 *cp = codes + (size_t)tile * nsteps * 32 + lane;
	const uint16_t *sp = scales + (size_t)tile * nsteps * 32 + lane;
	float *red = (float *)fp4t_smem; /* [nw][NR][16] row sums */
	__half *xs = (__half *)(fp4t_smem + (size_t)nw * NR * 16 * sizeof(float));
	uint4 wr[PF];
	uint32_t sr[PF];
	float acc[NR];

	fp4s_first<PF>(wr, sr, cp, sp, s0, s1, true);
#pragma unroll
	for (int i = 0; i < NR; i++)
		acc[i] = 0.0f;
	/* codes and scales are weights (pdl.h): x waits for the op ahead */
	sm70__pdl_enter();
	fp4s_stage_x<NR>(xs, x, cols);
	__syncthreads();
	fp4s_walk<NR, PF, true>(wr, sr, cp, sp, xs + half * 32, s0, s1, full, cols, half, acc);
#pragma unroll
	for (int i = 0; i < NR; i++) {
		const float v = acc[i] + __shfl_xor_sync(0xffffffffu, acc[i], 1);

		if (!half)
			red[(warp * NR + i) * 16 + (lane >> 1)] = v;
	}
	__syncthreads();
	for (int idx = threadIdx.x; idx < 16 * NR; idx += blockDim.x) {
		const int r = tile * 16 + (idx & 15);
		float sum = 0.0f;

		for (int v = 0; v < nw; v++)
			sum += red[v * NR * 16 + idx];
		if (r < rows)
			fp4s_store(y, y_f32, (size_t)(idx >> 4) * rows + r,
				   sum * (row_scale2 ? FP4S_OUT * row_scale2[r] : out_scale));
	}
}

/* Warps a block of the tile kernel: 16, 8 or 4, the most that keeps the tiles' warps within
 * one wave of resident warps (32 an SM at 64 registers) and every warp at four steps or
 * more; 4 past one wave. */
static int fp4t_warps(const struct sm70__cuda *c, int n_tiles, int nsteps)
{
	int nw = 16;

	while (nw > 4 && ((long)n_tiles * nw > 32L * c->n_sm || nsteps / nw < 4))
		nw /= 2;
	return nw;
}

template <int NR>
static int fp4t_launch(struct sm70__cuda *c, void *y, int y_f32, const __half *x,
		       const struct sm70_weight *w)
{
	const int n_tiles = (w->rows + 15) / 16, nsteps = (w->cols + FP4_KS - 1) / FP4_KS;
	const int nw = fp4t_warps(c, n_tiles, nsteps);
	const size_t smem = (size_t)nw * NR * 16 * sizeof(float) + (size_t)NR * w->cols * 2;

	if (smem > c->smem_optin)
		return 0;
	if (smem > 48 * 1024 &&
	    sm70__cuda_smem_optin(c, (const void *)fp4_tile_kernel<NR, FP4S_PF(NR)>))
		return 1;
	sm70__launch_pdl(c, SM70__PDL_PREFETCH, fp4_tile_kernel<NR, FP4S_PF(NR)>,
			 dim3((unsigned)n_tiles), dim3((unsigned)nw * 32), smem, y, y_f32, x,
			 (const uint4 *)w->data, (const uint16_t *)w->scale, w->rows, w->cols,
			 FP4S_OUT * w->scale2, w->row_scale2);
	return 1;
}

int sm70__cuda_fp4_tile(struct sm70__cuda *c, void *y, int y_f32, const __half *x,
			const struct sm70_weight *w, int n)
{
	if ((uintptr_t)x & 15)
		return 0;
	if (n == 1)
		return fp4t_launch<1>(c, y, y_f32, x, w);
	if (n == 2)
		return fp4t_launch<2>(c, y, y_f32, x, w);
	return 0;
}

int sm70__cuda_fp4_split(struct sm70__cuda *c, void *y, int y_f32, const __half *x,
			 const struct sm70_weight *w, int n, int xs)
{
	if (((uintptr_t)x & 15) || n < 1 || n > FP4S_ROWS_MAX)
		return 0;
	/* x in shared memory where a block's copy fits */
	if (xs && (size_t)n * w->cols * sizeof(__half) > c->smem_optin)
		xs = 0;
	switch (n + (xs ? 4 : 0)) {
	case 1: fp4s_launch<1, false>(c, y, y_f32, x, w); break;
	case 2: fp4s_launch<2, false>(c, y, y_f32, x, w); break;
	case 3: fp4s_launch<3, false>(c, y, y_f32, x, w); break;
	case 4: fp4s_launch<4, false>(c, y, y_f32, x, w); break;
	case 5: fp4s_launch<1, true>(c, y, y_f32, x, w); break;
	case 6: fp4s_launch<2, true>(c, y, y_f32, x, w); break;
	case 7: fp4s_launch<3, true>(c, y, y_f32, x, w); break;
	case 8: fp4s_launch<4, true>(c, y, y_f32, x, w); break;
	}
	return 1;
}
