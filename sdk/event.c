/*
 * event.c - the consumer side: reading the event ring, the need-wakeup dance with the
 * daemon (PROTOCOL.md section 6), sleeping through the handle's io_uring, noticing the
 * daemon's hang-up, and ending every live job explicitly when it happens.
 *
 * Waiting: spin on eq_tail for spin_us, then set client_sleeping, full fence, re-check, and
 * sleep on an io_uring holding a poll on the event eventfd and a poll on the control socket
 * (for the hang-up), bounded by the wait's timeout. The eventfds are non-blocking (their
 * O_NONBLOCK is shared with the daemon and must not be cleared), so an io_uring read on
 * them would complete at once with -EAGAIN: we poll them for POLLIN and then read() the
 * counter, as PROTOCOL.md section 6 prescribes. Polls stay armed between waits, so a wait
 * whose poll is still pending costs one io_uring_enter and no new submissions.
 * Non-goals: more than one consumer thread per handle (client.h states the rule).
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "sdk/client_impl.h"

enum { UD_EVFD = 1, UD_SOCK = 2 };

static int64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ __volatile__("yield");
#endif
}

/* ---- held events ------------------------------------------------------------------------- */

int sm70__held_push(struct sm70_client *c, const struct sm70_event *ev)
{
	if (c->held_head + c->held_n == c->held_cap) {
		struct sm70_event *nh;
		size_t cap;

		if (c->held_head) { /* slide to the front before growing */
			memmove(c->held, c->held + c->held_head, c->held_n * sizeof(*ev));
			c->held_head = 0;
		}
		if (c->held_n == c->held_cap) {
			cap = c->held_cap ? c->held_cap * 2 : 16;
			nh = realloc(c->held, cap * sizeof(*nh));
			if (!nh)
				return -ENOMEM;
			c->held = nh;
			c->held_cap = cap;
		}
	}
	c->held[c->held_head + c->held_n++] = *ev;
	return 0;
}

int sm70__held_take(struct sm70_client *c, uint64_t id, struct sm70_event *ev)
{
	size_t i;

	for (i = 0; i < c->held_n; i++) {
		struct sm70_event *h = &c->held[c->held_head + i];

		if (id && h->job_id != id)
			continue;
		*ev = *h;
		if (i == 0) {
			c->held_head++;
		} else {
			memmove(h, h + 1, (c->held_n - i - 1) * sizeof(*h));
		}
		if (--c->held_n == 0)
			c->held_head = 0;
		return 1;
	}
	return 0;
}

/* ---- the daemon's hang-up ---------------------------------------------------------------- */

int sm70__end_live_jobs(struct sm70_client *c, int err, const char *why)
{
	int ret = 0;

	pthread_mutex_lock(&c->lock);
	c->dead = 1; /* under the lock: no submission can slip in after the snapshot below */
	while (c->n_jobs) {
		const struct sm70__job *j = &c->jobs[c->n_jobs - 1];
		struct sm70_event ev;

		memset(&ev, 0, sizeof(ev));
		ev.size = sizeof(ev);
		ev.type = SM70_EVENT_FINISH;
		ev.flags = SM70_EVENT_FINAL;
		ev.job_id = j->id;
		ev.user_tag = j->user_tag;
		ev.finish_reason = SM70_REASON_ERROR;
		ev.error = err;
		ev.usage.prompt_tokens = j->prompt_len;
		ev.usage.completion_tokens = j->n_tokens;
		ev.stop_index = -1;
		snprintf(ev.message, sizeof(ev.message), "%s", why);
		ret = sm70__held_push(c, &ev);
		if (ret)
			break;
		c->n_jobs--;
	}
	pthread_mutex_unlock(&c->lock);
	return ret;
}

/* Reads what the socket holds without blocking; notes a hang-up (EOF or error). Protocol
 * 1.0 daemons send nothing after the welcome, so any message is discarded. */
static void check_hangup(struct sm70_client *c)
{
	char buf[SM70_PROTO_MSG_MAX];
	ssize_t n;

	for (;;) {
		n = recv(c->sock, buf, sizeof(buf), MSG_DONTWAIT);
		if (n > 0)
			continue;
		if (n < 0 && errno == EINTR)
			continue;
		if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK))
			c->hung_up = 1;
		return;
	}
}

/* What a daemon of protocol 1.2 or later said when it closed the session (PROTOCOL.md
 * section 2): its code (0: it said nothing, e.g. it died), with the reason copied into
 * why, printable and NUL-terminated. */
static int close_reason(const struct sm70_client *c, char *why, size_t len)
{
	const struct sm70_proto_seg_hdr *h = c->rings.hdr;
	uint32_t code = sm70_ring_load_acquire(&h->close_code);
	size_t i, n = len - 1 < sizeof(h->close_reason) ? len - 1 : sizeof(h->close_reason);

	if (!code)
		return 0;
	memcpy(why, h->close_reason, n);
	why[n] = '\0';
	for (i = 0; why[i]; i++)
		if ((unsigned char)why[i] < 0x20 || (unsigned char)why[i] >= 0x7f)
			why[i] = '?';
	if (!why[0])
		snprintf(why, len, "no reason given");
	return code < SM70_E_BASE ? (int)code : SM70_PROTO_E_INTERNAL;
}

/* The ring is empty and the daemon is gone: end what is left, with the daemon's reason
 * when it gave one. */
static int gone(struct sm70_client *c)
{
	char why[SM70_PROTO_REASON_LEN], msg[SM70_MESSAGE_LEN];
	int code = close_reason(c, why, sizeof(why));

	/* On -ENOMEM some jobs stay live and the next call tries again. */
	if (!code) {
		sm70__end_live_jobs(c, -ECONNRESET, "sm70d went away (connection reset); the "
				    "job's remaining output is lost");
		return sm70__fail(c, -ECONNRESET, "sm70d went away without saying why "
				  "(connection reset)");
	}
	/* the event's message is shorter than a reason: it keeps the start */
	snprintf(msg, sizeof(msg), "sm70d closed the session: %.101s", why);
	sm70__end_live_jobs(c, -(SM70_E_BASE + code), msg);
	return sm70__fail(c, -ECONNRESET, "sm70d closed the session (%s): %s",
			  sm70_proto_strerror(code), why);
}

/* ---- reading one event ------------------------------------------------------------------- */

static void finish_message(struct sm70_event *ev, int code)
{
	snprintf(ev->message, sizeof(ev->message), "sm70d ended the job: %s",
		 sm70_proto_strerror(code));
}

/* Turns a raw event into the public form and updates the job table. Returns 1 if *ev is an
 * event for the application, 0 for an unknown type (skipped). */
static int convert(struct sm70_client *c, const struct sm70_proto_eqe *q, struct sm70_event *ev)
{
	long idx;
	uint32_t i;
	int code;

	memset(ev, 0, sizeof(*ev));
	ev->size = sizeof(*ev);
	ev->job_id = q->tag;
	ev->stop_index = -1;
	switch (q->type) {
	case SM70_PROTO_EV_TOKEN:
		ev->type = SM70_EVENT_TOKEN;
		ev->index = q->index;
		ev->token = q->u.token.token;
		ev->logprob = q->u.token.logprob;
		ev->n_top = q->u.token.n_top < SM70_MAX_TOP_LOGPROBS ? q->u.token.n_top :
								       SM70_MAX_TOP_LOGPROBS;
		for (i = 0; i < ev->n_top; i++) {
			ev->top[i].id = q->u.token.top[i].id;
			ev->top[i].logprob = q->u.token.top[i].logprob;
		}
		break;
	case SM70_PROTO_EV_FINISH:
		ev->type = SM70_EVENT_FINISH;
		ev->flags = SM70_EVENT_FINAL;
		ev->finish_reason = q->u.finish.reason;
		if (ev->finish_reason < SM70_REASON_LENGTH || ev->finish_reason > SM70_REASON_ERROR)
			ev->finish_reason = SM70_REASON_ERROR; /* unknown reasons count as errors */
		if (ev->finish_reason == SM70_REASON_ERROR) {
			code = q->u.finish.error > 0 ? q->u.finish.error : SM70_PROTO_E_INTERNAL;
			ev->error = -(SM70_E_BASE + code);
			finish_message(ev, code);
		}
		ev->usage.prompt_tokens = q->u.finish.prompt_tokens;
		ev->usage.completion_tokens = q->u.finish.completion_tokens;
		ev->usage.cached_tokens = q->u.finish.cached_prompt_tokens;
		ev->usage.queue_us = q->u.finish.queue_us;
		ev->usage.ttft_us = q->u.finish.ttft_us;
		ev->usage.decode_us = q->u.finish.decode_us;
		break;
	case SM70_PROTO_EV_ERROR:
		ev->type = SM70_EVENT_ERROR;
		/* A refused CANCEL touched no job, nor did an ERROR the daemon marks as not
		 * final (a tag in use, the session-wide slow-consumer notice); anything else
		 * was the job's only event. */
		if (q->u.error.opcode != SM70_PROTO_OP_CANCEL &&
		    !(q->flags & SM70_PROTO_EVF_NOT_FINAL))
			ev->flags = SM70_EVENT_FINAL;
		code = q->u.error.error > 0 ? q->u.error.error : SM70_PROTO_E_INTERNAL;
		ev->error = -(SM70_E_BASE + code);
		memcpy(ev->message, q->u.error.message,
		       sizeof(q->u.error.message) < sizeof(ev->message) ?
			       sizeof(q->u.error.message) : sizeof(ev->message));
		ev->message[sizeof(ev->message) - 1] = '\0';
		if (!ev->message[0])
			snprintf(ev->message, sizeof(ev->message), "%s", sm70_proto_strerror(code));
		break;
	default:
		return 0; /* a newer minor's event type: skip it */
	}
	pthread_mutex_lock(&c->lock);
	idx = sm70__job_find(c, ev->job_id);
	if (idx >= 0) {
		struct sm70__job *j = &c->jobs[idx];

		ev->user_tag = j->user_tag;
		if (ev->type == SM70_EVENT_TOKEN)
			j->n_tokens++;
		if (ev->flags & SM70_EVENT_FINAL)
			*j = c->jobs[--c->n_jobs];
	}
	pthread_mutex_unlock(&c->lock);
	return 1;
}

/* Takes one event off the ring. Returns 1 with *ev, 0 if the ring is empty (or held only
 * unknown types), or -EPROTO for an impossible eq_tail. awake: the caller is a blocking
 * wait, which may lower client_sleeping while it finds events; a timeout-0 caller (an
 * application loop polling sm70_event_fd) keeps it raised, so the daemon keeps ringing the
 * descriptor even if the application stops draining before -ETIMEDOUT. */
static int pop(struct sm70_client *c, struct sm70_event *ev, int awake)
{
	struct sm70_proto_eqe q;
	int ret, ring;

	for (;;) {
		ret = sm70__eq_pop(&c->rings, &q, &ring);
		if (ret <= 0)
			return ret;
		if (ring)
			sm70__ring_doorbell(c);
		if (c->sleeping && awake) {
			sm70_proto_sleep_end(&c->rings.hdr->client_sleeping);
			c->sleeping = 0;
		}
		if (convert(c, &q, ev))
			return 1;
	}
}

/* Arms the polls that are not pending and sleeps until one fires or timeout_ns passes
 * (< 0: no limit). Returns 0 (woken or timed out; the caller re-checks) or -errno. */
static int uring_wait(struct sm70_client *c, int64_t timeout_ns)
{
	struct __kernel_timespec ts;
	struct io_uring_cqe *cqe;
	struct io_uring_sqe *sqe;
	unsigned head, seen = 0;
	int ret;

	if (!c->armed_ev) {
		sqe = io_uring_get_sqe(&c->uring);
		if (!sqe)
			return -EBUSY;
		io_uring_prep_poll_add(sqe, c->evfd, POLLIN);
		io_uring_sqe_set_data64(sqe, UD_EVFD);
		c->armed_ev = 1;
	}
	if (!c->armed_sock) {
		sqe = io_uring_get_sqe(&c->uring);
		if (!sqe)
			return -EBUSY;
		io_uring_prep_poll_add(sqe, c->sock, POLLIN | POLLRDHUP);
		io_uring_sqe_set_data64(sqe, UD_SOCK);
		c->armed_sock = 1;
	}
	ts.tv_sec = timeout_ns / 1000000000;
	ts.tv_nsec = timeout_ns % 1000000000;
	ret = io_uring_submit_and_wait_timeout(&c->uring, &cqe, 1, timeout_ns < 0 ? NULL : &ts,
					       NULL);
	if (ret < 0 && ret != -ETIME && ret != -EINTR)
		return ret;
	io_uring_for_each_cqe(&c->uring, head, cqe) {
		switch (io_uring_cqe_get_data64(cqe)) {
		case UD_EVFD:
			c->armed_ev = 0;
			break;
		case UD_SOCK:
			c->armed_sock = 0;
			check_hangup(c);
			break;
		default:
			break;
		}
		seen++;
	}
	io_uring_cq_advance(&c->uring, seen);
	return 0;
}

/* Resets the event eventfd's counter; the fd is non-blocking, so an empty counter just
 * fails with EAGAIN. */
static void drain_evfd(const struct sm70_client *c)
{
	uint64_t v;

	if (read(c->evfd, &v, sizeof(v)) < 0) {
		/* EAGAIN: nothing was pending */
	}
}

int sm70__fetch(struct sm70_client *c, struct sm70_event *ev, int timeout_ms)
{
	int64_t deadline = 0, left = -1, spin_end;
	int ret;

	if (!c->connected)
		return -ENOTCONN;
	if (timeout_ms > 0)
		deadline = now_ns() + (int64_t)timeout_ms * 1000000;
	for (;;) {
		ret = pop(c, ev, timeout_ms != 0);
		if (ret > 0)
			return 0;
		if (ret < 0)
			c->hung_up = 1; /* a broken ring is as final as a hang-up */
		if (c->hung_up)
			return gone(c);
		if (timeout_ms != 0 && c->spin_us != UINT32_MAX) {
			spin_end = now_ns() + (int64_t)c->spin_us * 1000;
			while (sm70__eq_pending(&c->rings) == 0 && now_ns() < spin_end)
				cpu_relax();
			if (sm70__eq_pending(&c->rings) != 0)
				continue;
		}
		/* Sleeper protocol: counter reset, flag, full fence, re-check. */
		drain_evfd(c);
		if (!c->sleeping) {
			sm70_proto_sleep_begin(&c->rings.hdr->client_sleeping);
			c->sleeping = 1;
		} else {
			__atomic_thread_fence(__ATOMIC_SEQ_CST);
		}
		if (sm70__eq_pending(&c->rings) != 0)
			continue;
		if (timeout_ms == 0) {
			/* The flag stays set, so the daemon rings the fd the application polls. */
			check_hangup(c);
			if (c->hung_up)
				continue;
			return -ETIMEDOUT;
		}
		if (timeout_ms > 0) {
			left = deadline - now_ns();
			if (left <= 0)
				return -ETIMEDOUT;
		}
		ret = uring_wait(c, left);
		if (ret)
			return ret;
	}
}

SM70_API int sm70_next_event(struct sm70_client *c, struct sm70_event *ev, int timeout_ms)
{
	struct sm70_event tmp;
	int ret;

	if (!c || !ev || ev->size < sizeof(*ev))
		return -EINVAL;
	do {
		if (sm70__held_take(c, 0, &tmp))
			continue;
		ret = sm70__fetch(c, &tmp, timeout_ms);
		/* After a hang-up the synthesized final events are held: return them first. */
		if (ret == -ECONNRESET && sm70__held_take(c, 0, &tmp))
			ret = 0;
		if (ret)
			return ret;
	} while (sm70__text_apply(c, &tmp)); /* a text job's tokens after its stop string */
	/* Newer callers may pass a larger struct: fill what this version knows. */
	memcpy(ev, &tmp, sizeof(tmp));
	return 0;
}

SM70_API int sm70_event_fd(const struct sm70_client *c)
{
	return c ? c->epfd : -EBADF;
}
