#!/bin/sh
# Installs what sm70 needs to build and test on Debian 12, and nothing more.
# Safe to run again: packages already present are left alone. Needs root (or sudo).
set -eu

# clang + libclang-rt-14-dev: libFuzzer's runtime for tests/fuzz (clang -fsanitize=fuzzer)
PKGS="scons gcc libc6-dev pkg-config python3 liburing-dev libsystemd-dev libjansson-dev libcmocka-dev
clang libclang-rt-14-dev"
[ "${SM70_WITH_PACKAGING:-0}" = 1 ] && PKGS="$PKGS debhelper dpkg-dev lintian fakeroot systemd"

missing=""
for p in $PKGS; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0

SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
echo "install-deps: installing$missing" >&2
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null
