"""What the scripts share: errors, the command line, devices and dtypes, reading JSON."""

import argparse
import difflib
import json
import os
import re
import sys
from contextlib import contextmanager, nullcontext

import torch


class Error(Exception):
    """A problem the user can fix; library code raises it, and never prints or exits."""


def run_script(main, prog):
    """main() with one error path: an Error is one line and exit status 2, as argparse's."""
    try:
        main()
    except KeyboardInterrupt:
        sys.stderr.write(f"{prog}: interrupted\n")
        sys.exit(130)
    except BrokenPipeError:  # `| head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
    except (Error, OSError) as e:  # an OSError outside writing() names its file
        # one write: other ranks may print at the same time
        sys.stderr.write(f"{prog}: error: {e}\n")
        sys.exit(2)


class ArgumentParser(argparse.ArgumentParser):
    def __init__(self, **kwargs):
        """A script's parser: its docstring, the description, shown with its own line breaks."""
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(**kwargs)

    def error(self, message):
        """One line through run_script, not argparse's usage block and exit; a long value it
        quotes (a number of 5,000 digits) is cut to its start."""
        # a quoted value too long for a one-line message
        shortened = re.sub(r"'([^']{61,})'", shorten_quote, message)
        raise Error(f"{shortened} (see --help)")


def shorten_quote(match):
    text = match.group(1)
    return f"'{text[:40]}...' ({len(text):,} characters)"


@contextmanager
def compiling(advice):
    """Work that compiles: torch.compile's failure (no C++ compiler, say) is one line with advice
    instead of inductor's traceback."""
    try:
        yield
    except torch._dynamo.exc.BackendCompilerFailed as e:
        reason = str(e).strip().splitlines()[0]
        raise Error(f"torch.compile failed ({reason}): {advice}") from None


# ------------------------------------------------------------------------------- device, dtype
def pick_device(name):
    """auto: cuda, then mps, then cpu. A GPU becomes the current one (new tensors go to it)."""
    if name == "auto":
        if torch.cuda.is_available():
            name = "cuda"
        elif torch.backends.mps.is_available():
            name = "mps"
        else:
            name = "cpu"
    try:
        torch.empty(0, device=name)
    # no such device type or index, no driver, or a build of torch without it
    except (RuntimeError, AssertionError) as e:
        cause = str(e).strip().splitlines()[0][:200]
        raise Error(f"--device {name}: no such device here ({cause})") from None
    if name.startswith("cuda"):
        if name == "cuda":  # the current GPU
            name = f"cuda:{torch.cuda.current_device()}"
        torch.cuda.set_device(name)
        # float32 matmuls on tensor cores (TF32), as nanoGPT
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    return name


def native_bf16(device):
    """Whether device multiplies bfloat16 natively: GPUs of compute capability 8.0 and up, CPUs
    with AMX or AVX-512 BF16."""
    kind = torch.device(device).type
    if kind == "cuda":
        return torch.cuda.is_bf16_supported(including_emulation=False)
    if kind != "cpu" or not os.path.isfile("/proc/cpuinfo"):
        return False
    flags = open("/proc/cpuinfo").read()
    return " amx_bf16" in flags or " avx512_bf16" in flags


def autocast(device, dtype):
    """Mixed precision: matmuls in dtype, reductions in float32."""
    if dtype == "float32":
        return nullcontext()
    return torch.autocast(torch.device(device).type, dtype=getattr(torch, dtype))


def check_regular(path):
    """An Error if path is there but not a regular file: a pipe or a device (a link to /dev/zero)
    would be read forever."""
    if os.path.exists(path) and not os.path.isfile(path):
        raise Error(f"{path}: not a regular file")


def read_utf8(path, missing, unreadable, fix=""):
    """The UTF-8 text of a file, or an Error: missing where there is no such file; unreadable,
    the cause's name, then fix, where it cannot be read."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        raise Error(missing) from None
    except (OSError, UnicodeDecodeError) as e:
        raise Error(f"{unreadable} ({type(e).__name__}){fix}") from None


def read_json(path, what):
    """A JSON file, or an Error naming it."""
    check_regular(path)
    text = read_utf8(path, f"{path}: no such {what}", f"{path}: not a readable JSON {what}")
    try:
        return parse_json(text)
    except Error as e:
        raise Error(f"{path}: not a readable JSON {what} ({e})") from None


def parse_json(text):
    """The value of JSON text, or an Error saying why it has none; Python's own
    limits included, which json.loads meets with other exceptions."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise Error(e.msg) from None  # "Expecting value", "Extra data", ...
    except ValueError:  # an integer past the digits int() reads
        digits = sys.get_int_max_str_digits()
        raise Error(f"an integer of more than {digits:,} digits") from None
    except RecursionError:  # arrays or objects nested past the recursion limit
        raise Error("arrays or objects nested too deep to read") from None


def did_you_mean(value, choices):
    """ " (did you mean X?)" for the closest of choices, or nothing."""
    close = difflib.get_close_matches(value, choices, n=1)
    return f" (did you mean {close[0]}?)" if close else ""
