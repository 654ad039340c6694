"""
Nothing lost since another checkout (--old, a commit before): what its code wrote, this code
loads and decodes the same. With the old code: tiny checkpoints of each kind (a character GPT,
one on GPT-2's BPE, an AG News classifier, a chat fine-tune, a window-pattern model) and the
old export.py's Hugging Face folder and GGUF file; then the old and this sample.py's greedy and
seeded 50 tokens, classify.py's probabilities and the chat reply on the same folders (float32
weights), this export.py's files against the old ones, an old run resumed 2 steps here, and
every config/*.py of the old checkout run 2 steps here. Prints a table; exits 1 if anything
differs. --speed: the old and this code side by side, turns rounds, medians (start to end of
the baby model's 300 steps; sample.py's tokens/s, 6 x 384 and GPT-2's shape, --weights auto).
  python bench/compat.py --old /tmp/old-0aa [--speed --turns 3]
Run from anywhere; TIKTOKEN_CACHE_DIR must point at the GPT-2 BPE offline.
"""

import functools
import glob
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

import torch

# run from anywhere: the repository root
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from bench.generate import PROMPT, sample_run, shakespeare_checkpoint  # noqa: E402
from bench.nanogpt import SHORT, timed  # noqa: E402
from lib.autotune import ENV  # noqa: E402
from lib.common import ArgumentParser, Error, run_script  # noqa: E402
from lib.options import Option, flags  # noqa: E402
from lib.records import read_metrics  # noqa: E402

SHARED = os.path.join(os.path.dirname(ROOT), "shared", "data")
TINY = ["--n_layer=1", "--n_head=2", "--n_embd=16", "--batch_size=4", "--eval_iters=2"]
TINY += ["--device=cpu", "--dtype=float32", "--compile=False", "--wandb_log=False"]
SAMPLE = ["--max_new_tokens=50", "--weights=float32", "--device=cpu"]
# the tokens drawn: this sample.py ends a sample at any special token (a chat model's <|end|>)
PLAIN = [*SAMPLE, "--start=ROMEO:", "--ignore_eos"]
GGUF = importlib.util.find_spec("gguf") is not None  # export.py --gguf needs it
HEADLINES = "Stocks fall on rate fears\nLakers win again\nNew chip doubles speed\n"
# the old code's runs: (its config, the dataset, flags beside TINY)
RUNS = {
    "char": ("shakespeare_char_cpu.py", "shakespeare_char", []),
    "bpe": ("shakespeare_char_cpu.py", "shakespeare", ["--gelu=tanh", "--block_size=16"]),
    "agnews": ("agnews.py", "agnews", ["--block_size=16"]),
    "window": ("shakespeare_char_window.py", "shakespeare_char", ["--window=16"]),
    "chat": ("chat.py", "chat", []),
}
FLAGS = {
    "speed": Option(False, "also time the old and this code side by side"),
    "turns": Option(3, "rounds of --speed's runs (medians)", ge=1),
}


def script(root, name, *args, stdin=None):
    """root's script name run with args -> its stdout; a failure raises its last words."""
    command = [sys.executable, os.path.join(root, name), *args]
    result = subprocess.run(command, cwd=root, input=stdin, capture_output=True, text=True)
    if result.returncode:
        raise Error(f"{' '.join(command)} failed: {result.stderr.strip()[-400:]}")
    return result.stdout


def checkpoints(old, work):
    """The old code's data and checkpoints in work -> {name: folder}."""
    data = os.path.join(work, "data")
    text = os.path.join(SHARED, "tinyshakespeare", "input.txt")
    for name in ("shakespeare_char", "shakespeare"):
        script(old, f"data/{name}/prepare.py", f"--source={text}", f"--out_dir={data}/{name}")
    agnews = os.path.join(SHARED, "agnews_sample")
    script(old, "data/agnews/prepare.py", f"--source={agnews}", f"--out_dir={data}/agnews")
    folders = {name: os.path.join(work, name) for name in RUNS}
    chat = [f"--tokenizer_from={folders['char']}", f"--out_dir={data}/chat"]
    for name in RUNS:
        if name == "chat":  # its conversations in the character model's tokens
            script(old, "data/chat/prepare.py", *chat, "--examples=200")
        old_run(old, work, name, folders[name], 4)
    folders["hf"] = os.path.join(work, "hf")
    gguf = os.path.join(work, "old.gguf")
    script(old, "export.py", f"--out_dir={folders['bpe']}", f"--hf_dir={folders['hf']}")
    if GGUF:
        script(old, "export.py", f"--out_dir={folders['bpe']}", f"--gguf={gguf}")
    return folders


def old_run(old, work, name, out, steps):
    """The old train.py's run name of RUNS, steps steps, into out."""
    config, dataset, extra = RUNS[name]
    if name == "chat":  # the character model's fine-tune, in its shape
        extra = [f"--init_from={os.path.join(work, 'char')}"]
    shape = [] if name == "chat" else TINY
    args = [*shape, f"--max_iters={steps}", f"--dataset={work}/data/{dataset}", *extra]
    script(old, "train.py", f"config/{config}", *args, f"--out_dir={out}")


def first_difference(a, b):
    """'equal', or where two texts part."""
    if a == b:
        return "equal"
    at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return f"DIFFERS at character {at}: {a[at : at + 20]!r} against {b[at : at + 20]!r}"


def samples(old, folders):
    """Rows: the old and this sample.py on each GPT folder, greedy and seeded; the chat reply."""
    rows = []
    for name in ("char", "bpe", "window", "chat", "hf"):
        where = f"--init_from={folders[name]}" if name == "hf" else f"--out_dir={folders[name]}"
        for how in (["--greedy"], ["--seed=7", "--top_k=20"]):
            both = [script(root, "sample.py", where, *PLAIN, *how) for root in (old, ROOT)]
            rows.append((name, f"sample.py --ignore_eos {' '.join(how)}", first_difference(*both)))
    messages = os.path.join(old, "data", "chat", "example.json")
    reply = [f"--out_dir={folders['chat']}", f"--messages={messages}", "--greedy", *SAMPLE]
    both = [script(root, "sample.py", *reply) for root in (old, ROOT)]
    rows.append(("chat", "the reply to data/chat/example.json", first_difference(*both)))
    return rows


def probabilities(old, folder):
    """Rows: classify.py's probabilities, old and this, on three headlines."""
    found = []
    for root in (old, ROOT):
        text = script(
            root, "classify.py", f"--out_dir={folder}", "--json", "--device=cpu", stdin=HEADLINES
        )
        rows = [json.loads(line)["probs"] for line in text.splitlines()]
        found.append(torch.tensor([list(row.values()) for row in rows]))
    return [("agnews", "classify.py --json probabilities", closeness(*found))]


def exports(old, folders, work):
    """Rows: this export.py's Hugging Face folder and GGUF file of the old checkpoint against the
    old export.py's."""
    from safetensors.torch import load_file

    hf, gguf = os.path.join(work, "hf-new"), os.path.join(work, "new.gguf")
    script(ROOT, "export.py", f"--out_dir={folders['bpe']}", f"--hf_dir={hf}")
    weights = [load_file(os.path.join(d, "model.safetensors")) for d in (folders["hf"], hf)]
    same = weights[0].keys() == weights[1].keys()
    same = same and all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    rows = [("hf", "export.py --hf_dir: model.safetensors", "equal" if same else "DIFFERS")]
    for name in sorted(os.listdir(folders["hf"])):
        if name != "model.safetensors":
            both = [open(os.path.join(d, name)).read() for d in (folders["hf"], hf)]
            rows.append(("hf", f"export.py --hf_dir: {name}", first_difference(*both)))
    if GGUF:
        script(ROOT, "export.py", f"--out_dir={folders['bpe']}", f"--gguf={gguf}")
        with open(os.path.join(work, "old.gguf"), "rb") as a, open(gguf, "rb") as b:
            same = a.read() == b.read()
        rows.append(("gguf", "export.py --gguf: the bytes", "equal" if same else "DIFFERS"))
    return rows


def resume(old, folders, work):
    """Row: the old character run's 4 steps continued to 6 here (--init_from=resume), its last
    losses against the old code's 6 steps in one run."""
    out, straight = os.path.join(work, "resumed"), os.path.join(work, "straight")
    shutil.copytree(folders["char"], out)
    dataset = os.path.join(work, "data", "shakespeare_char")
    args = ["--init_from=resume", f"--out_dir={out}", "--max_iters=6", f"--dataset={dataset}"]
    script(ROOT, "train.py", *args)
    old_run(old, work, "char", straight, 6)
    losses = [torch.tensor(last_losses(d)) for d in (out, straight)]
    return [("char", "train.py --init_from=resume, 4 -> 6 steps: losses", closeness(*losses))]


def last_losses(out_dir):
    """The last evaluation's train and val loss in out_dir's metrics."""
    last = [m for m in read_metrics(out_dir) if "val/loss" in m][-1]
    return [last["train/loss"], last["val/loss"]]


def closeness(a, b):
    """'equal' within float32's noise, or the largest difference."""
    gap = (a - b).abs().max().item()
    return "equal" if gap < 1e-5 else f"DIFFERS by {gap:.2e}"


def configs(old, folders, work):
    """Rows: each config/*.py of the old checkout, 2 steps of this train.py."""
    data = os.path.join(work, "data")
    datasets = dict(agnews="agnews", agnews_notes="agnews", gpt2="shakespeare", text="shakespeare")
    datasets.update(finetune_shakespeare="shakespeare")
    rows = []
    for path in sorted(glob.glob(os.path.join(old, "config", "*.py"))):
        name = os.path.basename(path)[:-3]
        extra = [f"--dataset={data}/{datasets.get(name, 'shakespeare_char')}"]
        extra += ["--gradient_accumulation_steps=1", "--wandb_log=False", "--batch_size=2"]
        if name == "chat":  # the character model's chat: its data, its block_size
            extra += [f"--dataset={data}/chat", f"--init_from={folders['char']}"]
        elif name == "finetune_shakespeare":  # GPT-2's fine-tune: the BPE model's shape
            extra += [f"--init_from={folders['bpe']}", "--block_size=16"]
        else:
            extra += [*TINY, "--block_size=32", *["--window=16"] * name.endswith("window")]
        out = os.path.join(work, f"config-{name}")
        script(ROOT, "train.py", path, *extra, "--max_iters=2", f"--out_dir={out}")
        rows.append(("config", f"config/{name}.py, 2 steps", "runs"))
    return rows


def speed(old, work, turns):
    """Rows: the old code's and this code's speed, runs interleaved, turns rounds: this / old of
    the medians (wall time inverted, so above 1 is faster here)."""
    import transformers

    char = os.path.join(work, "data", "shakespeare_char")
    baby = ["train.py", "config/shakespeare_char_cpu.py", *SHORT, f"--dataset={char}"]
    six = shakespeare_checkpoint(work)
    hf = os.path.join(work, "gpt2-random")
    torch.manual_seed(0)
    transformers.GPT2LMHeadModel(transformers.GPT2Config()).save_pretrained(hf)
    six_args = ["--out_dir", six, "--start", "ROMEO:", "--max_new_tokens", "500"]
    gpt2_args = ["--init_from", hf, "--start", PROMPT, "--greedy", "--max_new_tokens", "200"]
    measures = {
        "baby model, 300 steps, s": functools.partial(baby_run, command=baby, work=work),
        "6 x 384, 500 tokens, tokens/s": functools.partial(rate, args=six_args),
        "GPT-2 shape, 200 greedy, tokens/s": functools.partial(rate, args=gpt2_args),
    }
    for measure in measures.values():  # auto's timings, cached, before the turns
        measure(ROOT)
    runs = {(name, root): [] for name in measures for root in (old, ROOT)}
    for _ in range(turns):
        for name, measure in measures.items():
            for root in (old, ROOT):
                runs[name, root].append(measure(root))
    rows = []
    for name in measures:
        was, now = (statistics.median(runs[name, root]) for root in (old, ROOT))
        ratio = was / now if name.endswith(", s") else now / was
        both = " | ".join(", ".join(f"{v:.2f}" for v in runs[name, r]) for r in (old, ROOT))
        rows.append(("speed", f"{name}: old | this ({both})", f"{ratio:.3f}x"))
    return rows


def rate(root, args):
    """root's sample.py's tokens/s."""
    return sample_run(root, args)["tokens_s"]


def baby_run(root, command, work):
    """Seconds of root's train.py from start to end (a fresh out_dir)."""
    out = tempfile.mkdtemp(dir=work)
    seconds, _ = timed([sys.executable, *command, f"--out_dir={out}"], root)
    shutil.rmtree(out)
    return seconds


def main(argv=None):
    p = ArgumentParser(prog="compat.py", description=__doc__)
    p.add_argument("--old", required=True, help="a checkout of a commit before (git worktree)")
    flags(p, FLAGS)
    args = p.parse_args(argv)
    if not os.path.isfile(os.path.join(args.old, "train.py")):
        p.error(f"--old {args.old}: no train.py there (a checkout of this repository)")
    if not os.path.isdir(SHARED):
        raise Error(f"{SHARED}: missing (Tiny Shakespeare and AG News rows are read from it)")
    old = os.path.abspath(args.old)
    with tempfile.TemporaryDirectory() as work:
        os.environ[ENV] = os.path.join(work, "autotune.json")  # auto's timings of this run
        folders = checkpoints(old, work)
        rows = samples(old, folders) + probabilities(old, folders["agnews"])
        rows += exports(old, folders, work) + resume(old, folders, work)
        rows += configs(old, folders, work)
        if args.speed:
            rows += speed(old, work, args.turns)
    width = max(len(what) for _, what, _ in rows)
    for kind, what, verdict in rows:
        print(f"{kind:<7} {what:<{width}}  {verdict}")
    sys.exit(1 if any(verdict.startswith("DIFFERS") for _, _, verdict in rows) else 0)


if __name__ == "__main__":
    run_script(main, "compat.py")
