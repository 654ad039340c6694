"""The model a run trains, built from its settings: from scratch, from a pretrained GPT's
weights, or from a resumed run's state."""

import sys
from dataclasses import asdict, fields, replace

import torch

from lib.checkpoint import SHAPE
from lib.common import Error
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


def make_model(cfg, meta, state):
    """(cfg with the model's last values, the model): seeded, a pretrained GPT's body and shape
    (its context cut to block_size), or a resumed state's weights (taken over, not copied)."""
    source = None
    if state is None and cfg.init_from != "scratch":  # a fine-tune
        from lib.weights import load_pretrained

        source, info = load_pretrained(cfg.init_from)
        if info["architecture"] != "GPT":
            raise Error(
                f"init_from={cfg.init_from!r} holds an {info['architecture']}, "
                "not a GPT to start from"
            )
    vocab_size = cfg.vocab_size or meta["vocab_size"]
    if meta["vocab_size"] > vocab_size:
        raise Error(
            f"the model has {vocab_size} tokens, dataset {cfg.dataset} needs {meta['vocab_size']}"
        )
    shape = {"vocab_size": vocab_size}
    if source is not None:  # the pretrained shape, its vocabulary included
        shape = {k: getattr(source.config, k) for k in SHAPE if hasattr(source.config, k)}
        shape["block_size"] = min(cfg.block_size, source.config.block_size)
        # room for the dataset's tokens: a chat fine-tune's
        shape["vocab_size"] = max(shape["vocab_size"], meta["vocab_size"])
    cfg = replace(cfg, **shape)
    if state is None and source is None:
        return cfg, new_model(asdict(cfg), meta)
    with torch.device("meta"):
        model = new_model(asdict(cfg), meta)
    if state is not None:
        return cfg, model.load_weights(state["model"])
    return cfg, model.load_body(grown(source.state_dict(), cfg.vocab_size))


def grown(state, rows):
    """state with its token table grown to rows, each new row drawn from the old rows'
    mean and spread (Hugging Face's resize_token_embeddings draws alike)."""
    table = state["wte.weight"]
    if rows == len(table):
        return state
    print(f"the token table grows from {len(table)} to {rows} rows", file=sys.stderr)
    mean, std = table.mean(0), table.std(0)
    new = torch.normal(mean.expand(rows - len(table), -1), std)
    return {**state, "wte.weight": torch.cat([table, new])}
