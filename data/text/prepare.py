"""
Your own text as a language model's data: a file, a folder of files or a Hugging Face dataset, in
a vocabulary of its characters, GPT-2's BPE, or a byte-level BPE trained on its train split. Every
document ends with the tokenizer's <|endoftext|>; a hash of each document's text puts it in val
(--val_fraction) or train, the same way every run; where that leaves a split too small for a block
(a few long documents), each document's tail goes to val instead. Writes train.bin, val.bin, a
trained BPE's tokenizer.tiktoken and meta.json (with the documents, bytes and tokens of each split)
into this folder or --out_dir; nothing there changes until the whole corpus has been read.
  python data/text/prepare.py --source my_notes/ --tokenizer bpe --vocab_size 4096
  python data/text/prepare.py --source posts.jsonl --column body --tokenizer gpt2
  python data/text/prepare.py --dataset roneneldan/TinyStories --tokenizer bpe  # streamed
Documents: a folder's .txt and .md files (subfolders too) are one each, and its .jsonl and
.parquet files one per row; a lone .txt or .md file is cut at its blank lines. The text column is
--column, else "text", else a file's or dataset's one column of strings; a null there is an empty
document.
"""

import os
import re
import sys
import time
from contextlib import ExitStack

import numpy as np
from tqdm import tqdm

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))  # the repo root, for lib/
from lib import prepare
from lib.bpe import BPETokenizer, TrainedBPE, save_ranks, train_bpe
from lib.common import ArgumentParser, Error, run_script
from lib.corpus import PIECE, Corpus
from lib.files import atomic_path, locked_out_dir
from lib.options import Option, flags
from lib.tokenizer import CharTokenizer

# ids a token file holds: a vocabulary past it has nowhere to go
MOST_TOKENS = 2**32
# a token file's writes: this many ids at a time
BUFFER = 1 << 20
# the encoder's batches: up to 1,024 pieces, or this many characters
BATCH = 1 << 20
# where a piece may end: before a space or line break that follows a non-space. GPT-2's words part
# there (each is all spaces, or holds one at most, first), so the pieces encode as the whole does
CUT = re.compile(r"(?<=\S)[ \n]")
FLAGS = {
    "split": Option("train", "the --dataset split to read"),
    "column": Option(None, 'the text column (default: "text", or the only one)'),
    "tokenizer": Option(
        "bpe",
        "the text's characters, GPT-2's BPE, or a BPE trained here",
        choices=("char", "gpt2", "bpe"),
    ),
    "vocab_size": Option(
        4096, "a trained BPE's tokens: the 256 bytes, merges, <|endoftext|>", ge=257
    ),
    "val_fraction": Option(0.1, "the share of documents for val", gt=0, lt=1),
    "block_size": Option(
        128,
        "each split must hold more tokens than this: the block you train with, config/text.py's",
        ge=1,
    ),
    "out_dir": Option(HERE, "where to write"),
}
# a val tail starts at the start of its line (else its word) when that is this close to the cut
LINE = 1000


def make_tokenizer(args, corpus, tails=False):
    """The tokenizer args name; char and bpe read the corpus for it (bpe its train split, as tails
    splits it: see parts())."""
    if args.tokenizer == "gpt2":
        return BPETokenizer("r50k_base")
    if args.tokenizer == "char":
        chars = set()
        for text in tqdm(corpus, desc="characters", unit=" docs", disable=None):
            chars.update(text)
        if not chars:
            raise Error(f"{args.source or args.dataset}: no document holds any text")
        return CharTokenizer("".join(sorted(chars)), eot=True)
    docs = tqdm(corpus, desc="documents for the BPE", unit=" docs", disable=None)
    t0 = time.time()
    tok = train_bpe(train_pieces(docs, args, tails), args.vocab_size)
    line = f"trained a BPE of {tok.vocab_size:,} tokens"
    if tok.vocab_size < args.vocab_size:
        # the trainer runs out of pairs to merge: every word of the text is already one token
        line += f", not --vocab_size {args.vocab_size:,}: too little text for more merges"
    print(f"{line} ({time.time() - t0:.1f} s)")
    return tok


def train_pieces(docs, args, tails):
    """The train split's text in pieces (pieces()), as a BPE learns from it."""
    for text in docs:
        for name, start, end in parts(text, args.val_fraction, tails):
            if name == "train":
                yield from pieces(text, start, end)


def parts(text, val_fraction, tails):
    """(split, start, end) of each part of a document that goes to a split: all of it, to the
    split its hash names; or with tails, its head to train and its tail to val (tail_start)."""
    if not tails:
        name = "val" if prepare.in_val(text, val_fraction) else "train"
        return [(name, 0, len(text))]
    cut = tail_start(text, val_fraction)
    found = [("train", 0, cut), ("val", cut, len(text))]
    return [(name, start, end) for name, start, end in found if start < end]


def tail_start(text, val_fraction):
    """Where a document's val tail starts: at its last val_fraction of characters, moved back to
    the start of the line (else of the word) that the cut falls in, within LINE characters."""
    point = int(len(text) * (1 - val_fraction))
    for mark in ("\n", " "):
        found = text.rfind(mark, max(0, point - LINE), point)
        if found >= 0:
            return found + 1
    return point


def pieces(text, start, end):
    """text[start:end] in pieces of about PIECE characters, each cut before a CUT: they encode,
    and train a BPE, as the whole does, in memory bounded by PIECE. (A text with no CUT past
    PIECE is one piece.)"""
    while end - start > PIECE:
        cut = CUT.search(text, start + PIECE, end)
        if cut is None:
            break
        yield text[start : cut.start()]
        start = cut.start()
    yield text[start:end]


class SplitWriter:
    """One split's token file, written under a temporary name as the documents come (files: the
    ExitStack that gives it its name, or deletes it), with its counts of documents, bytes and
    tokens."""

    def __init__(self, files, out_dir, name, dtype):
        tmp = files.enter_context(atomic_path(os.path.join(out_dir, f"{name}.bin")))
        self.file = files.enter_context(open(tmp, "wb"))
        self.reset(dtype)

    def reset(self, dtype):
        """Empty, for the corpus written (again) in ids of dtype."""
        self.file.seek(0)
        self.file.truncate()
        self.dtype = dtype
        # the ids not yet written, an array per text
        self.ids = []
        self.buffered = 0
        self.counts = {"documents": 0, "bytes": 0, "tokens": 0}

    def add(self, text, ids):
        """The ids of text: a document, or a piece of one."""
        self.ids.append(np.asarray(ids, dtype=self.dtype))
        self.buffered += len(ids)
        self.counts["bytes"] += len(text.encode("utf-8"))
        self.counts["tokens"] += len(ids)
        if self.buffered >= BUFFER:
            self.flush()

    def end(self, eot_token):
        """A document's end: <|endoftext|>."""
        self.add("", [eot_token])
        self.counts["documents"] += 1

    def flush(self):
        for ids in self.ids:
            self.file.write(ids.data)
        self.ids = []
        self.buffered = 0


def main(argv=None):
    p = ArgumentParser(description=__doc__)
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--source", help="a .txt, .md, .jsonl or .parquet file, or a folder of them")
    where.add_argument(
        "--dataset", help="a Hugging Face dataset's name (or a folder of its files), streamed"
    )
    flags(p, FLAGS)
    args = p.parse_args(argv)
    if args.vocab_size > MOST_TOKENS:
        raise Error(f"--vocab_size {args.vocab_size:,}: past the {MOST_TOKENS:,} ids uint32 holds")
    t0 = time.time()
    prepare.check_out_dir(args.out_dir)
    corpus = Corpus(args)
    tok = make_tokenizer(args, corpus)
    tails = False
    with locked_out_dir(args.out_dir, prepare.held_by_a_prepare):
        # the token files take their names as this block ends, unless it fails
        with ExitStack() as files:
            dtype = prepare.token_dtype(tok.vocab_size)
            splits = {n: SplitWriter(files, args.out_dir, n, dtype) for n in ("train", "val")}
            encode(corpus, tok, splits, args, tails)
            small = small_split(splits, corpus, args)
            if small:
                # few documents: each one's tail to val (docs/data.md, "A few long documents")
                tails = True
                print(
                    f"{small} holds {splits[small].counts['tokens']:,} tokens as the hash of each "
                    f"document splits them; split by tails instead: each document's last "
                    f"{args.val_fraction * 100:g}% to val"
                )
                tok = make_tokenizer(args, corpus, tails) if args.tokenizer == "bpe" else tok
                for split in splits.values():
                    split.reset(prepare.token_dtype(tok.vocab_size))
                encode(corpus, tok, splits, args, tails)
                check_counts(splits, args)
            for split in splits.values():
                split.flush()
            # the old meta.json goes before its files do
            prepare.unpublish(args.out_dir)
        publish(args, tok, splits, tails, time.time() - t0)


def encode(corpus, tok, splits, args, tails):
    """Every document's ids and <|endoftext|> into its split's file (or its parts' into theirs:
    parts()), in pieces (pieces()): a batch of up to 1,024 pieces or BATCH characters at a time
    (tiktoken encodes a batch in threads)."""
    batch = []
    size = 0
    for text in tqdm(corpus, desc="encoding", unit=" docs", disable=None):
        for name, start, end in parts(text, args.val_fraction, tails):
            for piece in pieces(text, start, end):
                batch.append((name, piece))
                size += len(piece)
                if len(batch) >= 1024 or size >= BATCH:
                    add(batch, tok, splits)
                    batch = []
                    size = 0
            batch.append((name, None))  # the document's end
    add(batch, tok, splits)


def add(batch, tok, splits):
    """A batch's (split, piece) in order; a piece of None ends a document."""
    texts = [piece for _, piece in batch if piece is not None]
    encoded = iter(tok.encode_batch(texts))
    for name, piece in batch:
        if piece is None:
            splits[name].end(tok.eot_token)
        else:
            splits[name].add(piece, next(encoded))


def small_split(splits, corpus, args):
    """The name of a split that holds no more than block_size tokens (no training row), or None;
    no document at all is an Error."""
    documents = sum(s.counts["documents"] for s in splits.values())
    if not documents:
        raise Error(
            f"{args.source or args.dataset}: no document holds any text; "
            f"{corpus.skipped:,} are empty"
        )
    for name, split in splits.items():
        if split.counts["tokens"] <= args.block_size:
            return name
    return None


def check_counts(splits, args):
    """Each split holds a training row (more than block_size tokens), once split by tails."""
    documents = sum(s.counts["documents"] for s in splits.values())
    for name, split in splits.items():
        tokens = split.counts["tokens"]
        if tokens <= args.block_size:
            raise Error(
                f"{args.source or args.dataset}: {name} holds {tokens:,} tokens of {documents:,} "
                f"documents (each document's tail in val), not more than --block_size "
                f"{args.block_size}: add text, change --val_fraction, or pass the smaller "
                "block_size you train with"
            )


def publish(args, tok, splits, tails, seconds):
    """The token files have their names: the trained tokenizer's file, then meta.json, last."""
    if isinstance(tok, TrainedBPE):
        tok.spec = save_ranks(tok.ranks, args.out_dir)
    counts = {key: {n: s.counts[key] for n, s in splits.items()} for key in ("documents", "bytes")}
    tokens = {name: split.counts["tokens"] for name, split in splits.items()}
    meta = {
        "task": "lm",
        **prepare.tokenizer_meta(tok),
        "splits": tokens,
        **counts,
        "source": args.source or f"{args.dataset}:{args.split}",
    }
    # only where the split is not the hash of whole documents (a meta.json as before, else)
    if tails:
        meta["split_by"] = "tail"
    prepare.write_meta(args.out_dir, **meta)
    for name, split in splits.items():
        c = split.counts
        print(
            f"{name}: {c['documents']:,} documents, {c['bytes']:,} bytes, {c['tokens']:,} tokens "
            f"({c['tokens'] / c['bytes']:.3f} per byte)"
        )
    print(
        f"{tok.spec['type']} vocabulary of {tok.vocab_size:,} -> {args.out_dir} ({seconds:.1f} s)"
    )


if __name__ == "__main__":
    run_script(main, "prepare.py")
