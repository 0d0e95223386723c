/*
 * internal.h - tokenizer internals that the unit tests reach into; not an interface.
 */
#ifndef SM70_TEXT_INTERNAL_H
#define SM70_TEXT_INTERNAL_H

#include <stddef.h>

/* End of the pre-tokenizer regex match that starts at s[i] (i < n, s well-formed UTF-8):
 * digits_max 1 is the Qwen2 pattern, 3 Llama-3's. */
size_t sm70__pretok_next(const char *s, size_t n, size_t i, int digits_max);

/* Words up to this many bytes merge by scanning (at most 64), longer ones in a heap. */
extern size_t sm70__bpe_scan_max;

#endif
