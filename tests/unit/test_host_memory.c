/*
 * test_host_memory - the host memory a host backend's KV cache is sized from
 * (daemon/host_memory.h): MemAvailable, bounded by a v2 or v1 memory cgroup's headroom
 * (its own or an ancestor's, whichever is least), with "max" and v1's huge value as no
 * limit, and a namespaced cgroup path looked up at the mount's root. Fake /proc and
 * /sys/fs/cgroup trees in a temporary directory; then the real ones, which must give a
 * non-zero figure no larger than MemAvailable.
 */
#include "daemon/host_memory.c"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#define GIB (1ull << 30)
#define MIB (1ull << 20)

static char root[64];

/* Writes text to root/rel, making the directories. */
static void put(const char *rel, const char *text)
{
	char path[512], cmd[600];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", root, rel);
	*strrchr(path, '/') = '\0';
	snprintf(cmd, sizeof(cmd), "mkdir -p '%s'", path);
	assert_int_equal(system(cmd), 0);
	snprintf(path, sizeof(path), "%s/%s", root, rel);
	f = fopen(path, "w");
	assert_non_null(f);
	fputs(text, f);
	fclose(f);
}

static uint64_t avail(const char *case_dir, const char **bound)
{
	char proc[256], cg[256];

	snprintf(proc, sizeof(proc), "%s/%s/proc", root, case_dir);
	snprintf(cg, sizeof(cg), "%s/%s/cgroup", root, case_dir);
	return sm70__host_memory_available_at(proc, cg, bound);
}

static void test_fake_trees(void **state)
{
	const char *bound;
	uint64_t v;

	/* no cgroup limit: MemAvailable (16 GiB) */
	put("a/proc/meminfo", "MemTotal: 33554432 kB\nMemAvailable: 16777216 kB\n");
	put("a/proc/self/cgroup", "0::/system.slice/sm70d.service\n");
	put("a/cgroup/system.slice/sm70d.service/memory.max", "max\n");
	put("a/cgroup/system.slice/sm70d.service/memory.current", "1048576\n");
	v = avail("a", &bound);
	printf("no limit: %llu MiB by %s\n", (unsigned long long)(v / MIB), bound);
	assert_true(v == 16 * GIB);
	assert_string_equal(bound, "MemAvailable");

	/* v2 MemoryMax=4G with 1 GiB used: 3 GiB */
	put("b/proc/meminfo", "MemAvailable: 16777216 kB\n");
	put("b/proc/self/cgroup", "0::/system.slice/sm70d.service\n");
	put("b/cgroup/system.slice/sm70d.service/memory.max", "4294967296\n");
	put("b/cgroup/system.slice/sm70d.service/memory.current", "1073741824\n");
	v = avail("b", &bound);
	printf("v2 limit 4 GiB, 1 GiB used: %llu MiB by %s\n", (unsigned long long)(v / MIB),
	       bound);
	assert_true(v == 3 * GIB);
	assert_string_equal(bound, "the memory cgroup's limit");

	/* an ancestor's limit is lower: 2 GiB limit, 1.5 GiB used there */
	put("b/cgroup/system.slice/memory.max", "2147483648\n");
	put("b/cgroup/system.slice/memory.current", "1610612736\n");
	v = avail("b", NULL);
	printf("ancestor limit 2 GiB, 1.5 GiB used: %llu MiB\n", (unsigned long long)(v / MIB));
	assert_true(v == 512 * MIB);

	/* v1, a namespaced path that does not exist under the mount: the mount's root */
	put("c/proc/meminfo", "MemAvailable: 16777216 kB\n");
	put("c/proc/self/cgroup", "5:cpu,cpuacct:/x\n4:memory:/docker/abc\n0::/\n");
	put("c/cgroup/memory/memory.limit_in_bytes", "8589934592\n");
	put("c/cgroup/memory/memory.usage_in_bytes", "2147483648\n");
	v = avail("c", &bound);
	printf("v1 limit 8 GiB at the namespace root, 2 GiB used: %llu MiB by %s\n",
	       (unsigned long long)(v / MIB), bound);
	assert_true(v == 6 * GIB);
	/* v1's "no limit" */
	put("c/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n");
	assert_true(avail("c", NULL) == 16 * GIB);

	/* usage over the limit: nothing left */
	put("d/proc/meminfo", "MemAvailable: 1048576 kB\n");
	put("d/proc/self/cgroup", "0::/s\n");
	put("d/cgroup/s/memory.max", "1000\n");
	put("d/cgroup/s/memory.current", "2000\n");
	assert_true(avail("d", NULL) == 0);

	/* no meminfo: 0, whatever the cgroups say */
	put("e/proc/self/cgroup", "0::/s\n");
	assert_true(avail("e", NULL) == 0);
}

static void test_this_host(void **state)
{
	const char *bound;
	uint64_t v = sm70__host_memory_available(&bound);
	uint64_t mem = meminfo_available("/proc");

	printf("this host: %llu MiB by %s (MemAvailable %llu MiB)\n",
	       (unsigned long long)(v / MIB), bound, (unsigned long long)(mem / MIB));
	assert_true(v > 0);
	assert_true(v <= mem + 64 * MIB); /* MemAvailable moves between the two reads */
}

static int setup(void **state)
{
	snprintf(root, sizeof(root), "/tmp/sm70-host-memory-XXXXXX");
	return mkdtemp(root) ? 0 : -1;
}

static int teardown(void **state)
{
	char cmd[128];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
	return system(cmd) == 0 ? 0 : -1;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_fake_trees),
		cmocka_unit_test(test_this_host),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
