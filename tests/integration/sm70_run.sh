#!/bin/sh
# sm70-run's command-line contract: the JSON object's shape, greedy tokens equal to the
# transformers reference, reproducible seeded sampling, dummy weights, prompt files, and
# exit code 2 with a message naming the problem for bad arguments and bad model dirs.
set -eu
B=${SM70_BUILD:-build}
RUN="$B/bin/sm70-run"
FX=tests/fixtures/qwen3-gqa2-d64-tied
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# 1. Greedy JSON equals the reference continuation of case 2 (17-token prompt).
python3 - "$FX" >"$T/case" <<'PY'
import json, sys
c = json.load(open(sys.argv[1] + "/reference.json"))["cases"][2]
print(",".join(map(str, c["prompt"])))
print(" ".join(map(str, c["tokens"])))
print(c["max_new_tokens"])
PY
prompt=$(sed -n 1p "$T/case"); want=$(sed -n 2p "$T/case"); n=$(sed -n 3p "$T/case")
"$RUN" -m "$FX" --prompt-ids "$prompt" -n "$n" --top-logprobs 3 --json >"$T/out.json"
python3 - "$T/out.json" "$want" <<'PY' || exit 1
import json, sys
o = json.load(open(sys.argv[1]))
want = [int(x) for x in sys.argv[2].split()]
assert set(o) == {"tokens", "logprobs", "top_logprobs", "finish_reason", "usage", "timing"}, o.keys()
assert o["tokens"] == want, (o["tokens"], want)
assert len(o["logprobs"]) == len(want) and all(l <= 0 for l in o["logprobs"])
assert all(len(t) == 3 and t[0]["id"] == tok for t, tok in zip(o["top_logprobs"], want))
assert o["finish_reason"] == "length"
assert o["usage"] == {"prompt_tokens": 17, "completion_tokens": len(want)}, o["usage"]
assert o["timing"]["prefill_ms"] > 0 and o["timing"]["decode_tokens_per_s"] > 0
print("greedy JSON: %d tokens equal to transformers, shape ok" % len(want))
PY

# 2. Seeded sampling is reproducible; another seed differs.
s1=$("$RUN" -m "$FX" --prompt-ids 1,2,3 -n 24 --temperature 1.0 --top-k 20 --top-p 0.95 --seed 11 --json)
s2=$("$RUN" -m "$FX" --prompt-ids 1,2,3 -n 24 --temperature 1.0 --top-k 20 --top-p 0.95 --seed 11 --json)
s3=$("$RUN" -m "$FX" --prompt-ids 1,2,3 -n 24 --temperature 1.0 --top-k 20 --top-p 0.95 --seed 12 --json)
t1=$(echo "$s1" | python3 -c 'import json,sys; print(json.load(sys.stdin)["tokens"])')
t2=$(echo "$s2" | python3 -c 'import json,sys; print(json.load(sys.stdin)["tokens"])')
t3=$(echo "$s3" | python3 -c 'import json,sys; print(json.load(sys.stdin)["tokens"])')
[ "$t1" = "$t2" ] || fail "same seed gave $t1 and $t2"
[ "$t1" != "$t3" ] || fail "seeds 11 and 12 gave the same tokens"
echo "seeded sampling: seed 11 twice equal, seed 12 differs"

# 3. A prompt file (commas and newlines) equals --prompt-ids; streaming mode prints ids.
printf '1, 2\n3\n' >"$T/prompt.txt"
a=$("$RUN" -m "$FX" --prompt-file "$T/prompt.txt" -n 5 2>/dev/null)
b=$("$RUN" -m "$FX" --prompt-ids 1,2,3 -n 5 2>/dev/null)
[ "$a" = "$b" ] || fail "prompt file gave '$a', ids gave '$b'"
[ "$(echo "$a" | wc -w)" -eq 5 ] || fail "streaming printed '$a'"
echo "prompt file: same 5 tokens as --prompt-ids"

# 4. Dummy weights from config.json alone are deterministic.
mkdir "$T/dummy"; cp "$FX/config.json" "$T/dummy/"
d1=$("$RUN" -m "$T/dummy" --load-format dummy --prompt-ids 5,6 -n 6 2>/dev/null)
d2=$("$RUN" -m "$T/dummy" --load-format dummy --prompt-ids 5,6 -n 6 2>/dev/null)
[ "$d1" = "$d2" ] || fail "dummy weights differ between runs"
echo "dummy weights: deterministic ($d1)"

# 5. --tp 2 (simulated ranks on the CPU) gives the greedy reference and the seeded tokens.
"$RUN" -m "$FX" --prompt-ids "$prompt" -n "$n" --tp 2 --json >"$T/tp.json"
python3 - "$T/tp.json" "$want" <<'PY' || exit 1
import json, sys
o = json.load(open(sys.argv[1]))
assert o["tokens"] == [int(x) for x in sys.argv[2].split()], o["tokens"]
PY
t4=$("$RUN" -m "$FX" --prompt-ids 1,2,3 -n 24 --temperature 1.0 --top-k 20 --top-p 0.95 --seed 11 \
	--tp 4 --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["tokens"])')
[ "$t1" = "$t4" ] || fail "--tp 4 sampled $t4, one rank $t1"
echo "--tp 2 greedy equals transformers; --tp 4 seeded sampling equals one rank"

# 6. Errors: exit 2 and a message naming the problem.
expect2() { # NEEDLE ARGS...
	needle=$1; shift
	set +e; "$RUN" "$@" >/dev/null 2>"$T/err"; rc=$?; set -e
	[ $rc -eq 2 ] || fail "exit $rc (want 2) for: $*"
	grep -q -- "$needle" "$T/err" || fail "message '$(cat "$T/err")' lacks '$needle'"
	echo "exit 2: $(head -n 1 "$T/err")"
}
expect2 "required" --prompt-ids 1
expect2 "exactly one" -m "$FX"
expect2 "temperature" -m "$FX" --prompt-ids 1 --temperature -1
expect2 "top-p" -m "$FX" --prompt-ids 1 --top-p 1.5
expect2 "backend" -m "$FX" --prompt-ids 1 --backend tpu
expect2 "tensor parallelism 3" -m "$FX" --prompt-ids 1 --tp 3
expect2 "tp" -m "$FX" --prompt-ids 1 --tp 9
expect2 "bad token id" -m "$FX" --prompt-ids 1,x,3
expect2 "vocabulary" -m "$FX" --prompt-ids 1,99999
expect2 "config.json" -m "$T/nowhere" --prompt-ids 1
mkdir "$T/trunc"; cp "$FX/config.json" "$T/trunc/"
head -c 5000 "$FX/model.safetensors" >"$T/trunc/model.safetensors"
expect2 "model.safetensors" -m "$T/trunc" --prompt-ids 1
mkdir "$T/miss"; cp "$FX/config.json" "$T/miss/"
python3 - "$FX/model.safetensors" "$T/miss/model.safetensors" <<'PY'
import json, struct, sys
b = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
del h["model.layers.1.mlp.up_proj.weight"]
hb = json.dumps(h).encode()
hb += b" " * (-len(hb) % 8)
open(sys.argv[2], "wb").write(struct.pack("<Q", len(hb)) + hb + b[8 + n:])
PY
expect2 "model.layers.1.mlp.up_proj.weight" -m "$T/miss" --prompt-ids 1
# 7. A text prompt: the fixture with the real Qwen3 tokenizer beside it (its 512 ids are
#    Qwen3's first 512). The text streams; --json has "text" first, equal to the decode of
#    its tokens; --stop ends before the stop; --chat renders (and this model's vocabulary
#    refuses <|im_start|> by name); no tokenizer, or text options on an id prompt, exit 2.
mkdir "$T/text"
for f in config.json generation_config.json model.safetensors; do cp "$FX/$f" "$T/text/"; done
gzip -dc tests/fixtures/tokenizer/qwen3-tokenizer.json.gz >"$T/text/tokenizer.json"
cp tests/fixtures/tokenizer/qwen3-tokenizer_config.json "$T/text/tokenizer_config.json"
"$RUN" -m "$T/text" --prompt "in on the" -n 24 --ignore-eos --json >"$T/text.json"
"$RUN" -m "$T/text" --prompt "in on the" -n 24 --ignore-eos >"$T/text.out" 2>/dev/null
python3 - "$T/text.json" "$T/text.out" "$T/text/tokenizer.json" <<'PY' || exit 1
import json, sys
o = json.load(open(sys.argv[1]))
assert list(o)[:2] == ["text", "tokens"], list(o)
assert len(o["tokens"]) == 24 and o["finish_reason"] == "length", o
# the streamed text (plus the final newline) is the JSON's text
assert open(sys.argv[2], "rb").read() == o["text"].encode() + b"\n"
# and the text is what the tokens decode to (byte-level: each id's bytes, lossy UTF-8)
vocab = json.load(open(sys.argv[3]))["model"]["vocab"]
inv = {i: t for t, i in vocab.items()}
# GPT-2's bytes_to_unicode: printable bytes stand for themselves, the rest for 256 + n
bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
rest = [b for b in range(256) if b not in bs]
byte_of = {chr(c): b for b, c in zip(bs + rest, bs + [256 + n for n in range(len(rest))])}
raw = b"".join(bytes(byte_of[ch] for ch in inv[t]) for t in o["tokens"])
assert raw.decode("utf-8", "replace") == o["text"], (raw, o["text"])
print("text prompt: %d tokens streamed as text, equal to their decode" % len(o["tokens"]))
PY
text=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["text"])' "$T/text.json")
stop=$(printf '%s' "$text" | cut -c5-6)
"$RUN" -m "$T/text" --prompt "in on the" -n 24 --ignore-eos --stop "$stop" --json >"$T/stop.json"
python3 - "$T/text.json" "$T/stop.json" "$stop" <<'PY' || exit 1
import json, sys
full, o, stop = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), sys.argv[3]
want = full["text"][:full["text"].index(stop)]
assert o["text"] == want and o["finish_reason"] == "stop", (o["text"], want)
assert o["tokens"] == full["tokens"][:len(o["tokens"])] and len(o["tokens"]) < 24
print("--stop '%s': the text ends before it (%d tokens)" % (stop, len(o["tokens"])))
PY
expect2 "151644" -m "$T/text" --chat "hi"
expect2 "tokenizer.json" -m "$FX" --prompt "hi"
expect2 "need a text prompt" -m "$FX" --prompt-ids 1 --stop x
expect2 "exactly one" -m "$T/text" --prompt "a" --chat "b"
echo "sm70-run: all checks passed"
