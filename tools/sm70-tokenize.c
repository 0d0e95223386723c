/*
 * sm70-tokenize - text to token ids and back with a model's tokenizer.json, as JSON lines:
 * a stable interface for scripts and tests.
 *
 *   sm70-tokenize (-m MODEL_DIR | --tokenizer FILE)            {"text": ...} -> {"ids": [...]}
 *   sm70-tokenize (-m MODEL_DIR | --tokenizer FILE) --decode   {"ids": [...]} -> {"text": ...}
 *   sm70-tokenize (-m MODEL_DIR | --tokenizer FILE) --chat     {"messages": [...], ...} ->
 *                                                              {"text": ..., "ids": [...]}
 *   sm70-tokenize (...) --bench FILE [--repeat N]              encoding speed, one core
 *
 * One output line per input line, in order; a bad line (not JSON, not UTF-8, no "text")
 * answers {"error": "..."} (also on stderr) and the tool goes on. Blank lines are skipped.
 * Exit codes: 0 all lines done, 1 some line failed, 2 bad arguments or tokenizer.
 */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/version.h"
#include "text/chat.h"
#include "text/tokenizer.h"
#include "tools/cli/cli.h"

static void usage(FILE *f)
{
	fprintf(f,
		"usage: sm70-tokenize (-m|--model MODEL_DIR | --tokenizer FILE) [--decode | --chat]\n"
		"                     [--skip-special] [--special-as-text]\n"
		"       sm70-tokenize (-m MODEL_DIR | --tokenizer FILE) --bench FILE [--repeat N]\n"
		"       sm70-tokenize --help | --version\n"
		"Reads JSON lines on stdin: {\"text\": \"...\"} gives {\"ids\": [...]}; with\n"
		"--decode, {\"ids\": [...]} gives {\"text\": \"...\"}; with --chat,\n"
		"{\"messages\": [{\"role\": \"user\", \"content\": \"...\"}...],\n"
		" \"add_generation_prompt\": true, \"enable_thinking\": false} gives the prompt the\n"
		"model's chat template makes of it, {\"text\": \"...\", \"ids\": [...]} (the\n"
		"template comes from tokenizer_config.json or chat_template.jinja beside the\n"
		"tokenizer). A bad line gives {\"error\": \"...\"} and the next line is read.\n"
		"  -m, --model DIR      the model directory (its tokenizer.json)\n"
		"      --tokenizer FILE a tokenizer.json\n"
		"      --decode         ids to text\n"
		"      --chat           conversations to prompts\n"
		"      --skip-special   --decode: leave special tokens out\n"
		"      --special-as-text  encode: special tokens in the text stay text\n"
		"      --bench FILE     encode FILE and print MB/s (one core)\n"
		"      --repeat N       --bench passes (default 3)\n"
		"  -h, --help           this text\n");
}

/* Writes one JSON object {key: value} and a newline; value is stolen. */
static void put_json(const char *key, json_t *value)
{
	json_t *o = json_object();
	char *s;

	json_object_set_new(o, key, value);
	s = json_dumps(o, JSON_COMPACT);
	if (s) {
		fputs(s, stdout);
		fputc('\n', stdout);
		free(s);
	}
	json_decref(o);
}

static int line_error(long line, const char *fmt, const char *detail)
{
	char msg[600];

	snprintf(msg, sizeof(msg), "line %ld: ", line);
	snprintf(msg + strlen(msg), sizeof(msg) - strlen(msg), fmt, detail);
	fprintf(stderr, "sm70-tokenize: %s\n", msg);
	put_json("error", json_string(msg));
	return 1;
}

static void put_ids(const struct sm70_ids *ids)
{
	fputs("{\"ids\":[", stdout);
	for (size_t i = 0; i < ids->n; i++)
		printf(i ? ",%d" : "%d", ids->v[i]);
	fputs("]}\n", stdout);
}

/* {"messages": [...], "add_generation_prompt": bool, "enable_thinking": bool|null} ->
 * {"text": "...", "ids": [...]} */
static int chat_line(const struct sm70_tokenizer *tok, enum sm70_chat_format fmt, json_t *root,
		     long no, unsigned flags)
{
	json_t *gen = json_object_get(root, "add_generation_prompt");
	json_t *think = json_object_get(root, "enable_thinking");
	json_t *tools = json_object_get(root, "tools");
	struct sm70_err err = {{0}};
	struct sm70_text text = {0};
	struct sm70_ids ids = {0};
	struct sm70_chat_msg *m = NULL;
	unsigned cf = 0;
	size_t n;
	int rc = 0;

	if (!json_is_object(root))
		return line_error(no, "%s", "expected an object with a \"messages\" array");
	if (gen && !json_is_boolean(gen) && !json_is_null(gen))
		return line_error(no, "%s", "add_generation_prompt: expected true or false");
	if (think && !json_is_boolean(think) && !json_is_null(think))
		return line_error(no, "%s", "enable_thinking: expected true, false or null");
	if (tools && !json_is_null(tools) && !(json_is_array(tools) && !json_array_size(tools)))
		return line_error(no, "%s", "tools: not supported (no tool definitions in "
				  "the prompt)");
	if (json_is_true(gen))
		cf |= SM70_CHAT_ADD_GENERATION_PROMPT;
	if (json_is_false(think))
		cf |= SM70_CHAT_NO_THINKING;
	if (sm70_chat_msgs_from_json(json_object_get(root, "messages"), &m, &n, &err) ||
	    sm70_chat_render(fmt, m, n, cf, &text, &err) ||
	    sm70_tokenizer_encode(tok, text.s ? text.s : "", text.len, flags, &ids, &err)) {
		rc = line_error(no, "%s", err.msg);
	} else {
		json_t *o = json_object(), *arr = json_array();
		char *s;

		for (size_t i = 0; i < ids.n; i++)
			json_array_append_new(arr, json_integer(ids.v[i]));
		json_object_set_new(o, "text", json_stringn(text.s, text.len));
		json_object_set_new(o, "ids", arr);
		s = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
		if (s) {
			fputs(s, stdout);
			fputc('\n', stdout);
			free(s);
		}
		json_decref(o);
	}
	free(m);
	sm70_text_free(&text);
	sm70_ids_free(&ids);
	return rc;
}

static int do_line(const struct sm70_tokenizer *tok, const char *line, size_t len, long no,
		   int decode, enum sm70_chat_format chat, unsigned flags)
{
	size_t bad = sm70_utf8_check(line, len);
	json_error_t je;
	json_t *root, *v;
	struct sm70_err err = {{0}};
	char where[64];
	int rc = 0;

	if (bad != len) {
		snprintf(where, sizeof(where), "%zu", bad);
		return line_error(no, "invalid UTF-8 at byte %s", where);
	}
	root = json_loadb(line, len, JSON_ALLOW_NUL, &je);
	if (!root)
		return line_error(no, "invalid JSON: %s", je.text);
	if (chat) {
		rc = chat_line(tok, chat, root, no, flags);
	} else if (!decode) {
		struct sm70_ids ids = {0};

		v = json_object_get(root, "text");
		if (!json_is_string(v)) {
			rc = line_error(no, "%s", "expected an object with a \"text\" string");
		} else if (sm70_tokenizer_encode(tok, json_string_value(v), json_string_length(v),
						 flags, &ids, &err)) {
			rc = line_error(no, "%s", err.msg);
		} else {
			put_ids(&ids);
		}
		sm70_ids_free(&ids);
	} else {
		struct sm70_text text = {0};
		size_t n;
		int32_t *ids;

		v = json_object_get(root, "ids");
		n = json_array_size(v);
		ids = malloc((n ? n : 1) * sizeof(*ids));
		if (!json_is_array(v) || !ids) {
			rc = line_error(no, "%s", "expected an object with an \"ids\" array");
		} else {
			for (size_t i = 0; i < n && !rc; i++) {
				json_t *x = json_array_get(v, i);
				json_int_t id = json_integer_value(x);

				if (!json_is_integer(x) || id < 0 || id > INT32_MAX) {
					snprintf(where, sizeof(where), "%zu", i);
					rc = line_error(no, "ids[%s] is not a token id", where);
				}
				ids[i] = (int32_t)id;
			}
			if (!rc && sm70_tokenizer_decode(tok, ids, n, flags, &text, &err))
				rc = line_error(no, "%s", err.msg);
			else if (!rc)
				put_json("text", json_stringn(text.s ? text.s : "", text.len));
		}
		free(ids);
		sm70_text_free(&text);
	}
	json_decref(root);
	return rc;
}

/* Encodes FILE whole and line by line, `repeat` times each, and prints MB/s (one core). */
static int bench(const struct sm70_tokenizer *tok, const char *path, int repeat)
{
	FILE *f = fopen(path, "rb");
	struct sm70_text file = {0};
	struct sm70_ids ids = {0};
	struct sm70_err err = {{0}};
	size_t len, lines = 0, tokens_whole = 0, tokens_lines = 0, got;
	double t0, t_whole, t_lines;
	char chunk[65536], *buf;

	if (!f) {
		fprintf(stderr, "sm70-tokenize: %s: %s\n", path, strerror(errno));
		return 2;
	}
	while ((got = fread(chunk, 1, sizeof(chunk), f)) > 0)
		if (sm70_text_append(&file, chunk, got)) {
			fclose(f);
			sm70_text_free(&file);
			fprintf(stderr, "sm70-tokenize: %s: out of memory\n", path);
			return 2;
		}
	fclose(f);
	buf = file.s ? file.s : "";
	len = file.len;
	/* a first pass unmeasured: page faults and caches */
	if (sm70_tokenizer_encode(tok, buf, len, 0, &ids, &err)) {
		fprintf(stderr, "sm70-tokenize: %s: %s\n", path, err.msg);
		sm70_text_free(&file);
		return 2;
	}
	t0 = sm70__cli_now_s();
	for (int r = 0; r < repeat; r++) {
		ids.n = 0;
		sm70_tokenizer_encode(tok, buf, len, 0, &ids, NULL);
		tokens_whole = ids.n;
	}
	t_whole = sm70__cli_now_s() - t0;
	t0 = sm70__cli_now_s();
	for (int r = 0; r < repeat; r++) {
		const char *p = buf, *e = buf + len;

		tokens_lines = 0;
		lines = 0;
		while (p < e) {
			const char *nl = memchr(p, '\n', (size_t)(e - p));
			size_t l = nl ? (size_t)(nl - p) + 1 : (size_t)(e - p);

			ids.n = 0;
			sm70_tokenizer_encode(tok, p, l, 0, &ids, NULL);
			tokens_lines += ids.n;
			lines++;
			p += l;
		}
	}
	t_lines = sm70__cli_now_s() - t0;
	printf("{\"bytes\":%zu,\"lines\":%zu,\"repeat\":%d,"
	       "\"whole\":{\"tokens\":%zu,\"seconds\":%.4f,\"mb_per_s\":%.2f},"
	       "\"per_line\":{\"tokens\":%zu,\"seconds\":%.4f,\"mb_per_s\":%.2f}}\n",
	       len, lines, repeat, tokens_whole, t_whole, len * (double)repeat / t_whole / 1e6,
	       tokens_lines, t_lines, len * (double)repeat / t_lines / 1e6);
	sm70_ids_free(&ids);
	sm70_text_free(&file);
	return 0;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{"model", required_argument, NULL, 'm'},
		{"tokenizer", required_argument, NULL, 't'},
		{"decode", no_argument, NULL, 'd'},
		{"chat", no_argument, NULL, 'c'},
		{"skip-special", no_argument, NULL, 's'},
		{"special-as-text", no_argument, NULL, 'S'},
		{"bench", required_argument, NULL, 'b'},
		{"repeat", required_argument, NULL, 'r'},
		{"help", no_argument, NULL, 'h'},
		{"version", no_argument, NULL, 'V'},
		{NULL, 0, NULL, 0},
	};
	const char *model = NULL, *file = NULL, *bench_file = NULL;
	struct sm70_tokenizer *tok = NULL;
	struct sm70_err err = {{0}};
	unsigned flags = 0;
	enum sm70_chat_format chat = SM70_CHAT_NONE;
	int decode = 0, want_chat = 0, repeat = 3, c, failed = 0, rc;
	char *line = NULL;
	size_t cap = 0;
	ssize_t len;
	long no = 0;
	double x;

	while ((c = getopt_long(argc, argv, "m:h", opts, NULL)) != -1) {
		switch (c) {
		case 'm': model = optarg; break;
		case 't': file = optarg; break;
		case 'd': decode = 1; break;
		case 'c': want_chat = 1; break;
		case 's': flags |= SM70_TOK_SKIP_SPECIAL; break;
		case 'S': flags |= SM70_TOK_SPECIAL_AS_TEXT; break;
		case 'b': bench_file = optarg; break;
		case 'r':
			if (sm70__cli_parse_int(optarg, 1, 1e6, &x)) {
				fprintf(stderr, "sm70-tokenize: --repeat %s: not a count\n", optarg);
				return 2;
			}
			repeat = (int)x;
			break;
		case 'h': usage(stdout); return 0;
		case 'V': sm70_print_version(stdout, "sm70-tokenize"); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (optind != argc || !model == !file) {
		fprintf(stderr, "sm70-tokenize: give one of -m MODEL_DIR or --tokenizer FILE\n");
		usage(stderr);
		return 2;
	}
	if (decode && want_chat) {
		fprintf(stderr, "sm70-tokenize: --decode and --chat exclude each other\n");
		return 2;
	}
	if (want_chat && (flags & SM70_TOK_SPECIAL_AS_TEXT)) {
		/* it would turn the template's own <|im_start|> into text too */
		fprintf(stderr, "sm70-tokenize: --special-as-text does not go with --chat (the "
			"template's special tokens must stay tokens)\n");
		return 2;
	}
	rc = model ? sm70_tokenizer_load_dir(model, &tok, &err) :
		     sm70_tokenizer_load(file, &tok, &err);
	if (rc) {
		fprintf(stderr, "sm70-tokenize: %s\n", err.msg);
		return 2;
	}
	if (want_chat) {
		/* the template sits beside the tokenizer: MODEL_DIR, or FILE's directory */
		char dir[4096], *slash;

		snprintf(dir, sizeof(dir), "%s", model ? model : file);
		if (!model && (slash = strrchr(dir, '/')))
			*slash = 0;
		else if (!model)
			strcpy(dir, ".");
		rc = sm70_chat_load_dir(dir, &chat, &err);
		if (rc) {
			fprintf(stderr, "sm70-tokenize: --chat: %s\n", err.msg);
			sm70_tokenizer_free(tok);
			return 2;
		}
	}
	if (bench_file) {
		rc = bench(tok, bench_file, repeat);
		sm70_tokenizer_free(tok);
		return rc;
	}
	while ((len = getline(&line, &cap, stdin)) >= 0) {
		size_t n = (size_t)len;

		no++;
		while (n && (line[n - 1] == '\n' || line[n - 1] == '\r'))
			n--;
		if (!n || strspn(line, " \t") == n)
			continue;
		failed |= do_line(tok, line, n, no, decode, chat, flags);
		fflush(stdout);
	}
	free(line);
	sm70_tokenizer_free(tok);
	return failed ? 1 : 0;
}
