#!/bin/sh
# gpu-bench.sh - the standard GPU measurement of one build, in one run: the read bandwidth,
# the kernel benches, and end-to-end decode on the bench shapes (tools/bench/*) with
# dummy weights, each beside the paths back (SM70_PDL=0 SM70_GEMV_SPLIT=0 SM70_GEMV_WARPS=8)
# and beside any
# variant given, one process per setting. Every figure is printed with the bandwidth
# measured in the same run; logs go to $OUT (or ./gpu-bench-out).
#
#   BUILD_DIR=/tmp/b tools/gpu-bench.sh [--quick | --nvfp4 8b|27b|qwen4 | --transformers MODEL]
#                                       [--variant 'VAR=VALUE ...']...
#
# --quick: B1 and B16 at 1K only, and no kernel benches (about two minutes).
# --nvfp4 SHAPE: the NVFP4 measurement of one bench shape, sized for one device call of
# ten minutes: every variant of the NVFP4 op bench (8b only), then decode at B1/B8/B16 on
# 1K and 16K, the f16 config once and the NVFP4 one on every setting (default, the NVFP4
# path back SM70_NVFP4_VARIANT=5, and any --variant). The f16 27b and qwen4 configs need
# an H200's memory.
# --transformers MODEL (a tools/bench directory name, e.g. qwen3-8b): sm70's decode at
# B1/B8/B16 on 1K and 16K, then compiled transformers (tools/bench_transformers.py
# --compile: StaticCache, torch.compile reduce-overhead) on the same shapes, one process a
# batch size so each compile's time stays under its timeout.
# Run from the repository root on the GPU machine (tools/gpu-pack.sh makes BUILD_DIR).
set -u
B=${BUILD_DIR:-build}
O=${OUT:-gpu-bench-out}
quick=0
nvfp4=""
tf=""
variants="-
SM70_PDL=0 SM70_GEMV_SPLIT=0 SM70_GEMV_WARPS=8"
while [ $# -gt 0 ]; do
	case "$1" in
	--quick) quick=1 ;;
	--nvfp4) shift; nvfp4=${1:-}
		variants="-
SM70_NVFP4_VARIANT=5" ;;
	--transformers) shift; tf=${1:-}; variants="-" ;;
	--variant) shift; variants="$variants
$1" ;;
	*) echo "usage: $0 [--quick | --nvfp4 8b|27b|qwen4 | --transformers MODEL]" \
		"[--variant 'VAR=VALUE ...']..." >&2
		exit 2 ;;
	esac
	shift
done
mkdir -p "$O"
"$B/bin/sm70-bench" bw > "$O/bw.log" 2>&1
BW=$(awk '/read kernel/ {for (i = 1; i <= NF; i++) if ($i ~ /GB\/s/) {print $(i - 1); exit}}' "$O/bw.log")
echo "read bandwidth: $BW GB/s"

# one bench on every setting ("-": the default): NAME COMMAND...
each() {
	name=$1; shift
	echo "== $name"
	echo "$variants" | while read -r v; do
		[ "$v" = "-" ] && label=default || label=$v
		log="$O/$name.$(echo "$label" | tr ' =' '_-').log"
		# shellcheck disable=SC2046
		env $([ "$v" = "-" ] || echo "$v") "$@" > "$log" 2>&1
		echo "-- $label (rc $?)"
		grep -E '^ +[0-9]+ +[0-9]+ ' "$log"
	done
}
D="$B/bin/sm70-bench decode --load-format dummy --bw-gbs $BW"
if [ -n "$tf" ]; then
	[ -d "tools/bench/$tf" ] || { echo "gpu-bench: no tools/bench/$tf" >&2; exit 2; }
	each "$tf" timeout 180 $D -m "tools/bench/$tf" --batch 1,8,16 --ctx 1024,16384 --steps 32 \
		--kv-gib 40
	for b in 1 8 16; do
		PYTHONUNBUFFERED=1 timeout 200 python3 tools/bench_transformers.py -m "tools/bench/$tf" \
			--batch "$b" --ctx 1024,16384 --steps 32 --compile > "$O/transformers.$b.log" 2>&1
		echo "== transformers compiled, batch $b (rc $?)"
		grep -E '^ +[0-9]+ +[0-9]+ ' "$O/transformers.$b.log"
	done
	exit 0
fi
if [ -n "$nvfp4" ]; then
	case "$nvfp4" in
	8b) m=qwen3-8b; t=120; a="--steps 32 --kv-gib 40" ;;
	27b) m=qwen3.5-27b; t=180; a="--steps 24 --kv-gib 24" ;;
	qwen4) m=qwen4-exp; t=220; a="--steps 24 --kv-gib 16" ;;
	*) echo "gpu-bench: --nvfp4 takes 8b, 27b or qwen4" >&2; exit 2 ;;
	esac
	if [ "$nvfp4" = 8b ]; then
		timeout 120 "$B/bin/sm70-bench" nvfp4 --iters 20 > "$O/nvfp4.log" 2>&1
		echo "== sm70-bench nvfp4 (rc $?): $O/nvfp4.log"
		grep -E ' B[124] v' "$O/nvfp4.log"
	fi
	all=$variants
	variants="-"
	# shellcheck disable=SC2086
	each "$m" timeout "$t" $D -m "tools/bench/$m" --batch 1,8,16 --ctx 1024,16384 $a
	variants=$all
	# shellcheck disable=SC2086
	each "$m-nvfp4" timeout "$t" $D -m "tools/bench/$m-nvfp4" --batch 1,8,16 --ctx 1024,16384 $a
	exit 0
fi
if [ $quick -eq 1 ]; then
	each qwen3-8b timeout 90 $D -m tools/bench/qwen3-8b --batch 1,16 --ctx 1024 --steps 64 --kv-gib 8
	each qwen3.5-27b timeout 120 $D -m tools/bench/qwen3.5-27b --batch 1,16 --ctx 1024 --steps 32 --kv-gib 8
	exit 0
fi
for k in gemv gdn moe nvfp4; do
	timeout 90 "$B/bin/sm70-bench" "$k" --iters 20 > "$O/$k.log" 2>&1
	echo "== sm70-bench $k (rc $?): $O/$k.log"
done
each qwen3-8b timeout 120 $D -m tools/bench/qwen3-8b --batch 1,8,16 --ctx 1024,16384 --steps 64 --kv-gib 40
each qwen3.5-27b timeout 150 $D -m tools/bench/qwen3.5-27b --batch 1,8,16 --ctx 1024,16384 --steps 32 --kv-gib 24
each qwen3-30b-a3b timeout 120 $D -m tools/bench/qwen3-30b-a3b --batch 1,8,16 --ctx 1024 --steps 32 --kv-gib 8
each qwen3-8b-nvfp4 timeout 90 $D -m tools/bench/qwen3-8b-nvfp4 --batch 1,16 --ctx 1024 --steps 64 --kv-gib 8
