"""The model a run trains, built from its settings: from scratch, from a pretrained GPT's
weights, or from a resumed run's state; a fine-tune's start (init_from a checkpoint folder or
GPT-2): the pretrained GPT's body and shape, its context cut to the run's block_size, its token
table grown for new tokens."""

import os
import sys
from dataclasses import asdict, fields, replace

import torch

from lib.card import CARD_FIX, check_tokenizer, checking
from lib.checkpoint import SHAPE
from lib.common import Error, read_json
from lib.data import dataset_dir, read_meta
from lib.options import GPT2_NAMES
from model import ARCHITECTURES


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
    """(cfg with the model's last values, the model): seeded, a pretrained GPT's body and shape
    (pretrained_body, below), or a resumed state's weights (taken over, not copied). given: the keys
    the command set."""
    vocab_size = cfg.vocab_size or meta["vocab_size"]
    if meta["vocab_size"] > vocab_size:
        raise Error(
            f"the model has {vocab_size} tokens, dataset {cfg.dataset} needs {meta['vocab_size']}"
        )
    if cfg.lora_rank:  # adapters on a frozen start
        return adapted_model(cfg, meta, state, given)
    shape = {"vocab_size": vocab_size}
    body = None
    if state is None and cfg.init_from != "scratch":  # a fine-tune
        check_data_tokenizer(cfg, meta)  # data this run's prepare.py made too
        body, shape = pretrained_body(cfg, meta["vocab_size"], given)
    cfg = replace(cfg, **shape)
    if state is None and body is None:
        return cfg, new_model(asdict(cfg), meta)
    with torch.device("meta"):
        model = new_model(asdict(cfg), meta)
    if state is not None:
        return cfg, model.load_weights(state["model"])
    return cfg, model.load_body(body)


# the SHAPE keys a fine-tune may set apart from its start's: a shorter context, more tokens
RESIZED = ("block_size", "vocab_size")


def pretrained_body(cfg, vocab_size, given):
    """(the state, the shape) of a fine-tune's start, the GPT in cfg.init_from: its SHAPE keys,
    its context cut to cfg.block_size, its token table grown to vocab_size (a chat fine-tune's
    tokens). given: the keys the command set, refused where they differ from the start's."""
    # imported here: a plain run reads no pretrained model, nor its tokenizer
    from lib.weights import grown, load_pretrained

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
    torch.manual_seed(cfg.seed)  # the new rows' draws
    return grown(source.state_dict(), shape["vocab_size"]), shape


def check_data_tokenizer(cfg, meta=None):
    """A fine-tune's data is tokenized by its model's tokenizer (the chat tokens and lowercasing
    aside, which keep its ids): one line naming both if not. meta: the data's meta.json, read
    here if None (and unchecked where the run is to prepare it)."""
    folder = dataset_dir(cfg.dataset)
    if meta is None and os.path.isfile(os.path.join(folder, "meta.json")):
        meta = read_meta(folder)
    if cfg.init_from in ("scratch", "resume") or meta is None:
        return
    path = os.path.join(cfg.init_from, "config.json")
    if os.path.isfile(path):
        card = read_json(path, "checkpoint config")
    elif cfg.init_from in GPT2_NAMES:
        card = {}
    else:  # no model there: its load says so
        return
    with checking(card, path, CARD_FIX):
        check_tokenizer(card.get("tokenizer"))
    from lib.weights import GPT2_TOKENIZER  # a fine-tune's alone, as load_pretrained

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


def adapted_model(cfg, meta, state, given):
    """(cfg with the start's shape, the start with adapters on its targets, every other weight
    frozen); state: a resumed run's, whose adapters are loaded."""
    from lib.lora import KEYS, adapt, check_base, load_adapters, named_base

    if state is None:
        check_data_tokenizer(cfg, meta)
        base, sha256 = named_base(cfg.init_from)
    else:  # the base the run began from, as it was then
        base, sha256 = state["adapter"]["base"], state["adapter"]["sha256"]
        check_base(state["adapter"], os.path.join(cfg.out_dir, "trainer_state.pt"))
    body, shape = pretrained_body(replace(cfg, init_from=base), meta["vocab_size"], given)
    cfg = replace(cfg, **shape)
    with torch.device("meta"):
        model = new_model(asdict(cfg), meta)
    model.load_body(body)
    adapter = dict(base=base, sha256=sha256, seed=cfg.seed)
    adapter.update({k[len("lora_") :]: getattr(cfg, k) for k in KEYS})
    adapt(model, adapter)
    if state is not None:
        load_adapters(model, state["model"])
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    if int(os.environ.get("RANK", 0)) == 0:
        print(
            f"LoRA rank {cfg.lora_rank} on {cfg.lora_targets}: {trainable:,} trainable "
            f"parameters, the base's {model.num_params(False):,} frozen",
            file=sys.stderr,
        )
    return cfg, model
