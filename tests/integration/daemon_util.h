/*
 * daemon_util.h - start and stop a real build/bin/sm70d from an integration test.
 *
 * The daemon runs on the CPU backend (extra arguments come after `--backend cpu`, so a test
 * may pass `--backend null` and the last one wins) with a socket, a config file and a log file in a
 * fresh mkdtemp directory, so tests never collide with each other or with a system
 * daemon. The binary is $SM70_BUILD/bin/sm70d (SM70_BUILD defaults to "build"). Header-only
 * (static functions) so any test can include it; it uses libc and jansson (for sm70ctl's
 * JSON).
 *
 *   struct sm70t_daemon t;
 *   sm70t_daemon_start(&t, "{\"slow_consumer_ms\": 300}", NULL);   // 0 or -errno
 *   ... connect to t.sock ...
 *   int status = sm70t_daemon_stop(&t, SIGTERM, 5000);  // exit status, or -1
 *   sm70t_daemon_cleanup(&t);
 *
 * sm70t_daemon_start_hook runs a function in the child before exec (an rlimit, an
 * environment variable); sm70t_count_fds and sm70t_settled_fds count a process's open
 * descriptors, sm70t_status_kb reads its memory; sm70t_ctl_status and sm70t_kv_status
 * read `sm70ctl --json status`; sm70t_daemon_finish is a group teardown; sm70t_child_start
 * and sm70t_child_stop run a client in a child process (a victim) until told to stop.
 *
 * Non-goals: systemd socket activation, GPU backends, several daemons sharing a dir.
 */
#ifndef SM70_TESTS_DAEMON_UTIL_H
#define SM70_TESTS_DAEMON_UTIL_H

#include <dirent.h>
#include <jansson.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define SM70T_DEFAULT_MODEL "tests/fixtures/qwen3-gqa2-d64-tied"

struct sm70t_daemon {
	pid_t pid;
	char dir[64];
	char sock[100]; /* fits sun_path */
	char config[128];
	char log[128];
	int exited; /* waitpid already collected it */
	int status;
};

/* $SM70_BUILD, or "build" when it is unset or empty: where bin/ holds the programs. */
/* 1 in a build with AddressSanitizer (so is the daemon of the same build dir): its
 * quarantine keeps freed blocks, so a daemon's RssAnon measures the quarantine there, not
 * leaks or pools (LeakSanitizer at the daemon's exit is the leak check). */
#if defined(__SANITIZE_ADDRESS__)
#define UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define UNDER_ASAN 1
#endif
#endif
#ifndef UNDER_ASAN
#define UNDER_ASAN 0
#endif

static inline const char *sm70t_build_dir(void)
{
	const char *b = getenv("SM70_BUILD");

	return b && *b ? b : "build";
}

static inline long sm70t_ms_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000L + ts.tv_nsec / 1000000L;
}

/* 1 if something accepts connections on path. */
static inline int sm70t_socket_up(const char *path)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0), ok;

	if (fd < 0)
		return 0;
	snprintf(a.sun_path, sizeof(a.sun_path), "%s", path);
	ok = connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
	close(fd);
	return ok;
}

/* Prints the daemon's log (stderr) with a prefix; for failing tests. */
static inline void sm70t_daemon_dump_log(const struct sm70t_daemon *t)
{
	char line[1024];
	FILE *f = fopen(t->log, "r");

	if (!f)
		return;
	while (fgets(line, sizeof(line), f))
		fprintf(stderr, "  sm70d| %s", line);
	fclose(f);
}

/* 1 if the daemon's log contains needle so far. */
static inline int sm70t_log_contains(const struct sm70t_daemon *t, const char *needle)
{
	char line[1024];
	FILE *f = fopen(t->log, "r");
	int found = 0;

	if (!f)
		return 0;
	while (!found && fgets(line, sizeof(line), f))
		found = strstr(line, needle) != NULL;
	fclose(f);
	return found;
}

/* 1 (the default): sm70t_daemon_start* return once sm70d has logged that it is ready (its
 * model loaded); 0: as soon as its socket accepts, while the model may still be loading. */
static int sm70t_wait_ready = 1;

/* Runs in the forked child just before exec, after the environment was cleaned: set an
 * rlimit, an environment variable. */
typedef void (*sm70t_child_hook)(void *arg);

/*
 * Starts sm70d on model (NULL: the default fixture) with config_json (NULL: none) written
 * to the temp dir, and waits up to 20 s until its socket accepts connections and it has
 * logged that it is ready (its model loaded). Extra
 * arguments may follow in extra (NULL-terminated list, may be NULL); hook (may be NULL)
 * runs in the child before exec. Returns 0, or -errno (the daemon's log is printed if it
 * died).
 */
static inline int sm70t_daemon_start_hook(struct sm70t_daemon *t, const char *model,
					  const char *config_json, const char *const *extra,
					  sm70t_child_hook hook, void *hook_arg)
{
	char bin[256];
	const char *argv[32];
	int n = 0;
	long deadline;

	memset(t, 0, sizeof(*t));
	snprintf(t->dir, sizeof(t->dir), "/tmp/sm70t-XXXXXX");
	if (!mkdtemp(t->dir))
		return -errno;
	snprintf(t->sock, sizeof(t->sock), "%s/sm70.sock", t->dir);
	snprintf(t->log, sizeof(t->log), "%s/sm70d.log", t->dir);
	snprintf(t->config, sizeof(t->config), "%s/config.json", t->dir);
	snprintf(bin, sizeof(bin), "%s/bin/sm70d", sm70t_build_dir());
	if (access(bin, X_OK)) {
		fprintf(stderr, "daemon_util: %s is not executable (set SM70_BUILD)\n", bin);
		return -ENOENT;
	}
	argv[n++] = bin;
	argv[n++] = "--model";
	argv[n++] = model ? model : SM70T_DEFAULT_MODEL;
	argv[n++] = "--backend";
	argv[n++] = "cpu";
	argv[n++] = "--socket";
	argv[n++] = t->sock;
	if (config_json) {
		FILE *f = fopen(t->config, "w");

		if (!f)
			return -errno;
		fputs(config_json, f);
		fclose(f);
		argv[n++] = "--config";
		argv[n++] = t->config;
	}
	for (int i = 0; extra && extra[i] && n < 31; i++)
		argv[n++] = extra[i];
	argv[n] = NULL;

	fflush(NULL);
	t->pid = fork();
	if (t->pid < 0)
		return -errno;
	if (t->pid == 0) {
		int fd = open(t->log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);

		if (fd >= 0) {
			dup2(fd, 2);
			dup2(fd, 1);
		}
		/* Not under systemd, whatever the test runner's environment says. */
		unsetenv("NOTIFY_SOCKET");
		unsetenv("LISTEN_FDS");
		unsetenv("LISTEN_PID");
		unsetenv("WATCHDOG_USEC");
		if (hook)
			hook(hook_arg);
		execv(bin, (char *const *)argv);
		_exit(127);
	}
	deadline = sm70t_ms_now() + 20000;
	while (sm70t_ms_now() < deadline) {
		/* sm70d listens while its model loads: ready is when it says so */
		if (sm70t_socket_up(t->sock) &&
		    (!sm70t_wait_ready || sm70t_log_contains(t, "ready: serving")))
			return 0;
		if (waitpid(t->pid, &t->status, WNOHANG) == t->pid) {
			t->exited = 1;
			fprintf(stderr, "daemon_util: sm70d exited during start-up:\n");
			sm70t_daemon_dump_log(t);
			return -ECHILD;
		}
		usleep(20000);
	}
	fprintf(stderr, "daemon_util: sm70d did not listen within 20 s\n");
	sm70t_daemon_dump_log(t);
	kill(t->pid, SIGKILL);
	waitpid(t->pid, &t->status, 0);
	t->exited = 1;
	return -ETIMEDOUT;
}

static inline int sm70t_daemon_start_model(struct sm70t_daemon *t, const char *model,
					   const char *config_json, const char *const *extra)
{
	return sm70t_daemon_start_hook(t, model, config_json, extra, NULL, NULL);
}

static inline int sm70t_daemon_start(struct sm70t_daemon *t, const char *config_json,
				     const char *const *extra)
{
	return sm70t_daemon_start_model(t, NULL, config_json, extra);
}

/* The number of open descriptors of process pid (entries of /proc/PID/fd), or -errno. */
static inline int sm70t_count_fds(pid_t pid)
{
	char path[64];
	struct dirent *e;
	DIR *dp;
	int n = 0;

	snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
	dp = opendir(path);
	if (!dp)
		return -errno;
	while ((e = readdir(dp)))
		n += e->d_name[0] != '.';
	closedir(dp);
	return n;
}

/* The descriptor count of pid once it stopped changing (five equal reads 20 ms apart, 4 s
 * at most): the start-up probe connection of sm70t_daemon_start closes asynchronously. */
static inline int sm70t_settled_fds(pid_t pid)
{
	int n = sm70t_count_fds(pid), same = 0;

	for (int i = 0; i < 200 && same < 5; i++) {
		int m;

		usleep(20000);
		m = sm70t_count_fds(pid);
		same = m == n ? same + 1 : 0;
		n = m;
	}
	return n;
}

/* One field of /proc/PID/status in kB (e.g. "RssAnon"), or -1. */
static inline long sm70t_status_kb(pid_t pid, const char *field)
{
	char path[64], line[256];
	size_t n = strlen(field);
	long v = -1;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	f = fopen(path, "r");
	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (!strncmp(line, field, n) && line[n] == ':')
			v = strtol(line + n + 1, NULL, 10);
	fclose(f);
	return v;
}

/* Runs a shell command, at most size - 1 bytes of its stdout into out (NUL-terminated);
 * returns its exit status, or -1 when it did not exit. */
static inline int sm70t_capture(const char *cmd, char *out, size_t size)
{
	FILE *f = popen(cmd, "r");
	size_t n = 0;
	int st;

	assert_non_null(f);
	while (n + 1 < size) {
		size_t r = fread(out + n, 1, size - 1 - n, f);

		if (!r)
			break;
		n += r;
	}
	out[n] = '\0';
	st = pclose(f);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* The daemon's `sm70ctl --json status` object through its admin socket (the caller
 * json_decref()s it), or NULL when sm70ctl failed or printed no JSON. */
static inline json_t *sm70t_ctl_status(const struct sm70t_daemon *t)
{
	char cmd[512], *out = NULL;
	size_t len = 0;
	json_error_t je;
	json_t *root;
	FILE *f;
	int ok;

	snprintf(cmd, sizeof(cmd), "%s/bin/sm70ctl --socket %s.admin --json status",
		 sm70t_build_dir(), t->sock);
	f = popen(cmd, "r");
	if (!f)
		return NULL;
	ok = getline(&out, &len, f) > 0;
	if (pclose(f) != 0 || !ok) {
		free(out);
		return NULL;
	}
	root = json_loads(out, 0, &je);
	free(out);
	return root;
}

/* Jobs and free / total KV blocks from sm70t_ctl_status. Returns 0 or -1. */
static inline int sm70t_kv_status(const struct sm70t_daemon *t, int *jobs, int *free_blocks,
				  int *total)
{
	json_t *root = sm70t_ctl_status(t);

	if (!root)
		return -1;
	*jobs = (int)json_integer_value(json_object_get(root, "jobs"));
	*free_blocks = (int)json_integer_value(json_object_get(root, "kv_blocks_free"));
	*total = (int)json_integer_value(json_object_get(root, "kv_blocks_total"));
	json_decref(root);
	return 0;
}

/* Waits up to timeout_ms for the daemon to exit. Returns its exit status (0..255),
 * 128 + signal if a signal killed it, or -1 if it is still running. */
static inline int sm70t_daemon_wait(struct sm70t_daemon *t, int timeout_ms)
{
	long deadline = sm70t_ms_now() + timeout_ms;

	while (!t->exited) {
		if (waitpid(t->pid, &t->status, WNOHANG) == t->pid) {
			t->exited = 1;
			break;
		}
		if (sm70t_ms_now() >= deadline)
			return -1;
		usleep(10000);
	}
	if (WIFEXITED(t->status))
		return WEXITSTATUS(t->status);
	return 128 + WTERMSIG(t->status);
}

/* Sends sig (e.g. SIGTERM), waits up to timeout_ms, then SIGKILLs. Returns what
 * sm70t_daemon_wait returned for the first wait (-1: it had to be killed). */
static inline int sm70t_daemon_stop(struct sm70t_daemon *t, int sig, int timeout_ms)
{
	int st;

	if (t->pid <= 0)
		return -1;
	if (!t->exited)
		kill(t->pid, sig);
	st = sm70t_daemon_wait(t, timeout_ms);
	if (st < 0) {
		kill(t->pid, SIGKILL);
		sm70t_daemon_wait(t, 5000);
	}
	return st;
}

/* Kills a still-running daemon and removes the temp dir. */
static inline void sm70t_daemon_cleanup(struct sm70t_daemon *t)
{
	if (t->pid > 0 && !t->exited)
		sm70t_daemon_stop(t, SIGKILL, 5000);
	unlink(t->sock);
	unlink(t->config);
	unlink(t->log);
	rmdir(t->dir);
}

/* A group teardown: SIGTERM, up to timeout_ms for a clean exit (the log is printed if not),
 * cleanup. Returns 0 (exit status 0) or -1. */
static inline int sm70t_daemon_finish(struct sm70t_daemon *t, int timeout_ms)
{
	int st = sm70t_daemon_stop(t, SIGTERM, timeout_ms);

	if (st != 0)
		sm70t_daemon_dump_log(t);
	sm70t_daemon_cleanup(t);
	return st == 0 ? 0 : -1;
}

/* A child process told to stop by closing stop_w, answering on res_r. */
struct sm70t_child {
	pid_t pid;
	int stop_w, res_r;
};

/* Runs in the child: work until stop_r is readable (or at EOF), write a report to res_w,
 * _exit. It must write one byte to res_w first, once it is under way. */
typedef void (*sm70t_child_body)(int stop_r, int res_w);

/* Forks a child running body, then waits up to ready_ms (-1: forever) for its first byte,
 * stored in *ready. Returns 0, -ETIMEDOUT or -errno; on an error the child may still run. */
static inline int sm70t_child_start(struct sm70t_child *ch, sm70t_child_body body,
				    int ready_ms, char *ready)
{
	int stop[2], res[2];
	struct pollfd p;

	ch->pid = -1;
	ch->stop_w = ch->res_r = -1;
	if (pipe(stop))
		return -errno;
	if (pipe(res))
		return -errno;
	fflush(NULL);
	ch->pid = fork();
	if (ch->pid < 0)
		return -errno;
	if (ch->pid == 0) {
		close(stop[1]);
		close(res[0]);
		body(stop[0], res[1]);
		_exit(127);
	}
	close(stop[0]);
	close(res[1]);
	ch->stop_w = stop[1];
	ch->res_r = res[0];
	p = (struct pollfd){ .fd = ch->res_r, .events = POLLIN };
	if (poll(&p, 1, ready_ms) != 1)
		return -ETIMEDOUT;
	return read(ch->res_r, ready, 1) == 1 ? 0 : -EPIPE;
}

/* Tells the child to stop and reads its len-byte report into rep within timeout_ms (-1:
 * forever); a child that does not answer is SIGKILLed. Reaps it (wait status in *status,
 * may be NULL). Returns 0, -ETIMEDOUT (no full report: killed) or -ECHILD. */
static inline int sm70t_child_stop(struct sm70t_child *ch, void *rep, size_t len,
				   int timeout_ms, int *status)
{
	struct pollfd p = { .fd = ch->res_r, .events = POLLIN };
	int st, ok;

	close(ch->stop_w);
	ok = poll(&p, 1, timeout_ms) == 1 && read(ch->res_r, rep, len) == (ssize_t)len;
	if (!ok)
		kill(ch->pid, SIGKILL);
	close(ch->res_r);
	if (waitpid(ch->pid, &st, 0) != ch->pid)
		return -ECHILD;
	if (status)
		*status = st;
	return ok ? 0 : -ETIMEDOUT;
}

#endif
