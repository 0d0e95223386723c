/*
 * comm_nccl_absent.c - stands in for the NCCL communicator (kernels/cuda/comm_nccl.cu) in
 * builds without CUDA, so callers link the same symbol and get a clear error at run time.
 */
#include <errno.h>

#include "kernels/comm.h"

int sm70_comm_nccl_create(struct sm70_comm **out, struct sm70_backend *const be[], int n,
			  struct sm70_err *err)
{
	if (out)
		*out = NULL;
	return sm70_errf(err, -ENODEV,
			 "sm70 was built without CUDA support, so without NCCL (rebuild with "
			 "CUDA=1)");
}
