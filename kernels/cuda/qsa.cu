/*
 * qsa.cu - the CUDA QSA indexer ops (backend.h): qsa_key_write, qsa_compress and
 * qsa_select; f16 keys and queries in, the f32 indexer cache (struct sm70_qsa_layer).
 *
 * qsa_key_write: one thread per key value, f16 widened to f32.
 *
 * qsa_compress: one block per token; tokens that do not end a block of `ratio` return at
 * once. The mean is summed in f32 in position order and divided by ratio (the CPU twin's
 * bits), the sum of squares in double, and the norm and rotation follow head_norm_rope
 * (sm70__rope_table's f32 angles).
 *
 * qsa_select, two kernels:
 *  - scores: one block per (token, 32 compressed blocks). The token's q heads (f32) and
 *    the 32 compressed keys (rows padded by one float: lane c reads row c without bank
 *    conflicts) are staged in shared memory; warp w takes heads w, w + 8, ..., lane c the
 *    dot of block c, relu'd into a [head][32] table, then thread c sums its column over
 *    the heads in ascending order and divides by sqrt(dim): the contract's f32 score,
 *    written to the caller's scratch. A token whose every block is chosen is skipped.
 *  - pick: one block per token. The k-th largest score by a radix select on the f32 bits
 *    (scores are sums of relus, >= +0, so the bits order like the values), 8 bits a pass:
 *    a shared-memory histogram of the next byte of the scores that match the bytes found so
 *    far, then one warp finds the bin where the count from the top reaches the rank still
 *    wanted. What is left of the rank is how many of the scores equal to the k-th are
 *    taken, lowest blocks first (torch.topk's tie rule on CUDA). A scan in block order
 *    (ballots, then per-warp counts) ranks the equal ones and places the chosen ones, so
 *    positions come out ascending; the tail follows.
 * Grids come from b->n_tokens and b->max_pos alone, so a captured graph serves any
 * batch contents.
 *
 * Non-goals: tensor cores for the scores (the f32 keys and the exact tie rule want plain
 * f32 dots); indexers whose q and one tile of keys do not fit shared memory.
 */
#include <math.h>

#include "kernels/cuda/cuda_check.h"

#define KEY_THREADS 128
#define COMPRESS_THREADS 128
#define SCORE_THREADS 256
#define SCORE_WARPS (SCORE_THREADS / 32)
#define SCORE_BLOCKS 32 /* compressed blocks a score block takes: one a lane */
#define PICK_THREADS 512
#define PICK_WARPS (PICK_THREADS / 32)

/* The cache slot of position p through a sequence's block table. */
static __device__ __forceinline__ size_t qsa_slot(const int32_t *bt, int bs, int p)
{
	return (size_t)bt[p / bs] * bs + p % bs;
}

/* ---- qsa_key_write ----------------------------------------------------------------------- */

static __global__ void qsa_key_kernel(float *__restrict__ keys, const __half *__restrict__ k,
				      int ld, int dim, const int32_t *__restrict__ slots)
{
	const int t = blockIdx.x, d = blockIdx.y * KEY_THREADS + threadIdx.x;
	const int32_t slot = slots[t];

	if (d < dim && slot >= 0)
		keys[(size_t)slot * dim + d] = __half2float(k[(size_t)t * ld + d]);
}

/* See backend.h. Rows with a negative slot are skipped. */
extern "C" void sm70__cuda_qsa_key_write(struct sm70_backend *be,
					 const struct sm70_qsa_layer *ql, const void *k, int ld,
					 int dim, const struct sm70_batch *b)
{
	struct sm70__cuda *c = sm70__cuda_enter(be);

	if (b->n_tokens <= 0 || dim <= 0)
		return;
	qsa_key_kernel<<<dim3((unsigned)b->n_tokens, (unsigned)((dim + KEY_THREADS - 1) /
								  KEY_THREADS)),
			 KEY_THREADS, 0, c->stream>>>(ql->keys, (const __half *)k, ld, dim,
						      b->tok_slot);
	SM70_CUDA_LAUNCHED(be, "qsa_key_kernel");
}

/* ---- qsa_compress ------------------------------------------------------------------------ */

struct compress_args {
	float *comp;
	const float *keys;
	const float *k_norm;
	float eps;
	int dim;
	int ratio;
	int rot_dim;
	float theta;
	int bs;
	int max_blocks;
	const int32_t *tok_pos;
	const int32_t *tok_seq;
	const int32_t *tok_slot;
	const int32_t *block_tables;
};

/* The sum of v over the block (COMPRESS_THREADS threads); every thread gets it. */
static __device__ double block_sum_double(double v, double *red)
{
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	double s = 0.0;

	for (int o = 16; o > 0; o >>= 1)
		v += __shfl_xor_sync(0xffffffffu, v, o);
	if (lane == 0)
		red[warp] = v;
	__syncthreads();
	for (int w = 0; w < COMPRESS_THREADS / 32; w++)
		s += red[w];
	return s;
}

/* One block per token; shared memory: the row [dim], then cos/sin [rot_dim]. */
static __global__ void __launch_bounds__(COMPRESS_THREADS)
	qsa_compress_kernel(struct compress_args a)
{
	extern __shared__ float cm[];
	__shared__ double red[COMPRESS_THREADS / 32];
	float *x = cm, *tab = cm + a.dim;
	const int t = blockIdx.x, pos = a.tok_pos[t], slot = a.tok_slot[t];
	const int half = a.rot_dim / 2;

	if ((pos + 1) % a.ratio != 0 || slot < 0)
		return;
	const int p0 = pos + 1 - a.ratio;
	const int32_t *bt = a.block_tables + (size_t)a.tok_seq[t] * a.max_blocks;
	double ss = 0.0;

	sm70__rope_table(tab, a.rot_dim, (float)p0, a.theta);
	for (int d = threadIdx.x; d < a.dim; d += COMPRESS_THREADS) {
		float s = 0.0f;

		for (int i = 0; i < a.ratio; i++)
			s += a.keys[qsa_slot(bt, a.bs, p0 + i) * a.dim + d];
		s /= (float)a.ratio;
		x[d] = s;
		ss += (double)s * s;
	}
	ss = block_sum_double(ss, red);
	const float inv = 1.0f / sqrtf((float)(ss / (double)a.dim) + a.eps);

	for (int d = threadIdx.x; d < a.dim; d += COMPRESS_THREADS)
		x[d] = (x[d] * inv) * a.k_norm[d];
	__syncthreads(); /* rotation pairs cross threads; the table is made */
	float *out = a.comp + (size_t)slot * a.dim;

	for (int d = threadIdx.x; d < a.dim; d += COMPRESS_THREADS) {
		float v = x[d];

		if (d < half)
			v = x[d] * tab[d] - x[d + half] * tab[half + d];
		else if (d < a.rot_dim)
			v = x[d] * tab[d - half] + x[d - half] * tab[d];
		out[d] = v;
	}
}

/* See backend.h. Tokens with a negative slot are skipped; rot_dim even and <= dim. */
extern "C" void sm70__cuda_qsa_compress(struct sm70_backend *be,
					const struct sm70_qsa_layer *ql, const float *k_norm,
					float eps, int dim, int ratio, int rot_dim, double theta,
					int block_size, const struct sm70_batch *b)
{
	struct sm70__cuda *c = sm70__cuda_enter(be);
	const size_t smem = sizeof(float) * (size_t)(dim + rot_dim);
	struct compress_args a = { ql->comp, ql->keys, k_norm, eps, dim, ratio, rot_dim,
				   (float)theta, block_size, b->max_blocks, b->tok_pos,
				   b->tok_seq, b->tok_slot, b->block_tables };

	if (b->n_tokens <= 0 || dim <= 0 || ratio < 1)
		return;
	if (smem > 48 * 1024) {
		sm70__cuda_fail(be, "qsa_compress", __FILE__, __LINE__, "dim above 12288");
		return;
	}
	qsa_compress_kernel<<<b->n_tokens, COMPRESS_THREADS, smem, c->stream>>>(a);
	SM70_CUDA_LAUNCHED(be, "qsa_compress_kernel");
}

/* ---- qsa_select: scores ------------------------------------------------------------------- */

struct select_args {
	int32_t *sel;
	int32_t *n_sel;
	int sel_ld;
	const __half *q;
	int q_ld;
	const float *comp;
	int n_heads;
	int dim;
	int ratio;
	int top_blocks;
	int bs;
	float *scores;
	int scores_ld; /* ceil(max_pos / ratio) */
	float sqrt_dim;
	int max_blocks;
	const int32_t *tok_pos;
	const int32_t *tok_seq;
	const int32_t *block_tables;
};

/* Shared memory of the score kernel: q [n_heads][dim], keys [32][dim + 1], relu'd dots
 * [n_heads][32], all f32. */
static size_t score_smem(int n_heads, int dim)
{
	return sizeof(float) * ((size_t)n_heads * dim + (size_t)SCORE_BLOCKS * (dim + 1) +
				(size_t)n_heads * SCORE_BLOCKS);
}

static __global__ void __launch_bounds__(SCORE_THREADS) qsa_score_kernel(struct select_args a)
{
	extern __shared__ float sm[];
	const int t = blockIdx.x, c0 = blockIdx.y * SCORE_BLOCKS;
	const int nb = (a.tok_pos[t] + 1) / a.ratio;
	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, rs = a.dim + 1;

	if (nb <= a.top_blocks || c0 >= nb)
		return; /* every block is taken, or none of these exists */
	const int nc = min(SCORE_BLOCKS, nb - c0);
	const int32_t *bt = a.block_tables + (size_t)a.tok_seq[t] * a.max_blocks;
	const __half *qt = a.q + (size_t)t * a.q_ld;
	float *q_s = sm, *k_s = q_s + a.n_heads * a.dim, *dots = k_s + SCORE_BLOCKS * rs;

	for (int i = tid; i < a.n_heads * a.dim; i += SCORE_THREADS)
		q_s[i] = __half2float(qt[i]);
	for (int i = tid; i < nc * a.dim; i += SCORE_THREADS) {
		const int r = i / a.dim, d = i - r * a.dim;
		const int p = (c0 + r) * a.ratio + a.ratio - 1;

		k_s[r * rs + d] = a.comp[qsa_slot(bt, a.bs, p) * a.dim + d];
	}
	__syncthreads();
	for (int h = warp; h < a.n_heads; h += SCORE_WARPS) {
		const float *qh = q_s + h * a.dim, *kr = k_s + lane * rs;
		float s = 0.0f;

		if (lane < nc)
			for (int d = 0; d < a.dim; d++)
				s += qh[d] * kr[d];
		dots[h * SCORE_BLOCKS + lane] = s > 0.0f ? s : 0.0f;
	}
	__syncthreads();
	if (tid < nc) {
		float acc = 0.0f;

		for (int h = 0; h < a.n_heads; h++)
			acc += dots[h * SCORE_BLOCKS + tid];
		a.scores[(size_t)t * a.scores_ld + c0 + tid] = acc / a.sqrt_dim;
	}
}

/* ---- qsa_select: pick ---------------------------------------------------------------------- */

/* The block-wide exclusive prefix count of flag (PICK_THREADS threads, every one calling)
 * and in *total the block's count. */
static __device__ int block_excl_count(bool flag, int *warp_cnt, int *total)
{
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	const unsigned bal = __ballot_sync(0xffffffffu, flag);
	int before = 0, sum = 0;

	if (lane == 0)
		warp_cnt[warp] = __popc(bal);
	__syncthreads();
	for (int w = 0; w < PICK_WARPS; w++) {
		const int v = warp_cnt[w];

		before += w < warp ? v : 0;
		sum += v;
	}
	__syncthreads(); /* warp_cnt is reused by the next count */
	*total = sum;
	return before + __popc(bal & ((1u << lane) - 1u));
}

struct pick_shared {
	int hist[256];
	int warp_cnt[PICK_WARPS];
	uint32_t prefix;
	int want;
};

/*
 * The k-th largest (1 <= k <= nb) of the nb scores as f32 bits, and in *take_eq how many
 * of the scores equal to it are in the top k. Every thread of the block calls it and gets
 * the answer.
 */
static __device__ uint32_t block_kth_largest(const float *sc, int nb, int k, int *take_eq,
					     struct pick_shared *ps)
{
	const int tid = threadIdx.x, lane = tid & 31;
	uint32_t prefix = 0, mask = 0;
	int want = k;

	for (int shift = 24; shift >= 0; shift -= 8) {
		for (int i = tid; i < 256; i += PICK_THREADS)
			ps->hist[i] = 0;
		__syncthreads();
		for (int c = tid; c < nb; c += PICK_THREADS) {
			const uint32_t u = __float_as_uint(sc[c]);

			if ((u & mask) == prefix)
				atomicAdd(&ps->hist[(u >> shift) & 255], 1);
		}
		__syncthreads();
		if (tid < 32) {
			/* lane l holds bins 8l .. 8l + 7; suf: the count in bins from 8l up */
			int local = 0, suf;

			for (int j = 0; j < 8; j++)
				local += ps->hist[8 * lane + j];
			suf = local;
			for (int o = 1; o < 32; o <<= 1) {
				const int v = __shfl_down_sync(0xffffffffu, suf, o);

				if (lane + o < 32)
					suf += v;
			}
			if (suf - local < want && suf >= want) {
				int above = suf - local, bin = 8 * lane + 7;

				while (above + ps->hist[bin] < want)
					above += ps->hist[bin--];
				ps->prefix = prefix | (uint32_t)bin << shift;
				ps->want = want - above;
			}
		}
		__syncthreads();
		prefix = ps->prefix;
		want = ps->want;
		mask |= 255u << shift;
	}
	*take_eq = want;
	return prefix;
}

/* Writes the positions of the chosen blocks (above kth, and the first take_eq equal to
 * it) ascending into row; returns how many. */
static __device__ int block_write_chosen(int32_t *row, const float *sc, int nb, int ratio,
					 uint32_t kth, int take_eq, struct pick_shared *ps)
{
	int eq_before = 0, taken_before = 0;

	for (int c0 = 0; c0 < nb; c0 += PICK_THREADS) {
		const int c = c0 + threadIdx.x;
		const uint32_t u = c < nb ? __float_as_uint(sc[c]) : 0u;
		const bool eq = c < nb && u == kth, gt = c < nb && u > kth;
		int eq_total, taken_total;
		const int eq_rank = eq_before + block_excl_count(eq, ps->warp_cnt, &eq_total);
		const bool take = gt || (eq && eq_rank < take_eq);
		const int at = taken_before + block_excl_count(take, ps->warp_cnt, &taken_total);

		if (take)
			for (int i = 0; i < ratio; i++)
				row[at * ratio + i] = c * ratio + i;
		eq_before += eq_total;
		taken_before += taken_total;
	}
	return taken_before * ratio;
}

/* One block per token. Every branch depends on the token alone, so the block's threads
 * take it together. */
static __global__ void __launch_bounds__(PICK_THREADS) qsa_pick_kernel(struct select_args a)
{
	__shared__ struct pick_shared ps;
	const int t = blockIdx.x, p = a.tok_pos[t], nb = (p + 1) / a.ratio;
	int32_t *row = a.sel + (size_t)t * a.sel_ld;
	int n = 0, first_tail = nb * a.ratio;

	if (nb <= a.top_blocks) {
		first_tail = 0; /* every block: the positions are 0..p */
	} else if (a.top_blocks > 0) {
		const float *sc = a.scores + (size_t)t * a.scores_ld;
		int take_eq;
		const uint32_t kth = block_kth_largest(sc, nb, a.top_blocks, &take_eq, &ps);

		n = block_write_chosen(row, sc, nb, a.ratio, kth, take_eq, &ps);
	}
	for (int i = threadIdx.x; i <= p - first_tail; i += PICK_THREADS)
		row[n + i] = first_tail + i;
	if (threadIdx.x == 0)
		a.n_sel[t] = n + p + 1 - first_tail;
}

/* See backend.h. sel_ld must be at least min(top_blocks, nb) * ratio + ratio - 1 for
 * every token; top_blocks below 0 counts as 0; q_ld and the heads as the contract says
 * (q read as f16). The q heads and a 32-block tile of keys must fit shared memory. */
extern "C" void sm70__cuda_qsa_select(struct sm70_backend *be, int32_t *sel, int32_t *n_sel,
				      int sel_ld, const void *q, int q_ld,
				      const struct sm70_qsa_layer *ql, int n_heads, int dim,
				      int ratio, int top_blocks, int block_size, float *scratch,
				      const struct sm70_batch *b)
{
	struct sm70__cuda *c = sm70__cuda_enter(be);
	const size_t smem = score_smem(n_heads, dim);
	const int max_pos = b->max_pos > 0 ? b->max_pos : 0;
	const int score_tiles = (max_pos / ratio + SCORE_BLOCKS - 1) / SCORE_BLOCKS;
	struct select_args a = { sel, n_sel, sel_ld, (const __half *)q, q_ld, ql->comp,
				 n_heads, dim, ratio, top_blocks > 0 ? top_blocks : 0,
				 block_size, scratch, (max_pos + ratio - 1) / ratio,
				 (float)sqrt((double)dim), b->max_blocks, b->tok_pos, b->tok_seq,
				 b->block_tables };

	if (b->n_tokens <= 0 || ratio < 1)
		return;
	/* scores only where some token has more blocks than it takes */
	if (score_tiles > 0 && max_pos / ratio > a.top_blocks && a.top_blocks > 0) {
		if (smem > c->smem_optin) {
			sm70__cuda_fail(be, "qsa_select", __FILE__, __LINE__,
					"indexer q and key tile exceed shared memory");
			return;
		}
		if (smem > 48 * 1024 && sm70__cuda_smem_optin(c, (const void *)qsa_score_kernel))
			return;
		qsa_score_kernel<<<dim3((unsigned)b->n_tokens, (unsigned)score_tiles),
				   SCORE_THREADS, smem, c->stream>>>(a);
		if (SM70_CUDA_LAUNCHED(be, "qsa_score_kernel"))
			return;
	}
	qsa_pick_kernel<<<b->n_tokens, PICK_THREADS, 0, c->stream>>>(a);
	SM70_CUDA_LAUNCHED(be, "qsa_pick_kernel");
}
