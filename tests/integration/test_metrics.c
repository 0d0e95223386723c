/*
 * test_metrics - sm70d's metrics and admin socket against a real daemon (CPU backend, tiny
 * fixture): counters and histograms agree with what clients saw (the queue, prefill and
 * decode histograms add up to TTFT and inter-token time), the prefix-cache counters count
 * a repeated prompt, build and model info carry the configured model name (which status
 * and the client's welcome show too), cancelling frees the KV cache, and sm70ctl's
 * commands, --json output and exit codes.
 */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "sm70/client.h"
#include "tests/integration/daemon_util.h"

#define N_JOBS 8
#define WARM_TOKENS 8
#define PROMPT_LEN 24
#define GEN_TOKENS 128
#define MODEL_NAME "tiny/qwen3-test"

static struct sm70t_daemon T;
static char admin_path[108]; /* sizeof(sun_path) */

/* max_seqs 2: later jobs queue behind earlier ones, so TTFTs are long enough (several
 * engine steps) that a few microseconds of wakeup latency do not matter. */
static const char config_json[] = "{\"engine\": {\"max_seqs\": 2, \"feed_depth\": 1},"
				   " \"model_name\": \"" MODEL_NAME "\"}";

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- the admin socket --------------------------------------------------------------- */

/* One request {"cmd": cmd}; returns the parsed reply (caller decrefs) or NULL. */
static json_t *admin(const char *cmd)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	static char buf[65536];
	char req[64];
	json_t *r = NULL;
	ssize_t n;
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);

	snprintf(a.sun_path, sizeof(a.sun_path), "%s", admin_path);
	if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof(a)))
		goto out;
	n = snprintf(req, sizeof(req), "{\"cmd\":\"%s\"}", cmd);
	if (send(fd, req, (size_t)n, MSG_NOSIGNAL) != n)
		goto out;
	n = recv(fd, buf, sizeof(buf) - 1, 0);
	if (n <= 0)
		goto out;
	buf[n] = '\0';
	r = json_loads(buf, 0, NULL);
out:
	if (fd >= 0)
		close(fd);
	return r;
}

/* The metrics text (malloc'd). */
static char *metrics_text(void)
{
	json_t *r = admin("metrics");
	char *t;

	assert_non_null(r);
	assert_true(json_is_true(json_object_get(r, "ok")));
	t = strdup(json_string_value(json_object_get(r, "text")));
	json_decref(r);
	assert_non_null(t);
	return t;
}

/* The value of the sample whose name-and-labels is exactly `series`, or NAN. */
static double sample(const char *text, const char *series)
{
	size_t n = strlen(series);

	for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
		if (strncmp(p, series, n) == 0 && p[n] == ' ')
			return strtod(p + n + 1, NULL);
	return NAN;
}

/* Checks the exposition format: every sample belongs to a family announced by HELP and
 * TYPE lines before it, histogram buckets are cumulative, +Inf equals _count. Returns the
 * number of sample lines. */
static int check_format(const char *text)
{
	char fam[128] = "", type[32] = "";
	double last_bucket = -1;
	int samples = 0, help_seen = 0;
	const char *p = text;

	while (*p) {
		const char *eol = strchr(p, '\n');
		char line[512], name[128];
		size_t len;

		assert_non_null(eol); /* every line ends with \n */
		len = (size_t)(eol - p);
		assert_true(len < sizeof(line));
		memcpy(line, p, len);
		line[len] = '\0';
		p = eol + 1;
		if (strncmp(line, "# HELP ", 7) == 0) {
			assert_int_equal(sscanf(line + 7, "%127s", fam), 1);
			help_seen = 1;
			last_bucket = -1;
			continue;
		}
		if (strncmp(line, "# TYPE ", 7) == 0) {
			assert_int_equal(sscanf(line + 7, "%127s %31s", name, type), 2);
			assert_true(help_seen);
			assert_string_equal(name, fam);
			assert_true(!strcmp(type, "counter") || !strcmp(type, "gauge") ||
				    !strcmp(type, "histogram"));
			if (!strcmp(type, "counter"))
				assert_non_null(strstr(fam, "_total"));
			continue;
		}
		assert_true(line[0] != '#');
		assert_int_equal(strncmp(line, fam, strlen(fam)), 0);
		samples++;
		if (!strcmp(type, "histogram") && strstr(line, "_bucket{le=")) {
			double v = strtod(strrchr(line, ' ') + 1, NULL);

			assert_true(v >= last_bucket);
			last_bucket = v;
		}
		if (!strcmp(type, "histogram") && strstr(line, "_count ")) {
			assert_true(strtod(strrchr(line, ' ') + 1, NULL) == last_bucket);
		}
	}
	return samples;
}

/* ---- sm70ctl -------------------------------------------------------------------------- */

/* Runs sm70ctl with args (through sh); its stdout goes to out (size bytes). Returns its exit
 * status. */
static int ctl(const char *args, char *out, size_t size)
{
	char cmd[512];

	snprintf(cmd, sizeof(cmd), "%s/bin/sm70ctl %s 2>/dev/null", sm70t_build_dir(), args);
	return sm70t_capture(cmd, out, size);
}

/* ---- jobs through the SDK --------------------------------------------------------------- */

static struct sm70_client *connect_ok(void)
{
	struct sm70_client *c = NULL;
	int ret = sm70_client_connect(&c, T.sock, NULL);

	if (ret)
		fprintf(stderr, "connect: %s (%s)\n", sm70_strerror(ret),
			sm70_client_last_error(c));
	assert_int_equal(ret, 0);
	return c;
}

static void make_job(struct sm70_job *j, uint32_t *prompt, int k, uint32_t max_tokens)
{
	for (int i = 0; i < PROMPT_LEN; i++)
		prompt[i] = (uint32_t)((k * 37 + i * 11) % 500 + 1);
	sm70_job_init(j);
	j->prompt = prompt;
	j->prompt_len = PROMPT_LEN;
	j->max_tokens = max_tokens;
	j->flags = SM70_JOB_IGNORE_EOS;
	j->user_tag = (uint64_t)k;
}

/*
 * N jobs of GEN_TOKENS tokens after one warm-up job (the first engine step pays one-time
 * costs). The daemon's TTFT starts when it copies the entry out of the ring; an entry
 * that arrives while a step runs waits for the step's end, which the client sees and the
 * daemon does not. So the burst is submitted while the daemon is idle, and max_seqs 2
 * makes the later jobs queue, so that the TTFTs are many steps long and that one step of
 * difference is small next to them.
 */
static void test_counters_and_histograms(void **state)
{
	struct sm70_client *c = connect_ok();
	uint32_t prompts[N_JOBS][PROMPT_LEN], warm_prompt[PROMPT_LEN];
	double t_submit[N_JOBS], t_first[N_JOBS], t_last[N_JOBS];
	double ttft_client = 0, itl_client = 0, ttft_d, itl_d, ttft0, itl0;
	int n_tok[N_JOBS] = { 0 }, done = 0;
	struct sm70_result res = { .size = sizeof(res) };
	struct sm70_job warm;
	char *text;

	make_job(&warm, warm_prompt, 99, WARM_TOKENS);
	assert_int_equal(sm70_generate(c, &warm, NULL, NULL, &res), 0);
	text = metrics_text();
	ttft0 = sample(text, "sm70_time_to_first_token_seconds_sum");
	itl0 = sample(text, "sm70_inter_token_latency_seconds_sum");
	free(text);
	usleep(20000); /* let the daemon go idle */

	for (int k = 0; k < N_JOBS; k++) {
		struct sm70_job j;
		uint64_t id;

		make_job(&j, prompts[k], k, GEN_TOKENS);
		t_submit[k] = now_s();
		assert_int_equal(sm70_submit(c, &j, &id), 0);
	}
	while (done < N_JOBS) {
		struct sm70_event ev = { .size = sizeof(ev) };
		double t;
		int k;

		assert_int_equal(sm70_next_event(c, &ev, 10000), 0);
		t = now_s();
		k = (int)ev.user_tag;
		assert_true(k >= 0 && k < N_JOBS);
		if (ev.type == SM70_EVENT_TOKEN) {
			if (n_tok[k]++ == 0)
				t_first[k] = t;
			t_last[k] = t;
		} else {
			assert_int_equal(ev.type, SM70_EVENT_FINISH);
			assert_int_equal(ev.finish_reason, SM70_REASON_LENGTH);
			if (getenv("SM70T_DEBUG"))
				printf("job %d: client ttft %.2f ms, daemon %.2f ms, "
				       "queue %.2f ms\n", k, (t_first[k] - t_submit[k]) * 1e3,
				       (double)ev.usage.ttft_us * 1e-3,
				       (double)ev.usage.queue_us * 1e-3);
			done++;
		}
	}
	for (int k = 0; k < N_JOBS; k++) {
		assert_int_equal(n_tok[k], GEN_TOKENS);
		ttft_client += t_first[k] - t_submit[k];
		itl_client += t_last[k] - t_first[k];
	}

	text = metrics_text();
	printf("metrics: %d samples in %zu bytes, format checked\n", check_format(text),
	       strlen(text));
	/* N jobs plus the warm-up job */
	assert_true(sample(text, "sm70_time_to_first_token_seconds_count") == N_JOBS + 1);
	assert_true(sample(text, "sm70_time_to_first_token_seconds_bucket{le=\"+Inf\"}") ==
		    N_JOBS + 1);
	assert_true(sample(text, "sm70_inter_token_latency_seconds_count") ==
		    N_JOBS * (GEN_TOKENS - 1) + WARM_TOKENS - 1);
	assert_true(sample(text, "sm70_request_duration_seconds_count") == N_JOBS + 1);
	assert_true(sample(text, "sm70_requests_finished_total{reason=\"length\"}") ==
		    N_JOBS + 1);
	assert_true(sample(text, "sm70_requests_finished_total{reason=\"cancelled\"}") == 0);
	assert_true(sample(text, "sm70_prompt_tokens_total") == (N_JOBS + 1) * PROMPT_LEN);
	assert_true(sample(text, "sm70_generation_tokens_total") ==
		    N_JOBS * GEN_TOKENS + WARM_TOKENS);
	assert_true(sample(text, "sm70_prefix_cache_hit_tokens_total") == 0);
	assert_true(sample(text, "sm70_preemptions_total") == 0);
	assert_true(sample(text, "sm70_client_errors_total{code=\"busy\"}") == 0);
	assert_true(sample(text, "sm70_requests_running") == 0);
	assert_true(sample(text, "sm70_requests_waiting") == 0);
	assert_true(sample(text, "sm70_kv_cache_usage_ratio") == 0);
	assert_true(sample(text, "sm70_clients_connected") == 1);
	assert_non_null(strstr(text, "# TYPE sm70_gpu_memory_used_bytes gauge\n"));
	assert_null(strstr(text, "sm70_gpu_memory_used_bytes{")); /* none on the CPU backend */

	/* every job entered the engine and got tokens: one observation each; the phases
	 * split TTFT (queue + prefill) and the inter-token time (decode) exactly */
	assert_true(sample(text, "sm70_request_queue_seconds_count") == N_JOBS + 1);
	assert_true(sample(text, "sm70_request_prefill_seconds_count") == N_JOBS + 1);
	assert_true(sample(text, "sm70_request_decode_seconds_count") == N_JOBS + 1);
	assert_true(sample(text, "sm70_request_decode_seconds_bucket{le=\"+Inf\"}") == N_JOBS + 1);
	{
		double q = sample(text, "sm70_request_queue_seconds_sum");
		double p = sample(text, "sm70_request_prefill_seconds_sum");
		double dec = sample(text, "sm70_request_decode_seconds_sum");
		double ttft = sample(text, "sm70_time_to_first_token_seconds_sum");
		double itl = sample(text, "sm70_inter_token_latency_seconds_sum");

		printf("phases: queue %.4f s + prefill %.4f s = %.4f s (TTFT sum %.4f s); decode "
		       "%.4f s (ITL sum %.4f s)\n", q, p, q + p, ttft, dec, itl);
		/* max_seqs 2 and feed_depth 1: most jobs waited in their client's queue */
		assert_true(q > 0 && p > 0 && dec > 0);
		assert_true(fabs(q + p - ttft) <= 1e-5 * (N_JOBS + 1) + 1e-6 * ttft);
		assert_true(fabs(dec - itl) <= 1e-5 * (N_JOBS + 1) + 1e-6 * itl);
	}
	/* the prefix cache was asked at each admission; the prompts differ: no hits */
	assert_true(sample(text, "sm70_prefix_cache_queries_total") == N_JOBS + 1);
	assert_true(sample(text, "sm70_prefix_cache_query_tokens_total") ==
		    (N_JOBS + 1) * PROMPT_LEN);
	assert_true(sample(text, "sm70_prefix_cache_hits_total") == 0);
	assert_true(sample(text, "sm70_prefix_cache_hit_blocks_total") == 0);
	assert_true(sample(text, "sm70_model_info{model=\"" MODEL_NAME "\",backend=\"cpu\","
			   "tp=\"1\"}") == 1);
	assert_true(sample(text, "sm70_model_context_tokens") == 4096);
	assert_true(sample(text, "sm70_kv_cache_tokens") > 4096);
	{
		const char *b = strstr(text, "\nsm70_build_info{version=\"");
		char line[256];

		assert_non_null(b);
		sscanf(b + 1, "%255[^\n]", line);
		printf("build: %s\n", line);
		assert_non_null(strstr(line, "\",git=\""));
		assert_non_null(strstr(line, ",backend=\"cpu\",cuda=\""));
		assert_null(strstr(line, "=\"\"")); /* no empty label */
		assert_true(strcmp(line + strlen(line) - 3, "} 1") == 0);
	}

	ttft_d = sample(text, "sm70_time_to_first_token_seconds_sum") - ttft0;
	itl_d = sample(text, "sm70_inter_token_latency_seconds_sum") - itl0;
	printf("TTFT sum: daemon %.4f s, client %.4f s (%.1f%%); ITL sum: daemon %.4f s, "
	       "client %.4f s (%.1f%%)\n", ttft_d, ttft_client,
	       100 * fabs(ttft_d - ttft_client) / ttft_client, itl_d, itl_client,
	       100 * fabs(itl_d - itl_client) / itl_client);
	assert_true(fabs(ttft_d - ttft_client) <= 0.1 * ttft_client);
	assert_true(fabs(itl_d - itl_client) <= 0.1 * itl_client);
	assert_true(sample(text, "sm70_request_duration_seconds_sum") >= ttft_d + itl_d);
	free(text);
	sm70_client_close(c);
}

/* Cancelling running jobs frees their KV blocks (the prefix cache's parked blocks count as
 * free) and empties the running gauge. */
static void test_cancel_frees_kv(void **state)
{
	struct sm70_client *c = connect_ok();
	uint32_t prompts[4][PROMPT_LEN];
	uint64_t ids[4];
	int tokens = 0, finals = 0;
	double kv_running, t0 = now_s();
	char *text;

	for (int k = 0; k < 4; k++) {
		struct sm70_job j;

		make_job(&j, prompts[k], 100 + k, 3000);
		assert_int_equal(sm70_submit(c, &j, &ids[k]), 0);
	}
	while (tokens < 40) { /* both running jobs are well into decoding */
		struct sm70_event ev = { .size = sizeof(ev) };

		assert_int_equal(sm70_next_event(c, &ev, 10000), 0);
		assert_int_equal(ev.type, SM70_EVENT_TOKEN);
		tokens++;
	}
	text = metrics_text();
	kv_running = sample(text, "sm70_kv_cache_usage_ratio");
	printf("while running: kv usage %.5f, running %.0f, waiting %.0f\n", kv_running,
	       sample(text, "sm70_requests_running"), sample(text, "sm70_requests_waiting"));
	assert_true(kv_running > 0);
	assert_true(sample(text, "sm70_requests_running") == 2);
	assert_true(sample(text, "sm70_requests_waiting") == 2);
	free(text);

	for (int k = 0; k < 4; k++)
		assert_int_equal(sm70_cancel(c, ids[k]), 0);
	while (finals < 4) {
		struct sm70_event ev = { .size = sizeof(ev) };

		assert_int_equal(sm70_next_event(c, &ev, 10000), 0);
		if (ev.flags & SM70_EVENT_FINAL) {
			assert_int_equal(ev.finish_reason, SM70_REASON_CANCELLED);
			finals++;
		}
	}
	text = metrics_text();
	printf("after cancelling 4 jobs (%.2f s): kv usage %.5f, running %.0f, waiting %.0f, "
	       "cancelled %.0f\n", now_s() - t0, sample(text, "sm70_kv_cache_usage_ratio"),
	       sample(text, "sm70_requests_running"), sample(text, "sm70_requests_waiting"),
	       sample(text, "sm70_requests_finished_total{reason=\"cancelled\"}"));
	assert_true(sample(text, "sm70_kv_cache_usage_ratio") == 0);
	assert_true(sample(text, "sm70_requests_running") == 0);
	assert_true(sample(text, "sm70_requests_waiting") == 0);
	assert_true(sample(text, "sm70_requests_finished_total{reason=\"cancelled\"}") == 4);
	assert_true(sample(text, "sm70_request_duration_seconds_count") == N_JOBS + 1 + 4);
	free(text);
	sm70_client_close(c);
}

/* The same prompt twice: the second admission finds the first's full block. And the
 * welcome names the model as configured. */
static void test_prefix_hits_and_name(void **state)
{
	struct sm70_client *c = connect_ok();
	struct sm70_client_info info = { .size = sizeof(info) };
	struct sm70_result res = { .size = sizeof(res) };
	uint32_t prompt[PROMPT_LEN];
	double q0, qt0, h0, hb0, ht0;
	struct sm70_job j;
	char *text;

	assert_int_equal(sm70_client_info(c, &info), 0);
	assert_string_equal(info.model_name, MODEL_NAME);
	text = metrics_text();
	q0 = sample(text, "sm70_prefix_cache_queries_total");
	qt0 = sample(text, "sm70_prefix_cache_query_tokens_total");
	h0 = sample(text, "sm70_prefix_cache_hits_total");
	hb0 = sample(text, "sm70_prefix_cache_hit_blocks_total");
	ht0 = sample(text, "sm70_prefix_cache_hit_tokens_total");
	free(text);
	for (int run = 0; run < 2; run++) {
		make_job(&j, prompt, 300, 4);
		assert_int_equal(sm70_generate(c, &j, NULL, NULL, &res), 0);
	}
	text = metrics_text();
	printf("prefix cache after one prompt twice: %.0f queries of %.0f tokens, %.0f hits, "
	       "%.0f blocks, %.0f tokens\n", sample(text, "sm70_prefix_cache_queries_total") - q0,
	       sample(text, "sm70_prefix_cache_query_tokens_total") - qt0,
	       sample(text, "sm70_prefix_cache_hits_total") - h0,
	       sample(text, "sm70_prefix_cache_hit_blocks_total") - hb0,
	       sample(text, "sm70_prefix_cache_hit_tokens_total") - ht0);
	assert_true(sample(text, "sm70_prefix_cache_queries_total") - q0 == 2);
	assert_true(sample(text, "sm70_prefix_cache_query_tokens_total") - qt0 == 2 * PROMPT_LEN);
	assert_true(sample(text, "sm70_prefix_cache_hits_total") - h0 == 1);
	/* block size 16: one full block ends before the 24-token prompt's last token */
	assert_true(sample(text, "sm70_prefix_cache_hit_blocks_total") - hb0 == 1);
	assert_true(sample(text, "sm70_prefix_cache_hit_tokens_total") - ht0 == 16);
	assert_int_equal(res.usage.cached_tokens, 16);
	free(text);
	sm70_client_close(c);
}

static void test_sm70ctl(void **state)
{
	static char out[65536];
	char args[256];
	json_t *r;
	int st;

	snprintf(args, sizeof(args), "--socket %s status --json", admin_path);
	assert_int_equal(ctl(args, out, sizeof(out)), 0);
	r = json_loads(out, 0, NULL);
	assert_non_null(r);
	assert_string_equal(json_string_value(json_object_get(r, "backend")), "cpu");
	assert_string_equal(json_string_value(json_object_get(r, "model")), MODEL_NAME);
	assert_int_equal(json_integer_value(json_object_get(r, "context_tokens")), 4096);
	assert_int_equal(json_array_size(json_object_get(r, "warnings")), 0);
	assert_non_null(json_string_value(json_object_get(r, "version")));
	assert_true(json_is_true(json_object_get(r, "ready")));
	assert_true(json_integer_value(json_object_get(r, "generation_tokens_total")) >=
		    N_JOBS * GEN_TOKENS + WARM_TOKENS + 40);
	assert_int_equal(json_array_size(json_object_get(r, "gpus")), 0);
	json_decref(r);

	snprintf(args, sizeof(args), "--socket %s status", admin_path);
	assert_int_equal(ctl(args, out, sizeof(out)), 0);
	assert_non_null(strstr(out, "backend    cpu"));
	assert_non_null(strstr(out, "tokens/s"));

	snprintf(args, sizeof(args), "--socket %s jobs --json", admin_path);
	assert_int_equal(ctl(args, out, sizeof(out)), 0);
	r = json_loads(out, 0, NULL);
	assert_true(json_is_array(json_object_get(r, "jobs")));
	json_decref(r);

	snprintf(args, sizeof(args), "--socket %s clients --json", admin_path);
	assert_int_equal(ctl(args, out, sizeof(out)), 0);
	r = json_loads(out, 0, NULL);
	assert_true(json_is_array(json_object_get(r, "clients")));
	json_decref(r);

	snprintf(args, sizeof(args), "--socket %s health live", admin_path);
	assert_int_equal(ctl(args, out, sizeof(out)), 0);
	snprintf(args, sizeof(args), "--socket %s health ready --json", admin_path);
	assert_int_equal(ctl(args, out, sizeof(out)), 0);
	r = json_loads(out, 0, NULL);
	assert_true(json_is_true(json_object_get(r, "ready")));
	json_decref(r);

	snprintf(args, sizeof(args), "--socket %s metrics", admin_path);
	assert_int_equal(ctl(args, out, sizeof(out)), 0);
	assert_non_null(strstr(out, "# TYPE sm70_requests_running gauge"));

	/* exit codes: usage 2, not running 3 */
	assert_int_equal(ctl("--socket /nonexistent/sm70.admin status", out, sizeof(out)), 3);
	assert_int_equal(ctl("health", out, sizeof(out)), 2);
	assert_int_equal(ctl("frobnicate", out, sizeof(out)), 2);
	st = ctl("--socket /nonexistent/sm70.admin health ready", out, sizeof(out));
	printf("sm70ctl: status/jobs/clients/health/metrics ok, --json parsed; no daemon -> %d\n",
	       st);
	assert_int_equal(st, 3);
}

/* drain: running jobs finish, new ones are refused with E_SHUTDOWN, the daemon stays up
 * and says it is not ready. Runs last. */
static void test_drain(void **state)
{
	struct sm70_client *c = connect_ok();
	struct sm70_event ev = { .size = sizeof(ev) };
	uint32_t prompt[PROMPT_LEN];
	struct sm70_job j;
	static char out[4096];
	char args[256];
	uint64_t id;
	int finals = 0, tokens = 0;

	make_job(&j, prompt, 200, 200);
	assert_int_equal(sm70_submit(c, &j, &id), 0);
	assert_int_equal(sm70_next_event(c, &ev, 10000), 0); /* it runs */
	snprintf(args, sizeof(args), "--socket %s drain", admin_path);
	assert_int_equal(ctl(args, out, sizeof(out)), 0);
	assert_non_null(strstr(out, "drained"));
	while (!finals) {
		ev.size = sizeof(ev);
		assert_int_equal(sm70_next_event(c, &ev, 10000), 0);
		tokens += ev.type == SM70_EVENT_TOKEN;
		finals += !!(ev.flags & SM70_EVENT_FINAL);
	}
	assert_int_equal(ev.finish_reason, SM70_REASON_LENGTH); /* finished, not cut */

	make_job(&j, prompt, 201, 8);
	assert_int_equal(sm70_submit(c, &j, &id), 0);
	ev.size = sizeof(ev);
	assert_int_equal(sm70_next_event(c, &ev, 10000), 0);
	assert_int_equal(ev.type, SM70_EVENT_ERROR);
	assert_int_equal(ev.error, -SM70_E_SHUTDOWN);

	snprintf(args, sizeof(args), "--socket %s health ready", admin_path);
	assert_int_equal(ctl(args, out, sizeof(out)), 1);
	snprintf(args, sizeof(args), "--socket %s health live", admin_path);
	assert_int_equal(ctl(args, out, sizeof(out)), 0);
	{
		char *text = metrics_text();

		assert_true(sample(text, "sm70_client_errors_total{code=\"shutdown\"}") == 1);
		free(text);
	}
	printf("drain: the running job finished after %d more tokens; a new one got "
	       "E_SHUTDOWN; health ready -> 1, live -> 0\n", tokens);
	sm70_client_close(c);
}

static int setup(void **state)
{
	int ret = sm70t_daemon_start(&T, config_json, NULL);

	snprintf(admin_path, sizeof(admin_path), "%.80s.admin", T.sock);
	return ret;
}

static int teardown(void **state)
{
	int st = sm70t_daemon_stop(&T, SIGTERM, 10000);

	if (st != 0)
		sm70t_daemon_dump_log(&T);
	unlink(admin_path);
	sm70t_daemon_cleanup(&T);
	return st == 0 ? 0 : -1;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_counters_and_histograms),
		cmocka_unit_test(test_cancel_frees_kv),
		cmocka_unit_test(test_prefix_hits_and_name),
		cmocka_unit_test(test_sm70ctl),
		cmocka_unit_test(test_drain),
	};

	signal(SIGPIPE, SIG_IGN);
	return cmocka_run_group_tests(tests, setup, teardown);
}
