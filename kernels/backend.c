/* backend.c - what both backends share: destroying one through its op table. */
#include "kernels/backend.h"

void sm70_backend_destroy(struct sm70_backend *be)
{
	if (be)
		be->ops->destroy(be);
}
