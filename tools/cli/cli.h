/*
 * cli.h - argument parsing shared by the command-line tools (sm70-run, sm70-generate): token
 * id lists, prompt files, bounded numbers. No dependencies beyond libc, so tools that link
 * only the SDK can use it.
 */
#ifndef SM70_TOOLS_CLI_H
#define SM70_TOOLS_CLI_H

#include <stdint.h>

/* Parses token ids (0..INT32_MAX) separated by commas and/or white space into a new array
 * (*out, freed by the caller). Returns the count, -1 with *bad at the offending text, or -2
 * when out of memory. */
long sm70__cli_parse_ids(const char *s, int32_t **out, const char **bad);

/* The whole file as a NUL-terminated string (caller frees), or NULL with errno set. */
char *sm70__cli_read_file(const char *path);

/* A finite number in [lo, hi] (0), or -1. */
int sm70__cli_parse_num(const char *s, double lo, double hi, double *out);

/* An integer-valued number in [lo, hi] (0), or -1. */
int sm70__cli_parse_int(const char *s, double lo, double hi, double *out);

/* CLOCK_MONOTONIC in seconds, for the timings the tools print. */
double sm70__cli_now_s(void);

#endif
