/*
 * utf8.h - growable text buffers and UTF-8 scanning for the tokenizer: strict validation
 * (no overlong forms, no surrogates, nothing past U+10FFFF) and the classification that
 * lossy decoding and streaming detokenization share.
 *
 * Lossy decoding follows the Unicode "maximal subpart" rule, which is what Rust's
 * String::from_utf8_lossy (and so the Hugging Face decoders) does: every maximal prefix of
 * a well-formed sequence that cannot be completed becomes one U+FFFD. No dependencies.
 */
#ifndef SM70_TEXT_UTF8_H
#define SM70_TEXT_UTF8_H

#include <stddef.h>
#include <stdint.h>

/* A growable byte string, always NUL-terminated once anything was appended (s may hold
 * NULs of its own: len is the length). Zero-initialise; release with sm70_text_free. */
struct sm70_text {
	char *s;
	size_t len, cap;
};

/* Makes room for `more` bytes (plus the NUL). 0 or -ENOMEM. */
int sm70_text_reserve(struct sm70_text *t, size_t more);
/* Appends n bytes. 0 or -ENOMEM. */
int sm70_text_append(struct sm70_text *t, const void *p, size_t n);
/* Empties t, keeping its memory. */
void sm70_text_clear(struct sm70_text *t);
/* Frees t's memory and zeroes it. */
void sm70_text_free(struct sm70_text *t);

enum sm70_utf8_seq {
	SM70_UTF8_VALID = 0,      /* a whole, well-formed character */
	SM70_UTF8_INVALID,        /* *len bytes form one ill-formed maximal subpart */
	SM70_UTF8_INCOMPLETE,     /* the n bytes so far could still become a character */
};

/* Classifies the sequence at s (n >= 1 bytes available): returns the kind and sets *len
 * (the character's length, the bytes one U+FFFD replaces, or n). *cp gets the code point
 * of a valid character. */
enum sm70_utf8_seq sm70__utf8_next(const uint8_t *s, size_t n, size_t *len, uint32_t *cp);

/* Offset of the first byte of s[0..n) that is not well-formed UTF-8, or n when all is. */
size_t sm70_utf8_check(const char *s, size_t n);

/* Appends s[0..n) with every ill-formed maximal subpart replaced by U+FFFD (an incomplete
 * tail too). 0 or -ENOMEM. */
int sm70__utf8_append_lossy(struct sm70_text *t, const uint8_t *s, size_t n);

/* Writes cp (<= 0x10FFFF, not a surrogate) as UTF-8 into out[4]; returns its length. */
static inline size_t sm70__utf8_put(uint8_t *out, uint32_t cp)
{
	if (cp < 0x80) {
		out[0] = (uint8_t)cp;
		return 1;
	}
	if (cp < 0x800) {
		out[0] = (uint8_t)(0xC0 | (cp >> 6));
		out[1] = (uint8_t)(0x80 | (cp & 0x3F));
		return 2;
	}
	if (cp < 0x10000) {
		out[0] = (uint8_t)(0xE0 | (cp >> 12));
		out[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
		out[2] = (uint8_t)(0x80 | (cp & 0x3F));
		return 3;
	}
	out[0] = (uint8_t)(0xF0 | (cp >> 18));
	out[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
	out[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
	out[3] = (uint8_t)(0x80 | (cp & 0x3F));
	return 4;
}

/* Decodes the character at s, which must be well-formed UTF-8; sets *len. */
static inline uint32_t sm70__utf8_get(const uint8_t *s, size_t *len)
{
	uint8_t b = s[0];

	if (b < 0x80) {
		*len = 1;
		return b;
	}
	if (b < 0xE0) {
		*len = 2;
		return ((uint32_t)(b & 0x1F) << 6) | (s[1] & 0x3F);
	}
	if (b < 0xF0) {
		*len = 3;
		return ((uint32_t)(b & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
	}
	*len = 4;
	return ((uint32_t)(b & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) |
	       ((uint32_t)(s[2] & 0x3F) << 6) | (s[3] & 0x3F);
}

#endif
