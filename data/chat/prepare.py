"""
Conversations for a chat fine-tune, in lib/chat.py's template and the tokenizer of the model to
fine-tune (--tokenizer_from), with the chat tokens after its vocabulary. --source is JSON Lines,
one conversation a line as OpenAI's fine-tuning files and Hugging Face's chat sets hold them:
  {"messages": [{"role": "system" | "user" | "assistant", "content": "..."}, ...]}
Without --source: word tasks generated from --seed (reverse a word, spell it in capitals), the
example whose answers can be checked (bench/chat_example.py). A hash of each conversation puts it
in val (--val_fraction) or train. Writes {split}.bin (tokens), {split}.mask.bin (1 where the loss
learns the token: an assistant's content and end of turn), {split}.offsets.npy, then meta.json
(its splits count conversations).
  python data/chat/prepare.py --tokenizer_from out-shakespeare-char-cpu
  python data/chat/prepare.py --source chats.jsonl --tokenizer_from gpt2 --out_dir data/my_chats
A line that is not a conversation, or longer than --block_size + 1 tokens, is skipped with one line
naming it, and counted; nothing is cut short.
"""

import json
import os
import random
import shutil
import sys
import time
from collections import Counter

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))  # the repo root, for lib/
from lib import prepare
from lib.chat import ChatTokenizer, check_messages
from lib.common import ArgumentParser, Error, parse_json, run_script
from lib.corpus import not_regular, text_files
from lib.files import locked_out_dir
from lib.options import GPT2_NAMES, Option, flags
from lib.weights import get_tokenizer, load_pretrained

FLAGS = {
    "source": Option(None, "a .jsonl file, or a folder of them (default: the word tasks)"),
    "tokenizer_from": Option(
        "out-shakespeare-char-cpu",
        f"the checkpoint to fine-tune (its folder), or {', '.join(GPT2_NAMES)}: GPT-2's BPE",
    ),
    "out_dir": Option(HERE, "where to write"),
    "block_size": Option(0, "the longest conversation, less one (0: the model's block_size)", ge=0),
    "val_fraction": Option(0.1, "the share of conversations for val", gt=0, lt=1),
    "examples": Option(6000, "word tasks to generate, without --source", ge=1),
    "seed": Option(1337, "the word tasks' random seed"),
}


def backwards(word):
    return word[::-1]


# the generated tasks: (what the user asks, the answer) of a word
TASKS = (
    ("Reverse: {}", backwards),
    ("Spell backwards: {}", backwards),
    ("Capitals: {}", str.upper),
)
SYSTEM = "Answer with the word alone."


def word_tasks(n, seed):
    """n conversations of a word task on a random lower-case word of 3 to 7 letters, a
    third with a system prompt."""
    rng = random.Random(seed)
    for _ in range(n):
        word = "".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=rng.randint(3, 7)))
        ask, answer = rng.choice(TASKS)
        messages = [{"role": "system", "content": SYSTEM}] if rng.random() < 1 / 3 else []
        messages += [
            {"role": "user", "content": ask.format(word)},
            {"role": "assistant", "content": answer(word)},
        ]
        yield "generated", json.dumps({"messages": messages})


def jsonl_lines(source, flag="--source"):
    """(where, line) of each non-blank line of the .jsonl file source, or of the folder's
    (what is not a regular file skipped with a warning); flag: the option that named it."""
    if os.path.isdir(source):
        paths = text_files(source, (".jsonl",))
        if not paths:
            raise Error(f"{flag} {source}: no .jsonl file in the folder")
    elif os.path.isfile(source):
        paths = [source]
    elif os.path.exists(source):  # a named pipe or a device would be read for ever
        kind = not_regular(source)
        raise Error(f"{flag} {source}: not a regular file ({kind}); pass a .jsonl file")
    else:
        raise Error(f"{flag} {source}: no such file or folder; pass a .jsonl file")
    for path in paths:
        try:
            with open(path, encoding="utf-8-sig") as f:
                for number, line in enumerate(f, 1):
                    if line.strip():
                        yield f"{path}:{number}", line
        except (OSError, UnicodeDecodeError) as e:
            why = type(e).__name__
            raise Error(f"{path}: cannot read it ({why}); pass UTF-8 JSON Lines") from None


class Skip(Exception):
    """A line that is no conversation to learn: (its kind, counted; what is wrong)."""


def conversation(line, tokenizer, block_size):
    """(ids, learn) of one JSON line, or a Skip saying why not."""
    try:
        record = parse_json(line)
    except Error as e:
        raise Skip("not JSON", f"not readable JSON ({e})") from None
    if not isinstance(record, dict) or "messages" not in record:
        raise Skip("no messages", 'not an object with a "messages" list')
    messages = record["messages"]
    try:
        check_messages(messages)
        ids, learn = tokenizer.render(messages)
    except Error as e:  # a malformed message, or characters the model never saw
        raise Skip("bad messages", str(e)) from None
    if not any(learn):
        raise Skip("no assistant turn", "no assistant turn: nothing to learn")
    if len(ids) > block_size + 1:
        why = f"{len(ids)} tokens, past block_size + 1 = {block_size + 1}"
        raise Skip("too long", why)
    return ids, learn


def chat_tokenizer(name):
    """(tokenizer with the chat tokens, its spec's file or None, the model's context) of
    a checkpoint folder or GPT-2."""
    if name in GPT2_NAMES:
        return ChatTokenizer(get_tokenizer({"type": "bpe", "encoding": "r50k_base"})), None, 1024
    path = os.path.join(name, "config.json")
    if not os.path.isfile(path):
        raise Error(
            f"--tokenizer_from {name}: no config.json there; name the checkpoint folder "
            "you will fine-tune (train one first), or gpt2"
        )
    # its card and weights checked as the fine-tune reads them: a damaged one is one line
    model, info = load_pretrained(name)
    spec = info.get("tokenizer")  # a Hugging Face GPT-2's: GPT-2's BPE
    tokenizer = get_tokenizer(spec, path, model.config.vocab_size)
    if not spec.get("chat"):
        tokenizer = ChatTokenizer(tokenizer)
    context = model.config.block_size
    source_file = spec.get("file") and os.path.join(name, spec["file"])
    return tokenizer, source_file, context


def split_conversations(lines, tokenizer, block_size, val_fraction):
    """{split: [(ids, learn)]}, each bad line named on stderr; -> (splits, skipped counts)."""
    splits = {"train": [], "val": []}
    skipped = Counter()
    for where, line in lines:
        try:
            ids, learn = conversation(line, tokenizer, block_size)
        except Skip as e:
            kind, why = e.args
            print(f"{where}: {why}; skipped", file=sys.stderr)
            skipped[kind] += 1
            continue
        split = "val" if prepare.in_val(line.strip(), val_fraction) else "train"
        splits[split].append((ids, learn))
    return splits, skipped


def write_split(out_dir, split, rows, dtype):
    """{split}.bin, {split}.mask.bin and {split}.offsets.npy of rows [(ids, learn)]."""
    lengths = [len(ids) for ids, _ in rows]
    ids = np.fromiter((t for row, _ in rows for t in row), dtype, sum(lengths))
    learn = np.fromiter((t for _, row in rows for t in row), np.uint8, sum(lengths))
    prepare.save_array(os.path.join(out_dir, f"{split}.bin"), ids)
    prepare.save_array(os.path.join(out_dir, f"{split}.mask.bin"), learn)
    offsets = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
    prepare.save_array(os.path.join(out_dir, f"{split}.offsets.npy"), offsets)


def main():
    p = ArgumentParser(description=__doc__)
    flags(p, FLAGS)
    args = p.parse_args()
    t0 = time.time()
    prepare.check_out_dir(args.out_dir)
    tokenizer, tokenizer_file, context = chat_tokenizer(args.tokenizer_from)
    block_size = args.block_size or context
    if args.source:
        lines = jsonl_lines(args.source)
    else:
        lines = word_tasks(args.examples, args.seed)
    splits, skipped = split_conversations(lines, tokenizer, block_size, args.val_fraction)
    counts = {split: len(rows) for split, rows in splits.items()}
    if skipped:
        reasons = ", ".join(f"{n:,} {why}" for why, n in skipped.most_common())
        print(f"skipped {sum(skipped.values()):,} lines: {reasons}", file=sys.stderr)
    for split, n in counts.items():
        if not n:
            raise Error(
                f"no conversation in {split} ({counts}): give more conversations, or another "
                "--val_fraction"
            )
    dtype = prepare.token_dtype(tokenizer.vocab_size)
    with locked_out_dir(args.out_dir, prepare.held_by_a_prepare):
        prepare.unpublish(args.out_dir)
        for split, rows in splits.items():
            write_split(args.out_dir, split, rows, dtype)
        if tokenizer_file:  # a trained BPE's file lies beside the meta.json naming it
            shutil.copyfile(tokenizer_file, os.path.join(args.out_dir, tokenizer.spec["file"]))
        tokens = {split: sum(len(ids) for ids, _ in rows) for split, rows in splits.items()}
        prepare.write_meta(
            args.out_dir,
            task="chat",
            **prepare.tokenizer_meta(tokenizer),
            splits=counts,
            tokens=tokens,
            source=args.source or f"word tasks, seed {args.seed}",
        )
    print(
        f"{counts['train']:,} train and {counts['val']:,} val conversations "
        f"({tokens['train']:,} and {tokens['val']:,} tokens), {tokenizer.vocab_size} tokens with "
        f"the chat tokens -> {args.out_dir} ({time.time() - t0:.1f} s)"
    )


if __name__ == "__main__":
    run_script(main, "prepare.py")
