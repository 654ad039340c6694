"""
Generation speed, side by side in one run, on one device:
  0. F.linear against PackedLinear (oneDNN's layout), float32 and bfloat16 (packed only on CPUs
     with AVX-512), at 1 to 256 rows; one query's attention in float32 and bfloat16; 0b. one
     row's float32 products four ways against a sum over 256 MB, in one thread and in all;
  1. the memory bandwidth (the best of a few sums over 256 MB) and the GPT-2 124M shape (random
     weights saved as a Hugging Face folder), batch 1, 200 greedy tokens: sample.py with
     --weights auto ("defaults"), float32, bfloat16, int8 and int8_dynamic, each with and
     without --compile, against the bound bandwidth /
     bytes read per token, and Hugging Face's generate on the same weights in float32 and
     bfloat16; 1b. the engine there from position 900, float32 and bfloat16 weights, the
     latter with a float32 cache (the engine's on a CPU) and a bfloat16 one; 1c. where a
     batch-1 step's time goes: its products' share, on both shapes;
  2. the 6 x 384 Shakespeare shape, batch 1, 500 tokens: sample.py here (the same six) and, with
     --old, the sample.py of another checkout (a commit before) on the same checkpoint;
  3. the engine at batch 1, 8 and 32 on that shape, in the default format, eager and compiled:
     time to first token and tokens/s;
  4. with --val_model, each format's change in validation loss on a trained checkpoint.
  python bench/generate.py --old /tmp/old --val_model out-shakespeare-char --json gen.json
  python bench/generate.py --old /tmp/old --sections shakespeare --turns 5    section 2 alone
Run from anywhere; TIKTOKEN_CACHE_DIR must point at the GPT-2 BPE offline.
"""

import functools
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

# run from anywhere: the repository root
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from bench.timing import bandwidth, machine, median_pass  # noqa: E402
from cache import KVCache  # noqa: E402
from decoding import NextToken, Options  # noqa: E402
from engine import Engine, cache_dtype  # noqa: E402
from lib.checkpoint import save_pretrained  # noqa: E402
from lib.common import ArgumentParser, Error, run_script  # noqa: E402
from lib.formats import (  # noqa: E402
    PackedLinear,
    for_decoding,
    onednn_linear,
    onednn_multiplies,
)
from lib.gpt2 import from_pretrained  # noqa: E402
from lib.options import Option, flags  # noqa: E402
from lib.settings import load_split  # noqa: E402
from lib.weights import from_checkpoint  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402

PROMPT = "The meaning of life is"
# sample.py's modes: (name, --weights, --compile); defaults: --weights=auto, the format timed
# fastest here (lib/autotune.py)
MODES = [
    ("defaults", "auto", False),
    ("float32", "float32", False),
    ("float32_compiled", "float32", True),
    ("bfloat16", "bfloat16", False),
    ("bfloat16_compiled", "bfloat16", True),
    ("int8", "int8", False),
    ("int8_compiled", "int8", True),
    ("int8_dynamic", "int8_dynamic", False),
    ("int8_dynamic_compiled", "int8_dynamic", True),
]
SHAKESPEARE = dict(vocab_size=65, block_size=256, n_layer=6, n_head=6, n_embd=384)
GPT2 = dict(vocab_size=50257, block_size=1024, n_layer=12, n_head=12, n_embd=768, bias=True)
CHARS = "\n !$&',-.3:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
FLAGS = {
    "old": Option(None, "another checkout (a commit before): its sample.py beside ours"),
    "val_model": Option(None, "a trained 6 x 384 char checkpoint: the formats' loss changes"),
    "json": Option(None, "also write the results here"),
    "quick": Option(False, "fewer tokens: a smoke test"),
    "sections": Option(
        "products,gpt2,shakespeare,batches",
        "which to run: products (0, 0b), gpt2 (1 to 1c), shakespeare (2), batches (3)",
    ),
    "turns": Option(1, "rounds of section 2's runs (medians)"),
}


def products(sizes=(1, 8, 32, 256), matrices=24, repeats=5):
    """Section 0: F.linear against PackedLinear, in float32 and bfloat16, over matrices of GPT-2's
    MLP shape (3072 x 768, too many for the caches, as a model's are) at sizes rows: the median
    ms of a pass over them, and the GB/s of weights it reads."""
    torch.manual_seed(0)
    results = {}
    for dtype in ("float32", "bfloat16"):
        torch_dtype = getattr(torch, dtype)
        plain = [nn.Linear(768, 3072).to(torch_dtype) for _ in range(matrices)]
        kinds = [("linear", plain)]
        if onednn_multiplies(dtype):  # bfloat16 packs only on CPUs with AVX-512
            kinds.append(("packed", [PackedLinear(linear) for linear in plain]))
        read = sum(linear.weight.numel() * linear.weight.element_size() for linear in plain)
        for size in sizes:
            x = torch.randn(size, 768, dtype=torch_dtype)
            for name, layers in kinds:
                seconds = median_pass(x, layers, repeats)
                key = f"{dtype}_{name}_{size}"
                results[key] = dict(ms=1e3 * seconds, weights_GB_s=read / seconds / 1e9)
    return results


@torch.no_grad()
def one_row(matrices=24, rounds=15):
    """Section 0b: one row's float32 products over section 0's matrices, each way of
    multiplying against a sum over 256 MB, in one thread and in every thread: GB/s (the best of
    rounds, interleaved) and the share of the sum's rate. The ways: F.linear (MKL, over [out, in]
    as trained), x @ w over [in, out] (MKL), PackedLinear (oneDNN), and a sum of elementwise
    products compiled by inductor (a fused pass, as a compiled step could do)."""
    torch.manual_seed(0)
    linears = [nn.Linear(768, 3072, bias=False) for _ in range(matrices)]
    weights = [linear.weight.detach() for linear in linears]
    columns = [w.t().contiguous() for w in weights]
    packs = [PackedLinear(linear).packed for linear in linears]
    x = torch.randn(1, 768)
    compiled = torch.compile(row_sums)
    compiled(x, weights)
    packed_product = functools.partial(onednn_linear, bias=None)
    ways = {
        "F.linear": functools.partial(each, F.linear, x, weights),
        "x @ [in, out]": functools.partial(each, torch.matmul, x, columns),
        "packed": functools.partial(each, packed_product, x, packs),
        "compiled sum": functools.partial(compiled, x, weights),
    }
    read = matrices * 3072 * 768 * 4
    threads = torch.get_num_threads()
    results = {}
    for n in sorted({1, threads}):
        torch.set_num_threads(n)
        best = dict.fromkeys(ways, float("inf"))
        rates = {"sum": 0.0}
        for _ in range(rounds):  # interleaved: each way sees the machine as the others do
            rates["sum"] = max(rates["sum"], bandwidth(repeats=1) / 1e9)
            for name, way in ways.items():
                t0 = time.perf_counter()
                way()
                best[name] = min(best[name], time.perf_counter() - t0)
        for name, seconds in best.items():
            rates[name] = read / seconds / 1e9
        shares = {name: rates[name] / rates["sum"] for name in ways}
        results[f"{n}_threads"] = dict(GB_s=rates, of_sum=shares)
    torch.set_num_threads(threads)
    return results


def each(multiply, x, weights):
    """x by every weight, multiply's way."""
    return [multiply(x, w) for w in weights]


def row_sums(x, weights):
    """x [1, in] by each weight [out, in] as a sum of elementwise products -> [1, out] each."""
    return [(w * x).sum(-1) for w in weights]


@torch.no_grad()
def attention_dtypes(keys=(64, 256, 1024), repeats=200):
    """Section 0: one query's attention (torch's CPU kernel; 12 heads of 64, GPT-2's) over keys
    cached keys, in float32 and bfloat16: microseconds a call."""
    results = {}
    for dtype in ("float32", "bfloat16"):
        torch_dtype = getattr(torch, dtype)
        for n in keys:
            q = torch.randn(1, 12, 1, 64, dtype=torch_dtype)
            k = torch.randn(1, 12, n, 64, dtype=torch_dtype)
            v = torch.randn(1, 12, n, 64, dtype=torch_dtype)
            mask = torch.ones(1, 1, 1, n, dtype=torch.bool)
            attend = functools.partial(F.scaled_dot_product_attention, q, k, v, mask)
            attend()
            t0 = time.perf_counter()
            for _ in range(repeats):
                attend()
            us = 1e6 * (time.perf_counter() - t0) / repeats
            results[f"{dtype}_{n}"] = us
    return results


def bytes_per_token(model, context):
    """What one decoding step reads: every weight a token multiplies (the blocks' matrices and the
    head, in their stored format; norms and biases too) and the KV cache of context positions
    (in the engine's cache dtype)."""
    total = 0
    # the tables are looked up, one row a token; named_parameters lists a tied head as wte
    for name, tensor in list(model.named_parameters()) + list(model.named_buffers()):
        if not name.startswith(("wte.", "wpe.")):
            total += tensor.numel() * tensor.element_size()
    table = model.wte.weight
    if getattr(model.lm_head, "weight", None) is table:  # tied: the head multiplies wte
        total += table.numel() * table.element_size()
    for module in model.modules():  # int8_dynamic's weights: packed, in no buffer
        if hasattr(module, "packed") and hasattr(module, "in_features"):
            total += module.in_features * module.out_features
    config = model.config
    itemsize = cache_dtype(table).itemsize
    total += 2 * config.n_layer * context * config.n_embd * itemsize
    return total


def sample_run(root, args):
    """What sample.py in root prints for args: tokens/s, and with --compile the seconds its
    compilation took (before the tokens/s is timed)."""
    command = [sys.executable, os.path.join(root, "sample.py"), *args]
    result = subprocess.run(command, capture_output=True, text=True, cwd=root, timeout=1800)
    if result.returncode:
        raise Error(f"{' '.join(command)} failed: {result.stderr[-500:]}")
    found = re.search(r"([\d.]+) tokens/s", result.stderr)
    run = dict(tokens_s=float(found.group(1)))
    weights = re.search(r", (\w+) weights", result.stderr)  # what auto took; older: none
    if weights:
        run["weights"] = weights.group(1)
    compiled = re.search(r"compiled the one-token step in ([\d.]+) s", result.stderr)
    if compiled:
        run["compile_s"] = float(compiled.group(1))
    return run


def hugging_face(hf_dir, dtype, new_tokens):
    """transformers' generate on the folder's weights, greedy, batch 1: tokens/s."""
    import tiktoken
    import transformers

    model = transformers.GPT2LMHeadModel.from_pretrained(hf_dir, dtype=dtype).eval()
    ids = torch.tensor([tiktoken.get_encoding("r50k_base").encode(PROMPT)])
    settings = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
    with torch.no_grad():
        model.generate(ids, max_new_tokens=5, do_sample=False)  # warm-up
        t0 = time.perf_counter()
        model.generate(ids, **settings, pad_token_id=0)
    return new_tokens / (time.perf_counter() - t0)


def gpt2_shape(out, new_tokens):
    """Section 1: the bound, sample.py's MODES, Hugging Face's two dtypes."""
    import transformers

    hf_dir = os.path.join(out, "gpt2-random")
    torch.manual_seed(0)
    transformers.GPT2LMHeadModel(transformers.GPT2Config()).save_pretrained(hf_dir)
    speed = bandwidth()
    flags = ["--init_from", hf_dir, "--start", PROMPT, "--greedy"]
    flags += ["--max_new_tokens", str(new_tokens)]
    model = from_pretrained(hf_dir)
    context = len(PROMPT) // 4 + new_tokens // 2  # the mean position, roughly
    results = {"bandwidth_GB_s": speed / 1e9}
    for name, weights, compile in MODES:
        run = sample_run(ROOT, flags + ["--weights", weights] + ["--compile"] * compile)
        read = bytes_per_token(for_decoding(model, "cpu", weights), context)
        bound = speed / read
        results[name] = dict(**run, bytes=read, bound=bound, of_bound=run["tokens_s"] / bound)
        model = from_pretrained(hf_dir)  # for_decoding changed the weights in place
    for dtype in ("float32", "bfloat16"):
        rate = hugging_face(hf_dir, getattr(torch, dtype), new_tokens)
        results[f"hf_{dtype}"] = dict(tokens_s=rate)
    best_hf = max(results["hf_float32"]["tokens_s"], results["hf_bfloat16"]["tokens_s"])
    for name, _, _ in MODES:
        results[f"{name}_over_hf"] = results[name]["tokens_s"] / best_hf
    return results


def long_context(out, new_tokens, start=900):
    """Section 1b: the engine on section 1's weights from position start, batch 1, greedy, with
    float32 and bfloat16 weights, and bfloat16 with its cache (so its attention) in bfloat16
    too: tokens/s."""
    hf_dir = os.path.join(out, "gpt2-random")
    runs = [
        ("float32", "float32", None),
        ("bfloat16", "bfloat16", None),
        ("bfloat16_cache", "bfloat16", torch.bfloat16),
    ]
    results = {}
    for name, weights, dtype in runs:
        model = for_decoding(from_pretrained(hf_dir), "cpu", weights)
        engine = Engine(model, 1)
        if dtype is not None:
            length = engine.block_size + 1
            engine.cache = KVCache(model.config, 1, length, "cpu", dtype)
        engine.submit([1] * start, [NextToken(Options(), greedy=True)], new_tokens)
        engine.step()  # the prefill: timed are the steps after it
        t0 = time.perf_counter()
        tokens = 0
        while engine.busy():
            tokens += len(engine.step())
        results[name] = tokens / (time.perf_counter() - t0)
    return results


def step_split(steps=20):
    """Section 1c: where a batch-1 step's time goes in the default format, GPT-2's shape and the
    6 x 384 one (random weights, greedy): ms a step, and the ms and share of it in the products
    (their operators' time under torch.profiler, in a second run of as many steps)."""
    shapes = dict(gpt2=GPTConfig(**GPT2), shakespeare=GPTConfig(**SHAKESPEARE, bias=False))
    greedy = NextToken(Options(), greedy=True)
    # packed, torch's own, int8's or int8_dynamic's
    products = (
        "mkldnn::_linear_pointwise",
        "aten::linear",
        "aten::_weight_int8pack_mm",
        "quantized::linear_dynamic",
    )
    results = {}
    for name, config in shapes.items():
        engine = Engine(for_decoding(GPT(config), "cpu"), rows=1)
        engine.submit([0], [greedy], 3 * steps)
        for _ in range(steps // 2):  # warm: the first steps allocate
            engine.step()
        t0 = time.perf_counter()
        for _ in range(steps):
            engine.step()
        step = (time.perf_counter() - t0) / steps
        with torch.profiler.profile() as profiled:
            for _ in range(steps):
                engine.step()
        events = profiled.key_averages()
        spent = sum(e.cpu_time_total for e in events if e.key in products) / steps / 1e6
        results[name] = dict(step_ms=1e3 * step, products_ms=1e3 * spent, share=spent / step)
    return results


def shakespeare_checkpoint(out):
    """A 6 x 384 character model with random weights, saved as train.py saves one."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(**SHAKESPEARE, bias=False))
    path = os.path.join(out, "shakespeare-random")
    save_pretrained(model, path, task="lm", tokenizer={"type": "char", "chars": CHARS})
    return path


def small_shape(out, old, new_tokens, turns=1):
    """Section 2: sample.py here against an older checkout's, on one checkpoint, each run in turn
    (turns rounds): each mode's median tokens/s and its runs."""
    path = shakespeare_checkpoint(out)
    flags = ["--out_dir", path, "--start", "ROMEO:", "--max_new_tokens", str(new_tokens)]
    runs = {}
    for _ in range(turns):
        if old:
            # the older sample.py names its autocast dtype: float32, as its default was
            run = sample_run(old, flags + ["--dtype", "float32"])
            runs.setdefault("old", []).append(run["tokens_s"])
        for name, weights, compile in MODES:
            run = sample_run(ROOT, flags + ["--weights", weights] + ["--compile"] * compile)
            runs.setdefault(name, []).append(run["tokens_s"])
    results = {name: statistics.median(rates) for name, rates in runs.items()}
    results["runs"] = runs
    if old:
        for name, _, _ in MODES:
            results[f"{name}_over_old"] = results[name] / results["old"]
    return results


def batches(out, new_tokens, sizes=(1, 8, 32)):
    """Section 3: B requests of one row each at once, eager and compiled: time to first token
    and tokens/s."""
    path = shakespeare_checkpoint(out)
    results = {}
    for compile in (False, True):
        model, _ = from_checkpoint(path)
        model = for_decoding(model, "cpu")
        for size in sizes:
            name = f"{size}_compiled" if compile else str(size)
            results[name] = batch_run(Timed(model, size, compile=compile), size, new_tokens)
    return results


class Timed(Engine):
    """The engine, noting when each row takes its first token."""

    def take(self, rows, logits):
        took = super().take(rows, logits)
        for row in took:
            if len(row.generated) == 1:
                row.first_token = time.perf_counter()
        return took


def batch_run(engine, size, new_tokens):
    """size requests of one row each submitted at once, top_k 200 with a seed each."""
    t0 = time.perf_counter()
    requests = []
    for i in range(size):
        pick = NextToken(Options(top_k=200), generator=torch.Generator().manual_seed(i))
        requests.append(engine.submit([i + 1] * 8, [pick], new_tokens))
    while engine.busy():
        engine.step()
    seconds = time.perf_counter() - t0
    first = [request.rows[0].first_token - t0 for request in requests]
    return dict(ttft_ms=1e3 * sum(first) / size, tokens_s=size * new_tokens / seconds)


def validation_loss(path, weights, windows=40):
    """Mean loss over the same windows of data/shakespeare_char's val split."""
    model, _ = from_checkpoint(path)
    model = for_decoding(model, "cpu", weights)
    data = load_split(os.path.join(ROOT, "data", "shakespeare_char"), "val", 256)
    rows = data.eval_rows(windows)
    total = 0.0
    with torch.no_grad():
        for i in range(0, len(rows), 8):
            batch = data.batch(rows[i : i + 8])
            idx = batch["idx"]
            # every position through the decoding head (float32 logits whatever the format)
            logits, _ = model(idx, logits_to_keep=idx.size(1))
            flat = logits.view(-1, logits.size(-1)).float()
            loss = torch.nn.functional.cross_entropy(flat, batch["targets"].view(-1))
            total += loss.item() * len(batch["idx"])
    return total / len(rows)


def format_losses(path):
    """Section 4: validation loss with float32, bfloat16, int8 and int8_dynamic weights."""
    exact = validation_loss(path, "float32")
    results = dict(float32=exact)
    for weights in ("bfloat16", "int8", "int8_dynamic"):
        loss = validation_loss(path, weights)
        results[weights] = dict(loss=loss, change=loss / exact - 1)
    return results


def main(argv=None):
    p = ArgumentParser(prog="generate.py", description=__doc__)
    flags(p, FLAGS)
    args = p.parse_args(argv)
    if args.old and not os.path.isfile(os.path.join(args.old, "sample.py")):
        p.error(f"--old {args.old}: no sample.py there (a checkout of this repository)")
    if args.val_model and not os.path.isfile(os.path.join(args.val_model, "config.json")):
        p.error(f"--val_model {args.val_model}: no checkpoint there (config.json)")
    scale = 10 if args.quick else 1
    results = dict(machine=machine("cpu"))
    wanted = args.sections.split(",")
    if "products" in wanted:
        results["products"] = products()
        results["one_row"] = one_row()
        results["attention_us"] = attention_dtypes()
    with tempfile.TemporaryDirectory() as out:
        if "gpt2" in wanted:
            results["gpt2"] = gpt2_shape(out, 200 // scale)
            results["long_context"] = long_context(out, 60 // scale)
            results["step_split"] = step_split()
        if "shakespeare" in wanted:
            results["shakespeare"] = small_shape(out, args.old, 500 // scale, args.turns)
        if "batches" in wanted:
            results["batches"] = batches(out, 200 // scale)
    if args.val_model:
        results["losses"] = format_losses(args.val_model)
    print(json.dumps(results, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    run_script(main, "generate.py")
