/*
 * test_block_pool - the KV block pool: allocation and reference counts, and the prefix
 * cache's publish / lookup / park / evict rules, checked against a simple model under a
 * long random sequence of operations; isolation: keys depend on the domain and the pool's
 * secret, a key with other tokens or another domain is a miss, a child block is found only
 * after the very publication it was computed after.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "daemon/engine/block_pool.h"

#define BS 2 /* tokens per block in these pools */

static const int32_t *toks(int i)
{
	static int32_t t[4][BS];
	static int next;
	int32_t *r = t[next++ & 3];

	r[0] = i;
	r[1] = i * 7;
	return r;
}

static struct sm70_block_key key_of(const struct sm70_block_pool *p, int i)
{
	return sm70_block_key_next(p, 0, (struct sm70_block_key){ 0, 0 }, toks(i), BS);
}

/* A first block of prefix i in domain 0. */
static uint64_t publish(struct sm70_block_pool *p, int32_t id, int i)
{
	return sm70_block_pool_publish(p, id, key_of(p, i), 0, 0, toks(i));
}

static int32_t lookup(struct sm70_block_pool *p, int i)
{
	uint64_t serial;

	return sm70_block_pool_lookup(p, key_of(p, i), 0, 0, toks(i), &serial);
}

static void test_plain_pool(void **state)
{
	struct sm70_block_pool p;
	int32_t ids[8];

	assert_int_equal(sm70_block_pool_init(&p, 8, BS, 0), 0);
	for (int i = 0; i < 8; i++)
		assert_true((ids[i] = sm70_block_pool_alloc(&p)) >= 0);
	assert_int_equal(sm70_block_pool_alloc(&p), -ENOSPC);
	sm70_block_pool_ref(&p, ids[3]);
	sm70_block_pool_unref(&p, ids[3]);
	assert_int_equal(sm70_block_pool_available(&p), 0);
	assert_true(publish(&p, ids[3], 1) == SM70_BLOCK_NO_SERIAL); /* caching off */
	assert_int_equal(lookup(&p, 1), -1);
	for (int i = 0; i < 8; i++)
		sm70_block_pool_unref(&p, ids[i]);
	assert_int_equal(sm70_block_pool_available(&p), 8);
	sm70_block_pool_fini(&p);
	printf("plain pool: 8 allocations, -ENOSPC on the 9th, all free again\n");
}

static void test_park_and_evict_lru(void **state)
{
	struct sm70_block_pool p;
	int32_t a, b, c, d;

	assert_int_equal(sm70_block_pool_init(&p, 3, BS, 1), 0);
	a = sm70_block_pool_alloc(&p);
	b = sm70_block_pool_alloc(&p);
	c = sm70_block_pool_alloc(&p);
	uint64_t sb;

	publish(&p, a, 1);
	sb = publish(&p, b, 2);
	/* an equal block holds the prefix: c stays unpublished, b's publication answers */
	assert_true(publish(&p, c, 2) == sb);
	assert_int_equal(lookup(&p, 2), b);
	sm70_block_pool_unref(&p, b); /* parked first: least recently used */
	sm70_block_pool_unref(&p, a);
	sm70_block_pool_unref(&p, c); /* unpublished: free */
	assert_int_equal(p.n_parked, 2);
	assert_int_equal(sm70_block_pool_available(&p), 3);
	/* taking a parked block back removes it from the LRU */
	sm70_block_pool_ref(&p, a);
	assert_int_equal(p.n_parked, 1);
	d = sm70_block_pool_alloc(&p); /* the free one */
	assert_int_equal(d, c);
	d = sm70_block_pool_alloc(&p); /* evicts b */
	assert_int_equal(d, b);
	assert_int_equal(lookup(&p, 2), -1);
	assert_int_equal(lookup(&p, 1), a);
	assert_int_equal(p.evictions, 1);
	sm70_block_pool_fini(&p);
	printf("park/evict: LRU order kept, parked block revived, evicted key gone\n");
}

/* Random publish/lookup/unref/alloc against a model of what must be findable. */
static void test_random_against_model(void **state)
{
	enum { N = 64, KEYS = 200, OPS = 200000 };
	struct sm70_block_pool p;
	int model_block_of_key[KEYS];
	int key_of_block[N];
	int owned[N];
	unsigned seed = 12345;

	assert_int_equal(sm70_block_pool_init(&p, N, BS, 1), 0);
	for (int i = 0; i < KEYS; i++)
		model_block_of_key[i] = -1;
	for (int i = 0; i < N; i++)
		key_of_block[i] = -1, owned[i] = 0;
	for (int op = 0; op < OPS; op++) {
		int r = (int)((seed = seed * 1103515245u + 12345u) >> 8);
		int k = r % KEYS;
		int32_t id;
		switch ((r >> 10) % 4) {
		case 0: /* allocate, maybe publish */
			id = sm70_block_pool_alloc(&p);
			if (id < 0) {
				assert_int_equal(sm70_block_pool_available(&p), 0);
				break;
			}
			if (key_of_block[id] >= 0) { /* it was evicted */
				model_block_of_key[key_of_block[id]] = -1;
				key_of_block[id] = -1;
			}
			owned[id]++;
			if (model_block_of_key[k] < 0) {
				publish(&p, id, k);
				model_block_of_key[k] = id;
				key_of_block[id] = k;
			}
			break;
		case 1: /* release one owner of some owned block */
			id = (int32_t)((r >> 12) % N);
			if (owned[id]) {
				owned[id]--;
				sm70_block_pool_unref(&p, id);
			}
			break;
		case 2: /* look up and take */
			id = lookup(&p, k);
			assert_int_equal(id, model_block_of_key[k]);
			if (id >= 0) {
				sm70_block_pool_ref(&p, id);
				owned[id]++;
			}
			break;
		default: /* lookup only */
			assert_int_equal(lookup(&p, k), model_block_of_key[k]);
		}
	}
	for (int i = 0; i < N; i++)
		while (owned[i]--)
			sm70_block_pool_unref(&p, i);
	assert_int_equal(sm70_block_pool_available(&p), N);
	printf("random: %d operations agree with the model; %llu evictions\n", OPS,
	       (unsigned long long)p.evictions);
	sm70_block_pool_fini(&p);
}

/* The same tokens in two domains have two keys; a key carried into another domain, or
 * given other tokens, finds nothing (a mismatch counted); two pools (two boots) key the
 * same prefix differently. */
static void test_domains_and_tokens(void **state)
{
	struct sm70_block_pool p, q;
	struct sm70_block_key k0 = { 0, 0 }, ka, kb;
	int32_t t[BS] = { 11, 12 }, other[BS] = { 11, 13 };
	uint64_t serial;
	int32_t id;

	assert_int_equal(sm70_block_pool_init(&p, 4, BS, 1), 0);
	assert_int_equal(sm70_block_pool_init(&q, 4, BS, 1), 0);
	ka = sm70_block_key_next(&p, 1, k0, t, BS);
	kb = sm70_block_key_next(&p, 2, k0, t, BS);
	assert_false(ka.a == kb.a && ka.b == kb.b);
	kb = sm70_block_key_next(&q, 1, k0, t, BS);
	assert_false(ka.a == kb.a && ka.b == kb.b);
	id = sm70_block_pool_alloc(&p);
	assert_true(sm70_block_pool_publish(&p, id, ka, 1, 0, t) != SM70_BLOCK_NO_SERIAL);
	assert_int_equal(sm70_block_pool_lookup(&p, ka, 1, 0, t, &serial), id);
	assert_int_equal(sm70_block_pool_lookup(&p, ka, 2, 0, t, &serial), -1);
	assert_true(serial == SM70_BLOCK_NO_SERIAL);
	assert_int_equal(sm70_block_pool_lookup(&p, ka, 1, 0, other, &serial), -1);
	assert_int_equal(p.key_mismatches, 2);
	sm70_block_pool_unref(&p, id);
	sm70_block_pool_fini(&q);
	sm70_block_pool_fini(&p);
	printf("domains: one prefix, two domains, two keys; a forged key with another domain "
	       "or other tokens: a miss, %d mismatches counted; two pools: two keys\n", 2);
}

/* A second block is found only after the publication of the first it was computed after:
 * once the first is evicted and recomputed, the old second is stale, and the recomputed
 * second takes its key over (the stale parked one freed). */
static void test_chain_parents(void **state)
{
	struct sm70_block_pool p;
	struct sm70_block_key k0 = { 0, 0 }, k1, k2;
	int32_t t1[BS] = { 1, 2 }, t2[BS] = { 3, 4 };
	int32_t a, b, a2, b2;
	uint64_t s1, s2, ser;

	assert_int_equal(sm70_block_pool_init(&p, 3, BS, 1), 0);
	k1 = sm70_block_key_next(&p, 0, k0, t1, BS);
	k2 = sm70_block_key_next(&p, 0, k1, t2, BS);
	a = sm70_block_pool_alloc(&p);
	b = sm70_block_pool_alloc(&p);
	s1 = sm70_block_pool_publish(&p, a, k1, 0, 0, t1);
	s2 = sm70_block_pool_publish(&p, b, k2, 0, s1, t2);
	assert_true(s1 != SM70_BLOCK_NO_SERIAL && s2 != SM70_BLOCK_NO_SERIAL && s1 != s2);
	assert_int_equal(sm70_block_pool_lookup(&p, k2, 0, s1, t2, &ser), b);
	assert_true(ser == s2);
	assert_int_equal(sm70_block_pool_lookup(&p, k2, 0, 0, t2, &ser), -1);
	assert_true(sm70_block_pool_publish(&p, b, k2, 0, SM70_BLOCK_NO_SERIAL, t2) ==
		    SM70_BLOCK_NO_SERIAL);
	/* a parked before b: a is evicted first, b stays in the table, stale */
	sm70_block_pool_unref(&p, a);
	sm70_block_pool_unref(&p, b);
	assert_int_equal(sm70_block_pool_alloc(&p), 2); /* the free one */
	a2 = sm70_block_pool_alloc(&p);
	assert_int_equal(a2, a);
	s1 = sm70_block_pool_publish(&p, a2, k1, 0, 0, t1);
	assert_int_equal(sm70_block_pool_lookup(&p, k2, 0, s1, t2, &ser), -1);
	assert_int_equal(p.key_mismatches, 0); /* stale, not a collision */
	/* b is parked and stale; taking the key over frees it */
	assert_int_equal(p.n_parked, 1);
	sm70_block_pool_unref(&p, 2);
	b2 = sm70_block_pool_alloc(&p);
	assert_int_equal(b2, 2);
	s2 = sm70_block_pool_publish(&p, b2, k2, 0, s1, t2);
	assert_int_equal(sm70_block_pool_lookup(&p, k2, 0, s1, t2, &ser), b2);
	assert_int_equal(p.n_parked, 0);
	assert_int_equal(p.n_free, 1);
	sm70_block_pool_unref(&p, a2);
	sm70_block_pool_unref(&p, b2);
	assert_int_equal(sm70_block_pool_available(&p), 3);
	sm70_block_pool_fini(&p);
	printf("chain: a second block found only after its own first block's publication; "
	       "stale after the first's eviction; replaced, the stale one freed\n");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_plain_pool),
		cmocka_unit_test(test_park_and_evict_lru),
		cmocka_unit_test(test_random_against_model),
		cmocka_unit_test(test_domains_and_tokens),
		cmocka_unit_test(test_chain_parents),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
