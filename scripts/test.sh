#!/bin/sh
# Installs what is missing, builds, and runs every test: the normal build, then the
# whole suite again under AddressSanitizer + UndefinedBehaviorSanitizer, then the libFuzzer
# targets for submission-entry validation and the tokenizer, each for a bounded time
# (FUZZ_SECONDS, default 60), then (in CI) the Debian packages end to end.
# Usage: scripts/test.sh            (from anywhere; needs root or sudo for installs)
set -eu
cd "$(dirname "$0")/.."
jobs=$(nproc 2>/dev/null || echo 2)

scripts/install-deps.sh
echo "== build and test (release)"
scons -Q -j"$jobs" test
echo "== build and test (ASan + UBSan)"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
	scons -Q -j"$jobs" BUILD_DIR=build/asan SANITIZE=address,undefined CUDA=0 test
echo "== fuzz sm70_proto_validate_submit (${FUZZ_SECONDS:-60} s)"
tests/fuzz/run.sh
echo "== fuzz the tokenizer (${FUZZ_SECONDS:-60} s)"
tests/fuzz/run-tokenizer.sh
# The packaging check installs and purges system packages and a system user: it runs in CI
# (CI=true, as .ci/run sets) or when asked for with SM70_TEST_PACKAGING=1.
if [ "${CI:-}" = true ] || [ "${SM70_TEST_PACKAGING:-0}" = 1 ]; then
	echo "== Debian packages: build, lintian, install, serve, purge"
	tests/packaging/deb-check.sh
else
	echo "== Debian packages: skipped (they install system packages; run with CI=true or SM70_TEST_PACKAGING=1)"
fi
