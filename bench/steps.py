"""What training steps cost: train.py's step (tokens/s, examples/s) for the shapes of configs in
fp32, bf16 autocast and bf16 + torch.compile; one AdamW step alone; where a step spends its time;
the classifier's inference."""

import json
import os
import subprocess
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from bench.timing import rates, sync, table, timed, two
from lib.common import Error, autocast
from lib.data import read_meta
from lib.distributed import Run, TrainStep
from lib.records import flops_per_token
from lib.settings import new_model
from optim import configure_optimizers

CONFIGS = ["config/shakespeare_char_cpu.py", "config/shakespeare_char.py", "config/agnews.py"]
META_FALLBACK = {
    "shakespeare_char": {"vocab_size": 65},  # when data/<dataset>/meta.json was never prepared
    "shakespeare": {"vocab_size": 50257},
    "openwebtext": {"vocab_size": 50257},
    "agnews": {"vocab_size": 50257, "pad_token_id": 50256, "label_names": ["W", "S", "B", "T"]},
}
MODES = ["fp32", "bf16", "bf16+compile"]
OPTIMIZERS = ["loop", "foreach", "fused"]


def load_shape(config_file):
    """(config dict, dataset meta): the config as train.py resolves it
    (train.py CONFIG --print_config), without reading any data; the dataset's meta.json where it was
    prepared, else a stand-in with its vocabulary."""
    r = subprocess.run(
        [sys.executable, os.path.join(ROOT, "train.py"), config_file, "--print_config"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    if r.returncode:
        raise Error(f"train.py {config_file} --print_config failed: {r.stderr.strip()}")
    c = json.loads(r.stdout)
    meta_dir = os.path.join(ROOT, "data", c["dataset"])
    meta = (
        read_meta(meta_dir)
        if os.path.isfile(os.path.join(meta_dir, "meta.json"))
        else META_FALLBACK[c["dataset"]]
    )
    c["vocab_size"] = c["vocab_size"] or meta["vocab_size"]
    return c, meta


def make_batch(c, meta, rows, device, seed):
    """Random tokens: lm rows of block_size; classify rows of ~47 tokens (AG News-like) padded to
    the batch max."""
    V, T, gen = c["vocab_size"], c["block_size"], torch.Generator().manual_seed(seed)
    if c["task"] == "lm":
        batch = {
            "idx": torch.randint(V, (rows, T), generator=gen),
            "targets": torch.randint(V, (rows, T), generator=gen),
        }
    else:
        lengths = (47 + 15 * torch.randn(rows, generator=gen)).round().long().clamp(4, T)
        mask = (torch.arange(int(lengths.max()))[None, :] < lengths[:, None]).long()
        batch = {
            "idx": torch.randint(V, mask.shape, generator=gen).masked_fill(
                mask == 0, meta["pad_token_id"]
            ),
            "attention_mask": mask,
            "labels": torch.randint(len(meta["label_names"]), (rows,), generator=gen),
        }
    return {k: v.to(device) for k, v in batch.items()}


def dtype_of(mode):
    """A mode's autocast dtype: float32 for fp32, else bfloat16."""
    return "float32" if mode == "fp32" else "bfloat16"


def train_step(c, meta, mode, device, rows):
    """(step, model, batch): one of train.py's training steps (TrainStep: forward under autocast,
    backward, clip, the config's optimizer), on random tokens of the config's shape."""
    model = new_model(c, meta).to(device)
    optimizers = configure_optimizers(
        model,
        c["weight_decay"],
        c["learning_rate"],
        (c["beta1"], c["beta2"]),
        device.split(":")[0],
        c["optimizer"],
    )
    if mode.endswith("compile"):
        torch._dynamo.reset()  # each model compiles afresh
    runner = torch.compile(model) if mode.endswith("compile") else model
    run = Run(device, dtype_of(mode))
    train = TrainStep(runner, model, optimizers, run, c["grad_clip"])
    batch = make_batch(c, meta, rows, device, seed=0)

    def step():
        train.gradients([batch])
        train.update()

    return step, model, batch


def bench_train(c, meta, mode, device, repeats, max_rows=None):
    """Timed training steps: tokens/s and examples/s; MFU is added in report() against the measured
    peak."""
    rows = min(c["batch_size"], max_rows or c["batch_size"])
    step, model, batch = train_step(c, meta, mode, device, rows)
    width = batch["idx"].size(1)  # for classify the padded width: train.py counts those tokens too
    r = rates(timed(step, repeats, device), rows * width, "tokens_per_s")
    return {
        **rates(r, rows, "examples_per_s"),
        "rows": rows,
        "width": width,
        "dtype": dtype_of(mode),
        "task": c["task"],
        "flops_per_token": flops_per_token(model, width),
        "shape": f"{c['n_layer']} x {c['n_embd']}, {c['n_head']} heads",
    }


def bench_optimizer(c, meta, kind, device, repeats):
    """One AdamW step over the config's parameters (random gradients): the per-tensor loop
    (PyTorch's default on CPU), foreach (the default on CUDA) or fused (what
    optim.configure_optimizers picks on CPU and CUDA)."""
    model = new_model(c, meta).to(device)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    optimizer = torch.optim.AdamW(
        model.parameters(),
        **{"loop": dict(foreach=False), "foreach": dict(foreach=True), "fused": dict(fused=True)}[
            kind
        ],
    )
    return {
        **timed(optimizer.step, repeats, device),
        "params": sum(p.numel() for p in model.parameters()),
    }


def profile_train(config_file, device, modes=("fp32", "bf16"), top=15):
    """Where one training step of the config's shape spends its time: torch.profiler's operators by
    self time."""
    from torch.profiler import ProfilerActivity, profile

    c, meta = load_shape(config_file)
    cuda = device.startswith("cuda")
    for mode in modes:
        step, _, batch = train_step(c, meta, mode, device, c["batch_size"])
        step()  # warm-up
        sync(device)
        with profile(activities=[ProfilerActivity.CPU] + [ProfilerActivity.CUDA] * cuda) as prof:
            step()
            sync(device)
        print(
            f"\n### {os.path.relpath(config_file, ROOT)}, {mode}, "
            f"batch {tuple(batch['idx'].shape)}: one training step\n"
        )
        print(
            prof.key_averages().table(
                sort_by="self_cuda_time_total" if cuda else "self_cpu_time_total", row_limit=top
            )
        )


def bench_classify_inference(c, meta, mode, device, repeats, rows=256):
    """Forward only, eval mode, no_grad, batch 256, fp32 or bf16 autocast."""
    model = new_model(c, meta).to(device).eval()
    ctx = autocast(device, dtype_of(mode))
    batch = make_batch(c, meta, rows, device, seed=1)
    batch.pop("labels")

    @torch.no_grad()
    def forward():
        with ctx:
            model(**batch)

    return {**rates(timed(forward, repeats, device), rows, "examples_per_s"), "rows": rows}


def report_train(trains, peaks):
    """The training steps' table, MFU against the measured peaks, and the speed-ups."""
    rows = []
    for (cfg, mode), r in trains.items():
        if "error" in r:
            rows.append([cfg, "", "", mode, r["error"], "", "", ""])
            continue
        r.update(
            {
                f"mfu_{k}": r["flops_per_token"]
                * r[f"tokens_per_s_{k}"]
                / peaks[r["dtype"]]["flops_best"]
                for k in ("best", "median")
            }
        )
        rows.append(
            [
                cfg,
                r["shape"],
                f"{r['rows']} x {r['width']}",
                mode,
                two(r, "ms", "{:.1f}"),
                two(r, "tokens_per_s"),
                two(r, "examples_per_s") if r["task"] == "classify" else "",
                two(r, "mfu", "{:.1f}%", 100),
            ]
        )
    table(
        "Training step, best / median: forward, backward, clip, AdamW. "
        "MFU: against the best measured matmul FLOP/s of the dtype; "
        "classify counts padded tokens, as train.py does",
        ["config", "shape", "batch", "mode", "ms/step", "tokens/s", "examples/s", "MFU"],
        rows,
    )
    rows = []
    for cfg in dict.fromkeys(cfg for cfg, _ in trains):
        m = {mode: trains.get((cfg, mode), {}) for mode in MODES}

        def ratio(a, b, m=m):
            if "median_s" in m[a] and "median_s" in m[b]:
                return f"{m[a]['median_s'] / m[b]['median_s']:.2f}x"
            return "n/a"

        first = (
            f"{m['bf16+compile']['warmup_s']:.1f} s" if "warmup_s" in m["bf16+compile"] else "n/a"
        )
        rows.append([cfg, ratio("fp32", "bf16"), ratio("bf16", "bf16+compile"), first])
    table(
        "Speed-ups, medians",
        ["config", "bf16 / fp32", "compile / eager (bf16)", "first step with compiling"],
        rows,
    )


def report_optimizers(optims):
    """The AdamW table: the per-tensor loop, foreach, fused."""
    table(
        "AdamW step alone, ms (best / median): the default per-tensor loop, foreach, fused",
        ["config", "parameters", *OPTIMIZERS, "loop / fused (medians)"],
        [
            [
                cfg,
                f"{optims[(cfg, 'loop')]['params'] / 1e6:.2f}M",
                *(two(optims[(cfg, k)], "ms", "{:.2f}") for k in OPTIMIZERS),
                f"{optims[(cfg, 'loop')]['median_s'] / optims[(cfg, 'fused')]['median_s']:.1f}x",
            ]
            for cfg in dict.fromkeys(cfg for cfg, _ in optims)
            if all("median_s" in optims[(cfg, k)] for k in OPTIMIZERS)
        ],
    )


def report_classify(trains, infers):
    """The classifier's examples/s in training and inference."""
    if infers:
        cfg = next(iter(infers.values()))[0]
        rows = [
            [
                mode,
                f"{two(trains[(cfg, mode)], 'examples_per_s')} ({trains[(cfg, mode)]['rows']} rows)"
                if "rows" in trains.get((cfg, mode), {})
                else "n/a",
                two(r, "examples_per_s"),
            ]
            for mode, (_, r) in infers.items()
        ]
        table(
            f"Classifier examples/s, best / median ({cfg})",
            ["mode", "train (eager)", "inference (batch 256, eval, no_grad)"],
            rows,
        )
