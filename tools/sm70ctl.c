/*
 * sm70ctl - ask a running sm70d how it is doing, over its admin socket.
 *
 *   sm70ctl [--socket ADMIN_PATH] [--json] [-l SECONDS] COMMAND
 *   COMMAND: status | metrics | jobs | clients | health live|ready | drain
 *
 * Human tables by default, the daemon's JSON reply with --json (metrics: the Prometheus
 * text without it). -l repeats the command every SECONDS until interrupted; status then
 * shows tokens/s over that interval. Exit status: 0 ok; 1 the daemon answered no (health
 * check failed, an error reply); 2 usage; 3 sm70d is not running (nothing at the path, or
 * nothing listening); 4 unknown (no reply in time, a reply that does not answer the
 * command asked, or a state this tool does not know);
 * 5 permission denied (by the socket file's mode, or by the daemon's admin access lists);
 * 6 not an sm70 admin socket (not a socket, another socket type, sm70d's client socket, or
 * a reply that is not sm70d's JSON). Each request has a connection of its own (the daemon
 * closes idle ones); terminal control characters in what the daemon sends are stripped
 * before anything is printed. docs/OBSERVABILITY.md has the details.
 * Non-goals: changing the daemon's configuration, talking to the client socket.
 */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "common/version.h"

/* The packaged daemon's admin socket (in sm70d.service's RuntimeDirectory), then the one a
 * daemon started by hand with the default client socket binds ("<socket>.admin"). */
#define DEFAULT_ADMIN_SOCKET "/run/sm70d/admin.sock"
#define FALLBACK_ADMIN_SOCKET "/run/sm70/sm70d.sock.admin"
#define REPLY_MAX 65536
#define REPLY_TIMEOUT_MS 5000

enum {
	EXIT_OK = 0,
	EXIT_NO = 1,
	EXIT_USAGE = 2,
	EXIT_NOT_RUNNING = 3,
	EXIT_UNKNOWN = 4,
	EXIT_DENIED = 5,
	EXIT_NOT_ADMIN = 6,
};

static void usage(FILE *f)
{
	fprintf(f,
		"usage: sm70ctl [--socket ADMIN_PATH] [--json] [--loop SECONDS] COMMAND\n"
		"       sm70ctl --help | --version\n"
		"commands:\n"
		"  status          model, backend, GPUs, version, uptime, clients, jobs, KV use,\n"
		"                  tokens/s, start-up warnings\n"
		"  metrics         Prometheus text of every metric\n"
		"  jobs            unfinished jobs\n"
		"  clients         client sessions\n"
		"  health live     exit 0 if the daemon's loop answers\n"
		"  health ready    exit 0 if it accepts and runs new jobs, else 1\n"
		"  drain           stop admitting jobs, wait for the running ones, exit 0\n"
		"                  (sm70d stays up refusing new jobs until it is restarted)\n"
		"options:\n"
		"  -s, --socket PATH   admin socket (default $SM70_ADMIN_SOCKET, else\n"
		"                      %s, else %s\n"
		"                      if the first does not exist)\n"
		"  -j, --json          print the daemon's JSON reply\n"
		"  -l, --loop SECONDS  repeat every SECONDS\n"
		"  -h, --help          this text\n"
		"  --version           the version of sm70ctl (status shows the daemon's)\n"
		"exit status: 0 ok, 1 the daemon said no, 2 usage, 3 not running, 4 unknown,\n"
		"             5 permission denied, 6 not an sm70 admin socket\n",
		DEFAULT_ADMIN_SOCKET, FALLBACK_ADMIN_SOCKET);
}

/* ---- the request -------------------------------------------------------------------- */

/* Connects to path. Returns the fd or -errno (-ENOTSOCK: path is no socket). */
static int admin_connect(const char *path)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	struct stat st;
	int fd;

	if (strlen(path) >= sizeof(a.sun_path))
		return -ENAMETOOLONG;
	if (stat(path, &st) == 0 && !S_ISSOCK(st.st_mode))
		return -ENOTSOCK; /* connect would say ECONNREFUSED: "not running" */
	memcpy(a.sun_path, path, strlen(path) + 1);
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if (connect(fd, (struct sockaddr *)&a, sizeof(a))) {
		int e = errno;

		close(fd);
		return -e;
	}
	return fd;
}

/* The exit status and message for a failed connect. */
static int connect_failed(const char *path, int err)
{
	switch (err) {
	case -ENOENT:
	case -ECONNREFUSED:
		fprintf(stderr, "sm70ctl: sm70d is not running: nothing %s %s\n",
			err == -ENOENT ? "at" : "listens on", path);
		return EXIT_NOT_RUNNING;
	case -EACCES:
	case -EPERM:
		fprintf(stderr, "sm70ctl: permission denied: %s does not let this user in (its "
			"mode and group, admin_socket_mode / admin_socket_group)\n", path);
		return EXIT_DENIED;
	case -ENOTSOCK:
	case -EPROTOTYPE:
		fprintf(stderr, "sm70ctl: %s is not an sm70 admin socket (%s)\n", path,
			err == -ENOTSOCK ? "not a socket" : "not a SOCK_SEQPACKET socket");
		return EXIT_NOT_ADMIN;
	default:
		fprintf(stderr, "sm70ctl: cannot connect to %s: %s\n", path, strerror(-err));
		return EXIT_NOT_RUNNING;
	}
}

/*
 * Removes, in place, what a terminal would act on rather than show: C0 controls (all but
 * '\n' when keep_newlines), DEL and the C1 controls (U+0080..U+009F, 0xc2 0x80..0x9f in
 * UTF-8; CSI among them). Whatever the daemon sends, or whatever answers on its socket,
 * cannot move the cursor, retitle the window or hide text. Returns s.
 */
static char *strip_controls(char *s, int keep_newlines)
{
	unsigned char *r = (unsigned char *)s, *w = r;

	for (; *r; r++) {
		if (*r == 0xc2 && r[1] >= 0x80 && r[1] <= 0x9f) {
			r++;
			continue;
		}
		if ((*r < 0x20 && !(keep_newlines && *r == '\n')) || *r == 0x7f)
			continue;
		*w++ = *r;
	}
	*w = '\0';
	return s;
}

/* Strips every string in v (see strip_controls); newlines stay only in the metrics text
 * (keep_newlines is set for the value of a "text" key). */
static void sanitize(json_t *v, int keep_newlines)
{
	const char *key;
	json_t *e;
	size_t i;

	if (json_is_string(v)) {
		char *t = strdup(json_string_value(v));

		if (t && strlen(t) == json_string_length(v)) /* no NUL inside */
			json_string_set(v, strip_controls(t, keep_newlines));
		else if (t)
			json_string_set(v, "?");
		free(t);
	} else if (json_is_object(v)) {
		json_object_foreach(v, key, e)
			sanitize(e, strcmp(key, "text") == 0);
	} else if (json_is_array(v)) {
		json_array_foreach(v, i, e)
			sanitize(e, 0);
	}
}

/* Prints the (sanitized) reply as JSON on one line: every non-ASCII character escaped, so
 * nothing in a key either reaches the terminal raw. */
static void print_json(json_t *r)
{
	char *text = json_dumps(r, JSON_COMPACT | JSON_ENSURE_ASCII);

	printf("%s\n", text ? text : "{}");
	free(text);
}

/* Sends {"cmd": cmd} on fd and returns the parsed reply in *out (caller decrefs), the raw
 * text in raw (REPLY_MAX bytes). Returns an exit status: EXIT_OK, or EXIT_UNKNOWN /
 * EXIT_NOT_ADMIN with a message printed. A daemon that turns this uid away sends its
 * reply at accept and closes, so a failed send still reads what came. */
static int request(int fd, const char *cmd, json_t **out, char *raw)
{
	char req[128];
	struct pollfd p = { .fd = fd, .events = POLLIN };
	json_error_t je;
	json_t *rc;
	ssize_t n;
	int len;

	*out = NULL;
	len = snprintf(req, sizeof(req), "{\"cmd\":\"%s\"}", cmd);
	if (send(fd, req, (size_t)len, MSG_NOSIGNAL) != len && errno != EPIPE &&
	    errno != ECONNRESET) {
		fprintf(stderr, "sm70ctl: cannot send the request: %s\n", strerror(errno));
		return EXIT_UNKNOWN;
	}
	if (poll(&p, 1, REPLY_TIMEOUT_MS) != 1) {
		fprintf(stderr, "sm70ctl: no reply within %d ms\n", REPLY_TIMEOUT_MS);
		return EXIT_UNKNOWN;
	}
	n = recv(fd, raw, REPLY_MAX - 1, 0);
	if (n < 0 && errno == ECONNRESET) {
		/* A daemon that closed with our request unread (a refusal at accept) makes the
		 * first recv report the reset ahead of the reply it queued: read that. */
		n = recv(fd, raw, REPLY_MAX - 1, MSG_DONTWAIT);
		if (n < 0)
			errno = ECONNRESET;
	}
	if (n <= 0) {
		fprintf(stderr, "sm70ctl: the daemon closed the connection without a reply%s%s\n",
			n < 0 ? ": " : "", n < 0 ? strerror(errno) : "");
		return EXIT_UNKNOWN;
	}
	raw[n] = '\0';
	*out = json_loads(raw, JSON_REJECT_DUPLICATES, &je);
	if (!json_is_object(*out) || !json_is_boolean(json_object_get(*out, "ok"))) {
		uint32_t magic = 0;

		if (n >= 8)
			memcpy(&magic, raw + 4, sizeof(magic));
		if (magic == 0x30374d53u) /* SM70_PROTO_MAGIC: a protocol record */
			fprintf(stderr, "sm70ctl: not an sm70 admin socket: it answers with sm70d's "
				"client protocol (the client socket? the admin socket is "
				DEFAULT_ADMIN_SOCKET " or <socket>.admin)\n");
		else
			fprintf(stderr, "sm70ctl: not an sm70 admin socket: the reply is not sm70d's "
				"JSON: %.100s\n", strip_controls(raw, 0));
		json_decref(*out);
		*out = NULL;
		return EXIT_NOT_ADMIN;
	}
	sanitize(*out, 0);
	/* A reply to another request (a stale one, or a peer that is not sm70d) must not be
	 * taken for ours: a success names our command, a refusal names it or none (one sent
	 * at accept, before any request). */
	rc = json_object_get(*out, "cmd");
	if (json_is_true(json_object_get(*out, "ok")) ? !json_is_string(rc) ||
	    strcmp(json_string_value(rc), cmd) : rc && (!json_is_string(rc) ||
	    strcmp(json_string_value(rc), cmd))) {
		fprintf(stderr, "sm70ctl: the reply does not answer '%s' (its \"cmd\" is %s%s%s)\n",
			cmd, json_is_string(rc) ? "'" : "", json_is_string(rc) ?
			json_string_value(rc) : "missing", json_is_string(rc) ? "'" : "");
		json_decref(*out);
		*out = NULL;
		return EXIT_UNKNOWN;
	}
	return EXIT_OK;
}

/* ---- printing ---------------------------------------------------------------------- */

static double num(json_t *o, const char *k)
{
	json_t *v = json_object_get(o, k);

	return json_is_number(v) ? json_number_value(v) : NAN;
}

static long long inum(json_t *o, const char *k)
{
	json_t *v = json_object_get(o, k);

	return json_is_integer(v) ? (long long)json_integer_value(v) : -1;
}

static const char *str(json_t *o, const char *k)
{
	const char *s = json_string_value(json_object_get(o, k));

	return s ? s : "?";
}

static void fmt_duration(char *b, size_t n, double s)
{
	long t = isfinite(s) && s > 0 ? (long)s : 0;

	if (t >= 86400)
		snprintf(b, n, "%ldd%02ldh%02ldm", t / 86400, t / 3600 % 24, t / 60 % 60);
	else if (t >= 3600)
		snprintf(b, n, "%ldh%02ldm%02lds", t / 3600, t / 60 % 60, t % 60);
	else if (t >= 60)
		snprintf(b, n, "%ldm%02lds", t / 60, t % 60);
	else
		snprintf(b, n, "%.1fs", isfinite(s) && s > 0 ? s : 0.0);
}

static void fmt_bytes(char *b, size_t n, double v)
{
	static const char *const unit[] = { "B", "KiB", "MiB", "GiB", "TiB" };
	int u = 0;

	while (v >= 1024 && u < 4) {
		v /= 1024;
		u++;
	}
	snprintf(b, n, u ? "%.1f %s" : "%.0f %s", v, unit[u]);
}

/* The reply's "load" object as "42% (6.9 GiB of 16.4 GiB) for 12.3 s", or "" without one. */
static void fmt_load(char *b, size_t n, json_t *r)
{
	json_t *l = json_object_get(r, "load");
	double done = num(l, "bytes_done"), total = num(l, "bytes_total");
	char a[32], c[32];

	b[0] = '\0';
	if (!json_is_object(l))
		return;
	fmt_bytes(a, sizeof(a), isfinite(done) ? done : 0);
	fmt_bytes(c, sizeof(c), isfinite(total) ? total : 0);
	if (total > 0)
		snprintf(b, n, "%.0f%% (%s of %s) for %.1f s",
			 100 * (done < total ? done / total : 1.0), a, c, num(l, "elapsed_s"));
	else
		snprintf(b, n, "%s so far, for %.1f s", a, num(l, "elapsed_s"));
}

/* prev: the previous status reply with -l (NULL the first time), for tokens/s. */
static void print_status(json_t *r, json_t *prev)
{
	json_t *gpus = json_object_get(r, "gpus"), *g;
	double rate = num(r, "tokens_per_s"), win = num(r, "rate_window_s");
	char up[32], a[32], b[32];
	size_t i;

	fmt_duration(up, sizeof(up), num(r, "uptime_s"));
	printf("model      %s (%s)\n", str(r, "model"), str(r, "model_dir"));
	printf("backend    %s (tp %lld)\n", str(r, "backend"), inum(r, "tp"));
	if (!json_array_size(gpus))
		printf("gpus       -\n");
	json_array_foreach(gpus, i, g) {
		if (json_object_get(g, "memory_used_bytes")) {
			fmt_bytes(a, sizeof(a), num(g, "memory_used_bytes"));
			fmt_bytes(b, sizeof(b), num(g, "memory_total_bytes"));
			printf("%s %lld: %s used of %s\n", i ? "          " : "gpus      ",
			       inum(g, "id"), a, b);
		} else {
			printf("%s %lld: %s\n", i ? "          " : "gpus      ", inum(g, "id"),
			       json_is_true(json_object_get(g, "in_use")) ? "in use" :
			       "listed, not used (tp is lower)");
		}
	}
	printf("state      %s%s\n", str(r, "state"),
	       json_is_true(json_object_get(r, "ready")) ? " (ready)" : " (not ready)");
	printf("version    sm70d %s\n", str(r, "version"));
	printf("pid        %lld\n", inum(r, "pid"));
	printf("uptime     %s\n", up);
	if (json_is_true(json_object_get(json_object_get(r, "load"), "active"))) {
		char load[96];

		/* no engine yet: nothing else to show */
		fmt_load(load, sizeof(load), r);
		printf("loading    %s\n", load);
		printf("clients    %lld waiting for the model\n",
		       inum(json_object_get(r, "load"), "clients_waiting"));
		return;
	}
	printf("clients    %lld\n", inum(r, "clients"));
	printf("jobs       %lld running, %lld waiting\n", inum(r, "jobs_running"),
	       inum(r, "jobs_waiting"));
	printf("kv cache   %.1f%% used (%lld of %lld blocks free, %lld tokens)\n",
	       100 * num(r, "kv_usage_ratio"), inum(r, "kv_blocks_free"),
	       inum(r, "kv_blocks_total"), inum(r, "kv_tokens"));
	if (inum(r, "state_slots_total") > 0) {
		char sb[32];

		fmt_bytes(sb, sizeof(sb), num(r, "state_bytes"));
		printf("state      %lld of %lld sequence slots free, %s (recurrent layers)\n",
		       inum(r, "state_slots_free"), inum(r, "state_slots_total"), sb);
	}
	if (num(r, "pinned_host_bytes") > 0) {
		char pb[32];

		fmt_bytes(pb, sizeof(pb), num(r, "pinned_host_bytes"));
		printf("pinned     %s of host memory (n-gram tables)\n", pb);
	}
	if (json_is_false(json_object_get(r, "prefix_cache")))
		printf("prefix     cache off: %s\n", str(r, "prefix_cache_off_reason"));
	if (prev) {
		double dt = num(r, "uptime_s") - num(prev, "uptime_s");
		long long dn = inum(r, "generation_tokens_total") -
			       inum(prev, "generation_tokens_total");

		if (dt > 0) {
			rate = (double)dn / dt;
			win = dt;
		}
	}
	printf("tokens/s   %.1f (over the last %.1f s)\n", isfinite(rate) ? rate : 0.0,
	       isfinite(win) ? win : 0.0);
	/* what the daemon warned of at start-up (a KV cache shorter than one context) */
	json_array_foreach(json_object_get(r, "warnings"), i, g)
		if (json_is_string(g))
			printf("warning    %s\n", json_string_value(g));
}

static void print_jobs(json_t *r)
{
	json_t *jobs = json_object_get(r, "jobs"), *j;
	size_t i;

	printf("%-8s %-6s %-16s %-12s %-7s %4s %7s %13s %9s %8s\n", "ID", "CLIENT", "NAME", "TAG",
	       "STATE", "PRIO", "PROMPT", "GENERATED", "AGE", "TTFT");
	json_array_foreach(jobs, i, j) {
		char age[32], ttft[32], gen[32];
		double t = num(j, "ttft_s");

		fmt_duration(age, sizeof(age), num(j, "age_s"));
		if (t >= 0)
			snprintf(ttft, sizeof(ttft), "%.1fms", t * 1e3);
		else
			snprintf(ttft, sizeof(ttft), "-");
		snprintf(gen, sizeof(gen), "%lld/%lld", inum(j, "generated"),
			 inum(j, "max_new_tokens"));
		printf("%-8lld %-6lld %-16.16s %-12lld %-7s %4lld %7lld %13s %9s %8s\n",
		       inum(j, "id"), inum(j, "client"), str(j, "client_name"), inum(j, "tag"),
		       str(j, "state"), inum(j, "priority"), inum(j, "prompt_tokens"), gen, age,
		       ttft);
	}
	if (json_is_true(json_object_get(r, "truncated")))
		printf("(%zu of %lld jobs shown)\n", json_array_size(jobs), inum(r, "total"));
}

static void print_clients(json_t *r)
{
	json_t *cl = json_object_get(r, "clients"), *c;
	size_t i;

	printf("%-6s %-16s %8s %6s %-7s %5s %6s %5s %10s\n", "ID", "NAME", "PID", "UID",
	       "STATE", "JOBS", "QUEUED", "HELD", "CONNECTED");
	json_array_foreach(cl, i, c) {
		char t[32];

		fmt_duration(t, sizeof(t), num(c, "connected_s"));
		printf("%-6lld %-16.16s %8lld %6lld %-7s %5lld %6lld %5lld %10s\n", inum(c, "id"),
		       str(c, "name"), inum(c, "pid"), inum(c, "uid"), str(c, "state"),
		       inum(c, "jobs"), inum(c, "queued"), inum(c, "held_events"), t);
	}
	if (json_is_true(json_object_get(r, "truncated")))
		printf("(%zu of %lld clients shown)\n", json_array_size(cl), inum(r, "total"));
}

/* ---- commands ---------------------------------------------------------------------- */

/* An {"ok": false} reply: its message, and EXIT_DENIED for an access refusal ("code":
 * "denied") or EXIT_NO. Decrefs r. */
static int said_no(json_t *r, const char *what)
{
	int denied = strcmp(str(r, "code"), "denied") == 0;

	fprintf(stderr, "sm70ctl: %s%s: %s\n", denied ? "permission denied: " : "", what,
		str(r, "error"));
	json_decref(r);
	return denied ? EXIT_DENIED : EXIT_NO;
}

struct ctl {
	const char *socket;
	const char *fallback; /* tried when socket does not exist; NULL: none */
	const char *cmd;
	const char *check; /* health: "live" or "ready" */
	int json;
	double interval; /* -l; 0: once */
	json_t *prev;	 /* the previous status reply, for -l */
	char raw[REPLY_MAX];
};

/*
 * One request on a connection of its own: the daemon closes admin connections idle for
 * admin_idle_ms, so `-l` and drain's polling must not keep one across their sleeps. The
 * first call settles on the fallback path when the default one does not exist. Returns an
 * exit status, the reply in *out on EXIT_OK.
 */
static int ask(struct ctl *c, const char *cmd, json_t **out)
{
	int fd = admin_connect(c->socket), ret;

	*out = NULL;
	if (fd == -ENOENT && c->fallback) {
		fd = admin_connect(c->fallback);
		if (fd != -ENOENT)
			c->socket = c->fallback;
	}
	c->fallback = NULL;
	if (fd < 0)
		return connect_failed(c->socket, fd);
	ret = request(fd, cmd, out, c->raw);
	close(fd);
	return ret;
}

/* One round trip and its output. Returns an exit status. */
static int run_once(struct ctl *c)
{
	json_t *r;
	int ret = ask(c, c->cmd, &r);

	if (ret)
		return ret;
	if (!json_is_true(json_object_get(r, "ok")))
		return said_no(r, c->cmd);
	if (strcmp(c->cmd, "health") == 0) {
		json_t *v = json_object_get(r, c->check);

		if (!json_is_boolean(v)) {
			fprintf(stderr, "sm70ctl: unexpected health reply: no boolean '%s'\n",
				c->check);
			ret = EXIT_UNKNOWN;
		} else if (c->json) {
			print_json(r);
			ret = json_is_true(v) ? EXIT_OK : EXIT_NO;
		} else {
			char load[96];

			fmt_load(load, sizeof(load), r);
			printf("%s%s (%s: %s%s%s)\n", json_is_true(v) ? "" : "not ", c->check,
			       str(r, "state"), str(r, "reason"), load[0] ? ", " : "", load);
			ret = json_is_true(v) ? EXIT_OK : EXIT_NO;
		}
	} else if (c->json) {
		print_json(r);
	} else if (strcmp(c->cmd, "metrics") == 0) {
		fputs(str(r, "text"), stdout);
	} else if (strcmp(c->cmd, "status") == 0) {
		print_status(r, c->prev);
	} else if (strcmp(c->cmd, "jobs") == 0) {
		print_jobs(r);
	} else if (strcmp(c->cmd, "clients") == 0) {
		print_clients(r);
	}
	fflush(stdout);
	if (strcmp(c->cmd, "status") == 0) {
		json_decref(c->prev);
		c->prev = r;
	} else {
		json_decref(r);
	}
	return ret;
}

static void sleep_s(double s)
{
	struct timespec ts = { .tv_sec = (time_t)s,
			       .tv_nsec = (long)((s - (double)(time_t)s) * 1e9) };

	while (nanosleep(&ts, &ts) && errno == EINTR)
		;
}

/* drain: ask once, then poll status until no job is left. */
static int run_drain(struct ctl *c)
{
	json_t *r;
	long long left;
	int ret = ask(c, "drain", &r);

	if (ret)
		return ret;
	if (!json_is_true(json_object_get(r, "ok")))
		return said_no(r, "drain");
	left = inum(r, "jobs");
	if (!c->json)
		printf("draining: no new jobs accepted; waiting for %lld jobs\n", left);
	json_decref(r);
	for (;;) {
		const char *state;

		ret = ask(c, "status", &r);
		if (ret)
			return ret;
		state = str(r, "state");
		if (strcmp(state, "drained") == 0 || strcmp(state, "stopping") == 0 ||
		    strcmp(state, "draining") != 0) {
			if (c->json)
				print_json(r);
			else if (strcmp(state, "drained") == 0)
				printf("drained: every job finished; sm70d refuses new jobs until "
				       "it is restarted\n");
			else
				printf("sm70d is %s\n", state);
			ret = strcmp(state, "drained") == 0 ? EXIT_OK :
			      strcmp(state, "stopping") == 0 ? EXIT_NO : EXIT_UNKNOWN;
			json_decref(r);
			return ret;
		}
		json_decref(r);
		sleep_s(0.1);
	}
}

int main(int argc, char **argv)
{
	static const struct option lopts[] = {
		{ "socket", required_argument, 0, 's' },
		{ "json", no_argument, 0, 'j' },
		{ "loop", required_argument, 0, 'l' },
		{ "help", no_argument, 0, 'h' },
		{ "version", no_argument, 0, 'V' },
		{ 0, 0, 0, 0 },
	};
	static struct ctl c; /* the reply buffer is large */
	char *end;
	int opt, ret;

	c.socket = getenv("SM70_ADMIN_SOCKET");
	if (!c.socket || !*c.socket) {
		c.socket = DEFAULT_ADMIN_SOCKET;
		c.fallback = FALLBACK_ADMIN_SOCKET;
	}
	while ((opt = getopt_long(argc, argv, "s:jl:h", lopts, NULL)) != -1) {
		switch (opt) {
		case 's':
			c.socket = optarg;
			c.fallback = NULL;
			break;
		case 'j':
			c.json = 1;
			break;
		case 'l':
			c.interval = strtod(optarg, &end);
			if (*end || !(c.interval > 0) || c.interval > 86400) {
				fprintf(stderr, "sm70ctl: -l: '%s' is not a number of seconds in "
					"(0, 86400]\n", optarg);
				return EXIT_USAGE;
			}
			break;
		case 'h':
			usage(stdout);
			return EXIT_OK;
		case 'V':
			sm70_print_version(stdout, "sm70ctl");
			return EXIT_OK;
		default:
			usage(stderr);
			return EXIT_USAGE;
		}
	}
	if (optind >= argc) {
		usage(stderr);
		return EXIT_USAGE;
	}
	c.cmd = argv[optind++];
	if (strcmp(c.cmd, "health") == 0) {
		if (optind >= argc ||
		    (strcmp(argv[optind], "live") && strcmp(argv[optind], "ready"))) {
			fprintf(stderr, "sm70ctl: health needs 'live' or 'ready'\n");
			return EXIT_USAGE;
		}
		c.check = argv[optind++];
	} else if (strcmp(c.cmd, "status") && strcmp(c.cmd, "metrics") && strcmp(c.cmd, "jobs") &&
		   strcmp(c.cmd, "clients") && strcmp(c.cmd, "drain")) {
		fprintf(stderr, "sm70ctl: unknown command '%s'\n", c.cmd);
		usage(stderr);
		return EXIT_USAGE;
	}
	if (optind < argc) {
		fprintf(stderr, "sm70ctl: unexpected argument '%s'\n", argv[optind]);
		return EXIT_USAGE;
	}
	if (c.interval > 0 && strcmp(c.cmd, "drain") == 0) {
		fprintf(stderr, "sm70ctl: -l does not apply to drain\n");
		return EXIT_USAGE;
	}

	if (strcmp(c.cmd, "drain") == 0) {
		ret = run_drain(&c);
	} else {
		for (;;) {
			ret = run_once(&c);
			if (c.interval <= 0 || ret == EXIT_UNKNOWN || ret == EXIT_NOT_RUNNING ||
			    ret == EXIT_DENIED || ret == EXIT_NOT_ADMIN)
				break;
			sleep_s(c.interval);
			if (!c.json && strcmp(c.cmd, "metrics"))
				printf("\n");
		}
	}
	json_decref(c.prev);
	return ret;
}
