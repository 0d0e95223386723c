/*
 * test_graphs - decode steps replayed as CUDA graphs give what eager execution gives:
 * the same greedy and seeded tokens and logprobs within 1e-3, for batches that pad (3, 5
 * sequences) and contexts that cross bucket boundaries; and graphs are really used. On a
 * dense model, a hybrid one (DeltaNet state slots; padding rows use the scratch slot) and
 * a hybrid MoE one (routing read from device memory at every replay).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <cmocka.h>

#include "daemon/engine/engine.h"

static const char *const models[] = {
	"tests/fixtures/qwen3-gqa6-d256-long",
	"tests/fixtures/qwen3_5-gqa6-d256-hybrid",
	"tests/fixtures/qwen3_5_moe-e16k4-shared",
	"tests/fixtures/qwen4_exp-hc4-qsa-ple",
};
#define NREQ 5
#define NTOK 40

struct out {
	uint64_t ids[NREQ];
	int n[NREQ];
	int32_t tok[NREQ][NTOK];
	float lp[NREQ][NTOK];
};

static void on_event(void *ctx, const struct sm70_event *ev)
{
	struct out *o = ctx;

	for (int i = 0; i < NREQ; i++)
		if (o->ids[i] == ev->id && ev->sample.token >= 0 && o->n[i] < NTOK) {
			o->tok[i][o->n[i]] = ev->sample.token;
			o->lp[i][o->n[i]++] = ev->sample.logprob;
		}
}

static int run(const char *model, int graphs, int n_req, struct out *o,
	       struct sm70_engine_stats *st)
{
	struct sm70_engine_opts eo;
	struct sm70_engine *e = NULL;
	struct sm70_err err = { { 0 } };
	static int32_t prompt[600];
	int ret;

	setenv("SM70_GRAPHS", graphs ? "1" : "0", 1);
	sm70_engine_opts_default(&eo);
	eo.backend = "cuda";
	ret = sm70_engine_open(&e, model, &eo, &err);
	if (ret) {
		printf("SKIP: cannot open the CUDA engine on %s (%s)\n", model, err.msg);
		return -1;
	}
	memset(o, 0, sizeof(*o));
	for (int i = 0; i < 600; i++)
		prompt[i] = (i * 131 + 7) % sm70_engine_model_config(e)->vocab_size;
	for (int r = 0; r < n_req; r++) {
		/* lengths 480..., so decoding crosses the 512-token bucket boundary */
		struct sm70_request q = {
			.prompt = prompt + r, .n_prompt = 480 + 7 * r, .max_new_tokens = NTOK,
			.ignore_eos = 1, .sampling = { .temperature = r % 2 ? 0.8f : 0.0f,
			.top_k = r % 2 ? 20 : 0, .top_p = r % 2 ? 0.95f : 1.0f, .seed = (uint64_t)r,
			.top_logprobs = 0 },
		};
		assert_int_equal(sm70_engine_submit(e, &q, &o->ids[r], &err), 0);
	}
	while (sm70_engine_busy(e))
		assert_true(sm70_engine_step(e, on_event, o) >= 0);
	sm70_engine_get_stats(e, st);
	sm70_engine_close(e);
	return 0;
}

static void test_graph_equals_eager(void **state)
{
	static struct out eager, graph;
	struct sm70_engine_stats se, sg;
	int counts[2] = { 3, 5 };

	for (int c = 0; c < 6; c++) {
		const char *model = models[c / 2];
		int n = counts[c % 2];
		double worst = 0;
		if (run(model, 0, n, &eager, &se) || run(model, 1, n, &graph, &sg))
			skip();
		assert_int_equal(se.graph_replays, 0);
		assert_true(sg.graph_replays > 0);
		for (int r = 0; r < n; r++) {
			assert_int_equal(graph.n[r], NTOK);
			assert_memory_equal(graph.tok[r], eager.tok[r], sizeof(int32_t) * NTOK);
			for (int i = 0; i < NTOK; i++) {
				double d = fabs((double)graph.lp[r][i] - eager.lp[r][i]);
				if (d > worst)
					worst = d;
			}
		}
		printf("%s, %d sequences: %llu graph replays (%llu captures), tokens equal to "
		       "eager, worst logprob diff %.2e\n", model, n,
		       (unsigned long long)sg.graph_replays,
		       (unsigned long long)sg.graph_captures, worst);
		assert_true(worst < 1e-3);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_graph_equals_eager),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
