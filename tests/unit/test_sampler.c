/* test_sampler.c - host sampler: greedy, logprobs, reproducibility, chi-square vs exact, checks. */
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
#include <time.h>

#include "daemon/engine/sampler.h"

#define BIG_VOCAB 248320

/* ---- test-side reference, written independently of sampler.c --------------------------- */

static uint64_t rng_state;

static uint64_t rng_next(void)
{
	/* xorshift64*: enough to make test logits */
	rng_state ^= rng_state >> 12;
	rng_state ^= rng_state << 25;
	rng_state ^= rng_state >> 27;
	return rng_state * 2685821657736338717ull;
}

static double rng_unit(void)
{
	return (double)(rng_next() >> 11) / 9007199254740992.0;
}

static const float *cmp_logits;

/* logit descending, equal logits lowest id first */
static int cmp_order(const void *a, const void *b)
{
	int ia = *(const int *)a, ib = *(const int *)b;
	float la = cmp_logits[ia], lb = cmp_logits[ib];

	if (la != lb)
		return la > lb ? -1 : 1;
	return ia < ib ? -1 : (ia > ib);
}

static int *ref_order(const float *l, int vocab)
{
	int *order = malloc(sizeof(*order) * (size_t)vocab);

	assert_non_null(order);
	for (int i = 0; i < vocab; i++)
		order[i] = i;
	cmp_logits = l;
	qsort(order, (size_t)vocab, sizeof(*order), cmp_order);
	return order;
}

/* log_softmax of the raw logits in long double */
static void ref_log_softmax(const float *l, int vocab, double *out)
{
	long double mx = -INFINITY, sum = 0.0L;

	for (int i = 0; i < vocab; i++)
		if (l[i] > mx)
			mx = l[i];
	for (int i = 0; i < vocab; i++)
		sum += expl((long double)l[i] - mx);
	for (int i = 0; i < vocab; i++)
		out[i] = (double)((long double)l[i] - mx - logl(sum));
}

/*
 * The exact sampling distribution by the textbook route: full sort, keep the first k,
 * softmax of l/T over them, shortest prefix with cumulative >= top_p, renormalise.
 * Writes prob[0..vocab); returns how many tokens have nonzero probability.
 */
static int ref_probs(const float *l, int vocab, float t, int k, float top_p, double *prob)
{
	int *order = ref_order(l, vocab);
	int kept = (k > 0 && k < vocab) ? k : vocab;
	double *w = malloc(sizeof(*w) * (size_t)vocab);
	double z = 0.0, cum = 0.0;
	int nz = 0;

	assert_non_null(w);
	if (t == 0.0f)
		kept = 1; /* greedy */
	for (int j = 0; j < kept; j++) {
		w[j] = t == 0.0f ? 1.0 : exp(((double)l[order[j]] - l[order[0]]) / t);
		z += w[j];
	}
	if (top_p < 1.0f) {
		for (int j = 0; j < kept; j++) {
			cum += w[j];
			if (cum / z >= top_p) {
				kept = j + 1;
				break;
			}
		}
	}
	z = 0.0;
	for (int j = 0; j < kept; j++)
		z += w[j];
	memset(prob, 0, sizeof(*prob) * (size_t)vocab);
	for (int j = 0; j < kept; j++) {
		prob[order[j]] = w[j] / z;
		nz += prob[order[j]] > 0.0;
	}
	free(w);
	free(order);
	return nz;
}

/* Upper tail of the chi-square distribution, closed forms for integer dof. */
static double chi2_sf(double x, int dof)
{
	double y = x / 2.0, term, s;

	if (dof % 2 == 0) {
		term = exp(-y);
		s = term;
		for (int i = 1; i < dof / 2; i++) {
			term *= y / i;
			s += term;
		}
		return s;
	}
	s = erfc(sqrt(y));
	term = exp(-y) * sqrt(y) * 2.0 / sqrt(M_PI);
	for (int i = 1; i <= (dof - 1) / 2; i++) {
		s += term;
		term *= y / (i + 0.5);
	}
	return s;
}

static double now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static struct sm70_sampler *make_sampler(int vocab)
{
	struct sm70_sampler *s = NULL;

	assert_int_equal(sm70_sampler_create(&s, vocab), 0);
	assert_non_null(s);
	return s;
}

/* ---- 1. greedy ------------------------------------------------------------------------- */

static void test_greedy(void **state)
{
	static const float l1[] = { 0.5f, 2.0f, -1.0f, 3.0f, 1.0f, 3.0f, 2.9f };
	static const float l2[] = { -0.0f, 0.0f, -1.0f };
	float l3[8], l4[5] = { -INFINITY, -INFINITY, -7.0f, -INFINITY, -7.5f };
	struct sm70_sampling p = { .temperature = 0.0f, .top_p = 1.0f };
	struct sm70_sample_result r;
	struct sm70_sampler *s = make_sampler(7);
	double lp[7];

	(void)state;
	assert_int_equal(sm70_sample(s, l1, &p, 0, &r), 0);
	assert_int_equal(r.token, 3);
	ref_log_softmax(l1, 7, lp);
	assert_true(fabs(r.logprob - lp[3]) < 1e-6);
	/* filters do not change greedy, nor does the seed or n */
	p.top_k = 2;
	p.top_p = 0.3f;
	p.seed = 99;
	assert_int_equal(sm70_sample(s, l1, &p, 5, &r), 0);
	assert_int_equal(r.token, 3);
	sm70_sampler_destroy(s);

	p.top_k = 0;
	p.top_p = 1.0f;
	s = make_sampler(3);
	assert_int_equal(sm70_sample(s, l2, &p, 0, &r), 0);
	assert_int_equal(r.token, 0); /* -0 == +0: lowest id */
	sm70_sampler_destroy(s);

	for (int i = 0; i < 8; i++)
		l3[i] = 1.25f;
	s = make_sampler(8);
	assert_int_equal(sm70_sample(s, l3, &p, 0, &r), 0);
	assert_int_equal(r.token, 0);
	assert_true(fabs(r.logprob - (float)-log(8.0)) < 1e-6);
	sm70_sampler_destroy(s);

	s = make_sampler(5);
	assert_int_equal(sm70_sample(s, l4, &p, 0, &r), 0);
	assert_int_equal(r.token, 2);
	sm70_sampler_destroy(s);
	printf("greedy: argmax with ties to lowest id, -0/+0, all-equal, -inf rows ok\n");
}

/* ---- 2. logprobs and top-N -------------------------------------------------------------- */

static void check_logprobs(int vocab, int n_top, float t, int k, float top_p, double *max_err)
{
	float *l = malloc(sizeof(*l) * (size_t)vocab);
	double *lp = malloc(sizeof(*lp) * (size_t)vocab);
	struct sm70_sampling p = { .temperature = t, .top_k = k, .top_p = top_p, .seed = 5,
				   .top_logprobs = n_top };
	struct sm70_sample_result r;
	struct sm70_sampler *s = make_sampler(vocab);
	int *order;
	int want;

	assert_non_null(l);
	assert_non_null(lp);
	/* quarter steps in [-8, 8]: many equal logits, so top-N boundaries fall on ties */
	for (int i = 0; i < vocab; i++)
		l[i] = (float)(floor(rng_unit() * 64.0) / 4.0 - 8.0);
	ref_log_softmax(l, vocab, lp);
	order = ref_order(l, vocab);
	want = n_top < vocab ? n_top : vocab;
	for (uint64_t n = 0; n < 4; n++) {
		assert_int_equal(sm70_sample(s, l, &p, n, &r), 0);
		assert_true(r.token >= 0 && r.token < vocab);
		*max_err = fmax(*max_err, fabs(r.logprob - lp[r.token]));
		assert_true(fabs(r.logprob - lp[r.token]) < 1e-6);
		assert_int_equal(r.n_top, want);
		for (int j = 0; j < want; j++) {
			assert_int_equal(r.top_ids[j], order[j]);
			*max_err = fmax(*max_err, fabs(r.top_logprobs[j] - lp[order[j]]));
			assert_true(fabs(r.top_logprobs[j] - lp[order[j]]) < 1e-6);
		}
	}
	free(order);
	sm70_sampler_destroy(s);
	free(lp);
	free(l);
}

static void test_logprobs(void **state)
{
	double err = 0.0;

	(void)state;
	rng_state = 0x1234567887654321ull;
	check_logprobs(1000, 20, 0.0f, 0, 1.0f, &err);
	check_logprobs(1000, 20, 0.8f, 10, 0.9f, &err);
	check_logprobs(1000, 1, 1.0f, 0, 0.5f, &err);
	check_logprobs(1000, 0, 1.3f, 50, 1.0f, &err);
	check_logprobs(5, 20, 1.0f, 0, 1.0f, &err); /* fewer tokens than asked */
	check_logprobs(65536, 20, 0.7f, 40, 0.95f, &err);
	printf("logprobs: token and top-N vs long double log_softmax, max abs err %.3g, "
	       "order (ties lowest id) exact\n", err);
}

/* ---- 3. reproducibility ----------------------------------------------------------------- */

static void test_reproducible(void **state)
{
	enum { V = 100 };
	float l[V];
	struct sm70_sampling p = { .temperature = 1.0f, .top_k = 0, .top_p = 1.0f };
	struct sm70_sample_result ra, rb;
	struct sm70_sampler *a = make_sampler(V), *b = make_sampler(V);
	int seen[V] = { 0 }, distinct = 0, same_adjacent = 0;
	double mean = 0.0;

	(void)state;
	rng_state = 77;
	for (int i = 0; i < V; i++)
		l[i] = (float)(rng_unit() * 2.0);
	for (uint64_t seed = 0; seed < 10; seed++) {
		for (uint64_t n = 0; n < 50; n++) {
			p.seed = seed;
			assert_int_equal(sm70_sample(a, l, &p, n, &ra), 0);
			/* b has sampled other rows in between: no hidden state may leak */
			p.seed = seed + 1000;
			assert_int_equal(sm70_sample(b, l, &p, n + 3, &rb), 0);
			p.seed = seed;
			assert_int_equal(sm70_sample(b, l, &p, n, &rb), 0);
			assert_int_equal(ra.token, rb.token);
			assert_true(sm70_sample_uniform(seed, n) == sm70_sample_uniform(seed, n));
		}
	}
	p.seed = 42;
	for (uint64_t n = 0; n < 200; n++) {
		assert_int_equal(sm70_sample(a, l, &p, n, &ra), 0);
		if (!seen[ra.token]++)
			distinct++;
		if (n && ra.token == rb.token)
			same_adjacent++;
		rb = ra;
	}
	assert_true(distinct >= 40);
	assert_true(same_adjacent < 20);
	for (uint64_t n = 0; n < 100000; n++) {
		double u = sm70_sample_uniform(7, n);

		assert_true(u >= 0.0 && u < 1.0);
		assert_true(u != sm70_sample_uniform(8, n));
		mean += u;
	}
	mean /= 100000.0;
	assert_true(fabs(mean - 0.5) < 0.005);
	printf("reproducible: 500 (seed, n) pairs equal across samplers; over n=0..199 %d distinct "
	       "tokens, %d adjacent repeats; uniform mean %.4f over 1e5\n",
	       distinct, same_adjacent, mean);
	sm70_sampler_destroy(b);
	sm70_sampler_destroy(a);
}

/* ---- 4. drawn distribution vs exact ------------------------------------------------------ */

#define STAT_V 50
#define STAT_DRAWS 40000
/* fail when the chi-square upper tail probability is below this */
#define STAT_P_FAIL 1e-4

static void stat_check(const char *name, const float *l, float t, int k, float top_p)
{
	struct sm70_sampling p = { .temperature = t, .top_k = k, .top_p = top_p };
	struct sm70_sample_result r;
	struct sm70_sampler *s = make_sampler(STAT_V);
	double prob[STAT_V], chi2 = 0.0, pool_e = 0.0, max_err = 0.0, pv;
	long count[STAT_V] = { 0 }, pool_o = 0;
	int nz, bins = 0;

	nz = ref_probs(l, STAT_V, t, k, top_p, prob);
	for (uint64_t seed = 0; seed < STAT_DRAWS; seed++) {
		p.seed = seed;
		assert_int_equal(sm70_sample(s, l, &p, 3, &r), 0);
		assert_true(r.token >= 0 && r.token < STAT_V);
		count[r.token]++;
	}
	for (int i = 0; i < STAT_V; i++) {
		double e = prob[i] * STAT_DRAWS;

		max_err = fmax(max_err, fabs((double)count[i] / STAT_DRAWS - prob[i]));
		if (prob[i] == 0.0) {
			/* outside the filtered set: must never be drawn */
			if (count[i])
				fail_msg("%s: token %d drawn %ld times outside the set", name, i,
					 count[i]);
			continue;
		}
		if (e < 5.0) {
			/* small expectations are pooled so the chi-square approximation holds */
			pool_e += e;
			pool_o += count[i];
			continue;
		}
		chi2 += (count[i] - e) * (count[i] - e) / e;
		bins++;
	}
	if (pool_e > 0.0) {
		chi2 += (pool_o - pool_e) * (pool_o - pool_e) / pool_e;
		bins++;
	}
	pv = bins > 1 ? chi2_sf(chi2, bins - 1) : 1.0;
	printf("%-34s set %2d, chi2 %7.2f dof %2d p %.3g (fail < %g), max abs prob err %.4f\n",
	       name, nz, chi2, bins - 1, pv, STAT_P_FAIL, max_err);
	assert_true(pv >= STAT_P_FAIL);
	sm70_sampler_destroy(s);
}

static void test_distribution(void **state)
{
	float l[STAT_V], flat[STAT_V];

	(void)state;
	int *order;

	/* varied values in [-3, 3], then ties placed exactly on the top-k 5 and top-k 20
	 * boundaries: the tied token with the higher id must never be drawn */
	rng_state = 2024;
	for (int i = 0; i < STAT_V; i++) {
		l[i] = (float)(floor(rng_unit() * 384.0) / 64.0 - 3.0);
		flat[i] = 0.5f;
	}
	order = ref_order(l, STAT_V);
	l[order[10]] = l[order[4]];
	l[order[30]] = l[order[19]];
	printf("ties at the boundary: ids %d,%d (5th) and %d,%d (20th)\n", order[4], order[10],
	       order[19], order[30]);
	free(order);
	/* check the chi-square tail itself at textbook points */
	assert_true(fabs(chi2_sf(3.841459, 1) - 0.05) < 1e-5);
	assert_true(fabs(chi2_sf(18.46683, 4) - 0.001) < 1e-6);
	assert_true(fabs(chi2_sf(37.56623, 20) - 0.01) < 1e-6);
	stat_check("T=1", l, 1.0f, 0, 1.0f);
	stat_check("T=0.7 top-k 5", l, 0.7f, 5, 1.0f);
	stat_check("top-p 0.8", l, 1.0f, 0, 0.8f);
	stat_check("T=1 top-k 20 top-p 0.95", l, 1.0f, 20, 0.95f);
	stat_check("T=2.5 top-k 40 top-p 0.5", l, 2.5f, 40, 0.5f);
	stat_check("50 equal logits, top-k 5", flat, 1.0f, 5, 1.0f);
	stat_check("50 equal logits, top-p 0.3", flat, 1.0f, 0, 0.3f);
}

/* ---- 5. parameter validation --------------------------------------------------------------- */

static void test_validation(void **state)
{
	const struct sm70_sampling ok = { .temperature = 0.8f, .top_k = 40, .top_p = 0.9f,
					  .seed = 1, .top_logprobs = 5 };
	struct sm70_sampling p;
	struct sm70_sample_result r;
	struct sm70_sampler *s = NULL;
	float l[4] = { 1.0f, 2.0f, 3.0f, 4.0f };
	int bad = 0;

	(void)state;
	assert_int_equal(sm70_sampling_check(&ok), 0);
	p = ok;
	p.temperature = 0.0f;
	p.top_k = 0;
	p.top_p = 1.0f;
	p.top_logprobs = SM70_MAX_TOP_LOGPROBS;
	assert_int_equal(sm70_sampling_check(&p), 0);
	p.top_k = 1000000; /* beyond the vocabulary: off, not an error */
	assert_int_equal(sm70_sampling_check(&p), 0);

#define BAD(field, value)                                                        \
	do {                                                                     \
		p = ok;                                                          \
		p.field = value;                                                 \
		assert_int_equal(sm70_sampling_check(&p), -EINVAL);              \
		bad++;                                                           \
	} while (0)
	BAD(temperature, -0.1f);
	BAD(temperature, NAN);
	BAD(temperature, INFINITY);
	BAD(top_k, -1);
	BAD(top_p, 0.0f);
	BAD(top_p, -0.5f);
	BAD(top_p, 1.01f);
	BAD(top_p, NAN);
	BAD(top_logprobs, -1);
	BAD(top_logprobs, SM70_MAX_TOP_LOGPROBS + 1);
#undef BAD
	assert_int_equal(sm70_sampling_check(NULL), -EINVAL);

	assert_int_equal(sm70_sampler_create(&s, 0), -EINVAL);
	assert_null(s);
	assert_int_equal(sm70_sampler_create(&s, -3), -EINVAL);
	assert_int_equal(sm70_sampler_create(NULL, 10), -EINVAL);
	s = make_sampler(4);
	p = ok;
	p.top_p = 2.0f;
	assert_int_equal(sm70_sample(s, l, &p, 0, &r), -EINVAL);
	assert_int_equal(sm70_sample(s, l, NULL, 0, &r), -EINVAL);
	assert_int_equal(sm70_sample(s, NULL, &ok, 0, &r), -EINVAL);
	assert_int_equal(sm70_sample(s, l, &ok, 0, NULL), -EINVAL);
	assert_int_equal(sm70_sample(NULL, l, &ok, 0, &r), -EINVAL);
	/* rows with no distribution are refused rather than sampled */
	l[2] = NAN;
	assert_int_equal(sm70_sample(s, l, &ok, 0, &r), -EINVAL);
	l[2] = INFINITY;
	assert_int_equal(sm70_sample(s, l, &ok, 0, &r), -EINVAL);
	for (int i = 0; i < 4; i++)
		l[i] = -INFINITY;
	assert_int_equal(sm70_sample(s, l, &ok, 0, &r), -EINVAL);
	l[1] = 0.0f;
	assert_int_equal(sm70_sample(s, l, &ok, 0, &r), 0);
	assert_int_equal(r.token, 1);
	sm70_sampler_destroy(s);
	sm70_sampler_destroy(NULL);
	printf("validation: %d bad parameter sets and NULL/NaN/+inf/all -inf rows refused\n",
	       bad);
}

/* ---- edges: degenerate sets and masked tokens --------------------------------------------- */

static void test_edges(void **state)
{
	static const float one[1] = { -3.0f };
	static const float l[10] = { 1.0f, -INFINITY, 0.5f, -INFINITY, 2.0f,
				     -INFINITY, 1.5f, -INFINITY, -2.0f, -INFINITY };
	struct sm70_sampling p = { .temperature = 1.0f, .top_p = 1.0f };
	struct sm70_sample_result r, r2;
	struct sm70_sampler *s1 = make_sampler(1), *s = make_sampler(10);
	int draws = 0;

	(void)state;
	p.top_k = 1;
	p.top_logprobs = 3;
	assert_int_equal(sm70_sample(s1, one, &p, 0, &r), 0);
	assert_int_equal(r.token, 0);
	assert_int_equal(r.n_top, 1);
	assert_true(r.logprob == 0.0f);
	p.top_logprobs = 0;
	for (uint64_t n = 0; n < 2000; n++, draws++) {
		p.seed = n;
		/* no filter: masked tokens (odd ids) must never come out */
		p.top_k = 0;
		p.top_p = 1.0f;
		p.temperature = 1.0f;
		assert_int_equal(sm70_sample(s, l, &p, n, &r), 0);
		assert_true(r.token % 2 == 0);
		/* top-k at or above the vocabulary is off: same draw as k = 0 */
		p.top_k = 10 + (int)(n % 3);
		assert_int_equal(sm70_sample(s, l, &p, n, &r2), 0);
		assert_int_equal(r.token, r2.token);
		/* degenerate sets collapse onto the argmax */
		p.top_k = 1;
		assert_int_equal(sm70_sample(s, l, &p, n, &r), 0);
		assert_int_equal(r.token, 4);
		p.top_k = 0;
		p.top_p = 1e-7f;
		assert_int_equal(sm70_sample(s, l, &p, n, &r), 0);
		assert_int_equal(r.token, 4);
		p.top_p = 1.0f;
		p.temperature = 1e-30f;
		assert_int_equal(sm70_sample(s, l, &p, n, &r), 0);
		assert_int_equal(r.token, 4);
		/* a huge temperature flattens but still never picks masked tokens */
		p.temperature = 1e30f;
		assert_int_equal(sm70_sample(s, l, &p, n, &r), 0);
		assert_true(r.token % 2 == 0);
	}
	printf("edges: vocab 1, masked tokens, k >= vocab, k 1, top-p 1e-7, T 1e-30/1e30 over %d "
	       "seeds\n", draws);
	sm70_sampler_destroy(s);
	sm70_sampler_destroy(s1);
}

/* ---- 6. full vocabulary smoke ------------------------------------------------------------- */

static void big_check(struct sm70_sampler *s, const float *l, double *prob, const char *name,
		      float t, int k, float top_p)
{
	struct sm70_sampling p = { .temperature = t, .top_k = k, .top_p = top_p, .seed = 11,
				   .top_logprobs = 5 };
	struct sm70_sample_result r;
	int nz = ref_probs(l, BIG_VOCAB, t, k, top_p, prob);
	double t0 = now_us(), us;

	for (uint64_t n = 0; n < 20; n++) {
		assert_int_equal(sm70_sample(s, l, &p, n, &r), 0);
		assert_true(r.token >= 0 && r.token < BIG_VOCAB);
		if (!(prob[r.token] > 0.0))
			fail_msg("%s: token %d outside the expected set", name, r.token);
	}
	us = (now_us() - t0) / 20.0;
	printf("vocab %d, %-26s expected set %6d: 20 draws inside, %.0f us/call\n", BIG_VOCAB,
	       name, nz, us);
}

static void test_big_vocab(void **state)
{
	float *l = malloc(sizeof(*l) * BIG_VOCAB);
	double *prob = malloc(sizeof(*prob) * BIG_VOCAB);
	struct sm70_sampler *s = make_sampler(BIG_VOCAB);

	(void)state;
	assert_non_null(l);
	assert_non_null(prob);
	/* roughly normal logits, sd ~3, plus a few masked tokens */
	rng_state = 0xfeedull;
	for (int i = 0; i < BIG_VOCAB; i++)
		l[i] = (float)((rng_unit() + rng_unit() + rng_unit() + rng_unit() - 2.0) * 5.0);
	for (int i = 0; i < BIG_VOCAB; i += 1000)
		l[i] = -INFINITY;
	big_check(s, l, prob, "greedy", 0.0f, 0, 1.0f);
	big_check(s, l, prob, "top-k 20 top-p 0.95", 1.0f, 20, 0.95f);
	big_check(s, l, prob, "top-p 0.9", 1.0f, 0, 0.9f);
	big_check(s, l, prob, "T=0.6 top-p 0.9", 0.6f, 0, 0.9f);
	big_check(s, l, prob, "T=0.8 top-k 1000", 0.8f, 1000, 1.0f);
	big_check(s, l, prob, "T=1 no filter", 1.0f, 0, 1.0f);
	sm70_sampler_destroy(s);
	free(prob);
	free(l);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_greedy),
		cmocka_unit_test(test_logprobs),
		cmocka_unit_test(test_reproducible),
		cmocka_unit_test(test_distribution),
		cmocka_unit_test(test_validation),
		cmocka_unit_test(test_edges),
		cmocka_unit_test(test_big_vocab),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
