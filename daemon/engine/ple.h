/*
 * ple.h - qwen4_exp's per-layer n-gram embeddings, host side: the hash parameters
 * transformers derives from the config (multipliers from splitmix64, a distinct prime
 * vocabulary per head) and the n-gram tables, which live in one page-locked host
 * allocation the model owns and every rank's backend reads (docs/QWEN4_EXP.md).
 */
#ifndef SM70_ENGINE_PLE_H
#define SM70_ENGINE_PLE_H

#include <stddef.h>
#include <stdint.h>

#include "common/dtype.h"
#include "common/err.h"
#include "daemon/engine/model_config.h"

#define SM70_PLE_MAX_NGRAM 16

/* The hash of the PLE layer with index li (its place in ple_layer_ids). */
struct sm70_ple_params {
	int n_heads;                       /* (ngram - 1) * heads_per_ngram */
	uint64_t mult[SM70_PLE_MAX_NGRAM]; /* [ngram] odd multipliers */
	uint64_t *size;                    /* [n_heads] each head's (prime) vocabulary */
	uint64_t *offset;                  /* [n_heads] its first row in the table */
	uint64_t rows;                     /* the table's rows: the sum, padded */
};

/* Fills *p for PLE layer li of config c (size and offset are malloc'd: free with
 * sm70__ple_params_free). Returns 0 or -ENOMEM / -EINVAL. */
int sm70__ple_params(const struct sm70_model_config *c, int li, struct sm70_ple_params *p,
		     struct sm70_err *err);
void sm70__ple_params_free(struct sm70_ple_params *p);

/*
 * Page-locked host memory of `bytes` for n-gram tables: mapped, then locked with mlock.
 * When the lock fails the error names RLIMIT_MEMLOCK's value and the packaged unit's
 * setting (LimitMEMLOCK=). Returns the memory or NULL with err set.
 */
void *sm70__pinned_alloc(size_t bytes, struct sm70_err *err);
void sm70__pinned_free(void *p, size_t bytes);

/* Fills n elements of dtype dt (f32, f16 or bf16) with deterministic values in
 * +-scale, a function of (seed, index), on all cores (dummy weights for tables of many
 * GiB). */
void sm70__ple_dummy_fill(void *dst, enum sm70_dtype dt, size_t n, uint64_t seed,
			  float scale);

#endif
