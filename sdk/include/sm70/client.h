/*
 * sm70/client.h - libsm70client, the whole public API of the sm70 client library.
 *
 * A process connects to the sm70d daemon over its Unix socket and gets a private shared-memory
 * segment with a submission ring, an event ring and a prompt arena. Submitting a job and
 * reading its token events costs no system call while both sides are busy; a side that is
 * about to sleep says so in a flag and the other rings an eventfd. docs/PROTOCOL.md describes
 * the wire protocol; docs/SDK.md is the short guide to this API.
 * Prompts and outputs are token ids on the wire; since 0.3 the library can also take text
 * (a raw prompt or a chat) and give text back, tokenizing and detokenizing in this process
 * with the model's tokenizer.json (the "text" section below).
 * Non-goals: no automatic reconnection, no hidden threads: the library only runs inside the
 * calls below.
 *
 * Conventions
 * - Functions return 0 (or a non-negative count) on success and a negative error on failure:
 *   -errno values, or -SM70_E_* for the daemon's protocol errors (enum sm70_error).
 *   sm70_strerror() gives the text of either kind.
 * - Structs the caller passes in or out start with a `size` field that the caller sets to
 *   sizeof(the struct) (the *_init helpers do), and keep reserved space that must be zero.
 *   This lets later versions grow them without breaking programs built against this header.
 * - Ownership: the handle owns every file descriptor and mapping it creates; nothing the
 *   library returns must be freed by the caller except the handle (sm70_client_close).
 *
 * Thread safety
 * - sm70_submit and sm70_cancel may be called from any number of threads at once, and
 *   concurrently with the consumer below (they share one internal lock, held for about a
 *   microsecond).
 * - sm70_next_event and sm70_generate consume events: at most ONE thread at a time may be in
 *   either of them for a given handle.
 * - sm70_client_connect, sm70_client_reconnect and sm70_client_close must not run
 *   concurrently with any other call on the same handle.
 * - sm70_strerror is thread-safe; sm70_client_last_error's buffer belongs to the handle and
 *   is rewritten by the next failing call on it.
 * Different handles are fully independent; one handle per thread is always safe.
 */
#ifndef SM70_CLIENT_H
#define SM70_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The library is built with -fvisibility=hidden; only what this header declares is exported
 * (and the version script in sdk/libsm70client.map pins it to the node SM70CLIENT_0). */
#if defined(__GNUC__)
#define SM70_API __attribute__((visibility("default")))
#else
#define SM70_API
#endif

#define SM70_CLIENT_VERSION_MAJOR 0
#define SM70_CLIENT_VERSION_MINOR 3

/* Socket used when neither the socket_path argument nor $SM70_SOCKET names one. */
#define SM70_DEFAULT_SOCKET "/run/sm70/sm70d.sock"
/* How long sm70_client_connect waits for the welcome by default: as long as systemd lets
 * sm70d start (the packaged unit's TimeoutStartSec, 15 min), so that a connection that
 * starts the daemon by socket activation survives the load of a large model. */
#define SM70_DEFAULT_HANDSHAKE_TIMEOUT_MS 900000u

#define SM70_MAX_STOP 8		/* stop token ids per job */
#define SM70_MAX_TOP_LOGPROBS 8 /* alternatives per token event */
#define SM70_MESSAGE_LEN 128	/* event and result message buffers, NUL included */

/*
 * Errors that come from the daemon (refusals at connect, ERROR events, FINISH with an error).
 * They are the protocol's codes (PROTOCOL.md section 12) plus SM70_E_BASE, so they never
 * collide with errno values; functions and event fields carry them negated, like -errno.
 * Append-only: a value never changes meaning. An unknown code from a newer daemon is passed
 * through (SM70_E_BASE + its number), and sm70_strerror says "unknown sm70 error".
 */
#define SM70_E_BASE 1000
enum sm70_error {
	SM70_E_INVALID = SM70_E_BASE + 1,	 /* a malformed field; the message names it */
	SM70_E_TOO_LARGE = SM70_E_BASE + 2,	 /* above a session limit (prompt, tokens, ...) */
	SM70_E_BUSY = SM70_E_BASE + 3,		 /* too many jobs in flight, or no session room */
	SM70_E_NO_MEMORY = SM70_E_BASE + 4,	 /* the daemon's KV/state memory cannot hold it */
	SM70_E_CANCELLED = SM70_E_BASE + 5,	 /* ended by cancellation */
	SM70_E_SHUTDOWN = SM70_E_BASE + 6,	 /* the daemon is stopping */
	SM70_E_VERSION = SM70_E_BASE + 7,	 /* protocol mismatch: see sm70_client_last_error */
	SM70_E_DENIED = SM70_E_BASE + 8,	 /* this user may not use the daemon */
	SM70_E_SLOW_CONSUMER = SM70_E_BASE + 9, /* events not read in time (SDK.md) */
	SM70_E_INTERNAL = SM70_E_BASE + 10,	 /* daemon bug or backend failure */
	SM70_E_UNSUPPORTED = SM70_E_BASE + 11,	 /* the loaded model cannot serve the request */
	SM70_E_LOADING = SM70_E_BASE + 12,	 /* 0.2: connect gave up while the daemon was
						  * still loading its model (sm70_client_loading) */
};

/* ---- connection -------------------------------------------------------------------------- */

struct sm70_client; /* opaque */

struct sm70_connect_opts {
	uint32_t size;		 /* sizeof(struct sm70_connect_opts) */
	uint32_t sq_entries;	 /* wanted submission ring size, 0 = the daemon's default */
	uint32_t eq_entries;	 /* wanted event ring size, 0 = default */
	uint32_t arena_tokens;	 /* wanted prompt arena size in tokens, 0 = default */
	const char *client_name; /* up to 31 printable characters for the daemon's logs; NULL
				  * = the program name */
	uint32_t spin_us;	 /* how long sm70_next_event polls before it sleeps; 0 = 50 us,
				  * UINT32_MAX = never spin */
	uint32_t handshake_timeout_ms; /* 0.2: how long connect (and reconnect) wait for the
				  * welcome, while the daemon starts or loads its model; 0 =
				  * SM70_DEFAULT_HANDSHAKE_TIMEOUT_MS, UINT32_MAX = no limit */
	uint64_t reserved[6];	 /* zero */
};

/* Fills *opts with the defaults (all zero but size). */
SM70_API void sm70_connect_opts_init(struct sm70_connect_opts *opts);

/*
 * Connects to sm70d at socket_path (NULL: $SM70_SOCKET, else SM70_DEFAULT_SOCKET), sends the
 * hello, receives the shared segment and its eventfds, maps and checks it. opts may be NULL.
 * A daemon that is still loading its model answers at once that it is (with its progress,
 * see sm70_client_loading) and welcomes the client when the model is there: connect waits
 * for that up to opts->handshake_timeout_ms.
 *
 * *out is set to a new handle whenever one could be allocated, EVEN WHEN THE CONNECTION
 * FAILED, so that sm70_client_last_error() can explain the failure and sm70_client_reconnect()
 * can retry; the caller always releases it with sm70_client_close() (which accepts NULL).
 * *out is NULL only for -EINVAL (bad arguments) and -ENOMEM.
 * Returns 0, -ENOENT or -ECONNREFUSED (no daemon listening there), -EACCES, -ETIMEDOUT (no
 * answer in time), -SM70_E_LOADING (the daemon was still loading its model when the time ran
 * out; last_error has its progress, sm70_client_reconnect retries), -EPROTO (a broken
 * daemon), or a daemon refusal: -SM70_E_VERSION (the daemon speaks
 * another protocol major; last_error has its sentence naming what to upgrade),
 * -SM70_E_DENIED, -SM70_E_BUSY, -SM70_E_NO_MEMORY, -SM70_E_SHUTDOWN, -SM70_E_INVALID.
 */
SM70_API int sm70_client_connect(struct sm70_client **out, const char *socket_path,
				 const struct sm70_connect_opts *opts);

/*
 * Ends the session (the daemon cancels every job of it), unmaps the segment, closes every
 * descriptor and frees the handle. Events not yet read are lost. NULL is a no-op.
 */
SM70_API void sm70_client_close(struct sm70_client *c);

/*
 * Drops the current session, if any, and connects again to the same socket with the same
 * options, e.g. after sm70_next_event returned -ECONNRESET because the daemon restarted.
 * Jobs still live on the old session are lost: each gets a synthesized final event (FINISH,
 * reason ERROR, error -ECONNRESET) queued for sm70_next_event, so nothing vanishes silently.
 * Job ids keep increasing across sessions, and sm70_event_fd's descriptor stays the same.
 * Returns 0 or an error as sm70_client_connect.
 */
SM70_API int sm70_client_reconnect(struct sm70_client *c);

/* What a loading daemon last said during this handle's latest connect attempt. */
struct sm70_loading {
	uint32_t size;		/* sizeof(struct sm70_loading), set by the caller */
	uint32_t reserved0;
	uint64_t bytes_done;	/* bytes of weights the daemon had placed on its devices */
	uint64_t bytes_total;	/* what its load places; 0 = not known (may be an estimate
				 * that bytes_done passes) */
	uint64_t elapsed_ms;	/* since the daemon began loading */
	char model_name[64];	/* NUL-terminated */
	uint64_t reserved[6];
};

/*
 * Since 0.2. Fills *out (out->size set by the caller) with the progress the daemon reported
 * while this handle's latest connect or reconnect waited for its welcome. Returns 1 if the
 * daemon said it was loading (the attempt may since have been welcomed), 0 if it never did
 * (*out zeroed but for size), -EINVAL. Typical use: connect with a short
 * handshake_timeout_ms, and on -SM70_E_LOADING show the progress and reconnect.
 */
SM70_API int sm70_client_loading(const struct sm70_client *c, struct sm70_loading *out);

/*
 * A sentence about the last failure on this handle (connect refusals carry the daemon's own
 * words; after sm70_next_event returned -ECONNRESET, why the daemon closed the session, if
 * it said), or "" if there was none. Valid until the next call on the handle. Never NULL.
 */
SM70_API const char *sm70_client_last_error(const struct sm70_client *c);

struct sm70_limits {
	uint32_t max_jobs_in_flight; /* accepted, unfinished jobs per session */
	uint32_t max_prompt_tokens;
	uint32_t max_new_tokens;
	uint32_t max_context_tokens; /* prompt + new tokens */
	uint32_t max_top_logprobs;
	uint32_t max_priority;
	uint32_t vocab_size;
	uint32_t slow_consumer_ms; /* how long the event ring may stay full (SDK.md) */
};

struct sm70_client_info {
	uint32_t size;		  /* sizeof(struct sm70_client_info), set by the caller */
	uint32_t session_id;	  /* as in the daemon's logs and sm70ctl */
	uint16_t proto_major;	  /* the daemon's protocol version */
	uint16_t proto_minor;
	uint32_t sq_entries;	  /* granted ring and arena sizes */
	uint32_t eq_entries;
	uint32_t arena_tokens;
	struct sm70_limits limits;
	char model_name[64];	  /* NUL-terminated */
	uint64_t reserved[8];
};

/* Fills *info (info->size set by the caller) for the current session. Returns 0, -EINVAL,
 * or -ENOTCONN if the handle has no session. */
SM70_API int sm70_client_info(const struct sm70_client *c, struct sm70_client_info *info);

/* ---- jobs -------------------------------------------------------------------------------- */

#define SM70_JOB_SEED (1u << 0)	      /* use `seed`; without it the daemon picks one */
#define SM70_JOB_IGNORE_EOS (1u << 1) /* do not stop at the model's end-of-sequence token */

struct sm70_job {
	uint32_t size;		/* sizeof(struct sm70_job) */
	uint32_t flags;		/* SM70_JOB_* */
	const uint32_t *prompt; /* prompt token ids; copied during sm70_submit */
	uint32_t prompt_len;	/* >= 1 */
	uint32_t max_tokens;	/* new tokens to generate at most, >= 1 */
	float temperature;	/* 0 = greedy */
	float top_p;		/* in (0, 1]; 0 here means 1 (off) */
	int32_t top_k;		/* 0 = off */
	uint32_t top_logprobs;	/* alternatives in each token event, <= SM70_MAX_TOP_LOGPROBS */
	uint64_t seed;		/* with SM70_JOB_SEED */
	uint32_t n_stop;	/* <= SM70_MAX_STOP */
	uint32_t stop[SM70_MAX_STOP]; /* token ids that end the job (delivered as its last) */
	uint32_t priority;	/* 0 = normal; higher is scheduled sooner; <= max_priority */
	uint32_t deadline_ms;	/* 0 = none; else the job ends with DEADLINE after this long */
	uint32_t reserved0;
	uint64_t user_tag;	/* returned untouched in every event of the job */
	uint64_t reserved[8];	/* zero */
};

/* Fills *job with the defaults: size set, greedy, top_p 1, max_tokens 16, no prompt. */
SM70_API void sm70_job_init(struct sm70_job *job);

/*
 * Submits a job: copies the prompt into the shared arena, publishes one submission entry and
 * wakes the daemon only if it sleeps. Does not wait for the daemon; acceptance shows in the
 * events (a refused job gets one SM70_EVENT_ERROR, its only event). Any number of jobs may be
 * in flight per handle (the daemon's max_jobs_in_flight refuses extras with SM70_E_BUSY).
 * On success stores the new job's id (never 0, never reused by this handle) in *job_id.
 * Returns 0; -EAGAIN when the submission ring or the prompt arena is full right now (read
 * events, then retry); -EINVAL for a malformed job (NULL prompt, zero lengths, more than 8
 * stop ids or top logprobs, nonzero reserved fields); -E2BIG for a prompt longer than the
 * arena; -ECONNRESET after the daemon went away; -ENOTCONN without a session; -ENOMEM;
 * -EPROTO if the daemon's ring indices are impossible (a broken daemon).
 */
SM70_API int sm70_submit(struct sm70_client *c, const struct sm70_job *job, uint64_t *job_id);

/*
 * Asks the daemon to end job_id. Its final event follows (normally FINISH with reason
 * CANCELLED, but a job that was already finishing may end with LENGTH or STOP instead).
 * Returns 0, -ENOENT if job_id is not live on this handle (already finished or never
 * submitted), -EAGAIN if the submission ring is full, -ECONNRESET, -ENOTCONN.
 */
SM70_API int sm70_cancel(struct sm70_client *c, uint64_t job_id);

/* ---- events ------------------------------------------------------------------------------ */

enum sm70_event_type {
	SM70_EVENT_TOKEN = 1,  /* one generated token */
	SM70_EVENT_FINISH = 2, /* the job ended: reason, usage, maybe an error */
	SM70_EVENT_ERROR = 3,  /* a submission (or cancel) was refused: error + message */
};

/* Append-only. SM70_REASON_ERROR also stands for reasons this version does not know. */
enum sm70_finish_reason {
	SM70_REASON_NONE = 0,	    /* not a finish event */
	SM70_REASON_LENGTH = 1,	    /* max_tokens (or the context limit) reached */
	SM70_REASON_STOP_EOS = 2,   /* the model's end-of-sequence token */
	SM70_REASON_STOP_TOKEN = 3, /* one of the job's stop tokens */
	SM70_REASON_CANCELLED = 4,  /* sm70_cancel */
	SM70_REASON_DEADLINE = 5,   /* deadline_ms passed */
	SM70_REASON_ERROR = 6,	    /* see error and message */
	SM70_REASON_STOP_STRING = 7, /* 0.3, text jobs: a stop string matched (stop_index);
				      * the library cancelled the job */
};

#define SM70_EVENT_FINAL (1u << 0) /* flags: the job's last event; its id is free again */

struct sm70_top_logprob {
	uint32_t id;
	float logprob;
};

struct sm70_usage {
	uint32_t prompt_tokens;	    /* prompt length the job ran with */
	uint32_t completion_tokens; /* token events delivered */
	uint32_t cached_tokens;	    /* prompt tokens served from the daemon's prefix cache */
	uint32_t reserved0;
	uint64_t queue_us;  /* accepted -> first scheduled (daemon clock) */
	uint64_t ttft_us;   /* accepted -> first token published */
	uint64_t decode_us; /* first -> last token published */
	uint64_t reserved[2];
};

struct sm70_event {
	uint32_t size;	  /* set by the caller to sizeof(struct sm70_event) */
	uint32_t type;	  /* enum sm70_event_type */
	uint32_t flags;	  /* SM70_EVENT_FINAL */
	uint32_t index;	  /* TOKEN: 0-based position in the completion */
	uint64_t job_id;  /* from sm70_submit */
	uint64_t user_tag; /* the job's user_tag */
	/* TOKEN */
	uint32_t token;
	float logprob;	  /* natural log, under the raw distribution (temperature 1) */
	uint32_t n_top;	  /* valid entries in top, most likely first */
	uint32_t reserved0;
	struct sm70_top_logprob top[SM70_MAX_TOP_LOGPROBS];
	/* FINISH */
	uint32_t finish_reason; /* enum sm70_finish_reason */
	/* FINISH with reason ERROR, and ERROR: -SM70_E_* or -errno (-ECONNRESET when the daemon
	 * went away; its code when it closed the session and said why); else 0 */
	int32_t error;
	struct sm70_usage usage; /* FINISH; for ERROR zero */
	char message[SM70_MESSAGE_LEN]; /* ERROR and FINISH(ERROR): a sentence; else "" */
	/* 0.3, jobs of sm70_submit_text (else NULL, 0, -1): the text this event adds to the
	 * output, text_len bytes of whole UTF-8 characters (NUL-terminated; may be empty: a
	 * token that ends inside a character, or that may begin a stop string, adds nothing
	 * until it is decided). A FINISH carries what was held back at the end. Valid until
	 * the next sm70_next_event / sm70_generate* call on the handle. */
	const char *text;
	uint32_t text_len;
	int32_t stop_index; /* FINISH with SM70_REASON_STOP_STRING: which stop string */
	uint64_t reserved[6];
};

/*
 * Returns the next event of any job on this handle. Spins for up to spin_us on the event
 * ring, then sleeps (through the handle's io_uring) until an event arrives, the daemon hangs
 * up, or timeout_ms passes (-1 = no limit, 0 = do not wait at all).
 * ev->size must be set by the caller.
 * Returns 0 with *ev filled; -ETIMEDOUT when nothing arrived in time; -ECONNRESET once the
 * daemon has gone away AND every event it had posted and every synthesized final event (one
 * per job that was still live: FINISH, reason ERROR, error -ECONNRESET, or, when the daemon
 * closed the session and said why, its code, e.g. -SM70_E_SHUTDOWN or -SM70_E_INVALID for a
 * protocol violation, with its reason as the message) has been returned, with
 * sm70_client_last_error naming the reason;
 * -EINVAL; -ENOTCONN without a session. Consumer side: one thread at a time.
 */
SM70_API int sm70_next_event(struct sm70_client *c, struct sm70_event *ev, int timeout_ms);

/*
 * A descriptor for the application's own poll/epoll/io_uring loop: it becomes readable
 * (POLLIN, level-triggered) when events may be waiting or when the daemon hung up. Do not
 * read from it or close it. After it polls readable, call sm70_next_event with timeout 0
 * until it returns -ETIMEDOUT (no more for now; the wakeup is re-armed) or -ECONNRESET.
 * Wakeups can be spurious. The descriptor stays the same across sm70_client_reconnect.
 * Returns the descriptor or -EBADF for a NULL handle.
 */
SM70_API int sm70_event_fd(const struct sm70_client *c);

/* ---- blocking convenience ---------------------------------------------------------------- */

/* Called for each TOKEN event of the job; return non-zero to cancel the job (its remaining
 * events are still read, so sm70_generate returns after its final event). */
typedef int (*sm70_token_cb)(void *ctx, const struct sm70_event *ev);

struct sm70_result {
	uint32_t size;		/* sizeof(struct sm70_result), set by the caller */
	uint32_t finish_reason; /* enum sm70_finish_reason */
	int32_t error;		/* as in struct sm70_event */
	int32_t stop_index;	/* 0.3: as in struct sm70_event (was reserved0, zero) */
	uint64_t job_id;
	struct sm70_usage usage;
	char message[SM70_MESSAGE_LEN];
	uint64_t reserved[8];
};

/*
 * Submits job and waits for its final event, calling cb (may be NULL) with each token. Events
 * of other jobs that arrive meanwhile are kept and returned by later sm70_next_event calls.
 * out (may be NULL; else out->size set by the caller) receives the finish reason, usage and
 * error. Retries submission while the ring or arena is full.
 * Returns 0 when the job finished (LENGTH, STOP_*, CANCELLED, DEADLINE); the job's error
 * (negative: -SM70_E_* such as -SM70_E_INVALID for a refused job, or -ECONNRESET when the
 * daemon went away, or its close code when it closed the session and said why) when it
 * ended in error; or a sm70_submit error. Consumer side.
 */
SM70_API int sm70_generate(struct sm70_client *c, const struct sm70_job *job, sm70_token_cb cb,
			   void *ctx, struct sm70_result *out);

/* ---- text (since 0.3) --------------------------------------------------------------------
 * The library tokenizes text prompts and detokenizes outputs in this process with the
 * model's Hugging Face tokenizer.json (the Qwen2/Qwen3 byte-level BPE, exact against the
 * tokenizers package; docs/TOKENIZER.md) and renders chats with the model's chat template
 * (the formats docs/TOKENIZER.md lists). The daemon still sees token ids only. Stop strings
 * are matched here, on the decoded text: when one appears the library cancels the job, the
 * text before it is the last text delivered, and the FINISH says SM70_REASON_STOP_STRING.
 * Tokens the daemon made after the stop, before the cancel reached it, are not handed out;
 * the FINISH's usage stays the daemon's (its completion_tokens counts them).
 */

/*
 * Since 0.3. Loads the tokenizer for this handle's text calls: path is a model directory
 * (its tokenizer.json, and its chat template from tokenizer_config.json or
 * chat_template.jinja), a tokenizer.json file (the template from its directory), or NULL
 * for the daemon's own model directory (which a 1.2 daemon tells in the segment header;
 * the directory must be readable by this process). Optional: the first text call loads the
 * daemon's if none was loaded. Once per handle: the tokenizer stays for the handle's life.
 * Returns 0; -ENOENT (no tokenizer.json there, or a daemon that does not say where its
 * model is: give a path), -EACCES, -ENOTSUP (a tokenizer.json sm70 does not implement),
 * -EINVAL, -EALREADY (one is loaded), -ENOTCONN (NULL path without a session), -ENOMEM;
 * sm70_client_last_error says what and where. A template that is missing or not supported
 * is not an error here: raw text prompts work, chat prompts fail with -ENOTSUP.
 * Not thread-safe against other calls on the handle.
 */
SM70_API int sm70_client_tokenizer(struct sm70_client *c, const char *path);

/* One turn of a chat. Strings are NUL-terminated UTF-8. */
struct sm70_message {
	const char *role;	       /* "system", "user", "assistant" or "tool" */
	const char *content;
	const char *reasoning_content; /* an assistant turn's reasoning; NULL = none */
};

#define SM70_TEXT_NO_THINKING (1u << 0)	 /* chat: enable_thinking=false (Qwen3 answers
					  * without reasoning) */
#define SM70_TEXT_KEEP_SPECIAL (1u << 1) /* output text keeps special tokens such as
					  * <|im_end|> (left out by default) */
#define SM70_MAX_STOP_STRINGS 16

struct sm70_text_prompt {
	uint32_t size;	  /* sizeof(struct sm70_text_prompt) */
	uint32_t flags;	  /* SM70_TEXT_* */
	const char *text; /* a raw prompt, NUL-terminated UTF-8 (special tokens in it, such
			   * as <|im_start|>, are their ids); or NULL and messages: */
	const struct sm70_message *messages; /* a chat, rendered with the model's template
			   * and ending with the opening of the assistant's turn */
	uint32_t n_messages;
	uint32_t n_stop;		/* <= SM70_MAX_STOP_STRINGS */
	const char *const *stop;	/* stop strings, non-empty UTF-8; copied */
	uint64_t reserved[6];		/* zero */
};

/* Fills *p with the defaults (all zero but size). */
SM70_API void sm70_text_prompt_init(struct sm70_text_prompt *p);

/*
 * Since 0.3. Submits a job whose prompt is text: tokenizes p (a raw text or a chat) into
 * the job's prompt and submits it as sm70_submit does; job gives everything else
 * (max_tokens, sampling, stop token ids, user_tag) and its prompt must be NULL and
 * prompt_len 0. The job's events then carry text (struct sm70_event's text, text_len) as
 * well as token ids. Loads the daemon's tokenizer first if none is loaded.
 * Returns what sm70_submit returns, and -EINVAL (a bad job or prompt: no text and no
 * messages, both, too many or empty stop strings), -EILSEQ (text that is not UTF-8),
 * -ENOTSUP (a chat, and the model's chat template is missing or not supported), the errors
 * of sm70_client_tokenizer; sm70_client_last_error says what was wrong (an unknown role
 * names its message).
 */
SM70_API int sm70_submit_text(struct sm70_client *c, const struct sm70_job *job,
			      const struct sm70_text_prompt *p, uint64_t *job_id);

/*
 * Since 0.3. sm70_generate for a text prompt: submits with sm70_submit_text and waits for
 * the final event, calling cb for each TOKEN event (with its text) and once more for the
 * FINISH when that carries text (what was held back at the end; ev->type tells them
 * apart). Tokens the model made after a stop string are not passed on. out as in
 * sm70_generate (finish_reason SM70_REASON_STOP_STRING and stop_index when a stop string
 * ended it). Returns as sm70_generate and sm70_submit_text.
 */
SM70_API int sm70_generate_text(struct sm70_client *c, const struct sm70_job *job,
				const struct sm70_text_prompt *p, sm70_token_cb cb, void *ctx,
				struct sm70_result *out);

/* ---- errors ------------------------------------------------------------------------------ */

/* English text for an error returned by this library: an errno value or an SM70_E_* code,
 * negated or not. Never NULL; thread-safe (returns constant strings). */
SM70_API const char *sm70_strerror(int err);

#ifdef __cplusplus
}
#endif

#endif
