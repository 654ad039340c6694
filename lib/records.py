"""What a run records: metrics.jsonl (its evaluations and log steps, a JSON line each, mirrored
to wandb), and its speed: the FLOPs a model spends per token, the datasheet peak of known GPUs,
and the meter behind train.py's tokens/s and MFU (none where the device has no datasheet entry)."""

import functools
import io
import json
import os
import re
import sys
import time
from dataclasses import asdict

import torch

from lib.common import Error, check_regular, parse_json, read_utf8
from lib.files import atomic_path, write_json, writing


def read_metrics(out_dir):
    """The records of out_dir/metrics.jsonl; a torn last line (a cut-short write) is dropped with
    a warning."""
    path = os.path.join(out_dir, "metrics.jsonl")
    check_regular(path)
    missing = f"{path}: no such file: point at an out_dir that train.py wrote"
    text = read_utf8(path, missing, f"{path}: not a readable metrics file")
    lines = io.StringIO(text).readlines()  # as the file's readlines() gives them
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


# Dense (not sparse) bf16/fp16 tensor-core FLOP/s from the vendors' datasheets, by name
DATASHEET_BF16 = {
    "H200": 989e12,
    "H100": 989e12,
    "H100 PCIe": 756e12,
    "H100 NVL": 835e12,
    "A100": 312e12,
    "L40S": 362e12,
    "L4": 121e12,
    "A10": 125e12,
    "RTX 4090": 165e12,
    "RTX 3090": 71e12,
}


def flops_per_token(model, seq_len):
    """Training FLOPs per token: 6 per weight of a Linear (2 forward, 4
    backward), plus 12 L d T for the attention scores and their weighted
    sum of the values. Biases and norm gains are left out."""
    # a set: a table tied to a Linear (GPT's head) is counted once
    weights = {m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)}
    config = model.config
    attention = 12 * config.n_layer * config.n_embd * seq_len
    return 6 * sum(w.numel() for w in weights) + attention


def datasheet_peak(name):
    """The datasheet figure of a device by its name, or None: the longest
    entry the name holds as whole words (an A10G is not an A10)."""
    found = [k for k in DATASHEET_BF16 if re.search(rf"\b{re.escape(k)}\b", name)]
    return DATASHEET_BF16[max(found, key=len)] if found else None


def peak_flops(device, dtype):
    """The peak FLOP/s that MFU is measured against: a known GPU's in
    bfloat16 or float16, else None."""
    if torch.device(device).type != "cuda" or dtype == "float32":
        return None
    return datasheet_peak(torch.cuda.get_device_name(device))


class Speed:
    """Examples (or tokens) per second over all the processes since the
    last read, and MFU against peak (None: no MFU); evaluations are
    left out (skip their seconds)."""

    def __init__(self, model, peak):
        self.peak = peak
        # kept per width: counting walks every parameter
        self.flops_per_token = functools.cache(functools.partial(flops_per_token, model))
        self.restart()

    def restart(self):
        self.t0 = time.perf_counter()
        self.items = 0
        self.flops = 0.0

    def add(self, items, idx):
        """A micro-batch of this process: its examples (or tokens), and
        its tokens idx [B, width] for the FLOPs."""
        self.items += items
        self.flops += self.flops_per_token(idx.size(1)) * idx.numel()

    def skip(self, seconds):
        self.t0 += seconds

    def read(self, world_size):
        """(items/s of all the processes, MFU of this one or None)."""
        elapsed = time.perf_counter() - self.t0
        rate = self.items * world_size / elapsed
        mfu = self.flops / elapsed / self.peak if self.peak else None
        self.restart()
        return rate, mfu
