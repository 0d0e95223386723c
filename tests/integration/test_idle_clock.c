/* test_idle_clock - after sm70d sat idle past every timer it has, the first connection is welcomed and served with fresh timestamps. */
/*
 * The daemon's clock is read after every wait of its loop; a timestamp taken from the
 * time before a long wait would make the first connection after an idle spell look as old
 * as the spell (closed with "no hello within 5000 ms"), and would skew every timer started
 * from it.
 *
 * Daemon A shortens every timer the config has (hello_timeout_ms 300, slow_consumer_ms 200,
 * drain_grace_ms 200) and idles 1.2 s (past all of them and past the 1 s status/metrics
 * ticks), then: an SDK client connects and completes a job with a deadline, with small
 * queue/ttft times; after another idle a raw connection that waits 150 ms before its hello
 * is welcomed; after another, one that sends nothing is refused (a REFUSAL naming
 * hello_timeout_ms) and closed after the 300 ms hello timeout, not at once. Daemon W runs
 * with a systemd watchdog (WATCHDOG_USEC 600 ms, pings
 * every 300 ms to a NOTIFY_SOCKET of the test): the pings keep their period through an idle
 * spell and a client after it is served. (A watchdog wakes the loop, which would hide a stale
 * clock, so A and B run without one.) Daemon B runs with the defaults and idles 5.5 s (past
 * the default 5 s hello timeout) before an SDK client connects and completes a job, and
 * after another idle the admin socket reports a new session as just connected.
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
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "sm70/client.h"
#include "tests/integration/daemon_util.h"
#include "tests/integration/raw_client.h"

#define WATCHDOG_US 600000

static const uint32_t prompt[5] = { 11, 22, 33, 44, 55 };

/* ---- systemd's notification socket, played by the test -------------------------------- */

struct notify {
	int fd;
	char path[108];
	int n_ping;
	long last_ping_ms, max_gap_ms;
	int ready;
};

static struct notify nt = { .fd = -1 };
static struct sm70t_daemon t; /* the daemon of the running test */

static void set_notify_env(void *arg)
{
	char usec[32];

	(void)arg;
	snprintf(usec, sizeof(usec), "%d", WATCHDOG_US);
	setenv("NOTIFY_SOCKET", nt.path, 1);
	setenv("WATCHDOG_USEC", usec, 1);
}

/* Reads every notification that arrived; keeps the watchdog pings' largest gap. */
static void notify_drain(void)
{
	char buf[512];
	ssize_t n;

	while ((n = recv(nt.fd, buf, sizeof(buf) - 1, MSG_DONTWAIT)) > 0) {
		long now = sm70t_ms_now();

		buf[n] = '\0';
		if (strstr(buf, "READY=1"))
			nt.ready = 1;
		if (!strstr(buf, "WATCHDOG=1"))
			continue;
		if (nt.n_ping && now - nt.last_ping_ms > nt.max_gap_ms)
			nt.max_gap_ms = now - nt.last_ping_ms;
		nt.last_ping_ms = now;
		nt.n_ping++;
	}
}

/* Idles ms milliseconds, reading notifications meanwhile (none of this touches the daemon). */
static void idle(long ms)
{
	long end = sm70t_ms_now() + ms;

	while (sm70t_ms_now() < end) {
		if (nt.fd >= 0)
			notify_drain();
		usleep(10000);
	}
}

/* ---- helpers --------------------------------------------------------------------------- */

/* One SDK connection and one greedy job with a deadline; checks it ended by length with
 * timings taken after the idle (not inflated by it). */
static void sdk_job(const struct sm70t_daemon *d, const char *what)
{
	struct sm70_client *c = NULL;
	struct sm70_job job;
	struct sm70_result res = { .size = sizeof(res) };
	long t0 = sm70t_ms_now();
	int ret;

	ret = sm70_client_connect(&c, d->sock, NULL);
	if (ret)
		fail_msg("%s: connect: %s", what, sm70_client_last_error(c));
	sm70_job_init(&job);
	job.prompt = prompt;
	job.prompt_len = 5;
	job.max_tokens = 8;
	job.flags = SM70_JOB_IGNORE_EOS;
	job.deadline_ms = 2000;
	ret = sm70_generate(c, &job, NULL, NULL, &res);
	printf("%s: connected and ran a job in %ld ms: reason %u, %u tokens, queue %llu us, "
	       "ttft %llu us\n", what, sm70t_ms_now() - t0, res.finish_reason,
	       res.usage.completion_tokens, (unsigned long long)res.usage.queue_us,
	       (unsigned long long)res.usage.ttft_us);
	assert_int_equal(ret, 0);
	assert_int_equal(res.finish_reason, SM70_REASON_LENGTH);
	assert_int_equal(res.usage.completion_tokens, 8);
	assert_true(res.usage.queue_us < 500000);
	assert_true(res.usage.ttft_us < 500000);
	sm70_client_close(c);
}

/* {"cmd": "clients"} on the admin socket: connected_s of the newest session, or -1. */
static double admin_newest_connected_s(const struct sm70t_daemon *d)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	static char buf[65536];
	const char req[] = "{\"cmd\":\"clients\"}";
	json_t *r = NULL, *list, *e;
	double v = -1, best_id = -1;
	size_t i;
	ssize_t n;
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);

	snprintf(a.sun_path, sizeof(a.sun_path), "%.90s.admin", d->sock);
	if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof(a)) ||
	    send(fd, req, sizeof(req) - 1, MSG_NOSIGNAL) != (ssize_t)sizeof(req) - 1 ||
	    (n = recv(fd, buf, sizeof(buf) - 1, 0)) <= 0)
		goto out;
	buf[n] = '\0';
	r = json_loads(buf, 0, NULL);
	list = json_object_get(r, "clients");
	json_array_foreach(list, i, e) {
		double id = (double)json_integer_value(json_object_get(e, "id"));

		if (id > best_id) {
			best_id = id;
			v = json_number_value(json_object_get(e, "connected_s"));
		}
	}
out:
	json_decref(r);
	if (fd >= 0)
		close(fd);
	return v;
}

/* ---- daemon A: every timer shortened ------------------------------------------------- */

static void test_idle_past_short_timers(void **state)
{
	static const char cfg[] =
		"{ \"engine\": { \"n_threads\": 1, \"max_seqs\": 4, \"kv_bytes\": 16777216 },\n"
		"  \"hello_timeout_ms\": 300, \"slow_consumer_ms\": 200,\n"
		"  \"drain_grace_ms\": 200 }\n";
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	struct sm70_proto_hello h;
	struct sm70_proto_refusal r;
	struct sm70t_raw late;
	struct sm70_proto_eqe ev;
	struct pollfd p;
	long t0, closed_after;
	char c;
	int fd;

	assert_int_equal(sm70t_daemon_start(&t, cfg, NULL), 0);
	idle(1200);
	sdk_job(&t, "after 1.2 s idle (hello 300 ms, slow consumer 200 ms, drain grace 200 ms)");

	/* idle again, then a client slower than usual with its hello: still within 300 ms */
	idle(1000);
	memset(&h, 0, sizeof(h));
	h.size = sizeof(h);
	h.magic = SM70_PROTO_MAGIC;
	h.type = SM70_PROTO_MSG_HELLO;
	h.version_major = SM70_PROTO_VERSION_MAJOR;
	snprintf(a.sun_path, sizeof(a.sun_path), "%s", t.sock);
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	usleep(150 * 1000);
	assert_int_equal(send(fd, &h, sizeof(h), MSG_NOSIGNAL), sizeof(h));
	sm70t_raw_init(&late);
	late.sock = fd;
	assert_int_equal(sm70t_raw_finish(&late, 5000), 0);
	assert_int_equal(sm70t_raw_submit(&late, 1, prompt, 5, 4, SM70_PROTO_SQF_IGNORE_EOS), 0);
	sm70t_raw_publish(&late);
	assert_int_equal(sm70t_raw_wait_final(&late, 1, &ev, 5000), 4);
	assert_int_equal(ev.type, SM70_PROTO_EV_FINISH);
	printf("after 1 s idle: a hello sent 150 ms after connecting was welcomed and its job "
	       "ran\n");
	sm70t_raw_close(&late);

	/* idle again, then a connection that never says hello: closed by the 300 ms timeout
	 * counted from its accept, not from before the idle */
	idle(1000);
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	t0 = sm70t_ms_now();
	p = (struct pollfd){ .fd = fd, .events = POLLIN | POLLRDHUP };
	assert_int_equal(poll(&p, 1, 5000), 1);
	closed_after = sm70t_ms_now() - t0;
	/* it is told why (a REFUSAL naming the timeout), then the daemon hangs up */
	assert_int_equal(recv(fd, &r, sizeof(r), MSG_DONTWAIT), sizeof(r));
	assert_int_equal(r.type, SM70_PROTO_MSG_REFUSAL);
	assert_int_equal(r.result, SM70_PROTO_E_INVALID);
	assert_non_null(strstr(r.reason, "hello_timeout_ms"));
	/* the hang-up follows the refusal, but the daemon may not have reached it yet when the
	 * refusal is read (seen under load): wait for it */
	assert_int_equal(poll(&p, 1, 5000), 1);
	assert_int_equal(recv(fd, &c, 1, MSG_DONTWAIT), 0);
	close(fd);
	printf("after 1 s idle: a connection without a hello was refused (\"%s\") and closed "
	       "after %ld ms (hello_timeout_ms 300)\n", r.reason, closed_after);
	assert_true(closed_after >= 250);
	assert_true(closed_after <= 2000);
	assert_int_equal(sm70t_daemon_stop(&t, SIGTERM, 5000), 0);
}

/* The watchdog's own timer: pings keep their period through an idle spell, and a client
 * connecting after it is served. */
static void test_idle_with_watchdog(void **state)
{
	static const char cfg[] =
		"{ \"engine\": { \"n_threads\": 1, \"max_seqs\": 4, \"kv_bytes\": 16777216 },\n"
		"  \"hello_timeout_ms\": 300 }\n";
	struct sockaddr_un a = { .sun_family = AF_UNIX };

	nt.fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	assert_true(nt.fd >= 0);
	snprintf(nt.path, sizeof(nt.path), "/tmp/sm70t-notify-%d", (int)getpid());
	unlink(nt.path);
	snprintf(a.sun_path, sizeof(a.sun_path), "%s", nt.path);
	assert_int_equal(bind(nt.fd, (struct sockaddr *)&a, sizeof(a)), 0);
	assert_int_equal(sm70t_daemon_start_hook(&t, NULL, cfg, NULL, set_notify_env, NULL), 0);
	idle(1200);
	assert_true(nt.ready);
	sdk_job(&t, "after 1.2 s idle with a 600 ms watchdog");
	notify_drain();
	printf("watchdog: %d pings, largest gap %ld ms (WATCHDOG_USEC %d ms)\n", nt.n_ping,
	       nt.max_gap_ms, WATCHDOG_US / 1000);
	assert_true(nt.n_ping >= 3);
	assert_true(nt.max_gap_ms < WATCHDOG_US / 1000);
	assert_int_equal(sm70t_daemon_stop(&t, SIGTERM, 5000), 0);
}

/* ---- daemon B: the defaults, one plain idle longer than the 5 s hello timeout ---------- */

static void test_plain_idle_past_5s(void **state)
{
	static const char cfg[] =
		"{ \"engine\": { \"n_threads\": 1, \"max_seqs\": 4, \"kv_bytes\": 16777216 } }\n";
	struct sm70_client *c = NULL;
	double conn_s;

	static const char *const verbose[] = { "--verbose", NULL };

	assert_int_equal(sm70t_daemon_start(&t, cfg, verbose), 0);
	idle(5500);
	sdk_job(&t, "after 5.5 s idle (default hello timeout 5 s)");
	idle(1000);
	assert_int_equal(sm70_client_connect(&c, t.sock, NULL), 0);
	conn_s = admin_newest_connected_s(&t);
	printf("after 1 s more idle: the admin socket says the new session connected %.3f s "
	       "ago\n", conn_s);
	assert_true(conn_s >= 0 && conn_s < 1.0);
	sm70_client_close(c);
	assert_false(sm70t_log_contains(&t, "no hello within")); /* --verbose logs it */
	assert_int_equal(sm70t_daemon_stop(&t, SIGTERM, 5000), 0);
}

/* Whatever a test left running: its daemon (with its log printed on failure) and the
 * notification socket. */
static int teardown(void **state)
{
	if (t.pid > 0 && !t.exited) {
		sm70t_daemon_dump_log(&t);
		sm70t_daemon_stop(&t, SIGKILL, 5000);
	}
	if (t.pid > 0)
		sm70t_daemon_cleanup(&t);
	memset(&t, 0, sizeof(t));
	if (nt.fd >= 0) {
		close(nt.fd);
		unlink(nt.path);
	}
	nt.fd = -1;
	return 0;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_idle_past_short_timers, teardown),
		cmocka_unit_test_teardown(test_idle_with_watchdog, teardown),
		cmocka_unit_test_teardown(test_plain_idle_past_5s, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
