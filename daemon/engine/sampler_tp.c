/*
 * sampler_tp.c - merging the ranks' slice summaries into one sample (sampler_tp.h).
 *
 * The ranks' candidate lists are merged into sampling order. A rank that sent a full list
 * (SM70_SHARD_CANDS entries) may hold more entries, all after its last one; so the merged
 * list is the true head of the row's sampling order up to the earliest such last entry,
 * the "exact prefix". Every decision below is taken inside it or refused with -ERANGE.
 * The normalisers come from the ranks' sums rescaled to the global maximum.
 */
#include "daemon/engine/sampler_tp.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/comm.h"
#include "daemon/engine/sampler.h"

struct merged {
	uint32_t key;
	int32_t id;
	float logit;
};

static int merged_cmp(const void *a, const void *b)
{
	const struct merged *x = a, *y = b;

	if (x->key != y->key)
		return x->key > y->key ? -1 : 1;
	return (x->id > y->id) - (x->id < y->id);
}

int sm70_sample_shards(const struct sm70_shard_summary *const sh[], int n_ranks, int vocab,
		       const struct sm70_sampling *p, uint64_t n, struct sm70_sample_result *r)
{
	struct merged c[SM70_MAX_TP * SM70_SHARD_CANDS];
	double w[SM70_MAX_TP * SM70_SHARD_CANDS];
	float maxv = -INFINITY;
	double sum = 0.0, lse, t, z, zf, target, acc;
	int m = 0, exact, k, kept, pick;

	if (n_ranks < 1 || n_ranks > SM70_MAX_TP || vocab < 1 ||
	    sm70_sampling_check(p))
		return -EINVAL;
	for (int i = 0; i < n_ranks; i++) {
		if (sh[i]->bad || sh[i]->n_cand < 0 || sh[i]->n_cand > SM70_SHARD_CANDS)
			return -EINVAL;
		if (sh[i]->max > maxv)
			maxv = sh[i]->max;
	}
	if (!isfinite(maxv))
		return -EINVAL; /* every logit is -inf */

	/* merge; the exact prefix ends at the earliest last entry of a full list */
	for (int i = 0; i < n_ranks; i++)
		for (int j = 0; j < sh[i]->n_cand; j++)
			c[m++] = (struct merged){ sm70_order_key(sh[i]->logits[j]), sh[i]->ids[j],
						  sh[i]->logits[j] };
	qsort(c, (size_t)m, sizeof(c[0]), merged_cmp);
	exact = m;
	for (int i = 0; i < n_ranks; i++) {
		const struct sm70_shard_summary *s = sh[i];
		if (s->n_cand < SM70_SHARD_CANDS)
			continue;
		for (int j = 0; j < exact; j++)
			if (c[j].id == s->ids[s->n_cand - 1]) {
				exact = j + 1;
				break;
			}
	}

	for (int i = 0; i < n_ranks; i++)
		if (sh[i]->max > -INFINITY)
			sum += sh[i]->sum_raw * exp((double)sh[i]->max - maxv);
	lse = maxv + log(sum);

	r->n_top = p->top_logprobs < vocab ? p->top_logprobs : vocab;
	if (r->n_top > exact)
		return -ERANGE;
	for (int j = 0; j < r->n_top; j++) {
		r->top_ids[j] = c[j].id;
		r->top_logprobs[j] = (float)((double)c[j].logit - lse);
	}
	if (p->temperature == 0.0f) {
		r->token = c[0].id;
		r->logprob = (float)((double)c[0].logit - lse);
		return 0;
	}

	/* the candidates' weights; z is the total of the set top-k keeps (all when k is 0) */
	t = p->temperature;
	k = p->top_k > 0 && p->top_k < vocab ? p->top_k : 0;
	for (int j = 0; j < m; j++)
		w[j] = exp(((double)c[j].logit - maxv) / t);
	if (k) {
		if (k > exact)
			return -ERANGE;
		z = 0.0;
		for (int j = 0; j < k; j++)
			z += w[j];
		kept = k;
	} else {
		z = 0.0;
		for (int i = 0; i < n_ranks; i++)
			if (sh[i]->max > -INFINITY)
				z += sh[i]->sum_temp * exp(((double)sh[i]->max - maxv) / t);
		kept = vocab; /* not all listed: cuts past `exact` are refused below */
	}

	/* top-p: the shortest prefix whose total reaches top_p * z */
	zf = z;
	if (p->top_p < 1.0f) {
		target = (double)p->top_p * z;
		acc = 0.0;
		pick = -1;
		for (int j = 0; j < exact && j < kept; j++) {
			acc += w[j];
			if (acc >= target) {
				pick = j;
				break;
			}
		}
		if (pick < 0) {
			if (!k || kept > exact)
				return -ERANGE;
			pick = kept - 1; /* rounding left the total short: keep everything */
			acc = z;
		}
		kept = pick + 1;
		zf = acc;
	}

	/* the draw over what is kept */
	target = sm70_sample_uniform(p->seed, n) * zf;
	acc = 0.0;
	pick = -1;
	for (int j = 0; j < exact && j < kept; j++) {
		if (w[j] <= 0.0)
			continue; /* underflowed: never drawn, as in the host sampler */
		acc += w[j];
		pick = j;
		if (acc >= target)
			break;
	}
	if (acc < target && kept > exact)
		return -ERANGE; /* the draw lands past what the lists cover */
	if (pick < 0)
		return -EINVAL;
	r->token = c[pick].id;
	r->logprob = (float)((double)c[pick].logit - lse);
	return 0;
}
