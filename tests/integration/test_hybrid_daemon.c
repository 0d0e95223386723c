/* test_hybrid_daemon - sm70d serves hybrid (DeltaNet) and MoE fixtures to concurrent clients with transformers' tokens. */
/*
 * For each of a qwen3_5 fixture (DeltaNet + gated attention), a qwen3_next one (DeltaNet,
 * MoE with a shared expert, one dense layer), a qwen3_moe one (attention + MoE) and a
 * qwen4_exp one (hyper-connections, QSA, n-gram tables in pinned host memory), the
 * daemon runs it on the CPU backend with a 64-token step budget, so the long prompts are
 * chunked over several steps while other clients decode. Four client processes each
 * submit every case of the fixture's reference.json (greedy, the reference's
 * max_new_tokens) at once on one connection; each stream must equal transformers'
 * continuation. `sm70ctl --json status` must then show the recurrent state beside the KV
 * cache (hybrid models: every state slot and KV block free again, the prefix cache off
 * with its reason; the MoE-only model: no state, the prefix cache on) and the pinned
 * n-gram tables' size.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "sm70/client.h"
#include "tests/integration/daemon_util.h"

static const struct {
	const char *dir;
	int recurrent;
} fixtures[] = {
	{ "tests/fixtures/qwen3_5-gqa6-d256-hybrid", 1 },
	{ "tests/fixtures/qwen3_next-e16k3", 1 },
	{ "tests/fixtures/qwen3_moe-e8k2", 0 },
	{ "tests/fixtures/qwen4_exp-hc4-qsa-ple", 1 },
};
#define MAX_CASES 8
#define MAX_PROMPT 1024
#define MAX_TOK 32
#define N_CLIENTS 4

static int n_cases;
static uint32_t prompt[MAX_CASES][MAX_PROMPT];
static uint32_t prompt_len[MAX_CASES];
static uint32_t want[MAX_CASES][MAX_TOK];
static uint32_t want_n[MAX_CASES];
static uint32_t max_new[MAX_CASES];

/* What a client reports per finished job. */
struct rec {
	int32_t job;
	int32_t error;
	uint32_t n;
	uint32_t tok[MAX_TOK];
};

static void load_reference(const char *dir)
{
	json_error_t je;
	char path[256];
	json_t *ref, *cases, *c;
	size_t i;

	snprintf(path, sizeof(path), "%s/reference.json", dir);
	ref = json_load_file(path, 0, &je);
	assert_non_null(ref);
	cases = json_object_get(ref, "cases");
	json_array_foreach(cases, i, c) {
		json_t *p = json_object_get(c, "prompt"), *t = json_object_get(c, "tokens"), *v;
		size_t k;

		assert_true(i < MAX_CASES);
		assert_true(json_array_size(p) <= MAX_PROMPT);
		assert_true(json_array_size(t) <= MAX_TOK);
		json_array_foreach(p, k, v)
			prompt[i][k] = (uint32_t)json_integer_value(v);
		prompt_len[i] = (uint32_t)json_array_size(p);
		json_array_foreach(t, k, v)
			want[i][k] = (uint32_t)json_integer_value(v);
		want_n[i] = (uint32_t)json_array_size(t);
		max_new[i] = (uint32_t)json_integer_value(json_object_get(c, "max_new_tokens"));
		n_cases = (int)i + 1;
	}
	json_decref(ref);
}

/* A client process: every case at once on one connection, one record per finished job.
 * Never returns; exit 0, or 1 with a message when the SDK failed. */
static void client_body(const char *sock, int wfd)
{
	struct sm70_client *c = NULL;
	struct rec r[MAX_CASES] = { { 0 } };
	int done = 0, ret;

	ret = sm70_client_connect(&c, sock, NULL);
	if (ret) {
		fprintf(stderr, "client: connect: %s\n", sm70_strerror(ret));
		_exit(1);
	}
	for (int j = 0; j < n_cases; j++) {
		struct sm70_job job;
		uint64_t id;

		sm70_job_init(&job);
		job.prompt = prompt[j];
		job.prompt_len = prompt_len[j];
		job.max_tokens = max_new[j];
		job.user_tag = (uint64_t)j;
		r[j].job = j;
		while ((ret = sm70_submit(c, &job, &id)) == -EAGAIN)
			usleep(100);
		if (ret) {
			fprintf(stderr, "client: submit: %s\n", sm70_strerror(ret));
			_exit(1);
		}
	}
	while (done < n_cases) {
		struct sm70_event ev = { .size = sizeof(ev) };
		struct rec *x;

		ret = sm70_next_event(c, &ev, 60000);
		if (ret || ev.user_tag >= (uint64_t)n_cases) {
			fprintf(stderr, "client: next_event: %s\n", sm70_strerror(ret));
			_exit(1);
		}
		x = &r[ev.user_tag];
		if (ev.type == SM70_EVENT_TOKEN && x->n < MAX_TOK)
			x->tok[x->n++] = ev.token;
		if (ev.flags & SM70_EVENT_FINAL) {
			x->error = ev.error;
			if (write(wfd, x, sizeof(*x)) != (ssize_t)sizeof(*x))
				_exit(1);
			done++;
		}
	}
	sm70_client_close(c);
	_exit(0);
}

static long long ival(json_t *o, const char *k)
{
	return json_integer_value(json_object_get(o, k));
}

static void serve_fixture(const char *dir, int recurrent)
{
	static const char *const extra[] = { NULL };
	struct sm70t_daemon d;
	pid_t pid[N_CLIENTS];
	int rfd[N_CLIENTS], matched = 0;
	json_t *st = NULL;

	load_reference(dir);
	assert_int_equal(sm70t_daemon_start_model(&d, dir, "{\"engine\": {\"max_batch_tokens\":"
						  " 64, \"max_seqs\": 8}}", extra), 0);
	for (int i = 0; i < N_CLIENTS; i++) {
		int fds[2];

		assert_int_equal(pipe(fds), 0);
		fflush(NULL);
		pid[i] = fork();
		assert_true(pid[i] >= 0);
		if (pid[i] == 0) {
			close(fds[0]);
			client_body(d.sock, fds[1]);
		}
		close(fds[1]);
		rfd[i] = fds[0];
	}
	for (int i = 0; i < N_CLIENTS; i++) {
		struct rec x;
		int status;

		while (read(rfd[i], &x, sizeof(x)) == (ssize_t)sizeof(x)) {
			assert_int_equal(x.error, 0);
			assert_true(x.job >= 0 && x.job < n_cases);
			if (x.n != want_n[x.job] ||
			    memcmp(x.tok, want[x.job], sizeof(uint32_t) * x.n) != 0) {
				sm70t_daemon_dump_log(&d);
				fail_msg("client %d case %d (prompt %u tokens): %u tokens differ from "
					 "transformers' %u", i, x.job, prompt_len[x.job], x.n,
					 want_n[x.job]);
			}
			matched++;
		}
		close(rfd[i]);
		assert_int_equal(waitpid(pid[i], &status, 0), pid[i]);
		assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	}
	printf("%s: %d clients x %d cases (prompts up to %u tokens, 64-token steps): %d streams "
	       "equal transformers\n", dir, N_CLIENTS, n_cases, prompt_len[n_cases - 1], matched);
	assert_int_equal(matched, N_CLIENTS * n_cases);

	/* the daemon's books: state beside the KV cache, everything returned */
	for (long t0 = sm70t_ms_now(); sm70t_ms_now() - t0 < 3000; usleep(20000)) {
		json_decref(st);
		st = sm70t_ctl_status(&d);
		assert_non_null(st);
		if (ival(st, "jobs") == 0 && ival(st, "kv_blocks_free") == ival(st, "kv_blocks_total"))
			break;
	}
	printf("  sm70ctl status: %lld of %lld state slots free (%lld bytes), %lld of %lld KV blocks "
	       "free, prefix cache %s (%s)\n", ival(st, "state_slots_free"),
	       ival(st, "state_slots_total"), ival(st, "state_bytes"), ival(st, "kv_blocks_free"),
	       ival(st, "kv_blocks_total"),
	       json_is_true(json_object_get(st, "prefix_cache")) ? "on" : "off",
	       json_is_string(json_object_get(st, "prefix_cache_off_reason")) ?
		       json_string_value(json_object_get(st, "prefix_cache_off_reason")) :
		       "no reason needed");
	assert_int_equal(ival(st, "state_slots_total"), recurrent ? 8 : 0);
	assert_int_equal(ival(st, "state_slots_free"), recurrent ? 8 : 0);
	assert_true(recurrent ? ival(st, "state_bytes") > 0 : ival(st, "state_bytes") == 0);
	assert_int_equal(ival(st, "kv_blocks_free"), ival(st, "kv_blocks_total"));
	assert_true(json_is_boolean(json_object_get(st, "prefix_cache")));
	assert_int_equal(json_is_true(json_object_get(st, "prefix_cache")), !recurrent);
	/* qwen4_exp: its two n-gram tables (2064 and 2208 bf16 rows of 16) in pinned memory */
	assert_int_equal(ival(st, "pinned_host_bytes"),
			 strstr(dir, "qwen4_exp") ? (2064 + 2208) * 16 * 2 : 0);
	json_decref(st);
	assert_int_equal(sm70t_daemon_stop(&d, SIGTERM, 10000), 0);
	sm70t_daemon_cleanup(&d);
}

static void test_concurrent_clients(void **state)
{
	for (size_t i = 0; i < sizeof(fixtures) / sizeof(fixtures[0]); i++)
		serve_fixture(fixtures[i].dir, fixtures[i].recurrent);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_concurrent_clients),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
