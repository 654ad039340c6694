"""
One training loop for both tasks: a GPT language model (task=lm) or an encoder classifier (task=classify).
  python train.py config/agnews.py --batch_size=32          a config file sets keys, --key=value overrides them
  torchrun --standalone --nproc_per_node=4 train.py config/gpt2.py                      DDP on one machine
  torchrun --nnodes=2 --node_rank=0 --nproc_per_node=8 --master_addr=HOST --master_port=29500 train.py ...  (node 0)
  python train.py --help                                    every key with its default
Checkpoints in out_dir: model.safetensors + config.json (the best model by the validation metric, what sample.py
and classify.py load) and trainer_state.pt (the latest state, what init_from=resume continues from).
"""
import ast
import difflib
import json
import math
import os
import signal
import subprocess
import sys
import time
from contextlib import nullcontext

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

from dataset import load_split
from model import GPT, EncoderClassifier, EncoderConfig, GPTConfig, from_checkpoint, write_json

DEFAULTS = dict(
    # run
    out_dir="out",
    task="lm",  # lm: next-token prediction with GPT; classify: EncoderClassifier on labelled rows
    dataset="shakespeare_char",  # a folder under data/ made by its prepare.py, or a path to a prepared folder
    init_from="scratch",  # scratch, resume, gpt2[-medium|-large|-xl], or a folder of GPT weights (ours or HF's)
    seed=1337,
    device="auto",  # auto: cuda, then mps, then cpu
    dtype="auto",  # float32, bfloat16, float16; auto: bfloat16 where the hardware does it fast, else float32
    compile=False,
    # evaluation, logging, checkpoints
    eval_interval=250,
    eval_iters=100,  # batches per evaluation
    log_interval=10,
    eval_only=False,
    always_save_checkpoint=True,  # save trainer_state.pt at every evaluation, not only when validation improves
    wandb_log=False,
    wandb_project="gpt-starter",
    wandb_run_name="run",
    # data and model
    batch_size=12,  # rows per micro-step per process
    gradient_accumulation_steps=1,  # micro-steps per optimizer step, over all processes together
    block_size=256,
    vocab_size=0,  # 0: the dataset's
    n_layer=6,
    n_head=6,
    n_embd=384,
    dropout=0.0,
    bias=False,
    token_dropout=0.0,  # classify: hide this fraction of each training row's tokens, a regularizer for small data
    # optimizer: AdamW, linear warmup then cosine decay to min_lr
    learning_rate=6e-4,
    min_lr=6e-5,
    warmup_iters=100,
    lr_decay_iters=5000,
    decay_lr=True,
    max_iters=5000,
    weight_decay=0.1,
    beta1=0.9,
    beta2=0.95,
    grad_clip=1.0,  # 0 turns clipping off
)
SHAPE_KEYS = ("vocab_size", "block_size", "n_layer", "n_head", "n_embd", "bias")


def usage(message):
    raise SystemExit(f"train.py: {message}")


def parse_config(argv):
    """Config files (plain Python that sets keys) and --key=value overrides, in order, checked against DEFAULTS."""
    config = dict(DEFAULTS)

    def set_key(key, value, where):
        if key not in DEFAULTS:
            close = difflib.get_close_matches(key, DEFAULTS, n=3)
            usage(f"unknown key {key!r} in {where}" + (f"; did you mean {', '.join(close)}?" if close else "; see --help"))
        expected = type(DEFAULTS[key])
        if expected is float and type(value) is int:
            value = float(value)
        if type(value) is not expected:
            usage(f"{key} must be {expected.__name__}, got {type(value).__name__} {value!r} in {where}")
        config[key] = value

    for arg in argv:
        if arg in ("-h", "--help"):
            print(__doc__ + "\nkeys and defaults:")
            print("\n".join(f"  --{k}={v!r}" for k, v in DEFAULTS.items()))
            raise SystemExit(0)
        if arg.startswith("--"):
            key, eq, text = arg[2:].partition("=")
            if not eq:
                usage(f"{arg}: write --{key}=VALUE")
            try:
                value = ast.literal_eval(text)
            except (ValueError, SyntaxError):
                value = text  # a bare word is a string: --dataset=agnews
            set_key(key, value, arg)
        else:
            if not os.path.isfile(arg):
                usage(f"no config file {arg!r} (config files live in config/)")
            scope = {}
            exec(open(arg).read(), scope)
            for key, value in scope.items():
                if not key.startswith("_") and not callable(value) and type(value).__name__ != "module":
                    set_key(key, value, arg)
    if config["task"] not in ("lm", "classify"):
        usage(f"task must be lm or classify, got {config['task']!r}")
    if config["token_dropout"] and config["task"] != "classify":
        usage("token_dropout hides tokens of classification rows: it needs task=classify")
    return config


def get_lr(step, c):
    """Linear warmup for warmup_iters steps, then cosine decay to min_lr at lr_decay_iters, then min_lr."""
    if not c["decay_lr"]:
        return c["learning_rate"]
    if step < c["warmup_iters"]:
        return c["learning_rate"] * (step + 1) / (c["warmup_iters"] + 1)
    if step > c["lr_decay_iters"]:
        return c["min_lr"]
    ratio = (step - c["warmup_iters"]) / max(1, c["lr_decay_iters"] - c["warmup_iters"])
    return c["min_lr"] + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (c["learning_rate"] - c["min_lr"])


def pick_device(name, error):
    """The device that name (auto, cpu, cuda, cuda:1, mps) means here, or error(one line) if it is not there."""
    if name == "auto":  # cuda, then mps, then cpu
        return "cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available() else "cpu"
    available = {"cuda": torch.cuda.is_available, "mps": torch.backends.mps.is_available}
    if not available.get(name.split(":")[0], lambda: True)():
        error(f"--device {name}: this machine or this build of torch has no {name.split(':')[0]} device")
    try:
        torch.empty(0, device=name)
    except (RuntimeError, AssertionError) as e:  # no such device type, or no such device index
        error(f"--device {name}: {str(e).strip().splitlines()[0][:200]}")
    return name


def pick_device_and_dtype(c):
    device = pick_device(c["device"], usage)
    dtype = c["dtype"]
    if dtype == "auto":
        fast_bf16 = torch.cuda.is_bf16_supported() if device.startswith("cuda") else device == "cpu" and cpu_has_bf16()
        dtype = "bfloat16" if fast_bf16 else "float32"
    if dtype not in ("float32", "bfloat16", "float16"):
        usage(f"dtype must be auto, float32, bfloat16 or float16, got {dtype!r}")
    if dtype == "float16" and not device.startswith("cuda"):
        usage("dtype=float16 needs CUDA; use bfloat16 or float32 on this device")
    return device, dtype


def cpu_has_bf16():
    """AMX or AVX-512 BF16: bf16 matmuls then run several times faster than fp32 on the CPU."""
    try:
        flags = open("/proc/cpuinfo").read()
    except OSError:
        return False
    return " amx_bf16" in flags or " avx512_bf16" in flags


def matmul_flops(device, dtype, n=2048, repeats=3):
    """Achievable matmul FLOP/s: the best of a few n x n products, the practical peak MFU is measured against."""
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    best = float("inf")
    for _ in range(repeats + 1):  # the first one warms up
        sync(device)
        t0 = time.perf_counter()
        a @ b
        sync(device)
        best = min(best, time.perf_counter() - t0)
    return 2 * n ** 3 / best


def sync(device):
    """Wait for the device: GPU work is asynchronous, so a timer would stop before the work does."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    elif device == "mps":
        torch.mps.synchronize()


def build_model(c, meta):
    if c["task"] == "lm":
        return GPT(GPTConfig(**{k: c[k] for k in SHAPE_KEYS}, dropout=c["dropout"]))
    return EncoderClassifier(EncoderConfig(**{k: c[k] for k in SHAPE_KEYS}, dropout=c["dropout"],
                                           n_classes=len(meta["label_names"]), pad_token_id=meta["pad_token_id"]))


def pretrained_weights(c):
    """GPT weights to start from: gpt2 names, a Hugging Face GPT-2 folder, or a checkpoint folder of this project
    (a GPT pretrained on the same texts, say, to start a classifier). Returns (state_dict, its shape keys)."""
    ours = os.path.isfile(os.path.join(c["init_from"], "config.json")) and \
        "architecture" in json.load(open(os.path.join(c["init_from"], "config.json")))
    source = from_checkpoint(c["init_from"])[0] if ours else GPT.from_pretrained(c["init_from"])
    state = {k: v for k, v in source.state_dict().items() if not k.startswith(("lm_head", "head"))}
    return state, {k: getattr(source.config, k) for k in SHAPE_KEYS}


def prepare_data(c, ddp):
    """The dataset's folder; when it was never prepared, run its prepare.py (single process) or name the command."""
    data_dir = c["dataset"] if os.sep in c["dataset"] else os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", c["dataset"])
    command = f"python data/{c['dataset']}/prepare.py"
    if not os.path.exists(os.path.join(data_dir, "meta.json")):
        if ddp or not os.path.isfile(os.path.join(data_dir, "prepare.py")):
            usage(f"no prepared data in {data_dir}: run {command} first")
        print(f"no prepared data in {data_dir}: running {command}", file=sys.stderr)
        if subprocess.run([sys.executable, os.path.join(data_dir, "prepare.py")]).returncode:
            usage(f"{command} failed (message above); offline, prepare from local files: {command} --source DIR")
    return data_dir


def check_writable(out_dir):
    try:
        os.makedirs(out_dir, exist_ok=True)
        probe = os.path.join(out_dir, ".write_test")
        open(probe, "w").close()
        os.remove(probe)
    except OSError as e:
        usage(f"out_dir {out_dir!r} is not writable ({e.strerror}): pick another --out_dir")


def to_device(batch, device):
    """On CUDA through pinned host memory: a copy from pageable memory waits for the GPU's queue to drain first, a
    copy from pinned memory runs beside it."""
    pin = device.startswith("cuda")
    return {k: (v.pin_memory() if pin else v).to(device, non_blocking=True) for k, v in batch.items()}


@torch.no_grad()
def evaluate(model, data, c, autocast, device):
    """Mean loss (and accuracy for classify) over the same eval_iters batches every time, so evaluations compare.
    The sums stay on the device until the end: no host-device sync per batch."""
    model.eval()
    rows = data.eval_rows(c["eval_iters"] * c["batch_size"])
    loss_sum, correct, n = 0.0, 0, 0
    for i in range(0, len(rows), c["batch_size"]):
        batch = to_device(data.batch(rows[i:i + c["batch_size"]]), device)
        with autocast:
            logits, loss = model(**batch)
        size = len(batch["idx"])
        loss_sum, n = loss_sum + loss.float() * size, n + size
        if c["task"] == "classify":
            correct = correct + (logits.argmax(-1) == batch["labels"]).sum()
    model.train()
    metrics = {"loss": float(loss_sum) / n}
    if c["task"] == "classify":
        metrics["accuracy"] = int(correct) / n
    else:
        metrics["perplexity"] = math.exp(min(metrics["loss"], 50))
    return metrics


def main(argv):
    c = parse_config(argv)
    ddp = "RANK" in os.environ  # set by torchrun
    device, dtype = pick_device_and_dtype(c)
    rank, local_rank, world_size = 0, 0, 1
    if ddp:
        rank, local_rank, world_size = (int(os.environ[k]) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE"))
        if device.startswith("cuda"):
            device = f"cuda:{local_rank}"
            torch.cuda.set_device(device)
        dist.init_process_group(backend="nccl" if device.startswith("cuda") else "gloo")
    master = rank == 0
    log = print if master else (lambda *a, **k: None)
    if c["gradient_accumulation_steps"] % world_size:
        usage(f"gradient_accumulation_steps={c['gradient_accumulation_steps']} must be a multiple of the "
              f"{world_size} processes: each takes an equal share of the micro-steps")
    micro_steps = c["gradient_accumulation_steps"] // world_size
    device_type = device.split(":")[0]
    if master:
        check_writable(c["out_dir"])
    weights = None  # pretrained GPT weights fix the model's shape before the data is read at that block_size
    if c["init_from"] not in ("scratch", "resume"):
        weights, shape = pretrained_weights(c)
        c.update(shape, block_size=min(c["block_size"], shape["block_size"]))
        weights["wpe.weight"] = weights["wpe.weight"][:c["block_size"]]  # a shorter context keeps the first positions
    data_dir = prepare_data(c, ddp)
    train_data, val_data = (load_split(data_dir, split, c["block_size"]) for split in ("train", "val"))
    meta = train_data.meta
    if meta["task"] != c["task"]:
        usage(f"dataset {c['dataset']} is prepared for task={meta['task']}, but task={c['task']}")
    c["vocab_size"] = c["vocab_size"] or meta["vocab_size"]
    if meta["vocab_size"] > c["vocab_size"]:
        usage(f"the model has {c['vocab_size']} tokens, dataset {c['dataset']} needs {meta['vocab_size']}")

    # the model: from scratch, from our last state, or from pretrained GPT weights
    state_path = os.path.join(c["out_dir"], "trainer_state.pt")
    state, start_step, best = None, 0, -float("inf")
    if c["init_from"] == "resume":
        if not os.path.isfile(state_path):
            usage(f"init_from=resume but {state_path} does not exist: train with init_from=scratch first")
        try:
            state = torch.load(state_path, map_location="cpu", weights_only=True)
        except Exception as e:
            usage(f"cannot resume from {state_path} ({type(e).__name__}): not a trainer state that train.py wrote")
        if state["config"]["init_from"] != "scratch":  # the shape came from pretrained weights, not from the config
            c.update({k: state["config"][k] for k in SHAPE_KEYS})
        changed = [f"{k}={state['config'][k]!r} there, {c[k]!r} here" for k in SHAPE_KEYS + ("task",) if state["config"][k] != c[k]]
        if changed:
            usage(f"cannot resume {state_path} with a different model: {'; '.join(changed)}")
        start_step, best = state["step"], state["best"]
    torch.manual_seed(c["seed"])
    model = build_model(c, meta)
    if state is not None:
        model.load_state_dict(state["model"])
    elif weights is not None:
        missing, unexpected = model.load_state_dict(weights, strict=False)
        assert not unexpected and all(k.startswith(("lm_head", "head")) for k in missing), (missing, unexpected)
    model.to(device)
    optimizer = model.configure_optimizers(c["weight_decay"], c["learning_rate"], (c["beta1"], c["beta2"]), device_type)
    scaler = torch.amp.GradScaler(device_type, enabled=dtype == "float16")
    if state is not None:
        optimizer.load_state_dict(state["optimizer"])
        scaler.load_state_dict(state["scaler"])
    raw_model = model
    if c["compile"]:
        model = torch.compile(model)
    if ddp:
        model = DDP(model, device_ids=[local_rank] if device_type == "cuda" else None)
    ptdtype = getattr(torch, dtype)
    autocast = nullcontext() if dtype == "float32" else torch.autocast(device_type, dtype=ptdtype)
    peak = matmul_flops(device, torch.float32 if dtype == "float32" else ptdtype)

    info = {"task": c["task"], "dataset": c["dataset"], "tokenizer": meta["tokenizer"]}
    if c["task"] == "classify":
        info.update(label_names=meta["label_names"], max_length=meta.get("max_length", c["block_size"]))
    if master:
        log("config: " + ", ".join(f"{k}={v!r}" for k, v in c.items()), file=sys.stderr)
        write_json(os.path.join(c["out_dir"], "train_config.json"), c)
        log(f"{raw_model.num_params() / 1e6:.2f}M parameters, {world_size} process(es) on {device}, {dtype}, "
            f"matmul peak {peak / 1e9:.0f} GFLOP/s", file=sys.stderr)
    run = None
    if c["wandb_log"] and master:
        import wandb

        run = wandb.init(project=c["wandb_project"], name=c["wandb_run_name"], config=c, dir=c["out_dir"])

    def save_state(step):
        """The whole trainer state in one file: a crash mid-write leaves the previous one (tmp + os.replace)."""
        state = {"model": raw_model.state_dict(), "optimizer": optimizer.state_dict(), "scaler": scaler.state_dict(),
                 "step": step, "best": best, "config": c}
        torch.save(state, state_path + ".tmp")
        os.replace(state_path + ".tmp", state_path)

    stop_signal = []

    def on_signal(signum, frame):
        if stop_signal:  # a second Ctrl-C: stop now
            raise KeyboardInterrupt
        stop_signal.append(signum)

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)

    # every step's global batch is drawn from (seed, step); dropout from (seed, rank, step): resume is exact
    rows_per_step = c["batch_size"] * c["gradient_accumulation_steps"]
    bar = tqdm(total=c["max_iters"], initial=start_step, disable=not master, dynamic_ncols=True, file=sys.stderr)
    step, t0, seen, metrics, stop_signum = start_step, time.perf_counter(), 0, {}, 0
    while True:
        lr = get_lr(step, c)
        for group in optimizer.param_groups:
            group["lr"] = lr
        if master and (step % c["eval_interval"] == 0 or step == c["max_iters"] or c["eval_only"]):
            metrics = {f"{split}/{k}": v for split, data in (("train", train_data), ("val", val_data))
                       for k, v in evaluate(raw_model, data, c, autocast, device).items()}
            bar.write(f"step {step}: " + ", ".join(f"{k} {v:.4f}" for k, v in metrics.items()), file=sys.stderr)
            if run:
                run.log({**metrics, "lr": lr}, step=step)
            score = metrics["val/accuracy"] if c["task"] == "classify" else -metrics["val/loss"]
            if step > start_step and not c["eval_only"]:  # nothing new to save at the first evaluation
                if score > best:
                    best = score
                    raw_model.save_pretrained(c["out_dir"], **info)
                if score == best or c["always_save_checkpoint"]:
                    save_state(step)
        if step >= c["max_iters"] or c["eval_only"]:
            break
        if stop_signal and not ddp:  # one process has nobody to agree with: stop now
            stop_signum = stop_signal[0]
        if stop_signum:  # here, after this step's evaluation: a resumed run loses none
            if master:
                save_state(step)
            bar.close()
            print(f"stopped by signal {stop_signum} at step {step}; {state_path} holds it: resume with "
                  f"--init_from=resume", file=sys.stderr)
            raise SystemExit(128 + stop_signum)

        rows = train_data.rows(c["seed"], step, rows_per_step)
        torch.manual_seed(hash((c["seed"], rank, step)))  # dropout masks: a function of (seed, rank, step)
        loss_sum = 0.0
        for micro in range(micro_steps):
            first = (rank * micro_steps + micro) * c["batch_size"]
            batch = to_device(train_data.batch(rows[first:first + c["batch_size"]]), device)
            if c["token_dropout"] > 0:  # hidden tokens are masked like padding: the row reads as a shorter text
                batch["attention_mask"] *= torch.rand(batch["attention_mask"].shape, device=device) >= c["token_dropout"]
            last = micro == micro_steps - 1
            # without no_sync DDP would all-reduce on every micro-step; it must wrap the forward as well as backward
            with model.no_sync() if ddp and not last else nullcontext():
                with autocast:
                    _, loss = model(**batch)
                    loss = loss / micro_steps
                scaler.scale(loss).backward()
            loss_sum += loss.detach()
            seen += batch["idx"].numel() if c["task"] == "lm" else len(batch["idx"])
        scaler.unscale_(optimizer)
        norm = torch.nn.utils.clip_grad_norm_(raw_model.parameters(), c["grad_clip"] if c["grad_clip"] > 0 else float("inf"))
        # one host-device sync per step reads the loss, the gradient norm for the NaN guard and the signal to stop at,
        # which every rank must agree on: a rank stopping alone would leave the others waiting in the next all-reduce
        flag = torch.full((), float(stop_signal[0] if stop_signal else 0), device=device)
        if ddp:
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        loss_value, norm_value, stop_signum = torch.stack([loss_sum, norm, flag]).tolist()
        stop_signum = int(stop_signum)
        # a NaN on any rank reaches every rank's gradient norm through the all-reduce; with fp16 the scaler skips
        # such steps itself
        if not math.isfinite(loss_value) or not scaler.is_enabled() and not math.isfinite(norm_value):
            usage(f"loss {loss_value}, gradient norm {norm_value} at step {step}: stopping; the last checkpoint in "
                  f"{c['out_dir']} is untouched (try a lower learning_rate, or dtype=float32)")
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        bar.update(1)

        if master and (step % c["log_interval"] == 0 or step == c["max_iters"]):
            elapsed, t0 = time.perf_counter() - t0, time.perf_counter()
            rate = seen * world_size / elapsed
            width = c["block_size"] if c["task"] == "lm" else batch["idx"].size(1)
            tokens_per_s = rate if c["task"] == "lm" else rate * width
            mfu = raw_model.flops_per_token(width) * tokens_per_s / (peak * world_size)
            unit = "tok/s" if c["task"] == "lm" else "ex/s"
            bar.set_postfix_str(f"loss {loss_value:.4f}, lr {lr:.2e}, {rate:,.0f} {unit}, mfu {100 * mfu:.1f}%")
            if run:
                run.log({"train/step_loss": loss_value, "lr": lr, unit: rate, "mfu": mfu}, step=step)
            seen = 0
    bar.close()
    if run:
        run.finish()
    if ddp:
        dist.destroy_process_group()
    return raw_model, metrics


if __name__ == "__main__":
    main(sys.argv[1:])
