/* test_comm - tensor parallelism on CUDA: the shard_summary op against the CPU backend's,
 * and the NCCL communicator's all-reduce (P2P path and SM70_ALLREDUCE=nccl) against host
 * sums in rank order, eager, queued back to back and inside graphs replayed with new data. */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/dtype.h"
#include "kernels/backend.h"
#include "kernels/comm.h"

#define GPU_TEST_SEED 0x7e57c0771234ULL
#include "tests/gpu/gpu_test.h"

/*
 * Tolerances. shard_summary: ids, logits, max, n_cand and bad must be equal; the sums are
 * fp32 partial sums in different orders (GPU: per thread, then a tree), so 1e-5 relative.
 * all_reduce: the P2P path adds in rank order in fp32 from 0.0f, like the host reference,
 * so it must be bit-exact; NCCL adds in its own order (f16 possibly in half precision per
 * step), so |got - ref| <= (n - 1) * eps * sum_r |x_r| + tiny, eps = 2^-23 (f32) or 2^-10
 * (f16: one rounding of the result and one per step). Every path must give the same bits
 * on every rank.
 */
#define TOL_SUM 1e-5
#define P2P_MAX_BYTES (1u << 20) /* SM70_ALLREDUCE_P2P_MAX for the communicators made here */

static struct sm70_backend *gpus[SM70_MAX_TP], *cpu;
static int n_gpus;

/* ---- helpers ----------------------------------------------------------------------- */


static void *xmalloc(size_t bytes)
{
	void *p = malloc(bytes ? bytes : 1);

	assert_non_null(p);
	return p;
}

static void up(struct sm70_backend *be, void *dst, const void *src, size_t bytes)
{
	assert_int_equal(be->ops->upload(be, dst, src, bytes), 0);
}

static void down(struct sm70_backend *be, void *dst, const void *src, size_t bytes)
{
	assert_int_equal(be->ops->download(be, dst, src, bytes), 0);
}

static void *up_new(struct sm70_backend *be, const void *src, size_t bytes)
{
	void *p = balloc(be, bytes);

	up(be, p, src, bytes);
	return p;
}

/* ---- shard_summary ------------------------------------------------------------------- */

/* daemon/engine/sampler.c's order: IEEE bits as an order-preserving unsigned, -0 as +0 */
static uint32_t order_key(float f)
{
	uint32_t u;

	memcpy(&u, &f, sizeof(u));
	if (u == 0x80000000u)
		u = 0;
	return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

struct kid {
	uint32_t key;
	int32_t id;
};

static int cmp_kid(const void *a, const void *b)
{
	const struct kid *x = a, *y = b;

	if (x->key != y->key)
		return x->key > y->key ? -1 : 1;
	return x->id < y->id ? -1 : x->id > y->id;
}

enum {
	ROW_RANDOM,	/* uniform in [-8, 8) */
	ROW_COARSE,	/* multiples of 1/4 in [-4, 4]: ties everywhere */
	ROW_NEG_INF,	/* 40% -inf */
	ROW_TOP_TIES,	/* 300 entries equal to the max: ties across the 256th place */
	ROW_FEW_FINITE, /* 10 finite entries, the rest -inf: -inf candidates, lowest ids */
	ROW_ALL_NEG_INF,
	ROW_ZEROS,	/* +0 and -0 only: one key */
	ROW_NAN,	/* one NaN: bad */
	ROW_POS_INF,	/* one +inf: bad */
	ROW_KINDS
};

static void fill_row(float *x, int vocab, int kind)
{
	for (int i = 0; i < vocab; i++) {
		switch (kind) {
		case ROW_COARSE: x[i] = roundf(rnd(4.0f) * 4.0f) / 4.0f; break;
		case ROW_NEG_INF: x[i] = rnd_int(10) < 4 ? -INFINITY : rnd(6.0f); break;
		case ROW_FEW_FINITE:
		case ROW_ALL_NEG_INF: x[i] = -INFINITY; break;
		case ROW_ZEROS: x[i] = rnd_int(2) ? 0.0f : -0.0f; break;
		case ROW_TOP_TIES: x[i] = rnd(3.0f); break;
		default: x[i] = rnd(8.0f); break;
		}
	}
	if (kind == ROW_TOP_TIES)
		for (int k = 0; k < 300; k++)
			x[rnd_int(vocab)] = 7.0f;
	if (kind == ROW_FEW_FINITE)
		for (int k = 0; k < 10; k++)
			x[rnd_int(vocab)] = rnd(2.0f);
	if (kind == ROW_NAN)
		x[rnd_int(vocab)] = NAN;
	if (kind == ROW_POS_INF)
		x[rnd_int(vocab)] = INFINITY;
}

static int same_float(float a, float b)
{
	return a == b || (isnan(a) && isnan(b));
}

static double rel_err(double got, double ref)
{
	if (got == ref)
		return 0.0;
	return fabs(got - ref) / (fabs(ref) > 1e-300 ? fabs(ref) : 1e-300);
}

/*
 * Compares a row's summary from the GPU with the CPU's and with a full sort of the row;
 * returns the worst relative sum error.
 */
static double check_summary(const struct sm70_shard_summary *g, const struct sm70_shard_summary *c,
			    const float *x, int vocab, int id0, int kind, const char *what)
{
	const int k = vocab < SM70_SHARD_CANDS ? vocab : SM70_SHARD_CANDS;
	struct kid *all = xmalloc((size_t)vocab * sizeof(*all));
	double worst = 0.0;

	assert_int_equal(g->n_cand, k);
	assert_int_equal(c->n_cand, k);
	if (g->bad != c->bad || g->bad != (kind == ROW_NAN || kind == ROW_POS_INF))
		printf("  %s kind %d: bad gpu %d cpu %d\n", what, kind, g->bad, c->bad);
	assert_int_equal(g->bad, c->bad);
	assert_int_equal(g->bad, kind == ROW_NAN || kind == ROW_POS_INF);
	if (g->bad) {
		free(all);
		return 0.0; /* nothing else of a bad slice is meaningful */
	}
	if (!same_float(g->max, c->max))
		printf("  %s kind %d: max gpu %.9g cpu %.9g\n", what, kind, g->max, c->max);
	assert_true(same_float(g->max, c->max));
	for (int i = 0; i < vocab; i++)
		all[i] = (struct kid){ order_key(x[i]), i };
	qsort(all, (size_t)vocab, sizeof(*all), cmp_kid);
	for (int i = 0; i < k; i++) {
		if (g->ids[i] != c->ids[i] || g->ids[i] != id0 + all[i].id ||
		    !same_float(g->logits[i], c->logits[i]))
			printf("  %s kind %d: candidate %d: gpu id %d (%.9g) cpu id %d (%.9g) "
			       "sorted id %d\n", what, kind, i, g->ids[i], g->logits[i], c->ids[i],
			       c->logits[i], id0 + all[i].id);
		assert_int_equal(g->ids[i], c->ids[i]);
		assert_int_equal(g->ids[i], id0 + all[i].id);
		assert_true(same_float(g->logits[i], c->logits[i]));
		assert_true(same_float(g->logits[i], x[all[i].id]));
	}
	free(all);
	{
		/* (an all -inf slice: max -inf, both sums 0 on both backends) */
		double e1 = rel_err(g->sum_raw, c->sum_raw), e2 = rel_err(g->sum_temp, c->sum_temp);

		if (!(e1 <= TOL_SUM) || !(e2 <= TOL_SUM))
			printf("  %s kind %d: sum_raw gpu %.12g cpu %.12g, sum_temp gpu %.12g cpu "
			       "%.12g\n", what, kind, g->sum_raw, c->sum_raw, g->sum_temp,
			       c->sum_temp);
		assert_true(e1 <= TOL_SUM);
		assert_true(e2 <= TOL_SUM);
		worst = e1 > e2 ? e1 : e2;
	}
	return worst;
}

static void test_shard_summary(void **state)
{
	static const int vocabs[] = { 1, 255, 256, 257, 37984, 151936 / 2 };
	static const float temps[] = { 0.0f, 0.7f, 1.0f };
	const int n = ROW_KINDS * 3, id0 = 151936 / 2;
	struct sm70_backend *gpu = gpus[0];

	if (!cpu->ops->shard_summary) {
		printf("  the CPU backend has no shard_summary op to compare with\n");
		fail();
	}
	assert_non_null(gpu->ops->shard_summary);
	for (size_t v = 0; v < sizeof(vocabs) / sizeof(vocabs[0]); v++) {
		const int vocab = vocabs[v];
		const size_t nl = (size_t)n * vocab;
		float *x = xmalloc(nl * sizeof(float));
		struct sm70_sample_row rows[ROW_KINDS * 3];
		struct sm70_shard_summary *sg = xmalloc(n * sizeof(*sg));
		struct sm70_shard_summary *sc = xmalloc(n * sizeof(*sc));
		void *xg, *xc, *rg, *rc, *og, *oc;
		double worst = 0.0;
		char what[64];

		memset(rows, 0, sizeof(rows));
		for (int r = 0; r < n; r++) {
			fill_row(x + (size_t)r * vocab, vocab, r % ROW_KINDS);
			rows[r].temperature = temps[r / ROW_KINDS];
			rows[r].top_p = 1.0f;
			rows[r].seed = (uint64_t)r;
		}
		xg = up_new(gpu, x, nl * sizeof(float));
		xc = up_new(cpu, x, nl * sizeof(float));
		rg = up_new(gpu, rows, sizeof(rows));
		rc = up_new(cpu, rows, sizeof(rows));
		og = balloc(gpu, n * sizeof(*sg));
		oc = balloc(cpu, n * sizeof(*sc));
		gpu->ops->shard_summary(gpu, og, xg, rg, n, vocab, id0);
		cpu->ops->shard_summary(cpu, oc, xc, rc, n, vocab, id0);
		down(gpu, sg, og, n * sizeof(*sg));
		down(cpu, sc, oc, n * sizeof(*sc));
		snprintf(what, sizeof(what), "vocab %d", vocab);
		for (int r = 0; r < n; r++) {
			double e = check_summary(&sg[r], &sc[r], x + (size_t)r * vocab, vocab, id0,
						 r % ROW_KINDS, what);

			if (e > worst)
				worst = e;
		}
		printf("  shard_summary vocab %6d id0 %d: %d rows (%d kinds x T 0, 0.7, 1): "
		       "ids, logits, max, bad equal to the CPU's and to a full sort; max rel sum "
		       "err %.2g (tol %.0e)\n", vocab, id0, n, ROW_KINDS, worst, TOL_SUM);

		/* the same op captured in a graph, replayed over new logits */
		if (vocab == 257 || vocab == 37984) {
			void *graph = NULL;

			assert_int_equal(gpu->ops->graph_begin(gpu), 0);
			gpu->ops->shard_summary(gpu, og, xg, rg, n, vocab, id0);
			assert_int_equal(gpu->ops->graph_end(gpu, &graph), 0);
			for (int rep = 0; rep < 2; rep++) {
				for (int r = 0; r < n; r++)
					fill_row(x + (size_t)r * vocab, vocab, r % ROW_KINDS);
				up(gpu, xg, x, nl * sizeof(float));
				up(cpu, xc, x, nl * sizeof(float));
				assert_int_equal(gpu->ops->graph_launch(gpu, graph), 0);
				cpu->ops->shard_summary(cpu, oc, xc, rc, n, vocab, id0);
				down(gpu, sg, og, n * sizeof(*sg));
				down(cpu, sc, oc, n * sizeof(*sc));
				for (int r = 0; r < n; r++)
					check_summary(&sg[r], &sc[r], x + (size_t)r * vocab, vocab,
						      id0, r % ROW_KINDS, "graph replay");
			}
			gpu->ops->graph_destroy(gpu, graph);
			printf("  shard_summary vocab %6d captured in a graph: 2 replays over new "
			       "logits equal to the CPU's\n", vocab);
		}
		gpu->ops->buf_free(gpu, xg), gpu->ops->buf_free(gpu, rg);
		gpu->ops->buf_free(gpu, og);
		cpu->ops->buf_free(cpu, xc), cpu->ops->buf_free(cpu, rc);
		cpu->ops->buf_free(cpu, oc);
		free(x), free(sg), free(sc);
	}
	assert_int_equal(gpu->ops->sync(gpu), 0);
}

/* ---- all_reduce ------------------------------------------------------------------------ */

/* A communicator over every GPU with SM70_ALLREDUCE=mode and the P2P threshold at
 * P2P_MAX_BYTES. */
static struct sm70_comm *make_comm(const char *mode)
{
	struct sm70_comm *c = NULL;
	struct sm70_err err = { { 0 } };
	char max[32];
	int ret;

	snprintf(max, sizeof(max), "%u", P2P_MAX_BYTES);
	setenv("SM70_ALLREDUCE", mode, 1);
	setenv("SM70_ALLREDUCE_P2P_MAX", max, 1);
	ret = sm70_comm_nccl_create(&c, gpus, n_gpus, &err);
	unsetenv("SM70_ALLREDUCE");
	unsetenv("SM70_ALLREDUCE_P2P_MAX");
	if (ret)
		printf("  sm70_comm_nccl_create (SM70_ALLREDUCE=%s): %d: %s\n", mode, ret, err.msg);
	assert_int_equal(ret, 0);
	assert_int_equal(c->n_ranks, n_gpus);
	printf("  communicator over %d GPUs with SM70_ALLREDUCE=%s: \"%s\"\n", n_gpus, mode,
	       c->name);
	if (!strcmp(mode, "nccl"))
		assert_string_equal(c->name, "nccl");
	return c;
}

static size_t esize(enum sm70_dtype dt)
{
	return dt == SM70_DTYPE_F32 ? 4 : 2;
}

static float get_val(enum sm70_dtype dt, const void *p, size_t i)
{
	if (dt == SM70_DTYPE_F32)
		return ((const float *)p)[i];
	return sm70_f16_to_f32(((const uint16_t *)p)[i]);
}

/* count random values (small integers when ints: exact under any summation order). */
static void fill_vals(enum sm70_dtype dt, void *p, size_t count, int ints)
{
	for (size_t i = 0; i < count; i++) {
		float v = ints ? (float)(rnd_int(17) - 8) : rnd(1.0f);

		if (dt == SM70_DTYPE_F32)
			((float *)p)[i] = v;
		else
			((uint16_t *)p)[i] = sm70_f32_to_f16(v);
	}
}

/* One all-reduce's data on every rank: host inputs, device buffers, downloads. */
struct job {
	enum sm70_dtype dt;
	size_t count;
	size_t offset;        /* elements into the allocation (misaligned buffers) */
	int ints;
	void *in[SM70_MAX_TP];
	void *out[SM70_MAX_TP];
	void *base[SM70_MAX_TP];
	void *dev[SM70_MAX_TP];
};

static void job_init(struct job *j, enum sm70_dtype dt, size_t count, size_t offset, int ints)
{
	memset(j, 0, sizeof(*j));
	j->dt = dt;
	j->count = count;
	j->offset = offset;
	j->ints = ints;
	for (int r = 0; r < n_gpus; r++) {
		j->in[r] = xmalloc(count * esize(dt));
		j->out[r] = xmalloc(count * esize(dt));
		j->base[r] = balloc(gpus[r], (count + offset) * esize(dt));
		j->dev[r] = (char *)j->base[r] + offset * esize(dt);
	}
}

/* New inputs, uploaded to every rank. */
static void job_fill(struct job *j)
{
	for (int r = 0; r < n_gpus; r++) {
		fill_vals(j->dt, j->in[r], j->count, j->ints);
		up(gpus[r], j->dev[r], j->in[r], j->count * esize(j->dt));
	}
}

static void job_free(struct job *j)
{
	for (int r = 0; r < n_gpus; r++) {
		gpus[r]->ops->buf_free(gpus[r], j->base[r]);
		free(j->in[r]);
		free(j->out[r]);
	}
}

/*
 * Downloads every rank's result and compares it with the host sum of the inputs in rank
 * order (applied `times` times, for buffers reduced repeatedly), bit-exact when exact.
 */
static void job_check(struct job *j, const struct sm70_comm *c, int times, const char *what)
{
	const size_t es = esize(j->dt), bytes = j->count * es;
	const int exact = strstr(c->name, "p2p") && bytes <= P2P_MAX_BYTES;
	const double eps = j->dt == SM70_DTYPE_F32 ? 0x1p-23 : 0x1p-10;
	double max_err = 0.0, worst_tol = 0.0;
	size_t bad_at = (size_t)-1;

	for (int r = 0; r < n_gpus; r++)
		down(gpus[r], j->out[r], j->dev[r], bytes);
	for (int r = 1; r < n_gpus; r++) {
		if (memcmp(j->out[0], j->out[r], bytes))
			printf("  %s: rank %d differs from rank 0\n", what, r);
		assert_memory_equal(j->out[0], j->out[r], bytes);
	}
	for (size_t i = 0; i < j->count; i++) {
		float s = 0.0f, ref;
		double sum_abs = 0.0, tol, err;

		for (int r = 0; r < n_gpus; r++) {
			s += get_val(j->dt, j->in[r], i);
			sum_abs += fabs(get_val(j->dt, j->in[r], i));
		}
		if (j->dt == SM70_DTYPE_F16)
			s = sm70_f16_to_f32(sm70_f32_to_f16(s));
		/* a buffer reduced again holds n copies of the sum on every rank */
		for (int t = 1; t < times; t++) {
			float s2 = 0.0f;

			for (int r = 0; r < n_gpus; r++)
				s2 += s;
			s = j->dt == SM70_DTYPE_F16 ? sm70_f16_to_f32(sm70_f32_to_f16(s2)) : s2;
			sum_abs *= n_gpus;
		}
		ref = s;
		err = fabs((double)get_val(j->dt, j->out[0], i) - (double)ref);
		tol = exact ? 0.0 : (n_gpus - 1 + (times - 1) * n_gpus) * eps * sum_abs + 0x1p-24;
		if (exact) {
			/* bits, so that even the sign of a zero must agree */
			int same = j->dt == SM70_DTYPE_F32 ?
				!memcmp((const float *)j->out[0] + i, &ref, 4) :
				((const uint16_t *)j->out[0])[i] == sm70_f32_to_f16(ref);

			if (!same && err == 0.0)
				err = 1e-30;
		}
		if (!(err <= tol) && bad_at == (size_t)-1)
			bad_at = i;
		if (err > max_err)
			max_err = err;
		if (tol > worst_tol)
			worst_tol = tol;
	}
	printf("  %-44s %s: max |err| %.3g (%s), identical on %d ranks\n", what, c->name, max_err,
	       exact ? "bit-exact required" : "NCCL order allowed", n_gpus);
	if (bad_at != (size_t)-1)
		printf("  first bad element %zu: got %.9g\n", bad_at,
		       get_val(j->dt, j->out[0], bad_at));
	assert_true(bad_at == (size_t)-1);
}

static const size_t counts[] = { 1, 7, 4096 * 16, 5120 * 8, (size_t)1 << 22 };

/* Eager calls, one at a time, every dtype and count. */
static void run_eager(struct sm70_comm *c)
{
	for (int d = 0; d < 2; d++) {
		const enum sm70_dtype dt = d ? SM70_DTYPE_F16 : SM70_DTYPE_F32;

		for (size_t k = 0; k < sizeof(counts) / sizeof(counts[0]); k++) {
			struct job j;
			char what[64];

			job_init(&j, dt, counts[k], 0, 0);
			job_fill(&j);
			assert_int_equal(c->ops->all_reduce(c, j.dev, j.count, dt), 0);
			snprintf(what, sizeof(what), "eager %s count %zu", sm70_dtype_name(dt),
				 counts[k]);
			job_check(&j, c, 1, what);
			job_free(&j);
		}
	}
}

/* Many calls queued without a host wait: the P2P slots alternate and are reused while
 * peers may be a call ahead; sizes straddle the threshold; one buffer is misaligned and
 * one is reduced twice in a row. */
static void run_queued(struct sm70_comm *c)
{
	enum { NJ = 12 };
	struct job j[NJ];
	char what[64];

	for (int i = 0; i < NJ; i++) {
		const enum sm70_dtype dt = i % 2 ? SM70_DTYPE_F16 : SM70_DTYPE_F32;
		const size_t count = i == NJ - 1 ? (size_t)3 << 18 : (size_t)(rnd_int(40000) + 1);

		job_init(&j[i], dt, count, i == 3 ? 1 : 0, i == 5);
		job_fill(&j[i]);
	}
	for (int i = 0; i < NJ; i++) {
		assert_int_equal(c->ops->all_reduce(c, j[i].dev, j[i].count, j[i].dt), 0);
		if (i == 5) /* again: n copies of the sum */
			assert_int_equal(c->ops->all_reduce(c, j[i].dev, j[i].count, j[i].dt), 0);
	}
	for (int i = 0; i < NJ; i++) {
		snprintf(what, sizeof(what), "queued #%d %s count %zu%s", i,
			 sm70_dtype_name(j[i].dt), j[i].count,
			 i == 3 ? " misaligned" : i == 5 ? " twice" : "");
		job_check(&j[i], c, i == 5 ? 2 : 1, what);
		job_free(&j[i]);
	}
}

/* Captured on every rank, replayed 3 times over new contents, with eager calls between
 * the replays (the device-side epochs must keep graphs and eager calls in step). */
static void run_graph(struct sm70_comm *c)
{
	struct job a, b, big, odd, eager;
	void *graph[SM70_MAX_TP] = { NULL };

	job_init(&a, SM70_DTYPE_F16, 5120 * 8, 0, 0);
	job_init(&b, SM70_DTYPE_F32, 4096 * 16, 0, 0);
	job_init(&big, SM70_DTYPE_F16, (size_t)1 << 20, 0, 0); /* 2 MiB: NCCL in both modes */
	job_init(&odd, SM70_DTYPE_F16, 7, 1, 0);
	job_init(&eager, SM70_DTYPE_F32, 5120, 0, 0);
	for (int r = 0; r < n_gpus; r++) {
		assert_non_null(gpus[r]->ops->graph_begin);
		assert_int_equal(gpus[r]->ops->graph_begin(gpus[r]), 0);
	}
	assert_int_equal(c->ops->all_reduce(c, a.dev, a.count, a.dt), 0);
	assert_int_equal(c->ops->all_reduce(c, b.dev, b.count, b.dt), 0);
	assert_int_equal(c->ops->all_reduce(c, big.dev, big.count, big.dt), 0);
	assert_int_equal(c->ops->all_reduce(c, odd.dev, odd.count, odd.dt), 0);
	for (int r = 0; r < n_gpus; r++)
		assert_int_equal(gpus[r]->ops->graph_end(gpus[r], &graph[r]), 0);
	for (int rep = 0; rep < 3; rep++) {
		char what[64];

		job_fill(&a), job_fill(&b), job_fill(&big), job_fill(&odd), job_fill(&eager);
		for (int r = 0; r < n_gpus; r++)
			assert_int_equal(gpus[r]->ops->graph_launch(gpus[r], graph[r]), 0);
		assert_int_equal(c->ops->all_reduce(c, eager.dev, eager.count, eager.dt), 0);
		snprintf(what, sizeof(what), "graph replay %d: f16 5120x8", rep);
		job_check(&a, c, 1, what);
		snprintf(what, sizeof(what), "graph replay %d: f32 4096x16", rep);
		job_check(&b, c, 1, what);
		snprintf(what, sizeof(what), "graph replay %d: f16 1<<20", rep);
		job_check(&big, c, 1, what);
		snprintf(what, sizeof(what), "graph replay %d: f16 7 misaligned", rep);
		job_check(&odd, c, 1, what);
		snprintf(what, sizeof(what), "eager after replay %d: f32 5120", rep);
		job_check(&eager, c, 1, what);
	}
	for (int r = 0; r < n_gpus; r++)
		gpus[r]->ops->graph_destroy(gpus[r], graph[r]);
	job_free(&a), job_free(&b), job_free(&big), job_free(&odd), job_free(&eager);
}

static int enough_gpus(void)
{
	if (n_gpus >= 2)
		return 1;
	printf("  SKIP: all_reduce needs 2 GPUs, %d present\n", n_gpus);
	return 0;
}

static void test_allreduce(const char *mode)
{
	struct sm70_comm *c;

	if (!enough_gpus())
		return;
	c = make_comm(mode);
	if (!strcmp(mode, "auto") && strcmp(c->name, "nccl+p2p"))
		printf("  note: no P2P path on this machine (see the line above); NCCL alone\n");
	run_eager(c);
	run_queued(c);
	run_graph(c);
	{
		void *none[SM70_MAX_TP] = { NULL };

		assert_int_equal(c->ops->all_reduce(c, none, 4, SM70_DTYPE_BF16), -EINVAL);
	}
	for (int r = 0; r < n_gpus; r++)
		assert_int_equal(gpus[r]->ops->sync(gpus[r]), 0);
	sm70_comm_destroy(c);
}

static void test_allreduce_p2p(void **state)
{
	test_allreduce("auto");
}

static void test_allreduce_nccl(void **state)
{
	test_allreduce("nccl");
}

/* Bad groups are refused with a message: a CPU rank, one GPU twice, an unknown mode. */
static void test_create_errors(void **state)
{
	struct sm70_backend *two[2] = { gpus[0], gpus[0] }, *mixed[2] = { gpus[0], cpu };
	static struct sm70_comm dummy;
	struct sm70_comm *c = &dummy; /* create must clear it on failure */
	struct sm70_err err = { { 0 } };

	assert_int_equal(sm70_comm_nccl_create(&c, two, 2, &err), -EINVAL);
	assert_null(c);
	printf("  the same GPU twice: %s\n", err.msg);
	sm70_err_clear(&err);
	assert_int_equal(sm70_comm_nccl_create(&c, mixed, 2, &err), -EINVAL);
	printf("  a CPU rank: %s\n", err.msg);
	sm70_err_clear(&err);
	assert_int_equal(sm70_comm_nccl_create(&c, gpus, 0, &err), -EINVAL);
	sm70_err_clear(&err);
	setenv("SM70_ALLREDUCE", "fast", 1);
	assert_int_equal(sm70_comm_nccl_create(&c, gpus, 1, &err), -EINVAL);
	unsetenv("SM70_ALLREDUCE");
	printf("  SM70_ALLREDUCE=fast: %s\n", err.msg);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_shard_summary),
		cmocka_unit_test(test_create_errors),
		cmocka_unit_test(test_allreduce_p2p),
		cmocka_unit_test(test_allreduce_nccl),
	};
	struct sm70_err err = { { 0 } };
	int ret;

	for (; n_gpus < SM70_MAX_TP; n_gpus++) {
		sm70_err_clear(&err);
		ret = sm70_backend_cuda_create(&gpus[n_gpus], n_gpus, &err);
		if (ret)
			break;
	}
	if (n_gpus == 0) {
		printf("SKIP: no CUDA device (%s)\n", err.msg);
		return 0;
	}
	printf("%d CUDA backend(s) made (GPUs 0..%d)\n", n_gpus, n_gpus - 1);
	if (sm70_backend_cpu_create(&cpu, 0, &err)) {
		fprintf(stderr, "cpu backend: %s\n", err.msg);
		ret = 1;
		goto out;
	}
	ret = cmocka_run_group_tests(tests, NULL, NULL);
	/* A sticky error from any launch fails the run even if every compare passed. */
	for (int r = 0; r < n_gpus; r++) {
		if (gpus[r]->ops->sync(gpus[r])) {
			fprintf(stderr, "a CUDA error was recorded on GPU %d during the run\n", r);
			ret = 1;
		}
	}
out:
	sm70_backend_destroy(cpu);
	for (int r = n_gpus - 1; r >= 0; r--)
		sm70_backend_destroy(gpus[r]);
	return ret;
}
