/* test_safetensors - sm70_st_open accepts a valid file and refuses a corpus of broken ones. */
#include <errno.h>
#include <ftw.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "daemon/engine/safetensors.h"

#define NO_LEN UINT64_MAX

static char tmpdir[64];

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	return remove(path);
}

static int setup(void **state)
{
	snprintf(tmpdir, sizeof(tmpdir), "/tmp/sm70-st-XXXXXX");
	return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state)
{
	return nftw(tmpdir, rm_entry, 8, FTW_DEPTH | FTW_PHYS);
}

/* Writes len raw bytes to tmpdir/name; returns the path (static buffer). */
static const char *write_raw(const char *name, const void *bytes, size_t len)
{
	static char path[128];
	FILE *fp;

	snprintf(path, sizeof(path), "%s/%s", tmpdir, name);
	fp = fopen(path, "wb");
	assert_non_null(fp);
	if (len)
		assert_int_equal(fwrite(bytes, 1, len, fp), len);
	assert_int_equal(fclose(fp), 0);
	return path;
}

/*
 * Writes a safetensors file byte by byte: an 8-byte little-endian header length (hdr_len,
 * or the real length of hdr when NO_LEN), the header text, then data_len data bytes.
 */
static const char *write_st(const char *name, const char *hdr, uint64_t hdr_len,
			    const void *data, size_t data_len)
{
	size_t hl = strlen(hdr), total = 8 + hl + data_len;
	unsigned char *buf = malloc(total);
	uint64_t n = hdr_len == NO_LEN ? hl : hdr_len;
	const char *path;

	assert_non_null(buf);
	for (int i = 0; i < 8; i++)
		buf[i] = (unsigned char)(n >> (8 * i));
	memcpy(buf + 8, hdr, hl);
	if (data_len)
		memcpy(buf + 8 + hl, data, data_len);
	path = write_raw(name, buf, total);
	free(buf);
	return path;
}

/* Opens path expecting failure with code; the message must hold every given substring. */
static void expect_fail(const char *path, int code, const char *sub1, const char *sub2)
{
	struct sm70_st_file *f = (struct sm70_st_file *)&f;
	struct sm70_err e = { { 0 } };
	int ret = sm70_st_open(&f, path, &e);

	print_message("  %-28s -> %d: %s\n", strrchr(path, '/') + 1, ret, e.msg);
	assert_int_equal(ret, code);
	assert_null(f);
	assert_non_null(strstr(e.msg, strrchr(path, '/') + 1));
	if (sub1)
		assert_non_null(strstr(e.msg, sub1));
	if (sub2)
		assert_non_null(strstr(e.msg, sub2));
}

static const char valid_hdr[] =
	"{\"__metadata__\":{\"format\":\"pt\"},"
	"\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
	"\"a\":{\"dtype\":\"BF16\",\"shape\":[3,1],\"data_offsets\":[8,14]},"
	"\"empty\":{\"dtype\":\"F16\",\"shape\":[0,4],\"data_offsets\":[14,14]},"
	"\"s\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[14,22]}}";

/* Data for valid_hdr: f32 {1.5, -2.25}, bf16 {1, 2, 3}, i64 {-7}. */
static size_t valid_data(unsigned char *d)
{
	float fv[2] = { 1.5f, -2.25f };
	uint16_t bv[3] = { sm70_f32_to_bf16(1.0f), sm70_f32_to_bf16(2.0f),
			   sm70_f32_to_bf16(3.0f) };
	int64_t iv = -7;

	memcpy(d, fv, 8);
	memcpy(d + 8, bv, 6);
	memcpy(d + 14, &iv, 8);
	return 22;
}

static void test_valid(void **state)
{
	unsigned char data[32];
	size_t dl = valid_data(data);
	const char *path = write_st("valid.safetensors", valid_hdr, NO_LEN, data, dl);
	const struct sm70_st_tensor *a, *b, *s, *empty;
	struct sm70_err e = { { 0 } };
	struct sm70_st_file *f;
	float fv[2];
	uint16_t bv[3];
	int64_t iv;

	assert_int_equal(sm70_st_open(&f, path, &e), 0);
	assert_string_equal(e.msg, "");
	assert_int_equal(f->n_tensors, 4);
	/* sorted by name, __metadata__ skipped */
	assert_string_equal(f->tensors[0].name, "a");
	assert_string_equal(f->tensors[1].name, "b");
	assert_string_equal(f->tensors[2].name, "empty");
	assert_string_equal(f->tensors[3].name, "s");
	assert_null(sm70_st_find(f, "__metadata__"));
	assert_null(sm70_st_find(f, "zzz"));
	assert_null(sm70_st_find(f, ""));

	b = sm70_st_find(f, "b");
	assert_non_null(b);
	assert_int_equal(b->dtype, SM70_DTYPE_F32);
	assert_int_equal(b->ndim, 1);
	assert_int_equal(b->shape[0], 2);
	assert_int_equal(b->nbytes, 8);
	assert_string_equal(b->file, path);
	memcpy(fv, b->data, sizeof(fv));
	assert_true(fv[0] == 1.5f && fv[1] == -2.25f);

	a = sm70_st_find(f, "a");
	assert_non_null(a);
	assert_int_equal(a->dtype, SM70_DTYPE_BF16);
	assert_int_equal(a->ndim, 2);
	assert_int_equal(a->shape[0], 3);
	assert_int_equal(a->shape[1], 1);
	memcpy(bv, a->data, sizeof(bv)); /* data may be unaligned: copy out */
	assert_true(sm70_bf16_to_f32(bv[0]) == 1.0f && sm70_bf16_to_f32(bv[1]) == 2.0f &&
		    sm70_bf16_to_f32(bv[2]) == 3.0f);

	empty = sm70_st_find(f, "empty");
	assert_non_null(empty);
	assert_int_equal(empty->nbytes, 0);
	assert_int_equal(empty->shape[0], 0);

	s = sm70_st_find(f, "s");
	assert_non_null(s);
	assert_int_equal(s->ndim, 0);
	memcpy(&iv, s->data, sizeof(iv));
	assert_int_equal(iv, -7);
	print_message("  valid file: 4 tensors, read back f32 {%g, %g}, bf16 {1, 2, 3}, "
		      "i64 %lld\n", fv[0], fv[1], (long long)iv);
	sm70_st_close(f);
}

/* Every proper prefix of a valid file must be refused (the last tensor ends at EOF). */
static void test_every_truncation(void **state)
{
	unsigned char data[32], full[512];
	size_t dl = valid_data(data), hl = strlen(valid_hdr), total = 8 + hl + dl;
	struct sm70_st_file *f;
	size_t refused = 0;

	assert_true(total <= sizeof(full));
	for (int i = 0; i < 8; i++)
		full[i] = (unsigned char)((uint64_t)hl >> (8 * i));
	memcpy(full + 8, valid_hdr, hl);
	memcpy(full + 8 + hl, data, dl);
	for (size_t len = 0; len < total; len++) {
		struct sm70_err e = { { 0 } };
		const char *path = write_raw("prefix.safetensors", full, len);
		int ret = sm70_st_open(&f, path, &e);

		assert_int_equal(ret, -EINVAL);
		assert_null(f);
		assert_non_null(strstr(e.msg, "prefix.safetensors"));
		refused++;
	}
	print_message("  refused all %zu truncations of a %zu-byte file\n", refused, total);
}

static void test_short_and_lying_length(void **state)
{
	static const unsigned char five[5] = { 1, 2, 3, 4, 5 };
	static const char hdr[] = "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}";
	float one = 1.0f;

	expect_fail(write_raw("short.safetensors", five, sizeof(five)), -EINVAL,
		    "shorter than the 8-byte", NULL);
	expect_fail(write_raw("empty.safetensors", five, 0), -EINVAL, "0 bytes", NULL);
	expect_fail(write_st("lying.safetensors", hdr, 1000, &one, 4), -EINVAL,
		    "header length 1000 runs past the end of the file", NULL);
	expect_fail(write_st("absurd.safetensors", hdr, (uint64_t)1 << 40, &one, 4), -EINVAL,
		    "absurdly large", NULL);
	expect_fail(write_st("hugelen.safetensors", hdr, UINT64_MAX - 3, &one, 4), -EINVAL,
		    "absurdly large", NULL);
}

static void test_bad_json(void **state)
{
	expect_fail(write_st("garbage.safetensors", "{\"a\": [1, 2", NO_LEN, NULL, 0), -EINVAL,
		    "not valid JSON", "line 1");
	expect_fail(write_st("binary.safetensors", "\x01\x02\xff\xfe", NO_LEN, NULL, 0), -EINVAL,
		    "not valid JSON", NULL);
	expect_fail(write_st("array.safetensors", "[1, 2]", NO_LEN, NULL, 0), -EINVAL,
		    "not a JSON object", NULL);
	expect_fail(write_st("dup.safetensors",
			     "{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
			     "\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}",
			     NO_LEN, "ab", 2), -EINVAL, "duplicate", NULL);
	expect_fail(write_st("notobj.safetensors", "{\"w\": 5}", NO_LEN, NULL, 0), -EINVAL,
		    "tensor 'w'", "not a JSON object");
}

static void test_bad_fields(void **state)
{
	static const char four[4] = { 0 };

	expect_fail(write_st("nodtype.safetensors",
			     "{\"w\":{\"shape\":[1],\"data_offsets\":[0,4]}}", NO_LEN, four, 4),
		    -EINVAL, "tensor 'w'", "'dtype'");
	expect_fail(write_st("intdtype.safetensors",
			     "{\"w\":{\"dtype\":4,\"shape\":[1],\"data_offsets\":[0,4]}}", NO_LEN,
			     four, 4), -EINVAL, "tensor 'w'", "'dtype'");
	expect_fail(write_st("noshape.safetensors",
			     "{\"w\":{\"dtype\":\"F32\",\"shape\":4,\"data_offsets\":[0,4]}}",
			     NO_LEN, four, 4), -EINVAL, "tensor 'w'", "'shape'");
	expect_fail(write_st("strdim.safetensors",
			     "{\"w\":{\"dtype\":\"F32\",\"shape\":[\"1\"],\"data_offsets\":[0,4]}}",
			     NO_LEN, four, 4), -EINVAL, "tensor 'w'", "not an integer");
	expect_fail(write_st("nooffs.safetensors", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1]}}",
			     NO_LEN, four, 4), -EINVAL, "tensor 'w'", "'data_offsets'");
	expect_fail(write_st("threeoffs.safetensors",
			     "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,4]}}",
			     NO_LEN, four, 4), -EINVAL, "tensor 'w'", "'data_offsets'");
	expect_fail(write_st("stroffs.safetensors",
			     "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[\"0\",4]}}",
			     NO_LEN, four, 4), -EINVAL, "tensor 'w'", "non-negative integers");
	expect_fail(write_st("negoffs.safetensors",
			     "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}}",
			     NO_LEN, four, 4), -EINVAL, "tensor 'w'", "non-negative integers");
}

static void test_unknown_dtype(void **state)
{
	static const char eight[8] = { 0 };

	expect_fail(write_st("f64.safetensors",
			     "{\"model.norm.weight\":{\"dtype\":\"F64\",\"shape\":[1],"
			     "\"data_offsets\":[0,8]}}", NO_LEN, eight, 8),
		    -EINVAL, "tensor 'model.norm.weight'", "dtype 'F64'");
	expect_fail(write_st("xx.safetensors",
			     "{\"w\":{\"dtype\":\"XX\",\"shape\":[1],\"data_offsets\":[0,1]}}",
			     NO_LEN, eight, 1), -EINVAL, "tensor 'w'", "dtype 'XX'");
}

static void test_bad_shapes(void **state)
{
	static const char sixteen[16] = { 0 };

	expect_fail(write_st("negdim.safetensors",
			     "{\"w\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}",
			     NO_LEN, sixteen, 4), -EINVAL, "tensor 'w'", "(-1) is out of range");
	expect_fail(write_st("hugedim.safetensors",
			     "{\"w\":{\"dtype\":\"F32\",\"shape\":[9223372036854775807],"
			     "\"data_offsets\":[0,4]}}", NO_LEN, sixteen, 4),
		    -EINVAL, "tensor 'w'", "out of range");
	expect_fail(write_st("overflow.safetensors",
			     "{\"w\":{\"dtype\":\"F32\",\"shape\":[1099511627776,1099511627776],"
			     "\"data_offsets\":[0,4]}}", NO_LEN, sixteen, 4),
		    -EOVERFLOW, "tensor 'w'", "overflows");
	expect_fail(write_st("bytesoverflow.safetensors",
			     "{\"w\":{\"dtype\":\"F32\",\"shape\":[281474976710656,32768],"
			     "\"data_offsets\":[0,4]}}", NO_LEN, sixteen, 4),
		    -EOVERFLOW, "tensor 'w'", "overflows");
	expect_fail(write_st("ninedims.safetensors",
			     "{\"w\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],"
			     "\"data_offsets\":[0,1]}}", NO_LEN, sixteen, 1),
		    -EINVAL, "tensor 'w'", "9 dimensions");
	expect_fail(write_st("wrongsize.safetensors",
			     "{\"model.norm.weight\":{\"dtype\":\"F32\",\"shape\":[3],"
			     "\"data_offsets\":[0,8]}}", NO_LEN, sixteen, 8),
		    -EINVAL, "tensor 'model.norm.weight'", "needs 12 bytes");
}

static void test_bad_offsets(void **state)
{
	static const char sixteen[16] = { 0 };

	expect_fail(write_st("reversed.safetensors",
			     "{\"w\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[8,4]}}",
			     NO_LEN, sixteen, 16), -EINVAL, "tensor 'w'", "[8, 4]");
	/* data cut short: the header promises 16 bytes, the file holds 8 */
	expect_fail(write_st("truncdata.safetensors",
			     "{\"model.norm.weight\":{\"dtype\":\"F32\",\"shape\":[4],"
			     "\"data_offsets\":[0,16]}}", NO_LEN, sixteen, 8),
		    -EINVAL, "tensor 'model.norm.weight' data_offsets [0, 16]",
		    "run past the end of the data (8 bytes)");
	expect_fail(write_st("farend.safetensors",
			     "{\"w\":{\"dtype\":\"U8\",\"shape\":[4],"
			     "\"data_offsets\":[9223372036854775803,9223372036854775807]}}",
			     NO_LEN, sixteen, 16), -EINVAL, "tensor 'w'", "run past the end");
	expect_fail(write_st("overlap.safetensors",
			     "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
			     "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
			     NO_LEN, sixteen, 16), -EINVAL, "'a' [0, 8] and 'b' [4, 12]", "overlap");
	expect_fail(write_st("same.safetensors",
			     "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
			     "\"y\":{\"dtype\":\"I32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
			     NO_LEN, sixteen, 16), -EINVAL, "'x'", "overlap");
}

static void test_missing_file(void **state)
{
	char path[128];

	snprintf(path, sizeof(path), "%s/absent.safetensors", tmpdir);
	expect_fail(path, -ENOENT, "cannot open", NULL);
	expect_fail(tmpdir, -EINVAL, "not a regular file", NULL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_valid),
		cmocka_unit_test(test_every_truncation),
		cmocka_unit_test(test_short_and_lying_length),
		cmocka_unit_test(test_bad_json),
		cmocka_unit_test(test_bad_fields),
		cmocka_unit_test(test_unknown_dtype),
		cmocka_unit_test(test_bad_shapes),
		cmocka_unit_test(test_bad_offsets),
		cmocka_unit_test(test_missing_file),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
