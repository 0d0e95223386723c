/*
 * threadpool.c - the CPU backend's persistent worker pool; see threadpool.h.
 *
 * One job at a time: the caller writes the job, then bumps a generation counter
 * (release) and, if any worker sleeps, broadcasts; every worker runs each generation
 * exactly once (it claims chunks from an atomic counter until none are left) and checks
 * out by decrementing `busy` (release); the caller claims chunks too and then waits for
 * busy to reach 0 (acquire), which also makes the workers' writes visible to it. Because
 * the caller waits for every worker to check out before it writes the next job, a worker
 * can never miss a generation or see a half-written one.
 *
 * Waiting is a short bounded spin, then a sleep on a condition variable: a decode step
 * runs a few hundred small jobs back to back, and a futex wake-up per job per worker
 * (~10-20 us each on a VM) would cost more than the work. The spin ends after
 * POOL_SPIN polls, so idle workers do sleep; a pool with more threads than online CPUs
 * does not spin at all (a spinning thread would hold the CPU the others need).
 *
 * Non-goals: fairness between callers, waking only as many workers as there are chunks
 * (a broadcast costs a few microseconds, which the ops that use the pool amortise).
 */
#include "kernels/cpu/threadpool.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

/* More threads than this is a configuration mistake, not a machine. */
#define POOL_MAX_THREADS 1024
/* Chunks per thread: a few, so that uneven items (attention rows of different lengths)
 * balance without making the shared counter hot. */
#define POOL_CHUNKS_PER_THREAD 4
/* Polls of a flag before sleeping on it (each poll has a CPU pause: tens of us in all). */
#define POOL_SPIN 2000

static inline void pool_pause(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ __volatile__("yield");
#endif
}

struct pool_worker {
	struct sm70__pool *pool;
	pthread_t tid;
	int index;
};

struct sm70__pool {
	int n_threads;
	int n_workers; /* started workers: n_threads - 1 */
	int spin;      /* POOL_SPIN, or 0 when oversubscribed */
	struct pool_worker *workers;

	pthread_mutex_t lock;
	pthread_cond_t wake; /* workers: a new generation or stop */
	pthread_cond_t done; /* caller: busy reached 0 */
	atomic_ulong gen;    /* written under the lock; polled without it */
	atomic_int stop;
	atomic_int busy;     /* workers not yet checked out of the current job */
	int sleepers;        /* workers in pthread_cond_wait(wake); under the lock */

	/* The current job: written before gen is bumped, read after it is seen. */
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

/* Waits until the generation differs from seen (returns it) or stop is set (returns
 * seen). */
static unsigned long pool_wait_job(struct sm70__pool *p, unsigned long seen)
{
	unsigned long g;

	for (int i = 0; i < p->spin; i++) {
		g = atomic_load_explicit(&p->gen, memory_order_acquire);
		if (g != seen || atomic_load_explicit(&p->stop, memory_order_relaxed))
			return g;
		pool_pause();
	}
	pthread_mutex_lock(&p->lock);
	p->sleepers++;
	while ((g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen &&
	       !atomic_load_explicit(&p->stop, memory_order_relaxed))
		pthread_cond_wait(&p->wake, &p->lock);
	p->sleepers--;
	pthread_mutex_unlock(&p->lock);
	return g;
}

static void *pool_worker_main(void *arg)
{
	struct pool_worker *w = arg;
	struct sm70__pool *p = w->pool;
	unsigned long seen = 0;

	for (;;) {
		seen = pool_wait_job(p, seen);
		if (atomic_load_explicit(&p->stop, memory_order_relaxed))
			break;
		pool_drain(p, p->fn, p->ctx, p->n_items, p->chunk, w->index);
		/* Check out. The caller may be asleep on `done`: signal under the lock, so the
		 * signal cannot fall between its check of busy and its wait. */
		if (atomic_fetch_sub_explicit(&p->busy, 1, memory_order_acq_rel) == 1) {
			pthread_mutex_lock(&p->lock);
			pthread_cond_signal(&p->done);
			pthread_mutex_unlock(&p->lock);
		}
	}
	return NULL;
}

/* Stops and joins the first n started workers. */
static void pool_stop_workers(struct sm70__pool *p, int n)
{
	pthread_mutex_lock(&p->lock);
	atomic_store(&p->stop, 1);
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
	p->spin = n_threads <= sysconf(_SC_NPROCESSORS_ONLN) ? POOL_SPIN : 0;
	atomic_init(&p->next, 0);
	atomic_init(&p->gen, 0);
	atomic_init(&p->stop, 0);
	atomic_init(&p->busy, 0);
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

	pool->fn = fn;
	pool->ctx = ctx;
	pool->n_items = n_items;
	pool->chunk = chunk;
	atomic_store_explicit(&pool->next, 0, memory_order_relaxed);
	atomic_store_explicit(&pool->busy, pool->n_workers, memory_order_relaxed);
	pthread_mutex_lock(&pool->lock);
	atomic_fetch_add_explicit(&pool->gen, 1, memory_order_release);
	if (pool->sleepers)
		pthread_cond_broadcast(&pool->wake);
	pthread_mutex_unlock(&pool->lock);

	pool_drain(pool, fn, ctx, n_items, chunk, 0);

	/* busy reaching 0 (acquire) orders every worker's writes before our return. */
	for (int i = 0; i < pool->spin; i++) {
		if (atomic_load_explicit(&pool->busy, memory_order_acquire) == 0)
			return;
		pool_pause();
	}
	pthread_mutex_lock(&pool->lock);
	while (atomic_load_explicit(&pool->busy, memory_order_acquire) > 0)
		pthread_cond_wait(&pool->done, &pool->lock);
	pthread_mutex_unlock(&pool->lock);
}
