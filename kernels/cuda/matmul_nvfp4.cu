/*
 * matmul_nvfp4.cu - the CUDA matmul op on NVFP4 weights (W4A16): y[n, rows] = x[n, cols]
 * W^T, x f16, y f16 or f32, fp32 accumulation; and the backend's prepare_weight, which
 * rearranges ModelOpt's layout for the kernels. Contract: kernels/backend.h (struct
 * sm70_weight, matmul, prepare_weight).
 *
 * Why this shape. Decode is memory-bound: an H200 streams ~4.6 TB/s, 17.6 bytes a cycle
 * per SM (132 SMs, 1.98 GHz), which at 0.5625 bytes a weight (4-bit code + an E4M3 byte
 * per 16) is 31 weights a cycle per SM against 128 thread-instructions an SM issues a
 * cycle: ~4 instructions per weight at full bandwidth, ~3 at 80% with the issue half
 * busy. By Little's law (~4.6 TB/s x ~1 us loaded latency / 132) each SM must keep
 * ~40 KB or more of loads in flight. The first kernel (WMMA, two steps ahead) kept ~16 KB
 * an SM and spent ~3.5 instructions a weight (bit decode, HMUL2, two shared-memory
 * trips), and reached 23-46% of read bandwidth at B1.
 *
 * Decode. prepare_weight stores each 32-bit word of 8 codes (columns c .. c + 7) with its
 * bits placed so that four rotations and masks give the f16 pairs (c + 2p, c + 2p + 1)
 * directly: magnitude bits at f16 bits 9-11 and sign at 15 read as e2m1 * 2^-14, exactly
 * (E2M1's subnormal lands on f16's). Pair p's magnitudes sit rotated by 3p, its signs
 * by 7, 8, 6, 9 (fp4_unpack; no placement with one rotation a pair exists, a search of
 * all of them says, so the word costs 11 integer instructions, not 16 as before).
 *
 * Kernels, by batch size (fp4_pick; SM70_NVFP4_VARIANT overrides it, see below):
 * - n <= 4: fp4_dot_kernel, no tensor cores. A warp takes R rows at a time and lane l
 *   32 consecutive columns of each 1024 (one 16-byte load of codes, one u16 of its two
 *   block scales), streaming its (rows, stripe) steps P ahead in registers, through all
 *   the row groups of a grid sized to fill the GPU once (R = 2, P = 4: 4.5 KB a warp;
 *   64 registers at B1, so 32 warps and ~150 KB an SM in flight). The codes become f16
 *   e2m1 / 8 (one HMUL2 a pair), x (staged once a block in shared memory, in the order
 *   lanes read it, so without bank conflicts) multiplies them in HFMA2 chains of one
 *   16-column block, and each chain's two halves enter an f32 sum times the block's E4M3
 *   scale (a 256-entry f32 table in shared memory, one lookup a block). Per weight: 1.9
 *   instructions of decode shared by every row of x, 0.75 per row of x, ~0.3 of loads
 *   and lookups: ~2.9 at B1 (~58% issue at 80% bandwidth), ~3.7 at B2, ~5.2 at B4
 *   (there the issue rate, not memory, bounds it near ~60%).
 * - n > 4: fp4_wmma_kernel (the first kernel, with the new decode and four steps ahead):
 *   a block takes 16 MT rows, its 8 warps split the columns, each decodes W (times its
 *   block scale, exact in f16) and x into shared memory and multiplies there with WMMA
 *   16x16x16 (f16 in, f32 accumulate). Decoded W goes through shared memory twice (~4
 *   bytes a weight against the SM's 128 a cycle), which caps it near ~60% of bandwidth;
 *   decoding straight into fragments would need the WMMA fragment layout, which CUDA
 *   leaves unspecified (a non-goal here).
 * Lookup tables for the codes (one byte -> an f16 pair) were weighed and left: 15 random
 * lookups a cycle per SM with 3-4-way bank conflicts is most of shared memory's rate.
 * Split-K is not needed on these shapes: rows / R row groups (>= 2048 for 4096 rows)
 * already fill every warp slot once.
 *
 * Numerics. The WMMA path is exact up to f32 summation (e2m1 * e4m3 * 2^-7 is exact in
 * f16, the tensor cores multiply exactly), with 128 * scale2 applied to each f32 sum. The
 * dot path rounds each product e2m1 / 8 * x to f16 (2^-12 relative) and sums 8 of them
 * in f16 before the f32 sum: over K = 4096 random terms its error is ~4e-4 of max |y|
 * (a simulation of the exact operation order, tests/gpu/test_cuda_nvfp4.c's bound), an
 * f16 output's rounding is up to 4.9e-4. Its f16 part sees no scale (|e2m1 / 8| <= 0.75:
 * a chain of 8 overflows only past |x| ~ 10900 in all 8 of its columns; the scale and
 * scale2 are f32), so a block of tiny scales loses nothing.
 *
 * Arrangement (prepare_weight): row-major like ModelOpt's, rows padded to KP = cols
 * rounded up to 32 (so a lane's 16 bytes never cross a row), codes [rows][KP / 2] bytes
 * in the placed words above, scales [rows][KP / 16] ModelOpt's bytes, padding zero. Chunk
 * g (32 columns) of row r is uint4 r * KP / 32 + g of the codes and u16 r * KP / 32 + g of
 * the scales. row_scale2, when the weight has one, is uploaded as it is.
 *
 * Variants (SM70_NVFP4_VARIANT, for timing them against each other; 0 when unset):
 * 0 auto (the above), 1 WMMA at every n, 2 dot with R = 1, P = 8, 3 dot with R = 4,
 * P = 2, 4 dot with R = 2, P = 8, 5 WMMA two steps ahead (the first kernel's depth).
 * Variants 2-4 change only n <= 4.
 *
 * Other paths:
 * - n > 16: slices of 16 rows of x (W read once a slice).
 * - SM70_NVFP4=reference (the named switch back): prepare_weight uploads ModelOpt's layout
 *   as is, and matmul runs nvfp4_ref_kernel on it, one thread an output, dequantising
 *   each element in f32 as the CPU does. SM70_MATMUL=reference, or an x not 16-byte
 *   aligned, runs that kernel on the arranged layout.
 *
 * Non-goals: prefill speed (n > 16 re-reads W every 16 rows); NVFP4 in silu_matmul or the
 * MoE experts.
 */
#include <mma.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cuda_check.h"

#define FP4_WARPS 8          /* warps a block, both kernels */
#define FP4_ROWS_MAX 16      /* rows of x a launch takes */
#define FP4_DOT_ROWS_MAX 4   /* rows of x the dot kernel takes */
#define FP4_STRIPE 1024      /* columns of one dot step: 32 lanes x 32 */
#define FP4_KS 64            /* columns of one WMMA step: 16 rows x 64 = 32 lanes x 16 B */
#define FP4_LD (FP4_KS + 8)  /* WMMA staged row stride in halves: rows 16 B apart in banks */

/* Pair p's sign rotation, nibble p (the magnitudes rotate by 3p). */
#define FP4_SIGN_ROT 0x9687u

/* Columns of a row in the arrangement: cols rounded up to 32. */
static __host__ __device__ __forceinline__ int fp4_kp(int cols)
{
	return (cols + 31) & ~31;
}

/* Bit b of an arranged word holding element e (0..7) of its eight: magnitude bits 0-2
 * (b = 0..2) and the sign (b = 3). */
static __host__ __device__ __forceinline__ int fp4_bit_at(int e, int b)
{
	const int p = e >> 1, h = e & 1;

	if (b < 3)
		return (9 + 16 * h + 3 * p + b) & 31;
	return (15 + 16 * h + (int)((FP4_SIGN_ROT >> (4 * p)) & 15)) & 31;
}

/* Element e's 4-bit E2M1 code from an arranged word. */
static __host__ __device__ __forceinline__ uint32_t fp4_word_code(uint32_t w, int e)
{
	uint32_t code = 0;

	for (int b = 0; b < 4; b++)
		code |= ((w >> fp4_bit_at(e, b)) & 1u) << b;
	return code;
}

static __device__ __forceinline__ __half2 u32_as_half2(uint32_t u)
{
	union {
		uint32_t u;
		__half2 h;
	} v;

	v.u = u;
	return v.h;
}

static __device__ __forceinline__ uint32_t rotr(uint32_t w, int r)
{
	return __funnelshift_r(w, w, r);
}

/* The four f16 pairs of an arranged word, e2m1 * 2^-14 each, exactly: v[p] holds
 * elements 2p (low half) and 2p + 1. Eleven integer instructions. */
static __device__ __forceinline__ void fp4_unpack(uint32_t w, __half2 v[4])
{
	v[0] = u32_as_half2((w & 0x0e000e00u) | (rotr(w, 7) & 0x80008000u));
	v[1] = u32_as_half2((rotr(w, 3) & 0x0e000e00u) | (rotr(w, 8) & 0x80008000u));
	v[2] = u32_as_half2(rotr(w, 6) & 0x8e008e00u);
	v[3] = u32_as_half2(rotr(w, 9) & 0x8e008e00u);
}

/* Row r's scale2. */
static __device__ __forceinline__ float fp4_row_scale2(const float *rs, float scale2, int r)
{
	return rs ? rs[r] : scale2;
}

static __device__ __forceinline__ void fp4_store(void *y, int y_f32, size_t i, float v)
{
	if (y_f32)
		((float *)y)[i] = v;
	else
		((__half *)y)[i] = __float2half_rn(v);
}

/* What both fast kernels read. */
struct fp4_args {
	void *y;
	int y_f32;
	const __half *x;
	const uint4 *codes;
	const uint16_t *scales;
	const float *row_scale2; /* NULL: scale2 for every row */
	float scale2;
	int rows, cols, n;
};

/* ---- the dot kernel (n <= 4) ---------------------------------------------------------- */

/* Shared memory of a dot block: the E4M3 table and nr rows of x in lane order. */
static size_t fp4_dot_smem(int cols, int nr)
{
	const int ns = (fp4_kp(cols) + FP4_STRIPE - 1) / FP4_STRIPE;

	return 256 * sizeof(float) + (size_t)nr * ns * 128 * sizeof(uint4);
}

/* The block's x in lane order: entry ((i * ns + s) * 4 + q) * 32 + l is the 8 columns
 * 1024 s + 32 l + 8 q of row i, so that a warp's read of (i, s, q) is 512 contiguous bytes.
 * Columns past cols are zero. And tab[b] = e4m3(b) * 8 (the 8 undoes the codes' 1/8). */
template <int NR>
static __device__ void fp4_dot_stage(uint4 *xs, float *tab, const struct fp4_args *a, int ns)
{
	for (int e = threadIdx.x; e < NR * ns * 128; e += FP4_WARPS * 32) {
		const int l = e & 31, q = (e >> 5) & 3, s = (e >> 7) % ns, i = (e >> 7) / ns;
		const int k = FP4_STRIPE * s + 32 * l + 8 * q;

		xs[e] = k < a->cols ? __ldg((const uint4 *)(a->x + (size_t)i * a->cols + k)) :
				      make_uint4(0, 0, 0, 0);
	}
	for (int b = threadIdx.x; b < 256; b += FP4_WARPS * 32) {
		const int se = (b >> 3) & 15, sm = b & 7;
		const float v = se ? ldexpf(1.0f + (float)sm / 8.0f, se - 7) : ldexpf((float)sm, -9);

		tab[b] = (b & 0x80) ? -8.0f * v : 8.0f * v;
	}
}

/* One 16-column block of one weight row against NR rows of x: w0, w1 its two code words,
 * t its scale (tab's), xb[i] row i's 16 x values; acc[i] += t * (the block's dot). */
template <int NR>
static __device__ __forceinline__ void fp4_dot_block(float acc[NR], uint32_t w0, uint32_t w1,
						     float t, const uint4 xb[NR][2])
{
	const __half2 to_eighths = __float2half2_rn(2048.0f); /* 2^14 / 8 */
	__half2 c[8];

	fp4_unpack(w0, c);
	fp4_unpack(w1, c + 4);
#pragma unroll
	for (int j = 0; j < 8; j++)
		c[j] = __hmul2(c[j], to_eighths); /* e2m1 / 8, exact */
#pragma unroll
	for (int i = 0; i < NR; i++) {
		const uint32_t *xw = (const uint32_t *)xb[i];
		__half2 h = __hmul2(c[0], u32_as_half2(xw[0]));
		float2 f;

#pragma unroll
		for (int j = 1; j < 8; j++)
			h = __hfma2(c[j], u32_as_half2(xw[j]), h);
		f = __half22float2(h);
		acc[i] = fmaf(t, f.x, fmaf(t, f.y, acc[i]));
	}
}

static __device__ __forceinline__ float warp_sum(float v)
{
#pragma unroll
	for (int o = 16; o > 0; o >>= 1)
		v += __shfl_xor_sync(0xffffffffu, v, o);
	return v;
}

/*
 * NR rows of x, R weight rows a warp step, P steps loaded ahead. A warp's work is the
 * sequence of (row group, stripe) steps of the row groups gw, gw + total warps, ...;
 * its loads run P steps ahead through that whole sequence, so a warp moving to its next
 * row group keeps its loads in flight.
 */
template <int NR, int R, int P>
static __global__ void __launch_bounds__(FP4_WARPS * 32)
	fp4_dot_kernel(struct fp4_args a)
{
	extern __shared__ __align__(128) unsigned char fp4_smem[];
	float *tab = (float *)fp4_smem;
	const uint4 *xs = (const uint4 *)(tab + 256);
	const int lane = threadIdx.x & 31, gw = blockIdx.x * FP4_WARPS + (threadIdx.x >> 5);
	const int tw = gridDim.x * FP4_WARPS, kp32 = fp4_kp(a.cols) / 32;
	const int ns = (kp32 + 31) / 32, groups = (a.rows + R - 1) / R;
	uint4 wr[P][R];
	uint32_t sr[P][R];
	float acc[NR][R];
	int lg = gw, ls = 0; /* the next step to load */
	int cg = gw, cs = 0; /* the step being computed */

	/* Loads of step (g, s) into slot d: chunks past the row read as zero codes; rows
	 * past the matrix read the last row (valid memory, never stored). */
#define FP4_DOT_LOAD(d)                                                                  \
	do {                                                                             \
		const int ch_ = 32 * ls + lane;                                          \
		_Pragma("unroll") for (int r = 0; r < R; r++) {                          \
			const int row_ = min(lg * R + r, a.rows - 1);                    \
			const size_t at_ = (size_t)row_ * kp32 + ch_;                    \
			wr[d][r] = ch_ < kp32 ? __ldg(a.codes + at_) : make_uint4(0, 0, 0, 0); \
			sr[d][r] = ch_ < kp32 ? __ldg(a.scales + at_) : 0u;              \
		}                                                                        \
		if (++ls == ns) {                                                        \
			ls = 0;                                                          \
			lg += tw;                                                        \
		}                                                                        \
	} while (0)

#pragma unroll
	for (int d = 0; d < P; d++)
		if (lg < groups)
			FP4_DOT_LOAD(d);
	fp4_dot_stage<NR>((uint4 *)xs, tab, &a, ns);
	__syncthreads();
#pragma unroll
	for (int i = 0; i < NR; i++)
#pragma unroll
		for (int r = 0; r < R; r++)
			acc[i][r] = 0.0f;

	while (cg < groups) {
#pragma unroll
		for (int d = 0; d < P; d++) {
			if (cg >= groups)
				break;
#pragma unroll
			for (int b = 0; b < 2; b++) {
				uint4 xb[NR][2];

#pragma unroll
				for (int i = 0; i < NR; i++) {
					const uint4 *xe = xs + ((i * ns + cs) * 4 + 2 * b) * 32 + lane;

					xb[i][0] = xe[0];
					xb[i][1] = xe[32];
				}
#pragma unroll
				for (int r = 0; r < R; r++) {
					float ar[NR];

#pragma unroll
					for (int i = 0; i < NR; i++)
						ar[i] = acc[i][r];
					fp4_dot_block<NR>(ar, b ? wr[d][r].z : wr[d][r].x,
							  b ? wr[d][r].w : wr[d][r].y,
							  tab[(sr[d][r] >> (8 * b)) & 0xff], xb);
#pragma unroll
					for (int i = 0; i < NR; i++)
						acc[i][r] = ar[i];
				}
			}
			if (lg < groups)
				FP4_DOT_LOAD(d);
			if (++cs < ns)
				continue;
			/* the row group is done: its sums, times scale2, out */
#pragma unroll
			for (int i = 0; i < NR; i++) {
#pragma unroll
				for (int r = 0; r < R; r++) {
					const float v = warp_sum(acc[i][r]);
					const int row = cg * R + r;

					acc[i][r] = 0.0f;
					if (lane == 0 && row < a.rows)
						fp4_store(a.y, a.y_f32, (size_t)i * a.rows + row,
							  v * fp4_row_scale2(a.row_scale2, a.scale2,
									     row));
				}
			}
			cs = 0;
			cg += tw;
		}
	}
#undef FP4_DOT_LOAD
}

/* ---- the WMMA kernel (n > 4) ---------------------------------------------------------- */

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

/* Eight elements of one arranged word times t: four f16 pairs e2m1 * e4m3 * 2^-7, exact
 * (an integer of at most 8 bits times 2^-17 or more, at most 21). */
static __device__ __forceinline__ uint4 fp4_decode8(uint32_t w, __half2 t)
{
	__half2 v[4];
	union {
		uint4 u;
		__half2 h[4];
	} r;

	fp4_unpack(w, v);
#pragma unroll
	for (int p = 0; p < 4; p++)
		r.h[p] = __hmul2(v[p], t);
	return r.u;
}

/*
 * MT row tiles a block, NI = ceil(n / 4) x row groups loaded, PF steps of W loaded ahead
 * (x two ahead). Lane l decodes its 32 columns of row l / 2 of each tile; for x, as in
 * matmul.cu, lane l loads 8 columns (chunk l % 8) of rows l / 8 + 4 i.
 */
template <int MT, int NI, int PF>
static __global__ void __launch_bounds__(FP4_WARPS * 32, MT == 1 ? 2 : 1)
	fp4_wmma_kernel(struct fp4_args a)
{
	using namespace nvcuda;
	extern __shared__ __align__(128) unsigned char fp4_smem[];
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	const int sub = lane >> 3, chunk = lane & 7, t0 = blockIdx.x * MT;
	const int kp32 = fp4_kp(a.cols) / 32, nsteps = (kp32 + 1) / 2;
	const int s0 = warp * nsteps / FP4_WARPS, s1 = (warp + 1) * nsteps / FP4_WARPS;
	__half *ws = (__half *)(fp4_smem + warp * fp4_stage<MT>::bytes);
	__half *xs = ws + 16 * MT * FP4_LD;
	__half *wdst = ws + (lane >> 1) * FP4_LD + (lane & 1) * 32; /* this lane's 32 columns */
	size_t at[MT];
	wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[MT];
	uint4 wr[PF][MT], xr[2][NI];
	uint32_t sr[PF][MT];

#pragma unroll
	for (int m = 0; m < MT; m++) {
		/* a row past the end reads the last row (valid) and is never stored */
		const int r = min(16 * (t0 + m) + (lane >> 1), a.rows - 1);

		at[m] = (size_t)r * kp32 + (lane & 1);
		wmma::fill_fragment(acc[m], 0.0f);
	}
	/* x rows this warp never loads stay zero */
	for (int i = lane; i < (16 - 4 * NI) * FP4_LD / 8; i += 32)
		((uint4 *)(xs + 4 * NI * FP4_LD))[i] = make_uint4(0, 0, 0, 0);

	/* W of step s into slot d (a chunk past the row reads as zero codes); x of step s
	 * into slot d (columns past the end and rows past n read as zero: cols is a multiple
	 * of 16, so a chunk of 8 is all in or all out). */
#define FP4_LOAD_W(d, s)                                                                 \
	do {                                                                             \
		const bool in_ = 2 * (s) + (lane & 1) < kp32;                            \
		_Pragma("unroll") for (int m = 0; m < MT; m++) {                         \
			wr[d][m] = in_ ? __ldg(a.codes + at[m] + 2 * (size_t)(s)) :        \
					 make_uint4(0, 0, 0, 0);                          \
			sr[d][m] = in_ ? __ldg(a.scales + at[m] + 2 * (size_t)(s)) : 0u;  \
		}                                                                        \
	} while (0)
#define FP4_LOAD_X(d, s)                                                                 \
	do {                                                                             \
		const int k_ = (s) * FP4_KS + chunk * 8;                                 \
		_Pragma("unroll") for (int i = 0; i < NI; i++) {                         \
			const int j_ = sub + 4 * i;                                      \
			xr[d][i] = k_ < a.cols && j_ < a.n ?                             \
					   __ldg((const uint4 *)(a.x + (size_t)j_ * a.cols + k_)) : \
					   make_uint4(0, 0, 0, 0);                       \
		}                                                                        \
	} while (0)

#pragma unroll
	for (int d = 0; d < PF; d++)
		if (s0 + d < s1)
			FP4_LOAD_W(d, s0 + d);
#pragma unroll
	for (int d = 0; d < 2; d++)
		if (s0 + d < s1)
			FP4_LOAD_X(d, s0 + d);
	for (int s = s0; s < s1; s += PF) {
#pragma unroll
		for (int d = 0; d < PF; d++) {
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
				*(uint4 *)(xs + (sub + 4 * i) * FP4_LD + chunk * 8) = xr[d & 1][i];
			if (s + d + PF < s1)
				FP4_LOAD_W(d, s + d + PF);
			if (s + d + 2 < s1)
				FP4_LOAD_X(d & 1, s + d + 2);
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
#undef FP4_LOAD_X
#undef FP4_LOAD_W

	/* Each warp's partial tiles (rows x 16 x columns, row-major) into its own stage, then
	 * the block adds them and applies 128 * scale2. */
	{
		float *red = (float *)ws;

#pragma unroll
		for (int m = 0; m < MT; m++)
			wmma::store_matrix_sync(red + m * 256, acc[m], 16, wmma::mem_row_major);
	}
	__syncthreads();
	for (int idx = threadIdx.x; idx < a.n * 16 * MT; idx += FP4_WARPS * 32) {
		const int j = idx / (16 * MT), rr = idx - j * (16 * MT);
		const int r = t0 * 16 + rr;
		float sum = 0.0f;

		if (r >= a.rows)
			continue;
#pragma unroll
		for (int v = 0; v < FP4_WARPS; v++)
			sum += ((const float *)(fp4_smem + v * fp4_stage<MT>::bytes))[rr * 16 + j];
		fp4_store(a.y, a.y_f32, (size_t)j * a.rows + r,
			  sum * 128.0f * fp4_row_scale2(a.row_scale2, a.scale2, r));
	}
}

/* ---- the reference kernel ------------------------------------------------------------- */

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
static __global__ void nvfp4_ref_kernel(struct fp4_args a, int arranged)
{
	const int r = blockIdx.x * blockDim.x + threadIdx.x, i = blockIdx.y;
	const int kp = arranged ? fp4_kp(a.cols) : a.cols;
	const __half *xr = a.x + (size_t)i * a.cols;
	const uint8_t *codes = (const uint8_t *)a.codes, *scales = (const uint8_t *)a.scales;
	float s2, s = 0.0f;

	if (r >= a.rows)
		return;
	s2 = fp4_row_scale2(a.row_scale2, a.scale2, r);
	for (int k = 0; k < a.cols; k++) {
		const uint8_t sc = scales[(size_t)r * (kp / 16) + k / 16];
		uint32_t code;

		if (arranged)
			code = fp4_word_code(((const uint32_t *)codes)[(size_t)r * (kp / 8) + k / 8],
					     k % 8);
		else
			code = (codes[(size_t)r * (kp / 2) + k / 2] >> (4 * (k & 1))) & 15;
		s += __half2float(xr[k]) * fp4_element(code, sc, s2);
	}
	fp4_store(a.y, a.y_f32, (size_t)i * a.rows + r, s);
}

/* ---- launchers ------------------------------------------------------------------------ */

/* For a launch with smem bytes of dynamic shared memory: raises the kernel's limit to
 * limit (>= smem) once per device when smem passes the default 48 KB (the attribute is
 * per device; *set holds a bit per device). 0 or -EIO. */
static int fp4_smem_attr(struct sm70__cuda *c, const void *kernel, size_t smem, size_t limit,
			 uint64_t *set)
{
	const uint64_t bit = 1ull << (c->device & 63);

	if (smem <= 48 * 1024 || (*set & bit))
		return 0;
	if (SM70_CUDA_CHECK(&c->be, cudaFuncSetAttribute(kernel,
							 cudaFuncAttributeMaxDynamicSharedMemorySize,
							 (int)limit)))
		return -EIO;
	*set |= bit;
	return 0;
}

/* Blocks of a kernel an SM holds with smem bytes of dynamic shared memory: its
 * occupancy without shared memory (*occ0, asked once per device) bounded by the SM's
 * shared memory (1 KB of it reserved a block); 0 on a failed query. */
static int fp4_blocks_per_sm(struct sm70__cuda *c, const void *kernel, int *occ0, size_t smem)
{
	static int sm_smem[64]; /* shared memory an SM has, by device; 0: not asked yet */
	int *have = &sm_smem[c->device & 63], by_smem;

	if (!*occ0 && SM70_CUDA_CHECK(&c->be, cudaOccupancyMaxActiveBlocksPerMultiprocessor(
						      occ0, kernel, FP4_WARPS * 32, 0)))
		return 0;
	if (!*have && SM70_CUDA_CHECK(&c->be, cudaDeviceGetAttribute(
						      have,
						      cudaDevAttrMaxSharedMemoryPerMultiprocessor,
						      c->device)))
		return 0;
	by_smem = (int)((size_t)*have / (smem + 1024));
	return by_smem < *occ0 ? by_smem : *occ0;
}

/* The dot kernel on a grid that every SM holds at once (its loop takes the rest). */
template <int NR, int R, int P>
static void fp4_dot_launch(struct sm70__cuda *c, const struct fp4_args *a)
{
	static uint64_t attr_set;
	static int occ0[64]; /* by device */
	const void *kernel = (const void *)fp4_dot_kernel<NR, R, P>;
	const size_t smem = fp4_dot_smem(a->cols, NR);
	const int groups = (a->rows + R - 1) / R;
	int per_sm, blocks = (groups + FP4_WARPS - 1) / FP4_WARPS;

	/* its shared memory grows with cols: the limit goes to the most a block may have */
	if (fp4_smem_attr(c, kernel, smem, c->smem_optin, &attr_set))
		return;
	per_sm = fp4_blocks_per_sm(c, kernel, &occ0[c->device & 63], smem);
	if (per_sm < 1)
		per_sm = 1;
	if (blocks > per_sm * c->n_sm)
		blocks = per_sm * c->n_sm;
	fp4_dot_kernel<NR, R, P><<<blocks, FP4_WARPS * 32, smem, c->stream>>>(*a);
}

template <int MT, int NI, int PF>
static void fp4_wmma_launch(struct sm70__cuda *c, const struct fp4_args *a)
{
	static uint64_t attr_set;
	const size_t smem = FP4_WARPS * fp4_stage<MT>::bytes;
	const int n_tiles = (a->rows + 15) / 16;

	if (fp4_smem_attr(c, (const void *)fp4_wmma_kernel<MT, NI, PF>, smem, smem, &attr_set))
		return;
	fp4_wmma_kernel<MT, NI, PF><<<(n_tiles + MT - 1) / MT, FP4_WARPS * 32, smem,
				      c->stream>>>(*a);
}

/* The WMMA kernel for a->n rows: two row tiles a block (half the x re-reads) when that
 * still gives two blocks an SM; PF steps ahead. */
template <int PF>
static void fp4_wmma_dispatch(struct sm70__cuda *c, const struct fp4_args *a)
{
	const int mt2 = (a->rows + 31) / 32 >= 2 * c->n_sm;

	switch ((a->n + 3) / 4 + (mt2 ? 4 : 0)) {
	case 1: fp4_wmma_launch<1, 1, PF>(c, a); break;
	case 2: fp4_wmma_launch<1, 2, PF>(c, a); break;
	case 3: fp4_wmma_launch<1, 3, PF>(c, a); break;
	case 4: fp4_wmma_launch<1, 4, PF>(c, a); break;
	case 5: fp4_wmma_launch<2, 1, PF>(c, a); break;
	case 6: fp4_wmma_launch<2, 2, PF>(c, a); break;
	case 7: fp4_wmma_launch<2, 3, PF>(c, a); break;
	case 8: fp4_wmma_launch<2, 4, PF>(c, a); break;
	}
}

/* The dot kernel for a->n <= 4 rows, R rows a warp step, P steps ahead. */
template <int R, int P>
static void fp4_dot_dispatch(struct sm70__cuda *c, const struct fp4_args *a)
{
	switch (a->n) {
	case 1: fp4_dot_launch<1, R, P>(c, a); break;
	case 2: fp4_dot_launch<2, R, P>(c, a); break;
	case 3: fp4_dot_launch<3, R, P>(c, a); break;
	case 4: fp4_dot_launch<4, R, P>(c, a); break;
	}
}

/* One launch for a->n <= 16 rows of x, by variant (the file comment). The dot kernel
 * wants its x in shared memory; where that does not fit a block, WMMA runs instead. */
static void fp4_pick(struct sm70__cuda *c, const struct fp4_args *a)
{
	const int dot = a->n <= FP4_DOT_ROWS_MAX && c->nvfp4_variant != 1 &&
			c->nvfp4_variant != 5 && fp4_dot_smem(a->cols, a->n) <= c->smem_optin;

	if (!dot) {
		if (c->nvfp4_variant == 5)
			fp4_wmma_dispatch<2>(c, a);
		else
			fp4_wmma_dispatch<4>(c, a);
		return;
	}
	switch (c->nvfp4_variant) {
	case 2: fp4_dot_dispatch<1, 8>(c, a); break;
	case 3: fp4_dot_dispatch<4, 2>(c, a); break;
	case 4: fp4_dot_dispatch<2, 8>(c, a); break;
	default: fp4_dot_dispatch<2, 4>(c, a); break;
	}
}

/* Called by sm70__cuda_matmul for NVFP4 weights (w from this backend's prepare_weight). */
extern "C" void sm70__cuda_matmul_nvfp4(struct sm70_backend *be, void *y, int y_f32,
					const void *x, const struct sm70_weight *w, int n)
{
	struct sm70__cuda *c = sm70__cuda_enter(be);
	const size_t ysz = y_f32 ? sizeof(float) : sizeof(__half);
	struct fp4_args a;

	a.y = y;
	a.y_f32 = y_f32;
	a.x = (const __half *)x;
	a.codes = (const uint4 *)w->data;
	a.scales = (const uint16_t *)w->scale;
	a.row_scale2 = w->row_scale2;
	a.scale2 = w->scale2;
	a.rows = w->rows;
	a.cols = w->cols;
	a.n = n;

	if (c->nvfp4_ref || c->matmul_ref || ((uintptr_t)x & 15)) {
		nvfp4_ref_kernel<<<dim3((w->rows + 127) / 128, n), 128, 0, c->stream>>>(
			a, !c->nvfp4_ref);
		SM70_CUDA_LAUNCHED(be, "nvfp4_ref_kernel");
		return;
	}
	/* slices of 16 rows: a slice's x stays 16-byte aligned (cols % 16 == 0) */
	for (int i0 = 0; i0 < n; i0 += FP4_ROWS_MAX) {
		a.n = n - i0 < FP4_ROWS_MAX ? n - i0 : FP4_ROWS_MAX;
		a.y = (char *)y + (size_t)i0 * w->rows * ysz;
		a.x = (const __half *)x + (size_t)i0 * w->cols;
		fp4_pick(c, &a);
		if (SM70_CUDA_LAUNCHED(be, "fp4 matmul kernel"))
			return;
	}
}

/* ---- prepare_weight ------------------------------------------------------------------ */

/* ModelOpt's [rows][cols / 2] codes and [rows][cols / 16] scales into the arrangement
 * (host buffers of the arranged sizes, zeroed by the caller). */
static void fp4_arrange(uint32_t *words, uint8_t *scales, const struct sm70_weight *src)
{
	const int rows = src->rows, cols = src->cols, kp = fp4_kp(cols);
	const uint8_t *sc = (const uint8_t *)src->data, *ss = (const uint8_t *)src->scale;
	uint32_t place[8][16]; /* element e's code c as its bits in the word */

	for (int e = 0; e < 8; e++) {
		for (int code = 0; code < 16; code++) {
			place[e][code] = 0;
			for (int b = 0; b < 4; b++)
				place[e][code] |= (uint32_t)((code >> b) & 1) << fp4_bit_at(e, b);
		}
	}
	for (int r = 0; r < rows; r++) {
		const uint8_t *row = sc + (size_t)r * (cols / 2);
		uint32_t *wrow = words + (size_t)r * (kp / 8);

		for (int k = 0; k < cols; k++)
			wrow[k / 8] |= place[k % 8][(row[k / 2] >> (4 * (k & 1))) & 15];
		memcpy(scales + (size_t)r * (kp / 16), ss + (size_t)r * (cols / 16),
		       (size_t)cols / 16);
	}
}

/* An upload of n host bytes into new backend memory at *dst; 0 or -ENOMEM / -EIO. */
static int fp4_upload(struct sm70_backend *be, void **dst, const void *src, size_t n)
{
	*dst = be->ops->buf_alloc(be, n);
	if (!*dst)
		return -ENOMEM;
	return be->ops->upload(be, *dst, src, n);
}

/* See backend.h and the file comment: the arranged layout, or with SM70_NVFP4=reference
 * ModelOpt's as is; row_scale2 as it is either way. Host memory for the arrangement is
 * taken and released here. */
extern "C" int sm70__cuda_prepare_weight(struct sm70_backend *be, struct sm70_weight *w_out,
					 const struct sm70_weight *src, struct sm70_err *err)
{
	struct sm70__cuda *c = sm70__cuda_enter(be);
	size_t n_codes, n_scales;
	uint8_t *codes = NULL, *scales = NULL;
	void *rs = NULL;
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
		n_codes = (size_t)src->rows * (fp4_kp(src->cols) / 2);
		n_scales = (size_t)src->rows * (fp4_kp(src->cols) / 16);
		codes = (uint8_t *)calloc(n_codes, 1);
		scales = (uint8_t *)calloc(n_scales, 1);
		if (!codes || !scales) {
			ret = -ENOMEM;
			goto out;
		}
		fp4_arrange((uint32_t *)codes, scales, src);
	}
	ret = fp4_upload(be, &w_out->data, codes, n_codes);
	if (!ret)
		ret = fp4_upload(be, &w_out->scale, scales, n_scales);
	if (!ret && src->row_scale2) {
		ret = fp4_upload(be, &rs, src->row_scale2, (size_t)src->rows * sizeof(float));
		w_out->row_scale2 = (float *)rs;
	}
out:
	if (!c->nvfp4_ref) {
		free(scales);
		free(codes);
	}
	if (ret) {
		be->ops->buf_free(be, rs);
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
