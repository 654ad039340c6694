"""
Prepared datasets on disk and the batches drawn from them (the formats are documented in data/README.md).
  lm:        {split}.bin, every token id of the split in a row
  classify:  {split}.bin, the token ids of all rows in a row; {split}.offsets.npy, where each row starts (n + 1
             entries); {split}.labels.npy, one class id per row
  meta.json: task, tokenizer, vocab_size, dtype (uint16, or uint32 past 65,536 tokens); classify adds label_names,
             max_length and pad_token_id
A step's global batch is a function of (seed, step) alone, and each process takes its slice of it: the data order
survives a resume and does not depend on how many processes share the work.
"""
import json
import os

import numpy as np
import torch

from model import write_json


def token_dtype(vocab_size):
    return np.uint16 if vocab_size <= 2 ** 16 else np.uint32


def save_array(path, array):
    """Write .bin (raw) or .npy atomically: a half-written file never takes the name."""
    with open(path + ".tmp", "wb") as f:
        np.save(f, array) if path.endswith(".npy") else array.tofile(f)
    os.replace(path + ".tmp", path)


def write_meta(data_dir, **meta):
    os.makedirs(data_dir, exist_ok=True)
    write_json(os.path.join(data_dir, "meta.json"), meta)


def write_classification_split(data_dir, split, rows, labels, dtype):
    """rows: token id lists; labels: class ids. Writes {split}.bin, {split}.offsets.npy, {split}.labels.npy."""
    lengths = np.array([len(r) for r in rows], dtype=np.int64)
    save_array(os.path.join(data_dir, f"{split}.bin"), np.fromiter((t for r in rows for t in r), dtype, lengths.sum()))
    save_array(os.path.join(data_dir, f"{split}.offsets.npy"), np.concatenate([[0], np.cumsum(lengths)]))
    save_array(os.path.join(data_dir, f"{split}.labels.npy"), np.asarray(labels, dtype=np.int64))


def read_meta(data_dir):
    with open(os.path.join(data_dir, "meta.json")) as f:
        return json.load(f)


class LMData:
    """A token stream; a row is block_size tokens from a random offset, its targets the same shifted by one."""

    def __init__(self, data_dir, split, block_size):
        self.meta, self.block_size = read_meta(data_dir), block_size
        self.tokens = np.memmap(os.path.join(data_dir, f"{split}.bin"), dtype=self.meta["dtype"], mode="r")
        if len(self.tokens) <= block_size:
            raise ValueError(f"{data_dir}/{split}.bin holds {len(self.tokens)} tokens: fewer than block_size + 1")

    def rows(self, seed, step, n):
        return np.random.default_rng([seed, step]).integers(0, len(self.tokens) - self.block_size, n)

    def eval_rows(self, n):
        return self.rows(seed=2 ** 31 - 1, step=0, n=n)  # the same n rows at every evaluation

    def batch(self, rows):
        x = np.stack([self.tokens[i:i + self.block_size] for i in rows]).astype(np.int64)
        y = np.stack([self.tokens[i + 1:i + 1 + self.block_size] for i in rows]).astype(np.int64)
        return {"idx": torch.from_numpy(x), "targets": torch.from_numpy(y)}


class ClassificationData:
    """Labelled rows, read in epochs (a fresh permutation each); a batch is padded to its own longest row."""

    def __init__(self, data_dir, split, block_size):
        self.meta, self.block_size = read_meta(data_dir), block_size
        path = os.path.join(data_dir, split)
        self.tokens = np.memmap(path + ".bin", dtype=self.meta["dtype"], mode="r")
        self.offsets, self.labels = np.load(path + ".offsets.npy"), np.load(path + ".labels.npy")
        self._epoch = (None, None)

    def __len__(self):
        return len(self.labels)

    def rows(self, seed, step, n):
        """Rows step * n ... (step + 1) * n - 1 of an endless stream of epochs, each a permutation of (seed, epoch)."""
        out = []
        for position in range(step * n, (step + 1) * n):
            epoch = position // len(self)
            if self._epoch[0] != epoch:
                self._epoch = (epoch, np.random.default_rng([seed, epoch]).permutation(len(self)))
            out.append(self._epoch[1][position % len(self)])
        return np.array(out)

    def eval_rows(self, n):
        return np.arange(min(n, len(self)))  # in order, each row once

    def batch(self, rows):
        seqs = [self.tokens[self.offsets[i]:self.offsets[i + 1]][:self.block_size] for i in rows]
        width = max(1, max(len(s) for s in seqs))
        idx = np.full((len(seqs), width), self.meta["pad_token_id"], dtype=np.int64)
        attention_mask = np.zeros((len(seqs), width), dtype=np.int64)
        for i, s in enumerate(seqs):
            idx[i, :len(s)], attention_mask[i, :len(s)] = s, 1
        return {"idx": torch.from_numpy(idx), "attention_mask": torch.from_numpy(attention_mask),
                "labels": torch.from_numpy(self.labels[rows])}


def load_split(data_dir, split, block_size):
    """The split's reader for the task that meta.json names."""
    if not os.path.exists(os.path.join(data_dir, "meta.json")):
        raise FileNotFoundError(os.path.join(data_dir, "meta.json"))
    task = read_meta(data_dir)["task"]
    return (LMData if task == "lm" else ClassificationData)(data_dir, split, block_size)
