/*
 * fixture_cases.h - the cases a fixture test takes from a reference file (tests/fixtures/
 * DIR/reference.json). SM70_TEST_CASES=N keeps the first N of each fixture; scripts/test.sh
 * sets 2 for the sanitizer run, which then still takes every architecture's paths and
 * batches of several sequences, in about half the time. Unset, every case. Only for tests
 * whose verdict is per case: an average over the cases must see them all.
 */
#ifndef SM70_TESTS_UNIT_FIXTURE_CASES_H
#define SM70_TESTS_UNIT_FIXTURE_CASES_H

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>

/* ref's "cases" array, cut to SM70_TEST_CASES entries when that is set. */
static inline json_t *sm70t_fixture_cases(json_t *ref)
{
	json_t *cases = json_object_get(ref, "cases");
	const char *s = getenv("SM70_TEST_CASES");
	const long keep = s && *s ? strtol(s, NULL, 10) : 0;

	while (keep > 0 && json_array_size(cases) > (size_t)keep)
		json_array_remove(cases, json_array_size(cases) - 1);
	return cases;
}

/* A line saying the cut is on, for the test's log. */
static inline void sm70t_fixture_cases_note(void)
{
	const char *s = getenv("SM70_TEST_CASES");

	if (s && *s && strtol(s, NULL, 10) > 0)
		printf("SM70_TEST_CASES=%s: the first %s cases of each fixture only\n", s, s);
}

#endif
