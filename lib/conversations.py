"""A chat fine-tune's data (data/chat/prepare.py): conversations of different lengths, read in
epochs as a classifier's rows are, each a row padded to its batch's longest; the loss learns only
the tokens the mask marks, the assistant's."""

import os

import numpy as np
import torch

from lib.batches import LMData, check, load_array
from lib.common import Error
from lib.labelled import ClassificationData, read_rows


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
