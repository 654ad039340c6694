"""
Helpers the data/*/prepare.py scripts share: the Tiny Shakespeare text (downloaded, or read from --source) and the
write order that keeps a half-finished run from looking complete (meta.json goes first out, last back in).
"""
import os
import sys
import urllib.request

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo root: dataset.py
import dataset

SHAKESPEARE_URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"


def read_shakespeare(source=None):
    """The text of --source FILE, or of SHAKESPEARE_URL when there is none. Kept in memory: it is 1 MB."""
    if source is None:
        try:
            with urllib.request.urlopen(SHAKESPEARE_URL, timeout=30) as r:
                return r.read().decode("utf-8")
        except OSError as e:  # URLError, timeouts and refused connections are all OSErrors
            raise SystemExit(f"cannot download {SHAKESPEARE_URL} (no network? {type(e).__name__}: {e}): pass "
                             f"--source FILE, e.g. --source ../shared/data/tinyshakespeare/input.txt") from None
    if not os.path.isfile(source):
        raise SystemExit(f"--source {source}: no such file; pass the path of a text file such as "
                         f"../shared/data/tinyshakespeare/input.txt")
    try:
        with open(source, encoding="utf-8") as f:
            text = f.read()
    except UnicodeDecodeError as e:
        raise SystemExit(f"--source {source}: not UTF-8 text ({e}); convert it to UTF-8 first") from None
    if not text:
        raise SystemExit(f"--source {source}: the file is empty; pass a file holding the text")
    return text


def unpublish(out_dir):
    """Call once the input has passed its checks, before writing anything: without meta.json the folder reads as
    unprepared, so a run that dies halfway through its writes can't leave old metadata describing new files."""
    os.makedirs(out_dir, exist_ok=True)
    if os.path.exists(os.path.join(out_dir, "meta.json")):
        os.remove(os.path.join(out_dir, "meta.json"))


def write_lm(out_dir, splits, tok, source):
    """splits: {name: token ids}. Writes {name}.bin for each, then meta.json (task "lm") last."""
    dtype = dataset.token_dtype(tok.vocab_size)
    unpublish(out_dir)
    for name, ids in splits.items():
        dataset.save_array(os.path.join(out_dir, f"{name}.bin"), np.asarray(ids, dtype=dtype))
    dataset.write_meta(out_dir, task="lm", tokenizer=tok.spec, vocab_size=tok.vocab_size, dtype=np.dtype(dtype).name,
                       splits={name: len(ids) for name, ids in splits.items()}, source=source)
