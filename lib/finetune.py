"""A fine-tune's start (init_from a checkpoint folder or GPT-2): the pretrained GPT's body and
shape, its context cut to the run's block_size, its token table grown for new tokens; LoRA's
adapters on it; the settings it keeps (its attention pattern), and the checks that its folder
lies outside out_dir and that the run's data is tokenized as its model."""

import os
import sys
from dataclasses import asdict, replace

import torch

from lib.checkpoint import PATTERN, SHAPE
from lib.common import Error, read_json
from lib.data import dataset_dir
from lib.distributed import rank
from lib.options import CARD_FIX, GPT2_NAMES, check_tokenizer, checking
from lib.weights import GPT2_TOKENIZER, load_pretrained


def pretrained_model(cfg, meta, state, given, new_model):
    """(cfg with the start's shape, the start: the pretrained body, LoRA's adapters on it if
    any); state: a resumed run's, whose adapters start from the base the run began from.
    new_model: lib.settings.new_model, which makes the model that settings name."""
    base = cfg.init_from
    adapter = None
    if cfg.lora_rank:
        adapter = lora_adapter(cfg, state)
        base = adapter["base"]
    body, shape = pretrained_body(replace(cfg, init_from=base), meta["vocab_size"], given)
    cfg = replace(cfg, **shape)
    with torch.device("meta"):
        model = new_model(asdict(cfg), meta)
    model.load_body(body)
    return cfg, model if adapter is None else adapted(model, adapter, state)


# the SHAPE keys a fine-tune may set apart from its start's: a shorter context, more tokens
RESIZED = ("block_size", "vocab_size")


def pretrained_body(cfg, vocab_size, given):
    """(the state, the shape) of a fine-tune's start, the GPT in cfg.init_from: its SHAPE keys,
    its context cut to cfg.block_size, its vocabulary grown to vocab_size (a chat fine-tune's
    tokens: the model's load_body cuts and grows the state to the shape). given: the keys the
    command set, refused where they differ from the start's."""
    source, info = load_pretrained(cfg.init_from)
    if info["architecture"] != "GPT":
        raise Error(
            f"init_from={cfg.init_from!r} holds an {info['architecture']}, not a GPT to start from"
        )
    config = source.config
    shape = {k: getattr(config, k) for k in SHAPE if hasattr(config, k)}
    differ = [
        f"{k}={getattr(cfg, k)!r} (its {v!r})"
        for k, v in shape.items()
        if k in given and k not in RESIZED and getattr(cfg, k) != v
    ]
    if differ:
        raise Error(
            f"init_from={cfg.init_from!r}: a fine-tune computes as its start, and the command "
            f"names {', '.join(differ)}: drop those keys, or train from scratch"
        )
    if "block_size" in given and cfg.block_size > config.block_size:
        raise Error(
            f"init_from={cfg.init_from!r} reads {config.block_size} tokens at most, the command "
            f"names block_size={cfg.block_size}: pass {config.block_size} or less"
        )
    shape["block_size"] = min(cfg.block_size, config.block_size)
    shape["vocab_size"] = max(config.vocab_size, vocab_size)
    # the model's load_body draws the new rows; one line for the run, from its first process
    if shape["vocab_size"] > config.vocab_size and rank() == 0:
        grown = f"from {config.vocab_size} to {shape['vocab_size']} rows"
        print(f"the token table grows {grown}", file=sys.stderr)
    return source.state_dict(), shape


def check_start(cfg):
    """init_from, a folder, lies outside out_dir: the run writes out_dir, and
    --overwrite_out_dir moves its files aside, before the start is read."""
    if inside(cfg.init_from, cfg.out_dir):
        raise Error(
            f"init_from={cfg.init_from!r}: must be a folder outside out_dir={cfg.out_dir!r}, "
            "which the run writes (and --overwrite_out_dir moves aside): copy the checkpoint "
            "elsewhere and start from there"
        )


def inside(path, folder):
    """Whether path is folder or lies under it, links resolved."""
    path, folder = os.path.realpath(path), os.path.realpath(folder)
    return os.path.commonpath([path, folder]) == folder


def kept_pattern(settings, user_keys, keys):
    """A fine-tune's settings: init_from's pattern where the command names none, as its weights
    learnt to read; one line says what the run takes."""
    path = os.path.join(settings.init_from, "config.json")
    if not os.path.isfile(path):
        return settings  # no card of ours: GPT-2's weights, which have no pattern
    card = read_json(path, "checkpoint config")
    source = card.get("model") if isinstance(card, dict) else None
    if not isinstance(source, dict):  # a Hugging Face config
        return settings
    saved = {k: source[k] for k in PATTERN if k in source}
    try:  # a damaged card's
        kept = {k: keys[k].check(k, v) for k, v in saved.items() if k not in user_keys}
    except Error as e:
        raise Error(f"{path}: its {e}: give that key a value on this command") from None
    settings = replace(settings, **kept)
    named = [
        f"{k}={getattr(settings, k)!r} (its {saved[k]!r})"
        for k in PATTERN
        if k in user_keys and k in saved and saved[k] != getattr(settings, k)
    ]
    if rank() == 0 and (any(kept.values()) or named):
        pattern = ", ".join(f"{k}={getattr(settings, k)!r}" for k in PATTERN)
        line = f"init_from={settings.init_from}: the pattern {pattern}"
        if named:
            line += f"; the command names {', '.join(named)}"
        else:
            line += ", its own (name another on the command to change it)"
        print(line, file=sys.stderr)
    return settings


def check_data_tokenizer(cfg, meta):
    """A fine-tune's data (meta: its meta.json) is tokenized by its model's tokenizer (the chat
    tokens and lowercasing aside, which keep its ids): one line naming both if not."""
    folder = dataset_dir(cfg.dataset)
    path = os.path.join(cfg.init_from, "config.json")
    if os.path.isfile(path):
        card = read_json(path, "checkpoint config")
    elif cfg.init_from in GPT2_NAMES:
        card = {}
    else:  # no model there: its load says so
        return
    with checking(card, path, CARD_FIX):
        check_tokenizer(card.get("tokenizer"))
    ours = {"architecture", "model"} & card.keys()  # else GPT-2's: a name or a Hugging Face folder
    model = card.get("tokenizer", None if ours else GPT2_TOKENIZER)
    if model is not None and token_ids(model) != token_ids(meta["tokenizer"]):
        where = " (its config.json)" if card else ""
        raise Error(
            f"{folder} (its meta.json) is tokenized by {described(meta['tokenizer'])}, "
            f"init_from={cfg.init_from}{where} by {described(model)}: prepare the data with the "
            f"model's tokenizer (a chat set: data/chat/prepare.py --tokenizer_from={cfg.init_from})"
        )


def token_ids(spec):
    """What a tokenizer spec's ids mean: the spec less its chat tokens and lowercasing."""
    return {k: v for k, v in spec.items() if k not in ("chat", "lowercase")}


def described(spec):
    """A checked tokenizer spec in a few words."""
    if spec["type"] == "char":
        return f"{len(spec['chars'])} characters"
    if "file" in spec:
        return f"a BPE trained on its data (sha256 {spec['sha256'][:12]}...)"
    return f"tiktoken's {spec['encoding']}"


def lora_adapter(cfg, state):
    """The adapter of cfg's lora_* keys on its base: the one init_from names, or a resumed
    state's, as it was when the run began."""
    from lib.lora import check_base, named_base

    if state is None:
        base, sha256 = named_base(cfg.init_from)
    else:
        base, sha256 = state["adapter"]["base"], state["adapter"]["sha256"]
        check_base(state["adapter"], os.path.join(cfg.out_dir, "trainer_state.pt"))
    adapter = dict(base=base, sha256=sha256, seed=cfg.seed)
    # the lora_* keys of train.py's settings, less their prefix
    lora = {k: v for k, v in asdict(cfg).items() if k.startswith("lora_")}
    adapter.update({k[len("lora_") :]: v for k, v in lora.items()})
    return adapter


def adapted(model, adapter, state):
    """The start with adapters on its targets, every other weight frozen; state: a resumed run's,
    whose adapters are loaded."""
    from lib.lora import adapt, load_adapters

    adapt(model, adapter)
    if state is not None:
        load_adapters(model, state["model"])
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    if rank() == 0:
        print(
            f"LoRA rank {adapter['rank']} on {adapter['targets']}: {trainable:,} trainable "
            f"parameters, the base's {model.num_params(False) - trainable:,} frozen",
            file=sys.stderr,
        )
    return model
