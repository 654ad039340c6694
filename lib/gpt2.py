"""GPT-2's weights in the Hugging Face layout, from a folder or the hub, read into a GPT; its
config.json checked as a checkpoint's is (lib/options.py)."""

import os

import torch
from safetensors.torch import load_file

from lib.common import Error, check_regular, read_json
from lib.options import (
    GPT2_NAMES,
    Option,
    check_keys,
    check_shapes,
    check_tokenizer,
    checking,
)
from model import GPT, GPTConfig

# the names of GPT-2's modules in the Hugging Face layout -> ours
HF_MODULES = {"h": "blocks", "c_attn": "qkv", "c_proj": "proj", "c_fc": "fc"}
# each shape key's name in a Hugging Face GPT-2 config.json
HF_NAMES = {
    "vocab_size": "vocab_size",
    "block_size": "n_positions",
    "n_layer": "n_layer",
    "n_head": "n_head",
    "n_embd": "n_embd",
}
# GPTConfig's gelu by its activation_function (GPT-2's, the default, is tanh's)
HF_GELU = {"gelu_new": "tanh", "gelu": "none"}


def from_pretrained(name_or_dir):
    """A GPT of GPT-2's weights in the Hugging Face layout: a folder, or one of GPT2_NAMES from
    the hub."""
    path = name_or_dir
    if not os.path.isdir(path):
        if name_or_dir not in GPT2_NAMES:
            raise Error(
                f"{name_or_dir!r} is neither a directory nor one of {', '.join(GPT2_NAMES)}"
            )
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError

        repo = f"openai-community/{name_or_dir}"
        try:
            path = snapshot_download(repo, allow_patterns=["model.safetensors", "config.json"])
        # offline (HF_HUB_OFFLINE or no network) and not in the cache: hub's message is two lines
        except LocalEntryNotFoundError:
            raise Error(
                f"{name_or_dir}: the Hugging Face hub could not be reached and {repo} is not in "
                "its cache: pass --init_from a folder of its model.safetensors + config.json "
                f"(the Hugging Face layout, from huggingface.co/{repo})"
            ) from None
    config_path = os.path.join(path, "config.json")
    hf = read_json(config_path, "Hugging Face config")
    weights = os.path.join(path, "model.safetensors")
    check_regular(weights)
    try:
        loaded = load_file(weights)
    except Exception as e:
        raise Error(
            f"{path} is not a GPT-2 checkpoint in the Hugging Face layout ({type(e).__name__}: {e})"
        ) from None
    state = {}
    for key in list(loaded):
        # dropped from the loaded dict as it moves: one copy at a time
        tensor = loaded.pop(key)
        if key.endswith((".attn.bias", ".attn.masked_bias")) or key == "lm_head.weight":
            continue  # causal-mask buffers older transformers saved; the head is tied to wte
        parts = key.removeprefix("transformer.").split(".")
        key = ".".join(HF_MODULES.get(part, part) for part in parts)
        # GPT-2 was written with Conv1D, whose weight is [in, out]; Linear's is [out, in]
        if key.endswith(("qkv.weight", "proj.weight", "fc.weight")):
            tensor = tensor.t().contiguous()
        state[key] = tensor
    config = check_hf(hf, config_path, {name: tensor.shape for name, tensor in state.items()})
    with torch.device("meta"):  # the model takes the loaded tensors: one copy in memory
        model = GPT(config)
    return model.load_weights(state)


def check_hf(hf, path, shapes):
    """A Hugging Face GPT-2 config.json -> its GPTConfig, checked as check_card's."""
    with checking(hf, path, "not a GPT-2 config.json that fits the model.safetensors beside it"):
        check_keys(hf, dict.fromkeys(HF_NAMES.values(), Option(1, ge=1)))
        check_shapes(shapes, {key: (name, hf.get(name)) for key, name in HF_NAMES.items()})
        check_tokenizer(hf.get("tokenizer"))
        gelu = Option("gelu_new", choices=tuple(HF_GELU))
        check_keys(hf, {"activation_function": gelu}, ("activation_function",))
        shape = {key: hf[name] for key, name in HF_NAMES.items()}
        gelu = HF_GELU[hf.get("activation_function", "gelu_new")]
        return GPTConfig(**shape, bias=True, gelu=gelu)
