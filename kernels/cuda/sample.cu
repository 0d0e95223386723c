/*
 * sample.cu - the CUDA sample op: rows of f32 logits -> token, its raw logprob and the top-N
 * alternatives, with the host sampler's semantics (common/sampling.h) and its uniform draw.
 *
 * Fast path: P blocks cooperate on each row (P a power of two, B * P <= SMs, so that every
 * block of the launch is resident at once) and meet at per-row barriers made of two
 * counters in a fixed device scratch. Each block keeps its slice of the row in shared memory
 * when it fits. Nothing sorts the vocabulary:
 *   phase A   each block, in one load: slice max/argmax, the raw sum of exp(l - slice max)
 *             (rescaled to the row max when merged), and its local best L = max(top-N,
 *             small top-k) in sampling order: a threshold from the threads' own maxima (the
 *             per-warp ceil(L/16)-th best of them, minimum over warps: at least L elements
 *             reach it) gathers a few candidates, which are ranked exactly; when the
 *             threshold lets too many through, a radix count-select over order keys
 *             (sampler.c's order_key mapping) finds the list instead. The last block to
 *             arrive merges maxima, sums and the P sorted short lists (rank by binary
 *             search); greedy and top-k <= LIST_K (64) finish right there, so
 *             those rows cost one barrier, and the other blocks of such a row do not wait.
 *   passes    otherwise each block builds one radix-digit histogram (count, and mass in
 *             double) of the kept candidates; the last block merges the P histograms, picks
 *             the bin where the running total in sampling order reaches the target, and so
 *             walks the 11, 11 and 10 bit digits down to one key, then to one id among
 *             equal keys.
 *   top-k <= LIST_K is done on the merged list alone (one block, sequential in
 *   double, in the host's orders); larger top-k is a count select, top-p and the draw are
 *   mass selects over what the previous selects kept.
 * Reference path (SM70_SAMPLER=reference): one block per row finds each cut by bisection
 * over the 32-bit key space, summing the kept mass above the midpoint at every step.
 *
 * Masses are double (double exp), so the GPU picks the host's token except when u*Z falls
 * within ~1e-16 relative of a CDF boundary. Histogram masses use shared-memory double
 * atomics, whose order varies, so even that boundary case is not bit-reproducible.
 * Invalid rows (NaN, +inf, all -inf logits, bad parameters) get token -1, n_top 0.
 *
 * Non-goals: penalties, min-p, vocabularies beyond int, more than SM70__SAMPLE_MAX_ROWS rows
 * per launch (the launcher loops).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "kernels/cuda/cuda_check.h"

#define NT 512			/* threads per block */
#define NWARP (NT / 32)
#define NBINS 2048		/* radix digits: 11, 11, 10 bits */
#define LIST_K 64		/* top-k up to this goes through the merged short list */
#define MAXP 16			/* blocks per row at most */
#define MAXB 16			/* rows per launch (the launcher loops over more) */
#define GCAP NT			/* phase A candidates ranked directly, at most */

enum { ST_DONE = 0, ST_FINISH, ST_TOPK, ST_TOPP, ST_DRAW };

struct cand {
	uint32_t key;
	int32_t id;
};

struct part_stat {
	float maxv;
	int32_t argmax;
	int32_t bad;	/* a NaN in the slice */
	int32_t nlist;
	double raw;	/* sum of exp(l - row max) over the slice */
};

/* One row's progress; written by the merging block only, read by all after a release. */
struct row_state {
	int32_t stage;
	int32_t level;
	uint32_t prefix;	/* resolved high digits of the select's key */
	int32_t has_k;
	uint32_t k_key;
	int32_t k_id;
	int32_t has_p;
	uint32_t p_key;
	int32_t p_id;
	int32_t argmax;
	float maxv;
	int32_t pad;
	double acc;		/* total before the current bin */
	double target;		/* < 0: frac * (level-0 total) */
	double frac;
	double lse;
};

struct scratch {
	unsigned arr[MAXB];	/* arrivals at the row barrier (0 between calls) */
	unsigned rel[MAXB];	/* releases */
	unsigned fin[MAXB];	/* blocks that left, to reset the two above */
	struct row_state row[MAXB];
	int32_t nlist[MAXB];
	struct cand list[MAXB][LIST_K];
	struct part_stat stat[MAXB][MAXP];
	struct cand plist[MAXB][MAXP][LIST_K];
	uint32_t hcnt[MAXB][MAXP][NBINS];
	double hmass[MAXB][MAXP][NBINS];
};

static_assert(sizeof(struct scratch) <= SM70__CUDA_SAMPLE_SCRATCH_BYTES,
	      "sample scratch too small");

/* Per-row parameters, normalised as sm70_sample() does. */
struct prm {
	double t;
	double u;
	float top_p;
	int k;		/* 0: off */
	int n_top;
	int sampling;
	int valid;
};

static __device__ __forceinline__ uint32_t order_key(float f)
{
	uint32_t u = __float_as_uint(f);

	if (u == 0x80000000u)
		u = 0;
	return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

static __device__ __forceinline__ float key_float(uint32_t k)
{
	return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

static __device__ __forceinline__ bool before(uint32_t ka, int32_t ia, uint32_t kb, int32_t ib)
{
	return ka > kb || (ka == kb && ia < ib);
}

/* One 64-bit word per element whose unsigned order is the sampling order: the order key
 * above, the complemented id below (equal keys: the lower id is the larger word). */
static __device__ __forceinline__ uint64_t comp(uint32_t key, int32_t id)
{
	return ((uint64_t)key << 32) | (uint32_t)~(uint32_t)id;
}

static __device__ __forceinline__ struct cand comp_cand(uint64_t c)
{
	struct cand o;

	o.key = (uint32_t)(c >> 32);
	o.id = (int32_t)~(uint32_t)c;
	return o;
}

static __device__ __forceinline__ bool upto(uint32_t k, int32_t id, uint32_t ck, int32_t cid)
{
	return k > ck || (k == ck && id <= cid);
}

static __device__ __forceinline__ uint64_t mix64(uint64_t z)
{
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* sm70_sample_uniform, bit for bit. */
static __device__ double uniform(uint64_t seed, uint64_t n)
{
	const uint64_t golden = 0x9e3779b97f4a7c15ull;
	uint64_t h = mix64(seed + golden);

	h = mix64(h + (n + 1) * golden);
	return (double)(h >> 11) * 0x1.0p-53;
}

static __device__ struct prm decode(const struct sm70_sample_row *rw, int vocab)
{
	struct prm p;
	float t = rw->temperature;

	p.valid = isfinite(t) && t >= 0.0f && rw->top_k >= 0 &&
		  rw->top_p > 0.0f && rw->top_p <= 1.0f &&
		  rw->top_logprobs >= 0 && rw->top_logprobs <= SM70_MAX_TOP_LOGPROBS;
	p.t = (double)t;
	p.top_p = rw->top_p;
	p.k = rw->top_k > 0 && rw->top_k < vocab ? rw->top_k : 0;
	p.n_top = rw->top_logprobs < vocab ? rw->top_logprobs : vocab;
	p.sampling = t != 0.0f;
	p.u = uniform(rw->seed, rw->n);
	if (!p.valid)
		p.n_top = 0;
	return p;
}

/* The host's candidate weight exp((l - max) / T). */
static __device__ __forceinline__ double weight(float l, float maxv, double t)
{
	return exp(((double)l - (double)maxv) / t);
}

static __device__ void write_invalid(struct sm70_sample_result *o)
{
	o->token = -1;
	o->logprob = __int_as_float(0x7fc00000);
	o->n_top = 0;
}

/* ---- block-wide helpers ------------------------------------------------------------- */

/* Max with the lowest index on ties, over the block; every thread gets the result. */
static __device__ void block_argmax(float &v, int &idx)
{
	__shared__ float sv[NWARP];
	__shared__ int si[NWARP];
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

	for (int o = 16; o > 0; o >>= 1) {
		float ov = __shfl_xor_sync(0xffffffffu, v, o);
		int oi = __shfl_xor_sync(0xffffffffu, idx, o);

		if (ov > v || (ov == v && oi < idx) || (v != v && ov == ov)) {
			v = ov;
			idx = oi;
		}
	}
	__syncthreads();
	if (lane == 0) {
		sv[warp] = v;
		si[warp] = idx;
	}
	__syncthreads();
	v = sv[0];
	idx = si[0];
	for (int w = 1; w < NWARP; w++) {
		if (sv[w] > v || (sv[w] == v && si[w] < idx)) {
			v = sv[w];
			idx = si[w];
		}
	}
}

static __device__ double block_sum_d(double v)
{
	__shared__ double sd[NWARP];
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

	for (int o = 16; o > 0; o >>= 1)
		v += __shfl_xor_sync(0xffffffffu, v, o);
	__syncthreads();
	if (lane == 0)
		sd[warp] = v;
	__syncthreads();
	v = 0.0;
	for (int w = 0; w < NWARP; w++)
		v += sd[w];
	return v;
}

static __device__ int block_or(int v)
{
	return __syncthreads_or(v);
}

/*
 * Walks x[0..n) (ids id0 + i) in id order and returns the index i of the j-th element
 * (0-based) whose key is `key`, or -1. With out non-NULL it instead stores the indices of
 * the first `need` such elements in out[0..need). Every thread gets the result.
 */
static __device__ int block_nth_equal(const float *x, int n, uint32_t key, int j, int *out,
				      int need)
{
	__shared__ int wcnt[NWARP];
	__shared__ int s_found;
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	const int last = out ? need - 1 : j;
	int base = 0;

	if (threadIdx.x == 0)
		s_found = -1;
	for (int t0 = 0; t0 < n; t0 += NT) {
		int i = t0 + threadIdx.x;
		bool eq = i < n && order_key(x[i]) == key;
		unsigned bal = __ballot_sync(0xffffffffu, eq);
		int pos, tot = 0;

		__syncthreads();
		if (lane == 0)
			wcnt[warp] = __popc(bal);
		__syncthreads();
		pos = base;
		for (int w = 0; w < NWARP; w++) {
			if (w < warp)
				pos += wcnt[w];
			tot += wcnt[w];
		}
		pos += __popc(bal & ((1u << lane) - 1u));
		if (eq && pos <= last) {
			if (out)
				out[pos] = i;
			else if (pos == j)
				s_found = i;
		}
		base += tot;
		if (base > last)
			break;
	}
	__syncthreads();
	return s_found;
}

/* What one select is doing: the stage names the kind and the filters. */
struct sel {
	int mass;	/* 0: count every element, 1: weigh the kept candidates */
	int level;
	uint32_t prefix;
	int has_k, has_p;
	uint32_t k_key, p_key;
	int32_t k_id, p_id;
	float maxv;
	double t;
};

static __device__ const int shifts[3] = { 21, 10, 0 };

/* Adds x[0..n) (ids id0 + i) into the block's histogram of digit s.level, for elements
 * that match the resolved prefix and pass the select's filters. cnt/mass zeroed before. */
static __device__ void block_hist(const float *x, int n, int id0, const struct sel &s,
				  uint32_t *cnt, double *mass)
{
	const int shift = shifts[s.level];
	const uint32_t mask = s.level == 2 ? 0x3ffu : 0x7ffu;
	const int hs = s.level == 0 ? 32 : shifts[s.level - 1];

	for (int i = threadIdx.x; i < n; i += NT) {
		float l = x[i];
		uint32_t key = order_key(l);
		int32_t id = id0 + i;
		uint32_t bin;

		if (hs < 32 && (key >> hs) != (s.prefix >> hs))
			continue;
		bin = (key >> shift) & mask;
		if (s.mass) {
			double w;

			if (s.has_k && !upto(key, id, s.k_key, s.k_id))
				continue;
			if (s.has_p && !upto(key, id, s.p_key, s.p_id))
				continue;
			w = weight(l, s.maxv, s.t);
			if (!(w > 0.0))
				continue;
			atomicAdd(&mass[bin], w);
		}
		atomicAdd(&cnt[bin], 1u);
	}
}

/*
 * Warp 0 only: scans bins [0, nb) from the top like sampler.c's select_cut, from running
 * total *acc, for the first bin where the total reaches *target (< 0: frac of the bins'
 * total, resolved here). Returns the bin; *acc becomes the total before it. When rounding
 * keeps every bin short, the lowest non-empty bin is picked.
 */
static __device__ int warp_scan_bins(const uint32_t *cnt, const double *mass, int nb, int use_mass,
				     double *acc, double *target, double frac)
{
	const int lane = threadIdx.x & 31;
	const int per = nb / 32;
	const int top = nb - 1 - lane * per;	/* this lane's bins: top down to top-per+1 */
	double s = 0.0, ex, tgt, a0 = *acc;
	int nonempty = 0, pick, any;
	unsigned bal;

#pragma unroll 8
	for (int b = top; b > top - per; b--) {
		if (cnt[b]) {
			s += use_mass ? mass[b] : (double)cnt[b];
			nonempty = 1;
		}
	}
	/* exclusive prefix over lanes (lane 0 holds the highest bins) */
	ex = s;
	for (int o = 1; o < 32; o <<= 1) {
		double v = __shfl_up_sync(0xffffffffu, ex, o);

		if (lane >= o)
			ex += v;
	}
	tgt = *target;
	if (tgt < 0.0)
		tgt = frac * __shfl_sync(0xffffffffu, ex, 31);
	ex -= s;
	bal = __ballot_sync(0xffffffffu, nonempty && a0 + ex + s >= tgt);
	any = bal != 0;
	if (any) {
		pick = __ffs(bal) - 1;
	} else {
		bal = __ballot_sync(0xffffffffu, nonempty);
		pick = bal ? 31 - __clz(bal) : 31;
	}
	if (lane == pick) {
		double a = a0 + ex, bp = a;
		int pb = top - per + 1;

		for (int b = top; b > top - per; b--) {
			if (!cnt[b])
				continue;
			pb = b;
			bp = a;
			a += use_mass ? mass[b] : (double)cnt[b];
			if (a >= tgt)
				break;
		}
		*acc = bp;
		*target = tgt;
		return pb;
	}
	return -1;
}

/* Weight (or 1) of every element with key k. */
static __device__ __forceinline__ double key_weight(const struct sel &s, uint32_t k)
{
	return s.mass ? weight(key_float(k), s.maxv, s.t) : 1.0;
}

/* Given the total `acc` before key k's c elements of weight w each, the 0-based one at
 * which the running total reaches target (the last when rounding keeps it short); *at gets
 * the total through it. */
static __device__ int resolve_equal(double acc, double w, int c, double target, double *at)
{
	int j = 0;
	double a = acc;

	if (c > 64 && w > 0.0) {
		double g = floor((target - acc) / w) - 2.0;

		if (g > 0.0) {
			j = g < (double)(c - 1) ? (int)g : c - 1;
			a = acc + (double)j * w;
		}
	}
	for (;; j++) {
		a += w;
		if (a >= target || j == c - 1)
			break;
	}
	*at = a;
	return j;
}

/* ---- the fast kernel ---------------------------------------------------------------- */

struct blk_smem {
	uint32_t cnt[NBINS];
	double mass[NBINS];
	uint64_t cands[MAXP * LIST_K];	/* the P part lists, as comp() words, LIST_K apart */
	uint64_t gbuf[GCAP];		/* phase A candidates */
	uint64_t lbuf[LIST_K];		/* the radix fallback's list */
	uint64_t wthr[NWARP];
	unsigned ng;
	struct cand sorted[LIST_K];
	double w[LIST_K];
	int byid[LIST_K];
	int eq_idx[LIST_K];
	struct row_state st;
	int nlist;
	int last;
	int bin;
	double acc, target;
	unsigned ngreater;
};

static __device__ void load_state(struct row_state *dst, const struct row_state *src)
{
	const unsigned *s = (const unsigned *)src;
	unsigned *d = (unsigned *)dst;

	for (int i = threadIdx.x; i < (int)(sizeof(*src) / 4); i += NT)
		d[i] = __ldcg(s + i);
	__syncthreads();
}

/* Every block of a row: signal arrival; returns true in the last block to arrive, which
 * then sees every other block's writes. */
static __device__ bool row_arrive(struct scratch *sc, int r, int P, unsigned gen,
				  struct blk_smem *sm)
{
	__syncthreads();
	if (threadIdx.x == 0) {
		unsigned old;

		__threadfence();
		old = atomicAdd(&sc->arr[r], 1u);
		sm->last = old == gen * (unsigned)P - 1u;
		if (sm->last)
			__threadfence();
	}
	__syncthreads();
	return sm->last;
}

static __device__ void row_release(struct scratch *sc, int r, unsigned gen)
{
	__syncthreads();
	if (threadIdx.x == 0) {
		__threadfence();
		atomicExch(&sc->rel[r], gen);
	}
}

static __device__ void row_wait(struct scratch *sc, int r, unsigned gen)
{
	if (threadIdx.x == 0) {
		volatile unsigned *rel = &sc->rel[r];

		while (*rel < gen)
			__nanosleep(64);
		__threadfence();
	}
	__syncthreads();
}

/* Radix count-select fallback for block_top_list: the L best elements of x[0..n) (ids id0 +
 * i, n > L) in sampling order, unordered, as comp() words into out[0..L). */
static __device__ void block_local_radix(const float *x, int n, int id0, int L,
					 struct blk_smem *sm, uint64_t *out)
{
	struct sel s = {};
	double acc = 0.0, target = (double)L;
	uint32_t key;
	int g;

	for (s.level = 0; s.level < 3; s.level++) {
		for (int b = threadIdx.x; b < NBINS; b += NT)
			sm->cnt[b] = 0;
		__syncthreads();
		block_hist(x, n, id0, s, sm->cnt, sm->mass);
		__syncthreads();
		if (threadIdx.x < 32) {
			double a = acc, t = target;
			int b = warp_scan_bins(sm->cnt, sm->mass, s.level == 2 ? 1024 : 2048, 0,
					       &a, &t, 0.0);

			if (b >= 0) {
				sm->bin = b;
				sm->acc = a;
			}
		}
		__syncthreads();
		s.prefix |= (uint32_t)sm->bin << shifts[s.level];
		acc = sm->acc;
		__syncthreads();
	}
	key = s.prefix;
	g = (int)acc;	/* elements with a larger key: fewer than L */
	if (threadIdx.x == 0)
		sm->ngreater = 0;
	__syncthreads();
	for (int i = threadIdx.x; i < n; i += NT) {
		uint32_t k = order_key(x[i]);

		if (k > key) {
			unsigned at = atomicAdd(&sm->ngreater, 1u);

			out[at] = comp(k, id0 + i);
		}
	}
	block_nth_equal(x, n, key, 0, sm->eq_idx, L - g);
	for (int j = threadIdx.x; j < L - g; j += NT)
		out[g + j] = comp(key, id0 + sm->eq_idx[j]);
	__syncthreads();
}

/* buf[0..m) distinct comp() words: the best min(m, L) into dst in sampling order. The
 * caller syncs before (buf complete) and after. */
static __device__ void rank_out(const uint64_t *buf, int m, int L, struct cand *dst)
{
	for (int e = threadIdx.x; e < m; e += NT) {
		uint64_t v = buf[e];
		int rank = 0;

		for (int f = 0; f < m; f++)
			rank += buf[f] > v;
		if (rank < L)
			dst[rank] = comp_cand(v);
	}
}

/*
 * The block's L best elements of x[0..n) (ids id0 + i) in sampling order into dst[0..nlist),
 * nlist = min(n, L) left in sm->nlist. tc is this thread's best element of the load (the
 * elements i = threadIdx.x mod NT) as a comp() word, 0 when it had none. Each warp's
 * ceil(L / NWARP)-th best tc is reached by that many distinct elements of the warp, so the
 * smallest of those over the warps is reached by at least L elements: the ones that reach
 * it are gathered and ranked. Too many (a pathological layout) goes to the radix select.
 */
static __device__ void block_top_list(const float *x, int n, int id0, int L, uint64_t tc,
				      struct blk_smem *sm, struct cand *dst)
{
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	const int per = (L + NWARP - 1) / NWARP;
	uint64_t v = tc, t = 0, thr;
	int m;

	if (n <= L) {
		for (int i = threadIdx.x; i < n; i += NT)
			sm->gbuf[i] = comp(order_key(x[i]), id0 + i);
		__syncthreads();
		rank_out(sm->gbuf, n, L, dst);
		if (threadIdx.x == 0)
			sm->nlist = n;
		__syncthreads();
		return;
	}
	for (int j = 0; j < per; j++) {
		uint64_t mx = v;

		for (int o = 16; o > 0; o >>= 1) {
			uint64_t w = __shfl_xor_sync(0xffffffffu, mx, o);

			mx = w > mx ? w : mx;
		}
		t = mx;
		if (v == mx)
			v = 0;	/* words are distinct: only the holder drops out */
	}
	__syncthreads();
	if (lane == 0)
		sm->wthr[warp] = t;
	if (threadIdx.x == 0)
		sm->ng = 0;
	__syncthreads();
	thr = sm->wthr[0];
	for (int w = 1; w < NWARP; w++)
		thr = sm->wthr[w] < thr ? sm->wthr[w] : thr;
	for (int i = threadIdx.x; i < n; i += NT) {
		uint64_t c = comp(order_key(x[i]), id0 + i);

		if (c >= thr) {
			unsigned at = atomicAdd(&sm->ng, 1u);

			if (at < GCAP)
				sm->gbuf[at] = c;
		}
	}
	__syncthreads();
	m = (int)sm->ng;
	if (m > GCAP || m < L) {
		block_local_radix(x, n, id0, L, sm, sm->lbuf);
		rank_out(sm->lbuf, L, L, dst);
	} else {
		rank_out(sm->gbuf, m, L, dst);
	}
	if (threadIdx.x == 0)
		sm->nlist = L;
	__syncthreads();
}

/* How many of a[0..n) (descending) are greater than v. */
static __device__ __forceinline__ int count_greater(const uint64_t *a, int n, uint64_t v)
{
	int lo = 0, hi = n;

	while (lo < hi) {
		int mid = (lo + hi) >> 1;

		if (a[mid] > v)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* Merges the P sorted part lists into sm->sorted[0..min(L, total)) in sampling order: an
 * element's rank is its index in its own list plus, by binary search, the number of larger
 * elements in each other list (all words are distinct). */
static __device__ int merge_lists(struct scratch *sc, int r, int P, int L, struct blk_smem *sm)
{
	__shared__ int s_n[MAXP];
	int tot = 0;

	if (threadIdx.x < P)
		s_n[threadIdx.x] = __ldcg(&sc->stat[r][threadIdx.x].nlist);
	__syncthreads();
	for (int e = threadIdx.x; e < P * LIST_K; e += NT) {
		int q = e / LIST_K, j = e % LIST_K;

		if (j < s_n[q])
			sm->cands[e] = comp(__ldcg(&sc->plist[r][q][j].key),
					    __ldcg(&sc->plist[r][q][j].id));
	}
	__syncthreads();
	for (int q = 0; q < P; q++)
		tot += s_n[q];
	for (int e = threadIdx.x; e < P * LIST_K; e += NT) {
		int q0 = e / LIST_K, j = e % LIST_K, rank = j;
		uint64_t v;

		if (j >= s_n[q0])
			continue;
		v = sm->cands[e];
		for (int q = 0; q < P && rank < L; q++)
			if (q != q0)
				rank += count_greater(sm->cands + q * LIST_K, s_n[q], v);
		if (rank < L)
			sm->sorted[rank] = comp_cand(v);
	}
	__syncthreads();
	return tot < L ? tot : L;
}

/* Top-k from the merged list (k <= LIST_K, k < vocab), then top-p and the draw, in one
 * thread in the host's summation orders. Returns the sorted index of the token. */
static __device__ int sample_list(struct blk_smem *sm, int k, const struct prm &p, float maxv)
{
	__shared__ int s_tok;

	for (int j = threadIdx.x; j < k; j += NT) {
		int rank = 0;

		sm->w[j] = weight(key_float(sm->sorted[j].key), maxv, p.t);
		for (int i = 0; i < k; i++)
			rank += sm->sorted[i].id < sm->sorted[j].id;
		sm->byid[rank] = j;
	}
	__syncthreads();
	if (threadIdx.x == 0) {
		int m = 0, cut, tok = 0;
		double z = 0.0, acc = 0.0, target;

		while (m < k && sm->w[m] > 0.0)
			m++;
		for (int i = 0; i < k; i++)
			if (sm->w[sm->byid[i]] > 0.0)
				z += sm->w[sm->byid[i]];
		cut = m - 1;
		if (p.top_p < 1.0f) {
			target = (double)p.top_p * z;
			for (int j = 0; j < m; j++) {
				acc += sm->w[j];
				if (acc >= target || j == m - 1) {
					cut = j;
					break;
				}
			}
			z = 0.0;
			for (int i = 0; i < k; i++)
				if (sm->byid[i] <= cut)
					z += sm->w[sm->byid[i]];
		}
		target = p.u * z;
		acc = 0.0;
		for (int j = 0; j <= cut; j++) {
			acc += sm->w[j];
			if (acc >= target || j == cut) {
				tok = j;
				break;
			}
		}
		s_tok = tok;
	}
	__syncthreads();
	return s_tok;
}

static __device__ void write_result(struct sm70_sample_result *o, struct blk_smem *sm, int nl,
				    const struct prm &p, int32_t token, uint32_t tkey, double lse)
{
	if (threadIdx.x == 0) {
		o->token = token;
		o->logprob = (float)((double)key_float(tkey) - lse);
		o->n_top = p.n_top;
	}
	for (int j = threadIdx.x; j < p.n_top && j < nl; j += NT) {
		o->top_ids[j] = sm->sorted[j].id;
		o->top_logprobs[j] = (float)((double)key_float(sm->sorted[j].key) - lse);
	}
}

/* Sets st for the first select after the list/top-k stage. */
static __device__ void next_select(struct row_state *st, int stage, double frac)
{
	st->stage = stage;
	st->level = 0;
	st->prefix = 0;
	st->acc = 0.0;
	st->target = -1.0;
	st->frac = frac;
}

static __global__ void __launch_bounds__(NT, 1)
sample_kernel(struct sm70_sample_result *out, const float *__restrict__ logits,
	      const struct sm70_sample_row *rows, int vocab, int P, int chunk, int cached,
	      struct scratch *sc)
{
	extern __shared__ float s_x[];
	__shared__ struct blk_smem sm;
	const int r = blockIdx.y, q = blockIdx.x;
	const int lo = q * chunk;
	const int n = min(chunk, vocab - lo);
	const float *row = logits + (size_t)r * vocab;
	const float *x = cached ? s_x : row + lo;
	struct sm70_sample_result *o = out + r;
	const struct prm p = decode(rows + r, vocab);
	const int L = max(p.n_top, p.sampling && p.k >= 1 && p.k <= LIST_K ? p.k : 0);
	/* rows that end at the first barrier: the other blocks need not wait there */
	const bool one_pass = !p.valid || !p.sampling || (p.k >= 1 && p.k <= LIST_K);
	unsigned gen = 0;
	float mv = -INFINITY;
	int mi = 0x7fffffff, bad = 0;
	uint64_t tc;
	double raw = 0.0;

	/* phase A: load, slice max, NaN check, local list; 8 loads in flight per thread */
	for (int i0 = threadIdx.x; i0 < n; i0 += 8 * NT) {
		float v[8];

#pragma unroll
		for (int u = 0; u < 8; u++)
			v[u] = i0 + u * NT < n ? __ldg(row + lo + i0 + u * NT) : -INFINITY;
#pragma unroll
		for (int u = 0; u < 8; u++) {
			int i = i0 + u * NT;
			float l = v[u];

			if (i >= n)
				break;
			if (cached)
				s_x[i] = l;
			if (l != l)
				bad = 1;
			else if (l > mv || (l == mv && lo + i < mi)) {
				mv = l;
				mi = lo + i;
			}
		}
	}
	/* this thread's best element in sampling order (float order with lowest id first is
	 * the same order, -0 and +0 included) */
	tc = (int)threadIdx.x < n && mi != 0x7fffffff ? comp(order_key(mv), mi) : 0;
	bad = block_or(bad);
	block_argmax(mv, mi);
	/* raw sum against the slice max; the merge rescales it to the row max */
	if (!bad && isfinite(mv))
		for (int i = threadIdx.x; i < n; i += NT)
			raw += (double)expf((float)((double)x[i] - (double)mv));
	raw = block_sum_d(raw);
	if (p.valid && !bad && L > 0)
		block_top_list(x, n, lo, L, tc, &sm, sc->plist[r][q]);
	else if (threadIdx.x == 0)
		sm.nlist = 0;
	__syncthreads();
	if (threadIdx.x == 0) {
		sc->stat[r][q].maxv = mv;
		sc->stat[r][q].argmax = mi;
		sc->stat[r][q].bad = bad;
		sc->stat[r][q].nlist = sm.nlist;
		sc->stat[r][q].raw = raw;
	}
	if (row_arrive(sc, r, P, ++gen, &sm)) {
		int nl = 0, anybad = 0;
		float m = -INFINITY;
		int am = 0x7fffffff;

		__shared__ float s_mv[MAXP];
		__shared__ int s_am[MAXP], s_bad[MAXP];
		__shared__ double s_raw[MAXP];

		if (threadIdx.x < P) {
			s_mv[threadIdx.x] = __ldcg(&sc->stat[r][threadIdx.x].maxv);
			s_am[threadIdx.x] = __ldcg(&sc->stat[r][threadIdx.x].argmax);
			s_bad[threadIdx.x] = __ldcg(&sc->stat[r][threadIdx.x].bad);
			s_raw[threadIdx.x] = __ldcg(&sc->stat[r][threadIdx.x].raw);
		}
		__syncthreads();
		if (threadIdx.x == 0) {
			for (int i = 0; i < P; i++) {
				float v = s_mv[i];
				int a = s_am[i];

				anybad |= s_bad[i];
				if (v > m || (v == m && a < am)) {
					m = v;
					am = a;
				}
			}
			sm.st = {};
			sm.st.maxv = m;
			sm.st.argmax = am;
			if (!p.valid || anybad || !isfinite(m)) {
				write_invalid(o);
				sm.st.stage = ST_DONE;
			} else {
				double sum = 0.0;

				for (int i = 0; i < P; i++)
					if (s_raw[i] > 0.0)
						sum += s_raw[i] * exp((double)s_mv[i] - (double)m);
				sm.st.lse = (double)m + log(sum);
				if (one_pass) {
					sm.st.stage = ST_FINISH;
				} else if (p.k) {
					next_select(&sm.st, ST_TOPK, 0.0);
					sm.st.target = (double)p.k;
				} else {
					next_select(&sm.st, p.top_p < 1.0f ? ST_TOPP : ST_DRAW,
						    p.top_p < 1.0f ? (double)p.top_p : p.u);
				}
			}
		}
		__syncthreads();
		if (sm.st.stage != ST_DONE && L > 0)
			nl = merge_lists(sc, r, P, L, &sm);
		if (sm.st.stage == ST_FINISH) {
			int32_t tok = sm.st.argmax;
			uint32_t tkey = order_key(sm.st.maxv);

			if (p.sampling) {
				int j = sample_list(&sm, p.k, p, sm.st.maxv);

				tok = sm.sorted[j].id;
				tkey = sm.sorted[j].key;
			}
			write_result(o, &sm, nl, p, tok, tkey, sm.st.lse);
		}
		if (one_pass) {
			/* every block of the row has arrived and none comes back */
			if (threadIdx.x == 0)
				atomicExch(&sc->arr[r], 0u);
			return;
		}
		for (int j = threadIdx.x; j < nl; j += NT)
			sc->list[r][j] = sm.sorted[j];
		if (threadIdx.x == 0) {
			sc->nlist[r] = nl;
			sc->row[r] = sm.st;
		}
		row_release(sc, r, gen);
	} else if (one_pass) {
		return;
	} else {
		row_wait(sc, r, gen);
	}
	load_state(&sm.st, &sc->row[r]);

	while (sm.st.stage != ST_DONE) {
		struct sel s = {};
		const int stage = sm.st.stage;

		s.mass = stage != ST_TOPK;
		s.level = sm.st.level;
		s.prefix = sm.st.prefix;
		s.has_k = sm.st.has_k;
		s.k_key = sm.st.k_key;
		s.k_id = sm.st.k_id;
		s.has_p = sm.st.has_p;
		s.p_key = sm.st.p_key;
		s.p_id = sm.st.p_id;
		s.maxv = sm.st.maxv;
		s.t = p.t;
		for (int b = threadIdx.x; b < NBINS; b += NT) {
			sm.cnt[b] = 0;
			sm.mass[b] = 0.0;
		}
		__syncthreads();
		block_hist(x, n, lo, s, sm.cnt, sm.mass);
		__syncthreads();
		for (int b = threadIdx.x; b < NBINS; b += NT) {
			sc->hcnt[r][q][b] = sm.cnt[b];
			sc->hmass[r][q][b] = sm.mass[b];
		}
		if (row_arrive(sc, r, P, ++gen, &sm)) {
			struct row_state *st = &sm.st;

			__shared__ int s_hc[MAXP];

			for (int b = threadIdx.x; b < NBINS; b += NT) {
				uint32_t c = 0;
				double mm = 0.0;

#pragma unroll
				for (int i = 0; i < MAXP; i++) {
					if (i < P) {
						c += __ldcg(&sc->hcnt[r][i][b]);
						mm += __ldcg(&sc->hmass[r][i][b]);
					}
				}
				sm.cnt[b] = c;
				sm.mass[b] = mm;
			}
			if (threadIdx.x == 0)
				sm.nlist = __ldcg(&sc->nlist[r]);
			for (int j = threadIdx.x; j < LIST_K; j += NT) {
				sm.sorted[j].key = __ldcg(&sc->list[r][j].key);
				sm.sorted[j].id = __ldcg(&sc->list[r][j].id);
			}
			__syncthreads();
			if (threadIdx.x < 32) {
				double a = st->acc, t = st->target;
				int b = warp_scan_bins(sm.cnt, sm.mass, s.level == 2 ? 1024 : 2048,
						       s.mass, &a, &t, st->frac);

				if (b >= 0) {
					sm.bin = b;
					sm.acc = a;
					sm.target = t;
				}
			}
			__syncthreads();
			if (s.level == 2 && threadIdx.x < P)
				s_hc[threadIdx.x] = (int)__ldcg(&sc->hcnt[r][threadIdx.x][sm.bin]);
			__syncthreads();
			if (s.level < 2) {
				if (threadIdx.x == 0) {
					st->prefix |= (uint32_t)sm.bin << shifts[s.level];
					st->acc = sm.acc;
					st->target = sm.target;
					st->level++;
				}
			} else {
				/* one key left: find the id among its equal elements */
				__shared__ int s_q, s_j;
				uint32_t key = st->prefix | (uint32_t)sm.bin;
				int idx;

				if (threadIdx.x == 0) {
					double at;
					int c = (int)sm.cnt[sm.bin];
					int j = resolve_equal(sm.acc, key_weight(s, key), c,
							      sm.target, &at);
					int qq = 0;

					for (; qq < P - 1; qq++) {
						int cq = s_hc[qq];

						if (j < cq)
							break;
						j -= cq;
					}
					s_q = qq;
					s_j = j;
				}
				__syncthreads();
				idx = block_nth_equal(row + s_q * chunk,
						      min(chunk, vocab - s_q * chunk), key, s_j,
						      NULL, 0);
				if (threadIdx.x == 0) {
					int32_t id = s_q * chunk + (idx < 0 ? 0 : idx);

					if (stage == ST_TOPK) {
						st->has_k = 1;
						st->k_key = key;
						st->k_id = id;
						next_select(st, p.top_p < 1.0f ? ST_TOPP : ST_DRAW,
							    p.top_p < 1.0f ? (double)p.top_p : p.u);
					} else if (stage == ST_TOPP) {
						st->has_p = 1;
						st->p_key = key;
						st->p_id = id;
						next_select(st, ST_DRAW, p.u);
					} else {
						st->argmax = id;	/* the token */
						st->p_key = key;
						st->stage = ST_DONE;
					}
				}
				__syncthreads();
				if (stage == ST_DRAW)
					write_result(o, &sm, sm.nlist, p, st->argmax, st->p_key,
						     st->lse);
			}
			__syncthreads();
			if (threadIdx.x == 0)
				sc->row[r] = *st;
			row_release(sc, r, gen);
		} else {
			row_wait(sc, r, gen);
		}
		load_state(&sm.st, &sc->row[r]);
	}
	/* the last block out resets the row's counters for the next call */
	if (threadIdx.x == 0) {
		if (atomicAdd(&sc->fin[r], 1u) == (unsigned)P - 1u) {
			atomicExch(&sc->arr[r], 0u);
			atomicExch(&sc->rel[r], 0u);
			atomicExch(&sc->fin[r], 0u);
		}
	}
}

/* ---- the reference kernel ----------------------------------------------------------- */

/* Kept mass (or count) of elements with key >= lo_key, under the filters of s. */
static __device__ double ref_mass_ge(const float *row, int vocab, const struct sel &s,
				     uint64_t lo_key)
{
	double acc = 0.0;

	for (int i = threadIdx.x; i < vocab; i += NT) {
		float l = row[i];
		uint32_t k = order_key(l);
		double w;

		if ((uint64_t)k < lo_key)
			continue;
		if (s.has_k && !upto(k, i, s.k_key, s.k_id))
			continue;
		if (s.has_p && !upto(k, i, s.p_key, s.p_id))
			continue;
		w = s.mass ? weight(l, s.maxv, s.t) : 1.0;
		if (w > 0.0)
			acc += w;
	}
	return block_sum_d(acc);
}

/* The element where the kept running total in sampling order first reaches target (the
 * last kept one when it never does): bisection for the key, then an ordered walk. */
static __device__ void ref_select(const float *row, int vocab, const struct sel &s,
				  double target, uint32_t *ckey, int32_t *cid, double *through)
{
	uint64_t lo = 0, hi = 0xffffffffull;
	double acc, w;
	int c, j;

	double tb = ref_mass_ge(row, vocab, s, 0);

	/* the largest key whose kept total from the top reaches target; when rounding keeps
	 * the whole total short, the lowest kept key (the total itself is reached there) */
	if (tb > target)
		tb = target;
	while (lo < hi) {
		uint64_t mid = (lo + hi + 1) / 2;

		if (ref_mass_ge(row, vocab, s, mid) >= tb)
			lo = mid;
		else
			hi = mid - 1;
	}
	acc = lo < 0xffffffffull ? ref_mass_ge(row, vocab, s, lo + 1) : 0.0;
	w = s.mass ? weight(key_float((uint32_t)lo), s.maxv, s.t) : 1.0;
	/* kept elements of this key are a prefix, in id order, of all elements of this key */
	{
		struct sel one = s;
		double cnt;

		one.mass = 0;
		cnt = ref_mass_ge(row, vocab, one, lo) -
		      (lo < 0xffffffffull ? ref_mass_ge(row, vocab, one, lo + 1) : 0.0);
		c = (int)cnt;
	}
	j = resolve_equal(acc, w, c, target, through);
	*ckey = (uint32_t)lo;
	*cid = block_nth_equal(row, vocab, (uint32_t)lo, j, NULL, 0);
}

static __global__ void __launch_bounds__(NT, 1)
sample_ref_kernel(struct sm70_sample_result *out, const float *__restrict__ logits,
		  const struct sm70_sample_row *rows, int vocab)
{
	const int r = blockIdx.x;
	const float *row = logits + (size_t)r * vocab;
	struct sm70_sample_result *o = out + r;
	const struct prm p = decode(rows + r, vocab);
	float mv = -INFINITY;
	int mi = 0x7fffffff, bad = 0;
	double raw = 0.0, lse;
	uint32_t pk = 0xffffffffu;
	int32_t pid = -1;
	struct sel s = {};
	uint32_t tkey;
	int32_t tok;

	for (int i = threadIdx.x; i < vocab; i += NT) {
		float l = row[i];

		if (l != l)
			bad = 1;
		else if (l > mv || (l == mv && i < mi)) {
			mv = l;
			mi = i;
		}
	}
	bad = block_or(bad);
	block_argmax(mv, mi);
	if (!p.valid || bad || !isfinite(mv)) {
		if (threadIdx.x == 0)
			write_invalid(o);
		return;
	}
	for (int i = threadIdx.x; i < vocab; i += NT)
		raw += exp((double)row[i] - (double)mv);
	lse = (double)mv + log(block_sum_d(raw));

	/* top-N: N times the best element after the previous one */
	for (int j = 0; j < p.n_top; j++) {
		__shared__ uint32_t bk[NWARP];
		__shared__ int32_t bi[NWARP];
		uint32_t k0 = 0;
		int32_t i0 = 0x7fffffff;
		int found = 0;

		for (int i = threadIdx.x; i < vocab; i += NT) {
			uint32_t k = order_key(row[i]);

			if (j > 0 && !before(pk, pid, k, i))
				continue;
			if (!found || before(k, i, k0, i0)) {
				k0 = k;
				i0 = i;
				found = 1;
			}
		}
		if (!found)
			k0 = 0, i0 = 0x7fffffff;
		for (int off = 16; off > 0; off >>= 1) {
			uint32_t ok = __shfl_xor_sync(0xffffffffu, k0, off);
			int32_t oi = __shfl_xor_sync(0xffffffffu, i0, off);

			if (before(ok, oi, k0, i0)) {
				k0 = ok;
				i0 = oi;
			}
		}
		__syncthreads();
		if ((threadIdx.x & 31) == 0) {
			bk[threadIdx.x >> 5] = k0;
			bi[threadIdx.x >> 5] = i0;
		}
		__syncthreads();
		k0 = bk[0];
		i0 = bi[0];
		for (int w = 1; w < NWARP; w++) {
			if (before(bk[w], bi[w], k0, i0)) {
				k0 = bk[w];
				i0 = bi[w];
			}
		}
		if (threadIdx.x == 0) {
			o->top_ids[j] = i0;
			o->top_logprobs[j] = (float)((double)row[i0] - lse);
		}
		pk = k0;
		pid = i0;
	}

	tok = mi;
	tkey = order_key(mv);
	if (p.sampling) {
		double z, through;

		s.maxv = mv;
		s.t = p.t;
		if (p.k) {
			s.mass = 0;
			ref_select(row, vocab, s, (double)p.k, &s.k_key, &s.k_id, &through);
			s.has_k = 1;
		}
		s.mass = 1;
		if (p.top_p < 1.0f) {
			z = ref_mass_ge(row, vocab, s, 0);
			ref_select(row, vocab, s, (double)p.top_p * z, &s.p_key, &s.p_id,
				   &through);
			s.has_p = 1;
		}
		z = ref_mass_ge(row, vocab, s, 0);
		ref_select(row, vocab, s, p.u * z, &tkey, &tok, &through);
	}
	if (threadIdx.x == 0) {
		o->token = tok;
		o->logprob = (float)((double)key_float(tkey) - lse);
		o->n_top = p.n_top;
	}
}

/* ---- launchers ---------------------------------------------------------------------- */

/* Blocks per row for b rows: a power of two with b * P <= SMs (all resident at once, one
 * block per SM), slices of at least 1024 logits, at most MAXP. */
static int parts_for(const struct sm70__cuda *c, int b, int vocab)
{
	int p = 1;

	while (p * 2 <= MAXP && p * 2 * b <= c->n_sm && vocab / (p * 2) >= 1024)
		p *= 2;
	return p;
}

/* See backend.h. Rows are launched MAXB at a time. Fast path unless SM70_SAMPLER=reference
 * was set when the backend was made. */
extern "C" void sm70__cuda_sample(struct sm70_backend *be, struct sm70_sample_result *out,
				  const float *logits, const struct sm70_sample_row *rows, int n,
				  int vocab)
{
	struct sm70__cuda *c = sm70__cuda_enter(be);
	static const size_t fixed = sizeof(struct blk_smem) + 1024;

	if (n <= 0 || vocab <= 0)
		return;
	for (int r0 = 0; r0 < n; r0 += MAXB) {
		int b = n - r0 < MAXB ? n - r0 : MAXB;
		const float *lg = logits + (size_t)r0 * vocab;

		if (c->sample_ref || !c->sample_scratch) {
			sample_ref_kernel<<<b, NT, 0, c->stream>>>(out + r0, lg, rows + r0, vocab);
			if (SM70_CUDA_LAUNCHED(be, "sample_ref_kernel"))
				return;
			continue;
		}
		/* batch invariance: the parts a row is cut into order its sums (the logprob's
		 * normaliser), so they must not depend on the rows launched with it */
		int P = parts_for(c, c->be.batch_invariant ? MAXB : b, vocab);
		int chunk = (vocab + P - 1) / P;
		size_t dyn = (size_t)chunk * sizeof(float);
		int cached = c->smem_optin > fixed && dyn <= c->smem_optin - fixed;

		if (!cached)
			dyn = 0;
		/* static plus dynamic shared memory above 48 KiB needs the opt-in, whatever the
		 * dynamic part alone is */
		if (dyn > 0 && sm70__cuda_smem_optin(c, (const void *)sample_kernel))
			return;
		sample_kernel<<<dim3(P, b), NT, dyn, c->stream>>>(
			out + r0, lg, rows + r0, vocab, P, chunk, cached,
			(struct scratch *)c->sample_scratch);
		if (SM70_CUDA_LAUNCHED(be, "sample_kernel"))
			return;
	}
}

/* Times `iters` calls with CUDA events on the backend's stream; *us_median gets the median
 * microseconds per call. For benchmarks (tests/gpu). Returns 0 or -EIO. */
extern "C" int sm70__cuda_sample_time(struct sm70_backend *be, struct sm70_sample_result *out,
				      const float *logits, const struct sm70_sample_row *rows,
				      int n, int vocab, int iters, double *us_median)
{
	struct sm70__cuda *c = sm70__cuda_enter(be);
	cudaEvent_t e0 = NULL, e1 = NULL;
	float *t = NULL;
	int ret = -EIO;

	if (iters <= 0 || !(t = (float *)calloc((size_t)iters, sizeof(*t))))
		return -EINVAL;
	if (SM70_CUDA_CHECK(be, cudaEventCreate(&e0)) || SM70_CUDA_CHECK(be, cudaEventCreate(&e1)))
		goto out;
	for (int i = 0; i < iters; i++) {
		if (SM70_CUDA_CHECK(be, cudaEventRecord(e0, c->stream)))
			goto out;
		sm70__cuda_sample(be, out, logits, rows, n, vocab);
		if (SM70_CUDA_CHECK(be, cudaEventRecord(e1, c->stream)) ||
		    SM70_CUDA_CHECK(be, cudaEventSynchronize(e1)) ||
		    SM70_CUDA_CHECK(be, cudaEventElapsedTime(&t[i], e0, e1)))
			goto out;
	}
	/* insertion sort: iters is small */
	for (int i = 1; i < iters; i++) {
		float v = t[i];
		int j = i;

		for (; j > 0 && t[j - 1] > v; j--)
			t[j] = t[j - 1];
		t[j] = v;
	}
	*us_median = 1000.0 * t[iters / 2];
	ret = c->sticky;
out:
	if (e1)
		cudaEventDestroy(e1);
	if (e0)
		cudaEventDestroy(e0);
	free(t);
	return ret;
}
