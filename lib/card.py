"""A checkpoint's card, config.json, checked: its keys, an Option each (the shapes first, which
must fit the weights), and a tokenizer spec's; lib/data.py checks a dataset's meta.json with
them, lib/gpt2.py a Hugging Face GPT-2 config.json."""

import os
from contextlib import contextmanager
from dataclasses import fields

from lib.common import Error
from lib.options import Option
from model import ARCHITECTURES

# a tokenizer spec's keys besides its type: a tiktoken encoding by name, or a trained one in a
# file; "lowercase" and "eot" are optional
TOKENIZERS = {
    "char": {"chars": Option(""), "eot": Option(False)},
    "bpe": {"encoding": Option(""), "lowercase": Option(False)},
    "trained": {"file": Option(""), "sha256": Option("")},
}
# a checkpoint's config.json; a classifier's also holds its label names and max_length
CARD = {
    "architecture": Option("GPT", choices=tuple(ARCHITECTURES)),
    "model": Option({}),
    "weights_id": Option(""),
    "tokenizer": Option({}),
    "label_names": Option([]),
    "max_length": Option(1, ge=1),
}
# the longest context of a rotary model (tokens): no tensor fixes its block_size, and a decoder's
# KV cache holds all of it for each row (at 10**7 a tiny model's asks gigabytes a row)
MAX_ROTARY_CONTEXT = 2**17
CARD_FIX = "not a checkpoint config.json that train.py wrote, or damaged"


@contextmanager
def checking(data, path, fix):
    """The checks of one file, data its JSON: each failure inside is the Error `path: what; fix`."""
    try:
        if not isinstance(data, dict):
            raise Error(f"the file holds {type(data).__name__} {data!r:.40}, not a JSON object")
        yield
    except Error as e:
        raise Error(f"{path}: {e}; {fix}") from None


def check_keys(mapping, table, optional=(), where=""):
    """Each key of table in mapping, as its Option says; a key in optional may be absent or null."""
    for key, rule in table.items():
        value = mapping.get(key)
        if value is None and key not in optional:
            raise Error(f"no {where + key!r} key")
        if value is not None:
            rule.check(where + key, value)


def check_tokenizer(spec):
    """A tokenizer spec (TOKENIZERS); None: no tokenizer to check."""
    if spec is None:
        return
    check_keys({"tokenizer": spec}, {"tokenizer": Option({})})
    check_keys(spec, {"type": Option("char", choices=("char", "bpe"))}, where="tokenizer.")
    # as get_tokenizer reads it: a char one by its characters, whatever else it holds
    form = "trained" if spec["type"] == "bpe" and "file" in spec else spec["type"]
    check_keys(spec, TOKENIZERS[form], ("lowercase", "eot"), where="tokenizer.")
    if form == "trained" and os.path.basename(spec["file"]) != spec["file"]:
        raise Error(f"'tokenizer.file' {spec['file']!r:.40} is not a file name")


def check_card(info, path, shapes):
    """A checkpoint's config.json -> the model's config, its shape fitting the weights' (shapes:
    {tensor name: shape} from their header) before a model of that shape is built."""
    with checking(info, path, CARD_FIX):
        check_keys(info, CARD, optional=("weights_id", "tokenizer", "label_names", "max_length"))
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
        names = info.get("label_names")
        check_label_names(names)
        if names is not None and len(names) != getattr(config, "n_classes", len(names)):
            raise Error(
                f"'label_names' names {len(names)} classes, the model has {config.n_classes}"
            )
        return config


def check_label_names(names):
    """Label names (None: none), each a string that names one class only: a prediction's name
    says which class it is."""
    seen = set()
    for name in names or []:
        if not isinstance(name, str):
            raise Error(f"'label_names' holds {name!r:.40}, not a string")
        if name in seen:
            raise Error(f"'label_names' names {name!r:.40} twice")
        seen.add(name)


def check_shapes(shapes, given):
    """given: {config key: (its name in the file, its value)}, each as the weights' shapes say."""
    for key, found in weights_shape(shapes).items():
        name, value = given.get(key, (key, found))
        if value != found:
            raise Error(f"{name!r} is {value!r:.40}, the weights' shapes say {found!r:.40}")


def weights_shape(shapes):
    """The config values that the tensors' names and shapes fix: {key: value}."""
    table = shapes.get("wte.weight", shapes.get("lm_head.weight"))
    if table is None or len(table) != 2:
        return {}
    blocks = {name.split(".")[1] for name in shapes if name.startswith("blocks.")}
    found = {
        "vocab_size": table[0],
        "n_embd": table[1],
        "n_layer": len(blocks),
        "bias": "ln_f.bias" in shapes,
        "rope": "wpe.weight" not in shapes,
    }
    if "wpe.weight" in shapes:
        found["block_size"] = shapes["wpe.weight"][0]
    if "head.weight" in shapes:
        found["n_classes"] = shapes["head.weight"][0]
        found["bow_head"] = "bow.weight" in shapes
        if "bow.weight" in shapes:
            found["bow_buckets"] = shapes["bow.weight"][0] - table[0]
    return found
