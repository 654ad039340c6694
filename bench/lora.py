"""
LoRA against the full fine-tune on the GPT-2 124M shape (random weights saved as a checkpoint,
the start of each run: no download), fine-tuned on the chat example's conversations in GPT-2's
BPE, side by side in one run: each run's trainable parameters, its process's peak memory (the
RSS high-water mark), its step time (the median of its steps after the first) and its
checkpoint's size (model.safetensors; trainer_state.pt beside it).
  python bench/lora.py --ranks 0 8 64 --json lora.json
Rank 0 is the full fine-tune. TIKTOKEN_CACHE_DIR must point at the GPT-2 BPE offline.
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile

import torch
from safetensors import safe_open

# run from anywhere: the repository root
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from lib.checkpoint import save_pretrained  # noqa: E402
from lib.common import ArgumentParser, run_script  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402

GPT2 = dict(vocab_size=50304, block_size=1024, n_layer=12, n_head=12, n_embd=768, bias=True)
# config/chat.py's batch and context; float32 and eager, as a CPU fine-tune runs
RUN = [
    "--batch_size=32",
    "--block_size=64",
    "--dtype=float32",
    "--compile=False",
    "--device=cpu",
    "--warmup_iters=0",
    "--log_interval=1",
    "--eval_iters=1",
]


def base(folder):
    """The GPT-2 124M shape, random weights, saved as a checkpoint with GPT-2's tokenizer."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(**GPT2))
    tokenizer = {"type": "bpe", "encoding": "r50k_base"}
    save_pretrained(model, folder, task="lm", tokenizer=tokenizer)
    return folder


def run(command):
    """command as a child process -> its RSS high-water mark in bytes (its own, by wait4)."""
    child = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(child.pid, 0)
    code = os.waitstatus_to_exitcode(status)
    if code:
        raise subprocess.CalledProcessError(code, command)
    return usage.ru_maxrss * 1024  # Linux reports KiB


def step_seconds(out_dir):
    """The median of a run's step times, its first step (the warm-up) left out."""
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    seconds = [row["seconds"] for row in rows if "train/step_loss" in row]
    return statistics.median(b - a for a, b in zip(seconds, seconds[1:]))


def trainable(out_dir):
    """The parameters a run trains, which its checkpoint holds: the model's, or its adapters'."""
    with safe_open(os.path.join(out_dir, "model.safetensors"), "pt") as f:
        shapes = [f.get_slice(name).get_shape() for name in f.keys()]
    return sum(torch.Size(shape).numel() for shape in shapes)


def fine_tune(start, data, out_dir, rank, steps):
    """train.py from start on data, rank 0 the full fine-tune -> the run's figures."""
    command = [sys.executable, "train.py", *RUN, f"--init_from={start}", f"--dataset={data}"]
    command += [f"--out_dir={out_dir}", f"--max_iters={steps}", f"--eval_interval={steps}"]
    if rank:
        command.append(f"--lora_rank={rank}")
    peak = run(command)
    sizes = {
        name: os.path.getsize(os.path.join(out_dir, name))
        for name in ("model.safetensors", "trainer_state.pt")
    }
    return {
        "trainable": trainable(out_dir),
        "peak_rss": peak,
        "step_seconds": step_seconds(out_dir),
        **sizes,
    }


def main():
    p = ArgumentParser(description=__doc__)
    p.add_argument("--ranks", type=int, nargs="+", default=[0, 8, 64], help="0: full")
    p.add_argument("--steps", type=int, default=5, help="each run's optimizer steps")
    p.add_argument("--json", help="write the results to this file too")
    args = p.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        start = base(os.path.join(tmp, "base"))
        data = os.path.join(tmp, "chat")
        prepare = [sys.executable, "data/chat/prepare.py", f"--tokenizer_from={start}"]
        subprocess.run([*prepare, f"--out_dir={data}"], cwd=ROOT, check=True)
        for rank in args.ranks:
            out_dir = os.path.join(tmp, f"rank{rank}")
            row = fine_tune(start, data, out_dir, rank, args.steps)
            name = f"LoRA rank {rank}" if rank else "full"
            results[name] = row
            print(
                f"{name}: {row['trainable']:,} "
                f"trainable, peak RSS {row['peak_rss'] / 2**20:,.0f} MiB, step "
                f"{row['step_seconds']:.2f} s, model.safetensors "
                f"{row['model.safetensors'] / 2**20:,.2f} MiB, trainer_state.pt "
                f"{row['trainer_state.pt'] / 2**20:,.1f} MiB",
                flush=True,
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    run_script(main, "lora.py")
