"""
The tokenizers side by side on one corpus: each prepares it with data/text/prepare.py (the same
documents in val for all, by their hash), then trains config/text.py's model for the same steps,
and the table gives each one's tokens per byte, the wall time of training the tokenizer, the best
val loss and val bits per byte (the loss that compares across vocabularies), the training's wall
time, and each run's val bits per byte at the wall time of the fastest (its last evaluation by
then). Run nothing else beside it: the times are its own.
  TIKTOKEN_CACHE_DIR=../shared/tiktoken_cache \
  python bench/vocabularies.py --source ../shared/data/tinyshakespeare/input.txt --work /tmp/tok
"""

import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from lib.common import ArgumentParser, run_script  # noqa: E402
from lib.options import Option, flags  # noqa: E402
from lib.records import read_metrics  # noqa: E402

# (name, prepare.py's tokenizer options)
TOKENIZERS = [
    ("char", ["--tokenizer=char"]),
    ("gpt2", ["--tokenizer=gpt2"]),
    ("bpe-1024", ["--tokenizer=bpe", "--vocab_size=1024"]),
    ("bpe-4096", ["--tokenizer=bpe", "--vocab_size=4096"]),
]
FLAGS = {"max_iters": Option(1000, "each run's steps")}


def run(command):
    """Runs command from the repository root; returns its stdout (its stderr passes through)."""
    print("$", " ".join(command), file=sys.stderr, flush=True)
    done = subprocess.run(command, cwd=ROOT, stdout=subprocess.PIPE, text=True, check=True)
    return done.stdout


def main():
    p = ArgumentParser(description=__doc__)
    p.add_argument("--source", required=True, help="the corpus, as prepare.py's --source")
    p.add_argument("--work", required=True, help="a folder for the data and the runs")
    flags(p, FLAGS)
    args = p.parse_args()
    rows = []
    runs = []
    for name, options in TOKENIZERS:
        data = os.path.join(args.work, name)
        out = os.path.join(args.work, "out-" + name)
        prepare = [sys.executable, "data/text/prepare.py", "--source", args.source]
        printed = run(prepare + options + ["--out_dir", data])
        trained = re.search(r"in ([0-9.]+) s\n", printed)
        with open(os.path.join(data, "meta.json")) as f:
            meta = json.load(f)
        train = [sys.executable, "train.py", "config/text.py", f"--dataset={data}"]
        steps = f"--max_iters={args.max_iters}", f"--lr_decay_iters={args.max_iters}"
        run(train + [f"--out_dir={out}", *steps, "--dtype=float32", "--overwrite_out_dir=True"])
        evaluations = [r for r in read_metrics(out) if "val/bpb" in r]
        runs.append(evaluations)
        best = min(evaluations, key=val_loss)
        rows.append(
            [
                name,
                f"{meta['vocab_size']:,}",
                f"{meta['splits']['val'] / meta['bytes']['val']:.3f}",
                trained.group(1) if trained else "-",
                f"{best['val/loss']:.4f}",
                f"{best['val/bpb']:.4f}",
                str(best["step"]),
                f"{evaluations[-1]['seconds']:.0f}",
            ]
        )
    fastest = min(evaluations[-1]["seconds"] for evaluations in runs)
    for row, evaluations in zip(rows, runs):
        by_then = [r for r in evaluations if r["seconds"] <= fastest][-1]
        row.append(f"{by_then['val/bpb']:.4f} (step {by_then['step']})")
    print(
        "| tokenizer | vocabulary | val tokens per byte | tokenizer training (s) | best val loss ",
        end="",
    )
    print(
        f"| its val bits per byte | at step | training (s) | val bits per byte at {fastest:.0f} s |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for row in rows:
        print("| " + " | ".join(row) + " |")


def val_loss(record):
    return record["val/loss"]


if __name__ == "__main__":
    run_script(main, "vocabularies.py")
