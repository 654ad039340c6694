"""
The chat example, measured: exact match of greedy replies to the held-out word tasks (the val
conversations of data/chat/prepare.py, whose questions train never holds) before the fine-tune
(the base model, its token table grown as the fine-tune grows it), after `python train.py
config/chat.py`, after the same fine-tune with the loss on every token (the mask off: the data's
masks all ones), and after it on packed rows (consecutive conversations joined while they fit in
block_size + 1 tokens, the masks kept: a reply then attends to the conversations before it in its
row). Each fine-tune runs as a user runs it, in a folder of its own.
  python train.py config/shakespeare_char_cpu.py
  python data/chat/prepare.py --tokenizer_from out-shakespeare-char-cpu
  python bench/chat_example.py            # the base, then three fine-tunes of a few minutes each
  python bench/chat_example.py --max_iters=300      # shorter fine-tunes
  python bench/chat_example.py --score out-chat     # one checkpoint's exact match alone
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import replace

import numpy as np
import torch

# run from anywhere: the repository root
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from decoding import NextToken, Options
from engine import Engine
from lib.common import ArgumentParser, run_script
from lib.options import Option, flags
from lib.settings import load_split
from lib.tokenizer import end_tokens
from lib.weights import get_tokenizer, load_pretrained
from model import GPT

FLAGS = {
    "base": Option("out-shakespeare-char-cpu", "the model before the fine-tune"),
    "data": Option("data/chat", "the prepared conversations (their val split is scored)"),
    "config": Option("config/chat.py", "the fine-tune's config"),
    "max_iters": Option(0, "the fine-tunes' steps, the schedule alike (0: the config's)", ge=0),
    "score": Option(None, "score this checkpoint alone"),
    "json": Option(None, "write the results to this file too"),
}

# the tokens of a packed row: config/chat.py's block_size + 1
ROW = 65


def exact_match(model, data, rows=64):
    """The share of data's conversations whose last reply the model gives, greedy, token for
    token: the prompt is each one up to its last reply (the assistant's marker included)."""
    engine = Engine(model, rows)
    greedy = NextToken(Options(), greedy=True)
    tokenizer = get_tokenizer(data.meta["tokenizer"])
    marker = tokenizer.ids["<|assistant|>"]
    asked = []
    for i in range(len(data)):
        ids = data.tokens[data.offsets[i] : data.offsets[i + 1]].tolist()
        start = len(ids) - ids[::-1].index(marker)  # after the last marker
        budget = len(ids) - start + 1
        request = engine.submit(ids[:start], [greedy], budget, end_tokens(tokenizer))
        asked.append((request, ids[start:-1]))
    while engine.busy():
        engine.step()
    hits = sum(request.rows[0].generated == answer for request, answer in asked)
    return hits / len(asked)


def grown_base(base, vocab_size):
    """The base model as the fine-tune starts from it: the token table grown to vocab_size."""
    source, _ = load_pretrained(base)
    torch.manual_seed(1337)
    with torch.device("meta"):
        model = GPT(replace(source.config, vocab_size=vocab_size))
    return model.load_body(source.state_dict()).eval()


def fine_tune(config, out_dir, dataset, max_iters):
    """train.py on config into out_dir, as a user runs it -> seconds."""
    t0 = time.perf_counter()
    command = [sys.executable, "train.py", config, f"--out_dir={out_dir}", f"--dataset={dataset}"]
    if max_iters:
        command += [f"--max_iters={max_iters}", f"--lr_decay_iters={max_iters}"]
    subprocess.run(command, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def mask_off(data_dir, to):
    """A copy of the prepared conversations whose loss learns every token."""
    shutil.copytree(data_dir, to)
    for split in ("train", "val"):
        path = os.path.join(to, f"{split}.mask.bin")
        np.ones(os.path.getsize(path), np.uint8).tofile(path)
    return to


def packed(data_dir, to, size):
    """A copy of the prepared conversations, consecutive ones joined into rows of at most size
    tokens (their offsets merged)."""
    shutil.copytree(data_dir, to)
    with open(os.path.join(to, "meta.json")) as f:
        meta = json.load(f)
    for split in ("train", "val"):
        path = os.path.join(to, f"{split}.offsets.npy")
        offsets = np.load(path)
        rows = [0]
        for start, end in zip(offsets[:-1], offsets[1:]):
            if end - rows[-1] > size:  # the conversation opens a row of its own
                rows.append(start)
        rows.append(offsets[-1])
        np.save(path, np.array(rows, dtype=np.int64))
        meta["splits"][split] = len(rows) - 1
    with open(os.path.join(to, "meta.json"), "w") as f:
        json.dump(meta, f)
    return to


def main():
    p = ArgumentParser(description=__doc__)
    flags(p, FLAGS)
    args = p.parse_args()
    data_dir = os.path.abspath(args.data)
    val = load_split(data_dir, "val", 10**6)
    print(f"{len(val)} held-out conversations in {data_dir}", file=sys.stderr)
    if args.score:
        model, _ = load_pretrained(args.score)
        print(f"{args.score}: exact match {exact_match(model, val):.1%}")
        return
    results = {"held_out": len(val)}
    results["before"] = exact_match(grown_base(args.base, val.meta["vocab_size"]), val)
    print(f"before the fine-tune: {results['before']:.1%}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name, dataset in (
            ("the loss on the replies", data_dir),
            ("the loss on every token", mask_off(data_dir, os.path.join(tmp, "all"))),
            ("packed rows", packed(data_dir, os.path.join(tmp, "packed"), ROW)),
        ):
            out_dir = os.path.join(tmp, name.split()[-1])
            seconds = fine_tune(args.config, out_dir, dataset, args.max_iters)
            # scored on the masked val: the replies alone, whatever the loss learned
            model, _ = load_pretrained(out_dir)
            results[name] = {"exact_match": exact_match(model, val), "seconds": seconds}
            print(f"after, {name}: {results[name]['exact_match']:.1%} ({seconds:.0f} s)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    run_script(main, "chat_example.py")
