"""
OpenWebText (about 8M documents, 9B tokens) in GPT-2's byte-pair encoding, as nanoGPT's openwebtext:
<|endoftext|> (50256) after every document, 0.05% of the documents as val (seed 2357). Writes
train.bin (~17 GB), val.bin (uint16) and meta.json (task "lm") into this folder, or into --out_dir.
A job for a machine with disk and cores to spare: the download is ~54 GB of hub cache.
  python data/openwebtext/prepare.py --num_proc 8
  # local text: a folder of .txt files, one per document,
  python data/openwebtext/prepare.py --source my_texts/
  # or a .jsonl / .parquet with a "text" column
  python data/openwebtext/prepare.py --source docs.jsonl
"""

import glob
import os
import sys
import time

import numpy as np
from tqdm import tqdm

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))  # the repo root, for lib/
from lib import prepare
from lib.bpe import BPETokenizer
from lib.common import ArgumentParser, Error, run_script
from lib.options import Option, flags

HUB_NAME = "Skylion007/openwebtext"
tok = None  # the tokenizer, made once per process (map's workers make their own)
FLAGS = {
    "source": Option(
        None, f"local text instead of {HUB_NAME}: a folder of .txt files or a .jsonl/.parquet"
    ),
    "out_dir": Option(HERE, "where to write"),
    "num_proc": Option(min(8, os.cpu_count() or 1), "processes for download and tokenizing", ge=1),
    "val_fraction": Option(0.0005, "share of documents for val", gt=0, lt=1),
}


def process(example):
    global tok
    tok = tok or BPETokenizer("r50k_base")
    # <|endoftext|> closes each document, as in GPT-2
    ids = tok.encode(example["text"]) + [tok.start_token]
    return {"ids": ids, "len": len(ids), "bytes": len(example["text"].encode("utf-8"))}


def load(source, num_proc):
    """The documents as a datasets.Dataset with a "text" column."""
    import datasets  # imported here so that --help answers at once

    if source is None:
        return prepare.load_hub(
            HUB_NAME,
            "pass --source PATH, a folder of .txt files or a .jsonl/.parquet with a text column",
            num_proc=num_proc,
            split="train",
        )
    if os.path.isdir(source):
        # sorted: the same order, the same split, every run
        files = sorted(glob.glob(os.path.join(source, "*.txt")))
        if not files:
            raise Error(
                f"--source {source}: no .txt files in this folder; "
                "put one document per .txt file there"
            )
        ds = datasets.load_dataset("text", data_files=files, sample_by="document", split="train")
    elif source.endswith((".jsonl", ".parquet")) and os.path.isfile(source):
        ds = datasets.load_dataset(
            "json" if source.endswith(".jsonl") else "parquet", data_files=source, split="train"
        )
        if "text" not in ds.column_names:
            raise Error(
                f'--source {source}: no "text" column (found {ds.column_names}); '
                "name the column text"
            )
    else:
        raise Error(
            f"--source {source}: "
            "neither a folder of .txt files nor an existing .jsonl or .parquet file"
        )
    return ds


def main():
    p = ArgumentParser(description=__doc__)
    flags(p, FLAGS)
    args = p.parse_args()
    t0 = time.time()
    global tok
    prepare.check_out_dir(args.out_dir)
    tok = BPETokenizer("r50k_base")  # fail here, in one line, rather than inside num_proc workers

    ds = load(args.source, args.num_proc)
    if len(ds) < 2:
        raise Error(
            f"{args.source or HUB_NAME}: {len(ds)} document(s); train and val need at least 2"
        )
    # train_test_split cuts at least one document off for val and leaves at least one in train
    split = ds.train_test_split(test_size=args.val_fraction, seed=2357, shuffle=True)
    split["val"] = split.pop("test")
    tokenized = {
        name: d.map(
            process,
            remove_columns=d.column_names,
            desc=f"tokenizing {name}",
            num_proc=min(args.num_proc, len(d)) if args.num_proc > 1 else None,
        )  # <= rows: map warns
        for name, d in split.items()
    }

    dtype = prepare.token_dtype(tok.vocab_size)
    # from here on the folder is being rewritten: no meta.json until it is whole
    prepare.unpublish(args.out_dir)
    counts = {}
    text_bytes = {}
    for name, d in tokenized.items():
        # write through a memmap, a shard at a time: train is ~9B tokens, more than fits in memory
        # as a list
        n = int(np.sum(d["len"], dtype=np.uint64))
        path = os.path.join(args.out_dir, f"{name}.bin")
        arr = np.memmap(path + ".tmp", dtype=dtype, mode="w+", shape=(n,))
        shards, i = min(1024, len(d)), 0
        for k in tqdm(range(shards), desc=f"writing {path}"):
            ids = d.shard(num_shards=shards, index=k, contiguous=True).with_format("numpy")["ids"]
            batch = np.concatenate(list(ids))
            arr[i : i + len(batch)] = batch
            i += len(batch)
        arr.flush()
        del arr
        os.replace(path + ".tmp", path)  # only a whole file takes the name
        counts[name] = n
        text_bytes[name] = int(np.sum(d["bytes"], dtype=np.uint64))
        print(f"{name}: {len(d):,} documents, {n:,} tokens")
    prepare.write_meta(
        args.out_dir,
        task="lm",
        **prepare.tokenizer_meta(tok),
        splits=counts,
        bytes=text_bytes,
        source=args.source or HUB_NAME,
    )
    print(f"wrote {args.out_dir} ({time.time() - t0:.1f} s)")


if __name__ == "__main__":
    run_script(main, "prepare.py")
