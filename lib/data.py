"""Training data: a prepared dataset's files, checked against its meta.json, and its batches: a
language model's windows, a classifier's labelled rows, a chat fine-tune's conversations; then
load_split, which picks the reader meta.json's task names. A step's global batch is a function
of (seed, step) alone, so resume is exact."""

import functools
import os
import subprocess
import sys

import numpy as np
import torch

from lib.card import check_keys, check_label_names, check_tokenizer, checking
from lib.common import Error, read_json
from lib.distributed import under_torchrun
from lib.options import Option

# how many token ids each dtype of a dataset's files holds
ID_LIMITS = {"uint16": 2**16, "uint32": 2**32}
# a prepared dataset's meta.json; a classifier's also holds its labels and max_length
META = {
    "task": Option("lm", choices=("lm", "classify", "chat")),
    "vocab_size": Option(1, ge=1),
    "tokenizer": Option({}),
    "dtype": Option("uint16", choices=tuple(ID_LIMITS)),
    "splits": Option({}),
    "bytes": Option({}),  # each split's text in bytes (optional)
}
CLASSIFY_META = {"label_names": Option([]), "max_length": Option(1, ge=1)}
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
        if meta["task"] == "classify":
            pad = Option(0, ge=0, lt=meta["vocab_size"])
            check_keys(meta, {**CLASSIFY_META, "pad_token_id": pad})
            check_label_names(meta["label_names"])
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


def pad_batch(rows, pad_token_id):
    """Token id lists -> (idx [B, width], attention_mask [B, width]: 1 real, 0 padding)."""
    width = max(1, max(len(r) for r in rows))
    idx = np.full((len(rows), width), pad_token_id, dtype=np.int64)
    attention_mask = np.zeros_like(idx)
    for i, r in enumerate(rows):
        idx[i, : len(r)] = r
        attention_mask[i, : len(r)] = 1
    return torch.from_numpy(idx), torch.from_numpy(attention_mask)


def read_rows(path, n, meta):
    """(tokens, offsets) of a split of n rows, row i tokens[offsets[i]:offsets[i + 1]]."""
    if n == 0:
        raise Error(f"{path}: the split has no rows: prepare it from more data")
    tokens = load_array(path + ".bin", meta["dtype"])
    offsets = load_array(path + ".offsets.npy")
    check(
        len(offsets) == n + 1 and offsets[0] == 0 and (np.diff(offsets) >= 0).all(),
        path + ".offsets.npy",
        f"not {n + 1:,} rising offsets from 0",
    )
    check(
        offsets[-1] == len(tokens),
        path + ".bin",
        f"{len(tokens):,} tokens, the offsets say {offsets[-1]:,}",
    )
    check(
        len(tokens) == 0 or int(tokens.max()) < meta["vocab_size"],
        path + ".bin",
        f"token ids past vocab_size {meta['vocab_size']}",
    )
    return tokens, offsets


class ClassificationData:
    """Labelled rows, read in epochs (a fresh permutation each); a batch is padded to its own
    longest row."""

    best = ("val/accuracy", "max")
    labelled = True
    unit = "ex"  # the speed counts examples
    task = "classify"

    def __init__(self, path, n, block_size, meta):
        """path: the split's files, less their extensions; n: its rows, as meta.json says."""
        self.meta = meta
        self.folder = os.path.dirname(path)
        self.block_size = block_size
        self.tokens, self.offsets = read_rows(path, n, meta)
        labels_path = path + ".labels.npy"
        labels = load_array(labels_path)
        check(
            labels.ndim == 1 and np.issubdtype(labels.dtype, np.integer),
            labels_path,
            f"{labels.dtype} labels of shape {labels.shape}, not one integer per row",
        )
        check(len(labels) == n, labels_path, f"{len(labels):,} labels for {n:,} rows")
        check(
            0 <= labels.min() and labels.max() < len(meta["label_names"]),
            labels_path,
            f"labels outside 0..{len(meta['label_names']) - 1}",
        )
        self.labels = labels

    def __len__(self):
        return len(self.offsets) - 1

    def epochs(self, rows):
        """How many times rows drawn rows read the split."""
        return rows / len(self)

    def rows(self, seed, step, n):
        """Rows step * n ... (step + 1) * n - 1 of an endless stream of epochs, each a permutation
        of (seed, epoch)."""
        rows = len(self)
        positions = range(step * n, (step + 1) * n)
        return np.array([permutation(seed, p // rows, rows)[p % rows] for p in positions])

    def eval_rows(self, n):
        return np.arange(min(n, len(self)))  # in order, each row once

    def batch(self, rows):
        seqs = [self.tokens[self.offsets[i] : self.offsets[i + 1]][: self.block_size] for i in rows]
        idx, attention_mask = pad_batch(seqs, self.meta["pad_token_id"])
        return {
            "idx": idx,
            "attention_mask": attention_mask,
            "labels": torch.from_numpy(self.labels[rows]),
        }

    @staticmethod
    def count(batch):
        """What the throughput counts: examples."""
        return len(batch["idx"])


@functools.lru_cache(maxsize=1)
def permutation(seed, epoch, rows):
    """The order of an epoch of rows: a function of (seed, epoch) alone (the last one kept)."""
    return np.random.default_rng([seed, epoch]).permutation(rows)


class ConversationData(ClassificationData):
    """Conversations: as inputs, each one's tokens but its last; as targets, the next
    token where the mask marks it, else -1 (cross_entropy's ignore_index)."""

    best = ("val/loss", "min")
    labelled = False
    unit = "tok"  # the speed counts tokens, padding included
    task = "lm"
    tokens_per_byte = None

    def __init__(self, path, n, block_size, meta):
        """path: the split's files, less their extensions; n: its conversations."""
        self.meta = meta
        self.folder = os.path.dirname(path)
        self.tokens, self.offsets = read_rows(path, n, meta)
        self.learn = load_array(path + ".mask.bin", "uint8")
        check(
            len(self.learn) == len(self.tokens),
            path + ".mask.bin",
            f"{len(self.learn):,} marks for {len(self.tokens):,} tokens",
        )
        longest = int(np.diff(self.offsets).max())
        if longest > block_size + 1:
            raise Error(
                f"{path}.bin holds a conversation of {longest} tokens, past block_size + 1 = "
                f"{block_size + 1}: train with block_size={longest - 1}, or prepare with "
                f"--block_size={block_size}"
            )

    def batch(self, rows):
        spans = [(self.offsets[i], self.offsets[i + 1]) for i in rows]
        width = max(end - start for start, end in spans) - 1
        idx = torch.zeros(len(rows), width, dtype=torch.long)
        targets = torch.full_like(idx, -1)
        for row, (start, end) in enumerate(spans):
            ids = torch.from_numpy(self.tokens[start:end].astype(np.int64))
            learn = torch.from_numpy(self.learn[start + 1 : end].astype(bool))
            idx[row, : end - start - 1] = ids[:-1]
            targets[row, : end - start - 1] = ids[1:].where(learn, -1)
        return {"idx": idx, "targets": targets}

    count = staticmethod(LMData.count)  # tokens


# ------------------------------------------------------------ a dataset's splits, by task
def load_split(data_dir, split, block_size):
    """The split's reader for the task that meta.json names, its files checked against meta.json."""
    meta = read_meta(data_dir)
    check(
        split in meta["splits"],
        os.path.join(data_dir, "meta.json"),
        f"no {split} split ({sorted(meta['splits'])})",
    )
    args = (os.path.join(data_dir, split), meta["splits"][split], block_size, meta)
    if meta["task"] == "classify":
        return ClassificationData(*args)
    if meta["task"] == "chat":
        return ConversationData(*args)
    return LMData(*args)


def dataset_dir(dataset):
    """The folder of dataset: a path, or a name under data/."""
    return dataset if os.sep in dataset else os.path.join(ROOT, "data", dataset)


def load_data(cfg):
    """(train, val) of the dataset; one never prepared is prepared first by its prepare.py."""
    path = dataset_dir(cfg.dataset)
    prepare = os.path.join(path, "prepare.py")
    command = f"python data/{cfg.dataset}/prepare.py"
    if not os.path.exists(os.path.join(path, "meta.json")):
        if under_torchrun() or not os.path.isfile(prepare):
            raise Error(f"no prepared data in {path}: run {command} first")
        print(f"no prepared data in {path}: running {command}", file=sys.stderr)
        if subprocess.run([sys.executable, prepare]).returncode:
            raise Error(
                f"{command} failed (message above); offline, prepare from local files: "
                f"{command} --source PATH (its --help says which)"
            )
    train_data = load_split(path, "train", cfg.block_size)
    # a trained tokenizer's file, checked now: each model save copies it
    spec = train_data.meta["tokenizer"]
    if "file" in spec:
        from lib.weights import get_tokenizer

        get_tokenizer(spec, os.path.join(path, "meta.json"))
    val_data = load_split(path, "val", cfg.block_size)
    if train_data.task != cfg.task:
        raise Error(
            f"dataset {cfg.dataset} is prepared for task={train_data.task}, but task={cfg.task}"
        )
    return train_data, val_data


def to_device(batch, device):
    """The batch on device (on CUDA from pinned memory, which copies beside the GPU's work)."""
    pin = device.startswith("cuda")
    return {
        k: (v.pin_memory() if pin else v).to(device, non_blocking=True) for k, v in batch.items()
    }
