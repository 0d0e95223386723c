/*
 * scheduler.h - jobs: admission against per-client limits, fair feeding of the engine,
 * cancellation, deadlines, slow consumers, and turning engine events into ring events.
 *
 * A job is born when session.c hands over a validated SUBMIT with its private prompt copy.
 * It waits in its client's queue (ordered by priority, then age) and is fed into the engine
 * round-robin across clients, so that only a few jobs ever wait inside the engine and one
 * client's burst cannot starve another. It dies with its final event (FINISH), posted from
 * the engine's callback or, for a job that never reached the engine, directly.
 * Non-goals: KV accounting (the engine does it), prefix caching, threads.
 */
#ifndef SM70_DAEMON_SCHEDULER_H
#define SM70_DAEMON_SCHEDULER_H

#include <stddef.h>
#include <stdint.h>

#include "daemon/daemon.h"
#include "shm_proto/sm70_proto.h"

struct sm70__session;

/* Why the daemon ended a job before the engine did; picks the final event's reason. */
enum sm70__kill {
	SM70__KILL_NONE = 0,
	SM70__KILL_CANCEL,   /* CANCEL entry: FINISH(CANCELLED) */
	SM70__KILL_DEADLINE, /* FINISH(DEADLINE) */
	SM70__KILL_SLOW,     /* FINISH(ERROR, E_SLOW_CONSUMER) */
	SM70__KILL_SHUTDOWN, /* FINISH(ERROR, E_SHUTDOWN) */
	SM70__KILL_INTERNAL, /* FINISH(ERROR, E_INTERNAL) */
	SM70__KILL_HANGUP,   /* the client is gone: no event */
};

struct sm70__job {
	struct sm70__session *s;
	uint64_t serial; /* daemon-wide, never reused */
	uint64_t tag;	 /* the client's */
	uint64_t engine_id;
	int in_engine;
	int parked; /* in the engine but paused for another client (sm70_engine_park) */
	enum sm70__kill kill;
	uint8_t priority;
	uint32_t flags;
	uint32_t prompt_len;
	int32_t *prompt; /* private copy in s->prompts; freed once the engine copied it */
	uint32_t max_new_tokens;
	float temperature, top_p;
	int32_t top_k;
	uint64_t seed;
	uint32_t top_logprobs;
	uint32_t n_stop;
	int32_t stop[SM70_PROTO_MAX_STOP];
	uint64_t deadline_us; /* 0: none */
	uint64_t t_accept_us, t_sched_us, t_first_us, t_last_us;
	uint32_t n_posted; /* TOKEN events posted (or held) and not discarded */
	uint32_t cached_tokens;

	struct sm70__job *next_in_session, *prev_in_session;
	struct sm70__job *next_queued;
};

/* Takes a validated SUBMIT (private copy e) and its prompt (from s->prompts, ownership
 * passes in all cases). Checks the limits that need state (jobs in flight, tag in use, KV
 * capacity) and either queues a job or posts the ERROR event. Never fails otherwise. */
void sm70__sched_submit(struct sm70__daemon *d, struct sm70__session *s,
			const struct sm70_proto_sqe *e, int32_t *prompt);

/* The error code sm70__sched_submit would refuse e with now (why: its message), or 0 if e
 * would become a job. */
int sm70__sched_refusal(const struct sm70__daemon *d, struct sm70__session *s,
			const struct sm70_proto_sqe *e, char *why, size_t len);

/* Whether an unfinished job of s has this tag. */
int sm70__sched_tag_in_use(struct sm70__session *s, uint64_t tag);

/* A CANCEL entry for tag: ends the job if it exists (its final event follows, from the
 * next engine step for a job in the engine). Unknown tags are ignored. */
void sm70__sched_cancel(struct sm70__daemon *d, struct sm70__session *s, uint64_t tag);

/* The session closed: drops its queued jobs and cancels its jobs in the engine, whose final
 * events are then swallowed. The session may be freed once s->n_jobs is 0. */
void sm70__sched_session_gone(struct sm70__daemon *d, struct sm70__session *s);

/* The client's slow-consumer bound passed: discards its undelivered TOKEN events and ends
 * all its jobs with FINISH(ERROR, E_SLOW_CONSUMER). */
void sm70__sched_slow_consumer(struct sm70__daemon *d, struct sm70__session *s);

/* Ends every job with `kill` (shutdown, backend failure). */
void sm70__sched_kill_all(struct sm70__daemon *d, enum sm70__kill kill);

/* Whether there is engine work to do now: a job in the engine, or a queued job of a client
 * that is not stalled. */
int sm70__sched_busy(struct sm70__daemon *d);

/* Moves queued (and resumes parked) jobs into the engine, highest priority first, then
 * the client with the fewest jobs in the engine, ties round robin, until max_seqs plus
 * feed_depth jobs are in it; when it is full, a client below its share of the running slots
 * takes one from the client holding the most (docs/DAEMON.md, "Scheduler"). */
void sm70__sched_feed(struct sm70__daemon *d);

/* Runs one engine step and posts its events. Returns the engine's result. */
int sm70__sched_step(struct sm70__daemon *d);

/* Deadlines. Call once per iteration. */
void sm70__sched_tick(struct sm70__daemon *d);

/* Microseconds to the nearest deadline, or -1. */
int64_t sm70__sched_next_timer(const struct sm70__daemon *d);

#endif
