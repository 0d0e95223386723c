/*
 * raw_client.h - a bare sm70 protocol client for integration tests, written from
 * docs/PROTOCOL.md (no SDK), for tests that do to the descriptors and the segment what a
 * careless or hostile client would: keep connections half-open, clear O_NONBLOCK on the
 * eventfds, pin counters, read the doorbell itself.
 *
 *   struct sm70t_raw c;
 *   sm70t_raw_connect(&c, path, 0, 5000);        // 0 welcomed, 1 refused (c.refusal)
 *   sm70t_raw_submit(&c, tag, prompt, n, 8, 0);  // writes an entry; publish rings
 *   sm70t_raw_publish(&c);
 *   sm70t_raw_next(&c, &ev, 5000);               // 0, -ETIMEDOUT, -EPIPE
 *   sm70t_raw_close(&c);
 *
 * Header-only (static functions); every function returns 0 / 1 or -errno and never aborts,
 * so a test decides what a failure means. Non-goals: threads, CANCEL, prompts that wrap.
 */
#ifndef SM70_TESTS_RAW_CLIENT_H
#define SM70_TESTS_RAW_CLIENT_H

#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "shm_proto/sm70_proto.h"
#include "shm_proto/sm70_validate.h"

struct sm70t_raw {
	int sock, bell, evfd; /* -1 when not open */
	void *seg;
	size_t size;
	struct sm70_proto_seg_hdr *h;
	struct sm70_proto_sqe *sq;
	struct sm70_proto_eqe *eq;
	uint32_t *arena;
	struct sm70_proto_welcome w;
	struct sm70_proto_refusal refusal; /* after a refusal */
	uint32_t sq_tail, eq_head, arena_tail;
};

static inline long sm70t_raw_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000L + ts.tv_nsec / 1000000L;
}

static inline void sm70t_raw_init(struct sm70t_raw *c)
{
	memset(c, 0, sizeof(*c));
	c->sock = c->bell = c->evfd = -1;
}

/* Connects to path and sends a hello asking for want_eq events (0: default). Does not wait
 * for the answer. Returns 0 or -errno. */
static inline int sm70t_raw_start(struct sm70t_raw *c, const char *path, uint32_t want_eq)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	struct sm70_proto_hello h;

	sm70t_raw_init(c);
	c->sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (c->sock < 0)
		return -errno;
	snprintf(a.sun_path, sizeof(a.sun_path), "%s", path);
	if (connect(c->sock, (struct sockaddr *)&a, sizeof(a)))
		return -errno;
	memset(&h, 0, sizeof(h));
	h.size = sizeof(h);
	h.magic = SM70_PROTO_MAGIC;
	h.type = SM70_PROTO_MSG_HELLO;
	h.version_major = SM70_PROTO_VERSION_MAJOR;
	h.version_minor = 0; /* this client implements 1.0 */
	h.eq_entries = want_eq;
	snprintf(h.client_name, sizeof(h.client_name), "sm70t_raw");
	if (send(c->sock, &h, sizeof(h), MSG_NOSIGNAL) != (ssize_t)sizeof(h))
		return -errno;
	return 0;
}

/* Waits up to timeout_ms for the daemon's answer to the hello. Returns 0 (welcomed: the
 * segment is mapped and checked), 1 (refused: c->refusal), -ETIMEDOUT, -EPIPE (closed
 * without an answer) or -EPROTO. */
static inline int sm70t_raw_finish(struct sm70t_raw *c, int timeout_ms)
{
	char buf[SM70_PROTO_MSG_MAX];
	union {
		char b[CMSG_SPACE(sizeof(int) * SM70_PROTO_N_FDS)];
		struct cmsghdr align;
	} ctl;
	struct iovec iov = { .iov_base = buf, .iov_len = sizeof(buf) };
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.b,
			      .msg_controllen = sizeof(ctl.b) };
	struct pollfd p = { .fd = c->sock, .events = POLLIN };
	struct sm70_proto_seg_hdr copy;
	struct cmsghdr *cm;
	struct stat st;
	char why[128];
	int fds[SM70_PROTO_N_FDS], memfd;
	ssize_t n;

	for (;;) {
		if (poll(&p, 1, timeout_ms) != 1)
			return -ETIMEDOUT;
		msg.msg_controllen = sizeof(ctl.b);
		n = recvmsg(c->sock, &msg, MSG_CMSG_CLOEXEC);
		if (n == 0)
			return -EPIPE;
		if (n < 16 || (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)))
			return -EPROTO;
		/* a later minor may say more before its answer (no fds): wait on */
		if (((struct sm70_proto_refusal *)buf)->type == SM70_PROTO_MSG_WELCOME ||
		    ((struct sm70_proto_refusal *)buf)->type == SM70_PROTO_MSG_REFUSAL)
			break;
	}
	if (((struct sm70_proto_refusal *)buf)->type == SM70_PROTO_MSG_REFUSAL) {
		memcpy(&c->refusal, buf, sizeof(c->refusal));
		return 1;
	}
	memcpy(&c->w, buf, sizeof(c->w));
	cm = CMSG_FIRSTHDR(&msg);
	if (c->w.type != SM70_PROTO_MSG_WELCOME || !cm || cm->cmsg_type != SCM_RIGHTS ||
	    cm->cmsg_len != CMSG_LEN(sizeof(fds)))
		return -EPROTO;
	memcpy(fds, CMSG_DATA(cm), sizeof(fds));
	memfd = fds[SM70_PROTO_FD_MEMFD];
	c->bell = fds[SM70_PROTO_FD_DOORBELL];
	c->evfd = fds[SM70_PROTO_FD_EVENT];
	if (fstat(memfd, &st) || (uint64_t)st.st_size != c->w.segment_size) {
		close(memfd);
		return -EPROTO;
	}
	c->size = c->w.segment_size;
	c->seg = mmap(NULL, c->size, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
	close(memfd);
	if (c->seg == MAP_FAILED) {
		c->seg = NULL;
		return -errno;
	}
	memcpy(&copy, c->seg, sizeof(copy));
	if (sm70_proto_layout_check(&copy, c->size, why, sizeof(why))) {
		fprintf(stderr, "raw_client: bad segment: %s\n", why);
		return -EPROTO;
	}
	c->h = c->seg;
	c->sq = sm70_proto_sq(c->seg, &copy);
	c->eq = sm70_proto_eq(c->seg, &copy);
	c->arena = sm70_proto_arena(c->seg, &copy);
	c->sq_tail = copy.sq_tail;
	c->eq_head = copy.eq_head;
	c->arena_tail = copy.arena_head;
	return 0;
}

static inline int sm70t_raw_connect(struct sm70t_raw *c, const char *path, uint32_t want_eq,
				    int timeout_ms)
{
	int ret = sm70t_raw_start(c, path, want_eq);

	return ret ? ret : sm70t_raw_finish(c, timeout_ms);
}

static inline void sm70t_raw_close(struct sm70t_raw *c)
{
	if (c->seg)
		munmap(c->seg, c->size);
	if (c->bell >= 0)
		close(c->bell);
	if (c->evfd >= 0)
		close(c->evfd);
	if (c->sock >= 0)
		close(c->sock);
	sm70t_raw_init(c);
}

/* Adds 1 to the doorbell. */
static inline void sm70t_raw_ring(struct sm70t_raw *c)
{
	uint64_t one = 1;

	if (write(c->bell, &one, sizeof(one)) != (ssize_t)sizeof(one))
		perror("raw_client: doorbell write");
}

/* Writes a greedy SUBMIT for prompt (copied into the arena) without publishing it.
 * Returns 0, or -EAGAIN when the SQ or the arena has no room now. */
static inline int sm70t_raw_submit(struct sm70t_raw *c, uint64_t tag, const uint32_t *prompt,
				   uint32_t n, uint32_t max_new, uint32_t flags)
{
	uint32_t cap = c->w.arena_tokens, pos = c->arena_tail, slot = pos & (cap - 1);
	struct sm70_proto_sqe e;

	if (c->sq_tail - sm70_ring_load_acquire(&c->h->sq_head) >= c->w.sq_entries)
		return -EAGAIN;
	if (slot + n > cap)
		pos += cap - slot;
	if ((pos + n) - sm70_ring_load_acquire(&c->h->arena_head) > cap)
		return -EAGAIN;
	memcpy(&c->arena[pos & (cap - 1)], prompt, sizeof(*prompt) * n);
	c->arena_tail = pos + n;
	memset(&e, 0, sizeof(e));
	e.size = sizeof(e);
	e.opcode = SM70_PROTO_OP_SUBMIT;
	e.flags = flags;
	e.tag = tag;
	e.arena_pos = pos;
	e.prompt_len = n;
	e.max_new_tokens = max_new;
	e.temperature = 0.0f;
	e.top_p = 1.0f;
	memcpy(&c->sq[sm70_ring_slot(c->sq_tail, c->w.sq_entries)], &e, sizeof(e));
	c->sq_tail++;
	return 0;
}

/* Publishes the entries written so far; rings the doorbell if the daemon sleeps. */
static inline void sm70t_raw_publish(struct sm70t_raw *c)
{
	sm70_ring_store_release(&c->h->sq_tail, c->sq_tail);
	if (sm70_proto_wake_needed(&c->h->daemon_sleeping))
		sm70t_raw_ring(c);
}

/* Takes the next event out of the ring without waiting and without touching the event
 * fd. Returns 1 (an event in *ev) or 0 (none). */
static inline int sm70t_raw_pop(struct sm70t_raw *c, struct sm70_proto_eqe *ev)
{
	if (sm70_ring_load_acquire(&c->h->eq_tail) == c->eq_head)
		return 0;
	memcpy(ev, &c->eq[sm70_ring_slot(c->eq_head, c->w.eq_entries)], sizeof(*ev));
	c->eq_head++;
	sm70_ring_store_release(&c->h->eq_head, c->eq_head);
	if (sm70_proto_wake_needed(&c->h->eq_space_wanted))
		sm70t_raw_ring(c);
	return 1;
}

/* Next event within timeout_ms, sleeping on the event fd as section 6 says: 0, -ETIMEDOUT,
 * or -EPIPE (the daemon hung up and nothing is left in the ring). */
static inline int sm70t_raw_next(struct sm70t_raw *c, struct sm70_proto_eqe *ev, int timeout_ms)
{
	long deadline = sm70t_raw_ms() + timeout_ms;

	for (;;) {
		struct pollfd p[2] = { { .fd = c->evfd, .events = POLLIN },
				       { .fd = c->sock, .events = POLLRDHUP } };
		uint64_t v;
		struct iovec iov = { .iov_base = &v, .iov_len = sizeof(v) };
		long left;

		if (sm70t_raw_pop(c, ev))
			return 0;
		sm70_proto_sleep_begin(&c->h->client_sleeping);
		if (sm70_ring_load_acquire(&c->h->eq_tail) != c->eq_head) {
			sm70_proto_sleep_end(&c->h->client_sleeping);
			continue;
		}
		left = deadline - sm70t_raw_ms();
		if (left <= 0) {
			sm70_proto_sleep_end(&c->h->client_sleeping);
			return -ETIMEDOUT;
		}
		poll(p, 2, (int)left);
		sm70_proto_sleep_end(&c->h->client_sleeping);
		if (p[0].revents & POLLIN)
			(void)!preadv2(c->evfd, &iov, 1, -1, RWF_NOWAIT);
		if ((p[1].revents & (POLLHUP | POLLRDHUP)) &&
		    sm70_ring_load_acquire(&c->h->eq_tail) == c->eq_head)
			return -EPIPE;
	}
}

/* Reads events until the final one of tag (FINISH or ERROR) into *final. Returns the
 * number of TOKEN events of tag seen, or a negative sm70t_raw_next error. */
static inline int sm70t_raw_wait_final(struct sm70t_raw *c, uint64_t tag,
				       struct sm70_proto_eqe *final, int timeout_ms)
{
	int tokens = 0, ret;

	for (;;) {
		ret = sm70t_raw_next(c, final, timeout_ms);
		if (ret)
			return ret;
		if (final->tag != tag)
			continue;
		if (final->type == SM70_PROTO_EV_TOKEN) {
			tokens++;
			continue;
		}
		return tokens;
	}
}

#endif
