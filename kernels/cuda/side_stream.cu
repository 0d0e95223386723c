/*
 * side_stream.cu - the CUDA backend's side sections (kernels/backend.h side_begin,
 * side_end, side_join): ops queued between side_begin and side_end run on a second stream
 * that forks from the main one where side_begin was called, and side_join makes the main
 * stream wait for them. qwen4_exp gathers a step's PLE table rows (host memory read over
 * PCIe through the mapping, latency-bound) there, so the reads overlap the first layers.
 *
 * Both the fork and the join are events, which stream capture records as graph edges: a
 * captured step replays with the same overlap. cuBLAS stays bound to the main stream, so
 * ops that call it must not be queued in a section (the engine queues only ple_embed).
 */
#include "kernels/cuda/cuda_check.h"

extern "C" void sm70__cuda_side_begin(struct sm70_backend *be)
{
	struct sm70__cuda *c = sm70__cuda_enter(be);

	if (c->stream != c->main) {
		sm70__cuda_fail(be, "side_begin", __FILE__, __LINE__, "already in a side section");
		return;
	}
	if (SM70_CUDA_CHECK(be, cudaEventRecord(c->side_fork, c->main)) ||
	    SM70_CUDA_CHECK(be, cudaStreamWaitEvent(c->side, c->side_fork, 0)))
		return;
	c->stream = c->side;
}

extern "C" void sm70__cuda_side_end(struct sm70_backend *be)
{
	struct sm70__cuda *c = sm70__cuda_enter(be);

	if (c->stream != c->side)
		return; /* side_begin failed and said so */
	SM70_CUDA_CHECK(be, cudaEventRecord(c->side_done, c->side));
	c->stream = c->main;
}

extern "C" void sm70__cuda_side_join(struct sm70_backend *be)
{
	struct sm70__cuda *c = sm70__cuda_enter(be);

	SM70_CUDA_CHECK(be, cudaStreamWaitEvent(c->main, c->side_done, 0));
}
