/*
 * metrics.c - counters, histograms and the Prometheus text; see metrics.h.
 *
 * Bucket bounds are fixed at build time and chosen for decode on one host: TTFT from 1 ms
 * (a cached prompt on a GPU) to 30 s (a long prefill behind a full batch), inter-token
 * latency from 0.5 ms to 2.5 s, request duration from 10 ms to 10 min. Changing a bound
 * changes the series, so they are part of the interface (docs/OBSERVABILITY.md).
 */
#include "daemon/metrics.h"

#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "common/version.h"
#include "daemon/build_info.h"
#include "daemon/daemon.h"
#include "daemon/session.h"

static const double ttft_bounds[] = { 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
				      0.5, 1, 2.5, 5, 10, 30 };
static const double itl_bounds[] = { 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
				     0.25, 0.5, 1, 2.5 };
static const double duration_bounds[] = { 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60,
					   120, 300, 600 };

#define N_OF(a) ((int)(sizeof(a) / sizeof((a)[0])))

_Static_assert(N_OF(ttft_bounds) <= SM70__HIST_MAX_BUCKETS, "too many buckets");
_Static_assert(N_OF(itl_bounds) <= SM70__HIST_MAX_BUCKETS, "too many buckets");
_Static_assert(N_OF(duration_bounds) <= SM70__HIST_MAX_BUCKETS, "too many buckets");

void sm70__metrics_init(struct sm70__metrics *m, uint64_t now_us)
{
	memset(m, 0, sizeof(*m));
	m->start_us = now_us;
	m->ttft.bounds = ttft_bounds;
	m->ttft.n_bounds = N_OF(ttft_bounds);
	m->itl.bounds = itl_bounds;
	m->itl.n_bounds = N_OF(itl_bounds);
	m->duration.bounds = duration_bounds;
	m->duration.n_bounds = N_OF(duration_bounds);
	/* queueing and prefill span TTFT's range between them, decode the request's */
	m->queue.bounds = ttft_bounds;
	m->queue.n_bounds = N_OF(ttft_bounds);
	m->prefill.bounds = ttft_bounds;
	m->prefill.n_bounds = N_OF(ttft_bounds);
	m->decode.bounds = duration_bounds;
	m->decode.n_bounds = N_OF(duration_bounds);
}

void sm70__metrics_job_times(struct sm70__metrics *m, uint64_t t_accept, uint64_t t_sched,
			     uint64_t t_first, uint64_t t_last)
{
	if (!t_sched)
		return; /* ended in its client's queue: neither prefilled nor decoded */
	sm70__hist_observe(&m->queue, (double)(t_sched - t_accept) * 1e-6);
	if (!t_first)
		return;
	sm70__hist_observe(&m->prefill, (double)(t_first - t_sched) * 1e-6);
	sm70__hist_observe(&m->decode, (double)(t_last - t_first) * 1e-6);
}

void sm70__hist_observe(struct sm70__hist *h, double seconds)
{
	int i;

	if (!(seconds > 0))
		seconds = 0; /* also NaN */
	for (i = 0; i < h->n_bounds && seconds > h->bounds[i]; i++)
		;
	h->buckets[i]++;
	h->count++;
	h->sum += seconds;
}

void sm70__metrics_finished(struct sm70__metrics *m, unsigned int reason)
{
	if (reason > SM70_PROTO_FINISH_ERROR)
		reason = 0; /* rendered as "unknown" */
	m->finished[reason]++;
}

void sm70__metrics_client_error(struct sm70__metrics *m, int code)
{
	if (code < 0)
		code = -code;
	if (code <= 0 || code >= SM70_PROTO_E__COUNT)
		code = SM70_PROTO_E__COUNT;
	m->client_errors[code]++;
}

void sm70__metrics_tick(struct sm70__metrics *m, uint64_t now_us)
{
	uint32_t last = (m->rate_next + SM70__RATE_SAMPLES - 1) % SM70__RATE_SAMPLES;

	if (m->rate_n && now_us - m->rate[last].t_us < 1000000)
		return;
	m->rate[m->rate_next].t_us = now_us;
	m->rate[m->rate_next].tokens = m->generation_tokens;
	m->rate_next = (m->rate_next + 1) % SM70__RATE_SAMPLES;
	if (m->rate_n < SM70__RATE_SAMPLES)
		m->rate_n++;
}

double sm70__metrics_token_rate(const struct sm70__metrics *m, uint64_t now_us,
				double *window_s)
{
	uint32_t oldest;
	double dt;

	*window_s = 0;
	if (!m->rate_n)
		return 0;
	oldest = (m->rate_next + SM70__RATE_SAMPLES - m->rate_n) % SM70__RATE_SAMPLES;
	dt = (double)(now_us - m->rate[oldest].t_us) * 1e-6;
	if (dt <= 0)
		return 0;
	*window_s = dt;
	return (double)(m->generation_tokens - m->rate[oldest].tokens) / dt;
}

/* The CUDA runtime is in the process only when sm70d was linked with the CUDA backend; look
 * it up at run time so that this file needs no CUDA headers and the CPU build no CUDA. */
int sm70__gpu_memory(int dev, uint64_t *used, uint64_t *total)
{
	typedef int (*get_device_fn)(int *);
	typedef int (*set_device_fn)(int);
	typedef int (*mem_get_info_fn)(size_t *, size_t *);
	get_device_fn get_device = (get_device_fn)dlsym(RTLD_DEFAULT, "cudaGetDevice");
	set_device_fn set_device = (set_device_fn)dlsym(RTLD_DEFAULT, "cudaSetDevice");
	mem_get_info_fn mem_get_info = (mem_get_info_fn)dlsym(RTLD_DEFAULT, "cudaMemGetInfo");
	size_t f = 0, t = 0;
	int cur = -1, ret = 0;

	*used = *total = 0;
	if (!get_device || !set_device || !mem_get_info)
		return -ENODEV;
	/* Switching devices is safe: every backend op makes its own device current first
	 * (cuda_check.h, sm70__cuda_enter); the previous one is restored all the same. */
	if (get_device(&cur) != 0)
		cur = -1;
	if (set_device(dev) != 0 || mem_get_info(&f, &t) != 0 || f > t)
		ret = -ENODEV;
	if (cur >= 0 && cur != dev)
		set_device(cur);
	if (ret)
		return ret;
	*used = (uint64_t)(t - f);
	*total = (uint64_t)t;
	return 0;
}

const char *sm70__error_label(int code)
{
	static const char *const names[SM70_PROTO_E__COUNT] = {
		"ok", "invalid", "too_large", "busy", "no_memory", "cancelled", "shutdown",
		"version", "denied", "slow_consumer", "internal", "unsupported", "loading",
	};

	if (code < 0)
		code = -code;
	if (code <= 0 || code >= SM70_PROTO_E__COUNT || !names[code])
		return "unknown";
	return names[code];
}

const char *sm70__finish_label(unsigned int reason)
{
	static const char *const names[] = {
		"unknown", "length", "stop_eos", "stop_token", "cancelled", "deadline", "error",
	};

	if (reason >= sizeof(names) / sizeof(names[0]))
		return "unknown";
	return names[reason];
}

/* ---- the text ------------------------------------------------------------------------ */

struct out {
	char *p;
	size_t size, len;
	int full;
};

static void put(struct out *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void put(struct out *o, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (o->full)
		return;
	va_start(ap, fmt);
	n = vsnprintf(o->p + o->len, o->size - o->len, fmt, ap);
	va_end(ap);
	if (n < 0 || (size_t)n >= o->size - o->len) {
		o->full = 1;
		return;
	}
	o->len += (size_t)n;
}

static void head(struct out *o, const char *name, const char *type, const char *help)
{
	put(o, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void hist(struct out *o, const char *name, const char *help, const struct sm70__hist *h)
{
	uint64_t cum = 0;

	head(o, name, "histogram", help);
	for (int i = 0; i < h->n_bounds; i++) {
		cum += h->buckets[i];
		put(o, "%s_bucket{le=\"%g\"} %llu\n", name, h->bounds[i], (unsigned long long)cum);
	}
	cum += h->buckets[h->n_bounds];
	put(o, "%s_bucket{le=\"+Inf\"} %llu\n", name, (unsigned long long)cum);
	put(o, "%s_sum %.9g\n", name, h->sum);
	put(o, "%s_count %llu\n", name, (unsigned long long)h->count);
}

static void scalar(struct out *o, const char *name, const char *type, const char *help,
		   double v)
{
	head(o, name, type, help);
	put(o, "%s %.17g\n", name, v);
}

int sm70__metrics_render(struct sm70__daemon *d, char *buf, size_t size)
{
	const struct sm70__metrics *m = &d->metrics;
	struct out o = { .p = buf, .size = size };
	struct sm70_engine_stats st;
	uint32_t clients = 0, queued = 0;
	double kv = 0;

	if (!size)
		return -ENOSPC;
	buf[0] = '\0';
	memset(&st, 0, sizeof(st)); /* no engine yet while the model loads */
	if (d->engine)
		sm70_engine_get_stats(d->engine, &st);
	for (const struct sm70__session *s = d->sessions; s; s = s->next) {
		clients += s->state == SM70__SESSION_ACTIVE;
		queued += s->n_queued;
	}
	if (st.kv_blocks_total > 0)
		kv = (double)(st.kv_blocks_total - st.kv_blocks_free) / st.kv_blocks_total;

	hist(&o, "sm70_time_to_first_token_seconds", "Time from accepting a job to posting its "
	     "first token.", &m->ttft);
	hist(&o, "sm70_inter_token_latency_seconds", "Time between two successive tokens posted "
	     "for the same job.", &m->itl);
	hist(&o, "sm70_request_duration_seconds", "Time from accepting a job to its final "
	     "event, whatever the reason.", &m->duration);
	hist(&o, "sm70_request_queue_seconds", "Time a job waited between acceptance and "
	     "entering the engine (observed when it ends, for jobs that entered it).", &m->queue);
	hist(&o, "sm70_request_prefill_seconds", "Time from entering the engine to the first "
	     "token posted: the prefill and any wait for a batch slot (jobs with a token).",
	     &m->prefill);
	hist(&o, "sm70_request_decode_seconds", "Time from the first token posted to the last "
	     "(jobs with a token).", &m->decode);

	head(&o, "sm70_build_info", "gauge", "Always 1; the labels say what this sm70d was "
	     "built from: release, git revision, the backend it runs, the CUDA release of the "
	     "build (none without CUDA).");
	put(&o, "sm70_build_info{version=\"%s\",git=\"%s\",backend=\"%s\",cuda=\"%s\"} 1\n",
	    sm70_version(), sm70_git_describe(), d->cfg.backend, sm70__build_cuda);
	/* The model's name as an info metric rather than a label on every series: one daemon
	 * serves one model, and a renamed model keeps every other series (join with
	 * `* on(instance) group_left(model) sm70_model_info`). The name cannot hold '"' or
	 * '\' (model_name.h), so it needs no escaping. */
	head(&o, "sm70_model_info", "gauge", "Always 1; the labels name the model served "
	     "(model_name, else from the checkpoint), its backend and tensor-parallel ranks.");
	put(&o, "sm70_model_info{model=\"%s\",backend=\"%s\",tp=\"%u\"} 1\n", d->model_name,
	    d->cfg.backend, d->cfg.tp);
	scalar(&o, "sm70_kv_cache_tokens", "gauge", "Tokens the KV cache holds over all "
	       "sequences (0 while loading).", (double)d->kv_tokens);
	scalar(&o, "sm70_model_context_tokens", "gauge", "One full context: the model's "
	       "max_position_embeddings, or limits.max_context_tokens where lower (0 while "
	       "loading); above sm70_kv_cache_tokens, a long job cannot fit.",
	       (double)d->context_tokens);

	scalar(&o, "sm70_requests_running", "gauge", "Jobs in the engine's running batch.",
	       st.running);
	scalar(&o, "sm70_requests_waiting", "gauge", "Accepted jobs not running yet (client "
	       "queues and the engine's wait queue).", (double)queued + st.waiting);
	scalar(&o, "sm70_kv_cache_usage_ratio", "gauge", "Fraction of KV cache blocks held by "
	       "jobs (prefix-cache blocks no job holds count as free).", kv);
	scalar(&o, "sm70_clients_connected", "gauge", "Client sessions past the handshake.",
	       clients);
	scalar(&o, "sm70_model_loading", "gauge", "1 while the model loads (clients that "
	       "connect wait for their welcome), else 0.", d->loading ? 1.0 : 0.0);
	scalar(&o, "sm70_model_load_bytes", "gauge", "Bytes of weights the model load has "
	       "placed on the devices (final once loaded).", (double)d->load_done);
	scalar(&o, "sm70_model_load_total_bytes", "gauge", "Bytes of weights the model load "
	       "places (0 while unknown; estimated for dummy weights).", (double)d->load_total);
	scalar(&o, "sm70_model_load_seconds", "gauge", "How long the model load took, or has "
	       "taken so far.", (double)((d->loading ? sm70__now_us() : d->load_end_us) -
					 d->load_start_us) * 1e-6);
	head(&o, "sm70_gpu_memory_used_bytes", "gauge", "Memory in use on each GPU sm70d uses "
	     "(device-wide, as cudaMemGetInfo reports it); no samples on the CPU backend.");
	if (strcmp(d->cfg.backend, "cuda") == 0) {
		uint64_t used, total;

		for (uint32_t i = 0; i < d->cfg.tp && i < d->cfg.n_gpus; i++)
			if (sm70__gpu_memory((int)d->cfg.gpus[i], &used, &total) == 0)
				put(&o, "sm70_gpu_memory_used_bytes{gpu=\"%u\"} %llu\n",
				    d->cfg.gpus[i], (unsigned long long)used);
	}

	scalar(&o, "sm70_preemptions_total", "counter", "Running jobs preempted (KV freed, "
	       "recomputed later) because the KV cache ran out.", (double)st.preemptions);
	scalar(&o, "sm70_prompt_tokens_total", "counter", "Prompt tokens of jobs that entered "
	       "the engine.", (double)m->prompt_tokens);
	scalar(&o, "sm70_generation_tokens_total", "counter", "Tokens generated for jobs.",
	       (double)m->generation_tokens);
	scalar(&o, "sm70_prefix_cache_queries_total", "counter", "Prefix-cache lookups: one per "
	       "admission of a job while the cache is on (a preempted job readmitted looks up "
	       "again).", (double)st.prefix_queries);
	scalar(&o, "sm70_prefix_cache_query_tokens_total", "counter", "Tokens of the sequences "
	       "looked up (the denominator of a token hit rate).",
	       (double)st.prefix_query_tokens);
	scalar(&o, "sm70_prefix_cache_hits_total", "counter", "Lookups that found at least one "
	       "cached block.", (double)st.prefix_hits);
	scalar(&o, "sm70_prefix_cache_hit_blocks_total", "counter", "KV blocks the lookups found "
	       "in the prefix cache.", (double)st.prefix_hit_blocks);
	scalar(&o, "sm70_prefix_cache_hit_tokens_total", "counter", "Prompt tokens whose KV came "
	       "from the prefix cache instead of being computed.", (double)st.prefix_hit_tokens);
	scalar(&o, "sm70_prefix_cache_enabled", "gauge", "1 when the prefix cache is on; 0 when "
	       "configured off or the model's recurrent state cannot be restored at a cached "
	       "prefix (sm70ctl status says which).", st.prefix_cache_off ? 0.0 : 1.0);
	scalar(&o, "sm70_state_slots", "gauge", "Recurrent-state slots (one per running "
	       "sequence of a model with DeltaNet layers; 0 for other models).",
	       (double)st.state_slots_total);
	scalar(&o, "sm70_state_slots_free", "gauge", "Recurrent-state slots not held by a "
	       "sequence.", (double)st.state_slots_free);
	scalar(&o, "sm70_state_bytes", "gauge", "Bytes of recurrent-state memory over all "
	       "ranks.", (double)st.state_bytes);
	scalar(&o, "sm70_pinned_host_bytes", "gauge", "Page-locked host memory the model "
	       "holds (qwen4_exp n-gram tables; 0 for other models).", (double)st.pinned_bytes);
	scalar(&o, "sm70_step_weight_bytes", "gauge", "Bytes of weights a decode step reads, "
	       "the experts of MoE layers aside.", (double)st.weight_bytes);
	scalar(&o, "sm70_step_expert_bytes", "gauge", "Bytes of MoE expert weights the last "
	       "step read: only the experts its tokens were routed to (0 without MoE layers).",
	       (double)st.expert_bytes);
	head(&o, "sm70_requests_finished_total", "counter", "Jobs ended, by finish reason.");
	for (unsigned int r = 1; r <= SM70_PROTO_FINISH_ERROR; r++)
		put(&o, "sm70_requests_finished_total{reason=\"%s\"} %llu\n",
		    sm70__finish_label(r), (unsigned long long)m->finished[r]);
	if (m->finished[0])
		put(&o, "sm70_requests_finished_total{reason=\"unknown\"} %llu\n",
		    (unsigned long long)m->finished[0]);
	head(&o, "sm70_client_errors_total", "counter", "Errors sent to clients (ERROR events, "
	     "refused connections, FINISH with an error), by protocol error code.");
	for (int c = 1; c <= SM70_PROTO_E__COUNT; c++) {
		if (c == SM70_PROTO_E_CANCELLED)
			continue; /* never sent as an error: cancellation is a finish reason */
		if (c == SM70_PROTO_E__COUNT && !m->client_errors[c])
			continue;
		put(&o, "sm70_client_errors_total{code=\"%s\"} %llu\n", sm70__error_label(c),
		    (unsigned long long)m->client_errors[c]);
	}
	return o.full ? -ENOSPC : (int)o.len;
}
