/*
 * admin.c - the admin socket and its commands; see admin.h.
 *
 * Requests are tiny and replies are built from state the loop already holds (sessions,
 * jobs, engine stats, metrics), so a command costs microseconds and runs inline in the
 * socket's callback. Nothing here waits: `drain` only flips the daemon into refusing new
 * jobs; sm70ctl polls `status` until the running jobs are gone.
 */
#include "daemon/admin.h"
#include "daemon/unix_socket.h"

#include <errno.h>
#include <jansson.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "common/version.h"
#include "daemon/log.h"
#include "daemon/scheduler.h"
#include "daemon/session.h"

struct sm70__admin_conn {
	struct sm70__daemon *d;
	int fd;
	struct sm70__watch *watch;
	uid_t uid;
	pid_t pid;
	int control;	     /* in admin_control_uids/gids: may drain */
	uint64_t last_us;    /* accepted, or its last request: admin_idle_ms runs from here */
	struct sm70__admin_conn *next;
};

#define ACCEPT_RETRY_MS 100 /* out of descriptors: try the backlog again this often */

/* ---- the socket ----------------------------------------------------------------------- */

static int send_reply(int fd, const char *text)
{
	size_t n = strlen(text);

	if (send(fd, text, n, MSG_DONTWAIT | MSG_NOSIGNAL) != (ssize_t)n)
		return -errno;
	return 0;
}

/* Sends {"ok": false, "error": why, "code": code} and forgets the result: for peers being
 * turned away. */
static void send_error_once(int fd, const char *code, const char *why)
{
	json_t *r = json_pack("{s:b, s:s, s:s}", "ok", 0, "error", why, "code", code);
	char *text = r ? json_dumps(r, JSON_COMPACT) : NULL;

	if (text && send_reply(fd, text))
		sm70__debug("admin: cannot send a refusal: %s", strerror(errno));
	free(text);
	json_decref(r);
}

/*
 * Closes fd so that the peer still reads what was sent to it. An AF_UNIX socket closed with
 * requests unread makes the peer's next recv fail with ECONNRESET ahead of the reply queued
 * for it; after shutdown nothing more can be queued, so draining first leaves the peer its
 * reply, then end of file (session.c's close_unread does the same at the client socket).
 */
static void close_readable(int fd)
{
	char c;

	shutdown(fd, SHUT_RDWR);
	while (recv(fd, &c, sizeof(c), MSG_DONTWAIT) > 0)
		;
	close(fd);
}

static void conn_close(struct sm70__daemon *d, struct sm70__admin_conn *c)
{
	struct sm70__admin_conn **pp;

	for (pp = &d->admin_conns; *pp; pp = &(*pp)->next)
		if (*pp == c) {
			*pp = c->next;
			break;
		}
	sm70__loop_unwatch(d->loop, c->watch);
	close_readable(c->fd);
	d->n_admin_conns--;
	free(c);
}
static void on_conn(void *arg, int fd, uint32_t revents)
{
	struct sm70__admin_conn *c = arg;
	struct sm70__daemon *d = c->d;
	char buf[4096];
	char *reply = NULL;
	ssize_t n;

	if (!(revents & POLLIN)) {
		conn_close(d, c); /* hang-up or error */
		return;
	}
	n = recv(fd, buf, sizeof(buf) - 1, MSG_DONTWAIT | MSG_TRUNC);
	if (n < 0 && (errno == EAGAIN || errno == EINTR))
		return;
	if (n <= 0) {
		conn_close(d, c);
		return;
	}
	if ((size_t)n >= sizeof(buf)) {
		send_error_once(fd, "invalid", "request: larger than 4095 bytes");
		conn_close(d, c);
		return;
	}
	buf[n] = '\0';
	c->last_us = d->now_us;
	if (sm70__admin_handle(d, buf, (size_t)n, c->control, &reply) || send_reply(fd, reply)) {
		sm70__debug("admin: dropping the connection of pid %d: cannot reply",
			    (int)c->pid);
		conn_close(d, c);
	}
	free(reply);
}

/* The admin connections uid holds. */
static uint32_t uid_conns(const struct sm70__daemon *d, uid_t uid)
{
	uint32_t n = 0;

	for (const struct sm70__admin_conn *c = d->admin_conns; c; c = c->next)
		n += c->uid == uid;
	return n;
}

/*
 * Takes one connection off the admin socket: checks the peer's credentials and the
 * connection limits before anything is allocated, and turns it away with a reply it can
 * read. Returns 1 (taken, refused or dropped: try the next), 0 (the backlog is empty, or
 * accept failed in a way retrying now would not mend) or -errno (out of descriptors or
 * memory: accepting pauses).
 */
static int accept_one(struct sm70__daemon *d, int lfd)
{
	struct sm70__admin_conn *c;
	struct ucred cred;
	socklen_t len = sizeof(cred);
	char why[200];
	int control, fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);

	if (fd < 0) {
		int e = errno;

		if (e == EAGAIN)
			return 0;
		if (e == EMFILE || e == ENFILE || e == ENOBUFS || e == ENOMEM)
			return -e;
		if (e == EINTR || e == ECONNABORTED || e == EPROTO)
			return 1;
		sm70__warn("admin accept: %s", strerror(e));
		return 0;
	}
	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len)) {
		close(fd);
		return 1;
	}
	control = sm70__peer_allowed(fd, cred.uid, cred.gid, d->cfg.admin_control_uids,
				     d->cfg.n_admin_control_uids, d->cfg.admin_control_gids,
				     d->cfg.n_admin_control_gids);
	if (!control && !sm70__peer_allowed(fd, cred.uid, cred.gid, d->cfg.admin_allowed_uids,
					    d->cfg.n_admin_allowed_uids,
					    d->cfg.admin_allowed_gids,
					    d->cfg.n_admin_allowed_gids)) {
		snprintf(why, sizeof(why), "denied: uid %u (gid %u) is not in "
			 "admin_allowed_uids/gids (read) or admin_control_uids/gids",
			 (unsigned)cred.uid, (unsigned)cred.gid);
		sm70__notice("admin: pid %d %s", (int)cred.pid, why);
		send_error_once(fd, "denied", why);
		close_readable(fd);
		return 1;
	}
	if (d->n_admin_conns >= SM70__ADMIN_MAX_CONNS) {
		snprintf(why, sizeof(why), "busy: all %d admin connections are taken; retry "
			 "(idle ones close after admin_idle_ms, %u ms)", SM70__ADMIN_MAX_CONNS,
			 d->cfg.admin_idle_ms);
		send_error_once(fd, "busy", why);
		close_readable(fd);
		return 1;
	}
	if (uid_conns(d, cred.uid) >= d->cfg.admin_max_conns_per_uid) {
		snprintf(why, sizeof(why), "busy: admin_max_conns_per_uid: uid %u already has %u "
			 "admin connections; retry (idle ones close after admin_idle_ms, %u ms)",
			 (unsigned)cred.uid, d->cfg.admin_max_conns_per_uid, d->cfg.admin_idle_ms);
		sm70__debug("admin: pid %d %s", (int)cred.pid, why);
		send_error_once(fd, "busy", why);
		close_readable(fd);
		return 1;
	}
	c = calloc(1, sizeof(*c));
	if (!c) {
		close(fd);
		return 1;
	}
	c->d = d;
	c->fd = fd;
	c->uid = cred.uid;
	c->pid = cred.pid;
	c->control = control;
	c->last_us = d->now_us;
	if (sm70__loop_watch(d->loop, fd, POLLIN | POLLRDHUP, on_conn, c, &c->watch)) {
		free(c);
		close(fd);
		return 1;
	}
	c->next = d->admin_conns;
	d->admin_conns = c;
	d->n_admin_conns++;
	return 1;
}

/* Accepts every queued connection; out of descriptors, it leaves the rest in the backlog
 * and sm70__admin_poll tries again every ACCEPT_RETRY_MS (the listener's poll would not
 * fire again for connections already queued). */
static void accept_all(struct sm70__daemon *d)
{
	int ret;

	while ((ret = accept_one(d, d->admin_fd)) > 0)
		;
	if (ret < 0) {
		if (!d->admin_accept_paused)
			sm70__warn("admin accept: %s: admin connections wait in the backlog "
				   "(retrying every %d ms)", strerror(-ret), ACCEPT_RETRY_MS);
		d->admin_accept_paused = 1;
		d->admin_accept_retry_us = d->now_us + (uint64_t)ACCEPT_RETRY_MS * 1000;
		return;
	}
	if (d->admin_accept_paused)
		sm70__info("admin: accepting again");
	d->admin_accept_paused = 0;
}

static void on_admin_listen(void *arg, int lfd, uint32_t revents)
{
	(void)lfd;
	(void)revents;
	accept_all(arg);
}

void sm70__admin_poll(struct sm70__daemon *d)
{
	uint64_t idle = (uint64_t)d->cfg.admin_idle_ms * 1000;
	struct sm70__admin_conn *c, *next;
	char why[96];

	if (d->admin_fd < 0)
		return;
	if (d->admin_accept_paused && d->now_us >= d->admin_accept_retry_us)
		accept_all(d);
	for (c = d->admin_conns; c; c = next) {
		next = c->next;
		if (d->now_us - c->last_us < idle)
			continue;
		snprintf(why, sizeof(why), "idle: no request for admin_idle_ms (%u ms): closed",
			 d->cfg.admin_idle_ms);
		sm70__debug("admin: pid %d: %s", (int)c->pid, why);
		send_error_once(c->fd, "idle", why);
		conn_close(d, c);
	}
}

int64_t sm70__admin_next_timer(const struct sm70__daemon *d)
{
	uint64_t idle = (uint64_t)d->cfg.admin_idle_ms * 1000;
	int64_t best = -1;

	if (d->admin_fd < 0)
		return -1;
	if (d->admin_accept_paused)
		best = d->admin_accept_retry_us > d->now_us ?
		       (int64_t)(d->admin_accept_retry_us - d->now_us) : 0;
	for (const struct sm70__admin_conn *c = d->admin_conns; c; c = c->next) {
		uint64_t at = c->last_us + idle;
		int64_t dt = at > d->now_us ? (int64_t)(at - d->now_us) : 0;

		if (best < 0 || dt < best)
			best = dt;
	}
	return best;
}

int sm70__admin_open(struct sm70__daemon *d, struct sm70_err *err)
{
	int fd, ret;

	fd = sm70__unix_listen(d->cfg.admin_socket_path, d->cfg.admin_socket_mode, 16, err);
	if (fd == -EROFS || fd == -EACCES) {
		/* Under sm70d.service only the runtime and state directories are writable. */
		char why[sizeof(err->msg)];

		snprintf(why, sizeof(why), "%s", err->msg);
		sm70_err_clear(err);
		return sm70_errf(err, fd, "admin socket: %s (under sm70d.service only /run/sm70d, "
				 "its RuntimeDirectory, is writable in /run: leave admin_socket "
				 "unset or put it there)", why);
	}
	if (fd < 0)
		return fd;
	d->admin_fd = fd;
	d->admin_unlink = 1;
	d->admin_accept_paused = 0;
	if (d->cfg.has_admin_socket_gid &&
	    chown(d->cfg.admin_socket_path, (uid_t)-1, (gid_t)d->cfg.admin_socket_gid)) {
		ret = -errno;
		sm70__admin_close(d);
		return sm70_errf(err, ret, "admin_socket_group: cannot give %s to gid %u: %s%s",
				 d->cfg.admin_socket_path, d->cfg.admin_socket_gid, strerror(-ret),
				 ret == -EPERM ? " (sm70d's user must be a member of the group: "
				 "SupplementaryGroups= in a drop-in, or an `m sm70 GROUP` line in "
				 "sysusers.d)" : "");
	}
	ret = sm70__loop_watch(d->loop, fd, POLLIN, on_admin_listen, d, &d->admin_watch);
	if (ret) {
		sm70__admin_close(d);
		return sm70_errf(err, ret, "cannot watch the admin socket: %s", strerror(-ret));
	}
	sm70__info("admin socket on %s (mode %04o%s)", d->cfg.admin_socket_path,
		   d->cfg.admin_socket_mode, d->cfg.has_admin_socket_gid ? ", group set" : "");
	return 0;
}

void sm70__admin_close(struct sm70__daemon *d)
{
	while (d->admin_conns)
		conn_close(d, d->admin_conns);
	if (d->admin_fd < 0)
		return;
	sm70__loop_unwatch(d->loop, d->admin_watch);
	d->admin_watch = NULL;
	close(d->admin_fd);
	d->admin_fd = -1;
	if (d->admin_unlink)
		unlink(d->cfg.admin_socket_path);
	d->admin_unlink = 0;
}

/* ---- the commands ---------------------------------------------------------------------- */

static double secs(uint64_t us)
{
	return (double)us * 1e-6;
}

static const char *state_name(const struct sm70__daemon *d)
{
	if (d->draining)
		return "stopping";
	if (d->loading)
		return "loading";
	if (d->admin_drained)
		return d->n_jobs ? "draining" : "drained";
	return "serving";
}

/* Why the daemon is not ready, or NULL when it is. */
static const char *not_ready(const struct sm70__daemon *d)
{
	if (d->fatal || d->step_failures)
		return "engine steps are failing";
	if (d->draining)
		return "stopping (SIGTERM/SIGINT)";
	if (d->loading)
		return "loading the model";
	if (d->admin_drained)
		return "drained by sm70ctl drain: restart sm70d to serve again";
	return NULL;
}

/* The model load: while it runs, and how long it took once done. */
static json_t *load_json(const struct sm70__daemon *d, uint64_t now)
{
	uint64_t total = d->load_total > d->load_done ? d->load_total : d->load_done;
	uint32_t waiting = 0;
	json_t *l;

	for (const struct sm70__session *s = d->sessions; s; s = s->next)
		waiting += s->state == SM70__SESSION_WAITING;
	l = json_pack("{s:b, s:I, s:I, s:f, s:I}", "active", d->loading,
		      "bytes_done", (json_int_t)d->load_done,
		      "bytes_total", (json_int_t)d->load_total,
		      "elapsed_s", secs((d->loading ? now : d->load_end_us) - d->load_start_us),
		      "clients_waiting", (json_int_t)waiting);

	if (l)
		json_object_set_new(l, "fraction", total ? json_real((double)d->load_done /
								     (double)total) :
				    json_null());
	return l;
}

static json_t *cmd_status(struct sm70__daemon *d)
{
	/* d->now_us is from before the loop's wait: stale when the daemon was idle */
	uint64_t now = sm70__now_us();
	struct sm70_engine_stats st;
	uint32_t clients = 0, queued = 0;
	double window, rate = sm70__metrics_token_rate(&d->metrics, now, &window);
	json_t *gpus = json_array(), *r, *warn;

	memset(&st, 0, sizeof(st));
	if (d->engine)
		sm70_engine_get_stats(d->engine, &st);
	for (const struct sm70__session *s = d->sessions; s; s = s->next) {
		clients += s->state == SM70__SESSION_ACTIVE;
		queued += s->n_queued;
	}
	if (strcmp(d->cfg.backend, "cuda") == 0) {
		for (uint32_t i = 0; i < d->cfg.n_gpus; i++) {
			uint64_t used = 0, total = 0;
			int in_use = i < d->cfg.tp; /* rank i runs on gpus[i] */
			int have = in_use && sm70__gpu_memory((int)d->cfg.gpus[i], &used,
							      &total) == 0;
			json_t *g = json_pack("{s:I, s:b}", "id", (json_int_t)d->cfg.gpus[i],
					      "in_use", in_use);

			if (g && have) {
				json_object_set_new(g, "memory_used_bytes", json_integer(
					(json_int_t)used));
				json_object_set_new(g, "memory_total_bytes", json_integer(
					(json_int_t)total));
			}
			json_array_append_new(gpus, g);
		}
	}
	r = json_pack("{s:b, s:s, s:s, s:s, s:s, s:o, s:I, s:f, s:s, s:b, s:I, s:I, s:I, s:I,"
		      " s:I, s:I, s:f, s:I, s:I, s:I, s:f, s:f}",
		      "ok", 1, "cmd", "status", "model", d->model_name, "model_dir",
		      d->cfg.model_dir, "backend", d->cfg.backend, "gpus", gpus,
		      "pid", (json_int_t)getpid(),
		      "uptime_s", secs(now - d->metrics.start_us),
		      "state", state_name(d), "ready", not_ready(d) == NULL,
		      "clients", (json_int_t)clients,
		      "jobs", (json_int_t)d->n_jobs,
		      "jobs_running", (json_int_t)st.running,
		      "jobs_waiting", (json_int_t)(queued + (uint32_t)st.waiting),
		      "kv_blocks_total", (json_int_t)st.kv_blocks_total,
		      "kv_blocks_free", (json_int_t)st.kv_blocks_free,
		      "kv_usage_ratio", st.kv_blocks_total > 0 ?
			(double)(st.kv_blocks_total - st.kv_blocks_free) / st.kv_blocks_total : 0.0,
		      "kv_tokens", (json_int_t)d->kv_tokens,
		      "kv_bytes", (json_int_t)d->kv_bytes,
		      "generation_tokens_total", (json_int_t)d->metrics.generation_tokens,
		      "tokens_per_s", rate, "rate_window_s", window);
	if (r) /* as `sm70d --version` prints it, without the name */
		json_object_set_new(r, "version", json_string(sm70_version_text()));
	if (r && d->load_start_us)
		json_object_set_new(r, "load", load_json(d, now));
	if (r) {
		json_object_set_new(r, "tp", json_integer(st.tp));
		/* recurrent models: per-sequence state slots beside the KV cache */
		json_object_set_new(r, "kv_cache_bytes", json_integer((json_int_t)st.kv_bytes));
		json_object_set_new(r, "state_slots_total", json_integer(st.state_slots_total));
		json_object_set_new(r, "state_slots_free", json_integer(st.state_slots_free));
		json_object_set_new(r, "state_bytes", json_integer((json_int_t)st.state_bytes));
		json_object_set_new(r, "pinned_host_bytes",
				    json_integer((json_int_t)st.pinned_bytes));
		json_object_set_new(r, "prefix_cache", json_boolean(!st.prefix_cache_off));
		json_object_set_new(r, "context_tokens", json_integer(d->context_tokens));
		json_object_set_new(r, "git", json_string(sm70_git_describe()));
		warn = json_array();
		for (int i = 0; i < d->n_warnings; i++)
			json_array_append_new(warn, json_string(d->warnings[i]));
		json_object_set_new(r, "warnings", warn);
		if (st.prefix_cache_off)
			json_object_set_new(r, "prefix_cache_off_reason",
					    json_string(st.prefix_cache_off));
	}
	return r;
}

static json_t *cmd_jobs(struct sm70__daemon *d)
{
	uint64_t now = sm70__now_us();
	json_t *list = json_array();
	uint32_t total = 0;

	for (const struct sm70__session *s = d->sessions; s; s = s->next)
		for (const struct sm70__job *j = s->jobs; j; j = j->next_in_session) {
			const char *state = j->kill ? "ending" : j->in_engine ? "engine" :
					    "queued";

			if (++total > SM70__ADMIN_LIST_MAX)
				continue;
			json_array_append_new(list, json_pack(
				"{s:I, s:I, s:s, s:I, s:s, s:i, s:I, s:I, s:I, s:f, s:f}",
				"id", (json_int_t)j->serial, "client", (json_int_t)s->id,
				"client_name", s->name, "tag", (json_int_t)j->tag,
				"state", state, "priority", (int)j->priority,
				"prompt_tokens", (json_int_t)j->prompt_len,
				"max_new_tokens", (json_int_t)j->max_new_tokens,
				"generated", (json_int_t)j->n_posted,
				"age_s", secs(now - j->t_accept_us),
				"ttft_s", j->t_first_us ? secs(j->t_first_us - j->t_accept_us) :
							  -1.0));
		}
	return json_pack("{s:b, s:s, s:o, s:I, s:b}", "ok", 1, "cmd", "jobs", "jobs", list,
			 "total", (json_int_t)total, "truncated", total > SM70__ADMIN_LIST_MAX);
}

static json_t *cmd_clients(struct sm70__daemon *d)
{
	static const char *const states[] = { "?", "hello", "active", "closed", "waiting" };
	uint64_t now = sm70__now_us();
	json_t *list = json_array();
	uint32_t total = 0;

	for (const struct sm70__session *s = d->sessions; s; s = s->next) {
		if (++total > SM70__ADMIN_LIST_MAX)
			continue;
		json_array_append_new(list, json_pack(
			"{s:I, s:s, s:i, s:I, s:s, s:I, s:I, s:I, s:f, s:I, s:I, s:I}",
			"id", (json_int_t)s->id, "name", s->name, "pid", (int)s->pid,
			"uid", (json_int_t)s->uid,
			"state", states[s->state <= SM70__SESSION_WAITING ? s->state : 0],
			"jobs", (json_int_t)s->n_jobs, "queued", (json_int_t)s->n_queued,
			"held_events", (json_int_t)s->held_count,
			"connected_s", secs(now - s->t_accept_us),
			"sq_entries", (json_int_t)s->sq_entries,
			"eq_entries", (json_int_t)s->eq_entries,
			"arena_tokens", (json_int_t)s->arena_tokens));
	}
	return json_pack("{s:b, s:s, s:o, s:I, s:b}", "ok", 1, "cmd", "clients", "clients",
			 list, "total", (json_int_t)total, "truncated",
			 total > SM70__ADMIN_LIST_MAX);
}

static json_t *cmd_metrics(struct sm70__daemon *d)
{
	char *text = malloc(SM70__ADMIN_MSG_MAX / 2);
	json_t *r;
	int n;

	if (!text)
		return NULL;
	n = sm70__metrics_render(d, text, SM70__ADMIN_MSG_MAX / 2);
	r = n < 0 ? json_pack("{s:b, s:s}", "ok", 0, "error", "metrics: the text does not fit "
			      "a reply") :
		    json_pack("{s:b, s:s, s:s}", "ok", 1, "cmd", "metrics", "text", text);
	free(text);
	return r;
}

static json_t *cmd_health(struct sm70__daemon *d)
{
	const char *why = not_ready(d);
	json_t *r;

	/* Live: this loop answered. Ready: it would accept and run a new job now. */
	r = json_pack("{s:b, s:s, s:b, s:b, s:s, s:s}", "ok", 1, "cmd", "health", "live", 1,
		      "ready", why == NULL, "state", state_name(d), "reason", why ? why : "ready");
	if (r && d->loading)
		json_object_set_new(r, "load", load_json(d, sm70__now_us()));
	return r;
}

static json_t *cmd_drain(struct sm70__daemon *d)
{
	if (!d->admin_drained && !d->draining) {
		d->admin_drained = 1;
		sm70__notice("drain requested on the admin socket: no new jobs; %u jobs left to "
			     "finish; sm70d stays up until restarted", d->n_jobs);
	}
	return json_pack("{s:b, s:s, s:s, s:I}", "ok", 1, "cmd", "drain", "state",
			 state_name(d), "jobs", (json_int_t)d->n_jobs);
}

int sm70__admin_handle(struct sm70__daemon *d, const char *req, size_t len, int control,
		       char **reply)
{
	json_error_t je;
	json_t *in, *r = NULL;
	const char *cmd = NULL;
	char why[256];

	*reply = NULL;
	/* {"cmd":"jobs","cmd":"drain"} would otherwise be read as its last key by us and as
	 * its first by whatever logged or filtered the request on the way: refuse it. */
	in = json_loadb(req, len, JSON_REJECT_DUPLICATES, &je);
	if (!in && json_error_code(&je) == json_error_duplicate_key)
		snprintf(why, sizeof(why), "request: a key appears twice (%s): refused, nothing "
			 "was done", je.text);
	else if (!in)
		snprintf(why, sizeof(why), "request: not valid JSON: %s", je.text);
	if (!in) {
		r = json_pack("{s:b, s:s, s:s}", "ok", 0, "code", "invalid", "error", why);
		goto out;
	}
	if (json_is_object(in))
		cmd = json_string_value(json_object_get(in, "cmd"));
	if (!cmd) {
		r = json_pack("{s:b, s:s, s:s}", "ok", 0, "code", "invalid", "error", "request: "
			      "must be an object with a string \"cmd\"");
	} else if (strcmp(cmd, "status") == 0) {
		r = cmd_status(d);
	} else if (strcmp(cmd, "metrics") == 0) {
		r = cmd_metrics(d);
	} else if (strcmp(cmd, "jobs") == 0) {
		r = cmd_jobs(d);
	} else if (strcmp(cmd, "clients") == 0) {
		r = cmd_clients(d);
	} else if (strcmp(cmd, "health") == 0) {
		r = cmd_health(d);
	} else if (strcmp(cmd, "drain") == 0 && !control) {
		r = json_pack("{s:b, s:s, s:s}", "ok", 0, "code", "denied", "error", "denied: "
			      "this uid may read the admin socket but not drain sm70d (that takes "
			      "admin_control_uids or admin_control_gids)");
	} else if (strcmp(cmd, "drain") == 0) {
		r = cmd_drain(d);
	} else {
		snprintf(why, sizeof(why), "cmd: unknown command '%.64s' (status, metrics, jobs, "
			 "clients, health, drain)", cmd);
		r = json_pack("{s:b, s:s, s:s}", "ok", 0, "code", "invalid", "error", why);
	}
	/* Every reply to a request with a cmd names it, so that a peer can tell which
	 * request it answers. */
	if (r && cmd && !json_object_get(r, "cmd"))
		json_object_set_new(r, "cmd", json_stringn(cmd, strnlen(cmd, 64)));
out:
	json_decref(in);
	if (r)
		*reply = json_dumps(r, JSON_COMPACT);
	json_decref(r);
	if (*reply && strlen(*reply) >= SM70__ADMIN_MSG_MAX) {
		free(*reply);
		*reply = strdup("{\"ok\":false,\"error\":\"the reply does not fit 64 KiB\"}");
	}
	return *reply ? 0 : -ENOMEM;
}
