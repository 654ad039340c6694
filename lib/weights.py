"""Reading weights: this project's checkpoints (model.safetensors + config.json, which
lib/checkpoint.save_pretrained writes; the card checked against the weights' shapes); GPT-2's in
the Hugging Face layout through lib/gpt2.py; the tokenizer a checkpoint's or a dataset's spec
names (get_tokenizer), picked here so that no tokenizer module imports the module that picks it."""

import os
from dataclasses import fields

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from lib.common import Error, check_regular, read_json
from lib.options import (
    CARD_FIX,
    Option,
    check_keys,
    check_shapes,
    check_tokenizer,
    checking,
)
from lib.tokenizer import CharTokenizer
from model import ARCHITECTURES

# the tokenizer of GPT-2's weights, and of a Hugging Face folder whose config.json names none
GPT2_TOKENIZER = {"type": "bpe", "encoding": "r50k_base"}
# a checkpoint's config.json; a classifier's holds more (lib/classifier.py's META)
CARD = {
    "architecture": Option("GPT", choices=tuple(ARCHITECTURES)),
    "model": Option({}),
    "weights_id": Option(""),
    "tokenizer": Option({}),
}
# the longest context of a rotary model (tokens): no tensor fixes its block_size, and a decoder's
# KV cache holds all of it for each row (at 10**7 a tiny model's asks gigabytes a row)
MAX_ROTARY_CONTEXT = 2**17


def from_checkpoint(out_dir, device="cpu", info=None):
    """(model in eval mode, config.json's dict) of what save_pretrained wrote; info: config.json
    already read."""
    path = os.path.join(out_dir, "config.json")
    if info is None:
        if not os.path.isfile(path):
            raise Error(
                f"no checkpoint in {str(out_dir)!r} (config.json missing): "
                f"train one with train.py first"
            )
        info = read_json(path, "checkpoint config")
    if isinstance(info, dict) and "adapter" in info:  # LoRA's: merged into its base
        from lib.lora import merged  # handed the base's loader: lib/lora.py imports none

        model = merged(out_dir, check_card(info, path, {}), info, load_pretrained)
        return model.to(device).eval(), info
    weights = os.path.join(out_dir, "model.safetensors")
    check_regular(weights)
    metadata, shapes = read_header(weights)
    config = check_card(info, path, shapes)
    # the weights config.json was saved with; a card without an id is unchecked, and a header
    # that cannot be read is the load's error to report
    expected = info.get("weights_id")
    if expected is not None and metadata is not None and metadata.get("weights_id") != expected:
        raise Error(
            f"{weights} is not the model {path} was saved with (weights_id "
            f"{metadata.get('weights_id')!r} there, {expected!r} in config.json): a save was cut "
            "short between the two; resume from trainer_state.pt or train again"
        )
    try:  # one readable error for a broken or foreign checkpoint, whatever broke in it
        with torch.device("meta"):
            model = ARCHITECTURES[info["architecture"]][0](config)
        model.load_weights(load_file(weights))
    except Exception as e:
        raise Error(
            f"{str(out_dir)!r} is not a readable checkpoint of this project ({type(e).__name__}: "
            f"{str(e).splitlines()[0] if str(e) else ''})"
        ) from None
    return model.to(device).eval(), info


def check_card(info, path, shapes):
    """A checkpoint's config.json -> the model's config, its shape fitting the weights' (shapes:
    {tensor name: shape} from their header) before a model of that shape is built."""
    with checking(info, path, CARD_FIX):
        check_keys(info, CARD, optional=("weights_id", "tokenizer"))
        # a null field is an absent one: the config's default
        model = {key: value for key, value in info["model"].items() if value is not None}
        config_cls = ARCHITECTURES[info["architecture"]][1]
        rules = {f.name: Option(f.default, **f.metadata) for f in fields(config_cls)}
        rules["vocab_size"] = Option(1, ge=1)
        check_keys(model, rules, optional=rules.keys() - {"vocab_size"}, where="model.")
        check_tokenizer(info.get("tokenizer"))
        check_shapes(shapes, {key: (f"model.{key}", value) for key, value in model.items()})
        config = config_cls(**{key: model[key] for key in rules if key in model})
        if config.rope:
            Option(1, le=MAX_ROTARY_CONTEXT).check("model.block_size", config.block_size)
        return config


def read_header(path):
    """(metadata, {name: shape}) of a safetensors file, its tensors unread; (None, {}) if none."""
    try:
        with safe_open(path, "pt") as f:
            return f.metadata() or {}, {name: f.get_slice(name).get_shape() for name in f.keys()}
    except Exception:
        return None, {}


def load_pretrained(name_or_dir, device="cpu"):
    """(model in eval mode, info) of a checkpoint of this project or of GPT-2's weights (a name
    or a Hugging Face folder)."""
    path = os.path.join(name_or_dir, "config.json")
    config = read_json(path, "checkpoint config") if os.path.isfile(path) else {}
    # a Hugging Face config has neither of this project's card keys (a card that lost one of them
    # is still checked as a card)
    if not isinstance(config, dict) or {"architecture", "model"} & config.keys():
        return from_checkpoint(name_or_dir, device, config)
    from lib.gpt2 import from_pretrained  # GPT-2's weights: a name or a Hugging Face folder

    model = from_pretrained(name_or_dir).to(device).eval()
    tokenizer = config.get("tokenizer", GPT2_TOKENIZER)
    return model, {"architecture": "GPT", "tokenizer": tokenizer}


def load_gpt(source, device, hub=False):
    """(a GPT in eval mode on device, its tokenizer, a line saying what was loaded) from a
    checkpoint of this project or, with hub, GPT-2's weights."""
    where = os.path.join(source, "config.json")
    if not hub and not os.path.isfile(where):
        if os.path.isfile(os.path.join(source, "trainer_state.pt")):
            raise Error(
                f"{source!r} holds a run stopped before its first model save: resume it with "
                f"`python train.py --out_dir={source} --init_from=resume`"
            )
        raise Error(
            f"no checkpoint in {source!r}: train one with "
            "`python train.py config/shakespeare_char.py`, point --out_dir at one, "
            "or sample GPT-2 with --init_from gpt2"
        )
    model, info = load_pretrained(source, device)
    if info["architecture"] != "GPT":
        raise Error(
            f"{source!r} holds an {info['architecture']} (task {info.get('task')!r}): "
            "sample.py needs a GPT; classify.py runs a classifier"
        )
    tokenizer = get_tokenizer(info.get("tokenizer"), where, model.config.vocab_size)
    what = (
        f"loaded {source}: {model.num_params() / 1e6:.2f}M parameters, "
        f"{tokenizer.spec['type']} tokenizer"
    )
    return model, tokenizer, what


def get_tokenizer(spec, where="tokenizer", vocab_size=None):
    """The tokenizer that spec (its keys: lib/options.py's TOKENIZERS) names in the file where; a
    trained BPE's file lies beside that file. With vocab_size, every id must index a model's
    embedding rows."""
    if spec is None:
        raise Error(
            f"{where}: no tokenizer this project knows: add a 'tokenizer' key "
            "(a char one holds 'chars', a bpe one 'encoding')"
        )
    if spec["type"] == "char":
        tokenizer = CharTokenizer(spec["chars"], spec.get("eot", False))
    else:
        from lib.bpe import bpe_tokenizer

        tokenizer = bpe_tokenizer(spec, where)
    if "chat" in spec:  # a chat fine-tune's: its tokens after
        from lib.chat import with_chat

        tokenizer = with_chat(tokenizer, spec["chat"], where)
    if vocab_size is not None and tokenizer.vocab_size > vocab_size:
        raise Error(
            f"{where}: the tokenizer has {tokenizer.vocab_size:,} tokens, the model's vocabulary "
            f"{vocab_size:,}: the tokenizer is not the one this model was trained with"
        )
    return tokenizer
