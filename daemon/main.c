/*
 * main.c - sm70d: argument parsing, start-up, the main loop, drain and exit.
 *
 *   sm70d [--model DIR] [--backend cpu|cuda|null] [--load-format auto|dummy]
 *         [--socket PATH] [--admin-socket PATH] [--config FILE] [--tp N] [--gpus IDS]
 *         [--check-config] [--verbose] [--help] [--version]
 *
 * The configuration is /etc/sm70d/sm70d.json (if it exists) or --config FILE; flags
 * override it; --check-config validates it and the model directory (without loading the
 * weights) and exits. Runs in the foreground and logs to
 * stderr. Exit status: 0 after a drain (SIGTERM or SIGINT) or a good --check-config, 1 on a
 * fatal failure while running, 2 on bad arguments, config or model.
 *
 * The model loads on a thread of its own while the loop already serves: the admin socket
 * answers "loading" with the progress, clients that connect are told so and get their
 * welcome when the load is done, a signal cancels the load. Then one thread does
 * everything (docs/DAEMON.md says why): each iteration collects I/O from
 * the io_uring loop (without waiting while the engine has work, else waiting until the
 * nearest timer), copies new submissions out of every session, feeds the engine, runs one
 * engine step, and publishes the events it produced. Non-goals: daemonizing (systemd does
 * that), PID files, reloading the config.
 */
#include <errno.h>
#include <getopt.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <systemd/sd-daemon.h>
#include <time.h>
#include <unistd.h>

#include "common/version.h"
#include "daemon/admin.h"
#include "daemon/config.h"
#include "daemon/daemon.h"
#include "daemon/host_memory.h"
#include "daemon/log.h"
#include "daemon/loop.h"
#include "daemon/model_name.h"
#include "daemon/scheduler.h"
#include "daemon/session.h"

/* After the last job ended in a drain, how long held final events may wait for their
 * clients to read before the daemon exits anyway. */
#define DRAIN_FLUSH_US 2000000ull
/* While the model loads: how often STATUS= and the clients' LOADING messages are
 * refreshed, and how often the log gets a progress line. */
#define LOAD_TICK_US 1000000ull
#define LOAD_LOG_US 10000000ull
#define LOAD_FIRST_US 50000ull /* how often to look for the total before it is known */
/* engine.kv_memory_fraction on the host backends: at most this part of MemAvailable */
#define HOST_KV_SHARE 4

uint64_t sm70__now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

static void usage(FILE *f)
{
	fprintf(f,
		"usage: sm70d [options]\n"
		"Serves a model (--model DIR) to local clients over sm70's shared-memory\n"
		"protocol.\n"
		"The configuration is " SM70__CFG_DEFAULT_PATH " (if it exists) or --config FILE;\n"
		"flags override it. Runs in the foreground, logs to stderr; SIGTERM or SIGINT\n"
		"drains and exits.\n"
		"options:\n"
		"  -m, --model DIR          checkpoint directory (config: model)\n"
		"  --backend cpu|cuda|null  compute backend (config: backend)\n"
		"  --load-format auto|dummy dummy: pseudo-random weights from config.json alone\n"
		"  --socket PATH            client socket when systemd passes none\n"
		"                           (config: socket)\n"
		"  --admin-socket PATH      sm70ctl's socket (config: admin_socket)\n"
		"  --config FILE            the JSON configuration\n"
		"  --tp N                   tensor-parallel ranks, 1..4 (config: tp)\n"
		"  --gpus ID,ID,...         CUDA device of each rank (config: gpus)\n"
		"  --check-config           check the configuration and the model directory\n"
		"                           (config.json, weight headers, every tensor's name,\n"
		"                           shape and dtype; no weight data read), print OK,\n"
		"                           exit 0 or 2\n"
		"  -v, --verbose            log debug messages too\n"
		"  -h, --help               this text\n"
		"  --version                print the version\n"
		"exit status: 0 drained (or a good --check-config), 1 failed while running,\n"
		"             2 bad arguments, configuration or model\n");
}

struct opts {
	const char *model;
	const char *backend;	 /* NULL: from the config */
	const char *load_format; /* NULL: from the config */
	const char *socket;
	const char *admin_socket;
	const char *config;
	const char *gpus;        /* NULL: from the config */
	int tp;                  /* 0: from the config */
	int check_config;
	int verbose;
};

/* Returns 0, 1 (--help or --version printed) or -1 (bad arguments, message printed). */
static int parse_args(int argc, char **argv, struct opts *o)
{
	enum { O_BACKEND = 256, O_LOAD_FORMAT, O_SOCKET, O_CONFIG, O_ADMIN_SOCKET,
	       O_CHECK_CONFIG, O_TP, O_GPUS, O_VERSION };
	static const struct option lopts[] = {
		{ "model", required_argument, 0, 'm' },
		{ "backend", required_argument, 0, O_BACKEND },
		{ "load-format", required_argument, 0, O_LOAD_FORMAT },
		{ "socket", required_argument, 0, O_SOCKET },
		{ "config", required_argument, 0, O_CONFIG },
		{ "admin-socket", required_argument, 0, O_ADMIN_SOCKET },
		{ "check-config", no_argument, 0, O_CHECK_CONFIG },
		{ "tp", required_argument, 0, O_TP },
		{ "gpus", required_argument, 0, O_GPUS },
		{ "verbose", no_argument, 0, 'v' },
		{ "help", no_argument, 0, 'h' },
		{ "version", no_argument, 0, O_VERSION },
		{ 0, 0, 0, 0 },
	};
	int c;

	memset(o, 0, sizeof(*o));
	while ((c = getopt_long(argc, argv, "m:vh", lopts, NULL)) != -1) {
		switch (c) {
		case 'm':
			o->model = optarg;
			break;
		case O_BACKEND:
			if (strcmp(optarg, "cpu") && strcmp(optarg, "cuda") &&
			    strcmp(optarg, "null")) {
				fprintf(stderr, "sm70d: --backend must be cpu, cuda or null, not '%s'\n",
					optarg);
				return -1;
			}
			o->backend = optarg;
			break;
		case O_LOAD_FORMAT:
			if (strcmp(optarg, "auto") && strcmp(optarg, "dummy")) {
				fprintf(stderr, "sm70d: --load-format must be auto or dummy, not "
					"'%s'\n", optarg);
				return -1;
			}
			o->load_format = optarg;
			break;
		case O_SOCKET:
			o->socket = optarg;
			break;
		case O_CONFIG:
			o->config = optarg;
			break;
		case O_ADMIN_SOCKET:
			o->admin_socket = optarg;
			break;
		case O_CHECK_CONFIG:
			o->check_config = 1;
			break;
		case O_TP: {
			char *end;
			long v = strtol(optarg, &end, 10);
			if (*optarg == '\0' || *end || v < 1 || v > 4) {
				fprintf(stderr, "sm70d: --tp must be 1..4, not '%s'\n", optarg);
				return -1;
			}
			o->tp = (int)v;
			break;
		}
		case O_GPUS:
			o->gpus = optarg;
			break;
		case 'v':
			o->verbose = 1;
			break;
		case 'h':
			usage(stdout);
			return 1;
		case O_VERSION:
			sm70_print_version(stdout, "sm70d");
			return 1;
		default:
			usage(stderr);
			return -1;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "sm70d: unexpected argument '%s'\n", argv[optind]);
		return -1;
	}
	return 0;
}

/* ---- configuration ------------------------------------------------------------------- */

/* Copies a command-line path into a config field. Returns 0 or -ENAMETOOLONG. */
static int set_path(char *dst, size_t size, const char *src, const char *flag,
		    struct sm70_err *err)
{
	if (strlen(src) >= size)
		return sm70_errf(err, -ENAMETOOLONG, "%s: the path is longer than %zu bytes", flag,
				 size - 1);
	snprintf(dst, size, "%s", src);
	return 0;
}

/* --gpus: a comma-separated list of distinct CUDA device ids, rank order. */
static int parse_gpus(struct sm70__config *c, const char *list, struct sm70_err *err)
{
	const char *p = list;

	c->n_gpus = 0;
	for (;;) {
		char *end;
		long v = strtol(p, &end, 10);

		if (end == p || v < 0 || v > 255 || (*end && *end != ','))
			return sm70_errf(err, -EINVAL, "--gpus: '%s' is not a list of device ids "
					 "0..255 such as 0,1", list);
		for (uint32_t i = 0; i < c->n_gpus; i++)
			if (c->gpus[i] == (uint32_t)v)
				return sm70_errf(err, -EINVAL, "--gpus: %ld is listed twice", v);
		if (c->n_gpus == SM70__CFG_MAX_GPUS)
			return sm70_errf(err, -EINVAL, "--gpus: more than %d ids",
					 SM70__CFG_MAX_GPUS);
		c->gpus[c->n_gpus++] = (uint32_t)v;
		if (!*end)
			return 0;
		p = end + 1;
	}
}

/* With no admin_socket in the file or the flags and no --socket (which the admin socket's
 * name then follows), under a unit with RuntimeDirectory= (which
 * sets $RUNTIME_DIRECTORY, the first of a colon-separated list being ours): the admin socket
 * is RUNTIME_DIRECTORY/admin.sock, the one directory of /run the sandbox lets the daemon
 * write. Elsewhere sm70__config_check derives "<socket>.admin". Returns 0 or
 * -ENAMETOOLONG. */
static int runtime_admin_socket(struct sm70__config *c, struct sm70_err *err)
{
	const char *dir = getenv("RUNTIME_DIRECTORY");
	size_t n;
	int len;

	if (!dir || dir[0] != '/')
		return 0;
	n = strcspn(dir, ":");
	len = snprintf(c->admin_socket_path, sizeof(c->admin_socket_path), "%.*s/admin.sock",
		       (int)n, dir);
	if (len < 0 || (size_t)len >= sizeof(c->admin_socket_path)) {
		c->admin_socket_path[0] = '\0';
		return sm70_errf(err, -ENAMETOOLONG, "admin_socket: $RUNTIME_DIRECTORY/admin.sock "
				 "is longer than %zu bytes; set admin_socket",
				 sizeof(c->admin_socket_path) - 1);
	}
	return 0;
}

/* The configuration: defaults, the file (--config, else the default path if it exists),
 * then the flags, then the whole-configuration checks. Returns 0 or -errno with err
 * naming the key or flag. */
static int configure(struct sm70__config *c, const struct opts *o, const char **loaded,
		     struct sm70_err *err)
{
	const char *path = o->config ? o->config : SM70__CFG_DEFAULT_PATH;
	int ret;

	sm70__config_default(c);
	*loaded = path;
	ret = sm70__config_load(c, path, err);
	if (ret == -ENOENT && !o->config) {
		*loaded = "no config file: defaults and flags";
		ret = 0; /* no system config file: the defaults and the flags */
		sm70_err_clear(err);
	}
	if (ret)
		return ret;
	if (o->model && (ret = set_path(c->model_dir, sizeof(c->model_dir), o->model, "--model",
					err)))
		return ret;
	if (o->backend)
		snprintf(c->backend, sizeof(c->backend), "%s", o->backend);
	if (o->load_format)
		snprintf(c->load_format, sizeof(c->load_format), "%s", o->load_format);
	if (o->tp)
		c->tp = (uint32_t)o->tp;
	if (o->gpus && (ret = parse_gpus(c, o->gpus, err)))
		return ret;
	if (o->socket && (ret = set_path(c->socket_path, sizeof(c->socket_path), o->socket,
					 "--socket", err)))
		return ret;
	if (o->admin_socket && (ret = set_path(c->admin_socket_path,
					       sizeof(c->admin_socket_path), o->admin_socket,
					       "--admin-socket", err)))
		return ret;
	if (!c->admin_socket_path[0] && !o->socket && (ret = runtime_admin_socket(c, err)))
		return ret;
	return sm70__config_check(c, err);
}

/* Exports the fast-path switches for the backend, which reads them when it is created. */
static void export_fast_paths(const struct sm70__config *c)
{
	if (c->fast_paths.matmul[0])
		setenv("SM70_MATMUL", c->fast_paths.matmul, 1);
	if (c->fast_paths.attention[0])
		setenv("SM70_ATTENTION", c->fast_paths.attention, 1);
	if (c->fast_paths.fused[0])
		setenv("SM70_FUSED", strcmp(c->fast_paths.fused, "reference") ? "default" : "0",
		       1);
	if (c->fast_paths.allreduce[0])
		setenv("SM70_ALLREDUCE",
		       strcmp(c->fast_paths.allreduce, "reference") ? "auto" : "nccl", 1);
	if (c->fast_paths.overlap[0])
		setenv("SM70_PDL", strcmp(c->fast_paths.overlap, "reference") ? "prefetch,experts" : "0", 1);
	if (c->fast_paths.gemv_split[0])
		setenv("SM70_GEMV_SPLIT", strcmp(c->fast_paths.gemv_split, "reference") ? "1" : "0",
		       1);
}

/* Bytes of the *.safetensors files in dir: what the weights will take, near enough. */
static uint64_t weight_bytes(const char *dir)
{
	struct dirent *e;
	uint64_t sum = 0;
	DIR *dp = opendir(dir);

	if (!dp)
		return 0;
	while ((e = readdir(dp))) {
		size_t n = strlen(e->d_name);
		struct stat st;

		if (n > 12 && strcmp(e->d_name + n - 12, ".safetensors") == 0 &&
		    fstatat(dirfd(dp), e->d_name, &st, 0) == 0)
			sum += (uint64_t)st.st_size;
	}
	closedir(dp);
	return sum;
}

/* The KV budget of each rank: engine.kv_bytes, or engine.kv_memory_fraction of the memory
 * free now less the rank's share of the weight files (for CUDA on every rank's GPU, the
 * smallest of them, since ranks share block ids and so have equal pools; for the host
 * backends, whose simulated ranks share the host, MemAvailable bounded by the memory
 * cgroup's headroom (host_memory.h), and there at most
 * 1/HOST_KV_SHARE of it: the host also runs the weights' working set, the activations and
 * everything else, so 0.9 of it, a GPU's usual share, would starve them). Returns 0 or
 * -errno with err naming the key. */
static int kv_budget(const struct sm70__config *c, uint64_t *bytes, struct sm70_err *err)
{
	uint64_t avail = UINT64_MAX, used, total, w, host_cap;
	uint32_t ranks = c->tp ? c->tp : 1;

	*bytes = c->engine.kv_bytes;
	if (!(c->engine.kv_memory_fraction > 0)) {
		/* a fixed size no GPU of the ranks could hold fails now, not after the load
		 * (the host backends' check is sm70__config_check's) */
		for (uint32_t r = 0; strcmp(c->backend, "cuda") == 0 && r < ranks &&
		     r < c->n_gpus; r++)
			if (!sm70__gpu_memory((int)c->gpus[r], &used, &total) &&
			    c->engine.kv_bytes > total)
				return sm70_errf(err, -EINVAL, "engine.kv_bytes: %llu bytes is more "
						 "than GPU %u has (%llu bytes); lower it or use "
						 "engine.kv_memory_fraction",
						 (unsigned long long)c->engine.kv_bytes, c->gpus[r],
						 (unsigned long long)total);
		return 0;
	}
	w = weight_bytes(c->model_dir);
	if (strcmp(c->backend, "cuda") == 0) {
		for (uint32_t r = 0; r < ranks && r < c->n_gpus; r++) {
			if (sm70__gpu_memory((int)c->gpus[r], &used, &total))
				return sm70_errf(err, -ENODEV, "engine.kv_memory_fraction: cannot read "
						 "the free memory of GPU %u (is this build without "
						 "CUDA?)", c->gpus[r]);
			if (total - used < avail)
				avail = total - used;
		}
		w /= ranks;
	} else {
		avail = sm70__host_memory_available(NULL) / ranks;
		w /= ranks;
	}
	host_cap = strcmp(c->backend, "cuda") == 0 ? UINT64_MAX : avail / HOST_KV_SHARE;
	avail = avail > w ? avail - w : 0;
	*bytes = (uint64_t)((double)avail * c->engine.kv_memory_fraction);
	if (*bytes > host_cap)
		*bytes = host_cap;
	if (*bytes < (1u << 16))
		return sm70_errf(err, -ENOMEM, "engine.kv_memory_fraction: %g of the free memory "
				 "left after the weights is only %llu bytes",
				 c->engine.kv_memory_fraction, (unsigned long long)*bytes);
	return 0;
}

/* Once the model is loaded: one full context (the model's, or limits.max_context_tokens
 * where lower) should fit the KV cache, or a long job is refused (its prompt) or cut
 * short (its generation) whatever else runs. Says so in the log and in `status`, with
 * both figures in tokens and what to change. */
static void warn_short_kv(struct sm70__daemon *d)
{
	const struct sm70__config *c = &d->cfg;
	int limited = c->limits.max_context_tokens && c->limits.max_context_tokens <
		      d->max_position;
	char *w;

	d->context_tokens = limited ? c->limits.max_context_tokens : d->max_position;
	if (d->kv_tokens >= d->context_tokens || d->n_warnings >= SM70__MAX_WARNINGS)
		return;
	w = d->warnings[d->n_warnings++];
	snprintf(w, sizeof(d->warnings[0]), "the KV cache holds %llu tokens, less than one "
		 "full context of %u tokens (%s): longer jobs are refused or cut short; raise "
		 "%s or lower limits.max_context_tokens", (unsigned long long)d->kv_tokens,
		 d->context_tokens, limited ? "limits.max_context_tokens" :
		 "the model's max_position_embeddings", c->engine.kv_memory_fraction > 0 ?
		 "engine.kv_memory_fraction" : "engine.kv_bytes (or use engine.kv_memory_fraction)");
	sm70__warn("%s", w);
}

/* The engine's options from the configuration and the KV budget kv_budget found. */
static void engine_opts(const struct sm70__config *c, uint64_t kv_bytes,
			struct sm70_engine_opts *eo)
{
	sm70_engine_opts_default(eo);
	eo->backend = c->backend;
	eo->dummy_weights = strcmp(c->load_format, "dummy") == 0;
	eo->tp = (int)c->tp;
	eo->n_gpus = c->n_gpus < 4 ? (int)c->n_gpus : 4;
	for (int g = 0; g < eo->n_gpus; g++)
		eo->gpus[g] = (int)c->gpus[g];
	/* the config parser took only kv_mode.c's words; an unknown one keeps "auto" */
	(void)sm70_engine_opts_kv_mode(eo, c->engine.kv_dtype);
	eo->no_prefix_cache = !c->engine.prefix_cache;
	eo->n_threads = (int)c->engine.n_threads;
	eo->max_seqs = (int)c->engine.max_seqs;
	eo->max_batch_tokens = (int)c->engine.max_batch_tokens;
	eo->block_size = (int)c->engine.block_size;
	eo->kv_bytes = (size_t)kv_bytes;
	eo->state_slots = (int)c->engine.state_slots;
	if (c->engine.batch_invariant)
		eo->batch_invariant = 1;
	if (c->fast_paths.gdn[0])
		eo->gdn_recurrent = strcmp(c->fast_paths.gdn, "reference") == 0;
}

/*
 * --check-config: the configuration, the KV budget against the devices, then the model
 * directory as the start would load it, without its weights' data (sm70_engine_check).
 * Prints one line, OK or the error as the start would log it. Returns the exit status.
 */
static int check_config(struct sm70__daemon *d, int ret, const char *cfg_from,
			struct sm70_err *err)
{
	struct sm70_engine_opts eo;
	const char *name_from;
	char model[160];

	if (!ret)
		ret = kv_budget(&d->cfg, &d->kv_bytes, err);
	if (ret) {
		fprintf(stderr, "sm70d: config: %s\n", err->msg);
		return 2;
	}
	export_fast_paths(&d->cfg);
	engine_opts(&d->cfg, d->kv_bytes, &eo);
	ret = sm70_engine_check(d->cfg.model_dir, &eo, model, sizeof(model), err);
	if (ret) {
		fprintf(stderr, "sm70d: cannot load the model in %s: %s\n", d->cfg.model_dir,
			err->msg[0] ? err->msg : strerror(-ret));
		return 2;
	}
	sm70__model_name_choose(d->cfg.model_name, d->cfg.model_dir, d->model_name, &name_from);
	printf("sm70d: configuration OK (%s): model %s (%s%s; named %s, from %s), backend %s, "
	       "KV cache %llu MiB per rank%s, socket %s, admin socket %s\n", cfg_from,
	       d->cfg.model_dir, model, eo.dummy_weights ? ", dummy weights" : "",
	       d->model_name, name_from, d->cfg.backend, (unsigned long long)(d->kv_bytes >> 20),
	       d->cfg.engine.kv_memory_fraction > 0 ? " (from the free memory now)" : "",
	       d->cfg.socket_path, d->cfg.admin_socket_path);
	return 0;
}

/* ---- signals ------------------------------------------------------------------------- */

struct sigctx {
	struct sm70__daemon *d;
	int fd;
};

static void begin_drain(struct sm70__daemon *d, const char *why)
{
	if (d->draining) {
		/* A second signal: stop waiting for running jobs. */
		sm70__notice("%s again: cancelling the remaining %u jobs now", why, d->n_jobs);
		d->drain_deadline_us = d->now_us;
		return;
	}
	d->draining = 1;
	d->drain_deadline_us = d->now_us + (uint64_t)d->cfg.drain_grace_ms * 1000;
	sm70__notice("%s: draining: no new jobs; %u running jobs get %u ms to finish", why,
		     d->n_jobs, d->cfg.drain_grace_ms);
	sd_notifyf(0, "STOPPING=1\nSTATUS=draining %u jobs", d->n_jobs);
}

static void on_signal(void *arg, int fd, uint32_t revents)
{
	struct sigctx *c = arg;
	struct signalfd_siginfo si;

	while (read(fd, &si, sizeof(si)) == (ssize_t)sizeof(si)) {
		if (si.ssi_signo == SIGTERM)
			begin_drain(c->d, "SIGTERM");
		else if (si.ssi_signo == SIGINT)
			begin_drain(c->d, "SIGINT");
	}
}

/* ---- the main loop ------------------------------------------------------------------- */

static int64_t min_timer(int64_t a, int64_t b)
{
	if (a < 0)
		return b;
	if (b < 0)
		return a;
	return a < b ? a : b;
}

struct watchdog {
	uint64_t interval_us; /* 0: off */
	uint64_t last_us;
	uint64_t steps_at_last;
};

static void watchdog_tick(struct sm70__daemon *d, struct watchdog *w)
{
	if (!w->interval_us || d->now_us - w->last_us < w->interval_us)
		return;
	/* Alive means: the loop runs and, if the engine has work, its steps complete. */
	if (d->step_failures ||
	    (sm70_engine_busy(d->engine) && d->steps_ok == w->steps_at_last))
		return;
	sd_notify(0, "WATCHDOG=1");
	w->last_us = d->now_us;
	w->steps_at_last = d->steps_ok;
}

/* How long the loop may wait before the next ping is due: until last + interval, so that
 * pings stay an interval apart however the waits fall (a wait of a whole interval from
 * just before a ping was due would stretch the gap towards twice it, the full
 * WATCHDOG_USEC). A ping that is due but withheld (failing steps) waits another interval
 * rather than spinning. */
static int64_t watchdog_timer(const struct sm70__daemon *d, const struct watchdog *w)
{
	uint64_t due = w->last_us + w->interval_us;

	return due > d->now_us ? (int64_t)(due - d->now_us) : (int64_t)w->interval_us;
}

static void status_tick(struct sm70__daemon *d, uint64_t *last_us, uint64_t *last_key)
{
	uint64_t key = ((uint64_t)d->n_sessions << 32) | d->n_jobs;

	if (d->now_us - *last_us < 1000000 || key == *last_key)
		return;
	*last_us = d->now_us;
	*last_key = key;
	sd_notifyf(0, "STATUS=%s%s: %u sessions, %u jobs", d->draining ? "draining " : "serving ",
		   d->model_name, d->n_sessions, d->n_jobs);
}

static int run(struct sm70__daemon *d, struct watchdog *wd)
{
	uint64_t flush_deadline = 0, status_us = 0, status_key = ~0ull;
	int ret;

	for (;;) {
		int64_t timeout = 0;

		/* Timers are computed from the time now; the loop sets d->now_us again after its
		 * wait, before any callback stamps anything (accept, hello, signals), and it is
		 * set again after the engine step: no timestamp comes from before a wait or a
		 * step. */
		d->now_us = sm70__now_us();
		if (!sm70__sched_busy(d)) {
			timeout = min_timer(sm70__sessions_next_timer(d),
					    sm70__sched_next_timer(d));
			timeout = min_timer(timeout, sm70__admin_next_timer(d));
			if (d->draining && !d->drain_killed)
				timeout = min_timer(timeout, d->drain_deadline_us > d->now_us ?
					(int64_t)(d->drain_deadline_us - d->now_us) : 0);
			if (flush_deadline)
				timeout = min_timer(timeout, 10000);
			if (wd->interval_us)
				timeout = min_timer(timeout, watchdog_timer(d, wd));
			if (sm70__sessions_sleep_begin(d))
				timeout = 0;
		}
		ret = sm70__loop_run(d->loop, timeout); /* sets d->now_us after the wait */
		sm70__sessions_sleep_end(d);
		if (ret < 0) {
			sm70__err("io_uring wait failed: %s", strerror(-ret));
			return ret;
		}
		sm70__sessions_poll(d);
		sm70__admin_poll(d);
		sm70__sched_tick(d);
		if (d->draining && !d->drain_killed && d->now_us >= d->drain_deadline_us &&
		    d->n_jobs) {
			sm70__notice("drain grace over: cancelling %u jobs", d->n_jobs);
			sm70__sched_kill_all(d, SM70__KILL_SHUTDOWN);
			d->drain_killed = 1;
		}
		sm70__sched_feed(d);
		sm70__sched_step(d);
		d->now_us = sm70__now_us(); /* a step may take long (prefill, a first CUDA call) */
		sm70__metrics_tick(&d->metrics, d->now_us);
		sm70__sessions_publish(d);
		sm70__sessions_reap(d);
		watchdog_tick(d, wd);
		status_tick(d, &status_us, &status_key);
		if (d->fatal) {
			sm70__err("giving up after %d failed engine step(s)", d->step_failures);
			return -EIO;
		}
		if (d->draining && !d->n_jobs) {
			/* Give clients a moment to read final events the ring could not take. */
			if (!flush_deadline)
				flush_deadline = d->now_us + DRAIN_FLUSH_US;
			if (!sm70__sessions_holding(d) || d->now_us >= flush_deadline)
				return 0;
		}
	}
}

/* ---- loading the model -------------------------------------------------------------- */

/*
 * sm70_engine_open runs on a thread of its own; the thread touches nothing but struct
 * loader and, when sm70_engine_open has returned, writes the eventfd the loop watches.
 * Progress comes through the engine's load progress (relaxed atomics). Everything else,
 * sessions included, stays on the loop's thread.
 */
struct loader {
	struct sm70_engine_opts eo;
	const char *dir;
	struct sm70_load_progress progress;
	struct sm70_engine *engine;
	struct sm70_err err;
	int ret;
	int efd;
	int done; /* the loop read the eventfd */
};

static void *loader_main(void *arg)
{
	struct loader *l = arg;
	uint64_t one = 1;

	l->ret = sm70_engine_open(&l->engine, l->dir, &l->eo, &l->err);
	/* a fresh counter far from its maximum: the non-blocking write cannot fail */
	if (write(l->efd, &one, sizeof(one)) != (ssize_t)sizeof(one))
		sm70__err("loader: eventfd write: %s", strerror(errno));
	return NULL;
}

static void on_loaded(void *arg, int fd, uint32_t revents)
{
	struct loader *l = arg;
	uint64_t v;

	if (read(fd, &v, sizeof(v)) == (ssize_t)sizeof(v))
		l->done = 1;
}

static void fmt_bytes(char *b, size_t n, uint64_t v)
{
	if (v >= (1ull << 30))
		snprintf(b, n, "%.1f GiB", (double)v / (1ull << 30));
	else
		snprintf(b, n, "%.0f MiB", (double)v / (1ull << 20));
}

/* "loading qwen3-8b: 42% (6.9 of 16.4 GiB) for 12 s" */
static void load_line(const struct sm70__daemon *d, char *b, size_t n)
{
	uint64_t total = d->load_total > d->load_done ? d->load_total : d->load_done;
	char done[32], all[32];

	fmt_bytes(done, sizeof(done), d->load_done);
	fmt_bytes(all, sizeof(all), total);
	if (total)
		snprintf(b, n, "loading %s: %.0f%% (%s of %s) for %llu s", d->model_name,
			 100.0 * (double)d->load_done / (double)total, done, all,
			 (unsigned long long)((d->now_us - d->load_start_us) / 1000000));
	else
		snprintf(b, n, "loading %s: %s so far, for %llu s", d->model_name, done,
			 (unsigned long long)((d->now_us - d->load_start_us) / 1000000));
}

/*
 * Loads the model while the loop serves the sockets (they are open already): sessions
 * whose hello arrives wait, the admin socket reports the progress, STATUS= and the log
 * show it, a SIGTERM cancels the load. On success d->engine is set. Returns 0, -ECANCELED
 * (a signal stopped the load), or -errno with err naming the problem; on failure every
 * waiting client has been refused with the reason.
 */
static int load_model(struct sm70__daemon *d, const struct sm70_engine_opts *eo,
		      struct watchdog *wd, struct sm70_err *err)
{
	struct sm70__watch *w = NULL;
	struct loader l;
	uint64_t tick_us = 0, log_us;
	int total_shown = 0; /* a status line with the total has gone out */
	pthread_t th;
	char line[200];
	int ret;

	memset(&l, 0, sizeof(l));
	l.eo = *eo;
	l.eo.progress = &l.progress;
	l.dir = d->cfg.model_dir;
	sm70_err_clear(&l.err);
	l.efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (l.efd < 0)
		return sm70_errf(err, -errno, "eventfd: %s", strerror(errno));
	ret = sm70__loop_watch(d->loop, l.efd, POLLIN, on_loaded, &l, &w);
	if (ret) {
		close(l.efd);
		return sm70_errf(err, ret, "cannot watch the loader's eventfd: %s", strerror(-ret));
	}
	d->loading = 1;
	d->now_us = d->load_start_us = log_us = sm70__now_us();
	sm70__info("loading the model in %s on %s", d->cfg.model_dir, d->cfg.backend);
	sd_notifyf(0, "STATUS=loading %s", d->model_name);
	ret = -pthread_create(&th, NULL, loader_main, &l);
	if (ret) {
		sm70_errf(err, ret, "cannot start the loading thread: %s", strerror(-ret));
		goto out;
	}
	while (!l.done) {
		int64_t timeout = (int64_t)(LOAD_TICK_US - (d->now_us - tick_us) % LOAD_TICK_US);
		int64_t t = sm70__sessions_next_timer(d);

		/* until the loader knows its total, look every 50 ms: the first status line
		 * with a percentage should not wait a whole tick */
		if (!total_shown && timeout > (int64_t)LOAD_FIRST_US)
			timeout = (int64_t)LOAD_FIRST_US;

		if (t >= 0 && t < timeout)
			timeout = t;
		t = sm70__admin_next_timer(d);
		if (t >= 0 && t < timeout)
			timeout = t;
		ret = sm70__loop_run(d->loop, timeout);
		d->now_us = sm70__now_us();
		if (ret < 0 && !l.progress.cancel) {
			sm70__err("io_uring wait failed: %s; cancelling the load", strerror(-ret));
			__atomic_store_n(&l.progress.cancel, 1, __ATOMIC_RELAXED);
		}
		sm70__sessions_poll(d); /* hello timeouts, waiting clients that hung up */
		sm70__admin_poll(d);	/* idle admin connections */
		if (d->draining && !__atomic_load_n(&l.progress.cancel, __ATOMIC_RELAXED)) {
			sm70__notice("stopping while the model loads: cancelling the load");
			__atomic_store_n(&l.progress.cancel, 1, __ATOMIC_RELAXED);
		}
		d->load_done = __atomic_load_n(&l.progress.done, __ATOMIC_RELAXED);
		d->load_total = __atomic_load_n(&l.progress.total, __ATOMIC_RELAXED);
		if (d->now_us - tick_us >= LOAD_TICK_US || (!total_shown && d->load_total)) {
			tick_us = d->now_us;
			total_shown = d->load_total > 0;
			load_line(d, line, sizeof(line));
			sd_notifyf(0, "STATUS=%s", line);
			sm70__sessions_loading(d);
			if (d->now_us - log_us >= LOAD_LOG_US) {
				log_us = d->now_us;
				sm70__notice("%s", line);
			}
		}
		/* The loop is alive; an engine that hangs while loading is TimeoutStartSec's. */
		if (wd->interval_us && d->now_us - wd->last_us >= wd->interval_us) {
			sd_notify(0, "WATCHDOG=1");
			wd->last_us = d->now_us;
		}
	}
	pthread_join(th, NULL);
	ret = l.ret;
	if (ret == -ECANCELED || (ret && l.progress.cancel)) {
		ret = -ECANCELED;
		sm70_errf(err, ret, "stopped while loading the model");
	} else if (ret) {
		sm70_errf(err, ret, "cannot load the model in %s: %s", d->cfg.model_dir,
			  l.err.msg[0] ? l.err.msg : strerror(-ret));
	}
out:
	sm70__loop_unwatch(d->loop, w);
	close(l.efd);
	d->loading = 0;
	d->load_end_us = sm70__now_us();
	d->load_done = __atomic_load_n(&l.progress.done, __ATOMIC_RELAXED);
	if (ret) {
		char why[SM70_PROTO_REASON_LEN];

		snprintf(why, sizeof(why), "%.231s", ret == -ECANCELED ?
			 "sm70d stopped while loading its model; retry when it is back" :
			 err->msg);
		sm70__sessions_refuse_waiting(d, ret == -ECANCELED ? SM70_PROTO_E_SHUTDOWN :
					      SM70_PROTO_E_INTERNAL, why);
		sm70__sessions_close_all(d, SM70_PROTO_E_SHUTDOWN, "sm70d did not load its "
					 "model and is stopping");
		sm70__sessions_reap(d);
		return ret;
	}
	d->engine = l.engine;
	sm70__info("model %s loaded in %.1f s", d->model_name,
		   (double)(d->load_end_us - d->load_start_us) * 1e-6);
	return 0;
}

int main(int argc, char **argv)
{
	struct sm70__daemon d;
	struct sm70_engine_opts eo;
	struct sm70_engine_stats st;
	struct sm70_err err;
	struct opts o;
	struct sigctx sc = { .d = &d, .fd = -1 };
	struct watchdog wd = { 0 };
	struct sm70__watch *sig_watch = NULL;
	const struct sm70_model_config *mc;
	const char *cfg_from = NULL, *name_from = NULL;
	sigset_t mask;
	uint64_t usec = 0;
	int ret, code = 2;

	ret = parse_args(argc, argv, &o);
	if (ret)
		return ret > 0 ? 0 : 2;
	if (o.verbose)
		sm70__log_set_level(SM70__LOG_DEBUG);

	memset(&d, 0, sizeof(d));
	d.listen_fd = -1;
	d.admin_fd = -1;
	sm70_err_clear(&err);
	ret = configure(&d.cfg, &o, &cfg_from, &err);
	if (o.check_config)
		return check_config(&d, ret, cfg_from, &err);
	if (ret) {
		sm70__err("config: %s", err.msg);
		return 2;
	}
	sm70__info("configuration: %s", cfg_from);
	export_fast_paths(&d.cfg);
	ret = kv_budget(&d.cfg, &d.kv_bytes, &err);
	if (ret) {
		sm70__err("config: %s", err.msg);
		return 2;
	}
	if (d.cfg.engine.kv_memory_fraction > 0 && strcmp(d.cfg.backend, "cuda") == 0) {
		sm70__info("KV cache: %llu MiB per rank (engine.kv_memory_fraction %g of the free "
			   "GPU memory less the weights)", (unsigned long long)(d.kv_bytes >> 20),
			   d.cfg.engine.kv_memory_fraction);
	} else if (d.cfg.engine.kv_memory_fraction > 0) {
		const char *bound;
		uint64_t avail = sm70__host_memory_available(&bound);

		sm70__info("KV cache: %llu MiB per rank (engine.kv_memory_fraction %g of the free "
			   "host memory less the weights, at most a quarter of it; free: %llu MiB "
			   "by %s)", (unsigned long long)(d.kv_bytes >> 20),
			   d.cfg.engine.kv_memory_fraction, (unsigned long long)(avail >> 20),
			   bound);
	}

	/* Signals arrive through a signalfd; block them before the engine starts its worker
	 * threads, which inherit the mask. */
	sigemptyset(&mask);
	sigaddset(&mask, SIGTERM);
	sigaddset(&mask, SIGINT);
	sigprocmask(SIG_BLOCK, &mask, NULL);
	signal(SIGPIPE, SIG_IGN);

	/* The loop and both sockets first: they serve while the model loads. */
	code = 1;
	ret = sm70__loop_create(&d.loop, 256);
	if (ret) {
		sm70__err("io_uring setup failed: %s", strerror(-ret));
		goto out_engine;
	}
	sm70__loop_set_clock(d.loop, &d.now_us);
	sc.fd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
	if (sc.fd < 0 || sm70__loop_watch(d.loop, sc.fd, POLLIN, on_signal, &sc, &sig_watch)) {
		sm70__err("signalfd: %s", strerror(errno));
		goto out_loop;
	}
	d.now_us = sm70__now_us();
	sm70__metrics_init(&d.metrics, d.now_us);
	sm70__model_name_choose(d.cfg.model_name, d.cfg.model_dir, d.model_name, &name_from);
	sm70__info("model name %s (from %s)", d.model_name, name_from);
	code = 2;
	ret = sm70__listener_open(&d, &err);
	if (ret) {
		sm70__err("%s", err.msg);
		goto out_signal;
	}
	ret = sm70__admin_open(&d, &err);
	if (ret) {
		sm70__err("%s", err.msg);
		goto out_listener;
	}
	if (sd_watchdog_enabled(0, &usec) > 0 && usec)
		wd.interval_us = usec / 2;
	wd.last_us = sm70__now_us();

	engine_opts(&d.cfg, d.kv_bytes, &eo);
	ret = load_model(&d, &eo, &wd, &err);
	if (ret == -ECANCELED) {
		sm70__notice("%s; exiting", err.msg);
		code = 0;
		goto out_admin;
	}
	if (ret) {
		sm70__err("%s", err.msg);
		goto out_admin; /* code 2: the model (or the machine) is wrong, not the run */
	}
	mc = sm70_engine_model_config(d.engine);
	sm70_engine_get_stats(d.engine, &st);
	if (st.prefix_cache_off && d.cfg.engine.prefix_cache)
		sm70__notice("prefix cache off for this %s model: %s", mc->model_type,
			     st.prefix_cache_off);
	if (st.pinned_bytes)
		sm70__notice("n-gram tables: %llu bytes of page-locked host memory",
			     (unsigned long long)st.pinned_bytes);
	if (st.state_slots_total)
		sm70__notice("recurrent state: %d sequence slots, %llu bytes", st.state_slots_total,
			     (unsigned long long)st.state_bytes);
	d.vocab_size = (uint32_t)mc->vocab_size;
	d.max_position = (uint32_t)mc->max_position;
	d.kv_tokens = (uint64_t)st.kv_blocks_total * d.cfg.engine.block_size;
	warn_short_kv(&d);
	d.n_eos = mc->n_eos < 8 ? mc->n_eos : 8;
	for (int i = 0; i < d.n_eos; i++)
		d.eos_ids[i] = mc->eos_ids[i];
	d.seed_state = sm70__now_us() ^ ((uint64_t)getpid() << 32);
	sm70__info("model %s loaded on %s: vocab %u, context %u, KV cache %llu tokens",
		   d.model_name, d.cfg.backend, d.vocab_size, d.max_position,
		   (unsigned long long)d.kv_tokens);
	if (st.clamped_weights)
		sm70__notice("%llu weights were beyond the f16 range and were clamped to +-65504",
			     (unsigned long long)st.clamped_weights);

	code = 1;
	sm70__sessions_model_ready(&d); /* the clients that waited for the load */
	sd_notifyf(0, "READY=1\nSTATUS=serving %s on %s", d.model_name,
		   d.listen_unlink ? d.cfg.socket_path : "the socket from systemd");
	sm70__notice("ready: serving %s", d.model_name);

	ret = run(&d, &wd);
	code = ret ? 1 : 0;

	sd_notify(0, "STOPPING=1\nSTATUS=stopping");
	sm70__sessions_close_all(&d, code ? SM70_PROTO_E_INTERNAL : SM70_PROTO_E_SHUTDOWN,
				 code ? "sm70d is stopping after a failure; see its log" :
				 "sm70d is shutting down; reconnect when it is back");
	/* Let the engine emit the final events of the cancelled jobs, so that every job and
	 * session is freed before the engine goes. */
	for (int i = 0; i < 1000 && sm70_engine_busy(d.engine); i++)
		if (sm70__sched_step(&d) < 0)
			break;
	sm70__sessions_reap(&d);
	if (code == 0)
		sm70__notice("drained; exiting");
out_admin:
	sm70__admin_close(&d);
out_listener:
	sm70__listener_close(&d);
out_signal:
	sm70__loop_unwatch(d.loop, sig_watch);
	if (sc.fd >= 0)
		close(sc.fd);
out_loop:
	sm70__loop_destroy(d.loop);
out_engine:
	sm70_engine_close(d.engine);
	return code;
}
