#!/bin/sh
# sm70-tokenize's command-line contract: JSON lines in, one JSON line out per input line;
# ids equal to the tokenizers reference (the whole corpus, through the tool); --decode back
# to the text; a bad line (not JSON, not UTF-8, no "text", a bad id) answers {"error"} and
# the next line is still served, with exit code 1; -m MODEL_DIR; exit code 2 for bad
# arguments and a missing or unsupported tokenizer.
set -eu
B=${SM70_BUILD:-build}
TOOL="$B/bin/sm70-tokenize"
FX=tests/fixtures/tokenizer
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

mkdir "$T/model"
gzip -dc "$FX/qwen3-tokenizer.json.gz" >"$T/model/tokenizer.json"
TJ="$T/model/tokenizer.json"

# 1. The whole corpus through the tool equals the reference, line for line.
"$TOOL" --tokenizer "$TJ" <"$FX/corpus.jsonl" >"$T/ids.jsonl"
gzip -dc "$FX/reference.jsonl.gz" >"$T/ref.jsonl"
python3 - "$T/ids.jsonl" "$T/ref.jsonl" <<'PY' || exit 1
import json, sys
got = [json.loads(l) for l in open(sys.argv[1])]
ref = [json.loads(l) for l in open(sys.argv[2])]
assert len(got) == len(ref), (len(got), len(ref))
bad = [i for i, (g, r) in enumerate(zip(got, ref)) if g != {"ids": r["ids"]}]
assert not bad, "strings %s differ" % bad[:10]
print("encode: %d corpus lines equal the tokenizers reference" % len(got))
PY

# 2. --decode of the reference ids gives tokenizers' decode, line for line.
python3 -c '
import json, sys
for l in open(sys.argv[1]):
    print(json.dumps({"ids": json.loads(l)["ids"]}))' "$T/ref.jsonl" >"$T/ref_ids.jsonl"
"$TOOL" -m "$T/model" --decode <"$T/ref_ids.jsonl" >"$T/text.jsonl"
python3 - "$T/text.jsonl" "$T/ref.jsonl" <<'PY' || exit 1
import json, sys
got = [json.loads(l) for l in open(sys.argv[1])]
ref = [json.loads(l) for l in open(sys.argv[2])]
assert len(got) == len(ref)
bad = [i for i, (g, r) in enumerate(zip(got, ref)) if g != {"text": r["decoded"]}]
assert not bad, "strings %s differ" % bad[:10]
print("decode: %d lines equal tokenizers' decode" % len(got))
PY

# 3. Bad lines answer an error in their place and the tool goes on; exit code 1.
printf '%s\n' '{"text": "Hello"}' 'not json' '{"text": 5}' '[1, 2]' >"$T/bad.jsonl"
printf '{"text": "caf\351"}\n' >>"$T/bad.jsonl"            # Latin-1, not UTF-8
printf '\n   \n{"text": "<|im_end|>"}\n' >>"$T/bad.jsonl"   # blank lines are skipped
rc=0
"$TOOL" --tokenizer "$TJ" <"$T/bad.jsonl" >"$T/bad.out" 2>"$T/bad.err" || rc=$?
[ $rc -eq 1 ] || fail "bad lines: exit code $rc, want 1"
python3 - "$T/bad.out" "$T/bad.err" <<'PY' || exit 1
import json, sys
out = [json.loads(l) for l in open(sys.argv[1])]
err = open(sys.argv[2]).read()
assert out[0] == {"ids": [9707]}, out[0]
assert "error" in out[1] and out[1]["error"].startswith("line 2: invalid JSON"), out[1]
assert "error" in out[2] and "line 3" in out[2]["error"] and '"text"' in out[2]["error"], out[2]
assert "error" in out[3] and "line 4" in out[3]["error"], out[3]
assert out[4] == {"error": "line 5: invalid UTF-8 at byte 13"}, out[4]
assert out[5] == {"ids": [151645]}, out[5]
assert len(out) == 6, out
assert err.count("sm70-tokenize: line") == 4, err
print("bad lines: 4 errors in place, the lines after them served, exit code 1")
PY
printf '%s\n' '{"ids": [9707, 11]}' '{"ids": [1, -2]}' '{"ids": [151669]}' '{"ids": "x"}' \
	'{"ids": []}' >"$T/bad_ids.jsonl"
rc=0
"$TOOL" --tokenizer "$TJ" --decode <"$T/bad_ids.jsonl" >"$T/bad_ids.out" 2>/dev/null || rc=$?
[ $rc -eq 1 ] || fail "bad ids: exit code $rc, want 1"
python3 - "$T/bad_ids.out" <<'PY' || exit 1
import json, sys
out = [json.loads(l) for l in open(sys.argv[1])]
assert out[0] == {"text": "Hello,"}, out[0]
assert "ids[1]" in out[1]["error"], out[1]
assert "151669" in out[2]["error"], out[2]
assert "error" in out[3], out[3]
assert out[4] == {"text": ""}, out[4]
print("bad ids: negative, unknown and non-array ids answered with errors")
PY

# 4. Special-token options.
echo '{"ids": [151644, 872, 198, 9707, 151645]}' | "$TOOL" --tokenizer "$TJ" --decode \
	--skip-special | grep -qx '{"text":"user\\nHello"}' || fail "--skip-special"
echo '{"text": "<|im_end|>"}' | "$TOOL" --tokenizer "$TJ" --special-as-text |
	grep -q '151645' && fail "--special-as-text still gave the special id"

# 5. Exit code 2: bad arguments, no tokenizer, an unsupported one.
for args in "" "-m $T/model --tokenizer $TJ" "-m $T" "--tokenizer $T/missing.json" "-x"; do
	rc=0
	# shellcheck disable=SC2086
	"$TOOL" $args </dev/null >/dev/null 2>"$T/err" || rc=$?
	[ $rc -eq 2 ] || fail "'$args': exit code $rc, want 2"
done
python3 - "$TJ" "$T/wp.json" <<'PY'
import json, sys
t = json.load(open(sys.argv[1]))
t["model"]["type"] = "WordPiece"
json.dump(t, open(sys.argv[2], "w"))
PY
rc=0
"$TOOL" --tokenizer "$T/wp.json" </dev/null 2>"$T/err" || rc=$?
[ $rc -eq 2 ] && grep -q "WordPiece is not supported" "$T/err" ||
	fail "WordPiece: rc $rc, $(cat "$T/err")"
echo "exit code 2: bad arguments, missing tokenizer, unsupported model type named"

# 6. --chat: the 36 apply_chat_template cases through the tool, text and ids equal; bad
#    lines (not JSON, an unknown role, not UTF-8, no messages) answered in place; no
#    template beside the tokenizer is exit code 2.
cp "$FX/qwen3-tokenizer_config.json" "$T/model/tokenizer_config.json"
python3 -c '
import json, sys
for l in open(sys.argv[1]):
    d = json.loads(l)
    print(json.dumps({k: d[k] for k in ("messages", "add_generation_prompt", "enable_thinking")}))
' "$FX/chat_reference.jsonl" >"$T/chat_in.jsonl"
"$TOOL" -m "$T/model" --chat <"$T/chat_in.jsonl" >"$T/chat_out.jsonl"
python3 - "$T/chat_out.jsonl" "$FX/chat_reference.jsonl" <<'PY' || exit 1
import json, sys
got = [json.loads(l) for l in open(sys.argv[1])]
ref = [json.loads(l) for l in open(sys.argv[2])]
assert len(got) == len(ref) == 36, (len(got), len(ref))
bad = [i for i, (g, r) in enumerate(zip(got, ref)) if g != {"text": r["text"], "ids": r["ids"]}]
assert not bad, "chat cases %s differ" % bad
print("chat: %d apply_chat_template cases equal in text and ids" % len(got))
PY
printf '%s\n' '{"messages": [{"role": "user", "content": "Hi"}], "add_generation_prompt": true}' \
	'{"messages": [' '{"messages": [{"role": "wizard", "content": "x"}]}' >"$T/chat_bad.jsonl"
printf '{"messages": [{"role": "user", "content": "caf\351"}]}\n' >>"$T/chat_bad.jsonl"
printf '%s\n' '{"messages": []}' '{"text": "Hi"}' \
	'{"messages": [{"role": "user", "content": "Hi"}], "add_generation_prompt": true, "enable_thinking": false}' \
	>>"$T/chat_bad.jsonl"
rc=0
"$TOOL" --tokenizer "$TJ" --chat <"$T/chat_bad.jsonl" >"$T/chat_bad.out" 2>/dev/null || rc=$?
[ $rc -eq 1 ] || fail "chat bad lines: exit code $rc, want 1"
python3 - "$T/chat_bad.out" <<'PY' || exit 1
import json, sys
out = [json.loads(l) for l in open(sys.argv[1])]
assert len(out) == 7, out
assert out[0] == {"text": "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
                  "ids": [151644, 872, 198, 13048, 151645, 198, 151644, 77091, 198]}, out[0]
assert out[1]["error"].startswith("line 2: invalid JSON"), out[1]
assert out[2] == {"error": 'line 3: messages[0]: unknown role "wizard" (system, user, '
                  'assistant or tool)'}, out[2]
assert out[3]["error"].startswith("line 4: invalid UTF-8 at byte"), out[3]
assert out[4]["error"].startswith("line 5: messages: empty"), out[4]
assert out[5]["error"].startswith("line 6: messages: expected an array"), out[5]
assert out[6]["text"].endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n"), out[6]
print("chat bad lines: not JSON, unknown role, not UTF-8, no messages answered in place")
PY
mkdir "$T/notemplate"
cp "$TJ" "$T/notemplate/tokenizer.json"
rc=0
"$TOOL" -m "$T/notemplate" --chat </dev/null 2>"$T/err" || rc=$?
[ $rc -eq 2 ] && grep -q "no chat template" "$T/err" || fail "no template: rc $rc, $(cat "$T/err")"
rc=0
"$TOOL" -m "$T/model" --chat --special-as-text </dev/null 2>"$T/err" || rc=$?
[ $rc -eq 2 ] && grep -q "does not go with --chat" "$T/err" || fail "--chat --special-as-text: rc $rc"
echo "chat: a model without a template, or --special-as-text, is exit code 2, named"
