/*
 * safetensors.h - read-only, memory-mapped safetensors files, validated on open.
 *
 * Format: 8-byte little-endian header length N, N bytes of JSON mapping tensor names to
 * {dtype, shape, data_offsets:[begin,end]} (offsets relative to the byte after the
 * header), then the data. sm70_st_open checks everything a lying file could get wrong
 * (header length past the end, offsets out of range, overlapping or mis-sized ranges,
 * unknown dtypes, bad shapes) so that callers can trust every tensor it returns.
 *
 * Non-goals: writing files, big-endian hosts.
 */
#ifndef SM70_ENGINE_SAFETENSORS_H
#define SM70_ENGINE_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "common/dtype.h"
#include "common/err.h"

#define SM70_ST_MAX_DIMS 8

struct sm70_st_tensor {
	const char *name;      /* owned by the file */
	enum sm70_dtype dtype;
	int ndim;
	int64_t shape[SM70_ST_MAX_DIMS];
	const void *data;      /* inside the mapping; valid until sm70_st_close */
	size_t nbytes;
	const char *file;      /* path of the file holding it, for messages */
};

struct sm70_st_file {
	char *path;
	void *map;
	size_t map_size;
	size_t n_tensors;
	struct sm70_st_tensor *tensors; /* sorted by name */
};

/* Maps and validates path. On success *out owns the mapping; on failure err names the
 * file and what is wrong (and the tensor, when one is at fault). Returns 0, -ENOENT,
 * -EINVAL (malformed), -EOVERFLOW, -ENOMEM. */
int sm70_st_open(struct sm70_st_file **out, const char *path, struct sm70_err *err);

void sm70_st_close(struct sm70_st_file *f);

/* Tensor named name, or NULL. O(log n). */
const struct sm70_st_tensor *sm70_st_find(const struct sm70_st_file *f, const char *name);

/* Writes "[a, b, c]" into buf (always terminated, truncated if it does not fit). */
void sm70_st_format_shape(char *buf, size_t size, int ndim, const int64_t *shape);

#endif
