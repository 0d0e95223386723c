/*
 * kv_pair.h - the K/V dtype pairs the CUDA KV kernels are built for, and the one switch
 * from a layout's pair to a kernel instance.
 *
 * Every kernel that reads or writes the paged cache is templated on two bools, K in FP8
 * and V in FP8, and instantiated for the pairs below only: f16/f16, FP8-E4M3/FP8-E4M3,
 * and FP8-E4M3 K with f16 V (the "fp8" mode: V's E4M3 rounding is what costs accuracy).
 * f16 K with FP8 V would be a fourth copy of every kernel, for every GPU target, that
 * nobody asked for. cuda_backend.cu's kv_v_dtypes says the same to the engine.
 *
 * C++ (nvcc) only.
 */
#ifndef SM70_KERNELS_CUDA_KV_PAIR_H
#define SM70_KERNELS_CUDA_KV_PAIR_H

#include <type_traits>

#include "kernels/backend.h"

enum sm70__kv_pair {
	SM70__KV_F16,   /* K and V f16 */
	SM70__KV_FP8,   /* K and V FP8-E4M3 */
	SM70__KV_FP8_K, /* K FP8-E4M3, V f16 */
	SM70__KV_NONE,  /* a pair no kernel is built for */
};

static inline enum sm70__kv_pair sm70__kv_pair_of(const struct sm70_kv_layout *lay)
{
	const enum sm70_dtype k = lay->dtype, v = sm70_kv_v_dtype(lay);

	if (k == SM70_DTYPE_F16 && v == SM70_DTYPE_F16)
		return SM70__KV_F16;
	if (k == SM70_DTYPE_F8E4M3 && v == SM70_DTYPE_F8E4M3)
		return SM70__KV_FP8;
	if (k == SM70_DTYPE_F8E4M3 && v == SM70_DTYPE_F16)
		return SM70__KV_FP8_K;
	return SM70__KV_NONE;
}

static inline int sm70__kv_pair_k_fp8(enum sm70__kv_pair p)
{
	return p == SM70__KV_FP8 || p == SM70__KV_FP8_K;
}

static inline int sm70__kv_pair_v_fp8(enum sm70__kv_pair p)
{
	return p == SM70__KV_FP8;
}

/* f(kf8, vf8) with std::true_type / std::false_type for K and V in FP8, for a pair that
 * is not SM70__KV_NONE (the caller refuses that first). Inside f the flags are
 * decltype(kf8)::value, constants a template argument can take. */
template <class F> static inline auto sm70__kv_pair_call(enum sm70__kv_pair p, F f)
{
	switch (p) {
	case SM70__KV_FP8:
		return f(std::true_type(), std::true_type());
	case SM70__KV_FP8_K:
		return f(std::true_type(), std::false_type());
	default:
		return f(std::false_type(), std::false_type());
	}
}

#endif
