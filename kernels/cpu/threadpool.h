/*
 * threadpool.h - a small persistent pthread pool for the CPU backend's data-parallel ops.
 *
 * A pool of n threads is the caller plus n - 1 workers that, between jobs, poll briefly
 * (tens of microseconds) and then sleep on a condition variable. sm70__pool_run()
 * splits [0, n_items) into contiguous chunks that the workers and the caller claim from
 * a shared counter, and returns when every chunk is done; jobs no larger than one grain
 * run inline in the caller, without waking anyone.
 *
 * Non-goals: task graphs, nested or concurrent runs (one caller at a time per pool),
 * work stealing, priorities.
 */
#ifndef SM70_KERNELS_CPU_THREADPOOL_H
#define SM70_KERNELS_CPU_THREADPOOL_H

struct sm70__pool;

/* Runs items [begin, end) of a job. `thread` is the index of the thread running it, in
 * [0, n_threads) (0 is the caller), so that a job can use per-thread scratch memory. */
typedef void (*sm70__pool_fn)(void *ctx, int begin, int end, int thread);

/* Creates a pool of n_threads >= 1 threads (the caller counts as one, so n_threads - 1
 * workers are started). Returns 0 and sets *out, or -EINVAL / -ENOMEM / -errno from
 * pthread_create (nothing is left running then). */
int sm70__pool_create(struct sm70__pool **out, int n_threads);

/* Stops and joins the workers and frees the pool (NULL is fine). Must not race a run. */
void sm70__pool_destroy(struct sm70__pool *pool);

/* Threads in the pool, the caller included. */
int sm70__pool_threads(const struct sm70__pool *pool);

/*
 * Calls fn over [0, n_items) in contiguous chunks of at least `grain` items (grain < 1
 * counts as 1), spread over the workers and the calling thread; returns when all calls
 * have returned. Each item is passed to exactly one call. n_items <= grain (or a
 * one-thread pool) runs fn(ctx, 0, n_items, 0) in the caller. Not reentrant: one run
 * at a time per pool, and fn must not call sm70__pool_run on the same pool.
 */
void sm70__pool_run(struct sm70__pool *pool, int n_items, int grain, sm70__pool_fn fn,
		    void *ctx);

#endif
