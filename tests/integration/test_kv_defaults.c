/*
 * test_kv_defaults - how sm70d sizes its KV cache and says when it is too small, against
 * a real daemon (CPU backend, tiny fixture whose context is 4096 tokens): a 64 KiB cache
 * (32 tokens) is warned of at start in the log, in `status` and in sm70ctl's table, with
 * both figures in tokens; limits.max_context_tokens is the context it is measured
 * against; engine.kv_memory_fraction on a host backend takes its fraction of
 * MemAvailable but at most a quarter (as --check-config reports it), and a cache that
 * holds a context draws no warning; the packaged config passes --check-config.
 */
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "tests/integration/daemon_util.h"

/* MemAvailable in bytes, or 0. */
static uint64_t mem_available(void)
{
	char line[256];
	unsigned long long kb = 0;
	FILE *f = fopen("/proc/meminfo", "r");

	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1)
			break;
	fclose(f);
	return (uint64_t)kb * 1024;
}

static void stop(struct sm70t_daemon *t)
{
	int st = sm70t_daemon_stop(t, SIGTERM, 10000);

	if (st != 0)
		sm70t_daemon_dump_log(t);
	assert_int_equal(st, 0);
	sm70t_daemon_cleanup(t);
}

/* The warning in the log, the status reply and sm70ctl's table: want names the figures. */
static void expect_warning(const char *config, const char *want)
{
	struct sm70t_daemon t;
	static char out[8192];
	char cmd[512];
	json_t *r, *w;

	assert_int_equal(sm70t_daemon_start(&t, config, NULL), 0);
	if (!sm70t_log_contains(&t, want)) {
		sm70t_daemon_dump_log(&t);
		fail_msg("no warning '%s' in the log", want);
	}
	r = sm70t_ctl_status(&t);
	assert_non_null(r);
	w = json_object_get(r, "warnings");
	assert_int_equal(json_array_size(w), 1);
	printf("status warns: %s\n", json_string_value(json_array_get(w, 0)));
	assert_non_null(strstr(json_string_value(json_array_get(w, 0)), want));
	json_decref(r);
	snprintf(cmd, sizeof(cmd), "%s/bin/sm70ctl --socket %s.admin status", sm70t_build_dir(),
		 t.sock);
	assert_int_equal(sm70t_capture(cmd, out, sizeof(out)), 0);
	assert_non_null(strstr(out, "\nwarning    the KV cache holds"));
	assert_non_null(strstr(out, want));
	stop(&t);
}

static void test_small_cache_warned(void **state)
{
	/* 64 KiB: 2 blocks of 16 tokens for this fixture; the model's context is 4096 */
	expect_warning("{\"engine\": {\"kv_bytes\": 65536}}",
		       "holds 32 tokens, less than one full context of 4096 tokens (the model's "
		       "max_position_embeddings)");
	/* measured against the configured context where that is lower */
	expect_warning("{\"engine\": {\"kv_bytes\": 65536}, \"limits\": "
		       "{\"max_context_tokens\": 1000}}",
		       "holds 32 tokens, less than one full context of 1000 tokens "
		       "(limits.max_context_tokens)");
}

/* The KV budget --check-config reports for config (MiB per rank), or -1. */
static long long checked_kv_mib(const char *config)
{
	static char out[4096];
	char cmd[1024];
	const char *p;

	snprintf(cmd, sizeof(cmd), "f=/tmp/sm70-kv-defaults-%d.json; printf '%%s' '%s' > $f && "
		 "%s/bin/sm70d --check-config --model %s --config $f; st=$?; rm -f $f; exit $st",
		 (int)getpid(), config, sm70t_build_dir(), SM70T_DEFAULT_MODEL);
	if (sm70t_capture(cmd, out, sizeof(out)) != 0)
		return -1;
	p = strstr(out, "KV cache ");
	return p ? atoll(p + 9) : -1;
}

static void test_fraction_on_host(void **state)
{
	struct sm70t_daemon t;
	uint64_t avail = mem_available();
	long long f90, f10, f01;
	json_t *r;

	/* --check-config computes the budget without allocating it */
	f90 = checked_kv_mib("{\"engine\": {\"kv_memory_fraction\": 0.9}}");
	f10 = checked_kv_mib("{\"engine\": {\"kv_memory_fraction\": 0.1}}");
	printf("kv_memory_fraction on the CPU backend, %llu MiB available: 0.9 -> %lld MiB, "
	       "0.1 -> %lld MiB\n", (unsigned long long)(avail >> 20), f90, f10);
	assert_true(f90 > 0 && f10 > 0);
	/* 0.9 is capped at a quarter of what is available (give or take what changed) */
	assert_true(avail == 0 || (uint64_t)f90 <= (avail >> 20) / 4 + (avail >> 20) / 16);
	assert_true(avail == 0 || (uint64_t)f90 >= (avail >> 20) / 4 - (avail >> 20) / 16);
	/* 0.1 is below the cap: a tenth of what is available less the weights (1 MiB) */
	assert_true(f10 < f90);
	assert_true(avail == 0 || (uint64_t)f10 >= (avail >> 20) / 10 - (avail >> 20) / 40);

	/* a daemon with a small fraction (no large allocation under ASan): sized so, and one
	 * context fits, so no warning */
	assert_int_equal(sm70t_daemon_start(&t, "{\"engine\": {\"kv_memory_fraction\": "
					    "0.001}}", NULL), 0);
	f01 = checked_kv_mib("{\"engine\": {\"kv_memory_fraction\": 0.001}}");
	r = sm70t_ctl_status(&t);
	assert_non_null(r);
	printf("kv_memory_fraction 0.001: %lld MiB (--check-config %lld MiB), %lld tokens, "
	       "%zu warnings\n", json_integer_value(json_object_get(r, "kv_bytes")) >> 20, f01,
	       (long long)json_integer_value(json_object_get(r, "kv_tokens")),
	       json_array_size(json_object_get(r, "warnings")));
	assert_true(json_integer_value(json_object_get(r, "kv_tokens")) >= 4096);
	assert_int_equal(json_array_size(json_object_get(r, "warnings")), 0);
	assert_true(sm70t_log_contains(&t, "engine.kv_memory_fraction 0.001 of the free host "
				       "memory"));
	json_decref(r);
	stop(&t);
}

static void test_packaged_config_checks(void **state)
{
	static char out[4096];
	char cmd[512];

	/* the packaged file, with the fixture in place of /var/lib/sm70/model */
	snprintf(cmd, sizeof(cmd), "f=/tmp/sm70-kv-defaults-%d.json; "
		 "sed 's|/var/lib/sm70/model|%s|; s|\"sm70-clients\"|0|' packaging/sm70d.json "
		 "> $f && %s/bin/sm70d --check-config --config $f; st=$?; rm -f $f; exit $st",
		 (int)getpid(), SM70T_DEFAULT_MODEL, sm70t_build_dir());
	assert_int_equal(sm70t_capture(cmd, out, sizeof(out)), 0);
	printf("%s", out);
	assert_non_null(strstr(out, "configuration OK"));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_small_cache_warned),
		cmocka_unit_test(test_fraction_on_host),
		cmocka_unit_test(test_packaged_config_checks),
	};

	signal(SIGPIPE, SIG_IGN);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
