"""Attention alone, forward + backward of one layer: fused SDPA in fp32 and bf16, explicit math and
a per-head Python loop, their time, FLOP/s and memory."""

import math
import os
import sys

import torch
import torch.nn as nn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from bench.timing import rates, table, timed, two
from lib.common import autocast
from model import GPTConfig, MultiHeadAttention

ATTENTION_PATHS = ["fused", "fused bf16", "explicit", "loop"]


class LoopAttention(nn.Module):
    """REFERENCE ONLY, the course notebook's multi-head attention, clear and slow on purpose: every
    head has its own small Q, K, V projections (d -> d/h); per head bmm, softmax, bmm; the heads
    concatenated, then W_O. No mask."""

    def __init__(self, d, h, bias=True):
        super().__init__()
        self.d, self.h, self.bias = d, h, bias
        self.q, self.k, self.v = (
            nn.ModuleList(nn.Linear(d, d // h, bias=bias) for _ in range(h)) for _ in range(3)
        )
        self.o = nn.Linear(d, d, bias=bias)

    def forward(self, x):
        heads = []
        for wq, wk, wv in zip(self.q, self.k, self.v):
            q, k, v = wq(x), wk(x), wv(x)
            weights = torch.softmax(torch.bmm(q, k.transpose(1, 2)) / math.sqrt(q.size(-1)), dim=-1)
            heads.append(torch.bmm(weights, v))
        return self.o(torch.cat(heads, dim=-1))

    def fused_copy(self):
        """A model.MultiHeadAttention with these weights: head i's Q, K, V are rows i*d/h... of each
        third of qkv."""
        config = GPTConfig(n_embd=self.d, n_head=self.h, bias=self.bias)
        # bidirectional, as the loop
        mha = MultiHeadAttention(config, causal=False).to(self.o.weight.device)
        with torch.no_grad():
            for name in ("weight", "bias") if self.bias else ("weight",):
                getattr(mha.qkv, name).copy_(
                    torch.cat([getattr(lin, name) for g in (self.q, self.k, self.v) for lin in g])
                )
                getattr(mha.proj, name).copy_(getattr(self.o, name))
        return mha


def attention_flops(n, d):
    """Model FLOPs of one attention layer's forward + backward on n tokens: 3 x the forward's
    8 n d^2 (Q, K, V and output projections) + 4 n^2 d (scores, weights x values), the convention
    MFU uses."""
    return 3 * (8 * n * d * d + 4 * n * n * d)


def bench_attention(path, n, device, repeats, d=384, h=6):
    """Forward + backward of one attention layer on [1, n, d]: fp32, or "fused bf16" under bf16
    autocast (train.py's default where bf16 is fast). FLOP/s: attention_flops per second. Memory:
    the bytes autograd saves for backward (saved_tensors_hooks, each storage once, parameters
    excluded) plus the output; on CUDA also the allocator's peak."""
    torch.manual_seed(0)
    loop = LoopAttention(d, h).to(device)
    mha = loop.fused_copy()
    forward = {
        "fused": lambda x: mha(x)[0],
        "fused bf16": lambda x: mha(x)[0],
        "explicit": lambda x: mha(x, need_weights=True)[0],
        "loop": loop,
    }[path]
    ctx = autocast(device, "bfloat16" if path.endswith("bf16") else "float32")
    params = [*loop.parameters(), *mha.parameters()]
    x = torch.randn(1, n, d, device=device, requires_grad=True)
    grad = torch.randn(1, n, d, device=device)

    def step():
        for p in params + [x]:
            p.grad = None
        with ctx:
            out = forward(x)
        out.backward(grad)

    r = rates({**timed(step, repeats, device), "n": n}, attention_flops(n, d), "flops")
    skip, saved = {p.untyped_storage().data_ptr() for p in params}, {}

    def pack(t):
        if t.untyped_storage().data_ptr() not in skip:
            saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), ctx:
        out = forward(x)
    saved[out.untyped_storage().data_ptr()] = out.untyped_storage().nbytes()
    out.backward(grad)
    r["saved_bytes"] = sum(saved.values())
    return {**r, "cuda_peak_bytes": torch.cuda.max_memory_allocated(device) - base} if cuda else r


def report_attention(attns, peaks):
    """The attention table, and each n's speed-ups over the per-head loop."""
    cuda = any("cuda_peak_bytes" in r for r in attns.values())

    def peak(path):
        return peaks["bfloat16" if path.endswith("bf16") else "float32"]["flops_best"]

    table(
        "Attention alone, forward + backward: d=384, h=6, batch 1, no mask; "
        'fp32 but for "fused bf16" (bf16 autocast). '
        "GFLOP/s: model FLOPs (3 x forward), "
        "and as a share of the best measured matmul FLOP/s of the dtype. "
        "Memory: the bytes autograd saves for backward plus the output "
        "(saved_tensors_hooks, each storage once, parameters excluded)"
        + "; CUDA peak: torch.cuda.max_memory_allocated over forward + backward"
        * cuda,
        [
            "n",
            "path",
            "ms (best / median)",
            "GFLOP/s (best / median)",
            "of the peak (best)",
            "saved MiB",
        ]
        + ["CUDA peak MiB"] * cuda,
        [
            [n, path, r["error"]]
            if "error" in r
            else [
                n,
                path,
                two(r, "ms", "{:.2f}"),
                two(r, "flops", "{:,.0f}", 1e-9),
                f"{r['flops_best'] / peak(path):.0%}",
                f"{r['saved_bytes'] / 2**20:,.1f}",
            ]
            + ([f"{r['cuda_peak_bytes'] / 2**20:,.1f}"] if cuda else [])
            for (path, n), r in attns.items()
        ],
    )
    print()
    for n in dict.fromkeys(n for _, n in attns):
        loop = attns[("loop", n)]

        def speedup(path, loop=loop, n=n):
            if "median_s" in attns[(path, n)]:
                return f"{loop['median_s'] / attns[(path, n)]['median_s']:.2f}x"
            return "n/a"

        print(
            f"- n={n}, medians: fused {speedup('fused')} the per-head loop's speed, "
            f"fused bf16 {speedup('fused bf16')}; "
            f"the loop runs at {loop['flops_best'] / peak('loop'):.0%} of the fp32 matmul peak, "
            f"so no fp32 path can be more than {peak('loop') / loop['flops_best']:.1f}x faster"
            + " (target: fused >= 3x)"
            * (n == 512)
        )
