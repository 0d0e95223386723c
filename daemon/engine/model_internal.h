/*
 * model_internal.h - what model.c (load, free, eager steps), graphs.c (captured decode
 * steps) and the layer library share. Not for the engine: it sees model.h only.
 */
#ifndef SM70_ENGINE_MODEL_INTERNAL_H
#define SM70_ENGINE_MODEL_INTERNAL_H

#include "daemon/engine/model.h"

/* Offsets (in int32 elements) of the arrays inside the uploaded batch buffer. */
struct sm70__batch_offsets {
	size_t ids, pos, seq, slot, tables, out, chunk_first, chunk_len, state, total;
};

struct sm70__batch_offsets sm70__batch_layout(const struct sm70_model *m);
int sm70__max_blocks_per_seq(const struct sm70_model *m);

/* 0 when st fits the sizes given at load, else -EINVAL. */
int sm70__check_step(const struct sm70_model *m, const struct sm70_step *st);

/* Waits for every rank; returns the first error. */
int sm70__sync_all(struct sm70_model *m);

/* Queues the sampling work of n rows after the forward on every rank (the device sampler
 * with one rank, the slice summaries with several), and downloads its results. */
void sm70__queue_sampling(struct sm70_model *m, int n);
int sm70__fetch_sampling(struct sm70_model *m, int n, void *out);

/* graphs.c: the padded batch a decode-only step replays (0: none), and the replay itself
 * (-EAGAIN when this step cannot be replayed: run it eagerly). */
int sm70__graph_batch(const struct sm70_model *m, const struct sm70_step *st);
int sm70__forward_graph(struct sm70_model *m, const struct sm70_step *st, int B,
			const struct sm70_sample_row *rows, void *out);

#endif
