"""
Sparse attention patterns against full attention, side by side in one run on one device:
  1. cost against n: a training step (forward + backward, the best of 3) of a 4 x 128 GPT, one
     row of n = 1,024 ... 8,192 tokens, full causal attention against a window of 128 and
     BigBird (window 128, 2 global tokens, 3 random links): time, the step's peak memory above
     the model's, and the exponent of a power law fitted to each curve;
  2. quality: config/shakespeare_char_window.py trained as it is, with full attention and as
     BigBird (same model, steps and batches): validation loss and wall time;
  3. endless generation from the windowed checkpoint: 4,000 tokens, tokens/s (the best of 3
     runs) and peak memory per 500, and the cached tokens against the uncached model's (every
     step the whole sequence from scratch) on a run past block_size.
  python bench/patterns.py [--skip_quality] [--png bench/figures/patterns_cost.png]
  python bench/patterns.py --picture docs/patterns.png     the notes' four patterns, drawn
Prints markdown tables for BENCHMARKS.md; needs data/shakespeare_char prepared for 2 and 3.
"""

import ctypes
import json
import math
import os
import subprocess
import sys
import time

import torch

# run from anywhere: the repository root
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from decoding import NextToken, Options  # noqa: E402
from engine import Engine  # noqa: E402
from lib.common import ArgumentParser, Error, run_script  # noqa: E402
from lib.options import Option, flags  # noqa: E402
from lib.weights import from_checkpoint  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402
from patterns import Pattern  # noqa: E402

PATTERNS = {
    "full": {},
    "window 128": dict(window=128),
    "BigBird": dict(window=128, global_tokens=2, random_links=3),
}
CONFIG = "config/shakespeare_char_window.py"
OUT = "out-shakespeare-char-window"
FLAGS = {
    "ns": Option("1024,2048,4096,8192", "the row lengths n that part 1 times, comma-separated"),
    "skip_quality": Option(False, "skip part 2's trainings"),
    "png": Option("", "also plot part 1's times into this image"),
    "tokens": Option(4000, "part 3's tokens generated"),
    "out_dir": Option(os.path.join(ROOT, OUT), "the windowed checkpoint"),
    "picture": Option("", "draw the four patterns there and stop"),
}


def rss():
    """(current, peak since the last reset) resident memory of this process, MiB."""
    with open("/proc/self/status") as f:
        fields = dict(line.split(":", 1) for line in f)
    return [int(fields[k].split()[0]) / 1024 for k in ("VmRSS", "VmHWM")]


def reset_peak():
    ctypes.CDLL("libc.so.6").malloc_trim(0)  # freed memory back to the system: RSS is what is held
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the peak resident memory starts again from the current


def cost(ns, repeats=3):
    """{pattern: [(n, seconds, peak MiB above the start)]}: the best of repeats timed steps after
    a warm-up (a shared CPU's noise only ever adds)."""
    results = {name: [] for name in PATTERNS}
    for n in ns:
        for name, options in PATTERNS.items():
            torch.manual_seed(0)
            config = GPTConfig(
                vocab_size=65, block_size=n, n_layer=4, n_head=4, n_embd=128, **options
            )
            model = GPT(config)
            idx = torch.randint(0, 65, (1, n))

            train_step(model, idx)  # the block mask is built once per length, here
            model.zero_grad(set_to_none=True)
            reset_peak()
            start = rss()[0]
            times = []
            for _ in range(repeats):
                began = time.perf_counter()
                train_step(model, idx)
                times.append(time.perf_counter() - began)
                model.zero_grad(set_to_none=True)
            seconds = min(times)
            results[name].append((n, seconds, rss()[1] - start))
            print(f"n={n} {name}: {seconds:.3f} s", file=sys.stderr, flush=True)
            del model
    return results


def train_step(model, idx):
    _, loss = model(idx, idx)
    loss.backward()


def exponent(points):
    """The slope of log time against log n, least squares."""
    xs = [math.log(n) for n, _, _ in points]
    ys = [math.log(s) for _, s, _ in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def quality():
    """{pattern: (final val loss, wall seconds)} of the config trained three ways."""
    overrides = {
        "full": ["--window=0"],
        "window 128": [],
        "BigBird": ["--global_tokens=2", "--random_links=3"],
    }
    results = {}
    for name, extra in overrides.items():
        out = OUT if name == "window 128" else f"{OUT}-{name.split()[0].lower()}"
        command = [sys.executable, "train.py", CONFIG, f"--out_dir={out}"]
        command += ["--overwrite_out_dir=True", *extra]
        began = time.perf_counter()
        subprocess.run(command, cwd=ROOT, check=True, stderr=subprocess.DEVNULL)
        seconds = time.perf_counter() - began
        with open(os.path.join(ROOT, out, "metrics.jsonl")) as f:
            losses = [r["val/loss"] for r in map(json.loads, f) if "val/loss" in r]
        results[name] = (losses[-1], seconds)
        print(f"{name}: val {losses[-1]:.4f}, {seconds:.0f} s", file=sys.stderr, flush=True)
    return results


def endless(out, tokens=4000, chunk=500, prompt=1000, checked=150, rounds=3):
    """(per chunk: the best tokens/s of rounds runs, the largest peak MiB; whether the cached and
    uncached runs agree) from the windowed checkpoint, greedy from a newline; the check continues
    the sample's first prompt tokens by checked more, past block_size."""
    model, _ = from_checkpoint(out)
    timed = []  # per round, per chunk: (tokens/s, peak MiB)
    for _ in range(rounds):
        engine = Engine(model, rows=1)
        row = engine.submit([0], [NextToken(Options(), greedy=True)], tokens).rows[0]
        chunks = []
        while engine.busy():
            reset_peak()
            began = time.perf_counter()
            done = len(row.generated)
            while engine.busy() and len(row.generated) < done + chunk:
                engine.step()
            rate = (len(row.generated) - done) / (time.perf_counter() - began)
            chunks.append((rate, rss()[1]))
        timed.append(chunks)
    chunks = [(max(r for r, _ in c), max(m for _, m in c)) for c in zip(*timed)]
    model.config.attn_impl = "explicit"  # the uncached model on its dense mask
    runs = []
    for use_cache in (True, False):
        engine = Engine(model, rows=1, use_cache=use_cache)
        start = row.tokens[:prompt]
        request = engine.submit(start, [NextToken(Options(), greedy=True)], checked)
        while engine.busy():
            engine.step()
        runs.append(request.rows[0].generated)
    return chunks, runs[0] == runs[1]


def plot(results, png):
    from matplotlib import ticker

    from plot import pyplot

    plt = pyplot()
    fig, (ax_time, ax_memory) = plt.subplots(1, 2, figsize=(10, 4), layout="constrained")
    for name, points in results.items():
        ns = [n for n, _, _ in points]
        ax_time.plot(
            ns, [s for _, s, _ in points], "o-", label=f"{name} (n^{exponent(points):.2f})"
        )
        ax_memory.plot(ns, [m for _, _, m in points], "o-", label=name)
    for ax, label in ((ax_time, "seconds per step"), (ax_memory, "peak MiB above the model")):
        ax.set(xscale="log", yscale="log", xlabel="tokens n", ylabel=label)
        ax.set_xticks([n for n, _, _ in points], [f"{n:,}" for n, _, _ in points])
        # plain-text tick labels (plot turns TeX off): the n's alone across, numbers up
        ax.xaxis.set_minor_formatter(ticker.NullFormatter())
        ax.yaxis.set_major_formatter(ticker.FormatStrFormatter("%g"))
        ax.yaxis.set_minor_formatter(ticker.LogFormatter(labelOnlyBase=False))
        ax.legend()
    fig.suptitle("one training step of a 4 x 128 GPT: full causal attention against patterns")
    fig.savefig(png, dpi=110)


def picture(png, n=16):
    """The notes' four patterns of an encoder (no causal cut) over n positions, queries down, keys
    across, drawn from the model's own mask function."""
    from plot import pyplot

    plt = pyplot()
    panels = {
        "random (2 links a query)": dict(random_links=2),
        "window (3 each side)": dict(window=4),
        "global (first 2 tokens)": dict(global_tokens=2),
        "BigBird (all three)": dict(random_links=2, window=4, global_tokens=2),
    }
    fig, axes = plt.subplots(1, 4, figsize=(12, 3.4), layout="constrained")
    for ax, (title, options) in zip(axes, panels.items()):
        pattern = Pattern(GPTConfig(block_size=n, **options), causal=False)
        ax.imshow(pattern.dense(n, "cpu"), cmap="Blues", vmin=0, vmax=1.4)
        ax.set(title=title, xticks=[], yticks=[], xlabel="keys", ylabel="queries")
    fig.savefig(png, dpi=110)


def main():
    parser = ArgumentParser(prog="patterns.py", description=__doc__.split("\n")[1])
    flags(parser, FLAGS)
    a = parser.parse_args()
    if a.picture:
        return picture(a.picture)
    checkpoint = os.path.join(a.out_dir, "config.json")
    if a.skip_quality and not os.path.isfile(checkpoint):  # found before minutes of timing
        raise Error(
            f"--out_dir={a.out_dir}: no checkpoint there: drop --skip_quality (it trains one)"
        )
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    results = cost([int(n) for n in a.ns.split(",")])
    print("\n| n | " + " | ".join(f"{name}: s, MiB" for name in results) + " |")
    print("|---|" + "---|" * len(results))
    for i, (n, _, _) in enumerate(results["full"]):
        cells = [f"{p[i][1]:.3f}, {p[i][2]:,.0f}" for p in results.values()]
        print(f"| {n:,} | " + " | ".join(cells) + " |")
    fitted = ", ".join(f"{name} n^{exponent(p):.2f}" for name, p in results.items())
    print(f"\nfitted exponents: {fitted}")
    for name in ("window 128", "BigBird"):
        pairs = zip(results["full"], results[name])
        speedups = [f"{f[0]:,}: {f[1] / p[1]:.2f}x" for f, p in pairs]
        print(f"full / {name} time at n = " + ", ".join(speedups))
    if a.png:
        plot(results, a.png)
    if not a.skip_quality:
        print("\n| attention | val loss | wall time, s |\n|---|---|---|")
        for name, (loss, seconds) in quality().items():
            print(f"| {name} | {loss:.4f} | {seconds:.0f} |")
    chunks, same = endless(a.out_dir, a.tokens)
    print("\n| tokens | tokens/s, best of 3 | peak MiB |\n|---|---|---|")
    for i, (rate, peak) in enumerate(chunks):
        print(f"| {i * 500 + 1:,}-{(i + 1) * 500:,} | {rate:.1f} | {peak:,.0f} |")
    print(f"\n150 tokens after the sample's first 1,000, cached == uncached: {same}")


if __name__ == "__main__":
    run_script(main, "patterns.py")
