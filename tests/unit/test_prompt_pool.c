/* test_prompt_pool - a session's pool of queued prompt copies: bounded, out-of-order frees, pages given back when it drains. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "daemon/prompt_pool.c"

/* Fills a block with a pattern of its own, and checks it later. */
static void fill(int32_t *p, uint32_t n, int32_t seed)
{
	for (uint32_t i = 0; i < n; i++)
		p[i] = seed + (int32_t)i;
}

static int intact(const int32_t *p, uint32_t n, int32_t seed)
{
	for (uint32_t i = 0; i < n; i++)
		if (p[i] != seed + (int32_t)i)
			return 0;
	return 1;
}

static void test_bounded_and_wraps(void **state)
{
	struct sm70__prompt_pool p;
	int32_t *a, *b, *c, *d;

	(void)state;
	sm70__prompt_pool_init(&p, 1024);
	assert_null(p.mem); /* nothing mapped before the first copy */
	assert_true(sm70__prompt_pool_fits(&p, 1024));
	assert_false(sm70__prompt_pool_fits(&p, 1025));
	a = sm70__prompt_pool_alloc(&p, 400);
	b = sm70__prompt_pool_alloc(&p, 400);
	assert_non_null(a);
	assert_non_null(b);
	fill(a, 400, 1);
	fill(b, 400, 1000);
	/* 802 of 1025 words used: 300 more tokens do not fit */
	assert_false(sm70__prompt_pool_fits(&p, 300));
	assert_null(sm70__prompt_pool_alloc(&p, 300));
	c = sm70__prompt_pool_alloc(&p, 200);
	assert_non_null(c);
	fill(c, 200, 5000);
	/* freed out of order: b first frees nothing at the oldest end */
	sm70__prompt_pool_free(&p, b);
	assert_int_equal(p.used, 1003);
	assert_false(sm70__prompt_pool_fits(&p, 300));
	/* then a: the oldest end moves past a and b */
	sm70__prompt_pool_free(&p, a);
	assert_int_equal(p.used, 201);
	/* 500 tokens do not fit before the end (22 words left): the end is skipped, the block
	 * goes to the front */
	d = sm70__prompt_pool_alloc(&p, 500);
	assert_non_null(d);
	assert_ptr_equal(d, (int32_t *)p.mem + 1);
	fill(d, 500, 9000);
	assert_true(intact(c, 200, 5000));
	sm70__prompt_pool_free(&p, c);
	assert_true(intact(d, 500, 9000));
	sm70__prompt_pool_free(&p, d);
	assert_int_equal(p.used, 0);
	assert_int_equal(p.live, 0);
	assert_int_equal(p.head, 0);
	assert_int_equal(p.tail, 0);
	sm70__prompt_pool_free(&p, NULL);
	sm70__prompt_pool_destroy(&p);
	assert_null(p.mem);
}

static void test_pages_given_back(void **state)
{
	struct sm70__prompt_pool p;
	int32_t *a, *b;

	(void)state;
	sm70__prompt_pool_init(&p, 65536);
	/* small ones: no system call when they drain */
	a = sm70__prompt_pool_alloc(&p, 100);
	sm70__prompt_pool_free(&p, a);
	assert_int_equal(p.released, 0);
	/* a burst past 64 kB: given back when the pool empties */
	a = sm70__prompt_pool_alloc(&p, 32000);
	b = sm70__prompt_pool_alloc(&p, 32000);
	fill(a, 32000, 7);
	fill(b, 32000, 8);
	sm70__prompt_pool_free(&p, a);
	assert_int_equal(p.released, 0);
	sm70__prompt_pool_free(&p, b);
	assert_int_equal(p.released, 1);
	assert_int_equal(p.touched, 0);
	/* and the pool works on (the pages come back zeroed) */
	a = sm70__prompt_pool_alloc(&p, 65536);
	assert_non_null(a);
	assert_int_equal(a[100], 0);
	sm70__prompt_pool_free(&p, a);
	printf("pool of 65536 tokens: %llu release(s) of its pages\n",
	       (unsigned long long)p.released);
	sm70__prompt_pool_destroy(&p);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_bounded_and_wraps),
		cmocka_unit_test(test_pages_given_back),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
