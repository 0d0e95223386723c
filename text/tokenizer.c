/*
 * tokenizer.c - tokenizer.json loading, encoding and decoding; see tokenizer.h.
 *
 * Encoding runs the stages of the tokenizers package in its order, so each stage can be
 * checked against it: (1) added tokens whose `normalized` is false are found in the raw
 * text, leftmost-longest; (2) each stretch between them is NFC-normalised and searched for
 * the `normalized` added tokens; (3) each remaining stretch is split by the pre-tokenizer
 * regex, matched by hand (pretok_match: the alternatives of the pattern in order, as a
 * backtracking engine would take them); (4) each piece's bytes go through BPE by merge
 * rank. Byte-level mapping is folded in: BPE starts from the ids of the 256 byte symbols,
 * and every id keeps the bytes it decodes to, so no byte-level strings exist at run time.
 *
 * Not a regex engine, not a general BPE (no dropout, no byte fallback, no subword
 * prefixes): what a tokenizer.json asks beyond this is refused at load, by name.
 */
#include "text/tokenizer.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/internal.h"
#include "text/unicode.h"

/* The Split patterns implemented by pretok_match: Qwen2/Qwen3 (single digits) and
 * Llama-3 (digits in runs of up to three); otherwise the same. */
static const char QWEN2_PATTERN[] =
	"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}|"
	" ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char LLAMA3_PATTERN[] =
	"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}|"
	" ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

enum { ID_PRESENT = 1, ID_SPECIAL = 2, ID_ADDED = 4 };

struct added_tok {
	char *content;          /* as in the file */
	char *match;            /* what is searched for: content, or its NFC when normalized */
	size_t content_len, match_len;
	int32_t id;
	uint8_t special, normalized, lstrip, rstrip, single_word;
};

/* Leftmost-longest search over a set of added tokens: candidates grouped by first byte,
 * longest first, so the first that matches at a position is the longest there. */
struct match_set {
	uint32_t start[257];    /* order[start[b] .. start[b + 1]) begin with byte b */
	uint32_t *order;        /* indices into added[] */
	size_t n;
};

struct merge_slot {
	uint64_t key;           /* (left id << 32) | right id */
	uint32_t rank;          /* UINT32_MAX: empty slot */
	int32_t id;             /* the merged token */
};

struct sm70_tokenizer {
	size_t n_ids;           /* largest id + 1 */
	uint32_t *dec_off;      /* bytes of id i: dec_bytes[dec_off[i] .. dec_off[i + 1]) */
	char *dec_bytes;
	uint32_t *str_off;      /* spelling of id i in the file, likewise */
	char *str_bytes;
	uint8_t *id_flags;
	int32_t *vocab_hash;    /* spelling -> id for the model's vocab; -1 empty */
	size_t vocab_mask;
	size_t vocab_count;
	struct merge_slot *merges;
	size_t merge_mask;
	int32_t byte_id[256];   /* the id of each byte's symbol */
	struct added_tok *added;
	size_t n_added;
	struct match_set raw_set, norm_set;
	int nfc, digits_max, ignore_merges;
};

/* ---- small helpers ------------------------------------------------------------------ */

void sm70_ids_free(struct sm70_ids *ids)
{
	free(ids->v);
	ids->v = NULL;
	ids->n = ids->cap = 0;
}

static int ids_push(struct sm70_ids *ids, int32_t id)
{
	if (ids->n == ids->cap) {
		size_t cap = ids->cap ? ids->cap * 2 : 64;
		int32_t *v = realloc(ids->v, cap * sizeof(*v));

		if (!v)
			return -ENOMEM;
		ids->v = v;
		ids->cap = cap;
	}
	ids->v[ids->n++] = id;
	return 0;
}

static uint64_t hash_bytes(const void *p, size_t n)
{
	const uint8_t *s = p;
	uint64_t h = 0xcbf29ce484222325ull;

	for (size_t i = 0; i < n; i++)
		h = (h ^ s[i]) * 0x100000001b3ull;
	return h ^ (h >> 29);
}

static uint64_t hash_pair(uint64_t key)
{
	key *= 0x9E3779B97F4A7C15ull;
	return key ^ (key >> 31);
}

/* GPT-2's byte-level alphabet: printable Latin-1 bytes stand for themselves, the other 68
 * (0x00-0x20, 0x7F-0xA0, 0xAD) for U+0100.. in byte order. Pure functions: no tables to
 * initialise, so nothing is shared between threads. */
static uint32_t byte_char(unsigned b)
{
	if (b <= 0x20)
		return 256 + b;
	if (b >= 0x7F && b <= 0xA0)
		return 256 + 33 + (b - 0x7F);
	if (b == 0xAD)
		return 256 + 67;
	return b;
}

/* The byte a byte-level character stands for, or -1. */
static int char_byte(uint32_t cp)
{
	if ((cp >= 0x21 && cp <= 0x7E) || (cp >= 0xA1 && cp <= 0xAC) || (cp >= 0xAE && cp <= 0xFF))
		return (int)cp;
	if (cp >= 256 && cp <= 256 + 32)
		return (int)(cp - 256);
	if (cp >= 256 + 33 && cp <= 256 + 66)
		return (int)(0x7F + cp - 256 - 33);
	if (cp == 256 + 67)
		return 0xAD;
	return -1;
}

/* ---- vocabulary --------------------------------------------------------------------- */

static const char *spelling(const struct sm70_tokenizer *t, int32_t id, size_t *len)
{
	*len = t->str_off[id + 1] - t->str_off[id];
	return t->str_bytes + t->str_off[id];
}

static int32_t vocab_find(const struct sm70_tokenizer *t, const char *s, size_t n)
{
	size_t i = hash_bytes(s, n) & t->vocab_mask;

	for (;; i = (i + 1) & t->vocab_mask) {
		int32_t id = t->vocab_hash[i];
		size_t l;
		const char *p;

		if (id < 0)
			return -1;
		p = spelling(t, id, &l);
		if (l == n && !memcmp(p, s, n))
			return id;
	}
}

static const struct merge_slot *merge_find(const struct sm70_tokenizer *t, int32_t a,
					   int32_t b)
{
	uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
	size_t i = hash_pair(key) & t->merge_mask;

	for (;; i = (i + 1) & t->merge_mask) {
		const struct merge_slot *m = &t->merges[i];

		if (m->rank == UINT32_MAX)
			return NULL;
		if (m->key == key)
			return m;
	}
}

static uint32_t merge_rank(const struct sm70_tokenizer *t, int32_t a, int32_t b, int32_t *id)
{
	const struct merge_slot *m = merge_find(t, a, b);

	if (!m)
		return UINT32_MAX;
	*id = m->id;
	return m->rank;
}

/* ---- BPE ---------------------------------------------------------------------------- */

/* Words up to this many bytes merge by scanning the pairs (the usual case); longer ones
 * through a heap, so a megabyte-long "word" stays O(n log n). Both take the lowest-rank
 * pair, the leftmost among equals, as tokenizers' Word::merge_all does. A variable so the
 * tests can run either path over the whole corpus (internal.h). */
size_t sm70__bpe_scan_max = 48;

static int bpe_scan(const struct sm70_tokenizer *t, const uint8_t *p, size_t n,
		    struct sm70_ids *out)
{
	int32_t ids[64], nid[64];
	uint32_t rank[64];
	size_t count = n;

	for (size_t k = 0; k < n; k++)
		ids[k] = t->byte_id[p[k]];
	for (size_t k = 0; k + 1 < n; k++)
		rank[k] = merge_rank(t, ids[k], ids[k + 1], &nid[k]);
	while (count > 1) {
		size_t best = 0;
		uint32_t br = rank[0];

		for (size_t k = 1; k + 1 < count; k++)
			if (rank[k] < br) {
				br = rank[k];
				best = k;
			}
		if (br == UINT32_MAX)
			break;
		ids[best] = nid[best];
		count--;
		memmove(ids + best + 1, ids + best + 2, (count - best - 1) * sizeof(ids[0]));
		memmove(rank + best + 1, rank + best + 2,
			(count > best + 2 ? count - best - 2 : 0) * sizeof(rank[0]));
		memmove(nid + best + 1, nid + best + 2,
			(count > best + 2 ? count - best - 2 : 0) * sizeof(nid[0]));
		if (best > 0)
			rank[best - 1] = merge_rank(t, ids[best - 1], ids[best], &nid[best - 1]);
		if (best + 1 < count)
			rank[best] = merge_rank(t, ids[best], ids[best + 1], &nid[best]);
	}
	for (size_t k = 0; k < count; k++) {
		int rc = ids_push(out, ids[k]);

		if (rc)
			return rc;
	}
	return 0;
}

struct heap_ent {
	uint32_t rank;
	uint32_t pos;
};

static int heap_less(struct heap_ent a, struct heap_ent b)
{
	return a.rank < b.rank || (a.rank == b.rank && a.pos < b.pos);
}

static void heap_push(struct heap_ent *h, size_t *n, struct heap_ent e)
{
	size_t i = (*n)++;

	while (i > 0) {
		size_t up = (i - 1) / 2;

		if (!heap_less(e, h[up]))
			break;
		h[i] = h[up];
		i = up;
	}
	h[i] = e;
}

static struct heap_ent heap_pop(struct heap_ent *h, size_t *n)
{
	struct heap_ent top = h[0], last = h[--(*n)];
	size_t i = 0;

	for (;;) {
		size_t c = 2 * i + 1;

		if (c >= *n)
			break;
		if (c + 1 < *n && heap_less(h[c + 1], h[c]))
			c++;
		if (!heap_less(h[c], last))
			break;
		h[i] = h[c];
		i = c;
	}
	if (*n)
		h[i] = last;
	return top;
}

static int bpe_heap(const struct sm70_tokenizer *t, const uint8_t *p, size_t n,
		    struct sm70_ids *out)
{
	int32_t *ids = malloc(n * sizeof(*ids));
	int32_t *next = malloc(n * sizeof(*next));
	int32_t *prev = malloc(n * sizeof(*prev));
	struct heap_ent *h = malloc(2 * n * sizeof(*h));
	size_t hn = 0;
	int rc = -ENOMEM;

	if (!ids || !next || !prev || !h)
		goto out;
	for (size_t k = 0; k < n; k++) {
		ids[k] = t->byte_id[p[k]];
		next[k] = k + 1 < n ? (int32_t)(k + 1) : -1;
		prev[k] = (int32_t)k - 1;
	}
	for (size_t k = 0; k + 1 < n; k++) {
		int32_t nid;
		uint32_t r = merge_rank(t, ids[k], ids[k + 1], &nid);

		if (r != UINT32_MAX)
			heap_push(h, &hn, (struct heap_ent){r, (uint32_t)k});
	}
	while (hn) {
		struct heap_ent e = heap_pop(h, &hn);
		int32_t a = (int32_t)e.pos, b, nid;
		uint32_t r;

		if (ids[a] < 0 || next[a] < 0)
			continue;               /* merged away, or now the last symbol */
		b = next[a];
		r = merge_rank(t, ids[a], ids[b], &nid);
		if (r != e.rank)
			continue;               /* a stale entry: the pair changed */
		ids[a] = nid;
		ids[b] = -1;
		next[a] = next[b];
		if (next[a] >= 0)
			prev[next[a]] = a;
		if (prev[a] >= 0) {
			r = merge_rank(t, ids[prev[a]], ids[a], &nid);
			if (r != UINT32_MAX)
				heap_push(h, &hn, (struct heap_ent){r, (uint32_t)prev[a]});
		}
		if (next[a] >= 0) {
			r = merge_rank(t, ids[a], ids[next[a]], &nid);
			if (r != UINT32_MAX)
				heap_push(h, &hn, (struct heap_ent){r, (uint32_t)a});
		}
	}
	rc = 0;
	for (int32_t k = 0; k >= 0 && !rc; k = next[k])
		rc = ids_push(out, ids[k]);
out:
	free(h);
	free(prev);
	free(next);
	free(ids);
	return rc;
}

static int bpe(const struct sm70_tokenizer *t, const uint8_t *p, size_t n,
	       struct sm70_ids *out)
{
	if (n == 1)
		return ids_push(out, t->byte_id[p[0]]);
	if (t->ignore_merges) {
		/* a word that is itself a token is that token, whatever the merges say */
		char local[256], *buf = n * 2 <= sizeof(local) ? local : malloc(n * 2);
		size_t l = 0;
		int32_t id;

		if (!buf)
			return -ENOMEM;
		for (size_t k = 0; k < n; k++)
			l += sm70__utf8_put((uint8_t *)buf + l, byte_char(p[k]));
		id = vocab_find(t, buf, l);
		if (buf != local)
			free(buf);
		if (id >= 0)
			return ids_push(out, id);
	}
	if (n <= sm70__bpe_scan_max && n <= 64)
		return bpe_scan(t, p, n, out);
	return bpe_heap(t, p, n, out);
}

/* ---- the pre-tokenizer split -------------------------------------------------------- */

static inline uint32_t cp_at(const uint8_t *s, size_t i, size_t *len, unsigned *props)
{
	uint32_t cp;

	if (s[i] < 0x80) {
		*len = 1;
		cp = s[i];
	} else {
		cp = sm70__utf8_get(s + i, len);
	}
	*props = sm70__uprop(cp);
	return cp;
}

/* [^\s\p{L}\p{N}] */
#define IS_OTHER(p) (!((p) & (SM70_UP_L | SM70_UP_N | SM70_UP_WS)))

/* End of the regex match that starts at s[i] (i < n): the pattern's alternatives tried in
 * order, each the way a backtracking engine resolves it (docs/TOKENIZER.md walks through
 * them). */
static size_t pretok_match(const uint8_t *s, size_t n, size_t i, int digits_max)
{
	size_t l0, l1, j, k;
	unsigned p0, p1;
	uint32_t c0 = cp_at(s, i, &l0, &p0), c1;

	/* (?i:'s|'t|'re|'ve|'m|'ll|'d): case-insensitively, so "ſ" (which folds to s) too */
	if (c0 == '\'' && i + 1 < n) {
		uint8_t a = s[i + 1] | 0x20, b = i + 2 < n ? (s[i + 2] | 0x20) : 0;

		if (s[i + 1] < 0x80 && (a == 's' || a == 't' || a == 'm' || a == 'd'))
			return i + 2;
		if (s[i + 1] == 0xC5 && i + 2 < n && s[i + 2] == 0xBF)
			return i + 3;
		if (s[i + 1] < 0x80 && i + 2 < n && s[i + 2] < 0x80 &&
		    ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')))
			return i + 3;
	}
	/* [^\r\n\p{L}\p{N}]?\p{L}+ */
	j = i;
	if (!(p0 & (SM70_UP_L | SM70_UP_N)) && c0 != '\r' && c0 != '\n' && i + l0 < n) {
		cp_at(s, i + l0, &l1, &p1);
		if (p1 & SM70_UP_L)
			j = i + l0;
	}
	if (j != i || (p0 & SM70_UP_L)) {
		while (j < n) {
			cp_at(s, j, &l1, &p1);
			if (!(p1 & SM70_UP_L))
				break;
			j += l1;
		}
		return j;
	}
	/* \p{N} or \p{N}{1,3} */
	if (p0 & SM70_UP_N) {
		j = i + l0;
		for (int d = 1; d < digits_max && j < n; d++) {
			cp_at(s, j, &l1, &p1);
			if (!(p1 & SM70_UP_N))
				break;
			j += l1;
		}
		return j;
	}
	/* " ?[^\s\p{L}\p{N}]+[\r\n]*" */
	j = i;
	if (c0 == ' ' && i + 1 < n) {
		cp_at(s, i + 1, &l1, &p1);
		if (IS_OTHER(p1))
			j = i + 1;
	}
	cp_at(s, j, &l1, &p1);
	if (IS_OTHER(p1)) {
		while (j < n) {
			cp_at(s, j, &l1, &p1);
			if (!IS_OTHER(p1))
				break;
			j += l1;
		}
		while (j < n && (s[j] == '\r' || s[j] == '\n'))
			j++;
		return j;
	}
	/* whitespace from here on: the run [i, k), its last newline, its last character */
	{
		size_t last_nl = SIZE_MAX, last = i;

		for (k = i; k < n;) {
			c1 = cp_at(s, k, &l1, &p1);
			if (!(p1 & SM70_UP_WS))
				break;
			if (c1 == '\r' || c1 == '\n')
				last_nl = k;
			last = k;
			k += l1;
		}
		/* \s*[\r\n]+: \s* backs off to the last newline, which then ends the match */
		if (last_nl != SIZE_MAX)
			return last_nl + 1;
		/* \s+(?!\S): the whole run at the end of the text, else all but its last
		 * character (which precedes a non-space); \s+ for a single character */
		if (k == n || last == i)
			return k == n ? k : i + l0;
		return last;
	}
}

size_t sm70__pretok_next(const char *s, size_t n, size_t i, int digits_max)
{
	return pretok_match((const uint8_t *)s, n, i, digits_max);
}

/* ---- added tokens ------------------------------------------------------------------- */

static int is_word_char_before(const uint8_t *s, size_t end)
{
	size_t b = end, len;

	if (!end)
		return 0;
	do
		b--;
	while (b > 0 && (s[b] & 0xC0) == 0x80);
	return !!(sm70__uprop(sm70__utf8_get(s + b, &len)) & SM70_UP_WORD);
}

static int is_word_char_at(const uint8_t *s, size_t n, size_t i)
{
	size_t len;

	if (i >= n)
		return 0;
	return !!(sm70__uprop(sm70__utf8_get(s + i, &len)) & SM70_UP_WORD);
}

/* Start of the white space that ends s[0..end). */
static size_t space_start_before(const uint8_t *s, size_t end)
{
	while (end > 0) {
		size_t b = end, len;

		do
			b--;
		while (b > 0 && (s[b] & 0xC0) == 0x80);
		if (!(sm70__uprop(sm70__utf8_get(s + b, &len)) & SM70_UP_WS))
			break;
		end = b;
	}
	return end;
}

static size_t space_end_after(const uint8_t *s, size_t n, size_t i)
{
	while (i < n) {
		size_t len;

		if (!(sm70__uprop(sm70__utf8_get(s + i, &len)) & SM70_UP_WS))
			break;
		i += len;
	}
	return i;
}

/* The longest added token of the set at s[i], or -1. */
static long set_match_at(const struct sm70_tokenizer *t, const struct match_set *ms,
			 const uint8_t *s, size_t n, size_t i)
{
	for (uint32_t k = ms->start[s[i]]; k < ms->start[s[i] + 1]; k++) {
		const struct added_tok *a = &t->added[ms->order[k]];

		if (a->match_len <= n - i && !memcmp(s + i, a->match, a->match_len))
			return (long)ms->order[k];
	}
	return -1;
}

typedef int (*piece_fn)(const struct sm70_tokenizer *t, const uint8_t *s, size_t n,
			unsigned flags, struct sm70_ids *out);

/* Splits s[0..n) at the set's added tokens as tokenizers' find_matches does: their ids go
 * to out, the stretches between them to fn. */
static int split_added(const struct sm70_tokenizer *t, const struct match_set *ms,
		       const uint8_t *s, size_t n, unsigned flags, struct sm70_ids *out,
		       piece_fn fn)
{
	size_t done = 0, i = 0;
	int rc;

	if (!ms->n)
		return n ? fn(t, s, n, flags, out) : 0;
	while (i < n) {
		size_t start, stop;
		const struct added_tok *a;
		long k;

		if (ms->start[s[i]] == ms->start[s[i] + 1] ||
		    (k = set_match_at(t, ms, s, n, i)) < 0) {
			i++;
			continue;
		}
		a = &t->added[k];
		start = i;
		stop = i + a->match_len;
		i = stop;
		if ((flags & SM70_TOK_SPECIAL_AS_TEXT) && a->special)
			continue;
		if (a->single_word && (is_word_char_before(s, start) || is_word_char_at(s, n, stop)))
			continue;
		if (a->lstrip) {
			size_t ns = space_start_before(s, start);

			start = ns > done ? ns : done;
		}
		if (a->rstrip)
			stop = space_end_after(s, n, stop);
		if (start > done && (rc = fn(t, s + done, start - done, flags, out)))
			return rc;
		if ((rc = ids_push(out, a->id)))
			return rc;
		done = stop;
		if (i < stop)
			i = stop;
	}
	if (done < n)
		return fn(t, s + done, n - done, flags, out);
	return 0;
}

static int encode_pretok(const struct sm70_tokenizer *t, const uint8_t *s, size_t n,
			 unsigned flags, struct sm70_ids *out)
{
	for (size_t i = 0; i < n;) {
		size_t end = pretok_match(s, n, i, t->digits_max);
		int rc = bpe(t, s + i, end - i, out);

		if (rc)
			return rc;
		i = end;
	}
	return 0;
}

static int encode_normalized(const struct sm70_tokenizer *t, const uint8_t *s, size_t n,
			     unsigned flags, struct sm70_ids *out)
{
	struct sm70_text norm = {0};
	int rc;

	if (!t->nfc || sm70__nfc_inert((const char *)s, n))
		return split_added(t, &t->norm_set, s, n, flags, out, encode_pretok);
	rc = sm70__nfc_append(&norm, (const char *)s, n);
	if (!rc)
		rc = split_added(t, &t->norm_set, (const uint8_t *)norm.s, norm.len, flags, out,
				 encode_pretok);
	sm70_text_free(&norm);
	return rc;
}

int sm70_tokenizer_encode(const struct sm70_tokenizer *t, const char *text, size_t len,
			  unsigned flags, struct sm70_ids *out, struct sm70_err *err)
{
	size_t bad = sm70_utf8_check(text, len);

	if (bad != len)
		return sm70_errf(err, -EILSEQ, "text is not valid UTF-8 (byte %zu)", bad);
	return split_added(t, &t->raw_set, (const uint8_t *)text, len, flags, out,
			   encode_normalized);
}

/* ---- decoding ----------------------------------------------------------------------- */

int sm70_tokenizer_decode(const struct sm70_tokenizer *t, const int32_t *ids, size_t n,
			  unsigned flags, struct sm70_text *out, struct sm70_err *err)
{
	struct sm70_text raw = {0};
	int rc = 0;

	for (size_t i = 0; i < n && !rc; i++) {
		int32_t id = ids[i];

		if (id < 0 || (size_t)id >= t->n_ids || !(t->id_flags[id] & ID_PRESENT)) {
			rc = sm70_errf(err, -ERANGE, "token id %d is not in the vocabulary", id);
			break;
		}
		if ((flags & SM70_TOK_SKIP_SPECIAL) && (t->id_flags[id] & ID_SPECIAL))
			continue;
		rc = sm70_text_append(&raw, t->dec_bytes + t->dec_off[id],
				      t->dec_off[id + 1] - t->dec_off[id]);
	}
	if (!rc)
		rc = sm70__utf8_append_lossy(out, (const uint8_t *)raw.s, raw.len);
	sm70_text_free(&raw);
	return rc;
}

size_t sm70_tokenizer_vocab_size(const struct sm70_tokenizer *t)
{
	return t->n_ids;
}

const char *sm70_tokenizer_token_bytes(const struct sm70_tokenizer *t, int32_t id,
				       size_t *len)
{
	if (id < 0 || (size_t)id >= t->n_ids || !(t->id_flags[id] & ID_PRESENT))
		return NULL;
	*len = t->dec_off[id + 1] - t->dec_off[id];
	return t->dec_bytes + t->dec_off[id];
}

int32_t sm70_tokenizer_token_id(const struct sm70_tokenizer *t, const char *s, size_t len)
{
	for (size_t i = 0; i < t->n_added; i++)
		if (t->added[i].content_len == len && !memcmp(t->added[i].content, s, len))
			return t->added[i].id;
	return vocab_find(t, s, len);
}

int sm70_tokenizer_is_special(const struct sm70_tokenizer *t, int32_t id)
{
	return id >= 0 && (size_t)id < t->n_ids && (t->id_flags[id] & ID_SPECIAL);
}

/* ---- loading ------------------------------------------------------------------------ */

void sm70_tokenizer_free(struct sm70_tokenizer *t)
{
	if (!t)
		return;
	for (size_t i = 0; i < t->n_added; i++) {
		if (t->added[i].match != t->added[i].content)
			free(t->added[i].match);
		free(t->added[i].content);
	}
	free(t->added);
	free(t->raw_set.order);
	free(t->norm_set.order);
	free(t->merges);
	free(t->vocab_hash);
	free(t->id_flags);
	free(t->str_bytes);
	free(t->str_off);
	free(t->dec_bytes);
	free(t->dec_off);
	free(t);
}

/* Appends what a spelling decodes to, as the ByteLevel decoder does: the bytes its
 * characters stand for, or the spelling's own UTF-8 when any character is outside the
 * byte-level alphabet. */
static int bytelevel_decode(struct sm70_text *out, const char *s, size_t n)
{
	size_t mark = out->len, i = 0, len;
	int rc;

	while (i < n) {
		uint32_t cp = sm70__utf8_get((const uint8_t *)s + i, &len);
		int b = char_byte(cp);
		uint8_t c;

		if (b < 0) {
			out->len = mark;
			return sm70_text_append(out, s, n);
		}
		c = (uint8_t)b;
		if ((rc = sm70_text_append(out, &c, 1)))
			return rc;
		i += len;
	}
	return 0;
}

static int json_flag(json_t *o, const char *key, int dflt)
{
	json_t *v = json_object_get(o, key);

	return json_is_boolean(v) ? json_is_true(v) : dflt;
}

static int is_null_or_empty(json_t *v)
{
	return !v || json_is_null(v) || (json_is_string(v) && !json_string_length(v));
}

static const char *type_of(json_t *o)
{
	const char *s = json_string_value(json_object_get(o, "type"));

	return s ? s : "(no type)";
}

static int check_model(json_t *m, struct sm70_err *err)
{
	json_t *v;

	if (!json_is_object(m))
		return sm70_errf(err, -EINVAL, "\"model\" is missing or not an object");
	if (json_object_get(m, "type") && strcmp(type_of(m), "BPE"))
		return sm70_errf(err, -ENOTSUP, "model type %s is not supported (BPE only)",
				 type_of(m));
	v = json_object_get(m, "dropout");
	if (v && !json_is_null(v) && !(json_is_number(v) && json_number_value(v) == 0.0))
		return sm70_errf(err, -ENOTSUP, "BPE dropout is not supported");
	if (json_flag(m, "byte_fallback", 0))
		return sm70_errf(err, -ENOTSUP, "BPE byte_fallback is not supported "
				 "(byte-level BPE only)");
	if (!is_null_or_empty(json_object_get(m, "continuing_subword_prefix")))
		return sm70_errf(err, -ENOTSUP, "BPE continuing_subword_prefix is not supported");
	if (!is_null_or_empty(json_object_get(m, "end_of_word_suffix")))
		return sm70_errf(err, -ENOTSUP, "BPE end_of_word_suffix is not supported");
	if (!json_is_object(json_object_get(m, "vocab")))
		return sm70_errf(err, -EINVAL, "model.vocab is missing or not an object");
	if (!json_is_array(json_object_get(m, "merges")))
		return sm70_errf(err, -EINVAL, "model.merges is missing or not an array");
	return 0;
}

static int check_bytelevel(json_t *o, const char *where, struct sm70_err *err)
{
	if (json_flag(o, "add_prefix_space", 0))
		return sm70_errf(err, -ENOTSUP, "%s ByteLevel with add_prefix_space is not "
				 "supported", where);
	return 0;
}

static int load_pipeline(struct sm70_tokenizer *t, json_t *root, struct sm70_err *err)
{
	json_t *v = json_object_get(root, "version"), *pt, *seq, *split, *bl, *pat;
	const char *s;
	int rc;

	if (v && json_is_string(v) && strcmp(json_string_value(v), "1.0"))
		return sm70_errf(err, -ENOTSUP, "tokenizer.json version %s is not supported",
				 json_string_value(v));
	v = json_object_get(root, "truncation");
	if (v && !json_is_null(v))
		return sm70_errf(err, -ENOTSUP, "truncation is set; sm70 does not truncate");
	v = json_object_get(root, "padding");
	if (v && !json_is_null(v))
		return sm70_errf(err, -ENOTSUP, "padding is set; sm70 does not pad");

	v = json_object_get(root, "normalizer");
	if (!v || json_is_null(v))
		t->nfc = 0;
	else if (!strcmp(type_of(v), "NFC"))
		t->nfc = 1;
	else
		return sm70_errf(err, -ENOTSUP, "normalizer %s is not supported (NFC or none)",
				 type_of(v));

	pt = json_object_get(root, "pre_tokenizer");
	if (!json_is_object(pt) || strcmp(type_of(pt), "Sequence"))
		return sm70_errf(err, -ENOTSUP, "pre_tokenizer %s is not supported (a Sequence of "
				 "Split and ByteLevel)", pt ? type_of(pt) : "null");
	seq = json_object_get(pt, "pretokenizers");
	if (json_array_size(seq) != 2)
		return sm70_errf(err, -ENOTSUP, "pre_tokenizer Sequence of %zu is not supported "
				 "(Split, then ByteLevel)", json_array_size(seq));
	split = json_array_get(seq, 0);
	bl = json_array_get(seq, 1);
	if (strcmp(type_of(split), "Split") || strcmp(type_of(bl), "ByteLevel"))
		return sm70_errf(err, -ENOTSUP, "pre_tokenizer Sequence [%s, %s] is not supported "
				 "(Split, then ByteLevel)", type_of(split), type_of(bl));
	s = json_string_value(json_object_get(split, "behavior"));
	if (!s || strcmp(s, "Isolated") || json_flag(split, "invert", 0))
		return sm70_errf(err, -ENOTSUP, "Split behavior %s%s is not supported (Isolated)",
				 s ? s : "(none)", json_flag(split, "invert", 0) ? " inverted" : "");
	pat = json_object_get(json_object_get(split, "pattern"), "Regex");
	s = json_string_value(pat);
	if (s && !strcmp(s, QWEN2_PATTERN))
		t->digits_max = 1;
	else if (s && !strcmp(s, LLAMA3_PATTERN))
		t->digits_max = 3;
	else
		return sm70_errf(err, -ENOTSUP, "Split pattern %.200s is not supported (the "
				 "Qwen2 and Llama-3 patterns only)", s ? s : "(not a Regex)");
	if ((rc = check_bytelevel(bl, "pre_tokenizer", err)))
		return rc;
	if (json_flag(bl, "use_regex", 1))
		return sm70_errf(err, -ENOTSUP, "pre_tokenizer ByteLevel with use_regex is not "
				 "supported after a Split");

	v = json_object_get(root, "decoder");
	if (!json_is_object(v) || strcmp(type_of(v), "ByteLevel"))
		return sm70_errf(err, -ENOTSUP, "decoder %s is not supported (ByteLevel)",
				 v && !json_is_null(v) ? type_of(v) : "null");
	v = json_object_get(root, "post_processor");
	if (v && !json_is_null(v) && strcmp(type_of(v), "ByteLevel"))
		return sm70_errf(err, -ENOTSUP, "post_processor %s is not supported (ByteLevel "
				 "or none: sm70 adds no tokens around a text)", type_of(v));
	return 0;
}

/* Appends a spelling and what it decodes to; offsets stay 32-bit. */
static int set_spelling(const char *s, size_t n, struct sm70_text *str,
			struct sm70_text *dec)
{
	int rc;

	if ((rc = sm70_text_append(str, s, n)) || (rc = bytelevel_decode(dec, s, n)))
		return rc;
	if (str->len > UINT32_MAX / 2 || dec->len > UINT32_MAX / 2)
		return -EFBIG;
	return 0;
}

static int cmp_by_first_then_longest(const void *pa, const void *pb, void *arg)
{
	const struct added_tok *added = arg;
	const struct added_tok *a = &added[*(const uint32_t *)pa], *b = &added[*(const uint32_t *)pb];
	uint8_t fa = (uint8_t)a->match[0], fb = (uint8_t)b->match[0];

	if (fa != fb)
		return fa < fb ? -1 : 1;
	if (a->match_len != b->match_len)
		return a->match_len > b->match_len ? -1 : 1;
	return 0;
}

static int build_set(struct sm70_tokenizer *t, struct match_set *ms, int normalized)
{
	size_t k = 0;

	ms->order = malloc((t->n_added + 1) * sizeof(*ms->order));
	if (!ms->order)
		return -ENOMEM;
	for (size_t i = 0; i < t->n_added; i++) {
		/* a later token with the same content replaced this one's id */
		int dup = 0;

		for (size_t j = i + 1; j < t->n_added && !dup; j++)
			dup = t->added[j].content_len == t->added[i].content_len &&
			      !memcmp(t->added[j].content, t->added[i].content,
				      t->added[i].content_len);
		if (!dup && t->added[i].normalized == normalized && t->added[i].match_len)
			ms->order[k++] = (uint32_t)i;
	}
	ms->n = k;
	qsort_r(ms->order, k, sizeof(*ms->order), cmp_by_first_then_longest, t->added);
	for (unsigned b = 0, j = 0; b <= 256; b++) {
		while (j < k && (uint8_t)t->added[ms->order[j]].match[0] < b)
			j++;
		ms->start[b] = j;
	}
	return 0;
}

static int load_added(struct sm70_tokenizer *t, json_t *arr, size_t vocab_count,
		      struct sm70_err *err)
{
	size_t n = json_array_size(arr);
	int32_t next_id = (int32_t)vocab_count;

	t->added = calloc(n ? n : 1, sizeof(*t->added));
	if (!t->added)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++) {
		json_t *o = json_array_get(arr, i), *c = json_object_get(o, "content");
		struct added_tok *a = &t->added[t->n_added];
		const char *s = json_string_value(c);
		size_t len = json_string_length(c);
		int32_t id = -1;
		int rc;

		if (!s)
			return sm70_errf(err, -EINVAL, "added_tokens[%zu] has no content", i);
		if (!len)
			continue;       /* tokenizers ignores empty added tokens */
		/* the id: an existing added token's or vocab entry's, else the next free one
		 * (tokenizers assigns them so, whatever "id" the file says) */
		for (size_t j = 0; j < t->n_added && id < 0; j++)
			if (t->added[j].content_len == len && !memcmp(t->added[j].content, s, len))
				id = t->added[j].id;
		if (id < 0)
			id = vocab_find(t, s, len);
		if (id < 0)
			id = next_id++;
		a->content = malloc(len + 1);
		if (!a->content)
			return -ENOMEM;
		memcpy(a->content, s, len);
		a->content[len] = 0;
		a->content_len = len;
		a->match = a->content;
		a->match_len = len;
		a->id = id;
		a->special = (uint8_t)json_flag(o, "special", 0);
		a->normalized = (uint8_t)json_flag(o, "normalized", !a->special);
		a->lstrip = (uint8_t)json_flag(o, "lstrip", 0);
		a->rstrip = (uint8_t)json_flag(o, "rstrip", 0);
		a->single_word = (uint8_t)json_flag(o, "single_word", 0);
		t->n_added++;
		if (a->normalized && t->nfc && !sm70__nfc_inert(s, len)) {
			struct sm70_text nt = {0};

			if ((rc = sm70__nfc_append(&nt, s, len))) {
				sm70_text_free(&nt);
				return rc;
			}
			a->match = nt.s;
			a->match_len = nt.len;
		}
	}
	return 0;
}

static int load_vocab(struct sm70_tokenizer *t, json_t *model, json_t *added,
		      struct sm70_err *err)
{
	json_t *vocab = json_object_get(model, "vocab"), *merges, *v;
	struct sm70_text str = {0}, dec = {0};
	const char *key;
	size_t n_merges, max_id = 0, count = json_object_size(vocab), cap;
	int rc = 0;

	/* ids: the vocab's, then room for one new id per added token */
	json_object_foreach(vocab, key, v) {
		json_int_t id = json_integer_value(v);

		if (!json_is_integer(v) || id < 0 || id > INT32_MAX / 2)
			return sm70_errf(err, -EINVAL, "vocab entry \"%.80s\" has no valid id", key);
		if ((size_t)id > max_id)
			max_id = (size_t)id;
	}
	t->vocab_count = count;
	t->n_ids = (count ? max_id + 1 : 0);
	if (t->n_ids < count)
		t->n_ids = count;
	t->n_ids += json_array_size(added);
	t->str_off = calloc(t->n_ids + 1, sizeof(*t->str_off));
	t->dec_off = calloc(t->n_ids + 1, sizeof(*t->dec_off));
	t->id_flags = calloc(t->n_ids + 1, 1);
	for (cap = 16; cap < count * 2; cap *= 2)
		;
	t->vocab_mask = cap - 1;
	t->vocab_hash = malloc(cap * sizeof(*t->vocab_hash));
	if (!t->str_off || !t->dec_off || !t->id_flags || !t->vocab_hash)
		return -ENOMEM;
	memset(t->vocab_hash, 0xFF, cap * sizeof(*t->vocab_hash));

	/* Spellings and decoded bytes go into two arenas in id order (the offsets then give
	 * the lengths); place_added lays them out again once the added tokens have ids. */
	{
		const char **by_id = calloc(t->n_ids, sizeof(*by_id));
		size_t *len_by_id = calloc(t->n_ids, sizeof(*len_by_id));

		if (!by_id || !len_by_id) {
			free(by_id);
			free(len_by_id);
			return -ENOMEM;
		}
		json_object_foreach(vocab, key, v) {
			size_t id = (size_t)json_integer_value(v);

			by_id[id] = key;
			len_by_id[id] = strlen(key);
		}
		for (size_t id = 0; id < t->n_ids && !rc; id++) {
			t->str_off[id] = (uint32_t)str.len;
			t->dec_off[id] = (uint32_t)dec.len;
			if (!by_id[id])
				continue;
			rc = set_spelling(by_id[id], len_by_id[id], &str, &dec);
			t->id_flags[id] |= ID_PRESENT;
		}
		t->str_off[t->n_ids] = (uint32_t)str.len;
		t->dec_off[t->n_ids] = (uint32_t)dec.len;
		t->str_bytes = str.s;
		t->dec_bytes = dec.s;
		if (!rc) {
			for (size_t id = 0; id < t->n_ids; id++) {
				size_t h;

				if (!by_id[id])
					continue;
				h = hash_bytes(by_id[id], len_by_id[id]) & t->vocab_mask;
				while (t->vocab_hash[h] >= 0)
					h = (h + 1) & t->vocab_mask;
				t->vocab_hash[h] = (int32_t)id;
			}
		}
		free(by_id);
		free(len_by_id);
		if (rc)
			return rc;
	}

	/* the 256 byte symbols */
	for (unsigned b = 0; b < 256; b++) {
		uint8_t buf[4];
		size_t l = sm70__utf8_put(buf, byte_char(b));

		t->byte_id[b] = vocab_find(t, (const char *)buf, l);
		if (t->byte_id[b] < 0)
			return sm70_errf(err, -ENOTSUP, "the vocab lacks the byte-level symbol of "
					 "byte 0x%02X: not a byte-level BPE", b);
	}

	/* merges: pair -> (rank, merged id); a later duplicate wins, as in tokenizers */
	merges = json_object_get(model, "merges");
	n_merges = json_array_size(merges);
	for (cap = 16; cap < n_merges * 2; cap *= 2)
		;
	t->merge_mask = cap - 1;
	t->merges = malloc(cap * sizeof(*t->merges));
	if (!t->merges)
		return -ENOMEM;
	for (size_t i = 0; i < cap; i++)
		t->merges[i].rank = UINT32_MAX;
	for (size_t i = 0; i < n_merges; i++) {
		json_t *m = json_array_get(merges, i);
		const char *a, *b;
		size_t la, lb;
		int32_t ia, ib, im;
		char stackbuf[512], *cat;
		uint64_t k;
		size_t h;

		if (json_is_string(m)) {
			const char *s = json_string_value(m), *sp = strchr(s, ' ');

			if (!sp || strchr(sp + 1, ' '))
				return sm70_errf(err, -EINVAL, "merges[%zu] \"%.80s\" is not two "
						 "tokens", i, s);
			a = s;
			la = (size_t)(sp - s);
			b = sp + 1;
			lb = strlen(b);
		} else if (json_is_array(m) && json_array_size(m) == 2 &&
			   json_is_string(json_array_get(m, 0)) &&
			   json_is_string(json_array_get(m, 1))) {
			a = json_string_value(json_array_get(m, 0));
			la = json_string_length(json_array_get(m, 0));
			b = json_string_value(json_array_get(m, 1));
			lb = json_string_length(json_array_get(m, 1));
		} else {
			return sm70_errf(err, -EINVAL, "merges[%zu] is neither \"a b\" nor [a, b]", i);
		}
		ia = vocab_find(t, a, la);
		ib = vocab_find(t, b, lb);
		cat = la + lb <= sizeof(stackbuf) ? stackbuf : malloc(la + lb);
		if (!cat)
			return -ENOMEM;
		memcpy(cat, a, la);
		memcpy(cat + la, b, lb);
		im = vocab_find(t, cat, la + lb);
		if (cat != stackbuf)
			free(cat);
		if (ia < 0 || ib < 0 || im < 0)
			return sm70_errf(err, -EINVAL, "merges[%zu] (%.40s %.40s) names a token "
					 "that is not in the vocab", i, a, b);
		k = ((uint64_t)(uint32_t)ia << 32) | (uint32_t)ib;
		h = hash_pair(k) & t->merge_mask;
		while (t->merges[h].rank != UINT32_MAX && t->merges[h].key != k)
			h = (h + 1) & t->merge_mask;
		t->merges[h].key = k;
		t->merges[h].rank = (uint32_t)i;
		t->merges[h].id = im;
	}
	return 0;
}

/* Gives added tokens their spellings and decoded bytes (an added token with a vocab
 * entry's content keeps that id, and then decodes as the added token does). */
static int place_added(struct sm70_tokenizer *t)
{
	struct sm70_text str = {0}, dec = {0};
	uint32_t *so = malloc((t->n_ids + 1) * sizeof(*so));
	uint32_t *dof = malloc((t->n_ids + 1) * sizeof(*dof));
	int32_t *which = malloc((t->n_ids + 1) * sizeof(*which));
	int rc = 0;

	if (!so || !dof || !which) {
		rc = -ENOMEM;
		goto out;
	}
	/* the added token of each id: the last one listed with it, as in tokenizers */
	memset(which, 0xFF, (t->n_ids + 1) * sizeof(*which));
	for (size_t j = 0; j < t->n_added; j++)
		which[t->added[j].id] = (int32_t)j;
	/* both arenas again, in id order, with the added tokens in place */
	for (size_t id = 0; id < t->n_ids && !rc; id++) {
		size_t l;
		const char *s;

		so[id] = (uint32_t)str.len;
		dof[id] = (uint32_t)dec.len;
		if (which[id] >= 0) {
			const struct added_tok *a = &t->added[which[id]];

			/* decodes as its content, or the normalized form tokenizers caches */
			rc = sm70_text_append(&str, a->content, a->content_len);
			if (!rc)
				rc = bytelevel_decode(&dec, a->match, a->match_len);
			t->id_flags[id] |= ID_PRESENT | ID_ADDED | (a->special ? ID_SPECIAL : 0);
			continue;
		}
		if (!(t->id_flags[id] & ID_PRESENT))
			continue;
		s = spelling(t, (int32_t)id, &l);
		rc = sm70_text_append(&str, s, l);
		if (!rc)
			rc = sm70_text_append(&dec, t->dec_bytes + t->dec_off[id],
					      t->dec_off[id + 1] - t->dec_off[id]);
	}
	if (!rc && (str.len > UINT32_MAX / 2 || dec.len > UINT32_MAX / 2))
		rc = -EFBIG;
	if (!rc && !str.s)
		rc = sm70_text_append(&str, "", 0);
	if (!rc && !dec.s)
		rc = sm70_text_append(&dec, "", 0);
	if (rc)
		goto out;
	so[t->n_ids] = (uint32_t)str.len;
	dof[t->n_ids] = (uint32_t)dec.len;
	free(t->str_bytes);
	free(t->dec_bytes);
	free(t->str_off);
	free(t->dec_off);
	t->str_bytes = str.s;
	t->dec_bytes = dec.s;
	t->str_off = so;
	t->dec_off = dof;
	so = dof = NULL;
	str.s = dec.s = NULL;
	/* The vocab hash stays valid: an added token that took a vocab id has that entry's
	 * spelling by construction. Ids past the last one in use are dropped. */
	while (t->n_ids > 0 && !(t->id_flags[t->n_ids - 1] & ID_PRESENT))
		t->n_ids--;
out:
	sm70_text_free(&str);
	sm70_text_free(&dec);
	free(which);
	free(so);
	free(dof);
	return rc;
}

int sm70_tokenizer_load_json(const char *json, size_t len, struct sm70_tokenizer **out,
			     struct sm70_err *err)
{
	struct sm70_tokenizer *t = calloc(1, sizeof(*t));
	json_error_t je;
	json_t *root = NULL, *model, *added;
	int rc;

	*out = NULL;
	if (!t)
		return -ENOMEM;
	root = json_loadb(json, len, 0, &je);
	if (!root) {
		rc = sm70_errf(err, -EINVAL, "not JSON: %s (line %d)", je.text, je.line);
		goto fail;
	}
	if (!json_is_object(root)) {
		rc = sm70_errf(err, -EINVAL, "not a JSON object");
		goto fail;
	}
	model = json_object_get(root, "model");
	added = json_object_get(root, "added_tokens");
	if ((rc = load_pipeline(t, root, err)) || (rc = check_model(model, err)))
		goto fail;
	if (added && !json_is_array(added)) {
		rc = sm70_errf(err, -EINVAL, "added_tokens is not an array");
		goto fail;
	}
	t->ignore_merges = json_flag(model, "ignore_merges", 0);
	if ((rc = load_vocab(t, model, added, err)) ||
	    (rc = load_added(t, added, t->vocab_count, err)) || (rc = place_added(t)) ||
	    (rc = build_set(t, &t->raw_set, 0)) || (rc = build_set(t, &t->norm_set, 1)))
		goto fail;
	json_decref(root);
	*out = t;
	return 0;
fail:
	if (rc == -ENOMEM)
		sm70_errf(err, rc, "out of memory loading the tokenizer");
	json_decref(root);
	sm70_tokenizer_free(t);
	return rc;
}

int sm70_tokenizer_load(const char *path, struct sm70_tokenizer **out, struct sm70_err *err)
{
	FILE *f = fopen(path, "rb");
	struct sm70_text buf = {0};
	struct sm70_err local;
	char chunk[65536];
	size_t r;
	int rc;

	*out = NULL;
	if (!f)
		return sm70_errf(err, -errno, "%s: %s", path, strerror(errno));
	while ((r = fread(chunk, 1, sizeof(chunk), f)) > 0)
		if ((rc = sm70_text_append(&buf, chunk, r))) {
			fclose(f);
			sm70_text_free(&buf);
			return sm70_errf(err, rc, "%s: out of memory", path);
		}
	if (ferror(f)) {
		rc = -EIO;
		fclose(f);
		sm70_text_free(&buf);
		return sm70_errf(err, rc, "%s: read error", path);
	}
	fclose(f);
	sm70_err_clear(&local);
	rc = sm70_tokenizer_load_json(buf.s ? buf.s : "", buf.len, out, &local);
	sm70_text_free(&buf);
	if (rc)
		return sm70_errf(err, rc, "%s: %s", path, local.msg);
	return 0;
}

int sm70_tokenizer_load_dir(const char *dir, struct sm70_tokenizer **out, struct sm70_err *err)
{
	char path[4096];
	FILE *f;

	*out = NULL;
	if ((size_t)snprintf(path, sizeof(path), "%s/tokenizer.json", dir) >= sizeof(path))
		return sm70_errf(err, -ENAMETOOLONG, "%s: path too long", dir);
	f = fopen(path, "rb");
	if (!f)
		return sm70_errf(err, -errno, "%s: %s", path, strerror(errno));
	fclose(f);
	return sm70_tokenizer_load(path, out, err);
}
