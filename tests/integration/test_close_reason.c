/* test_close_reason - every session sm70d closes is told why first: in its segment header once welcomed, as a REFUSAL before. */
/*
 * Issue 17: "a session the daemon closes tells the client nothing". For each reason the
 * daemon ends a session, a raw protocol client (raw_client.h) does what brings it about
 * and must find, after the hang-up, the code and sentence of PROTOCOL.md section 2
 * ("Closing"): close_code / close_reason in its segment header, or a REFUSAL when it was
 * still in its handshake.
 *
 * - an sq_tail 100,000 entries ahead of sq_head: E_INVALID, the reason names sq_tail;
 * - an eq_head outside the event ring, noticed when a job's first token is posted:
 *   E_INVALID, names eq_head;
 * - a message on the control socket after the hello: E_INVALID, names the message;
 * - no hello within hello_timeout_ms (300 ms here): a REFUSAL, E_INVALID, names the key;
 * - SIGTERM (drain_grace_ms 0): the running job ends FINISH(ERROR, E_SHUTDOWN), then the
 *   header says E_SHUTDOWN "shutting down"; a connection still without its hello gets a
 *   REFUSAL with E_SHUTDOWN.
 * And libsm70client surfaces it: an SDK session whose eq_head the test corrupts (through
 * the segment's mapping in /proc/self/maps) gets its live job's final event with
 * -SM70_E_INVALID and the reason, then -ECONNRESET with sm70_client_last_error naming the
 * reason; an SDK session at the shutdown reads its job's E_SHUTDOWN finish, then
 * -ECONNRESET with last_error saying the daemon is shutting down. Each closed session
 * leaves a victim client of the same daemon served (a job within VICTIM_MS). A slow
 * consumer is not closed: a session that leaves its 16-entry ring full past
 * slow_consumer_ms (100 ms) reads its job's FINISH(ERROR, E_SLOW_CONSUMER), finds
 * close_code 0 and no hang-up, and is served on (the cut-off at the held-event bound says
 * why with a session-wide ERROR event: test_held_events).
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
#include <unistd.h>

#include <cmocka.h>

#include "sm70/client.h"
#include "tests/integration/daemon_util.h"
#include "tests/integration/raw_client.h"

#define VICTIM_MS 2000

static const uint32_t prompt[5] = { 11, 22, 33, 44, 55 };
static struct sm70t_daemon dmn;

/* A welcomed raw session, or the test fails (and does not go on with an unmapped c). */
static void raw_connect(struct sm70t_raw *c)
{
	int ret = sm70t_raw_connect(c, dmn.sock, 0, 5000);

	if (ret) {
		fail_msg("raw connect: %d", ret);
		__builtin_unreachable(); /* fail_msg jumps out of the test */
	}
}

/* Waits up to ms for the daemon to hang up c's control socket. Returns 0 or -ETIMEDOUT. */
static int wait_hangup(struct sm70t_raw *c, int ms)
{
	struct pollfd p = { .fd = c->sock, .events = POLLRDHUP };

	if (poll(&p, 1, ms) != 1 || !(p.revents & (POLLHUP | POLLRDHUP)))
		return -ETIMEDOUT;
	return 0;
}

/* The header's close code (acquire), and the reason copied out, NUL-terminated. */
static uint32_t header_reason(struct sm70t_raw *c, char *why, size_t len)
{
	uint32_t code = sm70_ring_load_acquire(&c->h->close_code);

	snprintf(why, len, "%.*s", (int)sizeof(c->h->close_reason), c->h->close_reason);
	return code;
}

/* Asserts that c was closed with code and a reason containing needle. */
static void expect_closed(struct sm70t_raw *c, const char *what, uint32_t code,
			  const char *needle)
{
	char why[SM70_PROTO_REASON_LEN + 1];

	assert_int_equal(wait_hangup(c, 3000), 0);
	assert_int_equal(header_reason(c, why, sizeof(why)), code);
	printf("%s: closed with %s: \"%s\"\n", what, sm70_proto_strerror((int)code), why);
	assert_non_null(strstr(why, needle));
}

/* Another client of the same daemon completes a short job within VICTIM_MS. */
static void victim_served(void)
{
	struct sm70t_raw v;
	struct sm70_proto_eqe ev;
	long t0 = sm70t_ms_now();

	raw_connect(&v);
	assert_int_equal(sm70t_raw_submit(&v, 1, prompt, 5, 4, SM70_PROTO_SQF_IGNORE_EOS), 0);
	sm70t_raw_publish(&v);
	assert_int_equal(sm70t_raw_wait_final(&v, 1, &ev, VICTIM_MS), 4);
	assert_int_equal(ev.type, SM70_PROTO_EV_FINISH);
	assert_true(sm70t_ms_now() - t0 <= VICTIM_MS);
	assert_int_equal(sm70_ring_load_acquire(&v.h->close_code), 0); /* open: no reason */
	sm70t_raw_close(&v);
}

static void test_sq_tail_violation(void **state)
{
	struct sm70t_raw c;

	(void)state;
	raw_connect(&c);
	assert_int_equal(sm70_ring_load_acquire(&c.h->close_code), 0);
	c.sq_tail += 100000;
	sm70t_raw_publish(&c);
	sm70t_raw_ring(&c);
	expect_closed(&c, "sq_tail 100000 ahead", SM70_PROTO_E_INVALID, "sq_tail");
	sm70t_raw_close(&c);
	victim_served();
}

static void test_eq_head_violation(void **state)
{
	struct sm70t_raw c;

	(void)state;
	raw_connect(&c);
	/* outside the ring before anything is posted: the first TOKEN finds it */
	sm70_ring_store_release(&c.h->eq_head, c.eq_head + 1000);
	assert_int_equal(sm70t_raw_submit(&c, 7, prompt, 5, 50, SM70_PROTO_SQF_IGNORE_EOS), 0);
	sm70t_raw_publish(&c);
	expect_closed(&c, "eq_head outside the ring", SM70_PROTO_E_INVALID, "eq_head");
	sm70t_raw_close(&c);
	victim_served();
}

static void test_message_after_hello(void **state)
{
	struct sm70t_raw c;

	(void)state;
	raw_connect(&c);
	assert_int_equal(send(c.sock, "x", 1, MSG_NOSIGNAL), 1);
	expect_closed(&c, "a message after the hello", SM70_PROTO_E_INVALID, "after its hello");
	sm70t_raw_close(&c);
	victim_served();
}

/* Connects without sending anything. */
static int bare_connect(void)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);

	assert_true(fd >= 0);
	snprintf(a.sun_path, sizeof(a.sun_path), "%s", dmn.sock);
	assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	return fd;
}

/* Reads the REFUSAL the daemon sent on fd within ms, then its end of file. */
static void expect_refusal(int fd, const char *what, int code, const char *needle)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };
	struct sm70_proto_refusal r;
	char c;

	assert_int_equal(poll(&p, 1, 3000), 1);
	assert_int_equal(recv(fd, &r, sizeof(r), MSG_DONTWAIT), sizeof(r));
	assert_int_equal(r.magic, SM70_PROTO_MAGIC);
	assert_int_equal(r.type, SM70_PROTO_MSG_REFUSAL);
	r.reason[sizeof(r.reason) - 1] = '\0';
	printf("%s: REFUSAL %s: \"%s\"\n", what, sm70_proto_strerror(r.result), r.reason);
	assert_int_equal(r.result, code);
	assert_non_null(strstr(r.reason, needle));
	assert_int_equal(poll(&p, 1, 3000), 1);
	assert_int_equal(recv(fd, &c, 1, MSG_DONTWAIT), 0);
}

static void test_hello_timeout(void **state)
{
	long t0 = sm70t_ms_now();
	int fd = bare_connect();

	(void)state;
	expect_refusal(fd, "no hello", SM70_PROTO_E_INVALID, "hello_timeout_ms");
	assert_true(sm70t_ms_now() - t0 >= 250);
	close(fd);
	victim_served();
}

/* The SDK session's segment in this process: the mapping of memfd "sm70-session-ID". */
static struct sm70_proto_seg_hdr *sdk_segment(struct sm70_client *c)
{
	struct sm70_client_info info = { .size = sizeof(info) };
	char line[512], name[64];
	void *at = NULL;
	FILE *f;

	assert_int_equal(sm70_client_info(c, &info), 0);
	snprintf(name, sizeof(name), "/memfd:sm70-session-%u ", info.session_id);
	f = fopen("/proc/self/maps", "r");
	assert_non_null(f);
	while (!at && fgets(line, sizeof(line), f))
		if (strstr(line, name))
			at = (void *)(uintptr_t)strtoull(line, NULL, 16);
	fclose(f);
	assert_non_null(at);
	return at;
}

static void test_sdk_violation(void **state)
{
	struct sm70_event ev = { .size = sizeof(ev) };
	struct sm70_proto_seg_hdr *h;
	struct sm70_client *c = NULL;
	struct sm70_job job;
	uint64_t id;
	int ret;

	(void)state;
	assert_int_equal(sm70_client_connect(&c, dmn.sock, NULL), 0);
	h = sdk_segment(c);
	/* what a bug in the application (a stray write into the segment) could do */
	__atomic_store_n(&h->eq_head, h->eq_tail + 1000, __ATOMIC_RELEASE);
	sm70_job_init(&job);
	job.prompt = prompt;
	job.prompt_len = 5;
	job.max_tokens = 50;
	job.flags = SM70_JOB_IGNORE_EOS;
	assert_int_equal(sm70_submit(c, &job, &id), 0);
	assert_int_equal(sm70_next_event(c, &ev, 5000), 0);
	printf("SDK, eq_head broken: job %llu ended: type %u reason %u error %d (%s): \"%s\"\n",
	       (unsigned long long)ev.job_id, ev.type, ev.finish_reason, ev.error,
	       sm70_strerror(ev.error), ev.message);
	assert_int_equal(ev.job_id, id);
	assert_int_equal(ev.type, SM70_EVENT_FINISH);
	assert_true(ev.flags & SM70_EVENT_FINAL);
	assert_int_equal(ev.finish_reason, SM70_REASON_ERROR);
	assert_int_equal(ev.error, -SM70_E_INVALID);
	assert_non_null(strstr(ev.message, "eq_head"));
	ret = sm70_next_event(c, &ev, 1000);
	printf("SDK: then %s; last_error \"%s\"\n", sm70_strerror(ret), sm70_client_last_error(c));
	assert_int_equal(ret, -ECONNRESET);
	assert_non_null(strstr(sm70_client_last_error(c), "eq_head"));
	assert_int_equal(sm70_submit(c, &job, &id), -ECONNRESET);
	sm70_client_close(c);
	victim_served();
}

/* A slow consumer is not closed: its jobs' final events say why, and it is served on. */
static void test_slow_consumer_stays_open(void **state)
{
	struct sm70t_raw c;
	struct sm70_proto_eqe ev;
	int n;

	(void)state;
	if (sm70t_raw_connect(&c, dmn.sock, 16, 5000)) {
		fail_msg("raw connect with a 16-entry ring");
		__builtin_unreachable();
	}
	assert_int_equal(sm70t_raw_submit(&c, 5, prompt, 5, 4000, SM70_PROTO_SQF_IGNORE_EOS), 0);
	sm70t_raw_publish(&c);
	usleep(600 * 1000); /* the ring is full long past slow_consumer_ms (100) */
	n = sm70t_raw_wait_final(&c, 5, &ev, 5000);
	printf("slow consumer: %d tokens, then FINISH reason %u error %s; the session stays "
	       "open (close_code %u)\n", n, ev.u.finish.reason,
	       sm70_proto_strerror(ev.u.finish.error), c.h->close_code);
	assert_true(n >= 16 && n < 4000);
	assert_int_equal(ev.type, SM70_PROTO_EV_FINISH);
	assert_int_equal(ev.u.finish.reason, SM70_PROTO_FINISH_ERROR);
	assert_int_equal(ev.u.finish.error, SM70_PROTO_E_SLOW_CONSUMER);
	assert_int_equal(sm70_ring_load_acquire(&c.h->close_code), 0);
	assert_int_equal(wait_hangup(&c, 0), -ETIMEDOUT);
	assert_int_equal(sm70t_raw_submit(&c, 6, prompt, 5, 4, SM70_PROTO_SQF_IGNORE_EOS), 0);
	sm70t_raw_publish(&c);
	assert_int_equal(sm70t_raw_wait_final(&c, 6, &ev, 5000), 4);
	assert_int_equal(ev.type, SM70_PROTO_EV_FINISH);
	sm70t_raw_close(&c);
}

/* Last: SIGTERM ends the daemon. A raw session with a running job, an SDK one with a
 * running job, and a connection without a hello are each told. */
static void test_shutdown(void **state)
{
	struct sm70_event sev = { .size = sizeof(sev) };
	struct sm70_proto_eqe ev;
	struct sm70_client *sc = NULL;
	struct sm70t_raw c;
	struct sm70_job job;
	uint64_t id;
	int fd, ret, n;

	(void)state;
	raw_connect(&c);
	assert_int_equal(sm70t_raw_submit(&c, 3, prompt, 5, 4000, SM70_PROTO_SQF_IGNORE_EOS), 0);
	sm70t_raw_publish(&c);
	assert_int_equal(sm70_client_connect(&sc, dmn.sock, NULL), 0);
	sm70_job_init(&job);
	job.prompt = prompt;
	job.prompt_len = 5;
	job.max_tokens = 4000;
	job.flags = SM70_JOB_IGNORE_EOS;
	assert_int_equal(sm70_submit(sc, &job, &id), 0);
	assert_int_equal(sm70t_raw_next(&c, &ev, 5000), 0); /* it runs */
	assert_int_equal(ev.type, SM70_PROTO_EV_TOKEN);
	assert_int_equal(sm70_next_event(sc, &sev, 5000), 0);
	assert_int_equal(sev.type, SM70_EVENT_TOKEN);
	fd = bare_connect();
	assert_int_equal(kill(dmn.pid, SIGTERM), 0);

	/* the daemon's own final event for the job, then the reason for the session */
	n = sm70t_raw_wait_final(&c, 3, &ev, 5000);
	assert_true(n >= 0);
	assert_int_equal(ev.type, SM70_PROTO_EV_FINISH);
	assert_int_equal(ev.u.finish.reason, SM70_PROTO_FINISH_ERROR);
	assert_int_equal(ev.u.finish.error, SM70_PROTO_E_SHUTDOWN);
	expect_closed(&c, "SIGTERM, raw session", SM70_PROTO_E_SHUTDOWN, "shutting down");
	sm70t_raw_close(&c);
	expect_refusal(fd, "SIGTERM, a connection without its hello", SM70_PROTO_E_SHUTDOWN,
		       "shutting down");
	close(fd);

	do
		ret = sm70_next_event(sc, &sev, 5000);
	while (ret == 0 && !(sev.flags & SM70_EVENT_FINAL));
	printf("SIGTERM, SDK session: final event type %u reason %u error %d: \"%s\"\n",
	       sev.type, sev.finish_reason, sev.error, sev.message);
	assert_int_equal(ret, 0);
	assert_int_equal(sev.finish_reason, SM70_REASON_ERROR);
	assert_int_equal(sev.error, -SM70_E_SHUTDOWN);
	ret = sm70_next_event(sc, &sev, 5000);
	printf("SIGTERM, SDK session: job ended %s, then %s; last_error \"%s\"\n",
	       sm70_strerror(-SM70_E_SHUTDOWN), sm70_strerror(ret), sm70_client_last_error(sc));
	assert_int_equal(ret, -ECONNRESET);
	assert_non_null(strstr(sm70_client_last_error(sc), "shutting down"));
	sm70_client_close(sc);
	assert_int_equal(sm70t_daemon_wait(&dmn, 5000), 0);
}

static int setup(void **state)
{
	static const char cfg[] =
		"{ \"engine\": { \"n_threads\": 1, \"max_seqs\": 4, \"kv_bytes\": 16777216 },\n"
		"  \"hello_timeout_ms\": 300, \"drain_grace_ms\": 0, \"slow_consumer_ms\": 100 }\n";

	(void)state;
	return sm70t_daemon_start(&dmn, cfg, NULL);
}

static int teardown(void **state)
{
	(void)state;
	if (dmn.pid > 0 && !dmn.exited)
		sm70t_daemon_dump_log(&dmn);
	sm70t_daemon_cleanup(&dmn);
	return 0;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_sq_tail_violation),
		cmocka_unit_test(test_eq_head_violation),
		cmocka_unit_test(test_message_after_hello),
		cmocka_unit_test(test_hello_timeout),
		cmocka_unit_test(test_sdk_violation),
		cmocka_unit_test(test_slow_consumer_stays_open),
		cmocka_unit_test(test_shutdown),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
