/*
 * client.c - connecting to sm70d: the hello/welcome exchange, the fds received with
 * SCM_RIGHTS, mapping and checking the segment (PROTOCOL.md section 2), and the handle's
 * life cycle (connect, reconnect, close).
 * Non-goals: the hot path (submit.c, event.c); retry policies (the application decides).
 */
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "sdk/client_impl.h"
#include "sdk/proto_check.h"

#define DEFAULT_SPIN_US 50u

extern char *program_invocation_short_name; /* glibc, with _GNU_SOURCE */

int sm70__fail(struct sm70_client *c, int err, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(c->last_error, sizeof(c->last_error), fmt, ap);
	va_end(ap);
	return err;
}

SM70_API void sm70_connect_opts_init(struct sm70_connect_opts *opts)
{
	memset(opts, 0, sizeof(*opts));
	opts->size = sizeof(*opts);
}

SM70_API const char *sm70_client_last_error(const struct sm70_client *c)
{
	return c ? c->last_error : "no handle";
}

static void close_fd(int *fd)
{
	if (*fd >= 0)
		close(*fd);
	*fd = -1;
}

void sm70__session_close(struct sm70_client *c)
{
	if (c->uring_ok)
		io_uring_queue_exit(&c->uring); /* also cancels the pending polls */
	c->uring_ok = 0;
	c->armed_ev = c->armed_sock = 0;
	if (c->seg)
		munmap(c->seg, c->seg_size);
	c->seg = NULL;
	if (c->evfd >= 0)
		epoll_ctl(c->epfd, EPOLL_CTL_DEL, c->evfd, NULL);
	if (c->sock >= 0)
		epoll_ctl(c->epfd, EPOLL_CTL_DEL, c->sock, NULL);
	close_fd(&c->evfd);
	close_fd(&c->doorbell);
	close_fd(&c->sock); /* the daemon cancels whatever was still running */
	c->connected = 0;
	c->hung_up = 0;
	c->sleeping = 0;
}

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* Milliseconds until deadline (UINT64_MAX: none) for poll: -1, or 0..INT_MAX. */
static int ms_left(uint64_t deadline)
{
	uint64_t now = now_ms();

	if (deadline == UINT64_MAX)
		return -1;
	if (now >= deadline)
		return 0;
	return deadline - now > INT_MAX ? INT_MAX : (int)(deadline - now);
}

/* Receives the daemon's answer: one record in buf (returns its length) and up to 3 fds,
 * waiting until deadline (monotonic ms). */
static ssize_t recv_answer(struct sm70_client *c, void *buf, size_t len, int fds[3], int *n_fds,
			   uint64_t deadline)
{
	union {
		struct cmsghdr h;
		char space[CMSG_SPACE(sizeof(int) * SM70_PROTO_N_FDS)];
	} ctl;
	struct iovec iov = { .iov_base = buf, .iov_len = len };
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.space,
			      .msg_controllen = sizeof(ctl.space) };
	struct pollfd pfd = { .fd = c->sock, .events = POLLIN };
	struct cmsghdr *cm;
	ssize_t n;
	int r;

	*n_fds = 0;
	do
		r = poll(&pfd, 1, ms_left(deadline));
	while (r < 0 && errno == EINTR);
	if (r < 0)
		return sm70__fail(c, -errno, "waiting for sm70d's answer: %s", strerror(errno));
	if (r == 0)
		return sm70__fail(c, -ETIMEDOUT, "sm70d at %s did not answer the hello in %.1f s "
				  "(handshake_timeout_ms)", c->path, c->handshake_ms / 1000.0);
	do
		n = recvmsg(c->sock, &msg, MSG_CMSG_CLOEXEC);
	while (n < 0 && errno == EINTR);
	if (n < 0 && errno == ECONNRESET) {
		/* A daemon that closed with our hello unread (a refusal at accept) makes the
		 * first recv report the reset ahead of the refusal it queued: read it. */
		msg.msg_controllen = sizeof(ctl.space);
		n = recvmsg(c->sock, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
		if (n < 0)
			errno = ECONNRESET;
	}
	if (n < 0)
		return sm70__fail(c, -errno, "receiving sm70d's answer: %s", strerror(errno));
	/* Collect every fd first, so that each one is closed on any error below. */
	for (cm = CMSG_FIRSTHDR(&msg); cm; cm = CMSG_NXTHDR(&msg, cm)) {
		size_t k, cnt;

		if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
			continue;
		cnt = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		for (k = 0; k < cnt; k++) {
			int fd;

			memcpy(&fd, CMSG_DATA(cm) + k * sizeof(int), sizeof(int));
			if (*n_fds < SM70_PROTO_N_FDS)
				fds[(*n_fds)++] = fd;
			else
				close(fd);
		}
	}
	if (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC))
		return sm70__fail(c, -EPROTO, "sm70d's answer was truncated (broken daemon?)");
	if (n == 0)
		return sm70__fail(c, -ECONNRESET, "sm70d closed the connection without an answer");
	return n;
}

static void fmt_gib(char *b, size_t n, uint64_t v)
{
	snprintf(b, n, "%.1f GiB", (double)v / (double)(1ull << 30));
}

/* The handshake timed out after the daemon said it was loading: -SM70_E_LOADING. */
static int still_loading(struct sm70_client *c)
{
	const struct sm70_proto_loading *l = &c->loading;
	char done[32], total[32], pct[16] = "";

	fmt_gib(done, sizeof(done), l->bytes_done);
	fmt_gib(total, sizeof(total), l->bytes_total);
	if (l->bytes_total)
		snprintf(pct, sizeof(pct), "%.0f%%, ", l->bytes_done >= l->bytes_total ? 100.0 :
			 100.0 * (double)l->bytes_done / (double)l->bytes_total);
	return sm70__fail(c, -SM70_E_LOADING, "sm70d at %s is still loading its model %.63s "
			  "(%s%s of %s after %u s); waited %.1f s (handshake_timeout_ms): retry",
			  c->path, l->model_name, pct, done, l->bytes_total ? total : "?",
			  l->elapsed_ms / 1000, c->handshake_ms / 1000.0);
}

/* Sends the hello record of PROTOCOL.md section 4.1. */
static int send_hello(struct sm70_client *c)
{
	struct sm70_proto_hello h;
	ssize_t n;

	memset(&h, 0, sizeof(h));
	h.size = sizeof(h);
	h.magic = SM70_PROTO_MAGIC;
	h.type = SM70_PROTO_MSG_HELLO;
	h.version_major = SM70_PROTO_VERSION_MAJOR;
	h.version_minor = SM70_PROTO_VERSION_MINOR;
	h.sq_entries = c->want_sq;
	h.eq_entries = c->want_eq;
	h.arena_tokens = c->want_arena;
	memcpy(h.client_name, c->name, sizeof(h.client_name));
	do
		n = send(c->sock, &h, sizeof(h), MSG_NOSIGNAL);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return sm70__fail(c, -errno, "sending the hello to sm70d: %s", strerror(errno));
	if ((size_t)n != sizeof(h))
		return sm70__fail(c, -EPROTO, "short send of the hello");
	return 0;
}

/* Turns a REFUSAL record into the handle's error. */
static int refused(struct sm70_client *c, const unsigned char *buf, size_t n)
{
	struct sm70_proto_refusal r;
	int code;

	memset(&r, 0, sizeof(r));
	memcpy(&r, buf, n < sizeof(r) ? n : sizeof(r));
	r.reason[sizeof(r.reason) - 1] = '\0';
	code = r.result > 0 && r.result < 1000 ? r.result : SM70_PROTO_E_INTERNAL;
	return sm70__fail(c, -(SM70_E_BASE + code), "sm70d refused the connection (%s): %s",
			  sm70_proto_strerror(code), r.reason[0] ? r.reason : "no reason given");
}

/* The welcome's layout must be the segment header's, field by field. */
static int welcome_matches(const struct sm70_proto_welcome *w, const struct sm70_proto_seg_hdr *h)
{
	return w->segment_size == h->total_size && w->sq_offset == h->sq_offset &&
	       w->eq_offset == h->eq_offset && w->arena_offset == h->arena_offset &&
	       w->sq_entries == h->sq_entries && w->eq_entries == h->eq_entries &&
	       w->arena_tokens == h->arena_tokens && w->session_id == h->session_id;
}

/* Maps the memfd and checks the header (steps 5-7 of PROTOCOL.md section 2). */
static int map_segment(struct sm70_client *c, int memfd, const struct sm70_proto_welcome *w)
{
	char why[SM70_PROTO_ERRMSG_LEN];
	struct stat st;
	int ret;

	if (fstat(memfd, &st) < 0)
		return sm70__fail(c, -errno, "fstat of the segment: %s", strerror(errno));
	if (w->segment_size == 0 || w->segment_size > SIZE_MAX ||
	    (uint64_t)st.st_size != w->segment_size)
		return sm70__fail(c, -EPROTO, "segment size %lld differs from the welcome's %llu",
				  (long long)st.st_size, (unsigned long long)w->segment_size);
	c->seg = mmap(NULL, (size_t)w->segment_size, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
	if (c->seg == MAP_FAILED) {
		c->seg = NULL;
		return sm70__fail(c, -errno, "mapping the segment: %s", strerror(errno));
	}
	c->seg_size = (size_t)w->segment_size;
	memcpy(&c->hdr, c->seg, sizeof(c->hdr));
	ret = sm70__proto_layout_check(&c->hdr, w->segment_size, why, sizeof(why));
	if (ret == -SM70_PROTO_E_VERSION)
		return sm70__fail(c, -SM70_E_VERSION, "segment header: %s", why);
	if (ret)
		return sm70__fail(c, -EPROTO, "bad segment header from sm70d: %s", why);
	if (!welcome_matches(w, &c->hdr))
		return sm70__fail(c, -EPROTO, "the segment header and the welcome disagree");
	sm70__rings_init(&c->rings, c->seg, &c->hdr);
	/* sq_tail == sq_head and eq_head == eq_tail at the start of a session */
	if (c->rings.sq_tail != sm70_ring_load_acquire(&c->rings.hdr->sq_head) ||
	    sm70__eq_pending(&c->rings) != 0)
		return sm70__fail(c, -EPROTO, "the new segment's rings are not empty");
	return 0;
}

int sm70__session_open(struct sm70_client *c)
{
	unsigned char buf[SM70_PROTO_MSG_MAX];
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct sm70_proto_welcome w;
	struct epoll_event ee = { .events = EPOLLIN };
	int fds[SM70_PROTO_N_FDS] = { -1, -1, -1 }, n_fds = 0, ret, i;
	uint64_t deadline;
	uint32_t magic;
	uint16_t type, major;
	ssize_t n;

	c->last_error[0] = '\0';
	c->loading_seen = 0;
	memset(&c->loading, 0, sizeof(c->loading));
	c->sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (c->sock < 0)
		return sm70__fail(c, -errno, "socket: %s", strerror(errno));
	memcpy(sa.sun_path, c->path, sizeof(sa.sun_path));
	if (connect(c->sock, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		ret = -errno;
		sm70__fail(c, ret, "cannot connect to %s: %s%s", c->path, strerror(errno),
			   ret == -ENOENT || ret == -ECONNREFUSED ? " (is sm70d running?)" : "");
		goto fail;
	}
	ret = send_hello(c);
	/* A daemon that refuses this uid answers at accept and closes, possibly before the
	 * hello was sent (PROTOCOL.md section 2): its REFUSAL is still waiting to be read. */
	if (ret && ret != -EPIPE && ret != -ECONNRESET)
		goto fail;
	/* A daemon loading its model sends LOADING messages (protocol 1.1) until the welcome. */
	deadline = c->handshake_ms == UINT32_MAX ? UINT64_MAX : now_ms() + c->handshake_ms;
	for (;;) {
		n = recv_answer(c, buf, sizeof(buf), fds, &n_fds, deadline);
		if (n == -ETIMEDOUT && c->loading_seen)
			n = still_loading(c);
		if (n < 0) {
			ret = (int)n;
			goto fail;
		}
		if (n < (ssize_t)sizeof(c->loading))
			break;
		memcpy(&magic, buf + 4, sizeof(magic));
		memcpy(&type, buf + 8, sizeof(type));
		if (magic != SM70_PROTO_MAGIC || type != SM70_PROTO_MSG_LOADING)
			break;
		memcpy(&c->loading, buf, sizeof(c->loading));
		c->loading.model_name[sizeof(c->loading.model_name) - 1] = '\0';
		c->loading_seen = 1;
		for (i = 0; i < n_fds; i++) /* it carries none; a broken daemon's are closed */
			close_fd(&fds[i]);
	}
	ret = sm70__fail(c, -EPROTO, "sm70d sent a malformed answer (%zd bytes)", n);
	if (n < 14)
		goto fail;
	/* The first 14 bytes are frozen across versions: read them before anything else. */
	memcpy(&magic, buf + 4, sizeof(magic));
	memcpy(&type, buf + 8, sizeof(type));
	memcpy(&major, buf + 10, sizeof(major));
	if (magic != SM70_PROTO_MAGIC)
		goto fail;
	if (type == SM70_PROTO_MSG_REFUSAL) {
		ret = refused(c, buf, (size_t)n);
		goto fail;
	}
	if (type != SM70_PROTO_MSG_WELCOME)
		goto fail;
	if (major != SM70_PROTO_VERSION_MAJOR) {
		ret = sm70__fail(c, -SM70_E_VERSION, "sm70d speaks protocol %u.x and this "
				 "libsm70client speaks %d.x, and it did not refuse the hello",
				 major, SM70_PROTO_VERSION_MAJOR);
		goto fail;
	}
	if ((size_t)n < sizeof(w))
		goto fail;
	memcpy(&w, buf, sizeof(w));
	if (w.size < sizeof(w) || w.n_fds != SM70_PROTO_N_FDS || n_fds != SM70_PROTO_N_FDS ||
	    w.result != SM70_PROTO_OK)
		goto fail;
	memcpy(c->model_name, w.model_name, sizeof(c->model_name));
	c->model_name[sizeof(c->model_name) - 1] = '\0';
	ret = map_segment(c, fds[SM70_PROTO_FD_MEMFD], &w);
	if (ret)
		goto fail;
	close_fd(&fds[SM70_PROTO_FD_MEMFD]); /* the mapping keeps the segment */
	c->doorbell = fds[SM70_PROTO_FD_DOORBELL];
	c->evfd = fds[SM70_PROTO_FD_EVENT];
	fds[SM70_PROTO_FD_DOORBELL] = fds[SM70_PROTO_FD_EVENT] = -1;

	ret = io_uring_queue_init(4, &c->uring, 0);
	if (ret) {
		sm70__fail(c, ret, "io_uring_queue_init: %s", strerror(-ret));
		goto fail;
	}
	c->uring_ok = 1;
	/* The application's descriptor: readable on events and on the daemon's hang-up. */
	ee.data.fd = c->evfd;
	if (epoll_ctl(c->epfd, EPOLL_CTL_ADD, c->evfd, &ee) < 0)
		goto fail_errno;
	ee.events = EPOLLIN | EPOLLRDHUP;
	ee.data.fd = c->sock;
	if (epoll_ctl(c->epfd, EPOLL_CTL_ADD, c->sock, &ee) < 0)
		goto fail_errno;
	/* Start "asleep": an application that polls sm70_event_fd before its first
	 * sm70_next_event call must still be woken by the first event. */
	sm70_proto_sleep_begin(&c->rings.hdr->client_sleeping);
	c->sleeping = 1;
	c->connected = 1;
	pthread_mutex_lock(&c->lock);
	c->dead = 0;
	pthread_mutex_unlock(&c->lock);
	c->last_error[0] = '\0';
	return 0;

fail_errno:
	ret = sm70__fail(c, -errno, "epoll_ctl: %s", strerror(errno));
fail:
	for (i = 0; i < SM70_PROTO_N_FDS; i++)
		close_fd(&fds[i]);
	sm70__session_close(c);
	return ret;
}

/* Picks the socket path: the argument, else $SM70_SOCKET, else the default. */
static int set_path(struct sm70_client *c, const char *socket_path)
{
	const char *p = socket_path;

	if (!p || !*p)
		p = getenv("SM70_SOCKET");
	if (!p || !*p)
		p = SM70_DEFAULT_SOCKET;
	if (strlen(p) >= sizeof(c->path))
		return -ENAMETOOLONG;
	strcpy(c->path, p);
	return 0;
}

/* Copies a printable, NUL-padded client name for the daemon's logs. */
static void set_name(struct sm70_client *c, const char *name)
{
	size_t i;

	if (!name)
		name = program_invocation_short_name ? program_invocation_short_name : "";
	memset(c->name, 0, sizeof(c->name));
	for (i = 0; i + 1 < sizeof(c->name) && name[i]; i++)
		c->name[i] = name[i] >= 0x20 && name[i] < 0x7f ? name[i] : '?';
}

static int opts_ok(const struct sm70_connect_opts *o)
{
	const unsigned char *p = (const unsigned char *)o;
	size_t i;

	if (o->size < sizeof(*o))
		return 0;
	/* A newer caller's extra bytes must be zero: we cannot honour what we do not know. */
	for (i = sizeof(*o); i < o->size; i++)
		if (p[i])
			return 0;
	for (i = 0; i < sizeof(o->reserved) / sizeof(o->reserved[0]); i++)
		if (o->reserved[i])
			return 0;
	return 1;
}

SM70_API int sm70_client_connect(struct sm70_client **out, const char *socket_path,
				 const struct sm70_connect_opts *opts)
{
	struct sm70_client *c;
	int ret;

	if (!out)
		return -EINVAL;
	*out = NULL;
	if (opts && !opts_ok(opts))
		return -EINVAL;
	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->sock = c->doorbell = c->evfd = -1;
	c->next_id = 1;
	ret = set_path(c, socket_path);
	if (ret)
		goto err_free;
	set_name(c, opts ? opts->client_name : NULL);
	if (opts) {
		c->want_sq = opts->sq_entries;
		c->want_eq = opts->eq_entries;
		c->want_arena = opts->arena_tokens;
		c->spin_us = opts->spin_us;
		c->handshake_ms = opts->handshake_timeout_ms;
	}
	if (!c->handshake_ms)
		c->handshake_ms = SM70_DEFAULT_HANDSHAKE_TIMEOUT_MS;
	if (!c->spin_us)
		c->spin_us = DEFAULT_SPIN_US;
	ret = -pthread_mutex_init(&c->lock, NULL);
	if (ret)
		goto err_free;
	ret = -pthread_mutex_init(&c->tok_lock, NULL);
	if (ret)
		goto err_mutex;
	c->epfd = epoll_create1(EPOLL_CLOEXEC);
	if (c->epfd < 0) {
		ret = -errno;
		pthread_mutex_destroy(&c->tok_lock);
		goto err_mutex;
	}
	*out = c;
	/* From here the handle exists even if the daemon does not answer: the caller can read
	 * last_error and retry with sm70_client_reconnect. */
	return sm70__session_open(c);

err_mutex:
	pthread_mutex_destroy(&c->lock);
err_free:
	free(c);
	return ret;
}

SM70_API int sm70_client_reconnect(struct sm70_client *c)
{
	int ret;

	if (!c)
		return -EINVAL;
	if (c->connected) {
		ret = sm70__end_live_jobs(c, -ECONNRESET,
					  "the session was dropped by sm70_client_reconnect");
		if (ret)
			return ret;
		sm70__session_close(c);
	}
	return sm70__session_open(c);
}

SM70_API void sm70_client_close(struct sm70_client *c)
{
	if (!c)
		return;
	sm70__session_close(c);
	close(c->epfd);
	sm70__text_close(c);
	pthread_mutex_destroy(&c->tok_lock);
	pthread_mutex_destroy(&c->lock);
	free(c->jobs);
	free(c->held);
	free(c);
}

SM70_API int sm70_client_info(const struct sm70_client *c, struct sm70_client_info *info)
{
	const struct sm70_proto_limits *l;

	if (!c || !info || info->size < sizeof(*info))
		return -EINVAL;
	if (!c->connected)
		return -ENOTCONN;
	l = &c->hdr.limits;
	memset(info, 0, sizeof(*info));
	info->size = sizeof(*info);
	info->session_id = c->hdr.session_id;
	info->proto_major = c->hdr.version_major;
	info->proto_minor = c->hdr.version_minor;
	info->sq_entries = c->hdr.sq_entries;
	info->eq_entries = c->hdr.eq_entries;
	info->arena_tokens = c->hdr.arena_tokens;
	info->limits = (struct sm70_limits){
		.max_jobs_in_flight = l->max_jobs_in_flight,
		.max_prompt_tokens = l->max_prompt_tokens,
		.max_new_tokens = l->max_new_tokens,
		.max_context_tokens = l->max_context_tokens,
		.max_top_logprobs = l->max_top_logprobs,
		.max_priority = l->max_priority,
		.vocab_size = l->vocab_size,
		.slow_consumer_ms = l->slow_consumer_ms,
	};
	memcpy(info->model_name, c->model_name, sizeof(info->model_name));
	return 0;
}

SM70_API int sm70_client_loading(const struct sm70_client *c, struct sm70_loading *out)
{
	if (!c || !out || out->size < sizeof(*out))
		return -EINVAL;
	memset(out, 0, sizeof(*out));
	out->size = sizeof(*out);
	if (!c->loading_seen)
		return 0;
	out->bytes_done = c->loading.bytes_done;
	out->bytes_total = c->loading.bytes_total;
	out->elapsed_ms = c->loading.elapsed_ms;
	memcpy(out->model_name, c->loading.model_name, sizeof(c->loading.model_name));
	out->model_name[sizeof(out->model_name) - 1] = '\0';
	return 1;
}
