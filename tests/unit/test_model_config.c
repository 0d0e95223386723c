/* test_model_config - config.json parsing: fixture values, defaults, text_config, errors. */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "daemon/engine/model_config.h"

#define FIX "tests/fixtures/"

static const char base_json[] =
	"{\"model_type\": \"qwen3\", \"vocab_size\": 100, \"hidden_size\": 64,"
	" \"intermediate_size\": 128, \"num_hidden_layers\": 2, \"num_attention_heads\": 4,"
	" \"num_key_value_heads\": 2}";

static json_t *load(const char *text)
{
	json_error_t jerr;
	json_t *j = json_loads(text, 0, &jerr);

	if (!j)
		fail_msg("test JSON does not parse: %s: %s", jerr.text, text);
	return j;
}

/* base_json with the keys of patch (a JSON object text) set over it. */
static json_t *patched(const char *patch)
{
	json_t *base = load(base_json), *p = load(patch);

	assert_int_equal(json_object_update(base, p), 0);
	json_decref(p);
	return base;
}

static long long ival(json_t *obj, const char *key)
{
	json_t *v = json_object_get(obj, key);

	assert_true(json_is_integer(v));
	return json_integer_value(v);
}

static void check_fixture(const char *dir, int eos0)
{
	char path[256];
	json_t *cfg, *gen, *eos;
	struct sm70_model_config mc;
	struct sm70_err e = { { 0 } };

	snprintf(path, sizeof(path), FIX "%s/config.json", dir);
	cfg = json_load_file(path, 0, NULL);
	assert_non_null(cfg);
	snprintf(path, sizeof(path), FIX "%s/generation_config.json", dir);
	gen = json_load_file(path, 0, NULL);
	assert_non_null(gen);

	assert_int_equal(sm70_model_config_parse(&mc, cfg, gen, &e), 0);
	assert_int_equal(mc.arch, SM70_ARCH_QWEN3);
	assert_string_equal(mc.model_type, "qwen3");
	assert_int_equal(mc.vocab_size, ival(cfg, "vocab_size"));
	assert_int_equal(mc.hidden_size, ival(cfg, "hidden_size"));
	assert_int_equal(mc.intermediate_size, ival(cfg, "intermediate_size"));
	assert_int_equal(mc.n_layers, ival(cfg, "num_hidden_layers"));
	assert_int_equal(mc.n_heads, ival(cfg, "num_attention_heads"));
	assert_int_equal(mc.n_kv_heads, ival(cfg, "num_key_value_heads"));
	assert_int_equal(mc.head_dim, ival(cfg, "head_dim"));
	assert_int_equal(mc.rot_dim, mc.head_dim);
	assert_int_equal(mc.max_position, ival(cfg, "max_position_embeddings"));
	assert_int_equal(mc.tie_word_embeddings,
			 json_is_true(json_object_get(cfg, "tie_word_embeddings")));
	assert_true(mc.rms_norm_eps ==
		    (float)json_real_value(json_object_get(cfg, "rms_norm_eps")));
	assert_true(mc.rope_theta == json_real_value(json_object_get(
					     json_object_get(cfg, "rope_parameters"), "rope_theta")));
	eos = json_object_get(gen, "eos_token_id");
	assert_int_equal(mc.n_eos, json_array_size(eos));
	for (int i = 0; i < mc.n_eos; i++)
		assert_int_equal(mc.eos_ids[i], json_integer_value(json_array_get(eos, i)));
	assert_int_equal(mc.eos_ids[0], eos0);
	print_message("  %-22s vocab %d hidden %d ffn %d layers %d heads %d/%d hd %d pos %d "
		      "tie %d eps %g theta %g eos %d(+%d) match the JSON\n", dir, mc.vocab_size,
		      mc.hidden_size, mc.intermediate_size, mc.n_layers, mc.n_heads,
		      mc.n_kv_heads, mc.head_dim, mc.max_position, mc.tie_word_embeddings,
		      mc.rms_norm_eps, mc.rope_theta, mc.eos_ids[0], mc.n_eos - 1);
	json_decref(gen);
	json_decref(cfg);
}

static void test_fixtures(void **state)
{
	check_fixture("qwen3-gqa2-d64-tied", 511);
	check_fixture("qwen3-gqa6-d256-long", 1020);
	check_fixture("qwen3-mha-d32-f16", 383);
}

/* The hybrid fixtures: layer kinds, DeltaNet dimensions, partial rotation and the
 * family's flags, from the flat and the vision-language (text_config) layouts. */
static void test_hybrid_fixtures(void **state)
{
	static const struct {
		const char *dir;
		const char *type;
		int layers, attn, kh, vh, dk, dv, rot, fused;
	} want[] = {
		{ "qwen3_5-gqa6-d256-hybrid", "qwen3_5_text", 5, 2, 2, 4, 32, 48, 64, 0 },
		{ "qwen3_5-vl-tied", "qwen3_5", 4, 1, 1, 3, 32, 32, 16, 0 },
		{ "qwen3_next-dense-fused", "qwen3_next", 4, 1, 2, 4, 32, 32, 16, 1 },
	};

	for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
		char path[256];
		struct sm70_model_config mc;
		struct sm70_err e = { { 0 } };
		json_t *cfg;
		int attn = 0;

		snprintf(path, sizeof(path), FIX "%s/config.json", want[i].dir);
		cfg = json_load_file(path, 0, NULL);
		assert_non_null(cfg);
		if (sm70_model_config_parse(&mc, cfg, NULL, &e))
			fail_msg("%s: %s", want[i].dir, e.msg);
		assert_string_equal(mc.model_type, want[i].type);
		assert_int_equal(mc.arch, SM70_ARCH_QWEN3_5);
		assert_int_equal(mc.n_layers, want[i].layers);
		for (int l = 0; l < mc.n_layers; l++)
			attn += mc.layer_kind[l] == SM70_LAYER_ATTENTION;
		assert_int_equal(attn, want[i].attn);
		assert_int_equal(mc.n_attn_layers, want[i].attn);
		assert_int_equal(mc.hybrid.n_gdn_layers, want[i].layers - want[i].attn);
		assert_int_equal(mc.hybrid.gdn.n_k_heads, want[i].kh);
		assert_int_equal(mc.hybrid.gdn.n_v_heads, want[i].vh);
		assert_int_equal(mc.hybrid.gdn.k_dim, want[i].dk);
		assert_int_equal(mc.hybrid.gdn.v_dim, want[i].dv);
		assert_int_equal(mc.hybrid.gdn.conv_k, 4);
		assert_int_equal(mc.rot_dim, want[i].rot);
		assert_int_equal(mc.hybrid.fused_proj, want[i].fused);
		assert_true(mc.zero_centred_norms && mc.attn_gate);
		print_message("  %-26s %s: %d layers (%d attention), DeltaNet %d/%d heads of %d/%d, "
			      "rot %d of %d%s\n", want[i].dir, mc.model_type, mc.n_layers, attn,
			      mc.hybrid.gdn.n_k_heads, mc.hybrid.gdn.n_v_heads, mc.hybrid.gdn.k_dim,
			      mc.hybrid.gdn.v_dim, mc.rot_dim, mc.head_dim,
			      mc.hybrid.fused_proj ? ", fused projections" : "");
		json_decref(cfg);
	}
}

static void test_generation_eos_wins(void **state)
{
	json_t *cfg = json_load_file(FIX "qwen3-gqa6-d256-long/config.json", 0, NULL);
	json_t *gen = load("{\"eos_token_id\": [1020, 1021, 7]}");
	json_t *gen_none = load("{\"bos_token_id\": 0}");
	struct sm70_model_config mc;
	struct sm70_err e = { { 0 } };

	assert_non_null(cfg);
	assert_int_equal(sm70_model_config_parse(&mc, cfg, gen, &e), 0);
	assert_int_equal(mc.n_eos, 3);
	assert_int_equal(mc.eos_ids[0], 1020);
	assert_int_equal(mc.eos_ids[1], 1021);
	assert_int_equal(mc.eos_ids[2], 7);
	/* without generation_config (or without its eos), config.json's single id is used */
	assert_int_equal(sm70_model_config_parse(&mc, cfg, NULL, &e), 0);
	assert_int_equal(mc.n_eos, 1);
	assert_int_equal(mc.eos_ids[0], 1020);
	assert_int_equal(sm70_model_config_parse(&mc, cfg, gen_none, &e), 0);
	assert_int_equal(mc.n_eos, 1);
	print_message("  eos: generation_config [1020, 1021, 7] wins over config 1020\n");
	json_decref(gen_none);
	json_decref(gen);
	json_decref(cfg);
}

static void test_defaults(void **state)
{
	json_t *cfg = patched("{\"num_key_value_heads\": null}");
	struct sm70_model_config mc;
	struct sm70_err e = { { 0 } };

	assert_int_equal(sm70_model_config_parse(&mc, cfg, NULL, &e), 0);
	assert_int_equal(mc.n_kv_heads, 4);
	assert_int_equal(mc.head_dim, 16);
	assert_int_equal(mc.rot_dim, 16);
	assert_int_equal(mc.max_position, 32768);
	assert_int_equal(mc.tie_word_embeddings, 0);
	assert_true(mc.rms_norm_eps == 1e-6f);
	assert_true(mc.rope_theta == 10000.0);
	assert_int_equal(mc.n_eos, 0);
	json_decref(cfg);

	/* older layout: top-level rope_theta, rope_scaling null, integer eps accepted */
	cfg = patched("{\"rope_theta\": 500000, \"rope_scaling\": null, \"eos_token_id\": 5,"
		      " \"tie_word_embeddings\": true}");
	assert_int_equal(sm70_model_config_parse(&mc, cfg, NULL, &e), 0);
	assert_true(mc.rope_theta == 500000.0);
	assert_int_equal(mc.n_eos, 1);
	assert_int_equal(mc.eos_ids[0], 5);
	assert_int_equal(mc.tie_word_embeddings, 1);
	json_decref(cfg);
	print_message("  defaults: kv=heads, head_dim=hidden/heads, pos 32768, eps 1e-6, "
		      "theta 1e4\n");
}

static void test_text_config(void **state)
{
	json_t *cfg = load("{\"model_type\": \"qwen3\", \"tie_word_embeddings\": true,"
			   " \"text_config\": {\"vocab_size\": 300, \"hidden_size\": 48,"
			   " \"intermediate_size\": 96, \"num_hidden_layers\": 3,"
			   " \"num_attention_heads\": 6, \"num_key_value_heads\": 3,"
			   " \"head_dim\": 8, \"eos_token_id\": [299, 298],"
			   " \"rope_parameters\": {\"rope_type\": \"default\","
			   " \"rope_theta\": 250000.0}}}");
	struct sm70_model_config mc;
	struct sm70_err e = { { 0 } };

	assert_int_equal(sm70_model_config_parse(&mc, cfg, NULL, &e), 0);
	assert_int_equal(mc.vocab_size, 300);
	assert_int_equal(mc.hidden_size, 48);
	assert_int_equal(mc.intermediate_size, 96);
	assert_int_equal(mc.n_layers, 3);
	assert_int_equal(mc.n_heads, 6);
	assert_int_equal(mc.n_kv_heads, 3);
	assert_int_equal(mc.head_dim, 8);
	assert_int_equal(mc.tie_word_embeddings, 1);
	assert_true(mc.rope_theta == 250000.0);
	assert_int_equal(mc.n_eos, 2);
	assert_int_equal(mc.eos_ids[1], 298);
	json_decref(cfg);

	/* a wrong type under text_config is named with its path */
	cfg = load("{\"model_type\": \"qwen3\", \"text_config\": {\"vocab_size\": 300,"
		   " \"hidden_size\": \"48\"}}");
	assert_int_equal(sm70_model_config_parse(&mc, cfg, NULL, &e), -EINVAL);
	print_message("  text_config values read; error: %s\n", e.msg);
	assert_non_null(strstr(e.msg, "'text_config.hidden_size' must be an integer"));
	json_decref(cfg);
}

struct bad_case {
	const char *patch; /* set over base_json */
	const char *gen;   /* generation_config text, or NULL */
	int code;
	const char *sub;
};

static const struct bad_case bad_cases[] = {
	{ "{\"model_type\": \"llama\"}", NULL, -ENOTSUP,
	  "config.json: unsupported model_type 'llama' (supported: qwen3, qwen3_5_text, "
	  "qwen3_5, qwen3_next, qwen3_moe, qwen3_5_moe_text, qwen3_5_moe, qwen4_exp_text, "
	  "qwen4_exp)" },
	{ "{\"model_type\": \"qwen3_moe\", \"num_experts\": 4, \"num_experts_per_tok\": 5,"
	  " \"moe_intermediate_size\": 32}", NULL, -EINVAL,
	  "'num_experts_per_tok' (5) exceeds 'num_experts' (4)" },
	{ "{\"model_type\": \"qwen3_moe\", \"intermediate_size\": null, "
	  "\"mlp_only_layers\": [0]}", NULL, -EINVAL, "missing required key 'intermediate_size'" },
	{ "{\"model_type\": \"qwen3_moe\", \"mlp_only_layers\": [7]}", NULL, -EINVAL,
	  "'mlp_only_layers[0]' must be a layer index below 2" },
	{ "{\"model_type\": \"qwen3_5_text\", \"layer_types\": [\"full_attention\"]}", NULL,
	  -EINVAL, "'layer_types' lists 1 layers, 'num_hidden_layers' is 2" },
	{ "{\"model_type\": \"qwen3_5_text\", \"layer_types\": [\"full_attention\", "
	  "\"sliding_attention\"]}", NULL, -ENOTSUP,
	  "'layer_types[1]' 'sliding_attention' is not supported" },
	{ "{\"model_type\": \"qwen3_5_text\", \"layer_types\": [\"linear_attention\", "
	  "\"linear_attention\"]}", NULL, -ENOTSUP, "has no full_attention layer" },
	{ "{\"model_type\": \"qwen3_5_text\", \"linear_num_key_heads\": 3, "
	  "\"linear_num_value_heads\": 4}", NULL, -EINVAL,
	  "'linear_num_value_heads' (4) is not a multiple of 'linear_num_key_heads' (3)" },
	{ "{\"model_type\": \"qwen3_5_text\", \"partial_rotary_factor\": 0.01}", NULL,
	  -EINVAL, "rotates 0 dimensions" },
	{ "{\"model_type\": \"qwen3_next\", \"num_experts\": 8, \"layer_types\": "
	  "[\"linear_attention\", \"full_attention\"], \"num_experts_per_tok\": 2, "
	  "\"shared_expert_intermediate_size\": -1}", NULL, -EINVAL,
	  "'shared_expert_intermediate_size' (-1) must be between 1" },
	{ "{\"model_type\": \"qwen3_vl\"}", NULL, -ENOTSUP, "'qwen3_vl'" },
	{ "{\"model_type\": null}", NULL, -EINVAL, "missing required key 'model_type'" },
	{ "{\"model_type\": 3}", NULL, -EINVAL, "'model_type' must be a string" },
	{ "{\"hidden_size\": \"64\"}", NULL, -EINVAL,
	  "config.json: 'hidden_size' must be an integer" },
	{ "{\"hidden_size\": 64.0}", NULL, -EINVAL, "'hidden_size' must be an integer" },
	{ "{\"vocab_size\": null}", NULL, -EINVAL, "missing required key 'vocab_size'" },
	{ "{\"num_hidden_layers\": null}", NULL, -EINVAL,
	  "missing required key 'num_hidden_layers'" },
	{ "{\"vocab_size\": -5}", NULL, -EINVAL, "'vocab_size' (-5) must be between" },
	{ "{\"vocab_size\": 16777217}", NULL, -EINVAL, "'vocab_size' (16777217)" },
	{ "{\"num_attention_heads\": 0}", NULL, -EINVAL, "'num_attention_heads' (0)" },
	{ "{\"num_key_value_heads\": 0}", NULL, -EINVAL, "'num_key_value_heads' (0)" },
	{ "{\"num_attention_heads\": 6, \"num_key_value_heads\": 4, \"head_dim\": 16}", NULL,
	  -EINVAL,
	  "config.json: 'num_attention_heads' (6) is not a multiple of 'num_key_value_heads' (4)" },
	{ "{\"num_attention_heads\": 2, \"num_key_value_heads\": 4}", NULL, -EINVAL,
	  "not a multiple" },
	{ "{\"hidden_size\": 66, \"num_attention_heads\": 4}", NULL, -EINVAL,
	  "no 'head_dim', and 'hidden_size' (66)" },
	{ "{\"head_dim\": 15}", NULL, -EINVAL, "'head_dim' (15) must be even" },
	{ "{\"head_dim\": true}", NULL, -EINVAL, "'head_dim' must be an integer" },
	{ "{\"max_position_embeddings\": 0}", NULL, -EINVAL, "'max_position_embeddings' (0)" },
	{ "{\"tie_word_embeddings\": 1}", NULL, -EINVAL,
	  "'tie_word_embeddings' must be true or false" },
	{ "{\"rms_norm_eps\": 0}", NULL, -EINVAL, "'rms_norm_eps' (0) must be in (0, 1)" },
	{ "{\"rms_norm_eps\": -1e-6}", NULL, -EINVAL, "'rms_norm_eps'" },
	{ "{\"rms_norm_eps\": 1e-60}", NULL, -EINVAL, "'rms_norm_eps'" },
	{ "{\"rms_norm_eps\": \"1e-6\"}", NULL, -EINVAL, "'rms_norm_eps' must be a number" },
	{ "{\"rope_parameters\": {\"rope_type\": \"yarn\", \"factor\": 4.0}}", NULL, -ENOTSUP,
	  "rope_type 'yarn' is not supported" },
	{ "{\"rope_scaling\": {\"type\": \"linear\", \"factor\": 2.0}}", NULL, -ENOTSUP,
	  "rope_scaling rope_type 'linear'" },
	{ "{\"rope_parameters\": {\"rope_type\": 7}}", NULL, -EINVAL,
	  "'rope_parameters.rope_type' must be a string" },
	{ "{\"rope_parameters\": \"default\"}", NULL, -EINVAL,
	  "'rope_parameters' must be an object" },
	{ "{\"rope_parameters\": {\"rope_type\": \"default\", \"partial_rotary_factor\": 0.25}}",
	  NULL, -ENOTSUP, "'rope_parameters.partial_rotary_factor' 0.25" },
	{ "{\"rope_theta\": -1}", NULL, -EINVAL, "'rope_theta' (-1) must be a positive" },
	{ "{\"rope_theta\": \"big\"}", NULL, -EINVAL, "'rope_theta' must be a number" },
	{ "{\"use_sliding_window\": true}", NULL, -ENOTSUP, "'use_sliding_window'" },
	{ "{\"attention_bias\": true}", NULL, -ENOTSUP, "'attention_bias'" },
	{ "{\"text_config\": [1]}", NULL, -EINVAL, "'text_config' must be an object" },
	{ "{\"eos_token_id\": 100}", NULL, -EINVAL,
	  "config.json: 'eos_token_id' 100 is outside the vocabulary (100 tokens)" },
	{ "{\"eos_token_id\": \"2\"}", NULL, -EINVAL, "config.json: 'eos_token_id' must be" },
	{ "{\"eos_token_id\": [1, 2.5]}", NULL, -EINVAL, "'eos_token_id' must be" },
	{ "{\"eos_token_id\": [1, 2, 3, 4, 5, 6, 7, 8, 9]}", NULL, -EINVAL,
	  "'eos_token_id' lists 9 ids (at most 8)" },
	{ "{\"eos_token_id\": 5}", "{\"eos_token_id\": [5, -1]}", -EINVAL,
	  "generation_config.json: 'eos_token_id' -1 is outside the vocabulary" },
	{ "{}", "[5]", -EINVAL, "generation_config.json: top level is not a JSON object" },
};

static void test_errors(void **state)
{
	for (size_t i = 0; i < sizeof(bad_cases) / sizeof(bad_cases[0]); i++) {
		const struct bad_case *b = &bad_cases[i];
		json_t *cfg = patched(b->patch), *gen = b->gen ? load(b->gen) : NULL;
		struct sm70_model_config mc;
		struct sm70_err e = { { 0 } };
		int ret = sm70_model_config_parse(&mc, cfg, gen, &e);

		print_message("  %-48.48s -> %d: %s\n", b->patch, ret, e.msg);
		assert_int_equal(ret, b->code);
		if (!strstr(e.msg, b->sub))
			fail_msg("message '%s' lacks '%s'", e.msg, b->sub);
		json_decref(gen);
		json_decref(cfg);
	}

	/* not an object at all */
	{
		json_t *arr = load("[]");
		struct sm70_model_config mc;
		struct sm70_err e = { { 0 } };

		assert_int_equal(sm70_model_config_parse(&mc, arr, NULL, &e), -EINVAL);
		assert_non_null(strstr(e.msg, "config.json: top level is not a JSON object"));
		json_decref(arr);
	}
	print_message("  %zu malformed configs refused with the expected messages\n",
		      sizeof(bad_cases) / sizeof(bad_cases[0]) + 1);
}


/* The qwen4_exp fixture's own fields, then every field refused by name (patched over the
 * fixture's config). */
static void test_qwen4_exp(void **state)
{
	static const struct {
		const char *patch;
		const char *sub;
	} bad[] = {
		{ "{\"indexer_n_heads\": null}", "missing required key 'indexer_n_heads'" },
		{ "{\"indexer_kv_heads\": 2}", "'indexer_kv_heads' (2) must be between 1 and 1" },
		{ "{\"indexer_budget\": 18}", "'indexer_budget' (18) must be a multiple of" },
		{ "{\"indexer_head_dim\": 8}", "more than 'indexer_head_dim' (8)" },
		{ "{\"ple_layer_ids\": [0]}", "'ple_layer_ids[0]' must be a one-indexed layer id" },
		{ "{\"ple_layer_ids\": [2]}", "names an attention layer" },
		{ "{\"ple_layer_ids\": [6]}", "one-indexed layer id in 1..5" },
		{ "{\"heads_per_ngram\": 3}", "'ple_embed_dim' (64) must be a multiple" },
		{ "{\"eos_token_id\": null}", "'eos_token_id' must be a token id" },
		{ "{\"output_gate_type\": \"relu\"}",
		  "'output_gate_type' must be \"silu\" or \"sigmoid\"" },
		{ "{\"hc_count\": 1}", "'hc_count' (1) must be between 2" },
		{ "{\"layer_types\": [\"linear_attention\", \"qsa\", \"linear_attention\", "
		  "\"linear_attention\", \"full_attention\"]}", "'layer_types[1]' 'qsa'" },
	};
	struct sm70_model_config mc;
	struct sm70_err e = { { 0 } };
	json_t *cfg = json_load_file(FIX "qwen4_exp-hc4-qsa-ple/config.json", 0, NULL);
	const struct sm70_qwen4_config *q = &mc.q4;

	assert_non_null(cfg);
	if (sm70_model_config_parse(&mc, cfg, NULL, &e))
		fail_msg("%s", e.msg);
	assert_int_equal(mc.arch, SM70_ARCH_QWEN4_EXP);
	assert_int_equal(mc.n_attn_layers, 2);
	assert_int_equal(mc.layer_kind[1], SM70_LAYER_ATTENTION);
	assert_int_equal(mc.layer_kind[4], SM70_LAYER_ATTENTION);
	assert_int_equal(mc.moe.n_moe_layers, 5); /* every layer */
	assert_int_equal(mc.moe.n_experts, 8);
	assert_int_equal(mc.moe.top_k, 2);
	assert_int_equal(mc.moe.shared_inter, 48);
	assert_true(mc.moe.renorm && mc.zero_centred_norms && mc.attn_gate);
	assert_int_equal(q->hc, 4);
	assert_int_equal(q->hc_rank, 16);
	assert_int_equal(q->idx_heads, 2);
	assert_int_equal(q->idx_dim, 32);
	assert_int_equal(q->idx_budget, 16);
	assert_int_equal(q->idx_ratio, 4);
	/* one-indexed ids 1 and 3 are layers 0 and 2 */
	assert_int_equal(q->n_ple, 2);
	assert_int_equal(q->ple_index[0], 0);
	assert_int_equal(q->ple_index[1], -1);
	assert_int_equal(q->ple_index[2], 1);
	assert_int_equal(q->ple_index[3], -1);
	assert_int_equal(q->ngram, 3);
	assert_int_equal(q->heads_per_ngram, 2);
	assert_int_equal(q->ngram_base, 500);
	assert_int_equal(q->ple_eos, 511);
	assert_int_equal(q->split_parts, 8);
	assert_int_equal(mc.hybrid.gdn.gate_sigmoid, 0); /* hidden_act silu */
	{
		/* the sigmoid gate (hidden_act, its default, must be silu for the MLPs) */
		static const char *const sig[] = { "{\"output_gate_type\": \"sigmoid\"}" };

		for (int i = 0; i < 1; i++) {
			json_t *c2 = json_deep_copy(cfg), *p = load(sig[i]);

			assert_int_equal(json_object_update(c2, p), 0);
			if (sm70_model_config_parse(&mc, c2, NULL, &e))
				fail_msg("%s: %s", sig[i], e.msg);
			assert_int_equal(mc.hybrid.gdn.gate_sigmoid, 1);
			json_decref(p);
			json_decref(c2);
		}
	}
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		json_t *c2 = json_deep_copy(cfg), *p = load(bad[i].patch);
		int ret;

		e.msg[0] = '\0'; /* errors keep their first message */
		assert_int_equal(json_object_update(c2, p), 0);
		ret = sm70_model_config_parse(&mc, c2, NULL, &e);
		print_message("  %-40.40s -> %d: %s\n", bad[i].patch, ret, e.msg);
		assert_true(ret < 0);
		if (!strstr(e.msg, bad[i].sub))
			fail_msg("message '%s' lacks '%s'", e.msg, bad[i].sub);
		json_decref(p);
		json_decref(c2);
	}
	json_decref(cfg);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_fixtures),
		cmocka_unit_test(test_hybrid_fixtures),
		cmocka_unit_test(test_generation_eos_wins),
		cmocka_unit_test(test_defaults),
		cmocka_unit_test(test_text_config),
		cmocka_unit_test(test_errors),
		cmocka_unit_test(test_qwen4_exp),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
