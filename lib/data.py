"""Training data: a prepared dataset's files, checked against its meta.json, and a language
model's windows; a classifier's labelled rows (lib/classifier.py) and a chat fine-tune's
conversations (lib/chat.py) are read as lib/prepare.py's Rows. A step's global batch is a
function of (seed, step) alone, so resume is exact."""

import os

import numpy as np
import torch

from lib.common import Error, read_json
from lib.options import Option, check_keys, check_tokenizer, checking

# how many token ids each dtype of a dataset's files holds
ID_LIMITS = {"uint16": 2**16, "uint32": 2**32}
# a prepared dataset's meta.json; a classifier's holds more (lib/classifier.py's)
META = {
    "task": Option("lm", choices=("lm", "classify", "chat")),
    "vocab_size": Option(1, ge=1),
    "tokenizer": Option({}),
    "dtype": Option("uint16", choices=tuple(ID_LIMITS)),
    "splits": Option({}),
    "bytes": Option({}),  # each split's text in bytes (optional)
}
META_FIX = "the data is damaged or from another version: run its prepare.py again"
# the repository: data/<name>/ holds each dataset's prepare.py and files
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def read_meta(data_dir):
    """A prepared dataset's meta.json, checked."""
    path = os.path.join(data_dir, "meta.json")
    return check_meta(read_json(path, "dataset description (meta.json)"), path)


def check_meta(meta, path):
    """A prepared dataset's meta.json (data/README.md), checked."""
    with checking(meta, path, META_FIX):
        check_keys(meta, META, optional=["bytes"])
        check_keys(meta, {"vocab_size": Option(1, le=ID_LIMITS[meta["dtype"]])})
        check_tokenizer(meta["tokenizer"])
        for table in ("splits", "bytes"):
            counts = meta.get(table, {})
            check_keys(counts, dict.fromkeys(counts, Option(0, ge=0)), where=f"{table}.")
    return meta


def check(ok, path, what):
    """A dataset's file that fails ok is refused as meta.json is."""
    if not ok:
        raise Error(f"{path}: {what}; {META_FIX}")


def load_array(path, dtype=None):
    """A .npy file, or with dtype, a file of raw token ids (mapped, not read)."""
    try:
        return np.load(path) if dtype is None else np.memmap(path, dtype, mode="r")
    except (OSError, ValueError) as e:
        raise Error(
            f"{path}: cannot read it ({type(e).__name__}); run the dataset's prepare.py again"
        ) from None


class LMData:
    """A token stream; a row is block_size tokens from a random offset, its targets the same
    shifted by one."""

    # the metric that picks the checkpoint to keep, and which way is better
    best = ("val/loss", "min")
    labelled = False  # evaluations report accuracy for labelled data
    unit = "tok"  # the speed counts tokens
    task = "lm"  # the model it trains

    def __init__(self, path, size, block_size, meta):
        """path: the split's files, less their extension; size: its tokens, as meta.json says."""
        self.meta = meta
        self.folder = os.path.dirname(path)
        self.block_size = block_size
        # the bytes of the UTF-8 text the split's tokens decode to (none
        # in data prepared before they were counted)
        text_bytes = meta.get("bytes", {}).get(os.path.basename(path))
        self.tokens_per_byte = text_bytes and size / text_bytes
        path += ".bin"
        self.tokens = load_array(path, meta["dtype"])
        n = len(self.tokens)
        check(n == size, path, f"{n:,} tokens, meta.json says {size:,}")
        if n <= block_size:
            raise Error(
                f"{path} holds {n:,} tokens, fewer than block_size + 1 = {block_size + 1}: "
                "use a smaller block_size or more text"
            )
        # a full scan up to 256M tokens (a second or two); the length is checked always
        if n <= 1 << 28:
            top = int(self.tokens.max())
            check(
                top < meta["vocab_size"],
                path,
                f"token ids reach {top}, past vocab_size {meta['vocab_size']}",
            )

    def epochs(self, rows):
        """How many times rows drawn rows read the split's tokens."""
        return rows * self.block_size / len(self.tokens)

    def rows(self, seed, step, n):
        rng = np.random.default_rng([seed, step])
        return rng.integers(0, len(self.tokens) - self.block_size, n)

    def eval_rows(self, n):
        return self.rows(seed=2**31 - 1, step=0, n=n)  # the same n rows at every evaluation

    def batch(self, rows):
        # each row's block_size + 1 tokens: the inputs, and the targets one later
        spans = [self.tokens[i : i + 1 + self.block_size] for i in rows]
        windows = torch.from_numpy(np.stack(spans).astype(np.int64))
        return {"idx": windows[:, :-1].contiguous(), "targets": windows[:, 1:].contiguous()}

    @staticmethod
    def count(batch):
        """What the throughput counts: tokens."""
        return batch["idx"].numel()


def epochs_line(data, cfg):
    """The passes a run makes over its training data, and a warning past MAX_EPOCHS: a small
    corpus read many times over is learnt by heart, val loss rising."""
    rows = cfg.max_iters * cfg.batch_size * cfg.gradient_accumulation_steps
    epochs = data.epochs(rows)
    line = f"{cfg.max_iters:,} steps read the training data {epochs:.1f} times (epochs)"
    if epochs > MAX_EPOCHS:
        line = (
            f"warning: {line}: past {MAX_EPOCHS}, val loss often rises while train loss falls "
            "(the best checkpoint is the one kept); fewer max_iters or more data"
        )
    return line


# a few passes over the data: more, and a model often learns it by heart
MAX_EPOCHS = 10


def dataset_dir(dataset):
    """The folder of dataset: a path, or a name under data/."""
    return dataset if os.sep in dataset else os.path.join(ROOT, "data", dataset)


def to_device(batch, device):
    """The batch on device (on CUDA from pinned memory, which copies beside the GPU's work)."""
    pin = device.startswith("cuda")
    return {
        k: (v.pin_memory() if pin else v).to(device, non_blocking=True) for k, v in batch.items()
    }
