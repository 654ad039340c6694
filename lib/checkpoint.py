"""What a run keeps in out_dir besides records: the lock that gives one run the folder,
trainer_state.pt (model, optimizers, step, best metric, settings) that init_from=resume continues
exactly, and config.json beside the model."""

import os
import socket
import sys
from contextlib import contextmanager
from dataclasses import asdict, replace

import torch

from lib.common import Error, atomic_path

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


@contextmanager
def locked_out_dir(out_dir, new_run):
    """Make out_dir and hold a lock on it for the run (flock: the OS releases it when the process
    dies, kill -9 included); a new run (new_run: not a resume) never replaces a checkpoint that is
    there."""
    try:
        os.makedirs(out_dir, exist_ok=True)
        lock = open(os.path.join(out_dir, ".lock"), "a+")
    except OSError as e:
        raise Error(
            f"out_dir {out_dir!r} is not writable ({e.strerror}): pick another --out_dir"
        ) from None
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
            f"out_dir {out_dir!r} cannot be locked ({e.strerror}: a filesystem without flock, "
            "such as some network mounts?): pick an --out_dir on a local disk"
        ) from None
    lock.truncate(0)
    lock.write(f"pid {os.getpid()} on {socket.gethostname()}")
    lock.flush()
    try:
        names = ("model.safetensors", "trainer_state.pt")
        saved = [f for f in names if os.path.exists(os.path.join(out_dir, f))]
        if saved and new_run:
            raise Error(
                f"out_dir {out_dir!r} already holds a checkpoint ({', '.join(saved)}): continue it "
                "with --init_from=resume, replace it with --overwrite_out_dir=True, or pick "
                "another --out_dir"
            )
        yield
    finally:
        lock.close()


def resume(settings, user_keys):
    """(the trainer state in out_dir, the settings of its run): only the keys given now override
    the saved ones, never the model's shape or the optimizer; the device is this command's.
    Loaded with mmap: the file is read as the tensors are used. init_from becomes where the run
    began (scratch, or the weights it started from), which it stays through every resume."""
    path = os.path.join(settings.out_dir, "trainer_state.pt")
    if not os.path.isfile(path):
        raise Error(
            f"init_from=resume but {path} does not exist: train with init_from=scratch first"
        )
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        saved = state["config"]
    except Exception as e:
        raise Error(
            f"cannot resume from {path} ({type(e).__name__}): "
            "not a trainer state that train.py wrote"
        ) from None
    if saved["init_from"] != "scratch":
        # the shape came from pretrained weights, not from the keys given
        user_keys = user_keys - set(SHAPE)
    current = asdict(settings)
    changed = []
    for k in KEPT_ON_RESUME:
        if k in user_keys and saved[k] != current[k]:
            changed.append(f"{k}={saved[k]!r} there, {current[k]!r} here")
    if changed:
        changes = "; ".join(changed)
        raise Error(f"cannot resume {path} with a different model or optimizer: {changes}")
    # the device is where this command runs (its processes joined their group on it); init_from
    # stays the first run's
    kept = {}
    for k, v in saved.items():
        given = k in user_keys and k != "init_from"
        if k in current and k != "device" and not given:
            kept[k] = v
    return state, replace(settings, **kept)


def save_state(out_dir, model, optimizers, scaler, progress):
    """The whole trainer state in one file, atomically; progress: step, best, seconds and settings
    (config)."""
    state = {
        "model": model.state_dict(),
        "optimizers": [o.state_dict() for o in optimizers],
        "scaler": scaler.state_dict(),
        **progress,
    }
    with atomic_path(os.path.join(out_dir, "trainer_state.pt")) as tmp:
        torch.save(state, tmp)


def restore(state, optimizers, scaler):
    """(step, best metric or None, seconds so far) of a resumed state, its optimizer states loaded;
    from scratch (0, None, 0.0). fp16's loss scale carries over; a disabled scaler (bf16 and fp32
    runs) saved an empty state, which an enabled one cannot load: it keeps its initial scale then
    (and a disabled one ignores a saved scale)."""
    if state is None:
        return 0, None, 0.0
    for optimizer, saved in zip(optimizers, state["optimizers"]):
        optimizer.load_state_dict(saved)
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
