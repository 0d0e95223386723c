/*
 * sm70-generate - generate from one prompt through a running sm70d, using libsm70client.
 * The prompt is token ids, a text (--prompt) or a user turn of a chat (--chat), which the
 * SDK tokenizes with the model's tokenizer. Prints the tokens (or, for a text prompt, the
 * text) as they arrive, or with --json the same JSON object as sm70-run --json (tokens,
 * logprobs, top_logprobs, finish_reason, usage, timing; "text" first for a text prompt), so
 * the two can be compared field by field.
 *
 * Exit codes: 0 done, 2 bad arguments (including a job the daemon refused as invalid or too
 * large), 3 the daemon is not running (nothing listens on the socket), 1 any other failure.
 * JSON is printed by hand, formatted exactly like jansson's compact output (which sm70-run
 * uses), so the tool needs nothing beyond the SDK.
 */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/version.h"
#include "sm70/client.h"
#include "tools/cli/cli.h"

struct run {
	int json;
	int text;		 /* a text job: stream ev->text, keep it for --json */
	char *out;		 /* the text so far */
	size_t out_len, out_cap;
	uint32_t *tokens;
	float *logprobs;
	struct sm70_top_logprob (*tops)[SM70_MAX_TOP_LOGPROBS];
	uint32_t *n_tops;
	uint32_t n, cap;
	double t_submit, t_first, t_last;
};

static void usage(FILE *f)
{
	fprintf(f,
		"usage: sm70-generate [--socket PATH] (--prompt-ids 1,2,3 | --prompt-file FILE |\n"
		"                     --prompt TEXT | --chat TEXT) [-n|--max-new-tokens N]\n"
		"                     [--temperature T] [--top-k K] [--top-p P] [--seed S]\n"
		"                     [--top-logprobs N] [--stop-ids 1,2] [--stop STRING]...\n"
		"                     [--json]\n"
		"  more: [--ignore-eos] [--priority N] [--deadline-ms MS] [--connect-timeout S]\n"
		"        [--system TEXT] [--no-thinking] [--tokenizer PATH] [--keep-special]\n"
		"       sm70-generate --help | --version\n"
		"The socket defaults to $SM70_SOCKET, else " SM70_DEFAULT_SOCKET ".\n"
		"Temperature 0 (the default) is greedy decoding; the seed defaults to 0, as in\n"
		"sm70-run. A prompt file holds token ids separated by commas or white space.\n"
		"--prompt TEXT is a raw text prompt; --chat TEXT a user turn (after --system\n"
		"TEXT, if given) in the model's chat template (--no-thinking: enable_thinking\n"
		"false). Their output streams as text, and --stop STRING (up to 16) ends the\n"
		"job where the text first holds STRING, which is not printed. The tokenizer is\n"
		"the daemon's model's (its tokenizer.json), or --tokenizer DIR_OR_FILE.\n"
		"--keep-special: special tokens (<|im_end|>) stay in the text.\n"
		"sm70-run's model options (-m/--model, --backend, --load-format, --threads,\n"
		"--block-size, --kv-blocks, --max-batch-tokens, --kv-dtype, each with a value)\n"
		"are accepted and ignored: the daemon's model and configuration are used.\n"
		"--connect-timeout: how long to wait for the daemon's welcome while it starts or\n"
		"loads its model (default 900 s); its loading progress is shown on stderr.\n"
		"Exit: 0 done, 2 bad arguments, 3 daemon not running, 1 other failures.\n");
}

static int die_usage(const char *fmt, const char *arg)
{
	fprintf(stderr, "sm70-generate: ");
	fprintf(stderr, fmt, arg);
	fprintf(stderr, "\n");
	usage(stderr);
	return 2;
}

/* Prints a double the way jansson does (%.17g, a ".0" on integral values, exponent without
 * '+' or leading zeros), so the output is byte-for-byte comparable with sm70-run --json.
 * Non-finite values, which JSON cannot express, become null. */
static void put_real(double v)
{
	char b[64], *s, *end;

	if (!isfinite(v)) {
		fputs("null", stdout);
		return;
	}
	snprintf(b, sizeof(b) - 2, "%.17g", v);
	if (!strchr(b, '.') && !strchr(b, 'e'))
		strcat(b, ".0");
	s = strchr(b, 'e');
	if (s) {
		s++;
		end = s + 1;
		if (*s == '-')
			s++;
		while (*end == '0')
			end++;
		if (end != s)
			memmove(s, end, strlen(end) + 1);
	}
	fputs(b, stdout);
}

static const char *finish_name(uint32_t reason)
{
	switch (reason) {
	case SM70_REASON_STOP_EOS:
	case SM70_REASON_STOP_TOKEN:
	case SM70_REASON_STOP_STRING:
		return "stop";
	case SM70_REASON_LENGTH:
		return "length";
	case SM70_REASON_CANCELLED:
		return "cancelled";
	case SM70_REASON_DEADLINE:
		return "deadline";
	default:
		return "error";
	}
}

/* Keeps (for --json) or prints a piece of the output text. */
static void take_text(struct run *r, const char *s, size_t n)
{
	if (!r->json) {
		fwrite(s, 1, n, stdout);
		fflush(stdout);
		return;
	}
	if (r->out_len + n + 1 > r->out_cap) {
		size_t cap = (r->out_len + n + 1) * 2;
		char *p = realloc(r->out, cap);

		if (!p)
			return; /* --json then lacks the end of the text; the tokens are kept */
		r->out = p;
		r->out_cap = cap;
	}
	memcpy(r->out + r->out_len, s, n);
	r->out_len += n;
	r->out[r->out_len] = '\0';
}

static int on_token(void *ctx, const struct sm70_event *ev)
{
	struct run *r = ctx;
	double t = sm70__cli_now_s();

	if (r->text && ev->text_len)
		take_text(r, ev->text, ev->text_len);
	if (ev->type != SM70_EVENT_TOKEN) /* a FINISH with the text held back at the end */
		return 0;
	if (r->n == 0)
		r->t_first = t;
	r->t_last = t;
	if (r->n < r->cap) {
		r->tokens[r->n] = ev->token;
		r->logprobs[r->n] = ev->logprob;
		r->n_tops[r->n] = ev->n_top;
		memcpy(r->tops[r->n], ev->top, sizeof(ev->top[0]) * ev->n_top);
		r->n++;
	}
	if (!r->json && !r->text) {
		printf("%s%u", r->n > 1 ? " " : "", ev->token);
		fflush(stdout);
	}
	return 0;
}

/* A JSON string as jansson writes it: \" \\ \b \f \n \r \t, other control characters as
 * \u00XX, everything else (UTF-8 included) as it is. */
static void put_string(const char *s, size_t n)
{
	putchar('"');
	for (size_t i = 0; i < n; i++) {
		unsigned char ch = (unsigned char)s[i];

		switch (ch) {
		case '"': fputs("\\\"", stdout); break;
		case '\\': fputs("\\\\", stdout); break;
		case '\b': fputs("\\b", stdout); break;
		case '\f': fputs("\\f", stdout); break;
		case '\n': fputs("\\n", stdout); break;
		case '\r': fputs("\\r", stdout); break;
		case '\t': fputs("\\t", stdout); break;
		default:
			if (ch < 0x20)
				printf("\\u%04x", ch);
			else
				putchar(ch);
		}
	}
	putchar('"');
}

static void print_json(const struct run *r, const struct sm70_result *res, double prefill_ms,
		       double decode_tps)
{
	uint32_t i, k;

	putchar('{');
	if (r->text) {
		fputs("\"text\":", stdout);
		put_string(r->out ? r->out : "", r->out_len);
		putchar(',');
	}
	fputs("\"tokens\":[", stdout);
	for (i = 0; i < r->n; i++)
		printf("%s%u", i ? "," : "", r->tokens[i]);
	fputs("],\"logprobs\":[", stdout);
	for (i = 0; i < r->n; i++) {
		if (i)
			putchar(',');
		put_real(r->logprobs[i]);
	}
	fputs("],\"top_logprobs\":[", stdout);
	for (i = 0; i < r->n; i++) {
		fputs(i ? ",[" : "[", stdout);
		for (k = 0; k < r->n_tops[i]; k++) {
			printf("%s{\"id\":%u,\"logprob\":", k ? "," : "", r->tops[i][k].id);
			put_real(r->tops[i][k].logprob);
			putchar('}');
		}
		putchar(']');
	}
	printf("],\"finish_reason\":\"%s\",\"usage\":{\"prompt_tokens\":%u,"
	       "\"completion_tokens\":%u},\"timing\":{\"prefill_ms\":",
	       finish_name(res->finish_reason), res->usage.prompt_tokens,
	       res->usage.completion_tokens);
	put_real(prefill_ms);
	fputs(",\"decode_tokens_per_s\":", stdout);
	put_real(decode_tps);
	fputs("}}\n", stdout);
}

/*
 * Connects, waiting up to seconds for the welcome. A daemon that is loading its model says
 * so at once: then the wait goes on in steps of 5 s, with a progress line on stderr after
 * each, until the welcome or the time is up. Returns what sm70_client_connect returns.
 */
static int connect_waiting(struct sm70_client **c, const char *sock, double seconds)
{
	struct sm70_connect_opts o;
	struct sm70_loading l = { .size = sizeof(l) };
	double end = sm70__cli_now_s() + seconds, left;
	int ret;

	sm70_connect_opts_init(&o);
	left = seconds;
	o.handshake_timeout_ms = (uint32_t)(1000 * (left < 5 ? left : 5));
	ret = sm70_client_connect(c, sock, &o);
	while (ret == -SM70_E_LOADING && *c && sm70_client_loading(*c, &l) == 1 &&
	       (left = end - sm70__cli_now_s()) > 0) {
		if (l.bytes_total)
			fprintf(stderr, "sm70-generate: sm70d is loading %s: %.0f%% after %llu s\n",
				l.model_name, l.bytes_done >= l.bytes_total ? 100.0 :
				100.0 * (double)l.bytes_done / (double)l.bytes_total,
				(unsigned long long)(l.elapsed_ms / 1000));
		else
			fprintf(stderr, "sm70-generate: sm70d is loading %s (%llu s so far)\n",
				l.model_name, (unsigned long long)(l.elapsed_ms / 1000));
		sm70_client_close(*c);
		*c = NULL;
		o.handshake_timeout_ms = (uint32_t)(1000 * (left < 5 ? left : 5)) + 1;
		ret = sm70_client_connect(c, sock, &o);
	}
	return ret;
}

int main(int argc, char **argv)
{
	enum { O_SOCK = 256, O_PIDS, O_PFILE, O_TEMP, O_TOPK, O_TOPP, O_SEED, O_TOPLP, O_JSON,
	       O_STOP, O_IGNEOS, O_PRIO, O_DEADLINE, O_CTIMEOUT, O_IGNORED, O_PROMPT, O_CHAT,
	       O_SYSTEM, O_NOTHINK, O_STOPSTR, O_TOKENIZER, O_KEEPSPECIAL };
	static const struct option lopts[] = {
		{ "socket", required_argument, 0, O_SOCK },
		{ "prompt-ids", required_argument, 0, O_PIDS },
		{ "prompt-file", required_argument, 0, O_PFILE },
		{ "prompt", required_argument, 0, O_PROMPT },
		{ "chat", required_argument, 0, O_CHAT },
		{ "system", required_argument, 0, O_SYSTEM },
		{ "no-thinking", no_argument, 0, O_NOTHINK },
		{ "stop", required_argument, 0, O_STOPSTR },
		{ "tokenizer", required_argument, 0, O_TOKENIZER },
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
		{ "priority", required_argument, 0, O_PRIO },
		{ "deadline-ms", required_argument, 0, O_DEADLINE },
		{ "connect-timeout", required_argument, 0, O_CTIMEOUT },
		/* sm70-run's model options, so one command line works with both tools */
		{ "model", required_argument, 0, 'm' },
		{ "backend", required_argument, 0, O_IGNORED },
		{ "load-format", required_argument, 0, O_IGNORED },
		{ "threads", required_argument, 0, O_IGNORED },
		{ "block-size", required_argument, 0, O_IGNORED },
		{ "kv-blocks", required_argument, 0, O_IGNORED },
		{ "max-batch-tokens", required_argument, 0, O_IGNORED },
		{ "kv-dtype", required_argument, 0, O_IGNORED },
		{ "help", no_argument, 0, 'h' },
		{ "version", no_argument, 0, 'V' },
		{ 0, 0, 0, 0 },
	};
	struct sm70_job job;
	struct sm70_result res = { .size = sizeof(res) };
	struct sm70_client *c = NULL;
	struct run r = { 0 };
	const char *sock = NULL, *pids = NULL, *pfile = NULL, *bad = NULL;
	const char *text = NULL, *chat = NULL, *system = NULL, *tokenizer = NULL;
	const char *stop_strings[SM70_MAX_STOP_STRINGS];
	struct sm70_message msgs[2];
	struct sm70_text_prompt tp;
	char *file_text = NULL;
	int32_t *prompt = NULL, *stops = NULL;
	long n;
	double v, connect_s = SM70_DEFAULT_HANDSHAKE_TIMEOUT_MS / 1000.0;
	int opt, ret, rc = 1;

	sm70_job_init(&job);
	sm70_text_prompt_init(&tp);
	job.flags = SM70_JOB_SEED; /* seed 0 unless --seed, like sm70-run */
	while ((opt = getopt_long(argc, argv, "m:n:h", lopts, NULL)) != -1) {
		switch (opt) {
		case O_SOCK:
			sock = optarg;
			break;
		case O_CTIMEOUT:
			if (sm70__cli_parse_num(optarg, 0.001, 4e6, &v))
				return die_usage("--connect-timeout wants seconds in (0, 4e6], not "
						 "'%s'", optarg);
			connect_s = v;
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
			tp.flags |= SM70_TEXT_NO_THINKING;
			break;
		case O_KEEPSPECIAL:
			tp.flags |= SM70_TEXT_KEEP_SPECIAL;
			break;
		case O_TOKENIZER:
			tokenizer = optarg;
			break;
		case O_STOPSTR:
			if (tp.n_stop == SM70_MAX_STOP_STRINGS)
				return die_usage("--stop: at most 16 stop strings (one more: '%s')",
						 optarg);
			if (!optarg[0])
				return die_usage("--stop wants a non-empty string%s", "");
			stop_strings[tp.n_stop++] = optarg;
			break;
		case 'n':
			if (sm70__cli_parse_int(optarg, 1, UINT32_MAX, &v))
				return die_usage("-n wants a positive integer, not '%s'", optarg);
			job.max_tokens = (uint32_t)v;
			break;
		case O_TEMP:
			if (sm70__cli_parse_num(optarg, 0, 1e6, &v))
				return die_usage("--temperature wants a number >= 0, not '%s'",
							 optarg);
			job.temperature = (float)v;
			break;
		case O_TOPK:
			if (sm70__cli_parse_int(optarg, 0, INT32_MAX, &v))
				return die_usage("--top-k wants an integer >= 0, not '%s'", optarg);
			job.top_k = (int32_t)v;
			break;
		case O_TOPP:
			if (sm70__cli_parse_num(optarg, 0, 1, &v) || v <= 0)
				return die_usage("--top-p wants a number in (0, 1], not '%s'",
							 optarg);
			job.top_p = (float)v;
			break;
		case O_SEED: {
			char *end;

			errno = 0;
			job.seed = strtoull(optarg, &end, 10);
			if (end == optarg || *end || errno || optarg[0] == '-')
				return die_usage("--seed wants an unsigned integer, not '%s'",
							 optarg);
			break;
		}
		case O_TOPLP:
			if (sm70__cli_parse_int(optarg, 0, SM70_MAX_TOP_LOGPROBS, &v))
				return die_usage("--top-logprobs wants an integer 0..8, not '%s'",
						 optarg);
			job.top_logprobs = (uint32_t)v;
			break;
		case O_JSON:
			r.json = 1;
			break;
		case O_STOP:
			n = sm70__cli_parse_ids(optarg, &stops, &bad);
			if (n < 0 || n > SM70_MAX_STOP)
				return die_usage("--stop-ids wants up to 8 token ids, not '%s'",
							 optarg);
			memcpy(job.stop, stops, sizeof(*stops) * (size_t)n);
			job.n_stop = (uint32_t)n;
			free(stops);
			break;
		case O_IGNEOS:
			job.flags |= SM70_JOB_IGNORE_EOS;
			break;
		case O_PRIO:
			if (sm70__cli_parse_int(optarg, 0, 255, &v))
				return die_usage("--priority wants an integer 0..255, not '%s'",
							 optarg);
			job.priority = (uint32_t)v;
			break;
		case O_DEADLINE:
			if (sm70__cli_parse_int(optarg, 0, UINT32_MAX, &v))
				return die_usage("--deadline-ms wants an integer >= 0, not '%s'",
							 optarg);
			job.deadline_ms = (uint32_t)v;
			break;
		case 'm':
		case O_IGNORED:
			break;
		case 'h':
			usage(stdout);
			return 0;
		case 'V':
			sm70_print_version(stdout, "sm70-generate");
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (optind < argc)
		return die_usage("unexpected argument '%s'", argv[optind]);
	if (!!pids + !!pfile + !!text + !!chat != 1)
		return die_usage("%s", "give exactly one of --prompt-ids, --prompt-file, --prompt "
				 "and --chat");
	if (system && !chat)
		return die_usage("%s", "--system belongs to a --chat prompt");
	if ((tp.n_stop || tokenizer || tp.flags) && !text && !chat)
		return die_usage("%s", "--stop, --tokenizer, --no-thinking and --keep-special "
				 "need a text prompt (--prompt or --chat)");
	r.text = text || chat;
	if (r.text) {
		uint32_t m = 0;

		if (system)
			msgs[m++] = (struct sm70_message){ .role = "system", .content = system };
		if (chat) {
			msgs[m++] = (struct sm70_message){ .role = "user", .content = chat };
			tp.messages = msgs;
			tp.n_messages = m;
		}
		tp.text = text;
		tp.stop = stop_strings;
		goto prompt_done;
	}
	if (pfile) {
		file_text = sm70__cli_read_file(pfile);
		if (!file_text) {
			fprintf(stderr, "sm70-generate: cannot read prompt file %s: %s\n", pfile,
				strerror(errno));
			return 2;
		}
		pids = file_text;
	}
	n = sm70__cli_parse_ids(pids, &prompt, &bad);
	if (n == -1) {
		fprintf(stderr, "sm70-generate: bad token id in the prompt near '%.20s'\n",
			bad ? bad : "");
		rc = 2;
		goto out;
	}
	if (n < 0)
		goto out;
	if (n == 0) {
		fprintf(stderr, "sm70-generate: the prompt is empty\n");
		rc = 2;
		goto out;
	}
	job.prompt = (const uint32_t *)prompt; /* ids are 0..INT32_MAX */
	job.prompt_len = (uint32_t)n;
prompt_done:

	r.cap = job.max_tokens < 1u << 20 ? job.max_tokens : 1u << 20;
	r.tokens = malloc(sizeof(*r.tokens) * r.cap);
	r.logprobs = malloc(sizeof(*r.logprobs) * r.cap);
	r.tops = malloc(sizeof(*r.tops) * r.cap);
	r.n_tops = malloc(sizeof(*r.n_tops) * r.cap);
	if (!r.tokens || !r.logprobs || !r.tops || !r.n_tops) {
		fprintf(stderr, "sm70-generate: out of memory\n");
		goto out;
	}

	ret = connect_waiting(&c, sock, connect_s);
	if (ret) {
		fprintf(stderr, "sm70-generate: %s\n",
			c && sm70_client_last_error(c)[0] ? sm70_client_last_error(c) :
							     sm70_strerror(ret));
		rc = ret == -ENOENT || ret == -ECONNREFUSED ? 3 : 1;
		goto out;
	}
	/* loaded before the clock starts (the daemon's when no --tokenizer), so that
	 * prefill_ms does not count reading tokenizer.json */
	if (r.text && (ret = sm70_client_tokenizer(c, tokenizer))) {
		fprintf(stderr, "sm70-generate: %s\n", sm70_client_last_error(c));
		rc = 2;
		goto out;
	}
	r.t_submit = sm70__cli_now_s();
	res.job_id = 0;
	ret = r.text ? sm70_generate_text(c, &job, &tp, on_token, &r, &res) :
		       sm70_generate(c, &job, on_token, &r, &res);
	if (!r.json && (r.n || r.out_len)) {
		putchar('\n');
		fflush(stdout); /* before the summary on stderr */
	}
	if (ret && res.job_id == 0) { /* never submitted */
		/* a text prompt's failure (tokenizer, template, UTF-8) is explained there */
		fprintf(stderr, "sm70-generate: %s\n", r.text && sm70_client_last_error(c)[0] ?
			sm70_client_last_error(c) : sm70_strerror(ret));
		rc = ret == -EINVAL || ret == -E2BIG || (r.text && ret != -ENOMEM &&
			ret != -ECONNRESET && ret != -ENOTCONN) ? 2 : 1;
		goto out;
	}
	if (ret == -SM70_E_INVALID || ret == -SM70_E_TOO_LARGE) {
		fprintf(stderr, "sm70-generate: sm70d refused the job: %s\n", res.message);
		rc = 2;
		goto out;
	}

	double prefill_ms = r.n ? (r.t_first - r.t_submit) * 1e3 : 0;
	/* From the daemon's clock: its decode_us runs from the first to the last token it
	 * published, so this is the rate of the job's decode steps, not of this process
	 * reading events (which may come in a burst and gave rates in the millions). */
	double decode_tps = res.usage.completion_tokens > 1 && res.usage.decode_us ?
		(double)(res.usage.completion_tokens - 1) * 1e6 / (double)res.usage.decode_us : 0;
	if (r.json)
		print_json(&r, &res, prefill_ms, decode_tps);
	else
		fprintf(stderr, "sm70-generate: %u tokens, finish %s, prefill %.1f ms, decode %.1f "
			"tokens/s\n", r.n, finish_name(res.finish_reason), prefill_ms, decode_tps);
	if (ret) {
		fprintf(stderr, "sm70-generate: the job failed: %s (%s)\n", sm70_strerror(ret),
			res.message);
		goto out;
	}
	rc = 0;
out:
	sm70_client_close(c);
	free(r.tokens);
	free(r.logprobs);
	free(r.tops);
	free(r.n_tops);
	free(prompt);
	free(file_text);
	free(r.out);
	return rc;
}
