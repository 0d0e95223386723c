#!/bin/sh
# Builds the libFuzzer target for sm70_proto_validate_submit with ASan + UBSan and runs it
# for a bounded time; exits non-zero on any crash, sanitizer report or oracle violation.
# Usage: tests/fuzz/run.sh    (from anywhere; FUZZ_SECONDS=60 by default, CLANG=clang,
#        FUZZ_DIR=build/fuzz keeps the binary, the growing corpus and any crash artifact)
set -eu
cd "$(dirname "$0")/../.."
secs=${FUZZ_SECONDS:-60}
dir=${FUZZ_DIR:-build/fuzz}
cc=${CLANG:-clang}

mkdir -p "$dir/corpus" "$dir/seeds"
"$cc" -std=c11 -D_GNU_SOURCE -Wall -Wextra -g -O1 -fno-omit-frame-pointer \
	-fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -I. \
	tests/fuzz/fuzz_validate.c shm_proto/sm70_validate.c -lm -o "$dir/fuzz_validate"

# Seeds: one valid SUBMIT, one valid CANCEL (little-endian, PROTOCOL.md section 4.5), so the
# fuzzer starts next to the accepting paths instead of having to find size = 128 first.
python3 - "$dir/seeds" <<'PY'
import struct, sys
d = sys.argv[1]
sub = struct.pack('<HBBIQIIIffiQIII8II4Q', 128, 1, 0, 2, 7, 100, 3, 16, 0.7, 0.9, 40, 5,
                  2, 0, 1, 5, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
can = struct.pack('<HBBIQ', 128, 2, 0, 0, 7) + bytes(112)
assert len(sub) == 128 and len(can) == 128
open(d + '/submit', 'wb').write(sub + bytes([103, 16]))
open(d + '/cancel', 'wb').write(can)
PY

echo "fuzz_validate: running for ${secs} s (corpus $dir/corpus)"
ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1} \
UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1} \
	"$dir/fuzz_validate" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
	-print_final_stats=1 -artifact_prefix="$dir/" "$dir/corpus" "$dir/seeds"
