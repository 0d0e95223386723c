#!/bin/sh
# build-deb.sh - builds the sm70 Debian packages (sm70d, libsm70client0, libsm70client-dev)
# from a clean copy of this tree, checks them with lintian, and leaves them in build/deb/.
#
#   scripts/build-deb.sh [--nocheck] [--keep]
#
#   --nocheck   skip the test suite during the build (DEB_BUILD_OPTIONS=nocheck)
#   --keep      keep the scratch build directory (its path is printed)
# Environment: SM70_DEB_OUT (default <tree>/build/deb), SM70_DEB_WORK (scratch directory,
# default a new one under /tmp), SM70_CUDA=1 for a CUDA-enabled sm70d (needs nvcc; see
# docs/OPERATIONS.md), DEB_BUILD_OPTIONS (passed on), SM70_GIT_DESCRIBE (what --version
# names; default `git describe` of this tree).
#
# The tree is copied (tracked and untracked files git does not ignore, no build outputs),
# packaging/debian becomes debian/ in the copy, and dpkg-buildpackage runs there, because it
# writes its results next to the source directory. Needs root (or sudo) only to install
# missing build dependencies. Exit status: 0 built and lintian found no errors, 1 otherwise.
set -eu

ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${SM70_DEB_OUT:-$ROOT/build/deb}
nocheck=0
keep=0
for a in "$@"; do
	case $a in
	--nocheck) nocheck=1 ;;
	--keep) keep=1 ;;
	-h | --help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) echo "build-deb: unknown argument '$a'" >&2; exit 2 ;;
	esac
done

say() { echo "build-deb: $*" >&2; }
die() { say "error: $*"; exit 1; }

SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
apt_install() {
	say "installing $*"
	$SUDO apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "$@" \
		>/dev/null
}

# The tools that run before the build dependencies can be read.
missing=""
for p in dpkg-dev fakeroot lintian; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
		missing="$missing $p"
done
# shellcheck disable=SC2086
[ -z "$missing" ] || apt_install $missing

[ -f "$ROOT/packaging/debian/control" ] || die "no packaging/debian/control in $ROOT"
grep -q "packaging/SConscript" "$ROOT/SConstruct" ||
	die "SConstruct does not call packaging/SConscript, so 'scons install' installs too little;" \
	    "add: SConscript('packaging/SConscript', exports='env bins sdk_shared sdk_static B')"

WORK=${SM70_DEB_WORK:-$(mktemp -d /tmp/sm70-deb.XXXXXX)}
SRC="$WORK/sm70"
rm -rf "$SRC"
mkdir -p "$SRC"
cleanup() {
	if [ "$keep" = 1 ]; then say "scratch directory kept: $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT

# A clean copy: what git tracks or would track, without ignored build outputs.
if git -C "$ROOT" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
	git -C "$ROOT" ls-files -z --cached --others --exclude-standard |
		(cd "$ROOT" && tar --null --files-from=- --ignore-failed-read -cf - 2>/dev/null) |
		tar -xf - -C "$SRC"
else
	tar -C "$ROOT" --exclude='./build*' --exclude=./.git -cf - . | tar -xf - -C "$SRC"
fi
rm -rf "$SRC/debian"
cp -a "$ROOT/packaging/debian" "$SRC/debian"
# The copy has no .git: the binaries' --version names the tree's git description this way
# (SConstruct reads SM70_GIT_DESCRIBE; "unknown" outside a checkout).
if [ -z "${SM70_GIT_DESCRIBE:-}" ]; then
	SM70_GIT_DESCRIBE=$(git -C "$ROOT" describe --tags --always --dirty 2>/dev/null) ||
		SM70_GIT_DESCRIBE=unknown
fi
export SM70_GIT_DESCRIBE

# Build dependencies, as debian/control lists them.
if ! (cd "$SRC" && dpkg-checkbuilddeps >/dev/null 2>&1); then
	say "installing build dependencies from debian/control"
	$SUDO apt-get update -qq
	(cd "$SRC" && DEBIAN_FRONTEND=noninteractive $SUDO apt-get build-dep -y -qq \
		--no-install-recommends ./ >/dev/null)
	(cd "$SRC" && dpkg-checkbuilddeps) || die "build dependencies still missing"
fi

opts=${DEB_BUILD_OPTIONS:-}
case " $opts " in *" parallel="*) ;; *) opts="$opts parallel=$(nproc 2>/dev/null || echo 1)" ;; esac
[ "$nocheck" = 1 ] && opts="$opts nocheck"
say "dpkg-buildpackage in $SRC (DEB_BUILD_OPTIONS='${opts# }')"
(cd "$SRC" && DEB_BUILD_OPTIONS="${opts# }" dpkg-buildpackage -b -us -uc) >"$WORK/build.log" 2>&1 || {
	tail -n 60 "$WORK/build.log" >&2
	keep=1
	die "dpkg-buildpackage failed; the whole log is $WORK/build.log"
}

changes=$(ls "$WORK"/sm70_*.changes 2>/dev/null | head -n 1)
[ -n "$changes" ] || die "no .changes file in $WORK"
mkdir -p "$OUT"
rm -f "$OUT"/*.deb "$OUT"/*.changes "$OUT"/*.buildinfo "$OUT"/lintian.txt
cp "$WORK"/*.deb "$WORK"/*.changes "$WORK"/*.buildinfo "$OUT"/
cp "$WORK/build.log" "$OUT/build.log"

# lintian as root warns that it should not run as root; it runs as the invoking user here
# and prints every tag (errors, warnings, info, pedantic), failing only on errors.
say "lintian"
rc=0
lintian --allow-root --fail-on error --display-info --pedantic "$OUT/$(basename "$changes")" \
	>"$OUT/lintian.txt" 2>&1 || rc=$?
sed 's/^/  /' "$OUT/lintian.txt" >&2
say "lintian: $(grep -c '^E:' "$OUT/lintian.txt" || true) errors," \
    "$(grep -c '^W:' "$OUT/lintian.txt" || true) warnings," \
    "$(grep -c '^[IP]:' "$OUT/lintian.txt" || true) info/pedantic (full list: $OUT/lintian.txt)"
ls -l "$OUT"/*.deb >&2
[ "$rc" -eq 0 ] || die "lintian reported errors"
say "done: packages in $OUT"
