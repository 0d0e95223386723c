/*
 * scheduler.c - jobs between the sessions and the engine; see scheduler.h.
 *
 * The engine is first-come-first-served and knows nothing of clients, so fairness lives
 * here: a job waits in its client's queue and enters the engine only when the engine has
 * a free running slot or fewer than feed_depth jobs waiting. The next job comes from the
 * client whose queue head has the highest priority, then the one with the fewest jobs in
 * the engine, ties broken round robin after the client fed last. A client whose event ring
 * is full (events held) is not fed at all.
 *
 * Running jobs are not left to finish when that is unfair: with the engine full, a client
 * below its share of the running slots (max_seqs / clients with work, at least 1) gets the
 * head of the engine's queue, and the client holding the most jobs above its share gives
 * up its newest running one of no higher priority, which the engine parks (its KV freed;
 * recomputed, with the same tokens, when resumed). So a newly arrived client's job starts
 * within an engine step or two, not after another client's whole jobs.
 *
 * The engine's request tag is the job pointer: its events find the job without a lookup,
 * and the job (and so its session) lives until the engine's final event for it.
 */
#include "daemon/scheduler.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/log.h"
#include "daemon/session.h"

static uint64_t splitmix64(uint64_t *state)
{
	uint64_t z = (*state += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* ---- the per-client lists ------------------------------------------------------------ */

static void queue_insert(struct sm70__session *s, struct sm70__job *j)
{
	struct sm70__job **pp = &s->queue;

	/* by priority, highest first; FIFO among equals */
	while (*pp && (*pp)->priority >= j->priority)
		pp = &(*pp)->next_queued;
	j->next_queued = *pp;
	*pp = j;
	s->n_queued++;
}

static void queue_remove(struct sm70__session *s, struct sm70__job *j)
{
	for (struct sm70__job **pp = &s->queue; *pp; pp = &(*pp)->next_queued)
		if (*pp == j) {
			*pp = j->next_queued;
			j->next_queued = NULL;
			s->n_queued--;
			return;
		}
}

static struct sm70__job *find_tag(struct sm70__session *s, uint64_t tag)
{
	for (struct sm70__job *j = s->jobs; j; j = j->next_in_session)
		if (j->tag == tag)
			return j;
	return NULL;
}

static struct sm70__job *find_serial(struct sm70__session *s, uint64_t serial)
{
	for (struct sm70__job *j = s->jobs; j; j = j->next_in_session)
		if (j->serial == serial)
			return j;
	return NULL;
}

/* ---- final events --------------------------------------------------------------------- */

static void kill_reason(enum sm70__kill k, uint16_t *reason, int32_t *error)
{
	*error = 0;
	switch (k) {
	case SM70__KILL_NONE:
	case SM70__KILL_CANCEL:
	case SM70__KILL_HANGUP:
		*reason = SM70_PROTO_FINISH_CANCELLED;
		break;
	case SM70__KILL_DEADLINE:
		*reason = SM70_PROTO_FINISH_DEADLINE;
		break;
	case SM70__KILL_SLOW:
		*reason = SM70_PROTO_FINISH_ERROR;
		*error = SM70_PROTO_E_SLOW_CONSUMER;
		break;
	case SM70__KILL_SHUTDOWN:
		*reason = SM70_PROTO_FINISH_ERROR;
		*error = SM70_PROTO_E_SHUTDOWN;
		break;
	case SM70__KILL_INTERNAL:
		*reason = SM70_PROTO_FINISH_ERROR;
		*error = SM70_PROTO_E_INTERNAL;
		break;
	}
}

/* Posts the job's FINISH (unless its client is gone) and frees it. */
static void finish_job(struct sm70__daemon *d, struct sm70__job *j, uint16_t reason,
		       int32_t error)
{
	struct sm70__session *s = j->s;
	struct sm70_proto_eqe ev;

	memset(&ev, 0, sizeof(ev));
	ev.type = SM70_PROTO_EV_FINISH;
	ev.tag = j->tag;
	ev.u.finish.reason = reason;
	ev.u.finish.error = error;
	ev.u.finish.prompt_tokens = j->prompt_len;
	ev.u.finish.completion_tokens = j->n_posted;
	ev.u.finish.cached_prompt_tokens = j->cached_tokens;
	ev.u.finish.queue_us = j->t_sched_us ? j->t_sched_us - j->t_accept_us : 0;
	ev.u.finish.ttft_us = j->t_first_us ? j->t_first_us - j->t_accept_us : 0;
	ev.u.finish.decode_us = j->t_first_us ? j->t_last_us - j->t_first_us : 0;
	if (j->kill != SM70__KILL_HANGUP)
		sm70__session_post(d, s, &ev, 0);
	sm70__hist_observe(&d->metrics.duration, (double)(sm70__now_us() - j->t_accept_us) * 1e-6);
	sm70__metrics_job_times(&d->metrics, j->t_accept_us, j->t_sched_us, j->t_first_us,
				j->t_last_us);
	sm70__metrics_finished(&d->metrics, reason);
	if (error)
		sm70__metrics_client_error(&d->metrics, error);
	sm70__debug("session %u: job %llu (tag %llu) finished: reason %u error %d, %u tokens",
		    s->id, (unsigned long long)j->serial, (unsigned long long)j->tag, reason,
		    error, j->n_posted);

	if (!j->in_engine) {
		queue_remove(s, j);
	} else {
		d->n_engine_jobs--;
		if (j->parked)
			s->n_parked--;
		else
			s->n_eng--;
	}
	if (j->prev_in_session)
		j->prev_in_session->next_in_session = j->next_in_session;
	else
		s->jobs = j->next_in_session;
	if (j->next_in_session)
		j->next_in_session->prev_in_session = j->prev_in_session;
	s->n_jobs--;
	s->use->jobs--;
	d->n_jobs--;
	sm70__prompt_pool_free(&s->prompts, j->prompt);
	free(j);
}

/* Ends a job early. A queued job finishes at once; a job in the engine gets its final
 * event from the engine's next step. The first reason wins. */
static void kill_job(struct sm70__daemon *d, struct sm70__job *j, enum sm70__kill k)
{
	uint16_t reason;
	int32_t error;
	int ret;

	if (j->kill)
		return;
	j->kill = k;
	if (!j->in_engine) {
		kill_reason(k, &reason, &error);
		finish_job(d, j, reason, error);
		return;
	}
	ret = sm70_engine_cancel(d->engine, j->engine_id);
	if (ret)
		sm70__warn("job %llu: engine cancel failed: %d", (unsigned long long)j->serial,
			   ret);
}

/* ---- entry points from session.c ------------------------------------------------------ */

int sm70__sched_refusal(const struct sm70__daemon *d, struct sm70__session *s,
			const struct sm70_proto_sqe *e, char *why, size_t len)
{
	if (s->n_jobs >= s->limits.max_jobs_in_flight) {
		snprintf(why, len, "max_jobs_in_flight: this session has %u unfinished jobs, its "
			 "limit", s->n_jobs);
		return SM70_PROTO_E_BUSY;
	}
	if (s->use->jobs >= s->cfg_limits.max_jobs_per_uid) {
		snprintf(why, len, "limits.max_jobs_per_uid: uid %u has %u unfinished jobs in all "
			 "its sessions, its limit", (unsigned)s->uid, s->use->jobs);
		return SM70_PROTO_E_BUSY;
	}
	if (find_tag(s, e->tag)) {
		/* posted with EVF_NOT_FINAL (session.c): the job with this tag goes on */
		snprintf(why, len, "tag: %llu names an unfinished job of this session, which goes "
			 "on", (unsigned long long)e->tag);
		return SM70_PROTO_E_INVALID;
	}
	if ((uint64_t)e->prompt_len + 1 > d->kv_tokens) {
		snprintf(why, len, "prompt_len: %u tokens can never fit the KV cache (%llu tokens)",
			 e->prompt_len, (unsigned long long)d->kv_tokens);
		return SM70_PROTO_E_NO_MEMORY;
	}
	return 0;
}

void sm70__sched_submit(struct sm70__daemon *d, struct sm70__session *s,
			const struct sm70_proto_sqe *e, int32_t *prompt)
{
	char why[SM70_PROTO_ERRMSG_LEN];
	struct sm70__job *j;
	int code = sm70__sched_refusal(d, s, e, why, sizeof(why));

	if (code) {
		sm70__session_post_error(d, s, e->tag, e->opcode, code, why);
		goto refused;
	}
	j = calloc(1, sizeof(*j));
	if (!j) {
		sm70__session_post_error(d, s, e->tag, e->opcode, SM70_PROTO_E_NO_MEMORY,
					 "tag: no daemon memory for another job");
		goto refused;
	}
	j->s = s;
	j->serial = ++d->next_serial;
	j->tag = e->tag;
	j->priority = e->priority;
	j->flags = e->flags;
	j->prompt_len = e->prompt_len;
	j->prompt = prompt;
	j->max_new_tokens = e->max_new_tokens;
	j->temperature = e->temperature;
	j->top_p = e->top_p;
	j->top_k = e->top_k;
	j->seed = (e->flags & SM70_PROTO_SQF_SEED) ? e->seed : splitmix64(&d->seed_state);
	j->top_logprobs = e->top_logprobs;
	j->n_stop = e->n_stop;
	for (uint32_t i = 0; i < e->n_stop && i < SM70_PROTO_MAX_STOP; i++)
		j->stop[i] = (int32_t)e->stop[i];
	j->t_accept_us = d->now_us;
	if (e->deadline_ms)
		j->deadline_us = d->now_us + (uint64_t)e->deadline_ms * 1000;

	j->next_in_session = s->jobs;
	if (s->jobs)
		s->jobs->prev_in_session = j;
	s->jobs = j;
	s->n_jobs++;
	s->use->jobs++;
	d->n_jobs++;
	queue_insert(s, j);
	sm70__debug("session %u: job %llu accepted: tag %llu, %u prompt tokens, %u new",
		    s->id, (unsigned long long)j->serial, (unsigned long long)j->tag,
		    j->prompt_len, j->max_new_tokens);
	return;
refused:
	sm70__prompt_pool_free(&s->prompts, prompt);
}

int sm70__sched_tag_in_use(struct sm70__session *s, uint64_t tag)
{
	return find_tag(s, tag) != NULL;
}

void sm70__sched_cancel(struct sm70__daemon *d, struct sm70__session *s, uint64_t tag)
{
	struct sm70__job *j = find_tag(s, tag);

	if (j)
		kill_job(d, j, SM70__KILL_CANCEL);
}

void sm70__sched_session_gone(struct sm70__daemon *d, struct sm70__session *s)
{
	struct sm70__job *j, *next;

	for (j = s->jobs; j; j = next) {
		next = j->next_in_session;
		if (j->kill && j->in_engine)
			continue; /* already cancelled in the engine; its event is dropped */
		kill_job(d, j, SM70__KILL_HANGUP);
	}
}

void sm70__sched_slow_consumer(struct sm70__daemon *d, struct sm70__session *s)
{
	struct sm70__job *j, *next;
	uint32_t i, kept = 0, n = s->held_count, dropped = 0;

	/* Discard the held TOKEN events of jobs that are still running; keep everything else
	 * (errors, and the events of jobs that already finished) in order. */
	for (i = 0; i < n; i++) {
		struct sm70__held_event *h = &s->held[(s->held_first + i) & (s->held_cap - 1)];
		struct sm70__job *owner = NULL;

		if (h->ev.type == SM70_PROTO_EV_TOKEN && h->serial)
			owner = find_serial(s, h->serial);
		if (owner) {
			if (owner->n_posted)
				owner->n_posted--;
			dropped++;
			continue;
		}
		s->held[(s->held_first + kept) & (s->held_cap - 1)] = *h;
		kept++;
	}
	s->held_count = kept;
	for (j = s->jobs; j; j = next) {
		next = j->next_in_session;
		kill_job(d, j, SM70__KILL_SLOW);
	}
	sm70__debug("session %u: slow consumer: %u token events discarded", s->id, dropped);
}

void sm70__sched_kill_all(struct sm70__daemon *d, enum sm70__kill k)
{
	for (struct sm70__session *s = d->sessions; s; s = s->next) {
		struct sm70__job *j, *next;

		for (j = s->jobs; j; j = next) {
			next = j->next_in_session;
			kill_job(d, j, k);
		}
	}
}

/* ---- the engine ------------------------------------------------------------------------ */

/* Whether s has work the engine could take now: queued jobs, or parked ones to resume. */
static int feedable(const struct sm70__session *s)
{
	return s->state == SM70__SESSION_ACTIVE && !s->held_count && (s->queue || s->n_parked);
}

/* The parked job of s to resume first: highest priority, oldest among equals (s->jobs is
 * newest first). NULL if none is parked. */
static struct sm70__job *parked_head(const struct sm70__session *s)
{
	struct sm70__job *best = NULL;

	if (!s->n_parked)
		return NULL;
	for (struct sm70__job *j = s->jobs; j; j = j->next_in_session)
		if (j->parked && !j->kill && (!best || j->priority >= best->priority))
			best = j;
	return best;
}

/* The priority of the next job s would give the engine. */
static int head_priority(const struct sm70__session *s)
{
	const struct sm70__job *p = parked_head(s);
	int q = s->queue ? s->queue->priority : -1;

	return p && p->priority >= q ? p->priority : q;
}

int sm70__sched_busy(struct sm70__daemon *d)
{
	if (sm70_engine_busy(d->engine))
		return 1;
	for (struct sm70__session *s = d->sessions; s; s = s->next)
		if (feedable(s))
			return 1;
	return 0;
}

/* The next client to feed: highest head priority, then fewest jobs in the engine, then the
 * first after rr_last. */
static struct sm70__session *pick(struct sm70__daemon *d)
{
	struct sm70__session *best = NULL;
	uint32_t best_key = 0;
	int best_prio = -1;

	for (struct sm70__session *s = d->sessions; s; s = s->next) {
		uint32_t key;
		int prio;

		if (!feedable(s))
			continue;
		key = s->id - d->rr_last - 1; /* distance after rr_last, wrapping */
		prio = head_priority(s);
		if (!best || prio > best_prio ||
		    (prio == best_prio && (s->n_eng < best->n_eng ||
					   (s->n_eng == best->n_eng && key < best_key)))) {
			best = s;
			best_key = key;
			best_prio = prio;
		}
	}
	return best;
}

/* The prefix-cache domain of s's jobs (engine.prefix_cache_scope): its uid, its primary
 * gid, or 0 for everyone. The scope sits above the id so that no uid's domain is a gid's. */
static uint64_t cache_domain(const struct sm70__daemon *d, const struct sm70__session *s)
{
	const char *scope = d->cfg.engine.prefix_cache_scope;

	if (strcmp(scope, "shared") == 0)
		return 0;
	if (strcmp(scope, "group") == 0)
		return (2ull << 32) | (uint32_t)s->gid;
	return (1ull << 32) | (uint32_t)s->uid; /* "user", the default */
}

static int feed_one(struct sm70__daemon *d, struct sm70__session *s, int front)
{
	struct sm70__job *j = s->queue;
	struct sm70_request r;
	struct sm70_err err;
	uint64_t id;
	int ret;

	memset(&r, 0, sizeof(r));
	r.prompt = j->prompt;
	r.n_prompt = (int)j->prompt_len;
	r.max_new_tokens = (int)j->max_new_tokens;
	r.sampling.temperature = j->temperature;
	r.sampling.top_k = j->top_k;
	r.sampling.top_p = j->top_p;
	r.sampling.seed = j->seed;
	r.sampling.top_logprobs = (int)j->top_logprobs;
	r.n_stop = (int)j->n_stop;
	memcpy(r.stop_ids, j->stop, sizeof(r.stop_ids));
	r.ignore_eos = !!(j->flags & SM70_PROTO_SQF_IGNORE_EOS);
	r.tag = (uint64_t)(uintptr_t)j;
	r.front = front;
	r.cache_domain = cache_domain(d, s);
	sm70_err_clear(&err);

	d->rr_last = s->id;
	ret = sm70_engine_submit(d->engine, &r, &id, &err);
	if (ret) {
		sm70__warn("session %u: job %llu refused by the engine: %s", s->id,
			   (unsigned long long)j->serial, err.msg[0] ? err.msg : strerror(-ret));
		finish_job(d, j, SM70_PROTO_FINISH_ERROR, ret == -E2BIG || ret == -ENOMEM ?
			   SM70_PROTO_E_NO_MEMORY : SM70_PROTO_E_INTERNAL);
		return 0;
	}
	queue_remove(s, j);
	j->in_engine = 1;
	j->engine_id = id;
	j->t_sched_us = d->now_us;
	d->metrics.prompt_tokens += j->prompt_len;
	sm70__prompt_pool_free(&s->prompts, j->prompt); /* the engine has its own copy */
	j->prompt = NULL;
	d->n_engine_jobs++;
	s->n_eng++;
	return 1;
}

/* Gives the engine s's next job: its parked head, or its queue head, whichever comes
 * first by priority (the parked one among equals: it is older). Returns 1 if the engine
 * took one. */
static int give_one(struct sm70__daemon *d, struct sm70__session *s, int front)
{
	struct sm70__job *p = parked_head(s);

	if (p && (!s->queue || p->priority >= s->queue->priority)) {
		d->rr_last = s->id;
		if (sm70_engine_unpark(d->engine, p->engine_id, front))
			return 0; /* cannot happen: the engine holds every job we think parked */
		p->parked = 0;
		s->n_parked--;
		s->n_eng++;
		return 1;
	}
	return s->queue ? feed_one(d, s, front) : 0;
}

/* The job another client gives up for s (of priority <= prio): the newest running job of
 * the client with the most jobs in the engine, above share; failing a running one, its
 * newest job waiting in the engine. NULL if no client is above share. */
static struct sm70__job *victim(struct sm70__daemon *d, const struct sm70__session *s,
				uint32_t share, int prio)
{
	struct sm70__session *x = NULL;
	struct sm70__job *waiting = NULL;

	for (struct sm70__session *o = d->sessions; o; o = o->next)
		if (o != s && o->n_eng > share && (!x || o->n_eng > x->n_eng))
			x = o;
	if (!x)
		return NULL;
	for (struct sm70__job *j = x->jobs; j; j = j->next_in_session) {
		if (!j->in_engine || j->parked || j->kill || j->priority > prio)
			continue;
		if (sm70_engine_is_running(d->engine, j->engine_id))
			return j;
		if (!waiting)
			waiting = j;
	}
	return waiting;
}

void sm70__sched_feed(struct sm70__daemon *d)
{
	struct sm70_engine_stats st;
	uint32_t in_engine, cap = d->cfg.engine.max_seqs + d->cfg.engine.feed_depth;
	uint32_t n_work = 0, share;
	struct sm70__session *s;
	struct sm70__job *v;

	sm70_engine_get_stats(d->engine, &st);
	in_engine = (uint32_t)(st.running + st.waiting);
	for (s = d->sessions; s; s = s->next)
		n_work += s->state == SM70__SESSION_ACTIVE && (s->queue || s->n_eng || s->n_parked);
	share = n_work ? d->cfg.engine.max_seqs / n_work : 0;
	if (share < 1)
		share = 1;
	while ((s = pick(d))) {
		if (in_engine < cap) {
			in_engine += (uint32_t)give_one(d, s, 0);
			continue;
		}
		/* Full. A client below its share takes a running slot from the one above it
		 * with the most: that one's job is parked, s's goes to the head of the queue. */
		if (s->n_eng >= share || !(v = victim(d, s, share, head_priority(s))))
			break;
		if (sm70_engine_park(d->engine, v->engine_id))
			break;
		v->parked = 1;
		v->s->n_eng--;
		v->s->n_parked++;
		sm70__debug("session %u: job %llu parked for session %u (%u in the engine, share "
			    "%u)", v->s->id, (unsigned long long)v->serial, s->id, v->s->n_eng + 1,
			    share);
		if (!give_one(d, s, 1))
			in_engine--;
	}
}

static void post_token(struct sm70__daemon *d, struct sm70__job *j,
		       const struct sm70_sample_result *r, uint64_t now)
{
	struct sm70_proto_eqe ev;
	uint32_t n_top = j->top_logprobs;

	if (n_top > (uint32_t)r->n_top)
		n_top = r->n_top > 0 ? (uint32_t)r->n_top : 0;
	if (n_top > SM70_PROTO_MAX_TOP)
		n_top = SM70_PROTO_MAX_TOP;
	memset(&ev, 0, sizeof(ev));
	ev.type = SM70_PROTO_EV_TOKEN;
	ev.index = j->n_posted;
	ev.tag = j->tag;
	ev.u.token.token = (uint32_t)r->token;
	ev.u.token.logprob = r->logprob;
	ev.u.token.n_top = (uint16_t)n_top;
	for (uint32_t i = 0; i < n_top; i++) {
		ev.u.token.top[i].id = (uint32_t)r->top_ids[i];
		ev.u.token.top[i].logprob = r->top_logprobs[i];
	}
	if (!j->t_first_us) {
		j->t_first_us = now;
		sm70__hist_observe(&d->metrics.ttft, (double)(now - j->t_accept_us) * 1e-6);
	} else {
		sm70__hist_observe(&d->metrics.itl, (double)(now - j->t_last_us) * 1e-6);
	}
	j->t_last_us = now;
	j->n_posted++;
	sm70__session_post(d, j->s, &ev, j->serial);
}

static int is_eos(const struct sm70__daemon *d, int32_t tok)
{
	for (int i = 0; i < d->n_eos; i++)
		if (d->eos_ids[i] == tok)
			return 1;
	return 0;
}

static void on_event(void *ctx, const struct sm70_event *ev)
{
	struct sm70__daemon *d = ctx;
	struct sm70__job *j = (struct sm70__job *)(uintptr_t)ev->tag;
	uint64_t now = sm70__now_us();
	uint16_t reason;
	int32_t error = 0;

	d->now_us = now; /* what posting stamps (a ring that fills starts its stall timer) */

	if (ev->cached_tokens > 0 && (uint32_t)ev->cached_tokens > j->cached_tokens)
		j->cached_tokens = (uint32_t)ev->cached_tokens;
	if (ev->sample.token >= 0)
		d->metrics.generation_tokens++;
	if (ev->sample.token >= 0 && j->kill != SM70__KILL_SLOW && j->kill != SM70__KILL_HANGUP)
		post_token(d, j, &ev->sample, now);
	switch (ev->finish) {
	case SM70_FINISH_NONE:
		return;
	case SM70_FINISH_LENGTH:
		reason = SM70_PROTO_FINISH_LENGTH;
		break;
	case SM70_FINISH_STOP:
		reason = !(j->flags & SM70_PROTO_SQF_IGNORE_EOS) && is_eos(d, ev->sample.token) ?
			 SM70_PROTO_FINISH_STOP_EOS : SM70_PROTO_FINISH_STOP_TOKEN;
		break;
	case SM70_FINISH_CANCELLED:
		kill_reason(j->kill, &reason, &error);
		break;
	case SM70_FINISH_NO_MEMORY:
		/* PROTOCOL.md section 11: out of memory after the job started */
		reason = SM70_PROTO_FINISH_ERROR;
		error = SM70_PROTO_E_NO_MEMORY;
		sm70__info("session %u: job %llu (tag %llu) outgrew the KV cache (%llu tokens) "
			   "after %d new tokens: E_NO_MEMORY", j->s->id,
			   (unsigned long long)j->serial, (unsigned long long)j->tag,
			   (unsigned long long)d->kv_tokens, ev->completion_tokens);
		break;
	case SM70_FINISH_ERROR:
	default:
		reason = SM70_PROTO_FINISH_ERROR;
		error = SM70_PROTO_E_INTERNAL;
		sm70__warn("session %u: job %llu (tag %llu) failed in the engine: %s", j->s->id,
			   (unsigned long long)j->serial, (unsigned long long)j->tag,
			   ev->message ? ev->message : "no reason given");
		break;
	}
	finish_job(d, j, reason, error);
}

int sm70__sched_step(struct sm70__daemon *d)
{
	int ret;

	if (!sm70_engine_busy(d->engine))
		return 0;
	ret = sm70_engine_step(d->engine, on_event, d);
	if (ret >= 0) {
		d->step_failures = 0;
		d->steps_ok++;
		return ret;
	}
	d->step_failures++;
	sm70__err("engine step failed: %s (%d in a row); ending the jobs in the engine",
		  strerror(-ret), d->step_failures);
	for (struct sm70__session *s = d->sessions; s; s = s->next)
		for (struct sm70__job *j = s->jobs; j; j = j->next_in_session)
			if (j->in_engine)
				kill_job(d, j, SM70__KILL_INTERNAL);
	/* -EIO is a sticky device error (the CUDA backend reports one once the context is
	 * lost): nothing will work again in this process, so exit at once and let systemd
	 * restart it. Other failures get two more chances. */
	if (ret == -EIO || d->step_failures >= 3)
		d->fatal = 1;
	return ret;
}

void sm70__sched_tick(struct sm70__daemon *d)
{
	for (struct sm70__session *s = d->sessions; s; s = s->next) {
		struct sm70__job *j, *next;

		for (j = s->jobs; j; j = next) {
			next = j->next_in_session;
			if (j->deadline_us && !j->kill && d->now_us >= j->deadline_us)
				kill_job(d, j, SM70__KILL_DEADLINE);
		}
	}
}

int64_t sm70__sched_next_timer(const struct sm70__daemon *d)
{
	int64_t best = -1;

	for (const struct sm70__session *s = d->sessions; s; s = s->next)
		for (const struct sm70__job *j = s->jobs; j; j = j->next_in_session) {
			int64_t dt;

			if (!j->deadline_us || j->kill)
				continue;
			dt = j->deadline_us > d->now_us ? (int64_t)(j->deadline_us - d->now_us) : 0;
			if (best < 0 || dt < best)
				best = dt;
		}
	return best;
}
