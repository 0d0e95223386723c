/* test_config - sm70d's config file parser and checks (daemon/config.c): every key, every
 * error case with its message. */
/* config.c is the daemon's, not the core library's: compile it into this test. */
#include "daemon/config.c"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "daemon/engine/engine.h"

#define MODEL "tests/fixtures/qwen3-gqa2-d64-tied"

static char dir[64];
static char path[128];
static int n_errors; /* error cases compared, for the summary line */

static void write_config(const char *text)
{
	FILE *f = fopen(path, "w");

	assert_non_null(f);
	fputs(text, f);
	fclose(f);
}

/* Loads text as a config over the defaults; returns the result, err filled. */
static int load_text(struct sm70__config *c, const char *text, struct sm70_err *err)
{
	write_config(text);
	sm70__config_default(c);
	sm70_err_clear(err);
	return sm70__config_load(c, path, err);
}

/* Loading text fails with code, and the message contains want (after the file name). */
static void expect_error(const char *text, int code, const char *want)
{
	struct sm70__config c;
	struct sm70_err err;
	int ret = load_text(&c, text, &err);

	if (ret != code || !strstr(err.msg, want))
		fail_msg("config %s: got %d '%s', want %d '%s'", text, ret, err.msg, code, want);
	assert_int_equal(strncmp(err.msg, path, strlen(path)), 0); /* names the file */
	n_errors++;
}

static void test_defaults_and_check(void **state)
{
	struct sm70__config c;
	struct sm70_err err;

	sm70__config_default(&c);
	sm70_err_clear(&err);
	assert_string_equal(c.backend, "cpu");
	assert_string_equal(c.socket_path, "/run/sm70/sm70d.sock");
	assert_int_equal(c.n_gpus, 1);
	assert_int_equal(c.gpus[0], 0);
	assert_int_equal(c.engine.prefix_cache, 1);
	assert_int_equal(c.engine.batch_invariant, 0);
	assert_string_equal(c.engine.kv_dtype, "auto");
	assert_int_equal(c.admin_allowed_uids[0], 0);
	assert_int_equal(c.admin_control_uids[0], 0);
	assert_int_equal(c.has_admin_socket_gid, 0);
	assert_int_equal(c.admin_socket_path[0], '\0');
	assert_int_equal(c.admin_idle_ms, 5000);
	assert_int_equal(c.admin_max_conns_per_uid, 4);
	/* no model directory yet */
	assert_int_equal(sm70__config_check(&c, &err), -EINVAL);
	assert_non_null(strstr(err.msg, "model: no model directory"));
	n_errors++;
	strcpy(c.model_dir, MODEL);
	sm70_err_clear(&err);
	assert_int_equal(sm70__config_check(&c, &err), 0);
	assert_string_equal(c.admin_socket_path, "/run/sm70/sm70d.sock.admin");
	printf("defaults: backend %s, socket %s, admin %s\n", c.backend, c.socket_path,
	       c.admin_socket_path);
}

static void test_every_key(void **state)
{
	struct sm70__config c;
	struct sm70_err err;
	const char *text =
		"{\"model\": \"" MODEL "\", \"model_name\": \"Qwen/Qwen3-8B prod\","
		" \"backend\": \"cuda\", \"load_format\": \"dummy\","
		" \"gpus\": [2, 0], \"socket\": \"/tmp/x.sock\", \"socket_mode\": \"0600\","
		" \"allowed_uids\": [0, \"root\", 1000], \"allowed_gids\": [\"root\", 5],"
		" \"max_sessions\": 8, \"admin_socket\": \"/tmp/x.admin\","
		" \"admin_socket_mode\": 384, \"admin_allowed_uids\": [7],"
		" \"admin_allowed_gids\": [0], \"admin_control_uids\": [8],"
		" \"admin_control_gids\": [\"root\"], \"admin_socket_group\": \"root\","
		" \"admin_idle_ms\": 250, \"admin_max_conns_per_uid\": 2,"
		" \"limits\": {\"max_jobs_in_flight\": 5, \"max_prompt_tokens\": 100,"
		"   \"max_new_tokens\": 50, \"max_context_tokens\": 0, \"max_priority\": 1,"
		"   \"max_top_logprobs\": 2},"
		" \"engine\": {\"max_seqs\": 4, \"max_batch_tokens\": 64, \"block_size\": 32,"
		"   \"kv_memory_fraction\": 0.5, \"kv_dtype\": \"fp8\", \"prefix_cache\": false,"
		"   \"n_threads\": 3, \"feed_depth\": 1, \"batch_invariant\": true},"
		" \"fast_paths\": {\"matmul\": \"reference\", \"attention\": \"fast\","
		" \"overlap\": \"reference\", \"gemv_split\": \"fast\"},"
		" \"rings\": {\"sq_entries\": 16, \"eq_entries\": 32, \"arena_tokens\": 2048,"
		"   \"start_index\": 4294967040},"
		" \"drain_grace_ms\": 100, \"slow_consumer_ms\": 200,"
		" \"slow_consumer_events\": 300, \"hello_timeout_ms\": 400}";

	assert_int_equal(load_text(&c, text, &err), 0);
	assert_int_equal(sm70__config_check(&c, &err), 0);
	assert_string_equal(c.model_dir, MODEL);
	assert_string_equal(c.model_name, "Qwen/Qwen3-8B prod");
	assert_string_equal(c.backend, "cuda");
	assert_string_equal(c.load_format, "dummy");
	assert_int_equal(c.n_gpus, 2);
	assert_int_equal(c.gpus[0], 2);
	assert_string_equal(c.socket_path, "/tmp/x.sock");
	assert_int_equal(c.socket_mode, 0600);
	assert_int_equal(c.n_allowed_uids, 3);
	assert_int_equal(c.allowed_uids[1], 0);
	assert_int_equal(c.allowed_uids[2], 1000);
	assert_int_equal(c.n_allowed_gids, 2);
	assert_int_equal(c.allowed_gids[1], 5);
	assert_int_equal(c.max_sessions, 8);
	assert_string_equal(c.admin_socket_path, "/tmp/x.admin");
	assert_int_equal(c.admin_socket_mode, 0600);
	assert_int_equal(c.n_admin_allowed_uids, 1);
	assert_int_equal(c.admin_allowed_uids[0], 7);
	assert_int_equal(c.n_admin_allowed_gids, 1);
	assert_int_equal(c.n_admin_control_uids, 1);
	assert_int_equal(c.admin_control_uids[0], 8);
	assert_int_equal(c.admin_control_gids[0], 0);
	assert_int_equal(c.has_admin_socket_gid, 1);
	assert_int_equal(c.admin_socket_gid, 0);
	assert_int_equal(c.admin_idle_ms, 250);
	assert_int_equal(c.admin_max_conns_per_uid, 2);
	assert_int_equal(c.limits.max_jobs_in_flight, 5);
	assert_int_equal(c.limits.max_top_logprobs, 2);
	assert_int_equal(c.engine.max_seqs, 4);
	assert_int_equal(c.engine.block_size, 32);
	assert_true(c.engine.kv_memory_fraction == 0.5);
	assert_string_equal(c.engine.kv_dtype, "fp8");
	assert_int_equal(c.engine.prefix_cache, 0);
	assert_int_equal(c.engine.n_threads, 3);
	assert_int_equal(c.engine.batch_invariant, 1);
	assert_string_equal(c.fast_paths.matmul, "reference");
	assert_string_equal(c.fast_paths.attention, "fast");
	assert_string_equal(c.fast_paths.overlap, "reference");
	assert_string_equal(c.fast_paths.gemv_split, "fast");
	assert_int_equal(c.rings.start_index, 4294967040u);
	assert_int_equal(c.drain_grace_ms, 100);
	assert_int_equal(c.hello_timeout_ms, 400);
	printf("every key: %zu top-level keys parsed and checked\n",
	       sizeof(top_keys) / sizeof(top_keys[0]) - 1);
}

/* Every engine.kv_dtype word the parser takes is one the engine knows, with the K/V
 * dtypes documented: "fp8" K FP8-E4M3 with V f16, "fp8-all" both FP8. */
static void test_kv_dtype_words(void **state)
{
	static const struct {
		const char *word;
		enum sm70_dtype k, v;
	} want[] = {
		{ "auto", SM70_DTYPE_COUNT, SM70_DTYPE_COUNT },
		{ "f32", SM70_DTYPE_F32, SM70_DTYPE_COUNT },
		{ "f16", SM70_DTYPE_F16, SM70_DTYPE_COUNT },
		{ "fp8", SM70_DTYPE_F8E4M3, SM70_DTYPE_F16 },
		{ "fp8-all", SM70_DTYPE_F8E4M3, SM70_DTYPE_COUNT },
	};
	char text[128];

	for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
		struct sm70__config c;
		struct sm70_engine_opts eo;
		struct sm70_err err;

		snprintf(text, sizeof(text), "{\"engine\": {\"kv_dtype\": \"%s\"}}",
			 want[i].word);
		assert_int_equal(load_text(&c, text, &err), 0);
		assert_string_equal(c.engine.kv_dtype, want[i].word);
		sm70_engine_opts_default(&eo);
		assert_int_equal(sm70_engine_opts_kv_mode(&eo, c.engine.kv_dtype), 0);
		assert_int_equal(eo.kv_dtype, want[i].k);
		assert_int_equal(eo.kv_v_dtype, want[i].v);
		if (want[i].k != SM70_DTYPE_COUNT)
			assert_string_equal(sm70_kv_mode_name(want[i].k, want[i].v), want[i].word);
	}
	/* the word list of the config and of the engine agree: one more is refused by both */
	expect_error("{\"engine\": {\"kv_dtype\": \"fp8-k\"}}", -EINVAL,
		     "engine.kv_dtype: must be");
	{
		struct sm70_engine_opts eo;

		sm70_engine_opts_default(&eo);
		assert_int_equal(sm70_engine_opts_kv_mode(&eo, "fp8-k"), -EINVAL);
		assert_int_equal(eo.kv_dtype, SM70_DTYPE_COUNT);
	}
	printf("engine.kv_dtype: %zu words, each the engine's K/V pair\n",
	       sizeof(want) / sizeof(want[0]));
}

static void test_unknown_keys(void **state)
{
	expect_error("{\"sokcet\": \"/x\"}", -EINVAL, ": sokcet: unknown key");
	expect_error("{\"engine\": {\"max_seq\": 4}}", -EINVAL, ": engine.max_seq: unknown key");
	expect_error("{\"fast_paths\": {\"gemm\": \"fast\"}}", -EINVAL,
		     "fast_paths.gemm: unknown key");
}

static void test_wrong_types(void **state)
{
	expect_error("{\"max_sessions\": \"ten\"}", -EINVAL,
		     "max_sessions: must be an integer in 1..65536");
	expect_error("{\"engine\": {\"prefix_cache\": 1}}", -EINVAL,
		     "engine.prefix_cache: must be true or false");
	expect_error("{\"backend\": 3}", -EINVAL,
		     "backend: must be \"cpu\", \"cuda\" or \"null\"");
	expect_error("{\"engine\": {\"kv_dtype\": \"bf16\"}}", -EINVAL,
		     "engine.kv_dtype: must be \"auto\", \"f32\", \"f16\", \"fp8\" or "
		     "\"fp8-all\"");
	expect_error("{\"fast_paths\": {\"matmul\": \"turbo\"}}", -EINVAL,
		     "fast_paths.matmul: must be \"fast\" or \"reference\"");
	expect_error("{\"limits\": 5}", -EINVAL, "limits: must be an object");
	expect_error("{\"admin_idle_ms\": 0}", -EINVAL,
		     "admin_idle_ms: must be an integer in 100..3600000");
	expect_error("{\"admin_max_conns_per_uid\": 17}", -EINVAL,
		     "admin_max_conns_per_uid: must be an integer in 1..16");
	expect_error("{\"model\": 7}", -EINVAL, "model: must be a path shorter than 4096 bytes");
	expect_error("{\"model_name\": 7}", -EINVAL, "model_name: must be a string of 1 to 63 "
		     "printable ASCII characters");
	expect_error("{\"model_name\": \"\"}", -EINVAL, "model_name: must be a string");
	expect_error("{\"model_name\": \"a\\nb\"}", -EINVAL, "model_name: must be a string");
	expect_error("{\"model_name\": \"say \\\"hi\\\"\"}", -EINVAL,
		     "model_name: must be a string");
	expect_error("{\"model_name\": \"0123456789012345678901234567890123456789"
		     "012345678901234567890123\"}", -EINVAL, "model_name: must be a string");
	expect_error("{\"gpus\": 0}", -EINVAL, "gpus: must be a list of 1 to 16 integers");
	expect_error("{\"allowed_uids\": [1.5]}", -EINVAL,
		     "allowed_uids[0]: must be a non-negative integer or a name");
	expect_error("{\"admin_allowed_gids\": [\"no-such-group-sm70\"]}", -EINVAL,
		     "admin_allowed_gids[0]: no group named 'no-such-group-sm70'");
	expect_error("{\"admin_socket_group\": \"no-such-group-sm70\"}", -EINVAL,
		     "admin_socket_group: no group named 'no-such-group-sm70'");
	expect_error("{\"admin_socket_group\": [0]}", -EINVAL,
		     "admin_socket_group: must be a gid or a group name");
	expect_error("{\"socket_mode\": \"rw\"}", -EINVAL,
		     "socket_mode: must be a file mode such as \"0660\"");
	expect_error("{\"engine\": {\"kv_memory_fraction\": \"half\"}}", -EINVAL,
		     "engine.kv_memory_fraction: must be a number in (0, 1]");
}

static void test_out_of_range(void **state)
{
	expect_error("{\"engine\": {\"max_seqs\": 0}}", -EINVAL,
		     "engine.max_seqs: must be an integer in 1..1024");
	expect_error("{\"engine\": {\"max_batch_tokens\": 2000000}}", -EINVAL,
		     "engine.max_batch_tokens: must be an integer in 16..1048576");
	expect_error("{\"limits\": {\"max_new_tokens\": -1}}", -EINVAL,
		     "limits.max_new_tokens: must be an integer in 1..16777216");
	expect_error("{\"engine\": {\"kv_memory_fraction\": 1.5}}", -EINVAL,
		     "engine.kv_memory_fraction: must be a number in (0, 1]");
	expect_error("{\"engine\": {\"kv_memory_fraction\": 0}}", -EINVAL,
		     "engine.kv_memory_fraction: must be a number in (0, 1]");
	expect_error("{\"engine\": {\"kv_bytes\": 1024}}", -EINVAL, "engine.kv_bytes: must be "
		     "an integer in 65536..");
	expect_error("{\"engine\": {\"kv_bytes\": 1048576, \"kv_memory_fraction\": 0.9}}",
		     -EINVAL, "engine.kv_memory_fraction: cannot be used together with "
		     "engine.kv_bytes");
	expect_error("{\"gpus\": [300]}", -EINVAL, "gpus[0]: must be an integer in 0..255");
	expect_error("{\"gpus\": [1, 1]}", -EINVAL, "gpus[1]: 1 is listed twice");
	expect_error("{\"gpus\": []}", -EINVAL, "gpus: must be a list of 1 to 16 integers");
	expect_error("{\"tp\": 0}", -EINVAL, "tp: must be an integer in 1..4");
	expect_error("{\"tp\": 8}", -EINVAL, "tp: must be an integer in 1..4");
	expect_error("{\"fast_paths\": {\"fused\": \"off\"}}", -EINVAL,
		     "fast_paths.fused: must be \"fast\" or \"reference\"");
	expect_error("{\"socket_mode\": \"017777\"}", -EINVAL,
		     "socket_mode: must be a file mode");
	expect_error("{\"socket\": \"/tmp/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
		     "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\"}", -EINVAL,
		     "socket: must be a path shorter than 108 bytes");
}

static void test_model_dir_checks(void **state)
{
	struct sm70__config c;
	struct sm70_err err;

	assert_int_equal(load_text(&c, "{\"model\": \"/nonexistent/sm70-model\"}", &err), 0);
	assert_int_equal(sm70__config_check(&c, &err), -ENOENT);
	assert_string_equal(err.msg, "model: /nonexistent/sm70-model: No such file or directory");
	printf("missing model dir: %s\n", err.msg);

	assert_int_equal(load_text(&c, "{\"model\": \"" MODEL "/config.json\"}", &err), 0);
	assert_int_equal(sm70__config_check(&c, &err), -ENOTDIR);
	assert_non_null(strstr(err.msg, "config.json: not a directory"));

	/* the cuda backend with no GPU left is caught even if gpus was emptied by hand */
	assert_int_equal(load_text(&c, "{\"model\": \"" MODEL "\", \"backend\": \"cuda\"}", &err),
			 0);
	c.n_gpus = 0;
	assert_int_equal(sm70__config_check(&c, &err), -EINVAL);
	assert_string_equal(err.msg, "gpus: the cuda backend needs at least one GPU");

	/* more ranks than GPUs listed, and ranks on the null backend */
	assert_int_equal(load_text(&c, "{\"model\": \"" MODEL "\", \"backend\": \"cuda\", "
				   "\"tp\": 2, \"gpus\": [3]}", &err), 0);
	assert_int_equal(sm70__config_check(&c, &err), -EINVAL);
	assert_string_equal(err.msg, "tp: 2 ranks need 2 GPUs in gpus, 1 listed");
	assert_int_equal(load_text(&c, "{\"model\": \"" MODEL "\", \"backend\": \"null\", "
				   "\"tp\": 2}", &err), 0);
	assert_int_equal(sm70__config_check(&c, &err), -EINVAL);
	assert_string_equal(err.msg, "tp: the null backend runs one rank only");
	assert_int_equal(load_text(&c, "{\"model\": \"" MODEL "\", \"backend\": \"cuda\", "
				   "\"tp\": 2, \"gpus\": [3, 1]}", &err), 0);
	assert_int_equal(sm70__config_check(&c, &err), 0);
	assert_int_equal(c.tp, 2);

	/* a derived admin path that does not fit sun_path */
	assert_int_equal(load_text(&c, "{\"model\": \"" MODEL "\", \"socket\": \"/tmp/"
				   "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
				   "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb\"}", &err), 0);
	assert_int_equal(sm70__config_check(&c, &err), -ENAMETOOLONG);
	assert_non_null(strstr(err.msg, "admin_socket: "));
	assert_non_null(strstr(err.msg, "set admin_socket to a shorter path"));

	assert_int_equal(load_text(&c, "{\"model\": \"" MODEL "\", \"socket\": \"/tmp/a\","
				   " \"admin_socket\": \"/tmp/a\"}", &err), 0);
	assert_int_equal(sm70__config_check(&c, &err), -EINVAL);
	assert_string_equal(err.msg, "admin_socket: must differ from socket (/tmp/a)");
	n_errors += 7;
}

static void test_unreadable_file(void **state)
{
	struct sm70__config c;
	struct sm70_err err;
	char missing[160];
	int ret;

	snprintf(missing, sizeof(missing), "%s/none.json", dir);
	sm70__config_default(&c);
	sm70_err_clear(&err);
	assert_int_equal(sm70__config_load(&c, missing, &err), -ENOENT);
	assert_non_null(strstr(err.msg, "none.json: cannot open: No such file or directory"));

	sm70_err_clear(&err);
	assert_int_equal(sm70__config_load(&c, dir, &err), -EISDIR);
	assert_non_null(strstr(err.msg, ": cannot read: not a regular file"));
	printf("unreadable: %s\n", err.msg);

	/* permissions do not stop root; check EACCES only when they apply */
	write_config("{}");
	chmod(path, 0);
	sm70_err_clear(&err);
	ret = sm70__config_load(&c, path, &err);
	if (geteuid() != 0) {
		assert_int_equal(ret, -EACCES);
		assert_non_null(strstr(err.msg, "cannot open: Permission denied"));
	} else {
		assert_int_equal(ret, 0);
		printf("(running as root: the EACCES case is not testable)\n");
	}
	chmod(path, 0644);
	n_errors += 2;
}

static void test_garbage_json(void **state)
{
	expect_error("{\"socket\": ", -EINVAL, ": line 1 column ");
	expect_error("{\"socket\": ", -EINVAL, "not valid JSON");
	expect_error("socket = /x", -EINVAL, "not valid JSON");
	expect_error("", -EINVAL, "not valid JSON");
	expect_error("[1, 2]", -EINVAL, ": the top level must be an object");
	expect_error("{\"max_sessions\": 1, \"max_sessions\": 2}", -EINVAL, "duplicate");
	printf("%d error cases compared with their messages\n", n_errors);
}

static int setup(void **state)
{
	snprintf(dir, sizeof(dir), "/tmp/sm70-config-XXXXXX");
	if (!mkdtemp(dir))
		return -1;
	snprintf(path, sizeof(path), "%s/sm70d.json", dir);
	return 0;
}

static int teardown(void **state)
{
	unlink(path);
	return rmdir(dir);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_defaults_and_check),
		cmocka_unit_test(test_every_key),
		cmocka_unit_test(test_kv_dtype_words),
		cmocka_unit_test(test_unknown_keys),
		cmocka_unit_test(test_wrong_types),
		cmocka_unit_test(test_out_of_range),
		cmocka_unit_test(test_model_dir_checks),
		cmocka_unit_test(test_unreadable_file),
		cmocka_unit_test(test_garbage_json),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
