/*
 * silu_matmul.cu - the CUDA silu_matmul op: the gated MLP's down projection with the
 * activation folded in, y[n, rows] = (silu(gate) * up) W^T, gate_up f16 [n, 2 * cols] (gate
 * first), W f16 [rows, cols], y f16. At decode it replaces silu_mul + matmul: one launch
 * fewer, and no [n, cols] f16 round trip through memory.
 *
 * Design: no workspace (ops never allocate and the backend has no scratch for this), so
 * silu(g) * u is made wherever x is read, always with silu_mul.cu's formula and rounded to
 * f16 as silu_mul would store it. Hence each path equals the unfused pair bit for bit:
 * - cols % 8 == 0 and 16-byte aligned gate_up and W: the tensor-core skinny GEMM of
 *   matmul.cu in its SILU form (sm70__cuda_gemv_tc_silu), which makes the x tile from the
 *   gate and up halves while staging it; n > 16 runs it over pieces of 16 rows. Equal to
 *   silu_mul + matmul for n <= 16; for n > 16 (where matmul takes cuBLAS) equal up to
 *   summation order.
 * - SM70_MATMUL=reference, or a shape the tensor-core kernel does not take: one thread per
 *   output element, like matmul.cu's reference kernel (equal to silu_mul + that kernel).
 *
 * Non-goals: prefill speed. Each 16-row piece re-reads all of W, so for n well above 16 the
 * engine should call silu_mul and matmul (cuBLAS) into its own buffer instead; the large-n
 * path exists so that the op is correct for every n. SM70_MATMUL=simt is not honoured (it
 * is a comparison knob of the plain matmul): the fused op keeps the tensor-core kernel.
 */
#include <stdint.h>

#include "kernels/cuda/cuda_check.h"

#define PIECE_ROWS 16     /* rows of x per tensor-core launch */
#define REF_MAX_GRID_Y 65535 /* the grid's y limit: rows of x per reference launch */

/* One thread per output element, as matmul_ref_kernel with x = f16(silu(g) * u) made from
 * gate_up as silu_mul_kernel does: the same products summed in the same order. */
static __global__ void silu_matmul_ref_kernel(__half *__restrict__ y,
					      const __half *__restrict__ gate_up,
					      const __half *__restrict__ w, int rows, int cols)
{
	const int r = blockIdx.x * blockDim.x + threadIdx.x, i = blockIdx.y;
	const __half *g = gate_up + (size_t)i * 2 * cols, *u = g + cols;
	const __half *wrow = w + (size_t)r * cols;
	float s = 0.0f;

	if (r >= rows)
		return;
	for (int k = 0; k < cols; k++) {
		float a = __half2float(g[k]);
		__half x = __float2half_rn((a / (1.0f + expf(-a))) * __half2float(u[k]));

		s += __half2float(x) * __half2float(wrow[k]);
	}
	y[(size_t)i * rows + r] = __float2half_rn(s);
}

/* See backend.h. w->dtype must be f16 (the backend's weight_dtype); y must not overlap
 * gate_up or W. */
extern "C" void sm70__cuda_silu_matmul(struct sm70_backend *be, void *y, const void *gate_up,
				       const struct sm70_weight *w, int n)
{
	struct sm70__cuda *c = sm70__cuda_enter(be);
	const __half *gu = (const __half *)gate_up, *wh = (const __half *)w->data;
	__half *yh = (__half *)y;
	const int rows = w->rows, cols = w->cols;
	int tc;

	if (n <= 0 || rows <= 0)
		return;
	if (w->dtype != SM70_DTYPE_F16) {
		sm70__cuda_fail(be, "silu_matmul", __FILE__, __LINE__, "weights must be f16");
		return;
	}
	/* cols % 8 keeps every row of gate and of up 16-byte aligned once gate_up is */
	tc = !c->matmul_ref && cols > 0 && cols % 8 == 0 && ((uintptr_t)gate_up & 15) == 0 &&
	     ((uintptr_t)w->data & 15) == 0;
	if (!tc) {
		for (int i0 = 0; i0 < n; i0 += REF_MAX_GRID_Y) {
			const int m = n - i0 < REF_MAX_GRID_Y ? n - i0 : REF_MAX_GRID_Y;

			silu_matmul_ref_kernel<<<dim3((rows + 127) / 128, m), 128, 0, c->stream>>>(
				yh + (size_t)i0 * rows, gu + (size_t)i0 * 2 * cols, wh, rows, cols);
			if (SM70_CUDA_LAUNCHED(be, "silu_matmul_ref_kernel"))
				return;
		}
		return;
	}
	for (int i0 = 0; i0 < n; i0 += PIECE_ROWS) {
		const int m = n - i0 < PIECE_ROWS ? n - i0 : PIECE_ROWS;

		sm70__cuda_gemv_tc_silu(c, yh + (size_t)i0 * rows, gu + (size_t)i0 * 2 * cols, wh,
					rows, cols, m);
		if (SM70_CUDA_LAUNCHED(be, "gemv_tc_kernel (silu)"))
			return;
	}
}
