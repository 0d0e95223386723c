/* fuzz_tokenizer - libFuzzer target: arbitrary bytes through the Qwen3 tokenizer. */
/*
 * The input's first byte picks a mode, the rest is the data:
 *   even: the data as text. Ill-formed UTF-8 must be refused with -EILSEQ at the offset an
 *         independent scan finds; well-formed text must encode, every id must be in the
 *         vocabulary, and (when the text holds no '<', so no added token) decode(encode(s))
 *         must equal NFC(s). Streaming the ids one at a time must give decode's text.
 *   odd:  the data as little-endian 16-bit values scaled onto the vocabulary: ids to
 *         decode (the result must be well-formed UTF-8) and to stream through a
 *         detokenizer with the stop strings the first byte selects; the streamed text
 *         must be a prefix of decode's, whole UTF-8, contain no stop string, and be
 *         followed in decode's text by one when the stream stopped.
 * A violation aborts, which libFuzzer reports as a crash. The tokenizer loads once, from
 * tests/fixtures/tokenizer/qwen3-tokenizer.json.gz (through gzip -dc).
 * Built and run by tests/fuzz/run-tokenizer.sh (clang -fsanitize=fuzzer,address,undefined).
 */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/tokenizer.h"
#include "text/unicode.h"

static struct sm70_tokenizer *tok;

#define CHECK(c) do { \
	if (!(c)) { \
		fprintf(stderr, "violated: %s (line %d)\n", #c, __LINE__); \
		abort(); \
	} \
} while (0)

static void load(void)
{
	FILE *p = popen("gzip -dc tests/fixtures/tokenizer/qwen3-tokenizer.json.gz", "r");
	struct sm70_text buf = {0};
	struct sm70_err err = {{0}};
	char chunk[65536];
	size_t r;

	if (!p) {
		perror("popen");
		exit(2);
	}
	while ((r = fread(chunk, 1, sizeof(chunk), p)) > 0)
		sm70_text_append(&buf, chunk, r);
	if (pclose(p) != 0 || sm70_tokenizer_load_json(buf.s, buf.len, &tok, &err)) {
		fprintf(stderr, "fuzz_tokenizer: cannot load the tokenizer (run from the "
			"repository root): %s\n", err.msg);
		exit(2);
	}
	sm70_text_free(&buf);
}

/* Offset of the first ill-formed byte, by the Unicode table of well-formed sequences. */
static size_t first_bad(const uint8_t *s, size_t n)
{
	size_t i = 0;

	while (i < n) {
		uint8_t b = s[i], lo = 0x80, hi = 0xBF;
		size_t need;

		if (b < 0x80) {
			i++;
			continue;
		}
		if (b >= 0xC2 && b <= 0xDF)
			need = 1;
		else if (b >= 0xE0 && b <= 0xEF)
			need = 2;
		else if (b >= 0xF0 && b <= 0xF4)
			need = 3;
		else
			return i;
		if (b == 0xE0)
			lo = 0xA0;
		if (b == 0xED)
			hi = 0x9F;
		if (b == 0xF0)
			lo = 0x90;
		if (b == 0xF4)
			hi = 0x8F;
		if (i + need >= n)
			return i;       /* cut short */
		for (size_t k = 1; k <= need; k++) {
			if (s[i + k] < lo || s[i + k] > hi)
				return i;
			lo = 0x80;
			hi = 0xBF;
		}
		i += need + 1;
	}
	return n;
}

static void stream(const int32_t *ids, size_t n, const char *const *stops, size_t n_stop,
		   struct sm70_text *all, int *stopped)
{
	struct sm70_detok_opts o = {.size = sizeof(o), .stop = stops, .n_stop = n_stop};
	struct sm70_detok *d = NULL;
	struct sm70_text delta = {0};
	int rc = 0;

	CHECK(sm70_detok_new(tok, &o, &d) == 0);
	for (size_t i = 0; i < n && rc == 0; i++) {
		sm70_text_clear(&delta);
		rc = sm70_detok_push(d, ids[i], &delta);
		CHECK(rc == 0 || rc == SM70_DETOK_STOPPED);
		CHECK(sm70_utf8_check(delta.s ? delta.s : "", delta.len) == delta.len);
		sm70_text_append(all, delta.s, delta.len);
	}
	if (rc == 0) {
		sm70_text_clear(&delta);
		rc = sm70_detok_finish(d, &delta);
		CHECK(rc == 0 || rc == SM70_DETOK_STOPPED);
		sm70_text_append(all, delta.s, delta.len);
	}
	sm70_text_append(all, "", 0);
	*stopped = rc == SM70_DETOK_STOPPED;
	sm70_text_free(&delta);
	sm70_detok_free(d);
}

static void fuzz_text(const uint8_t *s, size_t n)
{
	struct sm70_ids ids = {0};
	struct sm70_text out = {0}, nfc = {0}, streamed = {0};
	size_t bad = first_bad(s, n);
	int rc = sm70_tokenizer_encode(tok, (const char *)s, n, 0, &ids, NULL), stopped;

	if (bad != n) {
		char want[40];
		struct sm70_err err = {{0}};

		CHECK(rc == -EILSEQ);
		CHECK(sm70_utf8_check((const char *)s, n) == bad);
		sm70_tokenizer_encode(tok, (const char *)s, n, 0, &ids, &err);
		snprintf(want, sizeof(want), "(byte %zu)", bad);
		CHECK(strstr(err.msg, want) != NULL);
		goto out;
	}
	CHECK(rc == 0);
	CHECK(n == 0 || ids.n > 0);
	for (size_t i = 0; i < ids.n; i++)
		CHECK(ids.v[i] >= 0 && (size_t)ids.v[i] < sm70_tokenizer_vocab_size(tok));
	CHECK(sm70_tokenizer_decode(tok, ids.v, ids.n, 0, &out, NULL) == 0);
	if (!memchr(s, '<', n)) {
		CHECK(sm70__nfc_append(&nfc, (const char *)s, n) == 0);
		CHECK(out.len == nfc.len && !memcmp(out.s ? out.s : "", nfc.s ? nfc.s : "", nfc.len));
	}
	stream(ids.v, ids.n, NULL, 0, &streamed, &stopped);
	CHECK(!stopped);
	CHECK(streamed.len == out.len && !memcmp(streamed.s, out.s ? out.s : "", out.len));
out:
	sm70_ids_free(&ids);
	sm70_text_free(&out);
	sm70_text_free(&nfc);
	sm70_text_free(&streamed);
}

static void fuzz_ids(uint8_t sel, const uint8_t *s, size_t n)
{
	static const char *const stops[] = {"\n\n", "the", "\xe4\xb8\xad", "<|im_end|>", "aa",
					    "\xef\xbf\xbd"};
	size_t count = n / 2, n_stop = (sel >> 1) % 4, first = (sel >> 3) % 3;
	int32_t *ids = malloc((count + 1) * sizeof(*ids));
	struct sm70_text out = {0}, streamed = {0};
	size_t vocab = sm70_tokenizer_vocab_size(tok);
	int stopped;

	for (size_t i = 0; i < count; i++)
		ids[i] = (int32_t)(((uint32_t)s[2 * i] | (uint32_t)s[2 * i + 1] << 8) * vocab / 65536);
	CHECK(sm70_tokenizer_decode(tok, ids, count, 0, &out, NULL) == 0);
	CHECK(sm70_utf8_check(out.s ? out.s : "", out.len) == out.len);
	stream(ids, count, stops + first, n_stop, &streamed, &stopped);
	/* what was emitted is decode's text up to the first stop, which it never contains */
	CHECK(streamed.len <= out.len && !memcmp(streamed.s, out.s ? out.s : "", streamed.len));
	for (size_t k = 0; k < n_stop; k++)
		CHECK(!memmem(streamed.s, streamed.len, stops[first + k], strlen(stops[first + k])));
	if (!stopped) {
		CHECK(streamed.len == out.len);
	} else {
		int at_stop = 0;

		for (size_t k = 0; k < n_stop; k++)
			at_stop |= out.len - streamed.len >= strlen(stops[first + k]) &&
				   !memcmp(out.s + streamed.len, stops[first + k],
					   strlen(stops[first + k]));
		CHECK(at_stop);
	}
	free(ids);
	sm70_text_free(&out);
	sm70_text_free(&streamed);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (!tok)
		load();
	if (size == 0)
		return 0;
	if (data[0] % 2 == 0)
		fuzz_text(data + 1, size - 1);
	else
		fuzz_ids(data[0], data + 1, size - 1);
	return 0;
}
