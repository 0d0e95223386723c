#!/usr/bin/env python3
"""Writes the strings that the demo tokenizer is checked on (tests/fixtures/demo/
tokenizer_strings.jsonl): JSON lines {"group", "text"}.

- every string of the tokenizer corpus (tests/fixtures/tokenizer/corpus.jsonl) in its
  hand-written groups (scripts, emoji, marks, code, digits, punctuation, special tokens,
  English), every 10th white-space and random one: text far outside the demo vocabulary,
  which must fall back to byte tokens and smaller merges exactly as tokenizers does;
  not the three Unicode 16 probes (docs/TOKENIZER.md: their split differs by design);
- 150 pieces of the training text (paragraph starts of up to 300 characters, some cut
  inside a word), where the restricted vocabulary must give the training pieces;
- the chat layout with the special tokens inline.

Deterministic. Python 3 standard library only.
Usage: python3 tools/demo_model/tokenizer_strings.py DATA_DIR/austen.txt > FILE
"""
import json
import sys

HAND = {"scripts", "emoji", "nfc", "code", "digits", "punct", "special", "english"}


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: tokenizer_strings.py AUSTEN_TXT > strings.jsonl")
    out = []
    corpus = [json.loads(l) for l in open("tests/fixtures/tokenizer/corpus.jsonl",
                                          encoding="utf-8")]
    n_other = 0
    for c in corpus:
        if c["group"] == "new-unicode":
            continue
        if c["group"] in HAND:
            out.append({"group": "corpus-" + c["group"], "text": c["text"]})
        else:
            n_other += 1
            if n_other % 10 == 0:
                out.append({"group": "corpus-" + c["group"], "text": c["text"]})
    paras = [p for p in open(sys.argv[1], encoding="utf-8").read().split("\n\n") if p.strip()]
    step = len(paras) // 150
    for i in range(150):
        p = paras[i * step]
        cut = 300 if i % 3 else 97 + i       # some cuts fall inside a word
        out.append({"group": "austen", "text": p[:cut]})
    chats = [
        "<|im_start|>user\nWho is Mr. Darcy?<|im_end|>\n<|im_start|>assistant\n",
        "<|im_start|>system\nYou write like Jane Austen.<|im_end|>\n<|im_start|>user\n"
        "Describe a ball.<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
        "It was a truth<|endoftext|>universally acknowledged.",
        "<|im_start|>assistant\nVery well, ma'am.<|im_end|><|im_end|>",
        "<think>She had never been so happy.</think>",
        "<|im_start|user broken tokens <|im_end| and <| im_start |>",
    ]
    out += [{"group": "chat", "text": t} for t in chats]
    for o in out:
        sys.stdout.write(json.dumps(o, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
