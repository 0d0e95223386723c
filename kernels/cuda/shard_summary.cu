/*
 * shard_summary.cu - the CUDA shard_summary op (backend.h, common/sampling.h): what one
 * tensor-parallel rank reports about its slice of a row of logits so that the ranks can
 * sample together without gathering the row.
 *
 * One block of 1024 threads per row; the slice (up to ~125K f32 values) stays in global
 * memory and is read four times, from L2 after the first:
 *   1  max, the bad flag (NaN or +inf), histogram of the top 11 bits of the order keys
 *   2  sum_raw = sum exp(l - max), sum_temp = sum exp((l - max) / T) (fp32 per thread,
 *      reduced in double), histogram of the middle 11 bits under the chosen top digit
 *   3  histogram of the low 10 bits under the chosen 22-bit prefix
 *      (each histogram picks the digit where the running count from the top reaches the
 *      K-th element, K = min(256, vocab): after three the K-th key itself is known)
 *   4  compaction: every key above the K-th, then keys equal to it lowest id first
 *      (in id order by tiles when there are more equal keys than places, else in any order)
 * then a bitonic sort of the <= 256 candidates in shared memory, (key desc, id asc) packed
 * in one 64-bit word. Order keys are the host sampler's order_key (daemon/engine/sampler.c):
 * IEEE bits made order-preserving as unsigned, -0 folded onto +0. Output logits are read
 * back from the row, so they are the row's values bit for bit.
 *
 * As the CPU twin (kernels/cpu/shard_summary.c): max is over the values that are neither
 * NaN nor +inf; -inf entries add 0 to both sums, and a slice without a finite value has
 * max -inf and sums 0; sum_temp is 0 unless T > 0. A bad slice's other fields are computed
 * but mean nothing. Entries past n_cand are id -1, logit 0.
 * No allocation, no host synchronisation: capturable in a graph.
 * Non-goals: several blocks per row (rows are few at decode; one block per row keeps the
 * select exact and simple), vocabularies beyond INT_MAX.
 */
#include <math.h>

#include "kernels/cuda/cuda_check.h"

#define NT 1024
#define NWARP (NT / 32)
#define K_MAX SM70_SHARD_CANDS

static_assert(K_MAX == 256, "the bitonic sort below is written for 256 candidates");

static __device__ __forceinline__ uint32_t order_key(float f)
{
	uint32_t u = __float_as_uint(f);

	if (u == 0x80000000u)
		u = 0;
	return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* Sampling order as one unsigned 64-bit word: the key above, the complemented id below, so
 * that among equal keys the lower id is the larger word. 0 is below every real entry. */
static __device__ __forceinline__ unsigned long long comp(uint32_t key, int32_t id)
{
	return ((unsigned long long)key << 32) | (uint32_t)~(uint32_t)id;
}

/* Adds one to hist[bin] for every lane with bin >= 0, one atomic per distinct bin in the
 * warp (logits crowd into few top digits). Every lane of the warp must call it. */
static __device__ __forceinline__ void hist_add(uint32_t *hist, int bin)
{
	unsigned peers = __match_any_sync(0xffffffffu, bin);

	if (bin >= 0 && (int)(threadIdx.x & 31) == __ffs(peers) - 1)
		atomicAdd(&hist[bin], (uint32_t)__popc(peers));
}

/* Exclusive prefix sum of v over the threads in thread order; *total gets the sum. Every
 * thread must call it; sh holds NWARP + 1 words. */
static __device__ uint32_t block_excl_scan(uint32_t v, uint32_t *sh, uint32_t *total)
{
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	uint32_t incl = v, r;

	for (int o = 1; o < 32; o <<= 1) {
		uint32_t t = __shfl_up_sync(0xffffffffu, incl, o);

		if (lane >= o)
			incl += t;
	}
	if (lane == 31)
		sh[warp] = incl;
	__syncthreads();
	if (warp == 0) {
		uint32_t w = sh[lane], wi = w;

		for (int o = 1; o < 32; o <<= 1) {
			uint32_t t = __shfl_up_sync(0xffffffffu, wi, o);

			if (lane >= o)
				wi += t;
		}
		sh[lane] = wi - w;
		if (lane == 31)
			sh[NWARP] = wi;
	}
	__syncthreads();
	r = sh[warp] + incl - v;
	*total = sh[NWARP];
	__syncthreads();
	return r;
}

/*
 * Over hist[bpt * NT] bins counted from the top, finds the bin where the running count
 * reaches need (1 <= need <= the total): sel[0] = the bin, sel[1] = the count in the bins
 * above it, sel[2] = its own count. Every thread must call it.
 */
static __device__ void select_bin(const uint32_t *hist, int bpt, uint32_t need, uint32_t *sh,
				  uint32_t *sel)
{
	const int nb = bpt * NT, t = threadIdx.x;
	uint32_t mine = 0, before, total;

	for (int k = 0; k < bpt; k++)
		mine += hist[nb - 1 - t * bpt - k];
	before = block_excl_scan(mine, sh, &total);
	if (before < need && before + mine >= need) {
		uint32_t acc = before;

		for (int k = 0; k < bpt; k++) {
			int bin = nb - 1 - t * bpt - k;
			uint32_t h = hist[bin];

			if (acc + h >= need) {
				sel[0] = (uint32_t)bin;
				sel[1] = acc;
				sel[2] = h;
				break;
			}
			acc += h;
		}
	}
	__syncthreads();
}

static __global__ void __launch_bounds__(NT)
shard_summary_kernel(struct sm70_shard_summary *out, const float *__restrict__ logits,
		     const struct sm70_sample_row *rows, int vocab, int id0)
{
	__shared__ uint32_t hist[2048];
	__shared__ unsigned long long cand[K_MAX];
	__shared__ uint32_t scan_sh[NWARP + 1];
	__shared__ uint32_t sel[3];
	__shared__ uint32_t warp_cnt[NWARP];
	__shared__ float red_f[NWARP];
	__shared__ double red_raw[NWARP], red_tmp[NWARP];
	__shared__ float s_max;
	__shared__ int s_bad;
	__shared__ uint32_t n_gt, n_eq, tie_base;

	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
	const float *x = logits + (size_t)blockIdx.x * vocab;
	struct sm70_shard_summary *o = out + blockIdx.x;
	const float T = rows[blockIdx.x].temperature;
	const bool use_t = T > 0.0f;
	const uint32_t K = vocab < K_MAX ? (uint32_t)vocab : K_MAX;
	uint32_t need = K, above = 0, prefix = 0, eq_total = 0;
	float m = -INFINITY, s_raw = 0.0f, s_t = 0.0f;
	int bad = 0;

	for (int i = tid; i < 2048; i += NT)
		hist[i] = 0;
	if (tid == 0) {
		s_bad = 0;
		n_gt = 0;
		n_eq = 0;
		tie_base = 0;
	}
	__syncthreads();

	/* pass 1: max, bad, top digit */
	for (int base = 0; base < vocab; base += NT) {
		int i = base + tid, bin = -1;

		if (i < vocab) {
			float l = x[i];

			if (isnan(l) || l == INFINITY)
				bad = 1;
			else
				m = fmaxf(m, l);
			bin = (int)(order_key(l) >> 21);
		}
		hist_add(hist, bin);
	}
	m = sm70__warp_max(m);
	if (lane == 0)
		red_f[warp] = m;
	if (bad)
		s_bad = 1;
	__syncthreads();
	if (warp == 0) {
		float v = sm70__warp_max(red_f[lane]);

		if (lane == 0)
			s_max = v;
	}
	if (K)
		select_bin(hist, 2, need, scan_sh, sel); /* its barriers publish s_max too */
	else
		__syncthreads();
	const float maxv = s_max;

	if (K) {
		prefix = sel[0];
		above += sel[1];
		need -= sel[1];
	}
	__syncthreads(); /* everyone has read sel and is done with hist */
	for (int i = tid; i < 2048; i += NT)
		hist[i] = 0;
	__syncthreads();

	/* pass 2: sums, middle digit under the top one */
	for (int base = 0; base < vocab; base += NT) {
		int i = base + tid, bin = -1;

		if (i < vocab) {
			float l = x[i];
			uint32_t k = order_key(l);

			if (maxv > -INFINITY && !isnan(l)) {
				float d = l - maxv;

				s_raw += expf(d);
				if (use_t)
					s_t += expf(d / T);
			}
			if ((k >> 21) == prefix)
				bin = (int)((k >> 10) & 0x7ffu);
		}
		hist_add(hist, bin);
	}
	s_raw = sm70__warp_sum(s_raw);
	s_t = sm70__warp_sum(s_t);
	if (lane == 0) {
		red_raw[warp] = s_raw;
		red_tmp[warp] = s_t;
	}
	__syncthreads();
	if (K) {
		select_bin(hist, 2, need, scan_sh, sel);
		prefix = (prefix << 11) | sel[0];
		above += sel[1];
		need -= sel[1];
	}
	__syncthreads();
	for (int i = tid; i < 1024; i += NT)
		hist[i] = 0;
	__syncthreads();

	/* pass 3: low digit under the 22-bit prefix */
	if (K) {
		for (int base = 0; base < vocab; base += NT) {
			int i = base + tid, bin = -1;

			if (i < vocab) {
				uint32_t k = order_key(x[i]);

				if ((k >> 10) == prefix)
					bin = (int)(k & 0x3ffu);
			}
			hist_add(hist, bin);
		}
		__syncthreads();
		select_bin(hist, 1, need, scan_sh, sel);
		prefix = (prefix << 10) | sel[0];
		above += sel[1];
		need -= sel[1];
		eq_total = sel[2];
	}

	/* pass 4: the keys above the K-th (any order), then `need` keys equal to it, lowest
	 * ids first: `above` + `need` = K places */
	if (K) {
		const uint32_t kth = prefix;
		const bool ordered = eq_total > need;

		for (int base = 0; base < vocab; base += NT) {
			int i = base + tid;
			bool valid = i < vocab, eq;
			uint32_t k = valid ? order_key(x[i]) : 0;

			if (valid && k > kth)
				cand[atomicAdd(&n_gt, 1u)] = comp(k, i);
			eq = valid && k == kth;
			if (!ordered) {
				if (eq)
					cand[above + atomicAdd(&n_eq, 1u)] = comp(k, i);
				continue;
			}
			/* ordered: rank this tile's equal keys by id, after the earlier tiles */
			{
				unsigned bal = __ballot_sync(0xffffffffu, eq);
				uint32_t off = 0, tile = 0, rk;

				if (lane == 0)
					warp_cnt[warp] = (uint32_t)__popc(bal);
				__syncthreads();
				for (int w = 0; w < NWARP; w++) {
					if (w < warp)
						off += warp_cnt[w];
					tile += warp_cnt[w];
				}
				rk = tie_base + off + (uint32_t)__popc(bal & ((1u << lane) - 1u));
				if (eq && rk < need)
					cand[above + rk] = comp(k, i);
				__syncthreads();
				if (tid == 0)
					tie_base += tile;
			}
		}
	}
	for (int i = (int)K + tid; i < K_MAX; i += NT)
		cand[i] = 0;
	__syncthreads();

	/* bitonic sort of the 256 words, descending */
	for (int size = 2; size <= K_MAX; size <<= 1) {
		for (int stride = size >> 1; stride > 0; stride >>= 1) {
			if (tid < K_MAX) {
				int j = tid ^ stride;

				if (j > tid) {
					unsigned long long a = cand[tid], b = cand[j];
					bool desc = (tid & size) == 0;

					if (desc ? a < b : a > b) {
						cand[tid] = b;
						cand[j] = a;
					}
				}
			}
			__syncthreads();
		}
	}

	if (tid < K_MAX) {
		if ((uint32_t)tid < K) {
			int32_t id = (int32_t)~(uint32_t)cand[tid];

			o->ids[tid] = id0 + id;
			o->logits[tid] = x[id];
		} else {
			o->ids[tid] = -1;
			o->logits[tid] = 0.0f;
		}
	}
	if (tid == 0) {
		double raw = 0.0, tmp = 0.0;

		for (int w = 0; w < NWARP; w++) {
			raw += red_raw[w];
			tmp += red_tmp[w];
		}
		o->max = maxv;
		o->bad = s_bad;
		o->n_cand = (int32_t)K;
		o->reserved = 0;
		o->sum_raw = raw;
		o->sum_temp = use_t ? tmp : 0.0;
	}
}

/* See backend.h. One block per row; rows and out are device memory. */
extern "C" void sm70__cuda_shard_summary(struct sm70_backend *be, struct sm70_shard_summary *out,
					 const float *logits, const struct sm70_sample_row *rows,
					 int n, int vocab, int id0)
{
	struct sm70__cuda *c = sm70__cuda_enter(be);

	if (n <= 0 || vocab < 0)
		return;
	shard_summary_kernel<<<(unsigned)n, NT, 0, c->stream>>>(out, logits, rows, vocab, id0);
	SM70_CUDA_LAUNCHED(be, "shard_summary_kernel");
}
