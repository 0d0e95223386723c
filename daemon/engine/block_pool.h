/*
 * block_pool.h - host-side bookkeeping of the paged KV cache: which blocks are free, how
 * many owners each used block has, and the prefix cache.
 *
 * The memory itself lives in the backend (see model.h); this only hands out block ids.
 *
 * Prefix cache: a full block can be published under the key of the whole token prefix it
 * completes (a 128-bit chained hash: key_i = H(key_{i-1}, tokens of block i)). When its
 * last owner lets go, a published block is not freed but parked on an LRU list, still
 * findable by key; a later sequence with the same prefix takes it back instead of
 * recomputing. Allocation takes free blocks first, then evicts the least recently used
 * parked block. With caching off, blocks are never published and this is a plain pool.
 *
 * Not thread-safe: the engine thread owns it.
 */
#ifndef SM70_ENGINE_BLOCK_POOL_H
#define SM70_ENGINE_BLOCK_POOL_H

#include <stddef.h>
#include <stdint.h>

struct sm70_block_key {
	uint64_t a, b;
};

struct sm70_block_pool {
	int n_blocks;
	int n_free;
	int32_t *free_ids; /* stack of free block ids */
	int32_t *refs;     /* owners of each block; 0 when free or parked */

	int caching;
	uint8_t *published;            /* block holds a published prefix */
	struct sm70_block_key *keys;   /* its key, when published */
	int32_t *lru_prev, *lru_next;  /* parked blocks, head = least recently used */
	int32_t lru_head, lru_tail;
	int n_parked;
	int32_t *table;                /* open addressing, key -> block id, -1 empty */
	uint32_t table_mask;
	uint64_t evictions;
};

/* Returns 0 or -ENOMEM / -EINVAL. caching turns the prefix cache on. */
int sm70_block_pool_init(struct sm70_block_pool *p, int n_blocks, int caching);
void sm70_block_pool_fini(struct sm70_block_pool *p);

/* Blocks an allocation could get now: free plus parked. */
static inline int sm70_block_pool_available(const struct sm70_block_pool *p)
{
	return p->n_free + p->n_parked;
}

/* A block with one owner (free first, else the LRU parked one, unpublished), or
 * -ENOSPC. */
int32_t sm70_block_pool_alloc(struct sm70_block_pool *p);

/* Adds an owner to a block that is used or parked (a parked block leaves the LRU). */
void sm70_block_pool_ref(struct sm70_block_pool *p, int32_t id);

/* Drops one owner; with none left the block is parked if published, else freed. */
void sm70_block_pool_unref(struct sm70_block_pool *p, int32_t id);

/* The key of the prefix ending with tokens[0..n) after the prefix keyed prev (use a zero
 * key for the first block). */
struct sm70_block_key sm70_block_key_next(struct sm70_block_key prev, const int32_t *tokens,
					  int n);

/* The block published under key, or -1. Does not take a reference. */
int32_t sm70_block_pool_lookup(const struct sm70_block_pool *p, struct sm70_block_key key);

/* Publishes a used, full block under key. Does nothing when caching is off, when the
 * block is already published, or when another block already holds key. */
void sm70_block_pool_publish(struct sm70_block_pool *p, int32_t id, struct sm70_block_key key);

#endif
