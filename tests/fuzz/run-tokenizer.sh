#!/bin/sh
# Builds the libFuzzer target for the tokenizer (text/) with ASan + UBSan and runs it for a
# bounded time over the Qwen3 tokenizer; exits non-zero on any crash, sanitizer report or
# oracle violation (see tests/fuzz/fuzz_tokenizer.c).
# Usage: tests/fuzz/run-tokenizer.sh   (from anywhere; FUZZ_SECONDS=60 by default,
#        CLANG=clang, FUZZ_DIR=build/fuzz keeps the binary, corpus and any crash artifact)
set -eu
cd "$(dirname "$0")/../.."
secs=${FUZZ_SECONDS:-60}
dir=${FUZZ_DIR:-build/fuzz}
cc=${CLANG:-clang}

mkdir -p "$dir/corpus-tokenizer" "$dir/seeds-tokenizer"
"$cc" -std=c11 -D_GNU_SOURCE -Wall -Wextra -Wno-unused-parameter -g -O1 \
	-fno-omit-frame-pointer -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
	-I. tests/fuzz/fuzz_tokenizer.c text/*.c common/err.c -ljansson -lm \
	-o "$dir/fuzz_tokenizer"

# Seeds: a few corpus strings as text (mode byte 0), and some ids (mode byte 1).
python3 - "$dir/seeds-tokenizer" <<'PY'
import json, sys
d = sys.argv[1]
rows = [json.loads(l) for l in open('tests/fixtures/tokenizer/corpus.jsonl')]
for r in rows[::29]:
    open('%s/text-%d' % (d, r['id']), 'wb').write(b'\0' + r['text'].encode('utf-8'))
open(d + '/ids', 'wb').write(bytes([1]) + bytes(range(256)))
open(d + '/ids-stops', 'wb').write(bytes([0x0f]) + bytes(range(255, -1, -1)))
PY

echo "fuzz_tokenizer: running for ${secs} s (corpus $dir/corpus-tokenizer)"
ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1} \
UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1} \
	"$dir/fuzz_tokenizer" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
	-max_len=4096 -print_final_stats=1 -artifact_prefix="$dir/" "$dir/corpus-tokenizer" \
	"$dir/seeds-tokenizer"
