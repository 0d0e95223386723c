/*
 * test_block_pool - the KV block pool: allocation and reference counts, and the prefix
 * cache's publish / lookup / park / evict rules, checked against a simple model under a
 * long random sequence of operations.
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

static struct sm70_block_key key_of(int i)
{
	int32_t t[2] = { i, i * 7 };

	return sm70_block_key_next((struct sm70_block_key){ 0, 0 }, t, 2);
}

static void test_plain_pool(void **state)
{
	struct sm70_block_pool p;
	int32_t ids[8];

	assert_int_equal(sm70_block_pool_init(&p, 8, 0), 0);
	for (int i = 0; i < 8; i++)
		assert_true((ids[i] = sm70_block_pool_alloc(&p)) >= 0);
	assert_int_equal(sm70_block_pool_alloc(&p), -ENOSPC);
	sm70_block_pool_ref(&p, ids[3]);
	sm70_block_pool_unref(&p, ids[3]);
	assert_int_equal(sm70_block_pool_available(&p), 0);
	sm70_block_pool_publish(&p, ids[3], key_of(1)); /* caching off: ignored */
	assert_int_equal(sm70_block_pool_lookup(&p, key_of(1)), -1);
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

	assert_int_equal(sm70_block_pool_init(&p, 3, 1), 0);
	a = sm70_block_pool_alloc(&p);
	b = sm70_block_pool_alloc(&p);
	c = sm70_block_pool_alloc(&p);
	sm70_block_pool_publish(&p, a, key_of(1));
	sm70_block_pool_publish(&p, b, key_of(2));
	sm70_block_pool_publish(&p, c, key_of(2)); /* key taken: c stays unpublished */
	assert_int_equal(sm70_block_pool_lookup(&p, key_of(2)), b);
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
	assert_int_equal(sm70_block_pool_lookup(&p, key_of(2)), -1);
	assert_int_equal(sm70_block_pool_lookup(&p, key_of(1)), a);
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

	assert_int_equal(sm70_block_pool_init(&p, N, 1), 0);
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
				sm70_block_pool_publish(&p, id, key_of(k));
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
			id = sm70_block_pool_lookup(&p, key_of(k));
			assert_int_equal(id, model_block_of_key[k]);
			if (id >= 0) {
				sm70_block_pool_ref(&p, id);
				owned[id]++;
			}
			break;
		default: /* lookup only */
			assert_int_equal(sm70_block_pool_lookup(&p, key_of(k)), model_block_of_key[k]);
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

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_plain_pool),
		cmocka_unit_test(test_park_and_evict_lru),
		cmocka_unit_test(test_random_against_model),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
