/*
 * unicode.c - NFC normalisation over the generated tables (Unicode 9.0 data, see
 * unicode.h), following UAX #15: full canonical decomposition, canonical ordering of
 * each run of non-starters (stable by combining class), then canonical composition.
 *
 * Text splits for normalisation before every "inert" code point (class 0, no
 * decomposition, never the second half of a composition): NFC(xy) = NFC(x) NFC(y) when y
 * starts with one, so only the segments holding something else go through the full
 * algorithm and everything else is copied.
 */
#include "text/unicode.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

extern const uint32_t sm70__decomp_count;
extern const uint32_t sm70__decomp_cp[];
extern const uint16_t sm70__decomp_off[];
extern const uint32_t sm70__decomp_pool[];
extern const uint32_t sm70__comp_count;
extern const uint64_t sm70__comp_key[];
extern const uint32_t sm70__comp_val[];

#define S_BASE 0xAC00u
#define L_BASE 0x1100u
#define V_BASE 0x1161u
#define T_BASE 0x11A7u
#define L_COUNT 19u
#define V_COUNT 21u
#define T_COUNT 28u
#define N_COUNT (V_COUNT * T_COUNT)
#define S_COUNT (L_COUNT * N_COUNT)

size_t sm70__decompose(uint32_t cp, const uint32_t **seq)
{
	size_t lo = 0, hi = sm70__decomp_count;

	while (lo < hi) {
		size_t mid = (lo + hi) / 2;

		if (sm70__decomp_cp[mid] < cp) {
			lo = mid + 1;
		} else if (sm70__decomp_cp[mid] > cp) {
			hi = mid;
		} else {
			*seq = sm70__decomp_pool + sm70__decomp_off[mid];
			return (size_t)(sm70__decomp_off[mid + 1] - sm70__decomp_off[mid]);
		}
	}
	return 0;
}

uint32_t sm70__compose(uint32_t a, uint32_t b)
{
	uint64_t key = ((uint64_t)a << 21) | b;
	size_t lo = 0, hi = sm70__comp_count;

	if (a - L_BASE < L_COUNT && b - V_BASE < V_COUNT)
		return S_BASE + ((a - L_BASE) * V_COUNT + (b - V_BASE)) * T_COUNT;
	if (a - S_BASE < S_COUNT && (a - S_BASE) % T_COUNT == 0 && b > T_BASE &&
	    b < T_BASE + T_COUNT)
		return a + (b - T_BASE);
	while (lo < hi) {
		size_t mid = (lo + hi) / 2;

		if (sm70__comp_key[mid] < key)
			lo = mid + 1;
		else if (sm70__comp_key[mid] > key)
			hi = mid;
		else
			return sm70__comp_val[mid];
	}
	return 0;
}

/* A segment's code points while it is normalised: on the stack for the usual few. */
struct cpbuf {
	uint32_t *v;
	size_t n, cap;
	uint32_t local[64];
};

static int cp_push(struct cpbuf *b, uint32_t cp)
{
	if (b->n == b->cap) {
		size_t cap = b->cap * 2;
		uint32_t *v = b->v == b->local ? malloc(cap * sizeof(*v)) :
						 realloc(b->v, cap * sizeof(*v));

		if (!v)
			return -ENOMEM;
		if (b->v == b->local)
			memcpy(v, b->local, sizeof(b->local));
		b->v = v;
		b->cap = cap;
	}
	b->v[b->n++] = cp;
	return 0;
}

static int decompose_into(struct cpbuf *b, uint32_t cp)
{
	const uint32_t *seq;
	size_t n;

	if (cp - S_BASE < S_COUNT) {
		uint32_t si = cp - S_BASE, t = si % T_COUNT;
		int rc = cp_push(b, L_BASE + si / N_COUNT);

		if (!rc)
			rc = cp_push(b, V_BASE + (si % N_COUNT) / T_COUNT);
		if (!rc && t)
			rc = cp_push(b, T_BASE + t);
		return rc;
	}
	n = sm70__decompose(cp, &seq);
	if (!n)
		return cp_push(b, cp);
	for (size_t i = 0; i < n; i++) {
		int rc = cp_push(b, seq[i]);

		if (rc)
			return rc;
	}
	return 0;
}

/* Sorts one run of non-starters stably by combining class: insertion sort for the usual
 * few, a counting sort for long runs (text made of nothing but marks must not cost n^2). */
static int sort_run(uint32_t *v, size_t n)
{
	if (n <= 32) {
		for (size_t i = 1; i < n; i++) {
			uint32_t x = v[i];
			unsigned c = sm70__ccc(x);
			size_t j = i;

			while (j > 0 && sm70__ccc(v[j - 1]) > c) {
				v[j] = v[j - 1];
				j--;
			}
			v[j] = x;
		}
		return 0;
	}
	{
		size_t count[257] = {0};
		uint32_t *tmp = malloc(n * sizeof(*tmp));

		if (!tmp)
			return -ENOMEM;
		for (size_t i = 0; i < n; i++)
			count[sm70__ccc(v[i]) + 1]++;
		for (unsigned c = 1; c <= 256; c++)
			count[c] += count[c - 1];
		for (size_t i = 0; i < n; i++)
			tmp[count[sm70__ccc(v[i])]++] = v[i];
		memcpy(v, tmp, n * sizeof(*tmp));
		free(tmp);
		return 0;
	}
}

/* Canonical ordering: each run of non-starters sorted by class. */
static int reorder(uint32_t *v, size_t n)
{
	size_t i = 0;

	while (i < n) {
		size_t j = i;
		int rc;

		while (j < n && sm70__ccc(v[j]) != 0)
			j++;
		if (j - i > 1 && (rc = sort_run(v + i, j - i)))
			return rc;
		i = j + 1;
	}
	return 0;
}

/* Canonical composition in place; returns the new length. A character composes with the
 * last starter when nothing between them blocks it (a class 0, or a class >= its own). */
static size_t compose(uint32_t *v, size_t n)
{
	size_t starter = 0, out = 0;
	int have_starter = 0;
	int last_ccc = -1;      /* class of the last character kept after the starter */

	for (size_t i = 0; i < n; i++) {
		uint32_t cp = v[i];
		int c = (int)sm70__ccc(cp);

		if (have_starter && (last_ccc == -1 || (last_ccc != 0 && last_ccc < c))) {
			uint32_t r = sm70__compose(v[starter], cp);

			if (r) {
				v[starter] = r;
				continue;
			}
		}
		if (c == 0) {
			starter = out;
			have_starter = 1;
			last_ccc = -1;
		} else {
			last_ccc = c;
		}
		v[out++] = cp;
	}
	return out;
}

static int normalize_segment(struct sm70_text *out, const uint8_t *s, size_t n)
{
	struct cpbuf b;
	size_t i = 0, len;
	int rc = 0;

	b.v = b.local;
	b.n = 0;
	b.cap = sizeof(b.local) / sizeof(b.local[0]);
	while (i < n && !rc) {
		uint32_t cp = sm70__utf8_get(s + i, &len);

		rc = decompose_into(&b, cp);
		i += len;
	}
	if (!rc)
		rc = reorder(b.v, b.n);
	if (!rc) {
		b.n = compose(b.v, b.n);
		rc = sm70_text_reserve(out, b.n * 4);
	}
	if (!rc) {
		for (size_t k = 0; k < b.n; k++)
			out->len += sm70__utf8_put((uint8_t *)out->s + out->len, b.v[k]);
		out->s[out->len] = 0;
	}
	if (b.v != b.local)
		free(b.v);
	return rc;
}

int sm70__nfc_inert(const char *str, size_t n)
{
	const uint8_t *s = (const uint8_t *)str;
	size_t i = 0, len;

	while (i < n) {
		if (s[i] < 0x80) {
			i++;
			continue;
		}
		if (!(sm70__uprop(sm70__utf8_get(s + i, &len)) & SM70_UP_NFC_INERT))
			return 0;
		i += len;
	}
	return 1;
}

int sm70__nfc_append(struct sm70_text *out, const char *str, size_t n)
{
	const uint8_t *s = (const uint8_t *)str;
	size_t i = 0, copied = 0, seg = 0, len;
	int dirty = 0, rc;

	/* copied: text before it is in out; seg: where the segment holding the current
	 * character starts (the last inert character, or the start) */
	while (i < n) {
		uint32_t cp;
		unsigned inert;

		if (s[i] < 0x80) {
			cp = s[i];
			len = 1;
			inert = 1;
		} else {
			cp = sm70__utf8_get(s + i, &len);
			inert = sm70__uprop(cp) & SM70_UP_NFC_INERT;
		}
		if (inert) {
			if (dirty) {
				if ((rc = sm70_text_append(out, s + copied, seg - copied)) ||
				    (rc = normalize_segment(out, s + seg, i - seg)))
					return rc;
				copied = i;
				dirty = 0;
			}
			seg = i;
		} else {
			dirty = 1;
		}
		i += len;
	}
	if (dirty) {
		if ((rc = sm70_text_append(out, s + copied, seg - copied)) ||
		    (rc = normalize_segment(out, s + seg, n - seg)))
			return rc;
		return 0;
	}
	return sm70_text_append(out, s + copied, n - copied);
}
