/*
 * daemon.h - the state of one sm70d process, shared by main.c, session.c and scheduler.c.
 *
 * Everything runs on one thread (see docs/DAEMON.md), so this struct has no locks: the
 * loop callbacks, the engine's event callback and the timers all run between engine steps
 * on the thread that owns it. Non-goals: being a library; nothing here is exported.
 */
#ifndef SM70_DAEMON_DAEMON_H
#define SM70_DAEMON_DAEMON_H

#include <stdint.h>

#include "daemon/config.h"
#include "daemon/engine/engine.h"
#include "daemon/loop.h"
#include "daemon/metrics.h"

#define SM70__MAX_WARNINGS 4 /* start-up warnings kept for `status` */

struct sm70__session;
struct sm70__admin_conn;
struct sm70__uid_use;

struct sm70__daemon {
	struct sm70__config cfg;
	struct sm70__loop *loop;
	struct sm70_engine *engine;

	/* the loaded model, for limits and finish reasons */
	char model_name[64];
	uint32_t vocab_size;
	uint32_t max_position;
	uint64_t kv_tokens; /* KV cache capacity in tokens */
	/* one full context: max_position, or limits.max_context_tokens where lower */
	uint32_t context_tokens;
	/* start-up warnings an operator should see (main.c), for `status` */
	char warnings[SM70__MAX_WARNINGS][320];
	int n_warnings;
	int n_eos;
	int32_t eos_ids[8];

	/* the listening socket */
	int listen_fd;
	int listen_unlink; /* we bound it (not socket activation): unlink at exit */
	struct sm70__watch *listen_watch;
	/* descriptors kept for the next admission, and accepting paused while they cannot
	 * be had (EMFILE/ENFILE); owned by session.c (docs/DAEMON.md, "Sessions") */
	int fd_template;  /* an eventfd nothing uses: spares are dups of it */
	int fd_spare[4];
	int n_fd_spare;
	int accept_paused;
	int fds_released; /* a session closed its descriptors since the pause */
	uint64_t accept_retry_us;

	/* sessions, newest first; owned by session.c */
	struct sm70__session *sessions;
	uint32_t n_sessions;
	uint32_t next_session_id;
	/* what each uid holds, for the per-uid limits; owned by session.c */
	struct sm70__uid_use *uid_use;
	/* undelivered events one session may hold now: slow_consumer_events, or less, its
	 * share of slow_consumer_events_total (session.c, every loop iteration) */
	uint32_t held_bound;

	/* scheduler state; owned by scheduler.c */
	uint32_t n_jobs;	  /* accepted, without a final event yet */
	uint32_t n_engine_jobs; /* of which inside the engine */
	uint32_t rr_last;	  /* session id fed last, for round robin */
	uint64_t next_serial;
	uint64_t seed_state;
	int step_failures; /* consecutive failed engine steps */
	uint64_t steps_ok;  /* completed steps, for the watchdog */

	/* lifecycle; owned by main.c */
	uint64_t now_us;	   /* CLOCK_MONOTONIC: set by the loop after every wait, and
				    * after every engine step */
	int draining;		   /* SIGTERM seen: no new jobs or sessions */
	uint64_t drain_deadline_us; /* then cancel what still runs */
	int drain_killed;
	int fatal; /* an unrecoverable failure: exit non-zero */
	/* The model load (main.c): a thread loads while the loop serves the sockets; clients
	 * whose hello arrives meanwhile wait (SM70__SESSION_WAITING) for their welcome. */
	int loading;
	uint64_t load_start_us, load_end_us;
	uint64_t load_done, load_total; /* bytes, refreshed by the loop from the loader */

	/* observability: counters and histograms (metrics.c, updated by session.c and
	 * scheduler.c), the admin socket and its connections (admin.c) */
	struct sm70__metrics metrics;
	uint64_t kv_bytes; /* the KV budget the engine was given */
	int admin_fd;
	int admin_unlink; /* we bound it: unlink at exit */
	struct sm70__watch *admin_watch;
	struct sm70__admin_conn *admin_conns;
	uint32_t n_admin_conns;
	int admin_accept_paused; /* out of descriptors: accepting retries at the time below */
	uint64_t admin_accept_retry_us;
	int admin_drained; /* `sm70ctl drain`: no new jobs; the daemon stays up */
};

/* CLOCK_MONOTONIC in microseconds. */
uint64_t sm70__now_us(void);

#endif
