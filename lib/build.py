"""The model a run trains, built from its settings: from scratch, from a pretrained GPT's
weights, or from a resumed run's state."""

from dataclasses import asdict, fields, replace

import torch

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


def make_model(cfg, meta, state, given):
    """(cfg with the model's last values, the model): seeded, a pretrained GPT's body and shape
    (lib/finetune.py), or a resumed state's weights (taken over, not copied). given: the keys
    the command set."""
    vocab_size = cfg.vocab_size or meta["vocab_size"]
    if meta["vocab_size"] > vocab_size:
        raise Error(
            f"the model has {vocab_size} tokens, dataset {cfg.dataset} needs {meta['vocab_size']}"
        )
    if cfg.lora_rank:  # adapters on a frozen start
        from lib.lora import adapted_model

        return adapted_model(cfg, meta, state, given)
    shape = {"vocab_size": vocab_size}
    body = None
    if state is None and cfg.init_from != "scratch":  # a fine-tune
        from lib.finetune import check_data_tokenizer, pretrained_body

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
