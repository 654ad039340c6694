"""The classifier's labelled rows, as train.py reads them, and a trained classifier at work:
loaded from its checkpoint folder (its card's labels checked), its class probabilities for token
rows batched by length, and one text's attention maps. classify.py and the playground both run
these, so the two give the same numbers."""

import os
import sys

import numpy as np
import torch
from tqdm import tqdm

from lib.common import Error
from lib.data import META_FIX, check, load_array
from lib.options import CARD_FIX, Option, check_keys, checking
from lib.prepare import Rows
from lib.weights import from_checkpoint, get_tokenizer

# a classifier's meta.json holds these besides a dataset's keys (lib/data.py's META), and its
# checkpoint's config.json besides a card's (lib/weights.py's CARD)
META = {"label_names": Option([]), "max_length": Option(1, ge=1)}


def check_label_names(names):
    """Label names (None: none), each a string that names one class only: a prediction's name
    says which class it is."""
    seen = set()
    for name in names or []:
        if not isinstance(name, str):
            raise Error(f"'label_names' holds {name!r:.40}, not a string")
        if name in seen:
            raise Error(f"'label_names' names {name!r:.40} twice")
        seen.add(name)


class ClassificationData(Rows):
    """Labelled rows, read in epochs; a batch is padded to its own longest row."""

    best = ("val/accuracy", "max")
    labelled = True
    unit = "ex"  # the speed counts examples
    task = "classify"

    def __init__(self, path, n, block_size, meta):
        """path: the split's files, less their extensions; n: its rows, as meta.json says."""
        with checking(meta, os.path.join(os.path.dirname(path), "meta.json"), META_FIX):
            pad = Option(0, ge=0, lt=meta["vocab_size"])
            check_keys(meta, {**META, "pad_token_id": pad})
            check_label_names(meta["label_names"])
        super().__init__(path, n, meta)
        self.block_size = block_size
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


def pad_batch(rows, pad_token_id):
    """Token id lists -> (idx [B, width], attention_mask [B, width]: 1 real, 0 padding)."""
    width = max(1, max(len(r) for r in rows))
    idx = np.full((len(rows), width), pad_token_id, dtype=np.int64)
    attention_mask = np.zeros_like(idx)
    for i, r in enumerate(rows):
        idx[i, : len(r)] = r
        attention_mask[i, : len(r)] = 1
    return torch.from_numpy(idx), torch.from_numpy(attention_mask)


def load(out_dir, device, info=None):
    """(model, tokenizer, label names, max tokens per text) from a checkpoint folder; info: its
    config.json already read."""
    if info is None and not os.path.isfile(os.path.join(out_dir, "config.json")):
        raise Error(
            f"no checkpoint in {out_dir!r}: "
            "train one with `python train.py config/agnews.py`, or pass --out_dir"
        )
    model, info = from_checkpoint(out_dir, device, info)
    if info["architecture"] != "EncoderClassifier":
        raise Error(
            f"{out_dir!r} holds a {info['architecture']} (task {info.get('task')!r}), "
            f"not a classifier: for a GPT use sample.py --out_dir {out_dir}"
        )
    n_classes = model.config.n_classes
    where = os.path.join(out_dir, "config.json")
    with checking(info, where, CARD_FIX):
        check_keys(info, META, optional=tuple(META))
        names = info.get("label_names")
        check_label_names(names)
        if names is not None and len(names) != n_classes:
            raise Error(f"'label_names' names {len(names)} classes, the model has {n_classes}")
        # every id the model reads, padding's too, indexes its embedding rows
        pad = Option(0, ge=0, lt=model.config.vocab_size)
        pad.check("model.pad_token_id", model.config.pad_token_id)
    tokenizer = get_tokenizer(info.get("tokenizer"), where, model.config.vocab_size)
    names = names or [str(i) for i in range(n_classes)]
    return model, tokenizer, names, min(info.get("max_length") or 10**9, model.config.block_size)


@torch.no_grad()
def predict(model, rows, batch_size, device):
    """Class probabilities [len(rows), n_classes], in the rows' order. Rows go in sorted by length,
    so each batch pads little (to its longest row)."""
    probs = torch.empty(len(rows), model.config.n_classes)
    lengths = [len(row) for row in rows]
    order = sorted(range(len(rows)), key=lengths.__getitem__)
    chunks = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    for chunk in tqdm(
        chunks, desc="classifying", unit="batch", file=sys.stderr, disable=len(chunks) < 2
    ):
        idx, mask = pad_batch([rows[i] for i in chunk], model.config.pad_token_id)
        probs[chunk] = torch.softmax(
            model(idx.to(device), mask.to(device))[0].float(), dim=-1
        ).cpu()
    return probs


@torch.no_grad()
def attention_maps(model, row, device):
    """One text's class probabilities [n_classes] and its attention maps: per layer [n_head, n, n],
    queries by keys, float32 on the CPU (the explicit attention path, which returns its weights),
    NaN where the model's pattern masks the pair."""
    idx, mask = pad_batch([row], model.config.pad_token_id)
    logits, _, maps = model(idx.to(device), mask.to(device), need_weights=True)
    maps = [m[0].float().cpu() for m in maps]
    if model.pattern is not None:
        hidden = ~model.pattern.dense(len(row), "cpu")
        maps = [m.masked_fill(hidden, float("nan")) for m in maps]
    return torch.softmax(logits[0].float(), -1).cpu(), maps
