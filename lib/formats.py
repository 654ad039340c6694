"""The formats a GPT's weights decode in: float32, bfloat16, oneDNN's packed layout, int8
(weight-only, as gpt-fast's, a scale per output channel) and int8_dynamic (int8 x int8, as
llama.cpp's Q8_0)."""

import warnings
from weakref import WeakValueDictionary

import torch
import torch.nn as nn

from lib.common import Error, native_bf16
from lib.options import Option

WEIGHTS = ("auto", "float32", "bfloat16", "int8", "int8_dynamic")
# the scripts' --weights and --device (sample.py, serve.py, classify.py, bench/)
WEIGHTS_OPTION = Option(
    "auto",
    "the format a GPT's weights decode in: auto on a CPU is the fastest here, timed on the model "
    "at its first use and remembered (lib/autotune.py); on a GPU bfloat16 where it multiplies it "
    "natively (compute capability 8.0+), else float32",
    choices=WEIGHTS,
)


def for_decoding(model, device, weights="auto"):
    """The model in eval mode on device, its weights stored once, in one format."""
    model = model.to(device).eval()
    if weights == "auto" and torch.device(device).type == "cpu":
        from lib.autotune import decoding_weights

        weights = decoding_weights(model, WEIGHTS[1:], for_decoding)
    weights = resolve_weights(weights, device)
    model.weights_format = weights  # for the scripts' lines
    if weights == "bfloat16":
        head = model.lm_head.weight.detach().float()
        model.to(torch.bfloat16)
        # float32 logits: in bfloat16 near ones round to ties
        model.lm_head.weight = nn.Parameter(head, requires_grad=False)
    if weights == "int8":
        replace_linears(model, Int8Linear)
    elif weights == "int8_dynamic":
        replace_linears(model, DynamicInt8Linear)
    elif torch.device(device).type == "cpu" and onednn_multiplies(weights):
        replace_linears(model, PackedLinear)  # with bfloat16, its float32 head
    return model


def resolve_weights(weights, device):
    """auto without a model to time (for_decoding times one on a CPU): bfloat16 where native_bf16;
    on other CPUs int8, whose products read a quarter of float32's bytes; float32 elsewhere."""
    if weights == "int8_dynamic" and torch.device(device).type != "cpu":
        raise Error("weights=int8_dynamic multiplies on a CPU only: use int8 or bfloat16 here")
    if weights != "auto":
        return weights
    if native_bf16(device):
        return "bfloat16"
    return "int8" if torch.device(device).type == "cpu" else "float32"


class PackedLinear(nn.Module):
    """A Linear in oneDNN's blocked layout for this CPU, packed once: no reorder a call."""

    ROWS = 8  # the layout suits this many rows at a time; any number multiplies

    def __init__(self, linear):
        super().__init__()
        packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), self.ROWS)
        # one copy, opaque: a tied head packs its own and the token table stays for lookups
        self.register_buffer("packed", packed, persistent=False)
        self.bias = linear.bias

    def forward(self, x):
        if torch.compiler.is_compiling():
            return packed_linear(x, self.packed, self.bias)
        # eager, the function itself: the op's dispatch adds to every call
        return onednn_linear(x, self.packed, self.bias)


def onednn_linear(x, packed, bias):
    """x [..., in] by the packed weight [out, in] -> [..., out], plus bias."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


# the ops a compiled step calls, their kernels Python functions the dispatcher runs as they are:
# no torch.library.custom_op, whose wrapper costs 5.7 us a call (a GPT-2 token makes 49)
OPS = torch.library.Library("gpt", "FRAGMENT")


def compiler_op(schema, kernel, shape):
    """kernel as the op gpt::schema, shape (the output's, for tracing) its fake."""
    name = OPS.define(schema)
    # every backend's kernel: a packed weight is an MkldnnCPU tensor, not a CPU one
    OPS.impl(name, kernel, "CompositeExplicitAutograd")
    torch.library.register_fake(f"gpt::{name}", shape)
    return getattr(torch.ops.gpt, name).default


def packed_linear_shape(x, packed, bias):
    """packed_linear's output, empty."""
    return x.new_empty(*x.shape[:-1], packed.size(0))


# onednn_linear as an op the compiler calls, not lowers
packed_linear = compiler_op(
    "packed_linear(Tensor x, Tensor packed, Tensor? bias) -> Tensor",
    onednn_linear,
    packed_linear_shape,
)


def onednn_multiplies(weights):
    """Whether oneDNN multiplies the format on this CPU."""
    if not torch.backends.mkldnn.is_available():
        return False
    return weights == "float32" or torch.ops.mkldnn._is_mkldnn_bf16_supported()  # AVX-512


def replace_linears(model, kind):
    """Every Linear of the model replaced by kind(linear)."""
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, nn.Linear):
                setattr(module, name, kind(child))


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
        if torch.compiler.is_compiling() and flat.size(0) == 1 and flat.is_cpu:
            y = fused_row_products(flat, self.weight_int8, self.scales)
        else:
            y = torch._weight_int8pack_mm(flat, self.weight_int8, self.scales)
        y = y.view(*x.shape[:-1], y.size(-1)).to(x.dtype)
        return y if self.bias is None else y + self.bias


def fused_row_products(row, weight, scales):
    """_weight_int8pack_mm's math for one row [1, in], as sums inductor fuses: each int8 weight
    read once and widened in registers, 1.5x its kernel's speed in a compiled step."""
    # a float32 buffer: inlined, the row's producer (a norm) would be recomputed, and the row
    # widened, for every output
    row = row.float()
    row = torch.ops.prims.inductor_force_stride_order(row, row.stride())
    sums = (row * weight.float()).sum(-1, keepdim=True)  # [out, 1]
    return sums.T * scales.float()  # [1, out]


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
        # the compiled op's handle on it: an opaque object is no argument of a custom op
        self.key = id(self)
        DYNAMIC_INT8[self.key] = self

    def __setstate__(self, state):
        """A copy (copy.deepcopy, pickle) under a key of its own: its original may go."""
        super().__setstate__(state)
        self.key = id(self)
        DYNAMIC_INT8[self.key] = self

    def forward(self, x):
        if torch.compiler.is_compiling():
            return dynamic_int8_linear(x, self.key, self.out_features)
        return int8_products(x, self.packed)


# the DynamicInt8Linears alive, by key
DYNAMIC_INT8 = WeakValueDictionary()


def int8_products(x, packed):
    """x [..., in] by packed int8 weights -> [..., out] in x's dtype, x quantized per call."""
    # torch asks each argument for __torch_function__; packed, a TorchScript object, answers
    # by a C++ exception, 9 us a call. No argument here has one: the asking is off
    with torch._C.DisableTorchFunctionSubclass():
        # 7-bit inputs (reduce_range): products of 8-bit ones overflow AVX2's 16-bit sums
        return torch.ops.quantized.linear_dynamic(x.float(), packed, True).to(x.dtype)


def keyed_int8_products(x, key, out_features):
    """int8_products by the packed weights of the DynamicInt8Linear under key."""
    return int8_products(x, DYNAMIC_INT8[key].packed)


def keyed_int8_shape(x, key, out_features):
    """dynamic_int8_linear's output, empty."""
    return x.new_empty(*x.shape[:-1], out_features)


# int8_products as an op the compiler calls around its own kernels
dynamic_int8_linear = compiler_op(
    "dynamic_int8_linear(Tensor x, int key, int out_features) -> Tensor",
    keyed_int8_products,
    keyed_int8_shape,
)
