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
 * Non-goals: NVFP4 MoE experts (refused by name: they need prepare_experts and a loader
 * of their own), requantizing, other 4-bit formats, activation scales (W4A16).
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

/* 1 when the part is NVFP4, 0 when it is float, -EINVAL when the checkpoint contradicts
 * its quantization config (or holds NVFP4 tensors without one). */
static int part_kind(const struct sm70_model *m, const struct sm70_ckpt *ck,
		     const struct sm70_weight_part *p, int full_cols, struct sm70_err *err)
{
	char mod[MODULE_LEN];

	if (!module_of(mod, sizeof(mod), p->name))
		return 0;
	if (m->opts.dummy)
		return sm70_quant_module_quantized(&m->quant, mod, full_cols);
	if (m->quant.format == SM70_QUANT_NONE) {
		if (stored_nvfp4(ck, SM70_QUANT_MODELOPT_NVFP4, p->name, mod) ||
		    stored_nvfp4(ck, SM70_QUANT_CT_NVFP4, p->name, mod))
			return sm70_errf(err, -EINVAL, "%s is stored as NVFP4 in %s, but the "
					 "checkpoint declares no quantization (no "
					 "quantization_config in config.json, no "
					 "hf_quant_config.json)", p->name, sm70_ckpt_dir(ck));
		return 0;
	}
	if (!stored_nvfp4(ck, m->quant.format, p->name, mod))
		return 0;
	if (sm70_quant_ignored(&m->quant, mod))
		return sm70_errf(err, -EINVAL, "%s is stored as NVFP4 in %s, but the quantization "
				 "config lists %s as not quantized", p->name, sm70_ckpt_dir(ck),
				 mod);
	return 1;
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

/* Looks up tensor `name`, which must be dtype dt and [rows, cols]; `what` says what it
 * holds for the NVFP4 weight `weight` of k columns. */
static int get_2d(const struct sm70_ckpt *ck, const char *name, enum sm70_dtype dt, int64_t rows,
		  int64_t cols, int64_t k, const char *what, const char *weight,
		  const struct sm70_st_tensor **out, struct sm70_err *err)
{
	const struct sm70_st_tensor *t = sm70_ckpt_find(ck, name);
	char have[160];

	if (!t)
		return sm70_errf(err, -ENOENT, "missing tensor %s in %s: the NVFP4 weight %s needs "
				 "its %s", name, sm70_ckpt_dir(ck), weight, what);
	if (t->dtype != dt)
		return sm70_errf(err, -EINVAL, "tensor %s in %s has dtype %s: NVFP4 %s are %s", name,
				 t->file, sm70_dtype_name(t->dtype), what, sm70_dtype_name(dt));
	if (t->ndim != 2 || t->shape[0] != rows || t->shape[1] != cols) {
		sm70_st_format_shape(have, sizeof(have), t->ndim, t->shape);
		return sm70_errf(err, -EINVAL, "tensor %s in %s has shape %s: the %s of an NVFP4 "
				 "weight [%lld, %lld] are [%lld, %lld]", name, t->file, have, what,
				 (long long)rows, (long long)k, (long long)rows, (long long)cols);
	}
	*out = t;
	return 0;
}

/* The f32 scalar ([] or [1]) `name`; global (compressed-tensors' weight_global_scale)
 * gives scale2 as its reciprocal. Both must be finite and positive. */
static int get_scale2(const struct sm70_ckpt *ck, const char *name, int global,
		      const char *weight, float *scale2, struct sm70_err *err)
{
	const struct sm70_st_tensor *t = sm70_ckpt_find(ck, name);
	char have[160];
	float v;

	if (!t)
		return sm70_errf(err, -ENOENT, "missing tensor %s in %s: the NVFP4 weight %s needs "
				 "its %s", name, sm70_ckpt_dir(ck), weight,
				 global ? "global scale" : "weight_scale_2");
	if (t->dtype != SM70_DTYPE_F32)
		return sm70_errf(err, -EINVAL, "tensor %s in %s has dtype %s: an NVFP4 %s is f32",
				 name, t->file, sm70_dtype_name(t->dtype),
				 global ? "global scale" : "weight_scale_2");
	if (!(t->ndim == 0 || (t->ndim == 1 && t->shape[0] == 1))) {
		sm70_st_format_shape(have, sizeof(have), t->ndim, t->shape);
		return sm70_errf(err, -EINVAL, "tensor %s in %s has shape %s: expected one value "
				 "([] or [1]) for the matrix", name, t->file, have);
	}
	memcpy(&v, t->data, sizeof(v));
	if (!isfinite(v) || v <= 0.0f)
		return sm70_errf(err, -EINVAL, "tensor %s in %s is %g: an NVFP4 %s must be finite "
				 "and positive", name, t->file, (double)v,
				 global ? "global scale" : "weight_scale_2");
	*scale2 = global ? 1.0f / v : v;
	if (!isfinite(*scale2) || *scale2 <= 0.0f)
		return sm70_errf(err, -EINVAL, "tensor %s in %s is %g, whose reciprocal (the "
				 "weight's scale2) is not a finite positive f32", name, t->file,
				 (double)v);
	return 0;
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
	if ((ret = get_2d(ck, nc, SM70_DTYPE_U8, p->full_rows, full_cols / 2, full_cols,
			  "packed E2M1 codes",
			  p->name, &s->codes, err)) ||
	    (ret = get_2d(ck, ns, SM70_DTYPE_F8E4M3, p->full_rows, full_cols / SM70_NVFP4_BLOCK,
			  full_cols, "E4M3 block scales", p->name, &s->scales, err)))
		return ret;
	return get_scale2(ck, ng, ct, p->name, &s->scale2, err);
}

/* Part p's rows and columns [col0, col0 + cols) of codes and block scales into the
 * stack's rows (cols / 2 and cols / 16 bytes each); an E4M3 NaN scale is refused. */
static int copy_band(uint8_t *codes, uint8_t *scales, const struct nvfp4_src *s,
		     const struct sm70_weight_part *p, int full_cols, int col0, int cols,
		     struct sm70_err *err)
{
	const size_t crow = (size_t)full_cols / 2, srow = (size_t)full_cols / SM70_NVFP4_BLOCK;
	const size_t ccols = (size_t)cols / 2, scols = (size_t)cols / SM70_NVFP4_BLOCK;

	for (int i = 0; i < p->rows; i++) {
		const size_t row = (size_t)p->row0 + (size_t)i;
		const uint8_t *sc = (const uint8_t *)s->scales->data + row * srow +
				    (size_t)col0 / SM70_NVFP4_BLOCK;

		for (size_t b = 0; b < scols; b++)
			if ((sc[b] & 0x7f) == 0x7f)
				return sm70_errf(err, -EINVAL, "tensor %s in %s: block scale [%zu][%zu] "
						 "is an E4M3 NaN (0x%02x)", s->scales->name,
						 s->scales->file, row,
						 (size_t)col0 / SM70_NVFP4_BLOCK + b, sc[b]);
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
 * Dummy codes and block scales of part p, each byte a function of (name, seed, its index
 * in the whole tensor), so any band is the same band of the same tensor: codes uniform,
 * eight bytes a hash (a band's code bytes start on a multiple of 8: col0 and full_cols are
 * multiples of 16); scales uniform over the dummy bytes.
 */
static void dummy_band(uint8_t *codes, uint8_t *scales, const char *name, uint64_t seed,
		       const struct sm70_weight_part *p, int full_cols, int col0, int cols)
{
	const uint64_t cs = sm70__name_seed(name, seed);
	const uint64_t ss = sm70__name_seed(name, seed ^ DUMMY_SCALE_SEED);
	const size_t crow = (size_t)full_cols / 2, srow = (size_t)full_cols / SM70_NVFP4_BLOCK;
	const size_t ccols = (size_t)cols / 2, scols = (size_t)cols / SM70_NVFP4_BLOCK;

	for (int i = 0; i < p->rows; i++) {
		const size_t row = (size_t)p->row0 + (size_t)i;
		const uint64_t c0 = row * crow + (size_t)col0 / 2;
		const uint64_t s0 = row * srow + (size_t)col0 / SM70_NVFP4_BLOCK;

		for (size_t j = 0; j < ccols; j += 8) {
			uint64_t z = sm70__mix64(cs + ((c0 + j) / 8 + 1) * GOLDEN);

			memcpy(codes + (size_t)i * ccols + j, &z, 8);
		}
		for (size_t b = 0; b < scols; b++)
			scales[(size_t)i * scols + b] =
				(uint8_t)(DUMMY_SCALE_FIRST +
					  sm70__mix64(ss + (s0 + b + 1) * GOLDEN) % DUMMY_SCALE_COUNT);
	}
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
			   (ret = copy_band(c, s, &src, &parts[i], full_cols, col0, cols, err))) {
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

int sm70__refuse_nvfp4_experts(const struct sm70_model *m, int r, const struct sm70_ckpt *ck,
			      const char *p, int hidden, struct sm70_err *err)
{
	const struct sm70_backend *be = m->rank[r].be;
	char fused[MODULE_LEN], one[MODULE_LEN], mod[MODULE_LEN];
	const struct sm70_st_tensor *t;
	int nvfp4;

	if (m->quant.format == SM70_QUANT_NONE)
		return 0;
	snprintf(fused, sizeof(fused), "%smlp.experts.gate_up_proj", p);
	snprintf(one, sizeof(one), "%smlp.experts.0.gate_proj.weight", p);
	module_of(mod, sizeof(mod), one);
	t = sm70_ckpt_find(ck, fused);
	if (m->opts.dummy)
		nvfp4 = sm70_quant_module_quantized(&m->quant, fused, hidden);
	else
		nvfp4 = (t && t->dtype == SM70_DTYPE_U8) || find2(ck, fused, "_", "weight_scale") ||
			find2(ck, fused, "_", "weight_packed") ||
			stored_nvfp4(ck, m->quant.format, one, mod);
	if (!nvfp4)
		return 0;
	if (!be->ops->prepare_experts)
		return sm70_errf(err, -ENOTSUP, "the %s backend has no NVFP4 experts "
				 "(prepare_experts), which the experts of %smlp need", be->name, p);
	return sm70_errf(err, -ENOTSUP, "the experts of %smlp are NVFP4: sm70 loads NVFP4 dense "
			 "matrices, not yet NVFP4 experts", p);
}
