"""metrics.jsonl: a run's evaluations and log steps, a JSON line each, mirrored to wandb."""

import json
import os
import sys
import time
from dataclasses import asdict

from lib.common import Error, check_regular, parse_json
from lib.files import atomic_path, write_json, writing


def read_metrics(out_dir):
    """The records of out_dir/metrics.jsonl; a torn last line (a cut-short write) is dropped with
    a warning."""
    path = os.path.join(out_dir, "metrics.jsonl")
    check_regular(path)
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.readlines()
    except FileNotFoundError:
        raise Error(f"{path}: no such file: point at an out_dir that train.py wrote") from None
    except (OSError, UnicodeDecodeError) as e:
        raise Error(f"{path}: not a readable metrics file ({type(e).__name__})") from None
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = parse_json(line)
        except Error:
            record = None
        # a record: an object whose step is an int (not a bool)
        if isinstance(record, dict) and type(record.get("step")) is int:
            records.append(record)
        elif number == len(lines):
            sys.stderr.write(
                f"warning: {path}:{number}: dropped a torn last line (a cut-short write)\n"
            )
        else:
            raise Error(
                f"{path}:{number}: not a record with an integer 'step': repair or delete that line"
            )
    return records


class RunRecord:
    """Appends {"step", "seconds", "time", ...metrics} lines to metrics.jsonl, and to wandb."""

    def __init__(self, out_dir, settings, wandb_run, resumed_seconds, resumed_step):
        """A resumed run keeps the lines before its step; settings go to train_config.json."""
        self.path = os.path.join(out_dir, "metrics.jsonl")
        self.wandb = wandb_run
        self.t0 = time.perf_counter() - resumed_seconds
        kept = []
        if resumed_step is not None and os.path.isfile(self.path):
            # the lines before the resumed state: the evaluation at its step runs again
            kept = [
                json.dumps(r) + "\n"
                for r in read_metrics(out_dir)
                if r["step"] < resumed_step or (r["step"] == resumed_step and "val/loss" not in r)
            ]
        write_json(os.path.join(out_dir, "train_config.json"), settings)
        with atomic_path(self.path) as tmp, open(tmp, "w") as f:
            f.writelines(kept)

    def seconds(self):
        return time.perf_counter() - self.t0

    def log(self, step, **metrics):
        seconds = round(self.seconds(), 3)
        now = round(time.time(), 3)
        line = json.dumps({"step": step, "seconds": seconds, "time": now, **metrics}) + "\n"
        with writing(self.path), open(self.path, "a") as f:
            f.write(line)
        if self.wandb:
            self.wandb.log(metrics, step=step)


def start_wandb(cfg, parameters):
    """The run's wandb run, its files in out_dir/wandb."""
    import wandb

    folder = os.path.basename(os.path.abspath(cfg.out_dir))
    name = cfg.wandb_run_name or f"{folder}-{time.strftime('%Y%m%d-%H%M%S')}"
    run = wandb.init(project=cfg.wandb_project, name=name, config=asdict(cfg), dir=cfg.out_dir)
    run.summary["parameters"] = parameters
    return run
