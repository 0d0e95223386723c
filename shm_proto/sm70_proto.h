/*
 * sm70_proto.h - the client <-> daemon ABI: control-socket messages, the shared segment
 * header, submission and event records, error codes and the ring index rules.
 *
 * This header is the contract. docs/PROTOCOL.md explains it in prose for people writing a
 * client in another language; when the two disagree, this file (and its static asserts) wins.
 * Non-goals: no I/O, no allocation, no policy. The daemon and libsm70client build on it; it
 * needs only <stdint.h> and <stddef.h> and compiles as C11 and as C++ (atomics use the GCC/Clang
 * __atomic builtins on plain uint32_t fields, not <stdatomic.h>).
 *
 * Layout rules: every record has fixed-width fields in native byte order (the client and the
 * daemon share one host), explicit padding and reserved space, and _Static_asserts on its size
 * and on the offset of every field, so an accidental change fails the build. The header also
 * compiles cleanly with -Wpadded (tests/unit/test_proto.c makes it an error around its
 * #include of this file), which shows that the compiler inserts no implicit padding anywhere.
 * Reserved fields are written as zero and ignored on read; a later minor version may give them
 * a meaning where zero means "as before".
 */
#ifndef SM70_PROTO_H
#define SM70_PROTO_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
#define SM70_PROTO_ASSERT(cond, msg) static_assert(cond, msg)
extern "C" {
#else
#define SM70_PROTO_ASSERT(cond, msg) _Static_assert(cond, msg)
#endif

/* Asserts that field f of struct s sits at byte offset off. */
#define SM70_PROTO_AT(s, f, off) \
	SM70_PROTO_ASSERT(offsetof(struct s, f) == (off), #s "." #f " moved")
#define SM70_PROTO_SIZE(s, n) SM70_PROTO_ASSERT(sizeof(struct s) == (n), #s " changed size")

SM70_PROTO_ASSERT(sizeof(float) == 4, "float must be IEEE-754 binary32");

/* ---- identity and version ------------------------------------------------------------- */

/* "SM70" in memory order on a little-endian host; first field of every message and segment. */
#define SM70_PROTO_MAGIC 0x30374d53u

/* A major change breaks the layout and is refused at connect; a minor change only gives
 * meaning to reserved space (zero keeps the old behaviour), so any minor of one major
 * interoperates with any other. */
#define SM70_PROTO_VERSION_MAJOR 1
#define SM70_PROTO_VERSION_MINOR 2 /* 1.1: LOADING messages before the welcome, E_LOADING;
				    * 1.2: the model directory and the close reason in the
				    * segment header */

#define SM70_PROTO_CACHELINE 64u
#define SM70_PROTO_MAX_TOP 8u  /* top-logprob pairs inline in one TOKEN event */
#define SM70_PROTO_MAX_STOP 8u /* stop tokens inline in one SUBMIT entry */
#define SM70_PROTO_NAME_LEN 32u
#define SM70_PROTO_MODEL_NAME_LEN 64u
#define SM70_PROTO_MODEL_DIR_LEN 192u
#define SM70_PROTO_CLOSE_REASON_LEN 152u /* the segment header's close_reason */
#define SM70_PROTO_REASON_LEN 232u
#define SM70_PROTO_ERRMSG_LEN 104u
/* Every control message fits in this; receivers read with a buffer this large. */
#define SM70_PROTO_MSG_MAX 4096u
/* The welcome carries exactly these fds, in this order, in one SCM_RIGHTS message. */
#define SM70_PROTO_FD_MEMFD 0
#define SM70_PROTO_FD_DOORBELL 1 /* eventfd the client writes after submitting */
#define SM70_PROTO_FD_EVENT 2    /* eventfd the daemon writes after posting events */
#define SM70_PROTO_N_FDS 3

/* ---- error codes (append-only; values never change meaning) -------------------------- */

/* Records carry these as positive values; C functions return them negated. */
enum sm70_proto_error {
	SM70_PROTO_OK = 0,
	SM70_PROTO_E_INVALID = 1,	/* a malformed field; the message names it */
	SM70_PROTO_E_TOO_LARGE = 2,	/* a length or count above the session limit */
	SM70_PROTO_E_BUSY = 3,		/* a session or jobs-in-flight limit; the message names it */
	SM70_PROTO_E_NO_MEMORY = 4,	/* KV/state memory cannot hold the job, even alone */
	SM70_PROTO_E_CANCELLED = 5,	/* ended by a CANCEL entry */
	SM70_PROTO_E_SHUTDOWN = 6,	/* the daemon is stopping */
	SM70_PROTO_E_VERSION = 7,	/* protocol major version mismatch */
	SM70_PROTO_E_DENIED = 8,	/* uid/gid not allowed by the daemon config */
	SM70_PROTO_E_SLOW_CONSUMER = 9, /* event ring not drained within slow_consumer_ms */
	SM70_PROTO_E_INTERNAL = 10,	/* a daemon bug or backend failure */
	SM70_PROTO_E_UNSUPPORTED = 11,	/* valid request the loaded model cannot serve */
	SM70_PROTO_E_LOADING = 12,	/* 1.1: still loading the model (a client's wait ran out) */
	SM70_PROTO_E__COUNT		/* not a code: one past the last; grows over time */
};

/* The fixed English text of an error code (positive or negated). Never NULL; unknown codes
 * (from a newer daemon) give "unknown error". Thread-safe: returns string literals. */
static inline const char *sm70_proto_strerror(int code)
{
	static const char *const text[SM70_PROTO_E__COUNT] = {
		"success",
		"invalid request",
		"request too large",
		"too many sessions or jobs in flight",
		"not enough KV/state memory",
		"cancelled",
		"daemon shutting down",
		"protocol version mismatch",
		"permission denied",
		"event ring not drained in time",
		"internal daemon error",
		"not supported by the loaded model",
		"the daemon is still loading its model",
	};

	/* unsigned, so that negating INT_MIN is defined */
	unsigned int c = code < 0 ? 0u - (unsigned int)code : (unsigned int)code;

	if (c >= (unsigned int)SM70_PROTO_E__COUNT)
		return "unknown error";
	return text[c];
}

/* ---- per-session limits (in the welcome and in the segment header) ------------------- */

struct sm70_proto_limits {
	uint32_t max_jobs_in_flight; /* accepted, unfinished SUBMITs; more get E_BUSY */
	uint32_t max_prompt_tokens;  /* prompt_len above this: E_TOO_LARGE */
	uint32_t max_new_tokens;     /* max_new_tokens above this: E_TOO_LARGE */
	uint32_t max_context_tokens; /* prompt_len + max_new_tokens above this: E_TOO_LARGE */
	uint32_t max_top_logprobs;   /* <= SM70_PROTO_MAX_TOP */
	uint32_t max_priority;	     /* priority above this: E_INVALID */
	uint32_t vocab_size;	     /* prompt and stop token ids must be below this */
	uint32_t slow_consumer_ms;   /* event ring stuck full this long: E_SLOW_CONSUMER */
	uint32_t reserved[8];
};
SM70_PROTO_SIZE(sm70_proto_limits, 64);
SM70_PROTO_AT(sm70_proto_limits, max_jobs_in_flight, 0);
SM70_PROTO_AT(sm70_proto_limits, max_prompt_tokens, 4);
SM70_PROTO_AT(sm70_proto_limits, max_new_tokens, 8);
SM70_PROTO_AT(sm70_proto_limits, max_context_tokens, 12);
SM70_PROTO_AT(sm70_proto_limits, max_top_logprobs, 16);
SM70_PROTO_AT(sm70_proto_limits, max_priority, 20);
SM70_PROTO_AT(sm70_proto_limits, vocab_size, 24);
SM70_PROTO_AT(sm70_proto_limits, slow_consumer_ms, 28);
SM70_PROTO_AT(sm70_proto_limits, reserved, 32);

/* ---- control-socket messages (AF_UNIX, SOCK_SEQPACKET, one record per message) ------- */

/* The first 14 bytes of every message (size, magic, type, version) are frozen across all
 * major versions, and so is the whole REFUSAL record, so that any two versions can at
 * least tell each other what to upgrade. */
enum sm70_proto_msg_type {
	SM70_PROTO_MSG_HELLO = 1,   /* client -> daemon, first and only client message */
	SM70_PROTO_MSG_WELCOME = 2, /* daemon -> client, carries the three fds */
	SM70_PROTO_MSG_REFUSAL = 3, /* daemon -> client, then the daemon closes the socket */
	SM70_PROTO_MSG_LOADING = 4, /* 1.1, daemon -> client: still loading, the welcome follows */
};

struct sm70_proto_hello {
	uint32_t size;	/* sizeof(struct sm70_proto_hello) as the sender knows it */
	uint32_t magic; /* SM70_PROTO_MAGIC */
	uint16_t type;	/* SM70_PROTO_MSG_HELLO */
	uint16_t version_major;
	uint16_t version_minor;
	uint16_t flags;	       /* none defined; 0 */
	uint32_t sq_entries;   /* requested sizes; 0 = daemon default; rounded up to 2^n, */
	uint32_t eq_entries;   /* then clamped to the daemon's bounds. The welcome says */
	uint32_t arena_tokens; /* what was granted. */
	uint32_t reserved0;
	char client_name[SM70_PROTO_NAME_LEN]; /* for logs; NUL-padded, printable ASCII */
	uint64_t reserved[4];
};
SM70_PROTO_SIZE(sm70_proto_hello, 96);
SM70_PROTO_AT(sm70_proto_hello, size, 0);
SM70_PROTO_AT(sm70_proto_hello, magic, 4);
SM70_PROTO_AT(sm70_proto_hello, type, 8);
SM70_PROTO_AT(sm70_proto_hello, version_major, 10);
SM70_PROTO_AT(sm70_proto_hello, version_minor, 12);
SM70_PROTO_AT(sm70_proto_hello, flags, 14);
SM70_PROTO_AT(sm70_proto_hello, sq_entries, 16);
SM70_PROTO_AT(sm70_proto_hello, eq_entries, 20);
SM70_PROTO_AT(sm70_proto_hello, arena_tokens, 24);
SM70_PROTO_AT(sm70_proto_hello, reserved0, 28);
SM70_PROTO_AT(sm70_proto_hello, client_name, 32);
SM70_PROTO_AT(sm70_proto_hello, reserved, 64);

/* Sent with SM70_PROTO_N_FDS descriptors in one SCM_RIGHTS control message, in the order of
 * the SM70_PROTO_FD_* indices. The layout fields repeat the segment header's so a client can
 * check the mapping it gets against what it was told. */
struct sm70_proto_welcome {
	uint32_t size;
	uint32_t magic;
	uint16_t type; /* SM70_PROTO_MSG_WELCOME */
	uint16_t version_major;
	uint16_t version_minor; /* the daemon's minor */
	uint16_t n_fds;		/* SM70_PROTO_N_FDS */
	int32_t result;		/* SM70_PROTO_OK */
	uint32_t session_id;	/* the daemon's name for this session in logs and sm70ctl */
	uint64_t segment_size;	/* bytes of the memfd; map all of it */
	uint64_t sq_offset;
	uint64_t eq_offset;
	uint64_t arena_offset;
	uint32_t sq_entries;
	uint32_t eq_entries;
	uint32_t arena_tokens;
	uint32_t reserved0;
	struct sm70_proto_limits limits;
	char model_name[SM70_PROTO_MODEL_NAME_LEN]; /* NUL-terminated */
	uint64_t reserved[7];
};
SM70_PROTO_SIZE(sm70_proto_welcome, 256);
SM70_PROTO_AT(sm70_proto_welcome, size, 0);
SM70_PROTO_AT(sm70_proto_welcome, magic, 4);
SM70_PROTO_AT(sm70_proto_welcome, type, 8);
SM70_PROTO_AT(sm70_proto_welcome, version_major, 10);
SM70_PROTO_AT(sm70_proto_welcome, version_minor, 12);
SM70_PROTO_AT(sm70_proto_welcome, n_fds, 14);
SM70_PROTO_AT(sm70_proto_welcome, result, 16);
SM70_PROTO_AT(sm70_proto_welcome, session_id, 20);
SM70_PROTO_AT(sm70_proto_welcome, segment_size, 24);
SM70_PROTO_AT(sm70_proto_welcome, sq_offset, 32);
SM70_PROTO_AT(sm70_proto_welcome, eq_offset, 40);
SM70_PROTO_AT(sm70_proto_welcome, arena_offset, 48);
SM70_PROTO_AT(sm70_proto_welcome, sq_entries, 56);
SM70_PROTO_AT(sm70_proto_welcome, eq_entries, 60);
SM70_PROTO_AT(sm70_proto_welcome, arena_tokens, 64);
SM70_PROTO_AT(sm70_proto_welcome, reserved0, 68);
SM70_PROTO_AT(sm70_proto_welcome, limits, 72);
SM70_PROTO_AT(sm70_proto_welcome, model_name, 136);
SM70_PROTO_AT(sm70_proto_welcome, reserved, 200);

/* Frozen for all versions. The reason is one NUL-terminated English sentence that says what
 * to do, e.g. what to upgrade on a version mismatch. */
struct sm70_proto_refusal {
	uint32_t size;
	uint32_t magic;
	uint16_t type; /* SM70_PROTO_MSG_REFUSAL */
	uint16_t version_major;
	uint16_t version_minor;
	uint16_t reserved0;
	int32_t result; /* positive sm70_proto_error: E_VERSION, E_DENIED, E_BUSY, ... */
	uint32_t reserved1;
	char reason[SM70_PROTO_REASON_LEN];
};
SM70_PROTO_SIZE(sm70_proto_refusal, 256);
SM70_PROTO_AT(sm70_proto_refusal, size, 0);
SM70_PROTO_AT(sm70_proto_refusal, magic, 4);
SM70_PROTO_AT(sm70_proto_refusal, type, 8);
SM70_PROTO_AT(sm70_proto_refusal, version_major, 10);
SM70_PROTO_AT(sm70_proto_refusal, version_minor, 12);
SM70_PROTO_AT(sm70_proto_refusal, reserved0, 14);
SM70_PROTO_AT(sm70_proto_refusal, result, 16);
SM70_PROTO_AT(sm70_proto_refusal, reserved1, 20);
SM70_PROTO_AT(sm70_proto_refusal, reason, 24);

/*
 * Since 1.1 (PROTOCOL.md section 4.7). A daemon that is still loading its model answers a
 * hello whose version_minor is
 * at least 1 with a LOADING message at once, then another about every second, and finally
 * with the WELCOME (or a REFUSAL) once the model is loaded. No fds. A hello of minor 0 gets
 * no LOADING messages: such a client just waits for the welcome. Progress is in bytes of
 * weights placed on the devices; bytes_total is 0 while unknown, and bytes_done may pass it
 * (the total of dummy weights is an estimate).
 */
struct sm70_proto_loading {
	uint32_t size;
	uint32_t magic;
	uint16_t type; /* SM70_PROTO_MSG_LOADING */
	uint16_t version_major;
	uint16_t version_minor;
	uint16_t reserved0;
	uint32_t elapsed_ms;  /* since the daemon began loading */
	uint32_t reserved1;
	uint64_t bytes_done;  /* weights placed so far */
	uint64_t bytes_total; /* weights the load places; 0: not known */
	char model_name[SM70_PROTO_MODEL_NAME_LEN]; /* NUL-terminated */
	uint64_t reserved[3];
};
SM70_PROTO_SIZE(sm70_proto_loading, 128);
SM70_PROTO_AT(sm70_proto_loading, size, 0);
SM70_PROTO_AT(sm70_proto_loading, magic, 4);
SM70_PROTO_AT(sm70_proto_loading, type, 8);
SM70_PROTO_AT(sm70_proto_loading, version_major, 10);
SM70_PROTO_AT(sm70_proto_loading, version_minor, 12);
SM70_PROTO_AT(sm70_proto_loading, reserved0, 14);
SM70_PROTO_AT(sm70_proto_loading, elapsed_ms, 16);
SM70_PROTO_AT(sm70_proto_loading, reserved1, 20);
SM70_PROTO_AT(sm70_proto_loading, bytes_done, 24);
SM70_PROTO_AT(sm70_proto_loading, bytes_total, 32);
SM70_PROTO_AT(sm70_proto_loading, model_name, 40);
SM70_PROTO_AT(sm70_proto_loading, reserved, 104);

/* ---- the shared segment header (at offset 0 of the memfd) ---------------------------- */

/*
 * Bytes 0..127 are written by the daemon before it passes the fd and never change. From 128 on,
 * each shared index and flag sits alone on a 64-byte line, so that the two sides never write
 * the same cache line. "D" = only the daemon writes it, "C" = only the client writes it; the
 * other side only reads. Indices and flags are plain uint32_t accessed only through the
 * helpers below (or equivalent atomics in another language).
 */
struct sm70_proto_seg_hdr {
	uint32_t magic; /* SM70_PROTO_MAGIC */
	uint16_t version_major;
	uint16_t version_minor;
	uint32_t header_size; /* sizeof(struct sm70_proto_seg_hdr) */
	uint32_t session_id;
	uint64_t total_size; /* == the memfd size */
	uint64_t sq_offset;  /* byte offsets from the segment start; 64-byte aligned */
	uint64_t eq_offset;
	uint64_t arena_offset;
	uint32_t sq_entries;   /* power of two */
	uint32_t eq_entries;   /* power of two */
	uint32_t arena_tokens; /* power of two; the arena holds uint32_t token ids */
	uint16_t sqe_size;     /* sizeof(struct sm70_proto_sqe) */
	uint16_t eqe_size;     /* sizeof(struct sm70_proto_eqe) */
	struct sm70_proto_limits limits;

	uint32_t sq_head; /* D: next SQ entry the daemon will read */
	uint8_t pad_sq_head[60];
	uint32_t sq_tail; /* C: one past the last SQ entry the client published */
	uint8_t pad_sq_tail[60];
	uint32_t eq_head; /* C: next event the client will read */
	uint8_t pad_eq_head[60];
	uint32_t eq_tail; /* D: one past the last event the daemon published */
	uint8_t pad_eq_tail[60];
	uint32_t arena_head; /* D: arena tokens before this position are free again */
	uint8_t pad_arena_head[60];
	uint32_t daemon_sleeping; /* D: 1 = ring the doorbell after publishing sq_tail */
	uint8_t pad_daemon_sleeping[60];
	uint32_t client_sleeping; /* C: 1 = ring the event fd after publishing eq_tail */
	uint8_t pad_client_sleeping[60];
	uint32_t eq_space_wanted; /* D: 1 = ring the doorbell after advancing eq_head */
	uint8_t pad_eq_space_wanted[60];
	/* 1.2, D (once, before the fd is passed): the absolute path of the daemon's model
	 * directory, NUL-terminated, so that a client can find the tokenizer; "" when it is
	 * not known or longer than 191 bytes (and always "" from a 1.0/1.1 daemon) */
	char model_dir[SM70_PROTO_MODEL_DIR_LEN];
	/* 1.2, D: 0 while the session is open; a positive sm70_proto_error once the daemon
	 * closed it, release-stored after close_reason and before the socket is closed. */
	uint32_t close_code;
	uint32_t pad_close_code;
	char close_reason[SM70_PROTO_CLOSE_REASON_LEN]; /* 1.2, D: NUL-terminated, once close_code */
	uint8_t reserved[32];
};
SM70_PROTO_SIZE(sm70_proto_seg_hdr, 1024);
SM70_PROTO_AT(sm70_proto_seg_hdr, magic, 0);
SM70_PROTO_AT(sm70_proto_seg_hdr, version_major, 4);
SM70_PROTO_AT(sm70_proto_seg_hdr, version_minor, 6);
SM70_PROTO_AT(sm70_proto_seg_hdr, header_size, 8);
SM70_PROTO_AT(sm70_proto_seg_hdr, session_id, 12);
SM70_PROTO_AT(sm70_proto_seg_hdr, total_size, 16);
SM70_PROTO_AT(sm70_proto_seg_hdr, sq_offset, 24);
SM70_PROTO_AT(sm70_proto_seg_hdr, eq_offset, 32);
SM70_PROTO_AT(sm70_proto_seg_hdr, arena_offset, 40);
SM70_PROTO_AT(sm70_proto_seg_hdr, sq_entries, 48);
SM70_PROTO_AT(sm70_proto_seg_hdr, eq_entries, 52);
SM70_PROTO_AT(sm70_proto_seg_hdr, arena_tokens, 56);
SM70_PROTO_AT(sm70_proto_seg_hdr, sqe_size, 60);
SM70_PROTO_AT(sm70_proto_seg_hdr, eqe_size, 62);
SM70_PROTO_AT(sm70_proto_seg_hdr, limits, 64);
SM70_PROTO_AT(sm70_proto_seg_hdr, sq_head, 128);
SM70_PROTO_AT(sm70_proto_seg_hdr, pad_sq_head, 132);
SM70_PROTO_AT(sm70_proto_seg_hdr, sq_tail, 192);
SM70_PROTO_AT(sm70_proto_seg_hdr, pad_sq_tail, 196);
SM70_PROTO_AT(sm70_proto_seg_hdr, eq_head, 256);
SM70_PROTO_AT(sm70_proto_seg_hdr, pad_eq_head, 260);
SM70_PROTO_AT(sm70_proto_seg_hdr, eq_tail, 320);
SM70_PROTO_AT(sm70_proto_seg_hdr, pad_eq_tail, 324);
SM70_PROTO_AT(sm70_proto_seg_hdr, arena_head, 384);
SM70_PROTO_AT(sm70_proto_seg_hdr, pad_arena_head, 388);
SM70_PROTO_AT(sm70_proto_seg_hdr, daemon_sleeping, 448);
SM70_PROTO_AT(sm70_proto_seg_hdr, pad_daemon_sleeping, 452);
SM70_PROTO_AT(sm70_proto_seg_hdr, client_sleeping, 512);
SM70_PROTO_AT(sm70_proto_seg_hdr, pad_client_sleeping, 516);
SM70_PROTO_AT(sm70_proto_seg_hdr, eq_space_wanted, 576);
SM70_PROTO_AT(sm70_proto_seg_hdr, pad_eq_space_wanted, 580);
SM70_PROTO_AT(sm70_proto_seg_hdr, model_dir, 640);
SM70_PROTO_AT(sm70_proto_seg_hdr, close_code, 832);
SM70_PROTO_AT(sm70_proto_seg_hdr, pad_close_code, 836);
SM70_PROTO_AT(sm70_proto_seg_hdr, close_reason, 840);
SM70_PROTO_AT(sm70_proto_seg_hdr, reserved, 992);

/* ---- submission entry (client -> daemon) --------------------------------------------- */

enum sm70_proto_opcode {
	SM70_PROTO_OP_SUBMIT = 1, /* start a job */
	SM70_PROTO_OP_CANCEL = 2, /* end the job with this tag; every other field zero */
};

/* SUBMIT flags */
#define SM70_PROTO_SQF_IGNORE_EOS (1u << 0) /* do not stop on the model's EOS tokens */
#define SM70_PROTO_SQF_SEED (1u << 1)	    /* use `seed`; without it seed must be 0 and the */
					    /* daemon picks one */
#define SM70_PROTO_SQF_KNOWN (SM70_PROTO_SQF_IGNORE_EOS | SM70_PROTO_SQF_SEED)

/*
 * One submission. The prompt is prompt_len uint32_t token ids in the arena starting at token
 * position arena_pos, a free-running position: the tokens sit at arena slots
 * (arena_pos & (arena_tokens - 1)) onward and must not wrap past the arena end.
 * Sampling: temperature 0 = greedy; top_k 0 = off; top_p 1 = off.
 */
struct sm70_proto_sqe {
	uint16_t size;	 /* sizeof(struct sm70_proto_sqe) */
	uint8_t opcode;	 /* sm70_proto_opcode */
	uint8_t priority; /* 0 = normal; higher is scheduled sooner; <= limits.max_priority */
	uint32_t flags;	 /* SM70_PROTO_SQF_* */
	uint64_t tag;	 /* client-chosen; unique among this client's unfinished jobs */
	uint32_t arena_pos;
	uint32_t prompt_len; /* tokens, >= 1 */
	uint32_t max_new_tokens; /* >= 1 */
	float temperature;	 /* finite, >= 0 */
	float top_p;		 /* in (0, 1] */
	int32_t top_k;		 /* >= 0 */
	uint64_t seed;		 /* with SM70_PROTO_SQF_SEED */
	uint32_t top_logprobs;	 /* alternatives per TOKEN event, <= limits.max_top_logprobs */
	uint32_t deadline_ms;	 /* 0 = none; else the job ends with DEADLINE this long after
				  * the daemon accepted it */
	uint32_t n_stop;	 /* <= SM70_PROTO_MAX_STOP */
	uint32_t stop[SM70_PROTO_MAX_STOP]; /* ids that end the job; unused slots zero */
	uint32_t reserved0;
	uint64_t reserved[4];
};
SM70_PROTO_SIZE(sm70_proto_sqe, 128);
SM70_PROTO_AT(sm70_proto_sqe, size, 0);
SM70_PROTO_AT(sm70_proto_sqe, opcode, 2);
SM70_PROTO_AT(sm70_proto_sqe, priority, 3);
SM70_PROTO_AT(sm70_proto_sqe, flags, 4);
SM70_PROTO_AT(sm70_proto_sqe, tag, 8);
SM70_PROTO_AT(sm70_proto_sqe, arena_pos, 16);
SM70_PROTO_AT(sm70_proto_sqe, prompt_len, 20);
SM70_PROTO_AT(sm70_proto_sqe, max_new_tokens, 24);
SM70_PROTO_AT(sm70_proto_sqe, temperature, 28);
SM70_PROTO_AT(sm70_proto_sqe, top_p, 32);
SM70_PROTO_AT(sm70_proto_sqe, top_k, 36);
SM70_PROTO_AT(sm70_proto_sqe, seed, 40);
SM70_PROTO_AT(sm70_proto_sqe, top_logprobs, 48);
SM70_PROTO_AT(sm70_proto_sqe, deadline_ms, 52);
SM70_PROTO_AT(sm70_proto_sqe, n_stop, 56);
SM70_PROTO_AT(sm70_proto_sqe, stop, 60);
SM70_PROTO_AT(sm70_proto_sqe, reserved0, 92);
SM70_PROTO_AT(sm70_proto_sqe, reserved, 96);

/* ---- event entry (daemon -> client) -------------------------------------------------- */

enum sm70_proto_event_type {
	SM70_PROTO_EV_TOKEN = 1,  /* one generated token */
	SM70_PROTO_EV_FINISH = 2, /* the job ended; last event for its tag */
	SM70_PROTO_EV_ERROR = 3,  /* an entry was refused; for a SUBMIT, last event for its tag */
};

/*
 * Event flags (since 1.1; a 1.0 client ignores them). An ERROR with EVF_NOT_FINAL ends no
 * job: it answers an entry that never was the job its tag names (a SUBMIT whose tag an
 * unfinished job holds, a malformed CANCEL), or it concerns the whole session (tag 0,
 * opcode 0: the slow-consumer cut-off, PROTOCOL.md section 10).
 */
#define SM70_PROTO_EVF_NOT_FINAL (1u << 0)

/* Append-only; a client treats a reason it does not know as ERROR. */
enum sm70_proto_finish_reason {
	SM70_PROTO_FINISH_LENGTH = 1,	  /* max_new_tokens reached (or the context limit) */
	SM70_PROTO_FINISH_STOP_EOS = 2,	  /* the model's EOS token was generated */
	SM70_PROTO_FINISH_STOP_TOKEN = 3, /* one of the entry's stop tokens was generated */
	SM70_PROTO_FINISH_CANCELLED = 4,  /* a CANCEL entry or the client's own hang-up */
	SM70_PROTO_FINISH_DEADLINE = 5,	  /* deadline_ms passed */
	SM70_PROTO_FINISH_ERROR = 6,	  /* see the finish record's error code */
};

struct sm70_proto_top {
	uint32_t id;
	float logprob;
};
SM70_PROTO_SIZE(sm70_proto_top, 8);
SM70_PROTO_AT(sm70_proto_top, id, 0);
SM70_PROTO_AT(sm70_proto_top, logprob, 4);

/* logprob values are natural-log probabilities under the model's raw distribution
 * (temperature 1, before top-k/top-p), the sampled token's and the n_top most likely ones,
 * most likely first; top[i] for i >= n_top are zero. */
struct sm70_proto_ev_token {
	uint32_t token;
	float logprob;
	uint16_t n_top;
	uint16_t reserved0;
	uint32_t reserved1;
	struct sm70_proto_top top[SM70_PROTO_MAX_TOP];
	uint64_t reserved[4];
};
SM70_PROTO_SIZE(sm70_proto_ev_token, 112);
SM70_PROTO_AT(sm70_proto_ev_token, token, 0);
SM70_PROTO_AT(sm70_proto_ev_token, logprob, 4);
SM70_PROTO_AT(sm70_proto_ev_token, n_top, 8);
SM70_PROTO_AT(sm70_proto_ev_token, reserved0, 10);
SM70_PROTO_AT(sm70_proto_ev_token, reserved1, 12);
SM70_PROTO_AT(sm70_proto_ev_token, top, 16);
SM70_PROTO_AT(sm70_proto_ev_token, reserved, 80);

/* Times are microseconds measured by the daemon from the moment it accepted the entry. */
struct sm70_proto_ev_finish {
	uint16_t reason; /* sm70_proto_finish_reason */
	uint16_t reserved0;
	int32_t error;		       /* positive sm70_proto_error when reason is ERROR, else 0 */
	uint32_t prompt_tokens;	       /* the prompt length the job ran with */
	uint32_t completion_tokens;    /* TOKEN events delivered for this job */
	uint32_t cached_prompt_tokens; /* prompt tokens served from the prefix cache */
	uint32_t reserved1;
	uint64_t queue_us; /* accepted -> first scheduled */
	uint64_t ttft_us;  /* accepted -> first TOKEN event published */
	uint64_t decode_us; /* first -> last TOKEN event published */
	uint64_t reserved[8];
};
SM70_PROTO_SIZE(sm70_proto_ev_finish, 112);
SM70_PROTO_AT(sm70_proto_ev_finish, reason, 0);
SM70_PROTO_AT(sm70_proto_ev_finish, reserved0, 2);
SM70_PROTO_AT(sm70_proto_ev_finish, error, 4);
SM70_PROTO_AT(sm70_proto_ev_finish, prompt_tokens, 8);
SM70_PROTO_AT(sm70_proto_ev_finish, completion_tokens, 12);
SM70_PROTO_AT(sm70_proto_ev_finish, cached_prompt_tokens, 16);
SM70_PROTO_AT(sm70_proto_ev_finish, reserved1, 20);
SM70_PROTO_AT(sm70_proto_ev_finish, queue_us, 24);
SM70_PROTO_AT(sm70_proto_ev_finish, ttft_us, 32);
SM70_PROTO_AT(sm70_proto_ev_finish, decode_us, 40);
SM70_PROTO_AT(sm70_proto_ev_finish, reserved, 48);

/* The answer to an entry that never became (or, for CANCEL, never touched) a job. */
struct sm70_proto_ev_error {
	int32_t error;	/* positive sm70_proto_error */
	uint8_t opcode; /* the refused entry's opcode */
	uint8_t reserved0;
	uint16_t reserved1;
	char message[SM70_PROTO_ERRMSG_LEN]; /* NUL-terminated; names the field at fault */
};
SM70_PROTO_SIZE(sm70_proto_ev_error, 112);
SM70_PROTO_AT(sm70_proto_ev_error, error, 0);
SM70_PROTO_AT(sm70_proto_ev_error, opcode, 4);
SM70_PROTO_AT(sm70_proto_ev_error, reserved0, 5);
SM70_PROTO_AT(sm70_proto_ev_error, reserved1, 6);
SM70_PROTO_AT(sm70_proto_ev_error, message, 8);

/*
 * 128 bytes: a 16-byte header and a 112-byte body, which holds a TOKEN with all
 * SM70_PROTO_MAX_TOP (8) alternatives inline and 32 bytes to spare, so no entry is 192.
 */
struct sm70_proto_eqe {
	uint16_t type;	/* sm70_proto_event_type; skip types you do not know */
	uint16_t flags; /* SM70_PROTO_EVF_*; ignore bits you do not know */
	uint32_t index; /* TOKEN: 0-based position of the token in the completion; else 0 */
	uint64_t tag;	/* the entry's tag */
	union {
		struct sm70_proto_ev_token token;
		struct sm70_proto_ev_finish finish;
		struct sm70_proto_ev_error error;
		uint8_t raw[112];
	} u;
};
SM70_PROTO_SIZE(sm70_proto_eqe, 128);
SM70_PROTO_AT(sm70_proto_eqe, type, 0);
SM70_PROTO_AT(sm70_proto_eqe, flags, 2);
SM70_PROTO_AT(sm70_proto_eqe, index, 4);
SM70_PROTO_AT(sm70_proto_eqe, tag, 8);
SM70_PROTO_AT(sm70_proto_eqe, u, 16);
SM70_PROTO_AT(sm70_proto_eqe, u.token, 16);
SM70_PROTO_AT(sm70_proto_eqe, u.finish, 16);
SM70_PROTO_AT(sm70_proto_eqe, u.error, 16);

/* ---- ring index rules ----------------------------------------------------------------- */

/*
 * Rings (SQ, event ring, arena) have power-of-two capacities. Indices are free-running
 * uint32_t that wrap at 2^32; the slot of index i is i & (cap - 1); count = tail - head and
 * space = cap - count, both in modular arithmetic, so wraparound needs no special case.
 *
 * Producer: write the entry, then release-store the tail (the entry is visible before the
 * tail). Consumer: acquire-load the tail, read entries, then release-store the head (the
 * reads finish before the producer may reuse the slot). Each side may read its own index
 * with a relaxed load, since only it writes that index.
 *
 * A reader must treat count > cap (a corrupt or hostile peer) as a protocol violation.
 */

/* True if cap is a valid ring capacity: a nonzero power of two. */
static inline int sm70_ring_cap_ok(uint32_t cap)
{
	return cap != 0 && (cap & (cap - 1)) == 0;
}

/* Entries published and not yet consumed. Can exceed cap only if the peer is broken. */
static inline uint32_t sm70_ring_count(uint32_t head, uint32_t tail)
{
	return tail - head;
}

/* Free slots; only meaningful when sm70_ring_count(head, tail) <= cap. */
static inline uint32_t sm70_ring_space(uint32_t head, uint32_t tail, uint32_t cap)
{
	return cap - (tail - head);
}

static inline uint32_t sm70_ring_slot(uint32_t index, uint32_t cap)
{
	return index & (cap - 1);
}

/* Reads the other side's index (its tail as consumer, its head as producer). */
static inline uint32_t sm70_ring_load_acquire(const uint32_t *index)
{
	return __atomic_load_n(index, __ATOMIC_ACQUIRE);
}

/* Reads one's own index. */
static inline uint32_t sm70_ring_load_relaxed(const uint32_t *index)
{
	return __atomic_load_n(index, __ATOMIC_RELAXED);
}

/* Publishes one's own index (a producer's tail after writing entries, a consumer's head
 * after reading them). */
static inline void sm70_ring_store_release(uint32_t *index, uint32_t value)
{
	__atomic_store_n(index, value, __ATOMIC_RELEASE);
}

/* ---- need-wakeup protocol -------------------------------------------------------------- */

/*
 * Sleeper (a consumer that found its ring empty, or the daemon waiting for event space):
 *   sm70_proto_sleep_begin(flag); re-check the ring; if there is work, sm70_proto_sleep_end
 *   and go on; else block on the eventfd, then sm70_proto_sleep_end and re-check.
 * Waker (after publishing its index):
 *   if (sm70_proto_wake_needed(flag)) write 1 to the eventfd.
 * Both sides store then load different words; without the full fences each side's load may
 * pass its own store (store buffering), so the sleeper misses the new tail and the waker
 * misses the flag, and the sleeper sleeps forever. A seq_cst fence on both sides forbids
 * that outcome: at least one of them sees the other's store.
 */
static inline void sm70_proto_sleep_begin(uint32_t *flag)
{
	__atomic_store_n(flag, 1u, __ATOMIC_RELAXED);
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
}

static inline void sm70_proto_sleep_end(uint32_t *flag)
{
	__atomic_store_n(flag, 0u, __ATOMIC_RELAXED);
}

/* Call after the release-store of one's index. Returns nonzero if the peer must be woken. */
static inline int sm70_proto_wake_needed(const uint32_t *flag)
{
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	return __atomic_load_n(flag, __ATOMIC_RELAXED) != 0;
}

/* ---- typed views of the segment -------------------------------------------------------- */

/* These trust the header's offsets: a client calls sm70_proto_layout_check (sm70_validate.h)
 * once after mapping; the daemon wrote them itself. */
static inline struct sm70_proto_sqe *sm70_proto_sq(void *seg, const struct sm70_proto_seg_hdr *h)
{
	return (struct sm70_proto_sqe *)((char *)seg + h->sq_offset);
}

static inline struct sm70_proto_eqe *sm70_proto_eq(void *seg, const struct sm70_proto_seg_hdr *h)
{
	return (struct sm70_proto_eqe *)((char *)seg + h->eq_offset);
}

static inline uint32_t *sm70_proto_arena(void *seg, const struct sm70_proto_seg_hdr *h)
{
	return (uint32_t *)((char *)seg + h->arena_offset);
}

#ifdef __cplusplus
}
#endif

#endif
