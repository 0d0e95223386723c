/*
 * decode.c - `sm70-bench decode`: end-to-end decode throughput of the engine on a model
 * directory (real or --load-format dummy weights), for several batch sizes and contexts,
 * with the fraction of the memory roofline reached.
 *
 * Method: B requests whose prompts are `ctx` tokens long are admitted with their prefill
 * skipped (bench_skip_prefill: the KV cache holds whatever it holds; decode reads it all
 * the same), warmed up for a few steps, then `steps` decode steps are timed with the
 * monotonic clock (each step ends with the download of its sampled tokens, so the time is
 * the device time plus the host's share; "host us" is the step's time outside the
 * model's forward call, host work the device waits for). The roofline of one step is the
 * bytes it must move, weights + every sequence's KV + (recurrent models) every
 * sequence's DeltaNet state read and written back, divided by the read bandwidth passed
 * with --bw-gbs (measure it in the same run with `sm70-bench bw`), or, without it,
 * reported as bytes per second only. With --tp N the model is split over N GPUs: the bytes are those of all
 * ranks (KV heads replicated when there are fewer than ranks) and the roofline is N times
 * one GPU's bandwidth. SM70_BENCH_SKIP_ALLREDUCE=1 leaves the all-reduces out (wrong
 * tokens, right shape of work): the difference is their cost per step. QSA models
 * (qwen4_exp) read only the selected KV blocks, the tail and the compressed keys; their
 * n-gram rows come from host memory and are not in the HBM roofline.
 *
 * --kernel-times turns on the CUDA backend's kernel timeline (SM70_KERNEL_TIMES=1, and
 * SM70_GRAPHS=0 unless set: kernels/cuda/kernel_times.cu) and prints, after each
 * configuration, the timed steps' device time a step by kernel; --timeline FILE also
 * writes the last step's launches in order as CSV (index, device, name, us). The
 * tokens/s of such a run include the events' cost and have no graphs: compare them only
 * with each other.
 *
 * Non-goals: prefill speed, time to first token (sm70-run's timing covers those).
 */
#include "tools/bench/bench.h"
#include "tools/cli/cli.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "daemon/engine/engine.h"
#include "kernels/backend.h"

#define KT_MAX 512   /* kernel rows kept */
#define KT_STEP 8192 /* launches of one step kept */

struct count {
	int tokens;
	int finished;
};

static void on_event(void *ctx, const struct sm70_event *ev)
{
	struct count *c = ctx;

	if (ev->sample.token >= 0)
		c->tokens++;
	if (ev->finish)
		c->finished++;
}

static int parse_list(const char *s, int *out, int max)
{
	int n = 0;

	while (*s && n < max) {
		char *end;
		long v = strtol(s, &end, 10);
		if (end == s || v <= 0)
			return -1;
		out[n++] = (int)v;
		s = *end == ',' ? end + 1 : end;
		if (*end && *end != ',')
			return -1;
	}
	return n;
}

static void usage(FILE *f)
{
	fprintf(f,
		"usage: sm70-bench decode -m|--model MODEL_DIR [--backend cuda|cpu] [--load-format "
		"auto|dummy]\n"
		"         [--batch 1,8,16] [--ctx 1024,16384] [--steps N] [--kv-dtype MODE]\n"
		"         [--kv-gib G] [--bw-gbs GBPS] [--tp N] [--gpus 0,1,...]\n"
		"         [--batch-invariant] [--kernel-times] [--timeline PREFIX] [--help]\n"
		"MODE: f16 (the default), fp8 (K FP8-E4M3, V f16), fp8-all (K and V FP8-E4M3)"
		" or f32\n"
		"--batch-invariant times the engine.batch_invariant paths (docs/ENGINE.md).\n"
		"--kernel-times prints each configuration's device time a step by kernel (CUDA\n"
		"events, graphs off); --timeline PREFIX also writes the last step's launches to\n"
		"PREFIX-bB-ctxC.csv.\n");
}

/* The kernel timeline of the timed steps, taken by run_one when --kernel-times is on and
 * printed after the configuration's row. */
static struct {
	int on;
	struct sm70_kernel_time rows[KT_MAX];
	int n_rows;
	struct sm70_kernel_time *step; /* KT_STEP */
	int n_step;
} kt;

static void take_kernel_times(void)
{
	kt.n_rows = sm70_kernel_times(kt.rows, KT_MAX, 1);
	kt.n_step = kt.step ? sm70_kernel_timeline(kt.step, KT_STEP) : 0;
}

/* A row a (device, kernel) with its time a step, then (prefix) the last step in order as
 * CSV in PREFIX-bB-ctxC.csv. */
static void print_kernel_times(int steps, const char *prefix, int batch, int ctx)
{
	double sum = 0;

	if (!kt.n_rows) {
		printf("  kernel times: none (not a CUDA backend, or sm70 built without CUDA)\n");
		return;
	}
	for (int i = 0; i < kt.n_rows; i++)
		sum += kt.rows[i].us;
	printf("  kernel times (CUDA events, a step = %.1f us):\n", sum / steps);
	printf("  %-4s %-58s %9s %10s %10s %7s\n", "gpu", "kernel", "calls", "us each",
	       "us a step", "share");
	for (int i = 0; i < kt.n_rows; i++) {
		const struct sm70_kernel_time *r = &kt.rows[i];

		printf("  %-4d %-58.58s %9.1f %10.2f %10.1f %6.1f%%\n", r->device, r->name,
		       (double)r->calls / steps, r->us / r->calls, r->us / steps,
		       sum > 0 ? 100.0 * r->us / sum : 0.0);
	}
	if (prefix) {
		char path[4096];
		FILE *f;

		snprintf(path, sizeof(path), "%s-b%d-ctx%d.csv", prefix, batch, ctx);
		f = fopen(path, "w");
		if (!f) {
			fprintf(stderr, "sm70-bench decode: cannot write %s\n", path);
			return;
		}
		fprintf(f, "index,device,name,us\n");
		for (int i = 0; i < kt.n_step; i++)
			fprintf(f, "%d,%d,%s,%.2f\n", i, kt.step[i].device, kt.step[i].name,
				kt.step[i].us);
		fclose(f);
	}
	fflush(stdout);
}

/* One configuration on an open engine: returns 0 and fills tokens/s and bytes per step,
 * or 1 (nothing filled) when the KV pool cannot hold every sequence at once: the engine
 * would run fewer, preempting, and the row would be a smaller batch's at a roofline it
 * does not have. Leaves the engine idle. */
static int run_one(struct sm70_engine *e, const struct sm70_engine_opts *eo, int batch, int ctx,
		   int steps, double *tps, double *step_bytes, double *host_us)
{
	struct sm70_engine_stats st0, st1;
	struct sm70_err err = { { 0 } };
	struct count c = { 0, 0 };
	int32_t *prompt;
	int ret = 0, warm = 3;
	double t0;

	prompt = malloc(sizeof(int32_t) * (size_t)ctx);
	if (!prompt)
		return -1;
	for (int i = 0; i < ctx; i++)
		prompt[i] = (int32_t)((i * 7919u + 13u) %
				      (unsigned)sm70_engine_model_config(e)->vocab_size);
	for (int b = 0; b < batch; b++) {
		uint64_t id;
		struct sm70_request r = {
			.prompt = prompt, .n_prompt = ctx, .max_new_tokens = warm + steps + 1,
			.ignore_eos = 1, .sampling = { .temperature = 1.0f, .top_k = 20,
			.top_p = 0.95f, .seed = (uint64_t)b }, .bench_skip_prefill = 1,
		};
		prompt[0] = b % sm70_engine_model_config(e)->vocab_size; /* no prefix sharing */
		ret = sm70_engine_submit(e, &r, &id, &err);
		if (ret) {
			fprintf(stderr, "sm70-bench decode: %s\n", err.msg);
			goto out;
		}
	}
	for (int i = 0; i < warm; i++)
		if ((ret = sm70_engine_step(e, on_event, &c)) < 0)
			goto out;
	c.tokens = 0;
	if (kt.on)
		sm70_kernel_times(NULL, 0, 1); /* the timed steps alone */
	sm70_engine_get_stats(e, &st0);
	t0 = sm70__cli_now_s();
	for (int i = 0; i < steps; i++)
		if ((ret = sm70_engine_step(e, on_event, &c)) < 0)
			goto out;
	*tps = c.tokens / (sm70__cli_now_s() - t0);
	ret = 0;
	sm70_engine_get_stats(e, &st1);
	if (st0.running < batch || st1.preemptions != st0.preemptions) {
		printf("%6d %7d   skipped: the KV pool (%.1f GiB) holds %d of the %d sequences "
		       "(%llu preemptions while timed); raise --kv-gib\n",
		       batch, ctx, (double)st1.kv_bytes / (1u << 30), st0.running, batch,
		       (unsigned long long)(st1.preemptions - st0.preemptions));
		ret = 1;
		goto drain;
	}
	if (kt.on)
		take_kernel_times();
	*host_us = (double)((st1.step_ns - st0.step_ns) - (st1.forward_ns - st0.forward_ns)) / 1e3 /
		   steps;
	{
		const struct sm70_model_config *mc = sm70_engine_model_config(e);
		int kv_heads = mc->n_kv_heads < eo->tp ? eo->tp : mc->n_kv_heads;
		enum sm70_dtype v_dt = eo->kv_v_dtype != SM70_DTYPE_COUNT ? eo->kv_v_dtype :
								    eo->kv_dtype;
		double kv_tok = (double)mc->n_attn_layers * kv_heads * mc->head_dim *
				(double)(sm70_dtype_size(eo->kv_dtype) + sm70_dtype_size(v_dt));
		double slot = 0;
		/* a recurrent-state slot is read and written once per decode step */
		if (st1.state_slots_total)
			slot = (double)st1.state_bytes / (st1.state_slots_total + 1);
		/* mean context over the timed steps */
		double pos = ctx + warm + steps / 2.0, seen = pos;
		if (mc->arch == SM70_ARCH_QWEN4_EXP) {
			/* QSA reads the selected blocks and the tail of the KV, and every
			 * complete block's compressed key */
			const struct sm70_qwen4_config *q = &mc->q4;
			double nb = (double)(long)(pos / q->idx_ratio);
			double top = q->idx_budget / q->idx_ratio;
			seen = (nb < top ? nb : top) * q->idx_ratio + (pos - nb * q->idx_ratio);
			*step_bytes = batch * (double)mc->n_attn_layers * nb * q->idx_dim * 4.0;
		} else {
			*step_bytes = 0;
		}
		*step_bytes += (double)st1.weight_bytes + batch * kv_tok * seen + batch * 2.0 * slot;
		/* MoE: the experts the last timed step's routing read (distinct per layer) */
		*step_bytes += (double)st1.expert_bytes;
	}
drain:
	while (sm70_engine_busy(e)) {
		int r = sm70_engine_step(e, on_event, &c);

		if (r < 0) {
			ret = r;
			goto out;
		}
	}
out:
	free(prompt);
	return ret < 0 ? ret : ret == 1;
}

int sm70__bench_decode(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "model", required_argument, 0, 'm' }, { "backend", required_argument, 0, 'b' },
		{ "load-format", required_argument, 0, 'l' }, { "batch", required_argument, 0, 'B' },
		{ "ctx", required_argument, 0, 'c' }, { "steps", required_argument, 0, 's' },
		{ "kv-dtype", required_argument, 0, 'k' }, { "kv-gib", required_argument, 0, 'g' },
		{ "bw-gbs", required_argument, 0, 'w' }, { "tp", required_argument, 0, 't' },
		{ "gpus", required_argument, 0, 'G' }, { "help", no_argument, 0, 'h' },
		{ "batch-invariant", no_argument, 0, 'I' },
		{ "kernel-times", no_argument, 0, 'K' }, { "timeline", required_argument, 0, 'T' },
		{ 0, 0, 0, 0 },
	};
	struct sm70_engine_opts eo;
	struct sm70_engine *e = NULL;
	struct sm70_err err = { { 0 } };
	const char *model = NULL, *timeline = NULL;
	int ret;
	int batches[8] = { 1, 8, 16 }, n_b = 3, ctxs[8] = { 1024, 16384 }, n_c = 2, steps = 32;
	double kv_gib = 48, bw = 0;
	int o;

	sm70_engine_opts_default(&eo);
	eo.backend = "cuda";
	eo.dummy_weights = 1;
	eo.kv_dtype = SM70_DTYPE_F16;
	optind = 1;
	while ((o = getopt_long(argc, argv, "m:", lo, NULL)) != -1) {
		switch (o) {
		case 'm': model = optarg; break;
		case 'b': eo.backend = optarg; break;
		case 'l': eo.dummy_weights = strcmp(optarg, "dummy") == 0; break;
		case 'B': n_b = parse_list(optarg, batches, 8); break;
		case 'c': n_c = parse_list(optarg, ctxs, 8); break;
		case 's': steps = atoi(optarg); break;
		case 'g': kv_gib = atof(optarg); break;
		case 'w': bw = atof(optarg); break;
		case 't': eo.tp = atoi(optarg); break;
		case 'G': {
			int32_t *ids = NULL;
			const char *bad = NULL;
			long n = sm70__cli_parse_ids(optarg, &ids, &bad);
			eo.n_gpus = n >= 1 && n <= 4 ? (int)n : -1;
			for (long g = 0; g < n && g < 4; g++)
				eo.gpus[g] = ids[g];
			free(ids);
			break;
		}
		case 'k':
			/* the bytes-per-step figure needs the dtypes: no "auto" */
			if (strcmp(optarg, "auto") == 0 || sm70_engine_opts_kv_mode(&eo, optarg)) {
				fprintf(stderr, "sm70-bench decode: --kv-dtype must be f16, fp8, "
					"fp8-all or f32, not '%s'\n", optarg);
				return 2;
			}
			break;
		case 'I': eo.batch_invariant = 1; break;
		case 'K': kt.on = 1; break;
		case 'T': kt.on = 1; timeline = optarg; break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (!model || n_b < 1 || n_c < 1 || steps < 1 || kv_gib <= 0 || eo.tp < 1 ||
	    eo.n_gpus < 0) {
		usage(stderr);
		return 2;
	}
	if (kt.on) {
		/* before the engine makes its backends, which read them */
		setenv("SM70_KERNEL_TIMES", "1", 1);
		setenv("SM70_GRAPHS", "0", 0);
		kt.step = calloc(KT_STEP, sizeof(*kt.step));
	}
	eo.kv_bytes = (size_t)(kv_gib * (1u << 30));
	eo.max_seqs = 16;
	for (int i = 0; i < n_b; i++)
		if (batches[i] > eo.max_seqs)
			eo.max_seqs = batches[i];
	ret = sm70_engine_open(&e, model, &eo, &err);
	if (ret) {
		fprintf(stderr, "sm70-bench decode: %s\n", err.msg);
		return 1;
	}
	printf("decode: %s, backend %s, tp %d, %s weights, KV %s, %d timed steps, graphs %s%s%s\n",
	       model, eo.backend, eo.tp, eo.dummy_weights ? "dummy" : "checkpoint",
	       sm70_kv_mode_name(eo.kv_dtype, eo.kv_v_dtype), steps,
	       getenv("SM70_GRAPHS") && !strcmp(getenv("SM70_GRAPHS"), "0") ? "off" : "on",
	       getenv("SM70_BENCH_SKIP_ALLREDUCE") ? ", all-reduces SKIPPED" : "",
	       eo.batch_invariant ? ", batch invariant" : "");
	bw *= eo.tp;
	printf("%6s %7s %12s %12s %14s %10s %9s\n", "batch", "ctx", "tokens/s", "step ms",
	       "GB read/step", bw > 0 ? "roofline" : "GB/s", "host us");
	for (int i = 0; i < n_b; i++) {
		for (int j = 0; j < n_c; j++) {
			double tps = 0, bytes = 0, host_us = 0;
			int rc = run_one(e, &eo, batches[i], ctxs[j], steps, &tps, &bytes,
					 &host_us);

			if (rc == 1) { /* the line says why */
				fflush(stdout);
				continue;
			}
			if (rc) {
				sm70_engine_close(e);
				return 1;
			}
			double step_s = batches[i] / tps;
			double gbs = bytes / step_s / 1e9;
			if (bw > 0)
				printf("%6d %7d %12.1f %12.3f %14.2f %9.1f%% %9.1f\n", batches[i],
				       ctxs[j], tps, step_s * 1e3, bytes / 1e9, 100.0 * gbs / bw,
				       host_us);
			else
				printf("%6d %7d %12.1f %12.3f %14.2f %10.0f %9.1f\n", batches[i],
				       ctxs[j], tps, step_s * 1e3, bytes / 1e9, gbs, host_us);
			fflush(stdout);
			if (kt.on)
				print_kernel_times(steps, timeline, batches[i], ctxs[j]);
		}
	}
	sm70_engine_close(e);
	free(kt.step);
	return 0;
}
