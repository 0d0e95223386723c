/* fuzz_chat - libFuzzer target: arbitrary bytes as a chat request through the chat format. */
/*
 * The input's first byte holds the render flags, the rest is parsed as JSON (a "messages"
 * array, as sm70-tokenize --chat and OpenAI-style requests carry it). Whatever it is, the
 * parse and the render must return 0 or an error with a message, never crash or leak; a
 * rendered prompt must be well-formed UTF-8, begin with <|im_start|>, hold every turn's
 * content, and end with the generation prompt when it was asked for.
 * Built and run by tests/fuzz/run-chat.sh (clang -fsanitize=fuzzer,address,undefined).
 */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/chat.h"

#define CHECK(c) do { \
	if (!(c)) { \
		fprintf(stderr, "violated: %s (line %d)\n", #c, __LINE__); \
		abort(); \
	} \
} while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct sm70_err err = {{0}};
	struct sm70_text out = {0};
	struct sm70_chat_msg *m = NULL;
	unsigned flags;
	json_t *j;
	size_t n;
	int rc;

	if (!size)
		return 0;
	flags = data[0] & (SM70_CHAT_ADD_GENERATION_PROMPT | SM70_CHAT_NO_THINKING);
	j = json_loadb((const char *)data + 1, size - 1, JSON_ALLOW_NUL | JSON_DECODE_ANY, NULL);
	if (!j)
		return 0;
	rc = sm70_chat_msgs_from_json(j, &m, &n, &err);
	CHECK(rc == 0 || (rc < 0 && err.msg[0]));
	if (!rc) {
		err.msg[0] = 0;
		rc = sm70_chat_render(SM70_CHAT_QWEN3, m, n, flags, &out, &err);
		CHECK(rc == 0 || (rc < 0 && err.msg[0]));
	}
	if (!rc) {
		CHECK(sm70_utf8_check(out.s, out.len) == out.len);
		CHECK(out.len >= 12 && !memcmp(out.s, "<|im_start|>", 12));
		for (size_t i = 0; i < n; i++) {
			/* a user, system or tool turn's content appears verbatim (an assistant's
			 * may lose its <think> part) */
			if (strcmp(m[i].role, "assistant") && m[i].content_len)
				CHECK(memmem(out.s, out.len, m[i].content, m[i].content_len));
		}
		if (flags & SM70_CHAT_ADD_GENERATION_PROMPT) {
			const char *tail = flags & SM70_CHAT_NO_THINKING ?
				"<|im_start|>assistant\n<think>\n\n</think>\n\n" :
				"<|im_start|>assistant\n";
			size_t tl = strlen(tail);

			CHECK(out.len >= tl && !memcmp(out.s + out.len - tl, tail, tl));
		}
	}
	free(m);
	sm70_text_free(&out);
	json_decref(j);
	return 0;
}
