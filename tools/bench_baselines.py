#!/usr/bin/env python3
"""bench_baselines.py - PyTorch baselines for sm70-bench, measured on the same GPU.

Prints the same table as sm70-bench (case, us, GB/s, %read, %copy) for:
  - read and copy bandwidth through PyTorch (a sum over a 2 GiB f16 tensor; a D2D copy),
  - GEMV: torch.matmul (cuBLAS) on the Qwen3-8B shapes at n = 1, 2, 4, 8, 16,
  - attention decode: scaled_dot_product_attention on contiguous f16 KV, 24 q heads over
    4 KV heads, head_dim 256, B1/B8/B16 at 1K and 16K (the best of enable_gqa=True and the
    equivalent "group heads as query rows" form, which runs flash attention),
  - sampling over 248,320 logits at B1/B8/B16: temperature 1.0 + top-k 20 + top-p 0.95,
    and top-p 0.95 alone (sort-based), torch.multinomial for the draw.

Times are CUDA-event medians after warm-up; inputs rotate over copies that exceed three
L2s so reads come from HBM. Usage: python3 tools/bench_baselines.py [--iters N] [--only X]
Non-goals: FP8 attention (PyTorch SDPA has no FP8 KV path; FP8 rows compare with f16).
"""
import argparse
import math
import statistics

import torch
import torch.nn.functional as F


def median_us(fn, iters, per_sample=1, warm=3):
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    times = []
    for it in range(-warm, iters):
        start.record()
        for i in range(per_sample):
            fn(i)
        end.record()
        end.synchronize()
        if it >= 0:
            times.append(start.elapsed_time(end) * 1e3 / per_sample)
    return statistics.median(times)


def copies_for(nbytes, l2, most=64):
    return max(2, min(most, int(3 * l2 / nbytes) + 1))


def row(name, us, nbytes, bw, extra=""):
    gbs = nbytes / us * 1e-3
    print("%-34s %10.2f %9.1f %7.1f%% %7.1f%%  %s" % (name, us, gbs, 100 * gbs / bw[0],
                                                    100 * gbs / bw[1], extra))


def header(extra=""):
    print("%-34s %10s %9s %8s %8s  %s" % ("case", "us", "GB/s", "%read", "%copy", extra))


def bandwidth(iters):
    n = (2 << 30) // 2
    x = torch.rand(n, device="cuda", dtype=torch.float16)
    us_read = median_us(lambda i: torch.sum(x, dtype=torch.float32), iters, 4)
    half = n // 2
    a, b = x[:half], x[half:]
    us_copy = median_us(lambda i: b.copy_(a), iters, 4)
    read = 2.0 * n / us_read * 1e-3
    copy = 2.0 * 2 * half / us_copy * 1e-3
    print("\n== bandwidth through PyTorch (2 GiB f16), median of %d" % iters)
    print("read (torch.sum)                  %9.1f GB/s" % read)
    print("D2D copy (read + write bytes)     %9.1f GB/s" % copy)
    del x
    return read, copy


def gemv(iters, bw, l2):
    shapes = [("qkv", 6144, 4096), ("o", 4096, 4096), ("gate_up", 24576, 4096),
              ("down", 4096, 12288), ("lm_head", 151936, 4096)]
    print("\n== GEMV via torch.matmul (cuBLAS), f16, median of %d" % iters)
    header()
    for name, rows, cols in shapes:
        wbytes = rows * cols * 2
        nc = copies_for(wbytes, l2)
        ws = [torch.randn(rows, cols, device="cuda", dtype=torch.float16) * 0.03
              for _ in range(nc)]
        for n in (1, 2, 4, 8, 16):
            x = torch.randn(n, cols, device="cuda", dtype=torch.float16)
            y = torch.empty(n, rows, device="cuda", dtype=torch.float16)
            per = max(nc, 8)
            us = median_us(lambda i: torch.matmul(x, ws[i % nc].t(), out=y), iters, per)
            row("torch gemv %s %dx%d B%d" % (name, rows, cols, n), us,
                wbytes + n * cols * 2 + n * rows * 2, bw)
        del ws
        torch.cuda.empty_cache()


def attention(iters, bw, l2):
    hq, hkv, d = 24, 4, 256
    g = hq // hkv
    print("\n== attention via scaled_dot_product_attention, contiguous f16 KV, "
          "24/4 heads, D256, median of %d" % iters)
    header("form")
    for ctx in (1024, 16384):
        for b in (1, 8, 16):
            kvbytes = 2 * b * hkv * ctx * d * 2
            nc = copies_for(kvbytes, l2, 128)
            ks = [torch.randn(b, hkv, ctx, d, device="cuda", dtype=torch.float16)
                  for _ in range(nc)]
            vs = [torch.randn(b, hkv, ctx, d, device="cuda", dtype=torch.float16)
                  for _ in range(nc)]
            q = torch.randn(b, hq, 1, d, device="cuda", dtype=torch.float16)
            per = max(nc, 8)
            best = None
            # the group's query heads as query rows of their KV head: flash attention
            qg = q.view(b, hkv, g, d)
            us = median_us(lambda i: F.scaled_dot_product_attention(qg, ks[i % nc],
                                                                    vs[i % nc]), iters, per)
            best = (us, "grouped q rows")
            try:
                us = median_us(lambda i: F.scaled_dot_product_attention(
                    q, ks[i % nc], vs[i % nc], enable_gqa=True), iters, per)
                if us < best[0]:
                    best = (us, "enable_gqa")
            except (RuntimeError, TypeError):
                pass
            row("torch sdpa f16 ctx%dK B%d" % (ctx // 1024, b), best[0],
                kvbytes + 2 * b * hq * d * 2, bw, best[1])
            del ks, vs
            torch.cuda.empty_cache()


def sample_topk_topp(logits, temperature, k, p):
    x = logits / temperature
    vals, idx = torch.topk(x, k, dim=-1)
    probs = torch.softmax(vals, dim=-1)
    cum = torch.cumsum(probs, dim=-1)
    probs = probs.masked_fill(cum - probs > p, 0.0)
    pick = torch.multinomial(probs, 1)
    return torch.gather(idx, -1, pick)


def sample_topp(logits, p):
    vals, idx = torch.sort(logits, dim=-1, descending=True)
    probs = torch.softmax(vals, dim=-1)
    cum = torch.cumsum(probs, dim=-1)
    probs = probs.masked_fill(cum - probs > p, 0.0)
    pick = torch.multinomial(probs, 1)
    return torch.gather(idx, -1, pick)


def sampling(iters, bw):
    vocab = 248320
    print("\n== sampling over %d f32 logits (torch topk/sort + multinomial), median of %d"
          % (vocab, iters))
    header()
    for b in (1, 8, 16):
        logits = torch.randn(b, vocab, device="cuda", dtype=torch.float32) * 3
        us = median_us(lambda i: sample_topk_topp(logits, 1.0, 20, 0.95), iters, 4)
        row("torch sample T1 k20 p0.95 B%d" % b, us, b * vocab * 4, bw)
        us = median_us(lambda i: sample_topp(logits, 0.95), iters, 4)
        row("torch sample top-p 0.95 B%d" % b, us, b * vocab * 4, bw)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--only", choices=("gemv", "attention", "sampling"), default=None)
    args = ap.parse_args()
    props = torch.cuda.get_device_properties(0)
    l2 = getattr(props, "L2_cache_size", 60 << 20)
    print("bench_baselines: %s, torch %s, CUDA %s, L2 %.0f MB" %
          (props.name, torch.__version__, torch.version.cuda, l2 / 1e6))
    torch.manual_seed(0)
    bw = bandwidth(args.iters)
    if args.only in (None, "gemv"):
        gemv(args.iters, bw, l2)
    if args.only in (None, "attention"):
        attention(args.iters, bw, l2)
    if args.only in (None, "sampling"):
        sampling(args.iters, bw)


if __name__ == "__main__":
    main()
