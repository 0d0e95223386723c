/*
 * comm_cpu.c - the communicator for CPU-backend ranks: N ranks simulated in one process.
 *
 * Every rank's buffer is host memory, so an all-reduce is a loop that adds the ranks'
 * values in rank order and writes the sum back to each: the result is the same on every
 * rank and the same from run to run. It exists so that the sharding of the model (and
 * the sampling across vocabulary shards) is exercised in CI, where there is no GPU.
 *
 * Non-goals: speed (one thread; the messages of the tiny test models are small).
 */
#include "kernels/comm.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static int cpu_all_reduce(struct sm70_comm *c, void *const bufs[], size_t count,
			  enum sm70_dtype dt)
{
	int n = c->n_ranks;

	if (dt != SM70_DTYPE_F32 && dt != SM70_DTYPE_F16)
		return -EINVAL;
	for (size_t i = 0; i < count; i++) {
		float s = 0.0f;

		for (int r = 0; r < n; r++)
			s += dt == SM70_DTYPE_F32 ? ((const float *)bufs[r])[i] :
			     sm70_f16_to_f32(((const uint16_t *)bufs[r])[i]);
		for (int r = 0; r < n; r++) {
			if (dt == SM70_DTYPE_F32)
				((float *)bufs[r])[i] = s;
			else
				((uint16_t *)bufs[r])[i] = sm70_f32_to_f16(s);
		}
	}
	return 0;
}

static void cpu_comm_destroy(struct sm70_comm *c)
{
	free(c);
}

static const struct sm70_comm_ops cpu_comm_ops = {
	.all_reduce = cpu_all_reduce,
	.destroy = cpu_comm_destroy,
};

int sm70_comm_cpu_create(struct sm70_comm **out, struct sm70_backend *const be[], int n,
			 struct sm70_err *err)
{
	struct sm70_comm *c;

	*out = NULL;
	if (n < 1 || n > SM70_MAX_TP)
		return sm70_errf(err, -EINVAL, "tensor parallelism of %d ranks: expected 1..%d",
				 n, SM70_MAX_TP);
	for (int r = 0; r < n; r++)
		if (!be[r] || strcmp(be[r]->name, "cpu") != 0)
			return sm70_errf(err, -EINVAL, "cpu communicator: rank %d is not a CPU "
					 "backend", r);
	c = calloc(1, sizeof(*c));
	if (!c)
		return sm70_errf(err, -ENOMEM, "cpu communicator: out of memory");
	c->ops = &cpu_comm_ops;
	c->name = "cpu";
	c->n_ranks = n;
	for (int r = 0; r < n; r++)
		c->be[r] = be[r];
	*out = c;
	return 0;
}
