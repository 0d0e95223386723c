/* log.c - stderr logging with levels; see log.h. */
#include "daemon/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

static int max_level = SM70__LOG_INFO;
static int journal = -1; /* unknown until the first line */

void sm70__log_set_level(int level)
{
	max_level = level;
}

void sm70__log(int level, const char *fmt, ...)
{
	static const char *const names[8] = { "emerg", "alert", "crit", "error",
					       "warning", "notice", "info", "debug" };
	char line[1024];
	va_list ap;

	if (level > max_level)
		return;
	if (journal < 0)
		journal = getenv("JOURNAL_STREAM") != NULL;
	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	/* One fprintf per line so that concurrent writers to the same stderr never interleave
	 * inside a line. */
	if (journal)
		fprintf(stderr, "<%d>%s\n", level, line);
	else
		fprintf(stderr, "sm70d: %s: %s\n", names[level & 7], line);
}
