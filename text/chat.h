/*
 * chat.h - chat formats rendered in C: a conversation (system / user / assistant / tool
 * turns) to the prompt text a model was trained on, byte for byte what transformers'
 * apply_chat_template makes of the model's own template. No Jinja engine: a model's
 * chat_template is identified (by a hash of its text) as one of the formats implemented
 * here, and anything else is refused by name. docs/TOKENIZER.md lists the formats.
 *
 * The rendered text goes through sm70_tokenizer_encode as it is (special tokens in it,
 * <|im_start|> and the like, become their ids), which is what apply_chat_template's
 * tokenize=True does.
 */
#ifndef SM70_TEXT_CHAT_H
#define SM70_TEXT_CHAT_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "text/utf8.h"

enum sm70_chat_format {
	SM70_CHAT_NONE = 0,   /* no template known: raw prompts only */
	SM70_CHAT_QWEN3 = 1,  /* Qwen3's ChatML with <think> blocks and enable_thinking */
};

/* One turn. content (and reasoning, when not NULL) must be well-formed UTF-8 of the given
 * length (NULs allowed). role is "system", "user", "assistant" or "tool". */
struct sm70_chat_msg {
	const char *role;
	const char *content;
	size_t content_len;
	const char *reasoning;   /* an assistant turn's reasoning_content; NULL = absent */
	size_t reasoning_len;
};

enum {
	/* end with the opening of an assistant turn, for the model to continue */
	SM70_CHAT_ADD_GENERATION_PROMPT = 1u << 0,
	/* enable_thinking=false: the generation prompt holds an empty <think></think>
	 * block, so the model answers without reasoning (Qwen3) */
	SM70_CHAT_NO_THINKING = 1u << 1,
};

/* The format of a chat_template text (a trailing newline ignored, as Jinja ignores it).
 * Returns 0 with *out set, or -ENOTSUP with err naming the template by its hash and
 * listing the supported ones. */
int sm70_chat_identify(const char *tmpl, size_t len, enum sm70_chat_format *out,
		       struct sm70_err *err);

/* The format of a model directory's template: tokenizer_config.json's "chat_template"
 * (a string, or the "default" entry of a list of named templates), else
 * chat_template.jinja. Returns 0; -ENOENT (err says so) when the directory has neither;
 * -ENOTSUP for a template not implemented; -EINVAL for a malformed file. */
int sm70_chat_load_dir(const char *model_dir, enum sm70_chat_format *out,
		       struct sm70_err *err);

/* The name of a format ("qwen3"), "none" for SM70_CHAT_NONE. */
const char *sm70_chat_format_name(enum sm70_chat_format f);

/* Appends the rendered conversation to out. flags: SM70_CHAT_*. Returns 0; -EINVAL (err
 * names the turn and what is wrong: an unknown role, no messages, ill-formed UTF-8);
 * -ENOTSUP for SM70_CHAT_NONE; -ENOMEM. */
int sm70_chat_render(enum sm70_chat_format f, const struct sm70_chat_msg *msgs, size_t n,
		     unsigned flags, struct sm70_text *out, struct sm70_err *err);

/* A JSON "messages" array ([{"role", "content", "reasoning_content"?}...], as jansson's
 * json_t) as turns: *out (free() it) borrows the strings of `messages`, which must outlive
 * it. Returns 0; -EINVAL with err naming the entry (not an array, not an object, a
 * missing or non-string role or content, tool_calls, which no format here renders);
 * -ENOMEM. Roles and UTF-8 are checked by sm70_chat_render. */
struct json_t;
int sm70_chat_msgs_from_json(const struct json_t *messages, struct sm70_chat_msg **out,
			     size_t *n, struct sm70_err *err);

#endif
