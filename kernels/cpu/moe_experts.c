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
 * Non-goals: quantised experts, fusing the three passes (the reference favours plain
 * loops), ids outside the route's own grouping.
 */
#include <math.h>

#include "kernels/cpu/cpu_ops.h"

/* Stack piece of the no-scratch path, in elements (a multiple of 8). */
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

/* Row r of expert e of s, as stored. */
static const void *expert_row(const struct sm70_experts *s, int e, int r)
{
	return (const char *)s->data + ((size_t)e * (size_t)s->rows + (size_t)r) *
					       (size_t)s->cols * sm70_dtype_size(s->dtype);
}

/* The row as f32: itself when stored f32, else widened into buf; NULL when there is no
 * buf (the dot then widens it piece by piece). */
static const float *row_f32(float *buf, const void *row, enum sm70_dtype t, int n)
{
	if (t == SM70_DTYPE_F32)
		return row;
	if (!buf)
		return NULL;
	sm70__cpu_row_to_f32(buf, row, t, (size_t)n);
	return buf;
}

/* x . row over n elements: sm70__cpu_dot on rf when it is set, else the same sum with
 * row widened in EXPERTS_PIECE pieces (the same sm70__cpu_dot8 sequence, so the same
 * bits). */
static float row_dot(const float *x, const float *rf, const void *row, enum sm70_dtype t,
		     int n)
{
	const size_t esz = sm70_dtype_size(t);
	float acc[8] = { 0 }, buf[EXPERTS_PIECE];

	if (rf)
		return sm70__cpu_dot(x, rf, n);
	for (int c = 0;; c += EXPERTS_PIECE) {
		const int m = n - c < EXPERTS_PIECE ? n - c : EXPERTS_PIECE, m8 = m & ~7;

		sm70__cpu_row_to_f32(buf, (const char *)row + (size_t)c * esz, t, (size_t)m);
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
	const enum sm70_dtype t = j->gate_up->dtype;
	float *buf = j->scratch ? j->scratch + (size_t)thread * j->stride : NULL;

	for (int item = begin; item < end; item++) {
		const int u = item / I, i = item % I, e = r->used[u];
		const void *gr = expert_row(j->gate_up, e, i), *ur = expert_row(j->gate_up, e, I + i);
		const float *gf = row_f32(buf, gr, t, H);
		const float *uf = row_f32(buf ? buf + H : NULL, ur, t, H);

		for (int o = r->used_first[u]; o < r->used_first[u + 1]; o++) {
			const int a = r->order[o];
			const float *x = j->x + (size_t)(a / j->k) * (size_t)H;
			const float g = row_dot(x, gf, gr, t, H), up = row_dot(x, uf, ur, t, H);

			j->mid[(size_t)a * I + i] = (g / (1.0f + expf(-g))) * up;
		}
	}
}

static void experts_down(void *ctx, int begin, int end, int thread)
{
	const struct experts_job *j = ctx;
	const struct sm70_moe_route *r = j->route;
	const int H = j->hidden, I = j->inter;
	const enum sm70_dtype t = j->down->dtype;
	float *buf = j->scratch ? j->scratch + (size_t)thread * j->stride : NULL;

	for (int item = begin; item < end; item++) {
		const int u = item / H, h = item % H;
		const void *dr = expert_row(j->down, r->used[u], h);
		const float *df = row_f32(buf, dr, t, I);

		for (int o = r->used_first[u]; o < r->used_first[u + 1]; o++) {
			const int a = r->order[o];

			j->part[(size_t)a * H + h] =
				row_dot(j->mid + (size_t)a * I, df, dr, t, I) * r->w[a];
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

/* See backend.h. gate_up and down must be stacks of the same n_experts, gate_up rows
 * even, down [hidden][inter] with hidden = gate_up->cols, and the route a grouping as
 * moe_route writes it (otherwise nothing is computed). out must not overlap x, mid or
 * part. */
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
	    !experts_route_ok(route, (int)nk, gate_up->n_experts))
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
