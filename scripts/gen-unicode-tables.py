#!/usr/bin/env python3
"""gen-unicode-tables.py - writes text/unicode_tables.c from the Unicode Character Database
that Debian ships (package unicode-data, /usr/share/unicode).

The generated file is committed, so a build needs nothing beyond a C compiler; run this
again only to change what the tables hold:

    apt-get install unicode-data
    python3 scripts/gen-unicode-tables.py [UCD_DIR] > text/unicode_tables.c

Two Unicode versions, on purpose, because the tokenizer is judged against the Hugging Face
`tokenizers` package, and that package mixes two:
  * character classes (\\p{L}, \\p{N}, \\s and the \\w of the added-token word test) use the
    data as shipped (Debian 12: Unicode 15.0), close to the Oniguruma regex engine that
    tokenizers' Split pre-tokenizer runs;
  * normalisation (canonical decompositions, combining classes, compositions) is restricted
    to characters assigned by Unicode 9.0, because tokenizers normalises with the crate
    unicode-normalization-alignments 0.1.12, whose tables are Unicode 9.0. The stability
    policy of Unicode guarantees that those characters' data never changed since, so
    "15.0 data, characters of age <= 9.0" is exactly Unicode 9.0 normalisation.

Output, all const and read-only:
  sm70__uprop_stage1/2   two-stage table: code point -> property bits (SM70_UP_*)
  sm70__ccc_stage1/2     two-stage table: code point -> canonical combining class
  sm70__decomp_cp/_off/_pool  full canonical decompositions (Hangul excluded: algorithmic)
  sm70__comp_key/_val    primary composites: ((first << 21) | second) -> composite, sorted
"""
import os
import sys

UCD = sys.argv[1] if len(sys.argv) > 1 else '/usr/share/unicode'
NORM_AGE = (9, 0)     # normalisation data as of this version
SHIFT = 7             # two-stage tables: blocks of 128 code points
NCP = 0x110000

# property bits; text/unicode.h defines the same values
UP_L, UP_N, UP_WS, UP_WORD, UP_NFC_INERT = 1, 2, 4, 8, 16


def ucd_lines(name):
    with open(os.path.join(UCD, name), encoding='utf-8') as f:
        for line in f:
            line = line.split('#', 1)[0].strip()
            if line:
                yield [x.strip() for x in line.split(';')]


def cp_range(s):
    if '..' in s:
        a, b = s.split('..')
        return range(int(a, 16), int(b, 16) + 1)
    return range(int(s, 16), int(s, 16) + 1)


def main():
    gc = ['Cn'] * NCP
    ccc_all = [0] * NCP
    decomp = {}          # cp -> list of cps (canonical only)
    first = None
    for f in ucd_lines('UnicodeData.txt'):
        cp = int(f[0], 16)
        if f[1].endswith(', First>'):
            first = cp
            continue
        if f[1].endswith(', Last>'):
            for c in range(first, cp + 1):
                gc[c] = f[2]
            continue
        gc[cp] = f[2]
        ccc_all[cp] = int(f[3])
        if f[5] and not f[5].startswith('<'):
            decomp[cp] = [int(x, 16) for x in f[5].split()]

    age = [None] * NCP
    for f in ucd_lines('DerivedAge.txt'):
        v = tuple(int(x) for x in f[1].split('.'))
        for c in cp_range(f[0]):
            age[c] = v

    def old(c):
        return age[c] is not None and age[c] <= NORM_AGE

    props = {}
    for f in ucd_lines('PropList.txt'):
        props.setdefault(f[1], set()).update(cp_range(f[0]))
    for f in ucd_lines('DerivedCoreProperties.txt'):
        if len(f) == 2:
            props.setdefault(f[1], set()).update(cp_range(f[0]))
    fce = set()
    for f in ucd_lines('DerivedNormalizationProps.txt'):
        if f[1] == 'Full_Composition_Exclusion':
            fce.update(cp_range(f[0]))

    # normalisation data, Unicode 9.0
    ccc = [ccc_all[c] if old(c) else 0 for c in range(NCP)]
    d9 = {c: d for c, d in decomp.items() if old(c)}

    def full(c):
        if c not in d9:
            return [c]
        out = []
        for x in d9[c]:
            out += full(x)
        return out
    full_decomp = {c: full(c) for c in sorted(d9)}
    comp = {}
    for c, d in d9.items():
        if len(d) == 2 and c not in fce:
            comp[(d[0] << 21) | d[1]] = c
    seconds = {k & 0x1FFFFF for k in comp}
    seconds.update(range(0x1161, 0x1176))   # Hangul V jamo compose after L
    seconds.update(range(0x11A8, 0x11C3))   # Hangul T jamo compose after LV

    ws = props['White_Space']
    alpha = props['Alphabetic']
    join = props['Join_Control']
    up = bytearray(NCP)
    for c in range(NCP):
        g = gc[c]
        b = 0
        if g[0] == 'L':
            b |= UP_L
        if g[0] == 'N':
            b |= UP_N
        if c in ws:
            b |= UP_WS
        if c in alpha or g[0] == 'M' or g == 'Nd' or g == 'Pc' or c in join:
            b |= UP_WORD
        # NFC cannot change a text at a character that has no decomposition, combining
        # class 0 and never ends a composition: text splits there for normalisation.
        # Hangul syllables decompose but always recompose to themselves.
        hangul = 0xAC00 <= c < 0xAC00 + 11172
        if ccc[c] == 0 and (c not in d9 or hangul) and c not in seconds:
            b |= UP_NFC_INERT
        up[c] = b

    out = sys.stdout
    out.write('/*\n * unicode_tables.c - GENERATED by scripts/gen-unicode-tables.py from the '
              'Unicode\n * Character Database in %s (Debian package unicode-data). Do not edit;\n'
              ' * see the script for what the tables hold and why two Unicode versions.\n */\n'
              % UCD)
    out.write('#include "text/unicode.h"\n\n')
    ver = open(os.path.join(UCD, 'ReadMe.txt'), encoding='utf-8').read()
    uver = '?'
    for word in ver.split():
        if word[:1].isdigit() and word.count('.') == 2:
            uver = word.rstrip('.')
            break
    out.write('const char sm70__unicode_version[] = "%s";\n' % uver)
    out.write('const char sm70__unicode_norm_version[] = "%d.%d.0";\n\n' % NORM_AGE)

    def two_stage(name, vals, ctype):
        blocks, index = [], []
        seen = {}
        bs = 1 << SHIFT
        for i in range(0, NCP, bs):
            blk = bytes(vals[i:i + bs])
            if blk not in seen:
                seen[blk] = len(blocks)
                blocks.append(blk)
            index.append(seen[blk])
        it = 'uint8_t' if len(blocks) <= 256 else 'uint16_t'
        out.write('const %s %s_stage1[%d] = {\n' % (it, name, len(index)))
        for i in range(0, len(index), 16):
            out.write('\t' + ', '.join(str(x) for x in index[i:i + 16]) + ',\n')
        out.write('};\n')
        out.write('const %s %s_stage2[%d] = {\n' % (ctype, name, len(blocks) * bs))
        for blk in blocks:
            for i in range(0, bs, 32):
                out.write('\t' + ','.join(str(x) for x in blk[i:i + 32]) + ',\n')
        out.write('};\n\n')
        return it, len(blocks)

    it1, nb1 = two_stage('sm70__uprop', up, 'uint8_t')
    it2, nb2 = two_stage('sm70__ccc', bytes(ccc), 'uint8_t')

    cps = sorted(full_decomp)
    out.write('const uint32_t sm70__decomp_count = %d;\n' % len(cps))
    out.write('const uint32_t sm70__decomp_cp[%d] = {\n' % len(cps))
    for i in range(0, len(cps), 10):
        out.write('\t' + ', '.join('0x%05X' % c for c in cps[i:i + 10]) + ',\n')
    out.write('};\n')
    pool, offs = [], []
    for c in cps:
        offs.append(len(pool))
        pool += full_decomp[c]
    offs.append(len(pool))
    out.write('const uint16_t sm70__decomp_off[%d] = {\n' % len(offs))
    for i in range(0, len(offs), 16):
        out.write('\t' + ', '.join(str(x) for x in offs[i:i + 16]) + ',\n')
    out.write('};\n')
    out.write('const uint32_t sm70__decomp_pool[%d] = {\n' % len(pool))
    for i in range(0, len(pool), 10):
        out.write('\t' + ', '.join('0x%05X' % c for c in pool[i:i + 10]) + ',\n')
    out.write('};\n\n')

    keys = sorted(comp)
    out.write('const uint32_t sm70__comp_count = %d;\n' % len(keys))
    out.write('const uint64_t sm70__comp_key[%d] = {\n' % len(keys))
    for i in range(0, len(keys), 6):
        out.write('\t' + ', '.join('0x%011XULL' % k for k in keys[i:i + 6]) + ',\n')
    out.write('};\n')
    out.write('const uint32_t sm70__comp_val[%d] = {\n' % len(keys))
    for i in range(0, len(keys), 10):
        out.write('\t' + ', '.join('0x%05X' % comp[k] for k in keys[i:i + 10]) + ',\n')
    out.write('};\n')
    sys.stderr.write('gen-unicode-tables: Unicode %s (normalisation %d.%d): %d+%d property '
                     'blocks (%s, %s), %d decompositions, %d compositions\n'
                     % (uver, NORM_AGE[0], NORM_AGE[1], nb1, nb2, it1, it2, len(cps),
                        len(keys)))


if __name__ == '__main__':
    main()
