"""
Benchmarks on one device, in one run; prints markdown tables ready to paste into BENCHMARKS.md.
Each part's measurement and table live in a module named for what it measures: bench/timing.py
(the matmul peak), bench/steps.py (training steps, AdamW, the classifier), bench/kv_cache.py,
bench/attention.py and bench/time_to_loss.py.
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

import json
import os
import statistics
import sys
import tempfile
import time

import torch
from tqdm import tqdm

# run from anywhere: the repository root
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from bench.attention import ATTENTION_PATHS, bench_attention, report_attention
from bench.kv_cache import bench_generate, report_generation
from bench.steps import (
    CONFIGS,
    META_FALLBACK,
    MODES,
    OPTIMIZERS,
    bench_classify_inference,
    bench_optimizer,
    bench_train,
    load_shape,
    profile_train,
    report_classify,
    report_optimizers,
    report_train,
)
from bench.time_to_loss import time_to_loss
from bench.timing import bench_matmul, machine, table, two
from lib.common import ArgumentParser, pick_device, run_script
from lib.options import DEVICE_OPTION, Option, flags

FLAGS = {
    "device": DEVICE_OPTION,
    "repeats": Option(5, "timed repeats per figure, after one warm-up", ge=1),
    "quick": Option(
        False,
        "2 repeats, n = 128 and 512, 100 new tokens, training batches of at most 4 rows, "
        "torch.compile on the first config only",
    ),
    "no-compile": Option(False, "skip the torch.compile measurements"),
    "target": Option(
        1.8818,
        "with --time_to_loss: the validation loss to reach, what config/shakespeare_char_cpu.py "
        "reaches",
    ),
    "png": Option("time_to_loss.png", "with --time_to_loss: the plot"),
}


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
    report_train(trains, peaks)
    report_optimizers(optims)
    report_generation(gens)
    report_attention(attns, peaks)
    report_classify(trains, infers)
    for note in notes:
        print(f"\nNote: {note}")


def main(argv=None):
    p = ArgumentParser(prog="speed.py", description=__doc__)
    flags(p, FLAGS)
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
