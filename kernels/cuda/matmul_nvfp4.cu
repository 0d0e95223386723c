/*
 * matmul_nvfp4.cu - the CUDA matmul op on NVFP4 weights (W4A16): y[n, rows] = x[n, cols]
 * W^T, x f16, y f16 or f32, fp32 accumulation; and the backend's prepare_weight, which
 * rearranges ModelOpt's layout for the kernels. Contract: kernels/backend.h (struct
 * sm70_weight, matmul, prepare_weight).
 *
 * Arrangement (prepare_weight), for 16-byte coalesced loads in the order both kernels read:
 * rows in tiles of 16, columns in steps of 64. Tile t, step s is 32 lanes' 16 bytes
 * (512 contiguous bytes): lane l holds row 16t + l / 2, columns 64s + 32 (l % 2) .. + 31,
 * as four 32-bit words of 8 columns each. Steps follow each other within a tile, tiles
 * each other: data is [tiles][steps][32][16 bytes]. The scales are [tiles][steps][32]
 * uint16, lane l's two block scales (columns +0..15 in the low byte, +16..31 in the high),
 * one coalesced 64-byte request a warp step: the stream is a ninth of the bytes. Rows and
 * columns past the matrix are zero codes and zero scales. Within a word, element e's bits
 * sit where sm70_fp4_bit_at says (kernels/nvfp4_arrange.h, which makes the arrangement): pair p = (2p, 2p + 1)'s magnitudes
 * rotated by 3p from f16 bits 9-11 / 25-27 and its signs by 7, 8, 6, 9 from bits 15 / 31,
 * so that fp4_unpack yields the four f16 pairs in 11 integer instructions a word (the
 * nibble order before it took 15; no placement with one rotation a pair exists, and an
 * exhaustive search over rotations finds none cheaper than 11).
 *
 * Numerics. A code's magnitude bits at f16 bits 9-11 and its sign at 15 are the f16
 * e2m1 * 2^-14, exactly (exponent 0 lands on f16 subnormals the same way).
 * - WMMA path: an E4M3 byte's low seven bits at f16 bits 7-13 are e4m3 * 2^-8, exactly;
 *   times 2^15 the block scale t = e4m3 * 2^7 (at most 57344). Their product, one HMUL2
 *   per two elements, is e2m1 * e4m3 * 2^-7, exact in f16: an integer of at most 8 bits
 *   times 2^-17 or more, at most 21. So the tensor cores (WMMA 16x16x16, f16 in, f32
 *   accumulate: SM70) see W up to the power of two and the per-matrix factor 128 * scale2,
 *   applied to each f32 sum (128 * row_scale2[r] on row r when the weight has per-row
 *   scales).
 * - Dot path: each e2m1 * 2^-14 goes to f32 (HADD2.F32, exact), x to f32 (exact), and
 *   their product is exact inside the FFMA (2 significant bits times 11). A chain of 8
 *   columns sums in f32, the two chains of a 16-column block are added, and the block sum
 *   times the block's scale (a table of e4m3 * 2^14 in f32, exact) enters the lane's f32
 *   sum in one FFMA; the sums of the lane pair and of the 8 warps are added in f32 in a
 *   fixed order, then times scale2 (row_scale2[r]). Nothing is rounded to f16 before the
 *   output: every term x_k w_k is exact (the chain's first product, an FMUL, too) and
 *   passes through at most D f32 roundings, D = 7 (chain) + 1 (chain pair) + 2 S (the
 *   lane's FFMAs over its S steps, S = ceil(steps / 8)) + 1 (lane pair) + 7 (warps) + 1
 *   (scale2) = 17 + 2 S, so |y - x W^T| <= D 2^-24 sum_k |x_k w_k| (at K = 4096: S = 8,
 *   D = 33, 2.0e-6 of sum |x w|; random rounding makes it
 *   ~sqrt(D) times smaller in practice), the same form as the WMMA path's f32
 *   accumulation; an f16 y adds its own rounding, 2^-11 of |y|. No f16 intermediate means
 *   no underflow either: the smallest nonzero term (0.5 * 2^-9 * 2^-24) is an f32 normal,
 *   so rows of tiny scales keep their full relative precision.
 * Nothing here needs FP4/FP8 hardware: bit operations, f16 and f32 arithmetic only.
 *
 * Kernels, by batch size (SM70_NVFP4_VARIANT overrides the choice, see below; by default
 * the tile kernel of matmul_nvfp4_split.cu at n = 1-2, WMMA from 3; the two below at n <= 4
 * are the fallbacks and the path back):
 * - n <= 4: fp4_dot_kernel, no tensor cores. A block takes T row tiles (T = 2 on matrices
 *   tall enough to still give two blocks an SM, else 1) and its 8 warps split the column
 *   steps, as below; lane l multiplies its 32 columns of row l / 2 of
 *   each tile, T x PF lane units (T x PF x 528 bytes a warp, 4.2 KB at B1-B2) loaded
 *   ahead in registers. x goes to shared memory once a block in f32 (n x cols x 4.5
 *   bytes: a half step is 36 floats, so the two column halves a warp reads at once sit 4
 *   banks apart), zero past cols, staged while the first weight loads are in flight;
 *   each x value read serves T tiles. It is used where that x fits FP4_DOT_SMEM_MAX (and
 *   the device's block limit); past it (down_proj 12288 at n >= 3 on an H200, n >= 2 on a
 *   V100) WMMA runs.
 * - n > 4 (and the fallback above): fp4_gemv_kernel (WMMA). A block takes MT row tiles
 *   (MT = 2 on matrices tall enough to still give two blocks an SM, else 1); its 8 warps
 *   split the column steps, each streams its steps PF ahead in registers, decodes the
 *   codes into its own shared stage with the x tile (n rows padded to 16 with zeros),
 *   multiplies there, and the block adds the warps' partial tiles at the end, as
 *   matmul.cu's tensor-core GEMV does. Each weight byte is read once per launch for all
 *   of its rows of x. Unchanged from before but for the 11-instruction decode of the new
 *   word placement (4 integer instructions a word fewer, the same loads and stages).
 *
 * Performance reasoning (dot kernel, H200). Decode is memory-bound when the SM can issue
 * the work of its share of the bytes: 4.6 TB/s over 132 SMs at ~1.9 GHz is 18 bytes a
 * cycle an SM, 32 weights at 0.5625 bytes a weight; an SM issues 4 warp instructions a
 * cycle (1 a sub-partition), its integer pipe half that. One warp step of one tile (1024
 * weights, 16 rows x 64 columns) costs, counted in the sm_90 SASS at B1, T = 2: 32
 * HADD2.F32 (one a weight: the exact f16-to-f32 step), 32 FFMA/FMUL, 46 LOP3/SHF (44 the
 * unpack, 2 the scale index), 2 FADD + 2 FFMA (block sums times scales), 2 LDS (scales)
 * + 4 LDS.128 (x, 8 a step shared by the T tiles), 1 + 1 LDG and ~10 of addressing and
 * loop: 132.8 warp instructions (138 at T = 1), 4.1 a weight a lane. A sub-partition
 * issues them in 133 cycles: 4 x 1024 / 133 = 31 weights a cycle an SM, ~97% of 4.6 TB/s
 * at 1.9 GHz if issue never stalls; the integer pipe needs ~100 of those cycles. So B1
 * is just memory-bound, with no margin for stalls: expect ~60-75% of read bandwidth on
 * the tall shapes (lm_head, gate_up; the HFMA2 kernel of nvfp4-f, at 2.9 instructions a
 * weight, measured 67-71% on lm_head, so the memory side, not issue, was its limit),
 * against 40-47% for WMMA, and less on 6144 / 4096-row shapes where a launch is ~3 us and
 * its ramp and tail weigh. Each further row of x adds 32 FFMA/FMUL, 2 FADD, 2 FFMA and 4
 * LDS.128 (T = 2), counted: B2 173 instructions a tile step (~74% of the bytes' rate at
 * full issue), B3 222, B4 263 (~49%): there issue, not memory, bounds it, near the WMMA
 * path's figure; the variants let a run pick the crossover. The SM's one load pipe: x
 * costs 4 bytes a weight and row of x over T, and shared memory returns one register a
 * lane a cycle (LDS.128: 4 cycles a warp, 2 where lanes n and n ^ 2 share addresses, as
 * here), so a tile step takes 16 (8) of its cycles for x at B1, T = 2, +4 for codes and
 * ~3 for scales, against 33 of issue (133 over 4 sub-partitions); 32 (16) at T = 1
 * against 35; 64 (32) at B4, T = 2 against 66: near the edge where lanes do not pair.
 * Alternatives weighed: f16 products converted before the sum (HMUL2 + 2 HADD2.F32 + 2
 * FADD a pair and row of x: 5 against 2 FFMA + 2 shared HADD2.F32, and a rounding);
 * decoding straight to f32 bits (2 integer instructions an element: 64 a step on the
 * half-rate integer pipe, 128 cycles, more than the 133 of issue saves); x from L1 in f16
 * (32 more HADD2.F32 a step and row of x, shared by the T tiles only); a byte-to-float2
 * table in shared memory (16 LDS.64 a step at random banks: shared memory returns one
 * register a lane a cycle, which would bind at twice the bytes' rate).
 * Registers: 106-126 (B1-B4), no spills, two blocks (16 warps) an SM: 16 x 4.2 KB = 67 KB
 * of weight loads in flight an SM, above the ~40 KB that ~4.6 TB/s at ~1.1 us of loaded
 * latency needs. A V100 (0.9 TB/s, 80 SMs, FP32 and integer pipes 16 lanes wide: ~140
 * cycles a tile step on its FP32 pipe) needs ~13 weights a cycle an SM and gets ~29:
 * memory-bound with room to spare.
 *
 * Variants (SM70_NVFP4_VARIANT, read at backend creation, for timing the kernels against
 * each other; 0 when unset): 0 auto (the tile kernel at n = 1-2, as 8, where its x fits
 * its shared memory, else the dot kernel as in 5 at n = 1 and the split kernel as in 7 at
 * n = 2; WMMA from n = 3), 1 WMMA at every n, 2 the dot kernel with
 * T = 1 always, 3 the dot kernel with T = 2 always, 4 the dot kernel at n = 1 held to 3
 * blocks an SM (launch bounds: at most 85 registers, half the steps ahead), which trades
 * bytes in flight for warps against the issue-bound chain ncu showed, and WMMA from n = 2;
 * 5 as 4 but three blocks an SM only where that measured faster (fp4_dot3_pays: more
 * blocks than two an SM hold, and three fit in shared memory). 2 and 3 change only n <= 4 (and keep the shared-memory
 * fallback). 6 and 7: the split kernel (matmul_nvfp4_split.cu: f16 block sums, one warp a
 * row tile's column chunk) at n <= 4, reading x through L1 (6) or from a block's copy in
 * shared memory (7); WMMA past that. 8: the tile kernel of the same file (the dot kernel's
 * block structure with the f16 arithmetic) at n <= 2. SM70_NVFP4_VARIANT=5 is the path back
 * from the f16 block sums: the dot kernel at n = 1, WMMA from n = 2.
 *
 * Other paths:
 * - n > 16: the kernels over x in slices of 16 rows (W read once a slice).
 * - batch invariance (the backend's batch_invariant): WMMA at every n, so a row's bits do
 *   not depend on how many rows share the call.
 * - SM70_NVFP4=reference (the named switch back): prepare_weight uploads ModelOpt's layout
 *   as is, and matmul runs nvfp4_ref_kernel on it, one thread an output, dequantising
 *   each element in f32 as the CPU does. SM70_MATMUL=reference, or an x not 16-byte
 *   aligned, runs that kernel on the arranged layout.
 *
 * Non-goals: prefill speed (n > 16 re-reads W every 16 rows); split-K (the grid is sized
 * by row tiles alone); NVFP4 in silu_matmul or the MoE experts.
 */
#include <mma.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/nvfp4_words.h"
#include "kernels/cuda/pdl.h"

#define FP4_LD (FP4_KS + 8) /* staged row stride in halves: rows 16 bytes apart in banks */
#define FP4_WARPS 8
#define FP4_PF 2           /* steps loaded ahead */
#define FP4_ROWS_MAX 16    /* rows of x a launch takes */
#define FP4_DOT_ROWS_MAX 4 /* rows of x the dot kernel takes */
#define FP4_DOT_SMEM_MAX (112 * 1024) /* the most shared memory a dot block asks for: two
                                        * blocks still fit an H200 SM */
#define FP4_XH 36          /* staged x floats a half step: 32 columns + 4 (a bank offset) */
#define FP4_XS (2 * FP4_XH) /* staged x floats a step, per row of x */

/* Shared memory of one warp: its decoded W tiles and the x tile, FP4_LD halves a row. */
template <int MT> struct fp4_stage {
	static constexpr size_t bytes = (size_t)(16 * MT + 16) * FP4_LD * sizeof(__half);
};

/* A lane's two block scales (low byte: its first 16 columns) as f16 pairs of
 * t = e4m3 * 2^7 each: lo covers words 0-1 of its codes, hi words 2-3. */
static __device__ __forceinline__ void fp4_scales(uint32_t s16, __half2 *lo, __half2 *hi)
{
	const uint32_t spread = (s16 & 0xffu) | ((s16 & 0xff00u) << 8);
	const uint32_t bits = ((spread & 0x007f007fu) << 7) | ((spread & 0x00800080u) << 8);
	const __half2 t = __hmul2(u32_as_half2(bits), __float2half2_rn(32768.0f));

	*lo = __low2half2(t);
	*hi = __high2half2(t);
}

/* Eight elements of one arranged word as four f16 pairs, each e2m1 * e4m3 * 2^-7. */
static __device__ __forceinline__ uint4 fp4_decode8(uint32_t w, __half2 t)
{
	__half2 v[4];
	uint4 r;

	fp4_unpack(w, v);
	r.x = half2_as_u32(__hmul2(v[0], t));
	r.y = half2_as_u32(__hmul2(v[1], t));
	r.z = half2_as_u32(__hmul2(v[2], t));
	r.w = half2_as_u32(__hmul2(v[3], t));
	return r;
}

/*
 * MT row tiles a block, NI = ceil(n / 4) x row groups loaded. Lane l decodes its 32
 * columns of row l / 2 of each tile; for x, as in matmul.cu, lane l loads 8 columns
 * (chunk l % 8) of rows l / 8 + 4 i.
 */
template <int MT, int NI>
static __global__ void __launch_bounds__(FP4_WARPS * 32, MT == 1 ? 2 : 1)
	fp4_gemv_kernel(void *__restrict__ y, int y_f32, const __half *__restrict__ x,
			const uint4 *__restrict__ codes, const uint16_t *__restrict__ scales,
			int rows, int cols, int n, float out_scale,
			const float *__restrict__ row_scale2)
{
	sm70__pdl_enter();
	using namespace nvcuda;
	extern __shared__ __align__(128) unsigned char fp4_smem[];
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	const int sub = lane >> 3, chunk = lane & 7;
	const int n_tiles = (rows + 15) / 16, t0 = blockIdx.x * MT;
	const int nsteps = (cols + FP4_KS - 1) / FP4_KS;
	const int s0 = warp * nsteps / FP4_WARPS, s1 = (warp + 1) * nsteps / FP4_WARPS;
	__half *ws = (__half *)(fp4_smem + warp * fp4_stage<MT>::bytes);
	__half *xs = ws + 16 * MT * FP4_LD;
	__half *wdst = ws + (lane >> 1) * FP4_LD + (lane & 1) * 32; /* this lane's 32 columns */
	const uint4 *cp[MT];
	const uint16_t *sp[MT];
	wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[MT];
	uint4 wr[FP4_PF][MT], xr[FP4_PF][NI];
	uint32_t sr[FP4_PF][MT];

#pragma unroll
	for (int m = 0; m < MT; m++) {
		/* a tile past the end reads the last tile (valid) and is never stored */
		const int t = t0 + m < n_tiles ? t0 + m : n_tiles - 1;

		cp[m] = codes + (size_t)t * nsteps * 32 + lane;
		sp[m] = scales + (size_t)t * nsteps * 32 + lane;
		wmma::fill_fragment(acc[m], 0.0f);
	}
	/* x rows this warp never loads stay zero */
	for (int i = lane; i < (16 - 4 * NI) * FP4_LD / 8; i += 32)
		((uint4 *)(xs + 4 * NI * FP4_LD))[i] = make_uint4(0, 0, 0, 0);

	/* Loads of step s into register slot d; x columns past the end and x rows past n
	 * read as zero (cols is a multiple of 16, so a chunk of 8 is all in or all out). */
#define FP4_ISSUE(d, s)                                                                  \
	do {                                                                             \
		const int k_ = (s) * FP4_KS + chunk * 8;                                 \
		_Pragma("unroll") for (int m = 0; m < MT; m++) {                         \
			wr[d][m] = __ldg(cp[m] + (size_t)(s) * 32);                      \
			sr[d][m] = __ldg(sp[m] + (size_t)(s) * 32);                      \
		}                                                                        \
		_Pragma("unroll") for (int i = 0; i < NI; i++) {                         \
			const int j_ = sub + 4 * i;                                      \
			xr[d][i] = k_ < cols && j_ < n ?                                 \
					   __ldg((const uint4 *)(x + (size_t)j_ * cols + k_)) : \
					   make_uint4(0, 0, 0, 0);                       \
		}                                                                        \
	} while (0)

#pragma unroll
	for (int d = 0; d < FP4_PF; d++)
		if (s0 + d < s1)
			FP4_ISSUE(d, s0 + d);
	for (int s = s0; s < s1; s += FP4_PF) {
#pragma unroll
		for (int d = 0; d < FP4_PF; d++) {
			if (s + d >= s1)
				break;
#pragma unroll
			for (int m = 0; m < MT; m++) {
				__half2 lo, hi;
				uint4 *dst = (uint4 *)(wdst + m * 16 * FP4_LD);

				fp4_scales(sr[d][m], &lo, &hi);
				dst[0] = fp4_decode8(wr[d][m].x, lo);
				dst[1] = fp4_decode8(wr[d][m].y, lo);
				dst[2] = fp4_decode8(wr[d][m].z, hi);
				dst[3] = fp4_decode8(wr[d][m].w, hi);
			}
#pragma unroll
			for (int i = 0; i < NI; i++)
				*(uint4 *)(xs + (sub + 4 * i) * FP4_LD + chunk * 8) = xr[d][i];
			if (s + d + FP4_PF < s1)
				FP4_ISSUE(d, s + d + FP4_PF);
			__syncwarp();
#pragma unroll
			for (int kk = 0; kk < FP4_KS / 16; kk++) {
				wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major>
					b;

				wmma::load_matrix_sync(b, xs + kk * 16, FP4_LD);
#pragma unroll
				for (int m = 0; m < MT; m++) {
					wmma::fragment<wmma::matrix_a, 16, 16, 16, __half,
						       wmma::row_major> af;

					wmma::load_matrix_sync(af, ws + m * 16 * FP4_LD + kk * 16,
							       FP4_LD);
					wmma::mma_sync(acc[m], af, b, acc[m]);
				}
			}
			__syncwarp(); /* the stage is free for the next step */
		}
	}
#undef FP4_ISSUE

	/* Each warp's partial tiles (rows x 16 x columns, row-major) into its own stage, then
	 * the block adds them and applies 128 * scale2. */
	{
		float *red = (float *)ws;

#pragma unroll
		for (int m = 0; m < MT; m++)
			wmma::store_matrix_sync(red + m * 256, acc[m], 16, wmma::mem_row_major);
	}
	__syncthreads();
	for (int idx = threadIdx.x; idx < n * 16 * MT; idx += FP4_WARPS * 32) {
		const int j = idx / (16 * MT), rr = idx - j * (16 * MT);
		const int r = t0 * 16 + rr;
		float sum = 0.0f;

		if (r >= rows)
			continue;
#pragma unroll
		for (int v = 0; v < FP4_WARPS; v++)
			sum += ((const float *)(fp4_smem + v * fp4_stage<MT>::bytes))[rr * 16 + j];
		/* out_scale is 128 * scale2; a row's own scale2 takes its place (exact: a
		 * power of two times it) */
		sum *= row_scale2 ? 128.0f * row_scale2[r] : out_scale;
		if (y_f32)
			((float *)y)[(size_t)j * rows + r] = sum;
		else
			((__half *)y)[(size_t)j * rows + r] = __float2half_rn(sum);
	}
}

/* ---- the dot kernel (n <= 4) ------------------------------------------------------ */

/* An E4M3 byte's value in f32, exactly. */
static __device__ __forceinline__ float fp4_e4m3(uint32_t b)
{
	const uint32_t se = (b >> 3) & 15, sm = b & 7;
	const float v = se ? __uint_as_float(((se + 120) << 23) | (sm << 20)) :
			     (float)sm * 0x1p-9f;

	return (b & 0x80) ? -v : v;
}

/* Dynamic shared memory of a dot block: the scale table (256 f32), the warps' partial
 * sums (FP4_WARPS x t tiles x n rows x 16) and n rows of x in f32, FP4_XS floats a step. */
static size_t fp4_dot_smem(int n, int t, int cols)
{
	const size_t nsteps = (size_t)(cols + FP4_KS - 1) / FP4_KS;

	return (256 + (size_t)FP4_WARPS * t * n * 16 + (size_t)n * nsteps * FP4_XS) *
	       sizeof(float);
}

/*
 * NR rows of x, T row tiles a block, PF steps of W loaded ahead (T x PF lane units in
 * flight). The block's 8 warps split the column steps as the WMMA kernel's do; lane l
 * multiplies its 32 columns of row l / 2 of each tile. Per 16-column block: each element
 * decoded to f32 (fp4_unpack, then two HADD2.F32 a pair), multiplied by x in f32 (an exact
 * product in the FFMA) and summed in f32, 8 columns a chain; the two chains' sum times the
 * block's scale (tab: e4m3 * 2^14, exact) enters the lane's f32 sum. Then the lane pair's
 * sums meet by a shuffle and the warps' in shared memory, in a fixed order.
 */
template <int NR, int T, int PF, int MINB>
static __global__ void __launch_bounds__(FP4_WARPS * 32, MINB)
	fp4_dot_kernel(void *__restrict__ y, int y_f32, const __half *__restrict__ x,
		       const uint4 *__restrict__ codes, const uint16_t *__restrict__ scales,
		       int rows, int cols, float scale2, const float *__restrict__ row_scale2)
{
	extern __shared__ __align__(16) float fp4_dot_smem_f[];
	float *tab = fp4_dot_smem_f, *red = tab + 256, *xs = red + FP4_WARPS * T * NR * 16;
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, half = lane & 1;
	const int n_tiles = (rows + 15) / 16, t0 = blockIdx.x * T;
	const int nsteps = (cols + FP4_KS - 1) / FP4_KS, xrow = nsteps * FP4_XS;
	const int s0 = warp * nsteps / FP4_WARPS, s1 = (warp + 1) * nsteps / FP4_WARPS;
	const uint4 *cp[T];
	const uint16_t *sp[T];
	const float *xl[NR];
	uint4 wr[PF][T];
	uint32_t sr[PF][T];
	float acc[T][NR];

#pragma unroll
	for (int m = 0; m < T; m++) {
		/* a tile past the end reads the last tile (valid) and is never stored */
		const int t = t0 + m < n_tiles ? t0 + m : n_tiles - 1;

		cp[m] = codes + (size_t)t * nsteps * 32 + lane;
		sp[m] = scales + (size_t)t * nsteps * 32 + lane;
#pragma unroll
		for (int i = 0; i < NR; i++)
			acc[m][i] = 0.0f;
	}
#pragma unroll
	for (int i = 0; i < NR; i++)
		xl[i] = xs + i * xrow + half * FP4_XH;

#define FP4_DOT_ISSUE(d, s)                                                              \
	do {                                                                             \
		_Pragma("unroll") for (int m = 0; m < T; m++) {                          \
			wr[d][m] = __ldg(cp[m] + (size_t)(s) * 32);                      \
			sr[d][m] = __ldg(sp[m] + (size_t)(s) * 32);                      \
		}                                                                        \
	} while (0)

	/* the weight loads go out first; x and the table are staged under their latency */
#pragma unroll
	for (int d = 0; d < PF; d++)
		if (s0 + d < s1)
			FP4_DOT_ISSUE(d, s0 + d);
	for (int b = threadIdx.x; b < 256; b += FP4_WARPS * 32)
		tab[b] = fp4_e4m3((uint32_t)b) * 16384.0f;
	/* codes and scales are weights (pdl.h): x waits for the op ahead */
	sm70__pdl_enter();
	/* x row i, columns 8c .. 8c + 7 (zeros past cols: the padded columns' codes are zero
	 * codes, and zero x keeps them out of the sums even against an infinite x) */
	for (int e = threadIdx.x; e < NR * nsteps * 8; e += FP4_WARPS * 32) {
		const int i = e / (nsteps * 8), k = 8 * (e - i * nsteps * 8);
		const uint4 v = k < cols ? __ldg((const uint4 *)(x + (size_t)i * cols + k)) :
					   make_uint4(0, 0, 0, 0);
		const float2 a = __half22float2(u32_as_half2(v.x)),
			     b = __half22float2(u32_as_half2(v.y)),
			     c = __half22float2(u32_as_half2(v.z)),
			     d = __half22float2(u32_as_half2(v.w));
		float4 *dst = (float4 *)(xs + i * xrow + (k / 32) * FP4_XH + k % 32);

		dst[0] = make_float4(a.x, a.y, b.x, b.y);
		dst[1] = make_float4(c.x, c.y, d.x, d.y);
	}
	__syncthreads();

	for (int s = s0; s < s1; s += PF) {
#pragma unroll
		for (int d = 0; d < PF; d++) {
			if (s + d >= s1)
				break;
			const int xo = (s + d) * FP4_XS;
			float sc[T][2];

#pragma unroll
			for (int m = 0; m < T; m++) {
				sc[m][0] = tab[sr[d][m] & 0xffu];
				sc[m][1] = tab[sr[d][m] >> 8];
			}
#pragma unroll
			for (int b = 0; b < 2; b++) {
				float p[2][T][NR];

#pragma unroll
				for (int h = 0; h < 2; h++) {
					const int q = 2 * b + h;
					float xf[NR][8];

#pragma unroll
					for (int i = 0; i < NR; i++) {
						const float4 lo = *(const float4 *)(xl[i] + xo + 8 * q);
						const float4 hi =
							*(const float4 *)(xl[i] + xo + 8 * q + 4);

						xf[i][0] = lo.x, xf[i][1] = lo.y;
						xf[i][2] = lo.z, xf[i][3] = lo.w;
						xf[i][4] = hi.x, xf[i][5] = hi.y;
						xf[i][6] = hi.z, xf[i][7] = hi.w;
					}
#pragma unroll
					for (int m = 0; m < T; m++) {
						const uint32_t wq = q == 0 ? wr[d][m].x :
								    q == 1 ? wr[d][m].y :
								    q == 2 ? wr[d][m].z :
									     wr[d][m].w;
						__half2 v[4];
						float wf[8];

						fp4_unpack(wq, v);
#pragma unroll
						for (int j = 0; j < 4; j++) {
							const float2 f = __half22float2(v[j]);

							wf[2 * j] = f.x;
							wf[2 * j + 1] = f.y;
						}
#pragma unroll
						for (int i = 0; i < NR; i++) {
							float a = wf[0] * xf[i][0];

#pragma unroll
							for (int j = 1; j < 8; j++)
								a = fmaf(wf[j], xf[i][j], a);
							p[h][m][i] = a;
						}
					}
				}
#pragma unroll
				for (int m = 0; m < T; m++)
#pragma unroll
					for (int i = 0; i < NR; i++)
						acc[m][i] = fmaf(p[0][m][i] + p[1][m][i], sc[m][b],
								 acc[m][i]);
			}
			if (s + d + PF < s1)
				FP4_DOT_ISSUE(d, s + d + PF);
		}
	}
#undef FP4_DOT_ISSUE

	/* the lane pair's halves, then the warps' sums in order; times scale2 */
#pragma unroll
	for (int m = 0; m < T; m++) {
#pragma unroll
		for (int i = 0; i < NR; i++) {
			const float v = acc[m][i] + __shfl_xor_sync(0xffffffffu, acc[m][i], 1);

			if (!half)
				red[((warp * T + m) * NR + i) * 16 + (lane >> 1)] = v;
		}
	}
	__syncthreads();
	for (int idx = threadIdx.x; idx < T * NR * 16; idx += FP4_WARPS * 32) {
		const int m = idx / (NR * 16), i = idx / 16 % NR, r = (t0 + m) * 16 + idx % 16;
		float sum = 0.0f;

		if (r >= rows)
			continue;
#pragma unroll
		for (int v = 0; v < FP4_WARPS; v++)
			sum += red[v * T * NR * 16 + idx];
		sum *= row_scale2 ? row_scale2[r] : scale2;
		if (y_f32)
			((float *)y)[(size_t)i * rows + r] = sum;
		else
			((__half *)y)[(size_t)i * rows + r] = __float2half_rn(sum);
	}
}

/* ---- the reference kernel --------------------------------------------------------- */

/* The element (e2m1 * e4m3) * scale2 in f32, as the CPU twin rounds it. */
static __device__ __forceinline__ float fp4_element(uint32_t code, uint8_t sc, float scale2)
{
	const uint32_t e = (code >> 1) & 3, m = code & 1;
	const float mag = e ? ldexpf(1.0f + 0.5f * (float)m, (int)e - 1) : 0.5f * (float)m;
	const uint32_t se = (sc >> 3) & 15, sm = sc & 7;
	const float s = se ? ldexpf(1.0f + (float)sm / 8.0f, (int)se - 7) :
			     ldexpf((float)sm, -9);

	return (((code & 8) ? -mag : mag) * ((sc & 0x80) ? -s : s)) * scale2;
}

/* One thread an output: the reference path, on ModelOpt's layout (arranged 0) or on
 * prepare_weight's (arranged 1). */
static __global__ void nvfp4_ref_kernel(void *__restrict__ y, int y_f32,
					const __half *__restrict__ x,
					const uint8_t *__restrict__ codes,
					const uint8_t *__restrict__ scales, int rows, int cols,
					float scale2, const float *__restrict__ row_scale2,
					int arranged)
{
	const int r = blockIdx.x * blockDim.x + threadIdx.x, i = blockIdx.y;
	const int nsteps = (cols + FP4_KS - 1) / FP4_KS;
	const __half *xr = x + (size_t)i * cols;
	float s = 0.0f;

	if (r >= rows)
		return;
	if (row_scale2)
		scale2 = row_scale2[r];
	for (int k = 0; k < cols; k++) {
		size_t wi, so;
		uint32_t code;
		int e;

		if (arranged) {
			sm70_fp4_arranged_at(r, k, nsteps, &wi, &e, &so);
			code = fp4_word_code(((const uint32_t *)codes)[wi], e);
		} else {
			so = (size_t)r * (cols / 16) + k / 16;
			code = (codes[(size_t)r * (cols / 2) + k / 2] >> (4 * (k & 1))) & 15;
		}
		s += __half2float(xr[k]) * fp4_element(code, scales[so], scale2);
	}
	if (y_f32)
		((float *)y)[(size_t)i * rows + r] = s;
	else
		((__half *)y)[(size_t)i * rows + r] = __float2half_rn(s);
}

/* ---- launchers -------------------------------------------------------------------- */

template <int MT, int NI>
static void fp4_launch(struct sm70__cuda *c, void *y, int y_f32, const __half *x,
		       const struct sm70_weight *w, int n)
{
	const size_t smem = FP4_WARPS * fp4_stage<MT>::bytes;
	const int n_tiles = (w->rows + 15) / 16;

	if (smem > 48 * 1024 && sm70__cuda_smem_optin(c, (const void *)fp4_gemv_kernel<MT, NI>))
		return;
	sm70__launch_pdl(c, SM70__PDL_NVFP4, fp4_gemv_kernel<MT, NI>, dim3((n_tiles + MT - 1) / MT),
			 dim3(FP4_WARPS * 32), smem, y, y_f32, x, (const uint4 *)w->data,
			 (const uint16_t *)w->scale, w->rows, w->cols, n, 128.0f * w->scale2,
			 w->row_scale2);
}

/* The WMMA kernel: two row tiles a block (half the x re-reads) when that still gives two
 * blocks an SM. */
static void fp4_wmma_dispatch(struct sm70__cuda *c, void *y, int y_f32, const __half *x,
			      const struct sm70_weight *w, int n)
{
	const int mt2 = (w->rows + 31) / 32 >= 2 * c->n_sm;

	switch ((n + 3) / 4 + (mt2 ? 4 : 0)) {
	case 1: fp4_launch<1, 1>(c, y, y_f32, x, w, n); break;
	case 2: fp4_launch<1, 2>(c, y, y_f32, x, w, n); break;
	case 3: fp4_launch<1, 3>(c, y, y_f32, x, w, n); break;
	case 4: fp4_launch<1, 4>(c, y, y_f32, x, w, n); break;
	case 5: fp4_launch<2, 1>(c, y, y_f32, x, w, n); break;
	case 6: fp4_launch<2, 2>(c, y, y_f32, x, w, n); break;
	case 7: fp4_launch<2, 3>(c, y, y_f32, x, w, n); break;
	case 8: fp4_launch<2, 4>(c, y, y_f32, x, w, n); break;
	}
}

/* The dot kernel on n rows of x, T tiles a block. Its shared memory grows with cols: past
 * 48 KB its limit goes, once per device, to the most a block may have. */
template <int NR, int T, int PF, int MINB = 2>
static void fp4_dot_launch(struct sm70__cuda *c, void *y, int y_f32, const __half *x,
			   const struct sm70_weight *w)
{
	const size_t smem = fp4_dot_smem(NR, T, w->cols);
	const int n_tiles = (w->rows + 15) / 16, blocks = (n_tiles + T - 1) / T;

	if (smem > 48 * 1024 &&
	    sm70__cuda_smem_optin(c, (const void *)fp4_dot_kernel<NR, T, PF, MINB>))
		return;
	sm70__launch_pdl(c, SM70__PDL_PREFETCH, fp4_dot_kernel<NR, T, PF, MINB>, dim3(blocks),
			 dim3(FP4_WARPS * 32), smem, y, y_f32, x, (const uint4 *)w->data,
			 (const uint16_t *)w->scale, w->rows, w->cols, w->scale2, w->row_scale2);
}

/* Tile-steps in flight a warp: 8 at one or two rows of x, 4 at three or four (their
 * registers). */
template <int T>
static void fp4_dot_dispatch(struct sm70__cuda *c, void *y, int y_f32, const __half *x,
			     const struct sm70_weight *w, int n)
{
	switch (n) {
	case 1: fp4_dot_launch<1, T, 8 / T>(c, y, y_f32, x, w); break;
	case 2: fp4_dot_launch<2, T, 8 / T>(c, y, y_f32, x, w); break;
	case 3: fp4_dot_launch<3, T, 4 / T>(c, y, y_f32, x, w); break;
	case 4: fp4_dot_launch<4, T, 4 / T>(c, y, y_f32, x, w); break;
	}
}

/* Whether the n = 1 dot kernel at three blocks an SM (variant 4) pays on w: measured on an
 * H200 it was 7-18% faster where more blocks queue than two an SM hold (the 6144-row qkv
 * shape's 384, the two-tile blocks of gate_up and lm_head), 14-24% slower where two an SM
 * already hold them all (it only halves the prefetch there). Three must fit the SM's
 * shared memory (x in f32 grows with cols). */
static int fp4_dot3_pays(const struct sm70__cuda *c, const struct sm70_weight *w, int t)
{
	const long blocks = ((w->rows + 15) / 16 + t - 1) / t;

	/* 1 KB a block is the driver's own */
	return blocks > 2L * c->n_sm && 3 * (fp4_dot_smem(1, t, w->cols) + 1024) <= c->smem_sm;
}

/* One launch for n <= FP4_ROWS_MAX rows of x, by SM70_NVFP4_VARIANT (the file comment):
 * the dot kernel where the variant asks for it and its x fits its shared memory, else
 * WMMA. */
static void fp4_dispatch(struct sm70__cuda *c, void *y, int y_f32, const __half *x,
			 const struct sm70_weight *w, int n)
{
	const int v = c->nvfp4_variant;
	const size_t most = c->smem_optin < FP4_DOT_SMEM_MAX ? c->smem_optin : FP4_DOT_SMEM_MAX;
	const int t2 = v == 3 || (v != 2 && (w->rows + 31) / 32 >= 2 * c->n_sm);

	/* Batch invariance: WMMA at every n (its output column depends on its x row alone; the
	 * dot and f16-sum kernels sum in other orders). */
	/* the tile kernel (matmul_nvfp4_split.cu): variant 8, and auto at n = 1-2 (on an H200,
	 * 8B NVFP4 end to end: 368.7 against the dot kernel's 354.3 tokens/s at B1, 650.0
	 * against the split kernel's 585.0 at B2; docs/PERFORMANCE.md, "NVFP4: the tile kernel
	 * becomes the B1-B2 default") */
	if (!c->be.batch_invariant && (v == 8 || (v == 0 && n <= 2)) &&
	    sm70__cuda_fp4_tile(c, y, y_f32, x, w, n))
		return;
	/* the split kernel (same file): variants 6 and 7 up to its rows of x, x through L1 or
	 * in shared memory; auto at n = 2 where the tile kernel's x does not fit */
	if (!c->be.batch_invariant && (v == 6 || v == 7 || (v == 0 && n == 2)) &&
	    sm70__cuda_fp4_split(c, y, y_f32, x, w, n, v != 6))
		return;
	/* auto: the dot kernel at n = 1 only, WMMA from n = 3 (it measured as fast as the dot
	 * kernel or faster from n = 2, docs/PERFORMANCE.md "NVFP4 GEMV", and faster than the
	 * split kernel at n = 4; n = 3 was not timed against the split kernel) */
	if (c->be.batch_invariant || n > FP4_DOT_ROWS_MAX || v == 1 ||
	    ((v == 0 || v >= 4) && n > 1) || fp4_dot_smem(n, t2 ? 2 : 1, w->cols) > most) {
		fp4_wmma_dispatch(c, y, y_f32, x, w, n);
		return;
	}
	/* n = 1 at three blocks an SM where that pays: variant 4 everywhere, 5 (and auto where
	 * the tile kernel's x does not fit) by shape (measured faster end to end: 8B B1 328.4
	 * against 313.7 tokens/s, 27B 97.8 against 96.1, H100) */
	if (v == 4 || ((v == 0 || v == 5) && fp4_dot3_pays(c, w, t2 ? 2 : 1))) {
		if (t2)
			fp4_dot_launch<1, 2, 2, 3>(c, y, y_f32, x, w);
		else
			fp4_dot_launch<1, 1, 4, 3>(c, y, y_f32, x, w);
		return;
	}
	if (t2)
		fp4_dot_dispatch<2>(c, y, y_f32, x, w, n);
	else
		fp4_dot_dispatch<1>(c, y, y_f32, x, w, n);
}

/* Called by sm70__cuda_matmul for NVFP4 weights (w from this backend's prepare_weight). */
extern "C" void sm70__cuda_matmul_nvfp4(struct sm70_backend *be, void *y, int y_f32, const void *x,
			     const struct sm70_weight *w, int n)
{
	struct sm70__cuda *c = sm70__cuda_enter(be);
	const __half *xh = (const __half *)x;
	const size_t ysz = y_f32 ? sizeof(float) : sizeof(__half);

	if (c->nvfp4_ref || c->matmul_ref || ((uintptr_t)x & 15)) {
		nvfp4_ref_kernel<<<dim3((w->rows + 127) / 128, n), 128, 0, c->stream>>>(
			y, y_f32, xh, (const uint8_t *)w->data, (const uint8_t *)w->scale, w->rows,
			w->cols, w->scale2, w->row_scale2, !c->nvfp4_ref);
		SM70_CUDA_LAUNCHED(be, "nvfp4_ref_kernel");
		return;
	}
	/* slices of 16 rows: a slice's x stays 16-byte aligned (cols % 16 == 0) */
	for (int i0 = 0; i0 < n; i0 += FP4_ROWS_MAX) {
		const int m = n - i0 < FP4_ROWS_MAX ? n - i0 : FP4_ROWS_MAX;

		fp4_dispatch(c, (char *)y + (size_t)i0 * w->rows * ysz, y_f32,
			     xh + (size_t)i0 * w->cols, w, m);
		if (SM70_CUDA_LAUNCHED(be, "fp4 matmul kernel"))
			return;
	}
}

/* ---- prepare_weight ------------------------------------------------------------------ */

/* An upload of n host bytes into new backend memory at *dst; 0 or -ENOMEM / -EIO. */
static int fp4_upload(struct sm70_backend *be, void **dst, const void *src, size_t n)
{
	*dst = be->ops->buf_alloc(be, n);
	if (!*dst)
		return -ENOMEM;
	return be->ops->upload(be, *dst, src, n);
}

/* See backend.h and the file comment: the arranged layout, or with SM70_NVFP4=reference
 * ModelOpt's as is. Host memory for the arrangement is taken and released here. */
extern "C" int sm70__cuda_prepare_weight(struct sm70_backend *be, struct sm70_weight *w_out,
					 const struct sm70_weight *src, struct sm70_err *err)
{
	struct sm70__cuda *c = sm70__cuda_enter(be);
	size_t n_codes, n_scales;
	uint8_t *codes = NULL, *scales = NULL;
	int ret = sm70__nvfp4_check(src, err);

	*w_out = (struct sm70_weight){};
	w_out->dtype = SM70_DTYPE_NVFP4;
	if (ret)
		return ret;
	if (c->nvfp4_ref) {
		n_codes = (size_t)src->rows * (src->cols / 2);
		n_scales = (size_t)src->rows * (src->cols / 16);
		codes = (uint8_t *)src->data;
		scales = (uint8_t *)src->scale;
	} else {
		const size_t units = sm70_fp4_units(src->rows, src->cols);

		n_codes = units * 16;
		n_scales = units * 2;
		codes = (uint8_t *)calloc(n_codes, 1);
		scales = (uint8_t *)calloc(n_scales, 1);
		if (!codes || !scales) {
			ret = -ENOMEM;
			goto out;
		}
		sm70_fp4_arrange((uint32_t *)codes, scales, (const uint8_t *)src->data,
				 (const uint8_t *)src->scale, src->rows, src->cols);
	}
	ret = fp4_upload(be, &w_out->data, codes, n_codes);
	if (!ret)
		ret = fp4_upload(be, &w_out->scale, scales, n_scales);
	if (!ret && src->row_scale2)
		ret = fp4_upload(be, (void **)&w_out->row_scale2, src->row_scale2,
				 (size_t)src->rows * sizeof(float));
out:
	if (!c->nvfp4_ref) {
		free(scales);
		free(codes);
	}
	if (ret) {
		be->ops->buf_free(be, w_out->row_scale2);
		be->ops->buf_free(be, w_out->scale);
		be->ops->buf_free(be, w_out->data);
		*w_out = (struct sm70_weight){};
		w_out->dtype = SM70_DTYPE_NVFP4;
		return sm70_errf(err, ret, "nvfp4 weight [%d, %d]: %s", src->rows, src->cols,
				 ret == -ENOMEM ? "out of memory" : "upload failed");
	}
	w_out->rows = src->rows;
	w_out->cols = src->cols;
	w_out->scale2 = src->scale2;
	return 0;
}
