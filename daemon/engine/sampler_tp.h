/*
 * sampler_tp.h - sampling a row whose vocabulary is split across tensor-parallel ranks,
 * from each rank's summary of its slice (struct sm70_shard_summary), without the row.
 *
 * The result is the one sm70_sample() gives on the whole row (sampler.h: same order of
 * operations, same draw), up to the order in which double sums are added. Each rank sends
 * its slice's top SM70_SHARD_CANDS entries; the merged list is exact up to the first
 * point where a rank's unsent entries could come next, which always covers top-k up to
 * SM70_SHARD_CANDS and the top logprobs. Top-p alone and plain sampling are decided from
 * the list when their cut and draw fall inside that exact prefix (typical of trained
 * models); otherwise the caller gathers the row and samples it whole.
 *
 * Non-goals: anything the host sampler does not do.
 */
#ifndef SM70_ENGINE_SAMPLER_TP_H
#define SM70_ENGINE_SAMPLER_TP_H

#include <stdint.h>

#include "common/sampling.h"

/*
 * Samples the n-th generated token of a request from the summaries of a row's slices,
 * sh[0..n_ranks) in ascending id order, vocab entries in all. Returns 0; -EINVAL when p is
 * invalid or the row has no distribution (NaN, +inf, all -inf); -ERANGE when the
 * candidates cannot decide: sample the whole row instead.
 */
int sm70_sample_shards(const struct sm70_shard_summary *const sh[], int n_ranks, int vocab,
		       const struct sm70_sampling *p, uint64_t n, struct sm70_sample_result *r);

#endif
