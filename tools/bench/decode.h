/* decode.h - `sm70-bench decode`: end-to-end decode speed of the engine; see decode.c. */
#ifndef SM70_TOOLS_BENCH_DECODE_H
#define SM70_TOOLS_BENCH_DECODE_H

int sm70__bench_decode(int argc, char **argv);

#endif
