#!/usr/bin/env python3
"""The demo model's references, made on the GPU machine with transformers and tokenizers.

- --tokenizer-out: for each line of --strings, what tokenizers gives with the demo
  tokenizer.json: {"ids", "decoded"} (special tokens kept); it also counts the strings on
  which transformers' AutoTokenizer agrees, and that the chat template renders.
- --greedy-out: greedy continuations of a few English prompts from the saved checkpoint
  reloaded in fp32 (eager attention, TF32 off), with the top logprobs of every step and the
  smallest top-1/top-2 gap (how near a tie the case comes), as tools/mkref.py records them.
- --samples-out: the prompts continued greedily and sampled (temperature 0.8, top-k 40,
  top-p 0.95), as text, to read.

Usage: python3 tools/demo_model/reference.py --model DIR --tokenizer-dir DIR --strings FILE
           --tokenizer-out FILE --greedy-out FILE --samples-out FILE
"""
import argparse
import json

import torch
import transformers
from tokenizers import Tokenizer
from transformers import AutoTokenizer, Qwen3ForCausalLM

PROMPTS = [
    "It is a truth universally acknowledged, that",
    "Emma Woodhouse, handsome, clever, and rich,",
    "\"My dear Mr. Bennet,\" said his lady to him one day,",
    "The weather was fine, and",
    "Captain Wentworth",
    "She had never",
]
NEW_TOKENS, TOP_N = 32, 5


def greedy(model, prompt, eos):
    past, out = None, model(input_ids=torch.tensor([prompt], device="cuda"), use_cache=True)
    tokens, tops = [], []
    for _ in range(NEW_TOKENS):
        lp = torch.log_softmax(out.logits[0, -1].double(), dim=-1)
        vals, idx = torch.topk(lp, TOP_N)
        tok = int(idx[0])
        tokens.append(tok)
        tops.append([{"id": int(i), "logprob": float(v)} for v, i in zip(vals, idx)])
        if tok in eos:
            break
        past = out.past_key_values
        out = model(input_ids=torch.tensor([[tok]], device="cuda"), past_key_values=past,
                    use_cache=True)
    return tokens, tops


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for k in ("model", "tokenizer-dir", "strings", "tokenizer-out", "greedy-out",
              "samples-out"):
        ap.add_argument("--" + k, required=True)
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False

    tok = Tokenizer.from_file(a.tokenizer_dir + "/tokenizer.json")
    strings = [json.loads(l) for l in open(a.strings, encoding="utf-8")]
    refs = []
    with open(a.tokenizer_out, "w", encoding="utf-8") as f:
        for s in strings:
            ids = tok.encode(s["text"]).ids
            refs.append(ids)
            f.write(json.dumps({"ids": ids, "decoded": tok.decode(ids, skip_special_tokens=False)},
                               ensure_ascii=False) + "\n")
    print("tokenizer: %d strings encoded" % len(strings))
    try:                                    # a failure here must not cost the references
        auto = AutoTokenizer.from_pretrained(a.tokenizer_dir)
        same = sum(auto.encode(s["text"], add_special_tokens=False) == r
                   for s, r in zip(strings, refs))
        print("AutoTokenizer agrees with tokenizers on %d of %d" % (same, len(strings)))
        chat = auto.apply_chat_template([{"role": "user", "content": "Who is Mr. Darcy?"}],
                                        tokenize=False, add_generation_prompt=True,
                                        enable_thinking=False)
        print("chat template renders: %r -> %d ids" % (chat, len(tok.encode(chat).ids)))
    except Exception as e:                  # noqa: BLE001
        print("AutoTokenizer failed: %r" % e)

    gen = json.load(open(a.model + "/generation_config.json"))
    eos = gen["eos_token_id"]
    model = Qwen3ForCausalLM.from_pretrained(a.model, dtype=torch.float32,
                                             attn_implementation="eager").cuda().eval()
    cases = []
    with torch.no_grad():
        for text in PROMPTS:
            prompt = tok.encode(text).ids
            tokens, tops = greedy(model, prompt, eos)
            margin = min(t[0]["logprob"] - t[1]["logprob"] for t in tops)
            cases.append({"text": text, "prompt": prompt, "max_new_tokens": NEW_TOKENS,
                          "tokens": tokens, "top_logprobs": tops, "min_margin": margin,
                          "decoded": tok.decode(tokens)})
            print("greedy %r -> %r (min margin %.4f)" % (text, cases[-1]["decoded"], margin))
    with open(a.greedy_out, "w") as f:
        json.dump({"model": "models/demo", "transformers": transformers.__version__,
                   "torch": torch.__version__, "compute": "float32 eager", "top_n": TOP_N,
                   "cases": cases}, f)

    with open(a.samples_out, "w", encoding="utf-8") as f, torch.no_grad():
        for i, text in enumerate(PROMPTS):
            ids = torch.tensor([tok.encode(text).ids], device="cuda")
            g = model.generate(ids, max_new_tokens=80, do_sample=False)
            torch.manual_seed(i)
            s = model.generate(ids, max_new_tokens=80, do_sample=True, temperature=0.8,
                               top_k=40, top_p=0.95)
            block = "== %s\n-- greedy: %s\n-- sampled: %s\n\n" % (
                text, tok.decode(g[0, ids.size(1):].tolist()),
                tok.decode(s[0, ids.size(1):].tolist()))
            f.write(block)
            print(block, end="")


if __name__ == "__main__":
    main()
