#!/usr/bin/env python3
"""bench_moe_torch.py - PyTorch baselines for `sm70-bench moe`, on the same GPU.

The expert pass of one MoE layer (gate_up GEMM, SwiGLU, down GEMM, the routing weights and
the combine; the routing itself not timed, as in sm70-bench moe) for the shapes sm70-bench
moe measures: Qwen3-30B-A3B (E128/k8, hidden 2048, expert intermediate 768) and the
E512/k10 shape of Qwen3-Next / qwen4_exp (hidden 2048, intermediate 512), at B1/B4/B8/B16.

Two baselines, each a loop over the experts the batch selected:
  - eager: per expert, x[tokens] @ gate_up[e].T, silu * up, @ down[e].T, index_add_ of the
    weighted rows (the token lists are made on the device before timing, so the loop has no
    host syncs: kinder than a per-step torch.where);
  - graph: the same loop captured in a CUDA graph per routing, so what is left is cuBLAS'
    per-expert GEMMs and the small element-wise kernels, without Python's launch cost (the
    "per-expert cuBLAS path").

Routings: 16 random ones (softmax over random router logits, top-k, renormalised), cycled,
so that most experts come from HBM rather than L2. Bytes: the distinct experts a routing
selects, times their gate_up + down bytes (as sm70-bench moe counts them); %read against
--bw-gbs (sm70-bench bw's read kernel, measured in the same session).

Usage: python3 tools/bench_moe_torch.py --bw-gbs 4627.0 [--iters 30]
"""
import argparse
import os
import statistics
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_baselines import median_us  # noqa: E402  (CUDA-event medians after warm-up)

SHAPES = [("30b-a3b", 128, 8, 2048, 768), ("next", 512, 10, 2048, 512)]
BATCHES = [1, 4, 8, 16]
ROUTINGS = 16


def make_routing(n, E, k, gen):
    logits = torch.randn(n, E, generator=gen, device="cuda", dtype=torch.float32)
    w, ids = torch.topk(torch.softmax(logits, dim=-1), k, dim=-1)
    w = w / w.sum(dim=-1, keepdim=True)
    plan = []
    ids_h = ids.cpu()
    for e in sorted(set(ids_h.flatten().tolist())):
        tok, slot = (ids_h == e).nonzero(as_tuple=True)
        tok = tok.to("cuda")
        plan.append((e, tok, w[tok, slot.to("cuda")].to(torch.float16).unsqueeze(1)))
    return plan


def expert_loop(x, gu, dn, plan, inter, out):
    out.zero_()
    for e, tok, wt in plan:
        h = x.index_select(0, tok) @ gu[e].t()
        a = F.silu(h[:, :inter]) * h[:, inter:]
        out.index_add_(0, tok, (a @ dn[e].t()) * wt)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bw-gbs", type=float, required=True)
    ap.add_argument("--iters", type=int, default=30)
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
    print("torch %s, %s" % (torch.__version__, torch.cuda.get_device_name()))
    print("%-18s %8s %8s %10s %7s %10s %7s" % ("case", "experts", "MB", "eager us", "%read",
                                               "graph us", "%read"))
    gen = torch.Generator(device="cuda")
    gen.manual_seed(70)
    for name, E, k, hidden, inter in SHAPES:
        gu = torch.randn(E, 2 * inter, hidden, device="cuda", dtype=torch.float16) * hidden ** -0.5
        dn = torch.randn(E, hidden, inter, device="cuda", dtype=torch.float16) * inter ** -0.5
        per_expert = 3 * inter * hidden * 2
        for n in BATCHES:
            x = torch.randn(n, hidden, device="cuda", dtype=torch.float16)
            out = torch.empty(n, hidden, device="cuda", dtype=torch.float16)
            plans = [make_routing(n, E, k, gen) for _ in range(ROUTINGS)]
            experts = statistics.mean(len(p) for p in plans)
            nbytes = experts * per_expert
            eager = median_us(lambda i: expert_loop(x, gu, dn, plans[i % ROUTINGS], inter, out),
                              args.iters, ROUTINGS)
            graphs = []
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for p in plans:  # warm cuBLAS' handles and heuristics before capture
                    expert_loop(x, gu, dn, p, inter, out)
            torch.cuda.current_stream().wait_stream(stream)
            for p in plans:
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    expert_loop(x, gu, dn, p, inter, out)
                graphs.append(g)
            graph = median_us(lambda i: graphs[i % ROUTINGS].replay(), args.iters, ROUTINGS)
            gbs_e, gbs_g = nbytes / eager * 1e-3, nbytes / graph * 1e-3
            print("%-18s %8.1f %8.1f %10.2f %6.1f%% %10.2f %6.1f%%" % (
                "%s B%d" % (name, n), experts, nbytes / 1e6, eager, 100 * gbs_e / args.bw_gbs,
                graph, 100 * gbs_g / args.bw_gbs))
            del graphs
        del gu, dn
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
