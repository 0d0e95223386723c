/*
 * comm.h - collectives across the ranks of one tensor-parallel group.
 *
 * One host thread drives every rank: rank r's buffers live on backend be[r], and a
 * collective is one call that names each rank's buffer. On device backends the call only
 * queues work: it is ordered after the ops already queued on each rank's stream and
 * before those queued later, so it may be captured into the ranks' graphs like any op.
 *
 * Two implementations: "cpu" (ranks that are CPU backends, possibly one shared backend
 * simulating several ranks; sums in rank order, so results are reproducible) and "nccl"
 * (one CUDA backend per GPU), with an optional one-shot peer-to-peer all-reduce for
 * small messages (SM70_ALLREDUCE=nccl turns it off; see kernels/cuda/comm_nccl.cu).
 *
 * Non-goals: several processes, ranks on more than one host, collectives other than
 * the ones the model needs.
 */
#ifndef SM70_KERNELS_COMM_H
#define SM70_KERNELS_COMM_H

#include <stddef.h>

#include "common/dtype.h"
#include "common/err.h"
#include "kernels/backend.h"

#define SM70_MAX_TP 4

struct sm70_comm;

struct sm70_comm_ops {
	/* In place: bufs[r] (count elements of dt on rank r's backend; dt is f32 or the
	 * backend's act dtype) becomes the element-wise sum over all ranks, identical on
	 * every rank. Returns 0 or -errno. */
	int (*all_reduce)(struct sm70_comm *c, void *const bufs[], size_t count,
			  enum sm70_dtype dt);
	void (*destroy)(struct sm70_comm *c);
};

struct sm70_comm {
	const struct sm70_comm_ops *ops;
	const char *name;
	int n_ranks;
	struct sm70_backend *be[SM70_MAX_TP];
	void *priv;
};

/* A group of n CPU-backend ranks (be[r] may repeat: one backend can simulate several
 * ranks). Returns 0 or -errno with err set. */
int sm70_comm_cpu_create(struct sm70_comm **out, struct sm70_backend *const be[], int n,
			 struct sm70_err *err);

/* A group of n CUDA backends, one per distinct GPU, over NCCL. Returns -ENODEV when sm70
 * was built without CUDA, or -errno with err naming the failing GPU or NCCL call. */
int sm70_comm_nccl_create(struct sm70_comm **out, struct sm70_backend *const be[], int n,
			  struct sm70_err *err);

/* Destroys a communicator made by either constructor (NULL is fine). */
void sm70_comm_destroy(struct sm70_comm *c);

#endif
