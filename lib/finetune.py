"""A fine-tune's start (init_from a checkpoint folder or GPT-2): the pretrained GPT's body and
shape, its context cut to the run's block_size, its token table grown for new tokens."""

import sys

import torch

from lib.checkpoint import SHAPE
from lib.common import Error
from lib.weights import load_pretrained

# the SHAPE keys a fine-tune may set apart from its start's: a shorter context, more tokens
RESIZED = ("block_size", "vocab_size")


def pretrained_body(cfg, vocab_size, given):
    """(the state, the shape) of a fine-tune's start, the GPT in cfg.init_from: its SHAPE keys,
    its context cut to cfg.block_size, its token table grown to vocab_size (a chat fine-tune's
    tokens). given: the keys the command set, refused where they differ from the start's."""
    source, info = load_pretrained(cfg.init_from)
    if info["architecture"] != "GPT":
        raise Error(
            f"init_from={cfg.init_from!r} holds an {info['architecture']}, not a GPT to start from"
        )
    config = source.config
    shape = {k: getattr(config, k) for k in SHAPE if hasattr(config, k)}
    differ = [
        f"{k}={getattr(cfg, k)!r} (its {v!r})"
        for k, v in shape.items()
        if k in given and k not in RESIZED and getattr(cfg, k) != v
    ]
    if differ:
        raise Error(
            f"init_from={cfg.init_from!r}: a fine-tune computes as its start, and the command "
            f"names {', '.join(differ)}: drop those keys, or train from scratch"
        )
    shape["block_size"] = min(cfg.block_size, config.block_size)
    shape["vocab_size"] = max(config.vocab_size, vocab_size)
    torch.manual_seed(cfg.seed)  # the new rows' draws
    return grown(source.state_dict(), shape["vocab_size"]), shape


def grown(state, rows):
    """state with its token table grown to rows, each new row drawn from the old rows'
    mean and spread (as Hugging Face's resize_token_embeddings draws them)."""
    table = state["wte.weight"]
    if rows == len(table):
        return state
    print(f"the token table grows from {len(table)} to {rows} rows", file=sys.stderr)
    mean, std = table.mean(0), table.std(0)
    new = torch.normal(mean.expand(rows - len(table), -1), std)
    return {**state, "wte.weight": torch.cat([table, new])}
