/*
 * config.h - sm70d's configuration: defaults, and a small JSON file that overrides them.
 *
 * The parser is table-driven (config.c): each key has a type, a place in struct
 * sm70__config and a range; objects ("limits", "engine", "rings") nest tables. Unknown keys
 * are rejected and every error names the key, e.g. "limits.max_new_tokens: must be an
 * integer in 1..1048576". Non-goals: reloading at run time, environment variables.
 */
#ifndef SM70_DAEMON_CONFIG_H
#define SM70_DAEMON_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

#define SM70__CFG_MAX_IDS 64
#define SM70__CFG_PATH_MAX 108 /* sizeof(sun_path) */

struct sm70__config {
	char socket_path[SM70__CFG_PATH_MAX];
	uint32_t socket_mode; /* chmod of the socket file (default 0660) */
	/* Access: a peer is let in if its uid is in allowed_uids or its gid (primary or
	 * supplementary) in allowed_gids. Default: root and the daemon's own uid. */
	uint32_t allowed_uids[SM70__CFG_MAX_IDS];
	uint32_t n_allowed_uids;
	uint32_t allowed_gids[SM70__CFG_MAX_IDS];
	uint32_t n_allowed_gids;
	uint32_t max_sessions;

	struct {
		uint32_t max_jobs_in_flight;
		uint32_t max_prompt_tokens;
		uint32_t max_new_tokens;
		uint32_t max_context_tokens; /* 0: the model's context */
		uint32_t max_priority;
		uint32_t max_top_logprobs;
	} limits;

	struct {
		uint32_t max_seqs;
		uint32_t max_batch_tokens;
		uint32_t block_size;
		uint64_t kv_bytes;
		uint32_t n_threads; /* CPU backend workers, 0: all cores */
		uint32_t feed_depth; /* jobs kept waiting inside the engine beyond max_seqs */
	} engine;

	struct {
		uint32_t sq_entries; /* defaults for a hello that asks for 0 */
		uint32_t eq_entries;
		uint32_t arena_tokens;
		uint32_t start_index; /* first ring index of every session (test wraparound) */
	} rings;

	uint32_t drain_grace_ms;       /* SIGTERM: time running jobs get to finish */
	uint32_t slow_consumer_ms;     /* event ring stuck full this long: E_SLOW_CONSUMER */
	uint32_t slow_consumer_events; /* or this many undelivered events held for a client */
	uint32_t hello_timeout_ms;
};

/* Fills c with the defaults (the socket path, access for root and getuid(), limits). */
void sm70__config_default(struct sm70__config *c);

/* Overrides c with the JSON object in file `path`. Returns 0, or -EINVAL / -ENOENT / ...
 * with err naming the file and the key. c may be partly updated on failure. */
int sm70__config_load(struct sm70__config *c, const char *path, struct sm70_err *err);

#endif
