/*
 * gpu_test.h - helpers the GPU tests share: a reproducible random source, host vectors,
 * and backend buffers filled from the host. Each test defines GPU_TEST_SEED before
 * including this, so that every file draws its own stream.
 *
 * Header-only (static inline): tests are single files linked against the core library.
 */
#ifndef SM70_TESTS_GPU_GPU_TEST_H
#define SM70_TESTS_GPU_GPU_TEST_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include <errno.h>

#include "common/dtype.h"
#include "kernels/backend.h"

static uint64_t rng_state = GPU_TEST_SEED;

/* splitmix64: reproducible everywhere */
static inline uint64_t rng_next(void)
{
	uint64_t z = (rng_state += 0x9e3779b97f4a7c15ULL);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

/* uniform in [-amp, amp) */
static inline float rnd(float amp)
{
	return (float)((double)(rng_next() >> 11) * 0x1p-53 * 2.0 - 1.0) * amp;
}

/* uniform in 0..n-1 */
static inline int rnd_int(int n)
{
	return (int)(rng_next() % (uint64_t)n);
}

/* n zeroed floats (at least one), or the test fails. */
static inline float *fvec(size_t n)
{
	float *p = calloc(n ? n : 1, sizeof(float));

	assert_non_null(p);
	return p;
}

/* n random values in [-amp, amp), rounded to f16 so that every backend sees the same. */
static inline float *rvec16(size_t n, float amp)
{
	float *p = fvec(n);

	for (size_t i = 0; i < n; i++)
		p[i] = sm70_f16_to_f32(sm70_f32_to_f16(rnd(amp)));
	return p;
}

static inline void *balloc(struct sm70_backend *be, size_t bytes)
{
	void *p = be->ops->buf_alloc(be, bytes);

	assert_non_null(p);
	return p;
}

static inline void bfree(struct sm70_backend *be, void *p)
{
	be->ops->buf_free(be, p);
}

/* A backend copy of bytes of host memory. */
static inline void *up_bytes(struct sm70_backend *be, const void *src, size_t bytes)
{
	void *p = balloc(be, bytes);

	assert_int_equal(be->ops->upload(be, p, src, bytes), 0);
	return p;
}

/* A backend copy of n floats as the backend's act dtype (f32 on the CPU, f16 on CUDA). */
static inline void *up_act(struct sm70_backend *be, const float *v, size_t n)
{
	uint16_t *h;
	void *p;

	if (be->act_dtype == SM70_DTYPE_F32)
		return up_bytes(be, v, n * sizeof(float));
	h = malloc((n ? n : 1) * sizeof(*h));
	assert_non_null(h);
	for (size_t i = 0; i < n; i++)
		h[i] = sm70_f32_to_f16(v[i]);
	p = up_bytes(be, h, n * sizeof(*h));
	free(h);
	return p;
}

/* n act values of a backend buffer as floats in dst (f16 decoded on CUDA). */
static inline void get_act(struct sm70_backend *be, float *dst, const void *src, size_t n)
{
	uint16_t *h;

	if (be->act_dtype == SM70_DTYPE_F32) {
		assert_int_equal(be->ops->download(be, dst, src, n * sizeof(float)), 0);
		return;
	}
	h = malloc((n ? n : 1) * sizeof(*h));
	assert_non_null(h);
	assert_int_equal(be->ops->download(be, h, src, n * sizeof(*h)), 0);
	for (size_t i = 0; i < n; i++)
		dst[i] = sm70_f16_to_f32(h[i]);
	free(h);
}

/* n f32 values of a backend buffer into dst. */
static inline void get_f32(struct sm70_backend *be, float *dst, const void *src, size_t n)
{
	assert_int_equal(be->ops->download(be, dst, src, n * sizeof(float)), 0);
}

/* Writes n floats as act values into the existing backend buffer dst. */
static inline void set_act(struct sm70_backend *be, void *dst, const float *v, size_t n)
{
	void *tmp = up_act(be, v, n);
	size_t esz = be->act_dtype == SM70_DTYPE_F32 ? 4 : 2;
	void *h = malloc(n * esz);

	/* through the host: upload has no device-to-device form */
	assert_non_null(h);
	assert_int_equal(be->ops->download(be, h, tmp, n * esz), 0);
	assert_int_equal(be->ops->upload(be, dst, h, n * esz), 0);
	free(h);
	bfree(be, tmp);
}

/* A weight on a backend: f16 values (the CUDA weight dtype; the CPU reads f16 too). */
static inline struct sm70_weight mk_weight(struct sm70_backend *be, const float *v, int rows,
					   int cols)
{
	struct sm70_weight w = { .dtype = SM70_DTYPE_F16, .rows = rows, .cols = cols };
	size_t n = (size_t)rows * cols;
	uint16_t *h = malloc((n ? n : 1) * sizeof(*h));

	assert_non_null(h);
	for (size_t i = 0; i < n; i++)
		h[i] = sm70_f32_to_f16(v[i]);
	w.data = up_bytes(be, h, n * sizeof(*h));
	free(h);
	return w;
}

/* Prints and checks max |got - ref| / max |ref| <= tol. Returns the relative error. */
static inline double compare_values(const char *what, const float *got, const float *ref,
				    size_t n, double tol)
{
	double max_abs = 0.0, max_ref = 0.0, rel;
	size_t worst = 0;

	for (size_t i = 0; i < n; i++) {
		double a = fabs((double)got[i] - (double)ref[i]);

		if (isnan(got[i]) != isnan(ref[i]))
			a = INFINITY;
		if (a > max_abs || (isinf(a) && !isinf(max_abs))) {
			max_abs = a;
			worst = i;
		}
		if (fabs((double)ref[i]) > max_ref)
			max_ref = fabs((double)ref[i]);
	}
	rel = max_ref > 0 ? max_abs / max_ref : max_abs;
	printf("  %-52s max abs %.3g  rel %.3g  over %zu values (tol %.1g)\n", what, max_abs,
	       rel, n, tol);
	if (!(rel <= tol))
		printf("  worst at %zu: got %.8g ref %.8g\n", worst, got[worst], ref[worst]);
	assert_true(rel <= tol);
	return rel;
}

/* The KV cache modes the GPU tests cover, the pairs the CUDA kernels are built for
 * (kernels/cuda/kv_pair.h), by engine.kv_dtype's words: 0 "f16", 1 "fp8-all" (K and V
 * FP8-E4M3), 2 "fp8" (K FP8-E4M3, V f16). */
#define GPU_KV_MODES 3

static inline const char *kv_mode_name(int m)
{
	return m == 0 ? "f16" : m == 1 ? "fp8-all" : "fp8";
}

static inline int kv_mode_k_fp8(int m)
{
	return m != 0;
}

static inline int kv_mode_v_fp8(int m)
{
	return m == 1;
}

static inline struct sm70_kv_layout kv_mode_layout(int m, int n_blocks, int bs, int n_kv,
						   int D)
{
	return (struct sm70_kv_layout){
		.dtype = kv_mode_k_fp8(m) ? SM70_DTYPE_F8E4M3 : SM70_DTYPE_F16,
		.n_blocks = n_blocks, .block_size = bs, .n_kv_heads = n_kv, .head_dim = D,
		.v_dtype = m == 2 ? SM70_KV_V(SM70_DTYPE_F16) : SM70_KV_V_AS_K,
	};
}

/* n random cache values in [-1, 1) into bytes: FP8 as e4m3(x / scale), else f16. */
static inline void kv_fill_random(uint8_t *bytes, size_t n, int fp8, float scale)
{
	for (size_t i = 0; i < n; i++) {
		float x = rnd(1.0f);

		if (fp8) {
			bytes[i] = sm70_f32_to_e4m3(x / scale);
		} else {
			uint16_t h = sm70_f32_to_f16(x);

			memcpy(bytes + 2 * i, &h, 2);
		}
	}
}

/*
 * The main of an op test: makes gpu (device 0), gpu_ref (device 0 with the matmul and
 * attention reference switches) and cpu, runs the tests, and fails the run when either
 * CUDA backend recorded an error even if every compare passed. No device: prints SKIP and
 * returns 0.
 */
static inline int gpu_test_main(const char *name, const struct CMUnitTest *tests, size_t n,
				struct sm70_backend **gpu, struct sm70_backend **gpu_ref,
				struct sm70_backend **cpu)
{
	struct sm70_err err = { { 0 } };
	int ret = sm70_backend_cuda_create(gpu, 0, &err);

	if (ret == -ENODEV) {
		printf("SKIP: no CUDA device (%s)\n", err.msg);
		return 0;
	}
	if (ret) {
		fprintf(stderr, "cuda backend: %s\n", err.msg);
		return 1;
	}
	setenv("SM70_MATMUL", "reference", 1);
	setenv("SM70_ATTENTION", "reference", 1);
	ret = sm70_backend_cuda_create(gpu_ref, 0, &err);
	unsetenv("SM70_MATMUL");
	unsetenv("SM70_ATTENTION");
	if (ret) {
		fprintf(stderr, "cuda reference backend: %s\n", err.msg);
		sm70_backend_destroy(*gpu);
		return 1;
	}
	if (sm70_backend_cpu_create(cpu, 0, &err)) {
		fprintf(stderr, "cpu backend: %s\n", err.msg);
		sm70_backend_destroy(*gpu_ref);
		sm70_backend_destroy(*gpu);
		return 1;
	}
	ret = _cmocka_run_group_tests(name, tests, n, NULL, NULL);
	if ((*gpu)->ops->sync(*gpu) || (*gpu_ref)->ops->sync(*gpu_ref)) {
		fprintf(stderr, "a CUDA error was recorded during the run\n");
		ret = 1;
	}
	sm70_backend_destroy(*cpu);
	sm70_backend_destroy(*gpu_ref);
	sm70_backend_destroy(*gpu);
	return ret;
}

#endif
