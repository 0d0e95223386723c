#!/bin/sh
# Runs every unit test binary and integration script; prints one line each and a summary.
# Usage: tests/run-tests.sh BUILD_DIR   (run from the repository root)
set -u
B=${1:-build}
fail=0; n=0; failed=""
for t in "$B"/tests/test_* tests/integration/*.sh; do
	[ -x "$t" ] || [ "${t%.sh}" != "$t" ] || continue
	[ -e "$t" ] || continue
	n=$((n + 1))
	log="$B/test-logs/$(basename "$t").log"
	mkdir -p "$B/test-logs"
	start=$(date +%s)
	if [ "${t%.sh}" != "$t" ]; then
		SM70_BUILD="$B" sh "$t" >"$log" 2>&1; rc=$?
	else
		SM70_BUILD="$B" "$t" >"$log" 2>&1; rc=$?
	fi
	secs=$(( $(date +%s) - start ))
	if [ $rc -eq 0 ]; then
		echo "PASS  $(basename "$t") (${secs}s)"
	else
		echo "FAIL  $(basename "$t") (rc $rc, ${secs}s) -- log: $log"
		tail -n 30 "$log" | sed 's/^/      | /'
		fail=$((fail + 1)); failed="$failed $(basename "$t")"
	fi
done
echo "== $((n - fail))/$n passed${failed:+; failed:$failed}"
[ $fail -eq 0 ]
