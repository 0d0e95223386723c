/*
 * kv_write.c - the CPU kv_write op: new K and V rows into their paged-cache slots.
 *
 * The CPU cache holds f32, f16 (rounded to nearest even) or FP8-E4M3 (the value divided
 * by the layer's scale, saturating at +-448), the same encodings the CUDA backend uses,
 * so a cache written by one can be checked against the other. K and V each take their
 * own dtype (the layout's dtype and sm70_kv_v_dtype).
 *
 * Non-goals: per-head or per-token scales.
 */
#include "kernels/cpu/cpu_ops.h"

struct kv_job {
	const struct sm70_kv_layer *kv;
	const struct sm70_kv_layout *lay;
	const float *k;
	const float *v;
	int ld;
	const int32_t *slots;
};

/* Stores n values of src into the cache at dst (element index) in the layout's dtype. */
static void kv_store(void *cache, size_t dst, const float *restrict src, size_t n,
		     enum sm70_dtype t, float scale)
{
	switch (t) {
	case SM70_DTYPE_F16: {
		uint16_t *restrict d = (uint16_t *)cache + dst;

		for (size_t i = 0; i < n; i++)
			d[i] = sm70_f32_to_f16(src[i]);
		break;
	}
	case SM70_DTYPE_F8E4M3: {
		uint8_t *restrict d = (uint8_t *)cache + dst;

		for (size_t i = 0; i < n; i++)
			d[i] = sm70_f32_to_e4m3(src[i] / scale);
		break;
	}
	default:
		memcpy((float *)cache + dst, src, n * sizeof(float));
		break;
	}
}

static void kv_rows(void *ctx, int begin, int end, int thread)
{
	const struct kv_job *j = ctx;
	const struct sm70_kv_layout *lay = j->lay;
	const size_t row = (size_t)lay->n_kv_heads * (size_t)lay->head_dim;
	const long n_slots = (long)lay->n_blocks * lay->block_size;

	for (int i = begin; i < end; i++) {
		int32_t slot = j->slots[i];

		/* A negative slot marks a padding row (nothing to keep); one past the cache
		 * is a caller bug that must not become a wild write. */
		if (slot < 0 || slot >= n_slots)
			continue;
		kv_store(j->kv->k, (size_t)slot * row, j->k + (size_t)i * (size_t)j->ld, row,
			 lay->dtype, j->kv->k_scale);
		kv_store(j->kv->v, (size_t)slot * row, j->v + (size_t)i * (size_t)j->ld, row,
			 sm70_kv_v_dtype(lay), j->kv->v_scale);
	}
}

/* See backend.h. K and V dtypes f32, f16 or f8e4m3, each; rows whose slot is negative or beyond
 * the cache are skipped. */
void sm70__cpu_kv_write(struct sm70_backend *be, const struct sm70_kv_layer *kv,
			const struct sm70_kv_layout *lay, const void *k, const void *v, int ld,
			const int32_t *slots, int n)
{
	struct kv_job j = { kv, lay, k, v, ld, slots };
	size_t per_row = (size_t)lay->n_kv_heads * (size_t)lay->head_dim * 8;

	sm70__pool_run(sm70__cpu_of(be)->pool, n, sm70__cpu_grain(per_row), kv_rows, &j);
}
