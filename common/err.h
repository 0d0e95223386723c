/*
 * err.h - one error message buffer passed down through loading and setup code.
 *
 * Library code returns 0 or -errno; when it fails it may also fill a struct sm70_err
 * with one human sentence naming what was wrong (file, tensor, key). Callers that do
 * not care pass NULL. Not used on the decode hot path.
 */
#ifndef SM70_COMMON_ERR_H
#define SM70_COMMON_ERR_H

#include <stddef.h>

struct sm70_err {
	char msg[512];
};

/* Formats into e->msg (when e is non-NULL) and returns code, so callers can write
 * `return sm70_errf(err, -EINVAL, "...", ...);`. Keeps the first message written:
 * the innermost failure is usually the most precise one. */
int sm70_errf(struct sm70_err *e, int code, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* Clears e (when non-NULL). */
void sm70_err_clear(struct sm70_err *e);

#endif
