#!/bin/sh
# gpu-pack.sh - packs a GPU build for a machine that cannot build: the binaries that
# tools/gpu-check.sh and tools/gpu-bench.sh run, stripped, in one xz tarball small enough
# to carry (the CUDA code inside each binary is the same, so a dictionary that spans
# them compresses 300 MB to about 5 MB), beside libcmocka for the tests.
#
#   tools/gpu-pack.sh [BUILD_DIR [OUT_DIR]]   defaults: build-gpu, build-carry
#
# On the GPU machine: mkdir -p /tmp/b && tar xJf OUT_DIR/gpu.tar.xz -C /tmp/b, then
# LD_LIBRARY_PATH=OUT_DIR BUILD_DIR=/tmp/b tools/gpu-check.sh --no-build (or gpu-bench.sh).
set -eu
B=${1:-build-gpu}
O=${2:-build-carry}
t=$(mktemp -d)
trap 'rm -rf "$t"' EXIT
mkdir -p "$t/bin" "$t/tests-gpu" "$t/tests" "$O"
cp "$B/bin/sm70-bench" "$B/bin/sm70-run" "$B/bin/sm70d" "$t/bin/"
cp "$B"/tests-gpu/test_* "$t/tests-gpu/"
for x in test_fixtures test_kv_fp8 test_tp test_batch_invariance; do cp "$B/tests/$x" "$t/tests/"; done
strip "$t"/bin/* "$t"/tests-gpu/* "$t"/tests/*
tar cf - -C "$t" . | xz -T1 --lzma2=preset=6,dict=256MiB > "$O/gpu.tar.xz"
lib=$(ldd "$t/tests-gpu/test_graphs" | awk '/libcmocka/ {print $3}')
[ -n "$lib" ] && cp -L "$lib" "$O/"
ls -l "$O/gpu.tar.xz"
