"""A trained classifier at work: loaded from its checkpoint folder, its class probabilities for
token rows batched by length, and one text's attention maps. classify.py and the playground both
run these, so the two give the same numbers."""

import os
import sys

import torch
from tqdm import tqdm

from lib.card import CARD_FIX, checking
from lib.common import Error
from lib.data import pad_batch
from lib.options import Option
from lib.weights import from_checkpoint, get_tokenizer


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
    names = info.get("label_names") or [str(i) for i in range(model.config.n_classes)]
    # every id the model reads, padding's too, indexes its embedding rows
    where = os.path.join(out_dir, "config.json")
    tokenizer = get_tokenizer(info.get("tokenizer"), where, model.config.vocab_size)
    with checking(info, where, CARD_FIX):
        pad = Option(0, ge=0, lt=model.config.vocab_size)
        pad.check("model.pad_token_id", model.config.pad_token_id)
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
