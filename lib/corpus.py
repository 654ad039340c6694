"""The documents of a text corpus, as data/text/prepare.py reads them: a folder's .txt and .md
files (one document each) and its .jsonl and .parquet rows (one each), a lone text file cut at its
blank lines, or a Hugging Face dataset streamed; each checked to be text."""

import os
import stat
import sys

from lib.common import Error, parse_json

TEXT_FILES = (".txt", ".md")
ROW_FILES = (".jsonl", ".parquet")
# how a dataset's features (or its first row's values) name a text column
TEXT_KINDS = ("string", "large_string", "str")
# a document longer than this many characters is encoded, and learnt from by the BPE, in pieces:
# whole, its ids as Python ints, and the BPE trainer's words, take tens of times its size
PIECE = 1 << 16


def text_files(folder, endings=TEXT_FILES + ROW_FILES):
    """The files of folder and its subfolders whose names end in one of endings (those that hold
    documents), sorted: the same order, every run. What is not a regular file is skipped with a
    warning: a named pipe, or a link to /dev/zero, would hold the read for ever."""
    found = []
    for root, dirs, files in os.walk(folder):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(root, name)
            if not name.endswith(endings):
                continue
            kind = not_regular(path)
            if kind:
                sys.stderr.write(f"warning: {path}: not a regular file ({kind}), skipped\n")
            else:
                found.append(path)
    return found


def not_regular(path):
    """What path is, in words, if it is not a regular file once links are followed; else None."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "a link to nothing"
    except OSError as e:
        return f"unreadable: {e.strerror}"
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISFIFO(mode):
        return "a named pipe"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a device"


def paragraphs(path):
    """A text file's documents, read a line at a time: the runs of lines between blank lines."""
    lines = []
    with open(path, encoding="utf-8-sig") as f:
        for line in f:
            if line.strip():
                lines.append(line)
            elif lines:
                yield "".join(lines).removesuffix("\n")
                lines = []
    if lines:
        yield "".join(lines).removesuffix("\n")


def whole_file(path):
    with open(path, encoding="utf-8-sig") as f:
        yield f.read()


def pick_column(names, strings, column, where):
    """The text column, chosen by the names: --column, else "text", else the only one of strings
    (the columns that may hold text); what a row holds there never moves it."""
    if column is not None and column not in names:
        raise Error(f"{where}: no column {column!r} (found {sorted(names)}); pass --column NAME")
    if column is not None:
        return column
    if "text" in names:
        return "text"
    if len(strings) == 1:
        return strings[0]
    raise Error(f"{where}: which column holds the text? (found {sorted(names)}); pass --column")


def jsonl_rows(path, column):
    """The text of each row; the column is chosen by the first row's keys (a row without it, or
    with null there, reads as an empty document)."""
    name = None
    with open(path, encoding="utf-8-sig") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = parse_json(line)
            except Error as e:
                raise Error(
                    f"{path}:{number}: not a JSON object ({e}); fix or delete the line"
                ) from None
            if not isinstance(row, dict):
                raise Error(f"{path}:{number}: not a JSON object; fix or delete the line")
            if name is None:
                # a null may be the text column's empty first row
                strings = [k for k, v in row.items() if v is None or isinstance(v, str)]
                name = pick_column(row, strings, column, f"{path}:{number}")
            yield row.get(name)


def parquet_rows(path, column):
    import pyarrow.parquet as pq  # installed with datasets

    table = pq.ParquetFile(path)
    strings = [f.name for f in table.schema_arrow if is_text(f.type)]
    name = pick_column(table.schema_arrow.names, strings, column, path)
    for batch in table.iter_batches(columns=[name], batch_size=1024):
        yield from batch.column(0).to_pylist()


def is_text(kind):
    """Whether a parquet column's arrow type holds strings: plain, large, a view (polars) or a
    dictionary of them (pandas' categories)."""
    import pyarrow as pa

    if pa.types.is_dictionary(kind):
        return is_text(kind.value_type)
    return pa.types.is_string(kind) or pa.types.is_large_string(kind) or is_string_view(kind)


def is_string_view(kind):
    """string_view, in a pyarrow that has it (16 and later)."""
    import pyarrow as pa

    return hasattr(pa.types, "is_string_view") and pa.types.is_string_view(kind)


def file_documents(path, column, alone):
    """The documents of one file; alone: the corpus is this one text file."""
    if path.endswith(".jsonl"):
        return jsonl_rows(path, column)
    if path.endswith(".parquet"):
        return parquet_rows(path, column)
    return paragraphs(path) if alone else whole_file(path)


def hub_documents(dataset, split, column):
    """A Hugging Face dataset's rows, streamed: never more than a batch of it in memory."""
    import datasets  # imported here so that --help answers at once

    try:
        ds = datasets.load_dataset(dataset, split=split, streaming=True)
        # each column's kind: declared, or where the dataset declares none, its first value's
        first = {} if ds.features else next(iter(ds))
        kinds = ds.features or {k: type(v).__name__ for k, v in first.items()}
    except Exception as e:  # offline it is a ConnectionError; every failure has the same way out
        reason = (str(e).splitlines() or [""])[0][:200]
        raise Error(
            f"--dataset {dataset}: cannot load its {split} split ({type(e).__name__}: {reason}); "
            "offline, pass --source with a local copy"
        ) from None
    strings = [k for k, kind in kinds.items() if getattr(kind, "dtype", kind) in TEXT_KINDS]
    name = pick_column(kinds, strings, column, f"--dataset {dataset}")
    rows = 0
    try:
        for row in ds:
            yield row.get(name)
            rows += 1
    except Exception as e:  # a dropped connection, a damaged shard: not a write that failed
        reason = (str(e).splitlines() or [""])[0][:200]
        raise Error(
            f"--dataset {dataset}: the stream broke after {rows:,} rows ({type(e).__name__}: "
            f"{reason}); run again, or pass --source with a local copy"
        ) from None


class Corpus:
    """The documents of --source or --dataset, read afresh on each pass, each checked: a string
    of UTF-8 text with some text in it (empty ones are skipped and counted)."""

    def __init__(self, args):
        self.args = args
        self.skipped = 0
        source = args.source
        if args.dataset is not None:
            self.files = None
        elif os.path.isdir(source):
            self.files = text_files(source)
            if not self.files:
                raise Error(
                    f"--source {source}: no .txt, .md, .jsonl or .parquet file in this folder "
                    "or below it; put the text there"
                )
        elif os.path.isfile(source) and source.endswith(TEXT_FILES + ROW_FILES):
            self.files = [source]
        else:
            raise Error(
                f"--source {source}: not a folder, nor a .txt, .md, .jsonl or .parquet file"
            )

    def __iter__(self):
        self.skipped = 0
        if self.files is None:
            docs = hub_documents(self.args.dataset, self.args.split, self.args.column)
            yield from self.checked(docs, f"--dataset {self.args.dataset}")
            return
        # a lone text file is cut at its blank lines; a folder's files are one document each
        alone = os.path.isfile(self.args.source)
        for path in self.files:
            try:
                docs = file_documents(path, self.args.column, alone)
                yield from self.checked(docs, path)
            except UnicodeDecodeError as e:
                raise Error(
                    f"{path}: not UTF-8 text ({e.reason}); convert the file to "
                    "UTF-8 or move it out of the corpus"
                ) from None
            except OSError as e:
                raise Error(f"{path}: cannot read it ({e.strerror})") from None

    def checked(self, docs, where):
        for i, text in enumerate(docs):
            if text is None:
                text = ""
            if not isinstance(text, str):
                raise Error(
                    f"{where}: document {i + 1} is {type(text).__name__}, not text; pass --column "
                    "with the column that holds the text"
                )
            if not text or text.isspace():
                self.skipped += 1
                continue
            try:
                for start in range(0, len(text), PIECE):
                    text[start : start + PIECE].encode("utf-8")
            except UnicodeEncodeError:
                raise Error(
                    f"{where}: document {i + 1} holds a lone surrogate, not text; fix its source"
                ) from None
            yield text
