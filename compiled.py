"""--compile's module (sample.py's, serve.py's): a GPT engine's one-token step compiled at the
start, before any request is timed (gpt-fast's decode). Only an engine made with compile imports
it."""

import torch

from decoding import NextToken, Options
from lib.common import compiling


def warm_up(engine, rows):
    """Compiles engine's one-token step by throwaway requests of one row and of all."""
    # on a CPU inductor's C++ wrapper: no Python between the step's kernels and ops
    cpp = dict(cpp_wrapper=engine.device.type == "cpu")
    engine.one_token = torch.compile(engine.model, dynamic=True, options=cpp)
    greedy = NextToken(Options(), greedy=True)
    with compiling("drop --compile, or install a C++ compiler"):
        for size in (1, rows):
            engine.submit([0], [greedy] * size, 2)
            while engine.busy():
                engine.step()
