"""Values and their ranges in one place, an Option each: train.py's settings, the models' configs,
decoding.Options, the scripts' flags (flags()), and the JSON files read, checked key by key
(lib/weights.py checks a checkpoint's card, config.json, with them; lib/data.py a dataset's
meta.json; lib/gpt2.py a Hugging Face GPT-2 config.json): a tokenizer spec, and the shapes the
weights' tensors fix."""

import argparse
import math
import operator
import os
from contextlib import contextmanager
from dataclasses import dataclass, field, fields, replace

from lib.common import Error

# init_from's names of OpenAI's GPT-2 weights on the Hugging Face hub
GPT2_NAMES = ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl")
# the bounds an Option may have, by pydantic's names: (how a message says it, the test)
BOUNDS = {
    "ge": (">=", operator.ge),
    "gt": (">", operator.gt),
    "le": ("<=", operator.le),
    "lt": ("<", operator.lt),
}


@dataclass
class Option:
    """One value's rule: its default (which fixes its type), help, bounds (ge <= value, gt <
    value, le >= value, lt > value) or choices."""

    default: object
    help: str = ""
    ge: float = None
    gt: float = None
    le: float = None
    lt: float = None
    choices: tuple = None

    def check(self, name, value):
        """value (an int taken as a float where a float is due), or an Error naming the key, its
        value and what it must be."""
        kind = type(self.default)
        if kind is float and type(value) is int:
            value = float(value) if abs(value) < 1e300 else math.inf
        must = self.must(value)
        if must:
            raise Error(f"{name}={value!r:.40}: must be {must}")
        return value

    def must(self, value):
        """What value must be, if it breaks the rule; else None."""
        kind = type(self.default)
        if type(value) is not kind:
            return kind.__name__
        if kind is float and not math.isfinite(value):
            return "a finite number"
        if self.choices and value not in self.choices:
            return f"one of {', '.join(map(str, self.choices))}"
        for name, (sign, holds) in BOUNDS.items():
            bound = getattr(self, name)
            if bound is not None and not holds(value, bound):
                return f"{sign} {bound}"
        return None


# every script's --device
DEVICE_OPTION = Option("auto", "cpu, cuda, cuda:1, mps, ...; auto: cuda, then mps, then cpu")


def flags(parser, keys):
    """An argparse flag --name for each Option of keys, as the scripts declare theirs: a False
    default makes a switch; any other parses as its default's type (str for None), within its
    bounds and choices, the default shown in its help (unless None or empty)."""
    for name, key in keys.items():
        if key.default is False:
            parser.add_argument(f"--{name}", action="store_true", help=key.help)
            continue
        unset = key.default in (None, "")
        help = key.help if unset else f"{key.help} (default: %(default)s)"
        parser.add_argument(
            f"--{name}",
            type=flag_type(key),
            default=key.default,
            choices=key.choices,
            help=help,
        )


def flag_type(key):
    """An argparse type: the text as key's default's type; with bounds, one that key holds
    ("must be >= 1, got 0", argparse naming the flag)."""
    kind = str if key.default is None else type(key.default)
    if all(getattr(key, bound) is None for bound in BOUNDS):
        return kind
    bounded = replace(key, choices=None)  # argparse checks the choices

    def parse(text):
        value = kind(text)
        must = bounded.must(value)
        if must:
            raise argparse.ArgumentTypeError(f"must be {must}, got {text}")
        return value

    parse.__name__ = kind.__name__  # argparse's "invalid int value" names it
    return parse


def setting(default, help, ge=None, gt=None, le=None, lt=None, choices=None):
    """A dataclass field that is also an Option: its default, and its help and range in its
    metadata (the models' configs, decoding.Options)."""
    limits = dict(help=help, ge=ge, gt=gt, le=le, lt=lt, choices=choices)
    return field(default=default, metadata=limits)


def options_of(cls):
    """An Option for each field of a dataclass that is a setting()."""
    return {f.name: Option(f.default, **f.metadata) for f in fields(cls) if f.metadata}


# ------------------------------------------------------------ the JSON files read
# a tokenizer spec's keys besides its type: a tiktoken encoding by name, or a trained one in a
# file; "lowercase" and "eot" are optional
TOKENIZERS = {
    "char": {"chars": Option(""), "eot": Option(False)},
    "bpe": {"encoding": Option(""), "lowercase": Option(False)},
    "trained": {"file": Option(""), "sha256": Option("")},
}
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
