#!/bin/sh
# --version of every binary: one line "NAME VERSION (git DESCRIBE)" with SConstruct's
# VERSION, the release debian/changelog names; the same text (without the name) in the
# daemon's admin status (`version`) and in `sm70ctl status`.
set -eu
B=${SM70_BUILD:-build}
T=$(mktemp -d)
pid=
trap '[ -z "$pid" ] || kill "$pid" 2>/dev/null || true; rm -rf "$T"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

want=$(sed -n "s/^VERSION = '\(.*\)'$/\1/p" SConstruct)
[ -n "$want" ] || fail "no VERSION = '...' line in SConstruct"
deb=$(sed -n '1s/^sm70 (\([^)]*\)).*/\1/p' packaging/debian/changelog)
[ "$deb" = "$want" ] || fail "debian/changelog's top entry is $deb, SConstruct's VERSION $want"

for b in sm70d sm70ctl sm70-run sm70-generate sm70-bench sm70-tokenize sm70-quantize; do
	[ -x "$B/bin/$b" ] || fail "$B/bin/$b is not built"
	rc=0
	out=$("$B/bin/$b" --version 2>&1) || rc=$?
	[ $rc -eq 0 ] || fail "$b --version: exit $rc ($out)"
	echo "$out" | grep -Eq "^$b $want \(git [0-9A-Za-z._+-]+\)\$" ||
		fail "$b --version printed '$out', want '$b $want (git DESCRIBE)'"
	[ "$(echo "$out" | wc -l)" -eq 1 ] || fail "$b --version printed more than one line"
done
line=$("$B/bin/sm70d" --version)
echo "every binary: $line"

# The daemon's own version in the admin status.
echo '{}' >"$T/config.json"
"$B/bin/sm70d" --config "$T/config.json" --model tests/fixtures/qwen3-gqa2-d64-tied \
	--backend null --load-format dummy --socket "$T/s" >"$T/log" 2>&1 &
pid=$!
i=0
until grep -q "ready: serving" "$T/log"; do
	i=$((i + 1))
	[ $i -lt 200 ] || fail "sm70d did not become ready: $(cat "$T/log")"
	kill -0 $pid 2>/dev/null || fail "sm70d exited: $(cat "$T/log")"
	sleep 0.05
done
json=$("$B/bin/sm70ctl" --socket "$T/s.admin" --json status)
got=$(printf '%s' "$json" | python3 -c 'import json,sys; print(json.load(sys.stdin)["version"])')
[ "sm70d $got" = "$line" ] || fail "status version is '$got', sm70d --version says '$line'"
"$B/bin/sm70ctl" --socket "$T/s.admin" status | grep -qxF "version    $line" ||
	fail "sm70ctl status has no line 'version    $line'"
echo "sm70ctl status: version $got"
kill $pid
wait $pid || fail "sm70d did not drain cleanly"
pid=
echo "PASS"
