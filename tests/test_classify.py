"""classify.py end to end: a tiny char-level EncoderClassifier trained here for a moment on a toy
task (which of a, b, c a text holds most of), run as a user runs it (subprocesses, started together)
and checked against the model itself, one text at a time and unpadded. Variants of the same code
paths (--file, other formats, errors) run in-process."""

import csv
import io
import json
import os
import random
import re
import subprocess
import sys

import pytest
import torch
from conftest import ROOT, needs_shared

import classify
from lib.checkpoint import save_pretrained
from lib.common import run_script
from lib.weights import from_checkpoint
from model import GPT, EncoderClassifier, EncoderConfig, GPTConfig

CHARS = "abcd "
NAMES = ["alpha", "beta", "gamma"]
# 24 < block_size 32: longer texts are cut to 24 tokens, as prepare.py cut them for training
MAX_LENGTH = 24
# a real character: classify.py must mask by length, never by "idx != pad_token_id"
PAD = CHARS.index(" ")


def toy_rows(n, seed):
    """(text, label): mostly the label's letter, with noise; short texts are often ambiguous, so
    accuracy < 1."""
    rng, rows = random.Random(seed), []
    for _ in range(n):
        label, length = rng.randrange(3), rng.choice([rng.randint(1, 6), rng.randint(7, 40)])
        text = "".join(
            "abc"[label] if rng.random() < 0.4 else rng.choice(CHARS) for _ in range(length)
        )
        rows.append((text.strip() or "d", label))
    return rows


def direct_probs(model, ids_list):
    """Each text alone, unpadded: what classify.py's sorted, padded batches must reproduce."""
    with torch.no_grad():
        return [
            torch.softmax(
                model(torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.long))[0][0], -1
            )
            for ids in ids_list
        ]


def char_ids(text):
    return [CHARS.index(c) for c in text][:MAX_LENGTH]


def launch(*args, cwd, stdin=None):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # several at once: one thread each
    p = subprocess.Popen(
        [sys.executable, os.path.join(ROOT, "classify.py"), *args],
        cwd=cwd,
        env=env,
        text=True,
        encoding="utf-8",
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    return p, stdin or ""


def finish(started):
    p, stdin = started
    out, err = p.communicate(stdin, timeout=120)
    return p.returncode, out, err


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("clf")
    torch.manual_seed(0)
    model = EncoderClassifier(
        EncoderConfig(
            vocab_size=len(CHARS),
            block_size=32,
            n_layer=2,
            n_head=2,
            n_embd=16,
            bias=True,
            n_classes=3,
            pad_token_id=PAD,
        )
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    train = toy_rows(512, seed=1)
    for step in range(60):
        batch = train[step % 16 * 32 : (step % 16 + 1) * 32]
        ids = [char_ids(t) for t, _ in batch]
        width = max(map(len, ids))
        idx = torch.tensor([r + [PAD] * (width - len(r)) for r in ids])
        mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in ids])
        _, loss = model(idx, mask, torch.tensor([y for _, y in batch]))
        opt.zero_grad()
        loss.backward()
        opt.step()
    save_pretrained(
        model,
        out_dir,
        task="classify",
        tokenizer={"type": "char", "chars": CHARS},
        label_names=NAMES,
        max_length=MAX_LENGTH,
    )
    return str(out_dir)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("data")
    rows = toy_rows(80, seed=2)
    with open(d / "val.csv", "w", newline="") as f:
        csv.writer(f).writerows([("text", "label"), *rows])
    with open(d / "val.jsonl", "w") as f:  # the same rows with class names for labels
        f.writelines(json.dumps({"text": t, "label": NAMES[y]}) + "\n" for t, y in rows)
    # not in length order
    texts = ["dd", "b", "aaaa", "ccccc cccccccc ccccccccc cccccccccc ccc", "abcd abcd"]
    # a blank line
    (d / "texts.txt").write_text("\n".join(texts[:2]) + "\n\n" + "\n".join(texts[2:]) + "\n")
    return d, rows, texts


@pytest.fixture(scope="module")
def runs(ckpt, data):
    """Every classify.py subprocess of these tests, started at once (each spends a second or two
    importing torch)."""
    d, rows, texts = data
    started = {
        "eval": launch(
            "--out_dir", ckpt, "--eval", "val.csv", "--plot", "cm.png", "--batch_size", "7", cwd=d
        ),
        "args": launch("--out_dir", ckpt, *texts, "--batch_size", "2", cwd=d),
        "stdin": launch(
            "--out_dir", ckpt, "--json", "--batch_size", "3", cwd=d, stdin="\n".join(texts) + "\n"
        ),
        "attn": launch("--out_dir", ckpt, "--attention_maps", "attn.png", "abca cab", cwd=d),
        "missing": launch("--out_dir", str(d / "nothing"), "abc", cwd=d),
    }
    return {name: finish(s) for name, s in started.items()}


def eval_numbers(model, rows):
    """accuracy, per class (precision, recall, f1, support) and the confusion matrix, computed
    here."""
    preds = [int(p.argmax()) for p in direct_probs(model, [char_ids(t) for t, _ in rows])]
    cm = [
        [sum(1 for (_, y), p in zip(rows, preds) if (y, p) == (i, j)) for j in range(3)]
        for i in range(3)
    ]
    per_class = []
    for i in range(3):
        p = cm[i][i] / max(1, sum(r[i] for r in cm))
        r = cm[i][i] / max(1, sum(cm[i]))
        per_class.append((p, r, 2 * p * r / (p + r) if p + r else 0.0, sum(cm[i])))
    return sum(cm[i][i] for i in range(3)) / len(rows), per_class, cm


def test_calibration_error_by_hand():
    """15 bins of width 1/15 over the top probability: 0.9 and 0.9 (one right: accuracy 0.5) share
    (13/15, 14/15], 0.7 (right) is alone in (10/15, 11/15], 0.55 (right) in (8/15, 9/15]."""
    probs = torch.tensor([[0.9, 0.1], [0.1, 0.9], [0.3, 0.7], [0.55, 0.45]])
    labels = torch.tensor([0, 0, 1, 0])
    by_hand = 2 / 4 * (0.9 - 0.5) + 1 / 4 * (1 - 0.7) + 1 / 4 * (1 - 0.55)
    assert classify.calibration_error(probs, labels) == pytest.approx(by_hand, abs=1e-6)
    # one bin: the mean top probability against the accuracy
    mean_top = (0.9 + 0.9 + 0.7 + 0.55) / 4
    assert classify.calibration_error(probs, labels, bins=1) == pytest.approx(mean_top - 0.75)


@pytest.mark.slow
def test_eval_matches_the_model(ckpt, data, runs):
    d, rows, _ = data
    rc, out, err = runs["eval"]
    assert rc == 0, err
    lines = out.splitlines()
    accuracy, per_class, cm = eval_numbers(from_checkpoint(ckpt)[0], rows)
    # learned something, and still makes mistakes for the matrix to show
    assert 0.5 < accuracy < 1.0
    assert lines[0].startswith("accuracy: ") and float(lines[0].split()[1]) == pytest.approx(
        accuracy, abs=5e-5
    )
    table = {line.split()[0]: line.split()[1:] for line in lines[2:6]}
    for name, (p, r, f1, support) in zip(NAMES, per_class):
        assert [float(v) for v in table[name][:3]] == pytest.approx([p, r, f1], abs=5e-5) and int(
            table[name][3]
        ) == support
    macro = next(line for line in lines if line.startswith("macro avg")).split()[2:]
    assert [float(v) for v in macro[:3]] == pytest.approx(
        [sum(c[j] for c in per_class) / 3 for j in range(3)], abs=5e-5
    )
    start = lines.index("confusion matrix (rows = true, columns = predicted):")
    assert lines[start + 1].split() == NAMES
    matrix = [[int(v) for v in line.split()[1:]] for line in lines[start + 2 : start + 5]]
    assert [line.split()[0] for line in lines[start + 2 : start + 5]] == NAMES
    assert matrix == cm and sum(map(sum, matrix)) == len(rows)
    assert (d / "cm.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    probs = direct_probs(from_checkpoint(ckpt)[0], [char_ids(t) for t, _ in rows])
    ece = classify.calibration_error(torch.stack(probs), torch.tensor([y for _, y in rows]))
    assert lines[-1] == f"expected calibration error (15 bins): {ece:.4f}"


@pytest.mark.slow
def test_eval_reads_jsonl_and_parquet_with_class_names(ckpt, data, runs, capsys):
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    d, rows, _ = data
    pq.write_table(
        pa.table({"text": [t for t, _ in rows], "label": [y for _, y in rows]}), d / "val.parquet"
    )
    first = runs["eval"][1].splitlines()[0]
    for name in ("val.jsonl", "val.parquet"):
        classify.main(["--out_dir", ckpt, "--eval", str(d / name)])
        assert capsys.readouterr().out.splitlines()[0] == first


def parse_line(line):
    label, probs, text = re.fullmatch(r"(\S+) +\((.*)\)  (.*)", line).groups()
    return label, [float(p.split()[1]) for p in probs.split(", ")], text


@pytest.mark.slow
@pytest.mark.parametrize("run", ["args", "file"])
def test_predict_texts_and_file(ckpt, data, runs, run, capsys):
    d, _, texts = data
    # in-process: the same code as a subprocess, without a second's import of torch
    if run == "file":
        classify.main(["--out_dir", ckpt, "--file", str(d / "texts.txt")])
        rc, out, err = 0, capsys.readouterr().out, ""
    else:
        rc, out, err = runs[run]
    assert rc == 0, err
    expected = direct_probs(from_checkpoint(ckpt)[0], [char_ids(t) for t in texts])
    lines = out.splitlines()
    assert len(lines) == len(texts)  # the blank line of the file is skipped
    for line, text, probs in zip(lines, texts, expected):
        label, shown, shown_text = parse_line(line)
        # input order, despite length-sorting
        assert shown_text == text and label == NAMES[int(probs.argmax())]
        assert shown == pytest.approx(probs.tolist(), abs=0.006)


@pytest.mark.slow
def test_predict_stdin_json(ckpt, data, runs):
    _, _, texts = data
    rc, out, err = runs["stdin"]
    assert rc == 0, err
    expected = direct_probs(from_checkpoint(ckpt)[0], [char_ids(t) for t in texts])
    objects = [json.loads(line) for line in out.splitlines()]
    assert [o["text"] for o in objects] == texts
    for o, probs in zip(objects, expected):
        assert list(o["probs"]) == NAMES and sum(o["probs"].values()) == pytest.approx(
            1.0, abs=1e-5
        )
        assert o["label"] == max(o["probs"], key=o["probs"].get) == NAMES[o["label_id"]]
        assert list(o["probs"].values()) == pytest.approx(probs.tolist(), abs=1e-5)


@pytest.mark.slow
def test_attention_maps(ckpt, data, runs):
    d, _, _ = data
    rc, out, err = runs["attn"]
    assert rc == 0, err
    assert (d / "attn.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "4 panels, 2 layers x 2 heads, 8 tokens" in err
    # the plotting function itself: one panel per (layer, head), titled, tokens on both axes
    model = from_checkpoint(ckpt)[0]
    idx = torch.tensor([char_ids("abca cab")])
    with torch.no_grad():
        _, _, maps = model(idx, torch.ones_like(idx), need_weights=True)
    fig = classify.attention_figure([m[0].numpy() for m in maps], list("abca cab"), "predicted: x")
    panels = [ax for ax in fig.axes if ax.get_title()]
    assert sorted(ax.get_title() for ax in panels) == [
        f"layer {layer} head {h}" for layer in range(2) for h in range(2)
    ]
    assert [t.get_text() for t in panels[0].get_xticklabels()] == list("abca cab")
    assert [t.get_text() for t in panels[0].get_yticklabels()] == list("abca cab")
    assert (panels[0].get_xlabel(), panels[0].get_ylabel()) == ("key", "query")
    # one colour scale for every panel, 0 to the largest weight, and its colour bar
    top = max(float(m.max()) for m in maps)
    assert all(ax.images[0].get_clim() == (0, pytest.approx(top)) for ax in panels)
    assert any(ax.get_ylabel() == "attention weight" for ax in fig.axes if ax not in panels)


def one_line_error(rc, err, *words):
    assert (
        rc != 0 and len(err.strip().splitlines()) == 1 and err.startswith("classify.py: error:")
    ), err
    assert all(w in err for w in words), err


@pytest.mark.slow
def test_error_from_the_command_line(runs):
    one_line_error(*runs["missing"][::2], "no checkpoint", "python train.py config/agnews.py")


def in_process_error(argv, capsys):
    with pytest.raises(SystemExit) as e:
        # what `python classify.py ARGV` runs
        run_script(lambda: classify.main(argv), "classify.py")
    message = capsys.readouterr().err
    assert (
        e.value.code == 2 and message.startswith("classify.py: error:") and message.count("\n") == 1
    ), message
    return message


def test_errors(ckpt, tmp_path, capsys, monkeypatch):
    save_pretrained(
        GPT(GPTConfig(vocab_size=5, block_size=8, n_layer=1, n_head=1, n_embd=8, bias=True)),
        tmp_path / "gpt",
        task="lm",
        tokenizer={"type": "char", "chars": CHARS},
    )
    assert "sample.py" in in_process_error(["--out_dir", str(tmp_path / "gpt"), "abc"], capsys)
    (tmp_path / "cols.csv").write_text("sentence,category\nabc,1\n")
    assert "text,label" in in_process_error(
        ["--out_dir", ckpt, "--eval", str(tmp_path / "cols.csv")], capsys
    )
    (tmp_path / "cols.jsonl").write_text('{"text": "abc"}\n')
    assert "text,label" in in_process_error(
        ["--out_dir", ckpt, "--eval", str(tmp_path / "cols.jsonl")], capsys
    )
    (tmp_path / "labels.csv").write_text("text,label\nabc,0\nbca,3\ncab,delta\n")
    # scores the one usable row
    classify.main(["--out_dir", ckpt, "--eval", str(tmp_path / "labels.csv")])
    out, err = capsys.readouterr()
    assert "(0 of 1)" in out or "(1 of 1)" in out
    assert "skipped 2 of 3 rows (0 with no text, 2 with a label that is not a class id 0..2" in err
    (tmp_path / "empty.csv").write_text("text,label\n")
    assert "no usable row" in in_process_error(
        ["--out_dir", ckpt, "--eval", str(tmp_path / "empty.csv")], capsys
    )
    assert "not in this model's vocabulary" in in_process_error(["--out_dir", ckpt, "xyz"], capsys)
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    assert "no text to classify" in in_process_error(["--out_dir", ckpt], capsys)
    monkeypatch.setattr("sys.stdin", None)  # closed: `<&-`
    assert "no text to classify" in in_process_error(["--out_dir", ckpt], capsys)
    assert "--plot" in in_process_error(["--out_dir", ckpt, "--plot", "x.png", "abc"], capsys)


def test_help_documents_every_flag(capsys):
    with pytest.raises(SystemExit) as e:
        classify.main(["--help"])
    help_text = capsys.readouterr().out
    assert e.value.code == 0 and "python classify.py" in help_text
    for flag in (
        "--out_dir",
        "--device",
        "--batch_size",
        "--file",
        "--json",
        "--eval",
        "--plot",
        "--attention_maps",
    ):
        # followed by its help
        assert re.search(rf"^  {flag}( [A-Z_]+)?\s+[^-\s]", help_text, re.M), flag


@needs_shared
def test_bpe_checkpoint_truncates_to_block_size(tmp_path, capsys):
    """GPT-2's BPE through tiktoken; max_length 64 > block_size 32, so texts are cut to 32
    tokens."""
    from lib.bpe import BPETokenizer

    tok = BPETokenizer("r50k_base")
    torch.manual_seed(0)
    model = EncoderClassifier(
        EncoderConfig(
            vocab_size=tok.vocab_size,
            block_size=32,
            n_layer=1,
            n_head=2,
            n_embd=16,
            bias=True,
            n_classes=4,
            pad_token_id=tok.start_token,
        )
    )
    save_pretrained(
        model,
        tmp_path,
        task="classify",
        tokenizer=tok.spec,
        label_names=["W", "S", "B", "T"],
        max_length=64,
    )
    texts = [
        "Stocks fall as oil hits a record $55 a barrel",
        " ".join(["the market rallied again today"] * 12),
    ]
    classify.main(["--out_dir", str(tmp_path), "--json", *texts])
    assert len(tok.encode(texts[1])) > 32
    expected = direct_probs(from_checkpoint(str(tmp_path))[0], [tok.encode(t)[:32] for t in texts])
    for line, probs in zip(capsys.readouterr().out.splitlines(), expected):
        assert list(json.loads(line)["probs"].values()) == pytest.approx(probs.tolist(), abs=1e-5)
