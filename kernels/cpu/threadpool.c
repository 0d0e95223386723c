/*
 * threadpool.c - the CPU backend's persistent worker pool; see threadpool.h.
 *
 * One job at a time: the caller publishes the job under the lock, bumps a generation
 * counter and broadcasts; every worker runs each generation exactly once (it claims
 * chunks from an atomic counter until none are left) and checks out by decrementing
 * `busy`; the caller claims chunks too and then sleeps until busy reaches 0. Because
 * the caller waits for every worker to check out before it can publish the next job, a
 * worker can never miss a generation or see a half-written one. Nobody spins: idle
 * workers sleep in pthread_cond_wait.
 *
 * Non-goals: fairness between callers, waking only as many workers as there are chunks
 * (a broadcast costs a few microseconds, which the ops that use the pool amortise).
 */
#include "kernels/cpu/threadpool.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

/* More threads than this is a configuration mistake, not a machine. */
#define POOL_MAX_THREADS 1024
/* Chunks per thread: a few, so that uneven items (attention rows of different lengths)
 * balance without making the shared counter hot. */
#define POOL_CHUNKS_PER_THREAD 4

struct pool_worker {
	struct sm70__pool *pool;
	pthread_t tid;
	int index;
};

struct sm70__pool {
	int n_threads;
	int n_workers; /* started workers: n_threads - 1 */
	struct pool_worker *workers;

	pthread_mutex_t lock;
	pthread_cond_t wake; /* workers: a new generation or stop */
	pthread_cond_t done; /* caller: busy reached 0 */
	unsigned long gen;
	int stop;
	int busy;

	/* The current job: written under the lock before gen is bumped. */
	sm70__pool_fn fn;
	void *ctx;
	long n_items;
	long chunk;
	atomic_long next; /* first unclaimed item */
};

/* Claims and runs chunks of the current job until none are left. */
static void pool_drain(struct sm70__pool *p, sm70__pool_fn fn, void *ctx, long n_items,
		       long chunk, int thread)
{
	for (;;) {
		long begin = atomic_fetch_add_explicit(&p->next, chunk, memory_order_relaxed);
		long end;

		if (begin >= n_items)
			break;
		end = n_items - begin < chunk ? n_items : begin + chunk;
		fn(ctx, (int)begin, (int)end, thread);
	}
}

static void *pool_worker_main(void *arg)
{
	struct pool_worker *w = arg;
	struct sm70__pool *p = w->pool;
	unsigned long seen = 0;

	pthread_mutex_lock(&p->lock);
	for (;;) {
		sm70__pool_fn fn;
		void *ctx;
		long n_items, chunk;

		while (p->gen == seen && !p->stop)
			pthread_cond_wait(&p->wake, &p->lock);
		if (p->stop)
			break;
		seen = p->gen;
		fn = p->fn;
		ctx = p->ctx;
		n_items = p->n_items;
		chunk = p->chunk;
		pthread_mutex_unlock(&p->lock);

		pool_drain(p, fn, ctx, n_items, chunk, w->index);

		pthread_mutex_lock(&p->lock);
		if (--p->busy == 0)
			pthread_cond_signal(&p->done);
	}
	pthread_mutex_unlock(&p->lock);
	return NULL;
}

/* Stops and joins the first n started workers. */
static void pool_stop_workers(struct sm70__pool *p, int n)
{
	pthread_mutex_lock(&p->lock);
	p->stop = 1;
	pthread_cond_broadcast(&p->wake);
	pthread_mutex_unlock(&p->lock);
	for (int i = 0; i < n; i++)
		pthread_join(p->workers[i].tid, NULL);
}

int sm70__pool_create(struct sm70__pool **out, int n_threads)
{
	struct sm70__pool *p;
	int ret = 0, started = 0;

	*out = NULL;
	if (n_threads < 1 || n_threads > POOL_MAX_THREADS)
		return -EINVAL;
	p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	p->n_threads = n_threads;
	atomic_init(&p->next, 0);
	pthread_mutex_init(&p->lock, NULL);
	pthread_cond_init(&p->wake, NULL);
	pthread_cond_init(&p->done, NULL);
	if (n_threads > 1) {
		p->workers = calloc((size_t)n_threads - 1, sizeof(*p->workers));
		if (!p->workers) {
			ret = -ENOMEM;
			goto fail;
		}
	}
	for (; started < n_threads - 1; started++) {
		struct pool_worker *w = &p->workers[started];

		w->pool = p;
		w->index = started + 1;
		ret = -pthread_create(&w->tid, NULL, pool_worker_main, w);
		if (ret)
			goto fail;
	}
	p->n_workers = started;
	*out = p;
	return 0;

fail:
	pool_stop_workers(p, started);
	pthread_cond_destroy(&p->done);
	pthread_cond_destroy(&p->wake);
	pthread_mutex_destroy(&p->lock);
	free(p->workers);
	free(p);
	return ret;
}

void sm70__pool_destroy(struct sm70__pool *pool)
{
	if (!pool)
		return;
	pool_stop_workers(pool, pool->n_workers);
	pthread_cond_destroy(&pool->done);
	pthread_cond_destroy(&pool->wake);
	pthread_mutex_destroy(&pool->lock);
	free(pool->workers);
	free(pool);
}

int sm70__pool_threads(const struct sm70__pool *pool)
{
	return pool ? pool->n_threads : 1;
}

void sm70__pool_run(struct sm70__pool *pool, int n_items, int grain, sm70__pool_fn fn,
		    void *ctx)
{
	long chunk;

	if (n_items <= 0)
		return;
	if (grain < 1)
		grain = 1;
	if (!pool || pool->n_workers == 0 || n_items <= grain) {
		fn(ctx, 0, n_items, 0);
		return;
	}
	chunk = ((long)n_items + (long)pool->n_threads * POOL_CHUNKS_PER_THREAD - 1) /
		((long)pool->n_threads * POOL_CHUNKS_PER_THREAD);
	if (chunk < grain)
		chunk = grain;

	pthread_mutex_lock(&pool->lock);
	pool->fn = fn;
	pool->ctx = ctx;
	pool->n_items = n_items;
	pool->chunk = chunk;
	atomic_store_explicit(&pool->next, 0, memory_order_relaxed);
	pool->busy = pool->n_workers;
	pool->gen++;
	pthread_cond_broadcast(&pool->wake);
	pthread_mutex_unlock(&pool->lock);

	pool_drain(pool, fn, ctx, n_items, chunk, 0);

	/* The lock hand-off in the workers' check-out orders their writes before ours. */
	pthread_mutex_lock(&pool->lock);
	while (pool->busy > 0)
		pthread_cond_wait(&pool->done, &pool->lock);
	pthread_mutex_unlock(&pool->lock);
}
