/*
 * st_write.c - the streaming safetensors writer; see st_write.h.
 *
 * The header is built with jansson (which keeps insertion order), so tensors appear in it
 * in the order they were declared and their data_offsets grow monotonically.
 *
 * Non-goals: checking that data bytes are valid values of their dtype.
 */
#include "common/st_write.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct sm70_st_writer {
	char *path;          /* final name */
	char *tmp_path;      /* PATH.tmp, written until commit */
	FILE *fp;
	json_t *header;      /* the JSON object, built by sm70_st_writer_add */
	uint64_t *sizes;     /* bytes of each declared tensor, in order */
	size_t n_tensors;
	uint64_t data_bytes; /* sum of sizes */
	int header_written;
	size_t cur;          /* tensor being written */
	uint64_t cur_done;   /* bytes of it written so far */
};

static void writer_free(struct sm70_st_writer *w)
{
	if (w->fp)
		fclose(w->fp);
	json_decref(w->header);
	free(w->sizes);
	free(w->tmp_path);
	free(w->path);
	free(w);
}

int sm70_st_writer_open(struct sm70_st_writer **out, const char *path, struct sm70_err *err)
{
	struct sm70_st_writer *w;
	json_t *meta;
	int ret;

	*out = NULL;
	w = calloc(1, sizeof(*w));
	if (!w)
		return sm70_errf(err, -ENOMEM, "%s: out of memory", path);
	w->path = strdup(path);
	w->tmp_path = malloc(strlen(path) + sizeof(".tmp"));
	w->header = json_object();
	meta = json_pack("{s:s}", "format", "pt");
	if (!w->path || !w->tmp_path || !w->header || !meta ||
	    json_object_set_new(w->header, "__metadata__", meta) != 0) {
		ret = sm70_errf(err, -ENOMEM, "%s: out of memory", path);
		goto fail;
	}
	strcpy(w->tmp_path, path);
	strcat(w->tmp_path, ".tmp");
	w->fp = fopen(w->tmp_path, "we");
	if (!w->fp) {
		ret = -errno;
		sm70_errf(err, ret, "%s: cannot create: %s", w->tmp_path, strerror(-ret));
		goto fail;
	}
	*out = w;
	return 0;
fail:
	writer_free(w);
	return ret;
}

/* Element count times element size of shape, or -EOVERFLOW / -EINVAL naming the tensor. */
static int tensor_bytes(const char *path, const char *name, enum sm70_dtype dtype, int ndim,
			const int64_t *shape, uint64_t *out, struct sm70_err *err)
{
	uint64_t n = sm70_dtype_size(dtype);

	for (int i = 0; i < ndim; i++) {
		if (shape[i] < 0)
			return sm70_errf(err, -EINVAL, "%s: tensor '%s' dimension %d is negative",
					 path, name, i);
		if (__builtin_mul_overflow(n, (uint64_t)shape[i], &n))
			return sm70_errf(err, -EOVERFLOW, "%s: tensor '%s' byte size overflows",
					 path, name);
	}
	*out = n;
	return 0;
}

/* {"dtype": ..., "shape": [...], "data_offsets": [begin, end]}, or NULL (no memory). */
static json_t *tensor_entry(enum sm70_dtype dtype, int ndim, const int64_t *shape,
			    uint64_t begin, uint64_t end)
{
	json_t *jshape = json_array(), *entry;

	if (!jshape)
		return NULL;
	for (int i = 0; i < ndim; i++) {
		if (json_array_append_new(jshape, json_integer(shape[i])) != 0) {
			json_decref(jshape);
			return NULL;
		}
	}
	entry = json_pack("{s:s,s:o,s:[I,I]}", "dtype", sm70_dtype_safetensors_name(dtype),
			  "shape", jshape, "data_offsets", (json_int_t)begin, (json_int_t)end);
	return entry;
}

int sm70_st_writer_add(struct sm70_st_writer *w, const char *name, enum sm70_dtype dtype,
		       int ndim, const int64_t *shape, struct sm70_err *err)
{
	uint64_t bytes = 0, *sizes;
	json_t *entry;
	int ret;

	if (w->header_written)
		return sm70_errf(err, -EINVAL, "%s: tensor '%s' declared after the header",
				 w->path, name);
	if (!sm70_dtype_safetensors_name(dtype))
		return sm70_errf(err, -EINVAL, "%s: tensor '%s' has no safetensors dtype",
				 w->path, name);
	if (ndim < 0 || ndim > SM70_ST_WRITE_MAX_DIMS)
		return sm70_errf(err, -EINVAL, "%s: tensor '%s' has %d dimensions (at most %d)",
				 w->path, name, ndim, SM70_ST_WRITE_MAX_DIMS);
	if (strcmp(name, "__metadata__") == 0 || json_object_get(w->header, name))
		return sm70_errf(err, -EINVAL, "%s: tensor '%s' declared twice", w->path, name);
	ret = tensor_bytes(w->path, name, dtype, ndim, shape, &bytes, err);
	if (ret)
		return ret;
	if (w->data_bytes + bytes < w->data_bytes || w->data_bytes + bytes > INT64_MAX)
		return sm70_errf(err, -EOVERFLOW, "%s: data size overflows at tensor '%s'",
				 w->path, name);
	sizes = realloc(w->sizes, (w->n_tensors + 1) * sizeof(*sizes));
	if (!sizes)
		return sm70_errf(err, -ENOMEM, "%s: out of memory", w->path);
	w->sizes = sizes;
	entry = tensor_entry(dtype, ndim, shape, w->data_bytes, w->data_bytes + bytes);
	if (!entry || json_object_set_new(w->header, name, entry) != 0)
		return sm70_errf(err, -ENOMEM, "%s: out of memory", w->path);
	w->sizes[w->n_tensors++] = bytes;
	w->data_bytes += bytes;
	return 0;
}

uint64_t sm70_st_writer_data_bytes(const struct sm70_st_writer *w)
{
	return w->data_bytes;
}

/* fwrite of len bytes, or -EIO (-errno when set) naming the file. */
static int write_all(struct sm70_st_writer *w, const void *data, size_t len,
		     struct sm70_err *err)
{
	int ret;

	if (!len || fwrite(data, 1, len, w->fp) == len)
		return 0;
	ret = errno ? -errno : -EIO;
	return sm70_errf(err, ret, "%s: write failed: %s", w->tmp_path, strerror(-ret));
}

int sm70_st_writer_write_header(struct sm70_st_writer *w, struct sm70_err *err)
{
	unsigned char len_bytes[8];
	char *text;
	size_t len, padded;
	int ret;

	if (w->header_written)
		return sm70_errf(err, -EINVAL, "%s: header written twice", w->path);
	text = json_dumps(w->header, JSON_COMPACT);
	if (!text)
		return sm70_errf(err, -ENOMEM, "%s: out of memory", w->path);
	len = strlen(text);
	padded = (8 + len + 7) / 8 * 8 - 8; /* the data must start on an 8-byte boundary */
	for (int i = 0; i < 8; i++)
		len_bytes[i] = (unsigned char)((uint64_t)padded >> (8 * i));
	ret = write_all(w, len_bytes, sizeof(len_bytes), err);
	if (!ret)
		ret = write_all(w, text, len, err);
	for (size_t i = len; !ret && i < padded; i++)
		ret = write_all(w, " ", 1, err);
	free(text);
	if (!ret)
		w->header_written = 1;
	return ret;
}

int sm70_st_writer_write(struct sm70_st_writer *w, const void *data, size_t len,
			 struct sm70_err *err)
{
	const unsigned char *p = data;

	if (!w->header_written)
		return sm70_errf(err, -EINVAL, "%s: tensor data before the header", w->path);
	while (len) {
		uint64_t room;
		size_t n;
		int ret;

		while (w->cur < w->n_tensors && w->cur_done == w->sizes[w->cur]) {
			w->cur++;
			w->cur_done = 0;
		}
		if (w->cur == w->n_tensors)
			return sm70_errf(err, -EINVAL,
					 "%s: %zu bytes of data past the declared tensors",
					 w->path, len);
		room = w->sizes[w->cur] - w->cur_done;
		n = len < room ? len : (size_t)room;
		ret = write_all(w, p, n, err);
		if (ret)
			return ret;
		w->cur_done += n;
		p += n;
		len -= n;
	}
	return 0;
}

/* The number of declared bytes not written yet. */
static uint64_t bytes_missing(const struct sm70_st_writer *w)
{
	uint64_t missing = 0;

	for (size_t i = w->cur; i < w->n_tensors; i++)
		missing += w->sizes[i];
	return w->cur < w->n_tensors ? missing - w->cur_done : 0;
}

int sm70_st_writer_commit(struct sm70_st_writer *w, struct sm70_err *err)
{
	FILE *fp;
	int ret = 0;

	if (!w->header_written)
		ret = sm70_st_writer_write_header(w, err);
	if (!ret && bytes_missing(w))
		ret = sm70_errf(err, -EINVAL, "%s: %llu declared bytes were never written",
				w->path, (unsigned long long)bytes_missing(w));
	fp = w->fp;
	w->fp = NULL;
	if (fclose(fp) != 0 && !ret) {
		ret = -errno;
		sm70_errf(err, ret, "%s: write failed: %s", w->tmp_path, strerror(-ret));
	}
	if (!ret && rename(w->tmp_path, w->path) != 0) {
		ret = -errno;
		sm70_errf(err, ret, "%s: cannot rename to %s: %s", w->tmp_path, w->path,
			  strerror(-ret));
	}
	if (ret)
		unlink(w->tmp_path);
	writer_free(w);
	return ret;
}

void sm70_st_writer_abort(struct sm70_st_writer *w)
{
	if (!w)
		return;
	if (w->fp) {
		fclose(w->fp);
		w->fp = NULL;
	}
	unlink(w->tmp_path);
	writer_free(w);
}
