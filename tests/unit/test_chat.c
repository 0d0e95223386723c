/*
 * test_chat - the chat format (text/chat.c) equals transformers' apply_chat_template with
 * the real Qwen3 template: text and ids of all 36 cases of chat_reference.jsonl (6
 * conversations x add_generation_prompt x enable_thinking unset/false/true); the template
 * found in tokenizer_config.json and chat_template.jinja, and refused when it is another;
 * the parts of the template the reference does not cover (reasoning_content, tool turns, a
 * later system turn), expected from the template's text; bad turns named.
 */
#include <errno.h>
#include <jansson.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "text/chat.h"
#include "text/tokenizer.h"

#define DIR "tests/fixtures/tokenizer"

static struct sm70_tokenizer *qwen;

static int setup(void **state)
{
	struct sm70_err err = {{0}};
	FILE *p = popen("gzip -dc " DIR "/qwen3-tokenizer.json.gz", "r");
	struct sm70_text json = {0};
	char buf[65536];
	size_t got;

	assert_non_null(p);
	while ((got = fread(buf, 1, sizeof(buf), p)) > 0)
		assert_int_equal(sm70_text_append(&json, buf, got), 0);
	assert_int_equal(pclose(p), 0);
	if (sm70_tokenizer_load_json(json.s, json.len, &qwen, &err))
		fail_msg("%s", err.msg);
	sm70_text_free(&json);
	return 0;
}

static int teardown(void **state)
{
	sm70_tokenizer_free(qwen);
	return 0;
}

static void test_reference(void **state)
{
	FILE *f = fopen(DIR "/chat_reference.jsonl", "r");
	char *line = NULL;
	size_t cap = 0;
	int cases = 0;

	assert_non_null(f);
	while (getline(&line, &cap, f) > 0) {
		json_error_t je;
		json_t *c = json_loads(line, 0, &je), *ids, *think;
		struct sm70_chat_msg *m;
		struct sm70_text text = {0};
		struct sm70_ids got = {0};
		struct sm70_err err = {{0}};
		unsigned flags = 0;
		size_t n;

		assert_non_null(c);
		if (sm70_chat_msgs_from_json(json_object_get(c, "messages"), &m, &n, &err))
			fail_msg("case %d: %s", cases, err.msg);
		if (json_is_true(json_object_get(c, "add_generation_prompt")))
			flags |= SM70_CHAT_ADD_GENERATION_PROMPT;
		think = json_object_get(c, "enable_thinking");
		if (json_is_false(think))
			flags |= SM70_CHAT_NO_THINKING;
		if (sm70_chat_render(SM70_CHAT_QWEN3, m, n, flags, &text, &err))
			fail_msg("case %d: %s", cases, err.msg);
		if (strcmp(text.s, json_string_value(json_object_get(c, "text"))))
			fail_msg("case %d: rendered\n%s\nwant\n%s", cases, text.s,
				 json_string_value(json_object_get(c, "text")));
		assert_int_equal(sm70_tokenizer_encode(qwen, text.s, text.len, 0, &got, &err), 0);
		ids = json_object_get(c, "ids");
		assert_int_equal(got.n, json_array_size(ids));
		for (size_t i = 0; i < got.n; i++)
			if (got.v[i] != json_integer_value(json_array_get(ids, i)))
				fail_msg("case %d: id %zu is %d, want %lld", cases, i, got.v[i],
					 (long long)json_integer_value(json_array_get(ids, i)));
		sm70_ids_free(&got);
		sm70_text_free(&text);
		free(m);
		json_decref(c);
		cases++;
	}
	free(line);
	fclose(f);
	assert_int_equal(cases, 36);
	print_message("chat reference: %d of 36 cases equal in text and ids\n", cases);
}

/* Writes a model directory holding `config` as tokenizer_config.json (NULL: none) and
 * `jinja` as chat_template.jinja (NULL: none). */
static void make_dir(char *dir, const char *config, const char *jinja)
{
	char path[256];
	FILE *f;

	strcpy(dir, "/tmp/sm70-test-chat-XXXXXX");
	assert_non_null(mkdtemp(dir));
	if (config) {
		snprintf(path, sizeof(path), "%s/tokenizer_config.json", dir);
		assert_non_null(f = fopen(path, "w"));
		fputs(config, f);
		fclose(f);
	}
	if (jinja) {
		snprintf(path, sizeof(path), "%s/chat_template.jinja", dir);
		assert_non_null(f = fopen(path, "w"));
		fputs(jinja, f);
		fclose(f);
	}
}

static void remove_dir(const char *dir)
{
	char path[256];

	snprintf(path, sizeof(path), "%s/tokenizer_config.json", dir);
	unlink(path);
	snprintf(path, sizeof(path), "%s/chat_template.jinja", dir);
	unlink(path);
	rmdir(dir);
}

static void test_identify(void **state)
{
	json_t *cfg = json_load_file(DIR "/qwen3-tokenizer_config.json", 0, NULL);
	const char *tmpl = json_string_value(json_object_get(cfg, "chat_template"));
	struct sm70_err err = {{0}};
	enum sm70_chat_format f;
	char dir[64], *other, *list, *jinja_nl, *whole = json_dumps(cfg, 0);

	assert_non_null(tmpl);
	/* the fixture's config, as a model directory ships it */
	make_dir(dir, whole, NULL);
	free(whole);
	assert_int_equal(sm70_chat_load_dir(dir, &f, &err), 0);
	assert_int_equal(f, SM70_CHAT_QWEN3);
	assert_string_equal(sm70_chat_format_name(f), "qwen3");
	remove_dir(dir);

	/* chat_template.jinja (newer transformers writes it apart), with its last newline */
	assert_true(asprintf(&jinja_nl, "%s\n", tmpl) > 0);
	make_dir(dir, "{\"eos_token\": \"<|im_end|>\"}", jinja_nl);
	assert_int_equal(sm70_chat_load_dir(dir, &f, &err), 0);
	assert_int_equal(f, SM70_CHAT_QWEN3);
	remove_dir(dir);

	/* a list of named templates: the "default" one */
	json_t *named = json_pack("{s:[{s:s,s:s},{s:s,s:s}]}", "chat_template", "name",
				  "tool_use", "template", "x", "name", "default", "template", tmpl);
	list = json_dumps(named, 0);
	make_dir(dir, list, NULL);
	assert_int_equal(sm70_chat_load_dir(dir, &f, &err), 0);
	assert_int_equal(f, SM70_CHAT_QWEN3);
	remove_dir(dir);

	/* one character changed is another template: refused, named by its hash */
	other = strdup(tmpl);
	other[strlen(other) / 2] ^= 1;
	assert_int_equal(sm70_chat_identify(other, strlen(other), &f, &err), -ENOTSUP);
	assert_int_equal(f, SM70_CHAT_NONE);
	assert_non_null(strstr(err.msg, "fnv1a64:"));
	assert_non_null(strstr(err.msg, "is not supported"));
	print_message("unsupported: %s\n", err.msg);

	/* no template at all; a config that is not JSON */
	err.msg[0] = 0;
	make_dir(dir, "{}", NULL);
	assert_int_equal(sm70_chat_load_dir(dir, &f, &err), -ENOENT);
	assert_non_null(strstr(err.msg, "no chat template"));
	remove_dir(dir);
	err.msg[0] = 0;
	make_dir(dir, "{\"chat_template\": ", NULL);
	assert_int_equal(sm70_chat_load_dir(dir, &f, &err), -EINVAL);
	assert_non_null(strstr(err.msg, "tokenizer_config.json"));
	remove_dir(dir);

	free(other);
	free(list);
	free(jinja_nl);
	json_decref(named);
	json_decref(cfg);
}

static void expect(const struct sm70_chat_msg *m, size_t n, unsigned flags, const char *want)
{
	struct sm70_text t = {0};
	struct sm70_err err = {{0}};

	if (sm70_chat_render(SM70_CHAT_QWEN3, m, n, flags, &t, &err))
		fail_msg("%s", err.msg);
	if (strcmp(t.s, want))
		fail_msg("rendered\n%s\nwant\n%s", t.s, want);
	sm70_text_free(&t);
}

#define MSG(r, c) { .role = r, .content = c, .content_len = sizeof(c) - 1 }

/* What the reference does not cover, expected from the template's text. */
static void test_template_paths(void **state)
{
	/* reasoning_content given: content is not split; shown only after the last query */
	struct sm70_chat_msg a[] = {
		MSG("user", "q1"),
		{ .role = "assistant", .content = "a1", .content_len = 2, .reasoning = "\nr1\n",
		  .reasoning_len = 4 },
		MSG("user", "q2"),
		{ .role = "assistant", .content = "\n\na2", .content_len = 4, .reasoning = "r2",
		  .reasoning_len = 2 },
	};
	expect(a, 4, 0,
	       "<|im_start|>user\nq1<|im_end|>\n<|im_start|>assistant\na1<|im_end|>\n"
	       "<|im_start|>user\nq2<|im_end|>\n"
	       "<|im_start|>assistant\n<think>\nr2\n</think>\n\na2<|im_end|>\n");

	/* <think> in content: the text after the last </think>, reasoning between the last
	 * <think> before the first </think> and it */
	struct sm70_chat_msg b[] = {
		MSG("user", "q"),
		MSG("assistant", "<think>\n\nx<think>\nr\n\n</think>\n\nmid</think>\n\nend"),
		MSG("assistant", "plain"),
	};
	expect(b, 3, 0,
	       "<|im_start|>user\nq<|im_end|>\n"
	       "<|im_start|>assistant\n<think>\nr\n</think>\n\nend<|im_end|>\n"
	       "<|im_start|>assistant\n<think>\n\n</think>\n\nplain<|im_end|>\n");

	/* tool results: consecutive ones share a user turn and are not the last query; a
	 * later system turn is rendered in place */
	struct sm70_chat_msg c[] = {
		MSG("system", "s"),
		MSG("user", "weather?"),
		MSG("assistant", "<think>calling</think>ok"),
		MSG("tool", "{\"t\": 20}"),
		MSG("tool", "{\"t\": 21}"),
		MSG("user", "<tool_response>\nraw\n</tool_response>"),
		MSG("system", "s2"),
	};
	expect(c, 7, SM70_CHAT_ADD_GENERATION_PROMPT | SM70_CHAT_NO_THINKING,
	       "<|im_start|>system\ns<|im_end|>\n<|im_start|>user\nweather?<|im_end|>\n"
	       "<|im_start|>assistant\n<think>\ncalling\n</think>\n\nok<|im_end|>\n"
	       "<|im_start|>user\n<tool_response>\n{\"t\": 20}\n</tool_response>\n"
	       "<tool_response>\n{\"t\": 21}\n</tool_response><|im_end|>\n"
	       "<|im_start|>user\n<tool_response>\nraw\n</tool_response><|im_end|>\n"
	       "<|im_start|>system\ns2<|im_end|>\n"
	       "<|im_start|>assistant\n<think>\n\n</think>\n\n");
}

static void test_bad_turns(void **state)
{
	struct sm70_chat_msg role[] = { MSG("user", "a"), MSG("robot", "b") };
	struct sm70_chat_msg utf8[] = { MSG("user", "caf\xe9") };
	struct sm70_chat_msg reasoning[] = {
		{ .role = "user", .content = "a", .content_len = 1, .reasoning = "r",
		  .reasoning_len = 1 },
	};
	struct sm70_text t = {0};
	struct sm70_err err = {{0}};

	assert_int_equal(sm70_chat_render(SM70_CHAT_QWEN3, role, 2, 0, &t, &err), -EINVAL);
	assert_string_equal(err.msg, "messages[1]: unknown role \"robot\" (system, user, "
			    "assistant or tool)");
	err.msg[0] = 0;
	assert_int_equal(sm70_chat_render(SM70_CHAT_QWEN3, utf8, 1, 0, &t, &err), -EINVAL);
	assert_string_equal(err.msg, "messages[0].content: invalid UTF-8 at byte 3");
	err.msg[0] = 0;
	assert_int_equal(sm70_chat_render(SM70_CHAT_QWEN3, reasoning, 1, 0, &t, &err), -EINVAL);
	assert_non_null(strstr(err.msg, "reasoning_content"));
	err.msg[0] = 0;
	assert_int_equal(sm70_chat_render(SM70_CHAT_QWEN3, role, 0, 0, &t, &err), -EINVAL);
	assert_non_null(strstr(err.msg, "empty"));
	err.msg[0] = 0;
	assert_int_equal(sm70_chat_render(SM70_CHAT_NONE, role, 1, 0, &t, &err), -ENOTSUP);
	assert_int_equal(t.len, 0);

	/* from JSON */
	const char *bad[] = {
		"{}", "[1]", "[{\"role\": \"user\"}]", "[{\"role\": 1, \"content\": \"x\"}]",
		"[{\"role\": \"user\\u0000x\", \"content\": \"x\"}]",
		"[{\"role\": \"assistant\", \"content\": \"x\", \"tool_calls\": [{}]}]",
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		json_t *j = json_loads(bad[i], JSON_ALLOW_NUL, NULL);
		struct sm70_chat_msg *m;
		size_t n;

		assert_non_null(j);
		err.msg[0] = 0;
		assert_int_equal(sm70_chat_msgs_from_json(j, &m, &n, &err), -EINVAL);
		assert_non_null(strstr(err.msg, "messages"));
		json_decref(j);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_reference),
		cmocka_unit_test(test_identify),
		cmocka_unit_test(test_template_paths),
		cmocka_unit_test(test_bad_turns),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
