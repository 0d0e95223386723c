/*
 * bench_moe_absent.c - the `sm70-bench moe` helper in builds without CUDA: it reports that
 * no device is there.
 */
#include <errno.h>
#include <stddef.h>

#include "kernels/cuda/bench.h"

int sm70__bench_moe(int hidden, int inter, int n_experts, int top_k, int batch, int iters,
		    struct sm70__bench_moe *out)
{
	return -ENODEV;
}
