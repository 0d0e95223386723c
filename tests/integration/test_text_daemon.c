/*
 * test_text_daemon - text in, text out through a real sm70d (CPU backend): the tiny qwen3
 * fixture in a model directory that also holds the real Qwen3 tokenizer (its 512 ids are
 * the first 512 of Qwen3's), the SDK finding it through the daemon's model directory
 * (protocol 1.2), and concurrent clients whose jobs carry stop strings.
 *
 * A random model emits arbitrary tokens, so the stop strings come from a first greedy run:
 * one spanning two tokens' text, one a non-ASCII character (a U+FFFD of the bytes the model
 * strings together, or a real one) behind a stop string that never matches. Every event's
 * text must be whole UTF-8, the texts must add up to the tokenizer's decode of the tokens,
 * and a stopped job must end exactly before its stop, with no token after it handed out.
 */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "sm70/client.h"
#include "tests/integration/daemon_util.h"
#include "text/tokenizer.h"

#define PROMPT "in on the"   /* Qwen3 ids 258 389 279: below the fixture's 512 */
#define MAX_NEW 48
#define N_CLIENTS 4
#define ROUNDS 2

static struct sm70t_daemon D;
static char model[64];
static struct sm70_tokenizer *tok;

/* The reference run: its text, tokens and where each token's text begins. */
static char F[8192];
static size_t F_len;
static uint32_t F_tok[MAX_NEW];
static size_t F_off[MAX_NEW + 1];
static uint32_t F_n;

/* The stop cases chosen from it. */
static char S1[8], S2[8];
static size_t S1_at, S2_at;     /* where each first occurs in F */
static uint32_t S1_tokens, S2_tokens; /* tokens handed out up to the one completing it */

/* What one job gave the application. */
struct out {
	uint64_t id;
	char text[8192];
	size_t len;
	uint32_t tokens[MAX_NEW];
	uint32_t n;
	uint32_t reason;
	int stop_index, done, bad;
	char why[160];
};

static void note(struct out *o, const char *why)
{
	if (!o->bad)
		snprintf(o->why, sizeof(o->why), "%s", why);
	o->bad = 1;
}

/* Adds one event to o: text must be whole UTF-8, nothing may follow the final event. */
static void take(struct out *o, const struct sm70_event *ev)
{
	if (o->done)
		note(o, "an event after the final one");
	if (!ev->text)
		note(o, "an event without text");
	else if (sm70_utf8_check(ev->text, ev->text_len) != ev->text_len)
		note(o, "an event's text is not whole UTF-8 (a split character)");
	else if (o->len + ev->text_len < sizeof(o->text)) {
		memcpy(o->text + o->len, ev->text, ev->text_len);
		o->len += ev->text_len;
	}
	if (ev->type == SM70_EVENT_TOKEN && o->n < MAX_NEW)
		o->tokens[o->n++] = ev->token;
	if (ev->flags & SM70_EVENT_FINAL) {
		o->done = 1;
		o->reason = ev->type == SM70_EVENT_FINISH ? ev->finish_reason : 0;
		o->stop_index = ev->stop_index;
	}
}

static void job_defaults(struct sm70_job *j)
{
	sm70_job_init(j);
	j->max_tokens = MAX_NEW;
	j->flags = SM70_JOB_IGNORE_EOS;
}

/* ---- setup: the model directory and the daemon ------------------------------------------ */

static int setup(void **state)
{
	static const char *const files[] = { "config.json", "generation_config.json",
					     "model.safetensors" };
	char cwd[4096], a[4400], b[256], cmd[512];
	struct sm70_err err = {{0}};

	assert_non_null(getcwd(cwd, sizeof(cwd)));
	strcpy(model, "/tmp/sm70tt-XXXXXX");
	assert_non_null(mkdtemp(model));
	for (size_t i = 0; i < 3; i++) {
		snprintf(a, sizeof(a), "%s/" SM70T_DEFAULT_MODEL "/%s", cwd, files[i]);
		snprintf(b, sizeof(b), "%s/%s", model, files[i]);
		assert_int_equal(symlink(a, b), 0);
	}
	snprintf(cmd, sizeof(cmd), "gzip -dc tests/fixtures/tokenizer/qwen3-tokenizer.json.gz "
		 ">%s/tokenizer.json && cp tests/fixtures/tokenizer/qwen3-tokenizer_config.json "
		 "%s/tokenizer_config.json", model, model);
	assert_int_equal(system(cmd), 0);
	if (sm70_tokenizer_load_dir(model, &tok, &err))
		fail_msg("%s", err.msg);
	assert_int_equal(sm70t_daemon_start_model(&D, model, NULL, NULL), 0);
	return 0;
}

static int teardown(void **state)
{
	char cmd[128];

	sm70t_daemon_finish(&D, 5000);
	sm70_tokenizer_free(tok);
	snprintf(cmd, sizeof(cmd), "rm -rf %s", model);
	return system(cmd) == 0 ? 0 : -1;
}

static struct sm70_client *connect_to_daemon(void)
{
	struct sm70_client *c = NULL;
	int rc = sm70_client_connect(&c, D.sock, NULL);

	if (rc)
		fail_msg("connect: %s", c ? sm70_client_last_error(c) : sm70_strerror(rc));
	return c;
}

/* ---- the reference run, and the stop strings chosen from it ----------------------------- */

static int plain_ascii(char ch)
{
	return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
	       ch == ' ';
}

static void test_reference(void **state)
{
	struct sm70_client *c = connect_to_daemon();
	struct sm70_text_prompt p;
	struct sm70_event ev = { .size = sizeof(ev) };
	struct sm70_text dec = {0};
	struct sm70_job j;
	struct out o = {0};
	uint64_t id;
	int held = 0;

	/* the tokenizer comes from the daemon's model directory (protocol 1.2) */
	assert_int_equal(sm70_client_tokenizer(c, NULL), 0);
	assert_int_equal(sm70_client_tokenizer(c, NULL), -EALREADY);
	job_defaults(&j);
	sm70_text_prompt_init(&p);
	p.text = PROMPT;
	assert_int_equal(sm70_submit_text(c, &j, &p, &id), 0);
	while (!o.done) {
		assert_int_equal(sm70_next_event(c, &ev, 10000), 0);
		assert_true(ev.job_id == id);
		if (ev.type == SM70_EVENT_TOKEN) {
			F_off[ev.index] = o.len;
			held += ev.text_len == 0;
		}
		take(&o, &ev);
	}
	if (o.bad)
		fail_msg("reference run: %s", o.why);
	assert_int_equal(o.reason, SM70_REASON_LENGTH);
	assert_int_equal(o.n, MAX_NEW);
	assert_int_equal(o.stop_index, -1);
	memcpy(F, o.text, o.len);
	F_len = o.len;
	F_off[o.n] = o.len;
	memcpy(F_tok, o.tokens, sizeof(F_tok));
	F_n = o.n;
	/* the deltas add up to the one-shot decode */
	assert_int_equal(sm70_tokenizer_decode(tok, (const int32_t *)F_tok, F_n,
					       SM70_TOK_SKIP_SPECIAL, &dec, NULL), 0);
	assert_int_equal(dec.len, F_len);
	assert_memory_equal(dec.s, F, F_len);
	sm70_text_free(&dec);
	print_message("reference: %u tokens, %zu bytes of text, %d tokens added no text at "
		      "once (inside a character)\n", F_n, F_len, held);

	/* S1: two ASCII characters across a token boundary, first seen there */
	for (uint32_t k = 1; k + 1 < F_n && !S1[0]; k++) {
		size_t a = F_off[k + 1] - 1;

		if (F_off[k + 1] <= F_off[k] || F_off[k + 1] >= F_off[k + 2] ||
		    !plain_ascii(F[a]) || !plain_ascii(F[a + 1]))
			continue;
		memcpy(S1, F + a, 2);
		if ((size_t)(strstr(F, S1) - F) != a) {
			S1[0] = 0;
			continue;
		}
		S1_at = a;
		S1_tokens = k + 2;
	}
	/* S2: the first non-ASCII character */
	for (size_t i = 0; i < F_len && !S2[0]; i++) {
		size_t n;

		if ((unsigned char)F[i] < 0x80)
			continue;
		sm70__utf8_get((const uint8_t *)F + i, &n);
		memcpy(S2, F + i, n);
		S2_at = i;
		for (uint32_t k = 0; k < F_n; k++)
			if (F_off[k + 1] >= i + n) {
				S2_tokens = k + 1;
				break;
			}
	}
	if (!S1[0] || !S2[0])
		fail_msg("the greedy text has no two-token ASCII pair or no non-ASCII character: "
			 "choose another prompt");
	print_message("stops: \"%s\" at byte %zu (token %u), \"%s\" at byte %zu (token %u)\n",
		      S1, S1_at, S1_tokens, S2, S2_at, S2_tokens);

	/* A stop string that the text's last character begins: that character is held back
	 * to the end and comes with the FINISH, and the job ends by length, text complete. */
	{
		struct out o2 = {0};
		size_t last = F_len - 1, n;
		char s3[16];
		const char *const stops[] = { s3 };
		int finish_text = 0;

		while (last && ((unsigned char)F[last] & 0xC0) == 0x80)
			last--;
		sm70__utf8_get((const uint8_t *)F + last, &n);
		memcpy(s3, F + last, n);
		strcpy(s3 + n, "\x7f!");
		p.stop = stops;
		p.n_stop = 1;
		assert_int_equal(sm70_submit_text(c, &j, &p, &id), 0);
		while (!o2.done) {
			assert_int_equal(sm70_next_event(c, &ev, 10000), 0);
			if (ev.type == SM70_EVENT_FINISH)
				finish_text = (int)ev.text_len;
			take(&o2, &ev);
		}
		if (o2.bad)
			fail_msg("held-back end: %s", o2.why);
		assert_int_equal(o2.reason, SM70_REASON_LENGTH);
		assert_int_equal(o2.len, F_len);
		assert_memory_equal(o2.text, F, F_len);
		assert_true(finish_text >= (int)n);
		print_message("a stop string begun by the last character: %d bytes held back "
			      "to the FINISH, text complete\n", finish_text);
	}
	sm70_client_close(c);
}

/* ---- concurrent clients, each with three jobs in flight --------------------------------- */

static const char *const stops_a[] = { S1 };
static const char *const stops_b[] = { "never in it \xc2\xa7", S2 };

/* Checks o against the reference: the text before the stop, the tokens up to it. */
static void check(struct out *o, int which)
{
	size_t want_len = which == 0 ? F_len : which == 1 ? S1_at : S2_at;
	uint32_t want_n = which == 0 ? F_n : which == 1 ? S1_tokens : S2_tokens;
	char why[160];

	if (o->bad)
		return;
	if (o->len != want_len || memcmp(o->text, F, want_len)) {
		snprintf(why, sizeof(why), "job %d: %zu bytes of text, want %zu", which, o->len,
			 want_len);
		note(o, why);
	} else if (o->n != want_n || memcmp(o->tokens, F_tok, want_n * sizeof(F_tok[0]))) {
		snprintf(why, sizeof(why), "job %d: %u tokens handed out, want %u", which, o->n,
			 want_n);
		note(o, why);
	} else if (o->reason != (which ? SM70_REASON_STOP_STRING : SM70_REASON_LENGTH) ||
		   o->stop_index != (which ? which - 1 : -1)) {
		snprintf(why, sizeof(why), "job %d: reason %u stop_index %d", which, o->reason,
			 o->stop_index);
		note(o, why);
	}
}

struct client_run {
	int index;
	char why[200];
	int events;
};

static int on_event(void *ctx, const struct sm70_event *ev)
{
	take(ctx, ev);
	return 0;
}

static void *client_thread(void *arg)
{
	struct client_run *cr = arg;
	struct sm70_client *c = NULL;
	struct sm70_event ev = { .size = sizeof(ev) };
	struct sm70_text_prompt p[3];
	struct sm70_result res = { .size = sizeof(res) };
	struct sm70_job j;

	if (sm70_client_connect(&c, D.sock, NULL)) {
		snprintf(cr->why, sizeof(cr->why), "connect failed");
		sm70_client_close(c);
		return NULL;
	}
	job_defaults(&j);
	for (int i = 0; i < 3; i++) {
		sm70_text_prompt_init(&p[i]);
		p[i].text = PROMPT;
	}
	p[1].stop = stops_a;
	p[1].n_stop = 1;
	p[2].stop = stops_b;
	p[2].n_stop = 2;
	for (int round = 0; round < ROUNDS && !cr->why[0]; round++) {
		struct out *o = calloc(3, sizeof(*o));
		int left = 3, rc = 0;

		/* round 0: three jobs in flight on one handle, read with sm70_next_event;
		 * round 1: two in flight while sm70_generate_text runs the third (it holds
		 * their events for sm70_next_event) */
		for (int i = 0; i < 3 && !rc; i++)
			if (round == 0 || i != 1)
				rc = sm70_submit_text(c, &j, &p[i], &o[i].id);
		if (!rc && round == 1) {
			rc = sm70_generate_text(c, &j, &p[1], on_event, &o[1], &res);
			o[1].done = 1;
			o[1].reason = res.finish_reason;
			o[1].stop_index = res.stop_index;
			left--;
		}
		while (!rc && left) {
			rc = sm70_next_event(c, &ev, 10000);
			for (int i = 0; i < 3 && !rc; i++)
				if (o[i].id == ev.job_id) {
					take(&o[i], &ev);
					left -= o[i].done;
					cr->events++;
				}
		}
		for (int i = 0; i < 3; i++) {
			check(&o[i], i);
			if (rc)
				snprintf(cr->why, sizeof(cr->why), "client %d round %d: %s (%s)",
					 cr->index, round, sm70_strerror(rc),
					 sm70_client_last_error(c));
			else if (o[i].bad && !cr->why[0])
				snprintf(cr->why, sizeof(cr->why), "client %d round %d: %s",
					 cr->index, round, o[i].why);
		}
		free(o);
	}
	sm70_client_close(c);
	return NULL;
}

static void test_concurrent_stops(void **state)
{
	pthread_t th[N_CLIENTS];
	struct client_run cr[N_CLIENTS];
	int events = 0;

	memset(cr, 0, sizeof(cr));
	for (int i = 0; i < N_CLIENTS; i++) {
		cr[i].index = i;
		assert_int_equal(pthread_create(&th[i], NULL, client_thread, &cr[i]), 0);
	}
	for (int i = 0; i < N_CLIENTS; i++) {
		pthread_join(th[i], NULL);
		if (cr[i].why[0])
			fail_msg("%s", cr[i].why);
		events += cr[i].events;
	}
	print_message("%d clients x %d rounds x 3 jobs: every event whole UTF-8, stopped jobs "
		      "end before their stop, %d events\n", N_CLIENTS, ROUNDS, events);
}

/* ---- bad input gets a clear error; a chat renders and the daemon judges its ids ---------- */

static void test_errors(void **state)
{
	struct sm70_client *c = connect_to_daemon();
	struct sm70_text_prompt p;
	struct sm70_message m[] = { { .role = "user", .content = "hi" } };
	struct sm70_message bad_role[] = { { .role = "wizard", .content = "hi" } };
	struct sm70_event ev = { .size = sizeof(ev) };
	struct sm70_job j;
	uint32_t ids[] = { 1 };
	uint64_t id;
	char path[128];

	job_defaults(&j);
	sm70_text_prompt_init(&p);
	assert_int_equal(sm70_client_tokenizer(c, "/nonexistent/model"), -ENOENT);
	assert_non_null(strstr(sm70_client_last_error(c), "/nonexistent/model"));
	/* the app names the tokenizer file; the template is found beside it */
	snprintf(path, sizeof(path), "%s/tokenizer.json", model);
	assert_int_equal(sm70_client_tokenizer(c, path), 0);

	p.text = "caf\xe9";
	assert_int_equal(sm70_submit_text(c, &j, &p, &id), -EILSEQ);
	assert_non_null(strstr(sm70_client_last_error(c), "UTF-8"));
	p.text = "";
	assert_int_equal(sm70_submit_text(c, &j, &p, &id), -EINVAL);
	assert_non_null(strstr(sm70_client_last_error(c), "empty"));
	p.text = NULL;
	assert_int_equal(sm70_submit_text(c, &j, &p, &id), -EINVAL); /* neither */
	p.text = PROMPT;
	p.stop = (const char *const[]){ "" };
	p.n_stop = 1;
	assert_int_equal(sm70_submit_text(c, &j, &p, &id), -EINVAL);
	p.n_stop = 0;
	j.prompt = ids;
	j.prompt_len = 1;
	assert_int_equal(sm70_submit_text(c, &j, &p, &id), -EINVAL);
	assert_non_null(strstr(sm70_client_last_error(c), "prompt must be NULL"));
	job_defaults(&j);
	p.text = NULL;
	p.messages = bad_role;
	p.n_messages = 1;
	assert_int_equal(sm70_submit_text(c, &j, &p, &id), -EINVAL);
	assert_non_null(strstr(sm70_client_last_error(c), "unknown role \"wizard\""));

	/* a chat renders with the Qwen3 template; its <|im_start|> is beyond this model's
	 * 512 ids, so the daemon refuses it by name and the job's only event says so */
	p.messages = m;
	assert_int_equal(sm70_submit_text(c, &j, &p, &id), 0);
	assert_int_equal(sm70_next_event(c, &ev, 10000), 0);
	assert_int_equal(ev.type, SM70_EVENT_ERROR);
	assert_true(ev.flags & SM70_EVENT_FINAL);
	assert_int_equal(ev.error, -SM70_E_INVALID);
	assert_non_null(strstr(ev.message, "151644"));
	assert_int_equal(ev.text_len, 0);
	print_message("chat through a 512-id model: \"%s\"\n", ev.message);
	sm70_client_close(c);
}

/* ---- sm70-generate: text, stop strings, and a decode rate from the daemon's clock -------- */

static json_t *run_generate(const char *args)
{
	char cmd[1024];
	FILE *f;
	json_t *o;

	snprintf(cmd, sizeof(cmd), "%s/bin/sm70-generate --socket %s --prompt '" PROMPT "' "
		 "-n %d --ignore-eos --json %s", sm70t_build_dir(), D.sock, MAX_NEW, args);
	f = popen(cmd, "r");
	assert_non_null(f);
	o = json_loadf(f, 0, NULL);
	assert_int_equal(pclose(f), 0);
	assert_non_null(o);
	return o;
}

static void test_generate_tool(void **state)
{
	char args[256];
	json_t *o, *toks;
	double tps;

	o = run_generate("");
	assert_int_equal(json_string_length(json_object_get(o, "text")), F_len);
	assert_memory_equal(json_string_value(json_object_get(o, "text")), F, F_len);
	toks = json_object_get(o, "tokens");
	assert_int_equal(json_array_size(toks), F_n);
	for (uint32_t i = 0; i < F_n; i++)
		assert_int_equal(json_integer_value(json_array_get(toks, i)), F_tok[i]);
	/* the daemon's decode time over its tokens; reading events in a burst once gave
	 * 15,555,555 tokens/s for 8 tokens */
	tps = json_real_value(json_object_get(json_object_get(o, "timing"),
					      "decode_tokens_per_s"));
	assert_true(tps > 0 && tps < 1e6);
	json_decref(o);
	/* text options need a text prompt: exit 2 before connecting */
	snprintf(args, sizeof(args), "%s/bin/sm70-generate --prompt-ids 1 --stop x 2>/dev/null",
		 sm70t_build_dir());
	assert_int_equal(WEXITSTATUS(system(args)), 2);

	snprintf(args, sizeof(args), "--stop '%s'", S1);
	o = run_generate(args);
	assert_int_equal(json_string_length(json_object_get(o, "text")), S1_at);
	assert_memory_equal(json_string_value(json_object_get(o, "text")), F, S1_at);
	assert_int_equal(json_array_size(json_object_get(o, "tokens")), S1_tokens);
	assert_string_equal(json_string_value(json_object_get(o, "finish_reason")), "stop");
	print_message("sm70-generate: %u tokens at %.0f tokens/s (the daemon's clock); with "
		      "--stop '%s' the text ends at byte %zu\n", F_n, tps, S1, S1_at);
	json_decref(o);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_reference),
		cmocka_unit_test(test_concurrent_stops),
		cmocka_unit_test(test_errors),
		cmocka_unit_test(test_generate_tool),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
