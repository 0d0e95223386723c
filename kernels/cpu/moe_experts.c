/*
 * moe_experts.c - the CPU moe_experts op: each token's k routed SwiGLU experts, weighted
 * and summed.
 *
 * Three pool runs, each output element written by exactly one task with one fixed
 * sequence of f32 operations, so the result is bitwise the same for any thread count:
 *  1. tasks (used expert u, intermediate row i): expert e = used[u]'s gate row i and up
 *     row inter + i, converted to f32 once, are dotted against x[t] of every assignment
 *     a = t * k + j of e (order[used_first[u] .. used_first[u + 1]]):
 *     mid[a][i] = silu(g) * u, silu(g) = g / (1 + expf(-g)) as silu_mul.
 *  2. tasks (u, hidden row h): down row h of e against mid[a] of the same assignments:
 *     part[a][h] = (down_h . mid[a]) * w[a].
 *  3. tasks (token t): out[t] = part[t * k] + part[t * k + 1] + ... in j order.
 * Grouping by expert means a weight row is read and widened once per step however many
 * tokens chose its expert (prefill), and experts no token chose are never read. Dots
 * are sm70__cpu_dot (8 lanes, fixed tree), as matmul.
 *
 * f16 / bf16 rows are widened into the thread's scratch slice; without scratch (tests:
 * scratch_off) each dot widens its row in stack pieces, which gives the same bits.
 *
 * NVFP4 stacks (struct sm70_experts; prepare_experts here keeps ModelOpt's layout per
 * expert, copied) are widened the same way, each element dequantised in f32 as
 * (e2m1 * e4m3) * row_scale2[e][r]: the first product is exact (at most 6 significant
 * bits), so every element is the correctly rounded W[e][r][c], as matmul_nvfp4.c's.
 *
 * Non-goals: other quantised formats, fusing the three passes (the reference favours plain
 * loops), ids outside the route's own grouping.
 */
#include <errno.h>
#include <math.h>

#include "kernels/cpu/cpu_ops.h"

/* Stack piece of the no-scratch path, in elements (a multiple of 16: whole NVFP4 blocks,
 * and of 8 as sm70__cpu_dot8 needs). */
#define EXPERTS_PIECE 512

struct experts_job {
	float *out;
	const float *x;
	const struct sm70_experts *gate_up;
	const struct sm70_experts *down;
	const struct sm70_moe_route *route;
	int n;
	int k;
	int inter;
	int hidden;
	float *mid;
	float *part;
	float *scratch; /* NULL: widen in stack pieces */
	size_t stride;
};

static const float e2m1_mag[8] = { 0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f };

/* dst[0..m) = elements c0 .. c0 + m of NVFP4 row r of expert e (c0, m multiples of 16). */
static void nvfp4_widen(float *restrict dst, const struct sm70_experts *s, int e, int r,
			int c0, int m)
{
	const size_t row = (size_t)e * (size_t)s->rows + (size_t)r;
	const uint8_t *codes = (const uint8_t *)s->data + row * (size_t)(s->cols / 2);
	const uint8_t *scales = (const uint8_t *)s->scale + row * (size_t)(s->cols / 16);
	const float rs2 = s->row_scale2[row];

	for (int c = 0; c < m; c++) {
		const int k = c0 + c;
		const uint8_t code = (uint8_t)((codes[k / 2] >> (4 * (k & 1))) & 15);
		const float v = (code & 8) ? -e2m1_mag[code & 7] : e2m1_mag[code & 7];

		dst[c] = (v * sm70__e4m3_lut[scales[k / 16]]) * rs2;
	}
}

/* dst[0..m) = elements c0 .. c0 + m of row r of expert e of s, as f32. */
static void row_widen(float *restrict dst, const struct sm70_experts *s, int e, int r, int c0,
		      int m)
{
	const size_t esz = sm70_dtype_size(s->dtype);

	if (s->dtype == SM70_DTYPE_NVFP4) {
		nvfp4_widen(dst, s, e, r, c0, m);
		return;
	}
	sm70__cpu_row_to_f32(dst, (const char *)s->data +
					  (((size_t)e * (size_t)s->rows + (size_t)r) *
						   (size_t)s->cols + (size_t)c0) * esz,
			     s->dtype, (size_t)m);
}

/* Row r of expert e as f32: the stored row itself when it is f32, else widened into buf;
 * NULL when there is no buf (the dot then widens it piece by piece). */
static const float *row_f32(float *buf, const struct sm70_experts *s, int e, int r)
{
	if (s->dtype == SM70_DTYPE_F32)
		return (const float *)s->data + ((size_t)e * (size_t)s->rows + (size_t)r) *
							(size_t)s->cols;
	if (!buf)
		return NULL;
	row_widen(buf, s, e, r, 0, s->cols);
	return buf;
}

/* x . row r of expert e: sm70__cpu_dot on rf when it is set, else the same sum with the
 * row widened in EXPERTS_PIECE pieces (the same sm70__cpu_dot8 sequence, so the same
 * bits). */
static float row_dot(const float *x, const float *rf, const struct sm70_experts *s, int e,
		     int r)
{
	const int n = s->cols;
	float acc[8] = { 0 }, buf[EXPERTS_PIECE];

	if (rf)
		return sm70__cpu_dot(x, rf, n);
	for (int c = 0;; c += EXPERTS_PIECE) {
		const int m = n - c < EXPERTS_PIECE ? n - c : EXPERTS_PIECE, m8 = m & ~7;

		row_widen(buf, s, e, r, c, m);
		sm70__cpu_dot8(acc, x + c, buf, m8);
		if (c + m == n)
			return sm70__cpu_dot_end(acc, x + c + m8, buf + m8, m - m8);
	}
}

static void experts_gate_up(void *ctx, int begin, int end, int thread)
{
	const struct experts_job *j = ctx;
	const struct sm70_moe_route *r = j->route;
	const int H = j->hidden, I = j->inter;
	const struct sm70_experts *s = j->gate_up;
	float *buf = j->scratch ? j->scratch + (size_t)thread * j->stride : NULL;

	for (int item = begin; item < end; item++) {
		const int u = item / I, i = item % I, e = r->used[u];
		const float *gf = row_f32(buf, s, e, i);
		const float *uf = row_f32(buf ? buf + H : NULL, s, e, I + i);

		for (int o = r->used_first[u]; o < r->used_first[u + 1]; o++) {
			const int a = r->order[o];
			const float *x = j->x + (size_t)(a / j->k) * (size_t)H;
			const float g = row_dot(x, gf, s, e, i), up = row_dot(x, uf, s, e, I + i);

			j->mid[(size_t)a * I + i] = (g / (1.0f + expf(-g))) * up;
		}
	}
}

static void experts_down(void *ctx, int begin, int end, int thread)
{
	const struct experts_job *j = ctx;
	const struct sm70_moe_route *r = j->route;
	const int H = j->hidden, I = j->inter;
	float *buf = j->scratch ? j->scratch + (size_t)thread * j->stride : NULL;

	for (int item = begin; item < end; item++) {
		const int u = item / H, h = item % H, e = r->used[u];
		const float *df = row_f32(buf, j->down, e, h);

		for (int o = r->used_first[u]; o < r->used_first[u + 1]; o++) {
			const int a = r->order[o];

			j->part[(size_t)a * H + h] =
				row_dot(j->mid + (size_t)a * I, df, j->down, e, h) * r->w[a];
		}
	}
}

static void experts_sum(void *ctx, int begin, int end, int thread)
{
	const struct experts_job *j = ctx;
	const size_t H = (size_t)j->hidden;

	for (int tok = begin; tok < end; tok++) {
		float *restrict o = j->out + (size_t)tok * H;
		const float *restrict p = j->part + (size_t)tok * (size_t)j->k * H;

		memcpy(o, p, sizeof(float) * H);
		for (int jj = 1; jj < j->k; jj++) {
			const float *restrict q = p + (size_t)jj * H;

			for (size_t c = 0; c < H; c++)
				o[c] += q[c];
		}
	}
}

/* Whether the route's grouping can be walked safely: experts in range, assignments in
 * [0, nk), ascending group bounds. */
static int experts_route_ok(const struct sm70_moe_route *r, int nk, int n_experts)
{
	const int nu = r->n_used[0];

	if (nu < 0 || nu > nk || r->used_first[0] != 0 || r->used_first[nu] != nk)
		return 0;
	for (int u = 0; u < nu; u++)
		if (r->used[u] < 0 || r->used[u] >= n_experts ||
		    r->used_first[u + 1] < r->used_first[u])
			return 0;
	for (int i = 0; i < nk; i++)
		if (r->order[i] < 0 || r->order[i] >= nk)
			return 0;
	return 1;
}

/* Whether gate_up and down are both float stacks (f32, f16, bf16), or both NVFP4 stacks
 * as prepare_experts makes them. */
static int experts_dtypes_ok(const struct sm70_experts *gu, const struct sm70_experts *dn)
{
	const int fp4_gu = gu->dtype == SM70_DTYPE_NVFP4, fp4_dn = dn->dtype == SM70_DTYPE_NVFP4;

	if (fp4_gu != fp4_dn)
		return 0;
	if (!fp4_gu)
		return sm70_dtype_size(gu->dtype) && sm70_dtype_size(dn->dtype);
	return gu->cols % 16 == 0 && dn->cols % 16 == 0 && gu->scale && dn->scale &&
	       gu->row_scale2 && dn->row_scale2;
}

/* See backend.h. gate_up and down must be stacks of the same n_experts (float dtypes, or
 * NVFP4 both), gate_up rows even, down [hidden][inter] with hidden = gate_up->cols, and
 * the route a grouping as moe_route writes it (otherwise nothing is computed). out must
 * not overlap x, mid or part. */
void sm70__cpu_moe_experts(struct sm70_backend *be, void *out, const void *x,
			   const struct sm70_experts *gate_up, const struct sm70_experts *down,
			   const struct sm70_moe_route *route, int n, int k, void *mid,
			   float *part)
{
	struct sm70__cpu *c = sm70__cpu_of(be);
	struct experts_job j = { .out = out, .x = x, .gate_up = gate_up, .down = down,
				 .route = route, .n = n, .k = k, .inter = gate_up->rows / 2,
				 .hidden = gate_up->cols, .mid = mid, .part = part };
	size_t per_use, nk = (size_t)n * (size_t)k;
	int nu;

	if (n <= 0 || k < 1 || gate_up->rows < 2 || gate_up->rows % 2 || gate_up->cols < 1 ||
	    down->rows != gate_up->cols || down->cols != j.inter ||
	    down->n_experts != gate_up->n_experts || nk > (size_t)INT32_MAX ||
	    !experts_dtypes_ok(gate_up, down) || !experts_route_ok(route, (int)nk, gate_up->n_experts))
		return;
	nu = route->n_used[0];
	if (gate_up->dtype != SM70_DTYPE_F32 || down->dtype != SM70_DTYPE_F32) {
		size_t need = 2 * (size_t)j.hidden > (size_t)j.inter ? 2 * (size_t)j.hidden
								      : (size_t)j.inter;

		j.scratch = sm70__cpu_scratch(c, need);
		j.stride = c->scratch_stride;
	}
	/* an expert's tasks do its rows once and its assignments' dots: nk / nu on average */
	per_use = nk / (size_t)(nu ? nu : 1) + 1;
	sm70__pool_run(c->pool, nu * j.inter,
		       sm70__cpu_grain(2 * (size_t)j.hidden * per_use), experts_gate_up, &j);
	sm70__pool_run(c->pool, nu * j.hidden, sm70__cpu_grain((size_t)j.inter * per_use),
		       experts_down, &j);
	sm70__pool_run(c->pool, n, sm70__cpu_grain((size_t)k * (size_t)j.hidden), experts_sum,
		       &j);
}

/* ---- prepare_experts ------------------------------------------------------------------ */

/* See backend.h: the CPU keeps ModelOpt's layout per expert, copied into new backend
 * memory with the row scales. */
int sm70__cpu_prepare_experts(struct sm70_backend *be, struct sm70_experts *out,
			      const struct sm70_experts *src, struct sm70_err *err)
{
	int ret = sm70__nvfp4_experts_check(src, err);
	size_t rows, n_codes, n_scales;

	*out = (struct sm70_experts){ .dtype = SM70_DTYPE_NVFP4 };
	if (ret)
		return ret;
	rows = (size_t)src->n_experts * (size_t)src->rows;
	n_codes = rows * (size_t)(src->cols / 2);
	n_scales = rows * (size_t)(src->cols / 16);
	out->data = be->ops->buf_alloc(be, n_codes);
	out->scale = be->ops->buf_alloc(be, n_scales);
	out->row_scale2 = be->ops->buf_alloc(be, rows * sizeof(float));
	if (!out->data || !out->scale || !out->row_scale2) {
		be->ops->buf_free(be, out->row_scale2);
		be->ops->buf_free(be, out->scale);
		be->ops->buf_free(be, out->data);
		*out = (struct sm70_experts){ .dtype = SM70_DTYPE_NVFP4 };
		return sm70_errf(err, -ENOMEM, "nvfp4 experts [%d][%d, %d]: out of memory",
				 src->n_experts, src->rows, src->cols);
	}
	memcpy(out->data, src->data, n_codes);
	memcpy(out->scale, src->scale, n_scales);
	memcpy(out->row_scale2, src->row_scale2, rows * sizeof(float));
	out->n_experts = src->n_experts;
	out->rows = src->rows;
	out->cols = src->cols;
	return 0;
}
