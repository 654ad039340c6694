"""Model FLOPs utilisation: the FLOPs a model spends per token, the
datasheet peak of known GPUs, and the meter behind train.py's tokens/s
and MFU. Where the device has no datasheet entry, no MFU is shown."""

import functools
import re
import time

import torch

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
