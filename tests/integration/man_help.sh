#!/bin/sh
# The manuals cannot drift from the programs:
# - for each binary, the long options its source accepts (getopt tables and "--x" string
#   comparisons), the ones its --help prints and the ones its man page's OPTIONS section
#   lists are the same set (sm70-bench: its sections' --help too);
# - every SM70_API function of sdk/include/sm70/client.h has a man page (a page whose NAME
#   lists it, or a .so alias of one), and every function a page names is in the header;
# - the pages point to documents where the packages install them (/usr/share/doc/PKG/X.gz,
#   listed in debian/PKG.docs), not into the source tree;
# - with man(1) installed, every page renders without a warning.
# Each mismatch is reported as "BINARY: --option is in A but not in B".
set -eu
B=${SM70_BUILD:-build}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT

# binary | man page | sources | help invocations (";"-separated argument lists)
cat >"$T/bins" <<LIST
sm70d|packaging/man/sm70d.8|daemon/main.c|--help
sm70ctl|packaging/man/sm70ctl.8|tools/sm70ctl.c|--help
sm70-run|packaging/man/sm70-run.1|tools/sm70-run.c|--help
sm70-generate|packaging/man/sm70-generate.1|tools/sm70-generate.c|--help
sm70-tokenize|packaging/man/sm70-tokenize.1|tools/sm70-tokenize.c|--help
sm70-quantize|packaging/man/sm70-quantize.1|tools/sm70-quantize.c|--help
sm70-bench|packaging/man/sm70-bench.1|tools/sm70-bench.c tools/bench/decode.c tools/bench/ipc.c tools/bench/allreduce.c tools/bench/arrange.c|--help;decode --help;ipc --help;allreduce --help;arrange --help
LIST
while IFS='|' read -r bin page srcs helps; do
	[ -x "$B/bin/$bin" ] || { echo "FAIL: $B/bin/$bin is not built"; exit 1; }
	: >"$T/$bin.help"
	echo "$helps" | tr ';' '\n' | while read -r args; do
		# shellcheck disable=SC2086
		if ! "$B/bin/$bin" $args >>"$T/$bin.help" 2>"$T/$bin.err"; then
			echo "FAIL: $bin $args exits non-zero: $(cat "$T/$bin.err")"
			exit 1
		fi
	done
	[ -s "$T/$bin.help" ] || { echo "FAIL: $bin: --help printed nothing on stdout"; exit 1; }
done <"$T/bins"

python3 - "$T" <<'PY'
import os, re, sys

T = sys.argv[1]
bad = []
OPT = re.compile(r'(?<![\w-])--([a-z][a-z0-9]*(?:-[a-z0-9]+)*)')

def man_text(path):
    """The page with roff's escaped minus signs and font changes made plain."""
    s = open(path).read()
    s = s.replace('\\-', '-').replace('\\(em', ' ').replace('\\(en', ' ')
    return re.sub(r'\\f[BIRP]', '', s)

def section(text, name):
    m = re.search(r'^\.SH "?' + name + r'"?\s*$(.*?)(?=^\.SH |\Z)', text, re.M | re.S)
    return m.group(1) if m else None

for line in open(os.path.join(T, 'bins')):
    bin_, page, srcs, _ = line.rstrip('\n').split('|')
    src = ''
    for f in srcs.split():
        src += open(f).read()
    took = set(re.findall(r'\{\s*"([a-z][a-z0-9-]*)",\s*(?:no|required|optional)_argument', src))
    took |= set(re.findall(r'strcmp\([^,()]+,\s*"--([a-z][a-z0-9-]*)"\)', src))
    helped = set(OPT.findall(open(os.path.join(T, bin_ + '.help')).read()))
    opts = section(man_text(page), 'OPTIONS')
    if opts is None:
        bad.append('%s: %s has no OPTIONS section' % (bin_, page))
        continue
    manned = set(OPT.findall(opts))
    where = {'its source (%s)' % srcs: took, 'its --help': helped,
             '%s OPTIONS' % page: manned}
    for (a, sa), (b, sb) in [(x, y) for x in where.items() for y in where.items() if x != y]:
        for o in sorted(sa - sb):
            bad.append('%s: --%s is in %s but not in %s' % (bin_, o, a, b))
    print('%s: %d long options; source, --help and %s agree' % (bin_, len(took), page)
          if not any(m.startswith(bin_ + ':') for m in bad) else '%s: mismatches' % bin_)

# The SDK: every exported call has a page, every page names exported calls.
hdr = open('sdk/include/sm70/client.h').read()
api = set(re.findall(r'^SM70_API\s+[^;(]*?\**\s*\b(sm70_\w+)\s*\(', hdr, re.M))
if len(api) < 10:
    bad.append('sdk/include/sm70/client.h: found only %d SM70_API functions' % len(api))
named = {}
for f in sorted(os.listdir('sdk/man')):
    path = os.path.join('sdk/man', f)
    text = open(path).read()
    m = re.match(r'\.so\s+man3/(\S+)\s*$', text)
    if m:
        target = os.path.join('sdk/man', m.group(1))
        if not os.path.exists(target):
            bad.append('%s: .so points to %s, which does not exist' % (path, target))
            continue
        tname = section(man_text(target), 'NAME') or ''
        if f[:-2] not in re.findall(r'\b(sm70_\w+)\b', tname.split(' - ')[0]):
            bad.append('%s: an alias of %s, whose NAME does not list %s' % (path, target,
                                                                            f[:-2]))
        named[f[:-2]] = path
        continue
    name = section(man_text(path), 'NAME')
    if name is None:
        bad.append('%s: no NAME section' % path)
        continue
    for fn in re.findall(r'\b(sm70_\w+)\b', name.split(' - ')[0]):
        named.setdefault(fn, path)
        if fn not in api:
            bad.append('%s: names %s, which sdk/include/sm70/client.h does not export'
                       % (path, fn))
        if not re.search(r'\b' + fn + r'\(', section(man_text(path), 'SYNOPSIS') or ''):
            bad.append('%s: %s is in NAME but not in SYNOPSIS' % (path, fn))
        if not os.path.exists(os.path.join('sdk/man', fn + '.3')):
            bad.append('%s: names %s, but there is no sdk/man/%s.3 (a .so alias) for '
                       '"man %s"' % (path, fn, fn, fn))
for fn in sorted(api - set(named)):
    bad.append('sdk/include/sm70/client.h: %s has no man page (sdk/man/%s.3)' % (fn, fn))
print('SDK: %d SM70_API functions, each with a page' % len(api))

# Documents the pages point to are installed there.
docs = {}
for pkg in ('sm70d', 'libsm70client-dev'):
    docs[pkg] = set(os.path.basename(l.strip())
                    for l in open('packaging/debian/%s.docs' % pkg) if l.strip())
pages = [os.path.join(d, f) for d in ('packaging/man', 'sdk/man') for f in os.listdir(d)]
for path in sorted(pages):
    text = man_text(path)
    for pkg, doc in re.findall(r'/usr/share/doc/([a-z0-9-]+)/([A-Za-z_]+\.md)\.gz', text):
        if pkg not in docs or doc not in docs[pkg]:
            bad.append('%s: points to /usr/share/doc/%s/%s.gz, but packaging/debian/%s.docs '
                       'does not install docs/%s' % (path, pkg, doc, pkg, doc))
    for doc in re.findall(r'(?<![/\w])docs/[A-Za-z_]+\.md', text):
        bad.append('%s: points to %s of the source tree; name the installed path' % (path, doc))

for m in bad:
    print('FAIL: ' + m)
sys.exit(1 if bad else 0)
PY

# Every page renders without a warning (aliases resolve in a man tree).
if command -v man >/dev/null 2>&1; then
	mkdir -p "$T/man/man1" "$T/man/man3" "$T/man/man8"
	cp packaging/man/*.1 "$T/man/man1/"
	cp packaging/man/*.8 "$T/man/man8/"
	cp sdk/man/*.3 "$T/man/man3/"
	warned=0
	for f in "$T"/man/man*/*; do
		(cd "$T/man" && MANWIDTH=80 man --warnings -E UTF-8 -l "${f#"$T/man/"}" \
			>/dev/null 2>"$T/warn") || true
		if [ -s "$T/warn" ]; then
			echo "FAIL: ${f#"$T/man/"} renders with warnings:"
			sed 's/^/      /' "$T/warn"
			warned=1
		fi
	done
	[ $warned -eq 0 ] || exit 1
	echo "every page renders without a warning"
else
	echo "SKIP: rendering: man(1) is not installed"
fi
echo PASS
