"""LoRA adapters (Hu et al., 2021): a fine-tune that freezes its start, the base, and trains a
low-rank pair A [r, in], B [out, r] beside each target Linear; the checkpoint holds the pairs
alone and names its base by path and the sha256 of its weights file. Imported only when
lora_rank > 0, or to load such a checkpoint (merged into the base's weights: the base's speed)."""

import hashlib
import math
import os

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import nn

from lib import options
from lib.common import Error, did_you_mean
from lib.files import write_json
from lib.options import CARD_FIX, Option, checking
from model import GPT

# each block's Linears an adapter may target, by our name: GPT-2's (PEFT's) name
TARGETS = {
    "attn.qkv": "attn.c_attn",
    "attn.proj": "attn.c_proj",
    "mlp.fc": "mlp.c_fc",
    "mlp.proj": "mlp.c_proj",
}
# a card's adapter entry (lib/finetune.py writes it); sha256 is null for a GPT-2
# name the hub cache did not hold
ADAPTER = {
    "base": Option(""),
    "sha256": Option(""),
    "seed": Option(0),
    "rank": Option(1, ge=1),
    "alpha": Option(1.0, gt=0),
    "dropout": Option(0.0, ge=0, lt=1),
    "targets": Option(""),
}


class LoRALinear(nn.Module):
    """base(x) + dropout(x) A^T B^T alpha / r: B starts at zero, so the start is the base's."""

    def __init__(self, base, rank, alpha, dropout):
        super().__init__()
        self.base = base
        self.scale = alpha / rank
        self.lora_A = nn.Parameter(torch.empty(rank, base.in_features))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))  # as PEFT draws A
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        low = self.dropout(x) @ self.lora_A.t()
        return self.base(x) + (low @ self.lora_B.t()) * self.scale


def targets(cfg):
    """lora_targets as a list of TARGETS' names; one line for a name not among them."""
    names = [t.strip() for t in cfg.lora_targets.split(",") if t.strip()]
    for name in names or [cfg.lora_targets]:
        if name not in TARGETS:
            hint = did_you_mean(name, TARGETS)
            raise Error(
                f"lora_targets={cfg.lora_targets!r}: {name!r} is not a block's Linear; "
                f"name some of {', '.join(TARGETS)}, comma-separated{hint}"
            )
    return names


def check_keys(cfg, defaults):
    """train.py's rules for the lora keys (defaults: {each key: its default value})."""
    given = [
        f"{k}={getattr(cfg, k)!r}"
        for k, default in defaults.items()
        if k != "lora_rank" and getattr(cfg, k) != default
    ]
    if not cfg.lora_rank:
        raise Error(
            f"{', '.join(given)} but lora_rank=0 (no adapters): pass --lora_rank=8 (or more) "
            "to train adapters, or drop the lora keys"
        )
    if cfg.init_from == "scratch":
        raise Error(
            f"lora_rank={cfg.lora_rank} adapts a pretrained model, and init_from=scratch: pass "
            "--init_from a checkpoint folder or a GPT-2 name"
        )
    if cfg.strategy == "fsdp":
        raise Error("lora_rank > 0 trains under strategy=ddp: drop strategy=fsdp")
    targets(cfg)


def weights_file(base):
    """The file of base's weights: a folder's model.safetensors, or GPT-2's in the hub cache."""
    if os.path.isdir(base):
        return os.path.join(base, "model.safetensors")
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(f"openai-community/{base}", "model.safetensors")
    return cached if isinstance(cached, str) else None


def digest(path):
    """The sha256 of the file at path."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def named_base(init_from):
    """(the base's path as saved, its weights' sha256) of init_from."""
    base = os.path.abspath(init_from) if os.path.isdir(init_from) else init_from
    path = weights_file(base)
    return base, digest(path) if path else None


def check_adapter_card(info, path):
    """One line where the adapter entry of an adapter checkpoint's card is damaged (the
    card's model: lib/weights.py's check_card)."""
    with checking(info, path, CARD_FIX):
        options.check_keys(info, {"adapter": Option({})})
        options.check_keys(info["adapter"], ADAPTER, optional=("sha256",), where="adapter.")
        for name in targets_of(info["adapter"]):
            Option("", choices=tuple(TARGETS)).check("adapter.targets", name)


def check_base(adapter, where):
    """One line if the base an adapter names is missing or changed since it was trained."""
    base, saved = adapter["base"], adapter["sha256"]
    path = weights_file(base)
    if path is None or not os.path.isfile(path):
        raise Error(
            f"{where}: its base {base} is missing (no {path or 'model.safetensors'}): put the "
            "base back there, or train the adapter again"
        )
    if saved is not None and digest(path) != saved:
        raise Error(
            f"{where}: its base {path} changed since the adapter was trained (sha256 "
            f"{saved[:12]}... then): restore that base, or train the adapter again"
        )


def adapt(model, adapter):
    """model's weights frozen and its target Linears wrapped in LoRALinear; its state_dict then
    holds the adapters alone, and model.adapter says what they are."""
    width = model.config.n_embd
    if adapter["rank"] > width:
        raise Error(
            f"lora_rank={adapter['rank']} is above the targets' width {width} (n_embd): pass "
            f"{width} or less (a rank that high is a full fine-tune: drop lora_rank)"
        )
    model.requires_grad_(False)
    for block in model.blocks:
        for name in targets_of(adapter):
            parent, child = name.split(".")
            owner = getattr(block, parent)
            linear = getattr(owner, child)
            wrapped = LoRALinear(linear, adapter["rank"], adapter["alpha"], adapter["dropout"])
            setattr(owner, child, wrapped)
    model.adapter = adapter
    model.register_state_dict_post_hook(only_adapters)
    return model


def targets_of(adapter):
    """The target names an adapter's record lists."""
    return [t.strip() for t in adapter["targets"].split(",") if t.strip()]


def only_adapters(module, state, prefix, local_metadata):
    """A state_dict hook: the adapters' tensors alone (the base is the base's file)."""
    for name in list(state):
        if ".lora_" not in name:
            del state[name]


def load_adapters(model, tensors):
    """Copies tensors (the adapters' state) into model's adapters; one line if they do not fit."""
    own = dict(model.named_parameters())
    wanted = {name for name in own if ".lora_" in name}
    if set(tensors) != wanted or any(own[k].shape != v.shape for k, v in tensors.items()):
        raise Error("the saved adapters do not fit the model: resume with the run's lora keys")
    with torch.no_grad():
        for name, tensor in tensors.items():
            own[name].copy_(tensor)


def adapter_state(state):
    """The adapters' tensors of a trainer state's model entry, the base's left out."""
    return {name: tensor for name, tensor in state.items() if ".lora_" in name}


@torch.no_grad()
def merge(model, tensors, adapter, path):
    """W += B A alpha / r for each target Linear of model, from the adapters' tensors; one line
    naming their file, path, where they are not the pairs the card names."""
    rank, linears = adapter["rank"], {}
    for i, block in enumerate(model.blocks):
        for name in targets_of(adapter):
            parent, child = name.split(".")
            linears[f"blocks.{i}.{name}"] = getattr(getattr(block, parent), child)
    wanted = {}
    for key, linear in linears.items():
        wanted[f"{key}.lora_A"] = (rank, linear.in_features)
        wanted[f"{key}.lora_B"] = (linear.out_features, rank)
    if {k: tuple(v.shape) for k, v in tensors.items()} != wanted:
        raise Error(
            f"{path}: its tensors are not the adapters its card names (rank {rank} on "
            f"{adapter['targets']}): restore the file, or train the adapter again"
        )
    for key, linear in linears.items():
        b, a = tensors[f"{key}.lora_B"], tensors[f"{key}.lora_A"]
        linear.weight += (b @ a) * (adapter["alpha"] / rank)


def merged(out_dir, config, info, load):
    """The base with the adapters in out_dir merged into its weights; config: the card's model,
    checked; load: lib.weights.load_pretrained, the base's loader."""
    path = os.path.join(out_dir, "config.json")
    check_adapter_card(info, path)
    adapter = info["adapter"]
    check_base(adapter, path)
    source, _ = load(adapter["base"])
    torch.manual_seed(adapter["seed"])  # the fine-tune's new token rows, drawn again
    with torch.device("meta"):
        model = GPT(config)
    model.load_body(source.state_dict())
    weights = os.path.join(out_dir, "model.safetensors")
    merge(model, load_file(weights), adapter, weights)
    return model


def peft_adapter(out_dir, info):
    """(tensors, adapter_config.json) of the PEFT adapter folder for GPT2LMHeadModel on the base's
    export: PEFT's names (lora_A [r, in], lora_B [out, r] on Conv1D too); refused before a write."""
    adapter = info.get("adapter")
    if adapter is None:
        raise Error(f"--peft_dir: {out_dir} holds no LoRA adapter (train with --lora_rank)")
    tensors = load_file(os.path.join(out_dir, "model.safetensors"))
    # the base's token table: ours holds it as lm_head (tied), GPT-2's files as wte
    tables = ("lm_head.weight", "wte.weight", "transformer.wte.weight")
    with safe_open(weights_file(adapter["base"]), "pt") as f:
        held = [name for name in tables if name in f.keys()]
        base_rows = f.get_slice(held[0]).get_shape()[0] if held else None
    if base_rows is not None and base_rows != info["model"]["vocab_size"]:
        raise Error(
            f"{out_dir}: the fine-tune grew the base's token table ({base_rows} to "
            f"{info['model']['vocab_size']} rows), which a PEFT adapter cannot: export the "
            "merged model with --hf_dir"
        )
    peft = {}
    for name, tensor in tensors.items():
        block, i, parent, child, ab = name.split(".")
        hf = TARGETS[f"{parent}.{child}"]
        peft[f"base_model.model.transformer.h.{i}.{hf}.{ab}.weight"] = tensor.contiguous()
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": adapter["base"],
        "r": adapter["rank"],
        "lora_alpha": adapter["alpha"],
        "lora_dropout": adapter["dropout"],
        "target_modules": [TARGETS[t] for t in targets_of(adapter)],
        "fan_in_fan_out": True,  # GPT-2's Conv1D holds [in, out]
        "bias": "none",
        "inference_mode": True,
    }
    return peft, config


def write_peft(folder, tensors, config):
    """peft_adapter()'s files in folder: adapter_model.safetensors and adapter_config.json."""
    save_file(tensors, os.path.join(folder, "adapter_model.safetensors"), {"format": "pt"})
    write_json(os.path.join(folder, "adapter_config.json"), config)
