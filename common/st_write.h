/*
 * st_write.h - writes one safetensors file as a stream: declare every tensor (name, dtype,
 * shape), write the header, then append each tensor's bytes in the order declared.
 *
 * The layout is the one daemon/engine/safetensors.c reads: an 8-byte little-endian header
 * length, a JSON object {"__metadata__": {"format": "pt"}, name: {"dtype", "shape",
 * "data_offsets": [begin, end]}, ...} padded with spaces so that the data starts on an
 * 8-byte boundary, then the tensors back to back. The file is written as PATH.tmp and
 * renamed to PATH by sm70_st_writer_commit, so a reader never sees a partial file.
 *
 * Non-goals: random-access writes, big-endian hosts, metadata other than "format".
 * One writer is used by one thread at a time.
 */
#ifndef SM70_COMMON_ST_WRITE_H
#define SM70_COMMON_ST_WRITE_H

#include <stddef.h>
#include <stdint.h>

#include "common/dtype.h"
#include "common/err.h"

#define SM70_ST_WRITE_MAX_DIMS 8

struct sm70_st_writer;

/* Creates PATH.tmp. Returns 0 and *out, or -errno with err naming the file. */
int sm70_st_writer_open(struct sm70_st_writer **out, const char *path, struct sm70_err *err);

/* Declares the next tensor. name is copied. Returns 0, -EINVAL (a second tensor of that
 * name, a bad dtype, more than SM70_ST_WRITE_MAX_DIMS dimensions, a negative dimension,
 * or called after the header was written), -EOVERFLOW, -ENOMEM; err names the tensor. */
int sm70_st_writer_add(struct sm70_st_writer *w, const char *name, enum sm70_dtype dtype,
		       int ndim, const int64_t *shape, struct sm70_err *err);

/* Bytes the declared tensors hold in all. */
uint64_t sm70_st_writer_data_bytes(const struct sm70_st_writer *w);

/* Writes the header of every declared tensor; after it, no tensor may be added. */
int sm70_st_writer_write_header(struct sm70_st_writer *w, struct sm70_err *err);

/* Appends len bytes of tensor data, in declaration order; a tensor's bytes may come in
 * several calls. Returns 0, -EINVAL (more bytes than declared, or before the header), or
 * the -errno of the write. */
int sm70_st_writer_write(struct sm70_st_writer *w, const void *data, size_t len,
			 struct sm70_err *err);

/* Checks that every declared byte was written, flushes, and renames PATH.tmp to PATH;
 * frees w whatever the result (on failure the partial file is removed). */
int sm70_st_writer_commit(struct sm70_st_writer *w, struct sm70_err *err);

/* Removes PATH.tmp and frees w; NULL is a no-op. */
void sm70_st_writer_abort(struct sm70_st_writer *w);

#endif
