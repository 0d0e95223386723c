/*
 * tokenizer.h - Hugging Face tokenizer.json byte-level BPE (the Qwen2/Qwen3 family) in C:
 * text to token ids and back, and a streaming detokenizer with stop strings.
 *
 * Exact against the `tokenizers` package for what it supports: an NFC (or no) normalizer,
 * the pre-tokenizer Sequence[Split(Qwen2 regex, Isolated), ByteLevel(no prefix space, no
 * regex)] (Llama-3's variant of the regex, digits in groups of three, too), a BPE model by
 * merge rank, a ByteLevel decoder, added tokens with special / normalized / lstrip /
 * rstrip / single_word. Anything else in a tokenizer.json is refused at load with a
 * message naming it. Not here: chat templates (text/chat.h, a layer above), offsets,
 * truncation and padding, training.
 *
 * Threads: a loaded tokenizer is immutable; any number of threads may encode and decode
 * with it at once. A detokenizer is one stream's state: one thread at a time.
 * Memory: about 20 MB for a 150k vocabulary.
 */
#ifndef SM70_TEXT_TOKENIZER_H
#define SM70_TEXT_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "text/utf8.h"

struct sm70_tokenizer;

/* Token ids, growable; zero-initialise, release with sm70_ids_free. */
struct sm70_ids {
	int32_t *v;
	size_t n, cap;
};
void sm70_ids_free(struct sm70_ids *ids);

/* Loads a tokenizer.json file. Returns 0 and *out (free with sm70_tokenizer_free), or
 * -errno with err naming the file and what is wrong or unsupported (-ENOTSUP). */
int sm70_tokenizer_load(const char *path, struct sm70_tokenizer **out, struct sm70_err *err);
/* Loads MODEL_DIR/tokenizer.json; -ENOENT when the directory has none, so a caller can go
 * on with token ids alone. */
int sm70_tokenizer_load_dir(const char *model_dir, struct sm70_tokenizer **out,
			    struct sm70_err *err);
/* Loads a tokenizer.json held in memory (len bytes, NUL not needed). */
int sm70_tokenizer_load_json(const char *json, size_t len, struct sm70_tokenizer **out,
			     struct sm70_err *err);
void sm70_tokenizer_free(struct sm70_tokenizer *tok);

enum {
	/* encode: special added tokens in the text are plain text, not their ids (the
	 * `encode_special_tokens` of tokenizers): for untrusted text inside a template */
	SM70_TOK_SPECIAL_AS_TEXT = 1u << 0,
	/* decode / detokenizer: leave special added tokens out of the text */
	SM70_TOK_SKIP_SPECIAL = 1u << 1,
};

/* Appends the ids of text[0..len) to out. No special tokens are added around it (Qwen's
 * post-processor adds none). Returns 0, -EILSEQ when text is not well-formed UTF-8 (with
 * err giving the byte offset), or -ENOMEM. */
int sm70_tokenizer_encode(const struct sm70_tokenizer *tok, const char *text, size_t len,
			  unsigned flags, struct sm70_ids *out, struct sm70_err *err);

/* Appends the text of ids[0..n) to out, as tokenizers' decode does: token bytes
 * concatenated, ill-formed UTF-8 replaced by U+FFFD. Returns 0, -ERANGE for an id the
 * tokenizer does not have (err names it), or -ENOMEM. */
int sm70_tokenizer_decode(const struct sm70_tokenizer *tok, const int32_t *ids, size_t n,
			  unsigned flags, struct sm70_text *out, struct sm70_err *err);

/* One more than the largest id. */
size_t sm70_tokenizer_vocab_size(const struct sm70_tokenizer *tok);
/* The bytes token id decodes to (*len set), or NULL when there is no such id. Valid while
 * tok lives. */
const char *sm70_tokenizer_token_bytes(const struct sm70_tokenizer *tok, int32_t id,
				       size_t *len);
/* The id of a token by its tokenizer.json spelling (an added token's content, or a vocab
 * entry in byte-level form, e.g. "Ġthe"), or -1. */
int32_t sm70_tokenizer_token_id(const struct sm70_tokenizer *tok, const char *s, size_t len);
/* Whether id is a special added token (e.g. <|im_end|>). */
int sm70_tokenizer_is_special(const struct sm70_tokenizer *tok, int32_t id);

/* ---- streaming detokenization ----------------------------------------------------------
 * Feed generated ids one at a time; each push appends to `delta` the text that is now
 * final: never a split UTF-8 sequence (bytes of a character spread over several tokens
 * are held until it completes) and never text that could still be the start of a stop
 * string. When a stop string appears, the text before it is the last delta and the
 * matched part is never emitted. The concatenated deltas of a stream without stops equal
 * sm70_tokenizer_decode of all its ids. */
struct sm70_detok;

struct sm70_detok_opts {
	size_t size;                /* sizeof(struct sm70_detok_opts) */
	unsigned flags;             /* SM70_TOK_SKIP_SPECIAL */
	const char *const *stop;    /* stop strings (UTF-8, non-empty), copied */
	size_t n_stop;
};

/* Returns 0 and *out (free with sm70_detok_free; tok must outlive it), or -EINVAL (a bad
 * stop string) / -ENOMEM. opts may be NULL. */
int sm70_detok_new(const struct sm70_tokenizer *tok, const struct sm70_detok_opts *opts,
		   struct sm70_detok **out);
void sm70_detok_free(struct sm70_detok *d);

/* Feeds one id. Returns 0, SM70_DETOK_STOPPED when a stop string matched (the stream is
 * over: later pushes append nothing and return it again), -ERANGE for an unknown id, or
 * -ENOMEM. */
#define SM70_DETOK_STOPPED 1
int sm70_detok_push(struct sm70_detok *d, int32_t id, struct sm70_text *delta);
/* Ends the stream: appends whatever was held (an unfinished character as U+FFFD, text
 * that only began a stop string). Returns 0 or SM70_DETOK_STOPPED as push does. */
int sm70_detok_finish(struct sm70_detok *d, struct sm70_text *delta);
/* Which stop string matched (its index in opts.stop), or -1: the first one complete as
 * the ids came; of several completed by one id, the earliest in the text, then the first
 * listed. */
int sm70_detok_stop_index(const struct sm70_detok *d);
/* Starts a new stream with the same options. */
void sm70_detok_reset(struct sm70_detok *d);

#endif
