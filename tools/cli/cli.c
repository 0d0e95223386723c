/* cli.c - argument parsing shared by the command-line tools; see cli.h. */
#include "tools/cli/cli.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SEPARATORS ", \n\t\r"

long sm70__cli_parse_ids(const char *s, int32_t **out, const char **bad)
{
	size_t n = 0, cap = 64;
	int32_t *v = malloc(sizeof(*v) * cap);

	if (!v)
		return -2;
	while (*s) {
		char *end;
		long long x;

		while (*s && strchr(SEPARATORS, *s))
			s++;
		if (!*s)
			break;
		errno = 0;
		x = strtoll(s, &end, 10);
		if (end == s || errno || x < 0 || x > INT32_MAX ||
		    (*end && !strchr(SEPARATORS, *end))) {
			*bad = s;
			free(v);
			return -1;
		}
		if (n == cap) {
			int32_t *nv = realloc(v, sizeof(*v) * (cap *= 2));

			if (!nv) {
				free(v);
				return -2;
			}
			v = nv;
		}
		v[n++] = (int32_t)x;
		s = end;
	}
	*out = v;
	return (long)n;
}

char *sm70__cli_read_file(const char *path)
{
	FILE *f = fopen(path, "rb");
	char *buf = NULL, *nb;
	size_t n = 0, cap = 0, r;

	if (!f)
		return NULL;
	for (;;) {
		if (cap - n < 4096) {
			nb = realloc(buf, cap = cap ? cap * 2 : 8192);
			if (!nb) {
				free(buf);
				fclose(f);
				errno = ENOMEM;
				return NULL;
			}
			buf = nb;
		}
		r = fread(buf + n, 1, cap - n - 1, f);
		n += r;
		if (r == 0)
			break;
	}
	fclose(f);
	buf[n] = '\0';
	return buf;
}

int sm70__cli_parse_num(const char *s, double lo, double hi, double *out)
{
	char *end;
	double v;

	errno = 0;
	v = strtod(s, &end);
	if (end == s || *end || errno || !isfinite(v) || v < lo || v > hi)
		return -1;
	*out = v;
	return 0;
}

int sm70__cli_parse_int(const char *s, double lo, double hi, double *out)
{
	return sm70__cli_parse_num(s, lo, hi, out) || *out != floor(*out) ? -1 : 0;
}

double sm70__cli_now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
