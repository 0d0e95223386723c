/*
 * moe_route_test.h - the GPU MoE tests' routes: a route's arrays in backend memory, a host
 * copy of one (downloaded, uploaded to another backend), and the comparison of two (every
 * array bit for bit, the weights by relative error). Included after gpu_test.h.
 */
#ifndef SM70_TESTS_GPU_MOE_ROUTE_TEST_H
#define SM70_TESTS_GPU_MOE_ROUTE_TEST_H

/* A route's arrays for nk assignments in backend memory. */
static inline void route_new(struct sm70_backend *be, struct sm70_moe_route *r, size_t nk)
{
	r->ids = balloc(be, sizeof(int32_t) * nk);
	r->w = balloc(be, sizeof(float) * nk);
	r->order = balloc(be, sizeof(int32_t) * nk);
	r->used = balloc(be, sizeof(int32_t) * nk);
	r->used_first = balloc(be, sizeof(int32_t) * (nk + 1));
	r->n_used = balloc(be, sizeof(int32_t));
}

static inline void route_free(struct sm70_backend *be, struct sm70_moe_route *r)
{
	bfree(be, r->n_used);
	bfree(be, r->used_first);
	bfree(be, r->used);
	bfree(be, r->order);
	bfree(be, r->w);
	bfree(be, r->ids);
}

/* A host copy of a route (n_used in n_used[0]). */
struct hroute {
	int32_t *ids, *order, *used, *used_first, n_used[1];
	float *w;
	size_t nk;
};

static inline void route_get(struct sm70_backend *be, const struct sm70_moe_route *r, size_t nk,
		      struct hroute *h)
{
	h->nk = nk;
	h->ids = malloc(sizeof(int32_t) * nk);
	h->order = malloc(sizeof(int32_t) * nk);
	h->used = malloc(sizeof(int32_t) * nk);
	h->used_first = malloc(sizeof(int32_t) * (nk + 1));
	h->w = malloc(sizeof(float) * nk);
	assert_true(h->ids && h->order && h->used && h->used_first && h->w);
	assert_int_equal(be->ops->download(be, h->ids, r->ids, sizeof(int32_t) * nk), 0);
	assert_int_equal(be->ops->download(be, h->w, r->w, sizeof(float) * nk), 0);
	assert_int_equal(be->ops->download(be, h->order, r->order, sizeof(int32_t) * nk), 0);
	assert_int_equal(be->ops->download(be, h->n_used, r->n_used, sizeof(int32_t)), 0);
	assert_true(h->n_used[0] >= 0 && (size_t)h->n_used[0] <= nk);
	assert_int_equal(be->ops->download(be, h->used, r->used,
					   sizeof(int32_t) * (size_t)h->n_used[0]), 0);
	assert_int_equal(be->ops->download(be, h->used_first, r->used_first,
					   sizeof(int32_t) * (size_t)(h->n_used[0] + 1)), 0);
}

static inline void hroute_free(struct hroute *h)
{
	free(h->ids), free(h->order), free(h->used), free(h->used_first), free(h->w);
}

/* A host route into a backend's route arrays (the same route for both backends). */
static inline void route_put(struct sm70_backend *be, const struct sm70_moe_route *r,
		      const struct hroute *h)
{
	const size_t nk = h->nk;

	assert_int_equal(be->ops->upload(be, r->ids, h->ids, sizeof(int32_t) * nk), 0);
	assert_int_equal(be->ops->upload(be, r->w, h->w, sizeof(float) * nk), 0);
	assert_int_equal(be->ops->upload(be, r->order, h->order, sizeof(int32_t) * nk), 0);
	assert_int_equal(be->ops->upload(be, r->used, h->used,
					 sizeof(int32_t) * (size_t)(h->n_used[0] ? h->n_used[0] : 1)),
			 0);
	assert_int_equal(be->ops->upload(be, r->used_first, h->used_first,
					 sizeof(int32_t) * (size_t)(h->n_used[0] + 1)), 0);
	assert_int_equal(be->ops->upload(be, r->n_used, h->n_used, sizeof(int32_t)), 0);
}

/* Whether two host routes agree: everything but w bit for bit; returns max |dw| / |w|. */
static inline double route_compare(const struct hroute *g, const struct hroute *c)
{
	double rel = 0.0;

	assert_memory_equal(g->ids, c->ids, sizeof(int32_t) * c->nk);
	assert_memory_equal(g->order, c->order, sizeof(int32_t) * c->nk);
	assert_int_equal(g->n_used[0], c->n_used[0]);
	assert_memory_equal(g->used, c->used, sizeof(int32_t) * (size_t)c->n_used[0]);
	assert_memory_equal(g->used_first, c->used_first,
			    sizeof(int32_t) * (size_t)(c->n_used[0] + 1));
	for (size_t i = 0; i < c->nk; i++) {
		double d = fabs((double)g->w[i] - (double)c->w[i]);

		d = c->w[i] != 0.0f ? d / fabs((double)c->w[i]) : d;
		if (!(d <= rel))
			rel = d; /* NaN sticks */
	}
	return rel;
}

#endif
