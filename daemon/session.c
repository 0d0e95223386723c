/*
 * session.c - the listening socket, the handshake, the shared segment and both rings; see
 * session.h and docs/PROTOCOL.md.
 *
 * Trust boundary: everything in the segment is written by a client that may be hostile.
 * Submission entries and prompts are copied once into private memory (memcpy, then a
 * compiler barrier so that no later read can go back to the shared copy) and only the
 * copies are checked and used. Indices the client writes (sq_tail, eq_head) are read once
 * per use and checked against the ring size; a value that breaks the ring rules ends the
 * session, never the daemon. Nothing here blocks: the sockets are the daemon's own
 * non-blocking descriptions; the eventfds are shared with the client, who can clear their
 * O_NONBLOCK and set their counters, so the doorbell is read with RWF_NOWAIT and the event
 * fd is only written through the loop's waker (io_uring); a full event ring holds events
 * back instead of waiting.
 *
 * Descriptors: a connection is let in only while the daemon holds the four descriptors a
 * session needs (SESSION_FDS); when it cannot get them, accepting pauses until some are
 * released (docs/DAEMON.md, "Sessions").
 */
#include "daemon/session.h"
#include "daemon/unix_socket.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include "daemon/log.h"
#include "daemon/scheduler.h"
#include "shm_proto/sm70_validate.h"

/* After copying out of shared memory: the compiler may not satisfy a later read of the
 * private copy by reading the shared bytes again (which the client may have changed). */
#define SHM_BARRIER() __asm__ __volatile__("" ::: "memory")

/* Bounds for the ring sizes a hello may ask for. */
#define SQ_MIN 8u
#define SQ_MAX 4096u
#define EQ_MIN 16u
#define EQ_MAX 65536u
#define ARENA_MIN 1024u
#define ARENA_MAX (1u << 24)

/* Descriptors one session holds at its peak: the socket, then during the welcome the memfd
 * and the two eventfds (the memfd is closed once sent). */
#define SESSION_FDS 4
/* While accepting is paused for lack of descriptors: how often to try again even if no
 * session released any (another part of the daemon, or another process, may have). */
#define ACCEPT_RETRY_MS 100
/* The least a session may hold however many share slow_consumer_events_total: a full
 * batch of tokens and the final events of a session's jobs fit, so a client that reads
 * with a little lag is not cut off just because many others are connected. */
#define HELD_MIN 64u
/* An emptied FIFO larger than this is freed, so that memory a burst took goes back. */
#define HELD_KEEP 64u

static void on_sock(void *arg, int fd, uint32_t revents);
static void on_doorbell(void *arg, int fd, uint32_t revents);

/* ---- listening -------------------------------------------------------------------- */

static void on_listen(void *arg, int fd, uint32_t revents);

int sm70__listener_open(struct sm70__daemon *d, struct sm70_err *err)
{
	int n, i, fd = -1, ret;

	d->fd_template = -1;
	d->n_fd_spare = 0;
	d->accept_paused = 0;
	n = sd_listen_fds(1);
	if (n < 0)
		return sm70_errf(err, n, "sd_listen_fds: %s", strerror(-n));
	for (i = 0; i < n; i++) {
		int cand = SD_LISTEN_FDS_START + i;

		if (sd_is_socket_unix(cand, SOCK_SEQPACKET, 1, NULL, 0) > 0) {
			fd = cand;
			break;
		}
	}
	if (n > 0 && fd < 0)
		return sm70_errf(err, -EINVAL, "systemd passed %d fds but none is a listening "
				 "AF_UNIX SOCK_SEQPACKET socket", n);
	if (fd >= 0) {
		int fl = fcntl(fd, F_GETFL);

		if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) ||
		    fcntl(fd, F_SETFD, FD_CLOEXEC))
			return sm70_errf(err, -errno, "fcntl on the socket from systemd: %s",
					 strerror(errno));
		sm70__info("using the listening socket passed by systemd (fd %d)", fd);
		d->listen_unlink = 0;
	} else {
		fd = sm70__unix_listen(d->cfg.socket_path, d->cfg.socket_mode, 128, err);
		if (fd < 0)
			return fd;
		d->listen_unlink = 1;
		sm70__info("listening on %s (mode %04o)", d->cfg.socket_path, d->cfg.socket_mode);
	}
	d->listen_fd = fd;
	d->held_bound = d->cfg.slow_consumer_events; /* until the first poll computes it */
	d->fd_template = eventfd(0, EFD_CLOEXEC);
	if (d->fd_template < 0) {
		ret = -errno;
		sm70__listener_close(d);
		return sm70_errf(err, ret, "eventfd for the descriptor reserve: %s",
				 strerror(-ret));
	}
	ret = sm70__loop_watch(d->loop, fd, POLLIN, on_listen, d, &d->listen_watch);
	if (ret) {
		sm70__listener_close(d);
		return sm70_errf(err, ret, "cannot watch the listening socket: %s",
				 strerror(-ret));
	}
	return 0;
}

void sm70__listener_close(struct sm70__daemon *d)
{
	if (d->listen_fd < 0)
		return;
	while (d->n_fd_spare)
		close(d->fd_spare[--d->n_fd_spare]);
	if (d->fd_template >= 0)
		close(d->fd_template);
	d->fd_template = -1;
	sm70__loop_unwatch(d->loop, d->listen_watch);
	d->listen_watch = NULL;
	close(d->listen_fd);
	d->listen_fd = -1;
	if (d->listen_unlink)
		unlink(d->cfg.socket_path);
	d->listen_unlink = 0;
}

/* Tops the reserve up to SESSION_FDS spare descriptors. Returns 0, or -errno (EMFILE,
 * ENFILE) with what it could get kept. */
static int spares_fill(struct sm70__daemon *d)
{
	while (d->n_fd_spare < SESSION_FDS) {
		int fd = fcntl(d->fd_template, F_DUPFD_CLOEXEC, 0);

		if (fd < 0)
			return -errno;
		d->fd_spare[d->n_fd_spare++] = fd;
	}
	return 0;
}

/* Gives a session's spares back to the kernel: just before the welcome creates the
 * descriptors they were kept for, or when the session ends before it. */
static void session_spares_release(struct sm70__session *s)
{
	while (s->n_spare)
		close(s->spare_fds[--s->n_spare]);
}

static void accept_pause(struct sm70__daemon *d, int err)
{
	if (!d->accept_paused)
		sm70__warn("accept: %s: new connections wait in the backlog until descriptors are "
			   "released (retrying every %d ms)", strerror(err), ACCEPT_RETRY_MS);
	d->accept_paused = 1;
	d->fds_released = 0;
	d->accept_retry_us = d->now_us + (uint64_t)ACCEPT_RETRY_MS * 1000;
}

/* ---- per-uid counts ---------------------------------------------------------------- */

/* The uid's counts, made on its first session object; takes a reference. NULL: no
 * memory. */
static struct sm70__uid_use *uid_use_get(struct sm70__daemon *d, uint32_t uid)
{
	struct sm70__uid_use *u;

	for (u = d->uid_use; u; u = u->next)
		if (u->uid == uid)
			break;
	if (!u) {
		u = calloc(1, sizeof(*u));
		if (!u)
			return NULL;
		u->uid = uid;
		u->next = d->uid_use;
		d->uid_use = u;
	}
	u->refs++;
	return u;
}

/* Drops a reference; the last one frees the counts. */
static void uid_use_put(struct sm70__daemon *d, struct sm70__uid_use *u)
{
	if (!u || --u->refs)
		return;
	for (struct sm70__uid_use **pp = &d->uid_use; *pp; pp = &(*pp)->next)
		if (*pp == u) {
			*pp = u->next;
			break;
		}
	free(u);
}

/* The config's limits for the peer of fd: its uid's and groups' overrides applied (the
 * groups from SO_PEERGROUPS, only when an override names a group). */
static void peer_limits(const struct sm70__daemon *d, int fd, const struct ucred *cred,
			struct sm70__cfg_limits *out)
{
	uint32_t gids[257];
	gid_t groups[256];
	socklen_t len = sizeof(groups);
	uint32_t n = 0;
	int want_groups = 0, which;

	for (uint32_t i = 0; i < d->cfg.n_overrides; i++)
		want_groups |= d->cfg.overrides[i].n_gids > 0;
	gids[n++] = (uint32_t)cred->gid;
	if (want_groups && !getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups, &len))
		for (size_t i = 0; i < len / sizeof(gid_t) && n < 257; i++)
			gids[n++] = (uint32_t)groups[i];
	which = sm70__config_limits_for(&d->cfg, (uint32_t)cred->uid, gids, n, out);
	if (which >= 0)
		sm70__debug("uid %u: limits from overrides[%d]", (unsigned)cred->uid, which);
}

/* Fills a REFUSAL record (PROTOCOL.md section 4.3) and sends it without waiting. */
static void refusal_send(struct sm70__daemon *d, int fd, int code, const char *reason,
			 struct sm70_proto_refusal *r)
{
	memset(r, 0, sizeof(*r));
	r->size = sizeof(*r);
	r->magic = SM70_PROTO_MAGIC;
	r->type = SM70_PROTO_MSG_REFUSAL;
	r->version_major = SM70_PROTO_VERSION_MAJOR;
	r->version_minor = SM70_PROTO_VERSION_MINOR;
	r->result = code;
	snprintf(r->reason, sizeof(r->reason), "%s", reason);
	sm70__metrics_client_error(&d->metrics, code);
	if (send(fd, r, sizeof(*r), MSG_NOSIGNAL | MSG_DONTWAIT) < 0)
		sm70__debug("cannot send a refusal: %s", strerror(errno));
}

/*
 * Closes a connection whose peer may still be sending (its hello). An AF_UNIX socket closed
 * with records unread makes the peer's next recv fail with ECONNRESET ahead of the records
 * queued for it (the refusal); after shutdown nothing more can be queued, so draining first
 * leaves the peer its refusal, then end of file.
 */
static void close_unread(int fd)
{
	char c;

	shutdown(fd, SHUT_RDWR);
	while (recv(fd, &c, sizeof(c), MSG_DONTWAIT) > 0)
		;
	close(fd);
}

/*
 * Takes one connection off the listening socket. The peer's credentials are checked
 * first, before anything is allocated for it: a uid the config does not let in gets its
 * REFUSAL and is closed at once, so it cannot hold daemon descriptors for the hello window.
 * Returns 1 (taken, refused or dropped: try the next), 0 (the backlog is empty, or accept
 * failed in a way retrying now would not mend) or -errno (out of descriptors or memory:
 * accepting pauses).
 */
static int accept_one(struct sm70__daemon *d, int lfd)
{
	struct sm70_proto_refusal r;
	struct sm70__session *s;
	struct ucred cred;
	socklen_t len = sizeof(cred);
	char why[160];
	int fd, ret;

	ret = spares_fill(d);
	if (ret)
		return ret;
	/* The socket takes the place of one spare, the session keeps the other three for
	 * its welcome. */
	close(d->fd_spare[--d->n_fd_spare]);
	fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
	if (fd < 0) {
		ret = errno;
		if (ret == EAGAIN)
			return 0;
		if (ret == EMFILE || ret == ENFILE || ret == ENOBUFS || ret == ENOMEM)
			return -ret;
		if (ret == EINTR || ret == ECONNABORTED || ret == EPROTO)
			return 1; /* that connection is gone; the next one may be fine */
		sm70__warn("accept: %s", strerror(ret));
		return 0;
	}
	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len)) {
		sm70__warn("dropping a connection: SO_PEERCRED: %s", strerror(errno));
		close(fd);
		return 1;
	}
	if (!sm70__peer_allowed(fd, cred.uid, cred.gid, d->cfg.allowed_uids,
				 d->cfg.n_allowed_uids, d->cfg.allowed_gids, d->cfg.n_allowed_gids)) {
		snprintf(why, sizeof(why), "uid %u (gid %u) may not use this sm70d: ask its "
			 "administrator to add the uid to allowed_uids or a group to allowed_gids",
			 (unsigned)cred.uid, (unsigned)cred.gid);
		refusal_send(d, fd, SM70_PROTO_E_DENIED, why, &r);
		sm70__notice("connection from pid %d uid %u: refused (%s): %s", (int)cred.pid,
			     (unsigned)cred.uid, sm70_proto_strerror(SM70_PROTO_E_DENIED), why);
		close_unread(fd);
		return 1;
	}
	s = calloc(1, sizeof(*s));
	if (s)
		s->use = uid_use_get(d, cred.uid);
	if (!s || !s->use) {
		sm70__warn("dropping a connection: no memory");
		free(s);
		close(fd);
		return 1;
	}
	peer_limits(d, fd, &cred, &s->cfg_limits);
	s->d = d;
	s->id = ++d->next_session_id;
	s->state = SM70__SESSION_HELLO;
	s->sock = fd;
	s->doorbell_fd = s->event_fd = -1;
	s->uid = cred.uid;
	s->gid = cred.gid;
	s->pid = cred.pid;
	s->t_accept_us = d->now_us;
	while (s->n_spare < (int)(sizeof(s->spare_fds) / sizeof(s->spare_fds[0])) &&
	       d->n_fd_spare)
		s->spare_fds[s->n_spare++] = d->fd_spare[--d->n_fd_spare];
	if (sm70__loop_watch(d->loop, fd, POLLIN | POLLRDHUP, on_sock, s, &s->sock_watch)) {
		sm70__warn("dropping a connection: cannot watch it");
		session_spares_release(s);
		uid_use_put(d, s->use);
		free(s);
		close(fd);
		return 1;
	}
	s->next = d->sessions;
	d->sessions = s;
	d->n_sessions++;
	sm70__debug("session %u: connection from pid %d uid %u", s->id, (int)s->pid,
		    (unsigned)s->uid);
	return 1;
}

/* Accepts every queued connection it has descriptors for; pauses accepting when it runs
 * out, resumes it (paused = 0) once the backlog is empty. */
static void accept_all(struct sm70__daemon *d)
{
	int ret;

	while ((ret = accept_one(d, d->listen_fd)) > 0)
		;
	if (ret < 0) {
		accept_pause(d, -ret);
		return;
	}
	if (d->accept_paused)
		sm70__info("accepting again: the backlog is empty");
	d->accept_paused = 0;
}

static void on_listen(void *arg, int lfd, uint32_t revents)
{
	(void)lfd;
	(void)revents;
	accept_all(arg);
}

/* ---- the handshake ---------------------------------------------------------------- */

static void refuse(struct sm70__daemon *d, struct sm70__session *s, int code, const char *fmt,
		   ...) __attribute__((format(printf, 4, 5)));

static void refuse(struct sm70__daemon *d, struct sm70__session *s, int code, const char *fmt,
		   ...)
{
	struct sm70_proto_refusal r;
	char why[sizeof(r.reason)];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(why, sizeof(why), fmt, ap);
	va_end(ap);
	refusal_send(d, s->sock, code, why, &r);
	sm70__notice("session %u (pid %d uid %u): refused (%s): %s", s->id, (int)s->pid,
		     (unsigned)s->uid, sm70_proto_strerror(code), r.reason);
	sm70__session_close(d, s, 0, "refused");
}

static uint32_t ring_size(uint32_t want, uint32_t dflt, uint32_t lo, uint32_t hi)
{
	uint32_t v = want ? want : dflt, p = 1;

	if (v > hi)
		v = hi;
	while (p < v)
		p <<= 1;
	if (p < lo)
		p = lo;
	if (p > hi)
		p = hi; /* hi is a power of two */
	return p;
}

static uint32_t min_u32(uint32_t a, uint32_t b)
{
	return a < b ? a : b;
}

/* The model directory as clients see it (protocol 1.2): absolute, so that it means the same
 * from the client's working directory; "" when it does not fit. */
static void model_dir_for_client(const struct sm70__daemon *d, char out[SM70_PROTO_MODEL_DIR_LEN])
{
	char *abs = realpath(d->cfg.model_dir, NULL);

	memset(out, 0, SM70_PROTO_MODEL_DIR_LEN);
	if (abs && strlen(abs) < SM70_PROTO_MODEL_DIR_LEN)
		memcpy(out, abs, strlen(abs));
	free(abs);
}

/* Creates the segment and the eventfds, sends the welcome. Returns 0 or -errno (the caller
 * refuses the client). */
static int welcome(struct sm70__daemon *d, struct sm70__session *s,
		   const struct sm70_proto_hello *h)
{
	struct sm70_proto_seg_hdr hdr;
	struct sm70_proto_welcome w;
	struct sm70_proto_limits lim;
	union {
		char buf[CMSG_SPACE(sizeof(int) * SM70_PROTO_N_FDS)];
		struct cmsghdr align;
	} ctl;
	struct iovec iov = { .iov_base = &w, .iov_len = sizeof(w) };
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf,
			      .msg_controllen = sizeof(ctl.buf) };
	struct cmsghdr *cm;
	uint32_t sq, eq, ar;
	char memname[32];
	int memfd = -1, ret, fds[SM70_PROTO_N_FDS];
	void *seg = MAP_FAILED;

	sq = ring_size(h->sq_entries, d->cfg.rings.sq_entries, SQ_MIN, SQ_MAX);
	eq = ring_size(h->eq_entries, d->cfg.rings.eq_entries, EQ_MIN, EQ_MAX);
	ar = ring_size(h->arena_tokens, d->cfg.rings.arena_tokens, ARENA_MIN, ARENA_MAX);

	memset(&lim, 0, sizeof(lim));
	lim.max_jobs_in_flight = s->cfg_limits.max_jobs_in_flight;
	lim.max_prompt_tokens = min_u32(min_u32(s->cfg_limits.max_prompt_tokens, ar),
					d->max_position - 1);
	lim.max_new_tokens = s->cfg_limits.max_new_tokens;
	lim.max_context_tokens = d->cfg.limits.max_context_tokens ?
		min_u32(d->cfg.limits.max_context_tokens, d->max_position) : d->max_position;
	lim.max_top_logprobs = min_u32(d->cfg.limits.max_top_logprobs, SM70_PROTO_MAX_TOP);
	lim.max_priority = s->cfg_limits.max_priority;
	lim.vocab_size = d->vocab_size;
	lim.slow_consumer_ms = d->cfg.slow_consumer_ms;

	ret = sm70_proto_layout_init(&hdr, sq, eq, ar, d->cfg.rings.start_index);
	if (ret)
		return -EINVAL;
	hdr.session_id = s->id;
	hdr.limits = lim;
	model_dir_for_client(d, hdr.model_dir);

	snprintf(memname, sizeof(memname), "sm70-session-%u", s->id);
	session_spares_release(s); /* they were kept for the three descriptors made here */
	memfd = memfd_create(memname, MFD_ALLOW_SEALING | MFD_CLOEXEC);
	if (memfd < 0) {
		ret = -errno;
		goto fail;
	}
	if (ftruncate(memfd, (off_t)hdr.total_size)) {
		ret = -errno;
		goto fail;
	}
	seg = mmap(NULL, hdr.total_size, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
	if (seg == MAP_FAILED) {
		ret = -errno;
		goto fail;
	}
	memcpy(seg, &hdr, sizeof(hdr));
	/* Until the loop says otherwise the client rings: the daemon may be blocked now. */
	((struct sm70_proto_seg_hdr *)seg)->daemon_sleeping = 1;
	if (fcntl(memfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)) {
		ret = -errno;
		goto fail;
	}
	s->doorbell_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	s->event_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (s->doorbell_fd < 0 || s->event_fd < 0) {
		ret = -errno;
		goto fail;
	}
	ret = sm70__loop_waker_create(d->loop, s->event_fd, &s->event_waker);
	if (ret)
		goto fail;

	memset(&w, 0, sizeof(w));
	w.size = sizeof(w);
	w.magic = SM70_PROTO_MAGIC;
	w.type = SM70_PROTO_MSG_WELCOME;
	w.version_major = SM70_PROTO_VERSION_MAJOR;
	w.version_minor = SM70_PROTO_VERSION_MINOR;
	w.n_fds = SM70_PROTO_N_FDS;
	w.result = SM70_PROTO_OK;
	w.session_id = s->id;
	w.segment_size = hdr.total_size;
	w.sq_offset = hdr.sq_offset;
	w.eq_offset = hdr.eq_offset;
	w.arena_offset = hdr.arena_offset;
	w.sq_entries = sq;
	w.eq_entries = eq;
	w.arena_tokens = ar;
	w.limits = lim;
	snprintf(w.model_name, sizeof(w.model_name), "%s", d->model_name);

	fds[SM70_PROTO_FD_MEMFD] = memfd;
	fds[SM70_PROTO_FD_DOORBELL] = s->doorbell_fd;
	fds[SM70_PROTO_FD_EVENT] = s->event_fd;
	memset(&ctl, 0, sizeof(ctl));
	cm = CMSG_FIRSTHDR(&msg);
	cm->cmsg_level = SOL_SOCKET;
	cm->cmsg_type = SCM_RIGHTS;
	cm->cmsg_len = CMSG_LEN(sizeof(fds));
	memcpy(CMSG_DATA(cm), fds, sizeof(fds));
	if (sendmsg(s->sock, &msg, MSG_NOSIGNAL | MSG_DONTWAIT) != (ssize_t)sizeof(w)) {
		ret = -errno;
		goto fail;
	}
	/* The mapping keeps the memory; the client has its own fd. */
	close(memfd);
	memfd = -1;

	s->seg = seg;
	s->seg_size = hdr.total_size;
	s->hdr = seg;
	s->sq = sm70_proto_sq(seg, &hdr);
	s->eq = sm70_proto_eq(seg, &hdr);
	s->arena = sm70_proto_arena(seg, &hdr);
	s->sq_entries = sq;
	s->eq_entries = eq;
	s->arena_tokens = ar;
	s->limits = lim;
	s->sq_head = hdr.sq_head;
	s->eq_tail = s->eq_published = hdr.eq_tail;
	sm70__prompt_pool_init(&s->prompts, ar);
	ret = sm70__loop_watch(d->loop, s->doorbell_fd, POLLIN, on_doorbell, s,
			       &s->doorbell_watch);
	if (ret)
		return ret; /* the session is set up: closing it frees everything */
	s->state = SM70__SESSION_ACTIVE;
	return 0;
fail:
	if (seg != MAP_FAILED)
		munmap(seg, hdr.total_size);
	if (memfd >= 0)
		close(memfd);
	return ret ? ret : -EIO;
}

static uint32_t n_active(const struct sm70__daemon *d)
{
	uint32_t n = 0;

	for (const struct sm70__session *s = d->sessions; s; s = s->next)
		n += s->state == SM70__SESSION_ACTIVE || s->state == SM70__SESSION_WAITING;
	return n;
}

/* ---- waiting for the model -------------------------------------------------------- */

/* The LOADING record of PROTOCOL.md section 4.7 with d's progress now. */
static void loading_msg(const struct sm70__daemon *d, struct sm70_proto_loading *l)
{
	memset(l, 0, sizeof(*l));
	l->size = sizeof(*l);
	l->magic = SM70_PROTO_MAGIC;
	l->type = SM70_PROTO_MSG_LOADING;
	l->version_major = SM70_PROTO_VERSION_MAJOR;
	l->version_minor = SM70_PROTO_VERSION_MINOR;
	l->elapsed_ms = (uint32_t)((d->now_us - d->load_start_us) / 1000);
	l->bytes_done = d->load_done;
	l->bytes_total = d->load_total;
	snprintf(l->model_name, sizeof(l->model_name), "%s", d->model_name);
}

/* To a waiting client that understands it (hello minor >= 1); a full socket buffer (a
 * client that does not read) just misses this one. */
static void loading_send(struct sm70__session *s, const struct sm70_proto_loading *l)
{
	if (s->hello.version_minor < 1)
		return;
	if (send(s->sock, l, sizeof(*l), MSG_NOSIGNAL | MSG_DONTWAIT) < 0 && errno != EAGAIN)
		sm70__debug("session %u: cannot send LOADING: %s", s->id, strerror(errno));
}

void sm70__sessions_loading(struct sm70__daemon *d)
{
	struct sm70_proto_loading l;

	loading_msg(d, &l);
	for (struct sm70__session *s = d->sessions; s; s = s->next)
		if (s->state == SM70__SESSION_WAITING)
			loading_send(s, &l);
}

/* A hello that passed every check while the model loads: kept for the welcome; the client
 * hears at once that the model is loading. */
static void park(struct sm70__daemon *d, struct sm70__session *s,
		 const struct sm70_proto_hello *h)
{
	struct sm70_proto_loading l;

	s->hello = *h;
	s->state = SM70__SESSION_WAITING;
	sm70__info("session %u: '%s' pid %d uid %u waits for the model to load", s->id, s->name,
		   (int)s->pid, (unsigned)s->uid);
	loading_msg(d, &l);
	loading_send(s, &l);
}

void sm70__sessions_model_ready(struct sm70__daemon *d)
{
	for (struct sm70__session *s = d->sessions; s; s = s->next) {
		int ret;

		if (s->state != SM70__SESSION_WAITING)
			continue;
		s->state = SM70__SESSION_HELLO; /* what welcome() and refuse() start from */
		if (d->draining) {
			refuse(d, s, SM70_PROTO_E_SHUTDOWN, "sm70d is shutting down; retry when it "
			       "is back");
			continue;
		}
		ret = welcome(d, s, &s->hello);
		if (ret == -EPIPE || ret == -ECONNRESET)
			sm70__session_close(d, s, 0, "the client hung up before the welcome");
		else if (ret && s->state == SM70__SESSION_HELLO)
			refuse(d, s, ret == -ENOMEM ? SM70_PROTO_E_NO_MEMORY :
			       SM70_PROTO_E_INTERNAL, "sm70d could not set up the session: %s",
			       strerror(-ret));
		else if (ret)
			sm70__session_close(d, s, SM70_PROTO_E_INTERNAL, "sm70d could not watch "
					    "the session's doorbell; see its log");
		else
			sm70__notice("session %u: '%s' pid %d uid %u, rings %u/%u, arena %u tokens, "
				     "%zu bytes (waited %llu ms for the model)", s->id, s->name,
				     (int)s->pid, (unsigned)s->uid, s->sq_entries, s->eq_entries,
				     s->arena_tokens, s->seg_size, (unsigned long long)
				     ((d->now_us - s->t_accept_us) / 1000));
	}
}

void sm70__sessions_refuse_waiting(struct sm70__daemon *d, int code, const char *why)
{
	for (struct sm70__session *s = d->sessions; s; s = s->next)
		if (s->state == SM70__SESSION_WAITING)
			refuse(d, s, code, "%s", why);
}

static void handle_hello(struct sm70__daemon *d, struct sm70__session *s)
{
	char buf[SM70_PROTO_MSG_MAX];
	struct iovec iov = { .iov_base = buf, .iov_len = sizeof(buf) };
	/* No control buffer: fds a client might attach are discarded by the kernel. */
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };
	struct sm70_proto_hello h;
	ssize_t n;
	int ret;

	/* MSG_TRUNC: n is the record's real length even when it is longer than buf, so that
	 * a refusal can say how long it was */
	n = recvmsg(s->sock, &msg, MSG_DONTWAIT | MSG_TRUNC);
	if (n < 0) {
		if (errno != EAGAIN && errno != EINTR)
			sm70__session_close(d, s, 0, strerror(errno));
		return;
	}
	if (n == 0) {
		sm70__session_close(d, s, 0, "hung up before the hello");
		return;
	}
	memset(&h, 0, sizeof(h));
	memcpy(&h, buf, (size_t)n < sizeof(h) ? (size_t)n : sizeof(h));
	for (size_t i = 0; i < sizeof(h.client_name) && h.client_name[i]; i++)
		s->name[i] = (h.client_name[i] >= 0x20 && h.client_name[i] < 0x7f) ?
			     h.client_name[i] : '?';

	/* The uid was checked at accept (accept_one). */
	if (n < 14 || (msg.msg_flags & MSG_TRUNC)) {
		refuse(d, s, SM70_PROTO_E_INVALID, "hello: a message of %zd bytes is not a "
		       "hello", n);
		return;
	}
	if (h.magic != SM70_PROTO_MAGIC) {
		refuse(d, s, SM70_PROTO_E_INVALID, "magic: 0x%08x is not the sm70 magic: this "
		       "is not an sm70 client", h.magic);
		return;
	}
	if (h.type != SM70_PROTO_MSG_HELLO) {
		refuse(d, s, SM70_PROTO_E_INVALID, "type: %u is not a hello (1)", h.type);
		return;
	}
	if (h.version_major > SM70_PROTO_VERSION_MAJOR) {
		refuse(d, s, SM70_PROTO_E_VERSION, "sm70d speaks shared-memory protocol %u.x and "
		       "this client speaks %u.x: upgrade sm70d to a release that speaks protocol "
		       "%u", SM70_PROTO_VERSION_MAJOR, h.version_major, h.version_major);
		return;
	}
	if (h.version_major < SM70_PROTO_VERSION_MAJOR) {
		refuse(d, s, SM70_PROTO_E_VERSION, "sm70d speaks shared-memory protocol %u.x and "
		       "this client speaks %u.x: upgrade libsm70client (or this client) to a "
		       "release built for protocol %u", SM70_PROTO_VERSION_MAJOR,
		       h.version_major, SM70_PROTO_VERSION_MAJOR);
		return;
	}
	if (n < (ssize_t)sizeof(h) || h.size < sizeof(h)) {
		refuse(d, s, SM70_PROTO_E_INVALID, "size: a hello has at least %zu bytes "
		       "(size field %u, message %zd)", sizeof(h), h.size, n);
		return;
	}
	if (h.flags) {
		refuse(d, s, SM70_PROTO_E_INVALID, "flags: unknown bits 0x%x in the hello",
		       h.flags);
		return;
	}
	if (h.reserved0 || h.reserved[0] || h.reserved[1] || h.reserved[2] || h.reserved[3]) {
		refuse(d, s, SM70_PROTO_E_INVALID, "reserved: must be zero in the hello");
		return;
	}
	if (d->draining) {
		refuse(d, s, SM70_PROTO_E_SHUTDOWN, "sm70d is shutting down; retry when it is "
		       "back");
		return;
	}
	if (n_active(d) >= d->cfg.max_sessions) {
		refuse(d, s, SM70_PROTO_E_BUSY, "max_sessions: sm70d already serves %u sessions, "
		       "its limit; retry later", d->cfg.max_sessions);
		return;
	}
	if (s->use->sessions >= s->cfg_limits.max_sessions_per_uid) {
		refuse(d, s, SM70_PROTO_E_BUSY, "limits.max_sessions_per_uid: uid %u already has "
		       "%u sessions, its limit; close one or retry later", (unsigned)s->uid,
		       s->use->sessions);
		return;
	}
	/* from here on it holds a slot of its uid (the close gives it back) */
	s->use->sessions++;
	s->counted = 1;
	if (d->loading) {
		park(d, s, &h);
		return;
	}
	ret = welcome(d, s, &h);
	if (ret) {
		if (ret == -EPIPE || ret == -ECONNRESET) {
			/* it gave up before we could answer: not the daemon's error */
			sm70__session_close(d, s, 0, "the client hung up before the welcome");
			return;
		}
		if (s->state == SM70__SESSION_HELLO && (ret == -EMFILE || ret == -ENFILE))
			refuse(d, s, SM70_PROTO_E_BUSY, "sm70d has no file descriptors left for "
			       "another session; retry later");
		else if (s->state == SM70__SESSION_HELLO)
			refuse(d, s, ret == -ENOMEM ? SM70_PROTO_E_NO_MEMORY :
			       SM70_PROTO_E_INTERNAL, "sm70d could not set up the session: %s",
			       strerror(-ret));
		else
			sm70__session_close(d, s, SM70_PROTO_E_INTERNAL, "sm70d could not watch "
					    "the session's doorbell; see its log");
		return;
	}
	sm70__notice("session %u: '%s' pid %d uid %u, rings %u/%u, arena %u tokens, %zu bytes",
		     s->id, s->name, (int)s->pid, (unsigned)s->uid, s->sq_entries, s->eq_entries,
		     s->arena_tokens, s->seg_size);
}

static void on_sock(void *arg, int fd, uint32_t revents)
{
	struct sm70__session *s = arg;
	struct sm70__daemon *d = s->d;
	char c;
	ssize_t n;

	if (s->state == SM70__SESSION_HELLO) {
		if (revents & POLLIN)
			handle_hello(d, s);
		else if (revents & (POLLHUP | POLLRDHUP | POLLERR))
			sm70__session_close(d, s, 0, "hung up before the hello");
		return;
	}
	/* A waiting client may only wait, or give up (hang up), until its welcome. */
	if (s->state != SM70__SESSION_ACTIVE && s->state != SM70__SESSION_WAITING)
		return;
	if (revents & POLLIN) {
		n = recv(fd, &c, 1, MSG_DONTWAIT);
		if (n > 0) {
			sm70__session_close(d, s, SM70_PROTO_E_INVALID, "protocol violation: "
					    "the client sent a message on the control socket after "
					    "its hello");
			return;
		}
		if (n == 0) {
			sm70__session_close(d, s, 0, "the client hung up");
			return;
		}
	}
	if (revents & (POLLHUP | POLLRDHUP | POLLERR))
		sm70__session_close(d, s, 0, "the client hung up");
}

static void on_doorbell(void *arg, int fd, uint32_t revents)
{
	struct sm70__session *s = arg;
	uint64_t v;
	struct iovec iov = { .iov_base = &v, .iov_len = sizeof(v) };

	(void)revents;
	/* Reset the counter; the rings themselves are checked by sm70__sessions_poll right
	 * after the loop returns. Not read(2): the client shares this file's flags and may have
	 * cleared O_NONBLOCK, then taken the count itself between the poll and this read.
	 * RWF_NOWAIT makes the read fail with EAGAIN instead, whatever the flags say (eventfd
	 * has read_iter and FMODE_NOWAIT since Linux 5.8; Debian 12 has 6.1). */
	if (preadv2(fd, &iov, 1, -1, RWF_NOWAIT) < 0 && errno != EAGAIN)
		sm70__debug("session %u: doorbell read: %s", s->id, strerror(errno));
}

/* ---- the event ring --------------------------------------------------------------- */

/* Free slots in the client's event ring, or 0 if it broke the ring rules (then the session
 * is marked broken and closed by the next poll). */
static uint32_t eq_space(struct sm70__session *s)
{
	uint32_t head = sm70_ring_load_acquire(&s->hdr->eq_head);
	uint32_t used = sm70_ring_count(head, s->eq_tail);

	if (used > s->eq_entries) {
		s->broken = "protocol violation: eq_head is not within eq_entries of eq_tail";
		return 0;
	}
	return s->eq_entries - used;
}

static void eq_write(struct sm70__session *s, const struct sm70_proto_eqe *ev)
{
	memcpy(&s->eq[sm70_ring_slot(s->eq_tail, s->eq_entries)], ev, sizeof(*ev));
	s->eq_tail++;
}

static int hold(struct sm70__daemon *d, struct sm70__session *s,
		const struct sm70_proto_eqe *ev, uint64_t serial)
{
	if (s->held_count == s->held_cap) {
		uint32_t cap = s->held_cap ? s->held_cap * 2 : 16;
		struct sm70__held_event *n = malloc(sizeof(*n) * cap);

		if (!n || cap < s->held_cap) {
			free(n);
			s->slow_pending = 1;
			return -ENOMEM;
		}
		for (uint32_t i = 0; i < s->held_count; i++)
			n[i] = s->held[(s->held_first + i) & (s->held_cap - 1)];
		free(s->held);
		s->held = n;
		s->held_cap = cap;
		s->held_first = 0;
	}
	s->held[(s->held_first + s->held_count) & (s->held_cap - 1)] =
		(struct sm70__held_event){ .ev = *ev, .serial = serial };
	if (s->held_count++ == 0) {
		s->stall_since_us = d->now_us;
		sm70_proto_sleep_begin(&s->hdr->eq_space_wanted);
		sm70__debug("session %u: event ring full, holding events", s->id);
	}
	return 0;
}

int sm70__session_post(struct sm70__daemon *d, struct sm70__session *s,
		       const struct sm70_proto_eqe *ev, uint64_t serial)
{
	if (s->state != SM70__SESSION_ACTIVE)
		return 0;
	if (s->held_count == 0 && eq_space(s) > 0) {
		eq_write(s, ev);
		return 0;
	}
	return hold(d, s, ev, serial);
}

void sm70__session_post_error(struct sm70__daemon *d, struct sm70__session *s, uint64_t tag,
			      uint8_t opcode, int code, const char *msg)
{
	struct sm70_proto_eqe ev;

	memset(&ev, 0, sizeof(ev));
	ev.type = SM70_PROTO_EV_ERROR;
	ev.tag = tag;
	/* The final event of its tag only if it answers a SUBMIT whose tag no unfinished job
	 * holds; otherwise (a CANCEL, an unknown opcode, a tag in use) it ends nothing, and
	 * says so, so that a client does not take it for the running job's end. */
	if (opcode != SM70_PROTO_OP_SUBMIT || sm70__sched_tag_in_use(s, tag))
		ev.flags = SM70_PROTO_EVF_NOT_FINAL;
	ev.u.error.error = code;
	ev.u.error.opcode = opcode;
	snprintf(ev.u.error.message, sizeof(ev.u.error.message), "%s", msg);
	sm70__debug("session %u: ERROR %s for tag %llu: %s", s->id, sm70_proto_strerror(code),
		    (unsigned long long)tag, msg);
	sm70__metrics_client_error(&d->metrics, code);
	sm70__session_post(d, s, &ev, 0);
}

/* Moves held events into the ring as far as it has room; keeps eq_space_wanted set while
 * any are left (set, fence, re-check: the client may have freed space meanwhile). */
static void flush_held(struct sm70__daemon *d, struct sm70__session *s)
{
	for (;;) {
		uint32_t space = eq_space(s), moved = 0;

		while (s->held_count && space) {
			eq_write(s, &s->held[s->held_first].ev);
			s->held_first = (s->held_first + 1) & (s->held_cap - 1);
			s->held_count--;
			space--;
			moved++;
		}
		if (moved)
			s->stall_since_us = d->now_us;
		if (!s->held_count) {
			sm70_proto_sleep_end(&s->hdr->eq_space_wanted);
			if (s->held_cap > HELD_KEEP) {
				free(s->held);
				s->held = NULL;
				s->held_cap = s->held_first = 0;
			}
			if (s->cut_off)
				sm70__notice("session %u: took its held events: its submissions are "
					     "read again", s->id);
			s->cut_off = 0;
			return;
		}
		sm70_proto_sleep_begin(&s->hdr->eq_space_wanted);
		if (!eq_space(s))
			return;
	}
}

/* ---- the submission ring ---------------------------------------------------------- */

static void process_entry(struct sm70__daemon *d, struct sm70__session *s,
			  const struct sm70_proto_sqe *e)
{
	char why[SM70_PROTO_ERRMSG_LEN];
	int32_t *prompt;
	uint32_t slot, i;
	int ret;

	ret = sm70_proto_validate_submit(e, &s->limits, s->arena_tokens, why, sizeof(why));
	if (ret) {
		sm70__session_post_error(d, s, e->tag, e->opcode, -ret, why);
		return;
	}
	if (e->opcode == SM70_PROTO_OP_CANCEL) {
		sm70__sched_cancel(d, s, e->tag);
		return;
	}
	if (d->draining) {
		sm70__session_post_error(d, s, e->tag, e->opcode, SM70_PROTO_E_SHUTDOWN,
					 "sm70d is shutting down and accepts no new jobs");
		return;
	}
	if (d->admin_drained) {
		sm70__session_post_error(d, s, e->tag, e->opcode, SM70_PROTO_E_SHUTDOWN,
					 "sm70d was drained (sm70ctl drain) and accepts no new "
					 "jobs until it is restarted");
		return;
	}
	/* validate_submit checked slot + prompt_len <= arena_tokens on the private copy;
	 * drain_sq checked that the pool has room (NULL: no memory for its mapping). */
	prompt = sm70__prompt_pool_alloc(&s->prompts, e->prompt_len);
	if (!prompt) {
		sm70__session_post_error(d, s, e->tag, e->opcode, SM70_PROTO_E_NO_MEMORY,
					 "prompt_len: no daemon memory for the prompt copy");
		return;
	}
	slot = sm70_ring_slot(e->arena_pos, s->arena_tokens);
	memcpy(prompt, s->arena + slot, sizeof(*prompt) * e->prompt_len);
	SHM_BARRIER();
	for (i = 0; i < e->prompt_len; i++) {
		if ((uint32_t)prompt[i] >= s->limits.vocab_size) {
			snprintf(why, sizeof(why),
				 "prompt[%u]: token %u not below the vocab size %u", i,
				 (uint32_t)prompt[i], s->limits.vocab_size);
			sm70__prompt_pool_free(&s->prompts, prompt);
			sm70__session_post_error(d, s, e->tag, e->opcode, SM70_PROTO_E_INVALID,
						 why);
			return;
		}
	}
	sm70__sched_submit(d, s, e, prompt);
}

/* Whether entry e, read from the SQ, must wait there for room in the session's prompt
 * pool: a SUBMIT that would become a job (it is valid and no state-dependent limit refuses
 * it) whose prompt does not fit now. Entries that will be refused never wait. */
static int must_wait(const struct sm70__daemon *d, struct sm70__session *s,
		     const struct sm70_proto_sqe *e)
{
	char why[SM70_PROTO_ERRMSG_LEN];

	if (e->opcode != SM70_PROTO_OP_SUBMIT || d->draining || d->admin_drained ||
	    sm70_proto_validate_submit(e, &s->limits, s->arena_tokens, why, sizeof(why)) ||
	    sm70__sched_refusal(d, s, e, why, sizeof(why)))
		return 0;
	return !sm70__prompt_pool_fits(&s->prompts, e->prompt_len);
}

/* Whether the session's SQ may be read now: not while it is cut off, nor once it holds
 * its bound of events, nor (back-pressure) while it holds more than a ring's worth
 * (PROTOCOL.md sections 7 and 10: what a client that never reads can make the daemon keep
 * is bounded), nor while the entry it read last waits for prompt-pool room. */
static int sq_readable(const struct sm70__daemon *d, struct sm70__session *s)
{
	return !s->cut_off && s->held_count < d->held_bound && s->held_count <= s->eq_entries &&
	       !(s->has_pending && must_wait(d, s, &s->pending));
}

/* Copies and handles the entries between sq_head and the client's sq_tail while
 * sq_readable. */
static void drain_sq(struct sm70__daemon *d, struct sm70__session *s)
{
	uint32_t tail = sm70_ring_load_acquire(&s->hdr->sq_tail);
	uint32_t n = sm70_ring_count(s->sq_head, tail), arena_head = 0;
	int arena_moved = 0;

	if (!n)
		return;
	if (n > s->sq_entries) {
		char why[SM70_PROTO_REASON_LEN];

		snprintf(why, sizeof(why), "protocol violation: sq_tail %u is %u entries past "
			 "sq_head %u in a ring of %u", tail, n, s->sq_head, s->sq_entries);
		sm70__session_close(d, s, SM70_PROTO_E_INVALID, why);
		return;
	}
	while (s->sq_head != tail && sq_readable(d, s) && s->state == SM70__SESSION_ACTIVE) {
		struct sm70_proto_sqe e;

		if (s->has_pending) {
			e = s->pending; /* read once already; its slot and prompt are still ours */
		} else {
			memcpy(&e, &s->sq[sm70_ring_slot(s->sq_head, s->sq_entries)], sizeof(e));
			SHM_BARRIER();
		}
		if (must_wait(d, s, &e)) {
			s->pending = e;
			s->has_pending = 1;
			break;
		}
		s->has_pending = 0;
		s->sq_head++;
		if (e.opcode == SM70_PROTO_OP_SUBMIT) {
			arena_head = e.arena_pos + e.prompt_len;
			arena_moved = 1;
		}
		process_entry(d, s, &e);
	}
	if (arena_moved)
		sm70_ring_store_release(&s->hdr->arena_head, arena_head);
	sm70_ring_store_release(&s->hdr->sq_head, s->sq_head);
}

/* ---- per-iteration work ----------------------------------------------------------- */

/* The events one session may hold: slow_consumer_events, or its share of
 * slow_consumer_events_total among the welcomed sessions if that is less (but HELD_MIN). */
static uint32_t held_bound(const struct sm70__daemon *d)
{
	uint32_t n = 0, share;

	for (const struct sm70__session *s = d->sessions; s; s = s->next)
		n += s->state == SM70__SESSION_ACTIVE;
	share = d->cfg.slow_consumer_events_total / (n ? n : 1);
	if (share < HELD_MIN)
		share = HELD_MIN;
	return share < d->cfg.slow_consumer_events ? share : d->cfg.slow_consumer_events;
}

/*
 * The session reached its bound of held events (an event ring it does not drain, whether
 * jobs fill it or refused entries do): its running jobs' undelivered tokens are dropped and
 * every job ends with FINISH(ERROR, E_SLOW_CONSUMER); one session-wide ERROR says so (tag
 * 0, opcode 0, EVF_NOT_FINAL); its SQ is not read again until it has taken every held event
 * (flush_held). What it holds from then on is those final events, one per job.
 */
static void cut_off(struct sm70__daemon *d, struct sm70__session *s)
{
	struct sm70_proto_eqe ev;
	uint32_t held = s->held_count;

	s->cut_off = 1;
	sm70__notice("session %u ('%s' pid %d uid %u): slow consumer: %u undelivered events held "
		     "(its bound is %u): ending its %u jobs with E_SLOW_CONSUMER; its submissions "
		     "wait until it reads", s->id, s->name, (int)s->pid, (unsigned)s->uid, held,
		     d->held_bound, s->n_jobs);
	sm70__sched_slow_consumer(d, s);
	memset(&ev, 0, sizeof(ev));
	ev.type = SM70_PROTO_EV_ERROR;
	ev.flags = SM70_PROTO_EVF_NOT_FINAL;
	ev.u.error.error = SM70_PROTO_E_SLOW_CONSUMER;
	snprintf(ev.u.error.message, sizeof(ev.u.error.message), "slow consumer: %u events held "
		 "(bound %u); jobs ended, submissions wait until you read", held, d->held_bound);
	sm70__metrics_client_error(&d->metrics, SM70_PROTO_E_SLOW_CONSUMER);
	sm70__session_post(d, s, &ev, 0);
	s->stall_since_us = d->now_us;
}

void sm70__sessions_poll(struct sm70__daemon *d)
{
	struct sm70__session *s;

	d->held_bound = held_bound(d);

	if (d->accept_paused && d->listen_fd >= 0 &&
	    (d->fds_released || d->now_us >= d->accept_retry_us))
		accept_all(d);
	for (s = d->sessions; s; s = s->next) {
		if (s->state == SM70__SESSION_HELLO &&
		    d->now_us - s->t_accept_us > (uint64_t)d->cfg.hello_timeout_ms * 1000) {
			char why[SM70_PROTO_REASON_LEN];

			snprintf(why, sizeof(why), "hello_timeout_ms: no hello within %u ms of "
				 "connecting", d->cfg.hello_timeout_ms);
			sm70__session_close(d, s, SM70_PROTO_E_INVALID, why);
			continue;
		}
		if (s->state != SM70__SESSION_ACTIVE)
			continue;
		if (s->held_count)
			flush_held(d, s);
		if (sq_readable(d, s))
			drain_sq(d, s);
		if (s->state != SM70__SESSION_ACTIVE)
			continue;
		if (!s->cut_off && s->held_count >= d->held_bound)
			cut_off(d, s);
		if (s->held_count &&
		    d->now_us - s->stall_since_us >= (uint64_t)s->limits.slow_consumer_ms * 1000)
			s->slow_pending = 1;
		if (s->slow_pending && !s->n_jobs) {
			/* only final events are held: nothing left to end */
			s->slow_pending = 0;
			s->stall_since_us = d->now_us;
		}
		if (s->slow_pending) {
			s->slow_pending = 0;
			sm70__notice("session %u: event ring not drained (%u events held): ending "
				     "its jobs with E_SLOW_CONSUMER", s->id, s->held_count);
			sm70__sched_slow_consumer(d, s);
			s->stall_since_us = d->now_us;
		}
		if (s->broken)
			sm70__session_close(d, s, SM70_PROTO_E_INVALID, s->broken);
	}
}

void sm70__sessions_publish(struct sm70__daemon *d)
{
	for (struct sm70__session *s = d->sessions; s; s = s->next) {
		if (s->state != SM70__SESSION_ACTIVE || s->eq_tail == s->eq_published)
			continue;
		sm70_ring_store_release(&s->hdr->eq_tail, s->eq_tail);
		s->eq_published = s->eq_tail;
		/* Never write(2) here: the client shares the event fd's flags and counter and
		 * can make a write wait forever; the waker writes through io_uring. */
		if (sm70_proto_wake_needed(&s->hdr->client_sleeping))
			sm70__loop_wake(d->loop, s->event_waker);
	}
	sm70__loop_flush(d->loop); /* one submission for every wake of this iteration */
}

int sm70__sessions_sleep_begin(struct sm70__daemon *d)
{
	int pending = 0;

	for (struct sm70__session *s = d->sessions; s; s = s->next) {
		if (s->state != SM70__SESSION_ACTIVE)
			continue;
		sm70_proto_sleep_begin(&s->hdr->daemon_sleeping);
		if (s->held_count) {
			sm70_proto_sleep_begin(&s->hdr->eq_space_wanted);
			if (eq_space(s) || s->broken)
				pending = 1;
		}
		if (sq_readable(d, s) && sm70_ring_load_acquire(&s->hdr->sq_tail) != s->sq_head)
			pending = 1;
	}
	return pending;
}

void sm70__sessions_sleep_end(struct sm70__daemon *d)
{
	for (struct sm70__session *s = d->sessions; s; s = s->next)
		if (s->state == SM70__SESSION_ACTIVE)
			sm70_proto_sleep_end(&s->hdr->daemon_sleeping);
}

int64_t sm70__sessions_next_timer(const struct sm70__daemon *d)
{
	int64_t best = -1;

	if (d->accept_paused && d->listen_fd >= 0)
		best = d->accept_retry_us > d->now_us ? (int64_t)(d->accept_retry_us - d->now_us)
						      : 0;

	for (const struct sm70__session *s = d->sessions; s; s = s->next) {
		uint64_t at;
		int64_t dt;

		if (s->state == SM70__SESSION_HELLO)
			at = s->t_accept_us + (uint64_t)d->cfg.hello_timeout_ms * 1000 + 1;
		else if (s->state == SM70__SESSION_ACTIVE && s->held_count)
			at = s->stall_since_us + (uint64_t)s->limits.slow_consumer_ms * 1000;
		else
			continue;
		dt = at > d->now_us ? (int64_t)(at - d->now_us) : 0;
		if (best < 0 || dt < best)
			best = dt;
	}
	return best;
}

int sm70__sessions_holding(const struct sm70__daemon *d)
{
	for (const struct sm70__session *s = d->sessions; s; s = s->next)
		if (s->state == SM70__SESSION_ACTIVE && s->held_count)
			return 1;
	return 0;
}

/* ---- ending sessions -------------------------------------------------------------- */

/*
 * Tells the client why the daemon ends its session (PROTOCOL.md section 2, "Closing"): a
 * welcomed client finds the code and reason in its segment header (the event ring may be
 * full or broken, the header is always there), one still in its handshake gets a REFUSAL.
 * Before the socket closes, so that the hang-up comes after the reason.
 */
static void tell_close(struct sm70__daemon *d, struct sm70__session *s, int code,
		       const char *why)
{
	struct sm70_proto_refusal r;
	char c;

	if (s->hdr) {
		/* the events written so far, which the loop would have published */
		if (s->eq_tail != s->eq_published)
			sm70_ring_store_release(&s->hdr->eq_tail, s->eq_tail);
		s->eq_published = s->eq_tail;
		snprintf(s->hdr->close_reason, sizeof(s->hdr->close_reason), "%s", why);
		sm70_ring_store_release(&s->hdr->close_code, (uint32_t)code);
		sm70__metrics_client_error(&d->metrics, code);
		return;
	}
	refusal_send(d, s->sock, code, why, &r);
	/* as close_unread: a hello still queued must not turn the refusal into a reset */
	shutdown(s->sock, SHUT_RDWR);
	while (recv(s->sock, &c, sizeof(c), MSG_DONTWAIT) > 0)
		;
}

void sm70__session_close(struct sm70__daemon *d, struct sm70__session *s, int code,
			 const char *why)
{
	if (s->state == SM70__SESSION_CLOSED)
		return;
	if (code)
		tell_close(d, s, code, why);
	if (s->state == SM70__SESSION_ACTIVE)
		sm70__notice("session %u ('%s' pid %d): closed: %s (%u jobs to cancel)", s->id,
			     s->name, (int)s->pid, why, s->n_jobs);
	else
		sm70__debug("session %u: closed before the welcome: %s", s->id, why);
	sm70__loop_unwatch(d->loop, s->sock_watch);
	sm70__loop_unwatch(d->loop, s->doorbell_watch);
	s->sock_watch = s->doorbell_watch = NULL;
	/* Before the event fd is closed: a wake still waiting in the kernel (the client never
	 * read its counter) is cancelled there. */
	sm70__loop_waker_destroy(d->loop, s->event_waker);
	s->event_waker = NULL;
	close(s->sock);
	s->sock = -1;
	if (s->doorbell_fd >= 0)
		close(s->doorbell_fd);
	if (s->event_fd >= 0)
		close(s->event_fd);
	s->doorbell_fd = s->event_fd = -1;
	session_spares_release(s);
	d->fds_released = 1;
	s->state = SM70__SESSION_CLOSED;
	if (s->counted)
		s->use->sessions--;
	s->counted = 0;
	free(s->held);
	s->held = NULL;
	s->held_count = s->held_cap = s->held_first = 0;
	sm70__sched_session_gone(d, s);
}

void sm70__sessions_close_all(struct sm70__daemon *d, int code, const char *why)
{
	for (struct sm70__session *s = d->sessions; s; s = s->next)
		sm70__session_close(d, s, code, why);
}

void sm70__sessions_reap(struct sm70__daemon *d)
{
	struct sm70__session **pp = &d->sessions, *s;

	while ((s = *pp)) {
		if (s->state != SM70__SESSION_CLOSED || s->n_jobs) {
			pp = &s->next;
			continue;
		}
		/* The engine emitted every final event of this session's jobs: nothing refers
		 * to the segment any more. */
		*pp = s->next;
		if (s->seg)
			munmap(s->seg, s->seg_size);
		sm70__prompt_pool_destroy(&s->prompts); /* its jobs freed every copy */
		uid_use_put(d, s->use);
		d->n_sessions--;
		sm70__debug("session %u: freed", s->id);
		free(s);
	}
}
