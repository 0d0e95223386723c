#!/usr/bin/env python3
"""tokenizer_ref.py - the reference the C tokenizer is tested against, made with the Hugging
Face `tokenizers` package (on the GPU machine, which has it; no network needed).

For every string of the corpus (tools/tokenizer_corpus.py) it writes one JSON line with
what tokenizers gives for it: `ids` (encode, as `Tokenizer.encode(text).ids`), `decoded`
(decode of those ids, special tokens kept) and `decoded_skip` (special tokens skipped),
`normalized` (the NFC normalizer's output on the whole text), `split` (the pieces of the
Qwen2 Split pre-tokenizer on the normalized text) and `split_llama3` (the same with the
Llama-3 pattern, which groups digits by three). With --bench FILE it also times encoding
FILE on one core: whole (one encode of the file) and per line (encode_batch of its lines,
one rayon thread); --bench may be repeated. With --chat-dir DIR (a folder holding
tokenizer.json and tokenizer_config.json) it also writes --chat-out: transformers'
apply_chat_template for a few conversations, for the chat-format work that builds on this,
and counts the corpus strings on which transformers' AutoTokenizer agrees with tokenizers.

Usage: python3 tools/tokenizer_ref.py TOKENIZER_JSON CORPUS_JSONL OUT_JSONL
           [--bench FILE]... [--repeat N] [--chat-dir DIR --chat-out FILE]
"""
import argparse
import json
import os
import sys
import time

os.environ.setdefault('RAYON_NUM_THREADS', '1')
os.environ.setdefault('TOKENIZERS_PARALLELISM', 'false')

import tokenizers  # noqa: E402
from tokenizers import Regex, Tokenizer, pre_tokenizers  # noqa: E402

QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
         r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3 = QWEN2.replace(r"\p{N}|", r"\p{N}{1,3}|", 1)


def bench(tok, path, repeat):
    with open(path, encoding='utf-8', newline='') as f:   # bytes as they are: CRs too
        text = f.read()
    lines = text.splitlines(keepends=True)
    size = len(text.encode('utf-8'))
    tok.encode(text)
    t0 = time.perf_counter()
    for _ in range(repeat):
        ntok = len(tok.encode(text).ids)
    tw = time.perf_counter() - t0
    tok.encode_batch(lines[:100])
    t0 = time.perf_counter()
    for _ in range(repeat):
        nl = sum(len(e.ids) for e in tok.encode_batch(lines))
    tl = time.perf_counter() - t0
    return {
        'file': os.path.basename(path), 'bytes': size, 'lines': len(lines), 'repeat': repeat,
        'whole': {'tokens': ntok, 'seconds': round(tw, 4),
                  'mb_per_s': round(size * repeat / tw / 1e6, 2)},
        'per_line_batch': {'tokens': nl, 'seconds': round(tl, 4),
                           'mb_per_s': round(size * repeat / tl / 1e6, 2)},
    }


CONVERSATIONS = [
    [{'role': 'user', 'content': 'Hello!'}],
    [{'role': 'system', 'content': 'You are a helpful assistant.'},
     {'role': 'user', 'content': 'What is 2+2?'}],
    [{'role': 'user', 'content': 'Hi'},
     {'role': 'assistant', 'content': 'Hello! How can I help?'},
     {'role': 'user', 'content': 'Tell me a joke.'}],
    [{'role': 'system', 'content': 'Be brief.'},
     {'role': 'user', 'content': 'Why is the sky blue?'},
     {'role': 'assistant',
      'content': '<think>\nRayleigh scattering.\n</think>\n\nRayleigh scattering.'},
     {'role': 'user', 'content': 'And sunsets?'}],
    [{'role': 'user', 'content': 'Multi\nline\n\ncontent with <|im_end|> inside \u4f60\u597d'}],
    [{'role': 'user', 'content': '  leading and trailing spaces  '},
     {'role': 'assistant', 'content': 'ok'}],
]


def chat(chat_dir, chat_out, corpus, ref):
    from transformers import AutoTokenizer
    import transformers
    tk = AutoTokenizer.from_pretrained(chat_dir)
    n = 0
    with open(chat_out, 'w', encoding='utf-8') as out:
        for i, msgs in enumerate(CONVERSATIONS):
            for agp in (False, True):
                for think in (None, False, True):
                    kw = {} if think is None else {'enable_thinking': think}
                    text = tk.apply_chat_template(msgs, tokenize=False,
                                                  add_generation_prompt=agp, **kw)
                    out.write(json.dumps({'conversation': i, 'messages': msgs,
                                          'add_generation_prompt': agp,
                                          'enable_thinking': think, 'text': text,
                                          'ids': tk.encode(text, add_special_tokens=False)},
                                         ensure_ascii=True) + '\n')
                    n += 1
    same = total = 0
    with open(corpus, encoding='utf-8') as fc, open(ref, encoding='utf-8') as fr:
        for lc, lr in zip(fc, fr):
            total += 1
            same += tk.encode(json.loads(lc)['text']) == json.loads(lr)['ids']
    return {'transformers': transformers.__version__, 'cases': n,
            'autotokenizer_equal': same, 'of': total}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('tokenizer')
    ap.add_argument('corpus')
    ap.add_argument('out')
    ap.add_argument('--bench', action='append', default=[])
    ap.add_argument('--chat-dir')
    ap.add_argument('--chat-out')
    ap.add_argument('--repeat', type=int, default=3)
    a = ap.parse_args()

    tok = Tokenizer.from_file(a.tokenizer)
    split_q = pre_tokenizers.Split(Regex(QWEN2), behavior='isolated')
    split_l = pre_tokenizers.Split(Regex(LLAMA3), behavior='isolated')
    n = 0
    with open(a.corpus, encoding='utf-8') as f, open(a.out, 'w', encoding='utf-8') as out:
        for line in f:
            row = json.loads(line)
            text = row['text']
            enc = tok.encode(text)
            ids = enc.ids
            norm = tok.normalizer.normalize_str(text)
            rec = {
                'id': row['id'],
                'ids': ids,
                'decoded': tok.decode(ids, skip_special_tokens=False),
                'decoded_skip': tok.decode(ids, skip_special_tokens=True),
                'normalized': norm,
                'split': [p for p, _ in split_q.pre_tokenize_str(norm)],
                'split_llama3': [p for p, _ in split_l.pre_tokenize_str(norm)],
            }
            out.write(json.dumps(rec, ensure_ascii=True) + '\n')
            n += 1
    info = {'tokenizers': tokenizers.__version__, 'strings': n,
            'python': sys.version.split()[0]}
    info['bench'] = [bench(tok, path, a.repeat) for path in a.bench]
    if a.chat_dir:
        try:
            info['chat'] = chat(a.chat_dir, a.chat_out, a.corpus, a.out)
        except Exception as e:  # the tokenizer reference must not depend on this part
            info['chat'] = {'error': repr(e)}
    print(json.dumps(info))


if __name__ == '__main__':
    main()
