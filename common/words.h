/*
 * words.h - a switch's comma-separated list of known words (SM70_FUSED, SM70_PDL): the
 * OR of the bits each word stands for, and the first word that is not known.
 */
#ifndef SM70_COMMON_WORDS_H
#define SM70_COMMON_WORDS_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

struct sm70_word {
	const char *name;
	unsigned bits;
};

/* *bits = the OR of the bits of list's words, each looked up in words[0..n). Returns 0,
 * or -1 with *bad (and *bad_len) the first word that is none of them, an empty one
 * included ("a,,b", a trailing comma); *bits then holds the known words' bits. */
int sm70_words_bits(const char *list, const struct sm70_word *words, size_t n, unsigned *bits,
		    const char **bad, size_t *bad_len);

#ifdef __cplusplus
}
#endif

#endif
