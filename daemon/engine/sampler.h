/*
 * sampler.h - turns one row of f32 logits into the next token, on the host.
 *
 * Order of operations (the one transformers uses): temperature, then top-k, then top-p
 * over what top-k kept; draw from the renormalised remainder. Temperature 0 is greedy
 * (argmax, ties to the lowest id, as torch.argmax). Sampling is reproducible: the draw
 * for the n-th generated token of a request depends only on (seed, n), never on batch
 * composition or thread timing.
 *
 * Log-probabilities are always those of the model's raw distribution (log_softmax of the
 * unscaled logits), whatever the sampling settings, so they compare across settings.
 *
 * Non-goals: repetition/presence penalties, min-p, beam search. Not thread-safe per
 * sampler: one sampler per thread (it owns scratch sized to the vocabulary).
 */
#ifndef SM70_ENGINE_SAMPLER_H
#define SM70_ENGINE_SAMPLER_H

#include <stdint.h>

#include "common/sampling.h"

struct sm70_sampler;

/* Scratch for a vocabulary of `vocab` entries. Returns 0 or -ENOMEM / -EINVAL. */
int sm70_sampler_create(struct sm70_sampler **out, int vocab);
void sm70_sampler_destroy(struct sm70_sampler *s);

/* Validates p: returns 0 or -EINVAL (temperature < 0 or not finite, top_k < 0, top_p not
 * in (0, 1], top_logprobs out of range). */
int sm70_sampling_check(const struct sm70_sampling *p);

/* Samples from logits[0..vocab) for the n-th (0-based) generated token of a request.
 * Returns 0, or -EINVAL for bad params. */
int sm70_sample(struct sm70_sampler *s, const float *logits, const struct sm70_sampling *p,
		uint64_t n, struct sm70_sample_result *r);


#endif
