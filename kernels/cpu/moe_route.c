/*
 * moe_route.c - the CPU moe_route op: a mixture-of-experts router's softmax, top-k and
 * renormalisation, and the grouping of the step's assignments by expert.
 *
 * Per row (threads split the rows): m = max of the n_experts logits; s = sum of
 * expf(l - m) in 8 partial f32 sums folded in a fixed tree (the same bits on any
 * thread); p_e = expf(l_e - m) / s. The top k are picked on p, not on the logits: two
 * logits that round to the same probability are a tie, as they are for torch.topk on
 * the probabilities. p_e is recomputed in the pick pass rather than stored (it gives
 * the same bits and needs no scratch of n_experts floats); the row's ids/w entries hold
 * the pick, kept sorted by route_before, by insertion. With renorm the k picks are
 * divided by their sum, added in pick order.
 *
 * The grouping (order, used, used_first, n_used) is one pass in the caller thread
 * after the rows: an in-place heapsort of the assignment indices by (expert, index),
 * a unique key, so the result does not depend on the sort; index order within an
 * expert is token order, as backend.h asks. n * k is at most a few thousand.
 *
 * Non-goals: other scoring functions (sigmoid routers, group-limited routing, biases),
 * NaN logits (the ids stay valid and distinct, the weights are NaN).
 */
#include <math.h>

#include "kernels/cpu/cpu_ops.h"

/*
 * Whether (pa, ea) ranks before (pb, eb) in a token's pick: the larger probability
 * first, equal probabilities by the lower expert id (backend.h). The one place the
 * tie rule lives.
 */
static inline int route_before(float pa, int ea, float pb, int eb)
{
	return pa > pb || (pa == pb && ea < eb);
}

struct route_job {
	const struct sm70_moe_route *route;
	const float *logits;
	int ld;
	int n_experts;
	int k;
	int renorm;
};

static void route_rows(void *ctx, int begin, int end, int thread)
{
	const struct route_job *j = ctx;
	const int E = j->n_experts, k = j->k;

	for (int t = begin; t < end; t++) {
		const float *restrict l = j->logits + (size_t)t * (size_t)j->ld;
		int32_t *restrict ids = j->route->ids + (size_t)t * k;
		float *restrict w = j->route->w + (size_t)t * k;
		float acc[8] = { 0 }, m = l[0], s, sum;
		int e = 0, have = 0;

		for (int i = 1; i < E; i++)
			m = l[i] > m ? l[i] : m;
		for (; e + 8 <= E; e += 8)
			for (int i = 0; i < 8; i++)
				acc[i] += expf(l[e + i] - m);
		s = ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
		for (; e < E; e++)
			s += expf(l[e] - m);

		for (e = 0; e < E; e++) {
			const float p = expf(l[e] - m) / s;
			int pos;

			if (have == k && !route_before(p, e, w[k - 1], ids[k - 1]))
				continue;
			pos = have < k ? have++ : k - 1;
			for (; pos > 0 && route_before(p, e, w[pos - 1], ids[pos - 1]); pos--) {
				w[pos] = w[pos - 1];
				ids[pos] = ids[pos - 1];
			}
			w[pos] = p;
			ids[pos] = e;
		}
		if (!j->renorm)
			continue;
		sum = 0.0f;
		for (int i = 0; i < k; i++)
			sum += w[i];
		for (int i = 0; i < k; i++)
			w[i] /= sum;
	}
}

/* Whether assignment a sorts before assignment b: expert, then index. */
static inline int group_less(const int32_t *ids, int32_t a, int32_t b)
{
	return ids[a] < ids[b] || (ids[a] == ids[b] && a < b);
}

/* Restores the max-heap below node i of h[0, n). */
static void group_sift(const int32_t *ids, int32_t *h, int i, int n)
{
	for (;;) {
		int c = 2 * i + 1;
		int32_t v;

		if (c >= n)
			return;
		if (c + 1 < n && group_less(ids, h[c], h[c + 1]))
			c++;
		if (!group_less(ids, h[i], h[c]))
			return;
		v = h[i];
		h[i] = h[c];
		h[c] = v;
		i = c;
	}
}

/* order, used, used_first, n_used from ids [nk] (see backend.h). */
static void route_group(const struct sm70_moe_route *r, int nk)
{
	int32_t *h = r->order;
	int u = 0;

	for (int a = 0; a < nk; a++)
		h[a] = a;
	for (int i = nk / 2 - 1; i >= 0; i--)
		group_sift(r->ids, h, i, nk);
	for (int end = nk - 1; end > 0; end--) {
		int32_t v = h[0];

		h[0] = h[end];
		h[end] = v;
		group_sift(r->ids, h, 0, end);
	}
	for (int i = 0; i < nk; i++) {
		if (i > 0 && r->ids[h[i]] == r->ids[h[i - 1]])
			continue;
		r->used[u] = r->ids[h[i]];
		r->used_first[u++] = i;
	}
	r->used_first[u] = nk;
	r->n_used[0] = u;
}

/* See backend.h. Needs 1 <= k <= n_experts <= ld (otherwise only an empty grouping is
 * written); logits must not overlap the route's arrays. */
void sm70__cpu_moe_route(struct sm70_backend *be, const struct sm70_moe_route *route,
			 const float *logits, int ld, int n, int n_experts, int k, int renorm)
{
	struct route_job j = { route, logits, ld, n_experts, k, renorm };

	if (n <= 0 || k < 1 || k > n_experts || ld < n_experts) {
		route->used_first[0] = 0;
		route->n_used[0] = 0;
		return;
	}
	sm70__pool_run(sm70__cpu_of(be)->pool, n, sm70__cpu_grain((size_t)n_experts * 32),
		       route_rows, &j);
	route_group(route, n * k);
}
