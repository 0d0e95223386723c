/*
 * bench.h - the sections of sm70-bench that live in tools/bench/, one function each.
 *
 * Each takes the arguments after the section name (argv[0] is the section name itself),
 * prints its own table on stdout and returns the process exit code: 0 done, 1 a failure
 * while measuring, 2 bad arguments. Non-goals: a registry; tools/sm70-bench.c dispatches.
 */
#ifndef SM70_TOOLS_BENCH_BENCH_H
#define SM70_TOOLS_BENCH_BENCH_H

/* `sm70-bench ipc`: token delivery latency and event rate from a real sm70d on the null
 * backend to libsm70client, next to an AF_UNIX SOCK_SEQPACKET baseline in the same run. */
int sm70__bench_ipc(int argc, char **argv);

/* `sm70-bench decode`: end-to-end decode tokens/s of the engine at several batch sizes and
 * contexts, with the fraction of the weights+KV read roofline (decode.c). */
int sm70__bench_decode(int argc, char **argv);

/* `sm70-bench allreduce`: all-reduce latency per call on the decode message sizes, the
 * one-shot peer-to-peer path against NCCL (tools/bench/allreduce.c). */
int sm70__bench_allreduce(int argc, char **argv);

/* `sm70-bench arrange`: the NVFP4 rearrangement at load, the threaded table-driven path
 * beside the element-by-element reference (tools/bench/arrange.c). */
int sm70__bench_arrange(int argc, char **argv);

#endif
