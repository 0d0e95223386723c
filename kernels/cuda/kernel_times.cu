/*
 * kernel_times.cu - the CUDA backend's kernel timeline (SM70_KERNEL_TIMES=1): where a
 * step's device time goes, kernel by kernel, from CUDA events alone (no profiler, so it
 * works where ncu cannot read counters).
 *
 * On a profiled backend every kernel launch (SM70_CUDA_LAUNCHED), cuBLAS GEMM, upload,
 * download and graph replay is followed by an event on the stream; the time between two
 * consecutive events is charged to the later one. A kernel's row is then its duration
 * plus any idle gap before it, which is where the host's launch time shows when the host
 * falls behind; an upload's row holds the host's work between the previous step's
 * download and that upload. Events are read back at each download (the step's end, which
 * waits for the stream anyway) or when the pending ring is full.
 *
 * A profiled backend runs every launch fully ordered (SM70_PDL is ignored: an event
 * between two launches would end their overlap anyway), and launches made while a graph
 * is captured are not marked; a replay is one row. So the timeline is of the eager step:
 * run with SM70_GRAPHS=0 for kernel rows. Ops in a side section (side_stream.cu) are not
 * marked: they overlap the main stream's, whose rows then hold whatever they delayed.
 *
 * The totals are per process (a table of (device, name) rows under a mutex), read and
 * reset with sm70_kernel_times(); sm70_kernel_timeline() gives the last complete step of
 * the lowest profiled device in order.
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cuda_check.h"

#define KT_PENDING 4096 /* events in flight before a read-back */
#define KT_ROWS 512     /* distinct (device, name) rows */
#define KT_STEP 8192    /* entries of one step's sequence */

struct sm70__kt {
	cudaEvent_t ev[KT_PENDING];
	char name[KT_PENDING][SM70_KERNEL_TIME_NAME];
	int n;
	cudaEvent_t base; /* the last event read back: the next delta starts there */
	int has_base;
	char label[SM70_KERNEL_TIME_NAME / 2]; /* appended to the names marked while set */
	struct sm70_kernel_time *step;          /* the current step's sequence */
	int n_step;
};

static pthread_mutex_t kt_lock = PTHREAD_MUTEX_INITIALIZER;
static struct sm70_kernel_time kt_rows[KT_ROWS];
static int kt_n_rows;
static struct sm70_kernel_time kt_last[KT_STEP]; /* the last complete step */
static int kt_n_last, kt_last_device = -1;

static void kt_add(int device, const char *name, double us)
{
	int i;

	for (i = 0; i < kt_n_rows; i++)
		if (kt_rows[i].device == device && !strcmp(kt_rows[i].name, name))
			break;
	if (i == kt_n_rows) {
		if (kt_n_rows == KT_ROWS)
			return; /* more names than rows: the rest go uncounted */
		kt_n_rows++;
		snprintf(kt_rows[i].name, sizeof(kt_rows[i].name), "%s", name);
		kt_rows[i].device = device;
		kt_rows[i].calls = 0;
		kt_rows[i].us = 0;
	}
	kt_rows[i].calls++;
	kt_rows[i].us += us;
}

/* Reads back every pending event (waiting for the last) into the totals and the step's
 * sequence; step_end closes the step. */
static void kt_read_back(struct sm70__cuda *c, int step_end)
{
	struct sm70__kt *k = c->kt;

	if (k->n > 0 && cudaEventSynchronize(k->ev[k->n - 1]) == cudaSuccess) {
		pthread_mutex_lock(&kt_lock);
		for (int i = 0; i < k->n; i++) {
			float ms = 0.0f;
			cudaEvent_t prev = i ? k->ev[i - 1] : k->base;

			if ((i || k->has_base) &&
			    cudaEventElapsedTime(&ms, prev, k->ev[i]) == cudaSuccess) {
				kt_add(c->device, k->name[i], ms * 1e3);
				if (k->n_step < KT_STEP) {
					struct sm70_kernel_time *s = &k->step[k->n_step++];

					memcpy(s->name, k->name[i], sizeof(s->name));
					s->device = c->device;
					s->calls = 1;
					s->us = ms * 1e3;
				}
			}
		}
		pthread_mutex_unlock(&kt_lock);
		/* the last event becomes the base: swap handles rather than record again */
		cudaEvent_t t = k->base;

		k->base = k->ev[k->n - 1];
		k->ev[k->n - 1] = t;
		k->has_base = 1;
		k->n = 0;
	}
	cudaGetLastError();
	if (step_end && k->n_step > 0) {
		pthread_mutex_lock(&kt_lock);
		if (kt_last_device < 0 || c->device <= kt_last_device) {
			memcpy(kt_last, k->step, sizeof(kt_last[0]) * (size_t)k->n_step);
			kt_n_last = k->n_step;
			kt_last_device = c->device;
		}
		pthread_mutex_unlock(&kt_lock);
		k->n_step = 0;
	}
}

int sm70__kt_create(struct sm70__cuda *c)
{
	const char *v = getenv("SM70_KERNEL_TIMES");
	struct sm70__kt *k;

	if (!v || strcmp(v, "1") != 0)
		return 0;
	k = (struct sm70__kt *)calloc(1, sizeof(*k));
	if (!k)
		return -ENOMEM;
	k->step = (struct sm70_kernel_time *)calloc(KT_STEP, sizeof(*k->step));
	if (!k->step) {
		free(k);
		return -ENOMEM;
	}
	for (int i = 0; i < KT_PENDING; i++)
		if (cudaEventCreate(&k->ev[i]) != cudaSuccess)
			goto fail;
	if (cudaEventCreate(&k->base) != cudaSuccess)
		goto fail;
	c->kt = k;
	c->pdl = 0;
	fprintf(stderr, "sm70 cuda: SM70_KERNEL_TIMES=1: an event after every launch on device "
		"%d (launches fully ordered; graph replays are one row)\n", c->device);
	return 0;
fail:
	cudaGetLastError();
	for (int i = 0; i < KT_PENDING; i++)
		if (k->ev[i])
			cudaEventDestroy(k->ev[i]);
	free(k->step);
	free(k);
	return -EIO;
}

void sm70__kt_destroy(struct sm70__cuda *c)
{
	struct sm70__kt *k = c->kt;

	if (!k)
		return;
	for (int i = 0; i < KT_PENDING; i++)
		cudaEventDestroy(k->ev[i]);
	cudaEventDestroy(k->base);
	free(k->step);
	free(k);
	c->kt = NULL;
}

void sm70__kt_mark(struct sm70__cuda *c, const char *name)
{
	struct sm70__kt *k = c->kt;
	cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;

	if (c->stream != c->main || cudaStreamIsCapturing(c->stream, &st) != cudaSuccess ||
	    st != cudaStreamCaptureStatusNone) {
		cudaGetLastError();
		return;
	}
	if (k->n == KT_PENDING)
		kt_read_back(c, 0);
	if (cudaEventRecord(k->ev[k->n], c->stream) != cudaSuccess) {
		cudaGetLastError();
		return;
	}
	if (k->label[0])
		snprintf(k->name[k->n], sizeof(k->name[k->n]), "%s %s", name, k->label);
	else
		snprintf(k->name[k->n], sizeof(k->name[k->n]), "%s", name);
	k->n++;
}

void sm70__kt_step_end(struct sm70__cuda *c)
{
	kt_read_back(c, 1);
}

void sm70__kt_label(struct sm70__cuda *c, const char *fmt, ...)
{
	va_list ap;

	if (!fmt) {
		c->kt->label[0] = 0;
		return;
	}
	va_start(ap, fmt);
	vsnprintf(c->kt->label, sizeof(c->kt->label), fmt, ap);
	va_end(ap);
}

static int kt_by_time(const void *a, const void *b)
{
	const double x = ((const struct sm70_kernel_time *)a)->us;
	const double y = ((const struct sm70_kernel_time *)b)->us;

	return x < y ? 1 : x > y ? -1 : 0;
}

/* See backend.h. */
extern "C" int sm70_kernel_times(struct sm70_kernel_time *out, int max, int reset)
{
	int n;

	pthread_mutex_lock(&kt_lock);
	qsort(kt_rows, (size_t)kt_n_rows, sizeof(kt_rows[0]), kt_by_time);
	n = kt_n_rows < max ? kt_n_rows : max;
	if (n > 0)
		memcpy(out, kt_rows, sizeof(*out) * (size_t)n);
	if (reset) {
		kt_n_rows = 0;
		kt_n_last = 0;
		kt_last_device = -1;
	}
	pthread_mutex_unlock(&kt_lock);
	return n;
}

/* See backend.h. */
extern "C" int sm70_kernel_timeline(struct sm70_kernel_time *out, int max)
{
	int n;

	pthread_mutex_lock(&kt_lock);
	n = kt_n_last < max ? kt_n_last : max;
	if (n > 0)
		memcpy(out, kt_last, sizeof(*out) * (size_t)n);
	pthread_mutex_unlock(&kt_lock);
	return n;
}
