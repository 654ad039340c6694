"""Shared test setup: the read-only ../shared folder (real data, the GPT-2 BPE file), when it is
there."""

import json
import os
import re
import subprocess
import sys
from functools import partial

import pytest
import torch
import torch.distributed as dist

from engine import Engine
from lib.checkpoint import save_pretrained
from model import GPT, GPTConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(os.path.dirname(ROOT), "shared")
sys.path.insert(0, ROOT)

# a relative path would break in the tests that run from other folders
if os.environ.get("TIKTOKEN_CACHE_DIR"):
    os.environ["TIKTOKEN_CACHE_DIR"] = os.path.abspath(os.environ["TIKTOKEN_CACHE_DIR"])
elif os.path.isdir(os.path.join(SHARED, "tiktoken_cache")):
    os.environ["TIKTOKEN_CACHE_DIR"] = os.path.join(SHARED, "tiktoken_cache")
os.environ.setdefault("WANDB_MODE", "offline")  # tests never reach a server

needs_shared = pytest.mark.skipif(
    not os.path.isdir(SHARED), reason=f"needs the shared data folder {SHARED}"
)

# a model and schedule small enough for a training run in a fraction of a second, in float32 on the
# CPU
TINY = [
    "--n_layer=1",
    "--n_head=2",
    "--n_embd=16",
    "--block_size=16",
    "--batch_size=4",
    "--eval_iters=2",
    "--dtype=float32",
    "--device=cpu",
    "--warmup_iters=2",
    "--lr_decay_iters=10",
    "--learning_rate=1e-2",
]


@pytest.fixture(scope="session", autouse=True)
def autotune_cache(tmp_path_factory):
    """auto's timings (lib/autotune.py) go to a file of the test run, never the user's cache;
    the scripts the tests start inherit it."""
    path = tmp_path_factory.mktemp("autotune") / "autotune.json"
    os.environ["GPT_STARTER_AUTOTUNE"] = str(path)
    return path


@pytest.fixture(scope="module")
def one_thread():
    """Tiny tensors in one thread, as the script processes compared against run (OMP_NUM_THREADS=1):
    the same sums, and no threads fighting over the cores (60x slower on a busy 2-core machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def run_distributed(script, argv, processes=2):
    """script under torch.distributed.run, that many processes of it on this machine -> the
    finished process, its output captured."""
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={processes}",
        str(script),
    ]
    result = subprocess.run(command + argv, capture_output=True, text=True, timeout=120)
    # A gloo process can still abort in the interpreter's teardown once its run is over and rank 0
    # has written every file and its last line (pytorch/pytorch#190489), which torchrun reports
    # as a failure: such a run is taken as finished, and the test goes on to check its files.
    if result.returncode and TEARDOWN_ABORT in result.stderr and FINISHED.search(result.stderr):
        result.returncode = 0
    return result


TEARDOWN_ABORT = "terminate called without an active exception"
FINISHED = re.compile(r"^done: \d+ steps", re.MULTILINE)  # train.py's last line


def in_turn(runs, one_run):
    """In a torchrun process: one_run(run) for each of runs, each run's process group under keys
    of its own in torchrun's store (a group made again under the first one's keys waits forever):
    one start of the processes, a second or more of importing torch, serves several runs."""
    joined = dist.init_process_group
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))
    rank, processes = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    for n, run in enumerate(runs):
        keys = dist.PrefixStore(f"run{n}", store)
        dist.init_process_group = partial(joined, store=keys, rank=rank, world_size=processes)
        try:
            one_run(run)
        finally:
            dist.init_process_group = joined


def generate(model, prompts, max_new_tokens, picks, use_cache=True):
    """Decode rows of prompts (token id lists) together, one engine request per distinct prompt
    run: yields each step's tokens, [len(prompts)] (-1 once a row is done). picks: one per row."""
    engine = Engine(model, len(prompts), use_cache)
    requests = [
        engine.submit(prompt, [pick], max_new_tokens) for prompt, pick in zip(prompts, picks)
    ]
    rows = [request.rows[0] for request in requests]
    while engine.busy():
        stepped = set(map(id, engine.step()))
        yield [row.tokens[-1] if id(row) in stepped else -1 for row in rows]


def eot_checkpoint(out_dir, chars):
    """A random GPT over chars and <|endoftext|> (data/text/prepare.py's char tokenizer) saved in
    out_dir: of so few tokens, each about as likely, that a sample soon draws the end of text."""
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=len(chars) + 1, block_size=32, n_layer=1, n_head=2, n_embd=16)
    model = GPT(config)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.1)
    save_pretrained(
        model, out_dir, task="lm", tokenizer={"type": "char", "chars": chars, "eot": True}
    )
    return str(out_dir)


def marker_checkpoint(out_dir, chars="abcdefghrsu .:"):
    """A random chat GPT over chars (none of a marker's "<|>") saved in out_dir, as undertrained
    as one whose replies draw a role marker mid-reply: the markers likely, <|end|> never."""
    model = random_chat_gpt(chars, block_size=64, n_layer=1, n_embd=32)
    with torch.no_grad():
        # the last LayerNorm's feature 0 is 1 for every token, through which the role markers'
        # logits rise by 0.1 and <|end|>'s fall by 10
        model.ln_f.weight[0], model.ln_f.bias[0] = 0.0, 1.0
        model.wte.weight[len(chars) :, 0] = 0.1
        model.wte.weight[-1, 0] = -10.0
    return save_chat_gpt(model, chars, out_dir)


def random_chat_gpt(chars, **shape):
    """A GPT of 2 heads over chars and the 4 chat tokens, its weights drawn from N(0, 0.2) by
    seed 0: far from any trained model, so its greedy tokens vary."""
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=len(chars) + 4, n_head=2, bias=True, **shape)
    model = GPT(config)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.2)
    return model


def save_chat_gpt(model, chars, out_dir):
    """model saved in out_dir with the chat character tokenizer over chars -> its path."""
    spec = {"type": "char", "chars": chars, "chat": True}
    save_pretrained(model, out_dir, task="lm", tokenizer=spec)
    return str(out_dir)


def tiny_gpt2(folder):
    """A tiny random GPT-2 in the Hugging Face layout (see test_model.py), GPT-2's 50,257 tokens,
    context 64, 1 layer of 16, saved in folder -> its path."""
    from safetensors.torch import save_file

    torch.manual_seed(0)
    V, P, D = 50257, 64, 16

    def r(*s):
        return torch.randn(*s) * 0.2

    sd = {"wte.weight": r(V, D), "wpe.weight": r(P, D), "ln_f.weight": 1 + r(D), "ln_f.bias": r(D)}
    block = {
        "ln_1.weight": 1 + r(D),
        "ln_1.bias": r(D),
        "ln_2.weight": 1 + r(D),
        "ln_2.bias": r(D),
        "attn.c_attn.weight": r(D, 3 * D),
        "attn.c_attn.bias": r(3 * D),
        "attn.c_proj.weight": r(D, D),
        "attn.c_proj.bias": r(D),
        "mlp.c_fc.weight": r(D, 4 * D),
        "mlp.c_fc.bias": r(4 * D),
        "mlp.c_proj.weight": r(4 * D, D),
        "mlp.c_proj.bias": r(D),
    }
    sd.update({"h.0." + k: v for k, v in block.items()})
    os.makedirs(folder)
    save_file(sd, os.path.join(folder, "model.safetensors"))
    hf_config = {"vocab_size": V, "n_positions": P, "n_layer": 1, "n_head": 2, "n_embd": D}
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(hf_config, f)
    return str(folder)
