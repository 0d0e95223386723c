/*
 * engine.h - continuous-batching decode over one model: requests in, token events out.
 *
 * Each sm70_engine_step() admits waiting requests whose KV blocks fit, builds one batch
 * of every running decode plus prefill chunks up to the token budget, runs the model,
 * samples, and reports one event per sequence that produced a token. A request finishes
 * on EOS, a stop token, max_new_tokens, the context limit, or cancellation. When the KV
 * pool runs dry mid-decode the newest running request is preempted: its blocks are freed
 * and it is recomputed later from its prompt plus what it already generated (sampling
 * is counter-based, so it continues exactly where it stopped). No request is dropped.
 *
 * Prefix caching (on unless no_prefix_cache, or the architecture keeps state a cached
 * prefix cannot restore): full KV blocks are published under a keyed hash of the whole
 * prefix they complete and the request's cache_domain; an admitted request takes the
 * blocks of its longest cached prefix in its own domain, each compared token for token,
 * and computes only the rest (see block_pool.h). Requests in different domains never
 * share a block, so neither a hit (cached_tokens) nor its speed tells one domain what
 * another asked.
 *
 * Models with recurrent layers (Gated DeltaNet) also give each running sequence a state
 * slot: admission needs a free slot as well as KV blocks, and preemption or finishing
 * returns it (a readmitted sequence recomputes from position 0, which resets its state).
 *
 * Non-goals here: priorities and fairness between clients (the daemon's scheduler).
 * Not thread-safe: one thread drives an engine.
 */
#ifndef SM70_ENGINE_ENGINE_H
#define SM70_ENGINE_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "common/dtype.h"
#include "common/err.h"
#include "daemon/engine/model_config.h"
#include "daemon/engine/sampler.h"

#define SM70_MAX_STOP_TOKENS 8

enum sm70_finish {
	SM70_FINISH_NONE = 0,
	SM70_FINISH_LENGTH,    /* max_new_tokens or the context limit */
	SM70_FINISH_STOP,      /* EOS or a stop token */
	SM70_FINISH_CANCELLED,
	SM70_FINISH_ERROR,
	/* the sequence outgrew the whole KV cache: nothing is reserved for max_new_tokens at
	 * admission, so one that does not stop in time ends here with the tokens that fit */
	SM70_FINISH_NO_MEMORY,
};

/*
 * How far sm70_engine_open has got, for another thread to watch while it runs. The fields
 * are plain integers accessed with the __atomic builtins (relaxed): the loading thread
 * writes done and total, the watcher reads them and may set cancel.
 */
struct sm70_load_progress {
	uint64_t done;  /* bytes of weights placed on the backends so far (every rank's) */
	uint64_t total; /* what the whole load places, 0 until known; an estimate for dummy
			 * weights (a dense model of config.json's sizes): done may pass it */
	int cancel;     /* set by the watcher: the load stops at the next weight and
			 * sm70_engine_open returns -ECANCELED */
	int reserved;
};

struct sm70_engine_opts {
	const char *backend;      /* "cpu", "cuda", or "null" (a transport test double) */
	int dummy_weights;        /* --load-format dummy */
	uint64_t dummy_seed;
	int n_threads;            /* CPU backend workers; 0: all cores */
	int tp;                   /* tensor-parallel ranks, 1..SM70_MAX_TP (default 1) */
	int gpus[4];              /* CUDA device of each rank (default 0, 1, ...) */
	int n_gpus;               /* entries of gpus given; 0: the default */
	int max_seqs;             /* running sequences at once (default 16) */
	int max_batch_tokens;     /* tokens per step: decodes + prefill chunks (default 512) */
	int block_size;           /* KV tokens per block (default 16) */
	int kv_blocks;            /* 0: from kv_bytes */
	size_t kv_bytes;          /* KV budget when kv_blocks is 0 (default 256 MiB) */
	enum sm70_dtype kv_dtype; /* K's (and V's); SM70_DTYPE_COUNT: the backend's default */
	enum sm70_dtype kv_v_dtype; /* V's when it differs; SM70_DTYPE_COUNT: like K */
	int no_prefix_cache;      /* turn prefix caching off */
	int state_slots;          /* recurrent-state slots; 0: max_seqs (recurrent models) */
	int gdn_recurrent;        /* DeltaNet prefill by the recurrence, not the chunked form */
	/* a sequence's tokens and logprobs bitwise the same whatever shares its steps: one
	 * kernel and reduction order for every batch size (docs/ENGINE.md, "Batch
	 * invariance"); slower. Default from SM70_BATCH_INVARIANT=1. */
	int batch_invariant;
	struct sm70_load_progress *progress; /* NULL, or filled while sm70_engine_open runs */
};

struct sm70_request {
	const int32_t *prompt;    /* copied at submit */
	int n_prompt;
	int max_new_tokens;
	struct sm70_sampling sampling;
	int n_stop;
	int32_t stop_ids[SM70_MAX_STOP_TOKENS];
	int ignore_eos;
	uint64_t tag;             /* returned in every event */
	int front;                /* queue at the head of the waiting queue, not the tail (a
				   * scheduler's fair admission: next to be admitted) */
	/* Benchmarks only (the daemon never sets it): take all but the last prompt token as
	 * already in the KV cache, whatever the cache holds, so decode at a long context can
	 * be timed without paying for its prefill. */
	int bench_skip_prefill;
	/* The prefix-cache isolation domain: only requests with the same value share cached
	 * blocks. Opaque to the engine; the daemon sets it from the client's uid or gid
	 * (engine.prefix_cache_scope), sm70-run and tests leave 0. */
	uint64_t cache_domain;
};

struct sm70_event {
	uint64_t id;
	uint64_t tag;
	struct sm70_sample_result sample;
	enum sm70_finish finish;  /* NONE unless this is the request's last event */
	int prompt_tokens;
	int completion_tokens;
	int cached_tokens;        /* prompt tokens whose KV came from the prefix cache */
	/* FINISH_ERROR: why, in a sentence (the engine step, the sequence, what the logits
	 * held), valid during the callback; NULL otherwise */
	const char *message;
};

typedef void (*sm70_event_fn)(void *ctx, const struct sm70_event *ev);

struct sm70_engine_stats {
	int running;
	int waiting;
	int parked;
	int kv_blocks_total;
	int kv_blocks_free;
	uint64_t preemptions;
	uint64_t parks;           /* sm70_engine_park calls (a running one also preempts) */
	uint64_t steps;
	uint64_t prompt_tokens;
	uint64_t generated_tokens;
	uint64_t errors;          /* requests ended by non-finite logits */
	uint64_t computed_tokens; /* tokens run through the model */
	/* The prefix cache, counted at each admission while it is on (a preempted request
	 * readmitted is looked up, and counts, again): lookups, the tokens they looked up
	 * (prompt plus any tokens generated before a preemption), lookups that found at least
	 * one block, the blocks found and their tokens. */
	uint64_t prefix_queries;
	uint64_t prefix_query_tokens;
	uint64_t prefix_hits;
	uint64_t prefix_hit_blocks;
	uint64_t prefix_hit_tokens; /* tokens whose KV the prefix cache supplied */
	uint64_t prefix_evictions;
	uint64_t prefix_key_mismatches; /* keys found whose block held other tokens (a hash
					 * collision: expected never; each was a miss) */
	uint64_t weight_bytes;    /* bytes of weights one decode step reads, experts aside */
	uint64_t expert_bytes;    /* bytes of the MoE experts a recent step read (their routing;
				   * refreshed every 16th step and when the step size changes);
				   * kept by the step, so reading the stats never syncs a device */
	uint64_t clamped_weights; /* weights clamped to the f16 range when loaded */
	uint64_t graph_replays;   /* decode steps replayed as captured graphs */
	uint64_t graph_captures;
	uint64_t shard_fallbacks; /* sharded rows sampled from the gathered row (sampler_tp.h) */
	/* Wall time of the steps that ran the model, and the part of it spent inside the
	 * model's forward call (queueing the step, then waiting for its tokens or logits):
	 * the rest is host work the device waits for (batch building, sampling on the host,
	 * events), the cost an overlapped next step would hide. */
	uint64_t step_ns;
	uint64_t forward_ns;
	int tp;
	uint64_t kv_bytes;        /* the KV cache, over all ranks */
	int state_slots_total;    /* recurrent-state slots (0: the model has no recurrent layers) */
	int state_slots_free;
	uint64_t state_bytes;     /* the recurrent state memory, over all ranks */
	uint64_t pinned_bytes;    /* page-locked host memory of the model (n-gram tables) */
	const char *prefix_cache_off; /* why prefix caching is off (static text), or NULL */
};

struct sm70_engine;

/* Fills opts with the defaults (SM70_GDN=reference in the environment sets gdn_recurrent,
 * SM70_BATCH_INVARIANT=1 batch_invariant). */
void sm70_engine_opts_default(struct sm70_engine_opts *o);

/*
 * The KV cache modes by the words engine.kv_dtype, sm70-run and sm70-bench take (kv_mode.c):
 * "auto" the backend's default; "f32", "f16" K and V in that dtype; "fp8" K in FP8-E4M3
 * and V in f16 (the accurate one: E4M3's rounding of V is what costs accuracy); "fp8-all"
 * K and V in FP8-E4M3 (the smallest). sm70_engine_opts_kv_mode sets o->kv_dtype and
 * o->kv_v_dtype from word: 0, or -EINVAL for another word (o unchanged).
 * sm70_kv_mode_name is the word of a K/V pair (v SM70_DTYPE_COUNT: like K), or NULL.
 * SM70_KV_MODE_WORDS lists the words for messages.
 */
#define SM70_KV_MODE_WORDS "auto, f32, f16, fp8 (K FP8-E4M3, V f16) or fp8-all"
int sm70_engine_opts_kv_mode(struct sm70_engine_opts *o, const char *word);
const char *sm70_kv_mode_name(enum sm70_dtype k, enum sm70_dtype v);

/* Loads the model in model_dir onto the chosen backend. Returns 0 or -errno with err
 * naming the problem (bad checkpoint, no GPU, ...). */
int sm70_engine_open(struct sm70_engine **out, const char *model_dir,
		     const struct sm70_engine_opts *opts, struct sm70_err *err);
void sm70_engine_close(struct sm70_engine *e);

/*
 * Checks that model_dir would load with opts, without loading it: opens the backends
 * (and their communicator) and the checkpoint (config.json through the architecture
 * registry, every weight file's header, the index), then runs the architecture's loader
 * in its check-only mode: every tensor it needs looked up, with the shape and dtype it
 * needs, and every other rule of the load, but no weight data read and nothing
 * allocated on the backends. So a directory that would fail sm70_engine_open fails here
 * with the same error (except for what only the data shows: non-finite weights, NaN
 * block scales, and running out of device memory). summary (may be NULL with size 0)
 * receives "qwen3, 28 layers, 4 weight files". Returns 0 or -errno with err set.
 */
int sm70_engine_check(const char *model_dir, const struct sm70_engine_opts *opts,
		      char *summary, size_t summary_size, struct sm70_err *err);

const struct sm70_model_config *sm70_engine_model_config(const struct sm70_engine *e);

/* Queues a request. Returns 0 and its id, or -EINVAL (bad params: err says which),
 * -E2BIG (prompt longer than the context or the KV cache can ever hold). */
int sm70_engine_submit(struct sm70_engine *e, const struct sm70_request *r, uint64_t *id,
		       struct sm70_err *err);

/* Cancels a request (running, waiting or parked); its final event (CANCELLED) comes from
 * the next step. Returns 0 or -ENOENT. */
int sm70_engine_cancel(struct sm70_engine *e, uint64_t id);

/*
 * Parking: a caller's way to pause a request for others. sm70_engine_park takes a running
 * or waiting request out of scheduling: a running one is preempted (its KV blocks and
 * state slot freed; its tokens kept, so it is recomputed when admitted again and goes on
 * with the tokens it would have produced anyway). sm70_engine_unpark queues it again, at
 * the head of the waiting queue (front) or the tail. A parked request emits nothing, counts
 * in neither running nor waiting, and keeps sm70_engine_busy false on its own. Both return
 * 0 or -ENOENT (not there, or already parked / not parked).
 */
int sm70_engine_park(struct sm70_engine *e, uint64_t id);
int sm70_engine_unpark(struct sm70_engine *e, uint64_t id, int front);

/* 1 if the request is running (admitted, holding its KV blocks), else 0. */
int sm70_engine_is_running(const struct sm70_engine *e, uint64_t id);

/* Runs one step, calling fn for each event. Returns the number of events, 0 when there
 * was nothing to do, or -errno on a backend failure. */
int sm70_engine_step(struct sm70_engine *e, sm70_event_fn fn, void *ctx);

/* Whether any request is waiting or running. */
int sm70_engine_busy(const struct sm70_engine *e);

/* Fills s from counters the engine keeps on the host: no device call, no synchronisation
 * (a status or metrics read costs microseconds whatever the backend is doing). */
void sm70_engine_get_stats(const struct sm70_engine *e, struct sm70_engine_stats *s);

#endif
