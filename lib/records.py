"""Run records: each evaluation and log step as one JSON line in out_dir/metrics.jsonl, mirrored to wandb when asked,
and the loss curves drawn from those files (train.py's out_dir/loss.png; plot.py's several runs on one axis)."""
import functools
import json
import os
import time

from lib.common import Error, atomic_path


class RunRecord:
    """Appends {"step", "seconds", "time", ...metrics} lines to out_dir/metrics.jsonl and logs the same to wandb, if
    given. seconds: since this run's start, plus a resumed run's earlier ones; time: Unix time, to line runs up."""

    def __init__(self, out_dir, wandb_run=None, resumed_seconds=0.0, resumed_step=None):
        """A new run starts the file afresh; a resumed one keeps the lines before the step it resumes from (a run
        that crashed after its last save had logged steps that it will now run again)."""
        self.path, self.wandb = os.path.join(out_dir, "metrics.jsonl"), wandb_run
        self.t0 = time.perf_counter() - resumed_seconds
        kept = [] if resumed_step is None or not os.path.isfile(self.path) else \
            [line for line in open(self.path) if line.strip() and self.before(json.loads(line), resumed_step)]
        with atomic_path(self.path) as tmp, open(tmp, "w") as f:
            f.writelines(kept)

    @staticmethod
    def before(record, step):
        """Whether a record precedes the state at step: its log lines up to step (each written after the update that
        made it), its evaluations before step (a resumed run evaluates at its first step again)."""
        return record["step"] < step or record["step"] == step and "val/loss" not in record

    def seconds(self):
        return time.perf_counter() - self.t0

    def log(self, step, **metrics):
        with open(self.path, "a") as f:
            f.write(json.dumps({"step": step, "seconds": round(self.seconds(), 3), "time": round(time.time(), 3),
                                **metrics}) + "\n")
        if self.wandb:
            self.wandb.log(metrics, step=step)


class Speed:
    """What a log line reports of the training since the last one: examples (or tokens) per second over all the
    processes, and MFU, the FLOP/s of this device against its peak. Evaluations are left out (skip their seconds).
    clamp: the peak is measured (on CPUs), too low on a busy machine: it rises to the achieved rate, so MFU <= 100%.
    flops_per_token(width): the model's training FLOPs per token, kept per width (it walks the parameters)."""

    def __init__(self, peak, clamp, flops_per_token):
        self.peak, self.clamp, self.flops_per_token = peak, clamp, functools.cache(flops_per_token)
        self.restart()

    def restart(self):
        self.t0, self.items, self.flops = time.perf_counter(), 0, 0.0

    def add(self, items, idx):
        """A micro-batch of this process: its examples (or tokens), and its tokens idx [B, width] for the FLOPs."""
        self.items, self.flops = self.items + items, self.flops + self.flops_per_token(idx.size(1)) * idx.numel()

    def skip(self, seconds):
        self.t0 += seconds

    def read(self, world_size):
        """(items/s of all the processes, MFU of this one) since the last read."""
        elapsed = time.perf_counter() - self.t0
        achieved = self.flops / elapsed
        self.peak = max(self.peak, achieved) if self.clamp else self.peak
        rate = self.items * world_size / elapsed
        self.restart()
        return rate, achieved / self.peak


def start_wandb(settings, n_params):
    """A wandb run (files in out_dir/wandb) named wandb_run_name or after out_dir and start time; settings: a dict."""
    import wandb
    out_dir = settings["out_dir"]
    stamp = time.strftime("%Y%m%d-%H%M%S")
    name = settings["wandb_run_name"] or f"{os.path.basename(os.path.abspath(out_dir))}-{stamp}"
    run = wandb.init(project=settings["wandb_project"], name=name, config=settings, dir=out_dir)
    run.summary["parameters"] = n_params
    return run


def read_metrics(out_dir):
    """The lines of out_dir/metrics.jsonl, in order."""
    path = os.path.join(out_dir, "metrics.jsonl")
    if not os.path.isfile(path):
        raise Error(f"{path}: no such file: point at an out_dir that train.py wrote")
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError) as e:
        raise Error(f"{path}: not a readable metrics file ({type(e).__name__}): was it cut short?") from None


def plot_runs(out_dirs, path, x="step"):
    """Validation (solid) and training (dashed) loss of each run against step or seconds, one colour a run; a second
    panel with validation accuracy when any run is a classifier. Saved to path (PNG, SVG, PDF: by its extension)."""
    if not path.lower().endswith((".png", ".svg", ".pdf")) or not os.path.isdir(os.path.dirname(os.path.abspath(path))):
        raise Error(f"{path}: give an image path ending in .png, .svg or .pdf, in an existing folder")
    plt = pyplot()
    runs = {d: [r for r in read_metrics(d) if "val/loss" in r] for d in out_dirs}
    accuracy = any("val/accuracy" in r for rows in runs.values() for r in rows)
    fig, axes = plt.subplots(1, 1 + accuracy, figsize=(7 + 5 * accuracy, 4.5), squeeze=False, layout="constrained")
    for i, (d, rows) in enumerate(runs.items()):
        colour, label, xs = f"C{i % 10}", os.path.basename(os.path.abspath(d)), [r[x] for r in rows]
        axes[0][0].plot(xs, [r["val/loss"] for r in rows], "-o", color=colour, markersize=3, label=f"{label} val")
        axes[0][0].plot(xs, [r["train/loss"] for r in rows], "--", color=colour, label=f"{label} train")
        if accuracy:
            axes[0][1].plot(xs, [r.get("val/accuracy") for r in rows], "-o", color=colour, markersize=3, label=label)
    axes[0][0].set(xlabel=x, ylabel="loss (evaluation batches)", title="loss")
    if accuracy:
        axes[0][1].set(xlabel=x, ylabel="validation accuracy", title="accuracy")
    for ax in axes[0]:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def pyplot():
    """matplotlib's pyplot drawing into files only (no window), with plain-text labels ("$5" is not TeX)."""
    import matplotlib
    matplotlib.use("Agg")
    matplotlib.rcParams["text.parse_math"] = False
    import matplotlib.pyplot as plt
    return plt
