#!/bin/sh
# Runs every unit test binary and integration script; prints one line each and a summary.
# The unit tests (tests/unit: computation and files, no clocks) run SM70_TEST_JOBS at a
# time (default: one a CPU); the integration tests (real daemons and clients, timeouts of
# a few hundred ms) then run one at a time, so no other test's load stretches their clocks.
# Usage: tests/run-tests.sh BUILD_DIR   (run from the repository root)
#        tests/run-tests.sh --one BUILD_DIR TEST   (one test: its line, and its status in
#                                                   BUILD_DIR/test-logs/TEST.rc)
set -u

if [ "${1:-}" = --one ]; then
	B=$2 t=$3
	name=$(basename "$t")
	log="$B/test-logs/$name.log"
	start=$(date +%s)
	if [ "${t%.sh}" != "$t" ]; then
		SM70_BUILD="$B" sh "$t" >"$log" 2>&1; rc=$?
	else
		SM70_BUILD="$B" "$t" >"$log" 2>&1; rc=$?
	fi
	secs=$(( $(date +%s) - start ))
	echo "$rc" >"$B/test-logs/$name.rc"
	if [ $rc -eq 0 ]; then
		echo "PASS  $name (${secs}s)"
	else
		# one write, so that a test finishing beside it does not cut into it
		out=$(echo "FAIL  $name (rc $rc, ${secs}s) -- log: $log"
		      tail -n 30 "$log" | sed 's/^/      | /')
		echo "$out"
	fi
	exit 0
fi

B=${1:-build}
jobs=${SM70_TEST_JOBS:-$(nproc 2>/dev/null || echo 1)}
mkdir -p "$B/test-logs"
rm -f "$B"/test-logs/*.rc
units="" others=""
for t in "$B"/tests/test_* tests/integration/*.sh; do
	[ -x "$t" ] || [ "${t%.sh}" != "$t" ] || continue
	[ -e "$t" ] || continue
	if [ -f "tests/unit/$(basename "$t").c" ]; then
		units="$units $t"
	else
		others="$others $t"
	fi
done
# Reverse order starts the longest one (test_tp) first rather than last, alone.
# shellcheck disable=SC2086 # the lists are paths without spaces, split on purpose
[ -n "$units" ] && printf '%s\n' $units | sort -r | xargs -P "$jobs" -n 1 sh "$0" --one "$B"
for t in $others; do
	sh "$0" --one "$B" "$t"
done

n=0 fail=0 failed=""
for r in "$B"/test-logs/*.rc; do
	[ -e "$r" ] || continue
	n=$((n + 1))
	if [ "$(cat "$r")" != 0 ]; then
		fail=$((fail + 1))
		failed="$failed $(basename "$r" .rc)"
	fi
done
echo "== $((n - fail))/$n passed${failed:+; failed:$failed}"
[ $n -gt 0 ] && [ $fail -eq 0 ]
