"""What a run keeps in out_dir besides records: the lock that gives one run the folder,
trainer_state.pt (model, optimizers, step, best metric, settings) that init_from=resume continues
exactly, and config.json beside the model. The state is saved as torch.distributed.checkpoint's
full state dicts, gathered whole onto rank 0 under FSDP: the same trainer_state.pt resumes under any
strategy and number of processes (the module is imported at a run's first save or resume: the
import takes about a second)."""

import os
import shutil
import socket
import sys
from contextlib import contextmanager
from dataclasses import asdict, replace
from pathlib import Path

import torch

from lib.common import TEMPORARY, Error, WriteError, atomic_path, fsync, read_json
from lib.distributed import plain_class
from lib.weights import save_pretrained

# the settings a checkpoint's tensors depend on: its shape, and what its optimizer states fit
SHAPE = (
    "vocab_size",
    "block_size",
    "n_layer",
    "n_head",
    "n_embd",
    "bias",
    "rope",
    "qk_norm",
    "bow_head",
    "bow_buckets",
)
KEPT_ON_RESUME = SHAPE + ("task", "optimizer")
# the files whose presence means out_dir holds a checkpoint
CHECKPOINT = ("model.safetensors", "trainer_state.pt")
# where --overwrite_out_dir moves the old run's files
PREVIOUS = "previous"


@contextmanager
def locked_out_dir(out_dir, resuming, overwrite):
    """Make out_dir and hold a lock on it for the run (flock: the OS releases it when the process
    dies). A new run refuses a checkpoint there, or with overwrite moves the old run's files into
    out_dir/previous."""
    try:
        os.makedirs(out_dir, exist_ok=True)
        lock = open(os.path.join(out_dir, ".lock"), "a+")
    except OSError as e:
        raise Error(
            f"out_dir {out_dir!r} is not writable ({e.strerror}): pick another --out_dir"
        ) from None
    with lock:
        try:
            import fcntl  # POSIX; elsewhere runs are not locked

            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except ImportError:
            pass
        except BlockingIOError:  # held: the one failure that means another run
            lock.seek(0)
            holder = lock.read().strip() or "pid ?"
            raise Error(
                f"out_dir {out_dir!r} is in use by another run ({holder}): wait for it to end, "
                "or pick another --out_dir"
            ) from None
        except OSError as e:
            raise Error(
                f"out_dir {out_dir!r} cannot be locked ({e.strerror}: a filesystem without "
                "flock, such as some network mounts?): pick an --out_dir on a local disk"
            ) from None
        lock.truncate(0)
        lock.write(f"pid {os.getpid()} on {socket.gethostname()}")
        lock.flush()
        # the temporary files of saves cut short: with the lock held, every one is a dead run's
        for path in Path(out_dir).iterdir():
            if TEMPORARY.search(path.name):
                path.unlink()
        saved = saved_files(out_dir)
        if saved and not resuming and not overwrite:
            raise Error(
                f"out_dir {out_dir!r} already holds a checkpoint ({', '.join(saved)}): continue it "
                "with --init_from=resume, replace it with --overwrite_out_dir=True, or pick "
                "another --out_dir"
            )
        if saved and not resuming:
            move_aside(out_dir)
        yield


def move_aside(out_dir):
    """The old run's files into out_dir/previous, by rename: nothing is lost, and the folder that
    an earlier overwrite left there goes."""
    previous = Path(out_dir, PREVIOUS)
    shutil.rmtree(previous, ignore_errors=True)
    previous.mkdir()
    for path in Path(out_dir).iterdir():
        if path.name not in (".lock", PREVIOUS):
            path.rename(previous / path.name)
    fsync(os.path.abspath(out_dir))


@contextmanager
def what_survives(out_dir):
    """A write the system refused (a WriteError: a full disk, a folder without write permission)
    ends the run in one line that adds what out_dir holds and how to go on: trainer_state.pt,
    whole (each save replaces it in one rename), read for its step."""
    try:
        yield
    except WriteError as e:
        path = os.path.join(out_dir, "trainer_state.pt")
        if not os.path.exists(path):
            raise Error(
                f"{e}; {out_dir} holds no trainer state yet: free space (or fix the folder's "
                "permissions) and run again with --overwrite_out_dir=True"
            ) from None
        step = torch.load(path, map_location="cpu", weights_only=True, mmap=True)["step"]
        raise Error(
            f"{e}; the checkpoint of step {step} in {out_dir} is intact: free space (or fix the "
            "folder's permissions) and resume with --init_from=resume"
        ) from None


def saved_files(out_dir):
    """The names of the checkpoint files out_dir holds (empty: none)."""
    return [f for f in CHECKPOINT if Path(out_dir, f).exists()]


def resume(settings, user_keys):
    """(the trainer state in out_dir, the settings of its run): only the keys given now override
    the saved ones, never the model's shape or the optimizer; the device is this command's.
    Loaded with mmap: the file is read as the tensors are used. init_from becomes where the run
    began (scratch, or the weights it started from), which it stays through every resume."""
    path = os.path.join(settings.out_dir, "trainer_state.pt")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        saved = state["config"]
    except FileNotFoundError:
        raise Error(
            f"init_from=resume but {path} does not exist: train with init_from=scratch first"
        ) from None
    except Exception as e:
        raise Error(
            f"cannot resume from {path} ({type(e).__name__}): "
            "not a trainer state that train.py wrote"
        ) from None
    if saved["init_from"] != "scratch":
        # the shape came from pretrained weights, not from the keys given
        user_keys = user_keys - set(SHAPE)
    current = asdict(settings)
    changed = [
        f"{k}={saved[k]!r} there, {current[k]!r} here"
        for k in KEPT_ON_RESUME
        if k in user_keys and saved[k] != current[k]
    ]
    if changed:
        changes = "; ".join(changed)
        raise Error(f"cannot resume {path} with a different model or optimizer: {changes}")
    # the device is where this command runs (its processes joined their group on it); init_from
    # stays the first run's
    given = (user_keys | {"device"}) - {"init_from"}
    kept = {k: v for k, v in saved.items() if k in current and k not in given}
    return state, replace(settings, **kept)


def check_tokenizer_kept(out_dir, meta, data_dir):
    """A resumed run's data is tokenized as its model was: the tokenizer its card names is the
    one the data's meta.json names (a run stopped before its first model save has no card)."""
    path = os.path.join(out_dir, "config.json")
    if not os.path.isfile(path):
        return
    if read_json(path, "checkpoint config").get("tokenizer") != meta["tokenizer"]:
        raise Error(
            f"{data_dir}: not tokenized as the model in {out_dir} (its tokenizer differs from the "
            f"one {path} names: prepared again since the run began?): prepare it as before, or "
            "start a new run"
        )


def save_state(out_dir, model, optimizers, scaler, progress, run):
    """The whole trainer state in one file, atomically, written by rank 0; progress: step, best,
    seconds and settings (config). Every rank takes part in gathering it (FSDP's shards)."""
    model_state, optimizer_states = gathered(model, optimizers)
    if not run.master:
        return
    state = {
        "model": model_state,
        "optimizers": optimizer_states,
        "scaler": scaler.state_dict(),
        **progress,
    }
    with atomic_path(os.path.join(out_dir, "trainer_state.pt")) as tmp:
        torch.save(state, tmp)


def save_model(model, out_dir, run, data_dir, **extra):
    """model.safetensors + config.json (save_pretrained; data_dir: where a trained tokenizer's
    file comes from), written by rank 0. A sharded model's tensors are gathered first, every rank
    taking part, into a plain copy of the model on rank 0's CPU."""
    state = gathered(model, [])[0] if run.sharded else None
    if not run.master:
        return
    if run.sharded:
        with torch.device("meta"):
            copy = plain_class(model)(model.config)
        model = copy.load_weights(state)
    save_pretrained(model, out_dir, data_dir, **extra)


def gathered(model, optimizers):
    """(model.state_dict(), the optimizers' state dicts keyed by parameter names) with whole
    tensors in rank 0's CPU memory, empty on the other ranks: torch.distributed.checkpoint's full
    state dicts, the saved format of every strategy. Each tensor has memory of its own size (a
    gather can leave a view into a padded buffer, which torch.save writes whole and safetensors
    refuses), and a parameter under two names (GPT's head and token table) is one tensor."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    state = get_model_state_dict(model, options=options)
    for name, tensor in state.items():
        if tensor.untyped_storage().nbytes() > tensor.nbytes:
            state[name] = tensor.clone()
    first = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        kept = first.setdefault(id(p), name)
        if name in state:
            state[name] = state[kept]
    # before the first step there is no optimizer state to save (the API would make one, with a
    # step of learning rate 0)
    if not all(o.state for o in optimizers):
        return state, []
    return state, [get_optimizer_state_dict(model, o, options=options) for o in optimizers]


def restore(state, optimizers, scaler, sharded_model=None):
    """(step, best metric or None, seconds so far) of a resumed state, its optimizer states loaded;
    from scratch (0, None, 0.0). sharded_model: the FSDP model the optimizers update, whose
    processes each take their shards' slices of the saved whole tensors. fp16's loss scale carries
    over; a disabled scaler (bf16 and fp32 runs) saved an empty state, which an enabled one cannot
    load: it keeps its initial scale then (and a disabled one ignores a saved scale)."""
    if state is None:
        return 0, None, 0.0
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True)
    for optimizer, saved in zip(optimizers, state["optimizers"]):
        if sharded_model is None:
            # the saved groups name their parameters in the optimizer's order, which
            # load_state_dict pairs by place
            optimizer.load_state_dict(saved)
        else:
            set_optimizer_state_dict(sharded_model, optimizer, saved, options=options)
    if scaler.is_enabled() and state["scaler"]:
        scaler.load_state_dict(state["scaler"])
    return state["step"], state["best"], state.get("seconds", 0.0)


def model_card(settings, meta):
    """What config.json says beside the model; a classifier's labels also as Hugging Face's
    id2label and label2id."""
    launcher = "torchrun ..." if "RANK" in os.environ else "python"
    card = dict(
        task=settings.task,
        dataset=settings.dataset,
        init_from=settings.init_from,
        tokenizer=meta["tokenizer"],
        command=[launcher] + sys.argv,
    )
    if settings.task == "classify":
        names = meta["label_names"]
        card.update(
            label_names=names,
            max_length=meta["max_length"],
            id2label=dict(enumerate(names)),
            label2id={name: i for i, name in enumerate(names)},
        )
    return card
