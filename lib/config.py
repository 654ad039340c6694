"""Config files and --key=value overrides, read into settings by their Keys (lib/keys.py)."""

import ast
import difflib
import os
import traceback
from dataclasses import make_dataclass
from types import ModuleType

from lib.common import Error


def parse(argv, keys, doc):
    """(frozen settings, the names the user set) from config files and --key=value overrides, in
    order; --help prints doc and every key."""
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
            try:
                given[name] = keys[name].check(name, value)
            except Error as e:
                raise Error(f"{e} (in {arg})") from None
    values = {name: key.default for name, key in keys.items()} | given
    typed = [(name, type(key.default)) for name, key in keys.items()]
    return make_dataclass("Settings", typed, frozen=True)(**values), set(given)


def did_you_mean(value, choices):
    """ " (did you mean X?)" for the closest of choices, or nothing."""
    close = difflib.get_close_matches(value, choices, n=1)
    return f" (did you mean {close[0]}?)" if close else ""


def literal(text):
    """A Python literal (1e-3, True, 'x'), nan and inf, else the text itself."""
    for read in (ast.literal_eval, float):
        try:
            return read(text)
        except (ValueError, SyntaxError):
            pass
    return text


def read_file(path, scope):
    """The settings a config file sets into scope; include(path) runs another, relative to it."""
    if not os.path.isfile(path):
        raise Error(f"no config file {path!r} (config files live in config/)")

    def include(other):
        return read_file(os.path.join(os.path.dirname(path), other), scope)

    scope["include"] = include
    try:
        with open(path, encoding="utf-8") as f:
            exec(compile(f.read(), path, "exec"), scope)
    except Error:
        raise
    except SyntaxError as e:
        raise Error(f"{e.filename}:{e.lineno}: {e.msg}") from None
    except UnicodeDecodeError as e:
        raise Error(f"{path}: not UTF-8 text ({e.reason}): save it as UTF-8") from None
    except Exception as e:  # where Python says it was raised
        frame = traceback.extract_tb(e.__traceback__)[-1]
        raise Error(f"{frame.filename}:{frame.lineno}: {type(e).__name__}: {e}") from None
    return {
        name: value
        for name, value in scope.items()
        if not name.startswith("_") and not callable(value) and not isinstance(value, ModuleType)
    }
