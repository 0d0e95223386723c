#!/usr/bin/env python3
"""Baseline for `sm70-bench decode`: transformers decoding a randomly initialised model
(same config.json) with a static KV cache (hybrid models: their own dynamic cache, which
holds the DeltaNet state), fp16, on the same GPU.

Method: for each batch size B and context C, prefill B prompts of C tokens into a
StaticCache, then time `--steps` greedy decode steps (one forward of B tokens each, argmax
on the GPU, CUDA-synchronised at the end). Prints tokens/s in the table format of
sm70-bench decode. --compile runs the decode steps through torch.compile(mode=
"reduce-overhead"), which captures them in CUDA graphs over the static cache (the strong
baseline; the prefill stays eager); its first steps compile and are not timed.
Non-goals: sampling cost.

Usage: python3 tools/bench_transformers.py -m tools/bench/qwen3-8b --batch 1,8,16 --ctx 1024,16384 [--compile]
"""
import argparse
import json
import os
import time

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM, StaticCache


def hybrid(cfg):
    """Whether the model has recurrent (linear-attention) layers, which a StaticCache does
    not hold: those run with the model's own dynamic cache."""
    text = getattr(cfg, "text_config", None) or cfg
    return "linear_attention" in (getattr(text, "layer_types", None) or [])


def make_cache(cfg, batch, length):
    if hybrid(cfg):
        return None
    for kw in (dict(config=cfg, max_batch_size=batch, max_cache_len=length, device="cuda",
                    dtype=torch.float16),
               dict(config=cfg, max_cache_len=length)):
        try:
            return StaticCache(**kw)
        except TypeError:
            continue
    raise RuntimeError("cannot construct a StaticCache with this transformers version")


@torch.no_grad()
def run(model, step_fn, cfg, batch, ctx, steps, warm):
    cache = make_cache(cfg, batch, ctx + steps + warm + 8)
    ids = torch.randint(0, cfg.vocab_size, (batch, ctx), device="cuda")
    pos = torch.arange(ctx, device="cuda")
    out = model(input_ids=ids, past_key_values=cache, cache_position=pos, use_cache=True,
                logits_to_keep=1)
    tok = out.logits[:, -1].argmax(-1, keepdim=True)
    cache = out.past_key_values  # the model's own cache when it made one (hybrid)
    del out
    for i in range(warm):  # warm-up decode steps (with --compile: compiling, capturing)
        p = torch.tensor([ctx + i], device="cuda")
        out = step_fn(input_ids=tok, past_key_values=cache, cache_position=p, use_cache=True)
        tok, cache = out.logits[:, -1].argmax(-1, keepdim=True), out.past_key_values
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(steps):
        p = torch.tensor([ctx + warm + i], device="cuda")
        out = step_fn(input_ids=tok, past_key_values=cache, cache_position=p, use_cache=True)
        tok, cache = out.logits[:, -1].argmax(-1, keepdim=True), out.past_key_values
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    del cache
    torch.cuda.empty_cache()
    return batch * steps / dt, dt / steps


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--batch", default="1,8,16")
    ap.add_argument("--ctx", default="1024,16384")
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--compile", action="store_true",
                    help='decode steps through torch.compile(mode="reduce-overhead")')
    a = ap.parse_args()
    cfg = AutoConfig.from_pretrained(a.model)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float16,
                                                 attn_implementation="sdpa").eval()
    step_fn, warm = model, 3
    if a.compile:
        step_fn, warm = torch.compile(model, mode="reduce-overhead"), 8
    print("transformers %s, torch %s, %s: %s cache, fp16, sdpa, %s, %d timed steps" %
          (transformers.__version__, torch.__version__, os.path.basename(a.model.rstrip("/")),
           "dynamic" if hybrid(cfg) else "static",
           "torch.compile reduce-overhead" if a.compile else "eager", a.steps))
    print("%6s %7s %12s %12s" % ("batch", "ctx", "tokens/s", "step ms"))
    for b in map(int, a.batch.split(",")):
        for c in map(int, a.ctx.split(",")):
            tps, step = run(model, step_fn, cfg, b, c, a.steps, warm)
            print("%6d %7d %12.1f %12.3f" % (b, c, tps, step * 1e3), flush=True)


if __name__ == "__main__":
    main()
