#!/bin/sh
# sm70d --check-config checks the model directory as the start loads it (config.json
# through the architecture registry, the weight files' headers and index, every tensor's
# name, shape and dtype), without its weights' data: each kind of broken directory exits 2
# with the error named, and that error is the one the real load gives (sm70-run loads the
# same directory; the daemon's own start is compared once); every fixture, and NVFP4
# checkpoints made from two of them, say OK.
set -eu
B=${SM70_BUILD:-build}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
GOOD=tests/fixtures/qwen3-gqa2-d64-tied
SHARDED=tests/fixtures/qwen3-gqa6-d256-long
echo '{}' >"$T/empty.json"

# 1. Every fixture with a config.json passes, and says what it checked.
n=0
for d in tests/fixtures/*/; do
	[ -f "$d/config.json" ] || continue
	out=$("$B/bin/sm70d" --config "$T/empty.json" --check-config -m "$d" 2>&1) ||
		fail "--check-config on $d: $out"
	echo "$out" | grep -q "configuration OK .*model $d (.*layers, [0-9]* weight file" ||
		fail "--check-config on $d printed: $out"
	n=$((n + 1))
done
[ $n -ge 5 ] || fail "only $n fixtures found"
echo "ok: $n fixtures pass --check-config"

# 2. The broken directories, each with one defect.
mk() { cp -r "$1" "$T/$2"; }
mk $GOOD no-config && rm "$T/no-config/config.json"
mk $GOOD bad-json && printf '{"model_type": "qwen3", "hidden_size": 12' >"$T/bad-json/config.json"
mk $GOOD unknown-type
mk $SHARDED missing-shard && rm "$T/missing-shard/model-00003-of-00005.safetensors"
mk $GOOD truncated
mk $GOOD missing-tensor
mk $GOOD wrong-shape
mk $GOOD wrong-dtype
mk $GOOD no-weights && rm "$T/no-weights/model.safetensors"
# NVFP4 checkpoints (both layouts; MoE experts too) pass, and one without a block scale fails
for q in qwen3-gqa2-d64-tied:modelopt qwen3_moe-e8k2:compressed-tensors; do
	"$B/bin/sm70-quantize" -m "tests/fixtures/${q%%:*}" -o "$T/nvfp4-${q%%:*}" \
		--format "${q#*:}" >/dev/null 2>"$T/q.err" || fail "sm70-quantize $q: $(cat "$T/q.err")"
	out=$("$B/bin/sm70d" --config "$T/empty.json" --check-config -m "$T/nvfp4-${q%%:*}" 2>&1) ||
		fail "--check-config on the NVFP4 $q: $out"
done
echo "ok: NVFP4 checkpoints (modelopt, compressed-tensors with MoE experts) pass"
cp -r "$T/nvfp4-qwen3-gqa2-d64-tied" "$T/nvfp4-no-scale"
python3 - "$T" <<'PY'
import json, struct, sys
T = sys.argv[1]

def read(path):
    b = open(path, 'rb').read()
    n = struct.unpack('<Q', b[:8])[0]
    h = json.loads(b[8:8 + n])
    meta = h.pop('__metadata__', None)
    data = b[8 + n:]
    return meta, {k: [v['dtype'], v['shape'], data[v['data_offsets'][0]:v['data_offsets'][1]]]
                  for k, v in h.items()}

def write(path, meta, tensors):
    h, blob = {}, b''
    if meta is not None:
        h['__metadata__'] = meta
    for k, (dt, shape, raw) in sorted(tensors.items()):
        h[k] = {'dtype': dt, 'shape': shape, 'data_offsets': [len(blob), len(blob) + len(raw)]}
        blob += raw
    hb = json.dumps(h).encode()
    open(path, 'wb').write(struct.pack('<Q', len(hb)) + hb + blob)

c = json.load(open(T + '/unknown-type/config.json'))
c['model_type'] = 'llama9'
json.dump(c, open(T + '/unknown-type/config.json', 'w'))

f = T + '/truncated/model.safetensors'
b = open(f, 'rb').read()
n = struct.unpack('<Q', b[:8])[0]
open(f, 'wb').write(b[:8 + n // 2])          # the header's length promises more

f = T + '/missing-tensor/model.safetensors'
meta, t = read(f)
del t['model.layers.1.self_attn.k_norm.weight']
write(f, meta, t)

f = T + '/wrong-shape/model.safetensors'
meta, t = read(f)
t['model.layers.1.mlp.down_proj.weight'][1] = [320, 128]   # same bytes, transposed
write(f, meta, t)

f = T + '/wrong-dtype/model.safetensors'
meta, t = read(f)
t['model.norm.weight'] = ['I32', [128], bytes(512)]
write(f, meta, t)

f = T + '/nvfp4-no-scale/model.safetensors'
meta, t = read(f)
del t['model.layers.1.mlp.up_proj.weight_scale']
write(f, meta, t)
PY

# case  what the error must say
check() {
	dir="$T/$1" want=$2
	rc=0
	"$B/bin/sm70d" --config "$T/empty.json" --check-config -m "$dir" >"$T/out" 2>"$T/err" ||
		rc=$?
	[ $rc -eq 2 ] || fail "$1: --check-config exit $rc, want 2 ($(cat "$T/out" "$T/err"))"
	grep -qF "$want" "$T/err" || fail "$1: --check-config said '$(cat "$T/err")', want '$want'"
	msg=$(sed -n "s|^sm70d: cannot load the model in $dir: ||p" "$T/err")
	[ -n "$msg" ] || fail "$1: no 'cannot load the model in $dir: ' in '$(cat "$T/err")'"
	# the real load of the same directory fails with the same words
	rc=0
	"$B/bin/sm70-run" -m "$dir" --prompt-ids 1,2 -n 1 >/dev/null 2>"$T/run" || rc=$?
	[ $rc -ne 0 ] || fail "$1: sm70-run loaded the directory"
	grep -qF "$msg" "$T/run" || fail "$1: the load said '$(cat "$T/run")', the check '$msg'"
	echo "ok: $1: $msg"
}
check no-config "$T/no-config/config.json: cannot open: No such file or directory"
check bad-json "$T/bad-json/config.json"
check unknown-type "llama9"
check missing-shard "model-00003-of-00005.safetensors"
check truncated "$T/truncated/model.safetensors"
check missing-tensor "missing tensor model.layers.1.self_attn.k_norm.weight in $T/missing-tensor"
check wrong-shape "tensor model.layers.1.mlp.down_proj.weight in $T/wrong-shape/model.safetensors has shape [320, 128], expected [128, 320]"
check wrong-dtype "tensor model.norm.weight in $T/wrong-dtype/model.safetensors has dtype i32, expected f32, f16 or bf16"
check no-weights "$T/no-weights"
check nvfp4-no-scale "missing tensor model.layers.1.mlp.up_proj.weight_scale in $T/nvfp4-no-scale"

# 3. The daemon's own start on one of them: exit 2 with the same error.
rc=0
"$B/bin/sm70d" --config "$T/empty.json" -m "$T/missing-tensor" --socket "$T/s" \
	>"$T/start" 2>&1 || rc=$?
[ $rc -eq 2 ] || fail "sm70d on missing-tensor: exit $rc, want 2 ($(cat "$T/start"))"
grep -qF "missing tensor model.layers.1.self_attn.k_norm.weight in $T/missing-tensor" \
	"$T/start" || fail "sm70d's start said: $(cat "$T/start")"
echo "ok: sm70d's start fails alike (exit 2)"
echo PASS
