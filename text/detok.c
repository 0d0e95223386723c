/*
 * detok.c - streaming detokenization with stop strings; see tokenizer.h.
 *
 * Two holding areas between the ids and the deltas: `pend`, the bytes of a character not
 * yet complete (a token may end inside one; a UTF-8 sequence is decided as soon as its
 * bytes make it whole or ill-formed, exactly as a one-shot lossy decode decides it), and
 * `held`, text whose tail could still be the beginning of a stop string. Text leaves
 * `held` once no stop string can start in it, so a match is searched only in `held` and
 * the emitted text never contains any part of one.
 */
#include "text/tokenizer.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

struct sm70_detok {
	const struct sm70_tokenizer *tok;
	unsigned flags;
	char **stop;
	size_t *stop_len;
	size_t n_stop;
	struct sm70_text pend;
	struct sm70_text held;
	struct sm70_text txt;       /* scratch: the text one push decided */
	int stopped;
	int stop_index;
};

void sm70_detok_free(struct sm70_detok *d)
{
	if (!d)
		return;
	for (size_t i = 0; i < d->n_stop; i++)
		free(d->stop[i]);
	free(d->stop);
	free(d->stop_len);
	sm70_text_free(&d->pend);
	sm70_text_free(&d->held);
	sm70_text_free(&d->txt);
	free(d);
}

int sm70_detok_new(const struct sm70_tokenizer *tok, const struct sm70_detok_opts *opts,
		   struct sm70_detok **out)
{
	struct sm70_detok *d = calloc(1, sizeof(*d));
	struct sm70_detok_opts o = {0};

	*out = NULL;
	if (!d)
		return -ENOMEM;
	if (opts)
		memcpy(&o, opts, opts->size && opts->size < sizeof(o) ? opts->size : sizeof(o));
	d->tok = tok;
	d->flags = o.flags;
	d->stop_index = -1;
	if (o.n_stop) {
		d->stop = calloc(o.n_stop, sizeof(*d->stop));
		d->stop_len = calloc(o.n_stop, sizeof(*d->stop_len));
		if (!d->stop || !d->stop_len)
			goto nomem;
		for (size_t i = 0; i < o.n_stop; i++) {
			size_t n;

			if (!o.stop[i] || !(n = strlen(o.stop[i])) || sm70_utf8_check(o.stop[i], n) != n) {
				sm70_detok_free(d);
				return -EINVAL;
			}
			d->stop[i] = strdup(o.stop[i]);
			if (!d->stop[i])
				goto nomem;
			d->stop_len[i] = n;
			d->n_stop = i + 1;
		}
	}
	*out = d;
	return 0;
nomem:
	sm70_detok_free(d);
	return -ENOMEM;
}

void sm70_detok_reset(struct sm70_detok *d)
{
	sm70_text_clear(&d->pend);
	sm70_text_clear(&d->held);
	d->stopped = 0;
	d->stop_index = -1;
}

int sm70_detok_stop_index(const struct sm70_detok *d)
{
	return d->stop_index;
}

/* Moves the decided characters of pend (all of it when `final`) to txt, lossily. */
static int decide(struct sm70_detok *d, int final)
{
	const uint8_t *s = (const uint8_t *)d->pend.s;
	size_t n = d->pend.len, i = 0, len;
	uint32_t cp;
	int rc;

	while (i < n) {
		enum sm70_utf8_seq k = sm70__utf8_next(s + i, n - i, &len, &cp);

		if (k == SM70_UTF8_INCOMPLETE && !final)
			break;
		i += len;
	}
	if ((rc = sm70__utf8_append_lossy(&d->txt, s, i)))
		return rc;
	memmove(d->pend.s, d->pend.s + i, n - i);
	d->pend.len = n - i;
	d->pend.s[d->pend.len] = 0;
	return 0;
}

/* Passes txt on: to delta, or through the stop-string search. */
static int release(struct sm70_detok *d, struct sm70_text *delta)
{
	size_t best = SIZE_MAX, keep;
	int rc, which = -1;

	if (!d->n_stop) {
		rc = sm70_text_append(delta, d->txt.s, d->txt.len);
		sm70_text_clear(&d->txt);
		return rc;
	}
	rc = sm70_text_append(&d->held, d->txt.s, d->txt.len);
	sm70_text_clear(&d->txt);
	if (rc)
		return rc;
	/* the earliest complete match (the first stop string listed among equal starts) */
	for (size_t i = 0; i < d->n_stop; i++) {
		const char *m = memmem(d->held.s, d->held.len, d->stop[i], d->stop_len[i]);

		if (m && (size_t)(m - d->held.s) < best) {
			best = (size_t)(m - d->held.s);
			which = (int)i;
		}
	}
	if (which >= 0) {
		rc = sm70_text_append(delta, d->held.s, best);
		sm70_text_clear(&d->held);
		d->stopped = 1;
		d->stop_index = which;
		return rc ? rc : SM70_DETOK_STOPPED;
	}
	/* hold back the longest tail that some stop string begins with */
	keep = 0;
	for (size_t i = 0; i < d->n_stop; i++) {
		size_t max = d->stop_len[i] - 1 < d->held.len ? d->stop_len[i] - 1 : d->held.len;

		for (size_t l = max; l > keep; l--)
			if (!memcmp(d->held.s + d->held.len - l, d->stop[i], l)) {
				keep = l;
				break;
			}
	}
	rc = sm70_text_append(delta, d->held.s, d->held.len - keep);
	memmove(d->held.s, d->held.s + d->held.len - keep, keep);
	d->held.len = keep;
	d->held.s[keep] = 0;
	return rc;
}

int sm70_detok_push(struct sm70_detok *d, int32_t id, struct sm70_text *delta)
{
	const char *b;
	size_t n;
	int rc;

	if (d->stopped)
		return SM70_DETOK_STOPPED;
	b = sm70_tokenizer_token_bytes(d->tok, id, &n);
	if (!b)
		return -ERANGE;
	if ((d->flags & SM70_TOK_SKIP_SPECIAL) && sm70_tokenizer_is_special(d->tok, id))
		return 0;
	if ((rc = sm70_text_append(&d->pend, b, n)) || (rc = decide(d, 0)))
		return rc;
	return release(d, delta);
}

int sm70_detok_finish(struct sm70_detok *d, struct sm70_text *delta)
{
	int rc;

	if (d->stopped)
		return SM70_DETOK_STOPPED;
	if (d->pend.len && (rc = decide(d, 1)))
		return rc;
	if ((rc = release(d, delta)))
		return rc;
	rc = sm70_text_append(delta, d->held.s, d->held.len);
	sm70_text_clear(&d->held);
	return rc;
}
