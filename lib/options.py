"""Values and their ranges in one place, an Option each: train.py's settings, the models' configs,
decoding.Options, the JSON files read, the scripts' flags (flags())."""

import argparse
import math
import operator
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
