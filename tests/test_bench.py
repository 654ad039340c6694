"""bench/attention.py: the notebook-style per-head loop computes what the fused projection
computes; bench/speed.py's measurements run. bench/core_tokens.py: a run's walk."""

import ast
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import TINY

from bench import speed
from bench.attention import ATTENTION_PATHS, LoopAttention, attention_flops, bench_attention
from bench.core_tokens import tokens
from lib.checkpoint import save_pretrained
from lib.prepare import save_array, write_meta
from model import GPT, GPTConfig


def test_loop_reference_matches_fused_and_explicit_paths():
    torch.manual_seed(0)
    loop = LoopAttention(48, 6)
    mha = loop.fused_copy()  # the loop's per-head weights copied into one qkv projection
    x = torch.randn(2, 10, 48)
    expected = loop(x)
    fused, _ = mha(x)
    explicit, weights = mha(x, need_weights=True)
    torch.testing.assert_close(fused, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(explicit, expected, atol=1e-5, rtol=1e-5)
    assert weights.shape == (2, 6, 10, 10)


def test_attention_flops_is_three_times_what_pytorch_counts_in_the_forward():
    from torch.utils.flop_counter import FlopCounterMode

    mha = LoopAttention(48, 6).fused_copy()
    with FlopCounterMode(display=False) as counter:
        # the explicit path: its matmuls are what the counter sees
        mha(torch.randn(1, 10, 48), need_weights=True)
    assert 3 * counter.get_total_flops() == attention_flops(10, 48)


def test_attention_measurement_smoke():
    sizes = {}
    for path in ATTENTION_PATHS:
        r = bench_attention(path, 64, "cpu", repeats=1)
        assert (
            r["min_s"] > 0 and r["median_s"] > 0 and len(r["times_s"]) == 1 and r["saved_bytes"] > 0
        )
        assert r["flops_best"] == attention_flops(64, 384) / r["min_s"]
        sizes[path] = r["saved_bytes"]
    # the explicit path keeps the n x n weights for backward
    assert sizes["fused"] < sizes["explicit"]


def test_profile_prints_each_dtypes_operators(capsys, monkeypatch):
    # main changes directory to the repository; this puts the old one back afterwards
    monkeypatch.chdir(speed.ROOT)
    speed.main(["--profile", "config/shakespeare_char_cpu.py"])
    out = capsys.readouterr().out
    for mode in ("fp32", "bf16"):
        table = out.split(f"config/shakespeare_char_cpu.py, {mode}, batch (12, 64)")[1]
        # the projections' matmuls, in this dtype's own table
        assert "aten::mm" in table.split("###")[0]


def test_walk_lists_the_files_a_run_imports_with_their_tokens():
    tool = [sys.executable, "bench/core_tokens.py", "--"]
    # the tool walking itself: the outer walk holds the script run as __main__ and the files of
    # the process it starts
    command = tool + tool + [sys.executable, "-c", "import decoding"]
    out = subprocess.run(command, cwd=speed.ROOT, capture_output=True, text=True, check=True).stdout
    inner, outer = walk_tables(out)
    with open(os.path.join(speed.ROOT, "decoding.py")) as f:
        assert inner["decoding.py"] == tokens(f.read())
    assert "lib/common.py" in inner  # decoding imports it
    assert "model.py" not in inner  # nor does anything decoding imports
    assert "bench/core_tokens.py" not in inner
    assert outer == {"bench/core_tokens.py": outer["bench/core_tokens.py"], **inner}


def walk_tables(out):
    """Each table the tool printed: {file: tokens}, its total line checked against its rows;
    the run's own lines (a sample's text) left out."""
    tables, rows = [], {}
    for line in out.splitlines():
        if "  docstrings " not in line:
            continue
        name, count = line[:22].strip(), int(line[22:].split()[0].replace(",", ""))
        if name.startswith("the walk"):
            assert name == f"the walk, {len(rows)} files" and count == sum(rows.values())
            tables.append(rows)
            rows = {}
        else:
            rows[name] = count
    return tables


# what only a classifier's, a chat fine-tune's or a fine-tune's run reads
OTHER_TASKS = {
    "ClassificationData",
    "ConversationData",
    "Rows",
    "pad_batch",
    "pretrained_body",
    "check_data_tokenizer",
    "kept_pattern",
    "check_card",
}
# what a GPT's sample never runs: a classifier's card, an adapter's merge, --compile's warm-up
NOT_SAMPLED = {"check_label_names", "merged", "warm_up"}


def walk(command):
    """{file: tokens} of a command's walk (python COMMAND), as bench/core_tokens.py counts them."""
    command = [sys.executable, "bench/core_tokens.py", "--", sys.executable, *command]
    out = subprocess.run(command, cwd=speed.ROOT, capture_output=True, text=True, check=True)
    return walk_tables(out.stdout)[0]


def defined(files):
    """The names that files define at their top level and in their classes."""
    names = set()
    for name in files:
        with open(os.path.join(speed.ROOT, name)) as f:
            tree = ast.parse(f.read())
        classes = [node for node in tree.body if isinstance(node, ast.ClassDef)]
        for node in [*tree.body, *(member for c in classes for member in c.body)]:
            names.add(getattr(node, "name", None))
    return names


def write_characters(folder):
    """A prepared character dataset of 3 tokens, its train and val splits 200 tokens each."""
    for split in ("train", "val"):
        save_array(str(folder / f"{split}.bin"), np.arange(200, dtype=np.uint16) % 3)
    splits = {"train": 200, "val": 200}
    chars = {"type": "char", "chars": "abc"}
    write_meta(folder, task="lm", tokenizer=chars, vocab_size=3, dtype="uint16", splits=splits)


# the most tokens a plain training run's walk holds (BENCHMARKS.md, "the walks")
TRAINING_WALK = 15_000


@pytest.mark.slow  # a training run in a subprocess
def test_a_plain_training_runs_walk_holds_no_other_tasks_code_and_at_most_15000_tokens(tmp_path):
    """config/shakespeare_char_cpu.py's run from scratch, as the walk's benchmark runs it, on a
    small dataset: its files define none of the classifier's rows, the conversations, a
    fine-tune's start or a checkpoint card's check, and hold at most TRAINING_WALK tokens."""
    write_characters(tmp_path)
    run = ["train.py", "config/shakespeare_char_cpu.py", f"--dataset={tmp_path}"]
    files = walk(run + [f"--out_dir={tmp_path / 'out'}", "--max_iters=2", *TINY])
    assert defined(files) & OTHER_TASKS == set()
    assert "lib/finetune.py" not in files
    assert sum(files.values()) <= TRAINING_WALK, files


@pytest.mark.slow  # a sample in a subprocess
def test_a_gpts_samples_walk_holds_no_other_runs_code(tmp_path):
    """The files that a GPT checkpoint's sample imports define none of NOT_SAMPLED."""
    model = GPT(GPTConfig(vocab_size=3, block_size=8, n_layer=1, n_head=1, n_embd=8))
    save_pretrained(model, tmp_path, task="lm", tokenizer={"type": "char", "chars": "abc"})
    run = ["sample.py", f"--out_dir={tmp_path}", "--max_new_tokens=2", "--weights=float32"]
    assert defined(walk(run + ["--device=cpu"])) & NOT_SAMPLED == set()


# the modules of options a plain run does not take, each imported only where its option is chosen
OPTIONS = (
    "patterns",  # a sparse attention pattern, and a window model's rolling cache
    "muon",  # optimizer=muon
    "lib.gpt2",  # GPT-2's weights: a name on the hub or a Hugging Face folder
    "lib.bpe",  # a byte-pair encoding
    "tiktoken",
    "lib.chat",  # a chat model's tokenizer
    "lib.lora",  # lora_rank > 0, or an adapter checkpoint
    "parallel",  # torchrun's processes (DDP, FSDP), or activation_checkpointing
)
# a one-process character-level GPT in train.py's and sample.py's calls, then each option taken
RUN = """import sys
import train, sample
from engine import Engine
from lib.distributed import Run, parallel
from lib.formats import for_decoding
from lib.weights import get_tokenizer
from model import GPT, GPTConfig

def loaded():
    print(" ".join(sorted(sys.modules)))

get_tokenizer({"type": "char", "chars": "ab"})
model = GPT(GPTConfig(vocab_size=2, block_size=4, n_layer=1, n_head=1, n_embd=8))
parallel(model, Run("cpu", "float32"), checkpointing=False)
Engine(for_decoding(model, "cpu", "float32"), rows=1)
loaded()
try:  # without GPT-2's BPE file at hand (no ../shared, no network) it fails once imported
    get_tokenizer({"type": "bpe", "encoding": "r50k_base"})
except Exception:
    pass
window = GPTConfig(vocab_size=2, block_size=4, n_layer=1, n_head=1, n_embd=8, window=2)
Engine(GPT(window), rows=1)
parallel(model, Run("cpu", "float32"), checkpointing=True)
for_decoding(GPT(window), "cpu", "int8")
get_tokenizer({"type": "char", "chars": "ab", "chat": True})
loaded()
"""


def test_a_plain_run_imports_no_options_module_and_each_option_imports_its_own():
    """A reader of one run reads only what that run uses: train.py and sample.py with a character
    tokenizer on one process import none of OPTIONS; the options taken import theirs."""
    out = subprocess.run(
        [sys.executable, "-c", RUN], cwd=speed.ROOT, capture_output=True, text=True, check=True
    ).stdout
    plain, taken = (set(line.split()) for line in out.splitlines())
    assert plain & set(OPTIONS) == set()
    assert {
        "patterns",
        "lib.bpe",
        "tiktoken",
        "lib.chat",
        "parallel",
    } <= taken


def repository_imports():
    """{module: the repository's modules it imports}, imports inside functions included, for
    every module of the repository's packages and root (scripts and tests aside)."""
    graph = {}
    for folder in ("", "lib", "serving"):
        for name in sorted(os.listdir(os.path.join(speed.ROOT, folder or "."))):
            if name.endswith(".py") and name != "__init__.py":
                module = ".".join(filter(None, (folder, name[:-3])))
                with open(os.path.join(speed.ROOT, folder, name)) as f:
                    graph[module] = imported(ast.parse(f.read()))
    return {module: names & graph.keys() for module, names in graph.items()}


def imported(tree):
    """The dotted names a module's import statements name, and each `from package import name`."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return names


# no module longer than this many lines; lib/ no more than this many modules
MAX_LINES = 450
MAX_LIB_MODULES = 20


def test_lib_holds_20_modules_and_no_file_runs_past_450_lines():
    """The layout a reader walks: lib/ in at most MAX_LIB_MODULES modules, and no module of the
    repository's packages and root longer than MAX_LINES lines."""
    modules = [f for f in os.listdir(os.path.join(speed.ROOT, "lib")) if f.endswith(".py")]
    assert len(set(modules) - {"__init__.py"}) <= MAX_LIB_MODULES
    longer = []
    for folder in ("", "lib", "serving"):
        for name in os.listdir(os.path.join(speed.ROOT, folder or ".")):
            path = os.path.join(speed.ROOT, folder, name)
            if name.endswith(".py"):
                with open(path) as f:
                    if len(f.readlines()) > MAX_LINES:
                        longer.append(os.path.join(folder, name))
    assert longer == []


def test_no_module_imports_itself_through_others():
    """Imports go one way: no circle among the repository's modules, lazy imports included."""
    graph = repository_imports()
    circles = []
    for start in graph:
        stack = [(start, [start])]
        seen = set()
        while stack:
            module, path = stack.pop()
            for other in graph[module]:
                if other == start:
                    circles.append(" -> ".join(path + [start]))
                elif other not in seen:
                    seen.add(other)
                    stack.append((other, path + [other]))
    assert circles == []
