"""train.py's settings: the Key that describes one; config files (Python that sets keys, and may include() another)
and --key=value overrides, read in order, each value checked against its key's type and range; --help from the keys."""

import ast
import difflib
import math
import os
import traceback
from dataclasses import dataclass
from types import SimpleNamespace

from lib.common import Error


@dataclass
class Key:
    """One setting: its default (which fixes its type), help, and range: at_least <= value < below, or in choices."""

    default: object
    help: str
    at_least: float = None
    below: float = None
    choices: tuple = None

    def check(self, name, value):
        bounds = (
            f"in [{self.at_least}, {self.below})"
            if self.below is not None
            else f">= {self.at_least}"
        )
        ok = (
            (not isinstance(value, float) or math.isfinite(value), "a finite number"),
            (self.at_least is None or value >= self.at_least, bounds),
            (self.below is None or value < self.below, bounds),
            (
                self.choices is None or value in self.choices,
                f"one of {', '.join(map(str, self.choices or ()))}",
            ),
        )
        for good, what in ok:
            if not good:
                raise Error(f"{name}={value!r}: must be {what}")


def parse(argv, keys, doc):
    """(settings as a namespace, the names the user set) from config files and --key=value overrides, in order. A
    bare word is a string (--dataset=agnews); --help prints doc and every key; --print_config is left to the caller."""
    settings, user_keys = {name: key.default for name, key in keys.items()}, set()

    def set_key(name, value, where):
        if name not in keys:
            raise Error(
                f"unknown key {name!r} in {where}" + (did_you_mean(name, keys) or " (see --help)")
            )
        expected = type(keys[name].default)
        value = float(value) if expected is float and type(value) is int else value
        if type(value) is not expected:
            raise Error(
                f"{name} must be {expected.__name__}, got {type(value).__name__} {value!r} in {where}"
            )
        settings[name] = value
        user_keys.add(name)

    for arg in argv:
        if arg in ("-h", "--help"):
            print(doc + "\nkeys, their defaults and what they do:")
            print(
                "\n".join(
                    f"  --{name}={key.default!r}".ljust(34) + f"  {key.help}"
                    for name, key in keys.items()
                )
            )
            raise SystemExit(0)
        if arg == "--print_config":
            continue
        if arg.startswith("--"):
            name, eq, text = arg[2:].partition("=")
            if not eq:
                raise Error(f"{arg}: write --{name}=VALUE")
            set_key(name, literal(text), arg)
        else:
            for name, value in read_file(arg).items():
                set_key(name, value, arg)
    return SimpleNamespace(**settings), user_keys


def did_you_mean(value, choices):
    """ " (did you mean X?)" for the choice closest to a mistyped value, or nothing."""
    close = difflib.get_close_matches(str(value), choices, n=1)
    return f" (did you mean {close[0]}?)" if close else ""


def literal(text):
    """A Python literal (1e-3, True, 'x', (1, 2)), nan and inf as floats, anything else as the string itself."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        try:
            return float(text)
        except ValueError:
            return text


def read_file(path, scope=None):
    """The keys a config file sets; include(path) runs another, relative to this file (to work from any directory)."""
    scope = {} if scope is None else scope
    if not os.path.isfile(path):
        raise Error(f"no config file {path!r} (config files live in config/)")
    data = open(path, "rb").read()
    try:
        source = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise Error(
            f"{path}:{line}: not UTF-8 text (byte {data[e.start]:#x}): save the file as UTF-8"
        ) from None
    scope["include"] = lambda other: read_file(os.path.join(os.path.dirname(path), other), scope)
    try:
        exec(compile(source, path, "exec"), scope)
    except Error:
        raise
    except SyntaxError as e:
        raise Error(f"{e.filename}:{e.lineno}: {e.msg}") from None
    except Exception as e:
        lines = [f.lineno for f in traceback.extract_tb(e.__traceback__) if f.filename == path]
        raise Error(f"{path}:{lines[-1] if lines else '?'}: {type(e).__name__}: {e}") from None
    return {
        k: v
        for k, v in scope.items()
        if not k.startswith("_") and not callable(v) and type(v).__name__ != "module"
    }


def check(settings, keys, rules):
    """Every value in its key's range, then the rules between keys: each (holds, name, what) of rules(settings)."""
    for name, key in keys.items():
        key.check(name, getattr(settings, name))
    for holds, name, what in rules(settings):
        if not holds:
            raise Error(f"{name}={getattr(settings, name)!r}: must be {what}")
