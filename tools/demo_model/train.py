#!/usr/bin/env python3
"""Trains the demo model: a small qwen3 (Qwen3ForCausalLM, tied embeddings) on the text
that prepare.py made, on one GPU, in a few minutes.

The data is small (about 0.9M tokens), so the question is how many passes over it: the
script trains one model per entry of --epochs (each a full warm-up + cosine schedule, same
seed) and keeps the one with the lowest loss on held-out text (every 40th 1,024-token block
of the stream, never trained on). The kept model is written, in bf16, as a Hugging Face
checkpoint (config.json, model.safetensors, generation_config.json, with --tokenizer-dir
the tokenizer files, and training.json: the runs and their losses) as
soon as it is the best so far, so a run cut short still leaves a model. --seconds bounds
the whole run: a schedule that would pass it is shortened to fit.

Usage: python3 tools/demo_model/train.py --data DATA_DIR [--tokenizer-dir DIR] --out DIR
           [--epochs 6,8,10,12] [--seconds 300]
"""
import argparse
import json
import math
import os
import shutil
import time

import torch
import torch.nn.functional as F
from transformers import Qwen3Config, Qwen3ForCausalLM

# The shape: about 9M parameters, 18 MB in bf16 with the 16.5K vocabulary.
SHAPE = dict(hidden_size=256, intermediate_size=768, num_hidden_layers=6,
             num_attention_heads=4, num_key_value_heads=2, head_dim=64,
             tie_word_embeddings=True, rope_theta=10000.0, rms_norm_eps=1e-6,
             max_position_embeddings=2048, initializer_range=0.02)
SEQ, BATCH = 512, 32
VAL_EVERY_BLOCK, BLOCK = 40, 1024
LR, MIN_LR_FRAC, WARMUP, WD = 2e-3, 0.1, 100, 0.1


def load_stream(data_dir, device):
    with open(os.path.join(data_dir, "meta.json")) as f:
        meta = json.load(f)
    raw = open(os.path.join(data_dir, "tokens.u16"), "rb").read()
    ids = torch.frombuffer(bytearray(raw), dtype=torch.int16).to(torch.int64) & 0xFFFF
    if ids.numel() != meta["tokens"]:
        raise SystemExit("tokens.u16 holds %d tokens, meta.json says %d" %
                         (ids.numel(), meta["tokens"]))
    blocks = ids.split(BLOCK)
    train = torch.cat([b for i, b in enumerate(blocks) if i % VAL_EVERY_BLOCK != 7])
    val = torch.cat([b for i, b in enumerate(blocks) if i % VAL_EVERY_BLOCK == 7])
    return meta, train.to(device), val.to(device)


def val_loss(model, val):
    model.eval()
    n = (val.numel() - 1) // SEQ
    x = val[:n * SEQ].view(n, SEQ)
    y = val[1:n * SEQ + 1].view(n, SEQ)
    tot = 0.0
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        for i in range(0, n, 16):
            logits = model(input_ids=x[i:i + 16]).logits.float()
            tot += F.cross_entropy(logits.reshape(-1, logits.size(-1)), y[i:i + 16].reshape(-1),
                                   reduction="sum").item()
    model.train()
    return tot / (n * SEQ)


def config(meta):
    eos = [meta["im_end_id"], meta["endoftext_id"]]
    return Qwen3Config(vocab_size=meta["vocab_size"], bos_token_id=None,
                       eos_token_id=eos, pad_token_id=meta["endoftext_id"], **SHAPE)


def save(model, meta, tok_dir, out):
    tmp = out + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    m = Qwen3ForCausalLM(model.config)
    m.load_state_dict(model.state_dict())
    m.to(torch.bfloat16).save_pretrained(tmp, safe_serialization=True)
    with open(os.path.join(tmp, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": [meta["im_end_id"], meta["endoftext_id"]],
                   "pad_token_id": meta["endoftext_id"], "do_sample": True,
                   "temperature": 0.8, "top_k": 40, "top_p": 0.95}, f, indent=2)
        f.write("\n")
    if tok_dir:
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(os.path.join(tok_dir, name), tmp)
    shutil.rmtree(out, ignore_errors=True)
    os.rename(tmp, out)


def train_one(meta, train, val, epochs, deadline, log):
    torch.manual_seed(1234)
    model = Qwen3ForCausalLM(config(meta)).cuda()
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    rest = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WD},
                             {"params": rest, "weight_decay": 0.0}],
                            lr=LR, betas=(0.9, 0.95), fused=True)
    steps = int(epochs * train.numel() / (SEQ * BATCH))
    gen = torch.Generator(device="cuda").manual_seed(99)
    t0 = time.time()
    step = 0
    while step < steps:
        if step == 20:                       # fit the schedule into the time left
            rate = 20 / (time.time() - t0)
            fit = int(20 + rate * (deadline - time.time() - 30))
            if fit < steps:
                log("  %d steps do not fit in the time left; shortened to %d" % (steps, fit))
                steps = max(fit, 21)
        lr = LR * min(1.0, (step + 1) / WARMUP)
        if step >= WARMUP:
            frac = (step - WARMUP) / max(1, steps - WARMUP)
            lr = LR * (MIN_LR_FRAC + (1 - MIN_LR_FRAC) * 0.5 * (1 + math.cos(math.pi * frac)))
        for g in opt.param_groups:
            g["lr"] = lr
        start = torch.randint(0, train.numel() - SEQ - 1, (BATCH,), device="cuda",
                              generator=gen)
        idx = start[:, None] + torch.arange(SEQ + 1, device="cuda")[None, :]
        chunk = train[idx]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(input_ids=chunk[:, :-1]).logits
        loss = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)),
                               chunk[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step % 100 == 0 or step == steps:
            log("  step %5d/%d  lr %.2e  train loss %.3f  %.0f tokens/s" %
                (step, steps, lr, loss.item(), step * SEQ * BATCH / (time.time() - t0)))
    vl = val_loss(model, val)
    return model, vl, loss.item(), step, time.time() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--tokenizer-dir", help="copy its tokenizer files into the checkpoint")
    ap.add_argument("--out", required=True)
    ap.add_argument("--epochs", default="6,8,10,12")
    ap.add_argument("--seconds", type=float, default=300)
    ap.add_argument("--log", default=None)
    a = ap.parse_args()
    t_start = time.time()
    deadline = t_start + a.seconds
    logf = open(a.log, "a") if a.log else None

    def log(s):
        print(s, flush=True)
        if logf:
            logf.write(s + "\n")
            logf.flush()

    torch.backends.cuda.matmul.allow_tf32 = True
    meta, train, val = load_stream(a.data, "cuda")
    n_params = sum(p.numel() for p in Qwen3ForCausalLM(config(meta)).parameters())
    log("data: %d train / %d held-out tokens, vocab %d; model %.2fM parameters" %
        (train.numel(), val.numel(), meta["vocab_size"], n_params / 1e6))
    best = None
    results = []
    for ep in [float(e) for e in a.epochs.split(",")]:
        if time.time() > deadline - 20:
            log("no time left for %g epochs" % ep)
            break
        log("training %g epochs (batch %d x %d tokens)" % (ep, BATCH, SEQ))
        model, vl, tl, steps, secs = train_one(meta, train, val, ep, deadline, log)
        log("  %g epochs: %d steps in %.0f s, last train loss %.3f, held-out loss %.3f "
            "(perplexity %.1f)" % (ep, steps, secs, tl, vl, math.exp(vl)))
        results.append({"epochs": ep, "steps": steps, "seconds": round(secs, 1),
                        "train_loss": round(tl, 4), "heldout_loss": round(vl, 4)})
        if best is None or vl < best["heldout_loss"]:
            best = results[-1]
            save(model, meta, a.tokenizer_dir, a.out)
            log("  saved as the best so far to %s" % a.out)
        del model
        torch.cuda.empty_cache()
    summary = {"shape": SHAPE, "seq": SEQ, "batch": BATCH, "lr": LR, "parameters": n_params,
               "train_tokens": train.numel(), "heldout_tokens": val.numel(),
               "runs": results, "kept": best, "torch": torch.__version__,
               "gpu": torch.cuda.get_device_name(0),
               "wall_seconds": round(time.time() - t_start, 1)}
    with open(os.path.join(a.out, "training.json"), "w") as f:
        json.dump(summary, f, indent=2)
        f.write("\n")
    log(json.dumps(summary))


if __name__ == "__main__":
    main()
