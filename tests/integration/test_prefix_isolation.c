/* test_prefix_isolation - sm70d's prefix cache does not tell one uid what another asked: per-uid domains by default, one cache with scope "shared". */
/*
 * The attack of issue 17 item 9: a client submits a guess of another user's prompt and
 * reads cached_prompt_tokens (or its first-token time) to learn whether the guess is
 * right, block by block. Here two raw protocol clients in child processes, as uids
 * UID_A and UID_B (setresuid needs root: skipped otherwise), each submit the same
 * 40-token prompt in turn (A, B, A, B): with the default engine.prefix_cache_scope
 * ("user") B's first job finds nothing (cached 0) and each repeat finds its own uid's 32
 * tokens (2 blocks of 16 before the last token); with "shared" B's first job is a hit.
 * Every job's final event is a FINISH(LENGTH) with 8 tokens.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/integration/daemon_util.h"
#include "tests/integration/raw_client.h"

#define UID_A 4251
#define UID_B 4252
#define N_PROMPT 40

static struct sm70t_daemon dmn;

struct job_report {
	int ok;        /* 1: connected and got a FINISH(LENGTH) */
	int tokens;
	uint32_t cached;
	char why[96];
};

/* One job as uid, in a child process; the report comes back through a pipe. */
static struct job_report run_as(uid_t uid)
{
	struct job_report r;
	int p[2], st;
	pid_t pid;

	memset(&r, 0, sizeof(r));
	assert_int_equal(pipe(p), 0);
	fflush(NULL);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		static uint32_t prompt[N_PROMPT];
		struct sm70t_raw c;
		struct sm70_proto_eqe ev;
		int ret;

		close(p[0]);
		for (int i = 0; i < N_PROMPT; i++)
			prompt[i] = (uint32_t)(i * 29 + 3) % 500;
		if (setresgid(uid, uid, uid) || setresuid(uid, uid, uid)) {
			snprintf(r.why, sizeof(r.why), "setresuid: %s", strerror(errno));
		} else {
			sm70t_raw_init(&c);
			ret = sm70t_raw_connect(&c, dmn.sock, 0, 5000);
			if (ret) {
				snprintf(r.why, sizeof(r.why), "connect: %s",
					 ret > 0 ? "refused" : strerror(-ret));
			} else if (sm70t_raw_submit(&c, 1, prompt, N_PROMPT, 8, 0)) {
				snprintf(r.why, sizeof(r.why), "submit: no room");
			} else {
				sm70t_raw_publish(&c);
				ret = sm70t_raw_wait_final(&c, 1, &ev, 10000);
				r.tokens = ret;
				if (ret >= 0 && ev.type == SM70_PROTO_EV_FINISH &&
				    ev.u.finish.reason == SM70_PROTO_FINISH_LENGTH) {
					r.ok = 1;
					r.cached = ev.u.finish.cached_prompt_tokens;
				} else {
					snprintf(r.why, sizeof(r.why), "final event: ret %d, type %d",
						 ret, (int)ev.type);
				}
			}
			sm70t_raw_close(&c);
		}
		(void)!write(p[1], &r, sizeof(r));
		_exit(0);
	}
	close(p[1]);
	assert_int_equal(read(p[0], &r, sizeof(r)), (ssize_t)sizeof(r));
	close(p[0]);
	assert_int_equal(waitpid(pid, &st, 0), pid);
	if (!r.ok)
		fail_msg("uid %d: %s", (int)uid, r.why);
	return r;
}

static void scope(const char *name, const uint32_t want[4])
{
	char cfg[512];
	const uid_t who[4] = { UID_A, UID_B, UID_A, UID_B };

	snprintf(cfg, sizeof(cfg),
		 "{ \"engine\": { \"n_threads\": 1, \"kv_bytes\": 16777216, \"block_size\": 16%s%s%s },\n"
		 "  \"allowed_uids\": [0, %d, %d], \"socket_mode\": \"0666\" }\n",
		 name ? ", \"prefix_cache_scope\": \"" : "", name ? name : "", name ? "\"" : "",
		 UID_A, UID_B);
	assert_int_equal(sm70t_daemon_start(&dmn, cfg, NULL), 0);
	/* the clients' uids must reach the socket in the (0700) temp dir */
	assert_int_equal(chmod(dmn.dir, 0711), 0);
	for (int i = 0; i < 4; i++) {
		struct job_report r = run_as(who[i]);

		printf("scope %s: job %d as uid %d: %d tokens, cached_prompt_tokens %u (want %u)\n",
		       name ? name : "(default)", i, (int)who[i], r.tokens, r.cached, want[i]);
		assert_int_equal(r.tokens, 8);
		assert_int_equal(r.cached, want[i]);
	}
	assert_int_equal(sm70t_daemon_finish(&dmn, 10000), 0);
}

static int need_root(void)
{
	if (geteuid() == 0)
		return 1;
	printf("skipped: two client uids need root (setresuid)\n");
	return 0;
}

static void test_user_scope(void **state)
{
	static const uint32_t want[4] = { 0, 0, 32, 32 };

	(void)state;
	if (!need_root())
		skip();
	scope(NULL, want);
}

static void test_shared_scope(void **state)
{
	static const uint32_t want[4] = { 0, 32, 32, 32 };

	(void)state;
	if (!need_root())
		skip();
	scope("shared", want);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_user_scope),
		cmocka_unit_test(test_shared_scope),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
