/*
 * test_sampler_tp.c - sampling from vocabulary slices (sampler_tp.h and the CPU
 * shard_summary op) gives what the host sampler gives on the whole row, and refuses
 * (-ERANGE) only when the candidate lists cannot decide.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/engine/sampler.h"
#include "daemon/engine/sampler_tp.h"
#include "kernels/backend.h"
#include "kernels/comm.h"

static uint64_t rng_state = 0x243f6a8885a308d3ull;

static uint64_t rng_next(void)
{
	rng_state ^= rng_state >> 12;
	rng_state ^= rng_state << 25;
	rng_state ^= rng_state >> 27;
	return rng_state * 2685821657736338717ull;
}

static double rng_unit(void)
{
	return (double)(rng_next() >> 11) / 9007199254740992.0;
}

enum shape { PEAKED, FLAT, TIED, MASKED };

/* A row of logits: PEAKED looks like a trained model's (a few hundred plausible ids),
 * FLAT like a random one's, TIED has runs of equal values, MASKED has -inf entries. */
static void make_row(float *l, int vocab, enum shape s)
{
	for (int i = 0; i < vocab; i++) {
		double u = rng_unit();
		switch (s) {
		case PEAKED:
			l[i] = (float)(u < 0.01 ? 8.0 + 4.0 * rng_unit() : -6.0 * rng_unit());
			break;
		case FLAT:
			l[i] = (float)(0.3 * u);
			break;
		case TIED:
			l[i] = (float)((int)(u * 6.0)) * 0.5f;
			break;
		case MASKED:
			l[i] = u < 0.5 ? -INFINITY : (float)(3.0 * rng_unit());
			break;
		}
	}
}

struct split {
	struct sm70_backend *be;
	struct sm70_shard_summary sh[SM70_MAX_TP];
	const struct sm70_shard_summary *ptr[SM70_MAX_TP];
};

/* Summarises logits [vocab] cut into tp slices (ceil split, as the model cuts the head). */
static void summarise(struct split *sp, const float *l, int vocab, int tp, float temperature)
{
	int share = (vocab + tp - 1) / tp;
	struct sm70_sample_row row = { .temperature = temperature };

	for (int r = 0; r < tp; r++) {
		int v0 = r * share < vocab ? r * share : vocab;
		int n = vocab - v0 < share ? vocab - v0 : share;
		sp->be->ops->shard_summary(sp->be, &sp->sh[r], l + v0, &row, 1, n, v0);
		sp->ptr[r] = &sp->sh[r];
	}
}

static void same_result(const struct sm70_sample_result *a, const struct sm70_sample_result *b,
			const char *what)
{
	if (a->token != b->token)
		fail_msg("%s: token %d from the slices, %d from the row", what, a->token, b->token);
	assert_true(fabsf(a->logprob - b->logprob) <= 1e-5f);
	assert_int_equal(a->n_top, b->n_top);
	for (int j = 0; j < a->n_top; j++) {
		assert_int_equal(a->top_ids[j], b->top_ids[j]);
		assert_true(fabsf(a->top_logprobs[j] - b->top_logprobs[j]) <= 1e-5f);
	}
}

/* The slices' summaries are the row's: max, sums, and the head of the sampling order. */
static void test_summary(void **state)
{
	struct split sp = { .be = *state };
	static float l[5000];
	int vocabs[] = { 1, 255, 256, 257, 5000 };

	for (size_t v = 0; v < sizeof(vocabs) / sizeof(vocabs[0]); v++) {
		int vocab = vocabs[v];
		for (int s = PEAKED; s <= MASKED; s++) {
			struct sm70_shard_summary *o = &sp.sh[0];
			double raw = 0.0;
			float maxv = -INFINITY;

			make_row(l, vocab, (enum shape)s);
			if (s == MASKED)
				l[0] = 1.0f; /* at least one finite entry */
			summarise(&sp, l, vocab, 1, 1.0f);
			for (int i = 0; i < vocab; i++)
				maxv = l[i] > maxv ? l[i] : maxv;
			for (int i = 0; i < vocab; i++)
				raw += exp((double)l[i] - maxv);
			assert_int_equal(o->bad, 0);
			assert_true(o->max == maxv);
			assert_true(fabs(o->sum_raw - raw) <= 1e-12 * raw);
			assert_true(fabs(o->sum_temp - raw) <= 1e-12 * raw);
			assert_int_equal(o->n_cand, vocab < SM70_SHARD_CANDS ? vocab :
					 SM70_SHARD_CANDS);
			/* in sampling order, and nothing outside the list comes before its end */
			for (int j = 1; j < o->n_cand; j++)
				assert_true(o->logits[j - 1] > o->logits[j] ||
					    (o->logits[j - 1] == o->logits[j] &&
					     o->ids[j - 1] < o->ids[j]));
			for (int i = 0; i < vocab; i++) {
				int listed = 0;
				for (int j = 0; j < o->n_cand; j++)
					listed |= o->ids[j] == i;
				if (!listed) {
					float last = o->logits[o->n_cand - 1];
					assert_true(l[i] < last ||
						    (l[i] == last && i > o->ids[o->n_cand - 1]));
				}
			}
		}
	}
	l[3] = NAN;
	summarise(&sp, l, 100, 1, 1.0f);
	assert_int_equal(sp.sh[0].bad, 1);
	printf("summaries: max, sums (1e-12) and ordered heads of %zu vocab sizes x 4 shapes\n",
	       sizeof(vocabs) / sizeof(vocabs[0]));
}

/* Merged slices sample exactly what the whole row samples, for every setting. */
static void test_merge_equals_row(void **state)
{
	struct split sp = { .be = *state };
	const int vocab = 3001;
	struct sm70_sampler *smp;
	static float l[3001];
	struct sm70_sampling set[] = {
		{ .temperature = 0.0f, .top_p = 1.0f, .top_logprobs = 20 },
		{ .temperature = 1.0f, .top_k = 20, .top_p = 0.95f, .top_logprobs = 3 },
		{ .temperature = 0.7f, .top_k = 256, .top_p = 1.0f },
		{ .temperature = 1.0f, .top_p = 0.95f },
		{ .temperature = 1.3f, .top_p = 1.0f, .top_logprobs = 1 },
		{ .temperature = 0.5f, .top_k = 5, .top_p = 0.5f },
	};
	int compared = 0, refused = 0;

	assert_int_equal(sm70_sampler_create(&smp, vocab), 0);
	for (int tp = 1; tp <= SM70_MAX_TP; tp++) {
		for (int s = PEAKED; s <= MASKED; s++) {
			for (size_t k = 0; k < sizeof(set) / sizeof(set[0]); k++) {
				for (int draw = 0; draw < 12; draw++) {
					struct sm70_sample_result a, b;
					char what[96];
					int ret;

					make_row(l, vocab, (enum shape)s);
					set[k].seed = rng_next();
					summarise(&sp, l, vocab, tp, set[k].temperature);
					assert_int_equal(sm70_sample(smp, l, &set[k], (uint64_t)draw,
								     &b), 0);
					ret = sm70_sample_shards(sp.ptr, tp, vocab, &set[k],
								 (uint64_t)draw, &a);
					if (ret == -ERANGE) {
						/* only top-p alone / plain sampling may be undecided */
						assert_true(set[k].top_k == 0 ||
							    set[k].top_k > SM70_SHARD_CANDS);
						assert_true(s != PEAKED);
						refused++;
						continue;
					}
					assert_int_equal(ret, 0);
					snprintf(what, sizeof(what), "tp %d shape %d setting %zu draw %d",
						 tp, s, k, draw);
					same_result(&a, &b, what);
					compared++;
				}
			}
		}
	}
	sm70_sampler_destroy(smp);
	printf("merged slices equal the whole row in %d draws; %d refused (flat or masked rows, "
	       "top-p alone or plain sampling)\n", compared, refused);
	assert_true(compared > 2 * refused);
}

/* Rows with no distribution are refused, as the host sampler refuses them. */
static void test_bad_rows(void **state)
{
	struct split sp = { .be = *state };
	struct sm70_sampling p = { .temperature = 1.0f, .top_p = 1.0f };
	struct sm70_sample_result r;
	float l[600];

	for (int i = 0; i < 600; i++)
		l[i] = -INFINITY;
	summarise(&sp, l, 600, 2, 1.0f);
	assert_int_equal(sm70_sample_shards(sp.ptr, 2, 600, &p, 0, &r), -EINVAL);
	l[599] = NAN;
	summarise(&sp, l, 600, 2, 1.0f);
	assert_int_equal(sm70_sample_shards(sp.ptr, 2, 600, &p, 0, &r), -EINVAL);
	l[599] = INFINITY;
	summarise(&sp, l, 600, 2, 1.0f);
	assert_int_equal(sm70_sample_shards(sp.ptr, 2, 600, &p, 0, &r), -EINVAL);
	l[599] = 0.0f;
	summarise(&sp, l, 600, 2, 1.0f);
	assert_int_equal(sm70_sample_shards(sp.ptr, 2, 600, &p, 0, &r), 0);
	assert_int_equal(r.token, 599);
	p.temperature = -1.0f;
	assert_int_equal(sm70_sample_shards(sp.ptr, 2, 600, &p, 0, &r), -EINVAL);
}

static int setup(void **state)
{
	struct sm70_backend *be;
	struct sm70_err err = { { 0 } };

	if (sm70_backend_cpu_create(&be, 1, &err))
		return -1;
	*state = be;
	return 0;
}

static int teardown(void **state)
{
	sm70_backend_destroy(*state);
	return 0;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_summary),
		cmocka_unit_test(test_merge_equals_row),
		cmocka_unit_test(test_bad_rows),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
