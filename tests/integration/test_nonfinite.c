/* test_nonfinite - a checkpoint with a NaN or an infinity is refused at load, naming the tensor; logits that overflow at run time are logged with the engine step; sm70-run exits non-zero on an error finish. */
/*
 * The case of issue 17 item 7: a model with NaN weights loaded, reported ready and failed
 * every job as "internal daemon error" with nothing in the log, and sm70-run printed
 * "0 tokens, finish error" and exited 0. Each case here is a copy of the tiny fixture in a
 * temp dir with one tensor changed in model.safetensors (the header is parsed with jansson;
 * nothing big is committed):
 *
 * - one NaN in model.layers.1.mlp.down_proj.weight (a matrix) and one +inf in
 *   model.layers.0.input_layernorm.weight (an f32 vector): sm70d exits with status 2 and
 *   logs the tensor and the element; sm70-run exits 2 and says the same;
 * - model.norm.weight set to the largest bf16 (finite, so it loads): the logits overflow.
 *   sm70-run exits 1 and prints the reason; sm70d answers every job of a raw protocol
 *   client with FINISH(ERROR, E_INTERNAL) within JOB_BOUND_MS, logs "non-finite logits" with
 *   the engine step for each, keeps serving, and exits 0 on SIGTERM.
 */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
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

#include "tests/integration/daemon_util.h"
#include "tests/integration/raw_client.h"

#define FIXTURE "tests/fixtures/qwen3-gqa2-d64-tied"
#define JOB_BOUND_MS 2000
#define BF16_NAN 0x7fc0
#define BF16_PINF 0x7f80
#define BF16_MAX 0x7f7f

static char tmp[64];
static const uint32_t prompt[5] = { 11, 22, 33, 44, 55 };

/* Copies the fixture's config, generation config and weights into dir. */
static void copy_fixture(const char *dir)
{
	static const char *const files[] = { "config.json", "generation_config.json",
					     "model.safetensors" };
	char cmd[512];

	assert_int_equal(mkdir(dir, 0755), 0);
	for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
		snprintf(cmd, sizeof(cmd), "cp %s/%s %s/", FIXTURE, files[i], dir);
		assert_int_equal(system(cmd), 0);
	}
}

/* Sets elements [first, first + n) of the bf16 tensor `name` in dir's model.safetensors
 * to the bf16 bit pattern v. */
static void poison(const char *dir, const char *name, size_t first, size_t n, uint16_t v)
{
	char path[256], *hdr;
	uint64_t hlen;
	json_error_t je;
	json_t *root, *t;
	int64_t begin, end;
	int fd;

	snprintf(path, sizeof(path), "%s/model.safetensors", dir);
	fd = open(path, O_RDWR);
	assert_true(fd >= 0);
	assert_int_equal(pread(fd, &hlen, 8, 0), 8);
	assert_true(hlen < (1u << 20));
	hdr = calloc(1, (size_t)hlen + 1);
	assert_non_null(hdr);
	assert_int_equal(pread(fd, hdr, (size_t)hlen, 8), (ssize_t)hlen);
	root = json_loads(hdr, 0, &je);
	assert_non_null(root);
	t = json_object_get(root, name);
	assert_non_null(t);
	assert_string_equal(json_string_value(json_object_get(t, "dtype")), "BF16");
	begin = json_integer_value(json_array_get(json_object_get(t, "data_offsets"), 0));
	end = json_integer_value(json_array_get(json_object_get(t, "data_offsets"), 1));
	assert_true(begin + 2 * (int64_t)(first + n) <= end);
	for (size_t i = first; i < first + n; i++)
		assert_int_equal(pwrite(fd, &v, 2, (off_t)(8 + hlen + (uint64_t)begin + 2 * i)), 2);
	json_decref(root);
	free(hdr);
	close(fd);
}

static void rm_dir(const char *dir)
{
	char cmd[256];

	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	assert_int_equal(system(cmd), 0);
}

/* Runs sm70-run on dir with a 5-token prompt and 8 new tokens; returns its exit status,
 * its stderr in err. */
static int run_sm70_run(const char *dir, char *err, size_t len)
{
	char cmd[512], path[128];
	FILE *f;
	size_t n;
	int st;

	snprintf(path, sizeof(path), "%s/run.err", tmp);
	snprintf(cmd, sizeof(cmd), "%s/bin/sm70-run -m %s --prompt-ids 11,22,33,44,55 -n 8 "
		 "--threads 1 >/dev/null 2>%s", sm70t_build_dir(), dir, path);
	st = system(cmd);
	f = fopen(path, "r");
	assert_non_null(f);
	n = fread(err, 1, len - 1, f);
	err[n] = '\0';
	fclose(f);
	assert_true(WIFEXITED(st));
	return WEXITSTATUS(st);
}

/* sm70d on dir must not start: status 2, the log naming `needle`. */
static void daemon_refuses(const char *dir, const char *needle, const char *what)
{
	struct sm70t_daemon t;
	int ret;

	ret = sm70t_daemon_start_model(&t, dir, "{ \"engine\": { \"n_threads\": 1 } }", NULL);
	assert_int_equal(ret, -ECHILD);
	assert_true(WIFEXITED(t.status));
	assert_int_equal(WEXITSTATUS(t.status), 2);
	assert_true(sm70t_log_contains(&t, needle));
	assert_true(sm70t_log_contains(&t, what));
	printf("sm70d: exit status 2, the log names %s (%s)\n", needle, what);
	sm70t_daemon_cleanup(&t);
}

static void test_nonfinite_weights_refused(void **state)
{
	char dir[128], err[2048];
	int st;

	(void)state;
	snprintf(dir, sizeof(dir), "%s/nan-matrix", tmp);
	copy_fixture(dir);
	poison(dir, "model.layers.1.mlp.down_proj.weight", 5 * 320 + 17, 1, BF16_NAN);
	fprintf(stderr, "(the daemon log below is expected: the load must fail)\n");
	daemon_refuses(dir, "model.layers.1.mlp.down_proj.weight: element 1617 (row 5, column 17) "
		       "is NaN", "non-finite weight");
	st = run_sm70_run(dir, err, sizeof(err));
	printf("sm70-run: exit status %d: %s", st, err);
	assert_int_equal(st, 2);
	assert_non_null(strstr(err, "model.layers.1.mlp.down_proj.weight"));
	rm_dir(dir);

	snprintf(dir, sizeof(dir), "%s/inf-vector", tmp);
	copy_fixture(dir);
	poison(dir, "model.layers.0.input_layernorm.weight", 7, 1, BF16_PINF);
	daemon_refuses(dir, "model.layers.0.input_layernorm.weight: element 7", "+inf");
	st = run_sm70_run(dir, err, sizeof(err));
	printf("sm70-run: exit status %d: %s", st, err);
	assert_int_equal(st, 2);
	assert_non_null(strstr(err, "model.layers.0.input_layernorm.weight"));
	rm_dir(dir);
}

static void test_overflowing_logits_reported(void **state)
{
	struct sm70t_daemon t;
	struct sm70t_raw c;
	struct sm70_proto_eqe ev;
	char dir[128], err[2048];
	int st;

	(void)state;
	snprintf(dir, sizeof(dir), "%s/huge-norm", tmp);
	copy_fixture(dir);
	poison(dir, "model.norm.weight", 0, 128, BF16_MAX);

	st = run_sm70_run(dir, err, sizeof(err));
	printf("sm70-run: exit status %d: %s", st, err);
	assert_int_equal(st, 1);
	assert_non_null(strstr(err, "non-finite logits"));
	assert_non_null(strstr(err, "engine step"));

	assert_int_equal(sm70t_daemon_start_model(&t, dir, "{ \"engine\": { \"n_threads\": 1 } }",
						  NULL), 0);
	assert_int_equal(sm70t_raw_connect(&c, t.sock, 0, 5000), 0);
	for (uint64_t tag = 1; tag <= 3; tag++) {
		long t0 = sm70t_raw_ms();

		assert_int_equal(sm70t_raw_submit(&c, tag, prompt, 5, 8, 0), 0);
		sm70t_raw_publish(&c);
		assert_int_equal(sm70t_raw_wait_final(&c, tag, &ev, JOB_BOUND_MS), 0);
		assert_int_equal(ev.type, SM70_PROTO_EV_FINISH);
		assert_int_equal(ev.u.finish.reason, SM70_PROTO_FINISH_ERROR);
		assert_int_equal(ev.u.finish.error, SM70_PROTO_E_INTERNAL);
		printf("job %llu: FINISH(ERROR, %s) after %ld ms\n", (unsigned long long)tag,
		       sm70_proto_strerror(ev.u.finish.error), sm70t_raw_ms() - t0);
	}
	assert_true(sm70t_log_contains(&t, "failed in the engine: no token could be sampled at "
				       "engine step"));
	assert_true(sm70t_log_contains(&t, "non-finite logits"));
	sm70t_raw_close(&c);
	st = sm70t_daemon_stop(&t, SIGTERM, 5000);
	if (st != 0)
		sm70t_daemon_dump_log(&t);
	assert_int_equal(st, 0);
	printf("sm70d: every job answered, the log says why, exit 0 on SIGTERM\n");
	sm70t_daemon_cleanup(&t);
	rm_dir(dir);
}

static int setup(void **state)
{
	(void)state;
	snprintf(tmp, sizeof(tmp), "/tmp/sm70t-nonfinite-XXXXXX");
	return mkdtemp(tmp) ? 0 : -1;
}

static int teardown(void **state)
{
	char cmd[128];

	(void)state;
	snprintf(cmd, sizeof(cmd), "rm -rf %s", tmp);
	return system(cmd) == 0 ? 0 : -1;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_nonfinite_weights_refused),
		cmocka_unit_test(test_overflowing_logits_reported),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
