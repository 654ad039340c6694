"""Run records: each evaluation and log step as one JSON line in out_dir/metrics.jsonl, mirrored to
wandb when asked (plot.py draws the loss curves from those files)."""

import json
import os
import time

from lib.common import atomic_path


class RunRecord:
    """Appends {"step", "seconds", "time", ...metrics} lines to out_dir/metrics.jsonl and logs the
    same to wandb, if given. seconds: since this run's start, plus a resumed run's earlier ones;
    time: Unix time, to line runs up."""

    def __init__(self, out_dir, wandb_run=None, resumed_seconds=0.0, resumed_step=None):
        """A new run starts the file afresh; a resumed one keeps the lines before the step it
        resumes from (a run that crashed after its last save had logged steps that it will now run
        again)."""
        self.path = os.path.join(out_dir, "metrics.jsonl")
        self.wandb = wandb_run
        self.t0 = time.perf_counter() - resumed_seconds
        kept = []
        if resumed_step is not None and os.path.isfile(self.path):
            for line in open(self.path):
                if line.strip() and self.before(json.loads(line), resumed_step):
                    kept.append(line)
        with atomic_path(self.path) as tmp, open(tmp, "w") as f:
            f.writelines(kept)

    @staticmethod
    def before(record, step):
        """Whether a record precedes the state at step: its log lines up to step (each written
        after the update that made it), its evaluations before step (a resumed run evaluates at
        its first step again)."""
        if record["step"] == step:
            return "val/loss" not in record
        return record["step"] < step

    def seconds(self):
        return time.perf_counter() - self.t0

    def log(self, step, **metrics):
        seconds = round(self.seconds(), 3)
        now = round(time.time(), 3)
        line = json.dumps({"step": step, "seconds": seconds, "time": now, **metrics})
        with open(self.path, "a") as f:
            f.write(line + "\n")
        if self.wandb:
            self.wandb.log(metrics, step=step)
