/*
 * load_check.h - the backend op table of a check-only load (sm70_engine_check): the model's
 * loaders run their lookups and rules as in a real load, while every allocation, copy
 * and NVFP4 repacking on the backend is a no-op, so nothing of the weights is read,
 * placed or kept.
 */
#ifndef SM70_ENGINE_LOAD_CHECK_H
#define SM70_ENGINE_LOAD_CHECK_H

#include "kernels/backend.h"

/* *out = *orig with buf_alloc returning one shared address (never NULL; never to be
 * dereferenced), buf_free, upload, download, sync, host_register and host_unregister
 * doing nothing, and prepare_weight / prepare_experts (where orig has them) giving
 * that address for their buffers. Compute ops are left as they are: a load calls none. */
void sm70__load_check_ops(struct sm70_backend_ops *out, const struct sm70_backend_ops *orig);

#endif
