/*
 * load_check.c - the no-op backend op table of a check-only load (see load_check.h).
 */
#include "daemon/engine/load_check.h"

/* The address every allocation of a check-only load returns (--check-config reads no
 * weight data): the loaders only pass it back to upload and buf_free, which do nothing. */
static _Alignas(64) unsigned char no_data[64];

static void *check_alloc(struct sm70_backend *be, size_t bytes)
{
	return no_data;
}

static void check_free(struct sm70_backend *be, void *p)
{
}

static int check_copy(struct sm70_backend *be, void *dst, const void *src, size_t bytes)
{
	return 0;
}

static int check_sync(struct sm70_backend *be)
{
	return 0;
}

static int check_register(struct sm70_backend *be, void *p, size_t bytes)
{
	return 0;
}

static void check_unregister(struct sm70_backend *be, void *p)
{
}

static int check_prepare_weight(struct sm70_backend *be, struct sm70_weight *w_out,
				const struct sm70_weight *host, struct sm70_err *err)
{
	*w_out = *host;
	w_out->data = no_data;
	w_out->scale = no_data;
	w_out->row_scale2 = host->row_scale2 ? (float *)no_data : NULL;
	return 0;
}

static int check_prepare_experts(struct sm70_backend *be, struct sm70_experts *out,
				 const struct sm70_experts *host, struct sm70_err *err)
{
	*out = *host;
	out->data = no_data;
	out->scale = no_data;
	out->row_scale2 = (float *)no_data;
	return 0;
}

void sm70__load_check_ops(struct sm70_backend_ops *out, const struct sm70_backend_ops *orig)
{
	*out = *orig;
	out->buf_alloc = check_alloc;
	out->buf_free = check_free;
	out->upload = check_copy;
	out->download = check_copy;
	out->sync = check_sync;
	if (orig->host_register) {
		out->host_register = check_register;
		out->host_unregister = check_unregister;
	}
	if (orig->prepare_weight)
		out->prepare_weight = check_prepare_weight;
	if (orig->prepare_experts)
		out->prepare_experts = check_prepare_experts;
}
