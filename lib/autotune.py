"""auto by measurement on a CPU: of the options, the one that runs this model's own shapes fastest
here, timed briefly (as cuDNN's benchmark mode) and remembered per CPU, torch version and shape
in a JSON file (GPT_STARTER_AUTOTUNE names it; else the user's cache folder)."""

import copy
import hashlib
import os
import platform
import sys
import time
from functools import partial

import torch

from lib.common import Error, autocast, read_json

ENV = "GPT_STARTER_AUTOTUNE"  # the cache file's path, for tests and shared machines
TOKENS = 4e10  # a timed training pass multiplies about this many weight-flops
STEPS = 4  # one-token steps a decode's timing takes
CPUINFO = "/proc/cpuinfo"


def log(line):
    """A line on stderr, as the scripts' own (the stderr of the moment, not of the import)."""
    print(line, file=sys.stderr)


def cache_path():
    """The JSON file of the measurements: $GPT_STARTER_AUTOTUNE, else under XDG_CACHE_HOME."""
    if os.environ.get(ENV):
        return os.environ[ENV]
    root = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return os.path.join(root, "gpt-starter", "autotune.json")


def machine():
    """This CPU (its model name and a digest of its flags), torch's version and threads."""
    name, flags = platform.processor(), ""
    if os.path.isfile(CPUINFO):
        with open(CPUINFO) as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    name = value.strip()
                elif key.strip() == "flags":
                    flags = value.strip()
                    break
    digest = hashlib.sha1(flags.encode()).hexdigest()[:12]
    return f"{name} (flags {digest}), torch {torch.__version__}, {torch.get_num_threads()} threads"


def read_cache():
    """The measurements remembered, or none where the file is missing or damaged."""
    try:
        cache = read_json(cache_path(), "autotune cache")
    except Error:  # missing, unreadable, not JSON
        return {}
    return cache if isinstance(cache, dict) else {}


def write_cache(cache):
    """The file replaced whole (a reader never sees half); a folder it cannot write is skipped."""
    from lib.files import write_json  # a measurement's alone: a remembered choice writes nothing

    path = cache_path()
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        write_json(path, cache)
    except (OSError, Error):  # lib.files' WriteError is an Error
        pass  # measured again next time


def remembered(seconds, options):
    """Whether a cache entry holds a time for each option, and nothing else."""
    if not isinstance(seconds, dict) or set(seconds) != set(options):
        return False
    return all(isinstance(s, (int, float)) and s > 0 for s in seconds.values())


def choose(what, shape, measure, options):
    """The fastest of options for what at shape: measure(options) -> {option: seconds}, run
    once per machine and shape, then read back. Says its choice in one line on stderr."""
    key = f"{what} | {shape} | {machine()}"
    cache = read_cache()
    seconds = cache.get(key)
    how = "remembered"
    if not remembered(seconds, options):
        seconds = measure(options)
        cache[key] = seconds
        write_cache(cache)
        how = "measured"
    best = min(seconds, key=seconds.get)
    log(verdict(what, best, seconds, how))
    return best


def verdict(what, best, seconds, how):
    """'dtype auto -> float32: bfloat16 1.25x slower here (measured)'."""
    slower = [f"{o} {s / seconds[best]:.2f}x slower" for o, s in seconds.items() if o != best]
    return f"{what} auto -> {best}: {', '.join(slower)} here ({how})"


def interleaved(runs, repeats=3):
    """{name: the least seconds of run()}, each warmed once, the runs taking turns."""
    for run in runs.values():
        run()
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(repeats):
        for name, run in runs.items():
            t0 = time.perf_counter()
            run()
            best[name] = min(best[name], time.perf_counter() - t0)
    return best


# ----------------------------------------------------------------------- training: dtype=auto
FLOAT32_ATTENTION = "bfloat16, float32 attention"  # bfloat16's flash backward is slow on some CPUs
# each option of dtype=auto: (its autocast dtype, whether attention runs in float32)
TRAINING = {
    "float32": ("float32", False),
    "bfloat16": ("bfloat16", False),
    FLOAT32_ATTENTION: ("bfloat16", True),
}


def training_dtype(model, batch):
    """float32 or bfloat16 autocast (its attention in bfloat16 or float32), whichever runs
    model's forward and backward pass over batch's first rows (about TOKENS weight-flops) faster
    here -> the dtype; the model's attention set as chosen, the model otherwise left as it was."""
    flops = 6 * sum(p.numel() for p in model.parameters())
    rows = max(1, min(len(batch["idx"]), int(TOKENS / flops / batch["idx"].size(1))))
    batch = {k: v[:rows] for k, v in batch.items()}
    shape = f"{type(model).__name__} {model.config}, {rows} x {batch['idx'].size(1)}"

    def measure(options):
        with torch.random.fork_rng():  # dropout draws nothing the run would
            runs = {option: training_pass(model, batch, option) for option in options}
            seconds = interleaved(runs)
        model.zero_grad()  # the timing's grads dropped (set to None)
        return seconds

    dtype, in_float32 = TRAINING[choose("dtype", shape, measure, tuple(TRAINING))]
    float32_attention(model, in_float32)
    return dtype


def training_pass(model, batch, option):
    """A function running one forward and backward pass as option says."""
    dtype, in_float32 = TRAINING[option]

    def run():
        float32_attention(model, in_float32)
        with autocast("cpu", dtype):
            _, loss = model(**batch)
        loss.backward()

    return run


def float32_attention(model, on):
    """Each attention of model in float32 under autocast (on) or in autocast's dtype."""
    from model import MultiHeadAttention

    for module in model.modules():
        if isinstance(module, MultiHeadAttention):
            module.float32_attention = on


# ------------------------------------------------------------------- decoding: weights=auto
def decoding_weights(model, formats, convert):
    """Of formats, the one whose copy of model decodes one row's tokens fastest here;
    convert(model, device, weights): lib.formats.for_decoding."""
    shape = f"{type(model).__name__} {model.config}, 1 row"

    def measure(options):
        from decoding import NextToken, Options
        from engine import Engine

        greedy = NextToken(Options(), greedy=True)

        def steps(engine):
            engine.submit([0] * 8, [greedy], STEPS)
            while engine.busy():
                engine.step()

        runs = {}
        for weights in options:
            engine = Engine(convert(copy.deepcopy(model), "cpu", weights), 1)
            runs[weights] = partial(steps, engine)
        with torch.inference_mode():
            return interleaved(runs)

    return choose("weights", shape, measure, formats)
