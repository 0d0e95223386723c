/*
 * test_tokenizer - the C tokenizer (text/) equals Hugging Face tokenizers on the Qwen3
 * tokenizer.json: ids, decode, NFC and both pre-tokenizer patterns on every corpus string
 * (tests/fixtures/tokenizer, reference made by tools/tokenizer_ref.py); added-token
 * options on a small synthetic tokenizer; refusals of what is not supported; streaming
 * detokenization over split UTF-8 and stop strings that span tokens.
 */
#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "text/internal.h"
#include "text/tokenizer.h"
#include "text/unicode.h"

#define DIR "tests/fixtures/tokenizer"

static struct sm70_tokenizer *qwen;
static json_t *corpus, *reference; /* arrays of the JSON lines */

/* ---- loading the fixtures ------------------------------------------------------------ */

/* The output of a shell command (gzip -dc FILE): the fixtures are compressed. */
static char *read_cmd(const char *cmd, size_t *len)
{
	FILE *p = popen(cmd, "r");
	size_t n = 0, cap = 1 << 20, r;
	char *buf = malloc(cap);

	assert_non_null(p);
	assert_non_null(buf);
	while ((r = fread(buf + n, 1, cap - n - 1, p)) > 0) {
		n += r;
		if (cap - n - 1 == 0) {
			buf = realloc(buf, cap *= 2);
			assert_non_null(buf);
		}
	}
	assert_int_equal(pclose(p), 0);
	buf[n] = 0;
	*len = n;
	return buf;
}

static json_t *read_lines(const char *cmd)
{
	size_t len;
	char *buf = read_cmd(cmd, &len), *p = buf;
	json_t *arr = json_array();

	while (p < buf + len) {
		char *nl = memchr(p, '\n', (size_t)(buf + len - p));
		size_t l = nl ? (size_t)(nl - p) : (size_t)(buf + len - p);
		json_error_t je;
		json_t *o = json_loadb(p, l, JSON_ALLOW_NUL, &je);

		if (!o)
			fail_msg("%s: %s", cmd, je.text);
		json_array_append_new(arr, o);
		p += l + 1;
	}
	free(buf);
	return arr;
}

static int setup(void **state)
{
	struct sm70_err err = {{0}};
	size_t len;
	char *json = read_cmd("gzip -dc " DIR "/qwen3-tokenizer.json.gz", &len);

	if (sm70_tokenizer_load_json(json, len, &qwen, &err))
		fail_msg("load: %s", err.msg);
	free(json);
	corpus = read_lines("cat " DIR "/corpus.jsonl");
	reference = read_lines("gzip -dc " DIR "/reference.jsonl.gz");
	assert_int_equal(json_array_size(corpus), json_array_size(reference));
	assert_true(json_array_size(corpus) >= 1000);
	return 0;
}

static int teardown(void **state)
{
	sm70_tokenizer_free(qwen);
	json_decref(corpus);
	json_decref(reference);
	return 0;
}

static const char *text_of(size_t i, size_t *len)
{
	json_t *t = json_object_get(json_array_get(corpus, i), "text");

	*len = json_string_length(t);
	return json_string_value(t);
}

static json_t *ref_of(size_t i, const char *key)
{
	return json_object_get(json_array_get(reference, i), key);
}

static int ids_equal(const struct sm70_ids *got, json_t *want)
{
	if (got->n != json_array_size(want))
		return 0;
	for (size_t k = 0; k < got->n; k++)
		if (got->v[k] != (int32_t)json_integer_value(json_array_get(want, k)))
			return 0;
	return 1;
}

static int text_equal(const char *s, size_t n, json_t *want)
{
	return json_string_length(want) == n && !memcmp(json_string_value(want), s, n);
}

static void encode_ok(const struct sm70_tokenizer *t, const char *s, unsigned flags,
		      struct sm70_ids *out)
{
	struct sm70_err err = {{0}};

	out->n = 0;
	if (sm70_tokenizer_encode(t, s, strlen(s), flags, out, &err))
		fail_msg("encode \"%s\": %s", s, err.msg);
}

/* ---- the corpus against tokenizers ------------------------------------------------------ */

static size_t corpus_mismatches(const char *what)
{
	struct sm70_ids ids = {0};
	size_t bad = 0, tokens = 0;

	for (size_t i = 0; i < json_array_size(corpus); i++) {
		size_t len;
		const char *s = text_of(i, &len);

		ids.n = 0;
		assert_int_equal(sm70_tokenizer_encode(qwen, s, len, 0, &ids, NULL), 0);
		tokens += ids.n;
		if (!ids_equal(&ids, ref_of(i, "ids"))) {
			if (bad++ < 5)
				print_message("  %s: string %zu differs (%zu ids, %zu expected)\n", what,
					      i, ids.n, json_array_size(ref_of(i, "ids")));
		}
	}
	print_message("encode (%s): %zu of %zu strings equal tokenizers (%zu tokens)\n", what,
		      json_array_size(corpus) - bad, json_array_size(corpus), tokens);
	sm70_ids_free(&ids);
	return bad;
}

static void test_corpus_encode(void **state)
{
	assert_int_equal(corpus_mismatches("scan BPE"), 0);
}

static void test_corpus_encode_heap_bpe(void **state)
{
	size_t keep = sm70__bpe_scan_max;

	sm70__bpe_scan_max = 0;   /* every word of two bytes or more through the heap */
	assert_int_equal(corpus_mismatches("heap BPE"), 0);
	sm70__bpe_scan_max = keep;
}

static void test_corpus_decode(void **state)
{
	struct sm70_text out = {0};
	size_t bad = 0, bad_skip = 0;

	for (size_t i = 0; i < json_array_size(corpus); i++) {
		json_t *ids = ref_of(i, "ids");
		size_t n = json_array_size(ids);
		int32_t *v = malloc((n + 1) * sizeof(*v));

		for (size_t k = 0; k < n; k++)
			v[k] = (int32_t)json_integer_value(json_array_get(ids, k));
		sm70_text_clear(&out);
		assert_int_equal(sm70_tokenizer_decode(qwen, v, n, 0, &out, NULL), 0);
		bad += !text_equal(out.s, out.len, ref_of(i, "decoded"));
		sm70_text_clear(&out);
		assert_int_equal(sm70_tokenizer_decode(qwen, v, n, SM70_TOK_SKIP_SPECIAL, &out,
						       NULL), 0);
		bad_skip += !text_equal(out.s, out.len, ref_of(i, "decoded_skip"));
		free(v);
	}
	print_message("decode: %zu of %zu equal tokenizers (special tokens kept), %zu of %zu "
		      "(skipped)\n", json_array_size(corpus) - bad, json_array_size(corpus),
		      json_array_size(corpus) - bad_skip, json_array_size(corpus));
	sm70_text_free(&out);
	assert_int_equal(bad, 0);
	assert_int_equal(bad_skip, 0);
}

/* decode(encode(s)) == NFC(s), and NFC equals the tokenizers normalizer (Unicode 9.0). */
static void test_corpus_roundtrip_nfc(void **state)
{
	struct sm70_text norm = {0}, out = {0};
	struct sm70_ids ids = {0};
	size_t bad_nfc = 0, bad_rt = 0, changed = 0;

	for (size_t i = 0; i < json_array_size(corpus); i++) {
		size_t len;
		const char *s = text_of(i, &len);

		sm70_text_clear(&norm);
		assert_int_equal(sm70__nfc_append(&norm, s, len), 0);
		if (!text_equal(norm.s, norm.len, ref_of(i, "normalized")) && bad_nfc++ < 5)
			print_message("  NFC of string %zu differs\n", i);
		changed += norm.len != len || memcmp(norm.s, s, len);
		ids.n = 0;
		sm70_text_clear(&out);
		assert_int_equal(sm70_tokenizer_encode(qwen, s, len, 0, &ids, NULL), 0);
		assert_int_equal(sm70_tokenizer_decode(qwen, ids.v, ids.n, 0, &out, NULL), 0);
		/* added tokens split the text before normalisation: compare with the reference
		 * decode there, with NFC of the whole text elsewhere */
		if (strstr(s, "<|") || strstr(s, "<t") || strstr(s, "</")) {
			if (!text_equal(out.s, out.len, ref_of(i, "decoded")))
				bad_rt++;
		} else if (out.len != norm.len || memcmp(out.s, norm.s, norm.len)) {
			if (bad_rt++ < 5)
				print_message("  decode(encode(s)) != NFC(s) for string %zu\n", i);
		}
	}
	print_message("NFC: %zu of %zu equal tokenizers' normalizer (%zu strings changed by "
		      "it); decode(encode(s)) == NFC(s): %zu of %zu\n",
		      json_array_size(corpus) - bad_nfc, json_array_size(corpus), changed,
		      json_array_size(corpus) - bad_rt, json_array_size(corpus));
	sm70_text_free(&norm);
	sm70_text_free(&out);
	sm70_ids_free(&ids);
	assert_int_equal(bad_nfc, 0);
	assert_int_equal(bad_rt, 0);
	assert_true(changed >= 50);
}

/* Long runs of marks take the counting sort; the result is canonical order all the same. */
static void test_nfc_long_runs(void **state)
{
	struct sm70_text in = {0}, out = {0}, want = {0};
	struct sm70_ids ids = {0};
	const size_t pairs = 100000;

	sm70_text_append(&in, "a", 1);
	sm70_text_append(&want, "\xe1\xba\xa1", 3);            /* a + U+0323 composes */
	for (size_t i = 0; i < pairs; i++)
		sm70_text_append(&in, "\xcc\x81\xcc\xa3", 4);     /* U+0301 (230), U+0323 (220) */
	for (size_t i = 1; i < pairs; i++)
		sm70_text_append(&want, "\xcc\xa3", 2);
	for (size_t i = 0; i < pairs; i++)
		sm70_text_append(&want, "\xcc\x81", 2);
	assert_int_equal(sm70__nfc_append(&out, in.s, in.len), 0);
	assert_int_equal(out.len, want.len);
	assert_memory_equal(out.s, want.s, want.len);
	/* and the whole string through the tokenizer, in well under a second */
	assert_int_equal(sm70_tokenizer_encode(qwen, in.s, in.len, 0, &ids, NULL), 0);
	assert_true(ids.n > 0);
	print_message("NFC: a run of %zu marks reordered (counting sort) and encoded to %zu "
		      "ids\n", 2 * pairs, ids.n);
	sm70_text_free(&in);
	sm70_text_free(&out);
	sm70_text_free(&want);
	sm70_ids_free(&ids);
}

/* The split is compared on every string but the "new-unicode" probes: tokenizers'
 * Oniguruma knows Unicode 16.0, the tables Unicode 15.0 (Debian 12's data), so characters
 * assigned since may fall in other classes (their ids still agree on those probes). */
static size_t split_mismatches(const char *key, int digits_max)
{
	size_t bad = 0, pieces = 0, skipped = 0;

	for (size_t i = 0; i < json_array_size(corpus); i++) {
		json_t *want = ref_of(i, key), *norm = ref_of(i, "normalized");
		const char *s = json_string_value(norm);
		size_t n = json_string_length(norm), at = 0, k = 0;
		int ok = 1;

		if (!strcmp(json_string_value(json_object_get(json_array_get(corpus, i), "group")),
			    "new-unicode")) {
			skipped++;
			continue;
		}

		while (at < n && ok) {
			size_t end = sm70__pretok_next(s, n, at, digits_max);
			json_t *w = json_array_get(want, k++);

			ok = end > at && w && text_equal(s + at, end - at, w);
			at = end;
		}
		ok = ok && k == json_array_size(want);
		pieces += k;
		if (!ok && bad++ < 5)
			print_message("  %s: string %zu splits differently\n", key, i);
	}
	print_message("pre-tokenizer (%s): %zu of %zu strings split as tokenizers' Split "
		      "(%zu pieces; %zu probes of Unicode > 15.0 not compared)\n", key,
		      json_array_size(corpus) - skipped - bad, json_array_size(corpus) - skipped,
		      pieces, skipped);
	return bad;
}

static void test_corpus_split(void **state)
{
	assert_int_equal(split_mismatches("split", 1), 0);
	assert_int_equal(split_mismatches("split_llama3", 3), 0);
}

/* A loaded tokenizer is shared by threads that encode at once. */
static void *encode_all(void *arg)
{
	struct sm70_ids ids = {0};
	size_t *bad = arg;

	for (size_t i = 0; i < json_array_size(corpus); i++) {
		size_t len;
		const char *s = text_of(i, &len);

		ids.n = 0;
		if (sm70_tokenizer_encode(qwen, s, len, 0, &ids, NULL) ||
		    !ids_equal(&ids, ref_of(i, "ids")))
			(*bad)++;
	}
	sm70_ids_free(&ids);
	return NULL;
}

static void test_threads(void **state)
{
	pthread_t th[4];
	size_t bad[4] = {0};

	for (int i = 0; i < 4; i++)
		assert_int_equal(pthread_create(&th[i], NULL, encode_all, &bad[i]), 0);
	for (int i = 0; i < 4; i++) {
		pthread_join(th[i], NULL);
		assert_int_equal(bad[i], 0);
	}
	print_message("threads: 4 threads encoded the corpus at once, all equal\n");
}

/* ---- special tokens and the API around ids ---------------------------------------------- */

static void test_special_tokens(void **state)
{
	static const int32_t chat[] = {151644, 872, 198, 9707, 0, 151645, 198};
	struct sm70_ids ids = {0};
	struct sm70_text out = {0};
	size_t len;
	const char *b;

	encode_ok(qwen, "<|im_start|>user\nHello!<|im_end|>\n", 0, &ids);
	assert_int_equal(ids.n, 7);
	assert_memory_equal(ids.v, chat, sizeof(chat));

	/* special tokens as text: no special id, same text back; non-special added tokens
	 * (<think>) are still matched, as with tokenizers' encode_special_tokens */
	encode_ok(qwen, "<|im_start|>user<think>", SM70_TOK_SPECIAL_AS_TEXT, &ids);
	for (size_t i = 0; i < ids.n; i++)
		assert_false(sm70_tokenizer_is_special(qwen, ids.v[i]));
	assert_int_equal(ids.v[ids.n - 1], 151667);
	assert_int_equal(sm70_tokenizer_decode(qwen, ids.v, ids.n, 0, &out, NULL), 0);
	assert_string_equal(out.s, "<|im_start|>user<think>");

	assert_int_equal(sm70_tokenizer_token_id(qwen, "<|im_end|>", 10), 151645);
	assert_int_equal(sm70_tokenizer_token_id(qwen, "\xc4\xa0the", 5), 279);
	assert_int_equal(sm70_tokenizer_token_id(qwen, "no such token", 13), -1);
	b = sm70_tokenizer_token_bytes(qwen, 279, &len);
	assert_non_null(b);
	assert_int_equal(len, 4);
	assert_memory_equal(b, " the", 4);
	assert_null(sm70_tokenizer_token_bytes(qwen, 151669, &len));
	assert_null(sm70_tokenizer_token_bytes(qwen, -1, &len));
	assert_int_equal(sm70_tokenizer_vocab_size(qwen), 151669);
	assert_true(sm70_tokenizer_is_special(qwen, 151643));
	assert_true(sm70_tokenizer_is_special(qwen, 151656));
	assert_false(sm70_tokenizer_is_special(qwen, 151657));  /* <tool_call> */
	assert_false(sm70_tokenizer_is_special(qwen, 279));

	/* decode skips special tokens on request and refuses unknown ids */
	sm70_text_clear(&out);
	assert_int_equal(sm70_tokenizer_decode(qwen, chat, 7, SM70_TOK_SKIP_SPECIAL, &out, NULL),
			 0);
	assert_string_equal(out.s, "user\nHello!\n");
	{
		struct sm70_err err = {{0}};
		int32_t badid[] = {9707, 151669};

		assert_int_equal(sm70_tokenizer_decode(qwen, badid, 2, 0, &out, &err), -ERANGE);
		assert_non_null(strstr(err.msg, "151669"));
	}
	print_message("special tokens: chat layout ids, as-text mode, lookups, skip on decode\n");
	sm70_ids_free(&ids);
	sm70_text_free(&out);
}

static void test_invalid_utf8(void **state)
{
	static const char *bad[] = {"ab\xff", "\xc0\xaf", "\xed\xa0\x80", "\xf4\x90\x80\x80",
				    "x\xe2\x82", "\x80"};
	static const size_t at[] = {2, 0, 0, 0, 1, 0};
	struct sm70_ids ids = {0};

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		struct sm70_err err = {{0}};
		char want[32];

		assert_int_equal(sm70_tokenizer_encode(qwen, bad[i], strlen(bad[i]), 0, &ids, &err),
				 -EILSEQ);
		snprintf(want, sizeof(want), "(byte %zu)", at[i]);
		assert_non_null(strstr(err.msg, want));
	}
	assert_int_equal(ids.n, 0);
	/* a NUL inside the text is a character like any other */
	assert_int_equal(sm70_tokenizer_encode(qwen, "a\0b", 3, 0, &ids, NULL), 0);
	assert_int_equal(ids.n, 3);
	print_message("invalid UTF-8: %zu inputs refused with their offset\n",
		      sizeof(bad) / sizeof(bad[0]));
	sm70_ids_free(&ids);
}

/* ---- a synthetic tokenizer for the added-token options -------------------------------- */

static const char *byte_symbol(unsigned b, char out[4])
{
	static uint32_t map[256];
	uint32_t next = 256;
	size_t l;

	for (unsigned i = 0; i < 256; i++)
		map[i] = ((i >= 0x21 && i <= 0x7E) || (i >= 0xA1 && i <= 0xAC) || i >= 0xAE) ? i :
											    next++;
	l = sm70__utf8_put((uint8_t *)out, map[b]);
	out[l] = 0;
	return out;
}

/* 256 byte symbols (id = byte), "ab" (256, merge a+b), then the added tokens. */
static json_t *tiny_json(void)
{
	json_t *root = json_object(), *model = json_object(), *vocab = json_object(),
	       *added = json_array(), *pre;
	char sym[4];

	for (unsigned b = 0; b < 256; b++)
		json_object_set_new(vocab, byte_symbol(b, sym), json_integer(b));
	json_object_set_new(vocab, "ab", json_integer(256));
	json_object_set_new(model, "type", json_string("BPE"));
	json_object_set_new(model, "vocab", vocab);
	json_object_set_new(model, "merges", json_pack("[[ss]]", "a", "b"));
	json_array_append_new(added, json_pack("{s:i,s:s,s:b,s:b,s:b,s:b,s:b}", "id", 999,
					       "content", "<s>", "single_word", 0, "lstrip", 1,
					       "rstrip", 1, "normalized", 0, "special", 1));
	json_array_append_new(added, json_pack("{s:i,s:s,s:b,s:b,s:b,s:b,s:b}", "id", 258,
					       "content", "[W]", "single_word", 1, "lstrip", 0,
					       "rstrip", 0, "normalized", 0, "special", 0));
	/* normalized: matched after NFC, so a decomposed text finds it too */
	json_array_append_new(added, json_pack("{s:i,s:s,s:b,s:b,s:b,s:b,s:b}", "id", 259,
					       "content", "A\xcc\x8a", "single_word", 0, "lstrip",
					       0, "rstrip", 0, "normalized", 1, "special", 0));
	json_array_append_new(added, json_pack("{s:i,s:s,s:b,s:b,s:b,s:b,s:b}", "id", 260,
					       "content", "ab", "single_word", 0, "lstrip", 0,
					       "rstrip", 0, "normalized", 1, "special", 0));
	json_object_set_new(root, "version", json_string("1.0"));
	json_object_set_new(root, "added_tokens", added);
	json_object_set_new(root, "normalizer", json_pack("{s:s}", "type", "NFC"));
	pre = json_pack("{s:s,s:[{s:s,s:{s:s},s:s,s:b},{s:s,s:b,s:b,s:b}]}", "type", "Sequence",
			"pretokenizers", "type", "Split", "pattern", "Regex",
			"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?"
			"[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
			"behavior", "Isolated", "invert", 0, "type", "ByteLevel", "add_prefix_space",
			0, "trim_offsets", 0, "use_regex", 0);
	json_object_set_new(root, "pre_tokenizer", pre);
	json_object_set_new(root, "decoder", json_pack("{s:s}", "type", "ByteLevel"));
	json_object_set_new(root, "model", model);
	return root;
}

static int load_tiny(json_t *root, struct sm70_tokenizer **t, struct sm70_err *err)
{
	char *s = json_dumps(root, JSON_COMPACT);
	int rc = sm70_tokenizer_load_json(s, strlen(s), t, err);

	free(s);
	return rc;
}

static void expect_ids(const struct sm70_tokenizer *t, const char *s, const int32_t *want,
		       size_t n)
{
	struct sm70_ids ids = {0};

	encode_ok(t, s, 0, &ids);
	if (ids.n != n || memcmp(ids.v, want, n * sizeof(*want))) {
		for (size_t i = 0; i < ids.n; i++)
			print_message("%d ", ids.v[i]);
		fail_msg("\"%s\": %zu ids, want %zu", s, ids.n, n);
	}
	sm70_ids_free(&ids);
}

#define EXPECT(t, s, ...) do { \
	static const int32_t w_[] = {__VA_ARGS__}; \
	expect_ids(t, s, w_, sizeof(w_) / sizeof(w_[0])); \
} while (0)

/* Expected ids follow tokenizers' AddedVocabulary::find_matches: the token ids count
 * from the vocab size (257), whatever the file's "id" says; ab, an existing vocab entry,
 * keeps id 256. */
static void test_added_token_options(void **state)
{
	struct sm70_tokenizer *t = NULL;
	struct sm70_err err = {{0}};
	json_t *root = tiny_json();
	struct sm70_text out = {0};

	if (load_tiny(root, &t, &err))
		fail_msg("tiny: %s", err.msg);
	/* lstrip + rstrip: the white space on both sides belongs to the token */
	EXPECT(t, "x  <s>  y", 'x', 257, 'y');
	EXPECT(t, "x\t<s>\n", 'x', 257);
	EXPECT(t, "<s><s>", 257, 257);
	/* single_word: only between non-word characters (\w: letters, marks, digits, _) */
	EXPECT(t, "[W]", 258);
	EXPECT(t, "- [W] -", '-', ' ', 258, ' ', '-');
	EXPECT(t, "a[W]", 'a', '[', 'W', ']');
	EXPECT(t, "[W]1", '[', 'W', ']', '1');
	EXPECT(t, "_[W]", '_', '[', 'W', ']');
	EXPECT(t, "!\xc3\xa9[W]", '!', 0xC3, 0xA9, '[', 'W', ']');
	/* normalized: matched against the NFC text, by its NFC form */
	EXPECT(t, "\xc3\x85", 259);
	EXPECT(t, "A\xcc\x8a", 259);
	EXPECT(t, "xA\xcc\x8ay", 'x', 259, 'y');
	/* an added token equal to a vocab entry keeps its id and splits words */
	EXPECT(t, "cabd", 'c', 256, 'd');
	/* decoding goes through the ByteLevel decoder, added tokens too: the U+00C5 of the
	 * normalized token stands for the byte 0xC5 there, which alone is not UTF-8 (so
	 * tokenizers decodes it to U+FFFD as well) */
	assert_int_equal(sm70_tokenizer_decode(t, (const int32_t[]){'x', 257, 259, 256}, 4, 0,
					       &out, NULL), 0);
	assert_string_equal(out.s, "x<s>\xef\xbf\xbd" "ab");
	sm70_text_clear(&out);
	assert_int_equal(sm70_tokenizer_decode(t, (const int32_t[]){'x', 257, 'y'}, 3,
					       SM70_TOK_SKIP_SPECIAL, &out, NULL), 0);
	assert_string_equal(out.s, "xy");
	sm70_tokenizer_free(t);
	print_message("added tokens: lstrip/rstrip, single_word, normalized, vocab overlap\n");
	sm70_text_free(&out);
	json_decref(root);
}

/* Merges in the "a b" string form, and ignore_merges (a word in the vocab is that token). */
static void test_merges_forms(void **state)
{
	for (int ignore = 0; ignore <= 1; ignore++) {
		json_t *root = tiny_json(), *model = json_object_get(root, "model");
		json_t *vocab = json_object_get(model, "vocab");
		struct sm70_tokenizer *t = NULL;
		struct sm70_err err = {{0}};

		json_object_set_new(vocab, "xy", json_integer(257));
		json_object_set_new(vocab, "xyz", json_integer(258));
		json_object_set_new(model, "merges", json_pack("[s]", "x y"));
		json_object_set_new(model, "ignore_merges", json_boolean(ignore));
		if (load_tiny(root, &t, &err))
			fail_msg("tiny: %s", err.msg);
		EXPECT(t, "xy", 257);
		if (ignore) {
			EXPECT(t, "xyz", 258);
		} else {
			EXPECT(t, "xyz", 257, 'z');
		}
		EXPECT(t, "xyxy", 257, 257);
		EXPECT(t, "<s>", 259);      /* added tokens count from the vocab's size */
		sm70_tokenizer_free(t);
		json_decref(root);
	}
	print_message("merges: the \"a b\" form; ignore_merges off and on\n");
}

/* What is not supported is refused at load, by name. */
static void test_refusals(void **state)
{
	static const struct {
		const char *path, *key, *value_json, *words;
	} cases[] = {
		{"model", "type", "\"WordPiece\"", "WordPiece"},
		{"model", "dropout", "0.1", "dropout"},
		{"model", "byte_fallback", "true", "byte_fallback"},
		{"model", "continuing_subword_prefix", "\"##\"", "continuing_subword_prefix"},
		{"", "normalizer", "{\"type\": \"NFKC\"}", "normalizer NFKC"},
		{"", "pre_tokenizer", "{\"type\": \"Metaspace\"}", "pre_tokenizer Metaspace"},
		{"", "decoder", "{\"type\": \"WordPiece\"}", "decoder WordPiece"},
		{"", "post_processor", "{\"type\": \"TemplateProcessing\"}", "TemplateProcessing"},
		{"", "truncation", "{\"max_length\": 8}", "truncation"},
		{"", "version", "\"2.0\"", "version 2.0"},
	};
	struct sm70_tokenizer *t = NULL;
	struct sm70_err err = {{0}};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		json_t *root = tiny_json(), *where = root;

		if (*cases[i].path)
			where = json_object_get(root, cases[i].path);
		json_object_set_new(where, cases[i].key, json_loads(cases[i].value_json, JSON_DECODE_ANY, NULL));
		sm70_err_clear(&err);
		if (load_tiny(root, &t, &err) != -ENOTSUP)
			fail_msg("case %zu (%s) loaded: %s", i, cases[i].key, err.msg);
		assert_null(t);
		if (!strstr(err.msg, cases[i].words))
			fail_msg("case %zu: \"%s\" does not name %s", i, err.msg, cases[i].words);
		json_decref(root);
	}
	/* another Split pattern, and a merge of unknown tokens */
	{
		json_t *root = tiny_json();
		json_t *split = json_array_get(json_object_get(json_object_get(root,
						"pre_tokenizer"), "pretokenizers"), 0);

		json_object_set_new(json_object_get(split, "pattern"), "Regex",
				    json_string("\\w+|[^\\w\\s]+"));
		assert_int_equal(load_tiny(root, &t, &err), -ENOTSUP);
		json_decref(root);
		root = tiny_json();
		json_array_append_new(json_object_get(json_object_get(root, "model"), "merges"),
				      json_string("x yz"));
		sm70_err_clear(&err);
		assert_int_equal(load_tiny(root, &t, &err), -EINVAL);
		assert_non_null(strstr(err.msg, "not in the vocab"));
		json_decref(root);
	}
	assert_int_equal(sm70_tokenizer_load("/nonexistent/tokenizer.json", &t, &err), -ENOENT);
	assert_int_equal(sm70_tokenizer_load_dir("/nonexistent", &t, &err), -ENOENT);
	print_message("refusals: %zu unsupported settings named, a foreign pattern, a bad merge\n",
		      sizeof(cases) / sizeof(cases[0]));
}

/* ---- streaming detokenization ----------------------------------------------------------- */

static int utf8_whole(const struct sm70_text *t)
{
	return sm70_utf8_check(t->s ? t->s : "", t->len) == t->len;
}

/* Every corpus string, one id at a time: deltas are whole UTF-8 and add up to decode. */
static void test_stream_corpus(void **state)
{
	struct sm70_detok *d = NULL;
	struct sm70_text delta = {0}, all = {0};
	size_t bad = 0, held = 0, tokens = 0;

	assert_int_equal(sm70_detok_new(qwen, NULL, &d), 0);
	for (size_t i = 0; i < json_array_size(corpus); i++) {
		json_t *ids = ref_of(i, "ids");

		sm70_detok_reset(d);
		sm70_text_clear(&all);
		for (size_t k = 0; k < json_array_size(ids); k++) {
			sm70_text_clear(&delta);
			assert_int_equal(sm70_detok_push(d, (int32_t)json_integer_value(
					json_array_get(ids, k)), &delta), 0);
			assert_true(utf8_whole(&delta));
			held += delta.len == 0;
			tokens++;
			sm70_text_append(&all, delta.s, delta.len);
		}
		sm70_text_clear(&delta);
		assert_int_equal(sm70_detok_finish(d, &delta), 0);
		sm70_text_append(&all, delta.s, delta.len);
		bad += !text_equal(all.s ? all.s : "", all.len, ref_of(i, "decoded"));
	}
	print_message("stream: %zu of %zu strings equal decode, one id at a time (%zu of %zu "
		      "pushes held back a partial character)\n", json_array_size(corpus) - bad,
		      json_array_size(corpus), held, tokens);
	assert_int_equal(bad, 0);
	assert_true(held > 100);
	sm70_detok_free(d);
	sm70_text_free(&delta);
	sm70_text_free(&all);
}

static void push_expect(struct sm70_detok *d, int32_t id, int rc, const char *want)
{
	struct sm70_text delta = {0};

	assert_int_equal(sm70_detok_push(d, id, &delta), rc);
	if (strlen(want) != delta.len || memcmp(want, delta.s ? delta.s : "", delta.len))
		fail_msg("push %d: got \"%.*s\", want \"%s\"", id, (int)delta.len,
			 delta.s ? delta.s : "", want);
	sm70_text_free(&delta);
}

static void finish_expect(struct sm70_detok *d, int rc, const char *want)
{
	struct sm70_text delta = {0};

	assert_int_equal(sm70_detok_finish(d, &delta), rc);
	if (strlen(want) != delta.len || memcmp(want, delta.s ? delta.s : "", delta.len))
		fail_msg("finish: got \"%.*s\", want \"%s\"", (int)delta.len,
			 delta.s ? delta.s : "", want);
	sm70_text_free(&delta);
}

static void test_stream_split_utf8(void **state)
{
	struct sm70_detok *d = NULL;
	struct sm70_ids ids = {0};
	int32_t b[256];
	char sym[4];

	for (unsigned i = 0; i < 256; i++)
		b[i] = sm70_tokenizer_token_id(qwen, byte_symbol(i, sym), strlen(sym));
	assert_int_equal(sm70_detok_new(qwen, NULL, &d), 0);
	/* a four-byte character one byte per token: nothing until its last byte */
	push_expect(d, b[0xF0], 0, "");
	push_expect(d, b[0x9F], 0, "");
	push_expect(d, b[0x98], 0, "");
	push_expect(d, b[0x80], 0, "\xf0\x9f\x98\x80");
	/* ill-formed bytes become U+FFFD as soon as they are known to be */
	push_expect(d, b[0x80], 0, "\xef\xbf\xbd");
	push_expect(d, b[0xE2], 0, "");
	push_expect(d, b['a'], 0, "\xef\xbf\xbd" "a");
	push_expect(d, b[0xE2], 0, "");
	push_expect(d, b[0x82], 0, "");
	finish_expect(d, 0, "\xef\xbf\xbd");
	/* a real emoji split by BPE across tokens */
	sm70_detok_reset(d);
	encode_ok(qwen, "\xf0\x9f\xab\xa0", 0, &ids);  /* U+1FAE0, no single token */
	assert_true(ids.n >= 2);
	for (size_t k = 0; k + 1 < ids.n; k++)
		push_expect(d, ids.v[k], 0, "");
	push_expect(d, ids.v[ids.n - 1], 0, "\xf0\x9f\xab\xa0");
	finish_expect(d, 0, "");
	/* unknown ids are refused, special tokens skipped on request */
	push_expect(d, 151669, -ERANGE, "");
	sm70_detok_free(d);
	{
		struct sm70_detok_opts o = {.size = sizeof(o), .flags = SM70_TOK_SKIP_SPECIAL};

		assert_int_equal(sm70_detok_new(qwen, &o, &d), 0);
		push_expect(d, 151644, 0, "");
		push_expect(d, 9707, 0, "Hello");
		sm70_detok_free(d);
	}
	print_message("stream: split four-byte character, U+FFFD for ill-formed bytes, an "
		      "emoji over %zu tokens\n", ids.n);
	sm70_ids_free(&ids);
}

/* Streams `text` through stops; checks the deltas never hold any part of the match and
 * returns the text emitted. */
static char *stream_stops(const char *text, const char *const *stops, size_t n_stop,
			  int *stopped, int *which)
{
	struct sm70_detok_opts o = {.size = sizeof(o), .stop = stops, .n_stop = n_stop};
	struct sm70_detok *d = NULL;
	struct sm70_ids ids = {0};
	struct sm70_text all = {0}, delta = {0};
	int rc = 0;

	assert_int_equal(sm70_detok_new(qwen, &o, &d), 0);
	encode_ok(qwen, text, 0, &ids);
	for (size_t k = 0; k < ids.n && rc == 0; k++) {
		sm70_text_clear(&delta);
		rc = sm70_detok_push(d, ids.v[k], &delta);
		assert_true(rc == 0 || rc == SM70_DETOK_STOPPED);
		assert_true(utf8_whole(&delta));
		sm70_text_append(&all, delta.s, delta.len);
	}
	if (rc == 0) {
		sm70_text_clear(&delta);
		rc = sm70_detok_finish(d, &delta);
		sm70_text_append(&all, delta.s, delta.len);
	} else {
		/* after a stop: nothing more, whatever comes */
		sm70_text_clear(&delta);
		assert_int_equal(sm70_detok_push(d, 9707, &delta), SM70_DETOK_STOPPED);
		assert_int_equal(sm70_detok_finish(d, &delta), SM70_DETOK_STOPPED);
		assert_int_equal(delta.len, 0);
	}
	*stopped = rc == SM70_DETOK_STOPPED;
	*which = sm70_detok_stop_index(d);
	sm70_text_append(&all, "", 0);
	sm70_detok_free(d);
	sm70_ids_free(&ids);
	sm70_text_free(&delta);
	return all.s;
}

static void test_stop_strings(void **state)
{
	static const struct {
		const char *text;
		const char *stops[3];
		const char *want;
		int stopped, which;
	} cases[] = {
		/* spans tokens: " the" "END" ... */
		{"Hello world, this is theEND of it", {"theEND"}, "Hello world, this is ", 1, 0},
		{"one two three four", {"o t", "ee f"}, "one tw", 1, 0},
		{"one two three four", {"ee f", "o t"}, "one tw", 1, 1},
		{"abc<|im_end|>def", {"<|im_end|>"}, "abc", 1, 0},
		{"\xe4\xbd\xa0\xe5\xa5\xbd\xe4\xb8\x96\xe7\x95\x8c!", {"\xe7\x95\x8c"},
		 "\xe4\xbd\xa0\xe5\xa5\xbd\xe4\xb8\x96", 1, 0},
		{"\xf0\x9f\xab\xa0 melt", {"\xf0\x9f\xab\xa0"}, "", 1, 0},
		{"STOP at the start", {"STOP"}, "", 1, 0},
		/* only a prefix appears: held, then emitted at the end */
		{"ends with the EN", {"the END"}, "ends with the EN", 0, -1},
		{"never matches", {"xyz", "qq"}, "never matches", 0, -1},
		{"a\n\nb\n\nc", {"\n\n"}, "a", 1, 0},
		{"aaaaab", {"aab"}, "aaa", 1, 0},
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		size_t n = 0;
		int stopped, which;
		char *got;

		while (n < 3 && cases[i].stops[n])
			n++;
		got = stream_stops(cases[i].text, cases[i].stops, n, &stopped, &which);
		if (strcmp(got, cases[i].want))
			fail_msg("case %zu: got \"%s\", want \"%s\"", i, got, cases[i].want);
		assert_int_equal(stopped, cases[i].stopped);
		assert_int_equal(which, cases[i].which);
		free(got);
	}
	{
		/* the first stop to complete wins, even if a longer one started earlier */
		const char *stops[] = {"abcd", "bc"};
		struct sm70_detok_opts o = {.size = sizeof(o), .stop = stops, .n_stop = 2};
		struct sm70_detok *d;
		char sym[4];

		assert_int_equal(sm70_detok_new(qwen, &o, &d), 0);
		push_expect(d, sm70_tokenizer_token_id(qwen, byte_symbol('a', sym), 1), 0, "");
		push_expect(d, sm70_tokenizer_token_id(qwen, byte_symbol('b', sym), 1), 0, "");
		push_expect(d, sm70_tokenizer_token_id(qwen, byte_symbol('c', sym), 1),
			    SM70_DETOK_STOPPED, "a");
		assert_int_equal(sm70_detok_stop_index(d), 1);
		sm70_detok_free(d);
	}
	{
		struct sm70_detok *d;
		const char *empty[] = {""};
		struct sm70_detok_opts o = {.size = sizeof(o), .stop = empty, .n_stop = 1};

		assert_int_equal(sm70_detok_new(qwen, &o, &d), -EINVAL);
	}
	print_message("stop strings: %zu cases, spanning tokens and split characters\n",
		      sizeof(cases) / sizeof(cases[0]));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_corpus_encode),
		cmocka_unit_test(test_corpus_encode_heap_bpe),
		cmocka_unit_test(test_corpus_decode),
		cmocka_unit_test(test_corpus_roundtrip_nfc),
		cmocka_unit_test(test_corpus_split),
		cmocka_unit_test(test_nfc_long_runs),
		cmocka_unit_test(test_threads),
		cmocka_unit_test(test_special_tokens),
		cmocka_unit_test(test_invalid_utf8),
		cmocka_unit_test(test_added_token_options),
		cmocka_unit_test(test_merges_forms),
		cmocka_unit_test(test_refusals),
		cmocka_unit_test(test_stream_corpus),
		cmocka_unit_test(test_stream_split_utf8),
		cmocka_unit_test(test_stop_strings),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
