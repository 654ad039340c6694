"""Model FLOPs utilisation, in one place: the FLOPs a model spends per token, the peak of the
device it runs on (a datasheet's, or measured), and the meter behind train.py's tokens/s and MFU."""

import functools
import re
import time

import torch

from lib.common import sync

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
    """Training FLOPs per token: 6 per weight of a Linear (2 forward, 4 backward; the other
    embedding tables are looked up, not multiplied), plus 12 L d T for the attention scores and
    their weighted sum of the values. Biases and norm gains, a rounding, are left out."""
    # a set: a table tied to a Linear (GPT's head) is counted once
    weights = {m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)}
    config = model.config
    attention = 12 * config.n_layer * config.n_embd * seq_len
    return 6 * sum(w.numel() for w in weights) + attention


def datasheet_peak(name):
    """The datasheet figure of a device by its name, or 0.0: the longest entry whose words the
    name holds as whole words (an A10G is not an A10, an L40S not an L4, an H100 PCIe not the SXM
    H100)."""
    found = [k for k in DATASHEET_BF16 if re.search(rf"\b{re.escape(k)}\b", name)]
    return DATASHEET_BF16[max(found, key=len)] if found else 0.0


def matmul_flops(device, dtype, n=None, repeats=3):
    """Achievable matmul FLOP/s: the best of a few n x n products, each timed between two syncs.
    n = 8192 on a GPU, where a 2048 product is over about as fast as a launch and a sync."""
    if n is None:
        n = 8192 if torch.device(device).type == "cuda" else 2048
    a, b = torch.randn(2, n, n, device=device, dtype=dtype)
    best = float("inf")
    for _ in range(repeats + 1):  # the first one warms up
        sync(device)
        t0 = time.perf_counter()
        a @ b
        sync(device)
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best


def peak_flops(device, dtype):
    """(FLOP/s, where it came from) for MFU: on a GPU the datasheet's dense bf16/fp16 figure of a
    known device or the measured one, whichever is higher; elsewhere the measured one, too low on a
    busy machine (Speed's clamp)."""
    measured = matmul_flops(device, getattr(torch, dtype))
    if torch.device(device).type == "cuda" and dtype != "float32":
        name = torch.cuda.get_device_name(device)
        sheet = datasheet_peak(name)
        if sheet > measured:
            return sheet, f"{name} datasheet, dense {dtype}"
    return measured, f"measured {dtype} matmul"


class Speed:
    """What a log line reports of the training since the last one: examples (or tokens) per second
    over all the processes, and MFU, the FLOP/s of this device against its peak. Evaluations are
    left out (skip their seconds). clamp: the peak is measured (on CPUs), too low on a busy machine:
    it rises to the achieved rate, so MFU <= 100%."""

    def __init__(self, model, peak, clamp):
        self.peak = peak
        self.clamp = clamp
        # kept per width: counting walks every parameter
        self.flops_per_token = functools.cache(functools.partial(flops_per_token, model))
        self.restart()

    def restart(self):
        self.t0 = time.perf_counter()
        self.items = 0
        self.flops = 0.0

    def add(self, items, idx):
        """A micro-batch of this process: its examples (or tokens), and its tokens idx [B, width]
        for the FLOPs."""
        self.items += items
        self.flops += self.flops_per_token(idx.size(1)) * idx.numel()

    def skip(self, seconds):
        self.t0 += seconds

    def read(self, world_size):
        """(items/s of all the processes, MFU of this one) since the last read."""
        elapsed = time.perf_counter() - self.t0
        achieved = self.flops / elapsed
        if self.clamp:
            self.peak = max(self.peak, achieved)
        rate = self.items * world_size / elapsed
        self.restart()
        return rate, achieved / self.peak
