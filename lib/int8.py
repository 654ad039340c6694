"""int8 weights for decoding (weights=int8): weight-only, as gpt-fast's, a scale per output
channel."""

import torch
import torch.nn as nn


class Int8Linear(nn.Module):
    """A Linear with int8 weights, a bfloat16 scale per output channel."""

    # the CPU kernel reads rows 16 inputs at a time, aligned (8 on AVX2): zeros pad them
    ALIGN = 16

    def __init__(self, linear):
        super().__init__()
        weight = linear.weight.detach().float()
        scales = weight.abs().amax(dim=1).clamp(min=1e-8) / 127
        quantized = torch.round(weight / scales[:, None]).clamp(-128, 127)
        quantized = nn.functional.pad(quantized, (0, -weight.size(1) % self.ALIGN))
        self.register_buffer("weight_int8", quantized.to(torch.int8))
        self.register_buffer("scales", scales.to(torch.bfloat16))
        self.bias = linear.bias

    def forward(self, x):
        flat = x.reshape(-1, x.size(-1)).to(torch.bfloat16)
        # a new, aligned tensor, its rows padded as the weight's
        flat = nn.functional.pad(flat, (0, self.weight_int8.size(1) - x.size(-1)))
        y = torch._weight_int8pack_mm(flat, self.weight_int8, self.scales)
        y = y.view(*x.shape[:-1], y.size(-1)).to(x.dtype)
        return y if self.bias is None else y + self.bias
