/*
 * comm_bench_absent.c - the `sm70-bench allreduce` helpers in builds without CUDA or
 * without NCCL (SM70_NO_NCCL): they say which, so the tool can report it and exit.
 */
#include <errno.h>
#include <stdio.h>

#include "kernels/cuda/comm_bench.h"

int sm70__comm_bench_open(int n_gpus, size_t max_bytes, struct sm70__comm_bench_info *info,
			  char *msg, size_t msg_len)
{
	if (msg && msg_len)
		snprintf(msg, msg_len, "built without %s",
#ifdef SM70_NO_NCCL
			 "NCCL (nccl.h was not found at build time)"
#else
			 "CUDA"
#endif
		);
	return -ENODEV;
}

void sm70__comm_bench_close(void)
{
}

int sm70__comm_bench_allreduce(int p2p, size_t count, int f16, int per, int iters,
			       struct sm70__comm_bench_time *out)
{
	return -ENODEV;
}
