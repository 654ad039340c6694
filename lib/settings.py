"""train.py's settings and what they make: each key with its default, help and range (config
files and --key=value set them), the rules the keys must satisfy together, the reading of config
files, include() and --key=value overrides (parse); then the run's data, read by the task its
meta.json names, and its model: from scratch, a fine-tune's start, or a resumed run's."""

import ast
import os
import subprocess
import sys
import traceback
from dataclasses import asdict, fields, make_dataclass, replace
from types import ModuleType

import torch

from lib.common import Error, did_you_mean
from lib.data import LMData, check, dataset_dir, read_meta
from lib.distributed import rank, under_torchrun, world_size
from lib.options import GPT2_NAMES, Option, options_of
from model import ARCHITECTURES, EncoderConfig

OPTIONS = dict(
    # run
    out_dir=Option("out", "where the checkpoints and metrics.jsonl go"),
    task=Option(
        "lm",
        "lm: next-token prediction with GPT; classify: EncoderClassifier on labelled rows",
        choices=("lm", "classify"),
    ),
    dataset=Option(
        "shakespeare_char",
        "a folder under data/ made by its prepare.py, or a path to a prepared folder",
    ),
    init_from=Option(
        "scratch",
        "scratch, resume, gpt2[-medium|-large|-xl], or a folder of GPT weights (ours or HF's)",
    ),
    overwrite_out_dir=Option(
        False,
        "let a new run start in an out_dir that holds a checkpoint (without it, it refuses): "
        "the old run's files move into out_dir/previous",
    ),
    # torch.manual_seed's range, and numpy's seeds are >= 0
    seed=Option(1337, "batches, initial weights and dropout all follow from it", ge=0, lt=2**64),
    device=Option(
        "auto",
        "auto: cuda, then mps, then cpu; or cpu, cuda, cuda:1, mps "
        "(a resume runs where it is told)",
    ),
    dtype=Option(
        "auto",
        "autocast dtype; auto: on a CPU the fastest of float32, bfloat16 and bfloat16 with its "
        "attention in float32 for this model, timed at the start and remembered "
        "(lib/autotune.py); bfloat16 on GPUs that have it, else float16",
        choices=("auto", "float32", "bfloat16", "float16"),
    ),
    compile=Option(False, "torch.compile the model: a slower start, faster steps on GPUs"),
    deterministic=Option(
        False,
        "deterministic GPU kernels (slower): identical reruns, resumes and DDP on GPUs as well",
    ),
    strategy=Option(
        "ddp",
        "under torchrun: ddp, a whole copy of the model on each process; fsdp, parameters, "
        "gradients and AdamW's moments sharded over the processes (one process: no difference)",
        choices=("ddp", "fsdp"),
    ),
    activation_checkpointing=Option(
        False,
        "recompute each Block's activations in the backward pass: only the Blocks' inputs are "
        "kept, for a second forward pass (about a third more compute)",
    ),
    # evaluation, logging, checkpoints
    eval_interval=Option(250, "steps between evaluations (and checkpoints)", ge=1),
    eval_iters=Option(100, "batches per evaluation, the same ones every time", ge=1),
    log_interval=Option(
        10,
        "steps between log lines (loss, lr, speed, gradient norm; MFU on known GPUs)",
        ge=1,
    ),
    eval_only=Option(False, "evaluate once and exit"),
    always_save_checkpoint=Option(
        True, "save trainer_state.pt at every evaluation, not only when validation improves"
    ),
    wandb_log=Option(False, "log to wandb as well (WANDB_MODE=offline works without an account)"),
    wandb_project=Option("gpt-starter", "the wandb project"),
    wandb_run_name=Option("", "the wandb run's name; empty: out_dir and the start time"),
    # data and model
    batch_size=Option(12, "rows per micro-step per process", ge=1),
    gradient_accumulation_steps=Option(
        1, "micro-steps per optimizer step, over all processes together", ge=1
    ),
    vocab_size=Option(0, "0: the dataset's", ge=0),
    # the model's keys, declared with its config: block_size, n_layer, n_head, n_embd, dropout,
    # bias, attn_impl, rope, qk_norm, token_dropout, bow_head, bow_buckets
    **options_of(EncoderConfig),
    # optimizer and schedule: linear warmup, then cosine decay to min_lr
    optimizer=Option(
        "adamw",
        "adamw; muon: Muon for the blocks' matrices, AdamW for the rest",
        choices=("adamw", "muon"),
    ),
    learning_rate=Option(6e-4, "peak learning rate", ge=0),
    min_lr=Option(6e-5, "learning rate at the end of the decay", ge=0),
    warmup_iters=Option(100, "steps of linear warmup", ge=0),
    lr_decay_iters=Option(5000, "the step at which the decay reaches min_lr", ge=0),
    decay_lr=Option(True, "False: learning_rate throughout"),
    max_iters=Option(5000, "optimizer steps in all", ge=0),
    weight_decay=Option(0.1, "decoupled weight decay of matrices and embeddings", ge=0),
    beta1=Option(0.9, "Adam's first-moment decay", ge=0, lt=1),
    beta2=Option(0.95, "Adam's second-moment decay", ge=0, lt=1),
    grad_clip=Option(1.0, "clip the gradient's global norm to this; 0 turns clipping off", ge=0),
    # LoRA adapters (lib/lora.py) on a fine-tune's frozen start
    lora_rank=Option(0, "the adapters' rank; 0: no adapters, every weight trains", ge=0),
    lora_alpha=Option(16.0, "the adapters' output is scaled by lora_alpha / lora_rank", gt=0),
    lora_dropout=Option(0.0, "dropout on the adapters' input", ge=0, lt=1),
    lora_targets=Option(
        "attn.qkv",
        "the Linears of each block that take adapters, comma-separated: "
        "attn.qkv, attn.proj, mlp.fc, mlp.proj",
    ),
)
# the adapters' keys and their defaults, as lib/lora.py and a fine-tune's adapter read them
LORA_DEFAULTS = {k: key.default for k, key in OPTIONS.items() if k.startswith("lora_")}


def check_rules(cfg, resuming):
    """What the keys must satisfy together."""
    processes = world_size()
    forms = ("scratch", "resume") + GPT2_NAMES
    if cfg.decay_lr and cfg.min_lr > cfg.learning_rate:
        raise broken(cfg, "min_lr", f"<= learning_rate={cfg.learning_rate}")
    if not (resuming or cfg.init_from in forms or os.path.isdir(cfg.init_from)):
        hint = did_you_mean(cfg.init_from, forms)
        raise broken(
            cfg, "init_from", f"one of {', '.join(forms)} or a folder of GPT weights{hint}"
        )
    if not resuming and os.path.isdir(cfg.init_from):
        from lib.finetune import check_start  # a fine-tune's start

        check_start(cfg)
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
    if any(getattr(cfg, k) != default for k, default in LORA_DEFAULTS.items()):
        from lib.lora import check_keys

        check_keys(cfg, LORA_DEFAULTS)
    if rank() == 0 and cfg.decay_lr and cfg.max_iters < cfg.lr_decay_iters:
        print(
            f"warning: max_iters={cfg.max_iters} < lr_decay_iters={cfg.lr_decay_iters}: the "
            "learning rate will not have decayed to min_lr by the end "
            f"(lr_decay_iters={cfg.max_iters} gives a full schedule)",
            file=sys.stderr,
        )
    # the model's own rules (its config checks them): a shape's
    model_config(cfg.task, asdict(cfg))


def check_shared(cfg, resuming):
    """check_rules on another script's settings (rl.py's): its keys that train.py has, train.py's
    defaults for the rest."""
    defaults, _ = parse([], OPTIONS, "")
    check_rules(
        replace(defaults, **{k: v for k, v in asdict(cfg).items() if k in OPTIONS}), resuming
    )


def broken(cfg, name, what):
    """The error of a broken rule: the key, its value and what it must be."""
    return Error(f"{name}={getattr(cfg, name)!r}: must be {what}")


def parse(argv, keys, doc):
    """(frozen settings, the names the user set) from config files and --key=value overrides, in
    order; --help prints doc and every key."""
    given = {}
    for arg in argv:
        if arg in ("-h", "--help"):
            print(doc + "\nkeys, their defaults and what they do:")
            for name, key in keys.items():
                print(f"  --{name}={key.default!r}".ljust(34) + f"  {key.help}")
            raise SystemExit(0)
        if arg == "--print_config":
            continue
        if arg.startswith("--"):
            name, eq, text = arg[2:].partition("=")
            if not eq:
                raise Error(f"{arg}: write --{name}=VALUE")
            settings = {name: literal(text)}
        else:
            settings = read_file(arg, {})
        for name, value in settings.items():
            if name not in keys:
                hint = did_you_mean(name, keys) or " (see --help)"
                raise Error(f"unknown key {name!r} in {arg}{hint}")
            try:
                given[name] = keys[name].check(name, value)
            except Error as e:
                raise Error(f"{e} (in {arg})") from None
    values = {name: key.default for name, key in keys.items()} | given
    typed = [(name, type(key.default)) for name, key in keys.items()]
    return make_dataclass("Settings", typed, frozen=True)(**values), set(given)


def literal(text):
    """A Python literal (1e-3, True, 'x'), nan and inf, else the text itself."""
    for read in (ast.literal_eval, float):
        try:
            return read(text)
        except (ValueError, SyntaxError):
            pass
    return text


def read_file(path, scope):
    """The settings a config file sets into scope; include(path) runs another, relative to it."""
    if not os.path.isfile(path):
        raise Error(f"no config file {path!r} (config files live in config/)")

    def include(other):
        return read_file(os.path.join(os.path.dirname(path), other), scope)

    scope["include"] = include
    try:
        with open(path, encoding="utf-8") as f:
            exec(compile(f.read(), path, "exec"), scope)
    except Error:
        raise
    except SyntaxError as e:
        raise Error(f"{e.filename}:{e.lineno}: {e.msg}") from None
    except UnicodeDecodeError as e:
        raise Error(f"{path}: not UTF-8 text ({e.reason}): save it as UTF-8") from None
    except Exception as e:  # where Python says it was raised
        frame = traceback.extract_tb(e.__traceback__)[-1]
        raise Error(f"{frame.filename}:{frame.lineno}: {type(e).__name__}: {e}") from None
    return {
        name: value
        for name, value in scope.items()
        if not name.startswith("_") and not callable(value) and not isinstance(value, ModuleType)
    }


# ------------------------------------------------------------ the run's data and model
def load_split(data_dir, split, block_size):
    """The split's reader for the task that meta.json names, its files checked against meta.json."""
    meta = read_meta(data_dir)
    check(
        split in meta["splits"],
        os.path.join(data_dir, "meta.json"),
        f"no {split} split ({sorted(meta['splits'])})",
    )
    args = (os.path.join(data_dir, split), meta["splits"][split], block_size, meta)
    if meta["task"] == "classify":
        from lib.classifier import ClassificationData

        return ClassificationData(*args)
    if meta["task"] == "chat":
        from lib.chat import ConversationData

        return ConversationData(*args)
    return LMData(*args)


def load_data(cfg):
    """(train, val) of the dataset; one never prepared is prepared first by its prepare.py."""
    path = dataset_dir(cfg.dataset)
    prepare = os.path.join(path, "prepare.py")
    command = f"python data/{cfg.dataset}/prepare.py"
    if not os.path.exists(os.path.join(path, "meta.json")):
        if under_torchrun() or not os.path.isfile(prepare):
            raise Error(f"no prepared data in {path}: run {command} first")
        print(f"no prepared data in {path}: running {command}", file=sys.stderr)
        if subprocess.run([sys.executable, prepare]).returncode:
            raise Error(
                f"{command} failed (message above); offline, prepare from local files: "
                f"{command} --source PATH (its --help says which)"
            )
    train_data = load_split(path, "train", cfg.block_size)
    # a trained tokenizer's file, checked now: each model save copies it
    spec = train_data.meta["tokenizer"]
    if "file" in spec:
        from lib.weights import get_tokenizer

        get_tokenizer(spec, os.path.join(path, "meta.json"))
    val_data = load_split(path, "val", cfg.block_size)
    if train_data.task != cfg.task:
        raise Error(
            f"dataset {cfg.dataset} is prepared for task={train_data.task}, but task={cfg.task}"
        )
    return train_data, val_data


def model_config(task, settings):
    """(class, config) of task lm or classify, from settings' matching keys."""
    cls, config_cls = ARCHITECTURES["GPT" if task == "lm" else "EncoderClassifier"]
    kwargs = {f.name: settings[f.name] for f in fields(config_cls) if f.name in settings}
    return cls, config_cls(**kwargs)


def new_model(settings, meta):
    """The model that settings (train.py's keys, a dict) name for a dataset of meta (its
    vocabulary, labels and padding token), its weights drawn from the settings' seed."""
    torch.manual_seed(settings["seed"])
    shape = {
        **settings,
        "n_classes": len(meta.get("label_names", [])),
        "pad_token_id": meta.get("pad_token_id", 0),
    }
    cls, config = model_config(settings["task"], shape)
    return cls(config)


def make_model(cfg, meta, state, given):
    """(cfg with the model's last values, the model): seeded, a fine-tune's start with LoRA's
    adapters if any (lib/finetune.py), or a resumed state's weights (taken over, not copied).
    given: the keys the command set."""
    vocab_size = cfg.vocab_size or meta["vocab_size"]
    if meta["vocab_size"] > vocab_size:
        raise Error(
            f"the model has {vocab_size} tokens, dataset {cfg.dataset} needs {meta['vocab_size']}"
        )
    # a fine-tune's start, or LoRA's base (a resumed run's too, its adapters loaded on it)
    if cfg.lora_rank or state is None and cfg.init_from != "scratch":
        from lib.finetune import pretrained_model

        return pretrained_model(cfg, meta, state, given, new_model)
    cfg = replace(cfg, vocab_size=vocab_size)
    if state is None:
        return cfg, new_model(asdict(cfg), meta)
    with torch.device("meta"):
        model = new_model(asdict(cfg), meta)
    return cfg, model.load_weights(state["model"])
