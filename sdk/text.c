/*
 * text.c - text in, text out (0.3): the tokenizer of the handle, text and chat prompts
 * turned into token ids before sm70_submit, and each text job's events given their text
 * by a streaming detokenizer as the consumer hands them out, with stop strings matched on
 * that text (a match cancels the job). The tokenizer and chat format are text/'s, compiled
 * into the library; the daemon sees token ids only.
 *
 * Where the text is made: at hand-out (sm70_next_event, sm70_generate_text), not when an
 * event is read off the ring, because sm70_generate holds other jobs' events for later
 * and the text pointer must be valid when the application gets the event.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "sdk/client_impl.h"
#include "text/chat.h"
#include "text/tokenizer.h"

_Static_assert(sizeof(struct sm70_event) == 368 || sizeof(void *) != 8,
	       "struct sm70_event changed size: the text fields must fit its old reserved space");

#define KNOWN_TEXT_FLAGS (SM70_TEXT_NO_THINKING | SM70_TEXT_KEEP_SPECIAL)

SM70_API void sm70_text_prompt_init(struct sm70_text_prompt *p)
{
	memset(p, 0, sizeof(*p));
	p->size = sizeof(*p);
}

/* Loads the tokenizer at path (a directory or a tokenizer.json) and the chat format beside
 * it. Called with tok_lock held and c->tok NULL. */
static int load(struct sm70_client *c, const char *path)
{
	struct sm70_err err = {{0}};
	enum sm70_chat_format fmt = SM70_CHAT_NONE;
	char dir[4096], *slash;
	struct stat st;
	int rc;

	if (stat(path, &st))
		return sm70__fail(c, -errno, "tokenizer: %s: %s", path, strerror(errno));
	if (S_ISDIR(st.st_mode)) {
		rc = sm70_tokenizer_load_dir(path, &c->tok, &err);
		snprintf(dir, sizeof(dir), "%s", path);
	} else {
		rc = sm70_tokenizer_load(path, &c->tok, &err);
		snprintf(dir, sizeof(dir), "%s", path);
		slash = strrchr(dir, '/');
		if (slash)
			*slash = '\0';
		else
			strcpy(dir, ".");
	}
	if (rc)
		return sm70__fail(c, rc, "tokenizer: %s", err.msg);
	err.msg[0] = '\0';
	/* no template, or one not implemented: raw prompts still work */
	if (sm70_chat_load_dir(dir, &fmt, &err))
		snprintf(c->chat_error, sizeof(c->chat_error), "%s", err.msg);
	c->chat_format = (int)fmt;
	return 0;
}

/* The daemon's model directory from the private header copy (protocol 1.2). */
static int daemon_dir(struct sm70_client *c, const char **dir)
{
	const char *d = c->hdr.model_dir;

	if (!c->connected)
		return sm70__fail(c, -ENOTCONN, "tokenizer: no session, so no daemon to ask "
				  "where its model is; give the tokenizer's path");
	if (c->hdr.version_minor < 2 || !memchr(d, '\0', sizeof(c->hdr.model_dir)) || !d[0])
		return sm70__fail(c, -ENOENT, "tokenizer: sm70d (protocol 1.%u) did not say where "
				  "its model is; give the tokenizer's path",
				  c->hdr.version_minor);
	*dir = d;
	return 0;
}

SM70_API int sm70_client_tokenizer(struct sm70_client *c, const char *path)
{
	int rc = 0;

	if (!c)
		return -EINVAL;
	pthread_mutex_lock(&c->tok_lock);
	if (c->tok)
		rc = sm70__fail(c, -EALREADY, "tokenizer: this handle has one already");
	else if (!path)
		rc = daemon_dir(c, &path);
	if (!rc)
		rc = load(c, path);
	pthread_mutex_unlock(&c->tok_lock);
	return rc;
}

static int prompt_ok(struct sm70_client *c, const struct sm70_job *job,
		     const struct sm70_text_prompt *p)
{
	const unsigned char *b = (const unsigned char *)p;

	if (p->size < sizeof(*p))
		return sm70__fail(c, -EINVAL, "text prompt: size %u is less than %zu", p->size,
				  sizeof(*p));
	for (size_t i = sizeof(*p); i < p->size; i++)
		if (b[i])
			return sm70__fail(c, -EINVAL, "text prompt: unknown fields are set");
	for (size_t i = 0; i < sizeof(p->reserved) / sizeof(p->reserved[0]); i++)
		if (p->reserved[i])
			return sm70__fail(c, -EINVAL, "text prompt: reserved[%zu] is not zero", i);
	if (p->flags & ~KNOWN_TEXT_FLAGS)
		return sm70__fail(c, -EINVAL, "text prompt: unknown flags 0x%x",
				  p->flags & ~KNOWN_TEXT_FLAGS);
	if (!p->text == !p->n_messages)
		return sm70__fail(c, -EINVAL, "text prompt: give either text or messages");
	if (p->n_messages && !p->messages)
		return sm70__fail(c, -EINVAL, "text prompt: n_messages without messages");
	if (p->n_stop > SM70_MAX_STOP_STRINGS)
		return sm70__fail(c, -EINVAL, "text prompt: %u stop strings (at most %d)",
				  p->n_stop, SM70_MAX_STOP_STRINGS);
	for (uint32_t i = 0; i < p->n_stop; i++) {
		size_t n = p->stop[i] ? strlen(p->stop[i]) : 0;

		if (!n || sm70_utf8_check(p->stop[i], n) != n)
			return sm70__fail(c, -EINVAL, "text prompt: stop string %u is %s", i,
					  n ? "not UTF-8" : "empty");
	}
	if (job->prompt || job->prompt_len)
		return sm70__fail(c, -EINVAL, "text job: the job's prompt must be NULL and "
				  "prompt_len 0 (the text is the prompt)");
	return 0;
}

/* The prompt's text: p->text, or the chat rendered with the model's template. */
static int prompt_text(struct sm70_client *c, const struct sm70_text_prompt *p,
		       struct sm70_text *out)
{
	struct sm70_chat_msg *m;
	struct sm70_err err = {{0}};
	unsigned flags = SM70_CHAT_ADD_GENERATION_PROMPT;
	int rc;

	if (p->text)
		return sm70_text_append(out, p->text, strlen(p->text));
	if (!c->chat_format)
		return sm70__fail(c, -ENOTSUP, "chat prompt: %s",
				  c->chat_error[0] ? c->chat_error : "the model has no chat template");
	m = calloc(p->n_messages, sizeof(*m));
	if (!m)
		return -ENOMEM;
	for (uint32_t i = 0; i < p->n_messages; i++) {
		const struct sm70_message *in = &p->messages[i];

		if (!in->role || !in->content) {
			free(m);
			return sm70__fail(c, -EINVAL, "chat prompt: messages[%u] has no %s", i,
					  in->role ? "content" : "role");
		}
		m[i].role = in->role;
		m[i].content = in->content;
		m[i].content_len = strlen(in->content);
		m[i].reasoning = in->reasoning_content;
		m[i].reasoning_len = in->reasoning_content ? strlen(in->reasoning_content) : 0;
	}
	if (p->flags & SM70_TEXT_NO_THINKING)
		flags |= SM70_CHAT_NO_THINKING;
	rc = sm70_chat_render((enum sm70_chat_format)c->chat_format, m, p->n_messages, flags,
			      out, &err);
	free(m);
	return rc ? sm70__fail(c, rc, "chat prompt: %s", err.msg) : 0;
}

void sm70__text_job_free(struct sm70__text_job *t)
{
	if (!t)
		return;
	sm70_detok_free(t->detok);
	free(t);
}

int sm70__text_prepare(struct sm70_client *c, const struct sm70_job *job,
		       const struct sm70_text_prompt *p, uint32_t **ids_out, uint32_t *n_out,
		       struct sm70__text_job **t_out)
{
	struct sm70_detok_opts o = { .size = sizeof(o) };
	struct sm70_text text = {0};
	struct sm70_ids ids = {0};
	struct sm70_err err = {{0}};
	struct sm70__text_job *t;
	const char *path = NULL;
	int rc;

	*ids_out = NULL;
	*t_out = NULL;
	if (!c || !job || !p)
		return -EINVAL;
	rc = prompt_ok(c, job, p);
	if (rc)
		return rc;
	pthread_mutex_lock(&c->tok_lock);
	if (!c->tok && !(rc = daemon_dir(c, &path)))
		rc = load(c, path);
	pthread_mutex_unlock(&c->tok_lock);
	if (rc)
		return rc;
	rc = prompt_text(c, p, &text);
	if (!rc) {
		rc = sm70_tokenizer_encode(c->tok, text.s ? text.s : "", text.len, 0, &ids, &err);
		if (rc)
			sm70__fail(c, rc, "text prompt: %s", err.msg);
	}
	sm70_text_free(&text);
	if (!rc && (!ids.n || ids.n > UINT32_MAX))
		rc = sm70__fail(c, -EINVAL, "text prompt: %s", ids.n ? "too long" :
				"empty (it makes no tokens)");
	t = rc ? NULL : calloc(1, sizeof(*t));
	if (!rc && !t)
		rc = -ENOMEM;
	if (!rc) {
		o.flags = p->flags & SM70_TEXT_KEEP_SPECIAL ? 0 : SM70_TOK_SKIP_SPECIAL;
		o.stop = p->stop;
		o.n_stop = p->n_stop;
		t->stop_index = -1;
		rc = sm70_detok_new(c->tok, &o, &t->detok);
	}
	if (rc) {
		sm70__text_job_free(t);
		sm70_ids_free(&ids);
		return rc;
	}
	/* ids are never negative, so the int32 array is the uint32 one the job wants */
	*ids_out = (uint32_t *)ids.v;
	*n_out = (uint32_t)ids.n;
	*t_out = t;
	return 0;
}

SM70_API int sm70_submit_text(struct sm70_client *c, const struct sm70_job *job,
			      const struct sm70_text_prompt *p, uint64_t *job_id)
{
	struct sm70__text_job *t;
	struct sm70_job j;
	uint32_t *ids, n;
	int rc;

	if (!job_id || !job || job->size < sizeof(*job))
		return -EINVAL;
	rc = sm70__text_prepare(c, job, p, &ids, &n, &t);
	if (rc)
		return rc;
	j = *job;
	j.prompt = ids;
	j.prompt_len = n;
	rc = sm70__submit(c, &j, job_id, t);
	if (rc)
		sm70__text_job_free(t);
	free(ids);
	return rc;
}

/* Takes job id's text state out of the table when `remove`; returns it or NULL. */
static struct sm70__text_job *text_find(struct sm70_client *c, uint64_t id, int remove)
{
	struct sm70__text_job *t = NULL;

	pthread_mutex_lock(&c->lock);
	for (size_t i = 0; i < c->n_texts; i++)
		if (c->texts[i]->id == id) {
			t = c->texts[i];
			if (remove)
				c->texts[i] = c->texts[--c->n_texts];
			break;
		}
	pthread_mutex_unlock(&c->lock);
	return t;
}

int sm70__text_apply(struct sm70_client *c, struct sm70_event *ev)
{
	int final = !!(ev->flags & SM70_EVENT_FINAL);
	struct sm70__text_job *t;
	int rc;

	/* set before the entry of the first text job was published, so before any of its
	 * events could be read */
	if (!__atomic_load_n(&c->text_used, __ATOMIC_ACQUIRE))
		return 0;
	t = text_find(c, ev->job_id, final);
	if (!t)
		return 0;
	sm70_text_clear(&c->text_out);
	if (ev->type == SM70_EVENT_TOKEN) {
		if (t->stop_index >= 0) {
			/* the model ran on past the stop before the cancel arrived */
			if (!t->cancel_sent && sm70_cancel(c, t->id) != -EAGAIN)
				t->cancel_sent = 1;
			return 1;
		}
		/* -ERANGE: an id the tokenizer lacks (a model's padded vocabulary) adds no
		 * text, as tokenizers' decode drops it */
		rc = sm70_detok_push(t->detok, (int32_t)ev->token, &c->text_out);
		if (rc == SM70_DETOK_STOPPED) {
			t->stop_index = sm70_detok_stop_index(t->detok);
			t->cancel_sent = sm70_cancel(c, t->id) != -EAGAIN;
		}
		t->delivered++;
	} else if (final) {
		if (t->stop_index < 0)
			sm70_detok_finish(t->detok, &c->text_out);
		if (t->stop_index >= 0) {
			/* ended by us: whatever the daemon said (CANCELLED, or LENGTH/EOS if it
			 * got there first), the application's output ended at the stop */
			ev->type = SM70_EVENT_FINISH;
			ev->finish_reason = SM70_REASON_STOP_STRING;
			ev->error = 0;
			ev->message[0] = '\0';
			ev->stop_index = t->stop_index;
		}
		sm70__text_job_free(t);
	}
	ev->text = c->text_out.s ? c->text_out.s : "";
	ev->text_len = (uint32_t)c->text_out.len;
	return 0;
}

void sm70__text_close(struct sm70_client *c)
{
	for (size_t i = 0; i < c->n_texts; i++)
		sm70__text_job_free(c->texts[i]);
	free(c->texts);
	c->texts = NULL;
	c->n_texts = c->cap_texts = 0;
	sm70_text_free(&c->text_out);
	sm70_tokenizer_free(c->tok);
	c->tok = NULL;
}
