/*
 * parallel.c - sm70__parallel_for (parallel.h): threads started for one loop, each
 * claiming bands of items from a shared counter until none are left, then joined.
 */
#include <pthread.h>
#include <unistd.h>

#include "common/parallel.h"

struct parallel_job {
	void (*fn)(void *ctx, size_t i0, size_t i1);
	void *ctx;
	size_t n, band;
	size_t next; /* claimed with __atomic_fetch_add */
};

static void *parallel_worker(void *arg)
{
	struct parallel_job *j = arg;
	size_t i;

	while ((i = __atomic_fetch_add(&j->next, j->band, __ATOMIC_RELAXED)) < j->n)
		j->fn(j->ctx, i, i + j->band < j->n ? i + j->band : j->n);
	return NULL;
}

void sm70__parallel_for(size_t n, size_t band, size_t cost,
			void (*fn)(void *ctx, size_t i0, size_t i1), void *ctx)
{
	struct parallel_job j = { fn, ctx, n, band ? band : 1, 0 };
	pthread_t th[32];
	long cores = sysconf(_SC_NPROCESSORS_ONLN);
	int started = 0;

	if (cores > 32)
		cores = 32;
	if (n * cost >= ((size_t)1 << 20))
		for (; started < cores - 1; started++)
			if (pthread_create(&th[started], NULL, parallel_worker, &j))
				break;
	parallel_worker(&j); /* the caller works too; alone if threads could not start */
	for (int i = 0; i < started; i++)
		pthread_join(th[i], NULL);
}
