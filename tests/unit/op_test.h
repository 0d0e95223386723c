/*
 * op_test.h - helpers the CPU op unit tests share: a reproducible random source, a CPU
 * backend and its buffers, KV cache values as f32, and the largest-error statistics they
 * report. Each test defines OP_TEST_SEED before including this, so that every file draws
 * its own stream. (slot_batch.h adds the stateful ops' batches.)
 *
 * Header-only (static inline): tests are single files linked against the core library.
 * Non-goals: references (each test keeps its own float64 twin of the op it checks).
 */
#ifndef SM70_TESTS_UNIT_OP_TEST_H
#define SM70_TESTS_UNIT_OP_TEST_H

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "kernels/backend.h"

static uint64_t rng_state = OP_TEST_SEED;

/* splitmix64: reproducible everywhere */
static inline uint64_t rng_next(void)
{
	uint64_t z = (rng_state += 0x9e3779b97f4a7c15ULL);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

/* uniform in [lo, hi) */
static inline float rnd_range(float lo, float hi)
{
	return (float)(lo + (hi - lo) * ((double)(rng_next() >> 11) * 0x1p-53));
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

/* A CPU backend of threads threads (0: one per core), or the test fails. */
static inline struct sm70_backend *cpu_backend(int threads)
{
	struct sm70_backend *be = NULL;
	struct sm70_err err = { { 0 } };

	assert_int_equal(sm70_backend_cpu_create(&be, threads, &err), 0);
	assert_non_null(be);
	return be;
}

/* bytes (at least one) of backend memory, or the test fails; the caller frees it. */
static inline void *balloc(struct sm70_backend *be, size_t bytes)
{
	void *p = be->ops->buf_alloc(be, bytes ? bytes : 1);

	assert_non_null(p);
	return p;
}

/* Frees the backend buffers bufs[0..n), in order. */
static inline void bfree_list(struct sm70_backend *be, void *const *bufs, size_t n)
{
	for (size_t i = 0; i < n; i++)
		be->ops->buf_free(be, bufs[i]);
}

/* bfree_all(be, a, b, ...): frees each backend buffer named, in order. */
#define bfree_all(be, ...)                               \
	bfree_list((be), (void *const[]){ __VA_ARGS__ }, \
		   sizeof((void *const[]){ __VA_ARGS__ }) / sizeof(void *))

/* Element i of a KV cache of dtype t as f32 (FP8: the e4m3 value times scale). */
static inline float kv_value(const void *cache, size_t i, enum sm70_dtype t, float scale)
{
	if (t == SM70_DTYPE_F16)
		return sm70_f16_to_f32(((const uint16_t *)cache)[i]);
	if (t == SM70_DTYPE_F8E4M3)
		return sm70_e4m3_to_f32(((const uint8_t *)cache)[i]) * scale;
	return ((const float *)cache)[i];
}

/* Largest error seen, absolute and relative to a scale stated per comparison. */
struct errstat {
	double max_abs;
	double max_rel;
	size_t n;
};

/* Adds one value; a NaN on either side is an infinite error. */
static inline void err_add(struct errstat *e, double got, double ref, double scale)
{
	double a = fabs(got - ref);
	double r = scale > 0 ? a / scale : a;

	if (isnan(got) || isnan(ref))
		r = a = INFINITY;
	if (a > e->max_abs)
		e->max_abs = a;
	if (r > e->max_rel)
		e->max_rel = r;
	e->n++;
}

/* Adds one value; a NaN on one side only is an infinite error, NaN on both agrees. */
static inline void err_add_nan_ok(struct errstat *e, double got, double ref, double scale)
{
	double a = fabs(got - ref);
	double r = scale > 0 ? a / scale : a;

	if (isnan(got) != isnan(ref))
		r = a = INFINITY;
	if (a > e->max_abs)
		e->max_abs = a;
	if (r > e->max_rel)
		e->max_rel = r;
	e->n++;
}

/* Adds n floats against n doubles, relative to the largest |ref|. */
static inline void cmp_vec(struct errstat *e, const float *got, const double *ref, size_t n)
{
	double scale = 0;

	for (size_t i = 0; i < n; i++)
		scale = fmax(scale, fabs(ref[i]));
	for (size_t i = 0; i < n; i++)
		err_add(e, got[i], ref[i], scale);
}

/* Prints what was compared and checks max_rel <= tol. */
static inline void err_report(const char *what, const struct errstat *e, double tol)
{
	printf("  %-58s max abs %.3g, max rel %.3g (tol %.0e), %zu values\n", what, e->max_abs,
	       e->max_rel, tol, e->n);
	assert_true(e->max_rel <= tol);
}

#ifdef SM70_KERNELS_CPU_CPU_OPS_H
/*
 * Runs run(be, ctx) three ways (1 thread on be1; 4 threads on be4; 4 threads without the
 * per-thread scratch) and asserts the count f32 values at out are bitwise equal each time.
 * Returns the values compared (2 * count). Needs kernels/cpu/cpu_ops.h included first.
 */
static inline size_t threads_bitwise(struct sm70_backend *be1, struct sm70_backend *be4,
				     void (*run)(struct sm70_backend *be, void *ctx), void *ctx,
				     const float *out, size_t count)
{
	float *first = malloc(sizeof(float) * (count ? count : 1));

	assert_non_null(first);
	for (int way = 0; way < 3; way++) {
		struct sm70_backend *be = way ? be4 : be1;

		sm70__cpu_of(be)->scratch_off = way == 2;
		run(be, ctx);
		sm70__cpu_of(be)->scratch_off = 0;
		if (way == 0)
			memcpy(first, out, sizeof(float) * count);
		else
			assert_memory_equal(out, first, sizeof(float) * count);
	}
	free(first);
	return 2 * count;
}
#endif

#endif
