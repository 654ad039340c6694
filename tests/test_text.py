"""data/text/prepare.py, any text to a trained GPT: a corpus in a script other than Latin goes
through prepare (a BPE trained on it), train, sample, serve and export, and Hugging Face's
AutoTokenizer gives our ids; bits per byte by their definition; each bad input one line, nothing
written."""

import http.client
import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from conftest import ROOT, SHARED, TINY, needs_shared

import sample
import train
from export import export
from lib.common import Error
from lib.data import read_meta
from lib.weights import get_tokenizer, load_gpt
from serving.app import Server
from serving.playground import Playground

SHAKESPEARE = os.path.join(SHARED, "data", "tinyshakespeare", "input.txt")
# sentences written for these tests: Russian, with a Greek and a Ukrainian one
SENTENCES = [
    "Внимание — это взвешенная сумма значений.",
    "Каждая голова смотрит на свою часть контекста.",
    "Маска ставит минус бесконечность перед софтмаксом.",
    "Модель читает текст слева направо, токен за токеном.",
    "Ёжик в тумане ищет лошадку.",
    "Η προσοχή είναι ένας σταθμισμένος μέσος όρος.",
    "Щастя — це коли тебе розуміють.",
    "Словарь из байтов: любое слово можно записать.",
]
# texts that an exported tokenizer must encode to our ids
PROBES = [
    "Внимание — это всё, что нужно.",
    "Ёлка, ёжик и щётка: ЁЩЪ ёщъ.",
    "Ελληνικά και русский, mixed with English 123 — 😀!",
    "  два  пробела\n\nи новая строка\t",
]


def documents():
    """40 documents of three to five sentences each, none empty."""
    return [
        " ".join(SENTENCES[(i + j * 3) % len(SENTENCES)] for j in range(3 + i % 3)) + "\n"
        for i in range(40)
    ]


def script():
    """data/text/prepare.py as a module: its main(argv) runs in this process."""
    path = os.path.join(ROOT, "data", "text", "prepare.py")
    spec = importlib.util.spec_from_file_location("text_prepare", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


PREPARE = script()


def prepare(*args):
    PREPARE.main([str(a) for a in args])


def refusal(capsys, *args):
    """The one line that a bad input gets from prepare.py: its Error, or argparse's."""
    try:
        prepare(*args)
    except Error as e:
        return str(e)
    except SystemExit as e:
        assert e.code == 2
        line = capsys.readouterr().err.strip()
        assert "\n" not in line
        return line
    raise AssertionError(f"prepare.py {args} was not refused")


def split_documents(folder, name, tokenizer):
    """The texts of a split's documents, each cut at its <|endoftext|>."""
    ids = np.fromfile(os.path.join(folder, f"{name}.bin"), dtype=np.uint16)
    assert ids[-1] == tokenizer.eot_token  # every document ends with it
    ends = np.flatnonzero(ids == tokenizer.eot_token)
    return [tokenizer.decode(d[:-1].tolist()) for d in np.split(ids, ends + 1)[:-1]]


def data_tokenizer(folder):
    """The tokenizer prepare.py wrote, read from the data's folder: what the checkpoint and its
    export must carry."""
    return get_tokenizer(read_meta(folder)["tokenizer"], str(folder / "meta.json"))


def all_documents(folder):
    """The texts of every document in the data's folder, train's then val's."""
    tokenizer = data_tokenizer(folder)
    return [d for name in ("train", "val") for d in split_documents(folder, name, tokenizer)]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A folder of the documents, .md and .txt files, and a subfolder."""
    d = tmp_path_factory.mktemp("corpus")
    os.makedirs(d / "more")
    for i, text in enumerate(documents()):
        folder = d / "more" if i % 4 == 0 else d
        (folder / f"{i:02d}.{'md' if i % 2 else 'txt'}").write_text(text, encoding="utf-8")
    return d


@pytest.fixture(scope="module")
def prepared(corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("data")
    # run as a user runs it
    r = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "data", "text", "prepare.py"),
            "--source",
            corpus,
            "--vocab_size=300",
            "--val_fraction=0.25",
            "--block_size=16",
            "--out_dir",
            out,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    return out


def test_a_bpe_short_of_vocab_size_says_why_and_no_blank_lines(tmp_path, capfd):
    """Too little text for 4,096 tokens: the BPE stops early and the line says so; the trainer's
    progress (written to stdout when it is no terminal) leaves no blank lines."""
    (tmp_path / "short.txt").write_text("the cat sat on the mat. " * 50 + "a dog ran far away.\n")
    prepare("--source", tmp_path / "short.txt", "--block_size=8", "--out_dir", tmp_path / "data")
    out = capfd.readouterr().out
    assert "" not in out.splitlines(), out
    vocab = read_meta(tmp_path / "data")["vocab_size"]
    assert f"trained a BPE of {vocab:,} tokens, not --vocab_size 4,096: " in out
    assert "too little text for more merges" in out


def test_the_corpus_round_trips_through_its_own_bpe(prepared):
    meta = read_meta(prepared)
    tokenizer = data_tokenizer(prepared)
    assert meta["vocab_size"] == tokenizer.vocab_size == 300
    assert tokenizer.eot_token == 299
    found = []
    for name in ("train", "val"):
        docs = split_documents(prepared, name, tokenizer)
        # the counts meta.json keeps are the files'
        assert meta["documents"][name] == len(docs)
        assert meta["bytes"][name] == sum(len(d.encode("utf-8")) for d in docs)
        assert meta["splits"][name] == os.path.getsize(prepared / f"{name}.bin") // 2
        found += docs
    # each document once, whole, in the split its hash names
    assert sorted(found) == sorted(documents())
    # a trained BPE spends fewer tokens than bytes on this text (two bytes a Cyrillic letter)
    assert sum(meta["splits"].values()) < 0.7 * sum(meta["bytes"].values())


@pytest.fixture(scope="module")
def trained(prepared, tmp_path_factory):
    out = tmp_path_factory.mktemp("out")
    steps = ["--max_iters=4", "--eval_interval=2", f"--out_dir={out}", "--overwrite_out_dir=True"]
    train.main(TINY + [f"--dataset={prepared}"] + steps)
    return out


def test_bits_per_byte_is_the_loss_in_bits_over_the_splits_bytes(prepared, trained):
    meta = read_meta(prepared)
    records = [json.loads(line) for line in open(trained / "metrics.jsonl")]
    evaluations = [r for r in records if "val/loss" in r]
    assert len(evaluations) == 3
    for r in evaluations:
        for name in ("train", "val"):
            tokens_per_byte = meta["splits"][name] / meta["bytes"][name]
            expected = r[f"{name}/loss"] / math.log(2) * tokens_per_byte
            assert r[f"{name}/bpb"] == pytest.approx(expected, rel=1e-12)


def test_plot_draws_bits_per_byte_beside_the_loss(trained, tmp_path, monkeypatch):
    import plot

    drawn = []

    def keep(fig, path, dpi):
        drawn.append(fig)

    monkeypatch.setattr(plot, "save_figure", keep)
    plot.plot_runs([str(trained)], str(tmp_path / "loss.png"))
    loss, bpb = drawn[0].axes
    assert (loss.get_title(), bpb.get_title()) == ("loss", "validation bits per byte")
    records = [json.loads(line) for line in open(trained / "metrics.jsonl")]
    expected = [r["val/bpb"] for r in records if "val/loss" in r]
    assert list(bpb.lines[0].get_ydata()) == expected


def test_the_checkpoint_carries_its_tokenizer_and_sample_py_uses_it(trained, capsys):
    assert (trained / "tokenizer.tiktoken").is_file()
    options = ["--start=Внимание", "--max_new_tokens=8", "--num_samples=1", "--seed=1"]
    sample.main([f"--out_dir={trained}", *options])
    assert capsys.readouterr().out.startswith("Внимание")


def test_a_resume_on_data_prepared_again_with_another_tokenizer_is_refused(
    corpus, prepared, trained, tmp_path
):
    shutil.copytree(trained, tmp_path / "out")
    prepare(
        "--source", corpus, "--vocab_size", 280, "--block_size", 16, "--out_dir", tmp_path / "data"
    )
    resume = [f"--out_dir={tmp_path / 'out'}", "--init_from=resume", "--max_iters=6"]
    with pytest.raises(Error, match="not tokenized as the model in"):
        train.main(TINY + [f"--dataset={tmp_path / 'data'}"] + resume)


def test_a_tokenizer_file_that_is_not_the_named_one_is_refused(trained, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(trained, copy)
    with open(copy / "tokenizer.tiktoken", "a") as f:
        f.write("QUJD 300\n")
    with pytest.raises(Error, match="tokenizer.tiktoken: not the tokenizer that .* names"):
        load_gpt(str(copy), "cpu")
    os.remove(copy / "tokenizer.tiktoken")
    with pytest.raises(Error, match="cannot read the tokenizer that"):
        load_gpt(str(copy), "cpu")


def request(address, path, body):
    connection = http.client.HTTPConnection(address, timeout=60)
    connection.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    response = connection.getresponse()
    answer = json.loads(response.read())
    assert response.status == 200, answer
    return answer


def test_the_playground_tokenizes_with_the_trained_bpe(prepared, trained):
    playground = Playground([trained], "cpu", "float32", max_tokens=16)
    tokenizer = data_tokenizer(prepared)
    httpd = Server(playground, quiet=True, port=0)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    while not httpd.started:
        time.sleep(0.01)
    address = f"127.0.0.1:{httpd.port}"
    try:
        for text in PROBES:
            ids = request(address, "/tokenize", {"prompt": text})["tokens"]
            assert ids == tokenizer.encode(text)
            assert request(address, "/detokenize", {"tokens": ids})["prompt"] == text
        body = {"prompt": "Маска", "max_tokens": 4, "seed": 3}
        assert request(address, "/v1/completions", body)["choices"][0]["text"]
    finally:
        httpd.stop()
        thread.join()


def test_the_export_encodes_as_we_do_in_auto_tokenizer(prepared, trained, tmp_path):
    transformers = pytest.importorskip("transformers")
    export(str(trained), str(tmp_path / "hf"))
    hf = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    ours = data_tokenizer(prepared)
    # the export holds its tokenizer's file: this project reads it back, as sample.py does
    _, exported, _ = load_gpt(str(tmp_path / "hf"), "cpu", hub=True)
    for text in PROBES + documents()[:5]:
        ids = ours.encode(text)
        assert hf.encode(text) == ids == exported.encode(text), text
        assert hf.decode(ids) == text
    assert hf.eos_token_id == ours.eot_token == exported.eot_token == 299


@needs_shared
def test_a_bpe_trained_on_shakespeare_encodes_as_hugging_faces_does():
    transformers = pytest.importorskip("transformers")
    from lib.bpe import bpe_files, train_bpe

    with open(SHAKESPEARE, encoding="utf-8") as f:
        text = f.read()
    tokenizer = train_bpe(text.split("\n\n"), 2048)
    vocab, merges = bpe_files(tokenizer.enc)
    pairs = [tuple(line.split(" ")) for line in merges]
    hf = transformers.GPT2TokenizerFast(vocab=vocab, merges=pairs)
    # the whole play, and text unlike it
    assert hf.encode(text) == tokenizer.encode(text)
    for probe in PROBES:
        assert hf.encode(probe) == tokenizer.encode(probe)


def test_the_split_is_the_hash_of_each_document_whatever_the_tokenizer(corpus, prepared, tmp_path):
    prepare(
        "--source",
        corpus,
        "--tokenizer",
        "char",
        "--val_fraction",
        0.25,
        "--block_size",
        16,
        "--out_dir",
        tmp_path,
    )
    chars = data_tokenizer(tmp_path)
    bpe = data_tokenizer(prepared)
    assert chars.decode([chars.eot_token]) == "<|endoftext|>"
    for name in ("train", "val"):
        assert split_documents(tmp_path, name, chars) == split_documents(prepared, name, bpe)


def test_rows_of_jsonl_and_parquet_find_their_text_column(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    docs = documents()
    os.makedirs(tmp_path / "rows")
    # a byte-order mark first, as some editors write; a row with no text is an empty document,
    # whatever else it holds
    with open(tmp_path / "rows" / "a.jsonl", "w", encoding="utf-8-sig") as f:
        for i, text in enumerate(docs[:20]):
            f.write(json.dumps({"id": i, "body": text}, ensure_ascii=False) + "\n")
        f.write(json.dumps({"id": 20, "body": None, "title": "not the text"}) + "\n")
    # polars writes large strings
    body = pa.array(docs[20:], type=pa.large_string())
    table = pa.table({"id": list(range(20)), "body": body})
    pq.write_table(table, tmp_path / "rows" / "b.parquet")
    prepare(
        "--source",
        tmp_path / "rows",
        "--tokenizer",
        "char",
        "--val_fraction",
        0.25,
        "--block_size",
        16,
        "--out_dir",
        tmp_path / "out",
    )
    meta = read_meta(tmp_path / "out")
    assert sum(meta["documents"].values()) == 40
    found = all_documents(tmp_path / "out")
    assert sorted(found) == sorted(docs)


def test_a_dataset_is_read_streamed_through_datasets(tmp_path):
    """--dataset takes a hub name or a local folder of data files; the same reader, offline."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    docs = documents()
    os.makedirs(tmp_path / "hub")
    table = pa.table({"id": list(range(40)), "story": docs})
    pq.write_table(table, tmp_path / "hub" / "train.parquet")
    prepare(
        "--dataset",
        tmp_path / "hub",
        "--tokenizer",
        "char",
        "--block_size",
        16,
        "--out_dir",
        tmp_path / "out",
    )
    meta = read_meta(tmp_path / "out")
    assert meta["source"] == f"{tmp_path / 'hub'}:train"
    found = all_documents(tmp_path / "out")
    assert sorted(found) == sorted(docs)


def bad_inputs(d):
    """(arguments, words of the one line) for each bad input, its files made in d."""
    os.makedirs(d / "empty")
    (d / "empty" / "a.txt").write_text("\n\n  \n", encoding="utf-8")
    os.makedirs(d / "no_text")
    (d / "no_text" / "a.csv").write_text("text,label\nx,1\n", encoding="utf-8")
    (d / "rows.jsonl").write_text('{"body": "Маска"}\n', encoding="utf-8")
    (d / "short.txt").write_text("Ёжик в тумане.\n\nЛошадка!\n", encoding="utf-8")
    (d / "latin1.txt").write_bytes("Ünïcode in Latin-1".encode("latin-1"))
    return [
        (["--source", d / "empty"], "no document holds any text"),
        (["--source", d / "no_text"], "no .txt, .md, .jsonl or .parquet file"),
        (["--source", d / "rows.jsonl", "--column", "text"], "no column 'text'"),
        (["--source", d / "short.txt", "--vocab_size", 255], "must be >= 257"),
        (["--source", d / "short.txt", "--vocab_size", 2**32 + 1], "past the 4,294,967,296 ids"),
        (["--source", d / "short.txt", "--tokenizer", "char"], "not more than --block_size 128"),
        (["--source", d / "latin1.txt"], "not UTF-8 text (invalid"),
        (["--source", d / "nowhere"], "not a folder, nor a .txt"),
    ]


def test_each_bad_input_is_one_line_and_nothing_is_written(tmp_path, capsys):
    out = tmp_path / "out"
    os.makedirs(out)
    (out / "meta.json").write_text("{}")  # what an earlier run left: it must stay
    for args, words in bad_inputs(tmp_path):
        line = refusal(capsys, *args, "--out_dir", out)
        assert words in line and "\n" not in line, line
        assert sorted(os.listdir(out)) == ["meta.json"] and (out / "meta.json").read_text() == "{}"


def write_records(folder, records):
    os.makedirs(folder, exist_ok=True)
    with open(folder / "metrics.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)


def test_plot_draws_a_run_whose_records_lack_the_training_loss(tmp_path):
    import plot

    # an evaluation without a training loss beside it (a run that evaluates before its first step)
    records = [
        {"step": 0, "seconds": 0.5, "val/loss": 3.0},
        {"step": 10, "seconds": 2.0, "val/loss": 2.5, "train/loss": 2.4},
    ]
    write_records(tmp_path / "run", records)
    plot.main([str(tmp_path / "run"), f"--out={tmp_path / 'loss.png'}"])
    assert (tmp_path / "loss.png").stat().st_size > 0


def test_plot_without_out_names_its_image_after_the_runs_and_x(tmp_path, monkeypatch):
    """A second plot of other runs, or against seconds, is another file, never the first one
    replaced."""
    import plot

    records = [{"step": 0, "seconds": 0.5, "val/loss": 3.0}]
    write_records(tmp_path / "out-a", records)
    write_records(tmp_path / "out-b", records)
    monkeypatch.chdir(tmp_path)
    plot.main(["out-a"])
    first = (tmp_path / "loss-out-a.png").read_bytes()
    plot.main(["out-a", str(tmp_path / "out-b")])
    plot.main(["out-a", "out-b/", "--x=seconds"])
    images = sorted(p.name for p in tmp_path.glob("*.png"))
    assert images == ["loss-out-a+out-b-seconds.png", "loss-out-a+out-b.png", "loss-out-a.png"]
    assert (tmp_path / "loss-out-a.png").read_bytes() == first


def test_each_panel_legend_lists_the_runs_drawn_in_it(tmp_path, monkeypatch):
    """A language model beside a classifier: the loss panel holds both, the accuracy panel the
    classifier alone, the bits-per-byte panel the language model alone."""
    import plot

    lm = {"step": 0, "val/loss": 3.0, "train/loss": 3.1, "val/bpb": 2.0}
    write_records(tmp_path / "lm", [lm])  # the classifier's records lack a training loss
    write_records(tmp_path / "clf", [{"step": 0, "val/loss": 1.0, "val/accuracy": 0.9}])
    drawn = []

    def keep(fig, path, dpi):
        drawn.append(fig)

    monkeypatch.setattr(plot, "save_figure", keep)
    plot.plot_runs([str(tmp_path / "lm"), str(tmp_path / "clf")], str(tmp_path / "x.png"))
    legends = {
        ax.get_title(): [t.get_text() for t in ax.get_legend().get_texts()] for ax in drawn[0].axes
    }
    assert legends == {
        "loss": ["lm val", "lm train", "clf val"],
        "validation accuracy": ["clf"],
        "validation bits per byte": ["lm"],
    }


def test_plot_against_seconds_refuses_records_without_them_in_one_line(tmp_path):
    import plot

    write_records(tmp_path / "run", [{"step": 0, "val/loss": 3.0, "train/loss": 3.1}])
    with pytest.raises(Error, match=r"no evaluation that records 'seconds'.*--x step"):
        plot.main([str(tmp_path / "run"), "--x=seconds", f"--out={tmp_path / 'loss.png'}"])
    assert not (tmp_path / "loss.png").exists()


def test_a_jsonl_text_column_is_chosen_by_its_key_and_a_null_is_an_empty_document(tmp_path):
    docs = documents()
    os.makedirs(tmp_path / "rows")
    # "text" first null: the column is still "text", not the one string that row holds
    with open(tmp_path / "rows" / "a.jsonl", "w", encoding="utf-8") as f:
        f.write(json.dumps({"id": "row-0", "text": None}) + "\n")
        for i, text in enumerate(docs[:20]):
            f.write(json.dumps({"id": f"row-{i + 1}", "text": text}, ensure_ascii=False) + "\n")
    # "text" the only key, null in the first row: no string to find it by
    with open(tmp_path / "rows" / "b.jsonl", "w", encoding="utf-8") as f:
        f.write(json.dumps({"text": None}) + "\n")
        for text in docs[20:]:
            f.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")
    out = tmp_path / "out"
    prepare(
        "--source", tmp_path / "rows", "--tokenizer", "char", "--block_size", 16, "--out_dir", out
    )
    assert sorted(all_documents(out)) == sorted(docs)
    # without "text", a row's null may be the text: which column is asked, not guessed
    (tmp_path / "c.jsonl").write_text(
        '{"id": "row-0", "body": null}\n{"id": "row-1", "body": "x"}\n'
    )
    with pytest.raises(Error, match=r"which column holds the text\? \(found \['body', 'id'\]\)"):
        prepare("--source", tmp_path / "c.jsonl", "--out_dir", out)


def test_a_parquet_text_column_stored_as_dictionary_or_string_view_is_read(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    docs = documents()
    os.makedirs(tmp_path / "rows")
    # pandas' categories and polars' strings
    text = pa.array(docs[:20]).dictionary_encode()
    pq.write_table(pa.table({"id": list(range(20)), "text": text}), tmp_path / "rows" / "a.parquet")
    body = pa.array(docs[20:], type=pa.string_view())
    pq.write_table(pa.table({"id": list(range(20)), "body": body}), tmp_path / "rows" / "b.parquet")
    out = tmp_path / "out"
    prepare(
        "--source", tmp_path / "rows", "--tokenizer", "char", "--block_size", 16, "--out_dir", out
    )
    assert sorted(all_documents(out)) == sorted(docs)


def prepare_in_child(python_args, args):
    """data/text/prepare.py with args in a child process (after python_args, such as -c CODE)."""
    script = os.path.join(ROOT, "data", "text", "prepare.py")
    command = [sys.executable, *python_args, script, *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def test_what_is_not_a_regular_file_is_skipped_with_a_warning(corpus, tmp_path):
    """A named pipe among the documents: reading it would wait for a writer for ever."""
    folder = tmp_path / "corpus"
    shutil.copytree(corpus, folder)
    os.mkfifo(folder / "pipe.txt")
    os.symlink(tmp_path / "nowhere.md", folder / "z_dangling.md")
    args = [f"--source={folder}", "--tokenizer=char", "--block_size=16"]
    r = prepare_in_child([], args + [f"--out_dir={tmp_path / 'out'}"])
    assert r.returncode == 0, r.stderr
    assert f"{folder / 'pipe.txt'}: not a regular file (a named pipe), skipped" in r.stderr
    assert (
        f"{folder / 'z_dangling.md'}: not a regular file (a link to nothing), skipped" in r.stderr
    )
    assert sorted(all_documents(tmp_path / "out")) == sorted(documents())


def test_a_prepare_into_a_folder_another_prepare_holds_is_refused(corpus, tmp_path):
    import fcntl

    out = tmp_path / "out"
    os.makedirs(out)
    (out / "meta.json").write_text("{}")
    # what another prepare.py holds while it writes there
    folder = os.open(out, os.O_RDONLY)
    fcntl.flock(folder, fcntl.LOCK_EX)
    try:
        with pytest.raises(Error, match="another prepare.py is writing into it"):
            prepare("--source", corpus, "--tokenizer", "char", "--block_size", 16, "--out_dir", out)
    finally:
        os.close(folder)
    assert os.listdir(out) == ["meta.json"] and (out / "meta.json").read_text() == "{}"
    # let go, the folder is free again
    prepare("--source", corpus, "--tokenizer", "char", "--block_size", 16, "--out_dir", out)
    assert sorted(all_documents(out)) == sorted(documents())


# what the child measures: its peak memory before and after prepare.py's main
PEAK = """
import importlib.util, resource, sys
spec = importlib.util.spec_from_file_location("text_prepare", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
import pyarrow, tokenizers  # what main imports, imported before the measure starts
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
module.main(sys.argv[2:])
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024)
"""


def test_a_large_document_is_encoded_in_bounded_memory(corpus, tmp_path):
    """One document of 5 MB among small ones, through the default trained BPE (trained on it too):
    the peak grows by a few times the text (read whole), not by the tens of times that a whole
    document takes in the BPE's trainer and as Python ints of its ids, copied."""
    from lib.prepare import in_val

    folder = tmp_path / "corpus"
    shutil.copytree(corpus, folder)
    words = "the quick brown fox jumps over a lazy dog while seven wizards hex bold zebras".split()
    lines = []
    for i in range(60_001):
        line = " ".join(f"{words[(i * 7 + j * 3) % len(words)]}{(i * j) % 97}" for j in range(12))
        lines.append(line + ".\n")
    big = "".join(lines)
    assert not in_val(big, 0.25)  # a train document, which the BPE learns from
    (folder / "big.txt").write_text(big, encoding="utf-8")
    args = [f"--source={folder}", "--vocab_size=512", "--val_fraction=0.25", "--block_size=16"]
    r = prepare_in_child(["-c", PEAK], args + [f"--out_dir={tmp_path / 'out'}"])
    assert r.returncode == 0, r.stderr
    growth = int(r.stdout.splitlines()[-1])
    assert growth < 8 * len(big) + 32 * 2**20, (
        f"{growth / 2**20:.0f} MB for {len(big) / 2**20:.1f} MB"
    )
    assert big in all_documents(tmp_path / "out")


@needs_shared
def test_a_long_document_in_pieces_encodes_as_it_does_whole():
    """The cuts between pieces fall where GPT-2's words part, whatever spaces surround them."""
    import random

    from lib.bpe import BPETokenizer

    tokenizer = BPETokenizer("r50k_base")
    words = ["word", "Ёжик", "'s", "'ll", "123", "!!", " ", "  ", "\n", "\n\n", "\t", "\r\n"]
    words += ["\u00a0", "\u3000", " \n", "😀", "—", "\u2028", "\x1c"]
    rng = random.Random(0)
    text = "".join(rng.choice(words) for _ in range(200_000))
    pieces = list(PREPARE.pieces(text, 0, len(text)))
    assert len(pieces) > 4 and "".join(pieces) == text
    assert [i for p in pieces for i in tokenizer.encode(p)] == tokenizer.encode(text)


def notes():
    """Three long notes of 4 to 41 KB, each of whose hash puts it in train."""
    return [
        "".join(f"{i + 1}. {SENTENCES[(i * k) % len(SENTENCES)]}\n" for i in range(lines))
        for k, lines in ((1, 50), (3, 200), (5, 500))
    ]


@pytest.mark.parametrize("tokenizer", ["char", "bpe"])
def test_a_few_long_documents_give_val_each_ones_tail(tmp_path, tokenizer):
    from lib.prepare import in_val

    os.makedirs(tmp_path / "notes")
    texts = notes()
    assert not any(in_val(t, 0.1) for t in texts)  # the hash alone would leave val empty
    for i, text in enumerate(texts):
        (tmp_path / "notes" / f"{i}.md").write_text(text, encoding="utf-8")
    out = tmp_path / "out"
    prepare(
        "--source",
        tmp_path / "notes",
        "--tokenizer",
        tokenizer,
        "--vocab_size",
        300,
        "--out_dir",
        out,
    )
    meta = read_meta(out)
    assert meta["documents"] == {"train": 3, "val": 3} and meta["split_by"] == "tail"
    tokenizer = data_tokenizer(out)
    heads = split_documents(out, "train", tokenizer)
    tails = split_documents(out, "val", tokenizer)
    for text, head, tail in zip(texts, heads, tails):
        # cut at the start of a line, about a tenth from its end
        assert head + tail == text and head.endswith("\n")
        assert len(text) * 0.1 <= len(tail) <= len(text) * 0.1 + 100  # lines under 100 characters
    # one document alone is split the same way (a lone file's paragraph ends with no line break)
    prepare("--source", tmp_path / "notes" / "2.md", "--tokenizer", "char", "--out_dir", out)
    head, tail = all_documents(out)
    assert head + tail == texts[2].removesuffix("\n") and head.endswith("\n")
