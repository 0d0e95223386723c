/*
 * kv_write.cu - the CUDA kv_write op: new K and V rows (f16, inside the qkv matmul output)
 * into their paged-cache slots, each as f16 or as FP8-E4M3 of x / scale (kv_pair.h's
 * pairs: both f16, both FP8, or K FP8 with V f16).
 *
 * The FP8 encoding is done in integer arithmetic (round to nearest even, saturating at
 * +-448, NaN to 0x7f), bit-for-bit the encoder in common/dtype.c, so it needs no FP8
 * hardware (SM75 has none) and a cache written here equals one written by the CPU twin.
 * The division x / scale is IEEE f32 in both (nvcc's default -prec-div=true).
 *
 * Non-goals: per-head or per-token scales; a native cvt path on SM89+ (the software
 * encode is a handful of integer ops per element on a tiny tensor).
 */
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/kv_pair.h"
#include "kernels/cuda/pdl.h"

/* One value into a cache array: FP8 as e4m3(x / scale), else the f16 as it is. */
template <bool FP8>
static __device__ __forceinline__ void kv_put(void *cache, size_t i, __half x, float scale)
{
	if (FP8)
		((uint8_t *)cache)[i] = sm70__f32_to_e4m3(__half2float(x) / scale);
	else
		((__half *)cache)[i] = x;
}

template <bool KF8, bool VF8>
static __global__ void kv_write_kernel(void *kc, void *vc, const __half *__restrict__ k,
				       const __half *__restrict__ v, int ld,
				       const int32_t *__restrict__ slots, long n_slots, int row,
				       float k_scale, float v_scale)
{
	sm70__pdl_enter();
	const int32_t slot = slots[blockIdx.x];
	const __half *ks = k + (size_t)blockIdx.x * ld;
	const __half *vs = v + (size_t)blockIdx.x * ld;
	const size_t base = (size_t)slot * row;

	/* A negative slot marks a padding row; one past the cache must not become a wild
	 * write. */
	if (slot < 0 || slot >= n_slots)
		return;
	for (int d = threadIdx.x; d < row; d += blockDim.x) {
		kv_put<KF8>(kc, base + d, ks[d], k_scale);
		kv_put<VF8>(vc, base + d, vs[d], v_scale);
	}
}

/* See backend.h. K/V dtypes one of kv_pair.h's pairs; rows whose slot is negative or
 * beyond the cache are skipped. */
extern "C" void sm70__cuda_kv_write(struct sm70_backend *be, const struct sm70_kv_layer *kv,
				    const struct sm70_kv_layout *lay, const void *k,
				    const void *v, int ld, const int32_t *slots, int n)
{
	struct sm70__cuda *c = sm70__cuda_enter(be);
	const int row = lay->n_kv_heads * lay->head_dim;
	const long n_slots = (long)lay->n_blocks * lay->block_size;
	const int threads = row >= 256 ? 256 : 128;
	const enum sm70__kv_pair pair = sm70__kv_pair_of(lay);

	if (n <= 0 || row <= 0)
		return;
	if (pair == SM70__KV_NONE) {
		sm70__cuda_fail(be, "kv_write", __FILE__, __LINE__, "unsupported KV dtypes");
		return;
	}
	sm70__kv_pair_call(pair, [&](auto kf8, auto vf8) {
		sm70__launch_pdl(c, SM70__PDL_ROPE,
				 kv_write_kernel<decltype(kf8)::value, decltype(vf8)::value>,
				 dim3(n), dim3(threads), 0, kv->k, kv->v, (const __half *)k,
				 (const __half *)v, ld, slots, n_slots, row, kv->k_scale,
				 kv->v_scale);
	});
	SM70_CUDA_LAUNCHED(be, "kv_write_kernel");
}
