"""An out_dir held by one process at a time: a run's (lib/checkpoint.py) and a prepare's
(lib/prepare.py) locks share this core."""

from lib.common import Error


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
