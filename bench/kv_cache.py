"""Generation with and without the KV cache: greedy tokens/s of the shakespeare_char GPT's shape."""

import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from bench.timing import rates, table, timed, two
from decoding import NextToken, Options
from engine import Engine
from model import GPT, GPTConfig


def bench_generate(device, new_tokens, use_cache, repeats):
    """Greedy decoding of new_tokens from a 1-token prompt, float32, the shakespeare_char GPT
    shape."""
    torch.manual_seed(0)
    model = (
        GPT(GPTConfig(vocab_size=65, block_size=256, n_layer=6, n_head=6, n_embd=384, bias=True))
        .to(device)
        .eval()
    )
    greedy = NextToken(Options(), greedy=True)

    def run(n):
        engine = Engine(model, 1, use_cache)
        engine.submit([0], [greedy], n)
        while engine.busy():
            engine.step()

    r = timed(lambda: run(new_tokens), repeats, device, warm_fn=lambda: run(min(new_tokens, 20)))
    return {**rates(r, new_tokens, "tokens_per_s"), "new_tokens": new_tokens}


def report_generation(gens):
    """The generation table and the KV cache's speed-up."""
    table(
        "Generation: GPT 6 x 384, vocab 65, block 256, fp32, greedy, "
        f"{gens[True]['new_tokens']} new tokens from 1",
        ["KV cache", "tokens/s (best / median)"],
        [["yes" if k else "no", two(r, "tokens_per_s", "{:,.1f}")] for k, r in gens.items()],
    )
    print(f"\nKV cache speed-up (medians): {gens[False]['median_s'] / gens[True]['median_s']:.2f}x")
