/*
 * matmul_nvfp4.cu - the CUDA matmul op on NVFP4 weights (W4A16): y[n, rows] = x[n, cols]
 * W^T, x f16, y f16 or f32, fp32 accumulation; and the backend's prepare_weight, which
 * rearranges ModelOpt's layout for the kernel. Contract: kernels/backend.h (struct
 * sm70_weight, matmul, prepare_weight).
 *
 * Numerics. An E2M1 code's bits placed at f16 bits 9-11 (magnitude) and 15 (sign) are
 * the f16 e2m1 * 2^-14, exactly (exponent 0 lands on f16 subnormals the same way). An
 * E4M3 byte's low seven bits at f16 bits 7-13 are e4m3 * 2^-8, exactly; times 2^15 the
 * block scale t = e4m3 * 2^7 (at most 57344). Their product, one HMUL2 per two elements,
 * is e2m1 * e4m3 * 2^-7, exact in f16: an integer of at most 8 bits times 2^-17 or more,
 * at most 21. So the tensor cores (WMMA 16x16x16, f16 in, f32 accumulate: SM70) see W up
 * to the power of two and the per-matrix factor 128 * scale2, applied to each f32 sum
 * (128 * row_scale2[r] on row r when the weight has per-row scales).
 * Nothing here needs FP4/FP8 hardware: bit operations and f16 multiplies only.
 *
 * Arrangement (prepare_weight), for 16-byte coalesced loads in the order the kernel reads:
 * rows in tiles of 16, columns in steps of 64. Tile t, step s is 32 lanes' 16 bytes
 * (512 contiguous bytes): lane l holds row 16t + l / 2, columns 64s + 32 (l % 2) .. + 31,
 * as four 32-bit words of 8 elements each, element 2j in nibble j and 2j + 1 in nibble
 * j + 4 (so one shift and mask yields the f16 pair (2j, 2j + 1)). Steps follow each other
 * within a tile, tiles each other: data is [tiles][steps][32][16 bytes]. The scales are
 * [tiles][steps][32] uint16, lane l's two block scales (columns +0..15 in the low byte,
 * +16..31 in the high), one coalesced 64-byte request a warp step: the stream is a ninth
 * of the bytes, and a u16 per step keeps the step loop free of register-indexed arrays.
 * Rows and columns past the matrix are zero codes and zero scales.
 *
 * The kernel: a block takes MT row tiles (MT = 2 on matrices tall enough to still give
 * two blocks an SM, else 1); its 8 warps split the column steps, each streams its steps
 * PF ahead in registers, decodes the codes into its own shared stage with the x tile (n
 * rows padded to 16 with zeros), multiplies there, and the block adds the warps' partial
 * tiles at the end, as matmul.cu's tensor-core GEMV does. Each weight byte is read once
 * per launch for all of its rows of x.
 *
 * Other paths:
 * - n > 16: the same kernel over x in slices of 16 rows (W read once a slice).
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

#define FP4_KS 64          /* columns a step: 16 rows x 64 columns = 32 lanes x 16 bytes */
#define FP4_LD (FP4_KS + 8) /* staged row stride in halves: rows 16 bytes apart in banks */
#define FP4_WARPS 8
#define FP4_PF 2           /* steps loaded ahead */
#define FP4_ROWS_MAX 16    /* rows of x a launch takes */

/* Shared memory of one warp: its decoded W tiles and the x tile, FP4_LD halves a row. */
template <int MT> struct fp4_stage {
	static constexpr size_t bytes = (size_t)(16 * MT + 16) * FP4_LD * sizeof(__half);
};

static __device__ __forceinline__ __half2 u32_as_half2(uint32_t u)
{
	union {
		uint32_t u;
		__half2 h;
	} v;

	v.u = u;
	return v.h;
}

static __device__ __forceinline__ uint32_t half2_as_u32(__half2 h)
{
	union {
		uint32_t u;
		__half2 h;
	} v;

	v.h = h;
	return v.u;
}

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
	uint4 r;

	r.x = ((w << 9) & 0x0e000e00u) | ((w << 12) & 0x80008000u);
	r.y = ((w << 5) & 0x0e000e00u) | ((w << 8) & 0x80008000u);
	r.z = ((w << 1) & 0x0e000e00u) | ((w << 4) & 0x80008000u);
	r.w = ((w >> 3) & 0x0e000e00u) | (w & 0x80008000u);
	r.x = half2_as_u32(__hmul2(u32_as_half2(r.x), t));
	r.y = half2_as_u32(__hmul2(u32_as_half2(r.y), t));
	r.z = half2_as_u32(__hmul2(u32_as_half2(r.z), t));
	r.w = half2_as_u32(__hmul2(u32_as_half2(r.w), t));
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

/* Byte offset of element (r, k)'s code in the arranged layout, its nibble's shift, and
 * the offset of its scale byte (see the file comment). */
static __host__ __device__ __forceinline__ void fp4_arranged_at(int r, int k, int nsteps,
								 size_t *code, int *shift,
								 size_t *scale)
{
	const int lane = (r % 16) * 2 + (k % 64) / 32, e = k % 32;
	const size_t unit = ((size_t)(r / 16) * nsteps + k / 64) * 32 + lane;
	const int j8 = e % 8, nib = j8 / 2 + 4 * (j8 & 1);

	*code = unit * 16 + (size_t)(e / 8) * 4 + nib / 2;
	*shift = 4 * (nib & 1);
	*scale = unit * 2 + e / 16;
}

/* The element (e2m1 * e4m3) * scale2 in f32, as the CPU twin rounds it. */
static __device__ __forceinline__ float fp4_element(uint8_t code, uint8_t sc, float scale2)
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
		size_t co, so;
		int shift;
		uint8_t code;

		if (arranged) {
			fp4_arranged_at(r, k, nsteps, &co, &shift, &so);
		} else {
			co = (size_t)r * (cols / 2) + k / 2;
			shift = 4 * (k & 1);
			so = (size_t)r * (cols / 16) + k / 16;
		}
		code = (uint8_t)((codes[co] >> shift) & 15);
		s += __half2float(xr[k]) * fp4_element(code, scales[so], scale2);
	}
	if (y_f32)
		((float *)y)[(size_t)i * rows + r] = s;
	else
		((__half *)y)[(size_t)i * rows + r] = __float2half_rn(s);
}

template <int MT, int NI>
static void fp4_launch(struct sm70__cuda *c, void *y, int y_f32, const __half *x,
		       const struct sm70_weight *w, int n)
{
	static uint64_t attr_set; /* a bit per device: the attribute is per device */
	const size_t smem = FP4_WARPS * fp4_stage<MT>::bytes;
	const uint64_t bit = 1ull << (c->device & 63);
	const int n_tiles = (w->rows + 15) / 16;

	if (smem > 48 * 1024 && !(attr_set & bit)) {
		if (SM70_CUDA_CHECK(&c->be,
				    cudaFuncSetAttribute(fp4_gemv_kernel<MT, NI>,
							 cudaFuncAttributeMaxDynamicSharedMemorySize,
							 (int)smem)))
			return;
		attr_set |= bit;
	}
	fp4_gemv_kernel<MT, NI><<<(n_tiles + MT - 1) / MT, FP4_WARPS * 32, smem, c->stream>>>(
		y, y_f32, x, (const uint4 *)w->data, (const uint16_t *)w->scale, w->rows, w->cols,
		n, 128.0f * w->scale2, w->row_scale2);
}

/* Two row tiles a block (half the x re-reads) when that still gives two blocks an SM. */
static void fp4_dispatch(struct sm70__cuda *c, void *y, int y_f32, const __half *x,
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
		if (SM70_CUDA_LAUNCHED(be, "fp4_gemv_kernel"))
			return;
	}
}

/* ---- prepare_weight ------------------------------------------------------------------ */

/* ModelOpt's [rows][cols / 2] codes and [rows][cols / 16] scales into the arrangement
 * (host buffers of the arranged sizes, zeroed by the caller). */
static void fp4_arrange(uint8_t *codes, uint8_t *scales, const struct sm70_weight *src)
{
	const int rows = src->rows, cols = src->cols, nsteps = (cols + FP4_KS - 1) / FP4_KS;
	const uint8_t *sc = (const uint8_t *)src->data, *ss = (const uint8_t *)src->scale;

	for (int r = 0; r < rows; r++) {
		const uint8_t *row = sc + (size_t)r * (cols / 2);

		for (int k = 0; k < cols; k++) {
			const uint8_t code = (uint8_t)((row[k / 2] >> (4 * (k & 1))) & 15);
			size_t co, so;
			int shift;

			fp4_arranged_at(r, k, nsteps, &co, &shift, &so);
			codes[co] |= (uint8_t)(code << shift);
			if (k % 16 == 0)
				scales[so] = ss[(size_t)r * (cols / 16) + k / 16];
		}
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
		const size_t units = (size_t)((src->rows + 15) / 16) *
				     ((src->cols + FP4_KS - 1) / FP4_KS) * 32;

		n_codes = units * 16;
		n_scales = units * 2;
		codes = (uint8_t *)calloc(n_codes, 1);
		scales = (uint8_t *)calloc(n_scales, 1);
		if (!codes || !scales) {
			ret = -ENOMEM;
			goto out;
		}
		fp4_arrange(codes, scales, src);
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
