/*
 * sm70-bench - the benchmark driver.
 *
 *   sm70-bench bw|gemv|nvfp4|attention|prefill|gdn|moe|moe-nvfp4|kvread|all [--iters N]
 *              [--device N] [--variant N]   (nvfp4: one kernel variant 0-8, default every one)
 *   sm70-bench decode -m MODEL_DIR ...      end-to-end decode (tools/bench/decode.c)
 *   sm70-bench ipc ...                      the transport alone (tools/bench/ipc.c)
 *   sm70-bench arrange [--iters N]          NVFP4 rearrangement at load (tools/bench/arrange.c)
 *
 * The first form: decode-path micro-benchmarks of the CUDA backend: read and copy bandwidth, the
 * matmul op on Qwen3-8B GEMV shapes (with cuBLAS as the baseline in the same run), and the
 * attention op on GQA-6 head_dim-256 and Qwen3-8B's GQA-4 head_dim-128 shapes at 1K and 16K
 * context, f16 and FP8 KV; `prefill` times the attention op on one prompt chunk (512 or 2048 tokens
 * at contexts up to 8K) on the prefill path and, in the same run, on the decode kernels alone, in
 * FLOP/s (prefill is compute-bound) and time per token. `gdn` times the Gated DeltaNet recurrence
 * (the gdn op) on Qwen3.5-27B's layer shape: the decode update at B1, B8 and B16 against the
 * bandwidth of its state traffic, and one 8K-token prompt in the chunked form against the
 * recurrence and against 8K one-token decode calls (not part of `all`). `moe` times an MoE layer's
 * routed experts (the moe_experts op) at B1, B4, B8 and B16 on a Qwen3-30B-A3B-like and a
 * Qwen3-Next / Qwen3.5-MoE-like shape, counting the bytes of the experts the batch chose, on the
 * grouped path beside the reference path (not part of `all`). `nvfp4` times the matmul op on NVFP4
 * weights on the GEMV shapes at B1, B8 and B16 against the bytes of the packed codes and scales,
 * beside the f16 matmul op on the same shape in the same run, one row per kernel variant (--variant
 * N: that one only; not part of `all`). `moe-nvfp4` times the routed experts on NVFP4 stacks on the
 * two `moe` shapes at B1, B8 and B16 against the selected experts' NVFP4 bytes (codes, block
 * scales, row scales), beside the f16 stacks on the same routings in the same run (not part of
 * `all`). Both MoE sections end with each pass timed by warps a tile, forced 1-8 (SM70_MOE_KS) and
 * by the rule that picks it. `kvread` times the attention op beside plain kernels that read
 * the same cache along other walks (by head, with the op's grid, by whole rows, as pages of
 * [head][position]; sm70__bench_kv_read): how much of the op's time its layout and grid
 * account for (not part of `all`).
 *
 * Every row prints the median time of one op, the bytes it must read over that time, and
 * that as a fraction of the read bandwidth (a plain read kernel) and of the D2D copy
 * bandwidth measured in the same run. The PyTorch baselines come from
 * tools/bench_baselines.py, which prints the same table. Exit codes: 0 done, 1 a CUDA
 * failure, 2 bad arguments or a build without CUDA.
 *
 * Non-goals: correctness (tests/gpu).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/version.h"
#include "kernels/cuda/bench.h"
#include "tools/bench/bench.h"

struct ref_bw {
	double read, copy;
};

static void usage(FILE *f)
{
	fprintf(f, "usage: sm70-bench bw|gemv|nvfp4|attention|prefill|gdn|moe|moe-nvfp4|kvread|all "
		   "[--iters N] [--device N] [--variant N]\n"
		   "       sm70-bench decode -m MODEL_DIR [options]   (decode --help)\n"
		   "       sm70-bench ipc [options]                   (ipc --help)\n"
		   "       sm70-bench allreduce [--gpus N] [--json]   (allreduce --help)\n"
		   "       sm70-bench arrange [--iters N]             (NVFP4 rearrangement at load)\n"
		   "       sm70-bench --help | --version\n");
}

static void row(const char *name, double us, double bytes, const struct ref_bw *bw,
		const char *extra)
{
	double gbs = bytes / us * 1e-3;

	printf("%-34s %10.2f %9.1f %7.1f%% %7.1f%%  %s\n", name, us, gbs, 100.0 * gbs / bw->read,
	       100.0 * gbs / bw->copy, extra);
}

static void header(const char *extra)
{
	printf("%-34s %10s %9s %8s %8s  %s\n", "case", "us", "GB/s", "%read", "%copy", extra);
}

static int run_bw(int iters, struct ref_bw *bw, int print)
{
	const size_t bytes = (size_t)2 << 30;
	int ret = sm70__bench_bw(bytes, iters, &bw->read, &bw->copy);

	if (ret) {
		fprintf(stderr, "sm70-bench: bandwidth: error %d\n", ret);
		return ret;
	}
	if (print) {
		printf("\n== bandwidth (2 GiB buffer, median of %d)\n", iters);
		printf("read kernel (16 B loads)          %9.1f GB/s\n", bw->read);
		printf("D2D copy (read + write bytes)     %9.1f GB/s\n", bw->copy);
	}
	return 0;
}

static int run_gemv(int iters, const struct ref_bw *bw)
{
	static const struct {
		const char *name;
		int rows, cols;
	} shapes[] = {
		{ "qkv", 6144, 4096 },     { "o", 4096, 4096 },
		{ "gate_up", 24576, 4096 }, { "down", 4096, 12288 },
		{ "lm_head", 151936, 4096 },
	};
	static const int ns[] = { 1, 2, 4, 8, 16 };
	double tot[5] = { 0 }, tot_cb[5] = { 0 }, tot_bytes[5] = { 0 };

	printf("\n== GEMV: y[n, rows] = x[n, cols] W^T, f16 W (Qwen3-8B shapes), median of %d\n",
	       iters);
	header("cuBLAS us  cuBLAS %read  speedup  max rel vs cuBLAS");
	for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
		for (size_t k = 0; k < sizeof(ns) / sizeof(ns[0]); k++) {
			struct sm70__bench_gemv r;
			char name[64], extra[128];
			int ret = sm70__bench_gemv(shapes[s].rows, shapes[s].cols, ns[k], iters,
						   &r);

			if (ret) {
				fprintf(stderr, "sm70-bench: gemv %s: error %d\n", shapes[s].name,
					ret);
				return ret;
			}
			snprintf(name, sizeof(name), "gemv %s %dx%d B%d", shapes[s].name,
				 shapes[s].rows, shapes[s].cols, ns[k]);
			snprintf(extra, sizeof(extra), "%9.2f %12.1f%% %7.2fx  %.1e", r.us_cublas,
				 100.0 * r.bytes / r.us_cublas * 1e-3 / bw->read,
				 r.us_cublas / r.us, r.max_rel);
			row(name, r.us, r.bytes, bw, extra);
			if (s < 4) { /* one decoder layer: qkv + o + gate_up + down */
				tot[k] += r.us;
				tot_cb[k] += r.us_cublas;
				tot_bytes[k] += r.bytes;
			}
		}
	}
	for (size_t k = 0; k < sizeof(ns) / sizeof(ns[0]); k++) {
		char name[64], extra[128];

		snprintf(name, sizeof(name), "gemv layer total B%d", ns[k]);
		snprintf(extra, sizeof(extra), "%9.2f %12.1f%% %7.2fx", tot_cb[k],
			 100.0 * tot_bytes[k] / tot_cb[k] * 1e-3 / bw->read, tot_cb[k] / tot[k]);
		row(name, tot[k], tot_bytes[k], bw, extra);
	}
	return 0;
}

/*
 * The matmul op on NVFP4 weights (prepare_weight's arrangement) on the Qwen3-8B GEMV
 * shapes at B1, B2, B4, B8 and B16, beside the f16 matmul op on the same shape in the same
 * run: one row per kernel variant (SM70_NVFP4_VARIANT's values, kernels/cuda/
 * matmul_nvfp4.cu: v0 auto, v1 WMMA, v2 dot with one row tile a block, v3 dot with two,
 * v4 the B1 dot kernel at three blocks an SM, v5 that where it measured faster (the path
 * back), v6
 * the split kernel with f16 block sums up to four rows of x (matmul_nvfp4_split.cu), v7 that
 * with x in shared memory, v8 the tile kernel (the same sums, one block a row tile);
 * `variant` >= 0 times that one alone). Past n = 4 every variant runs the WMMA kernel, so
 * only the first one's row is printed. bytes: the packed codes + E4M3 scales (what an
 * NVFP4 call must read; x and y are under 1% of it); the f16 column's own %read counts its
 * W + x + y as the gemv table does.
 */
#define NVFP4_VARIANTS 9
#define NVFP4_DOT_ROWS_MAX 4 /* matmul_nvfp4.cu's FP4_DOT_ROWS_MAX */

static int run_nvfp4(int iters, int variant, const struct ref_bw *bw)
{
	static const struct {
		const char *name;
		int rows, cols;
	} shapes[] = {
		{ "qkv", 6144, 4096 },     { "o", 4096, 4096 },
		{ "gate_up", 24576, 4096 }, { "down", 4096, 12288 },
		{ "lm_head", 151936, 4096 },
	};
	static const int ns[] = { 1, 2, 4, 8, 16 };
	const int n_ns = (int)(sizeof(ns) / sizeof(ns[0]));
	int variants[NVFP4_VARIANTS], n_var = 0;

	for (int v = 0; v < NVFP4_VARIANTS; v++)
		if (variant < 0 || v == variant)
			variants[n_var++] = v;
	printf("\n== NVFP4 GEMV: y[n, rows] = x[n, cols] W^T, W NVFP4 (codes + E4M3 scales per "
	       "16), Qwen3-8B shapes, median of %d\n", iters);
	printf("bytes: packed codes + scales; vN: SM70_NVFP4_VARIANT=N; f16: the matmul op on an "
	       "f16 W of the same shape (its %%read over W + x + y); speedup: f16 us / nvfp4 us; "
	       "max rel: the fast kernel vs the reference kernel (f32 y)\n");
	header("f16 us  f16 %read  speedup  max rel");
	for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
		struct sm70__bench_nvfp4 r[NVFP4_VARIANTS * sizeof(ns) / sizeof(ns[0])];
		int ret = sm70__bench_nvfp4(shapes[s].rows, shapes[s].cols, ns, n_ns, variants,
					    n_var, iters, r);

		if (ret) {
			fprintf(stderr, "sm70-bench: nvfp4 %s: error %d\n", shapes[s].name, ret);
			return ret;
		}
		for (int k = 0; k < n_ns; k++) {
			struct sm70__bench_gemv f;

			ret = sm70__bench_gemv(shapes[s].rows, shapes[s].cols, ns[k], iters, &f);
			if (ret) {
				fprintf(stderr, "sm70-bench: nvfp4 %s: f16 gemv: error %d\n",
					shapes[s].name, ret);
				return ret;
			}
			for (int v = 0; v < (ns[k] > NVFP4_DOT_ROWS_MAX ? 1 : n_var); v++) {
				const struct sm70__bench_nvfp4 *o = &r[v * n_ns + k];
				char name[64], extra[128];

				snprintf(name, sizeof(name), "nvfp4 %s %dx%d B%d v%d",
					 shapes[s].name, shapes[s].rows, shapes[s].cols, ns[k],
					 variants[v]);
				snprintf(extra, sizeof(extra), "%6.2f %9.1f%% %7.2fx  %.1e", f.us,
					 100.0 * f.bytes / f.us * 1e-3 / bw->read, f.us / o->us,
					 o->max_rel);
				row(name, o->us, o->bytes, bw, extra);
			}
		}
	}
	return 0;
}

/* The KV modes the attention benches time, f16 first (the others' baseline). */
static const struct {
	int kv; /* enum sm70__bench_kv */
	const char *name;
} attn_kvs[] = {
	{ SM70__BENCH_KV_F16, "f16" },
	{ SM70__BENCH_KV_FP8_ALL, "fp8-all" },
	{ SM70__BENCH_KV_FP8, "fp8" },
};

/* The attention op on one head shape (q / kv heads, head_dim D) in every KV mode at B1, B8
 * and B16, 1K and 16K; tag prefixes the row names ("" for the first shape, kept as it
 * was for the scripts that read it). */
static int attention_shape(int n_q, int n_kv, int D, const char *tag, int iters,
			   const struct ref_bw *bw)
{
	static const int batches[] = { 1, 8, 16 }, ctxs[] = { 1024, 16384 };
	double us16[3][2] = { { 0 } };

	printf("\n== attention decode: %d q heads / %d KV heads, head_dim %d, paged (16-token "
	       "blocks, shuffled), median of %d\n", n_q, n_kv, D, iters);
	header("");
	for (size_t m = 0; m < sizeof(attn_kvs) / sizeof(attn_kvs[0]); m++) {
		for (int c = 0; c < 2; c++) {
			for (int bi = 0; bi < 3; bi++) {
				struct sm70__bench_attn r;
				char name[64], extra[64] = "";
				int ret = sm70__bench_attention(n_q, n_kv, D, attn_kvs[m].kv,
								batches[bi], ctxs[c], iters, &r);

				if (ret) {
					fprintf(stderr, "sm70-bench: attention: error %d\n", ret);
					return ret;
				}
				snprintf(name, sizeof(name), "attn %s%s ctx%dK B%d", tag,
					 attn_kvs[m].name, ctxs[c] / 1024, batches[bi]);
				if (m == 0)
					us16[bi][c] = r.us;
				else
					snprintf(extra, sizeof(extra), "%s speedup over f16 %.2fx",
						 attn_kvs[m].name, us16[bi][c] / r.us);
				row(name, r.us, r.bytes, bw, extra);
			}
		}
	}
	return 0;
}

/* The attention op beside the KV read walks over its cache (sm70__bench_kv_read), f16 and
 * the FP8 modes, at 16K (and 1K B1): where the op's time goes between the layout, the
 * grid and its own work. */
static int run_kvread(int iters, const struct ref_bw *bw)
{
	static const struct {
		int n_q, n_kv, D;
	} shapes[] = { { 32, 8, 128 }, { 24, 4, 256 } };
	static const struct {
		int batch, ctx;
	} cases[] = { { 1, 1024 }, { 1, 16384 }, { 8, 16384 }, { 16, 16384 } };
	static const char *walks[] = { "heads", "op-grid", "rows", "page-heads" };
	/* one case alone (a profiler's run): SM70_BENCH_CASE="d128 f16 ctx16K B16" */
	const char *only = getenv("SM70_BENCH_CASE");

	printf("\n== KV read walks beside the attention op (paged, 16-token blocks, shuffled), "
	       "median of %d\n", iters);
	header("vs op");
	for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
		for (size_t m = 0; m < sizeof(attn_kvs) / sizeof(attn_kvs[0]); m++) {
			for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
				struct sm70__bench_attn op, r;
				char name[64], extra[64];
				int ret;

				snprintf(name, sizeof(name), "d%d %s ctx%dK B%d", shapes[s].D,
					 attn_kvs[m].name, cases[k].ctx / 1024, cases[k].batch);
				if (only && strcmp(only, name))
					continue;
				ret = sm70__bench_attention(shapes[s].n_q, shapes[s].n_kv,
							    shapes[s].D, attn_kvs[m].kv,
							    cases[k].batch, cases[k].ctx, iters, &op);
				if (ret) {
					fprintf(stderr, "sm70-bench: kvread: op error %d\n", ret);
					return ret;
				}
				strcat(name, " op");
				row(name, op.us, op.bytes, bw, "");
				for (int w = 0; w < SM70__BENCH_KV_WALKS; w++) {
					ret = sm70__bench_kv_read(shapes[s].n_q, shapes[s].n_kv,
								  shapes[s].D, attn_kvs[m].kv,
								  cases[k].batch, cases[k].ctx, w,
								  iters, &r);
					if (ret) {
						fprintf(stderr, "sm70-bench: kvread: walk %s "
								"error %d\n",
							walks[w], ret);
						return ret;
					}
					snprintf(name, sizeof(name), "  read %s", walks[w]);
					snprintf(extra, sizeof(extra), "%.2fx", op.us / r.us);
					row(name, r.us, r.bytes, bw, extra);
				}
			}
		}
	}
	return 0;
}

/* GQA-6 head_dim 256 (Qwen3.5's attention layers), then Qwen3-8B's GQA-4 head_dim 128,
 * where the K/V loads of a row are half as many and the FP8 modes' balance differs. */
static int run_attention(int iters, const struct ref_bw *bw)
{
	int ret = attention_shape(24, 4, 256, "", iters, bw);

	return ret ? ret : attention_shape(32, 8, 128, "d128 ", iters, bw);
}

static int run_prefill(int iters)
{
	static const int chunks[] = { 512, 2048 }, ctxs[] = { 512, 2048, 8192 };

	printf("\n== attention prefill: one chunk, 24 q heads / 4 KV heads, head_dim 256, paged "
	       "(16-token blocks, shuffled), median of %d\n", iters);
	printf("%-30s %10s %9s %8s %12s %9s %9s\n", "case", "us", "TFLOP/s", "us/tok",
	       "decode-k us", "TFLOP/s", "speedup");
	for (size_t m = 0; m < sizeof(attn_kvs) / sizeof(attn_kvs[0]); m++) {
		for (int k = 0; k < 2; k++) {
			for (int c = 0; c < 3; c++) {
				struct sm70__bench_prefill r;
				char name[64];
				int ret;

				if (chunks[k] > ctxs[c])
					continue;
				ret = sm70__bench_prefill(24, 4, 256, attn_kvs[m].kv, chunks[k],
							  ctxs[c], iters, &r);
				if (ret) {
					fprintf(stderr, "sm70-bench: prefill: error %d\n", ret);
					return ret;
				}
				snprintf(name, sizeof(name), "prefill %s chunk%d ctx%d",
					 attn_kvs[m].name, chunks[k], ctxs[c]);
				printf("%-30s %10.1f %9.1f %8.3f %12.1f %9.1f %8.2fx\n", name, r.us,
				       r.flops / r.us * 1e-6, r.us / chunks[k], r.us_decode,
				       r.flops / r.us_decode * 1e-6, r.us_decode / r.us);
			}
		}
	}
	return 0;
}

/* Qwen3.5-27B's GDN layer: 16 key heads, 48 value heads, 128 x 128 */
#define GDN_NK 16
#define GDN_NV 48
#define GDN_D 128
#define GDN_PROMPT 8192

static int run_gdn(int iters, const struct ref_bw *bw)
{
	static const int batches[] = { 1, 8, 16 }, cols[] = { 0, 16, 32, 64 };
	const int piters = iters < 10 ? iters : 10;
	struct sm70__bench_gdn_prefill p;
	int ret;

	printf("\n== GDN decode update (gdn op): %d key / %d value heads, %d x %d f32 state a "
	       "head (Qwen3.5-27B layer), median of %d\n", GDN_NK, GDN_NV, GDN_D, GDN_D, iters);
	printf("bytes: the state read + written (%.1f MiB a sequence each way); us: the launches "
	       "replayed from a CUDA graph; eager: queued one by one; 16/32/64-col: the kernel's "
	       "column band forced (the op's own choice otherwise); cs: streaming cache hints "
	       "on the state\n", GDN_NV * GDN_D * GDN_D * 4.0 / 1048576.0);
	header("eager us  eager %read");
	for (size_t bi = 0; bi < sizeof(batches) / sizeof(batches[0]); bi++) {
		for (size_t k = 0; k < 2 * sizeof(cols) / sizeof(cols[0]); k++) {
			const int col = cols[k / 2], cs = (int)(k % 2);
			struct sm70__bench_gdn_decode r;
			char name[64], extra[64];

			if (!col && cs)
				continue; /* the default is one of the others */
			ret = sm70__bench_gdn_decode(GDN_NK, GDN_NV, GDN_D, GDN_D, batches[bi],
						     col, col ? cs : -1, iters, &r);
			if (ret) {
				fprintf(stderr, "sm70-bench: gdn decode: error %d\n", ret);
				return ret;
			}
			snprintf(name, sizeof(name), "gdn decode B%d%s%s", batches[bi],
				 col == 16 ? " 16-col" : col == 32 ? " 32-col" : col == 64 ? " 64-col" : "",
				 cs ? " cs" : "");
			snprintf(extra, sizeof(extra), "%8.2f %11.1f%%", r.us_eager,
				 100.0 * r.bytes / r.us_eager * 1e-3 / bw->read);
			row(name, r.us, r.bytes, bw, extra);
		}
	}
	ret = sm70__bench_gdn_prefill(GDN_NK, GDN_NV, GDN_D, GDN_D, GDN_PROMPT, piters, &p);
	if (ret) {
		fprintf(stderr, "sm70-bench: gdn prefill: error %d\n", ret);
		return ret;
	}
	printf("\n== GDN prefill: one %d-token chunk through the gdn op (27B layer, one "
	       "sequence, from a state at position 1000), median of %d\n", GDN_PROMPT, piters);
	printf("%-44s %10s %9s %9s\n", "case", "us", "us/tok", "vs chunk");
	printf("%-44s %10.1f %9.3f %8.2fx\n", "chunked form (chunk 64, one launch)",
	       p.us_chunked, p.us_chunked / GDN_PROMPT, 1.0);
	printf("%-44s %10.1f %9.3f %8.2fx\n", "recurrence (chunked = 0, one launch)",
	       p.us_recurrent, p.us_recurrent / GDN_PROMPT, p.us_recurrent / p.us_chunked);
	printf("%-44s %10.1f %9.3f %8.2fx\n", "decode update token by token (graph)",
	       p.us_tokens, p.us_tokens / GDN_PROMPT, p.us_tokens / p.us_chunked);
	printf("chunked vs recurrence: max |diff| / max |ref| %.2e over out (f16), %.2e over the "
	       "final state (f32)\n", p.rel_out, p.rel_state);
	return 0;
}

/* The split sweep of `moe` and `moe-nvfp4` (us_ks: [pass][0] the rule, [pass][ks] ks
 * forced): the table's title (with note after it) and header, then a case's two rows. */
static void ks_header(const char *what, const char *note)
{
	printf("\n== %s gate_up and down alone (graph, us) by warps a tile (SM70_MOE_KS=G,D), "
	       "and with the fitting rule (SM70_MOE_KS=auto)%s\n", what, note);
	printf("%-30s %8s %8s %8s %8s %8s %8s %8s %8s %8s\n", "case", "rule", "ks 1", "ks 2",
	       "ks 3", "ks 4", "ks 5", "ks 6", "ks 7", "ks 8");
}

static void ks_rows(const char *name, const double us[2][9])
{
	for (int p = 0; p < 2; p++) {
		const double *t = us[p];
		char pass[80];

		snprintf(pass, sizeof(pass), "%s %s", name, p ? "down" : "gate_up");
		printf("%-30s %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f\n", pass, t[0],
		       t[1], t[2], t[3], t[4], t[5], t[6], t[7], t[8]);
	}
}

/*
 * One MoE layer's routed experts: hidden 2048 with 128 experts of 768, top-8 (Qwen3-30B-A3B)
 * and 512 experts of 512, top-10 (Qwen3-Next-80B-A3B, Qwen3.5-MoE). %read counts only the
 * chosen experts' weights. A second table splits the grouped path into its launches and
 * times its other tile variants.
 */
static int run_moe(int iters, const struct ref_bw *bw)
{
	static const struct {
		const char *name;
		int hidden, inter, n_experts, top_k;
	} shapes[] = {
		{ "30b-a3b", 2048, 768, 128, 8 },
		{ "next", 2048, 512, 512, 10 },
	};
	static const int batches[] = { 1, 4, 8, 16 };
	enum { NB = sizeof(batches) / sizeof(batches[0]) };
	struct sm70__bench_moe r[2 * NB];
	int ret;

	printf("\n== MoE routed experts (moe_experts op), hidden 2048: 30b-a3b 128 x 768 top-8, "
	       "next 512 x 512 top-10; median of %d\n", iters);
	printf("bytes: distinct experts a call reads x their gate_up + down bytes (f16), the mean "
	       "over 16 random routings, a call each in turn; us: grouped path, calls replayed "
	       "from a CUDA graph; eager: queued one by one; ref: the reference path "
	       "(SM70_MOE=reference, one assignment at a time), graph; route: moe_route alone; "
	       "max rel: grouped vs ref\n");
	header("experts eager us   ref us ref %read  x ref route us  max rel");
	for (size_t s = 0; s < 2; s++) {
		for (size_t bi = 0; bi < NB; bi++) {
			struct sm70__bench_moe *q = &r[s * NB + bi];
			char name[64], extra[160];

			ret = sm70__bench_moe(shapes[s].hidden, shapes[s].inter, shapes[s].n_experts,
					      shapes[s].top_k, batches[bi], iters, q);
			if (ret) {
				fprintf(stderr, "sm70-bench: moe %s: error %d\n", shapes[s].name,
					ret);
				return ret;
			}
			snprintf(name, sizeof(name), "moe %s B%d", shapes[s].name, batches[bi]);
			snprintf(extra, sizeof(extra), "%7.1f %8.2f %8.2f %8.1f%% %5.2fx %8.2f  %.1e",
				 q->experts, q->us_eager, q->us_ref,
				 100.0 * q->bytes / q->us_ref * 1e-3 / bw->read, q->us_ref / q->us,
				 q->us_route, q->max_rel);
			row(name, q->us, q->bytes, bw, extra);
		}
	}
	printf("\n== MoE grouped path apart (graph): its launches alone (gate_up and down with "
	       "%%read of their own bytes), and the other tile variants (us)\n");
	printf("%-20s %9s %14s %14s %8s %8s %8s %8s %8s\n", "case", "v0 us", "gate_up (%read)",
	       "down (%read)", "comb us", "v1 us", "v2 us", "v3 us", "v4 us");
	for (size_t i = 0; i < 2 * NB; i++) {
		const struct sm70__bench_moe *q = &r[i];
		char name[64], gu[32], dn[32];

		snprintf(name, sizeof(name), "moe %s B%d", shapes[i / NB].name, batches[i % NB]);
		snprintf(gu, sizeof(gu), "%.2f (%.0f%%)", q->us_pass[0],
			 100.0 * q->bytes * 2 / 3 / q->us_pass[0] * 1e-3 / bw->read);
		snprintf(dn, sizeof(dn), "%.2f (%.0f%%)", q->us_pass[1],
			 100.0 * q->bytes / 3 / q->us_pass[1] * 1e-3 / bw->read);
		printf("%-20s %9.2f %14s %14s %8.2f %8.2f %8.2f %8.2f %8.2f\n", name, q->us, gu, dn,
		       q->us_pass[2], q->us_var[0], q->us_var[1], q->us_var[2], q->us_var[3]);
	}
	ks_header("MoE", "");
	for (size_t i = 0; i < 2 * NB; i++) {
		char name[64];

		snprintf(name, sizeof(name), "moe %s B%d", shapes[i / NB].name, batches[i % NB]);
		ks_rows(name, r[i].us_ks);
	}
	return 0;
}

/*
 * The routed experts on NVFP4 stacks on the `moe` shapes (next first: E512 / k10), %read
 * over the selected experts' NVFP4 bytes, with the f16 stacks on the same routings beside
 * them and the speedup. A second table splits the NVFP4 path into its launches and times
 * its other tile variants, a third each launch by warps a tile, as `moe` does.
 */
static int run_moe_nvfp4(int iters, const struct ref_bw *bw)
{
	static const struct {
		const char *name;
		int hidden, inter, n_experts, top_k;
	} shapes[] = {
		{ "next", 2048, 512, 512, 10 },
		{ "30b-a3b", 2048, 768, 128, 8 },
	};
	static const int batches[] = { 1, 8, 16 };
	struct sm70__bench_moe_nvfp4 r[2][3];

	printf("\n== MoE routed experts on NVFP4 stacks (moe_experts op), hidden 2048: next 512 x "
	       "512 top-10, 30b-a3b 128 x 768 top-8; median of %d\n", iters);
	printf("bytes: distinct experts a call reads x their NVFP4 bytes (codes + E4M3 block "
	       "scales + f32 row scales), the mean over 16 random routings, a call each in turn; "
	       "us: grouped path, graph; eager: queued one by one; ref: SM70_MOE=reference, "
	       "graph; f16: the f16 stacks' grouped path on the same routings (%%read of their "
	       "bytes); speedup: f16 us / us; max rel: grouped vs ref\n");
	header("experts eager us   ref us   f16 us f16 %read speedup  max rel");
	for (size_t s = 0; s < 2; s++) {
		int ret = sm70__bench_moe_nvfp4(shapes[s].hidden, shapes[s].inter,
						shapes[s].n_experts, shapes[s].top_k, batches, 3,
						iters, r[s]);

		if (ret) {
			fprintf(stderr, "sm70-bench: moe-nvfp4 %s: error %d\n", shapes[s].name,
				ret);
			return ret;
		}
		for (size_t bi = 0; bi < 3; bi++) {
			const struct sm70__bench_moe_nvfp4 *q = &r[s][bi];
			char name[64], extra[160];

			snprintf(name, sizeof(name), "moe-nvfp4 %s B%d", shapes[s].name, batches[bi]);
			snprintf(extra, sizeof(extra), "%7.1f %8.2f %8.2f %8.2f %8.1f%% %6.2fx  %.1e",
				 q->experts, q->us_eager, q->us_ref, q->us_f16,
				 100.0 * q->bytes_f16 / q->us_f16 * 1e-3 / bw->read,
				 q->us_f16 / q->us, q->max_rel);
			row(name, q->us, q->bytes, bw, extra);
		}
	}
	printf("\n== MoE NVFP4 path apart (graph): its launches alone (%%read of their own "
	       "bytes) and the other tile variants (us)\n");
	printf("%-24s %9s %16s %16s %8s %8s\n", "case", "v0 us", "gate_up (%read)",
	       "down (%read)", "v1 us", "v2 us");
	for (size_t s = 0; s < 2; s++) {
		/* gate_up's share of an expert's NVFP4 bytes: 2 inter of its 2 inter + hidden
		 * rows of codes and scales (9/16 of a byte an element over 2 inter x hidden of
		 * 3 inter x hidden elements) and of row scales */
		const double h = shapes[s].hidden, i2 = 2.0 * shapes[s].inter;
		const double gu_share = (i2 * h * 9 / 16 + i2 * 4) /
					(1.5 * i2 * h * 9 / 16 + (i2 + h) * 4);

		for (size_t bi = 0; bi < 3; bi++) {
			const struct sm70__bench_moe_nvfp4 *q = &r[s][bi];
			char name[64], gu[32], dn[32];

			snprintf(name, sizeof(name), "moe-nvfp4 %s B%d", shapes[s].name, batches[bi]);
			snprintf(gu, sizeof(gu), "%.2f (%.0f%%)", q->us_pass[0],
				 100.0 * q->bytes * gu_share / q->us_pass[0] * 1e-3 / bw->read);
			snprintf(dn, sizeof(dn), "%.2f (%.0f%%)", q->us_pass[1],
				 100.0 * q->bytes * (1 - gu_share) / q->us_pass[1] * 1e-3 /
					 bw->read);
			printf("%-24s %9.2f %16s %16s %8.2f %8.2f\n", name, q->us, gu, dn,
			       q->us_var[0], q->us_var[1]);
		}
	}
	ks_header("MoE NVFP4", "; down takes at most 3 (four tiles a block), so its ks 4-8 "
			       "repeat 3");
	for (size_t s = 0; s < 2; s++) {
		for (size_t bi = 0; bi < 3; bi++) {
			char name[64];

			snprintf(name, sizeof(name), "moe-nvfp4 %s B%d", shapes[s].name,
				 batches[bi]);
			ks_rows(name, r[s][bi].us_ks);
		}
	}
	return 0;
}

int main(int argc, char **argv)
{
	const char *what = NULL;
	int iters = 50, device = 0, variant = -1, ret;
	char desc[256] = "", msg[512] = "";
	struct ref_bw bw = { 0, 0 };

	if (argc > 1 && !strcmp(argv[1], "--version")) {
		sm70_print_version(stdout, "sm70-bench");
		return 0;
	}
	if (argc > 1 && !strcmp(argv[1], "decode"))
		return sm70__bench_decode(argc - 1, argv + 1);
	if (argc > 1 && !strcmp(argv[1], "ipc"))
		return sm70__bench_ipc(argc - 1, argv + 1);
	if (argc > 1 && !strcmp(argv[1], "allreduce"))
		return sm70__bench_allreduce(argc - 1, argv + 1);
	if (argc > 1 && !strcmp(argv[1], "arrange"))
		return sm70__bench_arrange(argc - 1, argv + 1);
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--iters") && i + 1 < argc) {
			iters = atoi(argv[++i]);
		} else if (!strcmp(argv[i], "--variant") && i + 1 < argc) {
			variant = atoi(argv[++i]);
		} else if (!strcmp(argv[i], "--device") && i + 1 < argc) {
			device = atoi(argv[++i]);
		} else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
			usage(stdout);
			return 0;
		} else if (!what && (!strcmp(argv[i], "bw") || !strcmp(argv[i], "gemv") ||
				     !strcmp(argv[i], "attention") || !strcmp(argv[i], "prefill") ||
				     !strcmp(argv[i], "gdn") || !strcmp(argv[i], "moe") ||
				     !strcmp(argv[i], "moe-nvfp4") ||
				     !strcmp(argv[i], "nvfp4") || !strcmp(argv[i], "kvread") ||
				     !strcmp(argv[i], "all"))) {
			what = argv[i];
		} else {
			usage(stderr);
			return 2;
		}
	}
	if (!what || iters < 1) {
		usage(stderr);
		return 2;
	}
	if (!sm70__bench_available()) {
		fprintf(stderr, "sm70-bench: built without CUDA\n");
		return 2;
	}
	ret = sm70__bench_open(device, desc, sizeof(desc), msg, sizeof(msg));
	if (ret) {
		fprintf(stderr, "sm70-bench: %s\n", msg);
		return ret == -ENODEV ? 2 : 1;
	}
	printf("sm70-bench %s: %s\n", what, desc);
	printf("matmul path: %s; nvfp4 path: %s; attention path: %s\n",
	       getenv("SM70_MATMUL") ? getenv("SM70_MATMUL") : "fast",
	       getenv("SM70_NVFP4") ? getenv("SM70_NVFP4") : "fast",
	       getenv("SM70_ATTENTION") ? getenv("SM70_ATTENTION") : "fast");
	/* Every table is relative to the bandwidth measured now. */
	ret = run_bw(iters, &bw, 1);
	if (!ret && (!strcmp(what, "gemv") || !strcmp(what, "all")))
		ret = run_gemv(iters, &bw);
	if (!ret && (!strcmp(what, "attention") || !strcmp(what, "all")))
		ret = run_attention(iters, &bw);
	if (!ret && (!strcmp(what, "prefill") || !strcmp(what, "all")))
		ret = run_prefill(iters);
	if (!ret && !strcmp(what, "gdn"))
		ret = run_gdn(iters, &bw);
	if (!ret && !strcmp(what, "moe"))
		ret = run_moe(iters, &bw);
	if (!ret && !strcmp(what, "nvfp4"))
		ret = run_nvfp4(iters, variant, &bw);
	if (!ret && !strcmp(what, "moe-nvfp4"))
		ret = run_moe_nvfp4(iters, &bw);
	if (!ret && !strcmp(what, "kvread"))
		ret = run_kvread(iters, &bw);
	sm70__bench_close();
	return ret ? 1 : 0;
}
