/*
 * bench_moe_absent.c - the `sm70-bench moe` and `moe-nvfp4` helpers in builds without CUDA:
 * they report that no device is there.
 */
#include <errno.h>
#include <stddef.h>

#include "kernels/cuda/bench.h"

int sm70__bench_moe(int hidden, int inter, int n_experts, int top_k, int batch, int iters,
		    struct sm70__bench_moe *out)
{
	return -ENODEV;
}

int sm70__bench_moe_nvfp4(int hidden, int inter, int n_experts, int top_k, const int *batches,
			  int n_batches, int iters, struct sm70__bench_moe_nvfp4 *out)
{
	return -ENODEV;
}
