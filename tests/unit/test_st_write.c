/* test_st_write - files from the streaming safetensors writer open with sm70_st_open and
 * hold what was written; misuse (duplicates, short or long data) is refused by name. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/st_write.h"
#include "daemon/engine/safetensors.h"

static char tmpdir[64];
static char path[128];

static int setup(void **state)
{
	snprintf(tmpdir, sizeof(tmpdir), "/tmp/sm70-stw-XXXXXX");
	if (!mkdtemp(tmpdir))
		return -1;
	snprintf(path, sizeof(path), "%s/out.safetensors", tmpdir);
	return 0;
}

static int teardown(void **state)
{
	char tmp[160];

	unlink(path);
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	unlink(tmp);
	return rmdir(tmpdir);
}

static int exists(const char *p)
{
	struct stat st;

	return stat(p, &st) == 0;
}

static void test_round_trip(void **state)
{
	static const int64_t s_u8[2] = { 3, 5 }, s_f32[1] = { 1 }, s_bf16[3] = { 2, 1, 4 };
	static const int64_t s_empty[2] = { 0, 7 };
	uint8_t u8[15], e4m3 = 0x38;
	float scalar = 0.125f, one = 3.0f;
	uint16_t bf16[8];
	struct sm70_st_writer *w;
	struct sm70_st_file *f;
	const struct sm70_st_tensor *t;
	struct sm70_err err = { { 0 } };
	unsigned char head[8];
	uint64_t hdr_len = 0;
	FILE *fp;

	for (int i = 0; i < 15; i++)
		u8[i] = (uint8_t)(i * 17);
	for (int i = 0; i < 8; i++)
		bf16[i] = sm70_f32_to_bf16((float)i - 3.5f);
	assert_int_equal(sm70_st_writer_open(&w, path, &err), 0);
	assert_int_equal(sm70_st_writer_add(w, "b.packed", SM70_DTYPE_U8, 2, s_u8, &err), 0);
	assert_int_equal(sm70_st_writer_add(w, "a.scalar", SM70_DTYPE_F32, 0, NULL, &err), 0);
	assert_int_equal(sm70_st_writer_add(w, "c.one", SM70_DTYPE_F32, 1, s_f32, &err), 0);
	assert_int_equal(sm70_st_writer_add(w, "d.scale", SM70_DTYPE_F8E4M3, 0, NULL, &err), 0);
	assert_int_equal(sm70_st_writer_add(w, "e.empty", SM70_DTYPE_BF16, 2, s_empty, &err), 0);
	assert_int_equal(sm70_st_writer_add(w, "f.bf16", SM70_DTYPE_BF16, 3, s_bf16, &err), 0);
	assert_int_equal(sm70_st_writer_data_bytes(w), 15 + 4 + 4 + 1 + 0 + 16);
	assert_int_equal(sm70_st_writer_write_header(w, &err), 0);
	/* u8 in two pieces, the rest in one call that spans three tensors */
	assert_int_equal(sm70_st_writer_write(w, u8, 4, &err), 0);
	assert_int_equal(sm70_st_writer_write(w, u8 + 4, 11, &err), 0);
	{
		unsigned char rest[9];

		memcpy(rest, &scalar, 4);
		memcpy(rest + 4, &one, 4);
		rest[8] = e4m3;
		assert_int_equal(sm70_st_writer_write(w, rest, sizeof(rest), &err), 0);
	}
	assert_int_equal(sm70_st_writer_write(w, bf16, sizeof(bf16), &err), 0);
	assert_int_equal(sm70_st_writer_commit(w, &err), 0);

	fp = fopen(path, "rb");
	assert_non_null(fp);
	assert_int_equal(fread(head, 1, 8, fp), 8);
	fclose(fp);
	for (int i = 7; i >= 0; i--)
		hdr_len = (hdr_len << 8) | head[i];
	assert_int_equal((8 + hdr_len) % 8, 0);

	assert_int_equal(sm70_st_open(&f, path, &err), 0);
	assert_int_equal(f->n_tensors, 6);
	t = sm70_st_find(f, "b.packed");
	assert_non_null(t);
	assert_int_equal(t->dtype, SM70_DTYPE_U8);
	assert_int_equal(t->ndim, 2);
	assert_int_equal(t->shape[1], 5);
	assert_memory_equal(t->data, u8, 15);
	t = sm70_st_find(f, "a.scalar");
	assert_int_equal(t->ndim, 0);
	assert_memory_equal(t->data, &scalar, 4);
	t = sm70_st_find(f, "d.scale");
	assert_int_equal(t->dtype, SM70_DTYPE_F8E4M3);
	assert_int_equal(*(const uint8_t *)t->data, 0x38);
	t = sm70_st_find(f, "e.empty");
	assert_int_equal(t->nbytes, 0);
	t = sm70_st_find(f, "f.bf16");
	assert_int_equal(t->shape[2], 4);
	assert_memory_equal(t->data, bf16, sizeof(bf16));
	assert_true(((uintptr_t)sm70_st_find(f, "b.packed")->data - (uintptr_t)f->map) % 8 == 0);
	sm70_st_close(f);
	printf("  6 tensors (u8, f32 scalar and [1], e4m3, empty bf16, bf16 [2,1,4]) read back "
	       "by sm70_st_open; header length %llu, data at an 8-byte boundary\n",
	       (unsigned long long)hdr_len);
}

static void test_misuse(void **state)
{
	static const int64_t shape[1] = { 4 }, neg[1] = { -1 };
	struct sm70_st_writer *w;
	struct sm70_err err = { { 0 } };
	char tmp[160];
	uint8_t b[8] = { 0 };

	unlink(path);
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	assert_int_equal(sm70_st_writer_open(&w, path, &err), 0);
	assert_int_equal(sm70_st_writer_add(w, "x", SM70_DTYPE_U8, 1, shape, &err), 0);
	assert_int_equal(sm70_st_writer_add(w, "x", SM70_DTYPE_U8, 1, shape, &err), -EINVAL);
	assert_non_null(strstr(err.msg, "'x' declared twice"));
	sm70_err_clear(&err);
	assert_int_equal(sm70_st_writer_add(w, "n", SM70_DTYPE_U8, 1, neg, &err), -EINVAL);
	assert_non_null(strstr(err.msg, "'n' dimension 0 is negative"));
	sm70_err_clear(&err);
	assert_int_equal(sm70_st_writer_write(w, b, 1, &err), -EINVAL);
	assert_non_null(strstr(err.msg, "before the header"));
	sm70_err_clear(&err);
	assert_int_equal(sm70_st_writer_write_header(w, &err), 0);
	assert_int_equal(sm70_st_writer_add(w, "late", SM70_DTYPE_U8, 1, shape, &err), -EINVAL);
	assert_non_null(strstr(err.msg, "'late' declared after the header"));
	sm70_err_clear(&err);
	assert_int_equal(sm70_st_writer_write(w, b, 5, &err), -EINVAL);
	assert_non_null(strstr(err.msg, "1 bytes of data past the declared tensors"));
	sm70_err_clear(&err);
	/* 4 bytes were written before the refusal; a second writer misses one */
	sm70_st_writer_abort(w);
	assert_false(exists(tmp));
	assert_false(exists(path));

	assert_int_equal(sm70_st_writer_open(&w, path, &err), 0);
	assert_int_equal(sm70_st_writer_add(w, "x", SM70_DTYPE_U8, 1, shape, &err), 0);
	assert_int_equal(sm70_st_writer_write_header(w, &err), 0);
	assert_int_equal(sm70_st_writer_write(w, b, 3, &err), 0);
	assert_int_equal(sm70_st_writer_commit(w, &err), -EINVAL);
	assert_non_null(strstr(err.msg, "1 declared bytes were never written"));
	assert_false(exists(tmp));
	assert_false(exists(path));
	printf("  duplicate, negative, late and surplus tensors refused by name; a short file "
	       "is never renamed into place\n");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_round_trip),
		cmocka_unit_test(test_misuse),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
