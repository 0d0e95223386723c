/*
 * sm70-run - the offline runner: loads a model in-process (no daemon), generates from
 * one prompt of token ids, a text (--prompt) or a chat turn (--chat) tokenized with the
 * model's tokenizer.json, and prints the tokens or the text (streamed) or one JSON object
 * (--json; with "text" first for a text prompt).
 *
 * Exit codes: 0 done, 2 bad arguments or a bad model directory (non-finite weights
 * included), 1 a failure while running, including a job that ended with an error
 * (non-finite logits, a sequence that outgrew the KV cache). Errors go to stderr.
 */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/version.h"
#include "daemon/engine/engine.h"
#include "text/chat.h"
#include "text/tokenizer.h"
#include "tools/cli/cli.h"

struct run {
	int json;
	int *tokens;
	float *logprobs;
	json_t *tops;
	int n;
	enum sm70_finish finish;
	char message[256]; /* why, for an error finish */
	int prompt_tokens, completion_tokens;
	double t_submit, t_first, t_last;
	/* a text prompt: the output streams through a detokenizer with the stop strings */
	struct sm70_detok *detok;
	struct sm70_text out, delta;
	int stopped;		/* a stop string matched: later tokens are not kept */
};

static void usage(FILE *f)
{
	fprintf(f,
		"usage: sm70-run -m|--model MODEL_DIR [--backend cpu|cuda]\n"
		"                [--load-format auto|dummy]\n"
		"                (--prompt-ids 1,2,3 | --prompt-file FILE | --prompt TEXT |\n"
		"                 --chat TEXT) [-n|--max-new-tokens N]\n"
		"                [--temperature T] [--top-k K] [--top-p P] [--seed S]\n"
		"                [--top-logprobs N] [--json]\n"
		"  more: [--stop-ids 1,2] [--stop STRING]... [--ignore-eos] [--threads N]\n"
		"        [--block-size N] [--system TEXT] [--no-thinking] [--keep-special]\n"
		"        [--tp N] [--gpus 0,1,...] [--batch-invariant]\n"
		"        [--kv-blocks N] [--max-batch-tokens N] [--kv-dtype f32|f16|fp8|fp8-all]\n"
		"       sm70-run --help | --version\n"
		"Temperature 0 (the default) is greedy decoding. A prompt file holds token ids\n"
		"separated by commas or white space. --prompt TEXT is a raw text prompt, --chat\n"
		"TEXT a user turn (after --system TEXT) in the model's chat template\n"
		"(--no-thinking: enable_thinking false); both use MODEL_DIR/tokenizer.json and\n"
		"print text; --stop STRING (up to 16) ends where the text first holds STRING.\n"
		"--keep-special: special tokens (<|im_end|>) stay in the text.\n"
		"--batch-invariant: one kernel and reduction order for every batch size\n"
		"(engine.batch_invariant; docs/ENGINE.md).\n");
}

static int die_usage(const char *fmt, const char *arg)
{
	fprintf(stderr, "sm70-run: ");
	fprintf(stderr, fmt, arg);
	fprintf(stderr, "\n");
	usage(stderr);
	return 2;
}

static void on_event(void *ctx, const struct sm70_event *ev)
{
	struct run *r = ctx;
	double t = sm70__cli_now_s();

	if (ev->sample.token >= 0) {
		if (r->n == 0)
			r->t_first = t;
		r->t_last = t;
		if (r->stopped)
			goto finish; /* made before the cancel took effect: not part of the output */
		if (r->detok) {
			int d;

			sm70_text_clear(&r->delta);
			/* an id the tokenizer lacks (a padded vocabulary) adds no text */
			d = sm70_detok_push(r->detok, ev->sample.token, &r->delta);
			if (d == SM70_DETOK_STOPPED)
				r->stopped = 1;
			if (ev->finish && !r->stopped)
				sm70_detok_finish(r->detok, &r->delta);
			sm70_text_append(&r->out, r->delta.s, r->delta.len);
			if (!r->json) {
				fwrite(r->delta.s, 1, r->delta.len, stdout);
				fflush(stdout);
			}
		}
		r->tokens[r->n] = ev->sample.token;
		r->logprobs[r->n] = ev->sample.logprob;
		json_t *alts = json_array();
		for (int i = 0; i < ev->sample.n_top; i++)
			json_array_append_new(alts, json_pack("{s:i,s:f}", "id",
						(json_int_t)ev->sample.top_ids[i], "logprob",
						(double)ev->sample.top_logprobs[i]));
		json_array_append_new(r->tops, alts);
		r->n++;
		if (!r->json && !r->detok) {
			printf("%d%c", ev->sample.token, ev->finish ? '\n' : ' ');
			fflush(stdout);
		}
	}
finish:
	if (ev->finish) {
		r->finish = ev->finish;
		if (ev->message)
			snprintf(r->message, sizeof(r->message), "%s", ev->message);
		else if (ev->finish == SM70_FINISH_NO_MEMORY)
			snprintf(r->message, sizeof(r->message), "the sequence outgrew the KV cache "
				 "after %d new tokens (--kv-blocks)", ev->completion_tokens);
		r->prompt_tokens = ev->prompt_tokens;
		r->completion_tokens = ev->completion_tokens;
	}
}

static const char *finish_name(enum sm70_finish f)
{
	switch (f) {
	case SM70_FINISH_STOP:
		return "stop";
	case SM70_FINISH_LENGTH:
		return "length";
	case SM70_FINISH_CANCELLED:
		return "cancelled";
	default:
		return "error";
	}
}

/* Tokenizes a text prompt (or a chat of an optional system turn and one user turn) with
 * model_dir's tokenizer into req->prompt (malloc'd). Returns 0, or -1 after saying why. */
static int text_prompt(const char *model_dir, const char *text, const char *chat,
		       const char *system, int no_thinking, struct sm70_tokenizer **tok,
		       struct sm70_request *req, int32_t **owned)
{
	struct sm70_err err = { { 0 } };
	struct sm70_text t = { 0 };
	struct sm70_ids ids = { 0 };
	enum sm70_chat_format fmt;
	int rc;

	if (!model_dir) {
		fprintf(stderr, "sm70-run: -m MODEL_DIR is required\n");
		return -1;
	}
	if (sm70_tokenizer_load_dir(model_dir, tok, &err)) {
		fprintf(stderr, "sm70-run: %s\n", err.msg);
		return -1;
	}
	if (chat) {
		struct sm70_chat_msg m[2];
		size_t n = 0;

		if (sm70_chat_load_dir(model_dir, &fmt, &err)) {
			fprintf(stderr, "sm70-run: --chat: %s\n", err.msg);
			return -1;
		}
		if (system)
			m[n++] = (struct sm70_chat_msg){ .role = "system", .content = system,
							 .content_len = strlen(system) };
		m[n++] = (struct sm70_chat_msg){ .role = "user", .content = chat,
						 .content_len = strlen(chat) };
		rc = sm70_chat_render(fmt, m, n, SM70_CHAT_ADD_GENERATION_PROMPT |
				      (no_thinking ? SM70_CHAT_NO_THINKING : 0), &t, &err);
	} else {
		rc = sm70_text_append(&t, text, strlen(text));
	}
	if (!rc)
		rc = sm70_tokenizer_encode(*tok, t.s ? t.s : "", t.len, 0, &ids, &err);
	sm70_text_free(&t);
	if (!rc && !ids.n)
		rc = sm70_errf(&err, -EINVAL, "the prompt is empty (it makes no tokens)");
	if (rc) {
		fprintf(stderr, "sm70-run: %s: %s\n", chat ? "--chat" : "--prompt", err.msg);
		sm70_ids_free(&ids);
		return -1;
	}
	req->prompt = *owned = ids.v;
	req->n_prompt = (int)ids.n;
	return 0;
}

int main(int argc, char **argv)
{
	enum { O_BACKEND = 256, O_LOAD, O_PIDS, O_PFILE, O_TEMP, O_TOPK, O_TOPP, O_SEED,
	       O_TOPLP, O_JSON, O_STOP, O_IGNEOS, O_THREADS, O_BS, O_KVB, O_MBT, O_KV16, O_TP,
	       O_GPUS, O_PROMPT, O_CHAT, O_SYSTEM, O_NOTHINK, O_STOPSTR, O_KEEPSPECIAL,
	       O_BATCHINV };
	static const struct option lopts[] = {
		{ "model", required_argument, 0, 'm' },
		{ "backend", required_argument, 0, O_BACKEND },
		{ "load-format", required_argument, 0, O_LOAD },
		{ "prompt-ids", required_argument, 0, O_PIDS },
		{ "prompt-file", required_argument, 0, O_PFILE },
		{ "prompt", required_argument, 0, O_PROMPT },
		{ "chat", required_argument, 0, O_CHAT },
		{ "system", required_argument, 0, O_SYSTEM },
		{ "no-thinking", no_argument, 0, O_NOTHINK },
		{ "stop", required_argument, 0, O_STOPSTR },
		{ "keep-special", no_argument, 0, O_KEEPSPECIAL },
		{ "max-new-tokens", required_argument, 0, 'n' },
		{ "temperature", required_argument, 0, O_TEMP },
		{ "top-k", required_argument, 0, O_TOPK },
		{ "top-p", required_argument, 0, O_TOPP },
		{ "seed", required_argument, 0, O_SEED },
		{ "top-logprobs", required_argument, 0, O_TOPLP },
		{ "json", no_argument, 0, O_JSON },
		{ "stop-ids", required_argument, 0, O_STOP },
		{ "ignore-eos", no_argument, 0, O_IGNEOS },
		{ "threads", required_argument, 0, O_THREADS },
		{ "block-size", required_argument, 0, O_BS },
		{ "kv-blocks", required_argument, 0, O_KVB },
		{ "max-batch-tokens", required_argument, 0, O_MBT },
		{ "kv-dtype", required_argument, 0, O_KV16 },
		{ "tp", required_argument, 0, O_TP },
		{ "gpus", required_argument, 0, O_GPUS },
		{ "batch-invariant", no_argument, 0, O_BATCHINV },
		{ "help", no_argument, 0, 'h' },
		{ "version", no_argument, 0, 'V' },
		{ 0, 0, 0, 0 },
	};
	struct sm70_engine_opts eo;
	struct sm70_request req = { .max_new_tokens = 16, .sampling = { .top_p = 1.0f } };
	struct sm70_engine *e = NULL;
	struct sm70_err err = { { 0 } };
	struct run r = { 0 };
	const char *model = NULL, *pids = NULL, *pfile = NULL, *bad = NULL;
	const char *text = NULL, *chat = NULL, *system = NULL, *stop_strings[16];
	struct sm70_tokenizer *tok = NULL;
	int n_stop_strings = 0, no_thinking = 0, keep_special = 0;
	char *file_text = NULL;
	int32_t *prompt = NULL, *stops = NULL;
	uint64_t id;
	double v;
	int c, ret, rc = 1;

	sm70_engine_opts_default(&eo);
	while ((c = getopt_long(argc, argv, "m:n:h", lopts, NULL)) != -1) {
		switch (c) {
		case 'm':
			model = optarg;
			break;
		case O_BACKEND:
			if (strcmp(optarg, "cpu") && strcmp(optarg, "cuda"))
				return die_usage("--backend must be cpu or cuda, not '%s'", optarg);
			eo.backend = optarg;
			break;
		case O_LOAD:
			if (strcmp(optarg, "auto") && strcmp(optarg, "dummy"))
				return die_usage("--load-format must be auto or dummy, not '%s'",
						 optarg);
			eo.dummy_weights = strcmp(optarg, "dummy") == 0;
			break;
		case O_PIDS:
			pids = optarg;
			break;
		case O_PFILE:
			pfile = optarg;
			break;
		case O_PROMPT:
			text = optarg;
			break;
		case O_CHAT:
			chat = optarg;
			break;
		case O_SYSTEM:
			system = optarg;
			break;
		case O_NOTHINK:
			no_thinking = 1;
			break;
		case O_KEEPSPECIAL:
			keep_special = 1;
			break;
		case O_STOPSTR:
			if (n_stop_strings == 16)
				return die_usage("--stop: at most 16 stop strings (one more: '%s')",
						 optarg);
			if (!optarg[0])
				return die_usage("--stop wants a non-empty string%s", "");
			stop_strings[n_stop_strings++] = optarg;
			break;
		case 'n':
			if (sm70__cli_parse_int(optarg, 1, INT32_MAX, &v))
				return die_usage("-n wants a positive integer, not '%s'", optarg);
			req.max_new_tokens = (int)v;
			break;
		case O_TEMP:
			if (sm70__cli_parse_num(optarg, 0, 1e6, &v))
				return die_usage("--temperature wants a number >= 0, not '%s'", optarg);
			req.sampling.temperature = (float)v;
			break;
		case O_TOPK:
			if (sm70__cli_parse_int(optarg, 0, INT32_MAX, &v))
				return die_usage("--top-k wants an integer >= 0, not '%s'", optarg);
			req.sampling.top_k = (int)v;
			break;
		case O_TOPP:
			if (sm70__cli_parse_num(optarg, 0, 1, &v) || v <= 0)
				return die_usage("--top-p wants a number in (0, 1], not '%s'", optarg);
			req.sampling.top_p = (float)v;
			break;
		case O_SEED: {
			char *end;
			errno = 0;
			req.sampling.seed = strtoull(optarg, &end, 10);
			if (end == optarg || *end || errno || optarg[0] == '-')
				return die_usage("--seed wants an unsigned integer, not '%s'", optarg);
			break;
		}
		case O_TOPLP:
			if (sm70__cli_parse_int(optarg, 0, SM70_MAX_TOP_LOGPROBS, &v))
				return die_usage("--top-logprobs wants an integer 0..20, not '%s'",
						 optarg);
			req.sampling.top_logprobs = (int)v;
			break;
		case O_JSON:
			r.json = 1;
			break;
		case O_STOP: {
			long n = sm70__cli_parse_ids(optarg, &stops, &bad);
			if (n < 0 || n > SM70_MAX_STOP_TOKENS)
				return die_usage("--stop-ids wants up to 8 token ids, not '%s'", optarg);
			memcpy(req.stop_ids, stops, sizeof(int32_t) * (size_t)n);
			req.n_stop = n;
			free(stops);
			break;
		}
		case O_IGNEOS:
			req.ignore_eos = 1;
			break;
		case O_THREADS:
			if (sm70__cli_parse_int(optarg, 0, 1024, &v))
				return die_usage("--threads wants an integer 0..1024, not '%s'", optarg);
			eo.n_threads = (int)v;
			break;
		case O_BS:
			if (sm70__cli_parse_int(optarg, 1, 4096, &v))
				return die_usage("--block-size wants an integer 1..4096, not '%s'",
						 optarg);
			eo.block_size = (int)v;
			break;
		case O_KVB:
			if (sm70__cli_parse_int(optarg, 1, INT32_MAX, &v))
				return die_usage("--kv-blocks wants a positive integer, not '%s'", optarg);
			eo.kv_blocks = (int)v;
			break;
		case O_MBT:
			if (sm70__cli_parse_int(optarg, 16, 1 << 20, &v))
				return die_usage("--max-batch-tokens wants an integer >= 16, not '%s'",
						 optarg);
			eo.max_batch_tokens = (int)v;
			break;
		case O_KV16:
			if (sm70_engine_opts_kv_mode(&eo, optarg))
				return die_usage("--kv-dtype must be " SM70_KV_MODE_WORDS
						 ", not '%s'", optarg);
			break;
		case O_TP:
			if (sm70__cli_parse_int(optarg, 1, 4, &v))
				return die_usage("--tp wants an integer 1..4, not '%s'", optarg);
			eo.tp = (int)v;
			break;
		case O_GPUS: {
			int32_t *ids = NULL;
			long n = sm70__cli_parse_ids(optarg, &ids, &bad);
			if (n < 1 || n > 4) {
				free(ids);
				return die_usage("--gpus wants 1 to 4 device ids such as 0,1, not '%s'",
						 optarg);
			}
			for (long g = 0; g < n; g++)
				eo.gpus[g] = ids[g];
			eo.n_gpus = (int)n;
			free(ids);
			break;
		}
		case O_BATCHINV:
			eo.batch_invariant = 1;
			break;
		case 'h':
			usage(stdout);
			return 0;
		case 'V':
			sm70_print_version(stdout, "sm70-run");
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (optind < argc)
		return die_usage("unexpected argument '%s'", argv[optind]);
	if (!model)
		return die_usage("%s", "-m MODEL_DIR is required");
	if (!!pids + !!pfile + !!text + !!chat != 1)
		return die_usage("%s", "give exactly one of --prompt-ids, --prompt-file, --prompt "
				 "and --chat");
	if (system && !chat)
		return die_usage("%s", "--system belongs to a --chat prompt");
	if ((n_stop_strings || no_thinking || keep_special) && !text && !chat)
		return die_usage("%s", "--stop, --no-thinking and --keep-special need a text "
				 "prompt (--prompt or --chat)");
	if (text || chat) {
		ret = text_prompt(model, text, chat, system, no_thinking, &tok, &req, &prompt);
		if (ret) {
			sm70_tokenizer_free(tok);
			return 2;
		}
		struct sm70_detok_opts o = { .size = sizeof(o), .stop = stop_strings,
					     .n_stop = (size_t)n_stop_strings,
					     .flags = keep_special ? 0 : SM70_TOK_SKIP_SPECIAL };
		if (sm70_detok_new(tok, &o, &r.detok)) {
			fprintf(stderr, "sm70-run: --stop: not UTF-8\n");
			rc = 2;
			goto out;
		}
		goto prompt_done;
	}
	if (pfile) {
		file_text = sm70__cli_read_file(pfile);
		if (!file_text) {
			fprintf(stderr, "sm70-run: cannot read prompt file %s: %s\n", pfile,
				strerror(errno));
			return 2;
		}
		pids = file_text;
	}
	req.n_prompt = (int)sm70__cli_parse_ids(pids, &prompt, &bad);
	if (req.n_prompt < 0) {
		fprintf(stderr, "sm70-run: bad token id in the prompt near '%.20s'\n",
			bad ? bad : "");
		free(file_text);
		return 2;
	}
	req.prompt = prompt;
	if (req.n_prompt == 0) {
		fprintf(stderr, "sm70-run: the prompt is empty\n");
		rc = 2;
		goto out;
	}
prompt_done:

	ret = sm70_engine_open(&e, model, &eo, &err);
	if (ret) {
		fprintf(stderr, "sm70-run: %s\n", err.msg[0] ? err.msg : strerror(-ret));
		rc = 2;
		goto out;
	}
	{
		struct sm70_engine_stats st;
		sm70_engine_get_stats(e, &st);
		if (st.clamped_weights)
			fprintf(stderr, "sm70-run: %llu weights were beyond the f16 range and were "
				"clamped to +-65504\n", (unsigned long long)st.clamped_weights);
	}
	r.tokens = malloc(sizeof(int) * (size_t)req.max_new_tokens);
	r.logprobs = malloc(sizeof(float) * (size_t)req.max_new_tokens);
	r.tops = json_array();
	if (!r.tokens || !r.logprobs || !r.tops)
		goto out;
	r.t_submit = sm70__cli_now_s();
	ret = sm70_engine_submit(e, &req, &id, &err);
	if (ret) {
		fprintf(stderr, "sm70-run: %s\n", err.msg[0] ? err.msg : strerror(-ret));
		rc = 2;
		goto out;
	}
	int cancelled = 0;
	while (sm70_engine_busy(e)) {
		ret = sm70_engine_step(e, on_event, &r);
		if (ret < 0) {
			fprintf(stderr, "sm70-run: engine step failed: %s\n", strerror(-ret));
			goto out;
		}
		if (r.stopped && !cancelled) {
			sm70_engine_cancel(e, id);
			cancelled = 1;
		}
	}
	if (r.detok && !r.json && r.out.len)
		putchar('\n');
	if (r.stopped)
		r.finish = SM70_FINISH_STOP;

	double prefill_ms = r.n ? (r.t_first - r.t_submit) * 1e3 : 0;
	/* In process, one token per engine step: the time between the steps that made the
	 * first and the last token (sm70-generate takes the same span from the daemon). */
	double decode_tps = r.n > 1 && r.t_last > r.t_first ?
		(double)(r.n - 1) / (r.t_last - r.t_first) : 0;
	if (r.json) {
		json_t *toks = json_array(), *lps = json_array();
		for (int i = 0; i < r.n; i++) {
			json_array_append_new(toks, json_integer(r.tokens[i]));
			json_array_append_new(lps, json_real(r.logprobs[i]));
		}
		json_t *o = json_pack("{s:o,s:o,s:O,s:s,s:{s:i,s:i},s:{s:f,s:f}}",
				      "tokens", toks, "logprobs", lps, "top_logprobs", r.tops,
				      "finish_reason", finish_name(r.finish),
				      "usage", "prompt_tokens", r.prompt_tokens,
				      "completion_tokens", r.completion_tokens,
				      "timing", "prefill_ms", prefill_ms,
				      "decode_tokens_per_s", decode_tps);
		if (r.detok) { /* "text" first, as sm70-generate prints it */
			json_t *t = json_object();

			json_object_set_new(t, "text", json_stringn(r.out.s ? r.out.s : "",
								      r.out.len));
			json_object_update(t, o);
			json_decref(o);
			o = t;
		}
		char *s = json_dumps(o, JSON_COMPACT);
		printf("%s\n", s);
		free(s);
		json_decref(o);
	} else {
		fprintf(stderr, "sm70-run: %d tokens, finish %s, prefill %.1f ms, decode %.1f "
			"tokens/s\n", r.n, finish_name(r.finish), prefill_ms, decode_tps);
	}
	rc = 0;
	if (r.finish == SM70_FINISH_ERROR || r.finish == SM70_FINISH_NO_MEMORY) {
		fprintf(stderr, "sm70-run: the job ended with an error: %s\n",
			r.message[0] ? r.message : "no reason given");
		rc = 1;
	}
out:
	json_decref(r.tops);
	sm70_detok_free(r.detok);
	sm70_tokenizer_free(tok);
	sm70_text_free(&r.out);
	sm70_text_free(&r.delta);
	free(r.tokens);
	free(r.logprobs);
	sm70_engine_close(e);
	free(prompt);
	free(file_text);
	return rc;
}
