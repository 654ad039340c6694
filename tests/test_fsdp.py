"""strategy=fsdp and activation_checkpointing on the CPU (gloo): two sharded processes against one
process and against DDP, a sharded run stopped and resumed under FSDP, DDP and one process, the
bytes each process holds, and recomputed Blocks against stored activations."""

import copy
import io
import json
import os
import re
import shutil
import sys
from contextlib import contextmanager, nullcontext, redirect_stderr
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from conftest import ROOT, TINY, in_turn, run_distributed

# lm_dir is a fixture: imported, it makes the same tiny data set for this module
from test_train import fixed_peak, lm_dir, run_in_one_thread, settings, state  # noqa: F401
from torch.distributed.tensor import DTensor
from torch.optim.optimizer import register_optimizer_step_post_hook

import parallel
import train
from lib.common import Error
from lib.distributed import Run
from lib.settings import load_split
from lib.weights import from_checkpoint
from model import GPT, GPTConfig

HERE = os.path.dirname(os.path.abspath(__file__))

# 4 micro-steps a step (2 on each of the 2 processes), evaluations (and saves) at 0, 10 and 20, and
# a schedule whose learning rate still moves the weights at step 20
COMMON = TINY + [
    "--gradient_accumulation_steps=4",
    "--eval_interval=10",
    "--lr_decay_iters=20",
    "--log_interval=1",
]

# One process adds a parameter's four micro-gradients as ((a + b) + c) + d; two processes as
# (a + b) + (c + d): each accumulates its two, and FSDP's reduce-scatter (as DDP's all-reduce) adds
# the two processes' halves, halved exactly. The two sums differ by float32 rounding, a few units
# in the last place: a relative 2^-24 = 6e-8 each. AdamW's step lr * m / (sqrt(v) + eps) does not
# change with the gradient's scale to first order, so it passes such a relative change on at about
# its size, times lr: under 1e-2 x 2.4e-7 = 2.4e-9 a step, 5e-8 over 20 steps. The weights round to
# float32 after each update as well: a weight near 1 (the norms' gains) lands one unit in its last
# place apart (1.2e-7) when an update falls on the other side of a rounding boundary, and those
# units pass back into the gradients of later steps. So the bound is a few units in the last place
# of weights up to 2 (2.4e-7 each): 1e-6, measured 1.2e-7 at most, 1e4 times below one step's
# update (1e-2). The norm the clip divides by is summed in another order too (the shards' squares,
# then the processes'), a relative 1e-7 in the clip's factor: the same size again. The logged
# losses and gradient norms, float32 sums over the same terms in other orders, agree within a
# relative 1e-6.
WEIGHTS = 1e-6
LOGGED = 1e-6

pytestmark = pytest.mark.slow  # torchrun runs of gloo processes


def torchrun(tmp_path, runs, processes=2):
    """train.main on each run's argv in turn, measured() (each_run()), in one torchrun launch
    (gloo; torchrun gives each process one thread): one start of the processes serves them all.
    runs: [(argv, None or (a folder, where rank 0 copies it first))]. -> the launch's stderr, once
    it has succeeded."""
    listed = tmp_path / "runs.json"
    listed.write_text(json.dumps(runs))
    script = tmp_path / "fsdp_run.py"
    script.write_text(
        f"import sys\nsys.path[:0] = [{ROOT!r}, {HERE!r}]\nimport test_fsdp\n"
        "test_fsdp.each_run(sys.argv[1])\n"
    )
    result = run_distributed(script, [str(listed)], processes)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stderr


def each_run(listed):
    """In a torchrun process: the runs of torchrun() in turn, measured(). Rank 0 copies a run's
    folder before it joins that run's group, which the other ranks wait for before they read it."""

    def one_run(run):
        argv, copied = run
        if copied and os.environ["RANK"] == "0":
            shutil.copytree(*copied)
        with measured():
            train.main(argv)

    in_turn(json.load(open(listed)), one_run)


def in_one_thread(argv):
    """run_in_one_thread(argv), measured() as torchrun() -> (its model, stderr)."""
    stderr = io.StringIO()
    with redirect_stderr(stderr), measured():
        model, _ = run_in_one_thread(argv[len(TINY) :])
    return model, stderr.getvalue()


@contextmanager
def measured():
    """A run with a test's peak FLOP/s (no matmuls timed at each start) whose first optimizer step
    prints the bytes this process holds of the parameters that optimizer updates (AdamW's: all of
    them), their gradients and its state: under FSDP its local shards (docs/scaling.md)."""

    printed = False

    def held(optimizer, args, kwargs):
        nonlocal printed
        if printed:
            return
        printed = True
        parameters = [p for group in optimizer.param_groups for p in group["params"]]
        gradients = [p.grad for p in parameters]
        states = [v for state in optimizer.state.values() for v in state.values()]
        sizes = [local_bytes(tensors) for tensors in (parameters, gradients, states)]
        rank = dist.get_rank() if dist.is_initialized() else 0
        sys.stderr.write(f"process {rank} holds {sizes} bytes\n")

    handle = register_optimizer_step_post_hook(held)
    measured_peak = train.peak_flops
    train.peak_flops = fixed_peak
    try:
        yield
    finally:
        train.peak_flops = measured_peak
        handle.remove()


def local_bytes(values):
    """The bytes of the values that are tensors (a gradient may be None), of a DTensor its local
    shard's."""
    tensors = [t for t in values if isinstance(t, torch.Tensor)]
    local = [t.to_local() if isinstance(t, DTensor) else t for t in tensors]
    return sum(t.nbytes for t in local)


@pytest.fixture(scope="module")
def launched(lm_dir, tmp_path_factory):  # noqa: F811
    """Every torchrun run of unclipped and clipped, in one launch (each start of the processes
    costs seconds). -> (their folder, the launch's stderr)"""
    tmp = tmp_path_factory.mktemp("launched")
    unclipped = COMMON + [f"--dataset={lm_dir}", "--max_iters=20", "--grad_clip=0"]
    checkpointed = ["--activation_checkpointing=True"]
    clipped = COMMON + [f"--dataset={lm_dir}", "--grad_clip=0.3", "--strategy=fsdp"]
    resumed = clipped + ["--max_iters=20", "--init_from=resume"]
    stopped = str(tmp / "stopped")
    runs = [
        (unclipped + ["--strategy=fsdp", *checkpointed, f"--out_dir={tmp / 'fsdp'}"], None),
        (unclipped + ["--strategy=ddp", *checkpointed, f"--out_dir={tmp / 'ddp'}"], None),
        (clipped + ["--max_iters=20", f"--out_dir={tmp / 'straight'}"], None),
        (clipped + ["--max_iters=10", f"--out_dir={stopped}"], None),
        (resumed + [f"--out_dir={tmp / 'resumed_fsdp'}"], (stopped, str(tmp / "resumed_fsdp"))),
        (
            resumed + ["--strategy=ddp", f"--out_dir={tmp / 'resumed_ddp'}"],
            (stopped, str(tmp / "resumed_ddp")),
        ),
    ]
    return tmp, torchrun(tmp, runs)


@pytest.fixture(scope="module")
def unclipped(launched, lm_dir, tmp_path_factory):  # noqa: F811
    """Runs to step 20 without clipping, where FSDP and DDP do the same arithmetic: FSDP and DDP
    under torchrun (launched's first two runs), both with activation checkpointing, and one
    process without. -> {name: (out_dir, the bytes each process holds: held())}"""
    tmp, stderr = launched
    argv = COMMON + [f"--dataset={lm_dir}", "--max_iters=20", "--grad_clip=0"]
    runs = {name: (tmp / name, held(stderr, run)) for run, name in enumerate(("fsdp", "ddp"))}
    one = tmp_path_factory.mktemp("unclipped") / "one"
    _, stderr = in_one_thread(argv + [f"--out_dir={one}"])
    runs["one"] = (one, held(stderr))
    return runs


@pytest.fixture(scope="module")
def clipped(launched, lm_dir, tmp_path_factory):  # noqa: F811
    """Runs with the gradient clipped at 0.3 (every step's norm is above it): FSDP straight to step
    20; FSDP stopped at step 10, then resumed to 20 under FSDP, under DDP (launched's runs) and in
    one process; one process straight to 20. -> {name: out_dir}"""
    tmp, _ = launched
    argv = COMMON + [f"--dataset={lm_dir}", "--grad_clip=0.3", "--strategy=fsdp"]
    resumed = argv + ["--max_iters=20", "--init_from=resume"]
    shutil.copytree(tmp / "stopped", tmp / "resumed_one")
    in_one_thread(resumed + [f"--out_dir={tmp / 'resumed_one'}"])
    in_one_thread(argv + ["--max_iters=20", f"--out_dir={tmp / 'one'}"])
    names = ("straight", "resumed_fsdp", "resumed_ddp", "resumed_one", "one")
    return {name: tmp / name for name in names}


def logged(out_dir, after=0):
    """The log steps of a run's metrics.jsonl past step after: {step: (loss, gradient norm)}."""
    records = map(json.loads, open(out_dir / "metrics.jsonl"))
    steps = {}
    for r in records:
        if "grad_norm" in r and r["step"] > after:
            steps[r["step"]] = (r["train/step_loss"], r["grad_norm"])
    return steps


def assert_logged_close(a, b):
    """Two runs' logged steps (logged()): the same steps, losses and norms within LOGGED."""
    assert a.keys() == b.keys()
    flat_a = [x for pair in a.values() for x in pair]
    flat_b = [x for pair in b.values() for x in pair]
    assert flat_a == pytest.approx(flat_b, rel=LOGGED)


def assert_close(a, b, atol):
    """Two trainer states' weights and AdamW moments equal within atol (0: bit for bit)."""
    for name, p in a["model"].items():
        q = b["model"][name]
        assert torch.allclose(p, q, rtol=0, atol=atol), (name, (p - q).abs().max().item())
    (moments_a,) = [o["state"] for o in a["optimizers"]]
    (moments_b,) = [o["state"] for o in b["optimizers"]]
    assert moments_a.keys() == moments_b.keys()
    for i, moments in moments_a.items():
        for key, v in moments.items():
            w = moments_b[i][key]
            assert torch.allclose(v, w, rtol=0, atol=atol), (i, key, (v - w).abs().max().item())


def test_two_sharded_processes_equal_one_process(unclipped):
    """AdamW, 2 micro-steps on each of 2 sharded processes against 4 in one process (WEIGHTS derives
    the bound), activation checkpointing on in the sharded run."""
    fsdp, one = unclipped["fsdp"][0], unclipped["one"][0]
    assert_close(state(fsdp), state(one), WEIGHTS)
    assert set(logged(fsdp)) == set(range(1, 21))
    assert_logged_close(logged(fsdp), logged(one))


def test_two_sharded_processes_equal_ddp_bit_for_bit(unclipped):
    """Without clipping FSDP and DDP do the same arithmetic (each process adds its two
    micro-gradients, and the two processes' halves are added): the weights, AdamW's moments and
    every logged loss agree to the last bit, and trainer_state.pt has one layout."""
    fsdp, ddp = state(unclipped["fsdp"][0]), state(unclipped["ddp"][0])
    assert_close(fsdp, ddp, 0)
    assert fsdp["optimizers"][0]["param_groups"] == ddp["optimizers"][0]["param_groups"]
    assert list(fsdp["model"]) == list(ddp["model"])
    losses = [loss for loss, _ in logged(unclipped["fsdp"][0]).values()]
    assert losses == [loss for loss, _ in logged(unclipped["ddp"][0]).values()]


def held(stderr, run=0):
    """The bytes each process says it holds (measured()) in its run-th run: {rank: parameters +
    gradients + optimizer state}."""
    found = {}
    for rank, sizes in re.findall(r"process (\d+) holds \[([\d, ]+)\] bytes", stderr):
        found.setdefault(int(rank), []).append(sum(int(n) for n in sizes.split(", ")))
    return {rank: sums[run] for rank, sums in found.items()}


def test_each_sharded_process_holds_at_most_0_55_of_one_process(unclipped):
    """Measured from the tensors after the first step: FSDP's processes hold their shards, DDP's
    processes the whole of each."""
    (one,) = unclipped["one"][1].values()
    fsdp = unclipped["fsdp"][1]
    assert sorted(fsdp) == [0, 1] and max(fsdp.values()) <= 0.55 * one, (fsdp, one)
    assert unclipped["ddp"][1] == {0: one, 1: one}


def test_the_tied_head_stays_tied_through_sharding_and_saving(unclipped):
    """GPT's head and token table are one parameter under FSDP too: trainer_state.pt holds one
    tensor under both names, and model.safetensors, gathered from the shards, loads as that
    model."""
    out_dir = unclipped["fsdp"][0]
    saved = state(out_dir)["model"]
    assert saved["lm_head.weight"].data_ptr() == saved["wte.weight"].data_ptr()
    model, info = from_checkpoint(out_dir)
    assert info["metrics"]["step"] == 20  # the best model is the last one
    assert model.lm_head.weight is model.wte.weight
    for name, p in model.state_dict().items():
        assert torch.equal(p, saved[name]), name


def test_a_sharded_run_stopped_at_10_and_resumed_equals_a_straight_run(clipped):
    """Resumed under FSDP with the same processes: the same arithmetic, to the last bit."""
    assert_close(state(clipped["straight"]), state(clipped["resumed_fsdp"]), 0)
    assert logged(clipped["straight"], 10) == logged(clipped["resumed_fsdp"], 10)


@pytest.mark.parametrize("where", ["resumed_ddp", "resumed_one"])
def test_a_sharded_state_resumes_in_one_process_and_under_ddp(clipped, where):
    """The state an FSDP run saved at step 10 goes on under DDP and in one process as the FSDP run
    did, within the rounding of their other orders of addition (WEIGHTS, LOGGED)."""
    straight = clipped["straight"]
    assert_close(state(straight), state(clipped[where]), WEIGHTS)
    assert set(logged(clipped[where], 10)) == set(range(11, 21))
    assert_logged_close(logged(straight, 10), logged(clipped[where], 10))


def test_clipping_by_the_sharded_norm_is_clipping_by_the_whole_norm(clipped):
    """Each step's norm is above grad_clip: two sharded processes clip (and log) as one process
    does, within WEIGHTS and LOGGED."""
    straight, one = clipped["straight"], clipped["one"]
    assert_close(state(straight), state(one), WEIGHTS)
    assert min(norm for _, norm in logged(straight).values()) > 0.3
    assert_logged_close(logged(straight), logged(one))


def test_activation_checkpointing_trains_as_stored_activations(lm_dir, tmp_path):  # noqa: F811
    """With dropout (the recomputed forward must draw the same masks): the same losses, gradient
    norms and weights, to the last bit, in one process."""
    argv = TINY + [f"--dataset={lm_dir}", "--dropout=0.1", "--max_iters=6", "--log_interval=1"]
    plain, _ = in_one_thread(argv + [f"--out_dir={tmp_path / 'plain'}"])
    recomputed, _ = in_one_thread(
        argv + [f"--out_dir={tmp_path / 'recomputed'}", "--activation_checkpointing=True"]
    )
    assert logged(tmp_path / "plain") == logged(tmp_path / "recomputed")
    for (name, p), q in zip(plain.state_dict().items(), recomputed.state_dict().values()):
        assert torch.equal(p, q), name


def test_recomputed_blocks_keep_their_names_and_gradients(monkeypatch):
    """recompute_blocks changes no state dict name, gives the gradients of the plain model, and
    checkpoints only in training: evaluation runs the plain forward."""
    torch.manual_seed(0)
    config = GPTConfig(
        vocab_size=10, block_size=8, n_layer=2, n_head=2, n_embd=16, bias=True, dropout=0.1
    )
    plain = GPT(config)
    recomputed = copy.deepcopy(plain)
    parallel.recompute_blocks(recomputed)
    assert list(recomputed.state_dict()) == list(plain.state_dict())
    calls = []
    checkpoint = parallel.checkpoint

    def counted(*args, **kwargs):
        calls.append(1)
        return checkpoint(*args, **kwargs)

    monkeypatch.setattr(parallel, "checkpoint", counted)
    idx = torch.randint(0, 10, (3, 8))
    for model in (plain, recomputed):
        torch.manual_seed(1)
        model(idx, idx)[1].backward()
    assert len(calls) == config.n_layer
    for (name, p), q in zip(plain.named_parameters(), recomputed.parameters()):
        assert torch.equal(p.grad, q.grad), name
    recomputed.eval()
    with torch.no_grad():
        recomputed(idx, idx)
    assert len(calls) == config.n_layer


def test_a_process_out_of_evaluation_rows_runs_as_many_forward_passes_as_rank_0(lm_dir):  # noqa: F811
    """Under FSDP every forward pass gathers parameters from every process. 36 rows over 8
    processes in batches of 4: ranks 0-3 hold 5 rows (2 batches), ranks 4-7 hold 4 (1 batch), so
    rank 6 runs a second, stand-in pass and counts nothing of it."""
    data = load_split(lm_dir, "val", 16)
    cfg = SimpleNamespace(eval_iters=9, batch_size=4)
    model = GPT(GPTConfig(vocab_size=10, block_size=16, n_layer=1, n_head=2, n_embd=16, bias=True))
    calls = []

    def count(module, args, kwargs):
        calls.append(len(kwargs["idx"]))

    model.register_forward_pre_hook(count, with_kwargs=True)
    sharded = Run("cpu", "float32", rank=6, world_size=8, sharded=True)
    unsharded = replace(sharded, sharded=False)
    metrics = train.evaluate(model, data, cfg, sharded, nullcontext())
    assert calls == [4, 1]
    assert metrics == train.evaluate(model, data, cfg, unsharded, nullcontext())
    assert calls == [4, 1, 4]


def test_one_process_with_strategy_fsdp_runs_as_today(lm_dir, tmp_path):  # noqa: F811
    """Sharding needs torchrun's processes: one process trains as with the default, bit for bit."""
    argv = TINY + [f"--dataset={lm_dir}", "--max_iters=4", "--log_interval=1"]
    default, _ = in_one_thread(argv + [f"--out_dir={tmp_path / 'ddp'}"])
    fsdp, _ = in_one_thread(argv + [f"--out_dir={tmp_path / 'fsdp'}", "--strategy=fsdp"])
    assert logged(tmp_path / "ddp") == logged(tmp_path / "fsdp")
    for (name, p), q in zip(default.state_dict().items(), fsdp.state_dict().values()):
        assert torch.equal(p, q), name


def test_muon_under_fsdp_is_refused_with_the_fix():
    with pytest.raises(
        Error,
        match="optimizer=.muon.: must be adamw with strategy=fsdp .*: train Muon with strategy=ddp",
    ):
        settings(["--strategy=fsdp", "--optimizer=muon"])
    with pytest.raises(Error, match="strategy='zero': must be one of ddp, fsdp"):
        settings(["--strategy=zero"])
