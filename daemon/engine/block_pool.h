/*
 * block_pool.h - host-side bookkeeping of the paged KV cache: which blocks are free, how
 * many owners each used block has, and the prefix cache.
 *
 * The memory itself lives in the backend (see model.h); this only hands out block ids.
 *
 * Prefix cache: a full block can be published under the key of the whole token prefix it
 * completes, within an isolation domain (an opaque 64-bit id: the daemon's uid or gid of
 * the submitter, 0 for one shared cache). Keys are chained: key_i = BLAKE2b-128 keyed
 * with a random per-pool secret over (domain, key_{i-1}, tokens of block i), so nobody
 * outside the process can compute or aim at a key. A key only finds a candidate: a hit
 * is trusted when the block's own tokens, its domain and its parent (the publication the
 * block was computed after, by serial number) are equal to the asker's, so a hit at depth
 * n is, by induction, a prefix equal token for token in the same domain. When its last
 * owner lets go, a published block is not freed but parked on an LRU list, still
 * findable; a later sequence with the same prefix takes it back instead of recomputing.
 * Allocation takes free blocks first, then evicts the least recently used parked block.
 * With caching off, blocks are never published and this is a plain pool.
 *
 * Not thread-safe: the engine thread owns it.
 */
#ifndef SM70_ENGINE_BLOCK_POOL_H
#define SM70_ENGINE_BLOCK_POOL_H

#include <stddef.h>
#include <stdint.h>

#include "common/blake2b.h"

struct sm70_block_key {
	uint64_t a, b;
};

/* A parent serial that no block has: a chain that could not be published goes on with it,
 * and nothing is ever found under it. The first block of a prefix has parent 0. */
#define SM70_BLOCK_NO_SERIAL UINT64_MAX

struct sm70_block_pool {
	int n_blocks;
	int n_free;
	int32_t *free_ids; /* stack of free block ids */
	int32_t *refs;     /* owners of each block; 0 when free or parked */

	int caching;
	int block_size;                /* tokens per block: what a published block keeps */
	uint8_t *published;            /* block holds a published prefix */
	struct sm70_block_key *keys;   /* its key, when published */
	int32_t *tokens;               /* [n_blocks][block_size]: its tokens, when published */
	uint64_t *domains;             /* its domain, when published */
	uint64_t *serials;             /* its publication's serial (unique, from 1) */
	uint64_t *parents;             /* the serial of the block before it, 0 for the first */
	uint64_t next_serial;
	struct sm70_blake2b hash;      /* keyed with the secret, the tag byte absorbed */
	int32_t *lru_prev, *lru_next;  /* parked blocks, head = least recently used */
	int32_t lru_head, lru_tail;
	int n_parked;
	int32_t *table;                /* open addressing, key -> block id, -1 empty */
	uint32_t table_mask;
	uint64_t evictions;
	uint64_t key_mismatches;       /* keys found whose block held other tokens or domain */
};

/* Returns 0 or -ENOMEM / -EINVAL, or the -errno of getrandom (the key secret comes from
 * it: it may wait for the kernel's entropy pool once, early in boot). caching turns the
 * prefix cache on; block_size is the tokens of a published block. */
int sm70_block_pool_init(struct sm70_block_pool *p, int n_blocks, int block_size, int caching);
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

/* The key of the prefix ending with tokens[0..n) after the prefix keyed prev in domain
 * (use a zero key for the first block). Depends on the pool's secret. */
struct sm70_block_key sm70_block_key_next(const struct sm70_block_pool *p, uint64_t domain,
					  struct sm70_block_key prev, const int32_t *tokens,
					  int n);

/* The block published under key that holds tokens[0..block_size) in domain after the
 * publication parent (0 for a prefix's first block), or -1; *serial gets its serial (the
 * parent of the next block). A key found with other contents counts in key_mismatches
 * and is a miss. Does not take a reference. */
int32_t sm70_block_pool_lookup(struct sm70_block_pool *p, struct sm70_block_key key,
			       uint64_t domain, uint64_t parent, const int32_t *tokens,
			       uint64_t *serial);

/* Publishes a used, full block holding tokens[0..block_size) under key, in domain, after
 * the publication parent. Returns the serial of the publication that now holds this
 * prefix: id's new one, or that of an equal block published before (id stays
 * unpublished); SM70_BLOCK_NO_SERIAL when caching is off or parent is. A block already
 * published keeps its publication. A key held by a block with other contents (a stale
 * block whose parent was evicted, or a collision) is taken over. */
uint64_t sm70_block_pool_publish(struct sm70_block_pool *p, int32_t id, struct sm70_block_key key,
				 uint64_t domain, uint64_t parent, const int32_t *tokens);

#endif
