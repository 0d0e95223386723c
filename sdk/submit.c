/*
 * submit.c - the producer side: sm70_submit and sm70_cancel turn a job into a submission
 * entry (PROTOCOL.md sections 4.5, 7 and 9) and keep the table of live jobs that lets the
 * library attach user tags to events and end every job explicitly if the daemon dies.
 * Non-goals: checking what the daemon checks anyway (limits, vocabulary, float ranges): its
 * ERROR event names the field at fault, which is better than a guess here.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sdk/client_impl.h"

#define KNOWN_JOB_FLAGS (SM70_JOB_SEED | SM70_JOB_IGNORE_EOS)

SM70_API void sm70_job_init(struct sm70_job *job)
{
	memset(job, 0, sizeof(*job));
	job->size = sizeof(*job);
	job->max_tokens = 16;
	job->top_p = 1.0f;
}

void sm70__ring_doorbell(const struct sm70_client *c)
{
	uint64_t one = 1;

	/* EAGAIN means the counter is saturated: the daemon has a wakeup pending anyway. */
	if (write(c->doorbell, &one, sizeof(one)) < 0) {
		/* nothing useful to do; the daemon also polls */
	}
}

long sm70__job_find(const struct sm70_client *c, uint64_t id)
{
	size_t i;

	/* Linear: a handle has at most a few dozen jobs in flight, and this keeps the table a
	 * plain array that is trivially correct. */
	for (i = 0; i < c->n_jobs; i++)
		if (c->jobs[i].id == id)
			return (long)i;
	return -1;
}

/* Under c->lock: makes room for one more job. */
static int jobs_reserve(struct sm70_client *c)
{
	struct sm70__job *nj;
	size_t cap;

	if (c->n_jobs < c->cap_jobs)
		return 0;
	cap = c->cap_jobs ? c->cap_jobs * 2 : 16;
	nj = realloc(c->jobs, cap * sizeof(*nj));
	if (!nj)
		return -ENOMEM;
	c->jobs = nj;
	c->cap_jobs = cap;
	return 0;
}

static int all_zero(const void *p, size_t n)
{
	const unsigned char *b = p;

	while (n--)
		if (*b++)
			return 0;
	return 1;
}

/* The checks that guard this library's own writes; everything else is the daemon's. */
static int job_ok(const struct sm70_job *j)
{
	if (j->size < sizeof(*j) || !all_zero((const char *)j + sizeof(*j), j->size - sizeof(*j)))
		return 0;
	if (j->reserved0 || !all_zero(j->reserved, sizeof(j->reserved)))
		return 0;
	if (j->flags & ~KNOWN_JOB_FLAGS)
		return 0;
	if (!j->prompt || j->prompt_len == 0 || j->max_tokens == 0)
		return 0;
	if (j->n_stop > SM70_MAX_STOP || j->top_logprobs > SM70_MAX_TOP_LOGPROBS ||
	    j->priority > UINT8_MAX)
		return 0;
	return 1;
}

/* Under c->lock: the state that refuses any entry. */
static int session_state(const struct sm70_client *c)
{
	if (c->dead)
		return -ECONNRESET;
	if (!c->connected)
		return -ENOTCONN;
	return 0;
}

/* Under c->lock: room for one more text job. */
static int texts_reserve(struct sm70_client *c)
{
	struct sm70__text_job **nt;
	size_t cap;

	if (c->n_texts < c->cap_texts)
		return 0;
	cap = c->cap_texts ? c->cap_texts * 2 : 16;
	nt = realloc(c->texts, cap * sizeof(*nt));
	if (!nt)
		return -ENOMEM;
	c->texts = nt;
	c->cap_texts = cap;
	return 0;
}

SM70_API int sm70_submit(struct sm70_client *c, const struct sm70_job *job, uint64_t *job_id)
{
	return sm70__submit(c, job, job_id, NULL);
}

int sm70__submit(struct sm70_client *c, const struct sm70_job *job, uint64_t *job_id,
		 struct sm70__text_job *t)
{
	struct sm70_proto_sqe e;
	struct sm70__job *slot;
	int ret;

	if (!c || !job || !job_id || !job_ok(job))
		return -EINVAL;
	memset(&e, 0, sizeof(e));
	e.size = sizeof(e);
	e.opcode = SM70_PROTO_OP_SUBMIT;
	e.priority = (uint8_t)job->priority;
	if (job->flags & SM70_JOB_IGNORE_EOS)
		e.flags |= SM70_PROTO_SQF_IGNORE_EOS;
	if (job->flags & SM70_JOB_SEED) {
		e.flags |= SM70_PROTO_SQF_SEED;
		e.seed = job->seed;
	}
	e.prompt_len = job->prompt_len;
	e.max_new_tokens = job->max_tokens;
	e.temperature = job->temperature;
	e.top_p = job->top_p == 0.0f ? 1.0f : job->top_p;
	e.top_k = job->top_k;
	e.top_logprobs = job->top_logprobs;
	e.deadline_ms = job->deadline_ms;
	e.n_stop = job->n_stop;
	memcpy(e.stop, job->stop, sizeof(e.stop[0]) * job->n_stop);

	pthread_mutex_lock(&c->lock);
	ret = session_state(c);
	if (ret)
		goto out;
	/* Room in the table first, so that nothing can fail after the entry is published. */
	ret = jobs_reserve(c);
	if (!ret && t)
		ret = texts_reserve(c);
	if (ret)
		goto out;
	e.tag = c->next_id;
	ret = sm70__sq_push(&c->rings, &e, job->prompt, job->prompt_len);
	if (ret < 0)
		goto out;
	if (ret > 0)
		sm70__ring_doorbell(c);
	slot = &c->jobs[c->n_jobs++];
	slot->id = e.tag;
	slot->user_tag = job->user_tag;
	slot->prompt_len = job->prompt_len;
	slot->n_tokens = 0;
	if (t) {
		t->id = e.tag;
		c->texts[c->n_texts++] = t;
		__atomic_store_n(&c->text_used, 1, __ATOMIC_RELEASE);
	}
	*job_id = c->next_id++;
	ret = 0;
out:
	pthread_mutex_unlock(&c->lock);
	return ret;
}

SM70_API int sm70_cancel(struct sm70_client *c, uint64_t job_id)
{
	struct sm70_proto_sqe e;
	int ret;

	if (!c)
		return -EINVAL;
	memset(&e, 0, sizeof(e));
	e.size = sizeof(e);
	e.opcode = SM70_PROTO_OP_CANCEL;
	e.tag = job_id;
	pthread_mutex_lock(&c->lock);
	ret = session_state(c);
	if (ret)
		goto out;
	if (sm70__job_find(c, job_id) < 0) {
		ret = -ENOENT;
		goto out;
	}
	ret = sm70__sq_push(&c->rings, &e, NULL, 0);
	if (ret > 0)
		sm70__ring_doorbell(c);
	ret = ret < 0 ? ret : 0;
out:
	pthread_mutex_unlock(&c->lock);
	return ret;
}
