"""data/*/prepare.py, run as a user runs them (subprocess, CLI): what they write, what they refuse,
and that dataset.py's readers take what they wrote."""

import csv
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import ROOT, SHARED, needs_shared

from lib.classifier import ClassificationData
from lib.data import read_meta
from lib.settings import load_split

SHAKESPEARE = os.path.join(SHARED, "data", "tinyshakespeare", "input.txt")
LABELS = ["World", "Sports", "Business", "Sci/Tech"]


def prepare(name, *args, env=None):
    """Runs data/{name}/prepare.py; the hub's caches point into the test's folder, so no cached copy
    of a hub data set can stand in for a download and nothing lands in ~/.cache."""
    return subprocess.run(
        [sys.executable, os.path.join(ROOT, "data", name, "prepare.py"), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


def hf_env(tmp):
    return {"HF_HOME": str(tmp / "hf"), "HF_DATASETS_CACHE": str(tmp / "hf" / "datasets")}


def one_line(result):
    """A refusal: non-zero exit and one line on stderr."""
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def bpe():
    import tiktoken

    return tiktoken.get_encoding("r50k_base")


def write_csv(path, rows):
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["text", "label"])
        w.writerows(rows)


def agnews_rows():
    """40 distinct texts (one long enough to be cut, one non-ASCII, one with a comma, quotes and a
    line break) and one text three times over: 43 rows."""
    rows = [
        (
            f"Story {i}: the {['council', 'match', 'market', 'chip'][i % 4]} "
            f"report number {i * 13}.",
            i % 4,
        )
        for i in range(36)
    ]
    rows += [
        (" ".join(f"word{j}" for j in range(60)), 3),
        ("Café crème, naïve façade — 日本 news", 0),
        ('A "quoted", comma\nand a line break', 1),
        ("   leading spaces kept", 2),
    ]
    return rows + [("The same text, three times.", 2)] * 3


@pytest.fixture(scope="module")
def agnews(tmp_path_factory):
    """A tiny train.csv (no val file) prepared with val carved out by hash."""
    tmp = tmp_path_factory.mktemp("agnews")
    os.makedirs(tmp / "src")
    write_csv(tmp / "src" / "train.csv", agnews_rows())
    r = prepare(
        "agnews",
        "--source",
        tmp / "src",
        "--out_dir",
        tmp / "out",
        "--val_fraction",
        0.3,
        "--max_length",
        16,
        "--cased",
    )
    assert r.returncode == 0, r.stderr
    return tmp / "out", r


def read_rows(out, split):
    tokens = np.fromfile(out / f"{split}.bin", dtype=read_meta(out)["dtype"])
    offsets, labels = np.load(out / f"{split}.offsets.npy"), np.load(out / f"{split}.labels.npy")
    return tokens, offsets, labels


@needs_shared
def test_agnews_csv_splits_labels_and_round_trip(agnews):
    out, r = agnews
    enc, source = bpe(), agnews_rows()
    label_of = dict(source)
    meta = read_meta(out)
    assert set(meta) == {
        "task",
        "tokenizer",
        "vocab_size",
        "dtype",
        "label_names",
        "max_length",
        "pad_token_id",
        "splits",
        "source",
    }
    assert (meta["task"], meta["tokenizer"], meta["vocab_size"], meta["dtype"]) == (
        "classify",
        {"type": "bpe", "encoding": "r50k_base"},
        50257,
        "uint16",
    )
    assert (meta["label_names"], meta["max_length"], meta["pad_token_id"]) == (LABELS, 16, 50256)
    assert not os.path.exists(out / "test.bin")  # no test file, no test split
    texts = {}
    for split in ("train", "val"):
        tokens, offsets, labels = read_rows(out, split)
        assert len(offsets) == len(labels) + 1 == meta["splits"][split] + 1 and len(labels) > 0
        assert offsets[0] == 0 and offsets[-1] == len(tokens) and labels.dtype == np.int64
        assert np.all(np.diff(offsets) >= 1) and np.all(np.diff(offsets) <= 16)
        texts[split] = []
        for i, label in enumerate(labels):
            ids = tokens[offsets[i] : offsets[i + 1]].tolist()
            text = next(t for t, _ in source if enc.encode_ordinary(t)[:16] == ids)
            assert label == label_of[text]
            # a row decodes to its text, or to a prefix of it when cut (in bytes: a cut may split a
            # character)
            assert (
                enc.decode(ids) == text
                if len(enc.encode_ordinary(text)) <= 16
                else text.encode().startswith(enc.decode_bytes(ids))
            )
            texts[split].append(text)
    assert sorted(texts["train"] + texts["val"]) == sorted(t for t, _ in source)  # every row, once
    # the repeated text sits in one split, all three times
    assert not set(texts["train"]) & set(texts["val"])
    # a summary line per split
    assert "train: " in r.stdout and "val: " in r.stdout and "World" in r.stdout


@pytest.mark.slow
@needs_shared
def test_agnews_parquet_jsonl_and_malformed_rows(tmp_path):
    pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
    src = tmp_path / "src"
    os.makedirs(src)
    good = [{"text": f"Good row {i} about things", "label": i % 4} for i in range(8)]
    bad = [
        {"text": "", "label": 1},
        {"text": "   ", "label": 1},
        {"label": 2},
        {"text": None, "label": 0},
        {"text": "no label"},
        {"text": "label x", "label": "x"},
        {"text": "label 7", "label": 7},
        {"text": "label -1", "label": -1},
        {"text": "label 1.5", "label": 1.5},
        {"text": "bool", "label": True},
    ]
    with open(src / "train.jsonl", "w") as f:
        f.write("\n".join(json.dumps(r) for r in good + bad) + "\n{not json\n")
        f.write(json.dumps({"text": "label as a string", "label": "2"}) + "\n")
    pq.write_table(
        pa.table({"text": ["Val row one", "Val row two"], "label": [3, 0]}), src / "val.parquet"
    )
    write_csv(src / "test.csv", [("Test row", 1), ("", 1)])
    r = prepare("agnews", "--source", src, "--out_dir", tmp_path / "out")
    assert r.returncode == 0, r.stderr
    warnings = [line for line in r.stderr.splitlines() if line.startswith("warning:")]
    # one line per file with bad rows: train.jsonl and test.csv, not val.parquet
    assert len(warnings) == 2
    assert (
        "train.jsonl: skipped 11 of 20 rows" in warnings[0]
        and "test.csv: skipped 1 of 2 rows" in warnings[1]
    )
    meta = read_meta(tmp_path / "out")
    assert meta["splits"] == {"train": 9, "val": 2, "test": 1}
    assert read_rows(tmp_path / "out", "train")[2].tolist() == [0, 1, 2, 3, 0, 1, 2, 3, 2]
    assert read_rows(tmp_path / "out", "val")[2].tolist() == [3, 0]
    tokens, offsets, labels = read_rows(tmp_path / "out", "test")
    # lowercased: the default
    assert bpe().decode(tokens.tolist()) == "test row" and labels.tolist() == [1]
    assert meta["tokenizer"] == {"type": "bpe", "encoding": "r50k_base", "lowercase": True}


@needs_shared
def test_agnews_labels_1_to_4_are_read_as_1_based_with_a_note(tmp_path):
    """The original AG News CSVs number the classes 1..4: mapped down, said in one line, never
    shifted silently."""
    os.makedirs(tmp_path / "src")
    write_csv(tmp_path / "src" / "train.csv", [(f"Story number {i}", i % 4 + 1) for i in range(20)])
    r = prepare(
        "agnews", "--source", tmp_path / "src", "--out_dir", tmp_path / "out", "--val_fraction", 0.2
    )
    assert r.returncode == 0, r.stderr
    assert (
        "labels run 1..4 with no 0: read as 1-based, "
        "1 = World, 2 = Sports, 3 = Business, 4 = Sci/Tech" in r.stderr
    )
    labels = np.concatenate([read_rows(tmp_path / "out", s)[2] for s in ("train", "val")])
    assert sorted(labels.tolist()) == sorted(i % 4 for i in range(20))


def test_agnews_file_without_valid_rows_fails_and_writes_nothing(tmp_path):
    os.makedirs(tmp_path / "src")
    write_csv(tmp_path / "src" / "train.csv", [("", 1), ("text", "sports"), ("text", 9)])
    os.makedirs(tmp_path / "out")
    (tmp_path / "out" / "meta.json").write_text("an earlier, complete run")
    line = one_line(prepare("agnews", "--source", tmp_path / "src", "--out_dir", tmp_path / "out"))
    assert "train.csv" in line and "no usable row" in line
    assert os.listdir(tmp_path / "out") == ["meta.json"]
    assert (tmp_path / "out" / "meta.json").read_text() == "an earlier, complete run"


@pytest.mark.slow
def test_agnews_offline_without_source_fails(tmp_path):
    env = {**hf_env(tmp_path), "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    line = one_line(prepare("agnews", "--out_dir", tmp_path / "out", env=env))
    assert (
        "fancyzhx/ag_news" in line and "--source" in line and not os.path.exists(tmp_path / "out")
    )


@needs_shared
def test_classification_data_reads_and_pads(agnews):
    out, _ = agnews
    tokens, offsets, labels = read_rows(out, "train")
    data = load_split(str(out), "train", block_size=64)
    assert isinstance(data, ClassificationData) and len(data) == len(labels)
    lengths = np.diff(offsets)
    # a short row beside the longest
    rows = np.array([int(np.argmin(lengths)), int(np.argmax(lengths))])
    b = data.batch(rows)
    width = lengths[rows].max()
    assert b["idx"].shape == b["attention_mask"].shape == (2, width)
    assert b["labels"].tolist() == labels[rows].tolist()
    for k, i in enumerate(rows):
        n = lengths[i]
        assert b["idx"][k, :n].tolist() == tokens[offsets[i] : offsets[i + 1]].tolist()
        assert b["attention_mask"][k, :n].eq(1).all() and b["attention_mask"][k, n:].eq(0).all()
        assert b["idx"][k, n:].eq(50256).all()  # pad_token_id, from meta.json
    assert b["attention_mask"][0, -1] == 0  # the short row is padded


def test_shakespeare_char_small(tmp_path):
    text = (
        "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n" * 3
    )
    (tmp_path / "in.txt").write_text(text)
    r = prepare("shakespeare_char", "--source", tmp_path / "in.txt", "--out_dir", tmp_path / "out")
    assert r.returncode == 0, r.stderr
    meta = read_meta(tmp_path / "out")
    chars = "".join(sorted(set(text)))
    assert meta["task"] == "lm" and meta["tokenizer"] == {"type": "char", "chars": chars}
    assert meta["vocab_size"] == len(chars) and meta["dtype"] == "uint16"
    train = np.fromfile(tmp_path / "out" / "train.bin", dtype=np.uint16)
    val = np.fromfile(tmp_path / "out" / "val.bin", dtype=np.uint16)
    assert len(train) == int(len(text) * 0.9) and len(train) + len(val) == len(text)
    assert meta["splits"] == {"train": len(train), "val": len(val)}
    assert "".join(chars[i] for i in np.concatenate([train, val])) == text
    data = load_split(str(tmp_path / "out"), "val", block_size=8)
    b = data.batch(np.array([0, 3]))
    assert (
        b["idx"][1].tolist() == val[3:11].tolist()
        and b["targets"][1].tolist() == val[4:12].tolist()
    )


def test_shakespeare_into_a_folder_another_prepare_holds_is_refused(tmp_path):
    import fcntl

    (tmp_path / "in.txt").write_text("First Citizen:\nBefore we proceed any further.\n" * 3)
    os.makedirs(tmp_path / "out")
    (tmp_path / "out" / "meta.json").write_text("{}")
    # what another prepare.py holds while it writes there
    folder = os.open(tmp_path / "out", os.O_RDONLY)
    fcntl.flock(folder, fcntl.LOCK_EX)
    try:
        args = ["--source", tmp_path / "in.txt", "--out_dir", tmp_path / "out"]
        line = one_line(prepare("shakespeare_char", *args))
    finally:
        os.close(folder)
    assert "another prepare.py is writing into it" in line
    assert os.listdir(tmp_path / "out") == ["meta.json"]


def test_shakespeare_offline_fails(tmp_path):
    # a proxy that refuses connections: offline, on a machine that has a network too
    env = {
        "https_proxy": "http://127.0.0.1:9",
        "HTTPS_PROXY": "http://127.0.0.1:9",
        "no_proxy": "",
        "NO_PROXY": "",
    }
    line = one_line(prepare("shakespeare_char", "--out_dir", tmp_path / "out", env=env))
    assert "cannot download" in line and "--source" in line and not os.path.exists(tmp_path / "out")


@needs_shared
@pytest.mark.parametrize(
    "name, vocab, n_train, n_val",
    [("shakespeare_char", 65, 1_003_854, 111_540), ("shakespeare", 50257, 301_966, 36_059)],
)
def test_shakespeare_matches_nanogpt(tmp_path, name, vocab, n_train, n_val):
    r = prepare(name, "--source", SHAKESPEARE, "--out_dir", tmp_path)
    assert r.returncode == 0, r.stderr
    meta = read_meta(tmp_path)
    assert (meta["vocab_size"], meta["dtype"], meta["splits"]) == (
        vocab,
        "uint16",
        {"train": n_train, "val": n_val},
    )
    ids = np.concatenate(
        [np.fromfile(tmp_path / f"{s}.bin", dtype=np.uint16) for s in ("train", "val")]
    ).tolist()
    decode = (
        bpe().decode
        if name == "shakespeare"
        else lambda ids: "".join(meta["tokenizer"]["chars"][i] for i in ids)
    )
    with open(SHAKESPEARE, encoding="utf-8") as f:
        text = f.read()
    assert decode(ids) == text
    # bits per byte's denominator: the bytes of each split's text
    n = int(len(text) * 0.9)
    assert meta["bytes"] == {"train": len(text[:n].encode()), "val": len(text[n:].encode())}


@pytest.mark.slow
@needs_shared
def test_openwebtext_local_folder(tmp_path):
    docs = [f"Document {i}.\nIt has two lines, and ünïcode — {i * 7}.\n" for i in range(6)] + [""]
    os.makedirs(tmp_path / "docs")
    for i, doc in enumerate(docs):
        (tmp_path / "docs" / f"{i:02d}.txt").write_text(doc, encoding="utf-8")
    r = prepare(
        "openwebtext",
        "--source",
        tmp_path / "docs",
        "--out_dir",
        tmp_path / "out",
        "--val_fraction",
        0.3,
        "--num_proc",
        1,
        env=hf_env(tmp_path),
    )
    assert r.returncode == 0, r.stderr
    meta = read_meta(tmp_path / "out")
    enc, found = bpe(), []
    for split in ("train", "val"):
        ids = np.fromfile(tmp_path / "out" / f"{split}.bin", dtype=np.uint16)
        # every document ends in <|endoftext|>
        assert meta["splits"][split] == len(ids) and ids[-1] == 50256
        ends = np.flatnonzero(ids == 50256)
        # each without its 50256
        found += [enc.decode(d[:-1].tolist()) for d in np.split(ids, ends + 1)[:-1]]
    assert sorted(found) == sorted(docs)  # each document once, whole, between two <|endoftext|>
    assert sum(meta["bytes"].values()) == sum(len(d.encode()) for d in docs)
    assert meta["task"] == "lm" and meta["dtype"] == "uint16" and meta["vocab_size"] == 50257
    assert not [f for f in os.listdir(tmp_path / "out") if f.endswith(".tmp")]
    assert load_split(str(tmp_path / "out"), "train", block_size=4).batch(np.array([0]))[
        "idx"
    ].shape == (1, 4)


def test_a_run_and_a_prepare_hold_an_out_dir_by_one_lock(tmp_path):
    """A prepare into a folder a run holds is refused, and a run into a folder a prepare holds:
    one locked_out_dir for both."""
    from lib import checkpoint, prepare
    from lib.common import Error
    from lib.files import locked_out_dir

    with checkpoint.run_out_dir(str(tmp_path), resuming=False, overwrite=False):
        with pytest.raises(Error, match="another prepare.py is writing into it"):
            with locked_out_dir(str(tmp_path), prepare.held_by_a_prepare):
                pass
    with locked_out_dir(str(tmp_path), prepare.held_by_a_prepare):
        with pytest.raises(Error, match="in use by another run"):
            with checkpoint.run_out_dir(str(tmp_path), resuming=False, overwrite=False):
                pass
    # let go, a run takes it
    with checkpoint.run_out_dir(str(tmp_path), resuming=False, overwrite=False):
        pass
