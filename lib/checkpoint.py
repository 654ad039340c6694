"""out_dir's lock, trainer_state.pt (what init_from=resume continues exactly, under any strategy
and number of processes), the model's card and its weights (model.safetensors + config.json)."""

import json
import os
import secrets
import shutil
import socket
import sys
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, replace
from pathlib import Path

import safetensors.torch
import torch

from lib.common import Error, check_regular, read_json
from lib.distributed import under_torchrun
from lib.files import TEMPORARY, WriteError, atomic_path, fsync, locked_out_dir
from lib.options import CARD_FIX, checking

# the settings a checkpoint's weights hold to: their shapes, what the optimizer states fit, and
# the function they compute (rope, qk_norm and gelu have no tensors of their own)
SHAPE = (
    "vocab_size",
    "block_size",
    "n_layer",
    "n_head",
    "n_embd",
    "bias",
    "rope",
    "qk_norm",
    "gelu",
    "bow_head",
    "bow_buckets",
)
# the attention pattern: no tensors of its own, but what the weights learnt to read through
PATTERN = ("window", "global_tokens", "random_links", "random_seed")
# a LoRA run's adapters: their tensors' shapes and the function they compute
ADAPTERS = ("lora_rank", "lora_alpha", "lora_targets")


@contextmanager
def run_out_dir(out_dir, resuming, overwrite):
    """out_dir locked for the run (lib.files.locked_out_dir), its .lock naming the run. A new
    run refuses a checkpoint there, or with overwrite moves it aside."""
    path = os.path.join(out_dir, ".lock")
    # a folder from elsewhere (a tarball) may hold a .lock that links to any file
    if os.path.islink(path) or (os.path.exists(path) and not os.path.isfile(path)):
        raise Error(f"{path} is a link or not a regular file: delete it (a run makes its own)")
    with locked_out_dir(out_dir, held_by_a_run):
        try:
            # never through a link, even one made since the check
            flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0)
            with open(os.open(path, flags, 0o666), "w") as lock:
                lock.write(f"pid {os.getpid()} on {socket.gethostname()}")
        except OSError as e:
            raise Error(
                f"out_dir {out_dir!r} is not writable ({e.strerror}): pick another --out_dir"
            ) from None
        # the temporary files of saves cut short: with the lock held, every one is a dead run's
        for path in Path(out_dir).iterdir():
            if TEMPORARY.search(path.name):
                path.unlink()
        saved = [f for f in ("model.safetensors", "trainer_state.pt") if Path(out_dir, f).exists()]
        if saved and not resuming:
            if not overwrite:
                raise Error(
                    f"out_dir {out_dir!r} already holds a checkpoint ({', '.join(saved)}): "
                    "continue it with --init_from=resume, replace it with "
                    "--overwrite_out_dir=True, or pick another --out_dir"
                )
            move_aside(out_dir)
        yield


def held_by_a_run(out_dir):
    """The refusal of an out_dir another run holds, naming that run (its .lock)."""
    try:
        holder = Path(out_dir, ".lock").read_text().strip()
    except (OSError, UnicodeDecodeError):
        holder = ""
    return (
        f"out_dir {out_dir!r} is in use by another run ({holder or 'pid ?'}): wait for it to "
        "end, or pick another --out_dir"
    )


def move_aside(out_dir):
    """The old run's files into out_dir/previous, by rename (replacing an older one there)."""
    previous = Path(out_dir, "previous")
    shutil.rmtree(previous, ignore_errors=True)
    previous.mkdir()
    for path in Path(out_dir).iterdir():
        if path.name not in (".lock", "previous"):
            path.rename(previous / path.name)
    fsync(os.path.abspath(out_dir))


@contextmanager
def what_survives(out_dir):
    """A refused write (a full disk, no permission) ends the run in one line: what out_dir holds
    and how to go on."""
    try:
        yield
    except WriteError as e:
        path = os.path.join(out_dir, "trainer_state.pt")
        if not os.path.exists(path):
            raise Error(
                f"{e}; {out_dir} holds no trainer state yet: free space (or fix the folder's "
                "permissions) and run again with --overwrite_out_dir=True"
            ) from None
        # whole: each save replaces it in one rename
        step = torch.load(path, map_location="cpu", weights_only=True, mmap=True)["step"]
        raise Error(
            f"{e}; the checkpoint of step {step} in {out_dir} is intact: free space (or fix the "
            "folder's permissions) and resume with --init_from=resume"
        ) from None


def resume(settings, user_keys, keys):
    """(out_dir's trainer state, its run's settings): the keys given now override the saved ones,
    except the model's shape, task and optimizer; init_from stays where the run began. keys: each
    setting's Option, whose rule the saved values pass as a new run's."""
    path = os.path.join(settings.out_dir, "trainer_state.pt")
    check_regular(path)
    try:
        # mmap: the file is read as the tensors are used
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        saved = state["config"]
        began = saved["init_from"]
    except FileNotFoundError:
        raise Error(
            f"init_from=resume but {path} does not exist: train with init_from=scratch first"
        ) from None
    except Exception as e:
        raise Error(
            f"cannot resume from {path} ({type(e).__name__}): "
            "not a trainer state that train.py wrote"
        ) from None
    if began != "scratch":
        # the shape came from pretrained weights, not from the keys given
        user_keys = user_keys - set(SHAPE)
    current = asdict(settings)
    # a key newer than the state has its default there: a run before lora_rank had rank 0
    fixed = SHAPE + PATTERN + ADAPTERS + ("task", "optimizer")
    was = {k: saved.get(k, keys[k].default) for k in fixed if k in user_keys}
    changed = [f"{k}={v!r} there, {current[k]!r} here" for k, v in was.items() if v != current[k]]
    if changed:
        changes = "; ".join(changed)
        raise Error(f"cannot resume {path} with a different model, pattern or optimizer: {changes}")
    # the device is where this command's processes joined their group
    given = (user_keys | {"device"}) - {"init_from"}
    try:  # a damaged state's, or another version's
        kept = {k: keys[k].check(k, v) for k, v in saved.items() if k in keys and k not in given}
    except Error as e:
        raise Error(f"{path}: its {e}: give that key a value on this command") from None
    return state, replace(settings, **kept)


def check_tokenizer_kept(state, out_dir, meta, data_dir):
    """A resumed run's data is tokenized as its trainer state says (one saved before states named
    their tokenizer: as its model's card, if any, says)."""
    kept = state.get("tokenizer")
    path = os.path.join(out_dir, "config.json")
    if kept is None and os.path.isfile(path):
        card = read_json(path, "checkpoint config")
        with checking(card, path, CARD_FIX):
            kept = card.get("tokenizer")
    if kept not in (None, meta["tokenizer"]):
        raise Error(
            f"{data_dir}: not tokenized as the model in {out_dir} trains with (prepared again "
            "since the run began?): prepare it as before, or start a new run"
        )


def save_state(out_dir, model, optimizers, scaler, progress, run):
    """trainer_state.pt, atomically: progress (step, best, seconds, config) and the tensors that
    every rank gathers and rank 0 writes."""
    model_state, optimizer_states = gathered(model, optimizers)
    if not run.master:
        return
    state = {
        "model": model_state,
        "optimizers": optimizer_states,
        "scaler": scaler.state_dict(),
        **progress,
    }
    if hasattr(model, "adapter"):  # the adapters alone, and the base they adapt
        from lib.lora import adapter_state

        state["model"], state["adapter"] = adapter_state(model_state), model.adapter
    with atomic_path(os.path.join(out_dir, "trainer_state.pt")) as tmp:
        torch.save(state, tmp)


def save_model(model, out_dir, run, data_dir, **extra):
    """save_pretrained on rank 0; a sharded model is gathered, every rank taking part, into a
    plain copy on rank 0's CPU."""
    state = gathered(model, [])[0] if run.sharded else None
    if not run.master:
        return
    if run.sharded:
        from parallel import unsharded

        model = unsharded(model, state)
    save_pretrained(model, out_dir, data_dir, **extra)


def save_pretrained(model, out_dir, tokenizer_dir=None, **extra):
    """model.safetensors + config.json (extra: task, tokenizer, label names), and a trained
    tokenizer's file copied from tokenizer_dir."""
    os.makedirs(out_dir, exist_ok=True)
    token = secrets.token_hex(8)
    card = {
        "architecture": type(model).__name__,
        "model": asdict(model.config),
        **extra,
        **({"adapter": model.adapter} if hasattr(model, "adapter") else {}),
        "weights_id": token,
    }
    tokenizer_file = (card.get("tokenizer") or {}).get("file")
    if tokenizer_file:  # read and checked before a write, whose errors say the disk refused it
        from lib.bpe import read_ranks_file

        source = os.path.join(tokenizer_dir, tokenizer_file)
        where = os.path.join(tokenizer_dir, "meta.json")
        text = read_ranks_file(source, card["tokenizer"]["sha256"], where)
    # renamed in reverse: the tokenizer, the weights, then the card that names both
    with ExitStack() as files:
        card_tmp = replacing(files, out_dir, "config.json")
        weights_tmp = replacing(files, out_dir, "model.safetensors")
        if tokenizer_file:
            with open(replacing(files, out_dir, tokenizer_file), "wb") as f:
                f.write(text)
        # drops a tied head's duplicate tensor
        safetensors.torch.save_model(
            model, weights_tmp, metadata={"format": "pt", "weights_id": token}
        )
        with open(card_tmp, "w") as f:
            json.dump(card, f, indent=2)


def replacing(files, out_dir, name):
    """The temporary path that replaces out_dir's file name as files (an ExitStack) closes."""
    return files.enter_context(atomic_path(os.path.join(out_dir, name)))


def gathered(model, optimizers):
    """(model state, optimizer states keyed by parameter names): full state dicts, whole tensors
    on rank 0's CPU and nothing on the other ranks, the same under every strategy."""
    # imported at the first save or resume: a second at every start otherwise
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    state = get_model_state_dict(model, options=options)
    # a view into a gather's padded buffer: torch.save writes the buffer, safetensors refuses it
    for name, tensor in state.items():
        if tensor.untyped_storage().nbytes() > tensor.nbytes:
            state[name] = tensor.clone()
    # a parameter under two names (GPT's head and token table) stays one tensor
    first = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        kept = first.setdefault(id(p), name)
        if name in state:
            state[name] = state[kept]
    # none before the first step (the API would make one by a step at learning rate 0)
    if not all(o.state for o in optimizers):
        return state, []
    return state, [get_optimizer_state_dict(model, o, options=options) for o in optimizers]


def restore(state, optimizers, scaler, sharded_model=None):
    """(step, best metric or None, seconds so far) of a resumed state, its optimizer and loss
    scaler states loaded; (0, None, 0.0) from scratch. sharded_model: the FSDP model."""
    if state is None:
        return 0, None, 0.0
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True)
    for optimizer, saved in zip(optimizers, state["optimizers"]):
        if sharded_model is None:
            # the saved groups list their parameters in the optimizer's order: paired by place
            optimizer.load_state_dict(saved)
        else:
            # each process takes its shards' slices of the whole tensors
            set_optimizer_state_dict(sharded_model, optimizer, saved, options=options)
    # a disabled scaler (bf16, fp32) saved an empty state, which an enabled one cannot load
    if scaler.is_enabled() and state["scaler"]:
        scaler.load_state_dict(state["scaler"])
    return state["step"], state["best"], state.get("seconds", 0.0)


def model_card(settings, meta):
    """config.json's entries; a classifier's labels also as Hugging Face's id2label, label2id."""
    launcher = "torchrun ..." if under_torchrun() else "python"
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
