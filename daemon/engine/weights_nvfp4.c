/*
 * weights_nvfp4.c - NVFP4 matrices from a checkpoint (ModelOpt's or compressed-tensors'
 * layout, docs/NVFP4.md) or made up for --load-format dummy, stacked from parts the way
 * sm70__weight_load stacks float ones, and handed to the backend's prepare_weight.
 *
 * A part is a band of rows of one quantized tensor cut to the weight's column band: row
 * slices of its codes [N, K/2] and block scales [N, K/16], columns that must start and end
 * on a block of 16 elements (a tensor-parallel split of the reduction dimension that cuts
 * a block is refused, not requantized). Each part keeps its own scale2: when the parts'
 * differ (q | k | v, gate | up, quantized one by one) every row carries its part's in
 * row_scale2, so the stack decodes to exactly the checkpoint's values. Each field is
 * checked before it is used, and a refusal names the tensor and the file.
 *
 * MoE experts come as one host stack per layer and matrix (gate_up, down) in ModelOpt's
 * layout per expert, cut from the fused tensors (mlp.experts.gate_up_proj [E, 2I, H] and
 * down_proj [E, H, I], one scale2 per expert) or from one tensor set per expert (gate and
 * up keep their own scale2), every row's scale2 in row_scale2, for prepare_experts.
 *
 * Dummy NVFP4 bytes are made on threads (rows of a matrix, experts of a stack): the
 * experts of a 512-expert, 40-layer model at hidden 2048 are 3.6e10 of them.
 *
 * Non-goals: requantizing, other 4-bit formats, activation scales (W4A16), stacks that
 * mix NVFP4 and float expert matrices (moe_experts takes one kind).
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/nvfp4.h"
#include "daemon/engine/model.h"

#define NAME_LEN 256
#define MODULE_LEN (NAME_LEN - 32) /* room for the longest suffix */

/* The dummy block scales: E4M3 bytes 0x70 .. 0x7e, the values 128 .. 448 (0x7f is NaN). */
#define DUMMY_SCALE_FIRST 0x70
#define DUMMY_SCALE_COUNT 15
#define DUMMY_SCALE_SEED 0x5ca1e5ca1e5ca1e5ull
#define GOLDEN 0x9e3779b97f4a7c15ull

/* A quantized part's tensors and its scale2 (ModelOpt's weight_scale_2). */
struct nvfp4_src {
	const struct sm70_st_tensor *codes, *scales;
	float scale2;
};

/* The module of a ".weight" tensor name into buf; 0 when name is not one. */
static int module_of(char *buf, size_t size, const char *name)
{
	size_t n = strlen(name), stem = n - strlen(".weight");

	if (n <= strlen(".weight") || strcmp(name + stem, ".weight") || stem >= size)
		return 0;
	memcpy(buf, name, stem);
	buf[stem] = '\0';
	return 1;
}

/* "<base><sep><suffix>", or NULL when there is no such tensor. */
static const struct sm70_st_tensor *find2(const struct sm70_ckpt *ck, const char *base,
					  const char *sep, const char *suffix)
{
	char n[NAME_LEN];

	snprintf(n, sizeof(n), "%s%s%s", base, sep, suffix);
	return sm70_ckpt_find(ck, n);
}

/* 1 when the checkpoint stores the weight `name` of module as NVFP4 in format f: its
 * block scales are there, or its codes (u8 under the weight's own name in ModelOpt's
 * layout, weight_packed in compressed-tensors'). */
static int stored_nvfp4(const struct sm70_ckpt *ck, enum sm70_quant_format f,
			const char *name, const char *module)
{
	const struct sm70_st_tensor *t = sm70_ckpt_find(ck, name);

	if (find2(ck, module, ".", "weight_scale"))
		return 1;
	if (f == SM70_QUANT_CT_NVFP4)
		return find2(ck, module, ".", "weight_packed") != NULL;
	return t && t->dtype == SM70_DTYPE_U8;
}

/* 1 when the checkpoint stores the fused expert parameter `name` (mlp.experts.gate_up_proj
 * or down_proj) as NVFP4 in format f: its block scales, or its codes (u8 under its own
 * name in ModelOpt's layout, name_weight_packed in compressed-tensors'). */
static int stored_fused_nvfp4(const struct sm70_ckpt *ck, enum sm70_quant_format f,
			      const char *name)
{
	const struct sm70_st_tensor *t = sm70_ckpt_find(ck, name);

	if (find2(ck, name, "_", "weight_scale"))
		return 1;
	if (f == SM70_QUANT_CT_NVFP4)
		return find2(ck, name, "_", "weight_packed") != NULL;
	return t && t->dtype == SM70_DTYPE_U8;
}

/* Whether the weight `name` of module mod (a fused expert parameter: name itself) is
 * stored as NVFP4 in format f. */
static int stored_as(const struct sm70_ckpt *ck, enum sm70_quant_format f, const char *name,
		     const char *mod, int fused)
{
	return fused ? stored_fused_nvfp4(ck, f, name) : stored_nvfp4(ck, f, name, mod);
}

/* 1 when the weight `name` (module mod, rows of cols elements) is NVFP4, 0 when it is
 * float, -EINVAL when the checkpoint contradicts its quantization config (or holds NVFP4
 * tensors without one). fused: a fused expert parameter, its own module. */
static int module_kind(const struct sm70_model *m, const struct sm70_ckpt *ck,
		       const char *name, const char *mod, int fused, int cols,
		       struct sm70_err *err)
{
	if (m->opts.dummy)
		return sm70_quant_module_quantized(&m->quant, mod, cols);
	if (m->quant.format == SM70_QUANT_NONE) {
		if (stored_as(ck, SM70_QUANT_MODELOPT_NVFP4, name, mod, fused) ||
		    stored_as(ck, SM70_QUANT_CT_NVFP4, name, mod, fused))
			return sm70_errf(err, -EINVAL, "%s is stored as NVFP4 in %s, but the "
					 "checkpoint declares no quantization (no "
					 "quantization_config in config.json, no "
					 "hf_quant_config.json)", name, sm70_ckpt_dir(ck));
		return 0;
	}
	if (!stored_as(ck, m->quant.format, name, mod, fused))
		return 0;
	if (sm70_quant_ignored(&m->quant, mod))
		return sm70_errf(err, -EINVAL, "%s is stored as NVFP4 in %s, but the quantization "
				 "config lists %s as not quantized", name, sm70_ckpt_dir(ck), mod);
	return 1;
}

/* module_kind of part p of a weight of full_cols columns; 0 for a name not "*.weight". */
static int part_kind(const struct sm70_model *m, const struct sm70_ckpt *ck,
		     const struct sm70_weight_part *p, int full_cols, struct sm70_err *err)
{
	char mod[MODULE_LEN];

	if (!module_of(mod, sizeof(mod), p->name))
		return 0;
	return module_kind(m, ck, p->name, mod, 0, full_cols, err);
}

int sm70__nvfp4_parts(const struct sm70_model *m, const struct sm70_ckpt *ck,
		      const struct sm70_weight_part *parts, int n, int full_cols,
		      struct sm70_err *err)
{
	int first = part_kind(m, ck, &parts[0], full_cols, err);

	for (int i = 1; i < n && first >= 0; i++) {
		int k = part_kind(m, ck, &parts[i], full_cols, err);

		if (k < 0)
			return k;
		if (k != first)
			return sm70_errf(err, -EINVAL, "%s stacks %s (%s) with %s (%s) in one matrix: "
					 "all its parts must be stored alike, all NVFP4 or all "
					 "float", sm70_ckpt_dir(ck), parts[0].name,
					 first ? "NVFP4" : "float", parts[i].name,
					 k ? "NVFP4" : "float");
	}
	return first;
}

/* Looks up tensor `name`, which must be dtype dt and of shape want[ndim]; `what` says what
 * it holds for the NVFP4 `weight` (a matrix or an expert stack) of shape logical. */
static int get_tensor(const struct sm70_ckpt *ck, const char *name, enum sm70_dtype dt,
		      int ndim, const int64_t *want, const int64_t *logical, const char *what,
		      const char *weight, const struct sm70_st_tensor **out, struct sm70_err *err)
{
	const struct sm70_st_tensor *t = sm70_ckpt_find(ck, name);
	char have[160], shape[160], need[160];
	int same = t && t->ndim == ndim;

	if (!t)
		return sm70_errf(err, -ENOENT, "missing tensor %s in %s: the NVFP4 weight %s needs "
				 "its %s", name, sm70_ckpt_dir(ck), weight, what);
	if (t->dtype != dt)
		return sm70_errf(err, -EINVAL, "tensor %s in %s has dtype %s: NVFP4 %s are %s", name,
				 t->file, sm70_dtype_name(t->dtype), what, sm70_dtype_name(dt));
	for (int i = 0; same && i < ndim; i++)
		same = t->shape[i] == want[i];
	if (!same) {
		sm70_st_format_shape(have, sizeof(have), t->ndim, t->shape);
		sm70_st_format_shape(shape, sizeof(shape), ndim, logical);
		sm70_st_format_shape(need, sizeof(need), ndim, want);
		return sm70_errf(err, -EINVAL, "tensor %s in %s has shape %s: the %s of an NVFP4 "
				 "%s %s are %s", name, t->file, have, what,
				 ndim == 3 ? "expert stack" : "weight", shape, need);
	}
	*out = t;
	return 0;
}

/* The codes and block scales of an NVFP4 weight of shape logical ([N, K] or [E, N, K]):
 * u8 [.., K / 2] and f8e4m3 [.., K / 16]. */
static int get_codes_scales(const struct sm70_ckpt *ck, const char *nc, const char *ns,
			    int ndim, const int64_t *logical, const char *weight,
			    struct nvfp4_src *s, struct sm70_err *err)
{
	int64_t packed[3], blocks[3];
	int ret;

	for (int i = 0; i < ndim; i++)
		packed[i] = blocks[i] = logical[i];
	packed[ndim - 1] = logical[ndim - 1] / 2;
	blocks[ndim - 1] = logical[ndim - 1] / SM70_NVFP4_BLOCK;
	ret = get_tensor(ck, nc, SM70_DTYPE_U8, ndim, packed, logical, "packed E2M1 codes",
			 weight, &s->codes, err);
	if (ret)
		return ret;
	return get_tensor(ck, ns, SM70_DTYPE_F8E4M3, ndim, blocks, logical, "E4M3 block scales",
			  weight, &s->scales, err);
}

/* Value i of the f32 tensor t as a scale2 (global: compressed-tensors' global scale, the
 * reciprocal of one), checked finite and positive; `at` is "" or "[i]" for messages. */
static int scale2_at(const struct sm70_st_tensor *t, size_t i, int global, const char *at,
		     float *scale2, struct sm70_err *err)
{
	float v;

	memcpy(&v, (const char *)t->data + i * sizeof(v), sizeof(v));
	if (!isfinite(v) || v <= 0.0f)
		return sm70_errf(err, -EINVAL, "tensor %s%s in %s is %g: an NVFP4 %s must be finite "
				 "and positive", t->name, at, t->file, (double)v,
				 global ? "global scale" : "weight_scale_2");
	*scale2 = global ? 1.0f / v : v;
	if (!isfinite(*scale2) || *scale2 <= 0.0f)
		return sm70_errf(err, -EINVAL, "tensor %s%s in %s is %g, whose reciprocal (the "
				 "weight's scale2) is not a finite positive f32", t->name, at,
				 t->file, (double)v);
	return 0;
}

/* The f32 tensor `name` of the scale2 values of `weight`, which must be there and f32. */
static int get_f32(const struct sm70_ckpt *ck, const char *name, int global,
		   const char *weight, const struct sm70_st_tensor **out, struct sm70_err *err)
{
	const struct sm70_st_tensor *t = sm70_ckpt_find(ck, name);

	if (!t)
		return sm70_errf(err, -ENOENT, "missing tensor %s in %s: the NVFP4 weight %s needs "
				 "its %s", name, sm70_ckpt_dir(ck), weight,
				 global ? "global scale" : "weight_scale_2");
	if (t->dtype != SM70_DTYPE_F32)
		return sm70_errf(err, -EINVAL, "tensor %s in %s has dtype %s: an NVFP4 %s is f32",
				 name, t->file, sm70_dtype_name(t->dtype),
				 global ? "global scale" : "weight_scale_2");
	*out = t;
	return 0;
}

/* The f32 scalar ([] or [1]) `name`; global (compressed-tensors' weight_global_scale)
 * gives scale2 as its reciprocal. Both must be finite and positive. */
static int get_scale2(const struct sm70_ckpt *ck, const char *name, int global,
		      const char *weight, float *scale2, struct sm70_err *err)
{
	const struct sm70_st_tensor *t;
	char have[160];
	int ret = get_f32(ck, name, global, weight, &t, err);

	if (ret)
		return ret;
	if (!(t->ndim == 0 || (t->ndim == 1 && t->shape[0] == 1))) {
		sm70_st_format_shape(have, sizeof(have), t->ndim, t->shape);
		return sm70_errf(err, -EINVAL, "tensor %s in %s has shape %s: expected one value "
				 "([] or [1]) for the matrix", name, t->file, have);
	}
	return scale2_at(t, 0, global, "", scale2, err);
}

/* The f32 vector [n_experts] `name` (one scale2, or global scale, an expert) into
 * scale2[n_experts], each checked as get_scale2 checks one. */
static int get_scale2s(const struct sm70_ckpt *ck, const char *name, int global,
		       const char *weight, int n_experts, float *scale2, struct sm70_err *err)
{
	const struct sm70_st_tensor *t;
	char have[160], at[32];
	int ret = get_f32(ck, name, global, weight, &t, err);

	if (ret)
		return ret;
	if (t->ndim != 1 || t->shape[0] != n_experts) {
		sm70_st_format_shape(have, sizeof(have), t->ndim, t->shape);
		return sm70_errf(err, -EINVAL, "tensor %s in %s has shape %s: expected one value "
				 "an expert ([%d])", name, t->file, have, n_experts);
	}
	for (int e = 0; e < n_experts && !ret; e++) {
		snprintf(at, sizeof(at), "[%d]", e);
		ret = scale2_at(t, (size_t)e, global, at, &scale2[e], err);
	}
	return ret;
}

/* The tensors of part p of a [p->full_rows, full_cols] weight, checked. */
static int nvfp4_source(const struct sm70_model *m, const struct sm70_ckpt *ck,
			const struct sm70_weight_part *p, int full_cols, struct nvfp4_src *s,
			struct sm70_err *err)
{
	int ct = m->quant.format == SM70_QUANT_CT_NVFP4, ret;
	char mod[MODULE_LEN], nc[NAME_LEN], ns[NAME_LEN], ng[NAME_LEN];

	module_of(mod, sizeof(mod), p->name);
	if (full_cols % SM70_NVFP4_BLOCK)
		return sm70_errf(err, -EINVAL, "%s in %s: rows of %d elements are not whole NVFP4 "
				 "blocks of %d", p->name, sm70_ckpt_dir(ck), full_cols,
				 SM70_NVFP4_BLOCK);
	if (ct && sm70_ckpt_find(ck, p->name))
		return sm70_errf(err, -EINVAL, "%s holds both %s and %s.weight_packed: a "
				 "compressed-tensors NVFP4 weight is its packed codes alone",
				 sm70_ckpt_dir(ck), p->name, mod);
	snprintf(nc, sizeof(nc), ct ? "%s.weight_packed" : "%s.weight", mod);
	snprintf(ns, sizeof(ns), "%s.weight_scale", mod);
	snprintf(ng, sizeof(ng), ct ? "%s.weight_global_scale" : "%s.weight_scale_2", mod);
	ret = get_codes_scales(ck, nc, ns, 2, (const int64_t[2]){ p->full_rows, full_cols },
			       p->name, s, err);
	if (ret)
		return ret;
	return get_scale2(ck, ng, ct, p->name, &s->scale2, err);
}

/* The error for the E4M3 NaN block scale `byte` at flat row `row`, block b of tensor t
 * (a fused expert tensor [E, N, K / 16] names its expert). */
static int nan_scale(const struct sm70_st_tensor *t, size_t row, size_t b, uint8_t byte,
		     struct sm70_err *err)
{
	if (t->ndim == 3)
		return sm70_errf(err, -EINVAL, "tensor %s in %s: block scale [%zu][%zu][%zu] (expert "
				 "%zu) is an E4M3 NaN (0x%02x)", t->name, t->file,
				 row / (size_t)t->shape[1], row % (size_t)t->shape[1], b,
				 row / (size_t)t->shape[1], byte);
	return sm70_errf(err, -EINVAL, "tensor %s in %s: block scale [%zu][%zu] is an E4M3 NaN "
			 "(0x%02x)", t->name, t->file, row, b, byte);
}

/* Part p's rows and columns [col0, col0 + cols) of codes and block scales into the
 * stack's rows (cols / 2 and cols / 16 bytes each); an E4M3 NaN scale is refused. A
 * check-only load (model.h) reads none of them. */
static int copy_band(const struct sm70_model *m, uint8_t *codes, uint8_t *scales,
		     const struct nvfp4_src *s, const struct sm70_weight_part *p, int full_cols,
		     int col0, int cols, struct sm70_err *err)
{
	const size_t crow = (size_t)full_cols / 2, srow = (size_t)full_cols / SM70_NVFP4_BLOCK;
	const size_t ccols = (size_t)cols / 2, scols = (size_t)cols / SM70_NVFP4_BLOCK;

	for (int i = 0; i < p->rows && !m->opts.check_only; i++) {
		const size_t row = (size_t)p->row0 + (size_t)i;
		const uint8_t *sc = (const uint8_t *)s->scales->data + row * srow +
				    (size_t)col0 / SM70_NVFP4_BLOCK;

		for (size_t b = 0; b < scols; b++)
			if ((sc[b] & 0x7f) == 0x7f)
				return nan_scale(s->scales, row, (size_t)col0 / SM70_NVFP4_BLOCK + b,
						 sc[b], err);
		memcpy(codes + (size_t)i * ccols,
		       (const uint8_t *)s->codes->data + row * crow + (size_t)col0 / 2, ccols);
		memcpy(scales + (size_t)i * scols, sc, scols);
	}
	return 0;
}

/* The dummy scale2 of a weight whose rows are full_cols long: the values' root mean
 * square (uniform codes, block scales uniform over the dummy bytes) equals the float
 * dummies', which are uniform in +-1/sqrt(full_cols). */
static float dummy_scale2(int full_cols)
{
	double codes = 0.0, scales = 0.0;

	for (int c = 0; c < 16; c++)
		codes += (double)sm70_e2m1_to_f32((uint8_t)c) * sm70_e2m1_to_f32((uint8_t)c) / 16;
	for (int b = 0; b < DUMMY_SCALE_COUNT; b++) {
		double v = sm70_e4m3_to_f32((uint8_t)(DUMMY_SCALE_FIRST + b));

		scales += v * v / DUMMY_SCALE_COUNT;
	}
	return (float)(1.0 / sqrt(3.0 * full_cols * codes * scales));
}

/*
 * Dummy codes and block scales of a band of a tensor (rows from row0, columns
 * [col0, col0 + cols) of rows full_cols long), each byte a function of (name, seed, its
 * index in the whole tensor), so any band is the same band of the same tensor: codes
 * uniform, eight bytes a hash (a band's code bytes start on a multiple of 8: col0 and
 * full_cols are multiples of 16); scales uniform over the dummy bytes.
 */
struct dummy_nvfp4 {
	uint8_t *codes, *scales; /* the band's first row; cols / 2 and cols / 16 bytes a row */
	uint64_t cs, ss;         /* the seeds of the codes and of the scales */
	size_t row0, full_cols, col0, cols;
};

static struct dummy_nvfp4 dummy_nvfp4_of(uint8_t *codes, uint8_t *scales, const char *name,
					 uint64_t seed, int row0, int full_cols, int col0,
					 int cols)
{
	return (struct dummy_nvfp4){
		.codes = codes, .scales = scales, .cs = sm70__name_seed(name, seed),
		.ss = sm70__name_seed(name, seed ^ DUMMY_SCALE_SEED), .row0 = (size_t)row0,
		.full_cols = (size_t)full_cols, .col0 = (size_t)col0, .cols = (size_t)cols,
	};
}

/* Rows [i0, i1) of the band d. */
static void dummy_nvfp4_rows(const struct dummy_nvfp4 *d, size_t i0, size_t i1)
{
	const size_t crow = d->full_cols / 2, srow = d->full_cols / SM70_NVFP4_BLOCK;
	const size_t ccols = d->cols / 2, scols = d->cols / SM70_NVFP4_BLOCK;

	for (size_t i = i0; i < i1; i++) {
		const size_t row = d->row0 + i;
		const uint64_t c0 = row * crow + d->col0 / 2;
		const uint64_t s0 = row * srow + d->col0 / SM70_NVFP4_BLOCK;

		for (size_t j = 0; j < ccols; j += 8) {
			uint64_t z = sm70__mix64(d->cs + ((c0 + j) / 8 + 1) * GOLDEN);

			memcpy(d->codes + i * ccols + j, &z, 8);
		}
		for (size_t b = 0; b < scols; b++)
			d->scales[i * scols + b] =
				(uint8_t)(DUMMY_SCALE_FIRST +
					  sm70__mix64(d->ss + (s0 + b + 1) * GOLDEN) % DUMMY_SCALE_COUNT);
	}
}

static void dummy_nvfp4_task(void *ctx, size_t i0, size_t i1)
{
	dummy_nvfp4_rows(ctx, i0, i1);
}

/* The dummy band of part p of tensor `name`, its rows on threads. */
static void dummy_band(uint8_t *codes, uint8_t *scales, const char *name, uint64_t seed,
		       const struct sm70_weight_part *p, int full_cols, int col0, int cols)
{
	struct dummy_nvfp4 d = dummy_nvfp4_of(codes, scales, name, seed, p->row0, full_cols,
					      col0, cols);

	sm70__parallel_for((size_t)p->rows, 16, (size_t)cols, dummy_nvfp4_task, &d);
}

/* prepare_weight on the stacked host matrix, with name in its messages; a backend that
 * drops a needed row_scale2 is refused rather than left to decode the wrong values. */
static int prepare(struct sm70_backend *be, int r, struct sm70_weight *w,
		   const struct sm70_weight *host, const char *name, struct sm70_err *err)
{
	struct sm70_err why = { { 0 } };
	int ret = be->ops->prepare_weight(be, w, host, &why);

	if (ret)
		return sm70_errf(err, ret, "%s on %s (rank %d): %s", name, be->name, r, why.msg);
	if (host->row_scale2 && !w->row_scale2) {
		be->ops->buf_free(be, w->scale);
		be->ops->buf_free(be, w->data);
		*w = (struct sm70_weight){ .dtype = SM70_DTYPE_NVFP4 };
		return sm70_errf(err, -ENOTSUP, "the %s backend's prepare_weight keeps one scale2 a "
				 "matrix, but %s stacks parts quantized with different "
				 "weight_scale_2 (row_scale2)", be->name, name);
	}
	return 0;
}

int sm70__nvfp4_weight_load(struct sm70_model *m, int r, const struct sm70_ckpt *ck,
			    struct sm70_weight *w, const struct sm70_weight_part *parts, int n,
			    int full_cols, int col0, int cols, struct sm70_err *err)
{
	struct sm70_backend *be = m->rank[r].be;
	struct sm70_weight host = { .dtype = SM70_DTYPE_NVFP4, .cols = cols };
	uint8_t *codes = NULL, *scales = NULL;
	float *row_s2 = NULL;
	size_t rows = 0, off = 0;
	int same = 1, ret = 0;

	*w = (struct sm70_weight){ .dtype = SM70_DTYPE_NVFP4 };
	if (!be->ops->prepare_weight)
		return sm70_errf(err, -ENOTSUP, "the %s backend has no NVFP4 weights "
				 "(prepare_weight), which %s needs", be->name, parts[0].name);
	if (col0 % SM70_NVFP4_BLOCK || cols % SM70_NVFP4_BLOCK)
		return sm70_errf(err, -EINVAL, "%s: the tensor-parallel split gives rank %d columns "
				 "[%d, %d) of %d, which do not align with NVFP4 blocks of %d "
				 "elements; choose a tensor parallelism that splits them into "
				 "multiples of %d", parts[0].name, r, col0, col0 + cols, full_cols,
				 SM70_NVFP4_BLOCK, SM70_NVFP4_BLOCK);
	for (int i = 0; i < n; i++) {
		if (parts[i].row0 < 0 || parts[i].rows < 1 ||
		    parts[i].row0 + parts[i].rows > parts[i].full_rows)
			return -EINVAL;
		rows += (size_t)parts[i].rows;
	}
	codes = malloc(rows * (size_t)cols / 2);
	scales = malloc(rows * (size_t)cols / SM70_NVFP4_BLOCK);
	row_s2 = malloc(rows * sizeof(*row_s2));
	if (!codes || !scales || !row_s2) {
		ret = sm70_errf(err, -ENOMEM, "out of host memory loading %s", parts[0].name);
		goto out;
	}
	for (int i = 0; i < n; i++) {
		uint8_t *c = codes + off * (size_t)cols / 2;
		uint8_t *s = scales + off * (size_t)cols / SM70_NVFP4_BLOCK;
		struct nvfp4_src src;

		if (m->opts.dummy) {
			dummy_band(c, s, parts[i].name, m->opts.dummy_seed, &parts[i], full_cols, col0,
				   cols);
			src.scale2 = dummy_scale2(full_cols);
		} else if ((ret = nvfp4_source(m, ck, &parts[i], full_cols, &src, err)) ||
			   (ret = copy_band(m, c, s, &src, &parts[i], full_cols, col0, cols,
						   err))) {
			goto out;
		}
		for (int k = 0; k < parts[i].rows; k++)
			row_s2[off + (size_t)k] = src.scale2;
		if (i == 0)
			host.scale2 = src.scale2;
		same &= src.scale2 == host.scale2;
		off += (size_t)parts[i].rows;
	}
	host.rows = (int)rows;
	host.data = codes;
	host.scale = scales;
	host.row_scale2 = same ? NULL : row_s2;
	ret = prepare(be, r, w, &host, parts[0].name, err);
out:
	free(row_s2);
	free(scales);
	free(codes);
	return ret;
}

/* ---- MoE experts ---------------------------------------------------------------------- */

static const char *const expert_proj[3] = { "gate_proj", "up_proj", "down_proj" };

/* mlp.experts.<e>.<proj>.weight of the MoE layer at prefix p. */
static void expert_name(char *buf, size_t size, const char *p, int e, const char *proj)
{
	snprintf(buf, size, "%smlp.experts.%d.%s.weight", p, e, proj);
}

/* Whether the checkpoint holds the fused expert parameter `name` in any form. */
static int fused_present(const struct sm70_ckpt *ck, const char *name)
{
	return sm70_ckpt_find(ck, name) || find2(ck, name, "_", "weight_packed") ||
	       find2(ck, name, "_", "weight_scale");
}

/* kind[0] (gate and up) and kind[1] (down) of the per-expert layout: every expert's
 * matrices checked, each group stored alike. */
static int per_expert_kinds(const struct sm70_model *m, const struct sm70_ckpt *ck,
			    const char *p, int n_experts, int inter, int hidden, int kind[2],
			    struct sm70_err *err)
{
	char name[NAME_LEN], mod[MODULE_LEN], first[NAME_LEN];

	for (int e = 0; e < n_experts; e++)
		for (int j = 0; j < 3; j++) {
			int down = j == 2, k;

			expert_name(name, sizeof(name), p, e, expert_proj[j]);
			module_of(mod, sizeof(mod), name);
			k = module_kind(m, ck, name, mod, 0, down ? inter : hidden, err);
			if (k < 0)
				return k;
			if (e == 0 && j != 1) {
				kind[down] = k;
				continue;
			}
			if (k == kind[down])
				continue;
			expert_name(first, sizeof(first), p, 0, expert_proj[j == 2 ? 2 : 0]);
			return sm70_errf(err, -EINVAL, "%s stores %s as %s but %s as %s: the "
					 "experts' %s matrices must be stored alike, all NVFP4 or "
					 "all float", sm70_ckpt_dir(ck), first,
					 kind[down] ? "NVFP4" : "float", name, k ? "NVFP4" : "float",
					 down ? "down" : "gate and up");
		}
	return 0;
}

int sm70__nvfp4_experts(const struct sm70_model *m, const struct sm70_ckpt *ck, const char *p,
			int n_experts, int inter, int hidden, struct sm70_err *err)
{
	char ngu[NAME_LEN], ndn[NAME_LEN];
	int kind[2] = { 0, 0 }, ret;

	snprintf(ngu, sizeof(ngu), "%smlp.experts.gate_up_proj", p);
	snprintf(ndn, sizeof(ndn), "%smlp.experts.down_proj", p);
	if (m->opts.dummy || fused_present(ck, ngu)) {
		if ((kind[0] = module_kind(m, ck, ngu, ngu, 1, hidden, err)) < 0)
			return kind[0];
		if ((kind[1] = module_kind(m, ck, ndn, ndn, 1, inter, err)) < 0)
			return kind[1];
	} else if ((ret = per_expert_kinds(m, ck, p, n_experts, inter, hidden, kind, err))) {
		return ret;
	}
	if (kind[0] != kind[1])
		return sm70_errf(err, -ENOTSUP, "the experts of %smlp in %s are %s in gate and up "
				 "but %s in down: moe_experts takes both stacks NVFP4 or both "
				 "float (a down_proj whose rows of %d elements are not whole NVFP4 "
				 "blocks of %d stays float: keep the experts float, e.g. "
				 "sm70-quantize --exclude '*.mlp.experts*')", p, sm70_ckpt_dir(ck),
				 kind[0] ? "NVFP4" : "float", kind[1] ? "NVFP4" : "float", inter,
				 SM70_NVFP4_BLOCK);
	return kind[0];
}

/* One rank's share of one MoE layer's NVFP4 experts, gathered into host stacks in
 * ModelOpt's layout (data, scale, row_scale2 from malloc): gate_up [E][2 ni][hidden],
 * down [E][hidden][ni]. */
struct expert_load {
	const struct sm70_model *m;
	const struct sm70_ckpt *ck;
	const char *p;
	int n_experts, inter, i0, ni, hidden, fused;
	struct sm70_experts gu, dn;
};

/*
 * Where matrix j (0 gate, 1 up, 2 down) of expert e comes from and goes: a band of rows of
 * a tensor seen as [full_rows, full_cols] (a fused tensor [E, N, K] is [E * N, K] that
 * way), cut to columns [col0, col0 + cols), into the stack's rows from `row` of expert e.
 */
struct expert_band {
	struct sm70_weight_part part;
	int full_cols, col0, cols;
	struct sm70_experts *stack;
	int row;
};

static struct expert_band band_of(struct expert_load *x, int e, int j, const char *name)
{
	const int I = x->inter, H = x->hidden, E = x->n_experts;
	struct expert_band b = { .part = { .name = name } };

	if (j == 2) {
		b.part.full_rows = x->fused ? E * H : H;
		b.part.row0 = x->fused ? e * H : 0;
		b.part.rows = H;
		b.full_cols = I;
		b.col0 = x->i0;
		b.cols = x->ni;
		b.stack = &x->dn;
		return b;
	}
	b.part.full_rows = x->fused ? E * 2 * I : I;
	b.part.row0 = (x->fused ? e * 2 * I + j * I : 0) + x->i0;
	b.part.rows = x->ni;
	b.full_cols = H;
	b.cols = H;
	b.stack = &x->gu;
	b.row = j * x->ni;
	return b;
}

static uint8_t *stack_codes(const struct expert_band *b, int e)
{
	const struct sm70_experts *s = b->stack;

	return (uint8_t *)s->data + ((size_t)e * (size_t)s->rows + (size_t)b->row) *
					    (size_t)(s->cols / 2);
}

static uint8_t *stack_scales(const struct expert_band *b, int e)
{
	const struct sm70_experts *s = b->stack;

	return (uint8_t *)s->scale + ((size_t)e * (size_t)s->rows + (size_t)b->row) *
					     (size_t)(s->cols / SM70_NVFP4_BLOCK);
}

/* The band's rows of expert e carry scale2. */
static void band_scale2(const struct expert_band *b, int e, float scale2)
{
	float *rs2 = b->stack->row_scale2 + (size_t)e * (size_t)b->stack->rows + (size_t)b->row;

	for (int i = 0; i < b->part.rows; i++)
		rs2[i] = scale2;
}

/* The dummy matrices of experts [e0, e1), under the per-expert names as float dummies. */
static void dummy_experts_task(void *ctx, size_t e0, size_t e1)
{
	struct expert_load *x = ctx;
	char name[NAME_LEN];

	for (int e = (int)e0; e < (int)e1; e++)
		for (int j = 0; j < 3; j++) {
			struct expert_band b;
			struct dummy_nvfp4 d;

			expert_name(name, sizeof(name), x->p, e, expert_proj[j]);
			b = band_of(x, e, j, name);
			d = dummy_nvfp4_of(stack_codes(&b, e), stack_scales(&b, e), name,
					   x->m->opts.dummy_seed, b.part.row0, b.full_cols, b.col0,
					   b.cols);
			dummy_nvfp4_rows(&d, 0, (size_t)b.part.rows);
			band_scale2(&b, e, dummy_scale2(b.full_cols));
		}
}

/* The checked tensors of the fused parameter `name` [E, rows, cols] and its scale2 [E]. */
static int fused_source(const struct expert_load *x, const char *name, int rows, int cols,
			struct nvfp4_src *s, float *scale2, struct sm70_err *err)
{
	const struct sm70_ckpt *ck = x->ck;
	int ct = x->m->quant.format == SM70_QUANT_CT_NVFP4, ret;
	char nc[NAME_LEN], ns[NAME_LEN], ng[NAME_LEN];

	if (cols % SM70_NVFP4_BLOCK)
		return sm70_errf(err, -EINVAL, "%s in %s: rows of %d elements are not whole NVFP4 "
				 "blocks of %d", name, sm70_ckpt_dir(ck), cols, SM70_NVFP4_BLOCK);
	if (ct && sm70_ckpt_find(ck, name))
		return sm70_errf(err, -EINVAL, "%s holds both %s and %s_weight_packed: a "
				 "compressed-tensors NVFP4 weight is its packed codes alone",
				 sm70_ckpt_dir(ck), name, name);
	snprintf(nc, sizeof(nc), ct ? "%s_weight_packed" : "%s", name);
	snprintf(ns, sizeof(ns), "%s_weight_scale", name);
	snprintf(ng, sizeof(ng), ct ? "%s_weight_global_scale" : "%s_weight_scale_2", name);
	ret = get_codes_scales(ck, nc, ns, 3,
			       (const int64_t[3]){ x->n_experts, rows, cols }, name, s, err);
	if (ret)
		return ret;
	return get_scale2s(ck, ng, ct, name, x->n_experts, scale2, err);
}

/* Every expert's bands from the fused mlp.experts.gate_up_proj and down_proj. */
static int fused_experts(struct expert_load *x, struct sm70_err *err)
{
	char names[2][NAME_LEN];
	struct nvfp4_src src[2];
	float *s2 = malloc(2 * (size_t)x->n_experts * sizeof(*s2));
	int ret;

	if (!s2)
		return sm70_errf(err, -ENOMEM, "out of host memory loading the experts of %smlp",
				 x->p);
	snprintf(names[0], NAME_LEN, "%smlp.experts.gate_up_proj", x->p);
	snprintf(names[1], NAME_LEN, "%smlp.experts.down_proj", x->p);
	if ((ret = fused_source(x, names[0], 2 * x->inter, x->hidden, &src[0], s2, err)) ||
	    (ret = fused_source(x, names[1], x->hidden, x->inter, &src[1], s2 + x->n_experts,
				err)))
		goto out;
	for (int e = 0; e < x->n_experts && !ret; e++)
		for (int j = 0; j < 3 && !ret; j++) {
			const int t = j == 2;
			struct expert_band b = band_of(x, e, j, names[t]);

			ret = copy_band(x->m, stack_codes(&b, e), stack_scales(&b, e), &src[t],
					&b.part, b.full_cols, b.col0, b.cols, err);
			band_scale2(&b, e, s2[t * x->n_experts + e]);
		}
out:
	free(s2);
	return ret;
}

/* Every expert's bands from its own mlp.experts.<e>.{gate,up,down}_proj tensors. */
static int per_expert_experts(struct expert_load *x, struct sm70_err *err)
{
	char name[NAME_LEN];
	int ret = 0;

	for (int e = 0; e < x->n_experts && !ret; e++)
		for (int j = 0; j < 3 && !ret; j++) {
			struct expert_band b;
			struct nvfp4_src src;

			expert_name(name, sizeof(name), x->p, e, expert_proj[j]);
			b = band_of(x, e, j, name);
			if ((ret = nvfp4_source(x->m, x->ck, &b.part, b.full_cols, &src, err)) ||
			    (ret = copy_band(x->m, stack_codes(&b, e), stack_scales(&b, e), &src,
					     &b.part, b.full_cols, b.col0, b.cols, err)))
				break;
			band_scale2(&b, e, src.scale2);
		}
	return ret;
}

/* A host stack [n_experts][rows][cols] in ModelOpt's layout; -ENOMEM when a buffer could
 * not be had (free it with stack_free either way). */
static int stack_new(struct sm70_experts *s, int n_experts, int rows, int cols)
{
	const size_t n = (size_t)n_experts * (size_t)rows;

	*s = (struct sm70_experts){ .dtype = SM70_DTYPE_NVFP4, .n_experts = n_experts,
				    .rows = rows, .cols = cols };
	s->data = malloc(n * (size_t)(cols / 2));
	s->scale = malloc(n * (size_t)(cols / SM70_NVFP4_BLOCK));
	s->row_scale2 = malloc(n * sizeof(float));
	return s->data && s->scale && s->row_scale2 ? 0 : -ENOMEM;
}

static void stack_free(struct sm70_experts *s)
{
	free(s->row_scale2);
	free(s->scale);
	free(s->data);
}

/* prepare_experts on a host stack, with the layer and matrix in its messages. */
static int prepare_stack(struct sm70_backend *be, int r, struct sm70_experts *out,
			 const struct sm70_experts *host, const char *p, const char *which,
			 struct sm70_err *err)
{
	struct sm70_err why = { { 0 } };
	int ret = be->ops->prepare_experts(be, out, host, &why);

	if (ret)
		return sm70_errf(err, ret, "the %s experts of %smlp on %s (rank %d): %s", which, p,
				 be->name, r, why.msg);
	return 0;
}

int sm70__nvfp4_experts_load(struct sm70_model *m, int r, const struct sm70_ckpt *ck,
			     const char *p, int n_experts, int inter, int i0, int ni, int hidden,
			     struct sm70_experts *gate_up, struct sm70_experts *down,
			     struct sm70_err *err)
{
	struct sm70_backend *be = m->rank[r].be;
	struct expert_load x = { .m = m, .ck = ck, .p = p, .n_experts = n_experts,
				 .inter = inter, .i0 = i0, .ni = ni, .hidden = hidden };
	char ndn[NAME_LEN];
	int ret = 0;

	*gate_up = (struct sm70_experts){ .dtype = SM70_DTYPE_NVFP4 };
	*down = (struct sm70_experts){ .dtype = SM70_DTYPE_NVFP4 };
	if (!be->ops->prepare_experts)
		return sm70_errf(err, -ENOTSUP, "the %s backend has no NVFP4 experts "
				 "(prepare_experts), which the experts of %smlp need", be->name, p);
	snprintf(ndn, sizeof(ndn), "%smlp.experts.gate_up_proj", p);
	x.fused = !m->opts.dummy && fused_present(ck, ndn);
	if (x.fused)
		snprintf(ndn, sizeof(ndn), "%smlp.experts.down_proj", p);
	else
		expert_name(ndn, sizeof(ndn), p, 0, "down_proj");
	if (i0 % SM70_NVFP4_BLOCK || ni % SM70_NVFP4_BLOCK)
		return sm70_errf(err, -EINVAL, "%s: the tensor-parallel split gives rank %d columns "
				 "[%d, %d) of %d, which do not align with NVFP4 blocks of %d "
				 "elements; choose a tensor parallelism that splits them into "
				 "multiples of %d", ndn, r, i0, i0 + ni, inter, SM70_NVFP4_BLOCK,
				 SM70_NVFP4_BLOCK);
	if (stack_new(&x.gu, n_experts, 2 * ni, hidden) || stack_new(&x.dn, n_experts, hidden, ni)) {
		ret = sm70_errf(err, -ENOMEM, "out of host memory loading the %d experts of %smlp",
				n_experts, p);
		goto out;
	}
	if (m->opts.dummy)
		sm70__parallel_for((size_t)n_experts, 1, 3 * (size_t)ni * (size_t)hidden,
				   dummy_experts_task, &x);
	else if ((ret = x.fused ? fused_experts(&x, err) : per_expert_experts(&x, err)))
		goto out;
	ret = prepare_stack(be, r, gate_up, &x.gu, p, "gate_up", err);
	if (!ret)
		ret = prepare_stack(be, r, down, &x.dn, p, "down", err);
out:
	stack_free(&x.dn);
	stack_free(&x.gu);
	return ret;
}
