/*
 * block_pool.h - host-side bookkeeping of the paged KV cache: which blocks are free and
 * how many owners each used block has.
 *
 * The memory itself lives in the backend (see model.h); this only hands out block ids.
 * Reference counts let several sequences share a block (prefix caching builds on it).
 * Not thread-safe: the engine thread owns it.
 */
#ifndef SM70_ENGINE_BLOCK_POOL_H
#define SM70_ENGINE_BLOCK_POOL_H

#include <stdint.h>

struct sm70_block_pool {
	int n_blocks;
	int n_free;
	int32_t *free_ids; /* stack of free block ids */
	int32_t *refs;     /* owners of each block; 0 when free */
};

/* Returns 0 or -ENOMEM / -EINVAL. */
int sm70_block_pool_init(struct sm70_block_pool *p, int n_blocks);
void sm70_block_pool_fini(struct sm70_block_pool *p);

/* A free block with one owner, or -ENOSPC. */
int32_t sm70_block_pool_alloc(struct sm70_block_pool *p);

/* Adds an owner to a used block. */
void sm70_block_pool_ref(struct sm70_block_pool *p, int32_t id);

/* Drops one owner; the block is free again when none is left. */
void sm70_block_pool_unref(struct sm70_block_pool *p, int32_t id);

#endif
