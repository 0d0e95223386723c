/*
 * sampling.h - sampling parameters and results, shared by the host sampler
 * (daemon/engine/sampler.c) and backends that sample on the device.
 *
 * Semantics (both implementations): temperature, then top-k, then top-p over what top-k
 * kept, then an inverse-CDF draw over the renormalised remainder in the order "logit
 * descending, equal logits lowest id first", with u = sm70_sample_uniform(seed, n) for
 * the n-th generated token of a request. Temperature 0 is greedy (argmax, lowest id on
 * ties). Logprobs are those of the raw distribution (log_softmax of unscaled logits).
 */
#ifndef SM70_COMMON_SAMPLING_H
#define SM70_COMMON_SAMPLING_H

#include <stdint.h>
#include <string.h>

#define SM70_MAX_TOP_LOGPROBS 20

struct sm70_sampling {
	float temperature; /* 0: greedy */
	int top_k;         /* 0 or >= vocab: off */
	float top_p;       /* in (0, 1]; 1.0 is off */
	uint64_t seed;
	int top_logprobs;  /* 0..SM70_MAX_TOP_LOGPROBS alternatives to report */
};

struct sm70_sample_result {
	int32_t token;
	float logprob;     /* raw-distribution logprob of token */
	int n_top;
	int32_t top_ids[SM70_MAX_TOP_LOGPROBS];   /* descending logprob, ties lowest id first */
	float top_logprobs[SM70_MAX_TOP_LOGPROBS];
};

/*
 * What one tensor-parallel rank reports about its slice [id0, id0 + n) of a row of logits,
 * so that the ranks can sample together without gathering the row
 * (daemon/engine/sampler_tp.h merges them). Candidates are the slice's first n_cand
 * entries in sampling order (logit descending, equal logits lowest id first), ids global.
 */
#define SM70_SHARD_CANDS 256

struct sm70_shard_summary {
	float max;          /* largest logit of the slice */
	int32_t bad;        /* 1 when the slice holds a NaN or +inf (no distribution) */
	int32_t n_cand;     /* min(SM70_SHARD_CANDS, n) */
	int32_t reserved;
	double sum_raw;     /* sum over the slice of exp(l - max) */
	double sum_temp;    /* sum of exp((l - max) / T), T the row's temperature; 0 if T is 0 */
	int32_t ids[SM70_SHARD_CANDS];
	float logits[SM70_SHARD_CANDS];
};

/*
 * Maps a non-NaN float to a uint32 with the same order, so that sampling order is "key
 * descending, equal keys lowest id first". -0 is folded onto +0 so that equal logits get
 * equal keys and fall back to the id order, as float comparison would.
 */
static inline uint32_t sm70_order_key(float f)
{
	uint32_t u;

	memcpy(&u, &f, sizeof(u));
	if (u == 0x80000000u)
		u = 0;
	return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* The uniform draw in [0, 1) for the n-th token of a request seeded with seed:
 * u = top 53 bits of mix64(mix64(seed + G) + (n + 1) * G) / 2^53, G = 0x9e3779b97f4a7c15,
 * mix64 the splitmix64 finaliser, arithmetic mod 2^64. Device samplers compute exactly
 * this. Defined in daemon/engine/sampler.c. */
double sm70_sample_uniform(uint64_t seed, uint64_t n);

#endif
