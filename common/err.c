/* err.c - the error message buffer; see err.h. */
#include "common/err.h"

#include <stdarg.h>
#include <stdio.h>

int sm70_errf(struct sm70_err *e, int code, const char *fmt, ...)
{
	va_list ap;

	if (!e || e->msg[0])
		return code;
	va_start(ap, fmt);
	vsnprintf(e->msg, sizeof(e->msg), fmt, ap);
	va_end(ap);
	return code;
}

void sm70_err_clear(struct sm70_err *e)
{
	if (e)
		e->msg[0] = '\0';
}
