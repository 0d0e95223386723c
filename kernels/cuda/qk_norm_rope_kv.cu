/*
 * qk_norm_rope_kv.cu - the CUDA qk_norm_rope_kv op: on each row of the stacked qkv matmul
 * output (f16), the per-head RMSNorm and rotate-half RoPE of the q and k heads in place,
 * and the row's rotated k and its v into their paged-cache slot (each f16 or FP8-E4M3 of
 * x / scale, one of kv_pair.h's pairs). One launch where the unfused model makes three
 * (head_norm_rope on q, on k, then kv_write).
 *
 * Layout of the work: a row's heads are numbered q (n_heads), then k (n_kv_heads), then v
 * (n_kv_heads); a block takes one row and four consecutive heads, one warp per head. A q
 * warp does head_norm_rope.cu's work; a k warp does it too and stores each value it
 * writes back into the cache as well; a v warp copies its head into the cache. Blocks that
 * hold a q or k head first make the row's cos/sin table in shared memory.
 *
 * Numerics are head_norm_rope.cu's and kv_write.cu's, operation for operation: the same
 * table (inv_freq = 1 / theta^(2j / rot_dim) with the power taken in double and rounded,
 * angle = (float)pos * inv_freq, cosf/sinf), the same lane-strided sum of squares and warp
 * reduction, the same f16 rounding of each result, and the cache gets that f16 value (FP8:
 * the f16 value as f32 divided by the scale in IEEE f32, encoded with RNE and saturation as
 * common/dtype.c does). So qkv and cache come out equal to the three separate ops.
 *
 * Non-goals: rope scaling, interleaved pairs, per-head or per-token KV scales.
 */
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/kv_pair.h"
#include "kernels/cuda/pdl.h"

#define HEADS_PER_BLOCK 4

/* Stores f16 value v at element i of a cache array in its dtype. */
template <bool FP8>
static __device__ __forceinline__ void cache_put(void *cache, size_t i, __half v, float scale)
{
	if (FP8)
		((uint8_t *)cache)[i] = sm70__f32_to_e4m3(__half2float(v) / scale);
	else
		((__half *)cache)[i] = v;
}

template <bool KF8, bool VF8>
static __global__ void qk_norm_rope_kv_kernel(__half *qkv, int ld, int n_heads, int n_kv_heads,
					      int head_dim, const float *__restrict__ q_norm,
					      const float *__restrict__ k_norm, float eps,
					      const int32_t *__restrict__ pos, int rot_dim,
					      float theta, void *kc, void *vc,
					      const int32_t *__restrict__ slots, long n_slots,
					      float k_scale, float v_scale)
{
	sm70__pdl_enter();
	extern __shared__ float tab[]; /* cos [half], then sin [half] */
	const int half = rot_dim / 2;
	const int lane = threadIdx.x & 31;
	const int n_rot = n_heads + n_kv_heads; /* heads that are normed and rotated */
	const int h = blockIdx.x * HEADS_PER_BLOCK + (threadIdx.x >> 5);
	const int32_t slot = slots[blockIdx.y];
	/* a negative slot marks a padding row, one past the cache a caller bug: the row is
	 * still rotated in place (as head_norm_rope would) but nothing goes to the cache */
	const bool to_cache = slot >= 0 && slot < n_slots;
	__half *x = qkv + (size_t)blockIdx.y * ld + (size_t)h * head_dim;
	const float *norm_w;
	size_t c0; /* the head's first element in the cache */
	float inv = 1.0f;

	if (blockIdx.x * HEADS_PER_BLOCK < n_rot) /* uniform over the block */
		sm70__rope_table(tab, rot_dim, (float)pos[blockIdx.y], theta);
	__syncthreads();
	if (h >= n_rot + n_kv_heads)
		return;
	if (h >= n_rot) {
		/* a v head: straight into the cache */
		if (!to_cache)
			return;
		c0 = ((size_t)slot * n_kv_heads + (h - n_rot)) * head_dim;
		for (int k = lane; k < head_dim; k += 32)
			cache_put<VF8>(vc, c0 + k, x[k], v_scale);
		return;
	}

	const bool is_k = h >= n_heads;
	const bool store = is_k && to_cache;

	norm_w = is_k ? k_norm : q_norm;
	c0 = is_k ? ((size_t)slot * n_kv_heads + (h - n_heads)) * head_dim : 0;
	if (norm_w)
		inv = sm70__head_rms_inv(x, head_dim, eps);
	for (int j = lane; j < half; j += 32) {
		float a = __half2float(x[j]), b = __half2float(x[j + half]);
		float cs = tab[j], sn = tab[half + j];
		__half ra, rb;

		if (norm_w) {
			a = (a * inv) * norm_w[j];
			b = (b * inv) * norm_w[j + half];
		}
		ra = __float2half_rn(a * cs - b * sn);
		rb = __float2half_rn(b * cs + a * sn);
		x[j] = ra;
		x[j + half] = rb;
		if (store) {
			cache_put<KF8>(kc, c0 + j, ra, k_scale);
			cache_put<KF8>(kc, c0 + j + half, rb, k_scale);
		}
	}
	/* dims past rot_dim: normed in place, and (k) copied to the cache normed or not */
	if (norm_w || store) {
		for (int k = rot_dim + lane; k < head_dim; k += 32) {
			__half v = x[k];

			if (norm_w) {
				v = __float2half_rn((__half2float(v) * inv) * norm_w[k]);
				x[k] = v;
			}
			if (store)
				cache_put<KF8>(kc, c0 + k, v, k_scale);
		}
	}
}

/* See backend.h. rot_dim must be even and <= head_dim; theta is rounded to f32 first, as
 * head_norm_rope does; lay must describe n_kv_heads heads of head_dim; K/V dtypes one of
 * kv_pair.h's pairs. Rows whose slot is negative or beyond the cache are rotated but not cached. */
extern "C" void sm70__cuda_qk_norm_rope_kv(struct sm70_backend *be, void *qkv, int ld, int n,
					   int n_heads, int n_kv_heads, int head_dim,
					   const float *q_norm, const float *k_norm, float eps,
					   const int32_t *pos, int rot_dim, double theta,
					   const struct sm70_kv_layer *kv,
					   const struct sm70_kv_layout *lay, const int32_t *slots)
{
	struct sm70__cuda *c = sm70__cuda_enter(be);
	const int heads = n_heads + 2 * n_kv_heads;
	const long n_slots = (long)lay->n_blocks * lay->block_size;
	dim3 grid((heads + HEADS_PER_BLOCK - 1) / HEADS_PER_BLOCK, n);
	size_t smem = (size_t)(rot_dim / 2) * 2 * sizeof(float);
	const enum sm70__kv_pair pair = sm70__kv_pair_of(lay);

	if (n <= 0 || n_heads <= 0 || n_kv_heads <= 0 || head_dim <= 0)
		return;
	if (rot_dim < 0 || rot_dim > head_dim || (rot_dim & 1)) {
		sm70__cuda_fail(be, "qk_norm_rope_kv", __FILE__, __LINE__, "bad rot_dim");
		return;
	}
	if (lay->n_kv_heads != n_kv_heads || lay->head_dim != head_dim) {
		sm70__cuda_fail(be, "qk_norm_rope_kv", __FILE__, __LINE__,
				"KV layout does not match the heads");
		return;
	}
	if (pair == SM70__KV_NONE) {
		sm70__cuda_fail(be, "qk_norm_rope_kv", __FILE__, __LINE__,
				"unsupported KV dtypes");
		return;
	}
	sm70__kv_pair_call(pair, [&](auto kf8, auto vf8) {
		sm70__launch_pdl(c, SM70__PDL_ROPE,
				 qk_norm_rope_kv_kernel<decltype(kf8)::value, decltype(vf8)::value>,
				 dim3(grid), dim3(HEADS_PER_BLOCK * 32), smem, (__half *)qkv, ld,
				 n_heads, n_kv_heads, head_dim, q_norm, k_norm, eps, pos, rot_dim,
				 (float)theta, kv->k, kv->v, slots, n_slots, kv->k_scale,
				 kv->v_scale);
	});
	SM70_CUDA_LAUNCHED(be, "qk_norm_rope_kv_kernel");
}
