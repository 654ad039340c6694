"""
One training loop for both tasks: a GPT language model (task=lm) or an encoder classifier (task=classify).
  python train.py config/agnews.py --batch_size=32          a config file sets keys, --key=value overrides them
  python train.py config/agnews.py --print_config           the resolved config as JSON, then exit
  torchrun --standalone --nproc_per_node=4 train.py config/gpt2.py                      DDP on one machine
  torchrun --nnodes=2 --node_rank=0 --nproc_per_node=8 --master_addr=HOST --master_port=29500 train.py ...  (node 0)
  python train.py --help                                    every key, its default and what it does
out_dir receives model.safetensors + config.json (the best model by the validation metric: what sample.py and
classify.py load), trainer_state.pt (the latest state: what init_from=resume continues), metrics.jsonl and loss.png.
"""
import ast
import difflib
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
import traceback
from contextlib import contextmanager, nullcontext
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
from tqdm import tqdm

from common import Error, atomic_path, autocast, peak_flops, pick_device, resolve_dtype, run_script, write_json
from dataset import load_split
from model import GPT2_NAMES, build_model, load_pretrained
from records import RunRecord, plot_runs, start_wandb

DEFAULTS = dict(
    # run
    out_dir="out",  # where checkpoints, metrics.jsonl and loss.png go
    task="lm",  # lm: next-token prediction with GPT; classify: EncoderClassifier on labelled rows
    dataset="shakespeare_char",  # a folder under data/ made by its prepare.py, or a path to a prepared folder
    init_from="scratch",  # scratch, resume, gpt2[-medium|-large|-xl], or a folder of GPT weights (ours or HF's)
    overwrite_out_dir=False,  # let a new run replace the checkpoint in out_dir (without it, it refuses)
    seed=1337,  # batches, initial weights and dropout all follow from it
    device="auto",  # auto: cuda, then mps, then cpu; or cpu, cuda, cuda:1, mps
    dtype="auto",  # float32, bfloat16, float16; auto: bfloat16 where the hardware has it, float16 on older GPUs
    compile=False,  # torch.compile the model: a slower start, faster steps on GPUs
    deterministic=False,  # deterministic GPU kernels (slower): identical reruns, resumes and DDP on GPUs as well
    # evaluation, logging, checkpoints
    eval_interval=250,  # steps between evaluations (and checkpoints)
    eval_iters=100,  # batches per evaluation, the same ones every time
    log_interval=10,  # steps between log lines (loss, lr, speed, MFU, gradient norm)
    eval_only=False,  # evaluate once and exit
    always_save_checkpoint=True,  # save trainer_state.pt at every evaluation, not only when validation improves
    wandb_log=False,  # log to wandb as well (WANDB_MODE=offline works without an account)
    wandb_project="gpt-starter",  # the wandb project
    wandb_run_name="",  # the wandb run's name; empty: out_dir and the start time
    # data and model
    batch_size=12,  # rows per micro-step per process
    gradient_accumulation_steps=1,  # micro-steps per optimizer step, over all processes together
    block_size=256,  # tokens of context (classify: the most tokens of a row the model reads)
    vocab_size=0,  # 0: the dataset's
    n_layer=6,  # transformer blocks
    n_head=6,  # attention heads per block, dividing n_embd
    n_embd=384,  # width of the residual stream
    dropout=0.0,  # dropout on embeddings, attention weights and residual branches
    bias=False,  # biases in Linears and LayerNorms (GPT-2 has them)
    attn_impl="sdpa",  # sdpa: fused F.scaled_dot_product_attention; explicit: model.attention(), the math to edit
    rope=False,  # rotary position embeddings instead of the learned position table
    rmsnorm=False,  # RMSNorm instead of LayerNorm
    qk_norm=False,  # RMS-normalise queries and keys per head
    relu2=False,  # ReLU^2 MLP activation instead of GELU
    tie_embeddings=True,  # the LM head shares the token embedding's weights (GPT-2)
    logit_softcap=0.0,  # > 0: logits = cap * tanh(logits / cap)
    zero_init=False,  # residual output projections start at zero
    token_dropout=0.0,  # classify: hide this fraction of each training row's tokens, a regularizer for small data
    bow_head=False,  # classify: a linear bag-of-words classifier beside the encoder (fastText), probabilities multiplied
    bow_buckets=0,  # classify: > 0: bow_head also counts (previous token, token) pairs, hashed into this many rows
    pretrain_iters=0,  # classify: first this many steps of masked-token prediction on the training texts, then max_iters
    # optimizer and schedule: linear warmup, then cosine decay to min_lr
    optimizer="adamw",  # adamw; muon: Muon for the blocks' matrices, AdamW for the rest
    learning_rate=6e-4,  # peak learning rate
    min_lr=6e-5,  # learning rate at the end of the decay
    warmup_iters=100,  # steps of linear warmup
    lr_decay_iters=5000,  # the step at which the decay reaches min_lr
    decay_lr=True,  # False: learning_rate throughout
    max_iters=5000,  # optimizer steps in all
    weight_decay=0.1,  # decoupled weight decay of matrices and embeddings
    beta1=0.9,  # Adam's first-moment decay
    beta2=0.95,  # Adam's second-moment decay
    grad_clip=1.0,  # clip the gradient's global norm to this; 0 turns clipping off
    ema_decay=0.0,  # > 0: evaluate and save an exponential moving average of the weights (0.999: the last ~1000 steps)
)
ARCH_KEYS = ("vocab_size", "block_size", "n_layer", "n_head", "n_embd", "bias", "rope", "rmsnorm", "qk_norm", "relu2",
             "tie_embeddings", "logit_softcap", "bow_head", "bow_buckets")  # a checkpoint's tensors
KEPT_ON_RESUME = ARCH_KEYS + ("task", "optimizer", "ema_decay")  # and what its optimizer and EMA states depend on
AT_LEAST_ONE = ("batch_size", "gradient_accumulation_steps", "eval_interval", "eval_iters", "log_interval",
                "block_size", "n_layer", "n_head", "n_embd")
NON_NEGATIVE = ("max_iters", "pretrain_iters", "warmup_iters", "lr_decay_iters", "vocab_size", "learning_rate", "min_lr", "weight_decay",
                "grad_clip", "logit_softcap", "bow_buckets")
FRACTIONS = ("dropout", "token_dropout", "beta1", "beta2", "ema_decay")  # in [0, 1)
CHOICES = {"task": ("lm", "classify"), "attn_impl": ("sdpa", "explicit"), "optimizer": ("adamw", "muon"),
           "dtype": ("auto", "float32", "bfloat16", "float16")}


# ------------------------------------------------------------------------------------------------- configuration

def parse_config(argv):
    """Config files (plain Python that sets keys) and --key=value overrides, in order, each checked against DEFAULTS.
    Returns (the config, the keys the user set)."""
    c, given = dict(DEFAULTS), set()

    def set_key(key, value, where):
        if key not in DEFAULTS:
            close = difflib.get_close_matches(key, DEFAULTS, n=3)
            raise Error(f"unknown key {key!r} in {where}" + (f"; did you mean {', '.join(close)}?" if close else "; see --help"))
        expected = type(DEFAULTS[key])
        if expected is float and type(value) is int:
            value = float(value)
        if type(value) is not expected:
            raise Error(f"{key} must be {expected.__name__}, got {type(value).__name__} {value!r} in {where}")
        c[key] = value
        given.add(key)

    for arg in argv:
        if arg in ("-h", "--help"):
            comments = key_comments()
            print(__doc__ + "\nkeys, their defaults and what they do:")
            print("\n".join(f"  --{k}={v!r}".ljust(34) + f"  {comments.get(k, '')}" for k, v in DEFAULTS.items()))
            raise SystemExit(0)
        if arg == "--print_config":
            continue
        if arg.startswith("--"):
            key, eq, text = arg[2:].partition("=")
            if not eq:
                raise Error(f"{arg}: write --{key}=VALUE")
            try:
                value = ast.literal_eval(text)
            except (ValueError, SyntaxError):
                try:
                    value = float(text)  # nan, inf
                except ValueError:
                    value = text  # a bare word is a string: --dataset=agnews
            set_key(key, value, arg)
        else:
            for key, value in exec_config(arg).items():
                set_key(key, value, arg)
    if c["init_from"] != "resume":  # a resumed run is checked once its saved config is in (load_state)
        check_config(c, resuming=False)
    return c, given


def key_comments():
    """{key: the comment beside its default in DEFAULTS}: what --help says of each key."""
    source = open(__file__, encoding="utf-8").read()
    start = source.index("DEFAULTS = dict(")
    return dict(re.findall(r"^\s+(\w+)=.*?,\s+# (.*)$", source[start:source.index("\n)\n", start)], re.M))


def exec_config(path, scope=None):
    """The keys a config file sets. A config may include("other.py"), a path relative to itself, so configs work
    from any working directory. Errors name the file and the line."""
    scope = {} if scope is None else scope
    if not os.path.isfile(path):
        raise Error(f"no config file {path!r} (config files live in config/)")
    data = open(path, "rb").read()
    try:
        source = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise Error(f"{path}:{line}: not UTF-8 text (byte {data[e.start]:#x}): save the file as UTF-8") from None
    scope["include"] = lambda other: exec_config(os.path.join(os.path.dirname(path), other), scope)
    try:
        exec(compile(source, path, "exec"), scope)
    except Error:
        raise
    except SyntaxError as e:
        raise Error(f"{e.filename}:{e.lineno}: {e.msg}") from None
    except Exception as e:
        lines = [f.lineno for f in traceback.extract_tb(e.__traceback__) if f.filename == path]
        raise Error(f"{path}:{lines[-1] if lines else '?'}: {type(e).__name__}: {e}") from None
    return {k: v for k, v in scope.items()
            if not k.startswith("_") and not callable(v) and type(v).__name__ != "module"}


def check_config(c, resuming):
    """Every key within its range, before anything runs: one line naming the key, the value and the range. A resumed
    run's init_from names where its weights once came from, which need not exist any more."""
    def need(ok, key, what):
        if not ok:
            raise Error(f"{key}={c[key]!r}: must be {what}")

    for key, value in c.items():
        need(not isinstance(value, float) or math.isfinite(value), key, "a finite number")
    for key in AT_LEAST_ONE:
        need(c[key] >= 1, key, ">= 1")
    for key in NON_NEGATIVE:
        need(c[key] >= 0, key, ">= 0")
    for key in FRACTIONS:
        need(0 <= c[key] < 1, key, "in [0, 1)")
    for key, choices in CHOICES.items():
        need(c[key] in choices, key, "one of " + ", ".join(choices))
    need(c["n_embd"] % c["n_head"] == 0, "n_head", f"a divisor of n_embd={c['n_embd']}")
    need(not c["rope"] or c["n_embd"] // c["n_head"] % 2 == 0, "n_head", f"such that the head size n_embd / n_head "
         f"is even: rotary embeddings rotate pairs of channels")
    need(not c["decay_lr"] or c["min_lr"] <= c["learning_rate"], "min_lr", f"<= learning_rate={c['learning_rate']}")
    forms = ("scratch", "resume") + GPT2_NAMES
    close = difflib.get_close_matches(c["init_from"], forms, n=1)
    need(resuming or c["init_from"] in forms or os.path.isdir(c["init_from"]), "init_from", f"one of {', '.join(forms)} or a "
         f"folder of GPT weights" + (f" (did you mean {close[0]}?)" if close else ""))
    for key in ("token_dropout", "bow_head", "bow_buckets", "pretrain_iters"):
        need(not c[key] or c["task"] == "classify", key, "0 unless task=classify (an option of the encoder)")
    need(not c["bow_buckets"] or c["bow_head"], "bow_buckets", "0 unless bow_head=True (the bigrams of its classifier)")


def get_lr(step, c):
    """Linear warmup for warmup_iters steps, then cosine decay to min_lr at lr_decay_iters, then min_lr. A pretraining
    stage (its pretrain_iters steps come first) has a schedule of its own: warmup, then decay over its steps."""
    if step < c["pretrain_iters"]:
        return get_lr(step, {**c, "pretrain_iters": 0, "lr_decay_iters": c["pretrain_iters"]})
    step -= c["pretrain_iters"]
    if not c["decay_lr"]:
        return c["learning_rate"]
    if step < c["warmup_iters"]:
        return c["learning_rate"] * (step + 1) / (c["warmup_iters"] + 1)
    if step > c["lr_decay_iters"]:
        return c["min_lr"]
    ratio = (step - c["warmup_iters"]) / max(1, c["lr_decay_iters"] - c["warmup_iters"])
    return c["min_lr"] + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (c["learning_rate"] - c["min_lr"])


# ----------------------------------------------------------------------------------------- processes, files, data

def init_distributed(c):
    """(ddp, rank, world_size, device). Under torchrun each process takes its GPU (LOCAL_RANK) and joins the group."""
    if "RANK" not in os.environ:
        return False, 0, 1, pick_device(c["device"])
    rank, local_rank, world_size = (int(os.environ[k]) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE"))
    cuda = c["device"] in ("auto", "cuda") and torch.cuda.is_available()  # each process its own GPU, never GPU 0
    device = pick_device(f"cuda:{local_rank}" if cuda else c["device"])
    # a long checkpoint save on rank 0 must not trip NCCL's 10-minute watchdog on the ranks waiting for it
    dist.init_process_group(backend="nccl" if device.startswith("cuda") else "gloo", timeout=timedelta(minutes=60))
    if c["gradient_accumulation_steps"] % world_size:
        raise Error(f"gradient_accumulation_steps={c['gradient_accumulation_steps']} must be a multiple of the "
                    f"{world_size} processes: each takes an equal share of the micro-steps")
    return True, rank, world_size, device


@contextmanager
def locked_out_dir(c):
    """Make out_dir and hold a lock on it for the run (flock: the OS releases it when the process dies, kill -9
    included); refuse to let a new run replace a checkpoint that is there."""
    out_dir = c["out_dir"]
    try:
        os.makedirs(out_dir, exist_ok=True)
        lock = open(os.path.join(out_dir, ".lock"), "a+")
    except OSError as e:
        raise Error(f"out_dir {out_dir!r} is not writable ({e.strerror}): pick another --out_dir") from None
    try:
        import fcntl  # POSIX; elsewhere runs are not locked

        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except ImportError:
        pass
    except OSError:
        lock.seek(0)
        raise Error(f"out_dir {out_dir!r} is in use by another run (pid {lock.read().strip() or '?'}): wait for it to "
                    f"end, or pick another --out_dir") from None
    lock.truncate(0)
    lock.write(str(os.getpid()))
    lock.flush()
    try:
        saved = [f for f in ("model.safetensors", "trainer_state.pt") if os.path.exists(os.path.join(out_dir, f))]
        if saved and c["init_from"] != "resume" and not c["overwrite_out_dir"]:
            raise Error(f"out_dir {out_dir!r} already holds a checkpoint ({', '.join(saved)}): continue it with "
                        f"--init_from=resume, replace it with --overwrite_out_dir=True, or pick another --out_dir")
        yield
    finally:
        lock.close()


def data_dir(c, ddp):
    """The dataset's folder; when it was never prepared, run its prepare.py (single process) or name the command."""
    path = c["dataset"] if os.sep in c["dataset"] else os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", c["dataset"])
    command = f"python data/{c['dataset']}/prepare.py"
    if not os.path.exists(os.path.join(path, "meta.json")):
        if ddp or not os.path.isfile(os.path.join(path, "prepare.py")):
            raise Error(f"no prepared data in {path}: run {command} first")
        print(f"no prepared data in {path}: running {command}", file=sys.stderr)
        if subprocess.run([sys.executable, os.path.join(path, "prepare.py")]).returncode:
            raise Error(f"{command} failed (message above); offline, prepare from local files: {command} --source DIR")
    return path


def load_state(c, given):
    """The trainer state to resume, its run's config taken into c: only the keys given now override it, and not
    the model's shape. Loaded with mmap, so the file is read as the tensors are used, not copied whole. init_from
    becomes where the run began (scratch, or the weights it started from), which it stays through every resume."""
    path = os.path.join(c["out_dir"], "trainer_state.pt")
    if not os.path.isfile(path):
        raise Error(f"init_from=resume but {path} does not exist: train with init_from=scratch first")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        saved = state["config"]
    except Exception as e:
        raise Error(f"cannot resume from {path} ({type(e).__name__}): not a trainer state that train.py wrote") from None
    if saved["init_from"] != "scratch":  # the shape came from pretrained weights, not from the keys given
        given = given - set(ARCH_KEYS)
    changed = [f"{k}={saved[k]!r} there, {c[k]!r} here" for k in KEPT_ON_RESUME if k in given and saved[k] != c[k]]
    if changed:
        raise Error(f"cannot resume {path} with a different model or optimizer: {'; '.join(changed)}")
    c.update({k: v for k, v in saved.items() if k in DEFAULTS and (k not in given or k == "init_from")})
    check_config(c, resuming=True)
    return state


def pretrained_source(c):
    """The GPT to start from (gpt2 names, a Hugging Face GPT-2 folder, or a checkpoint folder of this project: a GPT
    pretrained on the same texts, say, to start a classifier); its shape is taken into c, its context cut to
    block_size when that is shorter."""
    source, info = load_pretrained(c["init_from"])
    if info["architecture"] != "GPT":
        raise Error(f"init_from={c['init_from']!r} holds an {info['architecture']}, not a GPT to start from")
    c.update({k: getattr(source.config, k) for k in ARCH_KEYS if hasattr(source.config, k)},
             block_size=min(c["block_size"], source.config.block_size))
    return source


def to_device(batch, device):
    """On CUDA through pinned host memory: a copy from pageable memory waits for the GPU's queue to drain first, a
    copy from pinned memory runs beside it."""
    pin = device.startswith("cuda")
    return {k: (v.pin_memory() if pin else v).to(device, non_blocking=True) for k, v in batch.items()}


# ------------------------------------------------------------------------------------------- the pieces of a step

class StepGuard:
    """What may stop a run between steps. Ctrl-C or SIGTERM asks for a stop at the next step boundary, after saving;
    a second Ctrl-C stops at once, except during the save (torchrun's agent signals every rank again when one
    exits: a save must not be cut short by that). read() is the step's one host-device sync: the loss, the gradient
    norm and the stop signal, read together. Under DDP the signal is all-reduced, so every rank stops at the same
    step: a rank stopping alone would leave the others waiting in the next all-reduce. A NaN or inf loss or norm
    stops the run before anything is saved."""

    def __init__(self, ddp, device):
        self.ddp, self.device, self.signum, self.agreed, self.saving = ddp, device, 0, 0, False
        signal.signal(signal.SIGINT, self.on_signal)
        signal.signal(signal.SIGTERM, self.on_signal)

    def on_signal(self, signum, frame):
        if self.signum and signum == signal.SIGINT and not self.saving:
            raise KeyboardInterrupt
        self.signum = self.signum or signum

    def read(self, step, loss_sum, norm, scaler, out_dir):
        flag = torch.full((), float(self.signum), device=self.device)
        loss_sum = loss_sum.float()
        if self.ddp:  # the signal, and the mean loss over the ranks: a NaN on one rank stops every rank
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            dist.all_reduce(loss_sum)
            loss_sum /= dist.get_world_size()
        loss, norm, signum = torch.stack([loss_sum, norm.float(), flag]).tolist()
        # a NaN gradient on any rank reaches every rank's norm through DDP's all-reduce; fp16's scaler skips such steps
        if not math.isfinite(loss) or not scaler.is_enabled() and not math.isfinite(norm):
            raise Error(f"loss {loss}, gradient norm {norm} at step {step}: stopping; the last checkpoint in {out_dir} "
                        f"is untouched (try a lower learning_rate, or dtype=float32)")
        self.agreed = int(signum)
        return loss, norm

    def stop_now(self):
        """The signal to stop with now, or 0: the one all ranks agreed on at the last read; one process's own."""
        return self.agreed if self.ddp else self.signum

    def stop(self, save, step, out_dir):
        """Rank 0 saves (save is None elsewhere); every rank waits until it has (torchrun stops the other ranks once
        one exits); then exit with 128 + the signal, as a process killed by it would."""
        self.saving = True
        if save:
            save()
        if self.ddp:
            dist.barrier()
        signum = self.stop_now()
        # one write: every rank prints this line at once, and print() writes the text and its newline separately
        sys.stderr.write(f"stopped by signal {signum} at step {step}; {out_dir}/trainer_state.pt holds it: resume "
                         f"with --init_from=resume\n")
        raise SystemExit(128 + signum)


@torch.no_grad()
def evaluate(model, data, c, ctx, device, rank, world_size):
    """Mean loss (and accuracy for labelled data) over the same eval_iters batches every time, shared out across the
    processes. The sums stay on the device until the end: one host-device sync per evaluation."""
    model.eval()
    rows = data.eval_rows(c["eval_iters"] * c["batch_size"])[rank::world_size]
    sums = torch.zeros(3, device=device)  # loss x rows, correct predictions, rows
    sums[2] = len(rows)
    for i in range(0, len(rows), c["batch_size"]):
        batch = to_device(data.batch(rows[i:i + c["batch_size"]]), device)
        with ctx:
            logits, loss = model(**batch)
        sums[0] += loss.float() * len(batch["idx"])
        if data.labelled:
            sums[1] += (logits.argmax(-1) == batch["labels"]).sum()
    if world_size > 1:
        dist.all_reduce(sums)
    loss_sum, correct, n = sums.tolist()
    model.train()
    loss = loss_sum / n
    return {"loss": loss, "accuracy": correct / n} if data.labelled else {"loss": loss, "perplexity": math.exp(min(loss, 50))}


def save_state(path, model, ema, optimizers, scaler, step, best_score, c, seconds):
    """The whole trainer state in one file, written atomically (a crash mid-write leaves the previous one)."""
    state = {"model": model.state_dict(), "optimizers": [o.state_dict() for o in optimizers],
             "scaler": scaler.state_dict(), "step": step, "best": best_score, "config": c, "seconds": seconds}
    if ema is not None:
        state["ema"] = ema.state_dict()
    with atomic_path(path) as tmp:
        torch.save(state, tmp)


# --------------------------------------------------------------------------------------------------------- the run

def main(argv):
    c, given = parse_config(argv)
    if "--print_config" in argv:
        print(json.dumps(c, indent=2))
        return None, {}
    ddp, rank, world_size, device = init_distributed(c)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}  # StepGuard's, for the run only
    try:
        with locked_out_dir(c) if rank == 0 else nullcontext():
            return train(c, given, ddp, rank, world_size, device)
    finally:
        for s, handler in handlers.items():
            signal.signal(s, handler)
        if ddp:
            dist.destroy_process_group()


def train(c, given, ddp, rank, world_size, device):
    master, out_dir, resuming = rank == 0, c["out_dir"], c["init_from"] == "resume"
    train_data, val_data, raw_model, ema, optimizers, scaler, (step, best_score, seconds) = setup(c, given, ddp, device, master)
    dtype = c["dtype"]  # resolved by setup
    evaluated = raw_model if ema is None else ema.module  # what is evaluated and saved as the best model
    model = raw_model
    if ddp:  # DDP first, then compile: the recommended order, which overlaps the gradient all-reduce with backward
        model = DDP(model, device_ids=[torch.device(device).index] if device.startswith("cuda") else None)
    if c["compile"]:
        model = torch.compile(model)
    ctx, (peak, peak_source) = autocast(device, dtype), peak_flops(device, dtype)
    info = checkpoint_info(c, train_data.meta)
    if master:
        write_json(os.path.join(out_dir, "train_config.json"), c)
        print(f"{raw_model.num_params() / 1e6:.2f}M parameters, {world_size} process(es) on {device}, {dtype}; MFU "
              f"against {peak / 1e12:.3g} TFLOP/s ({peak_source})", file=sys.stderr)
    run = start_wandb(c, raw_model.num_params()) if c["wandb_log"] and master else None
    record = RunRecord(out_dir, run, seconds, step if resuming else None) if master else None
    guard = StepGuard(ddp, device)
    save = lambda: save_state(os.path.join(out_dir, "trainer_state.pt"), raw_model, ema, optimizers, scaler, step, best_score,
                              c, record.seconds())
    best_name, goal = train_data.best
    sign = 1 if goal == "max" else -1  # best_score = sign x the metric: higher is better, whichever way the metric goes

    # every step's global batch is drawn from (seed, step); dropout from (seed, rank, step): resume is exact
    micro_steps = c["gradient_accumulation_steps"] // world_size
    rows_per_step = c["batch_size"] * c["gradient_accumulation_steps"]
    pretrain, last = c["pretrain_iters"], c["pretrain_iters"] + c["max_iters"]  # pretraining steps come first
    vocab = torch.from_numpy(np.unique(train_data.tokens).astype(np.int64)).to(device) if pretrain else None
    bar = tqdm(total=last, initial=step, disable=not master, dynamic_ncols=True, file=sys.stderr)
    start_step, best_step, metrics, seen, tokens, t0 = step, None, {}, 0, 0, time.perf_counter()
    while True:
        lr = get_lr(step, c)
        for group in (g for optimizer in optimizers for g in optimizer.param_groups):
            group["lr"] = lr * group.get("lr_scale", 1.0)
        if step >= pretrain and ((step - pretrain) % c["eval_interval"] == 0 or step == last) or c["eval_only"]:
            eval_start = time.perf_counter()
            metrics = {f"{split}/{k}": v for split, data in (("train", train_data), ("val", val_data))
                       for k, v in evaluate(evaluated, data, c, ctx, device, rank, world_size).items()}
            if master:
                bar.write(f"step {step}: " + ", ".join(f"{k} {v:.4f}" for k, v in metrics.items()), file=sys.stderr)
                record.log(step, **metrics, lr=lr)
                if step > start_step and not c["eval_only"]:  # nothing new to save at the first evaluation
                    if sign * metrics[best_name] > best_score:
                        best_score, best_step = sign * metrics[best_name], step
                        evaluated.save_pretrained(out_dir, **info, metrics={"step": step, **metrics})
                    if best_step == step or c["always_save_checkpoint"]:
                        save()
            bar.unpause()  # the bar's rate and ETA count training steps, not evaluations; so does the log's speed
            t0 += time.perf_counter() - eval_start
        if step >= last or c["eval_only"]:
            break
        if guard.stop_now():  # here, after this step's evaluation: a resumed run loses none
            bar.close()
            guard.stop(save if master else None, step, out_dir)

        rows = train_data.rows(c["seed"], step, rows_per_step)
        torch.manual_seed(hash((c["seed"], rank, step)))  # dropout masks: a function of (seed, rank, step)
        loss_sum = torch.zeros((), device=device)
        for micro in range(micro_steps):
            first = (rank * micro_steps + micro) * c["batch_size"]
            batch = to_device(train_data.batch(rows[first:first + c["batch_size"]]), device)
            # without no_sync DDP would all-reduce on every micro-step; it must wrap the forward as well as backward
            with model.no_sync() if ddp and micro < micro_steps - 1 else nullcontext():
                with ctx:
                    _, loss = model(**batch, **({"mlm_vocab": vocab} if step < pretrain else {}))
                    loss = loss / micro_steps
                scaler.scale(loss).backward()
            loss_sum += loss.detach()
            seen, tokens = seen + train_data.count(batch), tokens + batch["idx"].numel()
        for optimizer in optimizers:
            scaler.unscale_(optimizer)
        norm = torch.nn.utils.clip_grad_norm_(raw_model.parameters(), c["grad_clip"] or float("inf"))
        loss_value, norm_value = guard.read(step, loss_sum, norm, scaler, out_dir)
        for optimizer in optimizers:
            scaler.step(optimizer)
            optimizer.zero_grad(set_to_none=True)
        scaler.update()
        if ema is not None:
            ema.update_parameters(raw_model)
        step += 1
        bar.update(1)

        if master and (step % c["log_interval"] == 0 or step == last):
            elapsed, t0 = time.perf_counter() - t0, time.perf_counter()
            achieved = raw_model.flops_per_token(batch["idx"].size(1)) * tokens * world_size / elapsed
            if device == "cpu":  # a peak measured while the machine was busy: MFU never passes 100%
                peak = max(peak, achieved)
            rate, unit = seen * world_size / elapsed, train_data.unit
            bar.set_postfix_str(f"loss {loss_value:.4f}, lr {lr:.2e}, {rate:,.0f} {unit}/s, mfu {100 * achieved / peak:.1f}%")
            record.log(step, **{"train/step_loss": loss_value, "lr": lr, f"{unit}/s": rate, "mfu": achieved / peak,
                                "grad_norm": norm_value})
            seen = tokens = 0
    bar.close()
    if master:
        finish(c, record, run, best_score, best_step, sign, best_name, step - start_step, metrics)
    return evaluated, metrics


def setup(c, given, ddp, device, master):
    """Everything a run starts from: (train data, val data, model on device, optimizers, grad scaler, (step, best
    score, seconds so far)), from scratch, a resumed state or pretrained weights."""
    state = load_state(c, given) if c["init_from"] == "resume" else None  # c takes the saved run's config
    source = None if state or c["init_from"] == "scratch" else pretrained_source(c)  # c takes its shape
    path = data_dir(c, ddp)
    train_data, val_data = (load_split(path, split, c["block_size"]) for split in ("train", "val"))
    meta = train_data.meta
    if meta["task"] != c["task"]:
        raise Error(f"dataset {c['dataset']} is prepared for task={meta['task']}, but task={c['task']}")
    c["vocab_size"] = c["vocab_size"] or meta["vocab_size"]
    if meta["vocab_size"] > c["vocab_size"]:
        raise Error(f"the model has {c['vocab_size']} tokens, dataset {c['dataset']} needs {meta['vocab_size']}")
    if master and c["decay_lr"] and c["max_iters"] < c["lr_decay_iters"]:
        print(f"warning: max_iters={c['max_iters']} < lr_decay_iters={c['lr_decay_iters']}: the learning rate will "
              f"not have decayed to min_lr by the end (lr_decay_iters={c['max_iters']} gives a full schedule)", file=sys.stderr)
    if c["deterministic"]:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # cuBLAS's deterministic workspace
        torch.use_deterministic_algorithms(True)
    torch.manual_seed(c["seed"])
    model = make_model(c, meta, state, source).to(device)
    del source  # the pretrained tensors belong to the model now: nothing else may hold them for the whole run
    c["dtype"], device_type = resolve_dtype(c["dtype"], device), device.split(":")[0]
    dtype = c["dtype"]
    optimizers = model.configure_optimizers(c["weight_decay"], c["learning_rate"], (c["beta1"], c["beta2"]),
                                            device_type, c["optimizer"])
    scaler = torch.amp.GradScaler(device_type, enabled=dtype == "float16")
    # the average of the weights over the last ~1 / (1 - decay) steps, a second copy of the model
    ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(c["ema_decay"])) if c["ema_decay"] else None
    if state is None:
        return train_data, val_data, model, ema, optimizers, scaler, (0, -float("inf"), 0.0)
    for optimizer, saved in zip(optimizers, state["optimizers"]):
        optimizer.load_state_dict(saved)
    load_scaler_state(scaler, state["scaler"])
    if ema is not None:
        ema.load_state_dict(state["ema"])
    return train_data, val_data, model, ema, optimizers, scaler, (state["step"], state["best"], state.get("seconds", 0.0))


def checkpoint_info(c, meta):
    """What config.json says beside the model: task, data, tokenizer, the command; a classifier's label names, also
    as Hugging Face's id2label and label2id."""
    info = {"task": c["task"], "dataset": c["dataset"], "init_from": c["init_from"], "tokenizer": meta["tokenizer"],
            "command": ["torchrun ..." if "RANK" in os.environ else "python"] + sys.argv}
    if c["task"] == "classify":
        names = meta["label_names"]
        info.update(label_names=names, max_length=meta["max_length"], id2label=dict(enumerate(names)),
                    label2id={name: i for i, name in enumerate(names)})
    return info


def load_scaler_state(scaler, saved):
    """fp16's loss scale carries over a resume; a disabled scaler (bf16 and fp32 runs) saved an empty state, which
    an enabled one cannot load: it keeps its initial scale then (and a disabled one ignores a saved scale)."""
    if scaler.is_enabled() and saved:
        scaler.load_state_dict(saved)


def make_model(c, meta, state, source):
    """A new model of c's shape: from scratch (seeded), from a resumed state, or from a pretrained GPT's weights (a
    classifier gets a new head). Resumed and pretrained tensors are taken over, not copied."""
    settings = {**c, "n_classes": len(meta.get("label_names", [])), "pad_token_id": meta.get("pad_token_id", 0)}
    if state is None and source is None:
        return build_model(c["task"], settings)
    with torch.device("meta"):
        model = build_model(c["task"], settings)
    if state is not None:
        return model.load_weights(state["model"])
    weights = {k: v for k, v in source.state_dict().items() if not k.startswith(("lm_head", "head"))}
    if "wpe.weight" in weights:
        weights["wpe.weight"] = weights["wpe.weight"][:c["block_size"]]  # a shorter context keeps the first positions
    return model.load_weights(weights, new=[m for m in ("head", "bow") if getattr(model, m, None) is not None])


def finish(c, record, run, best_score, best_step, sign, best_name, steps, metrics):
    """The run's summary on stderr, the loss curve in out_dir, the best metric in the wandb summary."""
    out_dir = c["out_dir"]
    try:
        plot_runs([out_dir], os.path.join(out_dir, "loss.png"))
    except Exception as e:  # a plot must never fail a finished run
        print(f"warning: could not draw {out_dir}/loss.png ({type(e).__name__}: {e})", file=sys.stderr)
    lines = [f"done: {steps} steps in {record.seconds():.1f} s (the run's time so far, resumes included)"]
    if best_step is not None:
        lines.append(f"best {best_name} {sign * best_score:.4f} at step {best_step}: {out_dir}/model.safetensors + config.json")
    elif metrics:
        lines.append(f"no better {best_name} than before ({sign * best_score:.4f}): {out_dir}/model.safetensors unchanged")
    lines.append(f"records: {out_dir}/metrics.jsonl, {out_dir}/loss.png; state: {out_dir}/trainer_state.pt")
    print("\n".join(lines), file=sys.stderr)
    if run:
        run.summary[f"best {best_name}"] = sign * best_score
        run.finish()


if __name__ == "__main__":
    run_script(lambda: main(sys.argv[1:]), "train.py")
