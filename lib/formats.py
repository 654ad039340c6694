"""The formats a GPT's weights decode in, stored once: float32, bfloat16 (the head kept float32,
for float32 logits) and int8 (weight-only, per-output-channel scales, as gpt-fast's quantize.py);
on a CPU the float32 and bfloat16 products run on oneDNN's packed layout (PackedLinear)."""

import torch
import torch.nn as nn

from lib.common import Error, native_bf16

WEIGHTS = ("auto", "float32", "bfloat16", "int8")


def for_decoding(model, device, weights="auto"):
    """The model in eval mode on device, its weights stored once in the format that decodes
    fastest there (resolve_weights; bfloat16 keeps the head in float32, for float32 logits), on
    a CPU in oneDNN's layout (PackedLinear); int8 (weight-only, per-output-channel scales) where
    asked."""
    if weights not in WEIGHTS:
        raise Error(f"weights must be one of {', '.join(WEIGHTS)}, got {weights!r}")
    model = model.to(device).eval()
    weights = resolve_weights(weights, device)
    if weights == "bfloat16":
        head = model.lm_head.weight.detach().float()
        model.to(torch.bfloat16)
        model.lm_head.weight = nn.Parameter(head, requires_grad=False)
    if weights == "int8":
        replace_linears(model, Int8Linear)
    elif torch.device(device).type == "cpu" and onednn_multiplies(weights):
        replace_linears(model, PackedLinear)  # with bfloat16, its float32 head
    return model


def resolve_weights(weights, device):
    """auto: bfloat16 where native_bf16 (train.py's dtype=auto rule), float32 elsewhere."""
    if weights != "auto":
        return weights
    return "bfloat16" if native_bf16(device) else "float32"


class Int8Linear(nn.Module):
    """A Linear with int8 weights and one bfloat16 scale per output channel (weight-only, as
    gpt-fast's int8): activations in bfloat16 through torch's int8-weight kernel, the output in
    the input's dtype."""

    def __init__(self, linear):
        super().__init__()
        weight = linear.weight.detach().float()
        scales = weight.abs().amax(dim=1).clamp(min=1e-8) / 127
        quantized = torch.round(weight / scales[:, None]).clamp(-128, 127)
        self.register_buffer("weight_int8", quantized.to(torch.int8))
        self.register_buffer("scales", scales.to(torch.bfloat16))
        self.bias = linear.bias

    def forward(self, x):
        flat = x.reshape(-1, x.size(-1)).to(torch.bfloat16)
        y = torch._weight_int8pack_mm(flat, self.weight_int8, self.scales)
        y = y.view(*x.shape[:-1], y.size(-1)).to(x.dtype)
        return y if self.bias is None else y + self.bias


class PackedLinear(nn.Module):
    """A Linear whose weight is stored once in oneDNN's blocked layout for this CPU's vector unit
    (the layout inductor's frozen CPU graphs use), its products oneDNN's: on some CPUs they read
    the weights faster than torch's F.linear (MKL), at any batch size (BENCHMARKS.md).
    The layout is chosen for ROWS rows at a time; any number multiplies."""

    ROWS = 8

    def __init__(self, linear):
        super().__init__()
        weight = linear.weight.detach()
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, self.ROWS)
        # one copy, opaque: a tied head packs its own and the token table stays for lookups
        self.register_buffer("packed", packed, persistent=False)
        self.bias = linear.bias

    def forward(self, x):
        if torch.compiler.is_compiling():
            return packed_linear(x, self.packed, self.bias)
        # eager, the op itself: the custom op's Python wrapper adds to every call
        return onednn_linear(x, self.packed, self.bias)


def onednn_linear(x, packed, bias):
    """x [..., in] by the packed weight [out, in] -> [..., out], plus bias."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


@torch.library.custom_op("gpt::packed_linear", mutates_args=())
def packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """onednn_linear as an op the compiler calls as it is (it cannot lower the packed layout)."""
    return onednn_linear(x, packed, bias)


@packed_linear.register_fake
def packed_linear_shape(x, packed, bias):
    """The output's shape and dtype, for the compiler's tracing."""
    return x.new_empty(*x.shape[:-1], packed.size(0))


def onednn_multiplies(weights):
    """Whether this torch's oneDNN multiplies the format on this CPU (bfloat16 needs AVX-512)."""
    if not torch.backends.mkldnn.is_available():
        return False
    return weights == "float32" or torch.ops.mkldnn._is_mkldnn_bf16_supported()


def replace_linears(model, kind):
    """Every Linear of the model (the blocks' and the head) replaced by kind(linear)."""
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, nn.Linear):
                setattr(module, name, kind(child))
