/*
 * bench_gdn_absent.c - the `sm70-bench gdn` helpers (and the bench backend accessor) in
 * builds without CUDA: they report that no device is there.
 */
#include <errno.h>
#include <stddef.h>

#include "kernels/cuda/bench.h"

struct sm70_backend *sm70__bench_backend(void)
{
	return NULL;
}

int sm70__bench_gdn_decode(int n_k_heads, int n_v_heads, int k_dim, int v_dim, int batch,
			   int cols, int hints, int iters, struct sm70__bench_gdn_decode *out)
{
	return -ENODEV;
}

int sm70__bench_gdn_prefill(int n_k_heads, int n_v_heads, int k_dim, int v_dim, int tokens,
			    int iters, struct sm70__bench_gdn_prefill *out)
{
	return -ENODEV;
}
