"""What the scripts share: the error type and how a script reports it, device and dtype rules,
timing, atomic writes. Library code (lib/, model.py, decoding.py) raises Error, and never prints or
exits."""

import argparse
import json
import os
import re
import secrets
import sys
from contextlib import contextmanager, nullcontext

import torch
from safetensors import SafetensorError


class Error(Exception):
    """A problem the user can fix (a bad value, a missing file, an absent device). Scripts print it
    as one line."""


class WriteError(Error):
    """A write the system refused (a full disk, a folder without write permission)."""


def run_script(main, prog):
    """The one error path of every script: an Error is `prog: error: message` on stderr and exit
    status 2 (as argparse's), so a 1 with a traceback always means a bug; a closed pipe (`| head`)
    ends quietly."""
    try:
        main()
    except Error as e:
        # one write: every rank of a group may print its line at once
        sys.stderr.write(f"{prog}: error: {e}\n")
        sys.exit(2)
    except KeyboardInterrupt:
        sys.stderr.write(f"{prog}: interrupted\n")
        sys.exit(130)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
    except OSError as e:  # one the system raised outside writing(): it names its file
        sys.stderr.write(f"{prog}: error: {e}\n")
        sys.exit(2)


class ArgumentParser(argparse.ArgumentParser):
    def error(self, message):
        """One line through run_script, not argparse's usage block and exit; a long value it
        quotes (a number of 5,000 digits) is cut to its start."""
        # a quoted value too long for a one-line message
        shortened = re.sub(r"'([^']{61,})'", shorten_quote, message)
        raise Error(f"{shortened} (see --help)")


def shorten_quote(match):
    text = match.group(1)
    return f"'{text[:40]}...' ({len(text):,} characters)"


def at_least(low):
    """An argparse type: an int >= low."""

    def parse(text):
        value = int(text)
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {text}")
        return value

    parse.__name__ = "int"  # argparse's "invalid int value" names it
    return parse


# ------------------------------------------------------------------------------- device, dtype
def pick_device(name):
    """The device that name (auto, cpu, cuda, cuda:1, mps) means here; auto: cuda, then mps, then
    cpu, the first this machine has. A chosen GPU is made the current one, so synchronize(), new
    tensors and libraries' contexts all go to it, not to GPU 0."""
    available = {
        "cuda": torch.cuda.is_available(),
        "mps": torch.backends.mps.is_available(),
        "cpu": True,
    }
    if name == "auto":
        name = next(kind for kind, here in available.items() if here)
    kind = name.split(":")[0]
    if not available.get(kind, True):
        raise Error(f"--device {name}: this machine or this build of torch has no {kind} device")
    try:
        torch.empty(0, device=name)
    except (RuntimeError, AssertionError) as e:  # no such device type, or no such index
        raise Error(f"--device {name}: {str(e).strip().splitlines()[0][:200]}") from None
    if kind == "cuda":
        if name == "cuda":  # the current GPU
            name = f"cuda:{torch.cuda.current_device()}"
        torch.cuda.set_device(name)
        # float32 matmuls on tensor cores (TF32), as nanoGPT
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    return name


def native_bf16(device):
    """Whether device multiplies bfloat16 natively: a CUDA GPU of compute capability 8.0 and up,
    or a CPU with AMX or AVX-512 BF16 (flags read from Linux's /proc/cpuinfo)."""
    kind = torch.device(device).type
    if kind == "cuda":
        return torch.cuda.is_bf16_supported(including_emulation=False)
    if kind != "cpu" or not os.path.isfile("/proc/cpuinfo"):
        return False
    flags = open("/proc/cpuinfo").read()
    return " amx_bf16" in flags or " avx512_bf16" in flags


def resolve_dtype(dtype, device):
    """dtype=auto: bfloat16 where native_bf16, float16 on other CUDA GPUs, float32 elsewhere.
    Checks that the dtype runs on device."""
    kind = torch.device(device).type
    if dtype == "auto":
        if native_bf16(device):
            dtype = "bfloat16"
        elif kind == "cuda":
            dtype = "float16"
        else:
            dtype = "float32"
    if dtype not in ("float32", "bfloat16", "float16"):
        raise Error(f"dtype must be auto, float32, bfloat16 or float16, got {dtype!r}")
    if dtype == "float16" and kind != "cuda":
        raise Error(f"dtype=float16 needs a CUDA GPU; on {kind} use bfloat16 or float32")
    if dtype == "bfloat16" and kind == "cuda" and not native_bf16(device):
        raise Error(
            "dtype=bfloat16: this GPU has no bfloat16 matmuls (they would be emulated, slowly, "
            "and compile skipped): use dtype=auto (float16 here) or float32"
        )
    return dtype


def autocast(device, dtype):
    """Mixed precision for forward passes: matmuls in dtype, reductions in float32; float32 is no
    context at all."""
    if dtype == "float32":
        return nullcontext()
    return torch.autocast(torch.device(device).type, dtype=getattr(torch, dtype))


def sync(device):
    """Wait for the device: GPU work is asynchronous, so a timer would stop before the work
    does."""
    kind = torch.device(device).type
    if kind == "cuda":
        torch.cuda.synchronize(device)
    elif kind == "mps":
        torch.mps.synchronize()


# --------------------------------------------------------------------------------------- files
# the name of atomic_path's temporary file, which a process killed mid-write leaves behind
TEMPORARY = re.compile(r"\.\d+-[0-9a-f]{8}\.tmp$")


@contextmanager
def atomic_path(path):
    """Yields a unique temporary name beside path (two writers never share one); on success it
    replaces path in one step (os.replace), on failure it is deleted: a crash never leaves half a
    file under the real name. The file reaches the disk before the rename and the rename before
    the return (fsync of the file, then of its folder), so a power loss leaves the old file or
    the new one whole."""
    tmp = f"{path}.{os.getpid()}-{secrets.token_hex(4)}.tmp"  # TEMPORARY's form
    try:
        with writing(path):
            yield tmp
            fsync(tmp)
            os.replace(tmp, path)
        fsync(os.path.dirname(os.path.abspath(path)))
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


@contextmanager
def writing(path):
    """Turns a write the system refused into a WriteError naming path and the cause: an OSError's
    strerror, or the message of torch's or safetensors' writer (torch.save on a full disk raises a
    RuntimeError that names no cause)."""
    try:
        yield
    except (OSError, RuntimeError, SafetensorError) as e:
        cause = getattr(e, "strerror", None) or str(e).partition("\n")[0]
        raise WriteError(f"cannot write {path} ({cause}): what it held before is whole") from None


def fsync(path):
    """Flush a file's or a folder's contents to the disk (folders: on POSIX; Windows cannot open
    one, and its renames need no flush of the folder)."""
    if os.path.isdir(path) and os.name == "nt":
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json(path, obj):
    with atomic_path(path) as tmp, open(tmp, "w") as f:
        json.dump(obj, f, indent=2)


def read_json(path, what):
    """A JSON file, or an Error naming it: missing, unreadable or not JSON."""
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        raise Error(f"{path}: no such {what}") from None
    # ValueError: not UTF-8, not JSON, or an integer past Python's digit limit; RecursionError:
    # arrays or objects nested past Python's recursion limit
    except (OSError, ValueError, RecursionError) as e:
        raise Error(f"{path}: not a readable JSON {what} ({type(e).__name__})") from None
