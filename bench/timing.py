"""How the benchmarks take their figures: calls timed after a warm-up, rates at the best and the
median time, the machine they ran on, its matmul peak and memory bandwidth; markdown tables."""

import os
import platform
import statistics
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from lib.common import native_bf16


def sync(device):
    """Wait for the device's queued work (timing)."""
    kind = torch.device(device).type
    if kind == "cuda":
        torch.cuda.synchronize(device)
    elif kind == "mps":
        torch.mps.synchronize()


def timed(fn, repeats, device, warm_fn=None):
    """Seconds per call of fn, repeats times, after one warm-up call of warm_fn (default fn), and
    the warm-up time."""
    t0 = time.perf_counter()
    (warm_fn or fn)()
    sync(device)
    warmup_s, times = time.perf_counter() - t0, []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return {
        "times_s": times,
        "min_s": min(times),
        "median_s": statistics.median(times),
        "warmup_s": warmup_s,
    }


def rates(r, work, unit):
    """Add work per second at the best (min) and the median time: r[unit + '_best'],
    r[unit + '_median']."""
    r[f"{unit}_best"], r[f"{unit}_median"] = work / r["min_s"], work / r["median_s"]
    return r


def machine(device):
    name = (
        torch.cuda.get_device_name(device)
        if device.startswith("cuda")
        else platform.processor() or platform.machine()
    )
    if device == "cpu" and os.path.isfile("/proc/cpuinfo"):
        name = next(
            (
                line.split(":", 1)[1].strip()
                for line in open("/proc/cpuinfo")
                if line.startswith("model name")
            ),
            name,
        )
    return {
        "device": device,
        "name": name,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpu_cores": os.cpu_count(),
        "cpu_bf16": native_bf16("cpu"),
        # the vector flags that decide the CPU's kernels, and torch's reading of them
        "flags": cpu_flags(),
        "capability": torch.backends.cpu.get_cpu_capability(),
        "python": platform.python_version(),
        "load_average": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
    }  # other jobs skew CPU timings


def cpu_flags():
    """lscpu's AVX, AMX and FMA flags."""
    if not os.path.isfile("/proc/cpuinfo"):
        return []
    line = next(x for x in open("/proc/cpuinfo") if x.startswith("flags"))
    return [f for f in line.split()[2:] if f.startswith(("avx", "amx", "fma"))]


def matmul_flops(device, dtype, n, repeats=3):
    """Achievable matmul FLOP/s: the best of a few n x n products, each timed between two
    syncs (the first one warms up)."""
    a, b = torch.randn(2, n, n, device=device, dtype=dtype)
    best = float("inf")
    for _ in range(repeats + 1):
        sync(device)
        t0 = time.perf_counter()
        a @ b
        sync(device)
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best


def bench_matmul(device, dtype, n, repeats):
    """matmul_flops once per repeat (each call warms up, then times one n x n product):
    FLOP/s samples."""
    return [matmul_flops(device, dtype, n=n, repeats=1) for _ in range(repeats)]


@torch.no_grad()
def median_pass(x, layers, repeats):
    """The median seconds of repeats passes of x through every layer (after one untimed)."""
    times = []
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        for layer in layers:
            layer(x)
        times.append(time.perf_counter() - t0)
    return sorted(times[1:])[repeats // 2]


def bandwidth(megabytes=256, repeats=5):
    """Bytes per second a sum reads: the best of repeats sums over megabytes of float32."""
    x = torch.ones(megabytes * 2**20 // 4)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - t0)
    return x.numel() * 4 / best


def two(r, unit, fmt="{:,.0f}", scale=1):
    if "error" in r:
        return r["error"]
    return f"{fmt.format(scale * r[unit + '_best'])} / {fmt.format(scale * r[unit + '_median'])}"


def table(title, header, rows):
    print(f"\n### {title}\n\n| " + " | ".join(header) + " |\n|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(map(str, row)) + " |")
