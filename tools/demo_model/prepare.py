#!/usr/bin/env python3
"""Prepares the demo model's training data and its restricted Qwen3 tokenizer.

1. The text: Jane Austen's six novels from Debian 12's r-cran-janeaustenr (fetched with
   apt-get download + dpkg-deb -x unless --pkgdir names an unpacked copy), reflowed so a
   paragraph is one line (the Gutenberg hard wrap and the _italics_ marks removed).
2. The ids: each novel encoded with the full Qwen3 tokenizer by the project's
   sm70-tokenize (equal to the tokenizers package on it).
3. The tokenizer: the Qwen3 tokenizer restricted to what that text needs, and still exact
   on it: every token the text encodes to, every merge whose result is a kept token and the
   parts of those merges (to a fixed point, so the whole merge tree of every piece is kept:
   BPE on the text then applies the same merges in the same order, because the merges left
   are a subset of the full list in the same rank order and the one the full list would
   pick next is among them), the 256 byte-level tokens (any text still encodes) and all 26
   added tokens (the chat format's). Ids are renumbered densely in their old order.
4. The training stream: the novels' ids renumbered, each followed by <|endoftext|>, as
   little-endian uint16 (tokens.u16), plus meta.json.

Deterministic: the same package and tokenizer give the same files. Python 3 standard
library only.

Usage: python3 tools/demo_model/prepare.py --tokenize build/bin/sm70-tokenize \
           --model-dir models/demo --data-dir build/demo-data [--pkgdir DIR]
"""
import argparse
import array
import glob
import gzip
import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import austen_text  # noqa: E402

PACKAGE = "r-cran-janeaustenr"
QWEN3 = "tests/fixtures/tokenizer/qwen3-tokenizer.json.gz"
QWEN3_CONFIG = "tests/fixtures/tokenizer/qwen3-tokenizer_config.json"


def fetch(workdir):
    """apt-get download the package into workdir and unpack it; returns (dir, version)."""
    subprocess.run(["apt-get", "download", PACKAGE], cwd=workdir, check=True)
    debs = glob.glob(os.path.join(workdir, PACKAGE + "_*.deb"))
    if len(debs) != 1:
        sys.exit("prepare: expected one %s .deb in %s, found %d" % (PACKAGE, workdir, len(debs)))
    out = os.path.join(workdir, "pkg")
    subprocess.run(["dpkg-deb", "-x", debs[0], out], check=True)
    return out


def package_version(pkgdir):
    """The version of the unpacked package, from its DESCRIPTION and changelog."""
    desc = os.path.join(pkgdir, "usr/lib/R/site-library/janeaustenr/DESCRIPTION")
    with open(desc, encoding="utf-8") as f:
        m = re.search(r"^Version: (\S+)", f.read(), re.M)
    log = os.path.join(pkgdir, "usr/share/doc", PACKAGE, "changelog.Debian.gz")
    with gzip.open(log, "rt", encoding="utf-8") as f:
        deb = re.match(r"\S+ \(([^)]+)\)", f.readline())
    return "%s (upstream %s)" % (deb.group(1) if deb else "?", m.group(1) if m else "?")


def reflow(lines):
    """Paragraphs (blank-line separated) as single lines; editorial [notes] dropped."""
    paras, cur = [], []
    for line in lines + [""]:
        line = line.strip()
        if line:
            cur.append(line)
            continue
        if cur:
            p = re.sub(r"\s+", " ", " ".join(cur)).replace("_", "")
            if not (p.startswith("[") and p.endswith("]")):
                paras.append(p)
            cur = []
    return "\n\n".join(paras) + "\n"


def encode(tool, tokenizer, texts):
    """Ids of each text from sm70-tokenize (one JSON line each way)."""
    inp = "".join(json.dumps({"text": t}) + "\n" for t in texts)
    r = subprocess.run([tool, "--tokenizer", tokenizer], input=inp.encode(),
                       stdout=subprocess.PIPE, check=True)
    out = [json.loads(l) for l in r.stdout.decode().splitlines()]
    if len(out) != len(texts) or any("ids" not in o for o in out):
        sys.exit("prepare: sm70-tokenize failed: %s" % r.stdout[:300])
    return [o["ids"] for o in out]


def byte_symbols():
    """The 256 characters that byte-level BPE uses for the bytes 0..255 (GPT-2's map)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + \
        list(range(0xAE, 0x100))
    sym, n = {}, 0
    for b in range(256):
        if b in keep:
            sym[b] = chr(b)
        else:
            sym[b] = chr(256 + n)
            n += 1
    return [sym[b] for b in range(256)]


def restrict(full, used_ids):
    """The restricted tokenizer.json and the old id -> new id map."""
    vocab = full["model"]["vocab"]
    by_id = {i: t for t, i in vocab.items()}
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ", 1))
              for m in full["model"]["merges"]]
    producers = {}
    for a, b in merges:
        producers.setdefault(a + b, []).append((a, b))
    added = {t["id"] for t in full["added_tokens"]}
    kept = set(byte_symbols())
    missing = kept - set(vocab)
    if missing:
        sys.exit("prepare: byte symbols missing from the vocabulary: %r" % sorted(missing))
    # Every used token, then the parts of every merge that makes a kept token, to a fixed
    # point (a token can be made by more than one merge; all are kept).
    work = [by_id[i] for i in used_ids if i not in added]
    while work:
        t = work.pop()
        if t in kept and len(t) > 1:
            continue
        kept.add(t)
        work.extend(p for a, b in producers.get(t, []) for p in (a, b) if p not in kept)
    new_vocab, remap = {}, {}
    for t, i in sorted(vocab.items(), key=lambda kv: kv[1]):
        if t in kept:
            remap[i] = len(new_vocab)
            new_vocab[t] = len(new_vocab)
    new_merges = [[a, b] for a, b in merges if a + b in kept]
    for a, b in new_merges:
        assert a in kept and b in kept, (a, b)
    added_tokens = []
    for t in sorted(full["added_tokens"], key=lambda t: t["id"]):
        remap[t["id"]] = len(new_vocab) + len(added_tokens)
        added_tokens.append(dict(t, id=remap[t["id"]]))
    out = dict(full)
    out["added_tokens"] = added_tokens
    out["model"] = dict(full["model"], vocab=new_vocab, merges=new_merges)
    return out, remap


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokenize", required=True, help="the sm70-tokenize binary")
    ap.add_argument("--model-dir", required=True, help="where tokenizer*.json go")
    ap.add_argument("--data-dir", required=True, help="where the text and ids go")
    ap.add_argument("--pkgdir", help="an unpacked %s (default: apt-get download it)" % PACKAGE)
    a = ap.parse_args()
    os.makedirs(a.model_dir, exist_ok=True)
    os.makedirs(a.data_dir, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="sm70-demo-") as tmp:
        pkgdir = a.pkgdir or fetch(tmp)
        novels = austen_text.read_novels(pkgdir)
        version = package_version(pkgdir)
        texts = [reflow([l for l in novels[n] if l is not None]) for n in austen_text.NOVELS]
        with open(os.path.join(a.data_dir, "austen.txt"), "w", encoding="utf-8") as f:
            f.write("\n".join(texts))

        full_path = os.path.join(tmp, "qwen3-tokenizer.json")
        with gzip.open(QWEN3, "rb") as f, open(full_path, "wb") as g:
            g.write(f.read())
        with open(full_path, encoding="utf-8") as f:
            full = json.load(f)
        ids = encode(a.tokenize, full_path, texts)
        used = sorted({i for doc in ids for i in doc})
        tok, remap = restrict(full, used)
        tok_path = os.path.join(a.model_dir, "tokenizer.json")
        with open(tok_path, "w", encoding="utf-8") as f:
            json.dump(tok, f, ensure_ascii=False, indent=None, separators=(",", ":"))
        with open(QWEN3_CONFIG, encoding="utf-8") as f:
            cfg = json.load(f)
        cfg["added_tokens_decoder"] = {str(remap[int(k)]): v
                                      for k, v in cfg["added_tokens_decoder"].items()}
        with open(os.path.join(a.model_dir, "tokenizer_config.json"), "w",
                  encoding="utf-8") as f:
            json.dump(cfg, f, ensure_ascii=False, indent=2)
            f.write("\n")

    # The restricted tokenizer must give the same pieces: encode again and compare.
    again = encode(a.tokenize, tok_path, texts)
    want = [[remap[i] for i in doc] for doc in ids]
    if again != want:
        bad = next(n for n, (x, y) in enumerate(zip(again, want)) if x != y)
        sys.exit("prepare: the restricted tokenizer encodes %s differently" %
                 austen_text.NOVELS[bad])
    eot = remap[next(t["id"] for t in full["added_tokens"] if t["content"] == "<|endoftext|>")]
    stream = array.array("H")
    for doc in want:
        stream.extend(doc)
        stream.append(eot)
    if sys.byteorder != "little":
        stream.byteswap()
    with open(os.path.join(a.data_dir, "tokens.u16"), "wb") as f:
        stream.tofile(f)
    meta = {"package": PACKAGE, "version": version,
            "novels": austen_text.NOVELS, "tokens": len(stream),
            "tokens_per_novel": [len(d) for d in want],
            "bytes": sum(len(t.encode()) for t in texts),
            "vocab_size": len(tok["model"]["vocab"]) + len(tok["added_tokens"]),
            "merges": len(tok["model"]["merges"]), "endoftext_id": eot,
            "im_end_id": remap[next(t["id"] for t in full["added_tokens"]
                                    if t["content"] == "<|im_end|>")]}
    with open(os.path.join(a.data_dir, "meta.json"), "w") as f:
        json.dump(meta, f, indent=2)
        f.write("\n")
    print(json.dumps(meta))


if __name__ == "__main__":
    main()
