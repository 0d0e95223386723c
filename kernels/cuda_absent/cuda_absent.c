/*
 * cuda_absent.c - stands in for the CUDA backend in builds without CUDA (CUDA=0, or no
 * nvcc found), so callers link the same symbols and get a clear error at run time.
 */
#include <errno.h>

#include "kernels/backend.h"

int sm70_backend_cuda_create(struct sm70_backend **out, int device, struct sm70_err *err)
{
	if (out)
		*out = NULL;
	return sm70_errf(err, -ENODEV,
			 "sm70 was built without CUDA support (rebuild with CUDA=1)");
}

int sm70_kernel_times(struct sm70_kernel_time *out, int max, int reset)
{
	(void)out;
	(void)max;
	(void)reset;
	return 0;
}

int sm70_kernel_timeline(struct sm70_kernel_time *out, int max)
{
	(void)out;
	(void)max;
	return 0;
}
