"""Atomic writes: a file is replaced whole or not at all, and a write the system refuses is one
line naming the file; the lock that holds an out_dir for one process (a run's, a prepare's)."""

import json
import os
import re
import secrets
from contextlib import contextmanager

from safetensors import SafetensorError

from lib.common import Error


class WriteError(Error):
    """A write the system refused (a full disk, no permission)."""


# the name of atomic_path's temporary file, which a process killed mid-write leaves behind
TEMPORARY = re.compile(r"\.\d+-[0-9a-f]{8}\.tmp$")


@contextmanager
def atomic_path(path):
    """A temporary name that replaces path on success, or is deleted: path is always whole."""
    tmp = temporary(path)
    try:
        with writing(path):
            yield tmp
            # the mode open() gives a new file (safetensors' save_file makes its files 0600)
            os.chmod(tmp, 0o666 & ~umask())
            fsync(tmp)  # on the disk before the rename, the rename before the return
            os.replace(tmp, path)
        fsync(os.path.dirname(os.path.abspath(path)))
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def temporary(path):
    """A new name beside path, in TEMPORARY's form, for what is written to replace it."""
    return f"{path}.{os.getpid()}-{secrets.token_hex(4)}.tmp"


def umask():
    """The process's umask, which only setting it reads."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextmanager
def writing(path):
    """A refused write as a WriteError naming path and the cause."""
    try:
        yield
    except (OSError, RuntimeError, SafetensorError) as e:  # torch.save: a RuntimeError
        cause = getattr(e, "strerror", None) or str(e).partition("\n")[0]
        raise WriteError(f"cannot write {path} ({cause}): what it held before is whole") from None


def fsync(path):
    """Flush a file or a folder to the disk."""
    if os.path.isdir(path) and os.name == "nt":  # no need, and no way
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json(path, obj):
    with atomic_path(path) as tmp, open(tmp, "w") as f:
        json.dump(obj, f, indent=2)


def try_lock(fd, name):
    """flock fd, exclusively and without waiting (the OS releases it when the process dies): False
    if another process holds it; True once held, or where there is no flock (not POSIX: nothing is
    locked). name: what holds fd, for the error of a filesystem that cannot lock."""
    try:
        import fcntl  # POSIX
    except ImportError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:  # held: the one failure that means another process
        return False
    except OSError as e:
        raise Error(
            f"{name} cannot be locked ({e.strerror}: a filesystem without flock, such as some "
            "network mounts?): pick an --out_dir on a local disk"
        ) from None
    return True


@contextmanager
def locked_out_dir(out_dir, refusal):
    """Make out_dir and hold it while the block runs: a second run or prepare into it is refused
    with refusal(out_dir), an Error's message, not mixed with the first's files. flock on the
    folder itself, with no file to follow; the OS releases it when the process dies. Where a
    folder cannot be opened (Windows) nothing is locked."""
    try:
        os.makedirs(out_dir, exist_ok=True)
        folder = None if os.name == "nt" else os.open(out_dir, os.O_RDONLY)
    except OSError as e:
        raise Error(
            f"out_dir {out_dir!r} is not writable ({e.strerror}): pick another --out_dir"
        ) from None
    try:
        if folder is not None and not try_lock(folder, f"out_dir {out_dir!r}"):
            raise Error(refusal(out_dir))
        yield
    finally:
        if folder is not None:
            os.close(folder)
