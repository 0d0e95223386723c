/*
 * metrics.h - sm70d's counters, gauges and histograms, and their Prometheus text.
 *
 * The scheduler and the sessions update the counters and histograms where things happen
 * (a job's first token, each later token, its end, an error sent to a client). Gauges
 * (running/waiting jobs, KV usage, clients, GPU memory) and the engine's own counters
 * (preemptions, prefix-cache hits) are read when the text is rendered, so they cost
 * nothing between scrapes. Everything runs on the daemon's one thread: no atomics.
 * docs/OBSERVABILITY.md lists every metric and its meaning.
 *
 * Non-goals: an HTTP endpoint (sm70ctl metrics, or a textfile collector, carries the text
 * to Prometheus), summaries/quantiles, per-client series.
 */
#ifndef SM70_DAEMON_METRICS_H
#define SM70_DAEMON_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "shm_proto/sm70_proto.h"

#define SM70__HIST_MAX_BUCKETS 20
#define SM70__RATE_SAMPLES 16 /* one a second: tokens/s over the last ~15 s */

/* A histogram with fixed upper bounds (seconds); the +Inf bucket is implicit. */
struct sm70__hist {
	const double *bounds;
	int n_bounds;
	uint64_t buckets[SM70__HIST_MAX_BUCKETS + 1]; /* not cumulative; the last is +Inf */
	uint64_t count;
	double sum;
};

struct sm70__metrics {
	uint64_t start_us; /* CLOCK_MONOTONIC at start-up, for uptime */
	struct sm70__hist ttft;	    /* accepted -> first token posted */
	struct sm70__hist itl;	    /* between two tokens posted for the same job */
	struct sm70__hist duration; /* accepted -> final event */
	/* each job's phases, observed at its end (the times its FINISH usage reports) */
	struct sm70__hist queue;   /* accepted -> handed to the engine */
	struct sm70__hist prefill; /* handed to the engine -> first token posted */
	struct sm70__hist decode;  /* first -> last token posted */
	uint64_t prompt_tokens;	    /* prompt tokens of jobs that entered the engine */
	uint64_t generation_tokens; /* tokens the engine generated for jobs */
	uint64_t finished[SM70_PROTO_FINISH_ERROR + 1]; /* by finish reason */
	uint64_t client_errors[SM70_PROTO_E__COUNT + 1]; /* by code; the last: unknown */

	/* (time, generation_tokens) once a second, a ring, for tokens/s in status */
	struct {
		uint64_t t_us, tokens;
	} rate[SM70__RATE_SAMPLES];
	uint32_t rate_n, rate_next;
};

struct sm70__daemon;

/* Zeroes m and sets up the histograms' buckets; now_us is the start-up time. */
void sm70__metrics_init(struct sm70__metrics *m, uint64_t now_us);

/* Adds one observation (seconds, clamped at 0) to h. */
void sm70__hist_observe(struct sm70__hist *h, double seconds);

/* A job ended with protocol finish reason `reason` (SM70_PROTO_FINISH_*). */
void sm70__metrics_finished(struct sm70__metrics *m, unsigned int reason);

/* A job ended: observes its queue wait (if it reached the engine), prefill (if it got a
 * first token) and decode time; the arguments are its CLOCK_MONOTONIC stamps in us, 0
 * for a phase it never reached. */
void sm70__metrics_job_times(struct sm70__metrics *m, uint64_t t_accept, uint64_t t_sched,
			     uint64_t t_first, uint64_t t_last);

/* The daemon sent error `code` (SM70_PROTO_E_*) to a client: an ERROR event, a refused
 * connection, or a FINISH carrying an error. */
void sm70__metrics_client_error(struct sm70__metrics *m, int code);

/* Records a tokens/s sample if a second has passed since the last one. Cheap; call once
 * per loop iteration. */
void sm70__metrics_tick(struct sm70__metrics *m, uint64_t now_us);

/* Generated tokens per second over the last ~15 s (the oldest sample still kept), and
 * the window it covers in *window_s (0 right after start-up, then the rate is 0). */
double sm70__metrics_token_rate(const struct sm70__metrics *m, uint64_t now_us,
				double *window_s);

/* GPU memory of CUDA device `dev` through the CUDA runtime linked into sm70d, if there is
 * one (the current device is left as it was). Returns 0, or -ENODEV (no CUDA runtime in
 * this build, or the query failed). */
int sm70__gpu_memory(int dev, uint64_t *used, uint64_t *total);

/* The Prometheus text exposition (format 0.0.4) of every metric into buf (NUL-terminated).
 * Returns its length, or -ENOSPC if size is too small (buf then holds a truncated text). */
int sm70__metrics_render(struct sm70__daemon *d, char *buf, size_t size);

/* Lower-case label value for an error code ("invalid", "busy", ..., "unknown") and for a
 * finish reason ("length", "stop_eos", ..., "unknown"). */
const char *sm70__error_label(int code);
const char *sm70__finish_label(unsigned int reason);

#endif
