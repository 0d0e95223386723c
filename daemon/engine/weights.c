/*
 * weights.c - weights for the architectures: stacks of checkpoint tensor bands (what a
 * tensor-parallel rank holds) in the backend's dtype, f32 vectors (norms, convolution
 * and gate parameters), and the deterministic dummy weights of --load-format dummy.
 * Matrices and expert stacks stored as NVFP4 go to weights_nvfp4.c.
 *
 * Every value read from a checkpoint is checked to be finite on its way through (in the
 * copy or conversion pass it takes anyway): a NaN or an infinity in the weights makes
 * every request fail later with nothing to go on, so the load fails instead, naming the
 * tensor and the element.
 */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/engine/model.h"


uint64_t sm70__mix64(uint64_t z)
{
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

uint64_t sm70__name_seed(const char *name, uint64_t seed)
{
	uint64_t h = 0xcbf29ce484222325ull ^ seed; /* FNV-1a */

	for (; *name; name++)
		h = (h ^ (unsigned char)*name) * 0x100000001b3ull;
	return h;
}

/* The dummy value of element i of a tensor seeded with s: uniform in [-1, 1). */
static float dummy_at(uint64_t s, uint64_t i)
{
	uint64_t z = sm70__mix64(s + (i + 1) * 0x9e3779b97f4a7c15ull);

	return (float)((double)(z >> 40) * 0x1p-23 - 1.0);
}

/*
 * Dummy weights: a [rows, cols] window at (row0, col0) of a tensor with full_cols columns,
 * each value scale * dummy_at(seed, flat index), rounded to bf16 (as a real checkpoint
 * would hold) and stored as dt. Rows are spread over threads, because an 8B-parameter
 * model has 8e9 values; the values do not depend on the thread count.
 */
struct dummy_job {
	void *dst;
	enum sm70_dtype dt;
	uint64_t seed;
	float scale;
	size_t full_cols, row0, rows, col0, cols;
};

#define DUMMY_BAND 16

static void dummy_rows(void *ctx, size_t r0, size_t r1)
{
	const struct dummy_job *j = ctx;

	for (size_t r = r0; r < r1; r++) {
		uint64_t base = (uint64_t)(j->row0 + r) * j->full_cols + j->col0;

		for (size_t c = 0; c < j->cols; c++) {
			size_t i = r * j->cols + c;
			uint16_t b = sm70_f32_to_bf16(j->scale * dummy_at(j->seed, base + c));
			float v = sm70_bf16_to_f32(b);
			if (j->dt == SM70_DTYPE_BF16)
				((uint16_t *)j->dst)[i] = b;
			else if (j->dt == SM70_DTYPE_F16)
				((uint16_t *)j->dst)[i] = sm70_f32_to_f16(v);
			else
				((float *)j->dst)[i] = v;
		}
	}
}

static void dummy_fill(struct dummy_job *j)
{
	sm70__parallel_for(j->rows, DUMMY_BAND, j->cols, dummy_rows, j);
}

/* Elements of a copy or conversion pass, checked for non-finite values as they go. */
#define CHECK_CHUNK 4096

/*
 * The first element of n at src (dt) that is not finite, or SIZE_MAX: an all-ones
 * exponent for f32, f16 and bf16 (infinity or NaN), the NaN pattern S.1111.111 for e4m3
 * (which has no infinity); integer types are never non-finite. Read through memcpy, as a
 * checkpoint's tensors need not be aligned; the loops compile to vector code.
 */
static size_t first_nonfinite(const void *src, enum sm70_dtype dt, size_t n)
{
	const unsigned char *p = src;
	unsigned bad = 0;
	size_t i;

	switch (dt) {
	case SM70_DTYPE_F32:
		for (i = 0; i < n; i++) {
			uint32_t v;
			memcpy(&v, p + 4 * i, 4);
			bad |= (v & 0x7f800000u) == 0x7f800000u;
		}
		break;
	case SM70_DTYPE_F16:
	case SM70_DTYPE_BF16: {
		uint16_t e = dt == SM70_DTYPE_F16 ? 0x7c00 : 0x7f80;
		for (i = 0; i < n; i++) {
			uint16_t v;
			memcpy(&v, p + 2 * i, 2);
			bad |= (v & e) == e;
		}
		break;
	}
	case SM70_DTYPE_F8E4M3:
		for (i = 0; i < n; i++)
			bad |= (p[i] & 0x7f) == 0x7f;
		break;
	default:
		return SIZE_MAX;
	}
	if (!bad)
		return SIZE_MAX;
	/* rare: find which */
	for (i = 0; i < n; i++) {
		float v;

		sm70_convert_to_f32(&v, p + i * sm70_dtype_size(dt), dt, 1);
		if (!isfinite(v))
			return i;
	}
	return SIZE_MAX;
}

/* The load's error for element `at` (row, col) of tensor `name` holding value v. */
static int nonfinite_error(struct sm70_err *err, const char *name, size_t at, size_t row,
			   size_t col, float v)
{
	return sm70_errf(err, -EINVAL, "%s: element %zu (row %zu, column %zu) is %s: the "
			 "checkpoint holds a non-finite weight (a corrupt or overflowed file); "
			 "refusing to load it", name, at, row, col,
			 isnan(v) ? "NaN" : v > 0 ? "+inf" : "-inf");
}

/* memcpy of count elements of dt that also reports the first non-finite one (SIZE_MAX:
 * none), chunk by chunk, so that each chunk is checked while it is in the cache. */
static size_t copy_finite(void *dst, const void *src, enum sm70_dtype dt, size_t count)
{
	size_t esz = sm70_dtype_size(dt);

	for (size_t i = 0; i < count; i += CHECK_CHUNK) {
		size_t n = count - i < CHECK_CHUNK ? count - i : CHECK_CHUNK, at;

		memcpy((char *)dst + i * esz, (const char *)src + i * esz, n * esz);
		at = first_nonfinite((const char *)src + i * esz, dt, n);
		if (at != SIZE_MAX)
			return i + at;
	}
	return SIZE_MAX;
}

/*
 * Converts count elements of src (src_dt) into dst (dt), in chunks through an f32
 * buffer. Values beyond the f16 range are clamped to +-65504 and counted in
 * m->clamped_values (bf16 checkpoints can hold them). *bad is the first non-finite
 * element's index, or SIZE_MAX.
 */
static int convert_weight(struct sm70_model *m, void *dst, enum sm70_dtype dt, const void *src,
			  enum sm70_dtype src_dt, size_t count, const char *name, size_t *bad,
			  struct sm70_err *err)
{
	enum { CHUNK = CHECK_CHUNK };
	float buf[CHUNK];
	size_t src_esz = sm70_dtype_size(src_dt), dst_esz = sm70_dtype_size(dt);

	*bad = SIZE_MAX;
	for (size_t i = 0; i < count; i += CHUNK) {
		size_t n = count - i < CHUNK ? count - i : CHUNK;
		char *d = (char *)dst + i * dst_esz;
		int finite = 1;

		sm70_convert_to_f32(buf, (const char *)src + i * src_esz, src_dt, n);
		for (size_t k = 0; k < n; k++)
			finite &= isfinite(buf[k]) != 0;
		if (!finite) {
			for (size_t k = 0; k < n && *bad == SIZE_MAX; k++)
				if (!isfinite(buf[k]))
					*bad = i + k;
			return 0;
		}
		for (size_t k = 0; k < n; k++) {
			float v = buf[k];
			uint16_t h;
			switch (dt) {
			case SM70_DTYPE_F32:
				memcpy(d + 4 * k, &v, 4);
				break;
			case SM70_DTYPE_F16:
				if (v > 65504.0f || v < -65504.0f) {
					v = v > 0 ? 65504.0f : -65504.0f;
					m->clamped_values++;
				}
				h = sm70_f32_to_f16(v);
				memcpy(d + 2 * k, &h, 2);
				break;
			case SM70_DTYPE_BF16:
				h = sm70_f32_to_bf16(v);
				memcpy(d + 2 * k, &h, 2);
				break;
			default:
				return sm70_errf(err, -EINVAL, "cannot store %s as %s", name,
						 sm70_dtype_name(dt));
			}
		}
	}
	return 0;
}

/* Copies the window of part p (rows x cols at col0) of tensor t into dst as dt; fails,
 * naming the element, if one is not finite. */
static int copy_window(struct sm70_model *m, void *dst, enum sm70_dtype dt,
		       const struct sm70_st_tensor *t, const struct sm70_weight_part *p,
		       int full_cols, int col0, int cols, struct sm70_err *err)
{
	size_t src_esz = sm70_dtype_size(t->dtype), dst_esz = sm70_dtype_size(dt);
	int whole_rows = col0 == 0 && cols == full_cols;
	/* whole rows are one contiguous run; a column window is one run per row */
	int runs = whole_rows ? 1 : p->rows;
	size_t run = whole_rows ? (size_t)p->rows * cols : (size_t)cols;

	if (m->opts.check_only)
		return 0; /* the tensor was found and its shape and dtype checked */
	for (int i = 0; i < runs; i++) {
		const char *src = (const char *)t->data +
				  (((size_t)p->row0 + i) * full_cols + col0) * src_esz;
		char *d = (char *)dst + (size_t)i * run * dst_esz;
		size_t bad, row, col;
		float v;
		int ret;

		if (t->dtype == dt) {
			bad = copy_finite(d, src, dt, run);
		} else {
			ret = convert_weight(m, d, dt, src, t->dtype, run, p->name, &bad, err);
			if (ret)
				return ret;
		}
		if (bad == SIZE_MAX)
			continue;
		row = (size_t)p->row0 + (whole_rows ? bad / (size_t)full_cols : (size_t)i);
		col = whole_rows ? bad % (size_t)full_cols : (size_t)col0 + bad;
		sm70_convert_to_f32(&v, src + bad * src_esz, t->dtype, 1);
		return nonfinite_error(err, p->name, row * (size_t)full_cols + col, row, col, v);
	}
	return 0;
}

int sm70__weight_load(struct sm70_model *m, int r, const struct sm70_ckpt *ck,
		      struct sm70_weight *w, const struct sm70_weight_part *parts, int n,
		      int full_cols, int col0, int cols, struct sm70_err *err)
{
	struct sm70_backend *be = m->rank[r].be;
	const struct sm70_st_tensor **t;
	enum sm70_dtype dt = SM70_DTYPE_BF16;
	size_t esz, total_rows = 0, off = 0;
	uint8_t *host = NULL;
	int ret = 0;

	if (n < 1 || col0 < 0 || cols < 1 || col0 + cols > full_cols)
		return -EINVAL;
	ret = sm70__nvfp4_parts(m, ck, parts, n, full_cols, err);
	if (ret < 0)
		return ret;
	if (ret)
		return sm70__nvfp4_weight_load(m, r, ck, w, parts, n, full_cols, col0, cols, err);
	t = calloc((size_t)n, sizeof(*t));
	if (!t)
		return -ENOMEM;
	for (int i = 0; i < n; i++) {
		if (parts[i].row0 < 0 || parts[i].rows < 1 ||
		    parts[i].row0 + parts[i].rows > parts[i].full_rows) {
			ret = -EINVAL;
			goto out;
		}
		total_rows += (size_t)parts[i].rows;
		if (m->opts.dummy)
			continue;
		int64_t shape[2] = { parts[i].full_rows, full_cols };
		ret = sm70_ckpt_get(ck, parts[i].name, 2, shape, &t[i], err);
		if (ret)
			goto out;
	}
	/* Stacked tensors keep their dtype when they agree, else become f32; a backend that
	 * wants one weight dtype gets that. */
	if (!m->opts.dummy) {
		dt = t[0]->dtype;
		for (int i = 1; i < n; i++)
			if (t[i]->dtype != dt)
				dt = SM70_DTYPE_F32;
	}
	if (be->weight_dtype != SM70_DTYPE_COUNT)
		dt = be->weight_dtype;
	esz = sm70_dtype_size(dt);
	host = malloc(total_rows * (size_t)cols * esz);
	if (!host) {
		ret = sm70_errf(err, -ENOMEM, "out of host memory loading %s", parts[0].name);
		goto out;
	}
	for (int i = 0; i < n; i++) {
		size_t count = (size_t)parts[i].rows * (size_t)cols;
		if (m->opts.dummy) {
			struct dummy_job j = {
				.dst = host + off, .dt = dt,
				.seed = sm70__name_seed(parts[i].name, m->opts.dummy_seed),
				.scale = 1.0f / sqrtf((float)full_cols),
				.full_cols = (size_t)full_cols, .row0 = (size_t)parts[i].row0,
				.rows = (size_t)parts[i].rows, .col0 = (size_t)col0,
				.cols = (size_t)cols,
			};
			dummy_fill(&j);
		} else {
			ret = copy_window(m, host + off, dt, t[i], &parts[i], full_cols, col0, cols,
					  err);
			if (ret)
				goto out;
		}
		off += count * esz;
	}
	w->dtype = dt;
	w->rows = (int)total_rows;
	w->cols = cols;
	w->data = be->ops->buf_alloc(be, off);
	if (!w->data) {
		ret = sm70_errf(err, -ENOMEM, "cannot allocate %zu bytes on %s (rank %d) for %s",
				off, be->name, r, parts[0].name);
		goto out;
	}
	ret = be->ops->upload(be, w->data, host, off);
out:
	free(host);
	free(t);
	return ret;
}

int sm70__f32_load(struct sm70_model *m, int r, const struct sm70_ckpt *ck, float **out,
		   const char *name, int ndim, const int64_t *shape,
		   const struct sm70_row_band *bands, int n_bands, float add, float dummy_base,
		   float dummy_scale, struct sm70_err *err)
{
	struct sm70_backend *be = m->rank[r].be;
	const struct sm70_st_tensor *t = NULL;
	size_t inner = 1, total = 0, off = 0;
	float *host = NULL, *row = NULL;
	uint64_t seed = sm70__name_seed(name, m->opts.dummy_seed);
	int ret = 0;

	*out = NULL;
	if (ndim < 1 || ndim > 4 || n_bands < 1)
		return -EINVAL;
	for (int d = 1; d < ndim; d++)
		inner *= (size_t)shape[d];
	for (int i = 0; i < n_bands; i++) {
		if (bands[i].row0 < 0 || bands[i].rows < 1 ||
		    bands[i].row0 + (int64_t)bands[i].rows > shape[0])
			return -EINVAL;
		total += (size_t)bands[i].rows * inner;
	}
	if (!m->opts.dummy) {
		ret = sm70_ckpt_get(ck, name, ndim, shape, &t, err);
		if (ret)
			return ret;
	}
	host = malloc(total * sizeof(float));
	if (!host)
		return -ENOMEM;
	for (int i = 0; i < n_bands && !m->opts.check_only; i++) {
		size_t n = (size_t)bands[i].rows * inner, first = (size_t)bands[i].row0 * inner;

		row = host + off;
		if (m->opts.dummy) {
			for (size_t k = 0; k < n; k++)
				row[k] = dummy_base + dummy_scale * dummy_at(seed, (uint64_t)(first + k));
		} else {
			sm70_convert_to_f32(row, (const char *)t->data +
					    first * sm70_dtype_size(t->dtype), t->dtype, n);
			for (size_t k = 0; k < n; k++)
				if (!isfinite(row[k])) {
					ret = nonfinite_error(err, name, first + k,
							      (first + k) / inner,
							      (first + k) % inner, row[k]);
					goto out;
				}
		}
		for (size_t k = 0; k < n; k++)
			row[k] += add;
		off += n;
	}
	*out = be->ops->buf_alloc(be, total * sizeof(float));
	if (!*out) {
		ret = sm70_errf(err, -ENOMEM, "cannot allocate %zu bytes on %s (rank %d) for %s",
				total * sizeof(float), be->name, r, name);
		goto out;
	}
	ret = be->ops->upload(be, *out, host, total * sizeof(float));
out:
	free(host);
	return ret;
}

int sm70__norm_load(struct sm70_model *m, int r, const struct sm70_ckpt *ck, float **out,
		    const char *name, int dim, struct sm70_err *err)
{
	int64_t shape[1] = { dim };
	struct sm70_row_band all = { 0, dim };
	/* zero-centred weights scale by 1 + w: the 1 is added here, once */
	float add = m->cfg.zero_centred_norms ? 1.0f : 0.0f;

	return sm70__f32_load(m, r, ck, out, name, 1, shape, &all, 1, add, 1.0f - add, 0.1f,
			      err);
}

int sm70__plain_norm_load(struct sm70_model *m, int r, const struct sm70_ckpt *ck,
			  float **out, const char *name, int dim, struct sm70_err *err)
{
	int64_t shape[1] = { dim };
	struct sm70_row_band all = { 0, dim };

	return sm70__f32_load(m, r, ck, out, name, 1, shape, &all, 1, 0.0f, 1.0f, 0.1f, err);
}

void sm70__weight_free(struct sm70_model *m, int r, struct sm70_weight *w)
{
	struct sm70_backend *be = m->rank[r].be;
	void *bufs[] = { w->data, w->scale, w->row_scale2 };

	for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
		if (bufs[i])
			be->ops->buf_free(be, bufs[i]);
	w->data = NULL;
	w->scale = NULL;
	w->row_scale2 = NULL;
}

/* Fills rows x cols of dst (dt) with tensor `name`'s dummy values at (row0, col0) of a
 * [., full_cols] matrix. */
static void dummy_window(const struct sm70_model *m, void *dst, enum sm70_dtype dt,
			 const char *name, int full_cols, int row0, int rows, int col0, int cols)
{
	struct dummy_job j = {
		.dst = dst, .dt = dt, .seed = sm70__name_seed(name, m->opts.dummy_seed),
		.scale = 1.0f / sqrtf((float)full_cols), .full_cols = (size_t)full_cols,
		.row0 = (size_t)row0, .rows = (size_t)rows, .col0 = (size_t)col0,
		.cols = (size_t)cols,
	};
	dummy_fill(&j);
}

/* One band of an expert matrix: rows [row0, row0 + rows) and columns [col0, col0 + cols)
 * of `t` seen as a [., full_cols] matrix (the fused tensors are [E * R, C] that way), or
 * of the dummy tensor `name`. */
static int expert_band(struct sm70_model *m, void *dst, enum sm70_dtype dt,
		       const struct sm70_st_tensor *t, const char *name, int full_cols, int row0,
		       int rows, int col0, int cols, struct sm70_err *err)
{
	struct sm70_weight_part p = { name, row0 + rows, row0, rows };

	if (m->opts.dummy) {
		dummy_window(m, dst, dt, name, full_cols, row0, rows, col0, cols);
		return 0;
	}
	return copy_window(m, dst, dt, t, &p, full_cols, col0, cols, err);
}

int sm70__load_experts(struct sm70_model *m, int r, const struct sm70_ckpt *ck, const char *p,
		       int n_experts, int inter, int i0, int ni, int hidden,
		       struct sm70_experts *gate_up, struct sm70_experts *down,
		       struct sm70_err *err)
{
	struct sm70_backend *be = m->rank[r].be;
	const struct sm70_st_tensor *fgu = NULL, *fdn = NULL;
	char ngu[192], ndn[192], ng[192], nu[192];
	enum sm70_dtype dt = SM70_DTYPE_BF16;
	size_t gu_bytes, dn_bytes, esz;
	uint8_t *host = NULL;
	int fused, ret = 0;

	snprintf(ngu, sizeof(ngu), "%smlp.experts.gate_up_proj", p);
	snprintf(ndn, sizeof(ndn), "%smlp.experts.down_proj", p);
	ret = sm70__nvfp4_experts(m, ck, p, n_experts, inter, hidden, err);
	if (ret < 0)
		return ret;
	if (ret)
		return sm70__nvfp4_experts_load(m, r, ck, p, n_experts, inter, i0, ni, hidden,
						gate_up, down, err);
	fused = !m->opts.dummy && sm70_ckpt_find(ck, ngu);
	if (fused) {
		int64_t s_gu[3] = { n_experts, 2 * inter, hidden }, s_dn[3] = { n_experts, hidden,
									       inter };
		if ((ret = sm70_ckpt_get(ck, ngu, 3, s_gu, &fgu, err)) ||
		    (ret = sm70_ckpt_get(ck, ndn, 3, s_dn, &fdn, err)))
			return ret;
		dt = fgu->dtype;
	} else if (!m->opts.dummy) {
		const struct sm70_st_tensor *t;
		int64_t s[2] = { inter, hidden };
		snprintf(ng, sizeof(ng), "%smlp.experts.0.gate_proj.weight", p);
		if ((ret = sm70_ckpt_get(ck, ng, 2, s, &t, err)))
			return ret;
		dt = t->dtype;
	}
	if (be->weight_dtype != SM70_DTYPE_COUNT)
		dt = be->weight_dtype;
	esz = sm70_dtype_size(dt);
	*gate_up = (struct sm70_experts){ .dtype = dt, .n_experts = n_experts, .rows = 2 * ni,
					  .cols = hidden };
	*down = (struct sm70_experts){ .dtype = dt, .n_experts = n_experts, .rows = hidden,
				       .cols = ni };
	gu_bytes = (size_t)2 * ni * hidden * esz;
	dn_bytes = (size_t)hidden * ni * esz;
	gate_up->data = be->ops->buf_alloc(be, gu_bytes * (size_t)n_experts);
	down->data = be->ops->buf_alloc(be, dn_bytes * (size_t)n_experts);
	host = malloc(gu_bytes > dn_bytes ? gu_bytes : dn_bytes);
	if (!gate_up->data || !down->data || !host) {
		ret = sm70_errf(err, -ENOMEM, "cannot allocate the %d experts of %s (%zu bytes on "
				"%s, rank %d)", n_experts, p, (gu_bytes + dn_bytes) * n_experts,
				be->name, r);
		goto out;
	}
	/* expert by expert: one expert's rows on the host at a time, however many there are */
	for (int e = 0; e < n_experts && !ret; e++) {
		const struct sm70_st_tensor *tg = fgu, *tu = fgu, *td = fdn;
		int g0 = e * 2 * inter + i0, u0 = e * 2 * inter + inter + i0, d0 = e * hidden;

		if (!fused) {
			int64_t s_gu[2] = { inter, hidden }, s_dn[2] = { hidden, inter };
			snprintf(ng, sizeof(ng), "%smlp.experts.%d.gate_proj.weight", p, e);
			snprintf(nu, sizeof(nu), "%smlp.experts.%d.up_proj.weight", p, e);
			snprintf(ndn, sizeof(ndn), "%smlp.experts.%d.down_proj.weight", p, e);
			g0 = i0;
			u0 = i0;
			d0 = 0;
			if (!m->opts.dummy &&
			    ((ret = sm70_ckpt_get(ck, ng, 2, s_gu, &tg, err)) ||
			     (ret = sm70_ckpt_get(ck, nu, 2, s_gu, &tu, err)) ||
			     (ret = sm70_ckpt_get(ck, ndn, 2, s_dn, &td, err))))
				break;
		}
		if ((ret = expert_band(m, host, dt, tg, fused ? ngu : ng, hidden, g0, ni, 0, hidden,
				       err)) ||
		    (ret = expert_band(m, host + (size_t)ni * hidden * esz, dt, tu,
				       fused ? ngu : nu, hidden, u0, ni, 0, hidden, err)) ||
		    (ret = be->ops->upload(be, (char *)gate_up->data + (size_t)e * gu_bytes, host,
					   gu_bytes)))
			break;
		if ((ret = expert_band(m, host, dt, td, ndn, inter, d0, hidden, i0, ni, err)) ||
		    (ret = be->ops->upload(be, (char *)down->data + (size_t)e * dn_bytes, host,
					   dn_bytes)))
			break;
		/* uploads are asynchronous on device backends: host is reused next expert */
		if ((ret = be->ops->sync(be)))
			break;
	}
out:
	free(host);
	return ret;
}

void sm70__experts_free(struct sm70_model *m, int r, struct sm70_experts *w)
{
	struct sm70_backend *be = m->rank[r].be;
	void *bufs[] = { w->data, w->scale, w->row_scale2 };

	for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
		if (bufs[i])
			be->ops->buf_free(be, bufs[i]);
	w->data = NULL;
	w->scale = NULL;
	w->row_scale2 = NULL;
}
