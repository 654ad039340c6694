"""
llama.cpp against this project on export.py's GGUF files of the GPT-2 124M shape (random weights,
or GPT-2's own from a Hugging Face folder with --init_from), in one run:
  1. tokens: the float32, float16 and Q8_0 files' greedy tokens in llama.cpp (llama-cpp-python)
     against ours (sample.py's engine, float32 weights): --new_tokens of them, Q8_0's first 50;
     where two differ first, each side's margin of its pick there;
  2. speed: batch 1, --new_tokens greedy tokens, --threads threads: llama.cpp on the float16 and
     Q8_0 files (their weights as stored: load_llama) against our engine with sample.py's
     default weights, int8 compiled and int8_dynamic eager and compiled, the runs interleaved
     (every other round backwards), the best of --rounds each.
  python bench/gguf_check.py --json gguf.json
Needs llama-cpp-python and the gguf package; TIKTOKEN_CACHE_DIR must point at the GPT-2 BPE
offline.
"""

import json
import os
import sys
import tempfile
import time
from functools import partial

import numpy as np
import torch

# run from anywhere: the repository root
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from bench.speed import machine  # noqa: E402
from decoding import NextToken, Options  # noqa: E402
from engine import Engine  # noqa: E402
from export import export  # noqa: E402
from lib.bpe import BPETokenizer  # noqa: E402
from lib.checkpoint import save_pretrained  # noqa: E402
from lib.common import ArgumentParser, run_script  # noqa: E402
from lib.formats import for_decoding  # noqa: E402
from lib.gpt2 import from_pretrained  # noqa: E402
from lib.options import Option, flags  # noqa: E402
from lib.weights import from_checkpoint  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402

PROMPT = "The meaning of life is"
GPT2 = dict(vocab_size=50304, block_size=1024, n_layer=12, n_head=12, n_embd=768, bias=True)
Q8_0_TOKENS = 50  # Q8_0's weights move by up to 1/254 of a block's largest: its first tokens


def load_llama(path, threads=1):
    """llama-cpp-python's model of a GGUF file, its context the model's, its weights as stored:
    not repacked for AMX, whose products crash llama.cpp (ggml-org/llama.cpp#20824; its tools'
    --no-repack), which Llama() has no argument for."""
    import llama_cpp

    defaults = llama_cpp.llama_model_default_params

    def stored_weights():
        params = defaults()
        params.use_extra_bufts = False
        return params

    llama_cpp.llama_cpp.llama_model_default_params = stored_weights
    try:
        return llama_cpp.Llama(
            model_path=str(path), n_ctx=0, n_threads=threads, n_threads_batch=threads, verbose=False
        )
    finally:
        llama_cpp.llama_cpp.llama_model_default_params = defaults


def llama_greedy(llama, prompt, n):
    """llama.cpp's n greedy tokens after prompt, the logits each is picked from, and the
    seconds they took."""
    import llama_cpp

    t0 = time.perf_counter()
    llama.reset()
    llama.eval(prompt)
    tokens, logits = [], []
    for _ in range(n):
        # the last token's, read from llama.cpp's buffer (eval keeps them only with logits_all)
        last = llama_cpp.llama_get_logits_ith(llama.ctx, -1)
        logits.append(np.ctypeslib.as_array(last, shape=(llama.n_vocab(),)).copy())
        tokens.append(int(logits[-1].argmax()))
        llama.eval([tokens[-1]])
    return tokens, logits, time.perf_counter() - t0


def our_greedy(engine, prompt, n, vocab_size):
    """Our engine's n greedy tokens over vocab_size ids, and the seconds they took."""
    t0 = time.perf_counter()
    pick = NextToken(Options(), greedy=True, vocab_size=vocab_size)
    request = engine.submit(prompt, [pick], n)
    while engine.busy():
        engine.step()
    return request.rows[0].generated, time.perf_counter() - t0


def margin(logits, token):
    """How far token's logit is above the best other one's (below 0: another is picked)."""
    return float(logits[token] - np.delete(logits, token).max())


def first_difference(theirs, ours, logits, model, prompt):
    """None where llama.cpp's tokens are ours; else where they first differ: the step, each pick's
    margin in llama.cpp's logits and in ours (model's, float32), the largest difference of the
    two sides' logits there, the spread (standard deviation) of ours, and a line saying so."""
    if theirs == ours[: len(theirs)]:
        return None
    i = next(i for i, (a, b) in enumerate(zip(theirs, ours)) if a != b)
    with torch.no_grad():
        mine = model(torch.tensor([prompt + ours[:i]]))[0][0, -1, : len(logits[i])].numpy()
    found = dict(
        step=i,
        llama_margin=margin(logits[i], theirs[i]),
        our_margin=margin(mine, ours[i]),
        logit_error=float(np.abs(logits[i] - mine).max()),
        logit_std=float(mine.std()),
    )
    found["line"] = (
        f"first difference at token {i}: llama.cpp picks {theirs[i]} by "
        f"{found['llama_margin']:.4f} (ours {margin(mine, theirs[i]):.4f}), we pick {ours[i]} "
        f"by {found['our_margin']:.4f} (llama.cpp {margin(logits[i], ours[i]):.4f}); the logits "
        f"differ by up to {found['logit_error']:.4f}, their spread {found['logit_std']:.2f}"
    )
    return found


def checkpoint(out, init_from):
    """The GPT-2 124M shape as a checkpoint of this project: GPT-2's weights, or random ones as
    train.py initialises them."""
    if init_from:
        model = from_pretrained(init_from)
    else:
        torch.manual_seed(0)
        model = GPT(GPTConfig(**GPT2))
    out_dir = os.path.join(out, "gpt2-shape")
    bpe = {"type": "bpe", "encoding": "r50k_base"}
    save_pretrained(model, out_dir, task="lm", dataset="random", tokenizer=bpe)
    return out_dir


def tokens_section(out_dir, files, prompt, n, vocab_size):
    """Section 1: each file's tokens against ours."""
    model, _ = from_checkpoint(out_dir)
    ours, _ = our_greedy(Engine(model, 1), prompt, n, vocab_size)
    results = {}
    for dtype, path in files.items():
        count = Q8_0_TOKENS if dtype == "q8_0" else n
        theirs, logits, _ = llama_greedy(load_llama(path), prompt, count)
        found = first_difference(theirs, ours, logits, model, prompt)
        results[dtype] = dict(tokens=count, equal=found is None, first_difference=found)
        print(f"{dtype}: {count} tokens {'equal' if found is None else found['line']}", flush=True)
    return results


def speed_section(out_dir, files, prompt, n, vocab_size, threads, rounds):
    """Section 2: tokens/s, the best of rounds interleaved runs each."""
    runs = {}  # name: a run of n tokens, its seconds last
    for dtype in ("float16", "q8_0"):
        llama = load_llama(files[dtype], threads)
        runs[f"llama.cpp {dtype}"] = partial(llama_greedy, llama, prompt, n)
    modes = ("auto", False), ("int8", True), ("int8_dynamic", False), ("int8_dynamic", True)
    for weights, compile in modes:
        model = for_decoding(from_checkpoint(out_dir)[0], "cpu", weights)
        engine = Engine(model, 1, compile=compile)
        name = f"ours {model.weights_format}{' compiled' if compile else ''}"
        if weights == "auto":
            name += " (defaults)"
        runs[name] = partial(our_greedy, engine, prompt, n, vocab_size)
    best = dict.fromkeys(runs, 0.0)
    order = list(runs)
    for _ in range(rounds):
        for name in order:
            best[name] = max(best[name], n / runs[name]()[-1])
        # a run right after llama.cpp's decodes up to 13% slower: every other round backwards, no
        # run always follows the same one
        order.reverse()
    for name, rate in best.items():
        print(f"{name:32s} {rate:7.1f} tokens/s", flush=True)
    return best


FLAGS = dict(
    init_from=Option(None, "a GPT-2 folder in the Hugging Face layout (else random weights)"),
    new_tokens=Option(200, "greedy tokens a run decodes", ge=1),
    threads=Option(2, "threads, ours and llama.cpp's", ge=1),
    rounds=Option(3, "interleaved rounds; the best of them counts", ge=1),
    json=Option(None, "write the results here"),
)


def main(argv=None):
    p = ArgumentParser(prog="gguf_check.py", description=__doc__)
    flags(p, FLAGS)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    tokenizer = BPETokenizer("r50k_base")
    prompt = tokenizer.encode(PROMPT)
    with tempfile.TemporaryDirectory() as out:
        out_dir = checkpoint(out, args.init_from)
        files = {}
        for dtype in ("float32", "float16", "q8_0"):
            files[dtype] = os.path.join(out, f"gpt2-shape-{dtype}.gguf")
            export(out_dir, gguf_path=files[dtype], gguf_dtype=dtype)
        vocab = tokenizer.vocab_size
        results = {"machine": machine("cpu"), "threads": args.threads}
        results["tokens"] = tokens_section(out_dir, files, prompt, args.new_tokens, vocab)
        results["tokens_s"] = speed_section(
            out_dir, files, prompt, args.new_tokens, vocab, args.threads, args.rounds
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    run_script(main, "gguf_check.py")
