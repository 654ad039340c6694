"""
What the prepare scripts share (data/<name>/prepare.py): reading text and labelled rows (csv,
parquet, jsonl), and writing a prepared dataset, meta.json last, in the formats of data/README.md:
  lm:        {split}.bin, every token id of the split in a row
  classify:  {split}.bin, the token ids of all rows in a row; {split}.offsets.npy, where each row
             starts (n + 1 entries); {split}.labels.npy, one class id per row
  meta.json: task, tokenizer, vocab_size, dtype (uint16, or uint32 past 65,536 tokens), splits
             (tokens or rows per split); classify adds label_names, max_length and pad_token_id
Rows reads a split of rows back: the classifier's and the chat fine-tune's readers build on it.
"""

import csv
import functools
import hashlib
import os
import re
import time
import urllib.request

import numpy as np

from lib.common import ArgumentParser, Error, parse_json, read_utf8
from lib.data import check, load_array
from lib.files import atomic_path, locked_out_dir, write_json
from lib.options import Option, flags

LABELLED_FORMATS = (".csv", ".parquet", ".jsonl")
# a label written as an integer: ASCII digits ("²" and "--1" are no class), short enough for int()
INTEGER = re.compile(r"-?[0-9]{1,18}")
# in_val hashes a text this many characters at a time
HASH_PIECE = 1 << 20


def read_records(path):
    """(text, label) pairs of a .csv, .parquet or .jsonl file with columns text,label, as stored,
    unchecked; a jsonl line that is not a JSON object reads as (None, None)."""
    if not path.endswith(LABELLED_FORMATS):
        raise Error(f"{path}: expected a .csv, .parquet or .jsonl file with columns text,label")
    try:
        if path.endswith(".csv"):
            csv.field_size_limit(2**31 - 1)  # a long article must not stop the run
            # -sig: spreadsheets often start with a BOM
            with open(path, newline="", encoding="utf-8-sig") as f:
                reader = csv.DictReader(f)
                if not {"text", "label"} <= set(reader.fieldnames or []):
                    raise Error(
                        f"{path}: needs a header with the columns text,label "
                        f"(found {reader.fieldnames})"
                    )
                return [(r["text"], r["label"]) for r in reader]
        if path.endswith(".parquet"):
            import pyarrow.parquet as pq  # installed with datasets

            names = pq.read_schema(path).names
            if not {"text", "label"} <= set(names):
                raise Error(f"{path}: needs the columns text,label (found {names})")
            table = pq.read_table(path, columns=["text", "label"])
            return list(zip(table.column("text").to_pylist(), table.column("label").to_pylist()))
        records = []
        with open(path, encoding="utf-8-sig") as f:
            for line in f:
                if line.strip():
                    try:
                        r = parse_json(line)
                    except Error:
                        r = None
                    records.append(
                        (r.get("text"), r.get("label")) if isinstance(r, dict) else (None, None)
                    )
        return records
    # missing, not UTF-8, broken csv or parquet
    except (OSError, UnicodeDecodeError, csv.Error, ValueError) as e:
        reason = (str(e).splitlines() or [""])[0][:200]
        raise Error(
            f"{path}: cannot read it ({type(e).__name__}: {reason}); "
            "it must be UTF-8 text (csv, jsonl) or parquet, with columns text,label"
        ) from None


def label_ids(values, names):
    """Class ids for raw labels: ints, integral floats (parquet turns an int column with gaps into
    floats), strings of an int, or class names. Returns (ids, with None where a label is none of the
    classes; a note or None). A file whose integer labels are exactly 1..n (no 0, as in the original
    AG News CSVs) is read as 1-based and shifted down, and the note says so: never shifted silently,
    never half-dropped."""

    def parse(value):  # -> (id, whether it was written as a number)
        if isinstance(value, str):
            value = value.strip()
            if value in names:
                return names.index(value), False
            value = int(value) if INTEGER.fullmatch(value) else None
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        number = isinstance(value, (int, np.integer)) and not isinstance(value, bool)
        return (int(value), True) if number else (None, False)

    parsed = [parse(v) for v in values]
    numbers = {i for i, number in parsed if number}
    shift = 1 if numbers and min(numbers) == 1 and max(numbers) == len(names) else 0
    ids = [None if i is None else i - shift * number for i, number in parsed]
    note = (
        (
            f"labels run 1..{len(names)} with no 0: read as 1-based, "
            + ", ".join(f"{i + 1} = {n}" for i, n in enumerate(names))
        )
        if shift
        else None
    )
    return [i if i is not None and 0 <= i < len(names) else None for i in ids], note


def read_labelled(path, names):
    """(texts, label ids, warnings) of a labelled .csv, .parquet or .jsonl file: see
    clean_labelled."""
    return clean_labelled(read_records(path), names, path)


def clean_labelled(records, names, path):
    """(texts, label ids, warnings) of (text, label) records: rows with no text or a label that is
    none of the classes are dropped and counted in a warning. No usable row at all is an Error."""
    records = list(records)
    ids, note = label_ids([label for _, label in records], names)
    texts, labels, no_text, bad_label = [], [], 0, 0
    for (text, _), label in zip(records, ids):
        if not isinstance(text, str) or not text.strip():
            no_text += 1
        elif label is None:
            bad_label += 1
        else:
            texts.append(text)
            labels.append(label)
    classes = f"a class id 0..{len(names) - 1} or a name ({', '.join(names)})"
    if not texts:
        raise Error(
            f"{path}: no usable row among {len(records):,} "
            f"(each needs columns text,label: a non-empty text and {classes}; "
            f"{no_text:,} had no text, {bad_label:,} another label)"
        )
    warnings = [f"{path}: {note}"] if note else []
    if no_text or bad_label:
        warnings.append(
            f"{path}: skipped {no_text + bad_label:,} of {len(records):,} rows "
            f"({no_text:,} with no text, {bad_label:,} with a label that is not {classes})"
        )
    return texts, labels, warnings


def load_hub(name, advice, **options):
    """datasets.load_dataset(name, **options); any failure is one line ending in advice."""
    import datasets  # imported here: it takes a second, and a local --source never needs it

    try:
        return datasets.load_dataset(name, **options)
    # offline it is a ConnectionError, but any failure here has the same way out
    except Exception as e:
        reason = (str(e).splitlines() or [""])[0][:200]
        raise Error(
            f"cannot download {name} (no network? {type(e).__name__}: {reason}): {advice}"
        ) from None


def read_text(source, url):
    """The text of the file source, or, without one, downloaded from url."""
    if source is None:
        try:
            with urllib.request.urlopen(url, timeout=30) as r:
                return r.read().decode("utf-8")
        except OSError as e:  # URLError, timeouts and refused connections are all OSErrors
            raise Error(
                f"cannot download {url} (no network? {type(e).__name__}: {e}): pass --source FILE"
            ) from None
    text = read_utf8(
        source,
        f"--source {source}: no such file; pass the path of a text file",
        f"--source {source}: not readable UTF-8 text",
        "; convert it to UTF-8",
    )
    if not text:
        raise Error(f"--source {source}: the file is empty; pass a file holding the text")
    return text


def in_val(text, val_fraction):
    """Whether a text goes to val: the same text always hashes the same way, so duplicates can't
    straddle train and val (a leak into val), and every run splits alike. A long text is hashed a
    piece at a time: never a second copy of all of it."""
    digest = hashlib.md5()
    for start in range(0, len(text), HASH_PIECE):
        digest.update(text[start : start + HASH_PIECE].encode("utf-8"))
    return int(digest.hexdigest()[:8], 16) / 2**32 < val_fraction


def token_dtype(vocab_size):
    return np.uint16 if vocab_size <= 2**16 else np.uint32


def save_array(path, array):
    """Write .bin (raw) or .npy atomically: a half-written file never takes the name. The raw
    bytes go through Python's file, which reports a refused write (numpy's tofile() can leave a
    short file without an error)."""
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        np.save(f, array) if path.endswith(".npy") else f.write(array.data)


def held_by_a_prepare(out_dir):
    """The refusal of an --out_dir another prepare.py holds (lib.files.locked_out_dir)."""
    return (
        f"--out_dir {out_dir}: another prepare.py is writing into it: wait for it to end, "
        "or pick another --out_dir"
    )


def check_out_dir(out_dir):
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise Error(f"--out_dir {out_dir} is a file, not a folder: pass a folder")


def unpublish(out_dir):
    """Call once the input has passed its checks, before writing anything: without meta.json the
    folder reads as unprepared, so a run that dies halfway through its writes can't leave old
    metadata describing new files."""
    check_out_dir(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    if os.path.exists(os.path.join(out_dir, "meta.json")):
        os.remove(os.path.join(out_dir, "meta.json"))


def tokenizer_meta(tok):
    """meta.json's account of the tokenizer: its spec, its vocabulary and the token files' dtype."""
    dtype = np.dtype(token_dtype(tok.vocab_size)).name
    return dict(tokenizer=tok.spec, vocab_size=tok.vocab_size, dtype=dtype)


def write_meta(data_dir, **meta):
    os.makedirs(data_dir, exist_ok=True)
    write_json(os.path.join(data_dir, "meta.json"), meta)


def write_lm(out_dir, splits, text_bytes, tok, source):
    """splits: {name: token ids}; text_bytes: {name: the bytes of its UTF-8 text}. Writes
    {name}.bin for each, then meta.json (task "lm") last."""
    dtype = token_dtype(tok.vocab_size)
    check_out_dir(out_dir)
    with locked_out_dir(out_dir, held_by_a_prepare):
        unpublish(out_dir)
        for name, ids in splits.items():
            save_array(os.path.join(out_dir, f"{name}.bin"), np.asarray(ids, dtype=dtype))
        write_meta(
            out_dir,
            task="lm",
            **tokenizer_meta(tok),
            splits={name: len(ids) for name, ids in splits.items()},
            bytes=text_bytes,
            source=source,
        )


def prepare_text(doc, url, out_dir, tokenizer_for, argv=None):
    """The prepare script of a corpus in one text file, cut 90/10 as nanoGPT cuts Tiny Shakespeare:
    --source FILE, or the text downloaded from url. tokenizer_for(text) makes the tokenizer. The
    text is cut first and each part encoded on its own, which gives nanoGPT's token counts."""
    p = ArgumentParser(description=doc)
    keys = {
        "source": Option(None, f"a local copy of the text (default: download {url})"),
        "out_dir": Option(out_dir, "where to write"),
    }
    flags(p, keys)
    args = p.parse_args(argv)
    t0 = time.time()
    check_out_dir(args.out_dir)
    text = read_text(args.source, url)
    tok = tokenizer_for(text)
    n = int(len(text) * 0.9)
    splits = {"train": tok.encode(text[:n]), "val": tok.encode(text[n:])}
    text_bytes = {"train": len(text[:n].encode()), "val": len(text[n:].encode())}
    write_lm(args.out_dir, splits, text_bytes, tok, source=args.source or url)
    print(
        f"{len(text):,} characters, {tok.spec['type']} vocabulary of {tok.vocab_size}: "
        f"train {len(splits['train']):,} tokens, val {len(splits['val']):,} tokens "
        f"-> {args.out_dir} ({time.time() - t0:.1f} s)"
    )


def write_classification_split(data_dir, split, rows, labels, dtype):
    """rows: token id lists; labels: class ids. Writes {split}.bin, {split}.offsets.npy,
    {split}.labels.npy."""
    os.makedirs(data_dir, exist_ok=True)
    lengths = np.array([len(r) for r in rows], dtype=np.int64)
    save_array(
        os.path.join(data_dir, f"{split}.bin"),
        np.fromiter((t for r in rows for t in r), dtype, lengths.sum()),
    )
    save_array(
        os.path.join(data_dir, f"{split}.offsets.npy"), np.concatenate([[0], np.cumsum(lengths)])
    )
    save_array(os.path.join(data_dir, f"{split}.labels.npy"), np.asarray(labels, dtype=np.int64))


class Rows:
    """A split of n rows, read in epochs (a fresh permutation each): row i is
    tokens[offsets[i]:offsets[i + 1]]. The readers of labelled rows and of
    conversations build on it."""

    def __init__(self, path, n, meta):
        """path: the split's files, less their extensions; n: its rows, as meta.json says."""
        self.meta = meta
        self.folder = os.path.dirname(path)
        if n == 0:
            raise Error(f"{path}: the split has no rows: prepare it from more data")
        tokens = load_array(path + ".bin", meta["dtype"])
        offsets = load_array(path + ".offsets.npy")
        check(
            len(offsets) == n + 1 and offsets[0] == 0 and (np.diff(offsets) >= 0).all(),
            path + ".offsets.npy",
            f"not {n + 1:,} rising offsets from 0",
        )
        check(
            offsets[-1] == len(tokens),
            path + ".bin",
            f"{len(tokens):,} tokens, the offsets say {offsets[-1]:,}",
        )
        check(
            len(tokens) == 0 or int(tokens.max()) < meta["vocab_size"],
            path + ".bin",
            f"token ids past vocab_size {meta['vocab_size']}",
        )
        self.tokens, self.offsets = tokens, offsets

    def __len__(self):
        return len(self.offsets) - 1

    def epochs(self, rows):
        """How many times rows drawn rows read the split."""
        return rows / len(self)

    def rows(self, seed, step, n):
        """Rows step * n ... (step + 1) * n - 1 of an endless stream of epochs, each a permutation
        of (seed, epoch)."""
        rows = len(self)
        positions = range(step * n, (step + 1) * n)
        return np.array([permutation(seed, p // rows, rows)[p % rows] for p in positions])

    def eval_rows(self, n):
        return np.arange(min(n, len(self)))  # in order, each row once


@functools.lru_cache(maxsize=1)
def permutation(seed, epoch, rows):
    """The order of an epoch of rows: a function of (seed, epoch) alone (the last one kept)."""
    return np.random.default_rng([seed, epoch]).permutation(rows)
