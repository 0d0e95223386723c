/*
 * client_impl.h - the inside of struct sm70_client, shared by the library's .c files.
 *
 * One handle = one control socket + one mapped segment (a "session") + the state that
 * outlives sessions: options, job ids, the epoll descriptor given to applications, the
 * queue of events held back (by sm70_generate, or synthesized after a daemon death).
 * Non-goals: nothing here is public; names are sm70__ and hidden.
 */
#ifndef SM70_SDK_CLIENT_IMPL_H
#define SM70_SDK_CLIENT_IMPL_H

#include <liburing.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/un.h>

#include "sdk/ring.h"
#include "sm70/client.h"
#include "text/utf8.h"

struct sm70_tokenizer;
struct sm70_detok;

/* A job submitted on this handle whose final event has not been returned yet. */
struct sm70__job {
	uint64_t id;
	uint64_t user_tag;
	uint32_t prompt_len;
	uint32_t n_tokens; /* TOKEN events seen, for synthesized usage */
};

/* A text job's output state (0.3): created by sm70_submit_text, used by the consumer as it
 * hands the job's events to the application, freed with its final event. */
struct sm70__text_job {
	uint64_t id;
	struct sm70_detok *detok;
	uint32_t delivered; /* TOKEN events handed to the application */
	int stop_index;	    /* >= 0 once a stop string matched */
	int cancel_sent;
};

struct sm70_client {
	/* ---- configuration, kept across sessions ---- */
	char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
	char name[SM70_PROTO_NAME_LEN];
	uint32_t want_sq, want_eq, want_arena;
	uint32_t spin_us;
	uint32_t handshake_ms; /* UINT32_MAX: no limit */
	char last_error[256];
	/* LOADING messages of the latest connect attempt */
	int loading_seen;
	struct sm70_proto_loading loading;
	int epfd; /* handed to applications by sm70_event_fd; stable across sessions */

	/* ---- the session (valid while connected) ---- */
	int connected;
	int sock;     /* SOCK_SEQPACKET lifeline */
	int doorbell; /* we write: wakes the daemon */
	int evfd;     /* the daemon writes: wakes us */
	void *seg;
	size_t seg_size;
	struct sm70_proto_seg_hdr hdr; /* private, validated copy of the header */
	char model_name[SM70_PROTO_MODEL_NAME_LEN];
	struct sm70__rings rings;
	struct io_uring uring;
	int uring_ok;
	int armed_ev, armed_sock; /* a poll SQE on evfd / sock is pending in uring */
	uint32_t sleeping;	  /* our last store to client_sleeping */
	int hung_up;		  /* consumer saw the daemon go away (or break the protocol) */

	/* ---- producer side, under lock ---- */
	pthread_mutex_t lock;
	int dead; /* under lock: no more submissions; live jobs were (or are being) ended */
	uint64_t next_id;
	struct sm70__job *jobs;
	size_t n_jobs, cap_jobs;

	/* ---- consumer side: events to return before reading the ring ---- */
	struct sm70_event *held;
	size_t held_head, held_n, held_cap;

	/* ---- text (0.3) ---- */
	pthread_mutex_t tok_lock; /* loading the tokenizer */
	struct sm70_tokenizer *tok; /* set once, then read-only */
	int chat_format;	    /* enum sm70_chat_format; 0: none */
	char chat_error[256];	    /* why there is none */
	int text_used;		    /* 1 once a text job was submitted (atomic): until then
				     * handing out an event costs nothing more than before */
	struct sm70__text_job **texts; /* under lock */
	size_t n_texts, cap_texts;
	struct sm70_text text_out; /* consumer: the text of the event last handed out */
};

/* Formats the handle's last_error. Returns err unchanged, for `return sm70__fail(...)`. */
int sm70__fail(struct sm70_client *c, int err, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* Connects a handle that has no session. Returns 0 or a sm70_client_connect error. */
int sm70__session_open(struct sm70_client *c);

/* Drops the session (socket, mapping, eventfds, io_uring); keeps everything else. */
void sm70__session_close(struct sm70_client *c);

/*
 * Called by the consumer once the daemon is gone: marks the handle dead (no more
 * submissions) and queues one synthesized final event per live job (FINISH, reason ERROR,
 * error err, with why as its message). Returns 0 or -ENOMEM (then some jobs stay live and a
 * later call retries).
 */
int sm70__end_live_jobs(struct sm70_client *c, int err, const char *why);

/* Under c->lock: the index of job id, or -1. */
long sm70__job_find(const struct sm70_client *c, uint64_t id);

/* Appends a copy of *ev to the held queue. Returns 0 or -ENOMEM. */
int sm70__held_push(struct sm70_client *c, const struct sm70_event *ev);

/* Removes the first held event of job id (any job if id == 0) into *ev. Returns 1 or 0. */
int sm70__held_take(struct sm70_client *c, uint64_t id, struct sm70_event *ev);

/*
 * Reads the next event from the ring (not the held queue), waiting as sm70_next_event does.
 * ev is a full-size private event. Returns 0, -ETIMEDOUT, or -ECONNRESET after the daemon
 * went away and its remaining events were read (the synthesized ones are then held).
 */
int sm70__fetch(struct sm70_client *c, struct sm70_event *ev, int timeout_ms);

/* sm70_submit, also registering text state t (may be NULL) for the job under the same
 * lock, so that no event of the job can be handed out before the library knows it. */
int sm70__submit(struct sm70_client *c, const struct sm70_job *job, uint64_t *job_id,
		 struct sm70__text_job *t);

/* Tokenizes a text prompt into *ids (free()d by the caller) and makes its text state.
 * Returns 0 or an sm70_submit_text error (last_error set). */
int sm70__text_prepare(struct sm70_client *c, const struct sm70_job *job,
		       const struct sm70_text_prompt *p, uint32_t **ids, uint32_t *n_ids,
		       struct sm70__text_job **t);
void sm70__text_job_free(struct sm70__text_job *t);

/* Consumer: gives *ev of a text job its text (a token's delta, the held-back end at the
 * final event), cancels a job whose stop string matched, and turns its final event into a
 * STOP_STRING finish. Returns 1 when the event is not for the application (a token after
 * the stop), else 0. Events of other jobs pass unchanged. */
int sm70__text_apply(struct sm70_client *c, struct sm70_event *ev);

/* Frees the handle's text state (at close). */
void sm70__text_close(struct sm70_client *c);

/* Writes 1 to the doorbell (a full eventfd counter means the daemon is already woken). */
void sm70__ring_doorbell(const struct sm70_client *c);

#endif
