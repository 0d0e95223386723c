#!/usr/bin/env python3
"""nvfp4_ref.py - the transformers reference of an NVFP4 checkpoint: its weights
dequantised, then decoded by transformers in fp32 as tools/mkref.py decodes a fixture.

For a checkpoint sm70-quantize wrote (ModelOpt: weight uint8 [N, K/2] low nibble first,
weight_scale E4M3 [N, K/16], weight_scale_2 f32; compressed-tensors: weight_packed,
weight_scale, weight_global_scale = 1 / weight_scale_2), every quantized matrix becomes
f32 e2m1 * e4m3 * scale2 (scale2 = 1 / global_scale for compressed-tensors, the f32
reciprocal sm70 takes), in that order, as sm70's dequantised reference op computes it;
every other tensor is upcast to f32. The f32 checkpoint is written to a scratch directory
(config.json without the quantization declaration) and loaded with from_pretrained, so
that transformers maps the tensor names as it does for any checkpoint. The prompts and
lengths are those of the original fixture's reference.json (--like); the output has
mkref's reference.json format, which tests/unit/test_fixtures.c replays.

Usage (where torch and transformers are, the GPU machine):
  python3 tools/nvfp4_ref.py --ckpt tests/fixtures/qwen3-gqa2-d64-tied-nvfp4 \
      --like tests/fixtures/qwen3-gqa2-d64-tied [--device cuda]
Writes CKPT/reference.json.
"""
import argparse
import glob
import json
import os
import shutil
import sys
import tempfile

import torch
import transformers
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mkref  # noqa: E402  (its greedy decoding and router margins)

E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                     -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], dtype=torch.float32)


def dequant(codes, scale, scale2):
    """codes uint8 [N, K/2] (low nibble first), scale E4M3 [N, K/16], scale2 f32 -> f32."""
    n = codes.shape[0]
    lo = (codes & 0x0F).long()
    hi = (codes >> 4).long()
    vals = torch.stack([E2M1[lo], E2M1[hi]], dim=-1).reshape(n, -1)
    blocks = scale.to(torch.float32).repeat_interleave(16, dim=1)
    return (vals * blocks) * scale2


def dequant_checkpoint(src, dst):
    tensors = {}
    for f in sorted(glob.glob(os.path.join(src, "*.safetensors"))):
        tensors.update(load_file(f))
    out, n_q = {}, 0
    for name, t in tensors.items():
        if name.endswith((".weight_scale", ".weight_scale_2", ".weight_global_scale",
                          ".input_scale")):
            continue
        stem = None
        if name.endswith(".weight_packed"):
            stem = name[:-len(".weight_packed")]
            s2 = (1.0 / tensors[stem + ".weight_global_scale"].to(torch.float32)).reshape(())
        elif name.endswith(".weight") and t.dtype == torch.uint8:
            stem = name[:-len(".weight")]
            s2 = tensors[stem + ".weight_scale_2"].to(torch.float32).reshape(())
        if stem is None:
            out[name] = t.to(torch.float32)
            continue
        out[stem + ".weight"] = dequant(t, tensors[stem + ".weight_scale"], s2).contiguous()
        n_q += 1
    save_file(out, os.path.join(dst, "model.safetensors"))
    with open(os.path.join(src, "config.json")) as f:
        cfg = json.load(f)
    cfg.pop("quantization_config", None)
    cfg["torch_dtype"] = "float32"
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(cfg, f)
    shutil.copy(os.path.join(src, "generation_config.json"), dst)
    return n_q, len(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--like", required=True)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    with open(os.path.join(a.like, "reference.json")) as f:
        like = json.load(f)
    with open(os.path.join(a.ckpt, "generation_config.json")) as f:
        eos = json.load(f)["eos_token_id"]
    eos = eos if isinstance(eos, list) else [eos]
    scratch = tempfile.mkdtemp()
    try:
        n_q, n = dequant_checkpoint(a.ckpt, scratch)
        model = AutoModelForCausalLM.from_pretrained(scratch, dtype=torch.float32,
                                                     attn_implementation="eager")
    finally:
        shutil.rmtree(scratch)
    model = model.to(a.device).eval()
    margins = mkref.RouterMargins(model)
    if not margins.handles:
        margins = None
    cases = []
    with torch.no_grad():
        for c in like["cases"]:
            toks, tops, routes = mkref.greedy(model, c["prompt"], c["max_new_tokens"], eos,
                                              a.device, margins)
            margin = min(t[0]["logprob"] - t[1]["logprob"] for t in tops)
            same = sum(x == y for x, y in zip(toks, c["tokens"]))
            print(f"{a.ckpt}: prompt {len(c['prompt']):5d} -> {len(toks)} tokens, min "
                  f"top1-top2 margin {margin:.4f}; {same} of them equal the bf16 "
                  f"model's")
            case = {"prompt": c["prompt"], "max_new_tokens": c["max_new_tokens"],
                    "tokens": toks, "top_logprobs": tops, "min_margin": margin}
            if margins is not None:
                case["router_margins"] = routes
            cases.append(case)
    ref = {"fixture": os.path.basename(os.path.normpath(a.ckpt)),
           "transformers": transformers.__version__, "torch": torch.__version__,
           "compute": "float32 eager; NVFP4 weights dequantised to f32 (e2m1 * e4m3 * "
                      "scale2), %d of %d tensors" % (n_q, n),
           "top_n": mkref.TOP_N, "cases": cases}
    with open(os.path.join(a.ckpt, "reference.json"), "w") as f:
        json.dump(ref, f)


if __name__ == "__main__":
    main()
