/*
 * strerror.c - sm70_strerror: one text function for both kinds of error the library returns
 * (errno values and the daemon's protocol codes offset by SM70_E_BASE).
 * Non-goals: localisation; the protocol texts are the fixed English ones of sm70_proto.h.
 */
#include <string.h>

#include "sdk/client_impl.h"

SM70_API const char *sm70_strerror(int err)
{
	/* unsigned, so that negating INT_MIN is defined */
	unsigned int e = err < 0 ? 0u - (unsigned int)err : (unsigned int)err;
	const char *s;

	if (e == 0)
		return "success";
	if (e > SM70_E_BASE && e < SM70_E_BASE + 1000) {
		if (e - SM70_E_BASE >= (unsigned int)SM70_PROTO_E__COUNT)
			return "unknown sm70 error";
		return sm70_proto_strerror((int)(e - SM70_E_BASE));
	}
	/* strerrordesc_np (glibc 2.32+) returns constant text: no buffer, thread-safe. */
	s = e < 4096 ? strerrordesc_np((int)e) : NULL;
	return s ? s : "unknown error";
}
