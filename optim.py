"""The optimizers: AdamW for every parameter, or Muon (muon.py, imported only then) for the
blocks' matrices and AdamW for the rest. The learning-rate schedule is train.py's."""

import torch

from lib.common import native_bf16


def configure_optimizers(model, weight_decay, learning_rate, betas, device_type, optimizer="adamw"):
    """adamw: AdamW, matrices and embeddings decayed, biases and gains not, plus the model's
    optimizer_groups(); muon: Muon at AdamW's update size for the blocks' 2-D weights."""
    muon = optimizer == "muon"
    hidden = [p for p in model.blocks.parameters() if muon and p.requires_grad and p.dim() == 2]
    own = model.optimizer_groups()
    taken = {*hidden, *(p for group in own for p in group["params"])}
    rest = [p for p in model.parameters() if p.requires_grad and p not in taken]
    groups = [
        {"params": [p for p in rest if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in rest if p.dim() < 2], "weight_decay": 0.0},
        *own,
    ]
    # fused: each tensor's whole update in one kernel, one pass over its memory
    fused = device_type in ("cuda", "cpu")
    optimizers = [torch.optim.AdamW(groups, lr=learning_rate, betas=betas, fused=fused)]
    if hidden:
        from muon import Muon

        dtype = torch.bfloat16 if native_bf16(device_type) else torch.float32
        optimizers.append(Muon(hidden, learning_rate, weight_decay, dtype))
    return optimizers
