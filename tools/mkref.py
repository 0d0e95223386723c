#!/usr/bin/env python3
"""Builds tiny random Qwen checkpoints and their transformers reference continuations.

Runs where torch and transformers are installed (the GPU machine). For each fixture it
writes a Hugging Face checkpoint directory (config.json, generation_config.json,
safetensors weights) and reference.json: the prompts, transformers' greedy continuation
computed in fp32 from the stored (bf16/fp16-rounded) weights, and the top logprobs of
every step. The C tests replay these prompts and compare.

Families are keyed by model_type: the config comes from AutoConfig.for_model and the
model from AutoModelForCausalLM, or AutoModelForImageTextToText for the vision-language
layouts (their text weights nest under model.language_model.; the reference runs text
only). Hybrid fixtures (qwen3_5, qwen3_next) also store, for their first prompt, the
hidden state after every layer (hidden.json), which is what a layer-by-layer comparison
needs when a fixture disagrees.

Non-goals: tokenizers (fixtures are token ids only), sampling references.

Usage: python3 tools/mkref.py [--out tests/fixtures] [--only NAME] [--device cuda|cpu]
"""
import argparse
import json
import os
import re
import shutil

import torch
import transformers
from transformers import (AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText)

TOP_N = 10

# name -> (config kwargs, storage dtype, shard size or None, prompt lengths, new tokens)
FIXTURES = {
    "qwen3-gqa2-d64-tied": dict(
        config=dict(vocab_size=512, hidden_size=128, intermediate_size=320,
                    num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                    head_dim=64, tie_word_embeddings=True, rope_theta=10000.0,
                    rms_norm_eps=1e-6, max_position_embeddings=4096,
                    initializer_range=0.08),
        dtype=torch.bfloat16, shard=None,
        prompts=[1, 5, 17, 64, 200], new_tokens=24, eos=[511]),
    "qwen3-gqa6-d256-long": dict(
        config=dict(vocab_size=1024, hidden_size=192, intermediate_size=384,
                    num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=1,
                    head_dim=256, tie_word_embeddings=False, rope_theta=1000000.0,
                    rms_norm_eps=1e-6, max_position_embeddings=8192,
                    initializer_range=0.06),
        dtype=torch.bfloat16, shard="1MB",
        prompts=[1200, 37, 530], new_tokens=16, eos=[1020, 1021]),
    "qwen3-mha-d32-f16": dict(
        config=dict(vocab_size=384, hidden_size=96, intermediate_size=192,
                    num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
                    head_dim=32, tie_word_embeddings=False, rope_theta=500000.0,
                    rms_norm_eps=1e-5, max_position_embeddings=2048,
                    initializer_range=0.1),
        dtype=torch.float16, shard=None,
        prompts=[3, 48, 129], new_tokens=20, eos=[383]),
    # Hybrid: Gated DeltaNet layers (2 key / 4 value heads, k_dim 32 != v_dim 48) and gated
    # full attention (GQA-6, head_dim 256, a quarter of it rotated). The 700-token prompt
    # spans eleven 64-token chunks of the chunked delta rule.
    "qwen3_5-gqa6-d256-hybrid": dict(
        model_type="qwen3_5_text",
        config=dict(vocab_size=512, hidden_size=128, intermediate_size=256,
                    num_hidden_layers=5, num_attention_heads=6, num_key_value_heads=1,
                    head_dim=256, linear_num_key_heads=2, linear_num_value_heads=4,
                    linear_key_head_dim=32, linear_value_head_dim=48,
                    linear_conv_kernel_dim=4,
                    layer_types=["linear_attention", "full_attention", "linear_attention",
                                 "linear_attention", "full_attention"],
                    tie_word_embeddings=False, rms_norm_eps=1e-6,
                    rope_parameters=dict(rope_type="default", rope_theta=1000000.0,
                                         partial_rotary_factor=0.25),
                    max_position_embeddings=4096, initializer_range=0.08),
        dtype=torch.bfloat16, shard=None,
        prompts=[1, 7, 64, 65, 200, 700], new_tokens=16, eos=[510]),
    # The vision-language layout of the same family: model.language_model.*, a (tiny)
    # model.visual.* the engine must ignore, tied embeddings, three GDN value heads per
    # key head.
    "qwen3_5-vl-tied": dict(
        model_type="qwen3_5", vl=True,
        config=dict(
            text_config=dict(vocab_size=384, hidden_size=96, intermediate_size=192,
                             num_hidden_layers=4, num_attention_heads=4,
                             num_key_value_heads=2, head_dim=64, linear_num_key_heads=1,
                             linear_num_value_heads=3, linear_key_head_dim=32,
                             linear_value_head_dim=32, linear_conv_kernel_dim=4,
                             tie_word_embeddings=True, rms_norm_eps=1e-6,
                             rope_parameters=dict(rope_type="default", rope_theta=10000000.0,
                                                  partial_rotary_factor=0.25,
                                                  mrope_section=[4, 2, 2]),
                             max_position_embeddings=2048, initializer_range=0.08),
            vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2,
                               out_hidden_size=96, patch_size=8, temporal_patch_size=2,
                               spatial_merge_size=2, num_position_embeddings=16),
            tie_word_embeddings=True),
        dtype=torch.bfloat16, shard=None,
        prompts=[5, 90, 150], new_tokens=16, eos=[383]),
    # qwen3_next's attention/GDN stack with its fused, per-key-head interleaved projections
    # (in_proj_qkvz, in_proj_ba) and dense MLPs on every layer (mlp_only_layers).
    "qwen3_next-dense-fused": dict(
        model_type="qwen3_next",
        config=dict(vocab_size=448, hidden_size=128, intermediate_size=224,
                    num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                    head_dim=64, linear_num_key_heads=2, linear_num_value_heads=4,
                    linear_key_head_dim=32, linear_value_head_dim=32,
                    linear_conv_kernel_dim=4, mlp_only_layers=[0, 1, 2, 3],
                    num_experts=4, num_experts_per_tok=2,
                    tie_word_embeddings=False, rms_norm_eps=1e-6,
                    rope_parameters=dict(rope_type="default", rope_theta=1000000.0,
                                         partial_rotary_factor=0.25),
                    max_position_embeddings=2048, initializer_range=0.08),
        dtype=torch.bfloat16, shard=None,
        prompts=[3, 130], new_tokens=16, eos=[447]),
    # Mixture of experts: 8 experts, 2 per token, renormalised; layer 1 dense
    # (mlp_only_layers); one tensor per expert (the layout transformers saves).
    "qwen3_moe-e8k2": dict(
        model_type="qwen3_moe",
        config=dict(vocab_size=512, hidden_size=128, intermediate_size=256,
                    moe_intermediate_size=64, num_experts=8, num_experts_per_tok=2,
                    norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[1],
                    num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                    head_dim=64, tie_word_embeddings=False, rms_norm_eps=1e-6,
                    rope_parameters=dict(rope_type="default", rope_theta=1000000.0),
                    max_position_embeddings=2048, initializer_range=0.08),
        dtype=torch.bfloat16, shard=None,
        prompts=[4, 33, 150], new_tokens=16, eos=[511]),
    # The hybrid MoE family: DeltaNet + gated attention, 16 experts / 4 per token plus a
    # gated shared expert; experts stored fused (gate_up_proj [E, 2I, H], down_proj).
    "qwen3_5_moe-e16k4-shared": dict(
        model_type="qwen3_5_moe_text", fused_experts=True,
        config=dict(vocab_size=384, hidden_size=96, moe_intermediate_size=48,
                    shared_expert_intermediate_size=80, num_experts=16,
                    num_experts_per_tok=4, num_hidden_layers=4, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=64, linear_num_key_heads=2,
                    linear_num_value_heads=4, linear_key_head_dim=32,
                    linear_value_head_dim=32, linear_conv_kernel_dim=4,
                    tie_word_embeddings=False, rms_norm_eps=1e-6,
                    rope_parameters=dict(rope_type="default", rope_theta=10000000.0,
                                         partial_rotary_factor=0.25),
                    max_position_embeddings=2048, initializer_range=0.08),
        dtype=torch.bfloat16, shard=None,
        prompts=[6, 100], new_tokens=16, eos=[383]),
    # qwen3_next with its sparse layers: 16 experts / 3 per token, not renormalised
    # (norm_topk_prob false), a shared expert, one dense layer.
    "qwen3_next-e16k3": dict(
        model_type="qwen3_next",
        config=dict(vocab_size=448, hidden_size=128, intermediate_size=192,
                    moe_intermediate_size=40, shared_expert_intermediate_size=64,
                    num_experts=16, num_experts_per_tok=3, norm_topk_prob=False,
                    decoder_sparse_step=1, mlp_only_layers=[2], num_hidden_layers=4,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                    linear_num_key_heads=2, linear_num_value_heads=4,
                    linear_key_head_dim=32, linear_value_head_dim=32,
                    linear_conv_kernel_dim=4, tie_word_embeddings=False, rms_norm_eps=1e-6,
                    rope_parameters=dict(rope_type="default", rope_theta=1000000.0,
                                         partial_rotary_factor=0.25),
                    max_position_embeddings=2048, initializer_range=0.08),
        dtype=torch.bfloat16, shard=None,
        prompts=[5, 120], new_tokens=16, eos=[447]),
    # The flagship family: hyper-connections (4 streams), QSA sparse attention with an
    # indexer (2 heads of 32, budget 16 tokens in blocks of 4: four blocks plus the tail),
    # per-layer n-gram embeddings (PLE) on two DeltaNet layers (one-indexed ids 1 and 3),
    # MoE 8 experts / 2 per token with a shared expert. The 150-token prompts are far past
    # the QSA budget, and EOS sits inside them (eos_at) so the n-gram window resets.
    "qwen4_exp-hc4-qsa-ple": dict(
        model_type="qwen4_exp_text",
        config=dict(vocab_size=512, hidden_size=64, moe_intermediate_size=32,
                    shared_expert_intermediate_size=48, num_experts=8,
                    num_experts_per_tok=2, num_hidden_layers=5, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=64, linear_num_key_heads=2,
                    linear_num_value_heads=4, linear_key_head_dim=32,
                    linear_value_head_dim=16, linear_conv_kernel_dim=4,
                    layer_types=["linear_attention", "full_attention", "linear_attention",
                                 "linear_attention", "full_attention"],
                    hc_count=4, hc_lowrank=16, ple_layer_ids=[1, 3], ple_embed_dim=64,
                    ple_conv_kernel_size=4, ngram_size=3, heads_per_ngram=2,
                    ngram_vocab_size_base=500, make_ngram_vocab_size_divisible_by=16,
                    split_ngram_parts=8, indexer_n_heads=2, indexer_kv_heads=1,
                    indexer_head_dim=32, indexer_budget=16, indexer_compress_ratio=4,
                    tie_word_embeddings=False, rms_norm_eps=1e-6,
                    rope_parameters=dict(rope_type="default", rope_theta=1000000.0,
                                         partial_rotary_factor=0.25),
                    max_position_embeddings=2048, initializer_range=0.08),
        dtype=torch.bfloat16, shard=None,
        prompts=[2, 9, 40, 150, 150], eos_at=[[], [4], [7, 8, 30], [20, 90], []],
        new_tokens=16, eos=[511]),
    # qwen4_exp's other DeltaNet output gate: output_gate_type "sigmoid" (the norm's gate
    # is sigmoid(z), not silu(z)); a DeltaNet and a QSA layer, no PLE.
    "qwen4_exp-sigmoid-gate": dict(
        model_type="qwen4_exp_text",
        config=dict(vocab_size=384, hidden_size=64, moe_intermediate_size=32,
                    shared_expert_intermediate_size=48, num_experts=8,
                    num_experts_per_tok=2, num_hidden_layers=3, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=64, linear_num_key_heads=2,
                    linear_num_value_heads=4, linear_key_head_dim=32,
                    linear_value_head_dim=16, linear_conv_kernel_dim=4,
                    layer_types=["linear_attention", "full_attention", "linear_attention"],
                    output_gate_type="sigmoid", hc_count=4, hc_lowrank=16, ple_layer_ids=[],
                    indexer_n_heads=2, indexer_kv_heads=1, indexer_head_dim=32,
                    indexer_budget=16, indexer_compress_ratio=4, tie_word_embeddings=True,
                    rms_norm_eps=1e-6,
                    rope_parameters=dict(rope_type="default", rope_theta=1000000.0,
                                         partial_rotary_factor=0.25),
                    max_position_embeddings=1024, initializer_range=0.08),
        dtype=torch.bfloat16, shard=None,
        prompts=[3, 40, 150], new_tokens=16, eos=[383]),
}

# Norms whose weight is centred on zero (the layer computes x * (1 + w)).
ZERO_CENTRED = ("qwen3_5_text", "qwen3_5", "qwen3_next", "qwen3_5_moe_text", "qwen3_5_moe",
                "qwen4_exp_text", "qwen4_exp")


def fuse_experts(path):
    """Rewrites the per-expert tensors transformers saves (mlp.experts.<e>.{gate,up,down}_
    proj.weight) as the fused layout (mlp.experts.gate_up_proj [E, 2I, H], gate first;
    mlp.experts.down_proj [E, H, I]) some published checkpoints use, so the loader's
    fused path has a fixture too."""
    from safetensors.torch import load_file, save_file
    f = os.path.join(path, "model.safetensors")
    t = load_file(f)
    out, experts = {}, {}
    for name, v in t.items():
        m = re.match(r"(.*mlp\.experts\.)(\d+)\.(gate|up|down)_proj\.weight$", name)
        if m:
            experts.setdefault(m.group(1), {})[(int(m.group(2)), m.group(3))] = v
        else:
            out[name] = v
    for base, parts in experts.items():
        n = 1 + max(e for e, _ in parts)
        out[base + "gate_up_proj"] = torch.stack(
            [torch.cat([parts[(e, "gate")], parts[(e, "up")]]) for e in range(n)]).contiguous()
        out[base + "down_proj"] = torch.stack([parts[(e, "down")] for e in range(n)]).contiguous()
    save_file(out, f, metadata={"format": "pt"})


def perturb_norms(model, gen, zero_centred):
    """Random RMSNorm weights (an effective scale around 1) so a missing or misplaced norm
    changes the output. Zero-centred norms get weights around 0, the plain gated norm of
    the DeltaNet output around 1. The DeltaNet decay parameters are redrawn so the state
    lives for tens of tokens (transformers' initial A up to 16 forgets it at once)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or re.search(r"\.norm_(key|query|conv)\.weight$|"
                                                          r"_layernorm\.weight$", name):
                plain = not zero_centred or name.endswith("linear_attn.norm.weight")
                p.copy_((1.0 if plain else 0.0) + 0.25 * torch.randn(p.shape, generator=gen))
            elif name.endswith("A_log"):
                p.copy_(torch.empty(p.shape).uniform_(0.02, 0.8, generator=gen).log())
            elif name.endswith("dt_bias"):
                p.copy_(0.5 * torch.randn(p.shape, generator=gen))
            elif name.endswith("ple.conv1d.weight"):
                # transformers starts the PLE convolution at zero; a zero tap would hide it
                p.copy_(0.3 * torch.randn(p.shape, generator=gen))


def model_classes(spec):
    return AutoModelForImageTextToText if spec.get("vl") else AutoModelForCausalLM


def layer_hidden(model, prompt, device):
    """The hidden state after every layer for the prompt's tokens (hidden.json)."""
    out = model(input_ids=torch.tensor([prompt], device=device), output_hidden_states=True)
    hs = out.hidden_states
    return [h[0].float().cpu().tolist() for h in hs]


class RouterMargins:
    """Forward hooks on the MoE routers: for each forward, the smallest gap between the
    k-th and the (k+1)-th routing probability over every MoE layer and token. A GPU run in
    fp16 may route such a token differently (the references are fp32), so the C tests
    forgive a divergence that follows a forward whose margin was that small."""

    def __init__(self, model):
        self.cur = None
        self.handles = [m.register_forward_hook(self.hook) for m in model.modules()
                        if type(m).__name__.endswith("TopKRouter")]

    def hook(self, module, inputs, output):
        logits = output[0] if isinstance(output, tuple) else output
        p = torch.softmax(logits.float(), dim=-1)
        k = module.top_k
        top = torch.topk(p, k + 1, dim=-1).values
        gap = float((top[..., k - 1] - top[..., k]).min())
        self.cur = gap if self.cur is None else min(self.cur, gap)

    def take(self):
        g, self.cur = self.cur, None
        return g


def greedy(model, prompt, new_tokens, eos, device, margins=None):
    """fp32 greedy decoding with a KV cache; returns tokens, the top logprobs per step and,
    for MoE models, the router margin of each forward (None otherwise)."""
    ids = torch.tensor([prompt], device=device)
    routes = []
    out = model(input_ids=ids, use_cache=True)
    past = out.past_key_values
    logits = out.logits[0, -1].float()
    tokens, tops = [], []
    for _ in range(new_tokens):
        lp = torch.log_softmax(logits.double(), dim=-1)
        vals, idx = torch.topk(lp, TOP_N)
        tok = int(idx[0])
        tokens.append(tok)
        tops.append([{"id": int(i), "logprob": float(v)} for v, i in zip(vals, idx)])
        if margins is not None:
            routes.append(margins.take())
        if tok in eos:
            break
        out = model(input_ids=torch.tensor([[tok]], device=device), past_key_values=past,
                    use_cache=True)
        past = out.past_key_values
        logits = out.logits[0, -1].float()
    return tokens, tops, routes


def build(name, spec, outdir, device):
    seed = sum(map(ord, name))
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    mtype = spec.get("model_type", "qwen3")
    cfg = AutoConfig.for_model(mtype, **spec["config"], bos_token_id=0,
                               eos_token_id=spec["eos"][0])
    if spec.get("vl"):
        cfg.text_config.bos_token_id = 0
        cfg.text_config.eos_token_id = spec["eos"][0]
    cls = model_classes(spec)
    model = cls.from_config(cfg).float()
    perturb_norms(model, gen, mtype in ZERO_CENTRED)
    # Round the weights to the storage dtype first, so the reference sees exactly the
    # numbers the checkpoint holds.
    model = model.to(spec["dtype"])
    path = os.path.join(outdir, name)
    shutil.rmtree(path, ignore_errors=True)
    kw = {"max_shard_size": spec["shard"]} if spec["shard"] else {}
    model.save_pretrained(path, safe_serialization=True, **kw)
    with open(os.path.join(path, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 0, "eos_token_id": spec["eos"]}, f, indent=2)

    if spec.get("fused_experts"):
        fuse_experts(path)
    # The reference loads the checkpoint as a user would, upcast to fp32. (Casting the
    # in-memory model back with .float() would not do: .to(bf16) also rounds the RoPE
    # inv_freq buffer, and .float() does not restore it.)
    del model
    model = cls.from_pretrained(path, dtype=torch.float32, attn_implementation="eager")
    model = model.to(device).eval()
    vocab = cfg.text_config.vocab_size if spec.get("vl") else cfg.vocab_size
    cases = []
    margins = RouterMargins(model)
    if not margins.handles:
        margins = None
    with torch.no_grad():
        for n in spec["prompts"]:
            prompt = torch.randint(0, vocab - 8, (n,), generator=gen).tolist()
            for at in (spec.get("eos_at") or [[]] * len(spec["prompts"]))[len(cases)]:
                prompt[at] = spec["eos"][0]
            toks, tops, routes = greedy(model, prompt, spec["new_tokens"], spec["eos"], device,
                                        margins)
            margin = min(t[0]["logprob"] - t[1]["logprob"] for t in tops)
            print(f"{name}: prompt {n:5d} -> {len(toks)} tokens, min top1-top2 margin {margin:.4f}")
            cases.append({"prompt": prompt, "max_new_tokens": spec["new_tokens"],
                          "tokens": toks, "top_logprobs": tops, "min_margin": margin})
            if margins is not None:
                # router_margins[i]: the forward that produced token i (0: the prompt's)
                cases[-1]["router_margins"] = routes
                print(f"   router margins: prompt {routes[0]:.2e}, decode min "
                      f"{min(routes[1:] or [1.0]):.2e}")
            if mtype != "qwen3" and len(cases) == 2:
                with open(os.path.join(path, "hidden.json"), "w") as f:
                    json.dump({"prompt": prompt, "layers": layer_hidden(model, prompt,
                                                                        device)}, f)
                if margins is not None:
                    margins.take()
    ref = {"fixture": name, "transformers": transformers.__version__,
           "torch": torch.__version__, "compute": "float32 eager", "top_n": TOP_N,
           "cases": cases}
    with open(os.path.join(path, "reference.json"), "w") as f:
        json.dump(ref, f)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="tests/fixtures")
    ap.add_argument("--only", default=None)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args()
    # fp32 matmuls must stay fp32 (no TF32) for a reference.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    os.makedirs(a.out, exist_ok=True)
    for name, spec in FIXTURES.items():
        if a.only and a.only != name:
            continue
        build(name, spec, a.out, a.device)


if __name__ == "__main__":
    main()
