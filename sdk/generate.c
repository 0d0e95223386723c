/*
 * generate.c - sm70_generate, the blocking convenience: submit one job, feed its tokens to a
 * callback, return its outcome. Built only on the public calls plus the held-event queue,
 * so events of the application's other jobs are kept for sm70_next_event, not lost.
 * Non-goals: timeouts (use deadline_ms in the job) and retries after errors.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "sdk/client_impl.h"

/* Next event of job id: a held one (only synthesized finals can be), else from the ring,
 * holding other jobs' events. Returns 0, or an error of sm70__fetch / -ENOMEM. */
static int next_of(struct sm70_client *c, uint64_t id, struct sm70_event *ev)
{
	int ret;

	for (;;) {
		if (sm70__held_take(c, id, ev))
			return 0;
		ret = sm70__fetch(c, ev, -1);
		if (ret == -ECONNRESET && sm70__held_take(c, id, ev))
			return 0;
		if (ret)
			return ret;
		if (ev->job_id == id)
			return 0;
		ret = sm70__held_push(c, ev);
		if (ret)
			return ret;
	}
}

/* Submits, reading (and holding) events while the ring or the arena is full: the daemon
 * frees both as it reads entries, and may be waiting for us to drain events first. */
static int submit_retry(struct sm70_client *c, const struct sm70_job *job, uint64_t *id,
			struct sm70__text_job *t)
{
	struct sm70_event ev;
	int ret, r;

	while ((ret = sm70__submit(c, job, id, t)) == -EAGAIN) {
		r = sm70__fetch(c, &ev, 1);
		if (r == 0)
			r = sm70__held_push(c, &ev);
		if (r && r != -ETIMEDOUT)
			return r;
	}
	return ret;
}

/* Waits for job id's final event, handing its tokens (and, for a text job, a FINISH that
 * carries text) to cb. */
static int wait_job(struct sm70_client *c, uint64_t id, int text, sm70_token_cb cb, void *ctx,
		    struct sm70_result *out)
{
	struct sm70_event ev;
	int ret, want_cancel = 0, cancel_sent = 0;

	for (;;) {
		ret = next_of(c, id, &ev);
		if (ret)
			return ret;
		if (text && sm70__text_apply(c, &ev))
			continue; /* a token after the job's stop string */
		if (ev.type == SM70_EVENT_TOKEN && cb && !want_cancel && cb(ctx, &ev))
			want_cancel = 1;
		if (ev.flags & SM70_EVENT_FINAL) {
			if (text && ev.type == SM70_EVENT_FINISH && ev.text_len && cb)
				cb(ctx, &ev);
			break;
		}
		if (want_cancel && !cancel_sent) {
			/* -EAGAIN (ring full): try again after the next event */
			ret = sm70_cancel(c, id);
			if (ret != -EAGAIN)
				cancel_sent = 1;
		}
	}
	if (out) {
		memset(out, 0, sizeof(*out));
		out->size = sizeof(*out);
		out->finish_reason = ev.finish_reason;
		out->error = ev.error;
		out->stop_index = ev.stop_index;
		out->job_id = id;
		out->usage = ev.usage;
		memcpy(out->message, ev.message, sizeof(out->message));
	}
	return ev.error;
}

SM70_API int sm70_generate(struct sm70_client *c, const struct sm70_job *job, sm70_token_cb cb,
			   void *ctx, struct sm70_result *out)
{
	uint64_t id;
	int ret;

	if (!c || !job || (out && out->size < sizeof(*out)))
		return -EINVAL;
	ret = submit_retry(c, job, &id, NULL);
	if (ret)
		return ret;
	return wait_job(c, id, 0, cb, ctx, out);
}

SM70_API int sm70_generate_text(struct sm70_client *c, const struct sm70_job *job,
				const struct sm70_text_prompt *p, sm70_token_cb cb, void *ctx,
				struct sm70_result *out)
{
	struct sm70__text_job *t;
	struct sm70_job j;
	uint32_t *ids, n;
	uint64_t id;
	int ret;

	if (!c || !job || job->size < sizeof(*job) || (out && out->size < sizeof(*out)))
		return -EINVAL;
	ret = sm70__text_prepare(c, job, p, &ids, &n, &t);
	if (ret)
		return ret;
	j = *job;
	j.prompt = ids;
	j.prompt_len = n;
	ret = submit_retry(c, &j, &id, t);
	free(ids);
	if (ret) {
		sm70__text_job_free(t);
		return ret;
	}
	return wait_job(c, id, 1, cb, ctx, out);
}
