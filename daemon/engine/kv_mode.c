/*
 * kv_mode.c - the KV cache modes by name (engine.h): the words the configuration, sm70-run
 * and sm70-bench take, and the K/V dtype pair each stands for.
 *
 * "fp8" keeps V in f16: rounding V through E4M3 is what cost the both-FP8 cache its
 * accuracy against FP16 KV (docs/PERFORMANCE.md, "FP8 KV accuracy: where the error comes
 * from"), while K in E4M3 alone stays at the FP16 cache's logits. "fp8-all" is the
 * smaller and (on CUDA today) the faster cache, for who wants that more.
 */
#include "daemon/engine/engine.h"

#include <errno.h>
#include <string.h>

static const struct {
	const char *word;
	enum sm70_dtype k;
	enum sm70_dtype v; /* SM70_DTYPE_COUNT: like K */
} kv_modes[] = {
	{ "auto", SM70_DTYPE_COUNT, SM70_DTYPE_COUNT },
	{ "f32", SM70_DTYPE_F32, SM70_DTYPE_COUNT },
	{ "f16", SM70_DTYPE_F16, SM70_DTYPE_COUNT },
	{ "fp8", SM70_DTYPE_F8E4M3, SM70_DTYPE_F16 },
	{ "fp8-all", SM70_DTYPE_F8E4M3, SM70_DTYPE_COUNT },
};

#define N_MODES (sizeof(kv_modes) / sizeof(kv_modes[0]))

int sm70_engine_opts_kv_mode(struct sm70_engine_opts *o, const char *word)
{
	for (size_t i = 0; word && i < N_MODES; i++) {
		if (strcmp(word, kv_modes[i].word) == 0) {
			o->kv_dtype = kv_modes[i].k;
			o->kv_v_dtype = kv_modes[i].v;
			return 0;
		}
	}
	return -EINVAL;
}

const char *sm70_kv_mode_name(enum sm70_dtype k, enum sm70_dtype v)
{
	if (v == k)
		v = SM70_DTYPE_COUNT;
	for (size_t i = 0; i < N_MODES; i++)
		if (kv_modes[i].k == k && kv_modes[i].v == v)
			return kv_modes[i].word;
	return NULL;
}
