/*
 * host_memory.c - MemAvailable bounded by the memory cgroups; see host_memory.h.
 *
 * Uses only libc (no daemon logging), so a unit test can compile it alone.
 */
#include "daemon/host_memory.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* A limit at or above this is "none" (v1 writes 2^63 rounded down to a page). */
#define NO_LIMIT (1ull << 62)

/* The number in file path ("max" and anything unreadable: none, UINT64_MAX). */
static uint64_t read_number(const char *path)
{
	unsigned long long v;
	char buf[64];
	FILE *f = fopen(path, "r");
	int ok;

	if (!f)
		return UINT64_MAX;
	ok = fgets(buf, sizeof(buf), f) && sscanf(buf, "%llu", &v) == 1;
	fclose(f);
	return ok ? (uint64_t)v : UINT64_MAX;
}

static uint64_t meminfo_available(const char *proc_dir)
{
	char path[PATH_MAX], line[256];
	unsigned long long kb = 0;
	FILE *f;

	snprintf(path, sizeof(path), "%s/meminfo", proc_dir);
	f = fopen(path, "r");
	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1)
			break;
	fclose(f);
	return (uint64_t)kb * 1024;
}

static int is_dir(const char *path)
{
	struct stat st;

	return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* The least headroom (limit - usage) of the cgroup mount/rel and its ancestors up to
 * the mount, or UINT64_MAX when none of them has a limit. */
static uint64_t headroom(const char *mount, const char *rel, const char *max_file,
			 const char *cur_file)
{
	char dir[PATH_MAX], path[PATH_MAX + 32];
	uint64_t best = UINT64_MAX;
	size_t n;

	if (snprintf(dir, sizeof(dir), "%s%s", mount, rel) >= (int)sizeof(dir))
		return UINT64_MAX;
	if (!is_dir(dir))
		snprintf(dir, sizeof(dir), "%s", mount); /* a namespaced view: our root */
	n = strlen(dir);
	while (n > 1 && dir[n - 1] == '/')
		dir[--n] = '\0';
	for (;;) {
		uint64_t max, cur;

		snprintf(path, sizeof(path), "%s/%s", dir, max_file);
		max = read_number(path);
		if (max < NO_LIMIT) {
			snprintf(path, sizeof(path), "%s/%s", dir, cur_file);
			cur = read_number(path);
			if (cur == UINT64_MAX)
				cur = 0;
			if ((cur < max ? max - cur : 0) < best)
				best = cur < max ? max - cur : 0;
		}
		if (strlen(dir) <= strlen(mount))
			break;
		*strrchr(dir, '/') = '\0';
		if (strlen(dir) < strlen(mount))
			break;
	}
	return best;
}

/* The least headroom over the process's memory cgroups (v2 and v1), or UINT64_MAX. */
static uint64_t cgroup_headroom(const char *proc_dir, const char *cgroup_root)
{
	char path[PATH_MAX], mount[PATH_MAX], line[PATH_MAX + 64];
	uint64_t best = UINT64_MAX, h;
	FILE *f;

	snprintf(path, sizeof(path), "%s/self/cgroup", proc_dir);
	f = fopen(path, "r");
	if (!f)
		return UINT64_MAX;
	while (fgets(line, sizeof(line), f)) {
		char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL, *rel;

		if (!c2)
			continue;
		*c1 = *c2 = '\0'; /* line: the hierarchy id, c1 + 1: its controllers */
		rel = c2 + 1;
		rel[strcspn(rel, "\n")] = '\0';
		if (strcmp(line, "0") == 0 && c1[1] == '\0') { /* v2: "0::/path" */
			snprintf(mount, sizeof(mount), "%s", cgroup_root);
			if (is_dir(mount) && (h = headroom(mount, rel, "memory.max",
							   "memory.current")) < best)
				best = h;
			/* a hybrid layout mounts v2 at unified/ */
			snprintf(mount, sizeof(mount), "%s/unified", cgroup_root);
			if (is_dir(mount) && (h = headroom(mount, rel, "memory.max",
							   "memory.current")) < best)
				best = h;
			continue;
		}
		/* v1: "N:controller,controller:/path" with memory among the controllers */
		for (char *tok = strtok(c1 + 1, ","); tok; tok = strtok(NULL, ","))
			if (strcmp(tok, "memory") == 0) {
				snprintf(mount, sizeof(mount), "%s/memory", cgroup_root);
				if (is_dir(mount) && (h = headroom(mount, rel,
								   "memory.limit_in_bytes",
								   "memory.usage_in_bytes")) < best)
					best = h;
				break;
			}
	}
	fclose(f);
	return best;
}

uint64_t sm70__host_memory_available_at(const char *proc_dir, const char *cgroup_root,
					const char **bound)
{
	uint64_t avail = meminfo_available(proc_dir);
	uint64_t cg = cgroup_headroom(proc_dir, cgroup_root);

	if (bound)
		*bound = "MemAvailable";
	if (avail && cg < avail) {
		avail = cg;
		if (bound)
			*bound = "the memory cgroup's limit";
	}
	return avail;
}

uint64_t sm70__host_memory_available(const char **bound)
{
	return sm70__host_memory_available_at("/proc", "/sys/fs/cgroup", bound);
}
