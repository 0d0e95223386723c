/* test_many_clients - sm70d and 1..16 client processes: streams equal sm70-run; kills free. */
/*
 * The expected tokens of each prompt come from `$SM70_BUILD/bin/sm70-run --json` (the
 * offline engine), once per prompt. Clients are forked processes that use libsm70client
 * and report each finished job through a pipe; the parent compares. A client killed with
 * SIGKILL mid-stream must leave the daemon and the other clients' streams untouched.
 * Memory, two ways: the daemon's own counters (`sm70ctl --json status`: no job left and
 * every KV block free after the cancels and after the kill), and what freeing enables: on a
 * daemon whose KV cache holds 512 tokens, a 504-token job must still run to its length
 * after jobs holding most of the cache were cancelled (sm70_cancel) or lost with their
 * killed client.
 */
#include <errno.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
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

#define FIXTURE "tests/fixtures/qwen3-gqa2-d64-tied"
#define N_PROMPTS 4
#define MAX_NEW 12
#define MAX_REC 16 /* tokens a result record carries */
#define BIG_NEW 500 /* 4 + 500 tokens: 32 blocks of 16 = the whole small KV cache */

static const uint32_t prompts[N_PROMPTS][6] = {
	{ 52, 261, 158 },
	{ 1, 2, 3, 4, 5 },
	{ 300, 17, 99, 250, 12, 7 },
	{ 5, 480, 33, 9 },
};
static const uint32_t prompt_lens[N_PROMPTS] = { 3, 5, 6, 4 };

/* sm70-run's output per prompt */
static uint32_t want[N_PROMPTS][MAX_NEW];
static uint32_t want_n[N_PROMPTS];
static int want_stop[N_PROMPTS]; /* 1: "stop", 0: "length" */

static struct sm70t_daemon dmn;

/* One finished job, written by a client process into its pipe. prompt -1 is the marker a
 * client writes when its first token arrived. */
struct rec {
	int32_t prompt;
	int32_t error;
	uint32_t reason;
	uint32_t n;
	uint32_t tok[MAX_REC];
};

/* Runs sm70-run on prompt p and stores its tokens. Returns 0 or -1. */
static int expect_from_sm70_run(int p)
{
	char cmd[512], ids[128] = "", *out = NULL;
	size_t len = 0;
	json_error_t je;
	json_t *root, *toks, *v;
	const char *fin;
	FILE *f;
	size_t i;
	int off = 0;

	for (uint32_t k = 0; k < prompt_lens[p]; k++)
		off += snprintf(ids + off, sizeof(ids) - (size_t)off, "%s%u", k ? "," : "",
				prompts[p][k]);
	snprintf(cmd, sizeof(cmd), "%s/bin/sm70-run -m %s --backend cpu --threads 1 "
		 "--prompt-ids %s -n %d --json", sm70t_build_dir(), FIXTURE, ids, MAX_NEW);
	f = popen(cmd, "r");
	if (!f)
		return -1;
	if (getline(&out, &len, f) < 0 || pclose(f) != 0) {
		free(out);
		fprintf(stderr, "failed: %s\n", cmd);
		return -1;
	}
	root = json_loads(out, 0, &je);
	free(out);
	if (!root)
		return -1;
	toks = json_object_get(root, "tokens");
	fin = json_string_value(json_object_get(root, "finish_reason"));
	json_array_foreach(toks, i, v)
		if (i < MAX_NEW)
			want[p][want_n[p]++] = (uint32_t)json_integer_value(v);
	want_stop[p] = fin && strcmp(fin, "stop") == 0;
	printf("sm70-run prompt %d: %u tokens, finish %s\n", p, want_n[p], fin ? fin : "?");
	json_decref(root);
	return want_n[p] > 0 ? 0 : -1;
}

/* ---- client processes --------------------------------------------------------------------- */

struct child {
	pid_t pid;
	int rfd; /* records from the child */
};

/* The child's body: n_jobs jobs (prompt (first + j) % N_PROMPTS, max_new tokens each,
 * ignore_eos as given) all submitted at once on one connection; one record per finished
 * job; with marker_after > 0, a marker record once that many tokens arrived in total.
 * Never returns. Exit status: 0, or 1 when the SDK failed (a message on stderr). */
static void child_body(const char *sock, int wfd, int first, int n_jobs, uint32_t max_new,
		       int ignore_eos, int marker_after)
{
	struct sm70_client *c = NULL;
	struct rec *r = calloc((size_t)n_jobs, sizeof(*r));
	int done = 0, seen = 0, ret;

	ret = sm70_client_connect(&c, sock, NULL);
	if (ret || !r) {
		fprintf(stderr, "child: connect: %s\n", sm70_strerror(ret));
		_exit(1);
	}
	for (int j = 0; j < n_jobs; j++) {
		struct sm70_job job;
		uint64_t id;
		int p = (first + j) % N_PROMPTS;

		sm70_job_init(&job);
		job.prompt = prompts[p];
		job.prompt_len = prompt_lens[p];
		job.max_tokens = max_new;
		job.flags = ignore_eos ? SM70_JOB_IGNORE_EOS : 0;
		job.user_tag = (uint64_t)j;
		r[j].prompt = p;
		while ((ret = sm70_submit(c, &job, &id)) == -EAGAIN)
			usleep(100);
		if (ret) {
			fprintf(stderr, "child: submit: %s\n", sm70_strerror(ret));
			_exit(1);
		}
	}
	while (done < n_jobs) {
		struct sm70_event ev = { .size = sizeof(ev) };
		struct rec *x;

		ret = sm70_next_event(c, &ev, 20000);
		if (ret) {
			fprintf(stderr, "child: next_event: %s\n", sm70_strerror(ret));
			_exit(1);
		}
		if (ev.user_tag >= (uint64_t)n_jobs)
			_exit(1);
		x = &r[ev.user_tag];
		if (ev.type == SM70_EVENT_TOKEN) {
			if (x->n < MAX_REC)
				x->tok[x->n] = ev.token;
			x->n++;
			if (++seen == marker_after) {
				struct rec m = { .prompt = -1 };

				if (write(wfd, &m, sizeof(m)) != (ssize_t)sizeof(m))
					_exit(1);
			}
		}
		if (ev.flags & SM70_EVENT_FINAL) {
			x->reason = ev.finish_reason;
			x->error = ev.error;
			if (write(wfd, x, sizeof(*x)) != (ssize_t)sizeof(*x))
				_exit(1);
			done++;
		}
	}
	sm70_client_close(c);
	_exit(0);
}

static void child_start(struct child *ch, const char *sock, int first, int n_jobs,
			uint32_t max_new, int ignore_eos, int marker_after)
{
	int fds[2];

	assert_int_equal(pipe(fds), 0);
	fflush(NULL);
	ch->pid = fork();
	assert_true(ch->pid >= 0);
	if (ch->pid == 0) {
		close(fds[0]);
		child_body(sock, fds[1], first, n_jobs, max_new, ignore_eos, marker_after);
	}
	close(fds[1]);
	ch->rfd = fds[0];
}

/* Reads the next record within timeout_ms. Returns 1, 0 at EOF, -ETIMEDOUT. */
static int child_read(struct child *ch, struct rec *r, int timeout_ms)
{
	struct pollfd p = { .fd = ch->rfd, .events = POLLIN };
	size_t got = 0;

	while (got < sizeof(*r)) {
		ssize_t n;

		if (poll(&p, 1, timeout_ms) != 1)
			return -ETIMEDOUT;
		n = read(ch->rfd, (char *)r + got, sizeof(*r) - got);
		if (n <= 0)
			return got ? -EPROTO : 0;
		got += (size_t)n;
	}
	return 1;
}

/* Collects every record of a child that runs to its end; checks each against sm70-run and
 * the exit status. Returns the number of jobs checked. */
static int child_finish_checked(struct child *ch)
{
	struct rec r;
	int n = 0, ret, status;

	while ((ret = child_read(ch, &r, 30000)) == 1) {
		uint32_t m;

		if (r.prompt < 0)
			continue; /* a marker */
		assert_true(r.prompt < N_PROMPTS);
		assert_int_equal(r.error, 0);
		assert_int_equal(r.reason, want_stop[r.prompt] ? SM70_REASON_STOP_EOS :
					       SM70_REASON_LENGTH);
		assert_int_equal(r.n, want_n[r.prompt]);
		m = r.n < MAX_REC ? r.n : MAX_REC;
		assert_memory_equal(r.tok, want[r.prompt], sizeof(uint32_t) * m);
		n++;
	}
	assert_int_equal(ret, 0);
	close(ch->rfd);
	assert_int_equal(waitpid(ch->pid, &status, 0), ch->pid);
	assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	return n;
}

/* ---- fixture ------------------------------------------------------------------------------ */

static int setup(void **state)
{
	static const char cfg[] =
		"{ \"engine\": { \"n_threads\": 1, \"max_seqs\": 16 },\n"
		"  \"limits\": { \"max_jobs_in_flight\": 16, \"max_new_tokens\": 4000 } }\n";

	for (int p = 0; p < N_PROMPTS; p++)
		if (expect_from_sm70_run(p))
			return -1;
	return sm70t_daemon_start(&dmn, cfg, NULL);
}

static int teardown(void **state)
{
	(void)state;
	return sm70t_daemon_finish(&dmn, 5000);
}

/* ---- tests -------------------------------------------------------------------------------- */

static void run_clients(int n_clients, int jobs_each)
{
	struct child ch[16];
	long t0 = sm70t_ms_now();
	int total = 0;

	assert_true(n_clients <= 16);
	for (int i = 0; i < n_clients; i++)
		child_start(&ch[i], dmn.sock, i, jobs_each, MAX_NEW, 0, 0);
	for (int i = 0; i < n_clients; i++)
		total += child_finish_checked(&ch[i]);
	assert_int_equal(total, n_clients * jobs_each);
	printf("%2d client processes x %d jobs: all %d greedy streams equal sm70-run token for "
	       "token (%ld ms)\n", n_clients, jobs_each, total, sm70t_ms_now() - t0);
}

static void test_one_client(void **state)
{
	run_clients(1, 1);
	run_clients(1, N_PROMPTS);
}

static void test_4_clients(void **state)
{
	run_clients(4, 1);
}

static void test_16_clients(void **state)
{
	run_clients(16, 1);
}

static void test_4_clients_8_jobs(void **state)
{
	run_clients(4, 8);
}

static void test_killed_client_leaves_others_alone(void **state)
{
	struct child victim, good[3];
	struct rec r;
	int status, total = 0;

	/* the victim streams two long jobs; it is killed once the others are streaming too */
	child_start(&victim, dmn.sock, 0, 2, 2000, 1, 3);
	assert_int_equal(child_read(&victim, &r, 10000), 1);
	assert_int_equal(r.prompt, -1);
	for (int i = 0; i < 3; i++) {
		child_start(&good[i], dmn.sock, i + 1, 8, MAX_NEW, 0, 1);
		assert_int_equal(child_read(&good[i], &r, 10000), 1);
		assert_int_equal(r.prompt, -1);
	}
	assert_int_equal(kill(victim.pid, SIGKILL), 0);
	assert_int_equal(waitpid(victim.pid, &status, 0), victim.pid);
	assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
	close(victim.rfd);
	for (int i = 0; i < 3; i++)
		total += child_finish_checked(&good[i]);
	assert_int_equal(total, 24);
	assert_int_equal(kill(dmn.pid, 0), 0);
	for (long t0 = sm70t_ms_now(); sm70t_ms_now() - t0 < 3000;) {
		if (sm70t_log_contains(&dmn, "hung up (2 jobs to cancel)"))
			break;
		usleep(10000);
	}
	assert_true(sm70t_log_contains(&dmn, "hung up (2 jobs to cancel)"));
	printf("SIGKILL of a client streaming 2 jobs while 3 others streamed 24: the daemon "
	       "cancelled its 2 jobs (log), the 24 streams equal sm70-run, sm70d still runs\n");
	run_clients(2, 2); /* and it keeps serving */
}

/* Waits up to 3 s for the daemon to report no job and every KV block free. */
static void expect_all_free(const struct sm70t_daemon *t, const char *after)
{
	int total = 0, fr = -1, jobs = -1;

	for (long t0 = sm70t_ms_now(); sm70t_ms_now() - t0 < 3000; usleep(20000)) {
		assert_int_equal(sm70t_kv_status(t, &jobs, &fr, &total), 0);
		if (jobs == 0 && fr == total)
			break;
	}
	printf("sm70ctl status after %s: %d jobs, %d of %d KV blocks free\n", after, jobs, fr,
	       total);
	assert_int_equal(jobs, 0);
	assert_int_equal(fr, total);
}

/* One BIG_NEW-token job on c: it needs every KV block of the small daemon. Returns its
 * tokens in out (BIG_NEW of them). */
static void big_job(struct sm70_client *c, uint32_t *out)
{
	struct sm70_event ev = { .size = sizeof(ev) };
	struct sm70_job job;
	uint64_t id;
	uint32_t n = 0;
	int ret;

	sm70_job_init(&job);
	job.prompt = prompts[3];
	job.prompt_len = prompt_lens[3];
	job.max_tokens = BIG_NEW;
	job.flags = SM70_JOB_IGNORE_EOS;
	assert_int_equal(sm70_submit(c, &job, &id), 0);
	for (;;) {
		ret = sm70_next_event(c, &ev, 10000);
		if (ret == -ETIMEDOUT)
			fail_msg("a job needing the whole KV cache made no progress for 10 s "
				 "after %u tokens: blocks were not freed", n);
		assert_int_equal(ret, 0);
		if (ev.type == SM70_EVENT_TOKEN && n < BIG_NEW)
			out[n++] = ev.token;
		if (ev.flags & SM70_EVENT_FINAL)
			break;
	}
	assert_int_equal(ev.type, SM70_EVENT_FINISH);
	assert_int_equal(ev.finish_reason, SM70_REASON_LENGTH);
	assert_int_equal(n, BIG_NEW);
}

static void test_cancel_and_kill_free_kv(void **state)
{
	static const char cfg[] =
		"{ \"engine\": { \"n_threads\": 1, \"max_seqs\": 4, \"block_size\": 16,\n"
		"              \"kv_bytes\": 1048576 },\n"
		"  \"limits\": { \"max_jobs_in_flight\": 8, \"max_new_tokens\": 4000 } }\n";
	static uint32_t first[BIG_NEW], again[BIG_NEW];
	struct sm70t_daemon small;
	struct sm70_client *c = NULL;
	struct sm70_event ev = { .size = sizeof(ev) };
	struct child victim;
	struct rec r;
	uint64_t ids[3];
	int tokens = 0, finals = 0, status, total = 0, free_blocks = 0, jobs = 0;

	assert_int_equal(sm70t_daemon_start(&small, cfg, NULL), 0);
	assert_int_equal(sm70_client_connect(&c, small.sock, NULL), 0);
	big_job(c, first);

	/* three long jobs hold most of the 32 blocks; cancel them mid-stream */
	for (int j = 0; j < 3; j++) {
		struct sm70_job job;

		sm70_job_init(&job);
		job.prompt = prompts[j];
		job.prompt_len = prompt_lens[j];
		job.max_tokens = 400;
		job.flags = SM70_JOB_IGNORE_EOS;
		assert_int_equal(sm70_submit(c, &job, &ids[j]), 0);
	}
	while (tokens < 300) {
		assert_int_equal(sm70_next_event(c, &ev, 10000), 0);
		tokens += ev.type == SM70_EVENT_TOKEN;
		assert_false(ev.flags & SM70_EVENT_FINAL);
	}
	assert_int_equal(sm70t_kv_status(&small, &jobs, &free_blocks, &total), 0);
	printf("sm70ctl status with 3 long jobs running: %d jobs, %d of %d KV blocks free\n",
	       jobs, free_blocks, total);
	assert_int_equal(jobs, 3);
	assert_true(free_blocks <= total - 4); /* the running jobs hold blocks */
	for (int j = 0; j < 3; j++)
		assert_int_equal(sm70_cancel(c, ids[j]), 0);
	while (finals < 3) {
		assert_int_equal(sm70_next_event(c, &ev, 10000), 0);
		if (ev.flags & SM70_EVENT_FINAL) {
			assert_int_equal(ev.type, SM70_EVENT_FINISH);
			assert_int_equal(ev.finish_reason, SM70_REASON_CANCELLED);
			finals++;
		}
	}
	expect_all_free(&small, "the cancels");
	big_job(c, again);
	assert_memory_equal(first, again, sizeof(first));
	printf("cancel: 3 jobs cancelled after %d tokens; then a %d-token job needing all 32 KV "
	       "blocks ran to its length, tokens equal to the first run\n", tokens, BIG_NEW);

	/* the same, but the jobs' client process is killed */
	child_start(&victim, small.sock, 0, 3, 400, 1, 300);
	assert_int_equal(child_read(&victim, &r, 10000), 1);
	assert_int_equal(r.prompt, -1);
	assert_int_equal(kill(victim.pid, SIGKILL), 0);
	assert_int_equal(waitpid(victim.pid, &status, 0), victim.pid);
	close(victim.rfd);
	expect_all_free(&small, "the kill");
	big_job(c, again);
	assert_memory_equal(first, again, sizeof(first));
	for (long t0 = sm70t_ms_now(); sm70t_ms_now() - t0 < 3000;) {
		if (sm70t_log_contains(&small, "hung up (3 jobs to cancel)"))
			break;
		usleep(10000);
	}
	assert_true(sm70t_log_contains(&small, "hung up (3 jobs to cancel)"));
	printf("kill: a client with 3 jobs holding the KV cache was SIGKILLed after 300 tokens; "
	       "the %d-token job ran to its length again\n", BIG_NEW);
	sm70_client_close(c);
	status = sm70t_daemon_stop(&small, SIGTERM, 5000);
	if (status != 0)
		sm70t_daemon_dump_log(&small);
	sm70t_daemon_cleanup(&small);
	assert_int_equal(status, 0);
}

/* A daemon splitting the model over two (simulated) tensor-parallel ranks serves the same
 * greedy streams. */
static void test_tp2_daemon(void **state)
{
	static const char cfg[] =
		"{ \"tp\": 2, \"engine\": { \"n_threads\": 1, \"max_seqs\": 16 },\n"
		"  \"limits\": { \"max_jobs_in_flight\": 16, \"max_new_tokens\": 4000 } }\n";
	struct sm70t_daemon tp2;
	struct child ch[4];
	int total = 0, status;

	assert_int_equal(sm70t_daemon_start(&tp2, cfg, NULL), 0);
	for (int i = 0; i < 4; i++)
		child_start(&ch[i], tp2.sock, i, 2, MAX_NEW, 0, 0);
	for (int i = 0; i < 4; i++)
		total += child_finish_checked(&ch[i]);
	assert_int_equal(total, 8);
	status = sm70t_daemon_stop(&tp2, SIGTERM, 5000);
	if (status != 0)
		sm70t_daemon_dump_log(&tp2);
	sm70t_daemon_cleanup(&tp2);
	assert_int_equal(status, 0);
	printf("tp 2 daemon: 4 client processes x 2 jobs equal sm70-run token for token\n");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_one_client),
		cmocka_unit_test(test_4_clients),
		cmocka_unit_test(test_16_clients),
		cmocka_unit_test(test_4_clients_8_jobs),
		cmocka_unit_test(test_killed_client_leaves_others_alone),
		cmocka_unit_test(test_cancel_and_kill_free_kv),
		cmocka_unit_test(test_tp2_daemon),
	};

	signal(SIGPIPE, SIG_IGN);
	return cmocka_run_group_tests(tests, setup, teardown);
}
