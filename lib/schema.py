"""The keys of the JSON files this project reads, checked as they are read: a dataset's meta.json
(lib/batches.read_meta), a checkpoint's config.json (lib/weights.from_checkpoint) and a Hugging
Face GPT-2 config.json (lib/weights.from_pretrained), whose shape keys are also checked against
the shapes of their weights. Each check names the file, the key and what it should hold, whoever
wrote the file. A table holds each file's keys: key -> its kind (int, float, bool, str, list,
dict), (kind, the least value it may hold) or [the values it may hold]."""

import os
from contextlib import contextmanager
from dataclasses import fields

from lib.common import Error
from lib.config import model_keys
from model import ARCHITECTURES, GPTConfig

# how a message names each kind
KINDS = {
    int: "an integer",
    float: "a number",
    bool: "true or false",
    str: "a string",
    list: "a list",
    dict: "an object",
}
# how many token ids each dtype of a dataset's files holds
ID_LIMITS = {"uint16": 2**16, "uint32": 2**32}
# a tokenizer spec's keys besides its type, by type and form: a tiktoken encoding by name, or a
# trained one in a file; "lowercase" and "eot" are optional
TOKENIZERS = {
    "char": {"chars": str, "eot": bool},
    "bpe": {"encoding": str, "lowercase": bool},
    "trained": {"file": str, "sha256": str},
}
OPTIONAL_TOKENIZER_KEYS = ("lowercase", "eot")
META = {
    "task": ["lm", "classify"],
    "vocab_size": (int, 1),
    "tokenizer": dict,
    "dtype": list(ID_LIMITS),
    "splits": dict,
}
CLASSIFY_META = {"label_names": list, "max_length": (int, 1), "pad_token_id": (int, 0)}
# a checkpoint's config.json; a classifier's also holds its label names and max_length
CARD = {
    "architecture": list(ARCHITECTURES),
    "model": dict,
    "weights_id": str,
    "tokenizer": dict,
    "label_names": list,
    "max_length": (int, 1),
}
# each shape key's name in a Hugging Face GPT-2 config.json
HF_NAMES = {
    "vocab_size": "vocab_size",
    "block_size": "n_positions",
    "n_layer": "n_layer",
    "n_head": "n_head",
    "n_embd": "n_embd",
}
META_FIX = "the data is damaged or from another version: run its prepare.py again"
CARD_FIX = "not a checkpoint config.json that train.py wrote, or damaged"


def shown(value):
    """A value as a message quotes it: short."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


@contextmanager
def checking(data, path, fix):
    """The checks of one file, data its JSON: each failure inside is the Error `path: what; fix`."""
    try:
        if not isinstance(data, dict):
            raise Error(f"the file holds {type(data).__name__} {shown(data)}, not a JSON object")
        yield
    except Error as e:
        raise Error(f"{path}: {e}; {fix}") from None


def check_keys(mapping, table, optional=(), where=""):
    """mapping's keys as table says (the module's docstring); a key in optional may be absent or
    null. A boolean is neither an integer nor a number."""
    for key, rule in table.items():
        name = where + key
        value = mapping.get(key)
        if value is None:
            if key in optional:
                continue
            raise Error(f"no {name!r} key")
        if isinstance(rule, list):
            if value not in rule:
                raise Error(f"{name} {shown(value)} is neither {' nor '.join(rule)}")
            continue
        kind, low = rule if isinstance(rule, tuple) else (rule, None)
        types = (int, float) if kind is float else kind
        if not isinstance(value, types) or isinstance(value, bool) != (kind is bool):
            raise Error(f"{name!r} must be {KINDS[kind]}, got {shown(value)}")
        if low is not None and value < low:
            raise Error(f"{name!r} must be >= {low}, got {shown(value)}")


def check_tokenizer(spec, vocab_size=None):
    """A tokenizer spec (TOKENIZERS), whose size fits vocab_size when given (a BPE encoding's size
    is known once loaded); None: no tokenizer to check."""
    if spec is None:
        return
    check_keys(spec, {"type": ["char", "bpe"]}, where="tokenizer.")
    form = "trained" if "file" in spec else spec["type"]
    check_keys(spec, TOKENIZERS[form], OPTIONAL_TOKENIZER_KEYS, where="tokenizer.")
    if form == "trained" and os.path.basename(spec["file"]) != spec["file"]:
        raise Error(f"'tokenizer.file' {shown(spec['file'])} is not a file name")
    if spec["type"] == "bpe":
        return
    size = len(spec["chars"]) + spec.get("eot", False)
    if not size:
        raise Error("'tokenizer.chars' is empty: it holds the vocabulary's characters")
    if vocab_size is not None and size > vocab_size:
        raise Error(f"'tokenizer.chars' holds {size:,} tokens, vocab_size {vocab_size:,}")


def check_label_names(names, n_classes=None):
    """A list of distinct strings (or None: no names), one per class when n_classes is given."""
    if names is None:
        return
    if not all(isinstance(name, str) for name in names) or len(set(names)) != len(names):
        raise Error("'label_names' must be a list of distinct strings")
    if n_classes is not None and len(names) != n_classes:
        raise Error(f"'label_names' names {len(names)} classes, the model has {n_classes}")


def check_meta(meta, path):
    """A prepared dataset's meta.json (data/README.md): a task (lm or classify), and the keys of
    that task, each of its kind."""
    with checking(meta, path, META_FIX):
        check_keys(meta, META)
        vocab_size = meta["vocab_size"]
        check_tokenizer(meta["tokenizer"], vocab_size)
        if vocab_size > ID_LIMITS[meta["dtype"]]:
            raise Error(f"vocab_size {vocab_size:,} has ids past what {meta['dtype']} holds")
        splits = meta["splits"]
        check_keys(splits, dict.fromkeys(splits, (int, 0)), where="splits.")
        # the bytes of each split's text (lm data prepared since they are counted)
        check_keys(meta, {"bytes": dict}, optional=["bytes"])
        text_bytes = meta.get("bytes", {})
        check_keys(text_bytes, dict.fromkeys(text_bytes, (int, 1)), where="bytes.")
        if meta["task"] == "classify":
            check_keys(meta, CLASSIFY_META)
            check_label_names(meta["label_names"])
            if meta["pad_token_id"] >= vocab_size:
                raise Error(
                    f"'pad_token_id' {meta['pad_token_id']} is past vocab_size {vocab_size}"
                )
    return meta


def check_card(info, path, shapes):
    """A checkpoint's config.json: an architecture, a 'model' holding its config's fields, each of
    its kind, a tokenizer, and a classifier's label names, one per class. Returns the model's
    config (its own rules checked), whose shape keys fit the weights' (shapes: {tensor name:
    shape}, from their header, without reading the tensors): a card that does not fit its weights
    fails here, in one line, before a model of its shape is built (a card of 10**6 layers would
    take minutes and all the memory to build first). Keys the card leaves out and tensors the
    weights lack are the load's to report."""
    with checking(info, path, CARD_FIX):
        check_keys(info, CARD, optional=("weights_id", "tokenizer", "label_names", "max_length"))
        # a null field is an absent one: the config's default
        model = {key: value for key, value in info["model"].items() if value is not None}
        config_cls = ARCHITECTURES[info["architecture"]][1]
        kinds = {f.name: f.type for f in fields(config_cls)}
        check_keys(model, kinds, optional=kinds, where="model.")
        check_keys(model, {"vocab_size": (int, 1)}, where="model.")
        # each field in its range, as train.py checks a setting (model.setting())
        for key, rule in model_keys(config_cls).items():
            rule.check(f"model.{key}", model.get(key, rule.default))
        # a card without a tokenizer loads; the scripts that encode text refuse it (get_tokenizer)
        check_tokenizer(info.get("tokenizer"), model["vocab_size"])
        check_label_names(info.get("label_names"), model.get("n_classes"))
        check_shapes(shapes, {key: (f"model.{key}", value) for key, value in model.items()})
        return config_cls(**{key: model[key] for key in kinds if key in model})


def check_hf(hf, path, shapes):
    """A Hugging Face GPT-2 config.json: its shape keys (HF_NAMES), each an integer >= 1, against
    its weights' shapes (in this project's tensor names), as check_card a card's, and the
    tokenizer export.py writes into it, if any. Returns the GPTConfig (its own rules checked: n_head
    divides n_embd), before a model of its shape is built."""
    with checking(hf, path, "not a GPT-2 config.json that fits the model.safetensors beside it"):
        check_keys(hf, dict.fromkeys(HF_NAMES.values(), (int, 1)))
        check_shapes(shapes, {key: (name, hf.get(name)) for key, name in HF_NAMES.items()})
        check_keys(hf, {"tokenizer": dict}, optional=["tokenizer"])
        check_tokenizer(hf.get("tokenizer"))
        return GPTConfig(**{key: hf[name] for key, name in HF_NAMES.items()}, bias=True)


def check_shapes(shapes, given):
    """given: {config key: (its name in the file, its value)}: each key the weights' shapes fix
    (weights_shape) holds their value, or is absent."""
    for key, found in weights_shape(shapes).items():
        name, value = given.get(key, (key, found))
        if value != found:
            raise Error(f"{name!r} is {shown(value)}, the weights' shapes say {shown(found)}")


def weights_shape(shapes):
    """The config values that the tensors' names and shapes fix: {key: value}. The token table
    (the tied head's name, if the file kept that one) gives the vocabulary and width; a position
    table, the context and no rotary embeddings; the blocks' names, the depth; a classifier's head
    and fastText table, its classes and buckets."""
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
