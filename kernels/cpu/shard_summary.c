/*
 * shard_summary.c - the CPU twin of the shard_summary op: what one tensor-parallel rank
 * tells the others about its slice of a row of logits (backend.h, common/sampling.h).
 *
 * Per row: the maximum, the two normalisers (raw and at the row's temperature) summed in
 * double as the host sampler sums them, and the slice's first SM70_SHARD_CANDS entries in
 * sampling order. Those are found by a radix select of the cut key over order-preserving
 * integer keys (three histogram passes), then only the few hundred survivors are sorted.
 *
 * Non-goals: threads (rows are few and slices small where the CPU backend runs sharded).
 */
#include "kernels/cpu/cpu_ops.h"

#include <math.h>
#include <stdlib.h>

/*
 * The key t of the k-th entry in descending key order (1 <= k <= n), and in *above how
 * many keys are strictly greater than t.
 */
static uint32_t kth_key(const float *l, int n, int k, int *above)
{
	static const int shifts[3] = { 21, 10, 0 };
	static const uint32_t widths[3] = { 11, 11, 10 };
	uint32_t prefix = 0, mask = 0;
	int cnt[2048];
	int greater = 0;

	for (int level = 0; level < 3; level++) {
		uint32_t bins = 1u << widths[level];
		int b;

		memset(cnt, 0, sizeof(int) * bins);
		for (int i = 0; i < n; i++) {
			uint32_t key = sm70_order_key(l[i]);
			if ((key & mask) == prefix)
				cnt[(key >> shifts[level]) & (bins - 1)]++;
		}
		for (b = (int)bins - 1; b > 0; b--) {
			if (cnt[b] >= k)
				break;
			k -= cnt[b];
			greater += cnt[b];
		}
		prefix |= (uint32_t)b << shifts[level];
		mask |= (bins - 1) << shifts[level];
	}
	*above = greater;
	return prefix;
}

struct cand {
	uint32_t key;
	int32_t id;
	float logit;
};

static int cand_cmp(const void *a, const void *b)
{
	const struct cand *x = a, *y = b;

	if (x->key != y->key)
		return x->key > y->key ? -1 : 1;
	return (x->id > y->id) - (x->id < y->id);
}

static void summarise_row(struct sm70_shard_summary *o, const float *l, int vocab, int id0,
			  float temperature)
{
	struct cand c[SM70_SHARD_CANDS];
	float maxv = -INFINITY;
	double raw = 0.0, tmp = 0.0;
	int k = vocab < SM70_SHARD_CANDS ? vocab : SM70_SHARD_CANDS;
	int above, m = 0, ties;
	uint32_t t;

	o->bad = 0;
	for (int i = 0; i < vocab; i++) {
		if (isnan(l[i]) || l[i] == INFINITY)
			o->bad = 1;
		else if (l[i] > maxv)
			maxv = l[i];
	}
	if (maxv > -INFINITY) {
		for (int i = 0; i < vocab; i++) {
			if (isnan(l[i]))
				continue;
			raw += exp((double)l[i] - maxv);
			if (temperature > 0.0f)
				tmp += exp(((double)l[i] - maxv) / (double)temperature);
		}
	}
	o->max = maxv;
	o->sum_raw = raw;
	o->sum_temp = tmp;
	o->reserved = 0;

	/* keys above the cut, then ties at the cut lowest ids first, then sort those */
	t = kth_key(l, vocab, k, &above);
	ties = k - above;
	for (int i = 0; i < vocab && m < k; i++) {
		uint32_t key = sm70_order_key(l[i]);
		if (key > t || (key == t && ties-- > 0))
			c[m++] = (struct cand){ key, id0 + i, l[i] };
	}
	qsort(c, (size_t)m, sizeof(c[0]), cand_cmp);
	o->n_cand = m;
	for (int j = 0; j < m; j++) {
		o->ids[j] = c[j].id;
		o->logits[j] = c[j].logit;
	}
}

void sm70__cpu_shard_summary(struct sm70_backend *be, struct sm70_shard_summary *out,
			     const float *logits, const struct sm70_sample_row *rows, int n,
			     int vocab, int id0)
{
	for (int r = 0; r < n; r++)
		summarise_row(&out[r], logits + (size_t)r * vocab, vocab, id0,
			      rows[r].temperature);
}
