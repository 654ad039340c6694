"""train.py's settings: each key with its default, help and range (config files and --key=value
set them), and the rules the keys must satisfy together."""

import os
import sys
from dataclasses import asdict

import torch

from lib import config
from lib.build import model_config
from lib.common import Error
from lib.keys import GPT2_NAMES, Key, keys_of
from model import EncoderConfig

KEYS = dict(
    # run
    out_dir=Key("out", "where the checkpoints and metrics.jsonl go"),
    task=Key(
        "lm",
        "lm: next-token prediction with GPT; classify: EncoderClassifier on labelled rows",
        choices=("lm", "classify"),
    ),
    dataset=Key(
        "shakespeare_char",
        "a folder under data/ made by its prepare.py, or a path to a prepared folder",
    ),
    init_from=Key(
        "scratch",
        "scratch, resume, gpt2[-medium|-large|-xl], or a folder of GPT weights (ours or HF's)",
    ),
    overwrite_out_dir=Key(
        False,
        "let a new run start in an out_dir that holds a checkpoint (without it, it refuses): "
        "the old run's files move into out_dir/previous",
    ),
    # torch.manual_seed's range, and numpy's seeds are >= 0
    seed=Key(1337, "batches, initial weights and dropout all follow from it", ge=0, lt=2**64),
    device=Key(
        "auto",
        "auto: cuda, then mps, then cpu; or cpu, cuda, cuda:1, mps "
        "(a resume runs where it is told)",
    ),
    dtype=Key(
        "auto",
        "autocast dtype; auto: on a CPU the faster of float32 and bfloat16 for this model, timed "
        "at the start and remembered (lib/autotune.py); bfloat16 on GPUs that have it, else "
        "float16",
        choices=("auto", "float32", "bfloat16", "float16"),
    ),
    compile=Key(False, "torch.compile the model: a slower start, faster steps on GPUs"),
    deterministic=Key(
        False,
        "deterministic GPU kernels (slower): identical reruns, resumes and DDP on GPUs as well",
    ),
    strategy=Key(
        "ddp",
        "under torchrun: ddp, a whole copy of the model on each process; fsdp, parameters, "
        "gradients and AdamW's moments sharded over the processes (one process: no difference)",
        choices=("ddp", "fsdp"),
    ),
    activation_checkpointing=Key(
        False,
        "recompute each Block's activations in the backward pass: only the Blocks' inputs are "
        "kept, for a second forward pass (about a third more compute)",
    ),
    # evaluation, logging, checkpoints
    eval_interval=Key(250, "steps between evaluations (and checkpoints)", ge=1),
    eval_iters=Key(100, "batches per evaluation, the same ones every time", ge=1),
    log_interval=Key(
        10,
        "steps between log lines (loss, lr, speed, gradient norm; MFU on known GPUs)",
        ge=1,
    ),
    eval_only=Key(False, "evaluate once and exit"),
    always_save_checkpoint=Key(
        True, "save trainer_state.pt at every evaluation, not only when validation improves"
    ),
    wandb_log=Key(False, "log to wandb as well (WANDB_MODE=offline works without an account)"),
    wandb_project=Key("gpt-starter", "the wandb project"),
    wandb_run_name=Key("", "the wandb run's name; empty: out_dir and the start time"),
    # data and model
    batch_size=Key(12, "rows per micro-step per process", ge=1),
    gradient_accumulation_steps=Key(
        1, "micro-steps per optimizer step, over all processes together", ge=1
    ),
    vocab_size=Key(0, "0: the dataset's", ge=0),
    # the model's keys, declared with its config: block_size, n_layer, n_head, n_embd, dropout,
    # bias, attn_impl, rope, qk_norm, token_dropout, bow_head, bow_buckets
    **keys_of(EncoderConfig),
    # optimizer and schedule: linear warmup, then cosine decay to min_lr
    optimizer=Key(
        "adamw",
        "adamw; muon: Muon for the blocks' matrices, AdamW for the rest",
        choices=("adamw", "muon"),
    ),
    learning_rate=Key(6e-4, "peak learning rate", ge=0),
    min_lr=Key(6e-5, "learning rate at the end of the decay", ge=0),
    warmup_iters=Key(100, "steps of linear warmup", ge=0),
    lr_decay_iters=Key(5000, "the step at which the decay reaches min_lr", ge=0),
    decay_lr=Key(True, "False: learning_rate throughout"),
    max_iters=Key(5000, "optimizer steps in all", ge=0),
    weight_decay=Key(0.1, "decoupled weight decay of matrices and embeddings", ge=0),
    beta1=Key(0.9, "Adam's first-moment decay", ge=0, lt=1),
    beta2=Key(0.95, "Adam's second-moment decay", ge=0, lt=1),
    grad_clip=Key(1.0, "clip the gradient's global norm to this; 0 turns clipping off", ge=0),
)


def check_rules(cfg, resuming):
    """What the keys must satisfy together."""
    processes = int(os.environ.get("WORLD_SIZE", 1))
    forms = ("scratch", "resume") + GPT2_NAMES
    if cfg.decay_lr and cfg.min_lr > cfg.learning_rate:
        raise broken(cfg, "min_lr", f"<= learning_rate={cfg.learning_rate}")
    if not (resuming or cfg.init_from in forms or os.path.isdir(cfg.init_from)):
        hint = config.did_you_mean(cfg.init_from, forms)
        raise broken(
            cfg, "init_from", f"one of {', '.join(forms)} or a folder of GPT weights{hint}"
        )
    if not resuming and os.path.isdir(cfg.init_from) and inside(cfg.init_from, cfg.out_dir):
        outside = (
            f"a folder outside out_dir={cfg.out_dir!r}, which the run writes (and "
            "--overwrite_out_dir moves aside): copy the checkpoint elsewhere and start from there"
        )
        raise broken(cfg, "init_from", outside)
    if cfg.strategy == "fsdp" and cfg.optimizer == "muon":
        whole = (
            "adamw with strategy=fsdp (Muon orthogonalises each whole matrix, FSDP gives each "
            "process a slice of its rows): train Muon with strategy=ddp"
        )
        raise broken(cfg, "optimizer", whole)
    if cfg.optimizer == "muon" and not hasattr(torch.optim, "Muon"):
        older = f"adamw: torch {torch.__version__} has no torch.optim.Muon (2.9 and later have)"
        raise broken(cfg, "optimizer", older)
    if cfg.gradient_accumulation_steps % processes:
        share = f"a multiple of the {processes} processes: each takes an equal share"
        raise broken(cfg, "gradient_accumulation_steps", share)
    for key in ("token_dropout", "bow_head", "bow_buckets"):
        if cfg.task != "classify" and getattr(cfg, key):
            raise broken(cfg, key, "0 unless task=classify (an option of the encoder)")
    first_rank = int(os.environ.get("RANK", 0)) == 0
    if first_rank and cfg.decay_lr and cfg.max_iters < cfg.lr_decay_iters:
        print(
            f"warning: max_iters={cfg.max_iters} < lr_decay_iters={cfg.lr_decay_iters}: the "
            "learning rate will not have decayed to min_lr by the end "
            f"(lr_decay_iters={cfg.max_iters} gives a full schedule)",
            file=sys.stderr,
        )
    # the model's own rules (its config checks them): a shape's
    model_config(cfg.task, asdict(cfg))


def inside(path, folder):
    """Whether path is folder or lies under it, links resolved."""
    path, folder = os.path.realpath(path), os.path.realpath(folder)
    return os.path.commonpath([path, folder]) == folder


def broken(cfg, name, what):
    """The error of a broken rule: the key, its value and what it must be."""
    return Error(f"{name}={getattr(cfg, name)!r}: must be {what}")
