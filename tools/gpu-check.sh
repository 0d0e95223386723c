#!/bin/sh
# gpu-check.sh - builds sm70 with CUDA and runs the GPU tests (tests/gpu) on a GPU machine.
# Run from the repository root. Prints each test's output, then one PASS/FAIL table.
#
#   tools/gpu-check.sh             scons -j16 CUDA=1 CUDA_ARCHS=${CUDA_ARCHS:-90}, then run
#   tools/gpu-check.sh --no-build  run what build/tests-gpu already holds (a prebuilt tree)
#
# Exit status: 0 when every test passed (a test that prints SKIP passes), 1 otherwise.
set -u
B=${BUILD_DIR:-build}
build=1
for a in "$@"; do
	case "$a" in
	--no-build) build=0 ;;
	*) echo "usage: $0 [--no-build]" >&2; exit 2 ;;
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
for t in "$B"/tests-gpu/test_*; do
	[ -x "$t" ] || continue
	n=$((n + 1))
	name=$(basename "$t")
	echo "== $name"
	start=$(date +%s)
	"$t"
	rc=$?
	secs=$(( $(date +%s) - start ))
	if [ $rc -eq 0 ]; then
		table="$table PASS:$name(${secs}s)"
	else
		table="$table FAIL:$name(rc=$rc)"
		fail=$((fail + 1))
	fi
done
if [ $n -eq 0 ]; then
	echo "gpu-check: no test binaries in $B/tests-gpu" >&2
	exit 1
fi
echo "gpu-check:$table -- $((n - fail))/$n passed"
[ $fail -eq 0 ]
