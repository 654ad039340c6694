"""int8 weights for decoding (weights=int8): weight-only, as gpt-fast's, a scale per output
channel."""

import warnings

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


class DynamicInt8Linear(nn.Module):
    """A Linear with int8 weights, a float scale per output channel, whose inputs are quantized to
    8 bits at each call (one scale over the call's rows): int8 x int8 products (VNNI where the CPU
    has it), as llama.cpp's Q8_0. weights=int8_dynamic."""

    def __init__(self, linear):
        super().__init__()
        weight = linear.weight.detach().float()
        scales = weight.abs().amax(dim=1).clamp(min=1e-8) / 127
        zeros = torch.zeros(len(scales), dtype=torch.long)
        with warnings.catch_warnings():  # torch deprecates quantized tensors; its kernel takes one
            warnings.filterwarnings("ignore", "torch.quantize_per_tensor")
            quantized = torch.quantize_per_channel(weight, scales.double(), zeros, 0, torch.qint8)
        bias = None if linear.bias is None else linear.bias.detach().float()
        # fbgemm's (or oneDNN's) packed form for this CPU; opaque, in no state_dict
        self.packed = torch.ops.quantized.linear_prepack(quantized, bias)
        self.out_features, self.in_features = weight.shape

    def forward(self, x):
        # 7-bit inputs (reduce_range): products of 8-bit ones overflow AVX2's 16-bit sums
        return torch.ops.quantized.linear_dynamic(x.float(), self.packed, True).to(x.dtype)
