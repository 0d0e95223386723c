/* comm.c - what both communicators share: destroying one through its op table. */
#include "kernels/comm.h"

void sm70_comm_destroy(struct sm70_comm *c)
{
	if (c)
		c->ops->destroy(c);
}
