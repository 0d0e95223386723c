/*
 * arrange.c - `sm70-bench arrange`: the load-time rearrangement of an NVFP4 matrix into the
 * CUDA kernels' layout (kernels/nvfp4_arrange.h), the table-driven threaded
 * sm70_fp4_arrange beside the element-by-element reference it replaced, on Qwen3 and
 * Qwen3.5 projection shapes: ms a matrix (median of --iters) and the source bytes (codes +
 * block scales) a second. Host only; no GPU needed.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kernels/nvfp4_arrange.h"
#include "tools/bench/bench.h"

#define ARRANGE_USAGE "usage: sm70-bench arrange [--iters N]   (N 1-64, default 3)\n"

typedef void (*arrange_fn)(uint32_t *, uint8_t *, const uint8_t *, const uint8_t *, int, int);

static double now_ms(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e3 + t.tv_nsec * 1e-6;
}

static int cmp_double(const void *a, const void *b)
{
	const double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

/* The median ms of iters calls of fn on one matrix (the outputs zeroed before each, as the
 * backend's calloc does, outside the timing). */
static double time_arrange(arrange_fn fn, uint32_t *w, uint8_t *s, size_t units,
			   const uint8_t *codes, const uint8_t *bs, int rows, int cols, int iters)
{
	double t[64];

	for (int i = 0; i < iters; i++) {
		double t0;

		memset(w, 0, units * 16);
		memset(s, 0, units * 2);
		t0 = now_ms();
		fn(w, s, codes, bs, rows, cols);
		t[i] = now_ms() - t0;
	}
	qsort(t, (size_t)iters, sizeof(t[0]), cmp_double);
	return t[iters / 2];
}

int sm70__bench_arrange(int argc, char **argv)
{
	static const struct {
		const char *name;
		int rows, cols;
	} shapes[] = {
		{ "qwen3-8b qkv", 6144, 4096 },
		{ "qwen3-8b gate_up", 24576, 4096 },
		{ "qwen3.5-27b down", 5120, 17408 },
	};
	int iters = 3;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--iters") && i + 1 < argc) {
			iters = atoi(argv[++i]);
		} else if (!strcmp(argv[i], "--help")) {
			printf(ARRANGE_USAGE);
			return 0;
		} else {
			fprintf(stderr, ARRANGE_USAGE);
			return 2;
		}
	}
	if (iters < 1 || iters > 64) {
		fprintf(stderr, "sm70-bench arrange: --iters takes 1-64\n");
		return 2;
	}
	printf("== NVFP4 rearrangement at load (host, %ld CPUs online), median of %d\n",
	       sysconf(_SC_NPROCESSORS_ONLN), iters);
	printf("%-20s %14s %12s %10s %14s %10s %8s\n", "matrix", "shape", "ref ms", "ref GB/s",
	       "arrange ms", "GB/s", "speedup");
	for (size_t k = 0; k < sizeof(shapes) / sizeof(shapes[0]); k++) {
		const int rows = shapes[k].rows, cols = shapes[k].cols;
		const size_t units = sm70_fp4_units(rows, cols);
		const size_t n_codes = (size_t)rows * cols / 2, n_scales = (size_t)rows * cols / 16;
		uint8_t *codes = malloc(n_codes), *bs = malloc(n_scales), *s = malloc(units * 2);
		uint32_t *w = malloc(units * 16);
		double ref, fast;
		char shape[32];

		if (!codes || !bs || !s || !w) {
			fprintf(stderr, "sm70-bench arrange: out of memory\n");
			free(codes);
			free(bs);
			free(s);
			free(w);
			return 1;
		}
		for (size_t i = 0; i < n_codes; i++)
			codes[i] = (uint8_t)((i * 2654435761u) >> 13);
		for (size_t i = 0; i < n_scales; i++)
			bs[i] = (uint8_t)(0x70 + i % 15);
		ref = time_arrange(sm70_fp4_arrange_reference, w, s, units, codes, bs, rows, cols,
				   iters);
		fast = time_arrange(sm70_fp4_arrange, w, s, units, codes, bs, rows, cols, iters);
		snprintf(shape, sizeof(shape), "%dx%d", rows, cols);
		printf("%-20s %14s %12.2f %10.2f %14.2f %10.2f %7.1fx\n", shapes[k].name, shape,
		       ref, (n_codes + n_scales) / ref * 1e-6, fast,
		       (n_codes + n_scales) / fast * 1e-6, ref / fast);
		free(codes);
		free(bs);
		free(s);
		free(w);
	}
	return 0;
}
