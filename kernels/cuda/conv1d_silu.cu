/*
 * conv1d_silu.cu - the CUDA conv1d_silu op: the GDN layer's causal depthwise convolution
 * over the q | k | v channels, then SiLU, with the last conv_k - 1 inputs of each sequence
 * kept in its state slot (f16 here: the act dtype, so the slot holds exact copies of the
 * inputs and splitting a prompt over calls changes no bit).
 *
 * Decodes: one thread per (sequence, channel) reads the slot's saved inputs, the token's
 * input and the channel's conv_k weights, writes one output and shifts the slot.
 * Prefill chunks: one thread per (chunk, piece of SUB tokens, channel) walks its piece
 * with the window in registers. The piece's first conv_k - 1 inputs come from the rows
 * before it (x is read-only), or, for the first piece, from the slot (zeros when the
 * chunk starts at position 0). Only the first piece's thread touches the slot: it reads
 * it before it writes the newest conv_k - 1 inputs back, so pieces never race on it.
 * Consecutive threads take consecutive channels: every access is a coalesced row segment.
 * The sum over the taps is f32, oldest first, as in the CPU twin.
 *
 * A batch without the decode/chunk shape (b->n_decode + the chunk lengths do not cover
 * its tokens in order) runs one thread per channel over every token in batch order,
 * reading and writing the slot in memory: slow, but right for any order and for slots
 * that several sequences share. In the shaped path, sequences that share a slot (padding
 * rows on the scratch slot) race on it: their outputs are unspecified.
 *
 * Non-goals: a bias (qwen3_5's conv has none), other activations, dilation, conv_k > 8.
 */
#include <stdint.h>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/pdl.h"

#define THREADS 256
#define SUB 64 /* tokens per chunk piece; >= conv_k - 1 */

struct conv_args {
	__half *out;
	const __half *x;
	int ld;
	const float *w;
	__half *conv;
	int n_slots, conv_dim;
	const int32_t *tok_pos, *tok_seq, *seq_state;
	int n_seqs, n_tokens;
	const int32_t *chunk_first, *chunk_len;
};

/* The state slot of token t, or -1 when its sequence or slot is out of range. */
static __device__ __forceinline__ int conv_slot(const struct conv_args &a, int t)
{
	int s = a.tok_seq[t], slot;

	if (s < 0 || s >= a.n_seqs)
		return -1;
	slot = a.seq_state[s];
	return slot < 0 || slot > a.n_slots ? -1 : slot;
}

static __device__ __forceinline__ float conv_silu(float v)
{
	return v / (1.0f + expf(-v));
}

/*
 * blockIdx.y: the segment (decode token y, or chunk y when chunks is set); blockIdx.z: the
 * piece of SUB tokens within a chunk. Template K: the kernel width.
 */
template <int K>
static __global__ void conv_kernel(struct conv_args a, int chunks)
{
	sm70__pdl_enter();
	const int ch = blockIdx.x * THREADS + threadIdx.x;
	const int s0 = blockIdx.z * SUB;
	const int dim = a.conv_dim;
	int first = blockIdx.y, len = 1, n, slot;
	float win[K > 1 ? K - 1 : 1], w[K];
	__half *st;

	if (ch >= dim)
		return;
	if (chunks) {
		first = a.chunk_first[blockIdx.y];
		len = a.chunk_len[blockIdx.y];
	}
	if (s0 >= len)
		return;
	n = len - s0 < SUB ? len - s0 : SUB;
	slot = conv_slot(a, first);
	if (slot < 0)
		return;
	st = a.conv + (size_t)slot * (K - 1) * dim + ch;
	for (int j = 0; j < K; j++)
		w[j] = a.w[(size_t)ch * K + j];
	if (s0 == 0) {
		const bool fresh = a.tok_pos[first] == 0;

		for (int j = 0; j < K - 1; j++)
			win[j] = fresh ? 0.0f : __half2float(st[(size_t)j * dim]);
	} else {
		/* the K - 1 inputs before the piece: rows of this chunk (s0 >= SUB >= K - 1) */
		for (int j = 0; j < K - 1; j++)
			win[j] = __half2float(a.x[(size_t)(first + s0 - (K - 1) + j) * a.ld + ch]);
	}
	for (int i = 0; i < n; i++) {
		const int t = first + s0 + i;
		const float xv = __half2float(a.x[(size_t)t * a.ld + ch]);
		float acc = 0.0f;

		for (int j = 0; j < K - 1; j++)
			acc += w[j] * win[j];
		acc += w[K - 1] * xv;
		for (int j = 0; j + 1 < K - 1; j++)
			win[j] = win[j + 1];
		if (K > 1)
			win[K - 2] = xv;
		a.out[(size_t)t * dim + ch] = __float2half_rn(conv_silu(acc));
	}
	if (s0 != 0)
		return;
	/* the slot keeps the newest K - 1 inputs: the window when the piece was the whole
	 * chunk, else the chunk's last K - 1 rows */
	for (int j = 0; j < K - 1; j++) {
		float v = len <= SUB ? win[j] :
				       __half2float(a.x[(size_t)(first + len - (K - 1) + j) * a.ld + ch]);

		st[(size_t)j * dim] = __float2half_rn(v);
	}
}

/* Any batch: one thread per channel over every token in batch order, state in memory. */
template <int K>
static __global__ void conv_serial_kernel(struct conv_args a)
{
	const int ch = blockIdx.x * THREADS + threadIdx.x;
	const int dim = a.conv_dim;
	float w[K];

	if (ch >= dim)
		return;
	for (int j = 0; j < K; j++)
		w[j] = a.w[(size_t)ch * K + j];
	for (int t = 0; t < a.n_tokens; t++) {
		const int slot = conv_slot(a, t);
		const float xv = __half2float(a.x[(size_t)t * a.ld + ch]);
		__half *st;
		float acc = 0.0f;

		if (slot < 0)
			continue;
		st = a.conv + (size_t)slot * (K - 1) * dim + ch;
		if (a.tok_pos[t] == 0)
			for (int j = 0; j < K - 1; j++)
				st[(size_t)j * dim] = __float2half_rn(0.0f);
		for (int j = 0; j < K - 1; j++)
			acc += w[j] * __half2float(st[(size_t)j * dim]);
		acc += w[K - 1] * xv;
		for (int j = 0; j + 1 < K - 1; j++)
			st[(size_t)j * dim] = st[(size_t)(j + 1) * dim];
		if (K > 1)
			st[(size_t)(K - 2) * dim] = __float2half_rn(xv);
		a.out[(size_t)t * dim + ch] = __float2half_rn(conv_silu(acc));
	}
}

template <int K>
static void conv_launch(struct sm70__cuda *c, const struct conv_args &a, int n_decode,
			int n_chunks, int max_len, int shaped)
{
	const unsigned bx = (unsigned)((a.conv_dim + THREADS - 1) / THREADS);

	if (!shaped) {
		conv_serial_kernel<K><<<bx, THREADS, 0, c->stream>>>(a);
		SM70_CUDA_LAUNCHED(&c->be, "conv_serial_kernel");
		return;
	}
	if (n_decode > 0) {
		sm70__launch_pdl(c, SM70__PDL_CONV, conv_kernel<K>, dim3(bx, (unsigned)n_decode, 1),
				 dim3(THREADS), 0, a, 0);
		SM70_CUDA_LAUNCHED(&c->be, "conv_kernel (decodes)");
	}
	if (n_chunks > 0) {
		unsigned pieces = (unsigned)((max_len + SUB - 1) / SUB);

		sm70__launch_pdl(c, SM70__PDL_CONV, conv_kernel<K>,
				 dim3(bx, (unsigned)n_chunks, pieces), dim3(THREADS), 0, a, 1);
		SM70_CUDA_LAUNCHED(&c->be, "conv_kernel (chunks)");
	}
}

/*
 * See backend.h. Sizes come from the batch's host fields (n_tokens, n_decode, n_chunks,
 * chunk_first_host, chunk_len_host), so the op can be captured in a graph. conv_k must be
 * 1..8.
 */
extern "C" void sm70__cuda_conv1d_silu(struct sm70_backend *be, void *out, const void *x,
				       int ld, const float *w, const struct sm70_state_layer *st,
				       const struct sm70_state_layout *lay,
				       const struct sm70_batch *b)
{
	struct sm70__cuda *c = sm70__cuda_enter(be);
	struct conv_args a;
	int covered = b->n_decode, max_len = 0, shaped;

	if (b->n_tokens <= 0 || b->n_seqs <= 0)
		return;
	if (!b->seq_state || lay->conv_k < 1 || lay->conv_k > 8 || lay->conv_dim <= 0 ||
	    ld < lay->conv_dim || lay->n_slots < 0 || b->n_decode > 65535 ||
	    b->n_chunks > 65535) {
		sm70__cuda_fail(be, "conv1d_silu", __FILE__, __LINE__, "bad layout or batch");
		return;
	}
	shaped = b->n_decode >= 0 && b->n_chunks >= 0 &&
		 (b->n_chunks == 0 || (b->chunk_first_host && b->chunk_len_host));
	for (int i = 0; shaped && i < b->n_chunks; i++) {
		if (b->chunk_first_host[i] != covered || b->chunk_len_host[i] < 1)
			shaped = 0;
		else
			covered += b->chunk_len_host[i];
		if (shaped && b->chunk_len_host[i] > max_len)
			max_len = b->chunk_len_host[i];
	}
	if (covered != b->n_tokens)
		shaped = 0;
	a = (struct conv_args){ (__half *)out, (const __half *)x, ld, w, (__half *)st->conv,
				lay->n_slots, lay->conv_dim, b->tok_pos, b->tok_seq, b->seq_state,
				b->n_seqs, b->n_tokens, b->chunk_first, b->chunk_len };
	switch (lay->conv_k) {
	case 1: conv_launch<1>(c, a, b->n_decode, b->n_chunks, max_len, shaped); break;
	case 2: conv_launch<2>(c, a, b->n_decode, b->n_chunks, max_len, shaped); break;
	case 3: conv_launch<3>(c, a, b->n_decode, b->n_chunks, max_len, shaped); break;
	case 4: conv_launch<4>(c, a, b->n_decode, b->n_chunks, max_len, shaped); break;
	case 5: conv_launch<5>(c, a, b->n_decode, b->n_chunks, max_len, shaped); break;
	case 6: conv_launch<6>(c, a, b->n_decode, b->n_chunks, max_len, shaped); break;
	case 7: conv_launch<7>(c, a, b->n_decode, b->n_chunks, max_len, shaped); break;
	default: conv_launch<8>(c, a, b->n_decode, b->n_chunks, max_len, shaped); break;
	}
}
