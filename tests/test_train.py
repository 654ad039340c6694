"""train.py on tiny data the tests make: config parsing, LR schedule, exact resume, accumulation,
DDP, failures."""

import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from contextlib import redirect_stdout
from dataclasses import fields
from functools import partial
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import ROOT, TINY, in_turn, run_distributed
from test_robustness import wait_for

import plot
import rl
import train
from bench.readme import PAGES
from lib import checkpoint, classifier
from lib.checkpoint import save_pretrained
from lib.common import Error
from lib.data import MAX_EPOCHS, epochs_line
from lib.distributed import started
from lib.finetune import RESIZED
from lib.prepare import save_array, write_classification_split, write_meta
from lib.records import flops_per_token
from lib.settings import load_split, parse
from lib.weights import load_pretrained
from model import GPT, EncoderClassifier, GPTConfig

DEFAULTS = {name: key.default for name, key in train.OPTIONS.items()}
HERE = os.path.dirname(os.path.abspath(__file__))
CHARS = {"type": "char", "chars": "abcdefghij"}  # lm_dir's tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors: one thread


@pytest.fixture(scope="module")
def lm_dir(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("lm"))
    rng = np.random.default_rng(0)
    for split, n in (("train", 5000), ("val", 500)):
        save_array(
            os.path.join(d, f"{split}.bin"),
            (np.arange(n) % 7 + rng.integers(0, 3, n)).astype(np.uint16),
        )
    write_meta(
        d,
        task="lm",
        tokenizer=CHARS,
        vocab_size=10,
        dtype="uint16",
        splits={"train": 5000, "val": 500},
    )
    return d


@pytest.fixture(scope="module")
def toy_classify_dir(tmp_path_factory):
    """Separable: class 0 rows use tokens 1-9, class 1 rows tokens 10-19; lengths vary, so batches
    need padding."""
    d = str(tmp_path_factory.mktemp("cls"))
    rng = np.random.default_rng(0)
    for split, n in (("train", 400), ("val", 100)):
        labels = rng.integers(0, 2, n)
        rows = [list(rng.integers(1 + 9 * y, 10 + 10 * y, rng.integers(3, 12))) for y in labels]
        write_classification_split(d, split, rows, labels, np.uint16)
    write_meta(
        d,
        task="classify",
        tokenizer={"type": "char", "chars": "x" * 20},
        vocab_size=20,
        dtype="uint16",
        label_names=["low", "high"],
        max_length=16,
        pad_token_id=0,
        splits={"train": 400, "val": 100},
    )
    return d


def run(argv):
    """train.main in this process with TINY's model and schedule. A run may replace an earlier run's
    checkpoint unless the test says otherwise."""
    overwrite = (
        []
        if any(a.startswith(("--overwrite_out_dir", "--init_from=resume")) for a in argv)
        else ["--overwrite_out_dir=True"]
    )
    return train.main(TINY + overwrite + argv)


def settings(argv):
    """The settings train.py resolves for argv (config files and overrides, checked), as
    --print_config prints them."""
    out = io.StringIO()
    with redirect_stdout(out):
        train.main(argv + ["--print_config"])
    return json.loads(out.getvalue())


def run_in_one_thread(argv):
    """run() in one thread, as every torchrun worker here (OMP_NUM_THREADS=1): the same kernels add
    the same terms in the same order, so DDP equals one process bit for bit. (g1 + g2) / 2 on two
    ranks is g1 / 2 + g2 / 2 over two micro-steps exactly: halving is exact in floating point. With
    another thread count the matmuls sum in another order, and Muon's Newton-Schulz (bfloat16 where
    native) turns those last-bit differences into 1e-4 moves of the weights."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return run(argv)
    finally:
        torch.set_num_threads(threads)


def state(out_dir):
    return torch.load(os.path.join(out_dir, "trainer_state.pt"), weights_only=True)


def test_config_file_overrides_and_types(tmp_path):
    cfg = tmp_path / "c.py"
    cfg.write_text(
        "n_layer = 3\nlearning_rate = 1e-3\ndataset = 'agnews'\nimport math\n_private = 1\n"
    )
    cfg, user_keys = parse(
        [str(cfg), "--n_layer=5", "--learning_rate=1", "--wandb_run_name=bare_word"],
        train.OPTIONS,
        "",
    )
    assert (cfg.n_layer, cfg.learning_rate, cfg.dataset, cfg.wandb_run_name) == (
        5,
        1.0,
        "agnews",
        "bare_word",
    )
    assert type(cfg.learning_rate) is float
    assert user_keys == {"n_layer", "learning_rate", "dataset", "wandb_run_name"}


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--n_layers=4"], "unknown key 'n_layers' in --n_layers=4 \\(did you mean n_layer\\?\\)"),
        (["--n_layer=2.5"], "n_layer=2.5: must be int"),
        (["--compile=yes"], "compile='yes': must be bool"),
        (["--n_layer"], "write --n_layer=VALUE"),
        (["missing.py"], "no config file 'missing.py'"),
        (["--task=regress"], "task='regress': must be one of lm, classify"),
        (["--batch_size=0"], "batch_size=0: must be >= 1"),
        (["--gradient_accumulation_steps=-2"], "gradient_accumulation_steps=-2: must be >= 1"),
        (["--eval_iters=0"], "eval_iters=0: must be >= 1"),
        (["--max_iters=-1"], "max_iters=-1: must be >= 0"),
        (["--learning_rate=-0.1"], "learning_rate=-0.1: must be >= 0"),
        (["--learning_rate=nan"], "learning_rate=nan: must be a finite number"),
        (["--dropout=1.0"], r"dropout=1.0: must be < 1"),
        (["--beta2=1"], r"beta2=1.0: must be < 1"),
        (["--n_embd=100", "--n_head=3"], "n_head=3: must be a divisor of n_embd=100"),
        (["--min_lr=0.1", "--learning_rate=0.01"], "min_lr=0.1: must be <= learning_rate=0.01"),
        (
            ["--init_from=resum"],
            "init_from='resum': must be one of scratch, resume, gpt2.* "
            "\\(did you mean resume\\?\\)",
        ),
        (["--attn_impl=flash"], "attn_impl='flash': must be one of sdpa, explicit"),
        (["--optimizer=sgd"], "optimizer='sgd': must be one of adamw, muon"),
        (["--token_dropout=0.2"], "token_dropout=0.2: must be 0 unless task=classify"),
        (["--dtype=float64"], "dtype='float64': must be one of auto, float32, bfloat16, float16"),
        (
            ["config/agnews.py", "--bow_head=False", "--bow_buckets=64"],
            "bow_buckets=64: must be 0 unless bow_head=True",
        ),
        (["config/agnews.py", "--bow_buckets=-1"], "bow_buckets=-1: must be >= 0"),
        (["--window=-1"], "window=-1: must be >= 0"),
        (["--block_size=64", "--window=65"], "window=65: must be <= block_size=64"),
        (["--block_size=64", "--global_tokens=65"], "global_tokens=65: must be <= block_size=64"),
        (["--block_size=4", "--random_links=5"], "random_links=5: must be <= block_size=4"),
    ],
)
def test_config_errors_are_one_clear_line(argv, message):
    with pytest.raises(Error, match=message):
        settings(argv)


@pytest.mark.parametrize(
    "text, message",
    [
        ("n_layer = 2\nn_head = (\n", r"c.py:2: '\(' was never closed"),
        ("n_layer = 2\nx = 1 / 0\n", "c.py:2: ZeroDivisionError: division by zero"),
        (b"n_layer = 2\n# caf\xe9\n", r"c.py: not UTF-8 text"),
        ("include('nowhere.py')\n", "no config file '.*nowhere.py'"),
    ],
)
def test_config_file_errors_name_the_file_and_line(tmp_path, text, message):
    cfg = tmp_path / "c.py"
    cfg.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(Error, match=message):
        settings([str(cfg)])


def test_include_is_relative_to_the_including_file(tmp_path, monkeypatch):
    (tmp_path / "base.py").write_text("n_layer = 3\nn_embd = 48\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "c.py").write_text("include('../base.py')\nn_embd = 96\n")
    monkeypatch.chdir("/")
    cfg, user_keys = parse([str(tmp_path / "sub" / "c.py")], train.OPTIONS, "")
    assert (cfg.n_layer, cfg.n_embd) == (3, 96) and user_keys == {"n_layer", "n_embd"}


def test_help_says_what_every_key_does(capsys):
    with pytest.raises(SystemExit) as e:
        train.main(["--help"])
    assert e.value.code == 0
    lines = {
        line.split("=")[0].strip(): line
        for line in capsys.readouterr().out.splitlines()
        if line.startswith("  --")
    }
    assert set(lines) == {f"--{k}" for k in train.OPTIONS}
    # a comment beside each default
    assert all(len(line.split("  ")[-1]) > 8 for line in lines.values()), lines
    assert "rotary position embeddings" in lines["--rope"]


def test_print_config_prints_the_resolved_config_and_exits(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert train.main(["config/agnews_notes.py", "--n_layer=3", "--print_config"]) == (None, {})
    c = json.loads(capsys.readouterr().out)
    assert (
        c["n_layer"] == 3
        and c["n_embd"] == 32
        and c["token_dropout"] == 0.0
        and c["out_dir"] == "out-agnews-notes"
    )


def test_lr_schedule():
    cfg = SimpleNamespace(
        **{
            **DEFAULTS,
            "learning_rate": 1.0,
            "min_lr": 0.1,
            "warmup_iters": 10,
            "lr_decay_iters": 110,
        }
    )
    assert train.get_lr(0, cfg) == pytest.approx(1 / 11)  # warmup starts above zero
    assert train.get_lr(9, cfg) == pytest.approx(10 / 11)
    assert train.get_lr(10, cfg) == pytest.approx(1.0)  # peak
    assert train.get_lr(60, cfg) == pytest.approx(0.55)  # cosine halfway: (1 + 0.1) / 2
    # end: min_lr
    assert train.get_lr(110, cfg) == pytest.approx(0.1) and train.get_lr(500, cfg) == 0.1


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_resume_is_exact(lm_dir, tmp_path, optimizer):
    common = [
        f"--dataset={lm_dir}",
        "--dropout=0.1",
        "--eval_interval=3",
        f"--optimizer={optimizer}",
    ]
    straight, straight_metrics = run(common + [f"--out_dir={tmp_path / 'a'}", "--max_iters=6"])
    run(common + [f"--out_dir={tmp_path / 'b'}", "--max_iters=3"])
    assert state(tmp_path / "b")["step"] == 3
    resumed, resumed_metrics = run(
        common + [f"--out_dir={tmp_path / 'b'}", "--max_iters=6", "--init_from=resume"]
    )
    for (name, p), q in zip(straight.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(p, q), name
    assert straight_metrics == resumed_metrics


def test_a_resumed_runs_summary_counts_its_own_steps_and_seconds(lm_dir, tmp_path, capsys):
    """This run's steps and seconds, the step it resumed from, and the run's seconds in all."""
    common = [f"--dataset={lm_dir}", f"--out_dir={tmp_path}", "--eval_interval=3"]
    run(common + ["--max_iters=3"])
    assert re.search(r"^done: 3 steps in [0-9.]+ s$", capsys.readouterr().err, re.MULTILINE)
    saved = state(tmp_path)
    saved["seconds"] = 1000.0  # as if the first run had taken that long
    torch.save(saved, tmp_path / "trainer_state.pt")
    run(common + ["--max_iters=5", "--init_from=resume"])
    done = re.search(r"^done: .*$", capsys.readouterr().err, re.MULTILINE).group()
    match = re.fullmatch(
        r"done: 2 steps in ([0-9.]+) s, resumed from step 3 \(([0-9.]+) s in all\)", done
    )
    assert match and float(match[1]) < 100, done
    assert float(match[2]) == pytest.approx(1000 + float(match[1]), abs=0.11)


def test_resume_with_another_shape_fails(lm_dir, tmp_path):
    run([f"--dataset={lm_dir}", f"--out_dir={tmp_path}", "--max_iters=1"])
    with pytest.raises(Error, match="cannot resume .* n_embd=16 there, 32 here"):
        run(
            [
                f"--dataset={lm_dir}",
                f"--out_dir={tmp_path}",
                "--max_iters=2",
                "--init_from=resume",
                "--n_embd=32",
            ]
        )


def test_resume_with_another_pattern_fails_and_writes_nothing(lm_dir, tmp_path):
    """A pattern has no tensors of its own, but the weights learnt to read through it: a resume
    that changes it is refused as a changed shape is, its checkpoint untouched."""
    common = [f"--dataset={lm_dir}", f"--out_dir={tmp_path}", "--window=8"]
    run(common + ["--max_iters=1", "--global_tokens=2"])
    card = (tmp_path / "config.json").read_bytes()
    for change, message in (
        ("--window=4", "window=8 there, 4 here"),
        ("--random_seed=1", "random_seed=0 there, 1 here"),
    ):
        with pytest.raises(Error, match=f"cannot resume .* {message}"):
            run(common + ["--max_iters=2", "--init_from=resume", change])
    assert (tmp_path / "config.json").read_bytes() == card
    assert state(tmp_path)["step"] == 1


def test_a_state_from_before_the_lora_keys_resumes_as_rank_0(lm_dir, tmp_path):
    """A trainer state saved before the lora keys existed is a run without adapters: a resume
    that asks for them is one line."""
    common = [f"--dataset={lm_dir}", f"--out_dir={tmp_path}"]
    run(common + ["--max_iters=1"])
    old = state(tmp_path)
    for key in ("lora_rank", "lora_alpha", "lora_dropout", "lora_targets"):
        del old["config"][key]
    torch.save(old, tmp_path / "trainer_state.pt")
    with pytest.raises(Error, match="cannot resume .* lora_rank=0 there, 4 here"):
        run(common + ["--max_iters=2", "--init_from=resume", "--lora_rank=4"])


def test_a_fine_tune_keeps_its_sources_pattern_unless_named(lm_dir, tmp_path, capsys):
    base = tmp_path / "base"
    pattern = ["--window=8", "--global_tokens=2", "--rope=True"]
    run([f"--dataset={lm_dir}", f"--out_dir={base}", "--max_iters=1"] + pattern)
    tuned = [f"--dataset={lm_dir}", f"--out_dir={tmp_path / 'tuned'}", f"--init_from={base}"]
    capsys.readouterr()
    model, _ = run(tuned + ["--max_iters=1"])
    assert (model.config.rope, model.config.window, model.config.global_tokens) == (True, 8, 2)
    said = capsys.readouterr().err
    assert f"init_from={base}: the pattern window=8, global_tokens=2" in said
    model, _ = run(tuned + ["--max_iters=1", "--window=4"])
    assert (model.config.window, model.config.global_tokens) == (4, 2)
    assert "the command names window=4 (its 8)" in capsys.readouterr().err


# GPTConfig's keys that a fine-tune may set apart from its start's: they change the training, not
# the function the weights compute
MAY_DIFFER = {"dropout", "attn_impl"}
# a start's value of each key a fine-tune takes from it, none of them train.py's default
START = dict(
    vocab_size=12,
    block_size=16,
    n_layer=2,
    n_head=4,
    n_embd=16,
    bias=True,
    rope=True,
    qk_norm=True,
    gelu="none",
    window=4,
    global_tokens=1,
    random_links=1,
    random_seed=3,
)


def test_a_fine_tune_computes_as_its_start(lm_dir, tmp_path):
    """Each of GPTConfig's keys is taken from the start or may differ; a fine-tune's card holds the
    start's value of each taken key, and a command that names another is refused."""
    taken = set(checkpoint.SHAPE + checkpoint.PATTERN) & {f.name for f in fields(GPTConfig)}
    assert {f.name for f in fields(GPTConfig)} - taken == MAY_DIFFER
    assert START.keys() == taken
    assert all(value != DEFAULTS[k] for k, value in START.items())
    save_pretrained(GPT(GPTConfig(**START)), tmp_path / "start", task="lm", tokenizer=CHARS)
    # TINY's block_size: a context no longer than the start's, which a fine-tune may cut
    keys = [a for a in TINY if a[2:].partition("=")[0] not in taken - set(RESIZED)]
    tuned = keys + [f"--dataset={lm_dir}", f"--init_from={tmp_path / 'start'}", "--max_iters=1"]
    train.main(tuned + [f"--out_dir={tmp_path / 'tuned'}"])
    card = json.loads((tmp_path / "tuned" / "config.json").read_text())
    assert {k: card["model"][k] for k in taken} == START
    with pytest.raises(Error, match=r"names n_layer=1 \(its 2\), gelu='tanh' \(its 'none'\): drop"):
        train.main(tuned + [f"--out_dir={tmp_path / 'x'}", "--gelu=tanh", "--n_layer=1"])
    assert not (tmp_path / "x" / "model.safetensors").exists()


def test_a_fine_tune_reads_its_starts_context_unless_named_longer(lm_dir, tmp_path):
    """A start of block_size 8 and a command that names none (the default, 256): the fine-tune
    reads 8 tokens, its data's rows too; a command that names 16 is refused in one line."""
    start = {"n_layer": 1, "n_head": 2, "n_embd": 16, "block_size": 8, "vocab_size": 10}
    save_pretrained(GPT(GPTConfig(**start)), tmp_path / "start", task="lm", tokenizer=CHARS)
    keys = [a for a in TINY if not a.startswith("--block_size=")]
    tuned = keys + [f"--dataset={lm_dir}", f"--init_from={tmp_path / 'start'}", "--max_iters=1"]
    assert DEFAULTS["block_size"] > 8
    train.main(tuned + [f"--out_dir={tmp_path / 'tuned'}"])
    card = json.loads((tmp_path / "tuned" / "config.json").read_text())
    assert card["model"]["block_size"] == 8
    with pytest.raises(Error, match=r"reads 8 tokens at most, the command names block_size=16"):
        train.main(tuned + [f"--out_dir={tmp_path / 'x'}", "--block_size=16"])
    assert not (tmp_path / "x" / "model.safetensors").exists()


def test_a_fine_tune_that_cuts_the_context_saves_its_position_rows(lm_dir, tmp_path):
    """A start of block_size 16, a full fine-tune of 8: its checkpoint holds the 8 rows it
    trained."""
    start = {"n_layer": 1, "n_head": 2, "n_embd": 16, "block_size": 16, "vocab_size": 10}
    save_pretrained(GPT(GPTConfig(**start)), tmp_path / "start", task="lm", tokenizer=CHARS)
    keys = [a for a in TINY if not a.startswith("--block_size=")] + ["--block_size=8"]
    tuned = keys + [f"--dataset={lm_dir}", f"--init_from={tmp_path / 'start'}", "--max_iters=1"]
    train.main(tuned + [f"--out_dir={tmp_path / 'tuned'}"])
    model, _ = load_pretrained(tmp_path / "tuned")
    assert model.wpe.weight.shape == (8, 16)


def test_accumulation_equals_one_big_batch(lm_dir, tmp_path):
    common = [f"--dataset={lm_dir}", "--max_iters=4"]
    big, _ = run(common + [f"--out_dir={tmp_path / 'a'}", "--batch_size=8"])
    small, _ = run(
        common
        + [f"--out_dir={tmp_path / 'b'}", "--batch_size=2", "--gradient_accumulation_steps=4"]
    )
    for p, q in zip(big.parameters(), small.parameters()):
        assert torch.allclose(p, q, atol=1e-5)


def torchrun(tmp_path, runs, processes=2):
    """train.main on each argv of runs in turn, in one torchrun launch (gloo; conftest.in_turn),
    each rank saving (state dict, metrics) as rank<N>.pt in the run's out_dir, with a test's peak
    FLOP/s (1e15) so that MFU is a known function of the rate. -> the finished process."""
    listed = tmp_path / "runs.json"
    listed.write_text(json.dumps(runs))
    script = tmp_path / "ddp_run.py"
    script.write_text(
        f"import sys\nsys.path[:0] = [{ROOT!r}, {HERE!r}]\nimport test_train\n"
        "test_train.each_run(sys.argv[1])\n"
    )
    return run_distributed(script, [str(listed)], processes)


def each_run(listed):
    """In a torchrun process: the runs of torchrun() in turn."""
    train.peak_flops = fixed_peak
    in_turn(json.load(open(listed)), run_and_save)


def fixed_peak(device, dtype):
    return 1e15


def run_and_save(argv):
    """train.main(argv), this rank's (state dict, metrics) saved in its out_dir."""
    model, metrics = train.main(argv)
    (out_dir,) = [a.removeprefix("--out_dir=") for a in argv if a.startswith("--out_dir=")]
    torch.save((model.state_dict(), metrics), os.path.join(out_dir, f"rank{os.environ['RANK']}.pt"))


# (optimizer, micro-steps) of test_ddp_two_processes_equal_one_process
DDP = [("adamw", 4), ("muon", 2)]


def ddp_argv(lm_dir, optimizer, micro_steps):
    """test_ddp_two_processes_equal_one_process's run, out_dir aside."""
    return TINY + [
        f"--dataset={lm_dir}",
        "--max_iters=3",
        f"--gradient_accumulation_steps={micro_steps}",
        "--eval_interval=100",
        f"--optimizer={optimizer}",
        "--log_interval=1",
    ]


@pytest.fixture(scope="module")
def launched(lm_dir, tmp_path_factory):
    """The torchrun runs of the DDP tests below, in one launch (each start of the processes
    costs seconds): each of DDP's runs into <optimizer>/ddp, then a run of 2 steps into bare and
    its bare resume to 4. -> (their folder, the finished process)"""
    tmp = tmp_path_factory.mktemp("launched")
    runs = [ddp_argv(lm_dir, *run) + [f"--out_dir={tmp / run[0] / 'ddp'}"] for run in DDP]
    bare = f"--out_dir={tmp / 'bare'}"
    first = [f"--dataset={lm_dir}", "--max_iters=2", "--gradient_accumulation_steps=2", bare]
    runs += [TINY + first, [bare, "--init_from=resume", "--max_iters=4"]]
    return tmp, torchrun(tmp, runs)


@pytest.mark.slow
@pytest.mark.parametrize("optimizer, micro_steps", DDP)
def test_ddp_two_processes_equal_one_process(lm_dir, launched, tmp_path, optimizer, micro_steps):
    """Two ranks share the micro-steps (DDP's no_sync on all but each rank's last) and average:
    the parameters of one process accumulating all of them; MFU is each device's own (the rate
    is the job's). The ranks agree bit for bit. AdamW over four: one process adds the
    micro-gradients as ((a + b) + c) + d, two as (a + b) + (c + d): the sums differ in their last
    bit (2^-24 relative), and AdamW's update, a ratio of moments, passes that on at about that
    relative size: 3 steps x lr 1e-2 x 1e-7, a few 1e-9 (6e-8 measured at most); 1e-6 is far
    above that and far below an update (1e-2). Muon over two: (a + b) / 2 on two ranks is
    a / 2 + b / 2 exactly (halving is exact), so the weights are equal bit for bit. Over four
    its Newton-Schulz, in bfloat16 where native, can turn a last-bit difference into a move of
    5e-5 (one momentum entry rounding to the other bfloat16 neighbour)."""
    atol = 1e-6 if optimizer == "adamw" else 0.0
    argv = ddp_argv(lm_dir, optimizer, micro_steps)
    folder, result = launched
    assert result.returncode == 0, result.stderr[-2000:]
    ddp = folder / optimizer / "ddp"
    single, metrics = run_in_one_thread(argv[len(TINY) :] + [f"--out_dir={tmp_path / 'one'}"])
    (rank0, metrics0), (rank1, metrics1) = (
        torch.load(ddp / "rank0.pt"),
        torch.load(ddp / "rank1.pt"),
    )
    for name, p in single.state_dict().items():
        assert torch.equal(rank0[name], rank1[name]) and torch.allclose(
            rank0[name], p, rtol=0, atol=atol
        ), name
    # evaluation is shared out over the ranks and its sums all-reduced: the same float32 terms
    # (losses near 2.3) added in another order, each sum off by a few units in the last place
    # (2.4e-7 at 2.3), far below 1e-5
    assert metrics0 == metrics1 and metrics0 == pytest.approx(metrics, abs=1e-5)
    logs = [r for r in map(json.loads, open(ddp / "metrics.jsonl")) if "mfu" in r]
    # block_size 16, 2 processes
    per_device = [flops_per_token(single, 16) * r["tok/s"] / 2 / 1e15 for r in logs]
    assert len(logs) == 3 and [r["mfu"] for r in logs] == pytest.approx(per_device, rel=1e-9)


@pytest.mark.slow
def test_a_bare_resume_under_torchrun_takes_the_saved_settings(launched):
    """torchrun ... --out_dir=X --init_from=resume (launched's last run): the saved
    gradient_accumulation_steps (2, a multiple of the 2 processes) is in before the check, not the
    default 1."""
    folder, result = launched
    assert result.returncode == 0, result.stderr[-2000:]
    assert (
        state(folder / "bare")["step"] == 4
        and state(folder / "bare")["config"]["gradient_accumulation_steps"] == 2
    )


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator, /proc")
def test_a_cpu_run_keeps_the_memory_a_large_tensor_frees(lm_dir, tmp_path):
    """After a CPU run begins, a freed large tensor's memory stays for the next one (not mapped
    afresh, its pages zeroed by the kernel, at every step): freeing 256 MiB keeps it resident."""
    argv = TINY + [f"--dataset={lm_dir}", f"--out_dir={tmp_path / 'o'}", "--max_iters=1"]
    code = f"""
import torch, train
train.main({argv!r})
def resident():
    fields = dict(line.split(":", 1) for line in open("/proc/self/status"))
    return int(fields["VmRSS"].split()[0]) / 1024
x = torch.ones(2**26)
held = resident()
del x
print(held - resident())
"""
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-500:]
    assert float(result.stdout) < 16  # MiB handed back


@pytest.mark.slow
def test_a_refusal_on_rank_0_is_every_ranks_one_line(lm_dir, tmp_path):
    """A new run into an out_dir that holds a checkpoint: rank 0 refuses it (it holds the lock), and
    the other rank prints the same line and exits too, instead of waiting in the group for a rank
    that is gone."""
    run([f"--dataset={lm_dir}", f"--out_dir={tmp_path / 'taken'}", "--max_iters=1"])
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=2",
            os.path.join(ROOT, "train.py"),
        ]
        + TINY
        + [
            f"--dataset={lm_dir}",
            "--max_iters=1",
            f"--out_dir={tmp_path / 'taken'}",
            "--gradient_accumulation_steps=2",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0 and result.stderr.count("already holds a checkpoint") == 2, (
        result.stderr[-2000:]
    )
    assert result.stderr.count("train.py: error: out_dir") == 2


def test_the_dtype_asked_for_is_saved_and_resolved_on_each_start(lm_dir, tmp_path):
    """dtype=auto is saved as auto (a resume on other hardware resolves it there), not as what it
    meant here."""
    run([f"--dataset={lm_dir}", f"--out_dir={tmp_path}", "--max_iters=2", "--dtype=auto"])
    assert state(tmp_path)["config"]["dtype"] == "auto"
    assert json.load(open(tmp_path / "train_config.json"))["dtype"] == "auto"
    # a bare resume: no TINY's dtype
    train.main([f"--out_dir={tmp_path}", "--max_iters=3", "--init_from=resume"])
    assert state(tmp_path)["config"]["dtype"] == "auto" and state(tmp_path)["step"] == 3


def measured_bfloat16(what, shape, measure, options):
    return "bfloat16"


def never_measured(*args):
    raise AssertionError("measured, for a dtype the command named")


def test_dtype_auto_on_a_cpu_trains_in_the_dtype_measured_fastest(
    lm_dir, tmp_path, monkeypatch, capsys
):
    """The choice of lib/autotune.py, not the CPU's flags; an explicit dtype is never timed."""
    from lib import autotune

    monkeypatch.setattr(autotune, "choose", measured_bfloat16)
    run([f"--dataset={lm_dir}", f"--out_dir={tmp_path}", "--max_iters=1", "--dtype=auto"])
    assert "on cpu, bfloat16" in capsys.readouterr().err
    monkeypatch.setattr(autotune, "choose", never_measured)
    for dtype in ("float32", "bfloat16"):
        run([f"--dataset={lm_dir}", f"--out_dir={tmp_path}", "--max_iters=1", f"--dtype={dtype}"])
        assert f"on cpu, {dtype}" in capsys.readouterr().err


def test_a_stop_signal_saves_before_a_due_evaluation(lm_dir, tmp_path, monkeypatch):
    """SIGTERM during step 3's batch: the run saves at step 4 and exits without evaluating step 4
    first (torchrun and SLURM kill a job soon after SIGTERM); the resumed run evaluates step 4 when
    it starts."""
    to_device = train.to_device
    batches = []

    def signalled(batch, device):
        batches.append(batch)
        # each step: its evaluation (2 batches of train, 2 of val), then 1 training batch
        if len(batches) == 20:
            os.kill(os.getpid(), signal.SIGTERM)  # during step 3, the 4th
        return to_device(batch, device)

    monkeypatch.setattr(train, "to_device", signalled)
    with pytest.raises(SystemExit) as stopped:
        run([f"--dataset={lm_dir}", f"--out_dir={tmp_path}", "--max_iters=10", "--eval_interval=1"])
    assert stopped.value.code == 128 + signal.SIGTERM and state(tmp_path)["step"] == 4
    evaluated = [
        r["step"] for r in map(json.loads, open(tmp_path / "metrics.jsonl")) if "val/loss" in r
    ]
    assert evaluated == [0, 1, 2, 3]


def test_locks_tell_a_held_lock_from_a_filesystem_without_locks(tmp_path, monkeypatch):
    import errno
    import fcntl

    def no_locks(*args):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    with pytest.raises(Error, match="cannot be locked .* a filesystem without flock"):
        with checkpoint.run_out_dir(str(tmp_path), resuming=False, overwrite=False):
            pass


@pytest.mark.parametrize("device", ["cuda:1", "mps"])
def test_one_device_for_several_processes_is_refused(device, monkeypatch):
    monkeypatch.setattr(
        os, "environ", {**os.environ, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2"}
    )
    with pytest.raises(
        Error, match=f"--device {device} with 2 processes: each process takes its own GPU"
    ):
        with started(device):
            pass


@pytest.mark.slow
def test_two_nodes_equal_one_process(lm_dir, tmp_path):
    """docs/scaling.md's multi-node command, as two "nodes" on this machine:
    torchrun --nnodes=2 --node_rank=0|1 with one process each, meeting at 127.0.0.1 (gloo), give the
    parameters of one process."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = tmp_path / "node_run.py"
    script.write_text(
        f"import os, sys, torch\nsys.path.insert(0, {ROOT!r})\nimport train\n"
        "model, _ = train.main(sys.argv[1:])\n"
        "torch.save(model.state_dict(), "
        f"os.path.join({str(tmp_path)!r}, 'rank%s.pt' % os.environ['RANK']))\n"
    )
    argv = TINY + [
        f"--dataset={lm_dir}",
        "--max_iters=3",
        "--gradient_accumulation_steps=2",
        "--eval_interval=100",
    ]
    nodes = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes=2",
                f"--node_rank={rank}",
                "--nproc_per_node=1",
                "--master_addr=127.0.0.1",
                f"--master_port={port}",
                str(script),
            ]
            + argv
            + [f"--out_dir={tmp_path / 'nodes'}"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
        for rank in (0, 1)
    ]
    for node in nodes:
        err = node.communicate(timeout=180)[1]
        assert node.returncode == 0, err[-2000:]
    single, _ = run_in_one_thread(argv[len(TINY) :] + [f"--out_dir={tmp_path / 'one'}"])
    rank0, rank1 = torch.load(tmp_path / "rank0.pt"), torch.load(tmp_path / "rank1.pt")
    for name, p in single.state_dict().items():
        assert torch.equal(rank0[name], rank1[name]) and torch.equal(rank0[name], p), name


def test_nan_loss_stops_and_keeps_last_checkpoint(lm_dir, tmp_path, monkeypatch):
    run([f"--dataset={lm_dir}", f"--out_dir={tmp_path}", "--max_iters=2"])
    before = {
        f: (tmp_path / f).read_bytes()
        for f in ("model.safetensors", "trainer_state.pt", "config.json")
    }
    forward = GPT.forward
    monkeypatch.setattr(
        GPT,
        "forward",
        lambda self, *a, **k: (
            lambda out: (
                (out[0], out[1] * float("nan")) if self.training and out[1] is not None else out
            )
        )(forward(self, *a, **k)),
    )
    with pytest.raises(Error, match="loss nan, gradient norm nan at step 2"):
        run(
            [
                f"--dataset={lm_dir}",
                f"--out_dir={tmp_path}",
                "--max_iters=6",
                "--init_from=resume",
                "--eval_interval=1",
            ]
        )
    assert before == {f: (tmp_path / f).read_bytes() for f in before}


def test_interrupted_save_leaves_previous_checkpoint(lm_dir, tmp_path, monkeypatch):
    run([f"--dataset={lm_dir}", f"--out_dir={tmp_path}", "--max_iters=2"])
    good = state(tmp_path)

    def dies_mid_write(obj, path):
        open(path, "wb").write(b"half a checkpoint")
        raise KeyboardInterrupt  # as a crash mid-write would

    monkeypatch.setattr(torch, "save", dies_mid_write)
    with pytest.raises(KeyboardInterrupt):
        run(
            [
                f"--dataset={lm_dir}",
                f"--out_dir={tmp_path}",
                "--max_iters=4",
                "--init_from=resume",
                "--eval_interval=1",
            ]
        )
    assert state(tmp_path)["step"] == good["step"] == 2


def logged_a_step(out_dir):
    """Whether a run's metrics.jsonl holds a log line, not only step 0's evaluation."""
    path = out_dir / "metrics.jsonl"
    return path.exists() and '"tok/s"' in path.read_text()


@pytest.mark.slow
def test_sigterm_saves_a_loadable_checkpoint(lm_dir, tmp_path):
    proc = subprocess.Popen(
        [sys.executable, os.path.join(ROOT, "train.py")]
        + TINY
        + [
            f"--dataset={lm_dir}",
            f"--out_dir={tmp_path}",
            "--max_iters=1000000",
            "--eval_interval=100000",
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    # training under way: its first log line (step 10) written
    wait_for(proc, partial(logged_a_step, tmp_path), "a log line")
    proc.send_signal(signal.SIGTERM)
    err = proc.communicate(timeout=60)[1]
    assert proc.returncode == 128 + signal.SIGTERM, err[-1000:]
    assert "stopped by signal" in err and state(tmp_path)["step"] > 0


@pytest.mark.slow
def test_ddp_signal_to_one_rank_stops_every_rank_at_the_same_step(lm_dir, tmp_path):
    # each rank writes its pid, so the test can signal rank 1 alone
    script = tmp_path / "ddp_run.py"
    script.write_text(
        f"import os, sys\nsys.path.insert(0, {ROOT!r})\nimport train\n"
        f"open(os.path.join({str(tmp_path)!r}, 'pid%s' % os.environ['RANK']), 'w')"
        ".write(str(os.getpid()))\n"
        "train.main(sys.argv[1:])\n"
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=2",
            str(script),
        ]
        + TINY
        + [
            f"--dataset={lm_dir}",
            f"--out_dir={tmp_path}",
            "--max_iters=1000000",
            "--eval_interval=100000",
            "--gradient_accumulation_steps=2",
        ],
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        start_new_session=True,
    )  # a process group: a hung run is killed whole below
    try:
        # training under way: its first log line (step 10) written
        wait_for(proc, partial(logged_a_step, tmp_path), "a log line")
        os.kill(int((tmp_path / "pid1").read_text()), signal.SIGTERM)
        err = proc.communicate(timeout=60)[1]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    stops = re.findall(r"stopped by signal 15 at step (\d+);", err)
    # rank 0 was never signalled, yet stopped with rank 1, at the same step, after saving it. (How
    # each rank's exit is reported is up to torchrun's agent, which signals the remaining rank once
    # one exits: not asserted.)
    assert len(stops) == 2 and stops[0] == stops[1], err[-2000:]
    assert proc.returncode != 0 and state(tmp_path)["step"] == int(stops[0])


def test_one_host_device_read_per_training_step(lm_dir, tmp_path, monkeypatch):
    """Every read of a tensor's value stalls a GPU's queue: one per step (loss, gradient norm and
    stop signal together) and one per split evaluated. Counted here as the calls that turn a tensor
    into Python numbers."""
    reads = []
    for name in ("item", "tolist", "__float__", "__int__", "__bool__"):
        method = getattr(torch.Tensor, name)
        monkeypatch.setattr(
            torch.Tensor,
            name,
            lambda self, *a, _m=method, _n=name, **k: reads.append(_n) or _m(self, *a, **k),
        )
    run(
        [
            f"--dataset={lm_dir}",
            f"--out_dir={tmp_path}",
            "--max_iters=6",
            "--eval_interval=3",
            "--eval_iters=4",
        ]
    )
    # one read per split evaluated (train, val), one per step
    evaluation, step = ["tolist"] * 2, ["tolist"]
    # evaluated at 0, 3, 6
    assert reads == evaluation + step * 3 + evaluation + step * 3 + evaluation, reads


def test_classifier_learns_a_separable_task(toy_classify_dir, tmp_path):
    _, metrics = run(
        [
            f"--dataset={toy_classify_dir}",
            f"--out_dir={tmp_path}",
            "--task=classify",
            "--max_iters=40",
            "--eval_interval=20",
            "--eval_iters=100",
            "--batch_size=16",
            "--token_dropout=0.2",
        ]
    )
    assert metrics["val/accuracy"] > 0.9
    import json

    info = json.load(open(tmp_path / "config.json"))
    assert info["architecture"] == "EncoderClassifier" and info["label_names"] == ["low", "high"]


def test_bow_head_table_learns_at_its_multiple_of_the_scheduled_rate(toy_classify_dir, tmp_path):
    """The schedule sets every group's rate; bow_head's table gets BOW_LR_SCALE times it, and the
    pair still learns."""
    scale = EncoderClassifier.BOW_LR_SCALE
    _, metrics = run(
        [
            f"--dataset={toy_classify_dir}",
            f"--out_dir={tmp_path}",
            "--task=classify",
            "--max_iters=40",
            "--eval_interval=20",
            "--eval_iters=100",
            "--batch_size=16",
            "--bow_head=True",
            "--bow_buckets=16",
            "--learning_rate=1e-4",
            "--min_lr=1e-5",
        ]
    )
    assert metrics["val/accuracy"] > 0.9
    (groups,) = [o["param_groups"] for o in state(tmp_path)["optimizers"]]
    scheduled = train.get_lr(
        40,
        SimpleNamespace(
            **{
                **DEFAULTS,
                "learning_rate": 1e-4,
                "min_lr": 1e-5,
                "warmup_iters": 2,
                "lr_decay_iters": 10,
            }
        ),
    )
    assert scale > 1 and [g["lr"] for g in groups] == pytest.approx(
        [scheduled] * (len(groups) - 1) + [scheduled * scale]
    )


@pytest.mark.slow
def test_wandb_offline_run_has_metrics(lm_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    run([f"--dataset={lm_dir}", f"--out_dir={tmp_path}", "--max_iters=2", "--wandb_log=True"])
    # wandb's service process may still be writing after finish() (failed once in ~13 runs)
    for _ in range(50):
        runs = list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
        if runs and b"val/loss" in runs[0].read_bytes():
            break
        time.sleep(0.2)
    assert runs and b"val/loss" in runs[0].read_bytes(), [(r, r.stat().st_size) for r in runs]


def test_bad_setups_fail_before_training(lm_dir, tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(Error, match="is not writable"):
        run([f"--dataset={lm_dir}", f"--out_dir={tmp_path / 'file' / 'out'}"])
    with pytest.raises(Error, match="run python data/never_prepared/prepare.py first"):
        run(["--dataset=never_prepared", f"--out_dir={tmp_path / 'o'}"])
    with pytest.raises(Error, match="prepared for task=lm, but task=classify"):
        run([f"--dataset={lm_dir}", f"--out_dir={tmp_path / 'o'}", "--task=classify"])
    with pytest.raises(Error, match="init_from=resume but .* does not exist"):
        run([f"--dataset={lm_dir}", f"--out_dir={tmp_path / 'fresh'}", "--init_from=resume"])
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "trainer_state.pt").write_bytes(b"half a file")
    with pytest.raises(
        Error, match="cannot resume from .* not a trainer state that train.py wrote"
    ):
        run([f"--dataset={lm_dir}", f"--out_dir={tmp_path / 'broken'}", "--init_from=resume"])


@pytest.mark.parametrize("name", sorted(os.listdir(os.path.join(ROOT, "config"))))
def test_every_config_file_parses_from_any_directory(name, monkeypatch, tmp_path):
    # include() paths are relative to the config file, not to the working directory, where
    # config/chat.py's base model is a folder
    (tmp_path / "out-shakespeare-char-cpu").mkdir()
    monkeypatch.chdir(tmp_path)
    path = os.path.join(ROOT, "config", name)
    if name.endswith("_rl.py"):  # rl.py's options
        assert parse([path], rl.OPTIONS, "")[0].out_dir != rl.OPTIONS["out_dir"].default
        return
    # each its own folder
    assert settings([path])["out_dir"] != DEFAULTS["out_dir"]


def readme_torchrun_commands():
    """(processes in all, config file) of every torchrun command README.md and docs/ give."""
    commands = []
    for page in PAGES:
        for line in open(os.path.join(ROOT, page), encoding="utf-8"):
            if line.lstrip().startswith("torchrun"):
                nodes = (
                    int(re.search(r"--nnodes=(\d+)", line).group(1)) if "--nnodes" in line else 1
                )
                per_node = int(re.search(r"--nproc_per_node=(\d+)", line).group(1))
                commands.append((nodes * per_node, re.search(r"train\.py (\S+)", line).group(1)))
    return commands


def test_readme_torchrun_commands_fit_their_configs():
    """Each process takes an equal share of the micro-steps: the multi-GPU and multi-node commands
    of docs/scaling.md must divide their config's gradient_accumulation_steps, or every rank stops
    at the check."""
    commands = readme_torchrun_commands()
    assert {n for n, _ in commands} >= {8, 16}, commands
    for processes, config_file in commands:
        steps = settings([os.path.join(ROOT, config_file)])["gradient_accumulation_steps"]
        assert steps % processes == 0, (config_file, processes)


def test_classifier_starts_from_a_gpt_checkpoint(lm_dir, toy_classify_dir, tmp_path):
    """init_from a GPT of ours: the encoder takes its embeddings and Blocks (the same names), only
    the head is new. The GPT's text is tokenized as the classifier's rows."""
    lm = tmp_path / "lm"
    shutil.copytree(lm_dir, lm)
    meta = json.load(open(lm / "meta.json"))
    meta["tokenizer"] = json.load(open(os.path.join(toy_classify_dir, "meta.json")))["tokenizer"]
    write_meta(lm, **{**meta, "vocab_size": 20})
    gpt, _ = run([f"--dataset={lm}", f"--out_dir={tmp_path / 'gpt'}", "--max_iters=2"])
    classifier, _ = run(
        [
            f"--dataset={toy_classify_dir}",
            f"--out_dir={tmp_path / 'cls'}",
            "--task=classify",
            "--max_iters=0",
            f"--init_from={tmp_path / 'gpt'}",
        ]
    )
    body = {k: v for k, v in gpt.state_dict().items() if not k.startswith("lm_head")}
    assert classifier.config.block_size == 16  # the GPT's context, none named
    for name, p in body.items():
        assert torch.equal(classifier.state_dict()[name], p), name
    with pytest.raises(Error, match="the model has 16 tokens, dataset .* needs 20"):
        run(
            [
                f"--dataset={toy_classify_dir}",
                f"--out_dir={tmp_path / 'x'}",
                "--task=classify",
                "--vocab_size=16",
            ]
        )


def test_resume_a_run_that_started_from_pretrained_weights(lm_dir, tmp_path):
    """The shape of such a run comes from the weights (2 layers here), not from the config (1
    layer, TINY's): resume keeps it."""
    run([f"--dataset={lm_dir}", f"--out_dir={tmp_path / 'base'}", "--max_iters=1", "--n_layer=2"])
    tuned = [f"--dataset={lm_dir}", f"--out_dir={tmp_path / 'tuned'}"]
    run(tuned + ["--max_iters=2", "--n_layer=2", f"--init_from={tmp_path / 'base'}"])
    model, _ = run(tuned + ["--max_iters=3", "--init_from=resume"])
    assert model.config.n_layer == 2 and state(tmp_path / "tuned")["step"] == 3


def test_explicit_attention_trains_as_the_fused_path(lm_dir, tmp_path):
    """attn_impl=explicit runs model.attention(), the math: the same training as SDPA to float
    rounding."""
    common = [f"--dataset={lm_dir}", "--max_iters=6", "--eval_interval=3"]
    _, fused = run(common + [f"--out_dir={tmp_path / 'a'}"])
    _, explicit = run(common + [f"--out_dir={tmp_path / 'b'}", "--attn_impl=explicit"])
    assert fused["val/loss"] == pytest.approx(explicit["val/loss"], abs=1e-5)
    assert fused["val/loss"] < 2.1  # and it did learn: ln(10) = 2.30 at the start


def test_scaler_state_is_loaded_only_between_enabled_scalers():
    def enabled():
        return torch.amp.GradScaler("cpu", enabled=True, init_scale=2.0**10)

    def restore(scaler, saved):
        return checkpoint.restore(
            {"optimizers": [], "scaler": saved, "step": 3, "best": None}, [], scaler
        )

    scaler = enabled()
    # a bf16 or fp32 run resumed with float16: its own initial scale
    assert restore(scaler, {}) == (3, None, 0.0)
    assert scaler.get_scale() == 2.0**10
    saved = enabled().state_dict() | {"scale": 8.0}
    restore(scaler, saved)
    assert scaler.get_scale() == 8.0
    disabled = torch.amp.GradScaler("cpu", enabled=False)
    restore(disabled, saved)  # float16 resumed as bf16: the scale is dropped
    assert not disabled.is_enabled()


def test_mfu_is_the_models_flops_against_the_peak_and_records_are_written(
    lm_dir, tmp_path, monkeypatch
):
    """MFU = the model's training FLOPs per token x tokens/s / the device's peak, on each log line.
    metrics.jsonl holds every evaluation and log step; a resume appends, and its clock goes on."""
    peak = 1e15
    monkeypatch.setattr(train, "peak_flops", lambda device, dtype: peak)
    model, _ = run(
        [
            f"--dataset={lm_dir}",
            f"--out_dir={tmp_path}",
            "--max_iters=4",
            "--eval_interval=2",
            "--log_interval=1",
        ]
    )
    run(
        [
            f"--dataset={lm_dir}",
            f"--out_dir={tmp_path}",
            "--max_iters=6",
            "--eval_interval=2",
            "--log_interval=1",
            "--init_from=resume",
        ]
    )
    lines = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    logs, evals = [r for r in lines if "mfu" in r], [r for r in lines if "val/loss" in r]
    assert [r["step"] for r in logs] == [1, 2, 3, 4, 5, 6]
    per_token = flops_per_token(model, 16)  # block_size 16
    assert all(r["mfu"] == pytest.approx(per_token * r["tok/s"] / peak, rel=1e-9) for r in logs)
    assert all({"train/step_loss", "lr", "tok/s", "grad_norm", "seconds"} <= set(r) for r in logs)
    # the resumed run's own evaluation at 4 replaces the first
    assert [r["step"] for r in evals] == [0, 2, 4, 6]
    assert all(a["seconds"] <= b["seconds"] for a, b in zip(lines, lines[1:]))
    plot.main([str(tmp_path), f"--out={tmp_path}/loss.png"])  # the curves drawn from these records
    assert (tmp_path / "loss.png").read_bytes()[:4] == b"\x89PNG"


def test_a_device_without_a_peak_logs_no_mfu(lm_dir, tmp_path):
    """On a CPU no datasheet peak is known: the log lines hold the speed, and no MFU."""
    run([f"--dataset={lm_dir}", f"--out_dir={tmp_path}", "--max_iters=3", "--log_interval=1"])
    logs = [r for r in map(json.loads, open(tmp_path / "metrics.jsonl")) if "tok/s" in r]
    assert len(logs) == 3 and not any("mfu" in r for r in logs)


def test_a_run_says_how_many_times_it_reads_its_data_and_warns_past_a_few(
    lm_dir, toy_classify_dir, tmp_path, capsys
):
    """Epochs by their definition: rows read / rows held (a classifier's), tokens read / tokens
    held (a language model's: block_size a row); past MAX_EPOCHS the line is a warning."""
    lm = load_split(lm_dir, "train", 16)
    cfg = SimpleNamespace(max_iters=10, batch_size=4, gradient_accumulation_steps=2)
    assert epochs_line(lm, cfg).startswith(
        f"10 steps read the training data {10 * 4 * 2 * 16 / 5000:.1f} times"
    )
    rows = load_split(toy_classify_dir, "train", 16)
    many = SimpleNamespace(max_iters=600, batch_size=4, gradient_accumulation_steps=2)
    line = epochs_line(rows, many)
    assert line.startswith(f"warning: 600 steps read the training data {600 * 8 / 400:.1f} times")
    assert MAX_EPOCHS < 600 * 8 / 400
    run([f"--dataset={lm_dir}", "--max_iters=2", f"--out_dir={tmp_path}"])
    assert "2 steps read the training data 0.0 times (epochs)" in capsys.readouterr().err


def test_a_plain_run_trains_on_a_torch_without_muon(lm_dir, tmp_path):
    """Muon is an option (muon.py, imported by optimizer=muon alone): a torch that lacks
    torch.optim.Muon still trains with AdamW, and refuses only the option."""
    argv = TINY + [f"--dataset={lm_dir}", "--max_iters=2", f"--out_dir={tmp_path / 'plain'}"]
    code = (
        "import sys, torch; del torch.optim.Muon; sys.path.insert(0, sys.argv[1]); "
        "import train; from lib.common import run_script; "
        "run_script(lambda: train.main(sys.argv[2:]), 'train.py'); print('trained')"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, ROOT, *argv], capture_output=True, text=True
    )
    assert result.stdout.strip().endswith("trained"), result.stderr[-2000:]
    muon = [*argv[:-1], f"--out_dir={tmp_path / 'muon'}", "--optimizer=muon"]
    result = subprocess.run(
        [sys.executable, "-c", code, ROOT, *muon], capture_output=True, text=True
    )
    assert result.returncode == 2 and "trained" not in result.stdout
    assert result.stderr.startswith("train.py: error: optimizer='muon': must be adamw: torch ")


def test_a_classifiers_recorded_val_metrics_are_classify_pys_float32_ones(
    toy_classify_dir, tmp_path
):
    """Trained under bfloat16 autocast, a classifier is evaluated in float32, as classify.py and
    the playground run it: the recorded val loss is lib.classifier's on the same rows, within
    float32's rounding (bfloat16's would be 1e-3 off), and the accuracy is the same number."""
    model, metrics = run(
        [
            f"--dataset={toy_classify_dir}",
            f"--out_dir={tmp_path}",
            "--task=classify",
            "--dtype=bfloat16",
            "--max_iters=4",
            "--eval_interval=4",
            "--eval_iters=100",
            "--batch_size=16",
        ]
    )
    val = load_split(toy_classify_dir, "val", 16)
    rows = [val.tokens[a:b][:16] for a, b in zip(val.offsets[:-1], val.offsets[1:])]
    probs = classifier.predict(model.eval(), rows, 64, "cpu")
    labels = torch.from_numpy(val.labels).long()
    loss = -probs[torch.arange(len(labels)), labels].log().mean().item()
    accuracy = (probs.argmax(-1) == labels).float().mean().item()
    assert metrics["val/loss"] == pytest.approx(loss, rel=1e-5)
    assert metrics["val/accuracy"] == pytest.approx(accuracy, abs=1e-9)
