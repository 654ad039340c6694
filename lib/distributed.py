"""A run's processes: torchrun's set-up, the model over them (parallel.py's DDP, FSDP and
activation checkpointing), one training step, a stop every rank agrees on, its signals."""

import ctypes
import os
import signal
import sys
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, replace
from datetime import timedelta

import torch
import torch.distributed as dist

from lib.common import Error, autocast, native_bf16, pick_device


@dataclass(frozen=True)
class Run:
    """This process's device, dtype and place in the group."""

    device: str  # cpu, cuda:3, mps
    dtype: str  # float32, bfloat16 or float16: the autocast dtype
    distributed: bool = False  # one of torchrun's processes
    rank: int = 0
    world_size: int = 1
    sharded: bool = False  # the model sharded over the processes (strategy=fsdp under torchrun)

    @property
    def master(self):
        """The process that logs and saves."""
        return self.rank == 0

    @property
    def device_type(self):
        return self.device.split(":")[0]

    def resolved(self, dtype, strategy):
        """With the settings' dtype; sharded under torchrun with strategy=fsdp."""
        sharded = self.distributed and strategy == "fsdp"
        return replace(self, dtype=resolve_dtype(dtype, self.device), sharded=sharded)


def under_torchrun():
    """Whether torchrun started this process: its environment names a rank."""
    return "RANK" in os.environ


def rank():
    """This process's rank under torchrun; 0 alone."""
    return int(os.environ.get("RANK", 0))


def world_size():
    """How many processes torchrun started; 1 alone."""
    return int(os.environ.get("WORLD_SIZE", 1))


@contextmanager
def started(device, deterministic=False):
    """This process's Run: under torchrun it takes its GPU (LOCAL_RANK) and joins the group."""
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
    if not under_torchrun():
        yield Run(pick_device(device), dtype=None)
        return
    processes = world_size()
    if device not in ("auto", "cuda", "cpu"):
        raise Error(
            f"--device {device} with {processes} processes: each process takes its own GPU "
            "(LOCAL_RANK); use --device=auto or cuda (or cpu)"
        )
    cuda = device != "cpu" and torch.cuda.is_available()
    device = pick_device(f"cuda:{os.environ['LOCAL_RANK']}" if cuda else device)
    backend = "nccl" if cuda else "gloo"
    # an hour: the other ranks wait while rank 0 saves a large checkpoint
    dist.init_process_group(backend=backend, timeout=timedelta(minutes=60))
    try:
        yield Run(device, None, True, rank(), processes)
        # every rank leaves once rank 0 has written its files; a rank that exits right after a
        # gloo collective can abort in teardown (pytorch/pytorch#190489)
        dist.barrier()
    finally:
        dist.destroy_process_group()


M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # mallopt's parameters (malloc.h)


def keep_freed_memory():
    """glibc's malloc keeps freed memory for the next tensors, its large blocks too: otherwise
    each is mapped afresh and the kernel zeroes its pages at every step (BENCHMARKS.md:
    "Training beside nanoGPT, profiled"). Elsewhere than Linux, nothing."""
    if not sys.platform.startswith("linux"):
        return
    mallopt = ctypes.CDLL(None).mallopt  # glibc's; musl's does nothing
    mallopt(M_MMAP_MAX, 0)  # no block in a mapping of its own: all in the heap
    mallopt(M_TRIM_THRESHOLD, 2**31 - 1)  # the heap's free top kept, not handed back


def agreed(run, attempt):
    """attempt()'s result, or the first rank's Error raised on every rank (none left waiting)."""
    error = None
    try:
        result = attempt()
    except Error as e:
        error = str(e)
    if run.distributed:
        errors = [None] * run.world_size
        dist.all_gather_object(errors, error)
        error = next(filter(None, errors), None)
    if error:
        raise Error(error)
    return result


# ------------------------------------------------------------------- the model over the processes
def parallel(model, run, checkpointing):
    """The model as the loop calls it: itself on one process; DDP's wrapper, itself sharded
    (FSDP) or with its activations recomputed otherwise (parallel.py)."""
    if not (checkpointing or run.distributed):
        return model.to(run.device)
    from parallel import wrapped

    return wrapped(model, run, checkpointing)


def micro_step(model, run, last):
    """Gradients are reduced only in an optimizer step's last micro-step."""
    if run.sharded:
        model.set_requires_gradient_sync(last)
    elif run.distributed and not last:
        return model.no_sync()
    return nullcontext()


def clip_gradients(model, max_norm, run):
    """Clip to max_norm by the whole gradient's norm, returned."""
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    return norm.full_tensor() if run.sharded else norm


def grad_scaler(run):
    """float16's loss scaler; under FSDP every process skips the same steps."""
    scaler = torch.amp.GradScaler
    if run.sharded:
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler as scaler
    return scaler(run.device_type, enabled=run.dtype == "float16")


@dataclass
class StepGuard:
    """Signal handlers: Ctrl-C or SIGTERM stops every rank at the same step, after a save; a
    second Ctrl-C stops at once, unless saving."""

    run: Run
    signum: int = 0  # the signal this process received
    agreed_signum: int = 0  # the one every rank agreed on at the last gather
    saving: bool = False

    def __enter__(self):
        self.handlers = {
            s: signal.signal(s, self.on_signal) for s in (signal.SIGINT, signal.SIGTERM)
        }
        return self

    def __exit__(self, *exc):
        for s, handler in self.handlers.items():
            signal.signal(s, handler)

    def on_signal(self, signum, frame):
        # torchrun signals every rank again when one exits: that must not cut a save short
        if self.signum and signum == signal.SIGINT and not self.saving:
            raise KeyboardInterrupt
        self.signum = self.signum or signum

    def gather(self, loss_sum, norm):
        """The step's one sync: (mean loss over the ranks, gradient norm), and any rank's signal."""
        flag = torch.tensor(float(self.signum), device=self.run.device)
        if self.run.distributed:
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            dist.all_reduce(loss_sum)
            loss_sum /= self.run.world_size
        loss, norm, signum = torch.stack([loss_sum, norm, flag]).tolist()
        self.agreed_signum = int(signum)
        return loss, norm

    def stop_now(self):
        return self.agreed_signum if self.run.distributed else self.signum

    @contextmanager
    def stopping(self, step, out_dir):
        """Around rank 0's save; then every rank exits with 128 + the signal."""
        self.saving = True
        yield
        if self.run.distributed:
            # torchrun stops the other ranks once one exits: none leaves before rank 0 has saved
            dist.barrier()
        signum = self.stop_now()
        # one write: every rank prints this line at once, and print() writes text and newline apart
        sys.stderr.write(
            f"stopped by signal {signum} at step {step}; {out_dir}/trainer_state.pt holds it: "
            "resume with --init_from=resume\n"
        )
        raise SystemExit(128 + signum)


# ------------------------------------------------------------------------- one training step
@dataclass
class TrainStep:
    """One run's step: its model, optimizers, processes (a lib.distributed.Run) and clipping."""

    model: torch.nn.Module  # what the forward runs through: the model, DDP's or compile's wrapper
    raw_model: torch.nn.Module  # the model itself (under FSDP this process's shards)
    optimizers: list
    run: Run
    grad_clip: float  # 0: no clipping

    def __post_init__(self):
        self.ctx = autocast(self.run.device, self.run.dtype)
        self.scaler = grad_scaler(self.run)  # float16's loss scaler; disabled otherwise

    def gradients(self, batches):
        """The micro-batches' gradients, summed: (the mean loss, the gradient's norm before
        clipping), tensors on the device (read them together: one sync)."""
        loss_sum = torch.zeros((), device=self.run.device)
        for i, batch in enumerate(batches):
            # the gradients reduced over the processes once, in the step's last micro-step
            with micro_step(self.model, self.run, last=i == len(batches) - 1):
                with self.ctx:
                    _, loss = self.model(**batch)
                    loss = loss / len(batches)
                self.scaler.scale(loss).backward()
            loss_sum += loss.detach()
        for optimizer in self.optimizers:
            self.scaler.unscale_(optimizer)
        max_norm = self.grad_clip or float("inf")
        return loss_sum, clip_gradients(self.raw_model, max_norm, self.run)

    def update(self):
        """The optimizers step on the gradients (fp16's scaler skips a step of inf or NaN), which
        are then dropped."""
        for optimizer in self.optimizers:
            self.scaler.step(optimizer)
        for optimizer in self.optimizers:
            optimizer.zero_grad(set_to_none=True)
        self.scaler.update()


def resolve_dtype(dtype, device):
    """auto: bfloat16 where native, float16 on other GPUs, float32 elsewhere; checked for device."""
    kind = torch.device(device).type
    if dtype == "auto":
        if native_bf16(device):
            dtype = "bfloat16"
        elif kind == "cuda":
            dtype = "float16"
        else:
            dtype = "float32"
    if dtype not in ("float32", "bfloat16", "float16"):
        raise Error(f"dtype must be auto, float32, bfloat16 or float16, got {dtype!r}")
    if dtype == "float16" and kind != "cuda":
        raise Error(f"dtype=float16 needs a CUDA GPU; on {kind} use bfloat16 or float32")
    if dtype == "bfloat16" and kind == "cuda" and not native_bf16(device):
        raise Error(
            "dtype=bfloat16: this GPU has no bfloat16 matmuls (they would be emulated, slowly, "
            "and compile skipped): use dtype=auto (float16 here) or float32"
        )
    return dtype
