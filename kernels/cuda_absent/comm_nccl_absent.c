/*
 * comm_nccl_absent.c - stands in for the NCCL communicator (kernels/cuda/comm_nccl.cu) in
 * builds without CUDA, or with CUDA but without NCCL (SM70_NO_NCCL: Debian has no NCCL
 * package, so a V100 build from its nvidia-cuda-toolkit has none), so callers link the
 * same symbol and get a clear error at run time.
 */
#include <errno.h>

#include "kernels/comm.h"

int sm70_comm_nccl_create(struct sm70_comm **out, struct sm70_backend *const be[], int n,
			  struct sm70_err *err)
{
	if (out)
		*out = NULL;
#ifdef SM70_NO_NCCL
	return sm70_errf(err, -ENODEV,
			 "sm70 was built without NCCL (nccl.h was not found at build time), so "
			 "tensor parallelism over GPUs is not available; install NCCL and rebuild "
			 "with NCCL=1, or run with tp 1");
#else
	return sm70_errf(err, -ENODEV,
			 "sm70 was built without CUDA support, so without NCCL (rebuild with "
			 "CUDA=1)");
#endif
}
