/*
 * head_norm_rope.cu - the CUDA head_norm_rope op: per-head RMSNorm (Qwen3's q_norm and
 * k_norm) and rotate-half RoPE, in place on f16 q or k rows that sit ld elements apart
 * (inside the stacked qkv matmul output).
 *
 * A block takes one row and four heads, one warp per head. The block first makes the
 * row's cos/sin table in shared memory (sm70__rope_table in cuda_check.h: with an f32
 * powf the angle at position 4000 could move by ~5e-4 rad from the CPU twin's).
 *
 * Non-goals: rope scaling (yarn, dynamic, linear), interleaved (GPT-J) pairs.
 */
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/pdl.h"

#define HEADS_PER_BLOCK 4

static __global__ void head_norm_rope_kernel(__half *qk, int ld, int n_heads, int head_dim,
					     const float *__restrict__ norm_w, float eps,
					     const int32_t *__restrict__ pos, int rot_dim,
					     float theta)
{
	sm70__pdl_enter();
	extern __shared__ float tab[]; /* cos [half], then sin [half] */
	const int half = rot_dim / 2;
	const int lane = threadIdx.x & 31;
	const int h = blockIdx.x * HEADS_PER_BLOCK + (threadIdx.x >> 5);
	const float fpos = (float)pos[blockIdx.y];
	__half *x = qk + (size_t)blockIdx.y * ld + (size_t)h * head_dim;
	float inv = 1.0f;

	sm70__rope_table(tab, rot_dim, fpos, theta);
	__syncthreads();
	if (h >= n_heads)
		return;
	if (norm_w)
		inv = sm70__head_rms_inv(x, head_dim, eps);
	for (int j = lane; j < half; j += 32) {
		float a = __half2float(x[j]), b = __half2float(x[j + half]);
		float cs = tab[j], sn = tab[half + j];

		if (norm_w) {
			a = (a * inv) * norm_w[j];
			b = (b * inv) * norm_w[j + half];
		}
		x[j] = __float2half_rn(a * cs - b * sn);
		x[j + half] = __float2half_rn(b * cs + a * sn);
	}
	if (norm_w)
		for (int k = rot_dim + lane; k < head_dim; k += 32)
			x[k] = __float2half_rn((__half2float(x[k]) * inv) * norm_w[k]);
}

/* See backend.h. rot_dim must be even and <= head_dim; theta is rounded to f32 first, as
 * PyTorch does with the rope_theta scalar. */
extern "C" void sm70__cuda_head_norm_rope(struct sm70_backend *be, void *qk, int ld, int n,
					  int n_heads, int head_dim, const float *norm_w,
					  float eps, const int32_t *pos, int rot_dim,
					  double theta)
{
	struct sm70__cuda *c = sm70__cuda_enter(be);
	dim3 grid((n_heads + HEADS_PER_BLOCK - 1) / HEADS_PER_BLOCK, n);
	size_t smem = (size_t)(rot_dim / 2) * 2 * sizeof(float);

	if (n <= 0 || n_heads <= 0 || head_dim <= 0)
		return;
	if (rot_dim < 0 || rot_dim > head_dim || (rot_dim & 1)) {
		sm70__cuda_fail(be, "head_norm_rope", __FILE__, __LINE__, "bad rot_dim");
		return;
	}
	sm70__launch_pdl(c, SM70__PDL_ROPE, head_norm_rope_kernel, dim3(grid),
			 dim3(HEADS_PER_BLOCK * 32), smem, (__half *)qk, ld, n_heads, head_dim,
			 norm_w, eps, pos, rot_dim, (float)theta);
	SM70_CUDA_LAUNCHED(be, "head_norm_rope_kernel");
}
