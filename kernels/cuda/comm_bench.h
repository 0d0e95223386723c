/*
 * comm_bench.h - the device side of `sm70-bench allreduce`: CUDA backends on several GPUs,
 * a communicator with the P2P all-reduce and one with NCCL alone, and timed all-reduces.
 *
 * A plain C header (tools are compiled by gcc without SM70_HAVE_CUDA): CUDA builds get
 * kernels/cuda/comm_bench.cu, CPU-only builds kernels/cuda_absent/comm_bench_absent.c,
 * whose functions return -ENODEV. Not thread-safe: one session per process.
 * Non-goals: correctness (tests/gpu/test_comm.c), collectives other than all-reduce.
 */
#ifndef SM70_KERNELS_CUDA_COMM_BENCH_H
#define SM70_KERNELS_CUDA_COMM_BENCH_H

#include <stddef.h>

struct sm70__comm_bench_info {
	int n_gpus;
	int p2p;               /* the P2P communicator exists (else p2p_why says why) */
	size_t max_bytes;      /* the largest message the session may time */
	char desc[256];        /* GPU name, count, driver, NCCL version */
	char p2p_why[512];
};

/*
 * Opens CUDA backends on GPUs 0..n_gpus-1 (0: every GPU present, at most SM70_MAX_TP), a
 * buffer of max_bytes on each, and two communicators over them: "p2p" (SM70_ALLREDUCE=p2p
 * with its threshold raised to max_bytes, so every size takes the P2P path) and "nccl"
 * (SM70_ALLREDUCE=nccl). The caller's environment is restored afterwards. Fills info.
 * Returns 0, -ENODEV (fewer than 2 GPUs, or no CUDA) or -errno, with msg saying why.
 */
int sm70__comm_bench_open(int n_gpus, size_t max_bytes, struct sm70__comm_bench_info *info,
			  char *msg, size_t msg_len);

/* Releases what open made. Safe to call twice. */
void sm70__comm_bench_close(void);

struct sm70__comm_bench_time {
	double us_graph; /* per call, `per` calls captured into one graph per rank, replayed */
	double us_eager; /* per call, `per` calls launched one by one from the host */
};

/*
 * Times the all-reduce of `count` elements (f16 when f16, else f32) through the P2P
 * communicator (p2p = 1) or NCCL alone (p2p = 0): each sample is `per` back-to-back calls
 * between CUDA events on every rank (the slowest rank counts), the figure is the median of
 * `iters` samples after 3 warm-up ones. Returns 0 or -errno.
 */
int sm70__comm_bench_allreduce(int p2p, size_t count, int f16, int per, int iters,
			       struct sm70__comm_bench_time *out);

#endif
