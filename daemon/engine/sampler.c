/*
 * sampler.c - the host-side token sampler: one row of logits -> token and logprobs.
 *
 * Every call is O(vocab): the sets that top-k, top-p and the inverse-CDF draw need are
 * found by a radix select over order-preserving integer keys of the logits, so nothing
 * sorts the vocabulary (only a final handful of at most SELECT_SMALL candidates). The
 * sampling order is "logit descending, equal logits lowest id first", which is the same as
 * probability descending under any temperature. All scratch lives in the sampler.
 *
 * Non-goals: penalties, min-p, several rows per call (callers loop), SIMD; GPU sampling
 * lives with the CUDA backend and only shares sm70_sample_uniform with this file.
 */
#include "daemon/engine/sampler.h"

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* Radix select digits: 11 + 11 + 10 bits of the 32-bit key, one histogram pass each. */
#define RADIX_BITS 11
#define RADIX_BINS (1u << RADIX_BITS)
/* Subsets this small are sorted and scanned instead of split by another digit. */
#define SELECT_SMALL 32

struct sm70_sampler {
	int vocab;
	uint32_t *key;		/* [vocab] order key of each logit of the current row */
	/* the candidate set in ascending id order: ids, keys, unnormalised probabilities */
	int32_t *c_id;
	uint32_t *c_key;
	double *c_w;
	/* select_cut's working subset, same layout */
	int32_t *t_id;
	uint32_t *t_key;
	double *t_w;
	uint32_t cnt[RADIX_BINS];
	double mass[RADIX_BINS];
};

/* Where a running total in sampling order reached its target. */
struct cut {
	uint32_t key;
	int32_t id;
};

/* The splitmix64 finaliser: a bijection on 64 bits with full avalanche. */
static uint64_t mix64(uint64_t z)
{
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/*
 * u = top 53 bits of mix64(mix64(seed + G) + (n + 1) * G) / 2^53, G = 0x9e3779b97f4a7c15,
 * all arithmetic mod 2^64. For a fixed seed the draws over n are the splitmix64 stream
 * started at mix64(seed + G); GPU samplers must compute exactly this to agree with the host.
 */
double sm70_sample_uniform(uint64_t seed, uint64_t n)
{
	const uint64_t golden = 0x9e3779b97f4a7c15ull;
	uint64_t h = mix64(seed + golden);

	h = mix64(h + (n + 1) * golden);
	return (double)(h >> 11) * 0x1.0p-53;
}

int sm70_sampling_check(const struct sm70_sampling *p)
{
	if (!p)
		return -EINVAL;
	if (!isfinite(p->temperature) || p->temperature < 0.0f)
		return -EINVAL;
	if (p->top_k < 0)
		return -EINVAL;
	/* written so that NaN fails too */
	if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
		return -EINVAL;
	if (p->top_logprobs < 0 || p->top_logprobs > SM70_MAX_TOP_LOGPROBS)
		return -EINVAL;
	return 0;
}

int sm70_sampler_create(struct sm70_sampler **out, int vocab)
{
	struct sm70_sampler *s;
	size_t n = (size_t)vocab;

	if (!out)
		return -EINVAL;
	*out = NULL;
	if (vocab <= 0)
		return -EINVAL;
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->vocab = vocab;
	s->key = malloc(n * sizeof(*s->key));
	s->c_id = malloc(n * sizeof(*s->c_id));
	s->c_key = malloc(n * sizeof(*s->c_key));
	s->c_w = malloc(n * sizeof(*s->c_w));
	s->t_id = malloc(n * sizeof(*s->t_id));
	s->t_key = malloc(n * sizeof(*s->t_key));
	s->t_w = malloc(n * sizeof(*s->t_w));
	if (!s->key || !s->c_id || !s->c_key || !s->c_w || !s->t_id || !s->t_key || !s->t_w)
		goto fail;
	*out = s;
	return 0;
fail:
	sm70_sampler_destroy(s);
	return -ENOMEM;
}

void sm70_sampler_destroy(struct sm70_sampler *s)
{
	if (!s)
		return;
	free(s->t_w);
	free(s->t_key);
	free(s->t_id);
	free(s->c_w);
	free(s->c_key);
	free(s->c_id);
	free(s->key);
	free(s);
}

/* True when (ka, ia) comes before (kb, ib) in sampling order. */
static inline bool before(uint32_t ka, int32_t ia, uint32_t kb, int32_t ib)
{
	return ka > kb || (ka == kb && ia < ib);
}

/* True when (k, id) is the cut or comes before it: the cut closes the kept prefix. */
static inline bool upto(uint32_t k, int32_t id, const struct cut *c)
{
	return k > c->key || (k == c->key && id <= c->id);
}

/* Insertion sort of m (small) parallel entries into sampling order; w may be NULL. */
static void sort_small(int32_t *id, uint32_t *key, double *w, int m)
{
	for (int i = 1; i < m; i++) {
		int32_t ci = id[i];
		uint32_t ck = key[i];
		double cw = w ? w[i] : 0.0;
		int j = i;

		for (; j > 0 && before(ck, ci, key[j - 1], id[j - 1]); j--) {
			id[j] = id[j - 1];
			key[j] = key[j - 1];
			if (w)
				w[j] = w[j - 1];
		}
		id[j] = ci;
		key[j] = ck;
		if (w)
			w[j] = cw;
	}
}

/*
 * Finds the candidate at which a running total taken in sampling order first reaches
 * `target` (>=): candidate j weighs w[j], or 1 when w is NULL (target is then a count).
 * ids[0..m) must ascend (NULL: the ids are 0..m-1); m > 0. Each radix digit costs one
 * histogram pass and one compaction of the current subset down to the bin where the total
 * crosses. When rounding leaves the total just short of target, the last candidate in
 * sampling order is the cut. Uses s->t_* and the histograms; the inputs are not modified.
 */
static void select_cut(struct sm70_sampler *s, const int32_t *ids, const uint32_t *keys,
		       const double *w, int m, double target, struct cut *out)
{
	static const int shifts[3] = { 21, 10, 0 };
	static const uint32_t masks[3] = { 0x7ff, 0x7ff, 0x3ff };
	const int32_t *sid = ids;
	const uint32_t *skey = keys;
	const double *sw = w;
	double acc = 0.0;	/* total of the candidates that come before the subset */
	int level;

	for (level = 0; level < 3 && m > SELECT_SMALL; level++) {
		const int shift = shifts[level];
		const uint32_t mask = masks[level];
		double before_pick = acc;
		uint32_t pick = 0;
		int n = 0;

		memset(s->cnt, 0, sizeof(s->cnt));
		if (sw) {
			memset(s->mass, 0, sizeof(s->mass));
			for (int j = 0; j < m; j++) {
				uint32_t b = (skey[j] >> shift) & mask;

				s->cnt[b]++;
				s->mass[b] += sw[j];
			}
		} else {
			for (int j = 0; j < m; j++)
				s->cnt[(skey[j] >> shift) & mask]++;
		}
		for (int b = (int)mask; b >= 0; b--) {
			if (!s->cnt[b])
				continue;
			pick = (uint32_t)b;
			before_pick = acc;
			acc += sw ? s->mass[b] : (double)s->cnt[b];
			if (acc >= target)
				break;
		}
		/* acc becomes the total before the picked bin; if rounding kept every bin short
		 * of target, the pick is the lowest bin and its last candidate the cut */
		acc = before_pick;
		/* compaction is stable, so ids keep ascending; in place once sid is t_id */
		for (int j = 0; j < m; j++) {
			if (((skey[j] >> shift) & mask) != pick)
				continue;
			s->t_id[n] = sid ? sid[j] : j;
			s->t_key[n] = skey[j];
			if (sw)
				s->t_w[n] = sw[j];
			n++;
		}
		sid = s->t_id;
		skey = s->t_key;
		sw = w ? s->t_w : NULL;
		m = n;
	}
	if (level < 3) {
		/* small subset with unequal keys: sort it (a copy, when still the input) */
		if (sid != s->t_id) {
			for (int j = 0; j < m; j++) {
				s->t_id[j] = sid ? sid[j] : j;
				s->t_key[j] = skey[j];
				if (sw)
					s->t_w[j] = sw[j];
			}
			sid = s->t_id;
			skey = s->t_key;
			sw = w ? s->t_w : NULL;
		}
		sort_small(s->t_id, s->t_key, w ? s->t_w : NULL, m);
	}
	/* here keys are equal (all 32 bits matched) or sorted; ids ascend within equal keys */
	for (int j = 0; j < m; j++) {
		acc += sw ? sw[j] : 1.0;
		if (acc >= target || j == m - 1) {
			out->key = skey[j];
			out->id = sid ? sid[j] : j;
			return;
		}
	}
}

/*
 * The n largest keys in sampling order into ids[0..n), n <= vocab: one pass with a small
 * sorted buffer, since n <= SM70_MAX_TOP_LOGPROBS. Scanning in id order and admitting only
 * strictly larger keys keeps the lowest ids on ties.
 */
static void top_n(const uint32_t *key, int vocab, int n, int32_t *ids)
{
	int have = 0;
	uint32_t worst = 0;

	if (n <= 0)
		return;
	for (int i = 0; i < vocab; i++) {
		uint32_t k = key[i];
		int j;

		if (have == n && k <= worst)
			continue;
		j = have < n ? have++ : n - 1;
		for (; j > 0 && key[ids[j - 1]] < k; j--)
			ids[j] = ids[j - 1];
		ids[j] = i;
		worst = key[ids[have - 1]];
	}
}

/*
 * Fills s->c_* with the candidates that survive top-k (all ids when k is 0), each with its
 * unnormalised probability exp((l - max) / T); drops those that underflow to 0 (masked
 * -inf logits among them) so they can never be drawn. Returns the count (>= 1: the
 * argmax weighs 1) and their total in *z.
 */
static int gather_candidates(struct sm70_sampler *s, const float *logits, float maxv, double t,
			     int k, double *z)
{
	const int vocab = s->vocab;
	struct cut c = { 0, 0 };
	double sum = 0.0;
	int m = 0;

	if (k)
		select_cut(s, NULL, s->key, NULL, vocab, (double)k, &c);
	for (int i = 0; i < vocab; i++) {
		uint32_t key = s->key[i];
		double w;

		if (k && !upto(key, i, &c))
			continue;
		w = exp(((double)logits[i] - maxv) / t);
		if (w > 0.0) {
			s->c_id[m] = i;
			s->c_key[m] = key;
			s->c_w[m] = w;
			sum += w;
			m++;
		}
	}
	*z = sum;
	return m;
}

/*
 * Keeps, in place, the shortest prefix of s->c_* in sampling order whose total reaches
 * top_p * z (z: total of all m). Returns the new count and its total in *zf.
 */
static int apply_top_p(struct sm70_sampler *s, int m, double z, double top_p, double *zf)
{
	struct cut c;
	double sum = 0.0;
	int n = 0;

	select_cut(s, s->c_id, s->c_key, s->c_w, m, top_p * z, &c);
	for (int j = 0; j < m; j++) {
		if (!upto(s->c_key[j], s->c_id[j], &c))
			continue;
		s->c_id[n] = s->c_id[j];
		s->c_key[n] = s->c_key[j];
		s->c_w[n] = s->c_w[j];
		sum += s->c_w[j];
		n++;
	}
	*zf = sum;
	return n;
}

int sm70_sample(struct sm70_sampler *s, const float *logits, const struct sm70_sampling *p,
		uint64_t n, struct sm70_sample_result *r)
{
	float maxv = -INFINITY;
	int argmax = 0, vocab, k, m = 0;
	double sum = 0.0, lse, z = 0.0;
	bool sampling;

	if (!s || !logits || !r || sm70_sampling_check(p))
		return -EINVAL;
	vocab = s->vocab;

	/* keys, argmax (first index wins ties), and a refusal of NaN rows */
	for (int i = 0; i < vocab; i++) {
		float l = logits[i];

		if (isnan(l))
			return -EINVAL;
		s->key[i] = sm70_order_key(l);
		if (l > maxv) {
			maxv = l;
			argmax = i;
		}
	}
	/* all -inf (nothing to sample) or a +inf (no normaliser) */
	if (!isfinite(maxv))
		return -EINVAL;

	k = p->top_k > 0 && p->top_k < vocab ? p->top_k : 0;
	sampling = p->temperature != 0.0f;
	if (sampling && !k && p->temperature == 1.0f) {
		/* the candidate weights are the raw terms here: one exp pass serves both, and
		 * skipping the zero terms leaves the sum bit-identical */
		m = gather_candidates(s, logits, maxv, 1.0, 0, &z);
		sum = z;
	} else {
		for (int i = 0; i < vocab; i++)
			sum += exp((double)logits[i] - maxv);
		if (sampling)
			m = gather_candidates(s, logits, maxv, p->temperature, k, &z);
	}
	lse = maxv + log(sum);

	r->n_top = p->top_logprobs < vocab ? p->top_logprobs : vocab;
	top_n(s->key, vocab, r->n_top, r->top_ids);
	for (int j = 0; j < r->n_top; j++)
		r->top_logprobs[j] = (float)((double)logits[r->top_ids[j]] - lse);

	if (sampling) {
		struct cut c;

		if (p->top_p < 1.0f)
			m = apply_top_p(s, m, z, p->top_p, &z);
		select_cut(s, s->c_id, s->c_key, s->c_w, m, sm70_sample_uniform(p->seed, n) * z,
			   &c);
		r->token = c.id;
	} else {
		r->token = argmax;
	}
	r->logprob = (float)((double)logits[r->token] - lse);
	return 0;
}
