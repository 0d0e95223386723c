#!/bin/sh
# gpu-check.sh - builds sm70 with CUDA and runs the GPU tests (tests/gpu) on a GPU machine.
# Run from the repository root. Prints each test's output, then one PASS/FAIL table:
# every tests/gpu binary, then the reference fixtures end to end on the CUDA backend
# (graphs on, eager with SM70_GRAPHS=0, every reference switch, the switches not yet on by
# default), the FP8 KV accuracy check,
# then tensor parallelism over every GPU present (test_tp: 2..N ranks against one rank).
#
#   tools/gpu-check.sh             scons -j16 CUDA=1 CUDA_ARCHS=${CUDA_ARCHS:-90}, then run
#   tools/gpu-check.sh --no-build  run what build/tests-gpu already holds (a prebuilt tree)
#   --quick                        the tests/gpu binaries and the fixtures under the defaults
#                                  only (about a minute and a half on an H200: the check to
#                                  run first when device time is short)
#
# Exit status: 0 when every test passed (a test that prints SKIP passes), 1 otherwise.
set -u
B=${BUILD_DIR:-build}
build=1
quick=0
for a in "$@"; do
	case "$a" in
	--no-build) build=0 ;;
	--quick) quick=1 ;;
	*) echo "usage: $0 [--no-build] [--quick]" >&2; exit 2 ;;
	esac
done

if [ $build -eq 1 ]; then
	if command -v scons >/dev/null 2>&1; then
		scons -j16 CUDA=1 CUDA_ARCHS="${CUDA_ARCHS:-90}" BUILD_DIR="$B" || exit 1
	else
		echo "gpu-check: scons not found; build elsewhere and run with --no-build" >&2
		exit 1
	fi
fi

table=""
fail=0
n=0
run_one() { # NAME COMMAND...
	name=$1; shift
	n=$((n + 1))
	echo "== $name"
	start=$(date +%s)
	"$@"
	rc=$?
	secs=$(( $(date +%s) - start ))
	if [ $rc -eq 0 ]; then
		table="$table PASS:$name(${secs}s)"
	else
		table="$table FAIL:$name(rc=$rc)"
		fail=$((fail + 1))
	fi
}
for t in "$B"/tests-gpu/test_*; do
	[ -x "$t" ] || continue
	run_one "$(basename "$t")" "$t"
done
if [ $quick -eq 1 ] && [ -x "$B/tests/test_fixtures" ]; then
	run_one fixtures-cuda env SM70_BACKEND=cuda "$B/tests/test_fixtures"
	echo "gpu-check (quick):$table -- $((n - fail))/$n passed"
	[ $fail -eq 0 ]
	exit
fi
for t in test_cuda_ops test_cuda_moe test_cuda_moe_nvfp4 test_graphs; do
	[ -x "$B/tests-gpu/$t" ] || continue
	run_one "$t-experiments" env SM70_PDL=all SM70_GEMV_WARPS=4 SM70_ATTN_FOLD=1 \
		"$B/tests-gpu/$t"
done
# 128-position attention tiles for every fp8-all shape (attn_wide_tile takes them by size)
[ -x "$B/tests-gpu/test_cuda_ops" ] &&
	run_one test_cuda_ops-wide-tile env SM70_ATTN_TILE=128 "$B/tests-gpu/test_cuda_ops"
# the B1 dot kernel at three blocks an SM on every shape (variant 5 takes it by shape)
[ -x "$B/tests-gpu/test_cuda_nvfp4" ] &&
	run_one test_cuda_nvfp4-variant4 env SM70_NVFP4_VARIANT=4 "$B/tests-gpu/test_cuda_nvfp4"
if [ -x "$B/tests/test_fixtures" ]; then
	run_one fixtures-cuda env SM70_BACKEND=cuda "$B/tests/test_fixtures"
	run_one fixtures-cuda-eager env SM70_BACKEND=cuda SM70_GRAPHS=0 "$B/tests/test_fixtures"
	run_one kv-fp8-cuda env SM70_BACKEND=cuda "$B/tests/test_kv_fp8"
	run_one kv-fp8-cuda-wide-tile env SM70_BACKEND=cuda SM70_ATTN_TILE=128 \
		"$B/tests/test_kv_fp8"
	run_one batch-invariance-cuda env SM70_BACKEND=cuda "$B/tests/test_batch_invariance"
	run_one batch-invariance-cuda-eager env SM70_BACKEND=cuda SM70_GRAPHS=0 \
		"$B/tests/test_batch_invariance"
	# the invariant paths against transformers, as the default ones
	run_one fixtures-cuda-batch-invariant env SM70_BACKEND=cuda SM70_BATCH_INVARIANT=1 \
		"$B/tests/test_fixtures"
	# the switches not on by default: every overlapped-launch kind, 8-warp GEMVs only (the
	# path back from auto), the attention merge folded into its split kernel
	run_one fixtures-cuda-experiments env SM70_BACKEND=cuda SM70_PDL=all SM70_GEMV_WARPS=8 \
		SM70_ATTN_FOLD=1 \
		"$B/tests/test_fixtures"
	run_one fixtures-cuda-reference env SM70_BACKEND=cuda SM70_GRAPHS=0 SM70_MATMUL=reference \
		SM70_ATTENTION=reference SM70_SAMPLER=reference SM70_FUSED=0 SM70_GDN=reference SM70_MOE=reference SM70_PDL=0 SM70_GEMV_SPLIT=0 \
		SM70_GEMV_WARPS=8 \
		"$B/tests/test_fixtures"
fi
if [ -x "$B/tests/test_tp" ]; then
	gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
	[ "$gpus" -gt 4 ] && gpus=4
	if [ "$gpus" -ge 2 ]; then
		run_one tp-cuda env SM70_BACKEND=cuda SM70_TP_MAX="$gpus" "$B/tests/test_tp"
		run_one tp-cuda-nccl env SM70_BACKEND=cuda SM70_TP_MAX="$gpus" SM70_ALLREDUCE=nccl \
			"$B/tests/test_tp"
	else
		echo "== tp-cuda: SKIP, $gpus GPU(s): tensor parallelism needs 2 or more"
	fi
fi
if [ $n -eq 0 ]; then
	echo "gpu-check: no test binaries in $B/tests-gpu" >&2
	exit 1
fi
echo "gpu-check:$table -- $((n - fail))/$n passed"
[ $fail -eq 0 ]
