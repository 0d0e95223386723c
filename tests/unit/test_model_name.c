/*
 * test_model_name - the model's name by its rule (daemon/model_name.h): model_name wins,
 * then config.json's _name_or_path (a hub id as it is, a path by its end), then the
 * directory's name unless generic, a symlink's target, a Hugging Face cache snapshot,
 * then model_type; invalid and generic names are skipped.
 */
#include "daemon/model_name.c"

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

static char root[64];

/* Makes root/rel (parents too) with a config.json holding json (NULL: none). */
static void make_dir(const char *rel, const char *json)
{
	char path[512], cmd[600];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", root, rel);
	snprintf(cmd, sizeof(cmd), "mkdir -p '%s'", path);
	assert_int_equal(system(cmd), 0);
	if (!json)
		return;
	strcat(path, "/config.json");
	f = fopen(path, "w");
	assert_non_null(f);
	fputs(json, f);
	fclose(f);
}

static void expect(const char *configured, const char *rel, const char *want,
		   const char *want_source)
{
	char dir[512], name[SM70__MODEL_NAME_MAX];
	const char *source = NULL;

	snprintf(dir, sizeof(dir), "%s/%s", root, rel);
	sm70__model_name_choose(configured, dir, name, &source);
	printf("%-40s -> %-24s (from %s)\n", rel, name, source);
	assert_string_equal(name, want);
	assert_string_equal(source, want_source);
}

static void test_rule(void **state)
{
	make_dir("qwen3-8b", "{\"model_type\": \"qwen3\"}");
	expect(NULL, "qwen3-8b", "qwen3-8b", "the directory");
	expect("", "qwen3-8b/", "qwen3-8b", "the directory");
	expect("prod-chat", "qwen3-8b", "prod-chat", "model_name");
	/* "." says nothing; the directory it resolves to does */
	expect(NULL, "qwen3-8b/.", "qwen3-8b", "the directory's target");

	make_dir("model", "{\"_name_or_path\": \"Qwen/Qwen3-8B\", \"model_type\": \"qwen3\"}");
	expect(NULL, "model", "Qwen/Qwen3-8B", "config.json _name_or_path");
	/* a path in _name_or_path: its end, unless generic */
	make_dir("a/model", "{\"_name_or_path\": \"/data/ckpt/qwen3-4b-ft\"}");
	expect(NULL, "a/model", "qwen3-4b-ft", "config.json _name_or_path");
	/* a Hugging Face cache snapshot in _name_or_path */
	make_dir("f/model", "{\"_name_or_path\": \"/root/.cache/huggingface/hub/"
		 "models--Qwen--Qwen3-4B/snapshots/1cfa9a7208912126459214e8b04321603b3df60c\"}");
	expect(NULL, "f/model", "Qwen/Qwen3-4B", "config.json _name_or_path");
	make_dir("b/model", "{\"_name_or_path\": \"./model\", \"model_type\": \"qwen3_5\"}");
	expect(NULL, "b/model", "qwen3_5", "config.json model_type");
	/* a name that cannot go into a label as it is: skipped */
	make_dir("c/weights", "{\"_name_or_path\": \"bad\\\"name\", \"model_type\": \"qwen3\"}");
	expect(NULL, "c/weights", "qwen3", "config.json model_type");
	make_dir("d/snapshot", "{\"_name_or_path\": \"\"}");
	expect(NULL, "d/snapshot", "unnamed", "nothing");
	make_dir("e/checkpoint", NULL);
	expect(NULL, "e/checkpoint", "unnamed", "nothing");

	/* the packaged layout: /var/lib/sm70/model -> the real directory */
	make_dir("store/qwen3-14b-awq", "{}");
	make_dir("svc", NULL);
	{
		char link[512], target[512];

		snprintf(link, sizeof(link), "%s/svc/model", root);
		snprintf(target, sizeof(target), "%s/store/qwen3-14b-awq", root);
		assert_int_equal(symlink(target, link), 0);
		expect(NULL, "svc/model", "qwen3-14b-awq", "the directory's target");
	}

	/* a Hugging Face cache snapshot */
	make_dir("hub/models--Qwen--Qwen3-0.6B/snapshots/0123456789abcdef0123456789abcdef01234567",
		 "{}");
	expect(NULL, "hub/models--Qwen--Qwen3-0.6B/snapshots/"
	       "0123456789abcdef0123456789abcdef01234567", "Qwen/Qwen3-0.6B",
	       "the Hugging Face cache path");
	/* an invalid configured name (config.c refuses it; the chooser skips it) */
	expect("tab\there", "qwen3-8b", "qwen3-8b", "the directory");
}

static void test_generic_and_valid(void **state)
{
	assert_true(sm70__model_name_generic("model"));
	assert_true(sm70__model_name_generic("Snapshots"));
	assert_true(sm70__model_name_generic("0123abc"));
	assert_false(sm70__model_name_generic("012ab")); /* too short to be a hash */
	assert_false(sm70__model_name_generic("qwen3"));
	assert_true(sm70__model_name_valid("Qwen/Qwen3-8B", 13));
	assert_false(sm70__model_name_valid("a\"b", 3));
	assert_false(sm70__model_name_valid("a\\b", 3));
	assert_false(sm70__model_name_valid("a\nb", 3));
	assert_false(sm70__model_name_valid("", 0));
	{
		char long_name[80];

		memset(long_name, 'x', sizeof(long_name));
		assert_true(sm70__model_name_valid(long_name, 63));
		assert_false(sm70__model_name_valid(long_name, 64));
	}
}

static int setup(void **state)
{
	snprintf(root, sizeof(root), "/tmp/sm70-model-name-XXXXXX");
	return mkdtemp(root) ? 0 : -1;
}

static int teardown(void **state)
{
	char cmd[128];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
	return system(cmd) == 0 ? 0 : -1;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_rule),
		cmocka_unit_test(test_generic_and_valid),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
