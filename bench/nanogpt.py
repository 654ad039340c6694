"""
This repository's training beside nanoGPT's on one CPU, in one run, the runs taking turns:
  1. config/shakespeare_char_fast.py start to finish against nanoGPT's CPU recipe (its README's
     command, 2,000 steps) start to finish: wall time and final validation loss of each;
  2. nanoGPT's CPU recipe cut to 300 steps, here (config/shakespeare_char_cpu.py) and there:
     wall time, process start to end.
Both prepare data/shakespeare_char from the same text (--source). Records the CPU's vector
flags and torch's CPU capability beside the figures.
  python bench/nanogpt.py --nanogpt /path/to/nanoGPT \\
      --source ../shared/data/tinyshakespeare/input.txt
"""

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

# run from anywhere: the repository root
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from bench.timing import machine, table  # noqa: E402
from lib.common import ArgumentParser, Error, run_script  # noqa: E402
from lib.options import Option, flags  # noqa: E402
from lib.records import read_metrics  # noqa: E402

# nanoGPT's README: "a baby GPT" on a CPU
NANOGPT_CPU = [
    "config/train_shakespeare_char.py",
    "--device=cpu",
    "--compile=False",
    "--eval_iters=20",
    "--log_interval=1",
    "--block_size=64",
    "--batch_size=12",
    "--n_layer=4",
    "--n_head=4",
    "--n_embd=128",
    "--max_iters=2000",
    "--lr_decay_iters=2000",
    "--dropout=0.0",
]
SHORT = ["--max_iters=300", "--lr_decay_iters=300"]  # the last flag of a key wins in both
FLAGS = {
    "turns": Option(1, "rounds of the four runs"),
    "json": Option(None, "also write the results here"),
}


def prepare(nanogpt, source):
    """Both data/shakespeare_char folders from the same text, each by its own prepare.py."""
    folder = os.path.join(nanogpt, "data", "shakespeare_char")
    if not os.path.isfile(os.path.join(folder, "train.bin")):
        shutil.copy(source, os.path.join(folder, "input.txt"))  # its prepare.py reads it
        subprocess.run([sys.executable, "prepare.py"], cwd=folder, check=True)
    here = os.path.join(ROOT, "data", "shakespeare_char", "prepare.py")
    subprocess.run([sys.executable, here, "--source", source], cwd=ROOT, check=True)


def timed(command, cwd):
    """Runs command to its end -> (seconds, stdout + stderr)."""
    t0 = time.time()
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
    seconds = time.time() - t0
    if result.returncode:
        raise Error(f"{' '.join(command)} failed: {result.stderr.strip()[-500:]}")
    return seconds, result.stdout + result.stderr


def nanogpt_run(nanogpt, extra):
    """nanoGPT's train.py with its CPU recipe -> (seconds, last validation loss)."""
    out_dir = tempfile.mkdtemp(prefix="nanogpt-")
    command = [sys.executable, "train.py", *NANOGPT_CPU, *extra, f"--out_dir={out_dir}"]
    seconds, log = timed(command, nanogpt)
    shutil.rmtree(out_dir)
    return seconds, float(re.findall(r"val loss ([\d.]+)", log)[-1])


def our_run(config, extra):
    """This repository's train.py -> (seconds, last validation loss)."""
    out_dir = tempfile.mkdtemp(prefix="ours-")
    command = [sys.executable, "train.py", config, *extra, f"--out_dir={out_dir}"]
    seconds, _ = timed(command + ["--overwrite_out_dir=True"], ROOT)
    losses = [m["val/loss"] for m in read_metrics(out_dir) if "val/loss" in m]
    shutil.rmtree(out_dir)
    return seconds, losses[-1]


def main(argv=None):
    p = ArgumentParser(prog="nanogpt.py", description=__doc__)
    p.add_argument("--nanogpt", required=True, help="a checkout of karpathy/nanoGPT")
    p.add_argument("--source", required=True, help="Tiny Shakespeare's input.txt")
    flags(p, FLAGS)
    args = p.parse_args(argv)
    if not os.path.isfile(os.path.join(args.nanogpt, "config", "train_shakespeare_char.py")):
        raise Error(f"--nanogpt={args.nanogpt}: not a nanoGPT checkout")
    prepare(args.nanogpt, args.source)
    ours_short = ("config/shakespeare_char_cpu.py", SHORT)
    runs = [
        ("nanoGPT, 2,000 steps", nanogpt_run, (args.nanogpt, [])),
        ("config/shakespeare_char_fast.py", our_run, ("config/shakespeare_char_fast.py", [])),
        ("nanoGPT, 300 steps", nanogpt_run, (args.nanogpt, SHORT)),
        ("config/shakespeare_char_cpu.py, 300 steps", our_run, ours_short),
    ]
    results = {name: [] for name, _, _ in runs}
    for _ in range(args.turns):
        for name, run, run_args in runs:
            results[name].append(run(*run_args))
            print(name, *results[name][-1], file=sys.stderr)
    wall = {name: statistics.median(s for s, _ in rs) for name, rs in results.items()}
    fast = wall["config/shakespeare_char_fast.py"] / wall["nanoGPT, 2,000 steps"]
    speed = wall["nanoGPT, 300 steps"] / wall["config/shakespeare_char_cpu.py, 300 steps"]
    info = machine("cpu")
    print(f"\n{info['name']}, {info['capability']}, flags {' '.join(info['flags'])}")
    table(
        "Beside nanoGPT, start to finish (s, each turn; the last validation loss)",
        ["run", "wall s", "val loss"],
        [
            [name, ", ".join(f"{s:.1f}" for s, _ in rs), ", ".join(f"{v:.4f}" for _, v in rs)]
            for name, rs in results.items()
        ],
    )
    print(f"\nthe fast recipe's wall time / nanoGPT's: {fast:.2f}x (medians)")
    print(f"nanoGPT's 300 steps, its wall time / ours: {speed:.2f}x (our speed over its)")
    if args.json:
        summary = dict(machine=info, runs=results, fast_over_nanogpt=fast, speed_300=speed)
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)


if __name__ == "__main__":
    run_script(main, "nanogpt.py")
