/*
 * ipc.c - `sm70-bench ipc`: what the sm70d -> libsm70client transport costs per token.
 *
 *   sm70-bench ipc [--daemon PATH] [--model DIR] [--samples N] [--gap-us N]
 *                  [--stream-tokens N] [--jobs N] [--seconds S]
 *
 * It starts a real sm70d (--daemon, else $SM70_BUILD/bin/sm70d, else the sm70d next to this
 * program, else build/bin/sm70d) with `--backend null --load-format dummy` on a tiny model
 * config (--model, default tests/fixtures/qwen3-gqa2-d64-tied) on a socket in a temp dir,
 * and connects to it through the public SDK.
 *
 * Method: the null backend stamps CLOCK_MONOTONIC nanoseconds into every token it samples
 * (top-logprob slots 1..3, see kernels/null/null_backend.c); the daemon copies those slots
 * verbatim into the event record, and the client reads CLOCK_MONOTONIC again right after
 * sm70_next_event returns the TOKEN. Both clocks are the same kernel clock, so the
 * difference is the delivery latency of a token: the engine finishing its step, the
 * scheduler writing the record, the tail publish, the wakeup (if the client sleeps) and
 * the SDK copying the event out. Nothing is added to the protocol for it.
 *   - isolated: one-token jobs, one at a time, gap-us apart (the daemon and a sleeping
 *     client are asleep when the token is made): spinning client (spin_us large), sleeping
 *     client (spin_us = UINT32_MAX, sm70_next_event blocks in io_uring), and a client that
 *     poll()s sm70_event_fd and drains with timeout 0;
 *   - stream: one job of stream-tokens tokens, as fast as the null engine makes them;
 *   - rate: --jobs jobs kept in flight on one spinning client for --seconds; events/s.
 * Baseline in the same run: the same 128-byte records over an AF_UNIX SOCK_SEQPACKET
 * socket pair from a child process (sender stamps right before send()), received by a
 * spinning (MSG_DONTWAIT) or a blocking receiver, paced like the isolated case, and sent
 * back to back for the rate.
 *
 * Non-goals: GPU numbers (the other sections), daemon step costs of real models.
 */
#include "tools/bench/bench.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "sm70/client.h"

#define REC_BYTES 128 /* sizeof(struct sm70_proto_eqe): the record the daemon publishes */
#define WARMUP 50
#define SPIN_FOREVER_US 2000000u /* "spinning client": far longer than any gap here */

enum wait_mode { WAIT_SPIN, WAIT_SLEEP, WAIT_POLL };

struct ipc_opts {
	const char *daemon;
	const char *model;
	int samples;
	int gap_us;
	int stream_tokens;
	int jobs;
	double seconds;
};

struct ipc_daemon {
	pid_t pid;
	char dir[64];
	char sock[100];
	char log[128];
	char config[128];
};

/* One row of the table: a latency distribution (n > 0) and/or a rate. */
struct row {
	char name[48];
	int n;
	double p50_us, p99_us, max_us;
	double rate; /* events or messages per second; 0: none */
};

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ __volatile__("yield");
#endif
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

/* Fills r's percentiles from n latencies in ns (sorts them). */
static void row_stats(struct row *r, uint64_t *lat, int n)
{
	r->n = n;
	if (n <= 0)
		return;
	qsort(lat, (size_t)n, sizeof(*lat), cmp_u64);
	r->p50_us = (double)lat[n / 2] * 1e-3;
	r->p99_us = (double)lat[(size_t)n * 99 / 100] * 1e-3;
	r->max_us = (double)lat[n - 1] * 1e-3;
}

static void row_print(const struct row *r)
{
	if (r->n > 0)
		printf("%-40s %7d %9.2f %9.2f %9.1f", r->name, r->n, r->p50_us, r->p99_us,
		       r->max_us);
	else
		printf("%-40s %7s %9s %9s %9s", r->name, "-", "-", "-", "-");
	if (r->rate > 0)
		printf(" %12.0f\n", r->rate);
	else
		printf(" %12s\n", "-");
}

/* ---- the daemon ------------------------------------------------------------------------ */

static int socket_accepts(const char *path)
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

/* The daemon binary: the option, $SM70_BUILD/bin/sm70d, next to this program, or
 * build/bin/sm70d. Writes it into buf. */
static void daemon_path(const struct ipc_opts *o, char *buf, size_t len)
{
	const char *b = getenv("SM70_BUILD");
	char self[PATH_MAX];
	ssize_t n;

	if (o->daemon) {
		snprintf(buf, len, "%s", o->daemon);
		return;
	}
	if (b && *b) {
		snprintf(buf, len, "%s/bin/sm70d", b);
		return;
	}
	n = readlink("/proc/self/exe", self, sizeof(self) - 1);
	if (n > 0) {
		char *slash;

		self[n] = '\0';
		slash = strrchr(self, '/');
		if (slash) {
			*slash = '\0';
			if (snprintf(buf, len, "%s/sm70d", self) < (int)len &&
			    access(buf, X_OK) == 0)
				return;
		}
	}
	snprintf(buf, len, "build/bin/sm70d");
}

static void daemon_log_dump(const struct ipc_daemon *d)
{
	char line[512];
	FILE *f = fopen(d->log, "r");

	if (!f)
		return;
	while (fgets(line, sizeof(line), f))
		fprintf(stderr, "  sm70d| %s", line);
	fclose(f);
}

/* Starts sm70d on the null backend and waits until it accepts. Returns 0 or -errno. */
static int daemon_start(struct ipc_daemon *d, const struct ipc_opts *o, const char *bin)
{
	uint64_t deadline;
	FILE *f;
	int status;

	memset(d, 0, sizeof(*d));
	d->pid = -1;
	snprintf(d->dir, sizeof(d->dir), "/tmp/sm70-bench-ipc-XXXXXX");
	if (!mkdtemp(d->dir))
		return -errno;
	snprintf(d->sock, sizeof(d->sock), "%s/sm70.sock", d->dir);
	snprintf(d->log, sizeof(d->log), "%s/sm70d.log", d->dir);
	snprintf(d->config, sizeof(d->config), "%s/config.json", d->dir);
	f = fopen(d->config, "w");
	if (!f)
		return -errno;
	/* Room for every job in flight at once; the null KV cache is never touched, so its
	 * size costs address space only. No client is slow here, so no slow-consumer cut. */
	fprintf(f,
		"{ \"engine\": { \"max_seqs\": %d, \"max_batch_tokens\": %d,\n"
		"              \"kv_bytes\": 1073741824, \"feed_depth\": 8 },\n"
		"  \"limits\": { \"max_jobs_in_flight\": %d },\n"
		"  \"slow_consumer_ms\": 60000, \"slow_consumer_events\": 1048576,\n"
		"  \"drain_grace_ms\": 100 }\n",
		o->jobs, o->jobs * 8 > 512 ? o->jobs * 8 : 512, o->jobs * 2 + 8);
	fclose(f);

	fflush(NULL);
	d->pid = fork();
	if (d->pid < 0)
		return -errno;
	if (d->pid == 0) {
		int fd = open(d->log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);

		if (fd >= 0) {
			dup2(fd, 1);
			dup2(fd, 2);
		}
		unsetenv("NOTIFY_SOCKET");
		unsetenv("LISTEN_FDS");
		unsetenv("LISTEN_PID");
		unsetenv("WATCHDOG_USEC");
		execl(bin, bin, "--model", o->model, "--backend", "null", "--load-format", "dummy",
		      "--socket", d->sock, "--config", d->config, (char *)NULL);
		_exit(127);
	}
	deadline = now_ns() + 20000000000ull;
	while (now_ns() < deadline) {
		if (socket_accepts(d->sock))
			return 0;
		if (waitpid(d->pid, &status, WNOHANG) == d->pid) {
			d->pid = -1;
			fprintf(stderr, "sm70-bench ipc: %s exited during start-up:\n", bin);
			daemon_log_dump(d);
			return -ECHILD;
		}
		usleep(10000);
	}
	fprintf(stderr, "sm70-bench ipc: sm70d did not listen within 20 s\n");
	daemon_log_dump(d);
	return -ETIMEDOUT;
}

static void daemon_stop(struct ipc_daemon *d)
{
	uint64_t deadline = now_ns() + 5000000000ull;

	if (d->pid > 0) {
		kill(d->pid, SIGTERM);
		while (waitpid(d->pid, NULL, WNOHANG) != d->pid) {
			if (now_ns() > deadline) {
				kill(d->pid, SIGKILL);
				waitpid(d->pid, NULL, 0);
				break;
			}
			usleep(5000);
		}
		d->pid = -1;
	}
	if (d->dir[0]) {
		unlink(d->sock);
		unlink(d->log);
		unlink(d->config);
		rmdir(d->dir);
	}
}

/* ---- sm70 clients ------------------------------------------------------------------------ */

static int client_open(struct sm70_client **c, const char *sock, enum wait_mode w, uint32_t eq)
{
	struct sm70_connect_opts co;
	int ret;

	sm70_connect_opts_init(&co);
	co.client_name = "sm70-bench ipc";
	co.sq_entries = 1024;
	co.eq_entries = eq;
	co.spin_us = w == WAIT_SPIN ? SPIN_FOREVER_US : UINT32_MAX;
	ret = sm70_client_connect(c, sock, &co);
	if (ret)
		fprintf(stderr, "sm70-bench ipc: connect: %s\n",
			*c ? sm70_client_last_error(*c) : sm70_strerror(ret));
	return ret;
}

/* The next event, waiting the way mode says. Returns 0 or an sm70_next_event error. */
static int client_next(struct sm70_client *c, enum wait_mode w, struct sm70_event *ev)
{
	for (;;) {
		struct pollfd p = { .fd = sm70_event_fd(c), .events = POLLIN };
		int ret = sm70_next_event(c, ev, w == WAIT_POLL ? 0 : -1);

		if (ret != -ETIMEDOUT || w != WAIT_POLL)
			return ret;
		if (poll(&p, 1, 10000) < 0 && errno != EINTR)
			return -errno;
	}
}

/* The null backend's emit stamp in a TOKEN event (top slots 1..3); 0 if it has none. */
static uint64_t token_stamp(const struct sm70_event *ev)
{
	uint64_t t = 0;

	if (ev->type != SM70_EVENT_TOKEN || ev->n_top < 4)
		return 0;
	for (int k = 1; k <= 3; k++) {
		float chunk = -ev->top[k].logprob - 1.0f;

		if (!(chunk >= 0.0f && chunk < 4194304.0f))
			return 0;
		t |= (uint64_t)chunk << (22 * (k - 1));
	}
	return t;
}

static void job_fill(struct sm70_job *job, const uint32_t *prompt, uint32_t max_tokens,
		     uint64_t seed, uint32_t top)
{
	sm70_job_init(job);
	job->prompt = prompt;
	job->prompt_len = 4;
	job->max_tokens = max_tokens;
	job->top_logprobs = top;
	job->seed = seed;
	job->flags = SM70_JOB_SEED | SM70_JOB_IGNORE_EOS;
}

static int submit_retry(struct sm70_client *c, const struct sm70_job *job)
{
	uint64_t id;
	int ret;

	while ((ret = sm70_submit(c, job, &id)) == -EAGAIN)
		cpu_relax();
	if (ret)
		fprintf(stderr, "sm70-bench ipc: submit: %s\n", sm70_strerror(ret));
	return ret;
}

/* Isolated tokens: n one-token jobs, one at a time, gap_us apart. */
static int sm70_isolated(const char *sock, enum wait_mode w, const struct ipc_opts *o,
			 struct row *r)
{
	static const uint32_t prompt[4] = { 1, 2, 3, 4 };
	struct sm70_client *c = NULL;
	struct sm70_event ev = { .size = sizeof(ev) };
	struct sm70_job job;
	uint64_t *lat = calloc((size_t)o->samples, sizeof(*lat));
	int ret, n = 0;

	if (!lat)
		return -ENOMEM;
	ret = client_open(&c, sock, w, 0);
	if (ret)
		goto out;
	for (int i = 0; i < o->samples + WARMUP; i++) {
		job_fill(&job, prompt, 1, (uint64_t)i, 4);
		ret = submit_retry(c, &job);
		if (ret)
			goto out;
		do {
			ret = client_next(c, w, &ev);
			if (ret)
				goto out;
			if (ev.type == SM70_EVENT_TOKEN && i >= WARMUP) {
				uint64_t t = now_ns(), s = token_stamp(&ev);

				if (s && t >= s)
					lat[n++] = t - s;
			}
		} while (!(ev.flags & SM70_EVENT_FINAL));
		if (ev.type != SM70_EVENT_FINISH || ev.finish_reason != SM70_REASON_LENGTH) {
			fprintf(stderr, "sm70-bench ipc: a job ended with %s\n",
				ev.message[0] ? ev.message : sm70_strerror(ev.error));
			ret = -EIO;
			goto out;
		}
		if (o->gap_us > 0)
			usleep((useconds_t)o->gap_us);
	}
	row_stats(r, lat, n);
out:
	sm70_client_close(c);
	free(lat);
	return ret;
}

/* One job of stream_tokens tokens: per-token latency and the job's token rate. */
static int sm70_stream(const char *sock, enum wait_mode w, const struct ipc_opts *o,
		       struct row *r)
{
	static const uint32_t prompt[4] = { 5, 6, 7, 8 };
	struct sm70_client *c = NULL;
	struct sm70_event ev = { .size = sizeof(ev) };
	struct sm70_client_info info = { .size = sizeof(info) };
	struct sm70_job job;
	uint64_t *lat = NULL, t0 = 0, t1 = 0;
	uint32_t max_tokens = (uint32_t)o->stream_tokens;
	int ret, n = 0;

	ret = client_open(&c, sock, w, 4096);
	if (ret)
		goto out;
	ret = sm70_client_info(c, &info);
	if (ret)
		goto out;
	if (info.limits.max_context_tokens && max_tokens > info.limits.max_context_tokens - 4)
		max_tokens = info.limits.max_context_tokens - 4;
	lat = calloc(max_tokens, sizeof(*lat));
	if (!lat) {
		ret = -ENOMEM;
		goto out;
	}
	job_fill(&job, prompt, max_tokens, 7, 4);
	ret = submit_retry(c, &job);
	if (ret)
		goto out;
	do {
		ret = client_next(c, w, &ev);
		if (ret)
			goto out;
		if (ev.type == SM70_EVENT_TOKEN) {
			uint64_t t = now_ns(), s = token_stamp(&ev);

			if (!t0)
				t0 = t;
			t1 = t;
			if (s && t >= s && n < (int)max_tokens)
				lat[n++] = t - s;
		}
	} while (!(ev.flags & SM70_EVENT_FINAL));
	row_stats(r, lat, n);
	if (n > 1 && t1 > t0)
		r->rate = (double)(n - 1) / ((double)(t1 - t0) * 1e-9);
out:
	sm70_client_close(c);
	free(lat);
	return ret;
}

/* Events per second: o->jobs long jobs kept in flight on one spinning client. */
static int sm70_rate(const char *sock, const struct ipc_opts *o, struct row *r,
		     double *token_share)
{
	static const uint32_t prompt[4] = { 9, 10, 11, 12 };
	struct sm70_client *c = NULL;
	struct sm70_event ev = { .size = sizeof(ev) };
	struct sm70_client_info info = { .size = sizeof(info) };
	struct sm70_job job;
	uint64_t events = 0, tokens = 0, t0 = 0, t_end, seed = 1000;
	uint32_t max_tokens = 100000;
	int ret;

	ret = client_open(&c, sock, WAIT_SPIN, 65536);
	if (ret)
		goto out;
	ret = sm70_client_info(c, &info);
	if (ret)
		goto out;
	if (info.limits.max_context_tokens && max_tokens > info.limits.max_context_tokens - 4)
		max_tokens = info.limits.max_context_tokens - 4;
	if (info.limits.max_new_tokens && max_tokens > info.limits.max_new_tokens)
		max_tokens = info.limits.max_new_tokens;
	for (int j = 0; j < o->jobs; j++) {
		job_fill(&job, prompt, max_tokens, seed++, 0);
		ret = submit_retry(c, &job);
		if (ret)
			goto out;
	}
	/* Count from the first event on, so that start-up is not in the rate. */
	ret = client_next(c, WAIT_SPIN, &ev);
	if (ret)
		goto out;
	t0 = now_ns();
	t_end = t0 + (uint64_t)(o->seconds * 1e9);
	for (;;) {
		ret = client_next(c, WAIT_SPIN, &ev);
		if (ret)
			goto out;
		events++;
		tokens += ev.type == SM70_EVENT_TOKEN;
		if (ev.flags & SM70_EVENT_FINAL) {
			job_fill(&job, prompt, max_tokens, seed++, 0);
			ret = submit_retry(c, &job);
			if (ret)
				goto out;
		}
		/* the clock is read every 256 events only: it costs as much as an event */
		if (!(events & 255) && now_ns() >= t_end)
			break;
	}
	r->rate = (double)events / ((double)(now_ns() - t0) * 1e-9);
	*token_share = events ? (double)tokens / (double)events : 0.0;
out:
	sm70_client_close(c); /* the daemon cancels what is still running */
	return ret;
}

/* ---- the baseline: SOCK_SEQPACKET between two processes ---------------------------------- */

/* Child: n + WARMUP stamped records gap_us apart (gap 0: back to back), then exits. */
static void seqpacket_sender(int fd, int n, int gap_us)
{
	unsigned char msg[REC_BYTES];

	memset(msg, 0, sizeof(msg));
	for (int i = 0; i < n + WARMUP; i++) {
		uint64_t t;

		if (gap_us > 0)
			usleep((useconds_t)gap_us);
		t = now_ns();
		memcpy(msg, &t, sizeof(t));
		if (send(fd, msg, sizeof(msg), MSG_NOSIGNAL) != (ssize_t)sizeof(msg))
			_exit(1);
	}
	_exit(0);
}

/* Latency (and, back to back, the rate) of n records over a socket pair. spin: the
 * receiver polls with MSG_DONTWAIT instead of blocking in recv. */
static int seqpacket_run(int n, int gap_us, int spin, struct row *r)
{
	unsigned char msg[REC_BYTES];
	uint64_t *lat = calloc((size_t)n, sizeof(*lat)), t0 = 0, t1 = 0;
	int sv[2] = { -1, -1 }, ret = 0, got = 0, status;
	pid_t pid;

	if (!lat)
		return -ENOMEM;
	if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv)) {
		ret = -errno;
		goto out;
	}
	fflush(NULL);
	pid = fork();
	if (pid < 0) {
		ret = -errno;
		goto out;
	}
	if (pid == 0) {
		close(sv[0]);
		seqpacket_sender(sv[1], n, gap_us);
	}
	close(sv[1]);
	sv[1] = -1;
	for (int i = 0; i < n + WARMUP; i++) {
		ssize_t m;
		uint64_t t, s;

		if (spin) {
			while ((m = recv(sv[0], msg, sizeof(msg), MSG_DONTWAIT)) < 0 &&
			       errno == EAGAIN)
				cpu_relax();
		} else {
			m = recv(sv[0], msg, sizeof(msg), 0);
		}
		t = now_ns();
		if (m != (ssize_t)sizeof(msg)) {
			ret = m < 0 ? -errno : -EPROTO;
			break;
		}
		memcpy(&s, msg, sizeof(s));
		if (i == WARMUP)
			t0 = t;
		t1 = t;
		if (i >= WARMUP && t >= s)
			lat[got++] = t - s;
	}
	waitpid(pid, &status, 0);
	row_stats(r, lat, got);
	if (gap_us == 0 && got > 1 && t1 > t0)
		r->rate = (double)(got - 1) / ((double)(t1 - t0) * 1e-9);
out:
	if (sv[0] >= 0)
		close(sv[0]);
	if (sv[1] >= 0)
		close(sv[1]);
	free(lat);
	return ret;
}

/* ---- the section --------------------------------------------------------------------------- */

static void usage(FILE *f)
{
	fprintf(f,
		"usage: sm70-bench ipc [--daemon PATH] [--model DIR] [--samples N] [--gap-us N]\n"
		"                      [--stream-tokens N] [--jobs N] [--seconds S] [--help]\n"
		"Starts sm70d --backend null --load-format dummy on DIR's config.json (default\n"
		"tests/fixtures/qwen3-gqa2-d64-tied) and measures token delivery latency and\n"
		"event rate through libsm70client, next to an AF_UNIX SOCK_SEQPACKET baseline.\n");
}

static int parse_int(const char *s, int lo, int hi, int *out)
{
	char *end;
	long v;

	errno = 0;
	v = strtol(s, &end, 10);
	if (end == s || *end || errno || v < lo || v > hi)
		return -1;
	*out = (int)v;
	return 0;
}

static int parse_args(int argc, char **argv, struct ipc_opts *o)
{
	o->daemon = NULL;
	o->model = "tests/fixtures/qwen3-gqa2-d64-tied";
	o->samples = 2000;
	o->gap_us = 200;
	o->stream_tokens = 4000;
	o->jobs = 64;
	o->seconds = 2.0;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		int bad = 0;

		if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
			usage(stdout);
			return 1;
		}
		if (!v) {
			bad = 1;
		} else if (!strcmp(a, "--daemon")) {
			o->daemon = v;
		} else if (!strcmp(a, "--model")) {
			o->model = v;
		} else if (!strcmp(a, "--samples")) {
			bad = parse_int(v, 1, 10000000, &o->samples);
		} else if (!strcmp(a, "--gap-us")) {
			bad = parse_int(v, 0, 1000000, &o->gap_us);
		} else if (!strcmp(a, "--stream-tokens")) {
			bad = parse_int(v, 1, 1000000, &o->stream_tokens);
		} else if (!strcmp(a, "--jobs")) {
			bad = parse_int(v, 1, 1024, &o->jobs);
		} else if (!strcmp(a, "--seconds")) {
			char *end;

			o->seconds = strtod(v, &end);
			bad = end == v || *end || !(o->seconds > 0 && o->seconds <= 600);
		} else {
			bad = 1;
		}
		if (bad) {
			fprintf(stderr, "sm70-bench ipc: bad argument '%s'\n", a);
			usage(stderr);
			return -1;
		}
		i++;
	}
	return 0;
}

int sm70__bench_ipc(int argc, char **argv)
{
	static const struct {
		const char *name;
		enum wait_mode w;
	} modes[] = {
		{ "spinning client (spin_us 2 s)", WAIT_SPIN },
		{ "sleeping client (spin_us off)", WAIT_SLEEP },
		{ "poll(sm70_event_fd) client", WAIT_POLL },
	};
	struct ipc_opts o;
	struct ipc_daemon d = { .pid = -1 };
	struct row rows[16];
	char bin[PATH_MAX], cfg[PATH_MAX + 16];
	double token_share = 0;
	int n = 0, ret, spin_row = -1, rate_row = -1;

	memset(rows, 0, sizeof(rows));
	ret = parse_args(argc, argv, &o);
	if (ret)
		return ret > 0 ? 0 : 2;
	snprintf(cfg, sizeof(cfg), "%s/config.json", o.model);
	if (access(cfg, R_OK)) {
		fprintf(stderr, "sm70-bench ipc: no %s (run from the repository root or pass "
			"--model DIR)\n", cfg);
		return 2;
	}
	daemon_path(&o, bin, sizeof(bin));
	if (access(bin, X_OK)) {
		fprintf(stderr, "sm70-bench ipc: %s is not executable (pass --daemon PATH or set "
			"SM70_BUILD)\n", bin);
		return 2;
	}
	signal(SIGPIPE, SIG_IGN);
	ret = daemon_start(&d, &o, bin);
	if (ret)
		goto out;

	printf("sm70-bench ipc: %s --backend null --load-format dummy --model %s\n", bin,
	       o.model);
	printf("%ld online CPUs; isolated tokens: %d one-token jobs %d us apart (+%d warm-up); "
	       "stream: 1 job of %d tokens; rate: %d jobs in flight for %.1f s\n",
	       sysconf(_SC_NPROCESSORS_ONLN), o.samples, o.gap_us, WARMUP, o.stream_tokens,
	       o.jobs, o.seconds);
	printf("latency = client CLOCK_MONOTONIC after sm70_next_event - the null backend's "
	       "CLOCK_MONOTONIC stamp at sampling (carried in top-logprob slots 1..3)\n");
	printf("baseline: %d-byte records over AF_UNIX SOCK_SEQPACKET from a child process, "
	       "stamped right before send()\n\n", REC_BYTES);

	for (size_t m = 0; m < sizeof(modes) / sizeof(modes[0]); m++) {
		struct row *r = &rows[n++];

		snprintf(r->name, sizeof(r->name), "sm70 token, %s", modes[m].name);
		ret = sm70_isolated(d.sock, modes[m].w, &o, r);
		if (ret)
			goto fail;
		if (modes[m].w == WAIT_SPIN)
			spin_row = n - 1;
	}
	for (size_t m = 0; m < 2; m++) {
		struct row *r = &rows[n++];

		snprintf(r->name, sizeof(r->name), "sm70 stream, %s",
			 modes[m].w == WAIT_SPIN ? "spinning client" : "sleeping client");
		ret = sm70_stream(d.sock, modes[m].w, &o, r);
		if (ret)
			goto fail;
	}
	rate_row = n;
	snprintf(rows[n].name, sizeof(rows[n].name), "sm70 rate, %d jobs, spinning client",
		 o.jobs);
	ret = sm70_rate(d.sock, &o, &rows[n++], &token_share);
	if (ret)
		goto fail;

	snprintf(rows[n].name, sizeof(rows[n].name), "seqpacket, spinning receiver");
	ret = seqpacket_run(o.samples, o.gap_us, 1, &rows[n++]);
	if (!ret) {
		snprintf(rows[n].name, sizeof(rows[n].name), "seqpacket, blocking receiver");
		ret = seqpacket_run(o.samples, o.gap_us, 0, &rows[n++]);
	}
	if (!ret) {
		snprintf(rows[n].name, sizeof(rows[n].name), "seqpacket back to back, blocking");
		ret = seqpacket_run(o.samples * 100, 0, 0, &rows[n++]);
	}
	if (ret) {
		fprintf(stderr, "sm70-bench ipc: baseline: %s\n", strerror(-ret));
		goto out;
	}

	printf("%-40s %7s %9s %9s %9s %12s\n", "case", "n", "p50 us", "p99 us", "max us",
	       "events/s");
	for (int i = 0; i < n; i++)
		row_print(&rows[i]);
	printf("\naims: spinning p50 < 5 us: %s (%.2f); spinning p99 < 25 us: %s (%.2f); "
	       ">= 1M events/s: %s (%.0f, %.1f%% of them tokens)\n",
	       rows[spin_row].p50_us < 5 ? "met" : "MISSED", rows[spin_row].p50_us,
	       rows[spin_row].p99_us < 25 ? "met" : "MISSED", rows[spin_row].p99_us,
	       rows[rate_row].rate >= 1e6 ? "met" : "MISSED", rows[rate_row].rate,
	       100.0 * token_share);
	goto out;
fail:
	fprintf(stderr, "sm70-bench ipc: %s\n", sm70_strerror(ret));
	daemon_log_dump(&d);
out:
	daemon_stop(&d);
	return ret ? 1 : 0;
}
