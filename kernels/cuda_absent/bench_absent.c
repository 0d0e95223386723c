/*
 * bench_absent.c - the sm70-bench helpers in builds without CUDA: they report that no
 * device is there, so the tool can say so and exit.
 */
#include <errno.h>
#include <stdio.h>

#include "kernels/cuda/bench.h"

int sm70__bench_available(void)
{
	return 0;
}

int sm70__bench_open(int device, char *desc, size_t desc_len, char *msg, size_t msg_len)
{
	if (msg && msg_len)
		snprintf(msg, msg_len, "built without CUDA");
	return -ENODEV;
}

void sm70__bench_close(void)
{
}

int sm70__bench_bw(size_t bytes, int iters, double *read_gbs, double *copy_gbs)
{
	return -ENODEV;
}

int sm70__bench_gemv(int rows, int cols, int n, int iters, struct sm70__bench_gemv *out)
{
	return -ENODEV;
}

int sm70__bench_nvfp4(int rows, int cols, const int *ns, int n_ns, const int *variants,
		      int n_var, int iters, struct sm70__bench_nvfp4 *out)
{
	return -ENODEV;
}

int sm70__bench_attention(int n_heads, int n_kv, int D, int kv, int batch, int ctx,
			  int iters, struct sm70__bench_attn *out)
{
	return -ENODEV;
}

int sm70__bench_kv_read(int n_heads, int n_kv, int D, int kv, int batch, int ctx, int walk,
			int iters, struct sm70__bench_attn *out)
{
	return -ENODEV;
}

int sm70__bench_prefill(int n_heads, int n_kv, int D, int kv, int chunk, int ctx,
			int iters, struct sm70__bench_prefill *out)
{
	return -ENODEV;
}
