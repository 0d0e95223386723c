/* block_pool.c - free list, reference counts and the prefix cache of KV blocks; see
 * block_pool.h. */
#include "daemon/engine/block_pool.h"

#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

/* The first byte of every key's message, absorbed with the secret at init: it tells these
 * keys from any other use of the same hash, and lets the template state hold the key
 * block already compressed, so a 16-token block costs one compression. */
#define KEY_TAG 'P'

static int random_secret(uint8_t *out, size_t n)
{
	size_t got = 0;

	while (got < n) {
		ssize_t r = getrandom(out + got, n - got, 0);
		if (r < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		got += (size_t)r;
	}
	return 0;
}

int sm70_block_pool_init(struct sm70_block_pool *p, int n_blocks, int block_size, int caching)
{
	uint32_t tsize = 16;
	uint8_t secret[32];
	uint8_t tag = KEY_TAG;
	int ret;

	memset(p, 0, sizeof(*p));
	if (n_blocks <= 0 || block_size <= 0)
		return -EINVAL;
	ret = random_secret(secret, sizeof(secret));
	if (ret)
		return ret;
	sm70__blake2b_init(&p->hash, sizeof(struct sm70_block_key), secret, sizeof(secret));
	sm70__blake2b_update(&p->hash, &tag, 1);
	memset(secret, 0, sizeof(secret));
	while (tsize < 2u * (uint32_t)n_blocks)
		tsize <<= 1;
	p->free_ids = malloc(sizeof(*p->free_ids) * (size_t)n_blocks);
	p->refs = calloc((size_t)n_blocks, sizeof(*p->refs));
	p->published = calloc((size_t)n_blocks, 1);
	p->keys = calloc((size_t)n_blocks, sizeof(*p->keys));
	p->lru_prev = malloc(sizeof(int32_t) * (size_t)n_blocks);
	p->lru_next = malloc(sizeof(int32_t) * (size_t)n_blocks);
	p->table = malloc(sizeof(int32_t) * tsize);
	if (caching) {
		p->tokens = malloc(sizeof(int32_t) * (size_t)n_blocks * (size_t)block_size);
		p->domains = calloc((size_t)n_blocks, sizeof(*p->domains));
		p->serials = calloc((size_t)n_blocks, sizeof(*p->serials));
		p->parents = calloc((size_t)n_blocks, sizeof(*p->parents));
	}
	if (!p->free_ids || !p->refs || !p->published || !p->keys || !p->lru_prev ||
	    !p->lru_next || !p->table ||
	    (caching && (!p->tokens || !p->domains || !p->serials || !p->parents))) {
		sm70_block_pool_fini(p);
		return -ENOMEM;
	}
	p->n_blocks = n_blocks;
	p->n_free = n_blocks;
	p->caching = caching;
	p->block_size = block_size;
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
	free(p->tokens);
	free(p->domains);
	free(p->serials);
	free(p->parents);
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

/* The block the table holds under key, or -1 (at most one: publish keeps keys unique). */
static int32_t table_find(const struct sm70_block_pool *p, struct sm70_block_key key)
{
	for (uint32_t i = slot_of(p, key);; i = (i + 1) & p->table_mask) {
		int32_t id = p->table[i];
		if (id < 0)
			return -1;
		if (key_eq(p->keys[id], key))
			return id;
	}
}

static const int32_t *tokens_of(const struct sm70_block_pool *p, int32_t id)
{
	return p->tokens + (size_t)id * (size_t)p->block_size;
}

/* Whether published block id holds tokens in domain: what a key alone cannot promise. */
static int same_contents(const struct sm70_block_pool *p, int32_t id, uint64_t domain,
			 const int32_t *tokens)
{
	return p->domains[id] == domain &&
	       memcmp(tokens_of(p, id), tokens, sizeof(int32_t) * (size_t)p->block_size) == 0;
}

int32_t sm70_block_pool_lookup(struct sm70_block_pool *p, struct sm70_block_key key,
			       uint64_t domain, uint64_t parent, const int32_t *tokens,
			       uint64_t *serial)
{
	int32_t id;

	*serial = SM70_BLOCK_NO_SERIAL;
	if (!p->caching || parent == SM70_BLOCK_NO_SERIAL || (id = table_find(p, key)) < 0)
		return -1;
	if (!same_contents(p, id, domain, tokens)) {
		p->key_mismatches++;
		return -1;
	}
	/* Same tokens after another publication: computed after another prefix (or after
	 * this one's evicted parent), so its KV is not this prefix's. */
	if (p->parents[id] != parent)
		return -1;
	*serial = p->serials[id];
	return id;
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

static void lru_unlink(struct sm70_block_pool *p, int32_t id);

uint64_t sm70_block_pool_publish(struct sm70_block_pool *p, int32_t id, struct sm70_block_key key,
				 uint64_t domain, uint64_t parent, const int32_t *tokens)
{
	uint32_t i;
	int32_t holder;

	assert(id >= 0 && id < p->n_blocks && p->refs[id] > 0);
	if (!p->caching || parent == SM70_BLOCK_NO_SERIAL)
		return SM70_BLOCK_NO_SERIAL;
	if (p->published[id])
		return key_eq(p->keys[id], key) && p->parents[id] == parent &&
		       same_contents(p, id, domain, tokens) ? p->serials[id] : SM70_BLOCK_NO_SERIAL;
	holder = table_find(p, key);
	if (holder >= 0) {
		if (p->parents[holder] == parent && same_contents(p, holder, domain, tokens))
			return p->serials[holder];
		/* Stale or colliding: this prefix takes the key. A parked holder is no one's
		 * and nobody can find it any more: free it. */
		table_remove(p, holder);
		if (p->refs[holder] == 0) {
			lru_unlink(p, holder);
			p->free_ids[p->n_free++] = holder;
		}
	}
	for (i = slot_of(p, key); p->table[i] >= 0; i = (i + 1) & p->table_mask)
		;
	p->table[i] = id;
	p->keys[id] = key;
	memcpy(p->tokens + (size_t)id * (size_t)p->block_size, tokens,
	       sizeof(int32_t) * (size_t)p->block_size);
	p->domains[id] = domain;
	p->parents[id] = parent;
	p->serials[id] = ++p->next_serial;
	p->published[id] = 1;
	return p->serials[id];
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

static void put64(uint8_t *b, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		b[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get64(const uint8_t *b)
{
	uint64_t v = 0;

	for (int i = 7; i >= 0; i--)
		v = (v << 8) | b[i];
	return v;
}

/* BLAKE2b-128 keyed with the pool's secret over tag || domain || prev || n || tokens, all
 * little-endian: 93 bytes for 16 tokens, one compression after the template's key block. */
struct sm70_block_key sm70_block_key_next(const struct sm70_block_pool *p, uint64_t domain,
					  struct sm70_block_key prev, const int32_t *tokens,
					  int n)
{
	struct sm70_blake2b s = p->hash;
	uint8_t head[28], chunk[128], out[16];
	int i = 0;

	put64(head, domain);
	put64(head + 8, prev.a);
	put64(head + 16, prev.b);
	put64(chunk, (uint64_t)(uint32_t)n);
	memcpy(head + 24, chunk, 4);
	sm70__blake2b_update(&s, head, sizeof(head));
	while (i < n) {
		int k = 0;
		for (; k < 32 && i < n; k++, i++) {
			uint32_t t = (uint32_t)tokens[i];
			chunk[4 * k] = (uint8_t)t;
			chunk[4 * k + 1] = (uint8_t)(t >> 8);
			chunk[4 * k + 2] = (uint8_t)(t >> 16);
			chunk[4 * k + 3] = (uint8_t)(t >> 24);
		}
		sm70__blake2b_update(&s, chunk, (size_t)k * 4);
	}
	sm70__blake2b_final(&s, out);
	return (struct sm70_block_key){ get64(out), get64(out + 8) };
}
