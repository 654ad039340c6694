"""A classifier's data (task=classify): labelled rows of different lengths, read in epochs, and
batches padded to their longest row."""

import functools
import os

import numpy as np
import torch

from lib.batches import check, load_array
from lib.common import Error


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
