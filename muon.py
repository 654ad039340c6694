"""Muon: momentum orthogonalised by Newton-Schulz iterations, for the blocks' matrices
(optimizer=muon); torch's, in the dtype the device multiplies fast."""

import torch
from torch.optim._muon import _adjust_lr


def orthogonalize(g, dtype, coefficients, steps, eps):
    """Muon's Newton-Schulz iterations: g's nearest semi-orthogonal matrix, roughly."""
    a, b, c = coefficients
    tall = g.size(0) > g.size(1)
    x = g.to(dtype).mT if tall else g.to(dtype)
    x = x / x.norm().clamp(min=eps)  # spectral norm <= 1
    for _ in range(steps):
        gram = x @ x.mT
        poly = torch.addmm(gram, gram, gram, beta=b, alpha=c)
        x = torch.addmm(x, poly, x, beta=a)
    return x.mT if tall else x


class Muon(torch.optim.Muon):
    """torch's Muon (Nesterov, AdamW's update size) orthogonalising in dtype: its bfloat16 where
    the device multiplies it natively, float32 where bfloat16 is emulated."""

    def __init__(self, params, lr, weight_decay, dtype):
        super().__init__(params, lr, weight_decay, adjust_lr_fn="match_rms_adamw")
        self.dtype = dtype

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            lr = group["lr"]
            momentum = group["momentum"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                buf = self.state[p].setdefault("momentum_buffer", torch.zeros_like(p))
                buf.lerp_(p.grad, 1 - momentum)
                update = p.grad.lerp(buf, momentum)
                ns = (group["ns_coefficients"], group["ns_steps"], group["eps"])
                update = orthogonalize(update, self.dtype, *ns)
                p.mul_(1 - lr * group["weight_decay"])
                # the update's size by torch's rule of adjust_lr_fn (match_rms_adamw: AdamW's)
                p.add_(update, alpha=-_adjust_lr(lr, group["adjust_lr_fn"], p.shape))
