/*
 * session.h - client sessions: the listening socket, the hello/welcome handshake, the
 * shared segment, draining the submission ring and posting into the event ring.
 *
 * A session owns its memfd mapping, its two eventfds and its control socket. It is closed
 * (socket shut, watches removed, jobs cancelled) on hang-up, on a protocol violation or at
 * shutdown, and destroyed (unmapped) only once the scheduler holds no job of it, i.e. after
 * the engine emitted every final event of its jobs. Non-goals: policy about jobs (that is
 * scheduler.c), the engine, threads.
 */
#ifndef SM70_DAEMON_SESSION_H
#define SM70_DAEMON_SESSION_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/err.h"
#include "daemon/daemon.h"
#include "daemon/prompt_pool.h"
#include "shm_proto/sm70_proto.h"

enum sm70__session_state {
	SM70__SESSION_HELLO = 1, /* accepted, waiting for the hello */
	SM70__SESSION_ACTIVE,	 /* welcomed, segment shared */
	SM70__SESSION_CLOSED,	 /* socket closed; waits for its jobs' final events */
	SM70__SESSION_WAITING,	 /* hello accepted while the model loads: welcomed after */
};

/* An event the ring could not take yet. serial names the job of a TOKEN event (so a slow
 * consumer's undelivered tokens can be discarded); 0 for other events. */
struct sm70__held_event {
	struct sm70_proto_eqe ev;
	uint64_t serial;
};

struct sm70__job;

/* What one uid holds over all its sessions (limits.max_sessions_per_uid and
 * max_jobs_per_uid). One per uid with a session object, freed with the last of them. */
struct sm70__uid_use {
	uint32_t uid;
	uint32_t refs;	   /* session objects pointing here, whatever their state */
	uint32_t sessions; /* of which welcomed or waiting for the model: what the limit counts */
	uint32_t jobs;	   /* accepted jobs of all of them without a final event yet */
	struct sm70__uid_use *next;
};

struct sm70__session {
	struct sm70__daemon *d;
	uint32_t id;
	enum sm70__session_state state;
	int sock;
	struct sm70__watch *sock_watch;
	int doorbell_fd; /* the client writes it */
	struct sm70__watch *doorbell_watch;
	int event_fd; /* the daemon writes it, only through event_waker (never write(2)) */
	struct sm70__waker *event_waker;
	int spare_fds[3]; /* until the welcome: the descriptors it will need */
	int n_spare;
	uid_t uid;
	gid_t gid;
	pid_t pid;
	struct sm70__uid_use *use; /* this uid's counts (scheduler.c counts the jobs) */
	int counted;		   /* counted in use->sessions */
	struct sm70__cfg_limits cfg_limits; /* the config's limits for its uid and groups */
	char name[SM70_PROTO_NAME_LEN + 1];
	uint64_t t_accept_us;

	/* the segment: shared memory, read only through private copies */
	void *seg;
	size_t seg_size;
	struct sm70_proto_seg_hdr *hdr;
	struct sm70_proto_sqe *sq;
	struct sm70_proto_eqe *eq;
	uint32_t *arena;
	/* private copies of the layout and of the daemon-written indices */
	uint32_t sq_entries, eq_entries, arena_tokens;
	struct sm70_proto_limits limits;
	uint32_t sq_head;
	uint32_t eq_tail;
	uint32_t eq_published; /* eq_tail as last release-stored */

	/* events held back while the ring is full (a FIFO ring of held_cap entries) */
	struct sm70__held_event *held;
	uint32_t held_first, held_count, held_cap;
	uint64_t stall_since_us; /* ring full and no eq_head progress since then */
	int slow_pending;	 /* the slow-consumer time bound passed: scheduler acts */
	int cut_off;		 /* it reached d->held_bound: its jobs were ended and its SQ is
				  * not read until every held event is in its ring */
	const char *broken;	 /* a protocol violation seen while posting: close soon */

	/* the prompt copies of its queued jobs, at most an arena's worth (prompt_pool.h) */
	struct sm70__prompt_pool prompts;
	/* an entry read (once) whose prompt did not fit the pool: it waits here, with sq_head
	 * and arena_head not moved past it, until the queue has moved */
	struct sm70_proto_sqe pending;
	int has_pending;

	/* scheduler.c's part */
	struct sm70__job *jobs;	    /* every accepted unfinished job of this session */
	struct sm70__job *queue;    /* not yet in the engine, by priority then age */
	uint32_t n_jobs, n_queued;
	uint32_t n_eng, n_parked; /* jobs in the engine: scheduled there, or parked */

	/* SM70__SESSION_WAITING: the hello, kept for the welcome */
	struct sm70_proto_hello hello;

	struct sm70__session *next;
};

/* Opens the listening socket: a SOCK_SEQPACKET fd passed by systemd if there is one, else
 * binds cfg.socket_path (removing a stale socket file nobody listens on) and chmods it.
 * Starts watching it, and sets aside the descriptors of the first admission. Returns 0 or
 * -errno with err naming the problem. */
int sm70__listener_open(struct sm70__daemon *d, struct sm70_err *err);

/* Stops listening; unlinks the socket file if this process created it. */
void sm70__listener_close(struct sm70__daemon *d);

/* For every session: posts held events the ring now has room for, copies new submission
 * entries (unless the session is stalled), closes sessions that broke the protocol or sent
 * no hello in time. Called once per loop iteration. */
void sm70__sessions_poll(struct sm70__daemon *d);

/* Release-stores each session's event-ring tail and rings its event fd if the client
 * sleeps. Called after posting (engine step, submission errors). */
void sm70__sessions_publish(struct sm70__daemon *d);

/* Before the loop blocks: sets daemon_sleeping (and eq_space_wanted where events are held)
 * with full fences, then re-checks the rings. Returns 1 if work arrived meanwhile (do not
 * block). sm70__sessions_sleep_end clears daemon_sleeping after the wait. */
int sm70__sessions_sleep_begin(struct sm70__daemon *d);
void sm70__sessions_sleep_end(struct sm70__daemon *d);

/* The nearest session timer (hello timeout, slow-consumer bound, accept retry) in
 * microseconds from now, or -1 if none. */
int64_t sm70__sessions_next_timer(const struct sm70__daemon *d);

/* Ends a session: removes its watches, closes its socket (the client sees a hang-up) and
 * cancels its jobs. code 0: the client's own doing (a hang-up), why is for the log only;
 * else the positive error code and the sentence the client is told first: in its segment
 * header (close_code, close_reason) once welcomed, as a REFUSAL before. The memory goes
 * later, in sm70__sessions_reap. */
void sm70__session_close(struct sm70__daemon *d, struct sm70__session *s, int code,
			 const char *why);

/* While the model loads: sends each waiting client that understands it (hello minor >= 1)
 * a LOADING message with d's progress (PROTOCOL.md section 4.7). Never blocks. */
void sm70__sessions_loading(struct sm70__daemon *d);

/* The model is loaded: welcomes every waiting session (or, while draining, refuses it
 * with E_SHUTDOWN). */
void sm70__sessions_model_ready(struct sm70__daemon *d);

/* The load failed or was given up: refuses every waiting session with code and why. */
void sm70__sessions_refuse_waiting(struct sm70__daemon *d, int code, const char *why);

/* Closes every session (shutdown), telling each client code and why. */
void sm70__sessions_close_all(struct sm70__daemon *d, int code, const char *why);

/* Frees closed sessions that have no job left. */
void sm70__sessions_reap(struct sm70__daemon *d);

/* Whether any session still holds events it could not post. */
int sm70__sessions_holding(const struct sm70__daemon *d);

/* Posts one event for the client: into the ring if it has room and nothing is held,
 * else into the held FIFO (the scheduler then stops feeding this client). Events for a
 * closed session are dropped. Returns 0 or -ENOMEM (the event was dropped; slow_pending
 * is set so the client's jobs end with E_SLOW_CONSUMER). */
int sm70__session_post(struct sm70__daemon *d, struct sm70__session *s,
		       const struct sm70_proto_eqe *ev, uint64_t serial);

/* Posts ERROR(code) for an entry: tag, opcode and a message naming the field. */
void sm70__session_post_error(struct sm70__daemon *d, struct sm70__session *s, uint64_t tag,
			      uint8_t opcode, int code, const char *msg);

#endif
