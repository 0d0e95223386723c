/*
 * host_memory.h - the host memory sm70d may still take, for engine.kv_memory_fraction on
 * the host backends.
 *
 * MemAvailable alone would overstate it wherever a memory cgroup limits sm70d (systemd's
 * MemoryMax=, a container's limit): the kernel reports the machine's memory there, and a
 * cache sized from it is reclaimed or OOM-killed under the limit. So the figure is
 * MemAvailable, or where lower the headroom (limit less usage) of the daemon's memory
 * cgroup and each of its ancestors, v2 (memory.max, memory.current) or v1
 * (memory.limit_in_bytes, memory.usage_in_bytes). A cgroup path that does not exist under
 * the mount (a container whose cgroup namespace shows its own root there) is looked up at
 * the mount's root. Non-goals: swap, huge pages, NUMA nodes.
 */
#ifndef SM70_DAEMON_HOST_MEMORY_H
#define SM70_DAEMON_HOST_MEMORY_H

#include <stdint.h>

/* Bytes available to this process: MemAvailable, bounded by its memory cgroups. Sets
 * *bound (may be NULL) to "MemAvailable" or "the memory cgroup's limit". 0 if
 * /proc/meminfo cannot be read. */
uint64_t sm70__host_memory_available(const char **bound);

/* The same, reading proc_dir/meminfo, proc_dir/self/cgroup and the cgroup trees under
 * cgroup_root (for tests: "/proc" and "/sys/fs/cgroup" in the daemon). */
uint64_t sm70__host_memory_available_at(const char *proc_dir, const char *cgroup_root,
					const char **bound);

#endif
