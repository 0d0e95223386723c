/*
 * test_quantize - sm70-quantize end to end: the qwen3 fixture in both formats opens with
 * sm70_ckpt_open, every quantized tensor dequantises to within half an E2M1 step of the
 * original, the two layouts hold the same codes and scales (global scales reciprocal),
 * copied and excluded tensors are byte-identical, fused 3-D experts get per-expert scales,
 * and bad inputs (NaN, infinity, a row length not a multiple of 16, an all-zero matrix, a
 * missing or malformed checkpoint, a non-empty or quantized directory) get named answers.
 */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "common/dtype.h"
#include "common/nvfp4.h"
#include "common/st_write.h"
#include "daemon/engine/checkpoint.h"
#include "tools/cli/cli.h"

#define FIXTURE "tests/fixtures/qwen3-gqa2-d64-tied"

static char tmp[64];
static char tool[256];
static char out_msg[8192]; /* stdout and stderr of the last run */

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	return remove(path);
}

static int setup(void **state)
{
	const char *b = getenv("SM70_BUILD");

	snprintf(tool, sizeof(tool), "%s/bin/sm70-quantize", b ? b : "build");
	snprintf(tmp, sizeof(tmp), "/tmp/sm70-quant-XXXXXX");
	return mkdtemp(tmp) ? 0 : -1;
}

static int teardown(void **state)
{
	return nftw(tmp, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* Runs sm70-quantize with args (NULL-terminated); returns its exit code, output in out_msg. */
static int run_tool(const char *const *args)
{
	char log[128], *argv[32];
	int n = 0, status, fd;
	pid_t pid;
	FILE *fp;
	size_t got;

	snprintf(log, sizeof(log), "%s/run.log", tmp);
	argv[n++] = tool;
	while (*args && n < 31)
		argv[n++] = (char *)*args++;
	argv[n] = NULL;
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
		dup2(fd, 1);
		dup2(fd, 2);
		execv(tool, argv);
		_exit(127);
	}
	assert_int_equal(waitpid(pid, &status, 0), pid);
	fp = fopen(log, "r");
	assert_non_null(fp);
	got = fread(out_msg, 1, sizeof(out_msg) - 1, fp);
	out_msg[got] = '\0';
	fclose(fp);
	return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

static void expect_run(int code, const char *needle, const char *const *args)
{
	int rc = run_tool(args);

	if (rc != code || (needle && !strstr(out_msg, needle)))
		fail_msg("exit %d (want %d), output '%s' (want '%s')", rc, code, out_msg,
			 needle ? needle : "");
}

static const struct sm70_st_tensor *must_find(const struct sm70_ckpt *c, const char *name)
{
	const struct sm70_st_tensor *t = sm70_ckpt_find(c, name);

	if (!t)
		fail_msg("tensor '%s' missing in %s", name, sm70_ckpt_dir(c));
	return t;
}

static float half_gap(float a)
{
	return a <= 2.0f ? 0.25f : a <= 4.0f ? 0.5f : 1.0f;
}

/* Every element of the input matrix rows x cols (f32 in w) against its NVFP4 decoding;
 * returns the worst error in block steps. */
static double check_bound(const float *w, int64_t rows, int64_t cols, const uint8_t *packed,
			  const uint8_t *scales, float scale_2)
{
	double worst = 0.0;

	for (int64_t r = 0; r < rows; r++) {
		for (int64_t c = 0; c < cols; c++) {
			size_t blk = (size_t)(r * (cols / 16) + c / 16);
			float x = w[r * cols + c], step = sm70_e4m3_to_f32(scales[blk]) * scale_2;
			float deq = sm70_nvfp4_dequant(packed + blk * 8, scales[blk], scale_2,
						       (int)(c % 16));
			float t = step > 0 ? fabsf(x) / step : 0.0f, err = fabsf(deq - x);
			float bound = step == 0.0f ? fabsf(x) : t <= 6.0f ? half_gap(t) * step
									 : (t - 6.0f) * step;

			if (scales[blk] >= 0x08)
				assert_true(t <= 6.4f);
			if (!(err <= bound + fabsf(x) * 0x1p-21f))
				fail_msg("[%lld, %lld]: %g decodes to %g (bound %g)", (long long)r,
					 (long long)c, x, deq, bound);
			if (step > 0 && err / step > worst)
				worst = err / step;
		}
	}
	return worst;
}

static float *to_f32(const struct sm70_st_tensor *t)
{
	size_t n = t->nbytes / sm70_dtype_size(t->dtype);
	float *f = malloc(n * sizeof(float));

	assert_non_null(f);
	assert_int_equal(sm70_convert_to_f32(f, t->data, t->dtype, n), 0);
	return f;
}

static float max_abs(const float *w, size_t n)
{
	float a = 0.0f;

	for (size_t i = 0; i < n; i++)
		a = fmaxf(a, fabsf(w[i]));
	return a;
}

static int has_suffix(const char *s, const char *suffix)
{
	size_t n = strlen(s), m = strlen(suffix);

	return n >= m && strcmp(s + n - m, suffix) == 0;
}

static int json_array_has(json_t *a, const char *s)
{
	size_t i;
	json_t *v;

	json_array_foreach(a, i, v)
		if (json_is_string(v) && strcmp(json_string_value(v), s) == 0)
			return 1;
	return 0;
}

static void test_fixture_both_formats(void **state)
{
	char mo[128], ct[128], name[256];
	struct sm70_ckpt *in, *a, *b;
	struct sm70_err err = { { 0 } };
	const struct sm70_st_file *f;
	int quantized = 0, copied = 0;
	double worst = 0.0;
	json_t *qa, *qb;

	snprintf(mo, sizeof(mo), "%s/mo", tmp);
	snprintf(ct, sizeof(ct), "%s/ct", tmp);
	expect_run(0, "12 of 24 tensors quantized", (const char *const[]){
		"-m", FIXTURE, "-o", mo, "--format", "modelopt", "--exclude", "*.o_proj",
		"--threads", "3", NULL });
	expect_run(0, "3 shards", (const char *const[]){
		"-m", FIXTURE, "-o", ct, "--format", "compressed-tensors", "--exclude", "*.o_proj",
		"--shard-size", "200K", NULL });
	assert_int_equal(sm70_ckpt_open(&in, FIXTURE, &err), 0);
	if (sm70_ckpt_open(&a, mo, &err) || sm70_ckpt_open(&b, ct, &err))
		fail_msg("%s", err.msg);
	assert_int_equal(sm70_ckpt_n_files(b), 3);

	f = sm70_ckpt_file(in, 0);
	for (size_t i = 0; i < f->n_tensors; i++) {
		const struct sm70_st_tensor *t = &f->tensors[i], *codes, *sc, *s2, *pk, *sc2, *g;
		float *w;

		if (!has_suffix(t->name, "_proj.weight") || has_suffix(t->name, "o_proj.weight")) {
			const struct sm70_st_tensor *ka = must_find(a, t->name);
			const struct sm70_st_tensor *kb = must_find(b, t->name);

			assert_int_equal(ka->dtype, t->dtype);
			assert_int_equal(ka->nbytes, t->nbytes);
			assert_memory_equal(ka->data, t->data, t->nbytes);
			assert_memory_equal(kb->data, t->data, t->nbytes);
			copied++;
			continue;
		}
		codes = must_find(a, t->name);
		snprintf(name, sizeof(name), "%s_scale", t->name);
		sc = must_find(a, name);
		snprintf(name, sizeof(name), "%s_scale_2", t->name);
		s2 = must_find(a, name);
		snprintf(name, sizeof(name), "%s_packed", t->name);
		pk = must_find(b, name);
		snprintf(name, sizeof(name), "%s_scale", t->name);
		sc2 = must_find(b, name);
		snprintf(name, sizeof(name), "%s_global_scale", t->name);
		g = must_find(b, name);
		assert_int_equal(codes->dtype, SM70_DTYPE_U8);
		assert_int_equal(codes->shape[0], t->shape[0]);
		assert_int_equal(codes->shape[1], t->shape[1] / 2);
		assert_int_equal(sc->dtype, SM70_DTYPE_F8E4M3);
		assert_int_equal(sc->shape[1], t->shape[1] / 16);
		assert_int_equal(s2->dtype, SM70_DTYPE_F32);
		assert_int_equal(s2->ndim, 0);
		assert_int_equal(g->ndim, 1);
		assert_int_equal(g->shape[0], 1);
		/* the same codes and block scales in both layouts; reciprocal global scales */
		assert_int_equal(pk->nbytes, codes->nbytes);
		assert_memory_equal(pk->data, codes->data, codes->nbytes);
		assert_memory_equal(sc2->data, sc->data, sc->nbytes);
		{
			float s2v, gv;

			memcpy(&s2v, s2->data, 4);
			memcpy(&gv, g->data, 4);
			assert_true(gv == 1.0f / s2v);
			w = to_f32(t);
			assert_true(s2v == max_abs(w, t->nbytes / 2) / 2688.0f);
			worst = fmax(worst, check_bound(w, t->shape[0], t->shape[1], codes->data,
							sc->data, s2v));
			free(w);
		}
		quantized++;
	}
	assert_int_equal(quantized, 12);
	qa = json_object_get(sm70_ckpt_config(a), "quantization_config");
	qb = json_object_get(sm70_ckpt_config(b), "quantization_config");
	assert_string_equal(json_string_value(json_object_get(qa, "quant_method")), "modelopt");
	assert_string_equal(json_string_value(json_object_get(qa, "quant_algo")), "NVFP4");
	assert_true(json_array_has(json_object_get(qa, "ignore"), "lm_head"));
	assert_true(json_array_has(json_object_get(qa, "ignore"),
				   "model.layers.1.self_attn.o_proj"));
	assert_string_equal(json_string_value(json_object_get(qb, "quant_method")),
			    "compressed-tensors");
	assert_string_equal(json_string_value(json_object_get(qb, "format")),
			    "nvfp4-pack-quantized");
	assert_true(json_array_has(json_object_get(qb, "ignore"),
				   "model.layers.0.self_attn.o_proj"));
	snprintf(name, sizeof(name), "%s/hf_quant_config.json", mo);
	assert_int_equal(access(name, R_OK), 0);
	snprintf(name, sizeof(name), "%s/generation_config.json", ct);
	assert_int_equal(access(name, R_OK), 0);
	sm70_ckpt_close(b);
	sm70_ckpt_close(a);
	sm70_ckpt_close(in);
	printf("  %d tensors quantized (worst error %.3f block steps, <= half an E2M1 step), "
	       "identical codes and scales in both layouts, %d copied byte for byte, 3 shards "
	       "read through the index\n", quantized, worst, copied);
}

/* A checkpoint at tmp/name: config.json and one model.safetensors of f32 tensors. */
struct spec {
	const char *name;
	int ndim;
	int64_t shape[3];
	const float *data;
};

static void make_ckpt(const char *dir, const struct spec *specs, int n)
{
	struct sm70_st_writer *w;
	struct sm70_err err = { { 0 } };
	char path[256];
	FILE *fp;

	mkdir(dir, 0755);
	snprintf(path, sizeof(path), "%s/config.json", dir);
	fp = fopen(path, "w");
	assert_non_null(fp);
	fputs("{\"model_type\": \"qwen3_moe\"}\n", fp);
	fclose(fp);
	snprintf(path, sizeof(path), "%s/model.safetensors", dir);
	assert_int_equal(sm70_st_writer_open(&w, path, &err), 0);
	for (int i = 0; i < n; i++)
		assert_int_equal(sm70_st_writer_add(w, specs[i].name, SM70_DTYPE_F32,
						    specs[i].ndim, specs[i].shape, &err), 0);
	assert_int_equal(sm70_st_writer_write_header(w, &err), 0);
	for (int i = 0; i < n; i++) {
		size_t elems = 1;

		for (int d = 0; d < specs[i].ndim; d++)
			elems *= (size_t)specs[i].shape[d];
		assert_int_equal(sm70_st_writer_write(w, specs[i].data, elems * 4, &err), 0);
	}
	assert_int_equal(sm70_st_writer_commit(w, &err), 0);
}

static void fill(float *w, size_t n, float scale, unsigned seed)
{
	for (size_t i = 0; i < n; i++) {
		seed = seed * 1103515245u + 12345u;
		w[i] = scale * ((float)(seed >> 8 & 0xffff) / 32768.0f - 1.0f);
	}
}

static void test_experts_and_edge_tensors(void **state)
{
	static float experts[2 * 4 * 32], router[2 * 32], odd[4 * 24], zero[4 * 16];
	const struct spec specs[] = {
		{ "model.layers.0.mlp.experts.gate_up_proj", 3, { 2, 4, 32 }, experts },
		{ "model.layers.0.mlp.gate.weight", 2, { 2, 32 }, router },
		{ "model.layers.0.self_attn.q_proj.weight", 2, { 4, 24 }, odd },
		{ "model.layers.0.self_attn.k_proj.weight", 2, { 4, 16 }, zero },
	};
	const struct sm70_st_tensor *t;
	struct sm70_err err = { { 0 } };
	struct sm70_ckpt *c;
	char in[128], out[128];
	float s2[2];

	fill(experts, 4 * 32, 0.01f, 1);
	fill(experts + 4 * 32, 4 * 32, 10.0f, 2); /* expert 1 a thousand times larger */
	fill(router, 64, 1.0f, 3);
	fill(odd, 96, 1.0f, 4);
	snprintf(in, sizeof(in), "%s/edge", tmp);
	snprintf(out, sizeof(out), "%s/edge-out", tmp);
	make_ckpt(in, specs, 4);
	expect_run(0, "not a multiple of 16", (const char *const[]){
		"-m", in, "-o", out, "--format", "modelopt", NULL });
	assert_non_null(strstr(out_msg, "'model.layers.0.self_attn.q_proj.weight' is kept"));
	assert_non_null(strstr(out_msg, "'model.layers.0.self_attn.k_proj.weight' has an "
				"all-zero matrix"));
	if (sm70_ckpt_open(&c, out, &err))
		fail_msg("%s", err.msg);
	t = must_find(c, "model.layers.0.mlp.experts.gate_up_proj");
	assert_int_equal(t->dtype, SM70_DTYPE_U8);
	assert_int_equal(t->ndim, 3);
	assert_int_equal(t->shape[2], 16);
	{
		const struct sm70_st_tensor *sc = must_find(c, "model.layers.0.mlp.experts."
							    "gate_up_proj_weight_scale");
		const struct sm70_st_tensor *g = must_find(c, "model.layers.0.mlp.experts."
							   "gate_up_proj_weight_scale_2");

		assert_int_equal(sc->shape[0], 2);
		assert_int_equal(sc->shape[2], 2);
		assert_int_equal(g->ndim, 1);
		assert_int_equal(g->shape[0], 2);
		memcpy(s2, g->data, sizeof(s2));
		for (int e = 0; e < 2; e++) {
			assert_true(s2[e] == max_abs(experts + e * 128, 128) / 2688.0f);
			check_bound(experts + e * 128, 4, 32, (const uint8_t *)t->data + e * 64,
				    (const uint8_t *)sc->data + e * 8, s2[e]);
		}
	}
	t = must_find(c, "model.layers.0.mlp.gate.weight");
	assert_int_equal(t->dtype, SM70_DTYPE_F32);
	assert_memory_equal(t->data, router, sizeof(router));
	t = must_find(c, "model.layers.0.self_attn.q_proj.weight");
	assert_int_equal(t->dtype, SM70_DTYPE_F32);
	assert_memory_equal(t->data, odd, sizeof(odd));
	t = must_find(c, "model.layers.0.self_attn.k_proj.weight_scale_2");
	assert_true(*(const float *)t->data == 1.0f);
	t = must_find(c, "model.layers.0.self_attn.k_proj.weight");
	for (size_t i = 0; i < t->nbytes; i++)
		assert_int_equal(((const uint8_t *)t->data)[i], 0);
	assert_true(json_array_has(json_object_get(json_object_get(sm70_ckpt_config(c),
		"quantization_config"), "ignore"), "model.layers.0.self_attn.q_proj"));
	sm70_ckpt_close(c);

	/* quantizing the output again is refused */
	snprintf(in, sizeof(in), "%s/edge-again", tmp);
	expect_run(2, "already quantized", (const char *const[]){
		"-m", out, "-o", in, "--format", "modelopt", NULL });
	printf("  fused experts: per-expert scale_2 [2] (amax / 2688 each), scales [2, 4, 2]; "
	       "router and K = 24 kept byte for byte with a notice; all-zero matrix: scale_2 1, "
	       "codes 0; a quantized input refused\n");
}

static void test_refusals(void **state)
{
	static float nan_w[2 * 16], inf_w[3 * 16];
	const struct spec nan_spec[] = { { "model.layers.0.mlp.up_proj.weight", 2, { 2, 16 },
					   nan_w } };
	const struct spec inf_spec[] = { { "model.layers.0.mlp.experts.down_proj", 3,
					   { 1, 3, 16 }, inf_w } };
	char in[128], out[128], path[256];
	FILE *fp;

	nan_w[19] = NAN;
	inf_w[40] = -INFINITY;
	snprintf(in, sizeof(in), "%s/nan", tmp);
	snprintf(out, sizeof(out), "%s/nan-out", tmp);
	make_ckpt(in, nan_spec, 1);
	expect_run(2, "tensor 'model.layers.0.mlp.up_proj.weight' element [1, 3] is NaN",
		   (const char *const[]){ "-m", in, "-o", out, "--format", "modelopt", NULL });
	snprintf(path, sizeof(path), "%s/model.safetensors", out);
	assert_int_not_equal(access(path, F_OK), 0); /* nothing left behind */
	snprintf(in, sizeof(in), "%s/inf", tmp);
	snprintf(out, sizeof(out), "%s/inf-out", tmp);
	make_ckpt(in, inf_spec, 1);
	expect_run(2, "'model.layers.0.mlp.experts.down_proj' element [0, 2, 8] is infinite",
		   (const char *const[]){ "-m", in, "-o", out, "--format",
					  "compressed-tensors", NULL });

	snprintf(in, sizeof(in), "%s/missing", tmp);
	expect_run(2, "missing/config.json: cannot open", (const char *const[]){
		"-m", in, "-o", out, "--format", "modelopt", NULL });
	snprintf(in, sizeof(in), "%s/garbage", tmp);
	mkdir(in, 0755);
	snprintf(path, sizeof(path), "%s/config.json", in);
	fp = fopen(path, "w");
	fputs("{}", fp);
	fclose(fp);
	snprintf(path, sizeof(path), "%s/model.safetensors", in);
	fp = fopen(path, "w");
	fputs("not a safetensors file", fp);
	fclose(fp);
	expect_run(2, "garbage/model.safetensors: header length", (const char *const[]){
		"-m", in, "-o", out, "--format", "modelopt", NULL });

	/* a non-empty output directory needs --force */
	snprintf(out, sizeof(out), "%s/busy", tmp);
	mkdir(out, 0755);
	snprintf(path, sizeof(path), "%s/notes.txt", out);
	fp = fopen(path, "w");
	fclose(fp);
	expect_run(2, "output directory is not empty (it holds notes.txt); --force",
		   (const char *const[]){ "-m", FIXTURE, "-o", out, "--format", "modelopt",
					  NULL });
	expect_run(0, NULL, (const char *const[]){ "-m", FIXTURE, "-o", out, "--format",
						   "modelopt", "--force", NULL });
	assert_int_equal(access(path, F_OK), 0); /* --force leaves other files alone */
	expect_run(2, "the output directory is the input directory", (const char *const[]){
		"-m", FIXTURE, "-o", FIXTURE, "--format", "modelopt", "--force", NULL });
	expect_run(2, "--format must be modelopt or compressed-tensors, not 'gguf'",
		   (const char *const[]){ "-m", FIXTURE, "-o", out, "--format", "gguf", NULL });
	printf("  NaN and infinity refused naming tensor and element (no output left), missing "
	       "and malformed checkpoints named, non-empty OUT_DIR needs --force, IN_DIR as "
	       "OUT_DIR and an unknown format refused\n");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_fixture_both_formats),
		cmocka_unit_test(test_experts_and_edge_tensors),
		cmocka_unit_test(test_refusals),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
