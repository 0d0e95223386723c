/*
 * allreduce.c - `sm70-bench allreduce`: the tensor-parallel all-reduce on decode message
 * sizes, through the P2P one-shot path and through NCCL alone, in the same run.
 *
 * Sizes: f16 [B, hidden] for B = 1, 8, 16 and hidden = 5120 (Qwen3-32B's width: what each
 * layer reduces twice per decode step), then 1 MiB and 16 MiB for the bandwidth end.
 * Each path is timed with its calls captured into a CUDA graph (per rank, --per calls a
 * replay: launch overhead left out, as in a decode step) and launched one by one. Bus
 * bandwidth is NCCL's convention: bytes / time * 2 (n - 1) / n, from the graph time.
 * The P2P communicator is made with its threshold raised to the largest size, so every
 * row runs it; in production it takes messages up to SM70_ALLREDUCE_P2P_MAX only.
 *
 * Non-goals: correctness (tests/gpu/test_comm.c), other collectives, other dtypes.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "kernels/cuda/comm_bench.h"
#include "tools/bench/bench.h"

#define HIDDEN 5120

struct row {
	char name[32];
	size_t bytes;
	struct sm70__comm_bench_time p2p, nccl;
	int have_p2p;
};

static void usage(FILE *f)
{
	fprintf(f, "usage: sm70-bench allreduce [--gpus N] [--iters N] [--per N] [--json]\n"
		   "                            [--help]\n"
		   "  --gpus N    GPUs 0..N-1 (default: all present, at most 4)\n"
		   "  --iters N   samples per figure, median reported (default 30)\n"
		   "  --per N     calls per sample and per captured graph (default 100)\n"
		   "  --json      one JSON object instead of the table\n");
}

static double busbw(size_t bytes, double us, int n)
{
	return us > 0 ? (double)bytes / us * 1e-3 * 2.0 * (n - 1) / n : 0.0;
}

static void print_table(const struct sm70__comm_bench_info *info, const struct row *rows,
			int n_rows, int iters, int per)
{
	printf("sm70-bench allreduce: %s\n", info->desc);
	printf("f16 sum, in place; median of %d samples of %d calls; graph: the %d calls "
	       "captured per rank and replayed; eager: launched one by one\n", iters, per, per);
	if (!info->p2p)
		printf("P2P path unavailable: %s\n", info->p2p_why);
	printf("%-12s %10s %10s %10s %10s %10s %9s %9s %8s\n", "case", "bytes", "p2p graph",
	       "p2p eager", "nccl graph", "nccl eager", "p2p bus", "nccl bus", "speedup");
	printf("%-12s %10s %10s %10s %10s %10s %9s %9s %8s\n", "", "", "us", "us", "us", "us",
	       "GB/s", "GB/s", "graph");
	for (int i = 0; i < n_rows; i++) {
		const struct row *r = &rows[i];

		if (r->have_p2p)
			printf("%-12s %10zu %10.2f %10.2f %10.2f %10.2f %9.1f %9.1f %7.2fx\n",
			       r->name, r->bytes, r->p2p.us_graph, r->p2p.us_eager,
			       r->nccl.us_graph, r->nccl.us_eager,
			       busbw(r->bytes, r->p2p.us_graph, info->n_gpus),
			       busbw(r->bytes, r->nccl.us_graph, info->n_gpus),
			       r->nccl.us_graph / r->p2p.us_graph);
		else
			printf("%-12s %10zu %10s %10s %10.2f %10.2f %9s %9.1f %8s\n", r->name,
			       r->bytes, "-", "-", r->nccl.us_graph, r->nccl.us_eager, "-",
			       busbw(r->bytes, r->nccl.us_graph, info->n_gpus), "-");
	}
}

static int print_json(const struct sm70__comm_bench_info *info, const struct row *rows,
		      int n_rows, int iters, int per)
{
	json_t *o = json_object(), *arr = json_array();
	char *s;

	if (!o || !arr)
		goto oom;
	json_object_set_new(o, "section", json_string("allreduce"));
	json_object_set_new(o, "device", json_string(info->desc));
	json_object_set_new(o, "gpus", json_integer(info->n_gpus));
	json_object_set_new(o, "dtype", json_string("f16"));
	json_object_set_new(o, "iters", json_integer(iters));
	json_object_set_new(o, "calls_per_sample", json_integer(per));
	json_object_set_new(o, "p2p", json_boolean(info->p2p));
	if (!info->p2p)
		json_object_set_new(o, "p2p_unavailable", json_string(info->p2p_why));
	for (int i = 0; i < n_rows; i++) {
		const struct row *r = &rows[i];
		json_t *j = json_object();

		if (!j)
			goto oom;
		json_object_set_new(j, "case", json_string(r->name));
		json_object_set_new(j, "bytes", json_integer((json_int_t)r->bytes));
		if (r->have_p2p) {
			json_object_set_new(j, "p2p_graph_us", json_real(r->p2p.us_graph));
			json_object_set_new(j, "p2p_eager_us", json_real(r->p2p.us_eager));
			json_object_set_new(j, "p2p_busbw_gbs",
					    json_real(busbw(r->bytes, r->p2p.us_graph,
							    info->n_gpus)));
		}
		json_object_set_new(j, "nccl_graph_us", json_real(r->nccl.us_graph));
		json_object_set_new(j, "nccl_eager_us", json_real(r->nccl.us_eager));
		json_object_set_new(j, "nccl_busbw_gbs",
				    json_real(busbw(r->bytes, r->nccl.us_graph, info->n_gpus)));
		json_array_append_new(arr, j);
	}
	json_object_set_new(o, "rows", arr);
	arr = NULL;
	s = json_dumps(o, JSON_INDENT(2));
	if (!s)
		goto oom;
	printf("%s\n", s);
	free(s);
	json_decref(o);
	return 0;
oom:
	json_decref(arr);
	json_decref(o);
	fprintf(stderr, "sm70-bench allreduce: out of memory\n");
	return 1;
}

int sm70__bench_allreduce(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "gpus", required_argument, 0, 'g' }, { "iters", required_argument, 0, 'i' },
		{ "per", required_argument, 0, 'p' },  { "json", no_argument, 0, 'j' },
		{ "help", no_argument, 0, 'h' },       { 0, 0, 0, 0 },
	};
	static const int batches[] = { 1, 8, 16 };
	struct sm70__comm_bench_info info;
	struct row rows[5];
	int n_rows = 0, gpus = 0, iters = 30, per = 100, json = 0, o, ret = 0;
	char msg[512] = "";

	optind = 1;
	while ((o = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
		switch (o) {
		case 'g': gpus = atoi(optarg); break;
		case 'i': iters = atoi(optarg); break;
		case 'p': per = atoi(optarg); break;
		case 'j': json = 1; break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (optind != argc || gpus < 0 || iters < 1 || per < 1) {
		usage(stderr);
		return 2;
	}
	memset(rows, 0, sizeof(rows));
	for (int i = 0; i < 3; i++) {
		snprintf(rows[n_rows].name, sizeof(rows[n_rows].name), "B%d x %d", batches[i],
			 HIDDEN);
		rows[n_rows++].bytes = (size_t)batches[i] * HIDDEN * 2;
	}
	snprintf(rows[n_rows].name, sizeof(rows[n_rows].name), "1 MiB");
	rows[n_rows++].bytes = (size_t)1 << 20;
	snprintf(rows[n_rows].name, sizeof(rows[n_rows].name), "16 MiB");
	rows[n_rows++].bytes = (size_t)16 << 20;

	ret = sm70__comm_bench_open(gpus, rows[n_rows - 1].bytes, &info, msg, sizeof(msg));
	if (ret) {
		fprintf(stderr, "sm70-bench allreduce: %s\n", msg);
		return 2;
	}
	for (int i = 0; i < n_rows && !ret; i++) {
		struct row *r = &rows[i];

		if (!json)
			fprintf(stderr, "  timing %s...\n", r->name);
		ret = sm70__comm_bench_allreduce(0, r->bytes / 2, 1, per, iters, &r->nccl);
		if (!ret && info.p2p) {
			ret = sm70__comm_bench_allreduce(1, r->bytes / 2, 1, per, iters, &r->p2p);
			r->have_p2p = !ret;
		}
		if (ret)
			fprintf(stderr, "sm70-bench allreduce: %s: error %d\n", r->name, ret);
	}
	sm70__comm_bench_close();
	if (ret)
		return 1;
	if (json)
		return print_json(&info, rows, n_rows, iters, per);
	print_table(&info, rows, n_rows, iters, per);
	return 0;
}
