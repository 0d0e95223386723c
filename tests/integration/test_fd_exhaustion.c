/* test_fd_exhaustion - sm70d out of file descriptors serves its backlog once descriptors free up, and denied peers hold none. */
/*
 * Both daemons run with RLIMIT_NOFILE lowered to FD_LIMIT (set in the child before exec).
 *
 * Backlog: raw clients connect and say hello one after another until the daemon has no
 * descriptors for another session; the next ones wait in the listen backlog (no answer, no
 * refusal). Then a few sessions close, with no new connection arriving afterwards: every
 * waiting connection must be welcomed and complete a job.
 *
 * Denied: with allowed_uids naming another uid, hundreds of connections that never send a
 * hello are each refused with E_DENIED at once, while the test still holds them all open,
 * and the daemon's descriptor count does not grow; an SDK client gets the refusal's reason.
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
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cmocka.h>

#include "sm70/client.h"
#include "tests/integration/daemon_util.h"
#include "tests/integration/raw_client.h"

#define FD_LIMIT 40
#define MAX_CONN 64
#define N_PENDING 3
#define N_DENIED 200

static const uint32_t prompt[5] = { 11, 22, 33, 44, 55 };
static struct sm70t_daemon t;

static void lower_nofile(void *arg)
{
	struct rlimit r = { .rlim_cur = FD_LIMIT, .rlim_max = FD_LIMIT };

	(void)arg;
	if (setrlimit(RLIMIT_NOFILE, &r))
		_exit(126);
}

/* One job on a welcomed raw session; fails the test unless it finishes by length. */
static void run_job(struct sm70t_raw *c, uint64_t tag)
{
	struct sm70_proto_eqe ev;

	assert_int_equal(sm70t_raw_submit(c, tag, prompt, 5, 4, SM70_PROTO_SQF_IGNORE_EOS), 0);
	sm70t_raw_publish(c);
	assert_int_equal(sm70t_raw_wait_final(c, tag, &ev, 5000), 4);
	assert_int_equal(ev.type, SM70_PROTO_EV_FINISH);
	assert_int_equal(ev.u.finish.reason, SM70_PROTO_FINISH_LENGTH);
}

static void test_backlog_served_after_emfile(void **state)
{
	static const char cfg[] =
		"{ \"engine\": { \"n_threads\": 1, \"max_seqs\": 4, \"kv_bytes\": 16777216 } }\n";
	static struct sm70t_raw c[MAX_CONN], pend[N_PENDING];
	int n_ok = 0, ret, i, closed, n0, n_end;
	long t0;

	assert_int_equal(sm70t_daemon_start_hook(&t, NULL, cfg, NULL, lower_nofile, NULL), 0);
	n0 = sm70t_settled_fds(t.pid);
	/* sessions until the daemon runs out of descriptors: the first one left waiting */
	for (;;) {
		assert_true(n_ok < MAX_CONN);
		ret = sm70t_raw_connect(&c[n_ok], t.sock, 0, 500);
		if (ret == -ETIMEDOUT)
			break;
		if (ret == 1)
			fail_msg("session %d refused (%d): %s", n_ok + 1, c[n_ok].refusal.result,
				 c[n_ok].refusal.reason);
		assert_int_equal(ret, 0);
		run_job(&c[n_ok], 1);
		n_ok++;
	}
	pend[0] = c[n_ok];
	sm70t_raw_init(&c[n_ok]);
	for (i = 1; i < N_PENDING; i++) {
		assert_int_equal(sm70t_raw_start(&pend[i], t.sock, 0), 0);
		assert_int_equal(sm70t_raw_finish(&pend[i], 200), -ETIMEDOUT);
	}
	printf("RLIMIT_NOFILE %d (daemon at %d descriptors idle): %d sessions welcomed, the next "
	       "%d connections wait\n", FD_LIMIT, n0, n_ok, N_PENDING);
	assert_true(n_ok >= N_PENDING + 2);
	assert_true(sm70t_log_contains(&t, "new connections wait in the backlog"));

	/* free descriptors: close a few sessions, and connect nothing new */
	for (closed = 0; closed < N_PENDING + 2; closed++)
		sm70t_raw_close(&c[n_ok - 1 - closed]);
	t0 = sm70t_ms_now();
	for (i = 0; i < N_PENDING; i++) {
		ret = sm70t_raw_finish(&pend[i], 3000);
		if (ret == 1)
			fail_msg("waiting connection %d refused: %s", i, pend[i].refusal.reason);
		assert_int_equal(ret, 0);
		run_job(&pend[i], 2);
	}
	printf("after %d sessions closed, the %d waiting connections were welcomed within %ld ms "
	       "and each ran a job\n", closed, N_PENDING, sm70t_ms_now() - t0);
	/* the sessions that stayed open still work */
	for (i = 0; i < n_ok - closed; i++)
		run_job(&c[i], 3);
	for (i = 0; i < N_PENDING; i++)
		sm70t_raw_close(&pend[i]);
	for (i = 0; i < n_ok - closed; i++)
		sm70t_raw_close(&c[i]);
	n_end = sm70t_settled_fds(t.pid);
	printf("daemon descriptors: %d idle before, %d after every session closed\n", n0, n_end);
	assert_int_equal(n_end, n0);
	assert_int_equal(sm70t_daemon_stop(&t, SIGTERM, 5000), 0);
}

static void test_denied_uid_holds_no_descriptors(void **state)
{
	static const char cfg[] =
		"{ \"engine\": { \"n_threads\": 1, \"max_seqs\": 4, \"kv_bytes\": 16777216 },\n"
		"  \"allowed_uids\": [4242] }\n";
	static int fds[N_DENIED];
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	struct sm70_client *sdk = NULL;
	int n0, n_held, refused = 0, ret, i;

	assert_true(getuid() != 4242);
	assert_int_equal(sm70t_daemon_start_hook(&t, NULL, cfg, NULL, lower_nofile, NULL), 0);
	n0 = sm70t_settled_fds(t.pid);
	snprintf(a.sun_path, sizeof(a.sun_path), "%s", t.sock);
	/* in batches that fit the listen backlog; no hello is ever sent */
	for (int b = 0; b < N_DENIED; b += 50) {
		for (i = b; i < b + 50 && i < N_DENIED; i++) {
			fds[i] = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
			assert_true(fds[i] >= 0);
			if (connect(fds[i], (struct sockaddr *)&a, sizeof(a)))
				fail_msg("connection %d: %s (the daemon does not take its backlog)",
					 i, strerror(errno));
		}
		for (i = b; i < b + 50 && i < N_DENIED; i++) {
			struct pollfd p = { .fd = fds[i], .events = POLLIN };
			struct sm70_proto_refusal r;

			if (poll(&p, 1, 2000) != 1)
				fail_msg("connection %d: no answer within 2 s without a hello", i);
			memset(&r, 0, sizeof(r));
			assert_int_equal(recv(fds[i], &r, sizeof(r), 0), sizeof(r));
			assert_int_equal(r.type, SM70_PROTO_MSG_REFUSAL);
			assert_int_equal(r.result, SM70_PROTO_E_DENIED);
			refused++;
		}
	}
	n_held = sm70t_settled_fds(t.pid); /* every connection is still open on the test's side */
	printf("%d connections of a denied uid, none sent a hello: %d refused with E_DENIED at "
	       "once; daemon descriptors %d before, %d while the test holds them all "
	       "(RLIMIT_NOFILE %d)\n", N_DENIED, refused, n0, n_held, FD_LIMIT);
	assert_int_equal(refused, N_DENIED);
	assert_int_equal(n_held, n0);
	for (i = 0; i < N_DENIED; i++)
		close(fds[i]);

	/* The refusal comes at accept, before or after the SDK sent its hello: either way
	 * the SDK reports it. */
	for (i = 0; i < 50; i++) {
		ret = sm70_client_connect(&sdk, t.sock, NULL);
		if (ret != -SM70_E_DENIED ||
		    !strstr(sm70_client_last_error(sdk), "may not use this sm70d"))
			fail_msg("SDK connect %d: %s: %s", i, sm70_strerror(ret),
				 sm70_client_last_error(sdk));
		if (i == 0)
			printf("SDK client: %s: %s\n", sm70_strerror(ret),
			       sm70_client_last_error(sdk));
		sm70_client_close(sdk);
		sdk = NULL;
	}
	printf("50 SDK connects: each reported E_DENIED with the daemon's reason\n");
	assert_int_equal(sm70t_daemon_stop(&t, SIGTERM, 5000), 0);
}

static int teardown(void **state)
{
	if (t.pid > 0 && !t.exited) {
		sm70t_daemon_dump_log(&t);
		sm70t_daemon_stop(&t, SIGKILL, 5000);
	}
	if (t.pid > 0)
		sm70t_daemon_cleanup(&t);
	memset(&t, 0, sizeof(t));
	return 0;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_backlog_served_after_emfile, teardown),
		cmocka_unit_test_teardown(test_denied_uid_holds_no_descriptors, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
