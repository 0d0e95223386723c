/*
 * hc_mix.cu - the CUDA hc_mix op (kernels/backend.h): one token's hyper-connection mixer
 * (qwen4_exp) in two launches instead of five, for batch-1 decode, where the mixer's
 * small matrices (about 5 MB each at the real scale) are launch- and latency-bound.
 *
 * Pass 1 (down): a block owns one stream s and a band of 8 rows of the down | inject
 * matrix. It sums the squares of the stream's dim values itself (cheap: 8 KiB of f32 at
 * dim 2048, from L2 after the first block), stages xn = f16((x * inv) * norm) for that
 * stream in shared memory (the blocks of row band 0 also write it out for pass 2), and
 * each warp dots one row's dim columns of that stream with 16-byte weight loads, all of
 * them issued before the first is used. The S per-stream partial sums of a row go to
 * part[s][row]: splitting by stream gives the grid S times more blocks than rows alone
 * and keeps every block's normalisation local.
 *
 * Pass 2 (up + combine): every block first makes z = f16(silu(f / S)) from the partials
 * (f = the partials added s ascending; 1.3 KB of L2 per block), block 0 the inject gates
 * 2 sigmoid(f / S); then each warp produces output values j: its four 8-lane groups take
 * the up rows s * dim + j of the four streams, u rounds to f16 as the composed path
 * stores it, and y[j] = f16(sum over s ascending of sigmoid(u) * xn, over S).
 *
 * The same roundings as the composed ops (group_rmsnorm, matmul, hc_gates, matmul,
 * hc_combine); only the order of the f32 sums differs (the dots, the norm's sum of squares).
 * tests/gpu/test_cuda_hc_ple.c checks it against the CPU composition.
 *
 * Non-goals: more than one token (the composed ops serve batches), more than 4 streams,
 * NVFP4 mixer weights, dims or ranks that are not multiples of 8.
 */
#include <errno.h>
#include <stdint.h>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/pdl.h"

#define MIX_WARPS 8      /* warps per block, both passes */
#define DOWN_ROWS 8      /* pass 1: rows per block, one a warp */
#define UP_J 2           /* pass 2: output values per warp */
#define MIX_MAX_RANK 4096

static __device__ __forceinline__ float mix_sigmoid(float v)
{
	return 1.0f / (1.0f + expf(-v));
}

/* Eight f16 products of a 16-byte weight load and 16 bytes of f16 activations. */
static __device__ __forceinline__ float dot8(uint4 w, uint4 x)
{
	const __half2 *wh = (const __half2 *)&w, *xh = (const __half2 *)&x;
	float acc = 0.0f;

#pragma unroll
	for (int e = 0; e < 4; e++) {
		const float2 a = __half22float2(wh[e]), b = __half22float2(xh[e]);

		acc += a.x * b.x + a.y * b.y;
	}
	return acc;
}

/* grid (row bands, S); dynamic shared memory: dim halfs. */
static __global__ void __launch_bounds__(MIX_WARPS * 32)
	hc_mix_down_kernel(float *__restrict__ part, __half *__restrict__ xn_out,
			   const float *__restrict__ x, const float *__restrict__ norm,
			   const __half *__restrict__ w, int rows, int width, int dim, float eps)
{
	sm70__pdl_enter();
	extern __shared__ uint4 xs_raw[];
	__half *xs = (__half *)xs_raw;
	__shared__ float red[MIX_WARPS];
	const int s = blockIdx.y, lane = threadIdx.x & 31, wp = threadIdx.x >> 5;
	const int row = blockIdx.x * DOWN_ROWS + wp;
	const int S = gridDim.y;
	const float *xs32 = x + (size_t)s * dim, *ns = norm + (size_t)s * dim;
	const __half *wr = w + (size_t)row * S * dim + (size_t)s * dim;
	float ss = 0.0f, inv, acc = 0.0f;
	uint4 wv[8];

	/* the row's first loads go out before the norm: the longest wait */
#pragma unroll
	for (int u = 0; u < 8; u++) {
		const int k = (u * 32 + lane) * 8;

		if (row < width && k < dim)
			wv[u] = __ldg((const uint4 *)(wr + k));
	}
	for (int k = threadIdx.x; k < dim; k += MIX_WARPS * 32)
		ss += xs32[k] * xs32[k];
	ss = sm70__warp_sum(ss);
	if (lane == 0)
		red[wp] = ss;
	__syncthreads();
	ss = 0.0f;
	for (int i = 0; i < MIX_WARPS; i++)
		ss += red[i];
	inv = 1.0f / sqrtf(ss / (float)dim + eps);
	for (int k = threadIdx.x; k < dim; k += MIX_WARPS * 32) {
		const __half v = __float2half_rn((xs32[k] * inv) * ns[k]);

		xs[k] = v;
		if (blockIdx.x == 0)
			xn_out[(size_t)s * dim + k] = v;
	}
	__syncthreads();
	if (row >= width)
		return;
	for (int k0 = 0; k0 < dim; k0 += 8 * 256) {
#pragma unroll
		for (int u = 0; u < 8; u++) {
			const int k = k0 + (u * 32 + lane) * 8;

			if (k < dim) {
				if (k0 > 0)
					wv[u] = __ldg((const uint4 *)(wr + k));
				acc += dot8(wv[u], *(const uint4 *)(xs + k));
			}
		}
	}
	acc = sm70__warp_sum(acc);
	if (lane == 0)
		part[(size_t)s * rows + row] = acc;
}

/* grid (ceil(dim / (MIX_WARPS * UP_J))); dynamic shared memory: rank halfs. */
static __global__ void __launch_bounds__(MIX_WARPS * 32)
	hc_mix_up_kernel(__half *__restrict__ y, float *__restrict__ inj,
			 const float *__restrict__ part, const __half *__restrict__ xn,
			 const __half *__restrict__ up, int rows, int S, int dim, int rank)
{
	sm70__pdl_enter();
	extern __shared__ uint4 zs_raw[];
	__half *zs = (__half *)zs_raw;
	const int lane = threadIdx.x & 31, wp = threadIdx.x >> 5;
	const int g = lane >> 3, li = lane & 7; /* stream group, lane in it */
	const int chunks = rank / 8;
	float acc[UP_J];
	uint4 wv[UP_J][8];
	int j[UP_J];

	/* the up rows first; z is ready by the time they arrive */
#pragma unroll
	for (int q = 0; q < UP_J; q++) {
		j[q] = (blockIdx.x * MIX_WARPS + wp) * UP_J + q;
		acc[q] = 0.0f;
#pragma unroll
		for (int u = 0; u < 8; u++) {
			const int c = u * 8 + li;

			if (g < S && j[q] < dim && c < chunks)
				wv[q][u] = __ldg((const uint4 *)(up + ((size_t)g * dim + j[q]) * rank +
								 (size_t)c * 8));
		}
	}
	for (int r = threadIdx.x; r < rank; r += MIX_WARPS * 32) {
		float f = 0.0f, v;

		for (int s = 0; s < S; s++)
			f += part[(size_t)s * rows + r];
		v = f / (float)S;
		zs[r] = __float2half_rn(v / (1.0f + expf(-v)));
	}
	if (inj && blockIdx.x == 0 && threadIdx.x < S) {
		float f = 0.0f;

		for (int s = 0; s < S; s++)
			f += part[(size_t)s * rows + rank + threadIdx.x];
		inj[threadIdx.x] = 2.0f / (1.0f + expf(-(f / (float)S)));
	}
	__syncthreads();
#pragma unroll
	for (int q = 0; q < UP_J; q++) {
		float t = 0.0f, sum = 0.0f;

		for (int c0 = 0; c0 < chunks; c0 += 64) {
#pragma unroll
			for (int u = 0; u < 8; u++) {
				const int c = c0 + u * 8 + li;

				if (g < S && j[q] < dim && c < chunks) {
					if (c0 > 0)
						wv[q][u] = __ldg((const uint4 *)(
							up + ((size_t)g * dim + j[q]) * rank +
							(size_t)c * 8));
					acc[q] += dot8(wv[q][u], *(const uint4 *)(zs + c * 8));
				}
			}
		}
		acc[q] += __shfl_xor_sync(0xffffffffu, acc[q], 1);
		acc[q] += __shfl_xor_sync(0xffffffffu, acc[q], 2);
		acc[q] += __shfl_xor_sync(0xffffffffu, acc[q], 4);
		if (g < S && j[q] < dim) {
			const float u16 = __half2float(__float2half_rn(acc[q]));

			t = __fmul_rn(mix_sigmoid(u16), __half2float(xn[(size_t)g * dim + j[q]]));
		}
		/* the streams' terms added s ascending, as hc_combine does */
		for (int s = 0; s < 4; s++) {
			const float ts = __shfl_sync(0xffffffffu, t, s * 8);

			if (s < S)
				sum = __fadd_rn(sum, ts);
		}
		if (lane == 0 && j[q] < dim)
			y[j[q]] = __float2half_rn(sum / (float)S);
	}
}

/* See backend.h. */
extern "C" int sm70__cuda_hc_mix(struct sm70_backend *be, void *y, float *inj, void *xn,
				 float *part, const float *x, const float *norm,
				 const struct sm70_weight *mix, const struct sm70_weight *up,
				 int streams, int dim, int rank, float eps)
{
	struct sm70__cuda *c = sm70__cuda_enter(be);
	const int width = rank + (inj ? streams : 0);

	/* batch invariance: the model takes this path for one token only, and its sums are
	 * in another order than the composed ops' it takes for more */
	if (c->be.batch_invariant || streams < 1 || streams > 4 || dim <= 0 || dim % 8 ||
	    rank <= 0 || rank % 8 ||
	    rank > MIX_MAX_RANK || mix->dtype != SM70_DTYPE_F16 || up->dtype != SM70_DTYPE_F16 ||
	    mix->cols != streams * dim || mix->rows < width || up->rows != streams * dim ||
	    up->cols != rank || (size_t)dim * 2 > c->smem_optin)
		return -ENOTSUP;
	if (dim * 2 > 48 * 1024 && sm70__cuda_smem_optin(c, (const void *)hc_mix_down_kernel))
		return -EIO;
	sm70__launch_pdl(c, SM70__PDL_HC, hc_mix_down_kernel,
			 dim3((unsigned)((width + DOWN_ROWS - 1) / DOWN_ROWS), (unsigned)streams),
			 dim3(MIX_WARPS * 32), (size_t)dim * 2, part, (__half *)xn, x, norm,
			 (const __half *)mix->data, mix->rows, width, dim, eps);
	SM70_CUDA_LAUNCHED(be, "hc_mix_down_kernel");
	sm70__launch_pdl(c, SM70__PDL_HC, hc_mix_up_kernel,
			 dim3((unsigned)((dim + MIX_WARPS * UP_J - 1) / (MIX_WARPS * UP_J))),
			 dim3(MIX_WARPS * 32), (size_t)rank * 2, (__half *)y, inj, part,
			 (const __half *)xn, (const __half *)up->data, mix->rows, streams, dim,
			 rank);
	return SM70_CUDA_LAUNCHED(be, "hc_mix_up_kernel");
}
