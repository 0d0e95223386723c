#!/bin/sh
# Installs what is missing, builds, starts the daemon sm70d on the bundled demo model
# (models/demo: a small qwen3 trained on Jane Austen's novels, CPU backend) and streams a
# completion of an English prompt as text to a client (sm70-generate, built on
# libsm70client) through the shared-memory rings; then the same request, greedy, as JSON;
# then a clean shutdown.
# Usage: scripts/demo.sh [PROMPT]
set -eu
cd "$(dirname "$0")/.."
jobs=$(nproc 2>/dev/null || echo 2)
PROMPT=${1:-"It is a truth universally acknowledged, that"}

scripts/install-deps.sh
scons -Q -j"$jobs" build/bin/sm70d build/bin/sm70-generate

MODEL=models/demo
DIR=$(mktemp -d)
SOCK="$DIR/sm70d.sock"
build/bin/sm70d --model "$MODEL" --backend cpu --socket "$SOCK" 2>"$DIR/sm70d.log" &
DAEMON=$!
trap 'kill $DAEMON 2>/dev/null; wait $DAEMON 2>/dev/null; rm -rf "$DIR"' EXIT

i=0
until [ -S "$SOCK" ]; do
	i=$((i + 1))
	if [ $i -gt 100 ] || ! kill -0 $DAEMON 2>/dev/null; then
		echo "sm70d did not start:" >&2; cat "$DIR/sm70d.log" >&2; exit 1
	fi
	sleep 0.1
done
SAMPLING="--temperature 0.8 --top-k 40 --top-p 0.95 --seed 7"

# sm70-generate --prompt TEXT tokenizes in the client (the model's tokenizer.json, found
# through the daemon) and streams the completion as text.
generate() { build/bin/sm70-generate --socket "$SOCK" --prompt "$PROMPT" "$@"; }

echo "== sm70d serves $MODEL on $SOCK (pid $DAEMON)"
echo "== streaming 120 tokens (temperature 0.8, top-k 40, top-p 0.95, seed 7):"
printf '%s' "$PROMPT"
# shellcheck disable=SC2086
generate -n 120 $SAMPLING
echo "== the same prompt, greedy, 8 tokens, as JSON:"
generate -n 8 --top-logprobs 2 --json
kill -TERM $DAEMON
wait $DAEMON && echo "== sm70d drained and exited 0"
trap 'rm -rf "$DIR"' EXIT
