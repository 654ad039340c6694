"""The model over torchrun's processes (DDP's wrapper, FSDP's shards) and activation
checkpointing; imported only under torchrun or with activation_checkpointing."""

import functools

import torch
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.checkpoint import checkpoint


def wrapped(model, run, checkpointing):
    """The model as the loop calls it: DDP's wrapper, or itself sharded (FSDP); with checkpointing,
    its blocks' activations recomputed in the backward pass."""
    if checkpointing:
        recompute_blocks(model)
    if run.sharded:
        return shard(model, run)
    model.to(run.device)
    if not run.distributed:
        return model
    # DDP's device_ids: this process's GPU, none on CPUs
    gpu = [run.device] if run.device_type == "cuda" else None
    return DDP(model, device_ids=gpu)


def shard(model, run):
    """FSDP2: each Block, then the rest, split by rows over the processes. Returns the model."""
    # imported here: a second at every start otherwise
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(run.device_type, (run.world_size,))
    # gathered in the autocast dtype, reduced in float32 as DDP's; the shards stay float32
    policy = MixedPrecisionPolicy(param_dtype=getattr(torch, run.dtype), reduce_dtype=torch.float32)
    for block in model.blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy)
    return fully_shard(model, mesh=mesh, mp_policy=policy)


def unsharded(model, state):
    """A plain copy of a sharded model (fully_shard made its class FSDPGPT of GPT) holding
    state, its gathered weights."""
    from torch.distributed.fsdp import FSDPModule

    plain = next(c for c in type(model).__mro__ if not issubclass(c, FSDPModule))
    with torch.device("meta"):
        copy = plain(model.config)
    return copy.load_weights(state)


def recompute_blocks(model):
    """Activation checkpointing, set on each Block's instance: the state dict's names stay."""
    for block in model.blocks:
        block.forward = functools.partial(recomputed, block, block.forward)


def recomputed(block, forward, *args, **kwargs):
    """forward, checkpointed in training with gradients."""
    if not block.training or not torch.is_grad_enabled():
        return forward(*args, **kwargs)
    # non-reentrant: it restores the random state, so dropout draws the same masks
    return checkpoint(forward, *args, use_reentrant=False, **kwargs)
