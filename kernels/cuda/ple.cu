/*
 * ple.cu - the CUDA per-layer n-gram embedding ops of qwen4_exp (kernels/backend.h):
 * ngram_hist, ple_embed, ple_gate and ple_conv.
 *
 * Batches: a sequence's earlier tokens in the same batch are found by walking back from a
 * token t while tok_seq matches and positions go down one by one (the "run" of t); what is
 * older comes from the slot. That covers the decode/chunk shape and any batch that keeps
 * a sequence's tokens together; a batch that interleaves sequences is the CPU's business
 * (its one-unit-per-token fallback). Every op reads its slot before any thread writes it:
 * the state update is a second kernel, queued after the first on the stream.
 *
 *  - ngram_hist: one thread per (token, history entry); then one per (run end, entry)
 *    writes the slot's context: the last token and its own history.
 *  - ple_embed: one warp per (token, head): the hash (uint64, wrapping, as the CPU) and
 *    a copy of one table row from mapped host memory, in 16-byte loads when the row and
 *    out are aligned, converted to f16 (exact for f16 tables; f32 and bf16 rounded to
 *    nearest even: the CPU's f32 row rounded to f16 gives the same bits).
 *  - ple_gate: one warp per (token, stream): the f32 dot product (lane partials, then the
 *    warp's tree), the shaping, then sigmoid(g) * v.
 *  - ple_conv: one block per (token, 256 channels); its first warp finds how much of the
 *    window lies in the token's run (a ballot over up to (k - 1) * dilation tokens), each
 *    thread then sums its channel's taps in f32, oldest first, with products and sums
 *    rounded apart as on the CPU. A second kernel, one block per run end (a decode or a
 *    chunk's last token when the batch has that shape), moves each slot on: its newest
 *    inputs in f16, exact copies.
 *
 * Sequences that share a slot (padding rows on the scratch slot) race on it: their
 * outputs and its contents are unspecified, as backend.h allows.
 *
 * Non-goals: computing the hash parameters, tables in other dtypes than f32, f16, bf16,
 * a bias in the convolution, batches that interleave sequences.
 */
#include <stdint.h>

#include "kernels/cuda/cuda_check.h"

#define THREADS 256
#define WARPS 4 /* per block, where a warp is the unit of work */

/* The batch arrays every kernel here reads (device memory). */
struct ple_batch {
	const int32_t *tok_ids, *tok_pos, *tok_seq, *seq_state;
	int n_tokens, n_seqs;
};

static struct ple_batch ple_batch_of(const struct sm70_batch *b)
{
	return (struct ple_batch){ b->tok_ids, b->tok_pos, b->tok_seq, b->seq_state, b->n_tokens,
				   b->n_seqs };
}

/* The slot of token t's sequence, or -1 when the sequence or its slot is out of range
 * (the state structs carry no slot count: only negative slots are). */
static __device__ __forceinline__ int ple_slot(const struct ple_batch &b, int t)
{
	const int s = b.tok_seq[t];

	if (s < 0 || s >= b.n_seqs || !b.seq_state)
		return -1;
	return b.seq_state[s] < 0 ? -1 : b.seq_state[s];
}

/* Whether token t - m is the previous m-th position of token t's sequence. */
static __device__ __forceinline__ bool ple_in_run(const struct ple_batch &b, int t, int m)
{
	return t - m >= 0 && b.tok_seq[t - m] == b.tok_seq[t] &&
	       b.tok_pos[t - m] == b.tok_pos[t] - m;
}

/* How many tokens before t, up to most, are its run; one thread. */
static __device__ int ple_run_back(const struct ple_batch &b, int t, int most)
{
	int r = 0;

	while (r < most && ple_in_run(b, t, r + 1))
		r++;
	return r;
}

/* The same by a whole warp, 32 tokens a round; every lane gets it. */
static __device__ int ple_run_back_warp(const struct ple_batch &b, int t, int most)
{
	const int lane = threadIdx.x & 31;

	for (int base = 0; base < most; base += 32) {
		const int m = base + lane + 1;
		const bool in = m <= most && ple_in_run(b, t, m);
		const unsigned out = __ballot_sync(0xffffffffu, !in);

		if (out)
			return base + __ffs(out) - 1;
	}
	return most;
}

/* Whether token t is the last of its run (the token after it is not its next position). */
static __device__ __forceinline__ bool ple_run_end(const struct ple_batch &b, int t)
{
	return t + 1 >= b.n_tokens || !ple_in_run(b, t + 1, 1);
}

/* ---- ngram_hist ------------------------------------------------------------------------ */

static __global__ void hist_kernel(int32_t *__restrict__ hist, const int32_t *__restrict__ ctx,
				   int n_hist, struct ple_batch b)
{
	const long idx = (long)blockIdx.x * THREADS + threadIdx.x;
	const int t = (int)(idx / n_hist), i = (int)(idx % n_hist);
	int r, slot;
	int32_t v;

	if (t >= b.n_tokens)
		return;
	r = ple_run_back(b, t, i + 1);
	if (b.tok_pos[t] - 1 - i < 0) {
		v = -1;
	} else if (r > i) {
		v = b.tok_ids[t - 1 - i];
	} else {
		/* ctx[0] is the position just before the run */
		slot = ple_slot(b, t);
		v = slot < 0 ? -1 : ctx[(size_t)slot * n_hist + i - r];
	}
	hist[(size_t)t * n_hist + i] = v;
}

static __global__ void hist_ctx_kernel(int32_t *__restrict__ ctx,
				       const int32_t *__restrict__ hist, int n_hist,
				       struct ple_batch b)
{
	const long idx = (long)blockIdx.x * THREADS + threadIdx.x;
	const int t = (int)(idx / n_hist), i = (int)(idx % n_hist);
	int slot;

	if (t >= b.n_tokens || !ple_run_end(b, t))
		return;
	slot = ple_slot(b, t);
	if (slot < 0)
		return;
	ctx[(size_t)slot * n_hist + i] = i == 0 ? b.tok_ids[t] : hist[(size_t)t * n_hist + i - 1];
}

/* See backend.h. A token whose sequence has no valid slot sees -1 where ctx would be
 * read, and writes no ctx. */
extern "C" void sm70__cuda_ngram_hist(struct sm70_backend *be, int32_t *hist, int32_t *ctx,
				      int n_hist, const struct sm70_batch *b)
{
	struct sm70__cuda *c = sm70__cuda_enter(be);
	const long count = (long)b->n_tokens * n_hist;
	const unsigned blocks = (unsigned)((count + THREADS - 1) / THREADS);

	if (b->n_tokens <= 0 || n_hist <= 0)
		return;
	hist_kernel<<<blocks, THREADS, 0, c->stream>>>(hist, ctx, n_hist, ple_batch_of(b));
	SM70_CUDA_LAUNCHED(be, "hist_kernel");
	hist_ctx_kernel<<<blocks, THREADS, 0, c->stream>>>(ctx, hist, n_hist, ple_batch_of(b));
	SM70_CUDA_LAUNCHED(be, "hist_ctx_kernel");
}

/* ---- ple_embed ------------------------------------------------------------------------- */

struct embed_args {
	__half *out;
	const char *table; /* the device's address of the table */
	enum sm70_dtype dtype;
	int vec; /* rows and out aligned for 16-byte table loads */
	const uint64_t *mult, *size, *offset;
	const int32_t *hist, *tok_ids;
	int ngram, hpn, row_dim, n_items;
	int32_t eos;
	uint64_t rows;
};

/* Eight bf16 (bits in u) or f16 values as eight halves. */
static __device__ __forceinline__ uint4 bf16x8_to_f16(uint4 u)
{
	const uint32_t in[4] = { u.x, u.y, u.z, u.w };
	uint32_t o[4];

	for (int e = 0; e < 4; e++) {
		const __half2 h = __floats2half2_rn(__uint_as_float(in[e] << 16),
						    __uint_as_float(in[e] & 0xffff0000u));

		o[e] = *(const uint32_t *)&h;
	}
	return make_uint4(o[0], o[1], o[2], o[3]);
}

/* Row r of the table into o (row_dim halves), by the 32 lanes of a warp. */
static __device__ void embed_copy(const struct embed_args &a, __half *o, uint64_t r, int lane)
{
	const int D = a.row_dim;

	if (a.dtype == SM70_DTYPE_F16) {
		const __half *src = (const __half *)a.table + r * D;

		if (a.vec)
			for (int k = lane; k < D / 8; k += 32)
				((uint4 *)o)[k] = ((const uint4 *)src)[k];
		else
			for (int k = lane; k < D; k += 32)
				o[k] = src[k];
	} else if (a.dtype == SM70_DTYPE_BF16) {
		const uint16_t *src = (const uint16_t *)a.table + r * D;

		if (a.vec)
			for (int k = lane; k < D / 8; k += 32)
				((uint4 *)o)[k] = bf16x8_to_f16(((const uint4 *)src)[k]);
		else
			for (int k = lane; k < D; k += 32)
				o[k] = __float2half_rn(__uint_as_float((uint32_t)src[k] << 16));
	} else {
		const float *src = (const float *)a.table + r * D;

		if (a.vec) {
			for (int k = lane; k < D / 4; k += 32) {
				const float4 v = ((const float4 *)src)[k];
				const __half2 lo = __floats2half2_rn(v.x, v.y);
				const __half2 hi = __floats2half2_rn(v.z, v.w);

				((uint2 *)o)[k] = make_uint2(*(const uint32_t *)&lo,
							     *(const uint32_t *)&hi);
			}
		} else {
			for (int k = lane; k < D; k += 32)
				o[k] = __float2half_rn(src[k]);
		}
	}
}

static __global__ void embed_kernel(struct embed_args a)
{
	const int item = blockIdx.x * WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
	const int G = (a.ngram - 1) * a.hpn;
	int t, g, n;
	const int32_t *h;
	uint64_t m, r;
	bool open = true; /* no -1 or eos seen yet, walking back */
	__half *o;

	if (item >= a.n_items)
		return;
	t = item / G;
	g = item % G;
	n = g / a.hpn + 2; /* head g hashes the n-gram of n tokens */
	h = a.hist + (size_t)t * (a.ngram - 1);
	m = (uint64_t)a.tok_ids[t] * a.mult[0];
	for (int i = 1; i < n; i++) {
		const int32_t prev = h[i - 1];

		if (prev == -1 || prev == a.eos)
			open = false;
		m ^= (uint64_t)(open ? prev : a.eos) * a.mult[i];
	}
	r = a.size[g] ? m % a.size[g] + a.offset[g] : UINT64_MAX;
	o = a.out + (size_t)item * a.row_dim;
	if (r >= a.rows) {
		for (int k = lane; k < a.row_dim; k += 32)
			o[k] = __float2half_rn(0.0f);
		return;
	}
	embed_copy(a, o, r, lane);
}

/* See backend.h. table_dtype f32, f16 or bf16 (anything else is reported); a head with
 * size 0 or a row past the table gives zeros, as on the CPU. The table is read through
 * the address host_register found for it. */
extern "C" void sm70__cuda_ple_embed(struct sm70_backend *be, void *out,
				     const struct sm70_ple_hash *ph, const int32_t *hist,
				     const struct sm70_batch *b)
{
	struct sm70__cuda *c = sm70__cuda_enter(be);
	const long items = (long)b->n_tokens * (ph->ngram - 1) * ph->heads_per_ngram;
	const char *table = (const char *)sm70__cuda_host_ptr(c, ph->table);
	const size_t esz = sm70_dtype_size(ph->table_dtype);
	const int per16 = esz ? (int)(16 / esz) : 0; /* table elements in 16 bytes */
	struct embed_args a;

	if (b->n_tokens <= 0 || ph->ngram < 2 || ph->heads_per_ngram <= 0 || ph->row_dim <= 0)
		return;
	if ((ph->table_dtype != SM70_DTYPE_F32 && ph->table_dtype != SM70_DTYPE_F16 &&
	     ph->table_dtype != SM70_DTYPE_BF16) || ph->rows < 0 || items > 0x7fffffffL) {
		sm70__cuda_fail(be, "ple_embed", __FILE__, __LINE__, "bad table or batch");
		return;
	}
	a = (struct embed_args){ (__half *)out, table, ph->table_dtype, 0, ph->mult, ph->size,
				 ph->offset, hist, b->tok_ids, ph->ngram, ph->heads_per_ngram,
				 ph->row_dim, (int)items, ph->eos, (uint64_t)ph->rows };
	/* out takes per16 halves per 16 table bytes: 16-byte stores for 2-byte tables, 8 for
	 * f32 */
	a.vec = ph->row_dim % per16 == 0 && (uintptr_t)table % 16 == 0 &&
		(uintptr_t)out % (size_t)(2 * per16) == 0;
	embed_kernel<<<(unsigned)((items + WARPS - 1) / WARPS), WARPS * 32, 0, c->stream>>>(a);
	SM70_CUDA_LAUNCHED(be, "ple_embed embed_kernel");
}

/* ---- ple_gate -------------------------------------------------------------------------- */

/* sign(g) * sqrt(max(|g|, 1e-6)), as the CPU twin (0 and NaN stay). */
static __device__ __forceinline__ float gate_shape(float g)
{
	const float r = sqrtf(fmaxf(fabsf(g), 1e-6f));

	return g > 0.0f ? r : g < 0.0f ? -r : g;
}

/* One warp per (row, stream); V 2: dim and v_ld even, every pointer 4-byte aligned. */
template <int V>
static __global__ void gate_kernel(__half *__restrict__ gv, const __half *__restrict__ kn,
				   const __half *__restrict__ qn, const __half *__restrict__ v,
				   int v_ld, int n_items, int streams, int dim)
{
	const int item = blockIdx.x * WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
	const __half *k_row, *q_row, *v_row;
	__half *o;
	float dot = 0.0f, s;

	if (item >= n_items)
		return;
	k_row = kn + (size_t)item * dim;
	q_row = qn + (size_t)item * dim;
	v_row = v + (size_t)(item / streams) * v_ld;
	o = gv + (size_t)item * dim;
	for (int k = lane * V; k < dim; k += 32 * V) {
		if (V == 2) {
			const float2 a = __half22float2(*(const __half2 *)(k_row + k));
			const float2 b = __half22float2(*(const __half2 *)(q_row + k));

			dot += a.x * b.x + a.y * b.y;
		} else {
			dot += __half2float(k_row[k]) * __half2float(q_row[k]);
		}
	}
	dot = sm70__warp_sum(dot);
	s = gate_shape(dot / sqrtf((float)dim));
	s = 1.0f / (1.0f + expf(-s));
	for (int k = lane * V; k < dim; k += 32 * V) {
		if (V == 2) {
			const float2 a = __half22float2(*(const __half2 *)(v_row + k));

			*(__half2 *)(o + k) = __floats2half2_rn(s * a.x, s * a.y);
		} else {
			o[k] = __float2half_rn(s * __half2float(v_row[k]));
		}
	}
}

/* See backend.h. gv must not overlap the inputs. */
extern "C" void sm70__cuda_ple_gate(struct sm70_backend *be, void *gv, const void *kn,
				    const void *qn, const void *v, int v_ld, int n, int streams,
				    int dim)
{
	struct sm70__cuda *c = sm70__cuda_enter(be);
	const uintptr_t align = (uintptr_t)gv | (uintptr_t)kn | (uintptr_t)qn | (uintptr_t)v;
	const long items = (long)n * streams;
	const unsigned blocks = (unsigned)((items + WARPS - 1) / WARPS);

	if (n <= 0 || streams <= 0 || dim <= 0)
		return;
	if (v_ld < dim || items > 0x7fffffffL) {
		sm70__cuda_fail(be, "ple_gate", __FILE__, __LINE__, "bad v_ld or n");
		return;
	}
	if (dim % 2 == 0 && v_ld % 2 == 0 && align % 4 == 0)
		gate_kernel<2><<<blocks, WARPS * 32, 0, c->stream>>>(
			(__half *)gv, (const __half *)kn, (const __half *)qn, (const __half *)v,
			v_ld, (int)items, streams, dim);
	else
		gate_kernel<1><<<blocks, WARPS * 32, 0, c->stream>>>(
			(__half *)gv, (const __half *)kn, (const __half *)qn, (const __half *)v,
			v_ld, (int)items, streams, dim);
	SM70_CUDA_LAUNCHED(be, "ple_gate gate_kernel");
}

/* ---- ple_conv -------------------------------------------------------------------------- */

struct conv_args {
	float *x;
	const __half *gv, *gvn;
	__half *state;
	const float *w;
	int C, K, dil, R; /* R = (K - 1) * dil: inputs a slot keeps */
	struct ple_batch b;
	const int32_t *chunk_first, *chunk_len;
	int n_decode; /* >= 0: blockIdx.x of conv_keep_kernel is a unit, not a token */
};

/* Token blockIdx.x over channels blockIdx.y * THREADS + threadIdx.x. */
static __global__ void conv_kernel(struct conv_args a)
{
	const int t = blockIdx.x, ch = blockIdx.y * THREADS + threadIdx.x;
	const int p = a.b.tok_pos[t];
	__shared__ int run, slot;
	float acc = 0.0f, xv;

	if (threadIdx.x < 32) {
		const int r = ple_run_back_warp(a.b, t, a.R);

		if (threadIdx.x == 0) {
			run = r;
			slot = ple_slot(a.b, t);
		}
	}
	__syncthreads();
	if (ch >= a.C || slot < 0)
		return;
	for (int j = 0; j < a.K; j++) {
		const int m = (a.K - 1 - j) * a.dil; /* tap j reads position p - m */
		float in;

		if (m <= run)
			in = __half2float(a.gvn[(size_t)(t - m) * a.C + ch]);
		else if (p - m < 0)
			continue; /* zeros before position 0 add nothing, as on the CPU */
		else
			in = __half2float(a.state[((size_t)slot * a.R + a.R - m + run) * a.C + ch]);
		acc = __fadd_rn(acc, __fmul_rn(a.w[(size_t)ch * a.K + j], in));
	}
	xv = __half2float(a.gv[(size_t)t * a.C + ch]) + acc / (1.0f + expf(-acc));
	a.x[(size_t)t * a.C + ch] = __fadd_rn(a.x[(size_t)t * a.C + ch], xv);
}

/* A run end over channels blockIdx.y * THREADS + threadIdx.x: its slot keeps the newest R
 * inputs. blockIdx.x is unit u (decode u, or chunk u - n_decode's last token) when
 * a.n_decode >= 0, else token t (and only run ends work). */
static __global__ void conv_keep_kernel(struct conv_args a)
{
	const int ch = blockIdx.y * THREADS + threadIdx.x;
	int t = blockIdx.x, run, slot, p;
	__half *st;

	if (a.n_decode >= 0 && t >= a.n_decode)
		t = a.chunk_first[t - a.n_decode] + a.chunk_len[t - a.n_decode] - 1;
	if (!ple_run_end(a.b, t))
		return;
	run = ple_run_back_warp(a.b, t, a.R - 1); /* every warp: no shared memory needed */
	slot = ple_slot(a.b, t);
	if (ch >= a.C || slot < 0)
		return;
	p = a.b.tok_pos[t];
	st = a.state + (size_t)slot * a.R * a.C + ch;
	/* row q is the input m = R - 1 - q positions before t; ascending q reads rows of the
	 * old state (q + run + 1) that are not yet written */
	for (int q = 0; q < a.R; q++) {
		const int m = a.R - 1 - q;
		__half v;

		if (m <= run)
			v = a.gvn[(size_t)(t - m) * a.C + ch];
		else if (p - m < 0)
			v = __float2half_rn(0.0f);
		else
			v = st[(size_t)(q + run + 1) * a.C];
		st[(size_t)q * a.C] = v;
	}
}

/* Whether the batch's host shape arrays cover its tokens in order (decodes, then chunks). */
static int conv_shaped(const struct sm70_batch *b)
{
	int covered = b->n_decode;

	if (b->n_decode < 0 || b->n_chunks < 0 ||
	    (b->n_chunks > 0 && (!b->chunk_first_host || !b->chunk_len_host || !b->chunk_first ||
				 !b->chunk_len)))
		return 0;
	for (int i = 0; i < b->n_chunks; i++) {
		if (b->chunk_first_host[i] != covered || b->chunk_len_host[i] < 1)
			return 0;
		covered += b->chunk_len_host[i];
	}
	return covered == b->n_tokens;
}

/* See backend.h. A token whose sequence has no valid slot is skipped (its row of x is
 * not changed). x must not overlap gv, gvn or the state. Sizes come from the batch's host
 * fields, so the op can be captured in a graph. */
extern "C" void sm70__cuda_ple_conv(struct sm70_backend *be, float *x, const void *gv,
				    const void *gvn, const struct sm70_dconv *dc,
				    const struct sm70_batch *b)
{
	struct sm70__cuda *c = sm70__cuda_enter(be);
	const unsigned by = (unsigned)((dc->channels + THREADS - 1) / THREADS);
	struct conv_args a;
	int units;

	if (b->n_tokens <= 0 || b->n_seqs <= 0 || dc->channels <= 0)
		return;
	if (!b->seq_state || dc->k < 1 || dc->dilation < 1 || by > 65535) {
		sm70__cuda_fail(be, "ple_conv", __FILE__, __LINE__, "bad convolution or batch");
		return;
	}
	a = (struct conv_args){ x, (const __half *)gv, (const __half *)gvn, (__half *)dc->state,
				dc->w, dc->channels, dc->k, dc->dilation,
				(dc->k - 1) * dc->dilation, ple_batch_of(b), b->chunk_first,
				b->chunk_len, -1 };
	conv_kernel<<<dim3((unsigned)b->n_tokens, by), THREADS, 0, c->stream>>>(a);
	SM70_CUDA_LAUNCHED(be, "ple_conv conv_kernel");
	if (a.R == 0)
		return;
	/* with the shape, one block row per decode and per chunk; else one per token */
	units = b->n_tokens;
	if (conv_shaped(b)) {
		a.n_decode = b->n_decode;
		units = b->n_decode + b->n_chunks;
	}
	conv_keep_kernel<<<dim3((unsigned)units, by), THREADS, 0, c->stream>>>(a);
	SM70_CUDA_LAUNCHED(be, "ple_conv conv_keep_kernel");
}
