/*
 * comm_bench.cu - what `sm70-bench allreduce` times (see comm_bench.h): the all-reduce of
 * the tensor-parallel communicator, through its P2P path and through NCCL alone, on the
 * ranks' own backend streams exactly as the model calls it.
 *
 * Two figures per size: calls captured into one CUDA graph per rank and replayed (what a
 * decode step does; launch overhead left out) and calls launched one by one from the host
 * thread (what an eager step pays). Buffers hold zeros, so repeated sums neither overflow
 * nor change the work. A sample's time is the slowest rank's, between events recorded on
 * every rank's stream.
 *
 * Non-goals: correctness (tests/gpu/test_comm.c), concurrency with other work.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nccl.h>

#include "kernels/cuda/cuda_check.h"

extern "C" {
#include "kernels/comm.h"
#include "kernels/cuda/comm_bench.h"
}

static struct {
	int n;
	size_t max_bytes;
	struct sm70_backend *be[SM70_MAX_TP];
	cudaEvent_t ev0[SM70_MAX_TP], ev1[SM70_MAX_TP];
	void *buf[SM70_MAX_TP];
	struct sm70_comm *p2p, *nccl;
} cb;

static struct sm70__cuda *rank_cuda(int r)
{
	return sm70__cuda_enter(cb.be[r]);
}

/* Sets name to value (NULL: unsets it). */
static void put_env(const char *name, const char *value)
{
	if (value)
		setenv(name, value, 1);
	else
		unsetenv(name);
}

/* Makes a communicator with SM70_ALLREDUCE=mode (and the P2P threshold at max_bytes),
 * restoring the caller's environment. */
static int make_comm(struct sm70_comm **out, const char *mode, struct sm70_err *err)
{
	const char *m0 = getenv("SM70_ALLREDUCE"), *x0 = getenv("SM70_ALLREDUCE_P2P_MAX");
	char *m = m0 ? strdup(m0) : NULL, *x = x0 ? strdup(x0) : NULL, max[32];
	int ret;

	snprintf(max, sizeof(max), "%zu", cb.max_bytes);
	put_env("SM70_ALLREDUCE", mode);
	put_env("SM70_ALLREDUCE_P2P_MAX", max);
	ret = sm70_comm_nccl_create(out, cb.be, cb.n, err);
	put_env("SM70_ALLREDUCE", m);
	put_env("SM70_ALLREDUCE_P2P_MAX", x);
	free(m);
	free(x);
	return ret;
}

extern "C" void sm70__comm_bench_close(void)
{
	sm70_comm_destroy(cb.nccl);
	sm70_comm_destroy(cb.p2p);
	for (int r = cb.n - 1; r >= 0; r--) {
		if (!cb.be[r])
			continue;
		rank_cuda(r);
		if (cb.buf[r])
			cb.be[r]->ops->buf_free(cb.be[r], cb.buf[r]);
		if (cb.ev1[r])
			cudaEventDestroy(cb.ev1[r]);
		if (cb.ev0[r])
			cudaEventDestroy(cb.ev0[r]);
		sm70_backend_destroy(cb.be[r]);
	}
	memset(&cb, 0, sizeof(cb));
}

extern "C" int sm70__comm_bench_open(int n_gpus, size_t max_bytes,
				     struct sm70__comm_bench_info *info, char *msg,
				     size_t msg_len)
{
	struct sm70_err err = { { 0 } };
	cudaDeviceProp prop;
	int count = 0, drv = 0, nv = 0, ret = 0;

	memset(info, 0, sizeof(*info));
	if (cudaGetDeviceCount(&count) != cudaSuccess) {
		cudaGetLastError();
		count = 0;
	}
	if (n_gpus == 0)
		n_gpus = count < SM70_MAX_TP ? count : SM70_MAX_TP;
	if (n_gpus < 2 || n_gpus > count || n_gpus > SM70_MAX_TP) {
		snprintf(msg, msg_len, "needs 2..%d GPUs; %d asked for, %d present", SM70_MAX_TP,
			 n_gpus, count);
		return -ENODEV;
	}
	cb.n = n_gpus;
	cb.max_bytes = max_bytes;
	for (int r = 0; r < cb.n; r++) {
		ret = sm70_backend_cuda_create(&cb.be[r], r, &err);
		if (ret) {
			snprintf(msg, msg_len, "GPU %d: %s", r, err.msg);
			goto fail;
		}
		rank_cuda(r);
		if (cudaEventCreate(&cb.ev0[r]) != cudaSuccess ||
		    cudaEventCreate(&cb.ev1[r]) != cudaSuccess) {
			cudaGetLastError();
			snprintf(msg, msg_len, "GPU %d: cannot create events", r);
			ret = -EIO;
			goto fail;
		}
		cb.buf[r] = cb.be[r]->ops->buf_alloc(cb.be[r], max_bytes);
		if (!cb.buf[r]) {
			snprintf(msg, msg_len, "GPU %d: cannot allocate %zu bytes", r, max_bytes);
			ret = -ENOMEM;
			goto fail;
		}
	}
	ret = make_comm(&cb.nccl, "nccl", &err);
	if (ret) {
		snprintf(msg, msg_len, "%s", err.msg);
		goto fail;
	}
	sm70_err_clear(&err);
	if (make_comm(&cb.p2p, "p2p", &err) == 0) {
		info->p2p = 1;
	} else {
		cb.p2p = NULL;
		snprintf(info->p2p_why, sizeof(info->p2p_why), "%s", err.msg);
	}
	info->n_gpus = cb.n;
	info->max_bytes = max_bytes;
	memset(&prop, 0, sizeof(prop));
	if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess || cudaDriverGetVersion(&drv) !=
	    cudaSuccess)
		cudaGetLastError();
	ncclGetVersion(&nv);
	snprintf(info->desc, sizeof(info->desc),
		 "%d x %.100s (sm_%d%d, %d SMs), driver %d.%d, NCCL %d", cb.n, prop.name,
		 prop.major % 100, prop.minor % 100, prop.multiProcessorCount % 100000,
		 drv / 1000 % 1000, drv % 1000 / 10, nv % 1000000);
	return 0;
fail:
	sm70__comm_bench_close();
	return ret;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static int record(int r, cudaEvent_t ev)
{
	return SM70_CUDA_CHECK(cb.be[r], cudaEventRecord(ev, rank_cuda(r)->stream));
}

static int elapsed(int r, float *ms)
{
	rank_cuda(r);
	return SM70_CUDA_CHECK(cb.be[r], cudaEventElapsedTime(ms, cb.ev0[r], cb.ev1[r]));
}

/* Queues `per` all-reduces on every rank. */
static int queue_calls(struct sm70_comm *c, size_t count, enum sm70_dtype dt, int per)
{
	for (int i = 0; i < per; i++) {
		int ret = c->ops->all_reduce(c, cb.buf, count, dt);

		if (ret)
			return ret;
	}
	return 0;
}

/* Captures `per` calls into one graph per rank. On failure every capture is ended. */
static int capture(struct sm70_comm *c, size_t count, enum sm70_dtype dt, int per,
		   void *graphs[])
{
	int begun = 0, ret = 0;

	for (; begun < cb.n; begun++) {
		ret = cb.be[begun]->ops->graph_begin(cb.be[begun]);
		if (ret)
			break;
	}
	if (!ret)
		ret = queue_calls(c, count, dt, per);
	for (int r = 0; r < begun; r++) {
		int e = cb.be[r]->ops->graph_end(cb.be[r], &graphs[r]);

		if (e) {
			graphs[r] = NULL;
			if (!ret)
				ret = e;
		}
	}
	return ret;
}

extern "C" int sm70__comm_bench_allreduce(int p2p, size_t count, int f16, int per, int iters,
					  struct sm70__comm_bench_time *out)
{
	struct sm70_comm *c = p2p ? cb.p2p : cb.nccl;
	const enum sm70_dtype dt = f16 ? SM70_DTYPE_F16 : SM70_DTYPE_F32;
	double *t = NULL;
	void *graphs[SM70_MAX_TP] = { NULL };
	int ret = 0;

	if (!c || per < 1 || iters < 1)
		return -EINVAL;
	if (count * (f16 ? 2 : 4) > cb.max_bytes)
		return -E2BIG;
	t = (double *)calloc((size_t)iters, sizeof(double));
	if (!t)
		return -ENOMEM;
	ret = capture(c, count, dt, per, graphs);
	for (int mode = 0; mode < 2 && !ret; mode++) {
		for (int it = -3; it < iters && !ret; it++) {
			float worst = 0.0f;

			for (int r = 0; r < cb.n && !ret; r++)
				ret = record(r, cb.ev0[r]);
			if (ret)
				break;
			if (mode == 0) {
				for (int r = 0; r < cb.n && !ret; r++)
					ret = cb.be[r]->ops->graph_launch(cb.be[r], graphs[r]);
			} else {
				ret = queue_calls(c, count, dt, per);
			}
			for (int r = 0; r < cb.n && !ret; r++)
				ret = record(r, cb.ev1[r]);
			for (int r = 0; r < cb.n && !ret; r++) {
				float ms = 0.0f;

				rank_cuda(r);
				ret = SM70_CUDA_CHECK(cb.be[r], cudaEventSynchronize(cb.ev1[r]));
				if (!ret)
					ret = elapsed(r, &ms);
				if (ms > worst)
					worst = ms;
			}
			if (it >= 0)
				t[it] = (double)worst * 1e3 / per;
		}
		if (ret)
			break;
		qsort(t, (size_t)iters, sizeof(double), cmp_double);
		if (mode == 0)
			out->us_graph = t[iters / 2];
		else
			out->us_eager = t[iters / 2];
	}
	for (int r = 0; r < cb.n; r++) {
		if (!ret)
			ret = cb.be[r]->ops->sync(cb.be[r]);
		if (graphs[r])
			cb.be[r]->ops->graph_destroy(cb.be[r], graphs[r]);
	}
	free(t);
	return ret;
}
