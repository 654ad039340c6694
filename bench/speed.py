"""
Benchmarks on one device, in one run; prints markdown tables ready to paste into BENCHMARKS.md.
  1. achievable matmul FLOP/s in fp32 and bf16: the practical peak that MFU is measured against
  2. training steps (tokens/s, MFU) for the shapes of three configs in fp32, bf16 autocast and
     bf16 + torch.compile
  3. one AdamW step: the per-tensor loop, foreach, fused
  4. generation tokens/s with and without the KV cache
  5. attention alone (fused SDPA in fp32 and bf16, explicit math, a per-head Python loop): time,
     FLOP/s and memory for n = 128 ... 4096
  6. classifier training and inference examples/s
Every figure is timed --repeats times after a warm-up; the tables show the best (min time) and the
median.
Usage, from the repository root (config paths are taken relative to it from any working directory):
  python bench/speed.py --quick                under a minute on 2 CPU cores: 2 repeats,
                                               n = 128 and 512, small batches
  python bench/speed.py --json bench.json      the full run (6 to 7 minutes on 2 CPU cores)
  python bench/speed.py --device cuda --no-compile
  python bench/speed.py --profile config/shakespeare_char.py
                                               where one training step spends its time,
                                               fp32 and bf16
  python bench/speed.py --time_to_loss config/shakespeare_char_cpu.py \\
      config/shakespeare_char_fast.py --repeats 3 --png bench/figures/time_to_loss_cpu.png
                                               wall time to a validation loss,
                                               the runs side by side, and a plot
"""

import argparse
import json
import math
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import nullcontext

import torch
import torch.nn as nn
from tqdm import tqdm

# run from anywhere: the repository root
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from decoding import NextToken, Options
from engine import Engine
from lib.batches import read_meta
from lib.build import new_model
from lib.common import (
    ArgumentParser,
    Error,
    native_bf16,
    pick_device,
    run_script,
)
from lib.mfu import flops_per_token
from lib.plots import pyplot, read_metrics
from model import GPT, GPTConfig, MultiHeadAttention

CONFIGS = ["config/shakespeare_char_cpu.py", "config/shakespeare_char.py", "config/agnews.py"]
META_FALLBACK = {
    "shakespeare_char": {"vocab_size": 65},  # when data/<dataset>/meta.json was never prepared
    "shakespeare": {"vocab_size": 50257},
    "openwebtext": {"vocab_size": 50257},
    "agnews": {"vocab_size": 50257, "pad_token_id": 50256, "label_names": ["W", "S", "B", "T"]},
}
MODES = ["fp32", "bf16", "bf16+compile"]
ATTENTION_PATHS = ["fused", "fused bf16", "explicit", "loop"]
OPTIMIZERS = ["loop", "foreach", "fused"]


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


def sync(device):
    """Wait for the device's queued work (timing)."""
    kind = torch.device(device).type
    if kind == "cuda":
        torch.cuda.synchronize(device)
    elif kind == "mps":
        torch.mps.synchronize()


def timed(fn, repeats, device, warm_fn=None):
    """Seconds per call of fn, repeats times, after one warm-up call of warm_fn (default fn), and
    the warm-up time."""
    t0 = time.perf_counter()
    (warm_fn or fn)()
    sync(device)
    warmup_s, times = time.perf_counter() - t0, []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return {
        "times_s": times,
        "min_s": min(times),
        "median_s": statistics.median(times),
        "warmup_s": warmup_s,
    }


def rates(r, work, unit):
    """Add work per second at the best (min) and the median time: r[unit + '_best'],
    r[unit + '_median']."""
    r[f"{unit}_best"], r[f"{unit}_median"] = work / r["min_s"], work / r["median_s"]
    return r


def autocast(device, mode):
    """(dtype name, context) for fp32 / bf16 modes, built as train.py builds it."""
    dtype = "float32" if mode == "fp32" else "bfloat16"
    return dtype, nullcontext() if dtype == "float32" else torch.autocast(
        device.split(":")[0], dtype=getattr(torch, dtype)
    )


def machine(device):
    name = (
        torch.cuda.get_device_name(device)
        if device.startswith("cuda")
        else platform.processor() or platform.machine()
    )
    if device == "cpu" and os.path.isfile("/proc/cpuinfo"):
        name = next(
            (
                line.split(":", 1)[1].strip()
                for line in open("/proc/cpuinfo")
                if line.startswith("model name")
            ),
            name,
        )
    return {
        "device": device,
        "name": name,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpu_cores": os.cpu_count(),
        "cpu_bf16": native_bf16("cpu"),
        # the vector flags that decide the CPU's kernels, and torch's reading of them
        "flags": cpu_flags(),
        "capability": torch.backends.cpu.get_cpu_capability(),
        "python": platform.python_version(),
        "load_average": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
    }  # other jobs skew CPU timings


def cpu_flags():
    """lscpu's AVX, AMX and FMA flags."""
    if not os.path.isfile("/proc/cpuinfo"):
        return []
    line = next(x for x in open("/proc/cpuinfo") if x.startswith("flags"))
    return [f for f in line.split()[2:] if f.startswith(("avx", "amx", "fma"))]


def matmul_flops(device, dtype, n, repeats=3):
    """Achievable matmul FLOP/s: the best of a few n x n products, each timed between two
    syncs (the first one warms up)."""
    a, b = torch.randn(2, n, n, device=device, dtype=dtype)
    best = float("inf")
    for _ in range(repeats + 1):
        sync(device)
        t0 = time.perf_counter()
        a @ b
        sync(device)
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best


def bench_matmul(device, dtype, n, repeats):
    """matmul_flops once per repeat (each call warms up, then times one n x n product):
    FLOP/s samples."""
    return [matmul_flops(device, dtype, n=n, repeats=1) for _ in range(repeats)]


def load_shape(config_file):
    """(config dict, dataset meta): the config as train.py resolves it
    (train.py CONFIG --print_config), without reading any data; the dataset's meta.json where it was
    prepared, else a stand-in with its vocabulary."""
    r = subprocess.run(
        [sys.executable, os.path.join(ROOT, "train.py"), config_file, "--print_config"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    if r.returncode:
        raise Error(f"train.py {config_file} --print_config failed: {r.stderr.strip()}")
    c = json.loads(r.stdout)
    meta_dir = os.path.join(ROOT, "data", c["dataset"])
    meta = (
        read_meta(meta_dir)
        if os.path.isfile(os.path.join(meta_dir, "meta.json"))
        else META_FALLBACK[c["dataset"]]
    )
    c["vocab_size"] = c["vocab_size"] or meta["vocab_size"]
    return c, meta


def make_batch(c, meta, rows, device, seed):
    """Random tokens: lm rows of block_size; classify rows of ~47 tokens (AG News-like) padded to
    the batch max."""
    V, T, gen = c["vocab_size"], c["block_size"], torch.Generator().manual_seed(seed)
    if c["task"] == "lm":
        batch = {
            "idx": torch.randint(V, (rows, T), generator=gen),
            "targets": torch.randint(V, (rows, T), generator=gen),
        }
    else:
        lengths = (47 + 15 * torch.randn(rows, generator=gen)).round().long().clamp(4, T)
        mask = (torch.arange(int(lengths.max()))[None, :] < lengths[:, None]).long()
        batch = {
            "idx": torch.randint(V, mask.shape, generator=gen).masked_fill(
                mask == 0, meta["pad_token_id"]
            ),
            "attention_mask": mask,
            "labels": torch.randint(len(meta["label_names"]), (rows,), generator=gen),
        }
    return {k: v.to(device) for k, v in batch.items()}


def train_step(c, meta, mode, device, rows):
    """(step, model, batch): one training step as train.py takes it, forward under autocast,
    backward, clip, the config's optimizer, zero_grad, on random tokens of the config's shape."""
    model = new_model(c, meta).to(device)
    optimizers = model.configure_optimizers(
        c["weight_decay"],
        c["learning_rate"],
        (c["beta1"], c["beta2"]),
        device.split(":")[0],
        c["optimizer"],
    )
    if mode.endswith("compile"):
        torch._dynamo.reset()  # each model compiles afresh
    runner = torch.compile(model) if mode.endswith("compile") else model
    _, ctx = autocast(device, mode)
    batch = make_batch(c, meta, rows, device, seed=0)

    def step():
        with ctx:
            _, loss = runner(**batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(
            model.parameters(), c["grad_clip"] if c["grad_clip"] > 0 else float("inf")
        )
        for optimizer in optimizers:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    return step, model, batch


def bench_train(c, meta, mode, device, repeats, max_rows=None):
    """Timed training steps: tokens/s and examples/s; MFU is added in report() against the measured
    peak."""
    rows = min(c["batch_size"], max_rows or c["batch_size"])
    step, model, batch = train_step(c, meta, mode, device, rows)
    width = batch["idx"].size(1)  # for classify the padded width: train.py counts those tokens too
    r = rates(timed(step, repeats, device), rows * width, "tokens_per_s")
    return {
        **rates(r, rows, "examples_per_s"),
        "rows": rows,
        "width": width,
        "dtype": autocast(device, mode)[0],
        "task": c["task"],
        "flops_per_token": flops_per_token(model, width),
        "shape": f"{c['n_layer']} x {c['n_embd']}, {c['n_head']} heads",
    }


def bench_optimizer(c, meta, kind, device, repeats):
    """One AdamW step over the config's parameters (random gradients): the per-tensor loop
    (PyTorch's default on CPU), foreach (the default on CUDA) or fused (what
    model.configure_optimizers picks on CPU and CUDA)."""
    model = new_model(c, meta).to(device)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    optimizer = torch.optim.AdamW(
        model.parameters(),
        **{"loop": dict(foreach=False), "foreach": dict(foreach=True), "fused": dict(fused=True)}[
            kind
        ],
    )
    return {
        **timed(optimizer.step, repeats, device),
        "params": sum(p.numel() for p in model.parameters()),
    }


def profile_train(config_file, device, modes=("fp32", "bf16"), top=15):
    """Where one training step of the config's shape spends its time: torch.profiler's operators by
    self time."""
    from torch.profiler import ProfilerActivity, profile

    c, meta = load_shape(config_file)
    cuda = device.startswith("cuda")
    for mode in modes:
        step, _, batch = train_step(c, meta, mode, device, c["batch_size"])
        step()  # warm-up
        sync(device)
        with profile(activities=[ProfilerActivity.CPU] + [ProfilerActivity.CUDA] * cuda) as prof:
            step()
            sync(device)
        print(
            f"\n### {os.path.relpath(config_file, ROOT)}, {mode}, "
            f"batch {tuple(batch['idx'].shape)}: one training step\n"
        )
        print(
            prof.key_averages().table(
                sort_by="self_cuda_time_total" if cuda else "self_cpu_time_total", row_limit=top
            )
        )


def bench_classify_inference(c, meta, mode, device, repeats, rows=256):
    """Forward only, eval mode, no_grad, batch 256, fp32 or bf16 autocast."""
    model, (_, ctx) = new_model(c, meta).to(device).eval(), autocast(device, mode)
    batch = make_batch(c, meta, rows, device, seed=1)
    batch.pop("labels")

    @torch.no_grad()
    def forward():
        with ctx:
            model(**batch)

    return {**rates(timed(forward, repeats, device), rows, "examples_per_s"), "rows": rows}


def bench_generate(device, new_tokens, use_cache, repeats):
    """Greedy decoding of new_tokens from a 1-token prompt, float32, the shakespeare_char GPT
    shape."""
    torch.manual_seed(0)
    model = (
        GPT(GPTConfig(vocab_size=65, block_size=256, n_layer=6, n_head=6, n_embd=384, bias=True))
        .to(device)
        .eval()
    )
    greedy = NextToken(Options(), greedy=True)

    def run(n):
        engine = Engine(model, 1, use_cache)
        engine.submit([0], [greedy], n)
        while engine.busy():
            engine.step()

    r = timed(lambda: run(new_tokens), repeats, device, warm_fn=lambda: run(min(new_tokens, 20)))
    return {**rates(r, new_tokens, "tokens_per_s"), "new_tokens": new_tokens}


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
    ctx = autocast(device, "bf16" if path.endswith("bf16") else "fp32")[1]
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


def two(r, unit, fmt="{:,.0f}", scale=1):
    if "error" in r:
        return r["error"]
    return f"{fmt.format(scale * r[unit + '_best'])} / {fmt.format(scale * r[unit + '_median'])}"


def table(title, header, rows):
    print(f"\n### {title}\n\n| " + " | ".join(header) + " |\n|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(map(str, row)) + " |")


def report(info, peaks, trains, optims, gens, attns, infers, notes):
    print(
        f"## Machine\n\n{info['name']} ({info['device']}), torch {info['torch']}, "
        f"{info['threads']} threads, {info['cpu_cores']} CPU cores, CPU bf16: {info['cpu_bf16']}, "
        f"Python {info['python']}, load average at the start {info['load_average']}"
    )
    table(
        "Matmul peak: n x n products, best / median of the samples taken "
        "at the start and at the end of the run",
        ["dtype", "n", "TFLOP/s"],
        [[dt, p["n"], two(p, "flops", "{:.3f}", 1e-12)] for dt, p in peaks.items()],
    )
    rows = []
    for (cfg, mode), r in trains.items():
        if "error" in r:
            rows.append([cfg, "", "", mode, r["error"], "", "", ""])
            continue
        r.update(
            {
                f"mfu_{k}": r["flops_per_token"]
                * r[f"tokens_per_s_{k}"]
                / peaks[r["dtype"]]["flops_best"]
                for k in ("best", "median")
            }
        )
        rows.append(
            [
                cfg,
                r["shape"],
                f"{r['rows']} x {r['width']}",
                mode,
                two(r, "ms", "{:.1f}"),
                two(r, "tokens_per_s"),
                two(r, "examples_per_s") if r["task"] == "classify" else "",
                two(r, "mfu", "{:.1f}%", 100),
            ]
        )
    table(
        "Training step, best / median: forward, backward, clip, AdamW. "
        "MFU: against the best measured matmul FLOP/s of the dtype; "
        "classify counts padded tokens, as train.py does",
        ["config", "shape", "batch", "mode", "ms/step", "tokens/s", "examples/s", "MFU"],
        rows,
    )
    rows = []
    for cfg in dict.fromkeys(cfg for cfg, _ in trains):
        m = {mode: trains.get((cfg, mode), {}) for mode in MODES}

        def ratio(a, b, m=m):
            if "median_s" in m[a] and "median_s" in m[b]:
                return f"{m[a]['median_s'] / m[b]['median_s']:.2f}x"
            return "n/a"

        first = (
            f"{m['bf16+compile']['warmup_s']:.1f} s" if "warmup_s" in m["bf16+compile"] else "n/a"
        )
        rows.append([cfg, ratio("fp32", "bf16"), ratio("bf16", "bf16+compile"), first])
    table(
        "Speed-ups, medians",
        ["config", "bf16 / fp32", "compile / eager (bf16)", "first step with compiling"],
        rows,
    )
    table(
        "AdamW step alone, ms (best / median): the default per-tensor loop, foreach, fused",
        ["config", "parameters", *OPTIMIZERS, "loop / fused (medians)"],
        [
            [
                cfg,
                f"{optims[(cfg, 'loop')]['params'] / 1e6:.2f}M",
                *(two(optims[(cfg, k)], "ms", "{:.2f}") for k in OPTIMIZERS),
                f"{optims[(cfg, 'loop')]['median_s'] / optims[(cfg, 'fused')]['median_s']:.1f}x",
            ]
            for cfg in dict.fromkeys(cfg for cfg, _ in optims)
            if all("median_s" in optims[(cfg, k)] for k in OPTIMIZERS)
        ],
    )
    table(
        "Generation: GPT 6 x 384, vocab 65, block 256, fp32, greedy, "
        f"{gens[True]['new_tokens']} new tokens from 1",
        ["KV cache", "tokens/s (best / median)"],
        [["yes" if k else "no", two(r, "tokens_per_s", "{:,.1f}")] for k, r in gens.items()],
    )
    print(f"\nKV cache speed-up (medians): {gens[False]['median_s'] / gens[True]['median_s']:.2f}x")
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
    if infers:
        cfg = next(iter(infers.values()))[0]
        rows = [
            [
                mode,
                f"{two(trains[(cfg, mode)], 'examples_per_s')} ({trains[(cfg, mode)]['rows']} rows)"
                if "rows" in trains.get((cfg, mode), {})
                else "n/a",
                two(r, "examples_per_s"),
            ]
            for mode, (_, r) in infers.items()
        ]
        table(
            f"Classifier examples/s, best / median ({cfg})",
            ["mode", "train (eager)", "inference (batch 256, eval, no_grad)"],
            rows,
        )
    for note in notes:
        print(f"\nNote: {note}")


def time_to_loss(runs, target, repeats, png):
    """Each run (a config file and --key=value overrides) as `python train.py RUN`, into a fresh
    out_dir, the runs taking turns repeats times, so a busy neighbour slows them alike. Per run: the
    wall time start to finish, the final validation loss and when (seconds since its process
    started) an evaluation first reached target."""
    results, train = {run: [] for run in runs}, os.path.join(ROOT, "train.py")
    bar = tqdm(total=len(runs) * repeats, desc="time to loss", file=sys.stderr, dynamic_ncols=True)
    for _ in range(repeats):
        for run in runs:
            out_dir, t0 = tempfile.mkdtemp(prefix="time-to-loss-"), time.time()
            r = subprocess.run(
                [
                    sys.executable,
                    train,
                    *shlex.split(run),
                    f"--out_dir={out_dir}",
                    "--overwrite_out_dir=True",
                ],
                cwd=ROOT,
                capture_output=True,
                text=True,
            )
            wall = time.time() - t0
            if r.returncode:
                raise Error(f"train.py {run} failed: {r.stderr.strip().splitlines()[-1]}")
            curve = [
                (m["time"] - t0, m["val/loss"]) for m in read_metrics(out_dir) if "val/loss" in m
            ]
            results[run].append(
                {
                    "wall_s": wall,
                    "curve": curve,
                    "final": curve[-1][1],
                    "reached_s": next((s for s, loss in curve if round(loss, 4) <= target), None),
                }
            )
            bar.update()
    bar.close()
    base = statistics.median(r["wall_s"] for r in results[runs[0]])
    table(
        f"Time to validation loss {target}: `python train.py RUN`, start to finish, "
        f"{repeats} turn(s) each, taking turns",
        [
            "run",
            "wall s (each turn)",
            "final val loss (each turn)",
            f"first eval <= {target} at s",
            f"wall time / {runs[0].split()[0]}'s (medians)",
        ],
        [
            [
                f"`{run}`",
                ", ".join(f"{r['wall_s']:.1f}" for r in rs),
                ", ".join(f"{r['final']:.4f}" for r in rs),
                ", ".join(
                    "never" if r["reached_s"] is None else f"{r['reached_s']:.1f}" for r in rs
                ),
                f"{statistics.median(r['wall_s'] for r in rs) / base:.2f}x",
            ]
            for run, rs in results.items()
        ],
    )
    plot_time_to_loss(results, target, png)
    return results


def plot_time_to_loss(results, target, png):
    """Validation loss against seconds since each run's process started; later turns paler."""
    import textwrap

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 5.5), layout="constrained")
    for i, (run, rs) in enumerate(results.items()):
        for j, r in enumerate(rs):
            ax.plot(
                *zip(*r["curve"]),
                "-o",
                color=f"C{i}",
                markersize=3,
                alpha=1 if j == 0 else 0.4,
                label=textwrap.fill(run, 90) if j == 0 else None,
            )
    ax.axhline(target, color="gray", linestyle="--", linewidth=1, label=f"target {target}")
    ax.set(
        xlabel="seconds since `python train.py` started",
        ylabel="validation loss",
        ylim=(target - 0.3, target + 1.2),
        title="validation loss against wall time",
    )
    ax.grid(alpha=0.3)
    fig.legend(fontsize=7, loc="outside lower center")
    fig.savefig(png, dpi=110)
    print(f"\nwrote {png}")


def main(argv=None):
    p = ArgumentParser(
        prog="speed.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--device", default="auto", help="auto (cuda, mps, cpu), cuda, cuda:1, mps or cpu"
    )
    p.add_argument(
        "--repeats", type=int, default=5, help="timed repeats per figure, after one warm-up"
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="2 repeats, n = 128 and 512, 100 new tokens, training batches of at most 4 rows, "
        "torch.compile on the first config only",
    )
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile measurements")
    p.add_argument(
        "--json", metavar="PATH", help="also save every figure (with the raw times) as JSON"
    )
    p.add_argument(
        "--configs",
        nargs="+",
        default=CONFIGS,
        metavar="CONFIG",
        help="the configs whose shapes the training and AdamW tables measure "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--profile",
        metavar="CONFIG",
        help="instead: where one training step of CONFIG's shape spends its time, "
        "fp32 and bf16 (torch.profiler's operators)",
    )
    p.add_argument(
        "--time_to_loss",
        metavar="RUN",
        nargs="+",
        help="instead: run each RUN (a config file, then any --key=value overrides, "
        "quoted as one argument) as `python train.py RUN`, taking turns --repeats times; "
        "print the wall times and the val loss each reached, and plot val loss against seconds",
    )
    p.add_argument(
        "--target",
        type=float,
        default=1.8818,
        help="with --time_to_loss: the validation loss to reach "
        "(default: %(default)s, what config/shakespeare_char_cpu.py reaches)",
    )
    p.add_argument(
        "--png",
        default="time_to_loss.png",
        help="with --time_to_loss: the plot (default: %(default)s)",
    )
    a = p.parse_args(argv)
    if a.time_to_loss:
        results = time_to_loss(a.time_to_loss, a.target, a.repeats, os.path.abspath(a.png))
        if a.json:
            with open(a.json, "w") as f:
                json.dump(
                    {"machine": machine("cpu"), "target": a.target, "runs": results}, f, indent=2
                )
        return
    json_path, profile = (
        a.json and os.path.abspath(a.json),
        a.profile and os.path.join(ROOT, a.profile),
    )
    if profile and not os.path.isfile(profile):
        p.error(f"--profile {a.profile}: no such config file (try config/shakespeare_char.py)")
    os.chdir(ROOT)  # config files exec other config files by relative path
    if a.repeats < 1:
        p.error(f"--repeats {a.repeats}: must be at least 1")
    device = pick_device(a.device)
    if profile:
        return profile_train(profile, device)
    # "first step with compiling" means a cold compile: inductor's on-disk caches would otherwise
    # make reruns fast
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="bench-inductor-"))
    repeats, info, t0 = 2 if a.quick else a.repeats, machine(device), time.perf_counter()
    print(
        f"# speed.py on {info['name']} ({device}), "
        f"torch {info['torch']}, {info['threads']} threads",
        file=sys.stderr,
    )
    configs = a.configs
    shapes = {cfg: load_shape(cfg) for cfg in configs}
    notes = [
        f"{cfg}: data/{c['dataset']} not prepared, "
        f"so the vocabulary is a stand-in of {c['vocab_size']}"
        for cfg, (c, meta) in shapes.items()
        if meta is META_FALLBACK.get(c["dataset"])
    ]
    plan = [
        (cfg, mode)
        for i, cfg in enumerate(configs)
        for mode in MODES
        if not (mode.endswith("compile") and (a.no_compile or (a.quick and i > 0)))
    ]
    ns = [128, 512] if a.quick else [128, 512, 1024, 2048, 4096]
    cls = next((cfg for cfg in configs if shapes[cfg][0]["task"] == "classify"), None)
    bar = tqdm(
        total=4
        + len(plan)
        + len(configs) * len(OPTIMIZERS)
        + 2
        + len(ATTENTION_PATHS) * len(ns)
        + 2 * bool(cls),
        file=sys.stderr,
        dynamic_ncols=True,
    )

    def run(label, fn, *args, catch=False):
        bar.set_description(label)
        try:
            r = fn(*args)
        except Exception as e:  # no compiler for torch.compile, no bf16 on this device...
            if not catch:
                raise
            message = (str(e).strip().splitlines() or [""])[0][:80]
            r = {"error": f"failed: {type(e).__name__}: {message}"}
        bar.update()
        return r

    # run at the start and at the end: a busy neighbour lowers only some samples
    def matmul_peaks():
        for name in ("float32", "bfloat16"):
            n = 8192 if device.startswith("cuda") else 2048
            p = peaks.setdefault(name, {"n": n, "flops": []})
            p["flops"] += run(
                f"matmul {name}", bench_matmul, device, getattr(torch, name), n, repeats
            )
            p["flops_best"], p["flops_median"] = max(p["flops"]), statistics.median(p["flops"])

    peaks = {}
    matmul_peaks()
    trains = {
        (cfg, mode): run(
            f"train {os.path.basename(cfg)} {mode}",
            bench_train,
            *shapes[cfg][:2],
            mode,
            device,
            repeats,
            4 if a.quick else None,
            catch=True,
        )
        for cfg, mode in plan
    }
    optims = {
        (cfg, kind): run(
            f"AdamW {kind} {os.path.basename(cfg)}",
            bench_optimizer,
            *shapes[cfg][:2],
            kind,
            device,
            repeats,
            catch=True,
        )
        for cfg in configs
        for kind in OPTIMIZERS
    }
    gens = {
        cache: run(
            f"generate, cache={cache}",
            bench_generate,
            device,
            100 if a.quick else 500,
            cache,
            repeats,
        )
        for cache in (True, False)
    }
    attns = {
        (path, n): run(
            f"attention {path} n={n}",
            bench_attention,
            path,
            n,
            device,
            repeats,
            catch=path.endswith("bf16"),
        )
        for n in ns
        for path in ATTENTION_PATHS
    }
    infers = (
        {
            mode: (
                cls,
                run(
                    f"classify inference {mode}",
                    bench_classify_inference,
                    *shapes[cls][:2],
                    mode,
                    device,
                    repeats,
                    catch=True,
                ),
            )
            for mode in ("fp32", "bf16")
        }
        if cls
        else {}
    )
    matmul_peaks()
    bar.close()
    for r in [*trains.values(), *optims.values(), *attns.values()]:
        if "min_s" in r:
            r["ms_best"], r["ms_median"] = 1e3 * r["min_s"], 1e3 * r["median_s"]
    report(info, peaks, trains, optims, gens, attns, infers, notes)
    print(
        f"\n{'--quick run: ' * a.quick}{repeats} timed repeats per figure; "
        f"{time.perf_counter() - t0:.0f} s in all"
    )
    if json_path:

        def key(k):
            return " ".join(map(str, k))

        with open(json_path, "w") as f:
            json.dump(
                {
                    "machine": info,
                    "args": vars(a),
                    "notes": notes,
                    "matmul": peaks,
                    "train": {key(k): v for k, v in trains.items()},
                    "optimizer": {key(k): v for k, v in optims.items()},
                    "generate": {f"cache={k}": v for k, v in gens.items()},
                    "attention": {key(k): v for k, v in attns.items()},
                    "classify_inference": {
                        k: {"config": cfg, **r} for k, (cfg, r) in infers.items()
                    },
                },
                f,
                indent=2,
            )


if __name__ == "__main__":
    run_script(main, "speed.py")
