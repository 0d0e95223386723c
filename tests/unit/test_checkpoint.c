/* test_checkpoint - opens real and generated checkpoint dirs: name mapping, shards, errors. */
#include <errno.h>
#include <ftw.h>
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

#include "daemon/engine/checkpoint.h"

#define FIX "tests/fixtures/"

static char tmpdir[64];

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	return remove(path);
}

static int setup(void **state)
{
	snprintf(tmpdir, sizeof(tmpdir), "/tmp/sm70-ckpt-XXXXXX");
	return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state)
{
	return nftw(tmpdir, rm_entry, 8, FTW_DEPTH | FTW_PHYS);
}

/* Creates tmpdir/name and returns its path (static buffer, one per call site's use). */
static const char *make_dir(const char *name)
{
	static char path[128];

	snprintf(path, sizeof(path), "%s/%s", tmpdir, name);
	assert_int_equal(mkdir(path, 0700), 0);
	return path;
}

static void write_text(const char *dir, const char *name, const char *text)
{
	char path[256];
	FILE *fp;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	fp = fopen(path, "w");
	assert_non_null(fp);
	fputs(text, fp);
	assert_int_equal(fclose(fp), 0);
}

struct spec {
	const char *name;
	const char *dtype; /* "F32" or "I32": 4-byte types only */
	int64_t rows, cols;
};

/* Writes a safetensors file dir/name holding the given 2-D tensors, element k of tensor i
 * equal to 100 * (i + 1) + k. */
static void write_st(const char *dir, const char *name, const struct spec *s, int n)
{
	json_t *hdr = json_object();
	size_t off = 0, hl;
	char path[256], *text;
	FILE *fp;

	for (int i = 0; i < n; i++) {
		size_t bytes = (size_t)(s[i].rows * s[i].cols) * 4;

		json_object_set_new(hdr, s[i].name,
				    json_pack("{s:s, s:[I, I], s:[I, I]}", "dtype", s[i].dtype,
					      "shape", (json_int_t)s[i].rows,
					      (json_int_t)s[i].cols, "data_offsets",
					      (json_int_t)off, (json_int_t)(off + bytes)));
		off += bytes;
	}
	text = json_dumps(hdr, JSON_COMPACT);
	assert_non_null(text);
	hl = strlen(text);
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	fp = fopen(path, "wb");
	assert_non_null(fp);
	for (int i = 0; i < 8; i++)
		fputc((int)(((uint64_t)hl >> (8 * i)) & 0xff), fp);
	fwrite(text, 1, hl, fp);
	for (int i = 0; i < n; i++) {
		for (int64_t k = 0; k < s[i].rows * s[i].cols; k++) {
			float f = (float)(100 * (i + 1) + k);
			int32_t v = (int32_t)f;

			if (strcmp(s[i].dtype, "F32") == 0)
				fwrite(&f, 4, 1, fp);
			else
				fwrite(&v, 4, 1, fp);
		}
	}
	assert_int_equal(fclose(fp), 0);
	free(text);
	json_decref(hdr);
}

static float first_value(const struct sm70_st_tensor *t)
{
	float f;

	assert_int_equal(sm70_convert_to_f32(&f, t->data, t->dtype, 1), 0);
	return f;
}

/* Checks name has the given dtype and shape and a non-zero first value. */
static const struct sm70_st_tensor *check_tensor(struct sm70_ckpt *c, const char *name,
						 enum sm70_dtype dt, int64_t rows, int64_t cols)
{
	const struct sm70_st_tensor *t;
	struct sm70_err e = { { 0 } };
	int64_t shape[2] = { rows, cols };
	int ndim = cols ? 2 : 1;
	char dims[48];
	float v;

	assert_int_equal(sm70_ckpt_get(c, name, ndim, shape, &t, &e), 0);
	assert_int_equal(t->dtype, dt);
	v = first_value(t);
	if (cols)
		snprintf(dims, sizeof(dims), "[%lld, %lld]", (long long)rows, (long long)cols);
	else
		snprintf(dims, sizeof(dims), "[%lld]", (long long)rows);
	print_message("  %-40s %-4s %-12s first %g (%s)\n", name, sm70_dtype_name(dt), dims,
		      v, strrchr(t->file, '/') + 1);
	assert_true(v != 0.0f);
	return t;
}

/* Opens dir expecting failure with code and a message holding both substrings. */
static void expect_open_fail(const char *dir, int config_only, int code, const char *sub1,
			     const char *sub2)
{
	struct sm70_ckpt *c = (struct sm70_ckpt *)&c;
	struct sm70_err e = { { 0 } };
	int ret = config_only ? sm70_ckpt_open_config_only(&c, dir, &e) :
				sm70_ckpt_open(&c, dir, &e);

	print_message("  %-14s -> %d: %s\n", strrchr(dir, '/') + 1, ret, e.msg);
	assert_int_equal(ret, code);
	assert_null(c);
	if (sub1)
		assert_non_null(strstr(e.msg, sub1));
	if (sub2)
		assert_non_null(strstr(e.msg, sub2));
}

static void test_fixture_tied(void **state)
{
	const char *dir = FIX "qwen3-gqa2-d64-tied";
	struct sm70_err e = { { 0 } };
	struct sm70_ckpt *c;

	assert_int_equal(sm70_ckpt_open(&c, dir, &e), 0);
	assert_string_equal(sm70_ckpt_dir(c), dir);
	assert_int_equal(json_integer_value(json_object_get(sm70_ckpt_config(c), "vocab_size")),
			 512);
	assert_non_null(sm70_ckpt_generation_config(c));
	check_tensor(c, "model.embed_tokens.weight", SM70_DTYPE_BF16, 512, 128);
	check_tensor(c, "model.norm.weight", SM70_DTYPE_BF16, 128, 0);
	check_tensor(c, "model.layers.1.self_attn.q_proj.weight", SM70_DTYPE_BF16, 256, 128);
	check_tensor(c, "model.layers.1.self_attn.k_proj.weight", SM70_DTYPE_BF16, 128, 128);
	check_tensor(c, "model.layers.0.mlp.down_proj.weight", SM70_DTYPE_BF16, 128, 320);
	assert_null(sm70_ckpt_find(c, "lm_head.weight")); /* tied: not stored */
	assert_null(sm70_ckpt_find(c, "model.layers.2.self_attn.q_proj.weight"));
	sm70_ckpt_close(c);
}

static void test_fixture_sharded(void **state)
{
	const char *dir = FIX "qwen3-gqa6-d256-long";
	const struct sm70_st_tensor *emb, *head;
	struct sm70_err e = { { 0 } };
	json_t *index, *map, *v;
	struct sm70_ckpt *c;
	const char *key;
	size_t n = 0;

	assert_int_equal(sm70_ckpt_open(&c, dir, &e), 0);
	emb = check_tensor(c, "model.embed_tokens.weight", SM70_DTYPE_BF16, 1024, 192);
	head = check_tensor(c, "lm_head.weight", SM70_DTYPE_BF16, 1024, 192);
	assert_string_not_equal(emb->file, head->file);
	check_tensor(c, "model.layers.1.self_attn.q_proj.weight", SM70_DTYPE_BF16, 1536, 192);
	check_tensor(c, "model.layers.1.self_attn.k_proj.weight", SM70_DTYPE_BF16, 256, 192);
	check_tensor(c, "model.layers.1.self_attn.o_proj.weight", SM70_DTYPE_BF16, 192, 1536);

	/* every tensor the index lists is found, in the shard it names */
	index = json_load_file(FIX "qwen3-gqa6-d256-long/model.safetensors.index.json", 0, NULL);
	assert_non_null(index);
	map = json_object_get(index, "weight_map");
	json_object_foreach(map, key, v) {
		const struct sm70_st_tensor *t = sm70_ckpt_find(c, key);

		assert_non_null(t);
		assert_string_equal(strrchr(t->file, '/') + 1, json_string_value(v));
		n++;
	}
	print_message("  all %zu weight_map entries found in their shards\n", n);
	json_decref(index);
	sm70_ckpt_close(c);
}

static void test_fixture_f16(void **state)
{
	struct sm70_err e = { { 0 } };
	struct sm70_ckpt *c;

	assert_int_equal(sm70_ckpt_open(&c, FIX "qwen3-mha-d32-f16", &e), 0);
	check_tensor(c, "model.embed_tokens.weight", SM70_DTYPE_F16, 384, 96);
	check_tensor(c, "lm_head.weight", SM70_DTYPE_F16, 384, 96);
	check_tensor(c, "model.layers.2.mlp.gate_proj.weight", SM70_DTYPE_F16, 192, 96);
	sm70_ckpt_close(c);
}

static void test_nested_names(void **state)
{
	static const struct spec s[] = {
		{ "model.language_model.embed_tokens.weight", "F32", 4, 2 },
		{ "model.language_model.layers.0.self_attn.q_proj.weight", "F32", 2, 2 },
		{ "lm_head.weight", "F32", 4, 2 },
		{ "model.visual.x", "F32", 1, 1 },
		{ "visual.blocks.0.w", "F32", 1, 1 },
		{ "mtp.y", "F32", 1, 1 },
		{ "model.mtp.z", "F32", 1, 1 },
	};
	const char *dir = make_dir("nested");
	const struct sm70_st_tensor *t;
	struct sm70_err e = { { 0 } };
	struct sm70_ckpt *c;
	float f;

	write_text(dir, "config.json", "{\"model_type\": \"qwen3_vl\"}");
	write_st(dir, "model.safetensors", s, 7);
	assert_int_equal(sm70_ckpt_open(&c, dir, &e), 0);
	assert_null(sm70_ckpt_generation_config(c));
	t = sm70_ckpt_find(c, "model.embed_tokens.weight");
	assert_non_null(t);
	assert_string_equal(t->name, "model.language_model.embed_tokens.weight");
	assert_int_equal(sm70_convert_to_f32(&f, t->data, t->dtype, 1), 0);
	assert_true(f == 100.0f);
	t = sm70_ckpt_find(c, "model.layers.0.self_attn.q_proj.weight");
	assert_non_null(t);
	assert_int_equal(sm70_convert_to_f32(&f, t->data, t->dtype, 1), 0);
	assert_true(f == 200.0f);
	assert_non_null(sm70_ckpt_find(c, "lm_head.weight"));
	assert_null(sm70_ckpt_find(c, "model.language_model.embed_tokens.weight"));
	assert_null(sm70_ckpt_find(c, "model.visual.x"));
	assert_null(sm70_ckpt_find(c, "visual.blocks.0.w"));
	assert_null(sm70_ckpt_find(c, "mtp.y"));
	assert_null(sm70_ckpt_find(c, "model.mtp.z"));
	assert_null(sm70_ckpt_find(c, "model.x"));
	print_message("  nested names resolved; visual/mtp tensors ignored\n");
	sm70_ckpt_close(c);
}

static void test_duplicate_canonical(void **state)
{
	static const struct spec a[] = { { "model.language_model.norm.weight", "F32", 1, 2 } };
	static const struct spec b[] = { { "model.norm.weight", "F32", 1, 2 } };
	const char *dir = make_dir("dupname");

	write_text(dir, "config.json", "{}");
	write_text(dir, "model.safetensors.index.json",
		   "{\"weight_map\": {\"model.language_model.norm.weight\": \"a.safetensors\","
		   " \"model.norm.weight\": \"b.safetensors\"}}");
	write_st(dir, "a.safetensors", a, 1);
	write_st(dir, "b.safetensors", b, 1);
	expect_open_fail(dir, 0, -EINVAL, "'model.norm.weight' is stored twice",
			 "a.safetensors");
}

static void test_get_errors(void **state)
{
	static const struct spec s[] = {
		{ "model.norm.weight", "F32", 1, 8 },
		{ "model.ids", "I32", 1, 3 },
	};
	const char *dir = make_dir("geterr");
	const struct sm70_st_tensor *t = (const struct sm70_st_tensor *)&t;
	int64_t good[2] = { 1, 8 }, bad[2] = { 8, 1 }, ids[2] = { 1, 3 };
	struct sm70_err e = { { 0 } };
	struct sm70_ckpt *c;

	write_text(dir, "config.json", "{}");
	write_st(dir, "model.safetensors", s, 2);
	assert_int_equal(sm70_ckpt_open(&c, dir, &e), 0);
	assert_int_equal(sm70_ckpt_get(c, "model.norm.weight", 2, good, &t, &e), 0);
	assert_non_null(t);

	assert_int_equal(sm70_ckpt_get(c, "model.absent.weight", 2, good, &t, &e), -ENOENT);
	print_message("  missing: %s\n", e.msg);
	assert_null(t);
	assert_non_null(strstr(e.msg, "missing tensor model.absent.weight in "));
	assert_non_null(strstr(e.msg, dir));

	sm70_err_clear(&e);
	assert_int_equal(sm70_ckpt_get(c, "model.norm.weight", 2, bad, &t, &e), -EINVAL);
	print_message("  shape: %s\n", e.msg);
	assert_non_null(strstr(e.msg, "tensor model.norm.weight in "));
	assert_non_null(strstr(e.msg, "model.safetensors has shape [1, 8], expected [8, 1]"));

	sm70_err_clear(&e);
	assert_int_equal(sm70_ckpt_get(c, "model.norm.weight", 1, good + 1, &t, &e), -EINVAL);
	print_message("  ndim: %s\n", e.msg);
	assert_non_null(strstr(e.msg, "has shape [1, 8], expected [8]"));

	sm70_err_clear(&e);
	assert_int_equal(sm70_ckpt_get(c, "model.ids", 2, ids, &t, &e), -EINVAL);
	print_message("  dtype: %s\n", e.msg);
	assert_non_null(strstr(e.msg, "tensor model.ids in "));
	assert_non_null(strstr(e.msg, "dtype i32"));
	sm70_ckpt_close(c);
}

static void test_index_errors(void **state)
{
	static const struct spec s[] = { { "model.norm.weight", "F32", 1, 2 } };
	const char *dir;

	dir = make_dir("noshard");
	write_text(dir, "config.json", "{}");
	write_text(dir, "model.safetensors.index.json",
		   "{\"weight_map\": {\"model.norm.weight\": \"model-00001-of-00002.safetensors\","
		   " \"lm_head.weight\": \"model-00002-of-00002.safetensors\"}}");
	write_st(dir, "model-00001-of-00002.safetensors", s, 1);
	expect_open_fail(dir, 0, -ENOENT, "model-00002-of-00002.safetensors", "cannot open");

	dir = make_dir("notinshard");
	write_text(dir, "config.json", "{}");
	write_text(dir, "model.safetensors.index.json",
		   "{\"weight_map\": {\"model.norm.weight\": \"one.safetensors\","
		   " \"lm_head.weight\": \"one.safetensors\"}}");
	write_st(dir, "one.safetensors", s, 1);
	expect_open_fail(dir, 0, -EINVAL, "tensor 'lm_head.weight'",
			 "missing from its shard");

	dir = make_dir("badindex");
	write_text(dir, "config.json", "{}");
	write_text(dir, "model.safetensors.index.json", "{\"weight_map\": {\n  oops");
	expect_open_fail(dir, 0, -EINVAL, "model.safetensors.index.json", "line 2");

	dir = make_dir("nomap");
	write_text(dir, "config.json", "{}");
	write_text(dir, "model.safetensors.index.json", "{\"metadata\": {}}");
	expect_open_fail(dir, 0, -EINVAL, "model.safetensors.index.json", "'weight_map'");

	dir = make_dir("escape");
	write_text(dir, "config.json", "{}");
	write_text(dir, "model.safetensors.index.json",
		   "{\"weight_map\": {\"model.norm.weight\": \"../x.safetensors\"}}");
	expect_open_fail(dir, 0, -EINVAL, "'../x.safetensors'", "not a plain file name");

	dir = make_dir("numshard");
	write_text(dir, "config.json", "{}");
	write_text(dir, "model.safetensors.index.json",
		   "{\"weight_map\": {\"model.norm.weight\": 3}}");
	expect_open_fail(dir, 0, -EINVAL, "'model.norm.weight'", "not a file name");
}

static void test_config_errors(void **state)
{
	static const struct spec s[] = { { "model.norm.weight", "F32", 1, 2 } };
	const char *dir;

	dir = make_dir("garbagecfg");
	write_text(dir, "config.json", "{\"vocab_size\": 12,\n\"hidden_size\": }");
	write_st(dir, "model.safetensors", s, 1);
	expect_open_fail(dir, 0, -EINVAL, "garbagecfg/config.json", "line 2");
	expect_open_fail(dir, 1, -EINVAL, "garbagecfg/config.json", "invalid JSON");

	dir = make_dir("arraycfg");
	write_text(dir, "config.json", "[1]");
	expect_open_fail(dir, 1, -EINVAL, "config.json", "not a JSON object");

	dir = make_dir("nocfg");
	write_st(dir, "model.safetensors", s, 1);
	expect_open_fail(dir, 0, -ENOENT, "nocfg/config.json", "cannot open");
	expect_open_fail(dir, 1, -ENOENT, "nocfg/config.json", NULL);

	dir = make_dir("badgen");
	write_text(dir, "config.json", "{}");
	write_text(dir, "generation_config.json", "{\"eos_token_id\": [1,}");
	write_st(dir, "model.safetensors", s, 1);
	expect_open_fail(dir, 0, -EINVAL, "generation_config.json", "line 1");

	dir = make_dir("noweights");
	write_text(dir, "config.json", "{}");
	expect_open_fail(dir, 0, -ENOENT, "no model.safetensors or model.safetensors.index.json",
			 NULL);

	dir = make_dir("badweights");
	write_text(dir, "config.json", "{}");
	write_text(dir, "model.safetensors", "short");
	expect_open_fail(dir, 0, -EINVAL, "badweights/model.safetensors", "shorter");
}

static void test_config_only(void **state)
{
	const char *dir = make_dir("cfgonly");
	struct sm70_err e = { { 0 } };
	struct sm70_ckpt *c;

	write_text(dir, "config.json", "{\"model_type\": \"qwen3\"}");
	write_text(dir, "generation_config.json", "{\"eos_token_id\": 3}");
	assert_int_equal(sm70_ckpt_open_config_only(&c, dir, &e), 0);
	assert_string_equal(json_string_value(json_object_get(sm70_ckpt_config(c),
							      "model_type")), "qwen3");
	assert_int_equal(json_integer_value(json_object_get(sm70_ckpt_generation_config(c),
							    "eos_token_id")), 3);
	assert_null(sm70_ckpt_find(c, "model.norm.weight"));
	sm70_ckpt_close(c);

	/* a real checkpoint opened config-only maps no weights */
	assert_int_equal(sm70_ckpt_open_config_only(&c, FIX "qwen3-gqa2-d64-tied", &e), 0);
	assert_null(sm70_ckpt_find(c, "model.embed_tokens.weight"));
	sm70_ckpt_close(c);
	sm70_ckpt_close(NULL);
	print_message("  config-only open: configs read, no tensors\n");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_fixture_tied),
		cmocka_unit_test(test_fixture_sharded),
		cmocka_unit_test(test_fixture_f16),
		cmocka_unit_test(test_nested_names),
		cmocka_unit_test(test_duplicate_canonical),
		cmocka_unit_test(test_get_errors),
		cmocka_unit_test(test_index_errors),
		cmocka_unit_test(test_config_errors),
		cmocka_unit_test(test_config_only),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
