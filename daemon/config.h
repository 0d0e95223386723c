/*
 * config.h - sm70d's configuration: defaults, a small JSON file that overrides them, and
 * the checks that run before anything starts.
 *
 * The parser is table-driven (config.c): each key has a type, a place in struct
 * sm70__config and a range; objects ("limits", "engine", "rings", "fast_paths") nest
 * tables. Unknown keys are rejected and every error names the key, e.g.
 * "limits.max_new_tokens: must be an integer in 1..16777216". Command-line flags override
 * the file (main.c writes them into the struct between load and check). docs/OBSERVABILITY.md
 * has the reference table. Non-goals: reloading at run time, environment variables.
 */
#ifndef SM70_DAEMON_CONFIG_H
#define SM70_DAEMON_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

#define SM70__CFG_DEFAULT_PATH "/etc/sm70d/sm70d.json"
#define SM70__CFG_MAX_IDS 64
#define SM70__CFG_MAX_GPUS 16
#define SM70__CFG_PATH_MAX 108 /* sizeof(sun_path) */
#define SM70__CFG_DIR_MAX 4096
#define SM70__CFG_WORD 16 /* one of a few choices, NUL included */
#define SM70__CFG_MAX_OVERRIDES 16
#define SM70__CFG_UNSET UINT32_MAX /* an override entry does not set this limit */

/* The limits that apply to one client (the config's "limits", or an override of them). */
struct sm70__cfg_limits {
	uint32_t max_jobs_in_flight;
	uint32_t max_prompt_tokens;
	uint32_t max_new_tokens;
	uint32_t max_context_tokens; /* 0: the model's context */
	uint32_t max_priority;	     /* priority is a privilege: 0 unless granted */
	uint32_t max_top_logprobs;
	/* Per uid, over all its sessions (a fair share, so that one uid cannot take every
	 * slot). 0 in the file: derived by sm70__config_check, a quarter of max_sessions (at
	 * least 1) and 4 x max_jobs_in_flight. */
	uint32_t max_sessions_per_uid;
	uint32_t max_jobs_per_uid;
};

/* One "overrides" entry: the limits it sets (others SM70__CFG_UNSET) for the peers it
 * names by uid or by group (primary or supplementary). */
struct sm70__cfg_override {
	uint32_t uids[SM70__CFG_MAX_IDS];
	uint32_t n_uids;
	uint32_t gids[SM70__CFG_MAX_IDS];
	uint32_t n_gids;
	uint32_t max_jobs_in_flight, max_prompt_tokens, max_new_tokens, max_priority;
	uint32_t max_sessions_per_uid, max_jobs_per_uid;
};

struct sm70__config {
	/* the model and where it runs */
	char model_dir[SM70__CFG_DIR_MAX]; /* "" until the file or --model sets it */
	/* "" (unset): the name comes from the checkpoint or the directory (model_name.h) */
	char model_name[64];
	char backend[SM70__CFG_WORD];	   /* "cpu" (default), "cuda" or "null" */
	char load_format[SM70__CFG_WORD];  /* "auto" (default) or "dummy" */
	uint32_t gpus[SM70__CFG_MAX_GPUS]; /* CUDA device ids, rank order (the first tp used) */
	uint32_t n_gpus;
	uint32_t tp;                       /* tensor-parallel ranks, 1..4 (default 1) */

	char socket_path[SM70__CFG_PATH_MAX];
	uint32_t socket_mode; /* chmod of the socket file (default 0660) */
	/* Access: a peer is let in if its uid is in allowed_uids or its gid (primary or
	 * supplementary) in allowed_gids. Default: root and the daemon's own uid. */
	uint32_t allowed_uids[SM70__CFG_MAX_IDS];
	uint32_t n_allowed_uids;
	uint32_t allowed_gids[SM70__CFG_MAX_IDS];
	uint32_t n_allowed_gids;
	uint32_t max_sessions;

	/* The admin channel (admin.c): "" means socket_path + ".admin", filled in by
	 * sm70__config_check. Its own access list, also root and the daemon's uid by
	 * default. */
	char admin_socket_path[SM70__CFG_PATH_MAX];
	uint32_t admin_socket_mode; /* default 0660 */
	uint32_t admin_allowed_uids[SM70__CFG_MAX_IDS];
	uint32_t n_admin_allowed_uids;
	uint32_t admin_allowed_gids[SM70__CFG_MAX_IDS];
	uint32_t n_admin_allowed_gids;
	/* Who may also control the daemon (drain): the lists above may only read (status,
	 * metrics, jobs, clients, health). A controller may read too. Default: root and the
	 * daemon's uid. */
	uint32_t admin_control_uids[SM70__CFG_MAX_IDS];
	uint32_t n_admin_control_uids;
	uint32_t admin_control_gids[SM70__CFG_MAX_IDS];
	uint32_t n_admin_control_gids;
	/* The admin socket file's group (chown after bind; the daemon must be a member), so
	 * that admin_socket_mode can open it to that group. */
	uint32_t admin_socket_gid;
	uint32_t has_admin_socket_gid;
	/* An admin connection with no request for this long is closed (default 5000), and
	 * one uid holds at most this many of the SM70__ADMIN_MAX_CONNS (default 4), so idle
	 * or hoarded connections cannot lock sm70ctl out. */
	uint32_t admin_idle_ms;
	uint32_t admin_max_conns_per_uid;

	struct sm70__cfg_limits limits;
	/* Per uid or group: the first entry naming a peer sets the limits it lists. */
	struct sm70__cfg_override overrides[SM70__CFG_MAX_OVERRIDES];
	uint32_t n_overrides;

	struct {
		uint32_t max_seqs;
		uint32_t max_batch_tokens;
		uint32_t block_size;
		uint64_t kv_bytes;
		/* > 0: the KV cache gets this fraction of the memory free before the model loads,
		 * less the model's weight files (main.c); kv_bytes is then ignored */
		double kv_memory_fraction;
		/* "auto" (the backend's), "f32", "f16", "fp8" (K FP8-E4M3, V f16), "fp8-all"
		 * (K and V FP8-E4M3): sm70_engine_opts_kv_mode's words */
		char kv_dtype[SM70__CFG_WORD];
		uint32_t prefix_cache;	       /* 1 (default) or 0 */
		/* who shares cached prefixes: "user" (default: each uid its own), "group"
		 * (the primary gid), "shared" (everyone; a hit tells one client what another
		 * asked) */
		char prefix_cache_scope[SM70__CFG_WORD];
		uint32_t n_threads; /* CPU backend workers, 0: all cores */
		uint32_t feed_depth; /* jobs kept waiting inside the engine beyond max_seqs */
		uint32_t state_slots; /* recurrent-state slots (hybrid models); 0: max_seqs */
		/* 1: a sequence's tokens and logprobs bitwise the same whatever shares its
		 * steps (docs/ENGINE.md, "Batch invariance"); 0 (default) leaves it to
		 * SM70_BATCH_INVARIANT */
		uint32_t batch_invariant;
	} engine;

	/* Named switches back to reference kernels ("fast" or "reference"; "" leaves the
	 * environment alone). Exported as SM70_MATMUL / SM70_ATTENTION / SM70_FUSED (0 for
	 * "reference") / SM70_ALLREDUCE (nccl for "reference") before the backends are
	 * created, which is where they are read. */
	struct {
		char matmul[SM70__CFG_WORD];
		char attention[SM70__CFG_WORD];
		char fused[SM70__CFG_WORD];
		char allreduce[SM70__CFG_WORD];
		/* "reference": DeltaNet prefill by the token-by-token recurrence instead of
		 * the chunked form (an engine option, not an environment variable) */
		char gdn[SM70__CFG_WORD];
		char overlap[SM70__CFG_WORD];    /* SM70_PDL: overlapped launches or none */
		char gemv_split[SM70__CFG_WORD]; /* SM70_GEMV_SPLIT: column-split GEMVs or none */
	} fast_paths;

	struct {
		uint32_t sq_entries; /* defaults for a hello that asks for 0 */
		uint32_t eq_entries;
		uint32_t arena_tokens;
		uint32_t start_index; /* first ring index of every session (test wraparound) */
	} rings;

	uint32_t drain_grace_ms;       /* SIGTERM: time running jobs get to finish */
	uint32_t slow_consumer_ms;     /* event ring stuck full this long: E_SLOW_CONSUMER */
	uint32_t slow_consumer_events; /* or this many undelivered events held for a client */
	/* all sessions together: each may hold its share (at least 64), if below the above */
	uint32_t slow_consumer_events_total;
	uint32_t hello_timeout_ms;
};

/* Fills c with the defaults (the socket path, access for root and getuid(), limits). */
void sm70__config_default(struct sm70__config *c);

/* Overrides c with the JSON object in file `path`. Returns 0, or -errno (-ENOENT: no such
 * file, -EACCES, -EISDIR, ... for a file that cannot be read; -EINVAL for bad JSON or a
 * bad key) with err naming the file and the dotted key and saying why. c may be partly
 * updated on failure. */
int sm70__config_load(struct sm70__config *c, const char *path, struct sm70_err *err);

/* The checks that need the whole configuration (after the file and the command-line
 * flags): a model directory is set and is a readable directory; the admin socket path
 * (derived from the socket path when unset) fits; gpus is not empty for the CUDA backend;
 * engine settings that cannot start (a step budget below max_seqs, a host backend's KV
 * cache larger than the host's memory).
 * Fills in derived defaults (the admin socket, the per-uid limits left at 0). Returns 0 or
 * -EINVAL/-errno with err naming the key. */
int sm70__config_check(struct sm70__config *c, struct sm70_err *err);

/* The limits for a peer: c->limits with the first override that names uid or one of the
 * n_gids gids applied. Returns that override's index, or -1 if none names the peer. */
int sm70__config_limits_for(const struct sm70__config *c, uint32_t uid, const uint32_t *gids,
			    uint32_t n_gids, struct sm70__cfg_limits *out);

#endif
