/* test_fairness - sm70d's scheduler: a burst does not starve others, priority wins, no job lost. */
/*
 * One sm70d on the null backend (--load-format dummy: the fixture's shapes, no numerics),
 * so a step costs microseconds and the order of events does not depend on the model's
 * speed. max_seqs 2 and feed_depth 2 make queueing visible: at most 4 jobs are inside the
 * engine, the rest wait in their client's queue in the daemon.
 *
 * When a job starts is read from its first TOKEN event: the null backend writes the
 * CLOCK_MONOTONIC time of the engine step that sampled a token into top_logprobs[1..3]
 * (kernels/null/null_backend.c), so the tokens of jobs on different connections can be
 * ordered by step exactly, whatever order this process happens to read them in. When a job
 * was accepted comes from the daemon's own FINISH usage (ttft_us before its first step).
 *
 * The bounds are stated in jobs, not in time: a job that arrives while others wait starts
 * after at most max_seqs + feed_depth jobs that were already fed into the engine, plus any
 * that had finished before it arrived (normally none; counted, so that a test process that
 * got descheduled does not make the test flaky). A burst is known to be inside the daemon
 * before the next job is sent: a refused entry after it (priority above the limit) comes
 * back only once the daemon has taken every entry before it.
 * Mutations of daemon/scheduler.c this catches (each tried): ties by session id instead of
 * round robin, pick() ignoring priority, the client queue ignoring priority, no feed cap.
 */
#include <errno.h>
#include <math.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "sm70/client.h"
#include "tests/integration/daemon_util.h"

#define MAX_SEQS 2
#define FEED_DEPTH 2
#define CAP (MAX_SEQS + FEED_DEPTH) /* jobs inside the engine at once */
#define MAX_JOBS 40		    /* max_jobs_in_flight */
#define MAX_PRIO 3
#define MAX_CLIENTS 4
#define MAX_RECS 256
#define PUMP_MS 10000 /* no test waits longer than this for its events */
/* A job that finished this long before another was (by the estimate) accepted counts as
 * finished before it; generous, since it only ever loosens a bound. */
#define SLACK_NS 200000ull

static const char config_json[] =
	"{ \"engine\": { \"max_seqs\": 2, \"feed_depth\": 2 },\n"
	"  \"limits\": { \"max_jobs_in_flight\": 40, \"max_priority\": 3 },\n"
	"  \"slow_consumer_ms\": 60000, \"slow_consumer_events\": 1000000 }\n";

static struct sm70t_daemon dmn;

/* What one submitted job saw. The job's user_tag is its index in recs[]. */
struct rec {
	int client;
	uint32_t prio;
	uint32_t max_tokens;
	int cancelled;		/* sm70_cancel was called */
	uint64_t id;
	uint32_t n_tok;
	uint32_t bad_index;	/* TOKEN events out of order */
	uint32_t after_final;	/* events after the final one */
	uint64_t first_ns;	/* step time of the first token, 0 if none */
	uint64_t last_ns;	/* step time of the last token */
	int n_final;
	uint32_t type_final;	/* FINISH or ERROR */
	uint32_t reason;
	int32_t error;
	struct sm70_usage usage;
};

static struct rec recs[MAX_RECS];
static int n_recs;
static struct sm70_client *cl[MAX_CLIENTS];
static int n_cl;

/* The step time the null backend encoded in a token event: three 22-bit chunks, each as
 * -(1 + chunk), exact in a float. 0 when the event carries fewer than 4 alternatives. */
static uint64_t step_ns(const struct sm70_event *ev)
{
	uint64_t t = 0;

	if (ev->n_top < 4)
		return 0;
	for (int k = 1; k <= 3; k++) {
		uint64_t chunk = (uint64_t)llroundf(-ev->top[k].logprob) - 1;

		t |= (chunk & 0x3fffff) << (22 * (k - 1));
	}
	return t;
}

static struct sm70_client *client_open(const char *name)
{
	struct sm70_connect_opts o;
	struct sm70_client *c = NULL;
	int ret;

	sm70_connect_opts_init(&o);
	/* Larger than any test's token count for one client: a full ring would stop the
	 * daemon feeding that client's queue (held events), which would reorder jobs. */
	o.eq_entries = 65536; /* the most a hello may ask for; 8 MiB */
	o.client_name = name;
	assert_true(n_cl < MAX_CLIENTS);
	ret = sm70_client_connect(&c, dmn.sock, &o);
	if (ret)
		fprintf(stderr, "connect %s: %s (%s)\n", name, sm70_strerror(ret),
			sm70_client_last_error(c));
	cl[n_cl++] = c; /* closed by clients_close() even when connect failed */
	assert_int_equal(ret, 0);
	return c;
}

static void clients_close(void)
{
	for (int i = 0; i < n_cl; i++)
		sm70_client_close(cl[i]);
	n_cl = 0;
	n_recs = 0;
	memset(recs, 0, sizeof(recs));
}

/* Submits a job on client ci (an index in cl[]) and returns its record index. */
static int submit(int ci, uint32_t prio, uint32_t max_tokens)
{
	static const uint32_t prompt[4] = { 52, 261, 158, 7 };
	struct sm70_job job;
	struct rec *r;
	int ret, k;

	assert_true(n_recs < MAX_RECS);
	k = n_recs++;
	r = &recs[k];
	r->client = ci;
	r->prio = prio;
	r->max_tokens = max_tokens;
	sm70_job_init(&job);
	job.prompt = prompt;
	job.prompt_len = 4;
	job.max_tokens = max_tokens;
	job.flags = SM70_JOB_IGNORE_EOS;
	job.top_logprobs = 4; /* carries the null backend's step time */
	job.priority = prio;
	job.user_tag = (uint64_t)k;
	while ((ret = sm70_submit(cl[ci], &job, &r->id)) == -EAGAIN)
		usleep(100);
	assert_int_equal(ret, 0);
	return k;
}

static void on_event(int ci, const struct sm70_event *ev)
{
	struct rec *r;

	assert_true(ev->user_tag < (uint64_t)n_recs);
	r = &recs[ev->user_tag];
	assert_int_equal(r->client, ci);
	if (r->n_final) {
		r->after_final++;
		return;
	}
	if (ev->type == SM70_EVENT_TOKEN) {
		uint64_t t = step_ns(ev);

		if (ev->index != r->n_tok)
			r->bad_index++;
		if (!r->n_tok)
			r->first_ns = t;
		r->last_ns = t;
		r->n_tok++;
	}
	if (ev->flags & SM70_EVENT_FINAL) {
		r->n_final++;
		r->type_final = ev->type;
		r->reason = ev->finish_reason;
		r->error = ev->error;
		r->usage = ev->usage;
	}
}

/* Reads every client's events until done(arg) is true. Returns 0, or -ETIMEDOUT after
 * PUMP_MS. One thread reads all handles: poll on their event fds, then drain each. */
static int pump(int (*done)(const void *), const void *arg)
{
	long deadline = sm70t_ms_now() + PUMP_MS;

	while (!done(arg)) {
		struct pollfd pfd[MAX_CLIENTS];
		int got = 0;

		for (int i = 0; i < n_cl; i++) {
			struct sm70_event ev = { .size = sizeof(ev) };
			int ret = 0;

			/* A few at a time, and done() after each: the daemon can produce events as
			 * fast as they are read, so draining a ring to empty may take long. */
			for (int n = 0; n < 64 && !done(arg); n++) {
				ret = sm70_next_event(cl[i], &ev, 0);
				if (ret)
					break;
				on_event(i, &ev);
				got = 1;
				ev.size = sizeof(ev);
			}
			if (ret && ret != -ETIMEDOUT) {
				fprintf(stderr, "client %d: next_event: %s\n", i,
					sm70_strerror(ret));
				return ret;
			}
			pfd[i].fd = sm70_event_fd(cl[i]);
			pfd[i].events = POLLIN;
		}
		if (sm70t_ms_now() >= deadline)
			return -ETIMEDOUT;
		if (!got && !done(arg))
			poll(pfd, (nfds_t)n_cl, 50);
	}
	return 0;
}

static int has_final(const void *arg)
{
	return recs[*(const int *)arg].n_final;
}

static int all_final(const void *arg)
{
	for (int k = 0; k < n_recs; k++)
		if (!recs[k].n_final)
			return 0;
	return 1;
}

/* Every job: exactly one final event and nothing after it, tokens in order, as many as the
 * FINISH reports; one that was not cancelled ran to its length. Prints the tally. */
static void check_nothing_lost(const char *what)
{
	int finals = 0, cancelled = 0, errors = 0;
	uint64_t tokens = 0;

	for (int k = 0; k < n_recs; k++) {
		const struct rec *r = &recs[k];

		if (r->n_final != 1 || r->after_final || r->bad_index)
			fprintf(stderr, "job %d: %d final events, %u after, %u out of order\n", k,
				r->n_final, r->after_final, r->bad_index);
		assert_int_equal(r->n_final, 1);
		assert_int_equal(r->after_final, 0);
		assert_int_equal(r->bad_index, 0);
		finals += r->n_final;
		tokens += r->n_tok;
		if (r->type_final == SM70_EVENT_ERROR) {
			errors++;
			assert_int_equal(r->n_tok, 0);
			continue;
		}
		assert_int_equal(r->type_final, SM70_EVENT_FINISH);
		assert_int_equal(r->usage.completion_tokens, r->n_tok);
		if (r->cancelled && r->reason == SM70_REASON_CANCELLED) {
			cancelled++;
			continue;
		}
		assert_int_equal(r->reason, SM70_REASON_LENGTH);
		assert_int_equal(r->error, 0);
		assert_int_equal(r->n_tok, r->max_tokens);
	}
	printf("%s: %d jobs, %d final events (%d cancelled, %d refused), %llu tokens, "
	       "none after a final\n", what, n_recs, finals, cancelled, errors,
	       (unsigned long long)tokens);
}

/* When recs[k] was accepted, on the step clock: its first step less the daemon's
 * accepted -> first token time. Never later than the truth (the daemon reads its clock for
 * the first token after the step's). */
static uint64_t accepted_ns(int k)
{
	return recs[k].first_ns - recs[k].usage.ttft_us * 1000;
}

/* Among records [lo, hi): how many started before recs[k] did, and how many had finished
 * (by the estimate, with SLACK_NS) before it was accepted. */
static void count_before(int k, int lo, int hi, int *started, int *finished)
{
	uint64_t acc = accepted_ns(k);

	*started = *finished = 0;
	for (int i = lo; i < hi; i++) {
		if (recs[i].first_ns < recs[k].first_ns)
			(*started)++;
		if (recs[i].last_ns < acc + SLACK_NS)
			(*finished)++;
	}
}

static void assert_started(int lo, int hi)
{
	for (int i = lo; i < hi; i++)
		if (recs[i].type_final != SM70_EVENT_ERROR)
			assert_true(recs[i].first_ns != 0);
}

/* Makes sure the daemon has taken every job client ci submitted so far: submits one with a
 * priority above the limit and waits for its refusal. A session's entries are taken in
 * order, so the jobs before it are all accepted by then. */
static void barrier(int ci)
{
	int k = submit(ci, MAX_PRIO + 1, 1);

	assert_int_equal(pump(has_final, &k), 0);
	assert_int_equal(recs[k].type_final, SM70_EVENT_ERROR);
}

/* ---- tests ---------------------------------------------------------------------------- */

/* Client A fills its max_jobs_in_flight with long jobs; client B then submits one short
 * job. Round robin must feed B's job at the first free slot: it starts after at most the
 * CAP jobs of A already in the engine, not after A's whole burst. */
static void test_burst_does_not_starve(void **state)
{
	const int n_a = MAX_JOBS;
	int b, started, finished, after = 0;

	client_open("fair-a");
	client_open("fair-b");
	for (int i = 0; i < n_a; i++)
		submit(0, 0, 1000);
	barrier(0);
	b = submit(1, 0, 4);
	assert_int_equal(pump(all_final, NULL), 0);
	check_nothing_lost("burst");
	assert_started(0, n_recs);

	count_before(b, 0, n_a, &started, &finished);
	for (int i = 0; i < n_a; i++)
		after += recs[i].first_ns > recs[b].first_ns;
	printf("burst: B's job (queued %llu us) started after %d of A's %d jobs, with %d in "
	       "the same step, before %d; %d of A's had finished when B arrived; bound %d + %d\n",
	       (unsigned long long)recs[b].usage.queue_us, started, n_a,
	       n_a - started - after, after, finished, finished, CAP);
	assert_true(finished <= n_a / 2); /* most of the burst was still queued */
	assert_true(started <= finished + CAP);

	/* A's own jobs start in the order it submitted them (FIFO among equals). */
	for (int i = 1; i < n_a; i++)
		assert_true(recs[i].first_ns >= recs[i - 1].first_ns);
	printf("burst: A's %d jobs started in submission order\n", n_a);
	clients_close();
}

/* One client: a priority-3 job submitted behind 12 queued priority-0 jobs overtakes every
 * one of them that was not already in the engine. */
static void test_priority_within_client(void **state)
{
	const int n_low = 12;
	int hi, started, finished;

	client_open("prio-one");
	for (int i = 0; i < n_low; i++)
		submit(0, 0, 2000);
	barrier(0);
	hi = submit(0, MAX_PRIO, 4);
	assert_int_equal(pump(all_final, NULL), 0);
	check_nothing_lost("priority, one client");
	assert_started(0, n_recs);

	count_before(hi, 0, n_low, &started, &finished);
	printf("priority, one client: the priority-%d job started after %d of %d earlier "
	       "priority-0 jobs (%d finished before it arrived; bound %d + %d)\n", MAX_PRIO,
	       started, n_low, finished, finished, CAP);
	assert_true(finished <= n_low / 2); /* most of them were still queued */
	assert_true(started <= finished + CAP);
	clients_close();
}

/* Across clients priority comes before round robin: A's priority-1 burst is fed entirely
 * before B's priority-0 job (which round robin alone would feed next), while C's priority-2
 * job, submitted after B's, overtakes both. */
static void test_priority_across_clients(void **state)
{
	const int n_a = 10;
	int b, c, c_early, started, finished, a_after_b = 0;

	client_open("prio-a");
	client_open("prio-b");
	client_open("prio-c");
	for (int i = 0; i < n_a; i++)
		submit(0, 1, 2000);
	barrier(0);
	b = submit(1, 0, 4);
	c = submit(2, 2, 4);
	assert_int_equal(pump(all_final, NULL), 0);
	check_nothing_lost("priority, three clients");
	assert_started(0, n_recs);

	for (int i = 0; i < n_a; i++)
		a_after_b += recs[i].first_ns > recs[b].first_ns;
	count_before(c, 0, n_a, &started, &finished);
	/* C can only overtake B if it arrived before B was fed (normally by far). */
	c_early = accepted_ns(c) < accepted_ns(b) + recs[b].usage.queue_us * 1000;
	printf("priority, three clients: B's priority-0 job started after %d of A's %d "
	       "priority-1 jobs, %s C's priority-2 job (C arrived %s B was fed); C's started "
	       "after %d of A's (%d finished before it arrived; bound %d + %d)\n",
	       n_a - a_after_b, n_a, recs[c].first_ns < recs[b].first_ns ? "after" : "NOT after",
	       c_early ? "before" : "after", started, finished, finished, CAP);
	assert_int_equal(a_after_b, 0);
	if (c_early)
		assert_true(recs[c].first_ns < recs[b].first_ns);
	assert_true(finished <= n_a / 2);
	assert_true(started <= finished + CAP);
	clients_close();
}

/* Three clients, mixed priorities and lengths, every fifth job cancelled at once (queued
 * or running), one refused for a priority above the limit: every job gets exactly one
 * final event. */
static void test_nothing_lost(void **state)
{
	const int per_client = 20;
	int bad;

	client_open("lost-a");
	client_open("lost-b");
	client_open("lost-c");
	for (int i = 0; i < per_client; i++)
		for (int ci = 0; ci < 3; ci++) {
			int k = submit(ci, (uint32_t)(i * 7 + ci) % (MAX_PRIO + 1),
				       1 + (uint32_t)(i * 5 + ci * 3) % 40);

			if (k % 5 == 4) {
				assert_int_equal(sm70_cancel(cl[ci], recs[k].id), 0);
				recs[k].cancelled = 1;
			}
		}
	bad = submit(1, MAX_PRIO + 1, 4);
	assert_int_equal(pump(all_final, NULL), 0);
	assert_int_equal(recs[bad].type_final, SM70_EVENT_ERROR);
	assert_int_equal(recs[bad].error, -SM70_E_INVALID);
	check_nothing_lost("mixed");
	clients_close();
}

static int test_teardown(void **state)
{
	clients_close(); /* also after a failed assertion */
	return 0;
}

static int group_setup(void **state)
{
	static const char *const extra[] = { "--backend", "null", "--load-format", "dummy",
					     NULL };
	int ret = sm70t_daemon_start(&dmn, config_json, extra);

	if (ret) {
		fprintf(stderr, "sm70d did not start: %s\n", strerror(-ret));
		return -1;
	}
	return 0;
}

static int group_teardown(void **state)
{
	int st;

	clients_close();
	st = sm70t_daemon_stop(&dmn, SIGTERM, 5000);
	if (st != 0) {
		fprintf(stderr, "sm70d exit status %d\n", st);
		sm70t_daemon_dump_log(&dmn);
	}
	sm70t_daemon_cleanup(&dmn);
	return st == 0 ? 0 : -1;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_burst_does_not_starve, test_teardown),
		cmocka_unit_test_teardown(test_priority_within_client, test_teardown),
		cmocka_unit_test_teardown(test_priority_across_clients, test_teardown),
		cmocka_unit_test_teardown(test_nothing_lost, test_teardown),
	};

	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
