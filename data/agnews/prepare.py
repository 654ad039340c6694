"""
AG News topic classification (0 World, 1 Sports, 2 Business, 3 Sci/Tech) in GPT-2's byte-pair
encoding, one row per article cut to --max_length tokens. Writes {split}.bin, {split}.offsets.npy,
{split}.labels.npy for train, val (and test when the source has one), then meta.json (task
"classify"), into this folder or --out_dir.
  python data/agnews/prepare.py  # downloads fancyzhx/ag_news: 120,000 train / 7,600 test rows
  TIKTOKEN_CACHE_DIR=../shared/tiktoken_cache \
  python data/agnews/prepare.py --source ../shared/data/agnews_sample  # offline: train.csv, val.csv
--source DIR holds train.{csv,parquet,jsonl} with columns text,label, and optionally val.* and
test.* alike.
Without a val file, val is carved out of train by a hash of each text, so identical texts share a
split.
"""

import os
import sys
import time
from collections import Counter

import numpy as np
from tqdm import tqdm

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))  # the repo root, for lib/
from lib import prepare
from lib.bpe import BPETokenizer
from lib.common import ArgumentParser, Error, run_script
from lib.options import Option, flags

HUB_NAME = "fancyzhx/ag_news"
LABEL_NAMES = ["World", "Sports", "Business", "Sci/Tech"]
FLAGS = {
    "source": Option(
        None, f"a folder with train.csv etc. (default: download {HUB_NAME} from the hub)"
    ),
    "out_dir": Option(HERE, "where to write"),
    "val_fraction": Option(
        0.05, "share of train carved out as val when the source has no val split", gt=0, lt=1
    ),
    "max_length": Option(128, "tokens kept per row", ge=1),
    "cased": Option(
        False,
        "keep the texts' case (default: lowercase them before BPE, as bag-of-words models do; the "
        "tokenizer in meta.json says so, and classify.py does the same)",
    ),
}


def keep(texts, labels, warnings):
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    return texts, labels


def find_file(source, split):
    found = [os.path.join(source, split + ext) for ext in prepare.LABELLED_FORMATS]
    found = [p for p in found if os.path.isfile(p)]
    if len(found) > 1:
        raise Error(f"--source {source}: both {' and '.join(found)}; keep one file per split")
    return found[0] if found else None


def load_local(source):
    """{split: (texts, labels)} from the files of --source DIR."""
    if not os.path.isdir(source):
        raise Error(
            f"--source {source}: no such folder; pass a folder holding train.csv (and val.csv), "
            f"e.g. --source ../shared/data/agnews_sample"
        )
    if find_file(source, "train") is None:
        raise Error(
            f"--source {source}: no train.csv, train.parquet or train.jsonl there; "
            "the folder needs one (columns text,label), optionally with val.* and test.* alike"
        )
    splits = {}
    for split in ("train", "val", "test"):
        if find_file(source, split):
            splits[split] = keep(*prepare.read_labelled(find_file(source, split), LABEL_NAMES))
    return splits


def load_hub():
    """{split: (texts, labels)} from the hub's train and test splits."""
    ds = prepare.load_hub(
        HUB_NAME,
        "pass --source DIR with train.csv/val.csv, e.g. --source ../shared/data/agnews_sample",
    )
    return {
        split: keep(
            *prepare.clean_labelled(
                zip(ds[split]["text"], ds[split]["label"]), LABEL_NAMES, f"{HUB_NAME}:{split}"
            )
        )
        for split in ds
    }


def main():
    p = ArgumentParser(description=__doc__)
    flags(p, FLAGS)
    args = p.parse_args()
    t0 = time.time()
    prepare.check_out_dir(args.out_dir)
    splits = load_local(args.source) if args.source else load_hub()
    if "val" not in splits:
        texts, labels = splits["train"]
        held = [prepare.in_val(t, args.val_fraction) for t in texts]
        splits["val"] = (
            [t for t, h in zip(texts, held) if h],
            [y for y, h in zip(labels, held) if h],
        )
        splits["train"] = (
            [t for t, h in zip(texts, held) if not h],
            [y for y, h in zip(labels, held) if not h],
        )
    # in this order in meta.json too
    splits = {s: splits[s] for s in ("train", "val", "test") if s in splits}
    # a text given in two splits would score as held out while trained on: keep it in test, else
    # val, not train
    seen, done = set(), []
    for split in [s for s in ("test", "val", "train") if s in splits]:
        texts, labels = splits[split]
        keep = [t not in seen for t in texts]
        if not all(keep):
            print(
                f"warning: {split}: dropped {keep.count(False):,} rows "
                f"whose text is also in {'/'.join(done)}",
                file=sys.stderr,
            )
            splits[split] = (
                [t for t, k in zip(texts, keep) if k],
                [y for y, k in zip(labels, keep) if k],
            )
        seen.update(texts)
        done.append(split)
    for split, (texts, _) in splits.items():
        if not texts:
            raise Error(
                f"the {split} split came out empty "
                f"(train {len(splits['train'][0]):,} rows, val {len(splits['val'][0]):,}): "
                "pass more rows, a val file, or another --val_fraction"
            )

    tok = BPETokenizer("r50k_base", lowercase=not args.cased)
    rows, truncated = {}, Counter()
    for split, (texts, _) in splits.items():
        rows[split] = []
        with tqdm(total=len(texts), desc=f"tokenizing {split}", unit=" rows") as bar:
            for i in range(0, len(texts), 1000):  # tiktoken's threads, a thousand rows at a time
                for ids in tok.encode_batch(texts[i : i + 1000]):
                    truncated[split] += len(ids) > args.max_length
                    rows[split].append(ids[: args.max_length])
                bar.update(len(texts[i : i + 1000]))

    dtype = prepare.token_dtype(tok.vocab_size)
    # from here on the folder is being rewritten: no meta.json until it is whole
    prepare.unpublish(args.out_dir)
    for split in ("train", "val", "test"):
        # a test split left over from an earlier run would no longer match meta.json
        if split not in splits:
            for suffix in (".bin", ".offsets.npy", ".labels.npy"):
                if os.path.exists(os.path.join(args.out_dir, split + suffix)):
                    os.remove(os.path.join(args.out_dir, split + suffix))
            continue
        prepare.write_classification_split(
            args.out_dir, split, rows[split], splits[split][1], dtype
        )
        lengths = np.array([len(r) for r in rows[split]])
        counts = Counter(splits[split][1])
        print(
            f"{split}: {len(lengths):,} rows, {lengths.sum():,} tokens, "
            f"mean {lengths.mean():.1f} tokens/row "
            f"({truncated[split]:,} cut to {args.max_length}); classes "
            + ", ".join(f"{name} {counts[i]:,}" for i, name in enumerate(LABEL_NAMES))
        )
    prepare.write_meta(
        args.out_dir,
        task="classify",
        **prepare.tokenizer_meta(tok),
        label_names=LABEL_NAMES,
        max_length=args.max_length,
        pad_token_id=tok.pad_token_id,
        splits={s: len(rows[s]) for s in splits},
        source=args.source or HUB_NAME,
    )
    print(f"wrote {args.out_dir} ({time.time() - t0:.1f} s)")


if __name__ == "__main__":
    run_script(main, "prepare.py")
