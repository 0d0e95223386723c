/*
 * parallel.h - one helper that spreads a loop over the host's cores for a moment: load-time
 * work (dummy weights, NVFP4 rearrangement) that is too big for one core and too short-lived
 * for a thread pool. Not for the decode path (the CPU backend has its own workers).
 */
#ifndef SM70_COMMON_PARALLEL_H
#define SM70_COMMON_PARALLEL_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Runs fn(ctx, i0, i1) over the items [0, n), `band` at a time, on up to 32 threads (the
 * caller among them); on the caller alone when n * cost (cost: work per item, e.g. bytes
 * made) is below 2^20 or no thread starts. fn runs concurrently on disjoint ranges, so its
 * results must not depend on which thread does which range. Returns when all are done. */
void sm70__parallel_for(size_t n, size_t band, size_t cost,
			void (*fn)(void *ctx, size_t i0, size_t i1), void *ctx);

#ifdef __cplusplus
}
#endif

#endif
