"""train.py's settings: the Key that describes one; config files (Python that sets keys, and may
include() another) and --key=value overrides, read in order, each value checked against its key's
type and range; --help from the keys. The settings come out as a frozen dataclass: a run reads
them and never writes them (a later step makes a new one with dataclasses.replace)."""

import ast
import difflib
import math
import os
import traceback
from dataclasses import dataclass, fields, make_dataclass

from lib.common import Error


@dataclass
class Key:
    """One setting: its default (which fixes its type), help, and range: at_least <= value <
    below, or in choices."""

    default: object
    help: str
    at_least: float = None
    below: float = None
    choices: tuple = None

    def check(self, name, value):
        if isinstance(value, float) and not math.isfinite(value):
            raise Error(f"{name}={value!r}: must be a finite number")
        if self.below is not None:
            bounds = f"in [{self.at_least}, {self.below})"
        else:
            bounds = f">= {self.at_least}"
        too_low = self.at_least is not None and value < self.at_least
        too_high = self.below is not None and value >= self.below
        if too_low or too_high:
            raise Error(f"{name}={value!r}: must be {bounds}")
        if self.choices is not None and value not in self.choices:
            choices = ", ".join(map(str, self.choices))
            raise Error(f"{name}={value!r}: must be one of {choices}")


def model_keys(config_cls):
    """A Key for each of a model config's fields that is a setting (model.setting(): its help and
    range in the field's metadata)."""
    return {f.name: Key(f.default, **f.metadata) for f in fields(config_cls) if f.metadata}


def settings_class(keys):
    """A frozen dataclass with one field per key, in the keys' order."""
    return make_dataclass(
        "Settings", [(name, type(key.default)) for name, key in keys.items()], frozen=True
    )


def parse(argv, keys, doc):
    """(the settings, the names the user set) from config files and --key=value overrides, in
    order, each value checked against its key. A bare word is a string (--dataset=agnews); --help
    prints doc and every key; --print_config is left to the caller."""
    values = {name: key.default for name, key in keys.items()}
    user_keys = set()

    def set_key(name, value, where):
        if name not in keys:
            hint = did_you_mean(name, keys) or " (see --help)"
            raise Error(f"unknown key {name!r} in {where}{hint}")
        expected = type(keys[name].default)
        if expected is float and type(value) is int:
            value = float(value)
        if type(value) is not expected:
            got = f"{type(value).__name__} {value!r}"
            raise Error(f"{name} must be {expected.__name__}, got {got} in {where}")
        values[name] = value
        user_keys.add(name)

    for arg in argv:
        if arg in ("-h", "--help"):
            print_help(doc, keys)
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
    settings = settings_class(keys)(**values)
    check(settings, keys)
    return settings, user_keys


def print_help(doc, keys):
    print(doc + "\nkeys, their defaults and what they do:")
    for name, key in keys.items():
        print(f"  --{name}={key.default!r}".ljust(34) + f"  {key.help}")


def did_you_mean(value, choices):
    """ " (did you mean X?)" for the choice closest to a mistyped value, or nothing."""
    close = difflib.get_close_matches(str(value), choices, n=1)
    return f" (did you mean {close[0]}?)" if close else ""


def literal(text):
    """A Python literal (1e-3, True, 'x', (1, 2)), nan and inf as floats, anything else as the
    string itself."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        pass
    try:
        return float(text)
    except ValueError:
        return text


def read_file(path, scope=None):
    """The keys a config file sets; include(path) runs another, relative to this file (to work
    from any directory)."""
    if scope is None:
        scope = {}
    if not os.path.isfile(path):
        raise Error(f"no config file {path!r} (config files live in config/)")
    data = open(path, "rb").read()
    try:
        source = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        byte = data[e.start]
        raise Error(
            f"{path}:{line}: not UTF-8 text (byte {byte:#x}): save the file as UTF-8"
        ) from None

    def include(other):
        return read_file(os.path.join(os.path.dirname(path), other), scope)

    scope["include"] = include
    try:
        exec(compile(source, path, "exec"), scope)
    except Error:
        raise
    except SyntaxError as e:
        raise Error(f"{e.filename}:{e.lineno}: {e.msg}") from None
    except Exception as e:
        frames = traceback.extract_tb(e.__traceback__)
        lines = [f.lineno for f in frames if f.filename == path]
        where = lines[-1] if lines else "?"
        raise Error(f"{path}:{where}: {type(e).__name__}: {e}") from None
    return {name: value for name, value in scope.items() if is_setting(name, value)}


def is_setting(name, value):
    """What a config file's names hold: settings, not imports, functions or private names."""
    module = type(value).__name__ == "module"
    return not name.startswith("_") and not callable(value) and not module


def check(settings, keys):
    """Every value in its key's range."""
    for name, key in keys.items():
        key.check(name, getattr(settings, name))
