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
scons -Q -j"$jobs" build/bin/sm70d build/bin/sm70-generate build/bin/sm70-run \
	build/bin/sm70-tokenize

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

# sm70-generate --prompt TEXT tokenizes in the client and streams text. Where this build's
# sm70-generate has no --prompt yet, the prompt goes through sm70-tokenize and the streamed
# ids come back through sm70-tokenize --decode, one id at a time.
ids_to_text() { # the id stream of sm70-generate on stdin -> text as the ids arrive
	stdbuf -o0 tr ' ' '\n' | while read -r id; do
		[ -n "$id" ] && printf '{"ids":[%s]}\n' "$id"
	done | build/bin/sm70-tokenize -m "$MODEL" --decode --skip-special |
		python3 -u -c 'import json, sys
for line in sys.stdin:
    sys.stdout.write(json.loads(line)["text"])
    sys.stdout.flush()'
	echo
}
if build/bin/sm70-generate --help 2>&1 | grep -q -- '--prompt TEXT'; then
	generate() { build/bin/sm70-generate --socket "$SOCK" --prompt "$PROMPT" "$@"; }
	stream() { generate "$@"; }
else
	IDS=$(python3 -c 'import json, sys; print(json.dumps({"text": sys.argv[1]}))' "$PROMPT" |
		build/bin/sm70-tokenize -m "$MODEL" | sed -e 's/^{"ids":\[//' -e 's/\]}$//')
	generate() { build/bin/sm70-generate --socket "$SOCK" --prompt-ids "$IDS" "$@"; }
	# (its summary line on stderr waits for the text to finish)
	stream() { generate "$@" 2>"$DIR/generate.err" | ids_to_text; cat "$DIR/generate.err" >&2; }
fi

echo "== sm70d serves $MODEL on $SOCK (pid $DAEMON)"
echo "== streaming 120 tokens (temperature 0.8, top-k 40, top-p 0.95, seed 7):"
printf '%s' "$PROMPT"
# shellcheck disable=SC2086
stream -n 120 $SAMPLING
echo "== the same prompt, greedy, 8 tokens, as JSON:"
generate -n 8 --top-logprobs 2 --json
kill -TERM $DAEMON
wait $DAEMON && echo "== sm70d drained and exited 0"
trap 'rm -rf "$DIR"' EXIT
