"""Run records: each evaluation and log step as one JSON line in out_dir/metrics.jsonl, mirrored to wandb when asked
(plot.py draws the loss curves from those files), and the speed meter behind the log lines' rate and MFU."""

import functools
import json
import os
import time

from lib.common import atomic_path


class RunRecord:
    """Appends {"step", "seconds", "time", ...metrics} lines to out_dir/metrics.jsonl and logs the same to wandb, if
    given. seconds: since this run's start, plus a resumed run's earlier ones; time: Unix time, to line runs up."""

    def __init__(self, out_dir, wandb_run=None, resumed_seconds=0.0, resumed_step=None):
        """A new run starts the file afresh; a resumed one keeps the lines before the step it resumes from (a run
        that crashed after its last save had logged steps that it will now run again)."""
        self.path, self.wandb = os.path.join(out_dir, "metrics.jsonl"), wandb_run
        self.t0 = time.perf_counter() - resumed_seconds
        kept = (
            []
            if resumed_step is None or not os.path.isfile(self.path)
            else [
                line
                for line in open(self.path)
                if line.strip() and self.before(json.loads(line), resumed_step)
            ]
        )
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
            f.write(
                json.dumps(
                    {
                        "step": step,
                        "seconds": round(self.seconds(), 3),
                        "time": round(time.time(), 3),
                        **metrics,
                    }
                )
                + "\n"
            )
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
        self.items, self.flops = (
            self.items + items,
            self.flops + self.flops_per_token(idx.size(1)) * idx.numel(),
        )

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
