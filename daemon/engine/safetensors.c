/*
 * safetensors.c - maps a safetensors file read-only and validates its header so that every
 * tensor handed out lies inside the data section, has a size that matches its shape, and
 * does not share bytes with another tensor.
 *
 * Non-goals: writing files, big-endian hosts, aligning data (safetensors does not promise
 * alignment; consumers copy out with memcpy). The "__metadata__" entry is not interpreted.
 */
#include "daemon/engine/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Real headers are a few hundred kB even for models with thousands of tensors; anything
 * this large is a corrupt or hostile length field, and we would otherwise hand it to the
 * JSON parser. */
#define ST_MAX_HEADER (100u * 1000u * 1000u)

/* Each dimension is bounded well below INT64_MAX so that a shape that "fits" is never the
 * product of wrapped-around factors; the element count itself is checked for overflow. */
#define ST_MAX_DIM ((int64_t)1 << 48)

void sm70_st_format_shape(char *buf, size_t size, int ndim, const int64_t *shape)
{
	size_t used = (size_t)snprintf(buf, size, "[");

	for (int i = 0; i < ndim && used < size; i++)
		used += (size_t)snprintf(buf + used, size - used, "%s%" PRId64, i ? ", " : "",
					 shape[i]);
	if (used < size)
		snprintf(buf + used, size - used, "]");
}

static int cmp_tensor_name(const void *a, const void *b)
{
	const struct sm70_st_tensor *ta = a, *tb = b;

	return strcmp(ta->name, tb->name);
}

static int cmp_tensor_data(const void *a, const void *b)
{
	const struct sm70_st_tensor *ta = *(const struct sm70_st_tensor *const *)a;
	const struct sm70_st_tensor *tb = *(const struct sm70_st_tensor *const *)b;
	const char *da = ta->data, *db = tb->data;

	if (da != db)
		return da < db ? -1 : 1;
	return ta->nbytes < tb->nbytes ? -1 : ta->nbytes > tb->nbytes;
}

/*
 * Reads one non-negative JSON integer of data_offsets. Returns 0 or -EINVAL with err set.
 */
static int read_offset(const char *path, const char *name, json_t *v, uint64_t *out,
		       struct sm70_err *err)
{
	if (!json_is_integer(v) || json_integer_value(v) < 0)
		return sm70_errf(err, -EINVAL,
				 "%s: tensor '%s' data_offsets must hold two non-negative integers",
				 path, name);
	*out = (uint64_t)json_integer_value(v);
	return 0;
}

/*
 * Validates one header entry and fills t (its name is set by the caller). data and
 * data_len describe the data section. Returns 0, -EINVAL or -EOVERFLOW with err naming
 * the file and tensor.
 */
static int parse_entry(struct sm70_st_tensor *t, const char *path, const char *name,
		       json_t *entry, const char *data, uint64_t data_len, struct sm70_err *err)
{
	json_t *jdtype, *jshape, *joffs;
	uint64_t elems = 1, bytes, begin, end;
	char shape_str[160];
	const char *dtype_str;
	size_t i;
	int ret;

	if (!json_is_object(entry))
		return sm70_errf(err, -EINVAL, "%s: tensor '%s' entry is not a JSON object",
				 path, name);

	jdtype = json_object_get(entry, "dtype");
	if (!json_is_string(jdtype))
		return sm70_errf(err, -EINVAL, "%s: tensor '%s' has no string 'dtype'", path, name);
	dtype_str = json_string_value(jdtype);
	if (sm70_dtype_from_safetensors(dtype_str, &t->dtype) != 0)
		return sm70_errf(err, -EINVAL, "%s: tensor '%s' has unsupported dtype '%s'",
				 path, name, dtype_str);

	jshape = json_object_get(entry, "shape");
	if (!json_is_array(jshape))
		return sm70_errf(err, -EINVAL, "%s: tensor '%s' has no array 'shape'", path, name);
	if (json_array_size(jshape) > SM70_ST_MAX_DIMS)
		return sm70_errf(err, -EINVAL, "%s: tensor '%s' has %zu dimensions (at most %d)",
				 path, name, json_array_size(jshape), SM70_ST_MAX_DIMS);
	t->ndim = (int)json_array_size(jshape);
	for (i = 0; i < json_array_size(jshape); i++) {
		json_t *d = json_array_get(jshape, i);
		json_int_t v;

		if (!json_is_integer(d))
			return sm70_errf(err, -EINVAL,
					 "%s: tensor '%s' shape element %zu is not an integer",
					 path, name, i);
		v = json_integer_value(d);
		if (v < 0 || v > ST_MAX_DIM)
			return sm70_errf(err, -EINVAL,
					 "%s: tensor '%s' dimension %zu (%lld) is out of range",
					 path, name, i, (long long)v);
		t->shape[i] = v;
		if (__builtin_mul_overflow(elems, (uint64_t)v, &elems))
			return sm70_errf(err, -EOVERFLOW,
					 "%s: tensor '%s' element count overflows", path, name);
	}
	if (__builtin_mul_overflow(elems, (uint64_t)sm70_dtype_size(t->dtype), &bytes))
		return sm70_errf(err, -EOVERFLOW, "%s: tensor '%s' byte size overflows", path, name);

	joffs = json_object_get(entry, "data_offsets");
	if (!json_is_array(joffs) || json_array_size(joffs) != 2)
		return sm70_errf(err, -EINVAL, "%s: tensor '%s' has no two-element 'data_offsets'",
				 path, name);
	ret = read_offset(path, name, json_array_get(joffs, 0), &begin, err);
	if (ret)
		return ret;
	ret = read_offset(path, name, json_array_get(joffs, 1), &end, err);
	if (ret)
		return ret;
	if (begin > end)
		return sm70_errf(err, -EINVAL,
				 "%s: tensor '%s' data_offsets [%" PRIu64 ", %" PRIu64
				 "] end before they begin", path, name, begin, end);
	if (end > data_len)
		return sm70_errf(err, -EINVAL,
				 "%s: tensor '%s' data_offsets [%" PRIu64 ", %" PRIu64
				 "] run past the end of the data (%" PRIu64 " bytes)",
				 path, name, begin, end, data_len);
	if (end - begin != bytes) {
		sm70_st_format_shape(shape_str, sizeof(shape_str), t->ndim, t->shape);
		return sm70_errf(err, -EINVAL,
				 "%s: tensor '%s' of dtype %s and shape %s needs %" PRIu64
				 " bytes, but data_offsets [%" PRIu64 ", %" PRIu64 "] hold %" PRIu64,
				 path, name, sm70_dtype_name(t->dtype), shape_str, bytes, begin,
				 end, end - begin);
	}
	t->data = data + begin;
	t->nbytes = (size_t)bytes;
	t->file = path;
	return 0;
}

/*
 * Two tensors may not share a byte: a writer bug or a crafted file could otherwise make
 * one weight alias another. Empty tensors occupy nothing and are skipped. Returns 0 or
 * -EINVAL naming both tensors.
 */
static int check_overlaps(struct sm70_st_file *f, const char *data, struct sm70_err *err)
{
	const struct sm70_st_tensor **order, *prev = NULL;
	int ret = 0;

	if (f->n_tensors < 2)
		return 0;
	order = malloc(f->n_tensors * sizeof(*order));
	if (!order)
		return sm70_errf(err, -ENOMEM, "%s: out of memory", f->path);
	for (size_t i = 0; i < f->n_tensors; i++)
		order[i] = &f->tensors[i];
	qsort(order, f->n_tensors, sizeof(*order), cmp_tensor_data);
	for (size_t i = 0; i < f->n_tensors; i++) {
		const struct sm70_st_tensor *t = order[i];

		if (!t->nbytes)
			continue;
		if (prev && (const char *)prev->data + prev->nbytes > (const char *)t->data) {
			ret = sm70_errf(err, -EINVAL,
					"%s: tensors '%s' [%td, %td] and '%s' [%td, %td] overlap",
					f->path, prev->name, (const char *)prev->data - data,
					(const char *)prev->data - data + (ptrdiff_t)prev->nbytes,
					t->name, (const char *)t->data - data,
					(const char *)t->data - data + (ptrdiff_t)t->nbytes);
			break;
		}
		prev = t;
	}
	free(order);
	return ret;
}

/*
 * Parses the JSON header at hdr (hdr_len bytes) and fills f->tensors, sorted by name.
 */
static int parse_header(struct sm70_st_file *f, const char *hdr, size_t hdr_len,
			const char *data, uint64_t data_len, struct sm70_err *err)
{
	json_error_t jerr;
	json_t *root, *entry;
	const char *key;
	size_t n = 0;
	int ret = 0;

	/* Duplicate names would make "which one is the weight" depend on the parser. */
	root = json_loadb(hdr, hdr_len, JSON_REJECT_DUPLICATES, &jerr);
	if (!root)
		return sm70_errf(err, -EINVAL,
				 "%s: header is not valid JSON (line %d, column %d: %s)", f->path,
				 jerr.line, jerr.column, jerr.text);
	if (!json_is_object(root)) {
		ret = sm70_errf(err, -EINVAL, "%s: header is not a JSON object", f->path);
		goto out;
	}

	f->tensors = calloc(json_object_size(root) ? json_object_size(root) : 1,
			    sizeof(*f->tensors));
	if (!f->tensors) {
		ret = sm70_errf(err, -ENOMEM, "%s: out of memory", f->path);
		goto out;
	}
	json_object_foreach(root, key, entry) {
		struct sm70_st_tensor *t = &f->tensors[n];

		if (strcmp(key, "__metadata__") == 0)
			continue;
		ret = parse_entry(t, f->path, key, entry, data, data_len, err);
		if (ret)
			goto out;
		t->name = strdup(key);
		if (!t->name) {
			ret = sm70_errf(err, -ENOMEM, "%s: out of memory", f->path);
			goto out;
		}
		f->n_tensors = ++n;
	}
	qsort(f->tensors, f->n_tensors, sizeof(*f->tensors), cmp_tensor_name);
	ret = check_overlaps(f, data, err);
out:
	json_decref(root);
	return ret;
}

int sm70_st_open(struct sm70_st_file **out, const char *path, struct sm70_err *err)
{
	struct sm70_st_file *f;
	const unsigned char *base;
	uint64_t hdr_len = 0;
	struct stat st;
	size_t size;
	int fd = -1, ret;

	*out = NULL;
	f = calloc(1, sizeof(*f));
	if (!f)
		return sm70_errf(err, -ENOMEM, "%s: out of memory", path);
	f->path = strdup(path);
	if (!f->path) {
		ret = sm70_errf(err, -ENOMEM, "%s: out of memory", path);
		goto fail;
	}

	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		ret = -errno;
		sm70_errf(err, ret, "%s: cannot open: %s", path, strerror(-ret));
		goto fail;
	}
	if (fstat(fd, &st) != 0) {
		ret = -errno;
		sm70_errf(err, ret, "%s: cannot stat: %s", path, strerror(-ret));
		goto fail;
	}
	if (!S_ISREG(st.st_mode)) {
		ret = sm70_errf(err, -EINVAL, "%s: not a regular file", path);
		goto fail;
	}
	if (st.st_size < 8) {
		ret = sm70_errf(err, -EINVAL,
				"%s: file is %lld bytes, shorter than the 8-byte header length",
				path, (long long)st.st_size);
		goto fail;
	}
	if ((uint64_t)st.st_size > SIZE_MAX) {
		ret = sm70_errf(err, -EOVERFLOW, "%s: file too large to map", path);
		goto fail;
	}
	size = (size_t)st.st_size;
	f->map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
	if (f->map == MAP_FAILED) {
		ret = -errno;
		f->map = NULL;
		sm70_errf(err, ret, "%s: cannot map: %s", path, strerror(-ret));
		goto fail;
	}
	f->map_size = size;
	close(fd);
	fd = -1;

	base = f->map;
	for (int i = 7; i >= 0; i--)
		hdr_len = (hdr_len << 8) | base[i];
	if (hdr_len > ST_MAX_HEADER) {
		ret = sm70_errf(err, -EINVAL,
				"%s: header length %" PRIu64 " is absurdly large (limit %u bytes)",
				path, hdr_len, ST_MAX_HEADER);
		goto fail;
	}
	if (hdr_len > size - 8) {
		ret = sm70_errf(err, -EINVAL,
				"%s: header length %" PRIu64
				" runs past the end of the file (%zu bytes)", path, hdr_len, size);
		goto fail;
	}
	ret = parse_header(f, (const char *)base + 8, (size_t)hdr_len,
			   (const char *)base + 8 + hdr_len, size - 8 - hdr_len, err);
	if (ret)
		goto fail;
	*out = f;
	return 0;

fail:
	if (fd >= 0)
		close(fd);
	sm70_st_close(f);
	return ret;
}

void sm70_st_close(struct sm70_st_file *f)
{
	if (!f)
		return;
	if (f->tensors) {
		for (size_t i = 0; i < f->n_tensors; i++)
			free((char *)f->tensors[i].name);
		free(f->tensors);
	}
	if (f->map)
		munmap(f->map, f->map_size);
	free(f->path);
	free(f);
}

const struct sm70_st_tensor *sm70_st_find(const struct sm70_st_file *f, const char *name)
{
	struct sm70_st_tensor key = { .name = name };

	if (!f || !f->n_tensors)
		return NULL;
	return bsearch(&key, f->tensors, f->n_tensors, sizeof(*f->tensors), cmp_tensor_name);
}
