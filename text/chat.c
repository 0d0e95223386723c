/*
 * chat.c - chat formats; see chat.h.
 *
 * A template is recognised by the FNV-1a 64 hash of its exact text: two templates that
 * differ in one character may render differently, so "looks like ChatML" is not enough to
 * promise byte equality. Each format below is the template's logic written out in C, with
 * Python's string semantics where the template uses them (split, strip, startswith).
 */
#include "text/chat.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The templates implemented, by hash. The Qwen3 one is what Qwen3 checkpoints ship
 * (tests/fixtures/tokenizer/qwen3-tokenizer_config.json, 4,116 bytes). */
static const struct {
	uint64_t hash;
	enum sm70_chat_format format;
} known[] = {
	{ 0x2bfdb7aa9754484eull, SM70_CHAT_QWEN3 },
};

static uint64_t fnv1a64(const char *s, size_t n)
{
	uint64_t h = 0xcbf29ce484222325ull;

	for (size_t i = 0; i < n; i++)
		h = (h ^ (uint8_t)s[i]) * 0x100000001b3ull;
	return h;
}

const char *sm70_chat_format_name(enum sm70_chat_format f)
{
	switch (f) {
	case SM70_CHAT_QWEN3: return "qwen3";
	case SM70_CHAT_NONE: break;
	}
	return "none";
}

int sm70_chat_identify(const char *tmpl, size_t len, enum sm70_chat_format *out,
		       struct sm70_err *err)
{
	uint64_t h;

	*out = SM70_CHAT_NONE;
	if (len && tmpl[len - 1] == '\n')
		len--;
	h = fnv1a64(tmpl, len);
	for (size_t i = 0; i < sizeof(known) / sizeof(known[0]); i++)
		if (known[i].hash == h) {
			*out = known[i].format;
			return 0;
		}
	return sm70_errf(err, -ENOTSUP,
			 "chat template fnv1a64:%016llx (%zu bytes) is not supported (supported: "
			 "qwen3, the template of Qwen3 checkpoints); send a raw prompt instead",
			 (unsigned long long)h, len);
}

/* tokenizer_config.json's chat_template: a string, or [{"name", "template"}...] of which
 * transformers uses "default". Returns 0 with the text in s, n (borrowed from root), -ENOENT, -EINVAL. */
static int config_template(json_t *root, const char *path, const char **s, size_t *n,
			   struct sm70_err *err)
{
	json_t *t = json_object_get(root, "chat_template");
	size_t i;
	json_t *e;

	if (!t || json_is_null(t))
		return -ENOENT;
	if (json_is_string(t)) {
		*s = json_string_value(t);
		*n = json_string_length(t);
		return 0;
	}
	if (json_is_array(t)) {
		json_array_foreach(t, i, e) {
			json_t *name = json_object_get(e, "name"), *tt = json_object_get(e, "template");

			if (json_is_string(name) && !strcmp(json_string_value(name), "default") &&
			    json_is_string(tt)) {
				*s = json_string_value(tt);
				*n = json_string_length(tt);
				return 0;
			}
		}
		return sm70_errf(err, -ENOTSUP, "%s: chat_template has no \"default\" entry", path);
	}
	return sm70_errf(err, -EINVAL, "%s: chat_template is neither a string nor a list", path);
}

static int read_file(const char *path, char **out, size_t *len)
{
	FILE *f = fopen(path, "rb");
	struct sm70_text t = {0};
	char buf[8192];
	size_t got;
	int rc = 0;

	if (!f)
		return -errno;
	while (!rc && (got = fread(buf, 1, sizeof(buf), f)) > 0)
		rc = sm70_text_append(&t, buf, got);
	if (!rc && ferror(f))
		rc = -EIO;
	fclose(f);
	if (rc) {
		sm70_text_free(&t);
		return rc;
	}
	*out = t.s ? t.s : strdup("");
	*len = t.len;
	return *out ? 0 : -ENOMEM;
}

int sm70_chat_load_dir(const char *dir, enum sm70_chat_format *out, struct sm70_err *err)
{
	char path[4096];
	json_error_t je;
	json_t *root;
	const char *s = NULL;
	char *file = NULL;
	size_t n = 0;
	int rc;

	*out = SM70_CHAT_NONE;
	if ((size_t)snprintf(path, sizeof(path), "%s/tokenizer_config.json", dir) >= sizeof(path))
		return sm70_errf(err, -ENAMETOOLONG, "%s: path too long", dir);
	root = json_load_file(path, 0, &je);
	if (!root && je.position) /* a file that is there but not JSON */
		return sm70_errf(err, -EINVAL, "%s: line %d: %s", path, je.line, je.text);
	if (root) {
		rc = config_template(root, path, &s, &n, err);
		if (rc == 0)
			rc = sm70_chat_identify(s, n, out, err);
		json_decref(root);
		if (rc != -ENOENT)
			return rc;
	}
	snprintf(path, sizeof(path), "%s/chat_template.jinja", dir);
	rc = read_file(path, &file, &n);
	if (rc == -ENOENT)
		return sm70_errf(err, -ENOENT, "%s has no chat template (no chat_template in "
				 "tokenizer_config.json, no chat_template.jinja)", dir);
	if (rc)
		return sm70_errf(err, rc, "%s: %s", path, strerror(-rc));
	rc = sm70_chat_identify(file, n, out, err);
	free(file);
	return rc;
}

/* ---- Python string operations, on (pointer, length) ---------------------------------- */

struct str {
	const char *s;
	size_t n;
};

static struct str str_of(const char *s, size_t n)
{
	return (struct str){ s, n };
}

static struct str lstrip_nl(struct str x)
{
	while (x.n && x.s[0] == '\n') {
		x.s++;
		x.n--;
	}
	return x;
}

static struct str rstrip_nl(struct str x)
{
	while (x.n && x.s[x.n - 1] == '\n')
		x.n--;
	return x;
}

static int has_prefix(struct str x, const char *p)
{
	size_t n = strlen(p);

	return x.n >= n && !memcmp(x.s, p, n);
}

static int has_suffix(struct str x, const char *p)
{
	size_t n = strlen(p);

	return x.n >= n && !memcmp(x.s + x.n - n, p, n);
}

/* Offset of the first (last when `last`) occurrence of p in x, or -1. */
static long find(struct str x, const char *p, int last)
{
	size_t n = strlen(p);
	long at = -1;

	for (size_t i = 0; i + n <= x.n; i++)
		if (!memcmp(x.s + i, p, n)) {
			at = (long)i;
			if (!last)
				break;
		}
	return at;
}

/* x.split(sep)[-1] and x.split(sep)[0] */
static struct str after_last(struct str x, const char *sep)
{
	long at = find(x, sep, 1);

	return at < 0 ? x : str_of(x.s + at + strlen(sep), x.n - (size_t)at - strlen(sep));
}

static struct str before_first(struct str x, const char *sep)
{
	long at = find(x, sep, 0);

	return at < 0 ? x : str_of(x.s, (size_t)at);
}

/* ---- Qwen3 ------------------------------------------------------------------------------ */

static int put(struct sm70_text *out, const char *s)
{
	return sm70_text_append(out, s, strlen(s));
}

static int put_str(struct sm70_text *out, struct str x)
{
	return sm70_text_append(out, x.s, x.n);
}

static int is_role(const struct sm70_chat_msg *m, const char *role)
{
	return !strcmp(m->role, role);
}

/* A user turn that only carries tool output does not count as the last query. */
static int is_tool_response(const struct sm70_chat_msg *m)
{
	struct str c = str_of(m->content, m->content_len);

	return has_prefix(c, "<tool_response>") && has_suffix(c, "</tool_response>");
}

static int qwen3_assistant(const struct sm70_chat_msg *m, int after_query, int last,
			   struct sm70_text *out)
{
	struct str content = str_of(m->content, m->content_len), reasoning = str_of("", 0);
	int rc = 0;

	if (m->reasoning) {
		reasoning = str_of(m->reasoning, m->reasoning_len);
	} else if (find(content, "</think>", 0) >= 0) {
		struct str whole = content;

		content = lstrip_nl(after_last(whole, "</think>"));
		reasoning = lstrip_nl(after_last(rstrip_nl(before_first(whole, "</think>")),
						 "<think>"));
	}
	rc |= put(out, "<|im_start|>assistant\n");
	/* reasoning is shown only after the last user query: in the turn being continued,
	 * or in the tool-calling turns that follow that query */
	if (after_query && (last || reasoning.n)) {
		rc |= put(out, "<think>\n");
		rc |= put_str(out, rstrip_nl(lstrip_nl(reasoning)));
		rc |= put(out, "\n</think>\n\n");
		rc |= put_str(out, lstrip_nl(content));
	} else {
		rc |= put_str(out, content);
	}
	rc |= put(out, "<|im_end|>\n");
	return rc ? -ENOMEM : 0;
}

static int render_qwen3(const struct sm70_chat_msg *m, size_t n, unsigned flags,
			struct sm70_text *out)
{
	size_t last_query = n - 1;
	int rc = 0;

	if (is_role(&m[0], "system")) {
		rc |= put(out, "<|im_start|>system\n");
		rc |= sm70_text_append(out, m[0].content, m[0].content_len);
		rc |= put(out, "<|im_end|>\n");
	}
	for (size_t i = n; i-- > 0;)
		if (is_role(&m[i], "user") && !is_tool_response(&m[i])) {
			last_query = i;
			break;
		}
	for (size_t i = 0; i < n && !rc; i++) {
		if (is_role(&m[i], "user") || (is_role(&m[i], "system") && i)) {
			rc |= put(out, "<|im_start|>");
			rc |= put(out, m[i].role);
			rc |= put(out, "\n");
			rc |= sm70_text_append(out, m[i].content, m[i].content_len);
			rc |= put(out, "<|im_end|>\n");
		} else if (is_role(&m[i], "assistant")) {
			rc |= qwen3_assistant(&m[i], i > last_query, i + 1 == n, out);
		} else if (is_role(&m[i], "tool")) {
			/* consecutive tool results share one user turn */
			if (!i || !is_role(&m[i - 1], "tool"))
				rc |= put(out, "<|im_start|>user");
			rc |= put(out, "\n<tool_response>\n");
			rc |= sm70_text_append(out, m[i].content, m[i].content_len);
			rc |= put(out, "\n</tool_response>");
			if (i + 1 == n || !is_role(&m[i + 1], "tool"))
				rc |= put(out, "<|im_end|>\n");
		}
	}
	if (!rc && (flags & SM70_CHAT_ADD_GENERATION_PROMPT)) {
		rc |= put(out, "<|im_start|>assistant\n");
		if (flags & SM70_CHAT_NO_THINKING)
			rc |= put(out, "<think>\n\n</think>\n\n");
	}
	return rc ? -ENOMEM : 0;
}

int sm70_chat_render(enum sm70_chat_format f, const struct sm70_chat_msg *msgs, size_t n,
		     unsigned flags, struct sm70_text *out, struct sm70_err *err)
{
	static const char *const roles[] = { "system", "user", "assistant", "tool" };
	size_t bad, start = out->len;
	int rc;

	if (f != SM70_CHAT_QWEN3)
		return sm70_errf(err, -ENOTSUP, "no chat format (the model's template is not "
				 "supported); send a raw prompt instead");
	if (!n)
		return sm70_errf(err, -EINVAL, "messages: empty (at least one is needed)");
	for (size_t i = 0; i < n; i++) {
		const struct sm70_chat_msg *m = &msgs[i];
		size_t r = 0;

		if (!m->role)
			return sm70_errf(err, -EINVAL, "messages[%zu]: no role", i);
		while (r < sizeof(roles) / sizeof(roles[0]) && strcmp(m->role, roles[r]))
			r++;
		if (r == sizeof(roles) / sizeof(roles[0]))
			return sm70_errf(err, -EINVAL, "messages[%zu]: unknown role \"%.40s\" "
					 "(system, user, assistant or tool)", i, m->role);
		if (!m->content && m->content_len)
			return sm70_errf(err, -EINVAL, "messages[%zu]: no content", i);
		if ((bad = sm70_utf8_check(m->content, m->content_len)) != m->content_len)
			return sm70_errf(err, -EINVAL, "messages[%zu].content: invalid UTF-8 at "
					 "byte %zu", i, bad);
		if (m->reasoning && !is_role(m, "assistant"))
			return sm70_errf(err, -EINVAL, "messages[%zu]: reasoning_content on a %s "
					 "turn (assistant turns only)", i, m->role);
		if (m->reasoning &&
		    (bad = sm70_utf8_check(m->reasoning, m->reasoning_len)) != m->reasoning_len)
			return sm70_errf(err, -EINVAL, "messages[%zu].reasoning_content: invalid "
					 "UTF-8 at byte %zu", i, bad);
	}
	rc = render_qwen3(msgs, n, flags, out);
	if (rc) {
		out->len = start;
		if (out->s)
			out->s[start] = 0;
		return sm70_errf(err, rc, "out of memory rendering the chat");
	}
	return 0;
}
