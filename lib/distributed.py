"""What a run's processes are (Run, from started(): device, dtype, rank) and what may stop them
between steps (StepGuard): a signal, or another rank's stop. One process or torchrun's group (DDP:
NCCL on CUDA, gloo on CPUs)."""

import os
import signal
import sys
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import timedelta

import torch
import torch.distributed as dist

from lib.common import Error, pick_device, resolve_dtype


@dataclass(frozen=True)
class Run:
    """What a run resolves at start-up and keeps to the end: this process's device, dtype and
    place in the group."""

    device: str  # cpu, cuda:3, mps
    dtype: str  # float32, bfloat16 or float16: the autocast dtype
    ddp: bool = False  # one of torchrun's processes
    rank: int = 0
    world_size: int = 1

    @property
    def master(self):
        """The process that logs and saves."""
        return self.rank == 0

    @property
    def device_type(self):
        return self.device.split(":")[0]

    @property
    def device_ids(self):
        """DDP's device_ids: this process's GPU, or None on CPUs."""
        if self.device_type != "cuda":
            return None
        return [torch.device(self.device).index]

    def resolved(self, dtype):
        """This Run with dtype as the settings ask for it (auto: the hardware's rule), checked for
        its device."""
        return replace(self, dtype=resolve_dtype(dtype, self.device))


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
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ["LOCAL_RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    if device not in ("auto", "cuda", "cpu"):
        raise Error(
            f"--device {device} with {world_size} processes: each process takes its own GPU "
            "(LOCAL_RANK); use --device=auto or cuda (or cpu)"
        )
    cuda = device in ("auto", "cuda") and torch.cuda.is_available()
    device = pick_device(f"cuda:{local_rank}" if cuda else device)
    backend = "nccl" if device.startswith("cuda") else "gloo"
    dist.init_process_group(backend=backend, timeout=timedelta(minutes=60))
    try:
        yield Run(device, None, True, rank, world_size)
    finally:
        dist.destroy_process_group()


def agreed(run, attempt):
    """attempt()'s result, or the first rank's Error raised on every rank: the same one line on
    each, none left waiting in the group for a rank that stopped (rank 0's out_dir lock and
    refusal, a resumed run's state)."""
    result = None
    error = None
    try:
        result = attempt()
    except Error as e:
        error = str(e)
    if run.ddp:
        errors = [None] * run.world_size
        dist.all_gather_object(errors, error)
        error = next((e for e in errors if e), None)
    if error:
        raise Error(error)
    return result


class StepGuard:
    """What may stop a run between steps; a context manager, the run's only signal handlers.
    Ctrl-C or SIGTERM asks for a stop at the next step boundary, after saving; a second Ctrl-C
    stops at once, except during the save (torchrun's agent signals every rank again when one
    exits: a save must not be cut short by that). Under DDP the signal is all-reduced, so every
    rank stops at the same step: one alone would leave the others waiting in an all-reduce."""

    def __init__(self, run):
        self.run = run
        self.signum = 0  # the signal this process received
        self.agreed_signum = 0  # the one every rank agreed on at the last gather
        self.saving = False

    def __enter__(self):
        self.handlers = {}
        for s in (signal.SIGINT, signal.SIGTERM):
            self.handlers[s] = signal.signal(s, self.on_signal)
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
        the stop signal of any rank agreed on by every rank."""
        flag = torch.full((), float(self.signum), device=self.run.device)
        loss_sum = loss_sum.float()
        if self.run.ddp:
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            dist.all_reduce(loss_sum)
            loss_sum /= self.run.world_size
        loss, norm, signum = torch.stack([loss_sum, norm.float(), flag]).tolist()
        self.agreed_signum = int(signum)
        return loss, norm

    def stop_now(self):
        """The signal to stop with now, or 0: under DDP the one all ranks agreed on at the last
        gather; one process's own otherwise."""
        return self.agreed_signum if self.run.ddp else self.signum

    @contextmanager
    def stopping(self, step, out_dir):
        """Around rank 0's save: a second Ctrl-C does not cut it short; then every rank waits until
        it has saved (torchrun stops the other ranks once one exits) and exits with 128 + the
        signal, as a process killed by it would."""
        self.saving = True
        yield
        if self.run.ddp:
            dist.barrier()
        signum = self.stop_now()
        # one write: every rank prints this line at once, and print() writes text and newline apart
        sys.stderr.write(
            f"stopped by signal {signum} at step {step}; {out_dir}/trainer_state.pt holds it: "
            "resume with --init_from=resume\n"
        )
        raise SystemExit(128 + signum)
