/* block_pool.c - free list, reference counts and the prefix cache of KV blocks; see
 * block_pool.h. */
#include "daemon/engine/block_pool.h"

#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

int sm70_block_pool_init(struct sm70_block_pool *p, int n_blocks, int caching)
{
	uint32_t tsize = 16;

	memset(p, 0, sizeof(*p));
	if (n_blocks <= 0)
		return -EINVAL;
	while (tsize < 2u * (uint32_t)n_blocks)
		tsize <<= 1;
	p->free_ids = malloc(sizeof(*p->free_ids) * (size_t)n_blocks);
	p->refs = calloc((size_t)n_blocks, sizeof(*p->refs));
	p->published = calloc((size_t)n_blocks, 1);
	p->keys = calloc((size_t)n_blocks, sizeof(*p->keys));
	p->lru_prev = malloc(sizeof(int32_t) * (size_t)n_blocks);
	p->lru_next = malloc(sizeof(int32_t) * (size_t)n_blocks);
	p->table = malloc(sizeof(int32_t) * tsize);
	if (!p->free_ids || !p->refs || !p->published || !p->keys || !p->lru_prev ||
	    !p->lru_next || !p->table) {
		sm70_block_pool_fini(p);
		return -ENOMEM;
	}
	p->n_blocks = n_blocks;
	p->n_free = n_blocks;
	p->caching = caching;
	/* Hand out low ids first: easier to read in dumps, no other reason. */
	for (int i = 0; i < n_blocks; i++)
		p->free_ids[i] = n_blocks - 1 - i;
	p->lru_head = p->lru_tail = -1;
	p->table_mask = tsize - 1;
	memset(p->table, 0xff, sizeof(int32_t) * tsize);
	return 0;
}

void sm70_block_pool_fini(struct sm70_block_pool *p)
{
	free(p->free_ids);
	free(p->refs);
	free(p->published);
	free(p->keys);
	free(p->lru_prev);
	free(p->lru_next);
	free(p->table);
	memset(p, 0, sizeof(*p));
}

/* ---- key -> block table (linear probing, backward-shift deletion) ---------------------- */

static uint32_t slot_of(const struct sm70_block_pool *p, struct sm70_block_key k)
{
	return (uint32_t)(k.a ^ (k.b >> 17)) & p->table_mask;
}

static int key_eq(struct sm70_block_key x, struct sm70_block_key y)
{
	return x.a == y.a && x.b == y.b;
}

int32_t sm70_block_pool_lookup(const struct sm70_block_pool *p, struct sm70_block_key key)
{
	if (!p->caching)
		return -1;
	for (uint32_t i = slot_of(p, key);; i = (i + 1) & p->table_mask) {
		int32_t id = p->table[i];
		if (id < 0)
			return -1;
		if (key_eq(p->keys[id], key))
			return id;
	}
}

static void table_remove(struct sm70_block_pool *p, int32_t id)
{
	uint32_t i = slot_of(p, p->keys[id]), j;

	while (p->table[i] != id)
		i = (i + 1) & p->table_mask;
	/* Shift later entries of the probe run back so lookups never see a hole. */
	for (j = (i + 1) & p->table_mask; p->table[j] >= 0; j = (j + 1) & p->table_mask) {
		uint32_t home = slot_of(p, p->keys[p->table[j]]);
		/* entry j may move to i when its home is not in (i, j] cyclically */
		if (((j - home) & p->table_mask) >= ((j - i) & p->table_mask)) {
			p->table[i] = p->table[j];
			i = j;
		}
	}
	p->table[i] = -1;
	p->published[id] = 0;
}

void sm70_block_pool_publish(struct sm70_block_pool *p, int32_t id, struct sm70_block_key key)
{
	uint32_t i;

	assert(id >= 0 && id < p->n_blocks && p->refs[id] > 0);
	if (!p->caching || p->published[id] || sm70_block_pool_lookup(p, key) >= 0)
		return;
	for (i = slot_of(p, key); p->table[i] >= 0; i = (i + 1) & p->table_mask)
		;
	p->table[i] = id;
	p->keys[id] = key;
	p->published[id] = 1;
}

/* ---- LRU of parked blocks ---------------------------------------------------------------- */

static void lru_unlink(struct sm70_block_pool *p, int32_t id)
{
	int32_t pr = p->lru_prev[id], nx = p->lru_next[id];

	if (pr >= 0)
		p->lru_next[pr] = nx;
	else
		p->lru_head = nx;
	if (nx >= 0)
		p->lru_prev[nx] = pr;
	else
		p->lru_tail = pr;
	p->n_parked--;
}

static void lru_push_tail(struct sm70_block_pool *p, int32_t id)
{
	p->lru_prev[id] = p->lru_tail;
	p->lru_next[id] = -1;
	if (p->lru_tail >= 0)
		p->lru_next[p->lru_tail] = id;
	else
		p->lru_head = id;
	p->lru_tail = id;
	p->n_parked++;
}

int32_t sm70_block_pool_alloc(struct sm70_block_pool *p)
{
	int32_t id;

	if (p->n_free > 0) {
		id = p->free_ids[--p->n_free];
	} else if (p->lru_head >= 0) {
		id = p->lru_head;
		lru_unlink(p, id);
		table_remove(p, id);
		p->evictions++;
	} else {
		return -ENOSPC;
	}
	p->refs[id] = 1;
	return id;
}

void sm70_block_pool_ref(struct sm70_block_pool *p, int32_t id)
{
	assert(id >= 0 && id < p->n_blocks);
	if (p->refs[id] == 0) {
		assert(p->published[id]); /* only parked blocks have no owner and are findable */
		lru_unlink(p, id);
	}
	p->refs[id]++;
}

void sm70_block_pool_unref(struct sm70_block_pool *p, int32_t id)
{
	assert(id >= 0 && id < p->n_blocks && p->refs[id] > 0);
	if (--p->refs[id] > 0)
		return;
	if (p->published[id])
		lru_push_tail(p, id);
	else
		p->free_ids[p->n_free++] = id;
}

static uint64_t mix64(uint64_t z)
{
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* Two independent 64-bit chains: a collision would hand a sequence another prompt's KV,
 * so the key is 128 bits. */
struct sm70_block_key sm70_block_key_next(struct sm70_block_key prev, const int32_t *tokens,
					  int n)
{
	uint64_t a = prev.a ^ 0x243f6a8885a308d3ull, b = prev.b ^ 0x13198a2e03707344ull;

	for (int i = 0; i < n; i++) {
		uint64_t t = (uint32_t)tokens[i];
		a = mix64(a + t + 0x9e3779b97f4a7c15ull);
		b = mix64((b ^ (t * 0xd6e8feb86659fd93ull)) + 0xa0761d6478bd642full);
	}
	a = mix64(a ^ (uint64_t)n);
	b = mix64(b + (uint64_t)n);
	return (struct sm70_block_key){ a, b };
}
