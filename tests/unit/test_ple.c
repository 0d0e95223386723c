/* test_ple - qwen4_exp's n-gram hash parameters against the ones transformers computed
 * and saved in the fixture checkpoint (layer_multipliers, ngram_heads_vocab_sizes,
 * ngram_heads_offsets of both PLE layers), the table sizes its shards add up to, and the
 * page-locked table memory: a lock beyond RLIMIT_MEMLOCK is refused with a message that
 * names the limit and the unit's setting. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "daemon/engine/checkpoint.h"
#include "daemon/engine/model_config.h"
#include "daemon/engine/ple.h"

#define FIXTURE "tests/fixtures/qwen4_exp-hc4-qsa-ple"

static const int64_t *stored(const struct sm70_ckpt *ck, int layer, const char *what, int n)
{
	char name[192];
	const struct sm70_st_tensor *t;

	snprintf(name, sizeof(name), "model.layers.%d.ple.ple_embedding.%s", layer, what);
	t = sm70_ckpt_find(ck, name);
	if (!t)
		fail_msg("%s missing from the fixture", name);
	assert_int_equal(t->dtype, SM70_DTYPE_I64);
	assert_int_equal(t->shape[0], n);
	return t->data;
}

static void test_params_match_transformers(void **state)
{
	struct sm70_ckpt *ck;
	struct sm70_model_config mc;
	struct sm70_err e = { { 0 } };
	static const int layers[2] = { 0, 2 }; /* ple_layer_ids [1, 3], one-indexed */

	if (sm70_ckpt_open(&ck, FIXTURE, &e) ||
	    sm70_model_config_parse(&mc, sm70_ckpt_config(ck), NULL, &e))
		fail_msg("%s", e.msg);
	for (int li = 0; li < 2; li++) {
		struct sm70_ple_params p;
		const int64_t *mult, *size, *off;
		int64_t rows = 0;
		char name[192];

		assert_int_equal(sm70__ple_params(&mc, li, &p, &e), 0);
		assert_int_equal(p.n_heads, 4);
		mult = stored(ck, layers[li], "layer_multipliers", 3);
		size = stored(ck, layers[li], "ngram_heads_vocab_sizes", 4);
		off = stored(ck, layers[li], "ngram_heads_offsets", 4);
		for (int i = 0; i < 3; i++)
			assert_true(p.mult[i] == (uint64_t)mult[i]);
		for (int g = 0; g < 4; g++) {
			assert_true(p.size[g] == (uint64_t)size[g]);
			assert_true(p.offset[g] == (uint64_t)off[g]);
		}
		for (int i = 0; i < 8; i++) {
			const struct sm70_st_tensor *t;
			snprintf(name, sizeof(name),
				 "model.layers.%d.ple.ple_embedding.ngram_embedding.shard_%d.weight",
				 layers[li], i);
			t = sm70_ckpt_find(ck, name);
			assert_non_null(t);
			rows += t->shape[0];
		}
		assert_true((uint64_t)rows == p.rows);
		print_message("  PLE layer %d (layer %d): multipliers %llu.., primes %llu..%llu, "
			      "%llu rows: equal to transformers'\n", li, layers[li],
			      (unsigned long long)p.mult[0], (unsigned long long)p.size[0],
			      (unsigned long long)p.size[3], (unsigned long long)p.rows);
		sm70__ple_params_free(&p);
	}
	sm70_ckpt_close(ck);
}

/* In a child (the limit stays there): lower RLIMIT_MEMLOCK below the request. */
static void test_memlock_refused(void **state)
{
	int fds[2], status;
	char msg[512] = { 0 };
	pid_t pid;

	assert_int_equal(pipe(fds), 0);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		struct rlimit rl = { 1 << 16, 1 << 16 };
		struct sm70_err e = { { 0 } };
		void *p;

		close(fds[0]);
		if (setrlimit(RLIMIT_MEMLOCK, &rl))
			_exit(3);
		/* root locks past the limit (CAP_IPC_LOCK): become nobody, which drops it */
		if (geteuid() == 0 && (setgid(65534) || setuid(65534)))
			_exit(3);
		p = sm70__pinned_alloc((size_t)16 << 20, &e);
		if (p) {
			/* privileged (CAP_IPC_LOCK): the limit does not apply */
			sm70__pinned_free(p, (size_t)16 << 20);
			_exit(2);
		}
		(void)!write(fds[1], e.msg, strlen(e.msg));
		_exit(0);
	}
	close(fds[1]);
	(void)!read(fds[0], msg, sizeof(msg) - 1);
	close(fds[0]);
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFEXITED(status));
	if (WEXITSTATUS(status) == 2) {
		print_message("  SKIP: this process may lock memory past RLIMIT_MEMLOCK "
			      "(CAP_IPC_LOCK), so the refusal cannot be seen here\n");
		return;
	}
	assert_int_equal(WEXITSTATUS(status), 0);
	print_message("  16 MiB under a 64 KiB limit: %s\n", msg);
	assert_non_null(strstr(msg, "RLIMIT_MEMLOCK is 64 KiB"));
	assert_non_null(strstr(msg, "LimitMEMLOCK=infinity"));
}

static void test_dummy_fill(void **state)
{
	enum { N = (1 << 20) + 3 };
	static uint16_t a[N], b[N];

	/* threads split the range; the values are a function of (seed, index) only */
	sm70__ple_dummy_fill(a, SM70_DTYPE_BF16, N, 7, 0.1f);
	for (size_t i = 0; i < N; i++) {
		float v = sm70_bf16_to_f32(a[i]);
		assert_true(v >= -0.1001f && v <= 0.1001f); /* bf16 rounding */
	}
	sm70__ple_dummy_fill(b, SM70_DTYPE_BF16, 1000, 7, 0.1f);
	assert_memory_equal(a, b, 1000 * sizeof(uint16_t));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_params_match_transformers),
		cmocka_unit_test(test_memlock_refused),
		cmocka_unit_test(test_dummy_fill),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
