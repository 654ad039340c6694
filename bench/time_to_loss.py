"""Wall time to a validation loss: whole `python train.py` runs side by side, and a plot."""

import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

from tqdm import tqdm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from bench.timing import table
from lib.common import Error
from lib.records import read_metrics
from plot import pyplot


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
