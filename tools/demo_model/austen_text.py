#!/usr/bin/env python3
"""Extracts Jane Austen's six novels as plain text from Debian's r-cran-janeaustenr.

The package stores each novel as an R character vector (one element per line of the
Project Gutenberg text) in R's lazy-load database (data/Rdata.rdx + data/Rdata.rdb). This
reads that database with a small R unserializer (the XDR format of R's serialize(),
versions 2 and 3; only the object types such data holds), so no R is needed.

Usage:
    apt-get download r-cran-janeaustenr && dpkg-deb -x r-cran-janeaustenr_*.deb pkg
    python3 tools/demo_model/austen_text.py pkg > austen.txt

Python 3 standard library only.
"""
import bz2
import gzip
import lzma
import os
import struct
import sys
import zlib

# The novels in the order they are written out (publication order).
NOVELS = ["sensesensibility", "prideprejudice", "mansfieldpark", "emma",
          "northangerabbey", "persuasion"]

NILVALUE, REFSXP = 254, 255
# Special values that stand alone (no payload): environments and markers.
STANDALONE = {253, 252, 251, 250, 242, 241}
SYMSXP, LISTSXP, CLOSXP, ENVSXP, PROMSXP, LANGSXP = 1, 2, 3, 4, 5, 6
CHARSXP, LGLSXP, INTSXP, REALSXP, CPLXSXP, STRSXP = 9, 10, 13, 14, 15, 16
DOTSXP, VECSXP, EXPRSXP, RAWSXP = 17, 19, 20, 24
ATTRLISTSXP, ATTRLANGSXP = 239, 240


class RData:
    """A reader over one serialized R object (XDR)."""

    def __init__(self, data):
        if data[:2] != b"X\n":
            raise ValueError("not an XDR R serialization (header %r)" % data[:2])
        self.b, self.pos, self.refs = data, 2, []
        version = self.int()
        self.int()
        self.int()
        if version == 3:
            n = self.int()                  # the native encoding's name
            self.pos += n
        elif version != 2:
            raise ValueError("R serialization version %d is not supported" % version)

    def int(self):
        (v,) = struct.unpack_from(">i", self.b, self.pos)
        self.pos += 4
        return v

    def length(self):
        n = self.int()
        if n == -1:
            hi, lo = self.int(), self.int()
            n = (hi << 32) | (lo & 0xFFFFFFFF)
        return n

    def item(self):
        flags = self.int()
        kind = flags & 0xFF
        has_attr, has_tag = flags & (1 << 9), flags & (1 << 10)
        if kind == NILVALUE or kind in STANDALONE:
            return None
        if kind == REFSXP:
            idx = flags >> 8 or self.int()
            return self.refs[idx - 1]
        if kind == SYMSXP:
            sym = ("sym", self.item())
            self.refs.append(sym)
            return sym
        if kind == ENVSXP:
            env = {}
            self.refs.append(env)
            self.int()                      # locked
            for _ in range(4):              # enclosure, frame, hash table, attributes
                self.item()
            return env
        if kind in (LISTSXP, LANGSXP, CLOSXP, PROMSXP, DOTSXP, ATTRLISTSXP, ATTRLANGSXP):
            out = []
            while True:
                if has_attr:
                    self.item()
                tag = self.item() if has_tag else None
                out.append((tag[1] if tag else None, self.item()))
                flags = self.int()
                kind = flags & 0xFF
                has_attr, has_tag = flags & (1 << 9), flags & (1 << 10)
                if kind == NILVALUE:
                    return out
                if kind not in (LISTSXP, LANGSXP, ATTRLISTSXP, ATTRLANGSXP):
                    self.pos -= 4           # the tail is not a pairlist cell
                    out.append((None, self.item()))
                    return out
        if kind == CHARSXP:
            n = self.int()
            if n == -1:
                return None                 # NA_character_
            s = self.b[self.pos:self.pos + n]
            self.pos += n
            # The level bits say LATIN1 (1 << 2); otherwise UTF-8 or ASCII.
            return s.decode("latin-1" if (flags >> 12) & 4 else "utf-8")
        if kind in (LGLSXP, INTSXP):
            n = self.length()
            v = list(struct.unpack_from(">%di" % n, self.b, self.pos))
            self.pos += 4 * n
        elif kind == REALSXP:
            n = self.length()
            v = list(struct.unpack_from(">%dd" % n, self.b, self.pos))
            self.pos += 8 * n
        elif kind == CPLXSXP:
            n = self.length()
            self.pos += 16 * n
            v = None
        elif kind == RAWSXP:
            n = self.length()
            v = self.b[self.pos:self.pos + n]
            self.pos += n
        elif kind in (STRSXP, VECSXP, EXPRSXP):
            v = [self.item() for _ in range(self.length())]
        else:
            raise ValueError("R object type %d at offset %d is not supported" %
                             (kind, self.pos - 4))
        if has_attr:
            attrs = dict(self.item())
            if isinstance(v, list) and "names" in attrs:
                v = dict(zip(attrs["names"], v))
        return v


def unpack_rdb_entry(blob):
    """A lazy-load database entry: 4-byte length, then zlib (or a type byte for others)."""
    (n,) = struct.unpack_from(">I", blob, 0)
    kind = blob[4:5]
    if kind == b"2":
        return blob[5:5 + n]
    if kind == b"B":
        return bz2.decompress(blob[5:])
    if kind == b"X":
        return lzma.decompress(blob[5:])
    return zlib.decompress(blob[4:])


def read_novels(pkgdir):
    data = os.path.join(pkgdir, "usr/lib/R/site-library/janeaustenr/data")
    with open(os.path.join(data, "Rdata.rdx"), "rb") as f:
        raw = f.read()
    raw = gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else zlib.decompress(raw[4:])
    # list(variables = list(NAME = c(offset, length), ...), references =, compressed =)
    where = RData(raw).item()["variables"]
    with open(os.path.join(data, "Rdata.rdb"), "rb") as f:
        rdb = f.read()
    out = {}
    for name in NOVELS:
        if name not in where:
            raise KeyError("%s: no dataset %r in Rdata.rdx" % (pkgdir, name))
        off, n = where[name]
        out[name] = RData(unpack_rdb_entry(rdb[off:off + n])).item()
    return out


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: austen_text.py PKGDIR (r-cran-janeaustenr unpacked by dpkg-deb -x)")
    for name, lines in read_novels(sys.argv[1]).items():
        sys.stdout.write("\n".join(l for l in lines if l is not None).strip() + "\n\n\n")


if __name__ == "__main__":
    main()
