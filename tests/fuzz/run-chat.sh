#!/bin/sh
# Builds the libFuzzer target for the chat format (text/chat.c) with ASan + UBSan and runs
# it for a bounded time; exits non-zero on any crash, sanitizer report or oracle violation
# (see tests/fuzz/fuzz_chat.c).
# Usage: tests/fuzz/run-chat.sh   (from anywhere; FUZZ_SECONDS=15 by default, CLANG=clang,
#        FUZZ_DIR=build/fuzz keeps the binary, corpus and any crash artifact)
set -eu
cd "$(dirname "$0")/../.."
secs=${FUZZ_SECONDS:-15}
dir=${FUZZ_DIR:-build/fuzz}
cc=${CLANG:-clang}

mkdir -p "$dir/corpus-chat" "$dir/seeds-chat"
"$cc" -std=c11 -D_GNU_SOURCE -Wall -Wextra -Wno-unused-parameter -g -O1 \
	-fno-omit-frame-pointer -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
	-I. tests/fuzz/fuzz_chat.c text/*.c common/err.c -ljansson -lm -o "$dir/fuzz_chat"

# Seeds: the conversations of the chat reference, with each flag combination.
python3 - "$dir/seeds-chat" <<'PY'
import json, sys
d = sys.argv[1]
for i, l in enumerate(open('tests/fixtures/tokenizer/chat_reference.jsonl')):
    c = json.loads(l)
    open('%s/chat-%d' % (d, i), 'wb').write(bytes([i % 4]) + json.dumps(c['messages']).encode())
PY

echo "fuzz_chat: running for ${secs} s (corpus $dir/corpus-chat)"
ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1} \
UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1} \
	"$dir/fuzz_chat" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
	-max_len=4096 -print_final_stats=1 -artifact_prefix="$dir/" "$dir/corpus-chat" \
	"$dir/seeds-chat"
