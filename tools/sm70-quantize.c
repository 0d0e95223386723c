/*
 * sm70-quantize - turns a bf16/f16/f32 checkpoint into an NVFP4 one, in NVIDIA ModelOpt's
 * layout or compressed-tensors' "nvfp4-pack-quantized" one, with weights-only scales (no
 * calibration data). tools/quantize/ holds the plan, the conversion and the output files;
 * this file parses arguments and runs the shards through a thread pool.
 *
 * Exit codes: 0 done, 2 bad arguments or a bad input (the message names the file and the
 * tensor; NaN or infinite weights are one), 1 a failure while writing. On failure the files
 * written so far are removed.
 * Non-goals: activation scales, KV-cache scales, re-quantizing a quantized checkpoint.
 */
#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/st_write.h"
#include "common/version.h"
#include "daemon/engine/checkpoint.h"
#include "tools/cli/cli.h"
#include "tools/quantize/quantize.h"

#define MAX_EXCLUDES 64
#define MAX_THREADS 256

struct options {
	const char *in_dir, *out_dir;
	int format;
	char *excludes[MAX_EXCLUDES];
	int n_excludes;
	int threads;
	uint64_t shard_bytes;
	int force;
};

/* One shard's quantization work, shared by the worker threads. */
struct shard_work {
	struct sm70__q_plan *plan;
	int shard;
	atomic_size_t next;        /* next item index to look at */
	atomic_int failed;
	pthread_mutex_t lock;      /* guards err */
	struct sm70_err err;
	int ret;
};

static void usage(FILE *f)
{
	fprintf(f,
		"usage: sm70-quantize -m|--model IN_DIR -o|--output OUT_DIR\n"
		"                     --format modelopt|compressed-tensors\n"
		"                     [--exclude PATTERN ...] [--threads N] [--shard-size BYTES]\n"
		"                     [--force]\n"
		"       sm70-quantize --help | --version\n"
		"Quantizes the projection weights of a bf16/f16/f32 checkpoint to NVFP4 (E2M1 codes\n"
		"in blocks of 16, FP8-E4M3 block scales, one f32 scale per matrix). Embeddings,\n"
		"lm_head, norms, routers and non-float tensors are copied. PATTERN is a glob on the\n"
		"module name (the tensor name without '.weight'), e.g. '*.self_attn.*'.\n"
		"--shard-size takes a K, M or G suffix (default 4G).\n");
}

static int die_usage(const char *fmt, const char *arg)
{
	fprintf(stderr, "sm70-quantize: ");
	fprintf(stderr, fmt, arg);
	fprintf(stderr, "\n");
	usage(stderr);
	return 2;
}

/* "4G", "512M", "1000": bytes, at least 1 KiB; 0 for a bad size. */
static uint64_t parse_size(const char *s)
{
	char *end;
	unsigned long long v;
	int shift = 0;

	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || end == s || *s == '-')
		return 0;
	if (*end == 'K' || *end == 'k')
		shift = 10;
	else if (*end == 'M' || *end == 'm')
		shift = 20;
	else if (*end == 'G' || *end == 'g')
		shift = 30;
	else if (*end)
		return 0;
	if (shift && end[1])
		return 0;
	if (v > (UINT64_MAX >> shift) || (v << shift) < 1024)
		return 0;
	return (uint64_t)v << shift;
}

static int parse_args(int argc, char **argv, struct options *o)
{
	static const struct option longs[] = {
		{ "model", required_argument, NULL, 'm' },
		{ "output", required_argument, NULL, 'o' },
		{ "format", required_argument, NULL, 'f' },
		{ "exclude", required_argument, NULL, 'x' },
		{ "threads", required_argument, NULL, 't' },
		{ "shard-size", required_argument, NULL, 's' },
		{ "force", no_argument, NULL, 'F' },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ NULL, 0, NULL, 0 },
	};
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	double v;
	int c;

	memset(o, 0, sizeof(*o));
	o->format = -1;
	o->threads = cpus < 1 ? 1 : cpus > MAX_THREADS ? MAX_THREADS : (int)cpus;
	o->shard_bytes = (uint64_t)4 << 30;
	while ((c = getopt_long(argc, argv, "m:o:h", longs, NULL)) != -1) {
		switch (c) {
		case 'm':
			o->in_dir = optarg;
			break;
		case 'o':
			o->out_dir = optarg;
			break;
		case 'f':
			o->format = sm70__q_parse_format(optarg);
			if (o->format < 0)
				return die_usage("--format must be modelopt or compressed-tensors, "
						 "not '%s'", optarg);
			break;
		case 'x':
			if (o->n_excludes == MAX_EXCLUDES)
				return die_usage("at most 64 --exclude patterns (at '%s')", optarg);
			o->excludes[o->n_excludes++] = optarg;
			break;
		case 't':
			if (sm70__cli_parse_int(optarg, 1, MAX_THREADS, &v))
				return die_usage("--threads must be 1 to 256, not '%s'", optarg);
			o->threads = (int)v;
			break;
		case 's':
			o->shard_bytes = parse_size(optarg);
			if (!o->shard_bytes)
				return die_usage("--shard-size must be a size of at least 1K, not "
						 "'%s'", optarg);
			break;
		case 'F':
			o->force = 1;
			break;
		case 'h':
			usage(stdout);
			exit(0);
		case 'V':
			sm70_print_version(stdout, "sm70-quantize");
			exit(0);
		default:
			usage(stderr);
			return 2;
		}
	}
	if (optind < argc)
		return die_usage("unexpected argument '%s'", argv[optind]);
	if (!o->in_dir || !o->out_dir)
		return die_usage("%s", "-m IN_DIR and -o OUT_DIR are required");
	if (o->format < 0)
		return die_usage("%s", "--format modelopt|compressed-tensors is required");
	return 0;
}

static void *worker(void *arg)
{
	struct shard_work *w = arg;
	struct sm70__q_plan *p = w->plan;
	size_t i;

	while (!atomic_load(&w->failed) && (i = atomic_fetch_add(&w->next, 1)) < p->n_items) {
		struct sm70__q_item *it = &p->items[i];
		struct sm70_err err = { { 0 } };
		int ret;

		if (it->shard != w->shard || !it->quantize)
			continue;
		ret = sm70__q_convert(it, p->format, &err);
		if (ret) {
			pthread_mutex_lock(&w->lock);
			if (!w->ret) {
				w->ret = ret;
				w->err = err;
			}
			pthread_mutex_unlock(&w->lock);
			atomic_store(&w->failed, 1);
		}
	}
	return NULL;
}

/* Quantizes the tensors of one shard on n_threads threads. */
static int convert_shard(struct sm70__q_plan *p, int shard, int n_threads,
			 struct sm70_err *err)
{
	pthread_t tids[MAX_THREADS];
	struct shard_work w = { .plan = p, .shard = shard };
	int started = 0;

	atomic_init(&w.next, 0);
	atomic_init(&w.failed, 0);
	pthread_mutex_init(&w.lock, NULL);
	for (; started < n_threads; started++)
		if (pthread_create(&tids[started], NULL, worker, &w) != 0)
			break;
	if (!started)
		worker(&w); /* no thread could start: do the work here */
	for (int i = 0; i < started; i++)
		pthread_join(tids[i], NULL);
	pthread_mutex_destroy(&w.lock);
	if (w.ret)
		return sm70_errf(err, w.ret, "%s", w.err.msg);
	return 0;
}

/* Writes the outputs of every item of shard to out_dir/name. */
static int write_shard(const struct sm70__q_plan *p, int shard, const char *path,
		       struct sm70_err *err)
{
	struct sm70_st_writer *w;
	int ret;

	ret = sm70_st_writer_open(&w, path, err);
	if (ret)
		return ret;
	for (size_t i = 0; !ret && i < p->n_items; i++)
		for (int j = 0; !ret && p->items[i].shard == shard && j < p->items[i].n_out; j++) {
			const struct sm70__q_out *o = &p->items[i].out[j];

			ret = sm70_st_writer_add(w, o->name, o->dtype, o->ndim, o->shape, err);
		}
	if (!ret)
		ret = sm70_st_writer_write_header(w, err);
	for (size_t i = 0; !ret && i < p->n_items; i++)
		for (int j = 0; !ret && p->items[i].shard == shard && j < p->items[i].n_out; j++)
			ret = sm70_st_writer_write(w, p->items[i].out[j].data,
						   p->items[i].out[j].nbytes, err);
	if (ret) {
		sm70_st_writer_abort(w);
		return ret;
	}
	return sm70_st_writer_commit(w, err);
}

/* Notices for the tensors that stayed as they were for a reason the user should know. */
static void print_notices(const struct sm70__q_plan *p, int shard)
{
	for (size_t i = 0; i < p->n_items; i++) {
		const struct sm70__q_item *it = &p->items[i];

		if (it->shard != shard)
			continue;
		if (it->bad_k)
			fprintf(stderr, "sm70-quantize: note: %s: tensor '%s' is kept unquantized: "
				"its rows (%lld) are not a multiple of 16\n", it->in->file,
				it->in->name, (long long)it->in->shape[it->in->ndim - 1]);
		if (it->all_zero)
			fprintf(stderr, "sm70-quantize: note: tensor '%s' has an all-zero matrix; "
				"its scale_2 is written as 1\n", it->in->name);
	}
}

static void remove_written(const struct sm70__q_plan *p, const char *out_dir, int n_written)
{
	for (int s = 0; s < n_written; s++) {
		char name[64], path[4096];

		sm70__q_shard_name(p, s, name, sizeof(name));
		snprintf(path, sizeof(path), "%s/%s", out_dir, name);
		unlink(path);
	}
}

static int write_shards(struct sm70__q_plan *p, const struct options *o, struct sm70_err *err)
{
	int ret = 0, s;

	for (s = 0; s < p->n_shards; s++) {
		char name[64], path[4096];

		sm70__q_shard_name(p, s, name, sizeof(name));
		snprintf(path, sizeof(path), "%s/%s", o->out_dir, name);
		ret = convert_shard(p, s, o->threads, err);
		if (!ret)
			ret = write_shard(p, s, path, err);
		for (size_t i = 0; i < p->n_items; i++)
			if (p->items[i].shard == s)
				sm70__q_release(&p->items[i]);
		if (ret)
			break;
		print_notices(p, s);
	}
	if (ret)
		remove_written(p, o->out_dir, s);
	return ret;
}

/* Input problems are exit 2, the rest (writing) exit 1. */
static int exit_code(int ret)
{
	return ret == -EINVAL || ret == -ENOENT || ret == -ENOTEMPTY || ret == -ENOTDIR ||
	       ret == -EOVERFLOW ? 2 : 1;
}

static int run(const struct options *o, struct sm70_err *err)
{
	const struct sm70_st_file *files[4096];
	struct sm70__q_plan plan = { 0 };
	struct sm70_ckpt *ck = NULL;
	size_t n_files;
	double t0 = sm70__cli_now_s();
	int ret;

	ret = sm70_ckpt_open(&ck, o->in_dir, err);
	if (ret)
		return ret;
	if (json_object_get(sm70_ckpt_config(ck), "quantization_config")) {
		ret = sm70_errf(err, -EINVAL, "%s/config.json: the checkpoint is already "
				"quantized (it has a quantization_config)", o->in_dir);
		goto out;
	}
	n_files = sm70_ckpt_n_files(ck);
	if (n_files > sizeof(files) / sizeof(files[0])) {
		ret = sm70_errf(err, -EINVAL, "%s: %zu weight files (at most 4096)", o->in_dir,
				n_files);
		goto out;
	}
	for (size_t i = 0; i < n_files; i++)
		files[i] = sm70_ckpt_file(ck, i);
	ret = sm70__q_plan_build(&plan, (enum sm70__q_format)o->format, files, n_files,
				 o->excludes, o->n_excludes, o->shard_bytes, err);
	if (!ret)
		ret = sm70__q_prepare_outdir(o->in_dir, o->out_dir, o->force, err);
	if (!ret)
		ret = write_shards(&plan, o, err);
	if (!ret)
		ret = sm70__q_write_index(&plan, o->out_dir, err);
	if (!ret)
		ret = sm70__q_write_configs(&plan, sm70_ckpt_config(ck), o->out_dir, err);
	if (!ret)
		ret = sm70__q_copy_side_files(o->in_dir, o->out_dir, err);
	if (!ret)
		printf("sm70-quantize: %zu of %zu tensors quantized to NVFP4 (%s), %d shard%s "
		       "in %s, %.1f s\n", plan.n_quantized, plan.n_items,
		       o->format == SM70_Q_MODELOPT ? "modelopt" : "compressed-tensors",
		       plan.n_shards, plan.n_shards == 1 ? "" : "s", o->out_dir,
		       sm70__cli_now_s() - t0);
out:
	sm70__q_plan_free(&plan);
	sm70_ckpt_close(ck);
	return ret;
}

int main(int argc, char **argv)
{
	struct sm70_err err = { { 0 } };
	struct options o;
	int ret = parse_args(argc, argv, &o);

	if (ret)
		return ret;
	ret = run(&o, &err);
	if (ret) {
		fprintf(stderr, "sm70-quantize: %s\n", err.msg[0] ? err.msg : strerror(-ret));
		return exit_code(ret);
	}
	return 0;
}
