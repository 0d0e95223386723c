#!/bin/sh
# Installs what is missing, builds, and generates a completion from the bundled model
# on the CPU backend, streaming token ids as they are produced.
# Usage: scripts/demo.sh [extra sm70-run flags]
set -eu
cd "$(dirname "$0")/.."
jobs=$(nproc 2>/dev/null || echo 2)

scripts/install-deps.sh
scons -Q -j"$jobs" build/bin/sm70-run
MODEL=tests/fixtures/qwen3-gqa2-d64-tied
echo "== sm70-run on $MODEL (CPU backend): prompt 1,2,3,4,5, 32 new tokens, seeded sampling"
build/bin/sm70-run -m "$MODEL" --prompt-ids 1,2,3,4,5 -n 32 --temperature 0.8 --top-k 40 \
	--top-p 0.95 --seed 7 "$@"
echo "== the same, greedy, as JSON"
build/bin/sm70-run -m "$MODEL" --prompt-ids 1,2,3,4,5 -n 8 --top-logprobs 2 --json
