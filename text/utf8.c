/* utf8.c - text buffers and UTF-8 scanning; see utf8.h. */
#include "text/utf8.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int sm70_text_reserve(struct sm70_text *t, size_t more)
{
	size_t need, cap;
	char *p;

	if (more > SIZE_MAX - t->len - 1)
		return -ENOMEM;
	need = t->len + more + 1;
	if (need <= t->cap)
		return 0;
	cap = t->cap ? t->cap : 64;
	while (cap < need)
		cap = cap > SIZE_MAX / 2 ? need : cap * 2;
	p = realloc(t->s, cap);
	if (!p)
		return -ENOMEM;
	t->s = p;
	t->cap = cap;
	return 0;
}

int sm70_text_append(struct sm70_text *t, const void *p, size_t n)
{
	int rc = sm70_text_reserve(t, n);

	if (rc)
		return rc;
	if (n)
		memcpy(t->s + t->len, p, n);
	t->len += n;
	t->s[t->len] = 0;
	return 0;
}

void sm70_text_clear(struct sm70_text *t)
{
	t->len = 0;
	if (t->s)
		t->s[0] = 0;
}

void sm70_text_free(struct sm70_text *t)
{
	free(t->s);
	t->s = NULL;
	t->len = t->cap = 0;
}

enum sm70_utf8_seq sm70__utf8_next(const uint8_t *s, size_t n, size_t *len, uint32_t *cp)
{
	uint8_t b = s[0], lo = 0x80, hi = 0xBF;
	size_t need, i;
	uint32_t v;

	if (b < 0x80) {
		*len = 1;
		*cp = b;
		return SM70_UTF8_VALID;
	}
	if (b >= 0xC2 && b <= 0xDF) {
		need = 1;
		v = b & 0x1F;
	} else if (b >= 0xE0 && b <= 0xEF) {
		need = 2;
		v = b & 0x0F;
		if (b == 0xE0)
			lo = 0xA0;          /* no overlong 3-byte forms */
		else if (b == 0xED)
			hi = 0x9F;          /* no surrogates */
	} else if (b >= 0xF0 && b <= 0xF4) {
		need = 3;
		v = b & 0x07;
		if (b == 0xF0)
			lo = 0x90;
		else if (b == 0xF4)
			hi = 0x8F;          /* nothing past U+10FFFF */
	} else {
		*len = 1;
		return SM70_UTF8_INVALID;
	}
	for (i = 1; i <= need; i++) {
		if (i >= n) {
			*len = n;
			return SM70_UTF8_INCOMPLETE;
		}
		if (s[i] < lo || s[i] > hi) {
			*len = i;
			return SM70_UTF8_INVALID;
		}
		lo = 0x80;
		hi = 0xBF;
		v = (v << 6) | (s[i] & 0x3F);
	}
	*len = need + 1;
	*cp = v;
	return SM70_UTF8_VALID;
}

size_t sm70_utf8_check(const char *str, size_t n)
{
	const uint8_t *s = (const uint8_t *)str;
	size_t i = 0, len;
	uint32_t cp;

	while (i < n) {
		/* ASCII eight bytes at a time: most text is mostly ASCII */
		while (i + 8 <= n) {
			uint64_t w;

			memcpy(&w, s + i, 8);
			if (w & 0x8080808080808080ull)
				break;
			i += 8;
		}
		if (i >= n)
			break;
		if (s[i] < 0x80) {
			i++;
			continue;
		}
		if (sm70__utf8_next(s + i, n - i, &len, &cp) != SM70_UTF8_VALID)
			return i;
		i += len;
	}
	return n;
}

int sm70__utf8_append_lossy(struct sm70_text *t, const uint8_t *s, size_t n)
{
	static const uint8_t fffd[3] = {0xEF, 0xBF, 0xBD};
	size_t i = 0, run = 0, len;
	uint32_t cp;
	int rc;

	if (!n)
		return sm70_text_append(t, "", 0);
	while (i < n) {
		enum sm70_utf8_seq k = sm70__utf8_next(s + i, n - i, &len, &cp);

		if (k == SM70_UTF8_VALID) {
			i += len;
			continue;
		}
		if ((rc = sm70_text_append(t, s + run, i - run)) ||
		    (rc = sm70_text_append(t, fffd, 3)))
			return rc;
		i += len;
		run = i;
	}
	return sm70_text_append(t, s + run, n - run);
}
