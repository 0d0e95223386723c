/*
 * bench_util.h - what sm70-bench's CUDA sections (bench.cu, bench_gdn.cu, bench_moe.cu)
 * share: the check that ends a benchmark function on a failed CUDA call, and the hash
 * their input-filling kernels draw values from. C++ (nvcc) only.
 */
#ifndef SM70_KERNELS_CUDA_BENCH_UTIL_H
#define SM70_KERNELS_CUDA_BENCH_UTIL_H

#include <cuda_runtime.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>

/* Logs a failed call as "file:line: call: message", sets ret to -EIO and jumps to the
 * function's `out` label (which releases what the function holds). */
#define SM70_BENCH_CHECK(call)                                                           \
	do {                                                                             \
		cudaError_t e_ = (call);                                                 \
		if (e_ != cudaSuccess) {                                                 \
			fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,    \
				cudaGetErrorString(e_));                                 \
			ret = -EIO;                                                      \
			goto out;                                                        \
		}                                                                        \
	} while (0)

/* The splitmix64/murmur finaliser folded to 32 bits: benchmark inputs as a function of
 * (seed, index), the same on every launch configuration. */
/* unused by some including files: no -Wunused-function for them */
static __attribute__((unused)) __device__ __forceinline__ uint32_t
sm70__bench_hash(uint64_t x)
{
	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdULL;
	x ^= x >> 33;
	x *= 0xc4ceb9fe1a85ec53ULL;
	x ^= x >> 33;
	return (uint32_t)x;
}

#endif
