"""What a run's processes are (Run, from started(): device, dtype, rank), how the model is spread
over them (parallel(): DDP's copies or FSDP's shards, activation checkpointing) and what may stop
them between steps (StepGuard): a signal, or another rank's stop. One process or torchrun's group
(NCCL on CUDA, gloo on CPUs). torch's FSDP and DTensor modules are imported by the functions that
use them, when a run shards: importing them adds about a second to every start."""

import functools
import os
import signal
import sys
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, replace
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.checkpoint import checkpoint

from lib.common import Error, pick_device, resolve_dtype


@dataclass(frozen=True)
class Run:
    """What a run resolves at start-up and keeps to the end: this process's device, dtype and
    place in the group."""

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
        """This Run with dtype as the settings ask for it (auto: the hardware's rule), checked for
        its device, and sharded if strategy is fsdp under torchrun (one process runs unsharded)."""
        sharded = self.distributed and strategy == "fsdp"
        return replace(self, dtype=resolve_dtype(dtype, self.device), sharded=sharded)


@contextmanager
def started(device, deterministic=False):
    """This process's Run (its dtype comes with resolved()), for the length of the with-block.
    Under torchrun each process takes its GPU (LOCAL_RANK, never GPU 0 for all) and joins the
    group, which it leaves at the end; the timeout lets rank 0 save a large checkpoint while the
    others wait. deterministic: deterministic kernels and cuBLAS workspace (slower)."""
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
    if "RANK" not in os.environ:
        yield Run(pick_device(device), dtype=None)
        return
    world_size = int(os.environ["WORLD_SIZE"])
    if device not in ("auto", "cuda", "cpu"):
        raise Error(
            f"--device {device} with {world_size} processes: each process takes its own GPU "
            "(LOCAL_RANK); use --device=auto or cuda (or cpu)"
        )
    cuda = device != "cpu" and torch.cuda.is_available()
    device = pick_device(f"cuda:{os.environ['LOCAL_RANK']}" if cuda else device)
    backend = "nccl" if cuda else "gloo"
    dist.init_process_group(backend=backend, timeout=timedelta(minutes=60))
    try:
        yield Run(device, None, True, int(os.environ["RANK"]), world_size)
        # Every rank leaves once rank 0 has written its files. A rank that exits right after its
        # last collective can reach the interpreter's teardown while gloo's worker thread still
        # holds that collective's tensors: their release then takes the GIL, and the process
        # aborts ("terminate called without an active exception", pytorch/pytorch#190489).
        dist.barrier()
    finally:
        dist.destroy_process_group()


def agreed(run, attempt):
    """attempt()'s result, or the first rank's Error raised on every rank: the same one line on
    each, none left waiting in the group for a rank that stopped (rank 0's out_dir lock and
    refusal, a resumed run's state)."""
    error = None
    try:
        result = attempt()
    except Error as e:
        error = str(e)
    error = next(filter(None, every_rank(run, error)), None)
    if error:
        raise Error(error)
    return result


def every_rank(run, value):
    """[value of every rank], in rank order: an all-gather under torchrun, every rank taking
    part."""
    if not run.distributed:
        return [value]
    every = [None] * run.world_size
    dist.all_gather_object(every, value)
    return every


# ------------------------------------------------------------------- the model over the processes
def parallel(model, run, checkpointing):
    """The model as the training loop calls it, on run's device: the model itself in one process,
    DDP's wrapper around it under torchrun, or the model itself sharded in place (run.sharded:
    FSDP; it then holds this process's shards). checkpointing: each Block recomputes its
    activations in the backward pass (recompute_blocks)."""
    if checkpointing:
        recompute_blocks(model)
    if run.sharded:
        return shard(model, run)
    model.to(run.device)
    if not run.distributed:
        return model
    # DDP's device_ids: this process's GPU, none on CPUs
    gpu = [run.device] if run.device_type == "cuda" else None
    return DDP(model, device_ids=gpu)


def shard(model, run):
    """FSDP2: each Block, then the whole model (the embeddings, the tied head and the final norm
    that remain), split by rows over the processes. A Block's parameters are all-gathered just
    before its forward and again before its backward, and freed after each: a process holds its
    own shards of every parameter, gradient and AdamW moment, and the whole of one Block at a time.
    fully_shard moves the parameters to the device group by group, so the whole model never sits on
    one GPU. GPT's head and token table stay one parameter: both belong to the outermost group.

    The precision: in bfloat16 or float16 the parameters are all-gathered in it (what autocast
    casts each matmul's weights to; half the bytes sent and held), and the gradients reduced in
    float32, as DDP reduces them; the shards that the optimizer updates stay float32. Autocast
    still runs around the forward pass, so the operations it keeps in float32 (on CUDA the norms,
    softmax, the loss) stay there. What differs from DDP's autocast: the residual stream between
    those operations is carried in the low precision (the embedding tables are gathered in it, and
    each Block's input is cast to it), and the norms' gains are rounded to it. float32: FSDP casts
    nothing (a dtype the parameters already have is no cast). Returns the model."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(run.device_type, (run.world_size,))
    policy = MixedPrecisionPolicy(param_dtype=getattr(torch, run.dtype), reduce_dtype=torch.float32)
    for block in model.blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy)
    return fully_shard(model, mesh=mesh, mp_policy=policy)


def recompute_blocks(model):
    """Activation checkpointing: each Block keeps only its input through the forward pass and runs
    again in the backward pass to rebuild the rest (torch.utils.checkpoint, non-reentrant, which
    restores the random state: dropout draws the same masks). Each Block's forward is replaced on
    the instance, so the modules, and the state dict's names, stay as they are (checkpoint_wrapper
    would add a level to every name)."""
    for block in model.blocks:
        block.forward = functools.partial(recomputed, block, block.forward)


def recomputed(block, forward, *args, **kwargs):
    """forward(*args, **kwargs) checkpointed while block trains with gradients; evaluation and
    decoding run the plain forward."""
    if not block.training or not torch.is_grad_enabled():
        return forward(*args, **kwargs)
    return checkpoint(forward, *args, use_reentrant=False, **kwargs)


def micro_step(model, run, last):
    """The context of one micro-step's forward and backward: the gradients are reduced over the
    processes only in the last micro-step of an optimizer step. DDP: no_sync() on the others (it
    must wrap the forward as well as the backward); FSDP: each process keeps the unsharded
    gradients until then (the memory of DDP's gradients, for one reduce-scatter a step)."""
    if run.sharded:
        model.set_requires_gradient_sync(last)
    elif run.distributed and not last:
        return model.no_sync()
    return nullcontext()


def clip_gradients(model, max_norm, run):
    """Clip the gradient to max_norm by the norm of the whole gradient, returned. Under FSDP each
    process holds a shard of every gradient: the norm is gathered from the shards' squares over
    the processes (a DTensor's reduction), and every process scales its shards alike."""
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    return norm.full_tensor() if run.sharded else norm


def grad_scaler(run):
    """float16's loss scaler (disabled in the other dtypes). Under FSDP each process checks only
    its own shards for an overflow: ShardedGradScaler all-reduces the verdict, so every process
    skips the same steps."""
    scaler = torch.amp.GradScaler
    if run.sharded:
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler as scaler
    return scaler(run.device_type, enabled=run.dtype == "float16")


def plain_class(model):
    """The model's own class: fully_shard makes a sharded module an instance of a subclass
    (FSDPGPT of GPT)."""
    from torch.distributed.fsdp import FSDPModule

    return next(c for c in type(model).__mro__ if not issubclass(c, FSDPModule))


@dataclass
class StepGuard:
    """What may stop a run between steps; a context manager, the run's only signal handlers.
    Ctrl-C or SIGTERM asks for a stop at the next step boundary, after saving; a second Ctrl-C
    stops at once, except during the save (torchrun's agent signals every rank again when one
    exits: a save must not be cut short by that). Under torchrun the signal is all-reduced, so
    every rank stops at the same step: one alone would leave the others waiting in an all-reduce."""

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
        if self.signum and signum == signal.SIGINT and not self.saving:
            raise KeyboardInterrupt
        self.signum = self.signum or signum

    def gather(self, loss_sum, norm):
        """The step's one sync: (the mean loss over the ranks, the gradient norm) as numbers, and
        the stop signal of any rank agreed on by every rank. loss_sum and norm: float32 scalars on
        the device (loss_sum is all-reduced in place)."""
        flag = torch.tensor(float(self.signum), device=self.run.device)
        if self.run.distributed:
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            dist.all_reduce(loss_sum)
            loss_sum /= self.run.world_size
        loss, norm, signum = torch.stack([loss_sum, norm, flag]).tolist()
        self.agreed_signum = int(signum)
        return loss, norm

    def stop_now(self):
        """The signal to stop with now, or 0: under torchrun the one all ranks agreed on at the last
        gather; one process's own otherwise."""
        return self.agreed_signum if self.run.distributed else self.signum

    @contextmanager
    def stopping(self, step, out_dir):
        """Around rank 0's save: a second Ctrl-C does not cut it short; then every rank waits until
        it has saved (torchrun stops the other ranks once one exits) and exits with 128 + the
        signal, as a process killed by it would."""
        self.saving = True
        yield
        if self.run.distributed:
            dist.barrier()
        signum = self.stop_now()
        # one write: every rank prints this line at once, and print() writes text and newline apart
        sys.stderr.write(
            f"stopped by signal {signum} at step {step}; {out_dir}/trainer_state.pt holds it: "
            "resume with --init_from=resume\n"
        )
        raise SystemExit(128 + signum)
