/*
 * graph.cu - CUDA-graph capture and replay of the op stream (backend.h's graph ops).
 *
 * The model captures a decode step (forward + sampling) once per padded batch size and
 * context bucket and replays it afterwards: one launch instead of hundreds, which is most
 * of a small-batch step's host overhead. Capture is in relaxed mode: with tensor
 * parallelism one thread captures every rank's stream at once and must end and
 * instantiate one rank's graph while the next rank's stream is still capturing, which the
 * stricter modes forbid. Nothing in the op stream allocates or synchronises, and cuBLAS
 * has a fixed workspace (set at backend create) so it allocates nothing while captured.
 */
#include "kernels/cuda/cuda_check.h"

extern "C" int sm70__cuda_graph_begin(struct sm70_backend *be)
{
	struct sm70__cuda *c = sm70__cuda_enter(be);

	if (c->sticky)
		return c->sticky;
	return SM70_CUDA_CHECK(be, cudaStreamBeginCapture(c->stream,
							   cudaStreamCaptureModeRelaxed));
}

extern "C" int sm70__cuda_graph_end(struct sm70_backend *be, void **graph)
{
	struct sm70__cuda *c = sm70__cuda_enter(be);
	cudaGraph_t g = NULL;
	cudaGraphExec_t exec = NULL;
	int ret;

	ret = SM70_CUDA_CHECK(be, cudaStreamEndCapture(c->stream, &g));
	if (ret)
		return ret;
#if CUDART_VERSION >= 12000
	ret = SM70_CUDA_CHECK(be, cudaGraphInstantiate(&exec, g, 0));
#else /* CUDA 11 (the V100 toolchain): the error-node form */
	ret = SM70_CUDA_CHECK(be, cudaGraphInstantiate(&exec, g, NULL, NULL, 0));
#endif
	cudaGraphDestroy(g); /* the executable graph keeps what it needs */
	if (ret)
		return ret;
	*graph = exec;
	return 0;
}

extern "C" int sm70__cuda_graph_launch(struct sm70_backend *be, void *graph)
{
	struct sm70__cuda *c = sm70__cuda_enter(be);

	if (c->sticky)
		return c->sticky;
	if (SM70_CUDA_CHECK(be, cudaGraphLaunch((cudaGraphExec_t)graph, c->stream)))
		return -EIO;
	if (c->kt)
		sm70__kt_mark(c, "graph replay");
	return 0;
}

extern "C" void sm70__cuda_graph_destroy(struct sm70_backend *be, void *graph)
{
	sm70__cuda_enter(be);
	if (graph)
		cudaGraphExecDestroy((cudaGraphExec_t)graph);
}
