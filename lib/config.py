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
from types import ModuleType

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
        """An Error naming the key, its value and what it must be, if value is out of range."""
        must = None
        if isinstance(value, float) and not math.isfinite(value):
            must = "a finite number"
        elif self.below is not None and not self.at_least <= value < self.below:
            must = f"in [{self.at_least}, {self.below})"
        elif self.at_least is not None and value < self.at_least:
            must = f">= {self.at_least}"
        elif self.choices and value not in self.choices:
            must = f"one of {', '.join(map(str, self.choices))}"
        if must:
            raise Error(f"{name}={value!r}: must be {must}")


def model_keys(config_cls):
    """A Key for each of a model config's fields that is a setting (model.setting(): its help and
    range in the field's metadata)."""
    return {f.name: Key(f.default, **f.metadata) for f in fields(config_cls) if f.metadata}


def parse(argv, keys, doc):
    """(the settings, the names the user set) from config files and --key=value overrides, in
    order, each value checked against its key. A bare word is a string (--dataset=agnews); --help
    prints doc and every key; --print_config is left to the caller."""
    given = {}
    for arg in argv:
        if arg in ("-h", "--help"):
            print(doc + "\nkeys, their defaults and what they do:")
            for name, key in keys.items():
                print(f"  --{name}={key.default!r}".ljust(34) + f"  {key.help}")
            raise SystemExit(0)
        if arg == "--print_config":
            continue
        if arg.startswith("--"):
            name, eq, text = arg[2:].partition("=")
            if not eq:
                raise Error(f"{arg}: write --{name}=VALUE")
            settings = {name: literal(text)}
        else:
            settings = read_file(arg, {})
        for name, value in settings.items():
            if name not in keys:
                hint = did_you_mean(name, keys) or " (see --help)"
                raise Error(f"unknown key {name!r} in {arg}{hint}")
            expected = type(keys[name].default)
            if expected is float and type(value) is int:
                value = float(value)
            if type(value) is not expected:
                got = f"{type(value).__name__} {value!r}"
                raise Error(f"{name} must be {expected.__name__}, got {got} in {arg}")
            given[name] = value
    values = {name: key.default for name, key in keys.items()} | given
    for name, key in keys.items():
        key.check(name, values[name])
    typed = [(name, type(key.default)) for name, key in keys.items()]
    return make_dataclass("Settings", typed, frozen=True)(**values), set(given)


def did_you_mean(value, choices):
    """ " (did you mean X?)" for the choice closest to a mistyped value, or nothing."""
    close = difflib.get_close_matches(value, choices, n=1)
    return f" (did you mean {close[0]}?)" if close else ""


def literal(text):
    """A Python literal (1e-3, True, 'x', (1, 2)), nan and inf as floats, anything else as the
    string itself."""
    for read in (ast.literal_eval, float):
        try:
            return read(text)
        except (ValueError, SyntaxError):
            pass
    return text


def read_file(path, scope):
    """The settings a config file sets into scope (the names set so far): not its imports,
    functions or private names. include(path) runs another into the same scope, relative to this
    file (to work from any directory)."""
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
        # the line of this file that raised it (the last of its frames: its own or an include's)
        frames = traceback.extract_tb(e.__traceback__)
        line = [f.lineno for f in frames if f.filename == path][-1]
        raise Error(f"{path}:{line}: {type(e).__name__}: {e}") from None
    return {
        name: value
        for name, value in scope.items()
        if not name.startswith("_") and not callable(value) and not isinstance(value, ModuleType)
    }
