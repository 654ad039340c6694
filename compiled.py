"""--compile's module (sample.py's, serve.py's): a GPT engine's one-token step compiled at the
start, before any request is timed (gpt-fast's decode). Only an engine made with compile imports
it."""

import os
import tempfile
import warnings

import torch

from cache import KVCache
from decoding import NextToken, Options
from lib.common import compiling

ADVICE = "drop --compile, or install a C++ compiler"


def warm_up(engine, rows):
    """Compiles engine's one-token step: ahead of time where ahead_of_time(engine), else by
    throwaway requests of one row and of all."""
    if ahead_of_time(engine):
        with compiling(ADVICE):
            engine.one_token = OneRowStep(engine)
        return
    # on a CPU inductor's C++ wrapper: no Python between the step's kernels and ops
    cpp = dict(cpp_wrapper=engine.device.type == "cpu")
    engine.one_token = torch.compile(engine.model, dynamic=True, options=cpp)
    greedy = NextToken(Options(), greedy=True)
    with compiling(ADVICE):
        for size in (1, rows):
            engine.submit([0], [greedy] * size, 2)
            while engine.busy():
                engine.step()


def ahead_of_time(engine):
    """Whether the step is OneRowStep (1.2 to 1.7x Dynamo's, BENCHMARKS.md): an engine that
    allows it, of one KVCache slot of over 2 positions (a smaller one's step would specialize),
    int8 weights on a CPU (as measured: int8_dynamic's and oneDNN's packed weights are objects
    torch.export cannot trace), no pattern."""
    model = engine.model
    int8 = getattr(model, "weights_format", None) == "int8"
    cache = engine.cache
    one_row = engine.use_cache and type(cache) is KVCache and len(cache.lengths) == 1
    allowed = engine.AHEAD_OF_TIME and engine.block_size > 2 and model.pattern is None
    return allowed and one_row and int8 and engine.device.type == "cpu"


class OneRow(KVCache):
    """What KVCache.step readies for its one row at position n_keys - 1, from tensors: the
    number of keys the size of key_positions, which the exported step keeps symbolic."""

    def __init__(self, kv, positions, key_positions):
        self.kv = [kv[i : i + 2] for i in range(0, len(kv), 2)]  # (keys, values) per layer
        self.positions = positions  # [1, 1]
        self.key_positions = key_positions  # (keys,)
        self.n_keys = key_positions.size(0)
        self.start = self.n_keys - 1
        self.read = slice(None)
        self.unmasked = True


class Step(torch.nn.Module):
    """The model's one-token step over a one-row cache given as tensors: what export traces."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, idx, positions, key_positions, kv):
        cache = OneRow(kv, positions, key_positions)
        return self.model(idx, cache=cache, logits_to_keep=1)[0]  # (1, 1, vocab)


class OneRowStep:
    """A one-slot engine's step exported and compiled ahead of time by AOTInductor: a C++ call
    with no Python and no guards between tokens, holding the GIL. Its weights are the model's
    tensors at the start, shared, not copied: a change in place is decoded with, a tensor
    replaced or a model put in training is not. Its cache is the engine's."""

    def __init__(self, engine):
        self.kv = [t for layer in engine.cache.kv for t in layer]
        step = Step(engine.model)
        # an example token at position 1: two keys, of 2 to block_size (export fails where the
        # step would specialize: the library checks no input's size)
        example = (torch.tensor([[0]]), torch.tensor([[1]]), torch.arange(2), self.kv)
        keys = torch.export.Dim("keys", min=2, max=engine.block_size)
        shapes = (None, None, {0: keys}, [None] * len(self.kv))
        with torch.no_grad():
            exported = torch.export.export(step, example, dynamic_shapes=shapes)
        configs = {"aot_inductor.package_constants_in_so": False}
        with tempfile.TemporaryDirectory() as folder, warnings.catch_warnings():
            # torch's own copy of the graph warns of a deprecation inside torch
            warnings.filterwarnings("ignore", ".*LeafSpec", FutureWarning)
            path = os.path.join(folder, "step.pt2")
            torch._inductor.aoti_compile_and_package(
                exported, package_path=path, inductor_configs=configs
            )
            runner = torch._inductor.aoti_load_package(path)
        held = dict(step.named_parameters()) | dict(step.named_buffers())
        # the library reads them by address: held here, alive while it is
        self.weights = {name: held[name].data for name in runner.get_constant_fqns()}
        runner.load_constants(self.weights, check_full_update=True, user_managed=True)
        self.run = runner.loader.boxed_run  # the call without its Python packet

    def __call__(self, idx, cache, logits_to_keep):
        """The model's (logits, loss) for idx [1, 1] at cache's step."""
        (logits,) = self.run([idx, cache.positions, cache.key_positions, *self.kv])
        return logits, None
