"""Bad input and faults, as a new user or an adversary meets them: every command-line tool over a
table of bad inputs (one clear last line, a non-zero exit, never a traceback), and the faults that
must never cost a saved run: a second run into the same out_dir, a scratch run over a checkpoint,
damaged data, resume of a resumed run, Ctrl-C."""

import base64
import glob
import hashlib
import io
import json
import os
import random
import re
import runpy
import signal
import subprocess
import sys
import time
import traceback
from contextlib import contextmanager, nullcontext, redirect_stderr, redirect_stdout
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import ROOT, TINY

import train
from export import export
from lib import checkpoint, common, settings
from lib.checkpoint import save_pretrained
from lib.common import Error
from lib.corpus import jsonl_rows
from lib.prepare import read_records, save_array, write_classification_split, write_meta
from lib.records import read_metrics
from lib.weights import load_pretrained
from model import GPT, EncoderClassifier, EncoderConfig, GPTConfig

CHARS = "abcdefghij"

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors: one thread


def cli(script, *args, stdin=""):
    """Runs a script as `python script ARGS` would, but in this process (the suite would spend a
    second per run importing torch): -> (exit status, stdout, stderr); an uncaught exception's
    traceback lands in stderr. stdin: text or bytes, read as strict UTF-8 over its bytes as a
    terminal's is; None: closed (`<&-`)."""
    out, err = io.StringIO(), io.StringIO()
    argv, handlers, sys_stdin = (
        sys.argv,
        {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)},
        sys.stdin,
    )
    if isinstance(stdin, str):
        stdin = stdin.encode()
    if stdin is not None:
        stdin = io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8")
    sys.argv, sys.stdin, code = [os.path.join(ROOT, script), *map(str, args)], stdin, 0
    try:
        with redirect_stdout(out), redirect_stderr(err):
            runpy.run_path(os.path.join(ROOT, script), run_name="__main__")
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
        if isinstance(e.code, str):
            err.write(e.code + "\n")
    except BaseException:
        code = 1
        err.write(traceback.format_exc())
    finally:
        sys.argv, sys.stdin = argv, sys_stdin
        for s, h in handlers.items():
            signal.signal(s, h)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Everything the table below points at: tiny prepared data (good and damaged), checkpoints, bad
    files."""
    d = tmp_path_factory.mktemp("bad")
    rng = np.random.default_rng(0)
    for name, damage in (
        ("lm", lambda a: a),
        ("short", lambda a: a[:1000]),
        ("big_ids", lambda a: a + 20),
    ):
        (d / name).mkdir()
        for split, n in (("train", 3000), ("val", 300)):
            save_array(
                str(d / name / f"{split}.bin"), damage(rng.integers(0, 10, n).astype(np.uint16))
            )
        write_meta(
            str(d / name),
            task="lm",
            tokenizer={"type": "char", "chars": CHARS},
            vocab_size=10,
            dtype="uint16",
            splits={"train": 3000, "val": 300},
        )
    cls = d / "cls"
    for split, n in (("train", 50), ("val", 20)):
        write_classification_split(str(cls), split, [[1, 2, 3]] * n, [0, 1] * (n // 2), np.uint16)
    write_meta(
        str(cls),
        task="classify",
        tokenizer={"type": "char", "chars": CHARS},
        vocab_size=10,
        dtype="uint16",
        label_names=["a", "b"],
        max_length=16,
        pad_token_id=0,
        splits={"train": 50, "val": 20},
    )
    cls_cut = d / "cls_cut"  # labels cut to 10 rows against 50 offsets
    for split, n in (("train", 50), ("val", 20)):
        write_classification_split(
            str(cls_cut), split, [[1, 2, 3]] * n, [0, 1] * (n // 2), np.uint16
        )
    np.save(cls_cut / "train.labels.npy", np.zeros(10, dtype=np.int64))
    write_meta(
        str(cls_cut),
        task="classify",
        tokenizer={"type": "char", "chars": CHARS},
        vocab_size=10,
        dtype="uint16",
        label_names=["a", "b"],
        max_length=16,
        pad_token_id=0,
        splits={"train": 50, "val": 20},
    )
    for name, damage in (
        ("no_dtype", lambda meta: meta.pop("dtype")),
        ("float_ids", lambda meta: meta.update(dtype="float64")),
    ):
        (d / name).mkdir()
        for split in ("train", "val"):
            (d / name / f"{split}.bin").write_bytes((d / "lm" / f"{split}.bin").read_bytes())
        meta = json.loads((d / "lm" / "meta.json").read_text())
        damage(meta)
        (d / name / "meta.json").write_text(json.dumps(meta))
    torch.manual_seed(0)
    char = {"type": "char", "chars": CHARS}
    shape = dict(vocab_size=10, block_size=16, n_layer=1, n_head=2, n_embd=16, bias=True)
    save_pretrained(GPT(GPTConfig(**shape)), d / "gpt", task="lm", tokenizer=char)
    save_pretrained(GPT(GPTConfig(**shape, rope=True)), d / "rope", task="lm", tokenizer=char)
    save_pretrained(
        EncoderClassifier(EncoderConfig(**shape, n_classes=2)),
        d / "clf",
        task="classify",
        tokenizer=char,
        label_names=["a", "b"],
        max_length=16,
    )
    # config.json without one
    for name, source in (("clf_no_tokenizer", "clf"), ("gpt_no_tokenizer", "gpt")):
        (d / name).mkdir()
        config = json.loads((d / source / "config.json").read_text())
        del config["tokenizer"]
        (d / name / "config.json").write_text(json.dumps(config))
        (d / name / "model.safetensors").write_bytes(
            (d / source / "model.safetensors").read_bytes()
        )
    export(str(d / "gpt"), str(d / "gpt_hf"))  # GPT-2's layout, as Hugging Face's
    (d / "broken").mkdir()
    (d / "broken" / "config.json").write_text((d / "gpt" / "config.json").read_text())
    (d / "broken" / "model.safetensors").write_bytes(b"half a file")
    (d / "state").mkdir()
    (d / "state" / "trainer_state.pt").write_bytes(b"half a state")
    (d / "a_file").write_text("not a folder")
    (d / "latin1.txt").write_bytes("caf\xe9 cr\xe8me\n".encode("latin-1"))
    (d / "empty.txt").write_text("")
    (d / "syntax.py").write_text("n_layer = 2\nn_head = (\n")
    (d / "raises.py").write_text("n_layer = 2\nn_embd = undefined_name\n")
    (d / "latin1.py").write_bytes(b"n_layer = 2\n# caf\xe9\n")
    (d / "cols.csv").write_text("sentence,category\nabc,1\n")
    (d / "empty.csv").write_text("text,label\n")
    (d / "labels.txt").write_text("text,label\nabc,0\n")
    for name, content in (
        ("no_train", {"val.csv": "text,label\nx,0\n"}),
        ("no_columns", {"train.csv": "sentence,category\nx,0\n"}),
        ("latin1_csv", {"train.csv": "text,label\ncaf\xe9,0\n".encode("latin-1")}),
        ("no_rows", {"train.csv": "text,label\n,0\nx,9\n"}),
        (
            "two_formats",
            {"train.csv": "text,label\nx,0\n", "train.jsonl": '{"text": "x", "label": 0}\n'},
        ),
    ):
        (d / name).mkdir()
        for fname, data in content.items():
            (d / name / fname).write_bytes(data if isinstance(data, bytes) else data.encode())
    return d


# (script, arguments ({d} is the files folder), words the last line must hold)
BAD_INPUTS = [
    ("train.py", ["--n_layers=4"], "unknown key 'n_layers'"),
    ("rl.py", ["--group_size=1"], "group_size=1: must be >= 2"),
    ("rl.py", ["--init_from=out-chat"], "name --prompts=FILE.jsonl and --reward=PATH.py:NAME"),
    ("train.py", ["--n_layer"], "write --n_layer=VALUE"),
    ("train.py", ["--compile=yes"], "compile='yes': must be bool"),
    ("train.py", ["--batch_size=0"], "batch_size=0: must be >= 1"),
    (
        "train.py",
        ["--gradient_accumulation_steps=0"],
        "gradient_accumulation_steps=0: must be >= 1",
    ),
    ("train.py", ["--eval_interval=0"], "eval_interval=0: must be >= 1"),
    ("train.py", ["--max_iters=-5"], "max_iters=-5: must be >= 0"),
    ("train.py", ["--dropout=1.5"], "dropout=1.5: must be < 1"),
    ("train.py", ["--beta1=-0.1"], "beta1=-0.1: must be >= 0"),
    ("train.py", ["--learning_rate=nan"], "learning_rate=nan: must be a finite number"),
    ("train.py", ["--weight_decay=inf"], "weight_decay=inf: must be a finite number"),
    ("train.py", ["--min_lr=1.0"], "min_lr=1.0: must be <= learning_rate"),
    ("train.py", ["--n_embd=100", "--n_head=3"], "n_head=3: must be a divisor of n_embd=100"),
    ("train.py", ["--init_from=resum"], "did you mean resume"),
    ("train.py", ["--init_from={d}/nowhere"], "init_from="),
    ("train.py", ["--optimizer=sgd"], "optimizer='sgd'"),
    ("train.py", ["--attn_impl=flash"], "attn_impl='flash'"),
    ("train.py", ["--dtype=float64"], "dtype='float64'"),
    ("train.py", ["missing.py"], "no config file 'missing.py'"),
    ("train.py", ["{d}/syntax.py"], "syntax.py:2:"),
    ("train.py", ["{d}/raises.py"], "raises.py:2: NameError"),
    ("train.py", ["{d}/latin1.py"], "latin1.py: not UTF-8 text"),
    ("train.py", ["--device=gpu"], "--device gpu"),
    (
        "train.py",
        ["--dataset=never_prepared_set", "--out_dir={d}/o1"],
        "run python data/never_prepared_set/prepare.py",
    ),
    (
        "train.py",
        ["--dataset={d}/lm", "--task=classify", "--out_dir={d}/o2"],
        "prepared for task=lm",
    ),
    ("train.py", ["--dataset={d}/lm", "--init_from=resume", "--out_dir={d}/o3"], "does not exist"),
    (
        "train.py",
        ["--dataset={d}/lm", "--init_from=resume", "--out_dir={d}/state"],
        "not a trainer state",
    ),
    ("train.py", ["--dataset={d}/lm", "--out_dir={d}/a_file/out"], "is not writable"),
    ("train.py", ["--dataset={d}/lm", "--out_dir={d}/gpt"], "already holds a checkpoint"),
    ("train.py", ["--dataset={d}/short", "--out_dir={d}/o4"], "1,000 tokens, meta.json says 3,000"),
    ("train.py", ["--dataset={d}/big_ids", "--out_dir={d}/o5"], "past vocab_size 10"),
    (
        "train.py",
        ["--dataset={d}/cls_cut", "--task=classify", "--out_dir={d}/o6"],
        "10 labels for 50 rows",
    ),
    (
        "train.py",
        ["--dataset={d}/lm", "--block_size=5000", "--out_dir={d}/o7"],
        "fewer than block_size + 1",
    ),
    ("train.py", ["--dataset={d}/no_dtype", "--out_dir={d}/o10"], "meta.json: no 'dtype' key"),
    (
        "train.py",
        ["--dataset={d}/float_ids", "--out_dir={d}/o11"],
        "meta.json: dtype='float64': must be one of uint16, uint32",
    ),
    (
        "train.py",
        ["--dataset={d}/lm", "--vocab_size=5", "--out_dir={d}/o8"],
        "the model has 5 tokens",
    ),
    (
        "train.py",
        ["--dataset={d}/lm", "--init_from={d}/clf", "--out_dir={d}/o9"],
        "holds an EncoderClassifier",
    ),
    (
        "data/chat/prepare.py",
        ["--tokenizer_from={d}/nothing", "--out_dir={d}/c1"],
        "no config.json there",
    ),
    (
        "data/chat/prepare.py",
        ["--source={d}/nope.jsonl", "--tokenizer_from={d}/gpt", "--out_dir={d}/c2"],
        "no such file or folder",
    ),
    ("bench/chat_example.py", ["--data={d}/nothing"], "meta.json"),
    ("sample.py", ["--out_dir={d}/nothing"], "no checkpoint in"),
    ("sample.py", ["--out_dir={d}/gpt", "--chat"], "has no chat tokens: fine-tune it"),
    ("sample.py", ["--out_dir={d}/clf"], "sample.py needs a GPT"),
    ("sample.py", ["--out_dir={d}/broken"], "not a readable checkpoint"),
    ("sample.py", ["--out_dir={d}/gpt", "--top_p=1.5"], "top_p=1.5: must be <= 1"),
    ("sample.py", ["--out_dir={d}/gpt", "--temperature=-1"], "temperature=-1.0: must be >= 0"),
    (
        "sample.py",
        ["--out_dir={d}/gpt", "--temperature=nan"],
        "temperature=nan: must be a finite number",
    ),
    (
        "sample.py",
        ["--out_dir={d}/gpt", "--frequency_penalty=nan"],
        "frequency_penalty=nan: must be a finite number",
    ),
    ("sample.py", ["--out_dir={d}/gpt", "--top_k=-3"], "top_k=-3: must be >= 0"),
    (
        "sample.py",
        ["--out_dir={d}/gpt", "--seed=18446744073709551616"],
        "--seed 18446744073709551616: must be",
    ),
    (
        "sample.py",
        ["--out_dir={d}/gpt", "--seed=18446744073709551615", "--num_samples=2"],
        "must be in [-2**63, 2**64 - num_samples]",
    ),
    ("sample.py", ["--out_dir={d}/gpt", "--seed=-9223372036854775809"], "must be in [-2**63"),
    ("sample.py", ["--out_dir={d}/gpt", f"--top_k={'9' * 5000}"], "...' (5,000 characters)"),
    ("sample.py", ["--out_dir={d}/gpt", "--num_samples=0"], "--num_samples: must be >= 1"),
    ("sample.py", ["--out_dir={d}/gpt", "--max_new_tokens=-1"], "--max_new_tokens: must be >= 0"),
    ("sample.py", ["--out_dir={d}/gpt", "--max_new_tokens=ten"], "invalid int value: 'ten'"),
    (
        "sample.py",
        ["--out_dir={d}/gpt", "--num_samples=100000000"],
        "--num_samples 100000000: a KV",
    ),
    ("sample.py", ["--out_dir={d}/gpt", "--start=FILE:{d}/nope.txt"], "No such file"),
    ("sample.py", ["--out_dir={d}/gpt", "--start=FILE:{d}/latin1.txt"], "not UTF-8 text"),
    ("sample.py", ["--out_dir={d}/gpt", "--start=xyz"], "not in this model's vocabulary"),
    (
        "sample.py",
        ["--out_dir={d}/gpt", "--weights=float16"],
        "argument --weights: invalid choice: 'float16'",
    ),
    ("sample.py", ["--init_from=gpt3"], "'gpt3' is neither a directory nor one of gpt2"),
    ("sample.py", ["--out_dir={d}/gpt", "--bogus"], "unrecognized arguments: --bogus"),
    ("classify.py", ["--out_dir={d}/nothing", "abc"], "no checkpoint in"),
    ("classify.py", ["--out_dir={d}/gpt", "abc"], "not a classifier"),
    (
        "classify.py",
        ["--out_dir={d}/clf_no_tokenizer", "abc"],
        "config.json: no tokenizer this project knows",
    ),
    (
        "sample.py",
        ["--out_dir={d}/gpt_no_tokenizer"],
        "config.json: no tokenizer this project knows",
    ),
    ("classify.py", ["--out_dir={d}/clf", "--eval={d}/missing.csv"], "cannot read it"),
    (
        "classify.py",
        ["--out_dir={d}/clf", "--eval={d}/labels.txt"],
        "expected a .csv, .parquet or .jsonl",
    ),
    ("classify.py", ["--out_dir={d}/clf", "--eval={d}/cols.csv"], "columns text,label"),
    ("classify.py", ["--out_dir={d}/clf", "--eval={d}/empty.csv"], "no usable row"),
    (
        "classify.py",
        ["--out_dir={d}/clf", "--plot=x.png", "abc"],
        "--plot draws the confusion matrix of --eval",
    ),
    (
        "classify.py",
        ["--out_dir={d}/clf", "--eval={d}/cols.csv", "--plot=cm.gif"],
        "must end in .png",
    ),
    (
        "classify.py",
        ["--out_dir={d}/clf", "--eval={d}/cols.csv", "--plot={d}/no/dir/cm.png"],
        "cannot write into",
    ),
    (
        "classify.py",
        ["--out_dir={d}/clf", "--attention_maps={d}/no/dir/a.png", "abc"],
        "cannot write into",
    ),
    (
        "classify.py",
        ["--out_dir={d}/clf", "--attention_maps=a.png", "abc", "bca"],
        "draws one text, got 2",
    ),
    ("classify.py", ["--out_dir={d}/clf", "--file={d}/nope.txt"], "No such file"),
    ("classify.py", ["--out_dir={d}/clf", "--file={d}/latin1.txt"], "not UTF-8 text"),
    ("classify.py", ["--out_dir={d}/clf", "--batch_size=0", "abc"], "--batch_size: must be >= 1"),
    (
        "classify.py",
        ["--out_dir={d}/clf", "--file={d}/empty.txt", "abc"],
        "pass texts or --file, not both",
    ),
    ("classify.py", ["--out_dir={d}/clf", "xyz"], "not in this model's vocabulary"),
    ("bench/speed.py", ["--repeats=0"], "--repeats: must be >= 1, got 0"),
    (
        "bench/speed.py",
        ["--time_to_loss", "config/shakespeare_char_cpu.py", "--repeats=0"],
        "--repeats: must be >= 1, got 0",
    ),
    ("bench/speed.py", ["--device=gpu"], "--device gpu"),
    ("bench/speed.py", ["--profile=missing.py"], "no such config file"),
    ("bench/speed.py", ["--bogus"], "unrecognized arguments: --bogus"),
    ("bench/core_tokens.py", [], "no command: give the run after --"),
    ("bench/core_tokens.py", ["--", "python", "-c", "raise SystemExit(3)"], "exited with status 3"),
    ("export.py", ["--out_dir={d}/nothing", "--hf_dir={d}/hf"], "no checkpoint in"),
    (
        "export.py",
        ["--out_dir={d}/clf", "--hf_dir={d}/hf"],
        "export.py writes GPT-2's layout, for a GPT",
    ),
    (
        "export.py",
        ["--out_dir={d}/rope", "--hf_dir={d}/hf"],
        "rope=True has no place in GPT-2's layout",
    ),
    ("export.py", ["--out_dir={d}/gpt", "--hf_dir={d}/a_file"], "is a file"),
    ("export.py", ["--out_dir={d}/gpt"], "pass --hf_dir, --gguf, --peft_dir or more"),
    ("export.py", ["--out_dir={d}/gpt", "--hf_dir={d}/gpt"], "is the checkpoint being exported"),
    ("export.py", ["--out_dir={d}/gpt", "--hf_dir={d}/clf"], "holds files no export wrote there"),
    ("export.py", ["--out_dir={d}/gpt", "--gguf={d}/gpt.bin"], "name the file *.gguf"),
    ("bench/gguf_check.py", ["--bogus"], "unrecognized arguments: --bogus"),
    ("serve.py", ["--out_dir={d}/nothing"], "no such checkpoint config"),
    ("serve.py", ["--out_dir={d}/gpt", "--out_dir={d}/gpt/"], "two checkpoints named 'gpt'"),
    ("serve.py", ["--out_dir={d}/gpt", "--port=-1"], "must be >= 0, got -1"),
    ("serve.py", ["--out_dir={d}/gpt", "--max_n=0"], "must be >= 1, got 0"),
    ("plot.py", ["{d}/nothing"], "no such file"),
    ("plot.py", ["{d}/gpt", "--x=tokens"], "invalid choice: 'tokens'"),
    ("data/agnews/prepare.py", ["--source={d}/nowhere"], "no such folder"),
    ("data/agnews/prepare.py", ["--source={d}/no_train"], "no train.csv"),
    ("data/agnews/prepare.py", ["--source={d}/no_columns"], "columns text,label"),
    ("data/agnews/prepare.py", ["--source={d}/latin1_csv"], "UTF-8"),
    ("data/agnews/prepare.py", ["--source={d}/no_rows"], "no usable row"),
    ("data/agnews/prepare.py", ["--source={d}/two_formats"], "keep one file per split"),
    (
        "data/agnews/prepare.py",
        ["--source={d}/no_train", "--val_fraction=1.5"],
        "must be < 1, got 1.5",
    ),
    ("data/agnews/prepare.py", ["--source={d}/no_train", "--max_length=0"], "must be >= 1, got 0"),
    (
        "data/agnews/prepare.py",
        ["--source={d}/no_train", "--out_dir={d}/a_file"],
        "is a file, not a folder",
    ),
    ("data/shakespeare_char/prepare.py", ["--source={d}/nope.txt"], "no such file"),
    ("data/shakespeare_char/prepare.py", ["--source={d}/empty.txt"], "the file is empty"),
    ("data/shakespeare_char/prepare.py", ["--source={d}/latin1.txt"], "not readable UTF-8 text"),
    (
        "data/shakespeare_char/prepare.py",
        ["--source={d}/latin1.txt", "--out_dir={d}/a_file"],
        "is a file, not a folder",
    ),
    ("data/shakespeare_char/prepare.py", ["--bogus"], "unrecognized arguments: --bogus"),
    ("data/shakespeare/prepare.py", ["--source={d}/nope.txt"], "no such file"),
    ("data/openwebtext/prepare.py", ["--bogus"], "unrecognized arguments: --bogus"),
    ("data/text/prepare.py", ["--source={d}/latin1.txt"], "not UTF-8 text (invalid"),
    ("bench/vocabularies.py", ["--source={d}/nope.txt"], "the following arguments are required"),
    ("bench/agnews.py", ["--bogus"], "unrecognized arguments: --bogus"),
    ("bench/lora.py", ["--bogus"], "unrecognized arguments: --bogus"),
    ("bench/calibration.py", ["{d}/missing", "{d}/nope.csv"], "no checkpoint in"),
    ("bench/nanogpt.py", ["--nanogpt={d}", "--source={d}/nope.txt"], "not a nanoGPT checkout"),
    ("bench/patterns.py", ["--skip_quality", "--out_dir={d}/missing"], "no checkpoint there"),
    ("bench/generate.py", ["--old={d}"], "no sample.py there"),
    ("bench/compat.py", ["--old={d}"], "no train.py there"),
    ("bench/compat.py", [], "the following arguments are required: --old"),
    ("bench/compat.py", ["--old={d}", "--turns=0"], "--turns: must be >= 1, got 0"),
    ("bench/generate.py", ["--val_model={d}/missing"], "no checkpoint there"),
    ("bench/serve_load.py", ["--out_dir={d}/gpt", "--requests=0"], "must be >= 1, got 0"),
    (
        "bench/serve_load.py",
        ["--out_dir={d}/gpt", "--concurrency=17"],
        "decodes at most 16 requests at once",
    ),
    # seeds past the range that torch.manual_seed and numpy's generators take
    ("train.py", ["--seed=-1", "--dataset={d}/lm", "--out_dir={d}/o12"], "seed=-1: must be >= 0"),
    (
        "train.py",
        [f"--seed={2**64}", "--dataset={d}/lm", "--out_dir={d}/o13"],
        f"seed={2**64}: must be < {2**64}",
    ),
]


@pytest.mark.parametrize(
    "script, args, words",
    BAD_INPUTS,
    ids=[f"{s.split('/')[-2 if '/' in s else 0]}-{i}" for i, (s, _, _) in enumerate(BAD_INPUTS)],
)
def test_bad_input_is_one_clear_line(files, script, args, words, monkeypatch):
    monkeypatch.chdir(files)
    args = (TINY if script == "train.py" else []) + [a.replace("{d}", str(files)) for a in args]
    code, out, err = cli(script, *args)
    assert code != 0 and "Traceback" not in err, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"{os.path.basename(script)}: error:") and words in last, last


def test_the_table_covers_every_command_line_tool():
    """Every script of the repository (each ends its errors through run_script) has bad inputs in
    the table."""
    scripts = {
        os.path.relpath(path, ROOT)
        for pattern in ("*.py", "bench/*.py", "data/*/prepare.py")
        for path in glob.glob(os.path.join(ROOT, pattern))
        if "\n    run_script(" in open(path).read()
    }
    assert "train.py" in scripts and scripts - {s for s, _, _ in BAD_INPUTS} == set()


# ------------------------------------------------------------------------------------------- faults

run = train.main


def test_a_scratch_run_never_replaces_a_checkpoint(files, tmp_path):
    common = TINY + [f"--dataset={files}/lm", f"--out_dir={tmp_path}", "--max_iters=2"]
    run(common)
    saved = {
        f: (tmp_path / f).read_bytes()
        for f in ("model.safetensors", "trainer_state.pt", "config.json")
    }
    # from scratch or from other weights: a new run either way
    for init in ([], [f"--init_from={files}/gpt"]):
        with pytest.raises(
            Error,
            match="already holds a checkpoint .* --init_from=resume, "
            "replace it with --overwrite_out_dir=True, or pick another --out_dir",
        ):
            run(common + init)
    assert saved == {f: (tmp_path / f).read_bytes() for f in saved}
    run(common + ["--overwrite_out_dir=True", "--seed=7"])  # said explicitly: replaced
    assert (tmp_path / "model.safetensors").read_bytes() != saved["model.safetensors"]


def test_a_random_seed_past_torchs_range_is_refused_before_out_dir_is_made(files, tmp_path):
    """torch.Generator takes seeds below 2**64: random_seed is checked with the other settings."""
    seed = f"--random_seed={2**64}"
    out_dir = tmp_path / "out"
    common = TINY + [f"--dataset={files}/lm", f"--out_dir={out_dir}", "--random_links=1"]
    with pytest.raises(Error, match=rf"^random_seed={2**64}: must be < {2**64} \(in {seed}\)$"):
        run(common + [seed])
    assert not out_dir.exists()


# what a run leaves in out_dir: its checkpoint, settings and records
RUN_FILES = (
    "model.safetensors",
    "config.json",
    "trainer_state.pt",
    "train_config.json",
    "metrics.jsonl",
)


class Crash(Exception):
    """A fault that ends a run where a test says."""


def crashing_at(step_to_fail, action):
    """A stand-in for train.get_lr that calls action() at step_to_fail."""
    get_lr = train.get_lr

    def lr(step, cfg):
        if step == step_to_fail:
            action()
        return get_lr(step, cfg)

    return lr


def crash():
    raise Crash


def sample_text(out_dir):
    code, out, err = cli("sample.py", f"--out_dir={out_dir}", "--start=abc", "--max_new_tokens=20")
    assert code == 0, err[-2000:]
    return out


def new_records(out_dir, since):
    """Whether every record of out_dir's metrics.jsonl was logged at or after Unix time since."""
    records = list(map(json.loads, (out_dir / "metrics.jsonl").read_text().splitlines()))
    return records and all(r["time"] >= since for r in records)


def test_an_overwrite_run_moves_the_old_run_into_previous(files, tmp_path):
    """--overwrite_out_dir moves every file of the old run into out_dir/previous, byte for byte,
    where it samples and resumes as before; a later overwrite replaces that folder."""
    out = tmp_path / "out"
    common = TINY + [f"--dataset={files}/lm", f"--out_dir={out}", "--eval_interval=2"]
    run(common + ["--max_iters=4"])
    old = {f: (out / f).read_bytes() for f in RUN_FILES}
    old_sample = sample_text(out)
    run(common + ["--overwrite_out_dir=True", "--seed=7", "--max_iters=2"])
    previous = out / "previous"
    assert {f: (previous / f).read_bytes() for f in RUN_FILES} == old
    assert sample_text(previous) == old_sample and sample_text(out) != old_sample
    assert json.loads((out / "train_config.json").read_text())["seed"] == 7
    _, metrics = run([f"--out_dir={previous}", "--init_from=resume", "--max_iters=6"])
    assert metrics and not (previous / "previous").exists()
    newer = {f: (out / f).read_bytes() for f in RUN_FILES}
    run(common + ["--overwrite_out_dir=True", "--seed=8", "--max_iters=2"])
    assert {f: (previous / f).read_bytes() for f in RUN_FILES} == newer


@pytest.mark.slow
def test_a_second_run_into_the_same_out_dir_is_refused_until_the_first_is_gone(files, tmp_path):
    command = [
        sys.executable,
        os.path.join(ROOT, "train.py"),
        *TINY,
        f"--dataset={files}/lm",
        f"--out_dir={tmp_path}",
        "--max_iters=1000000",
        "--eval_interval=100000",
    ]
    # one thread: the first run trains on one core while the others start on the other
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    first = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=env)
    try:
        for line in first.stderr:  # wait for training to start
            if line.startswith("step 0:"):
                break
        # the second and third runs in this process: another process than the first
        code, _, err = cli(*command[1:-2], "--max_iters=2", "--init_from=resume")
        assert code == 2 and f"is in use by another run (pid {first.pid} on " in err
    finally:
        first.kill()  # kill -9: no chance to clean up, yet the OS releases the lock
        first.wait()
    code, _, err = cli(*command[1:-2], "--max_iters=2", "--overwrite_out_dir=True")
    assert code == 0, err[-2000:]
    assert not list(tmp_path.glob("*.tmp"))


@contextmanager
def file_size_limit(size):
    """The kernel refuses every write that takes a file past size bytes (EFBIG, "File too large"),
    from torch's, safetensors' and Python's writers alike: a full disk that root does not get
    past. Python ignores SIGXFSZ, so the write fails rather than the process."""
    import resource

    limits = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, limits[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)


def refuse_torch_save(*args, **kwargs):
    raise RuntimeError("basic_ios::clear: iostream error")  # torch.save's, on a full disk


def train_error(err):
    """train.py's one error line (tqdm's bar may precede it on the same line)."""
    lines = re.findall(r"train\.py: error: .*", err)
    assert len(lines) == 1 and "Traceback" not in err, err[-3000:]
    return lines[0]


# the end of train.py's line after a refused write, once trainer_state.pt of step 2 is saved
INTACT = (
    "what it held before is whole; the checkpoint of step 2 in {out} is intact: free space (or "
    "fix the folder's permissions) and resume with --init_from=resume"
)


def check_resumes(files, out, saved):
    """out's files are as saved (a dict of their bytes), and out resumes to step 4 as a run that
    never failed does."""
    assert {f: (out / f).read_bytes() for f in saved} == saved
    assert not list(out.glob("*.tmp"))
    common = TINY + [f"--dataset={files}/lm", "--eval_interval=2", "--max_iters=4"]
    model, metrics = run(common + [f"--out_dir={out}", "--init_from=resume"])
    whole, whole_metrics = run(common + [f"--out_dir={out.parent / 'whole'}"])
    assert metrics == whole_metrics
    for (name, p), q in zip(model.state_dict().items(), whole.state_dict().values()):
        assert torch.equal(p, q), name
    assert torch.load(out / "trainer_state.pt", weights_only=True)["step"] == 4


@pytest.mark.parametrize("refusal", ["file size limit", "torch.save's error"])
def test_a_full_disk_at_a_save_is_one_line_and_the_last_checkpoint_resumes(
    files, tmp_path, monkeypatch, refusal
):
    """A trainer_state.pt that the disk refuses (torch's writer raises a RuntimeError) ends the run
    in one line, exit status 2: the file, the cause, and the checkpoint that is intact. It is, and
    resumes as if nothing had happened. A run that had saved nothing yet says so."""
    out = tmp_path / "out"
    common = TINY + [f"--dataset={files}/lm", "--eval_interval=2"]
    run(common + [f"--out_dir={out}", "--max_iters=2"])
    saved = {f: (out / f).read_bytes() for f in RUN_FILES}
    limit = nullcontext()
    if refusal == "torch.save's error":
        monkeypatch.setattr(torch, "save", refuse_torch_save)
    else:  # model.safetensors fits, trainer_state.pt does not
        assert len(saved["model.safetensors"]) < 32_000 < len(saved["trainer_state.pt"])
        limit = file_size_limit(32_000)
    with limit:
        code, _, err = cli("train.py", f"--out_dir={out}", "--init_from=resume", "--max_iters=4")
        fresh, _, fresh_err = cli(
            "train.py", *common, f"--out_dir={tmp_path / 'fresh'}", "--max_iters=4"
        )
    monkeypatch.undo()
    line = train_error(err)
    cause = "basic_ios::clear: iostream error" if refusal != "file size limit" else ".+"
    assert code == 2 and re.fullmatch(
        re.escape(f"train.py: error: cannot write {out}/trainer_state.pt (")
        + cause
        + re.escape("): " + INTACT.format(out=out)),
        line,
    ), line
    assert fresh == 2 and train_error(fresh_err).endswith(
        f"; {tmp_path / 'fresh'} holds no trainer state yet: free space (or fix the folder's "
        "permissions) and run again with --overwrite_out_dir=True"
    ), fresh_err[-2000:]
    # the improved model of step 4 went before its state: only trainer_state.pt is as saved
    saved = {"trainer_state.pt": saved["trainer_state.pt"]}
    check_resumes(files, out, saved)
    run(common + [f"--out_dir={tmp_path / 'fresh'}", "--overwrite_out_dir=True", "--max_iters=2"])


@pytest.mark.parametrize("name, mode", [("train_config.json", "w"), ("metrics.jsonl", "a")])
def test_a_refused_write_of_the_settings_or_records_is_one_line(
    files, tmp_path, monkeypatch, name, mode
):
    """A folder that refuses a write (chmod a-w, chattr +i; played here by open(), since root
    writes anyway): the settings' atomic replace or a record's append ends the run in one line
    naming the file and its cause, and the checkpoint of step 2 stays whole and resumable."""
    out = tmp_path / "out"
    run(TINY + [f"--dataset={files}/lm", f"--out_dir={out}", "--eval_interval=2", "--max_iters=2"])
    # the settings and records are rewritten as a resumed run starts
    saved = {f: (out / f).read_bytes() for f in RUN_FILES[:3]}
    real_open = open

    def refusing_open(file, *args, **kwargs):
        given = args[0] if args else kwargs.get("mode", "r")
        if os.path.basename(str(file)).startswith(name) and given.startswith(mode):
            raise PermissionError(13, "Permission denied", str(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr("builtins.open", refusing_open)
    code, _, err = cli("train.py", f"--out_dir={out}", "--init_from=resume", "--max_iters=4")
    monkeypatch.undo()
    line = train_error(err)
    expected = f"cannot write {out}/{name} (Permission denied): " + INTACT.format(out=out)
    assert code == 2 and line == f"train.py: error: {expected}", line
    check_resumes(files, out, saved)


def test_a_refused_write_is_one_line_from_every_script_that_writes(files, tmp_path):
    """export.py, plot.py, classify.py and prepare.py on a disk that takes no more than 100 bytes a
    file: each ends in one line, exit status 2, that names the file and the cause; a file that
    was there stays whole."""
    run(TINY + [f"--dataset={files}/lm", f"--out_dir={tmp_path / 'run'}", "--max_iters=2"])
    text = tmp_path / "text.txt"
    text.write_text("abcdefghij" * 100)
    (tmp_path / "hf").mkdir()
    (tmp_path / "chars").mkdir()
    # (the file each writes, the command)
    commands = [
        (
            tmp_path / "hf" / "model.safetensors",
            ["export.py", f"--out_dir={files}/gpt", f"--hf_dir={tmp_path}/hf", "--overwrite"],
        ),
        (tmp_path / "loss.png", ["plot.py", tmp_path / "run", f"--out={tmp_path}/loss.png"]),
        (
            tmp_path / "maps.png",
            ["classify.py", f"--out_dir={files}/clf", f"--attention_maps={tmp_path}/maps.png", "a"],
        ),
        (
            tmp_path / "chars" / "train.bin",
            ["data/shakespeare_char/prepare.py", f"--source={text}", f"--out_dir={tmp_path}/chars"],
        ),
    ]
    for path, (script, *args) in commands:
        path.write_bytes(b"what was there")
        with file_size_limit(100):
            code, _, err = cli(script, *args)
        last = err.strip().splitlines()[-1]
        prog = os.path.basename(script)
        assert code == 2 and re.fullmatch(
            re.escape(f"{prog}: error: cannot write {path} (")
            + ".*File too large.*"
            + re.escape("): what it held before is whole"),
            last,
        ), err[-3000:]
        assert path.read_bytes() == b"what was there"
        assert not list(path.parent.glob("*.tmp"))


# train.py in a child process whose every fsync first waits 30 ms: a save then takes a few hundred
# ms of a tiny run's time, and a kill at a random moment often lands in one
SLOW_SAVES = """
import runpy
import sys
import time

import lib.files

fsync = lib.files.fsync


def slow_fsync(path):
    time.sleep(0.03)
    fsync(path)


lib.files.fsync = slow_fsync
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def mtime(path):
    """A file's modification time in ns, or None where there is none."""
    try:
        return os.stat(path).st_mtime_ns
    except FileNotFoundError:
        return None


def changed(path, before):
    """Whether path's modification time is other than before (None: no file then)."""
    return mtime(path) != before


def wait_for(process, condition, what):
    """Poll condition() every millisecond while the process runs (60 s at most)."""
    deadline = time.monotonic() + 60
    while not condition():
        assert process.poll() is None, f"train.py ended before {what}"
        assert time.monotonic() < deadline, f"no {what} within 60 s"
        time.sleep(0.001)


def saving(out_dir, pid):
    """Whether process pid has a temporary file of a save open in out_dir."""
    return any(f".{pid}-" in name for name in os.listdir(out_dir))


def kill_at(moment, process, out_dir, rng):
    """SIGKILL after a random pause: at once (random), once a save's temporary file appears
    (mid-save), or once trainer_state.pt has just been replaced (after-save)."""
    time.sleep(rng.uniform(0, 0.4))
    state = out_dir / "trainer_state.pt"
    if moment == "mid-save":
        wait_for(process, partial(saving, out_dir, process.pid), "a save")
    if moment == "after-save":
        before = mtime(state)
        wait_for(process, partial(changed, state, before), "a save")
    process.kill()


def first_evaluation(stderr):
    """The step of the first evaluation a run printed."""
    return int(re.search(r"step (\d+): train/loss", stderr).group(1))


def check_killed_run(out_dir, saved):
    """After a kill: the state is a whole save, at an evaluation after the resumed one (saved)
    and at most one evaluation before the last one logged; the records read (a torn last line
    dropped), one line per evaluation and step; the model loads, or says that a save was cut
    short between its two files. Returns the state's step."""
    from lib.records import read_metrics
    from lib.weights import from_checkpoint

    step = torch.load(out_dir / "trainer_state.pt", weights_only=True)["step"]
    records = read_metrics(str(out_dir))
    evaluations = [r["step"] for r in records if "val/loss" in r]
    logs = [r["step"] for r in records if "val/loss" not in r]
    assert evaluations == list(range(0, evaluations[-1] + 1, 5))
    assert logs == list(range(1, logs[-1] + 1))
    assert step % 5 == 0 and saved < step and evaluations[-1] - 5 <= step <= evaluations[-1]
    try:
        from_checkpoint(out_dir)
    except Error as e:
        assert "a save was cut short between the two" in str(e)
    return step


@pytest.mark.slow
def test_kill_9_at_any_moment_loses_at_most_the_steps_since_the_last_save(files, tmp_path):
    """SIGKILL at 5 moments of a run that saves every 5 steps (seeded: the same moments every
    time), two of them during a save and one right after: after each, --init_from=resume works
    and starts at the last complete save."""
    out = tmp_path / "out"
    rng = random.Random(0)
    command = [
        sys.executable,
        "-c",
        SLOW_SAVES,
        "train.py",
        *TINY,
        f"--dataset={files}/lm",
        f"--out_dir={out}",
        "--eval_interval=5",
        "--log_interval=1",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    saved = 0
    for leg, moment in enumerate(["mid-save", "random", "after-save", "random", "mid-save"]):
        stderr = tmp_path / f"{leg}.err"
        resume = ["--init_from=resume"] if leg else []
        before = mtime(out / "trainer_state.pt")
        with open(stderr, "w") as err:
            process = subprocess.Popen(
                command + resume + ["--max_iters=100000"], cwd=ROOT, stderr=err, env=env
            )
        try:  # each run saves once first: what the next resume starts from moves on
            wait_for(process, partial(changed, out / "trainer_state.pt", before), "a save")
            kill_at(moment, process, out, rng)
        finally:
            process.kill()
            process.wait()
        if leg:
            assert first_evaluation(stderr.read_text()) == saved
        saved = check_killed_run(out, saved)
    # the last run to its end, in this process
    code, _, err = cli("train.py", *command[4:], "--init_from=resume", f"--max_iters={saved + 5}")
    assert code == 0 and first_evaluation(err) == saved, err[-2000:]
    check_killed_run(out, saved)
    assert not list(out.glob("*.tmp"))  # the killed saves' files, removed by the next run


def test_a_resumed_run_resumes_again_from_its_own_state(files, tmp_path):
    """A bare resume (only out_dir and init_from) takes the shape and the run's config from
    trainer_state.pt: three legs of 3 steps equal 9 steps straight, dropout and all."""
    straight, _ = run(
        TINY
        + [
            f"--dataset={files}/lm",
            f"--out_dir={tmp_path / 'a'}",
            "--max_iters=9",
            "--lr_decay_iters=9",
            "--dropout=0.1",
            "--eval_interval=3",
            "--n_layer=2",
        ]
    )
    run(
        TINY
        + [
            f"--dataset={files}/lm",
            f"--out_dir={tmp_path / 'b'}",
            "--max_iters=3",
            "--lr_decay_iters=9",
            "--dropout=0.1",
            "--eval_interval=3",
            "--n_layer=2",
        ]
    )
    run([f"--out_dir={tmp_path / 'b'}", "--init_from=resume", "--max_iters=6"])
    resumed, _ = run([f"--out_dir={tmp_path / 'b'}", "--init_from=resume", "--max_iters=9"])
    assert resumed.config.n_layer == 2
    for (name, p), q in zip(straight.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(p, q), name
    with pytest.raises(
        Error,
        match="cannot resume .* with a different model, pattern or optimizer: "
        "n_embd=16 there, 32 here",
    ):
        run([f"--out_dir={tmp_path / 'b'}", "--init_from=resume", "--max_iters=12", "--n_embd=32"])


@pytest.mark.slow
def test_ctrl_c_in_sample_keeps_what_was_generated(files):
    """Ctrl-C as a terminal sends it. The child's SIGINT starts at its default: a suite launched in
    the background (`cmd &` in a script) ignores SIGINT, its children inherit that, and Python then
    installs no KeyboardInterrupt."""
    process = subprocess.Popen(
        [
            sys.executable,
            os.path.join(ROOT, "sample.py"),
            f"--out_dir={files}/gpt",
            "--stream",
            "--max_new_tokens=10000000",
            "--start=abc",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONFAULTHANDLER": "1"},
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    first = process.stdout.read(20)
    assert first.startswith("abc")  # generating
    time.sleep(0.5)
    process.send_signal(signal.SIGINT)
    try:
        out, err = process.communicate(timeout=60)
    # SIGABRT makes faulthandler print where every thread of it stands
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGABRT)
        pytest.fail(
            f"sample.py did not stop within 60 s of Ctrl-C:\n{process.communicate()[1][-4000:]}"
        )
    out = first + out
    assert process.returncode == 130 and "Traceback" not in err, err
    assert "interrupted after" in err.strip().splitlines()[-1], err[-2000:]
    assert len(out) > 20 and set(out.strip()) <= set(CHARS + "\n")


def test_resume_refuses_another_optimizer(files, tmp_path):
    run(TINY + [f"--dataset={files}/lm", f"--out_dir={tmp_path}", "--max_iters=2"])
    with pytest.raises(
        Error, match="different model, pattern or optimizer: optimizer='adamw' there, 'muon' here"
    ):
        run([f"--out_dir={tmp_path}", "--init_from=resume", "--max_iters=4", "--optimizer=muon"])


def test_resume_drops_a_torn_last_metrics_line(files, tmp_path, capsys):
    """A crash mid-write leaves half a line at the end of metrics.jsonl: the resume and plot.py
    drop it with a warning; a damaged line before the last is an Error naming the file and line."""
    run(TINY + [f"--dataset={files}/lm", f"--out_dir={tmp_path}", "--max_iters=2"])
    metrics = tmp_path / "metrics.jsonl"
    torn = '{"step": 31, "ti'
    metrics.write_text(metrics.read_text() + torn)
    capsys.readouterr()
    run([f"--out_dir={tmp_path}", "--init_from=resume", "--max_iters=4"])
    assert "metrics.jsonl:" in capsys.readouterr().err
    steps = [r["step"] for r in map(json.loads, metrics.read_text().splitlines())]
    assert steps == sorted(steps) and 31 not in steps and max(steps) == 4
    metrics.write_text(metrics.read_text() + torn)
    code, _, err = cli("plot.py", tmp_path, f"--out={tmp_path / 'loss.png'}")
    assert code == 0 and "dropped a torn last line" in err, err
    metrics.write_text(torn + "\n" + metrics.read_text())
    code, _, err = cli("plot.py", tmp_path, f"--out={tmp_path / 'loss.png'}")
    last = err.strip().splitlines()[-1]
    assert code == 2 and "metrics.jsonl:1: not a record with an integer 'step'" in last, err
    with pytest.raises(Error, match=r"metrics.jsonl:1: not a record"):
        run([f"--out_dir={tmp_path}", "--init_from=resume", "--max_iters=6"])


DELETE = object()  # a damage that removes the key


def damaged_copy(source, dest, file, key, value):
    """dest: a copy of the folder source whose file has key (dotted; None: the whole file) set to
    value, removed (DELETE), or, for an int key of None, the file's text cut to that length, for a
    str one, that text."""
    dest.mkdir()
    for path in source.iterdir():
        (dest / path.name).write_bytes(path.read_bytes())
    text = (source / file).read_text()
    if key is None and isinstance(value, str):
        (dest / file).write_text(value)
        return dest
    if key is None and isinstance(value, int):
        (dest / file).write_text(text[:value])
        return dest
    data = json.loads(text)
    if key is None:
        data = value
    else:
        *parents, last = key.split(".")
        inner = data
        for parent in parents:
            inner = inner[parent]
        if value is DELETE:
            del inner[last]
        else:
            inner[last] = value
    (dest / file).write_text(json.dumps(data))
    return dest


CHAR_FILE = {"type": "char", "file": "tokenizer.tiktoken", "sha256": "0" * 64}
# (folder of the files fixture, file, key, value, the words of the line); truncations: key None
DAMAGED_FILES = [
    ("lm", "meta.json", None, 1, "not a readable JSON"),
    ("lm", "meta.json", None, 40, "not a readable JSON"),
    ("lm", "meta.json", None, [], "holds list [], not a JSON object"),
    ("lm", "meta.json", "vocab_size", "65", "vocab_size='65': must be int"),
    (
        "lm",
        "meta.json",
        "vocab_size",
        10**30,
        "vocab_size=1000000000000000000000000000000: must be <= 65536",
    ),
    ("lm", "meta.json", "splits.train", "3000", "splits.train='3000': must be int"),
    ("lm", "meta.json", "tokenizer.chars", 5, "tokenizer.chars=5: must be str"),
    ("lm", "meta.json", "tokenizer", DELETE, "no 'tokenizer' key"),
    ("cls", "meta.json", "max_length", "16", "max_length='16': must be int"),
    ("cls", "meta.json", "pad_token_id", 99, "pad_token_id=99: must be < 10"),
    ("gpt", "config.json", None, 1, "not a readable JSON"),
    ("gpt", "config.json", None, 60, "not a readable JSON"),
    ("gpt", "config.json", None, [1], "holds list [1], not a JSON object"),
    ("gpt", "config.json", "architecture", DELETE, "no 'architecture' key"),
    ("gpt", "config.json", "model.vocab_size", "65", "model.vocab_size='65': must be int"),
    ("gpt", "config.json", "model.bias", "yes", "model.bias='yes': must be bool"),
    ("gpt", "config.json", "model", {}, "no 'model.vocab_size' key"),
    ("gpt", "config.json", "model.block_size", "32", "model.block_size='32': must be int"),
    ("gpt", "config.json", "tokenizer.chars", 5, "tokenizer.chars=5: must be str"),
    (
        "gpt",
        "config.json",
        "tokenizer.chars",
        "abcdefghijk",
        "the tokenizer has 11 tokens, the model's vocabulary 10",
    ),
    ("clf", "config.json", "max_length", "128", "max_length='128': must be int"),
    ("clf", "config.json", "label_names", ["a"], "'label_names' names 1 classes, the model has 2"),
    ("clf", "config.json", "label_names", ["a", "a"], "'label_names' names 'a' twice"),
    ("clf", "config.json", "label_names", ["a", ["b"]], "holds ['b'], not a string"),
    ("cls", "meta.json", "label_names", ["a", "a"], "'label_names' names 'a' twice"),
    ("clf", "config.json", "tokenizer", DELETE, "no tokenizer this project knows"),
    ("gpt", "config.json", "tokenizer", DELETE, "no tokenizer this project knows"),
    # shape keys that do not fit the weights: refused before a model of that shape is built
    ("gpt", "config.json", "model.n_layer", 10**6, "'model.n_layer' is 1000000, the weights'"),
    ("gpt", "config.json", "model.n_embd", 10**6, "'model.n_embd' is 1000000, the weights'"),
    ("gpt", "config.json", "model.vocab_size", 11, "'model.vocab_size' is 11, the weights'"),
    ("gpt", "config.json", "model.block_size", 10**9, "'model.block_size' is 1000000000"),
    ("gpt", "config.json", "model.bias", False, "'model.bias' is False, the weights' shapes"),
    ("gpt", "config.json", "model.rope", True, "'model.rope' is True, the weights' shapes say"),
    ("gpt", "config.json", "model.n_head", 3, "n_head=3: must be a divisor of n_embd=16"),
    ("clf", "config.json", "model.n_layer", 10**6, "'model.n_layer' is 1000000, the weights'"),
    ("clf", "config.json", "model.bow_head", True, "'model.bow_head' is True, the weights'"),
    ("gpt_hf", "config.json", "n_layer", 10**6, "'n_layer' is 1000000, the weights' shapes say 1"),
    ("gpt_hf", "config.json", "n_positions", 10**9, "'n_positions' is 1000000000, the weights'"),
    ("gpt_hf", "config.json", "n_embd", 32, "'n_embd' is 32, the weights' shapes say 16"),
    # every key of a config.json of either kind in its type and range, whatever the parser raises
    ("gpt_hf", "config.json", "n_head", 0, "n_head=0: must be >= 1"),
    ("gpt_hf", "config.json", "n_head", -4, "n_head=-4: must be >= 1"),
    ("gpt_hf", "config.json", "n_head", "4", "n_head='4': must be int"),
    ("gpt_hf", "config.json", "n_head", 3, "n_head=3: must be a divisor of n_embd=16"),
    ("gpt_hf", "config.json", "n_head", DELETE, "no 'n_head' key"),
    ("gpt_hf", "config.json", "tokenizer.chars", 5, "tokenizer.chars=5: must be str"),
    ("gpt_hf", "config.json", None, "[" * 100_000, "not a readable JSON checkpoint config"),
    ("gpt", "config.json", None, "[" * 100_000, "not a readable JSON checkpoint config"),
    ("gpt", "config.json", None, '{"a": ' + "9" * 4301 + "}", "not a readable JSON checkpoint"),
    ("gpt", "config.json", "model.n_head", -4, "model.n_head=-4: must be >= 1"),
    ("gpt", "config.json", "model.n_head", None, "n_head=6: must be a divisor of n_embd=16"),
    ("gpt", "config.json", "model.dropout", 5, "model.dropout=5.0: must be < 1"),
    ("gpt", "config.json", "model.attn_impl", "sdp", "model.attn_impl='sdp': must be one of sdpa"),
    ("gpt", "config.json", "tokenizer.chat", "yes", "'tokenizer.chat' is 'yes', not true or"),
    # a char tokenizer is read as characters whatever else it holds
    ("gpt", "config.json", "tokenizer", CHAR_FILE, "no 'tokenizer.chars' key"),
    ("lm", "meta.json", "tokenizer", CHAR_FILE, "no 'tokenizer.chars' key"),
]
# the scripts that read each kind of folder, and their arguments
READERS = {
    "lm": [("train.py", [*TINY, "--dataset={x}", "--out_dir={x}/out"])],
    "cls": [("train.py", [*TINY, "--dataset={x}", "--out_dir={x}/out"])],
    "gpt": [
        ("sample.py", ["--out_dir={x}", "--max_new_tokens=2"]),
        ("sample.py", ["--init_from={x}", "--max_new_tokens=2"]),
        ("export.py", ["--out_dir={x}", "--hf_dir={x}-hf"]),
        ("serve.py", ["--out_dir={x}", "--port=0"]),
        ("data/chat/prepare.py", ["--tokenizer_from={x}", "--out_dir={x}-chat"]),
    ],
    "gpt_hf": [
        ("sample.py", ["--init_from={x}", "--max_new_tokens=2"]),
        ("data/chat/prepare.py", ["--tokenizer_from={x}", "--out_dir={x}-chat"]),
    ],
    "clf": [
        ("classify.py", ["--out_dir={x}", "abc"]),
        ("serve.py", ["--out_dir={x}", "--port=0"]),
    ],
}


def case_id(value):
    """A value too long for a test's name, named by its length (None: pytest's own name)."""
    if isinstance(value, str) and len(value) > 1000:
        return f"{len(value)}-characters"


@pytest.mark.parametrize("source, file, key, value, words", DAMAGED_FILES, ids=case_id)
def test_a_damaged_file_is_one_line_from_every_script_that_reads_it(
    files, tmp_path, source, file, key, value, words
):
    folder = damaged_copy(files / source, tmp_path / source, file, key, value)
    for script, args in READERS[source]:
        code, _, err = cli(script, *[a.replace("{x}", str(folder)) for a in args])
        assert code == 2 and "Traceback" not in err, (script, err[-3000:])
        last = err.strip().splitlines()[-1]
        prog = os.path.basename(script)
        assert last.startswith(f"{prog}: error: {folder / file}") and words in last, (
            script,
            last,
        )


# data a new run refuses, of each task: (folder of the files fixture, meta.json's key, its value
# (key None: the file cut to that length), the run's task, the words of the line)
REFUSED_DATA = [
    ("lm", None, 40, "lm", "not a readable JSON"),
    ("lm", "tokenizer", DELETE, "lm", "no 'tokenizer' key"),
    ("lm", "splits.train", 4000, "lm", "3,000 tokens, meta.json says 4,000"),
    ("cls", "label_names", ["a", "a"], "classify", "'label_names' names 'a' twice"),
    ("cls", "pad_token_id", 99, "classify", "pad_token_id=99: must be < 10"),
    ("cls", "max_length", "16", "classify", "max_length='16': must be int"),
    ("lm", "task", "chat", "lm", "train.offsets.npy: cannot read it"),  # a chat set's files
    ("lm", "task", "lm", "classify", "prepared for task=lm, but task=classify"),
]


def files_of(folder):
    """Every file under folder, by its path there: its bytes."""
    return {p.relative_to(folder): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_data_a_run_refuses_leaves_an_out_dir_and_its_previous_byte_for_byte(files, tmp_path):
    """A new run reads and checks its data, a classifier's labels and a chat set's files too,
    before it touches out_dir: with --overwrite_out_dir=True, refused data moves nothing into
    previous/ and replaces no older previous/."""
    out = tmp_path / "out"
    common = TINY + [f"--out_dir={out}", "--max_iters=2", "--overwrite_out_dir=True"]
    for seed in (1, 2):  # a run, and one before it in previous/
        run(common + [f"--dataset={files}/lm", f"--seed={seed}"])
    saved = files_of(out)
    assert Path("previous", "model.safetensors") in saved
    for i, (source, key, value, task, words) in enumerate(REFUSED_DATA):
        folder = damaged_copy(files / source, tmp_path / str(i), "meta.json", key, value)
        with pytest.raises(Error, match=re.escape(words)):
            run(common + [f"--dataset={folder}", f"--task={task}"])
        assert files_of(out) == saved, (source, key)


@pytest.mark.parametrize(
    "labels",
    [np.zeros(50, dtype=np.float32), np.zeros((50, 1), dtype=np.int64)],
    ids=["float", "2-D"],
)
def test_labels_of_the_wrong_dtype_or_shape_are_one_line(files, tmp_path, labels):
    folder = damaged_copy(files / "cls", tmp_path / "cls", "meta.json", "task", "classify")
    np.save(folder / "train.labels.npy", labels)
    with pytest.raises(Error, match=r"train.labels.npy: .* labels of shape .* one integer per row"):
        run(TINY + [f"--dataset={folder}", f"--out_dir={tmp_path / 'out'}", "--max_iters=1"])


def test_labels_that_look_like_numbers_but_are_not_are_skipped_rows(files, tmp_path):
    """'--1', '²', '١' and a 400-digit label are no class: classify.py --eval and
    data/agnews/prepare.py (one reader) skip them with the rows warning, not a ValueError."""
    rows = "text,label\nabc,0\nbca,1\ncab,--1\nacb,\u00b2\nbac,\u0661\ncba," + "9" * 400 + "\n"
    (tmp_path / "odd.csv").write_text(rows)
    code, out, err = cli("classify.py", f"--out_dir={files}/clf", f"--eval={tmp_path / 'odd.csv'}")
    assert code == 0 and "skipped 4 of 6 rows (0 with no text, 4 with a label" in err, err[-2000:]
    (tmp_path / "source").mkdir()
    (tmp_path / "source" / "train.csv").write_text(rows)
    code, _, err = cli(
        "data/agnews/prepare.py", f"--source={tmp_path / 'source'}", f"--out_dir={tmp_path / 'o'}"
    )
    assert "Traceback" not in err and "skipped 4 of 6 rows" in err, err[-2000:]


def test_seeds_and_top_k_at_their_limits(files):
    """The largest seed torch takes samples; a top_k past the vocabulary, even of 400 digits, keeps
    every token (the same text as top_k=0); a value too long to quote is cut in the message."""
    common = [f"--out_dir={files}/gpt", "--start=abc", "--max_new_tokens=20"]
    code, out, err = cli("sample.py", *common, f"--seed={2**64 - 1}")
    assert code == 0 and out.startswith("abc"), err[-2000:]
    code, everything, err = cli("sample.py", *common, "--top_k=0")
    assert code == 0, err[-2000:]
    code, huge, err = cli("sample.py", *common, f"--top_k={'9' * 400}")
    assert code == 0 and huge == everything, err[-2000:]
    code, _, err = cli("sample.py", *common, f"--top_k={'9' * 5000}")
    assert code == 2 and len(err.strip()) < 200, err[-300:]


def test_atomic_writes_reach_the_disk_before_and_after_the_rename(tmp_path, monkeypatch):
    """The file is fsynced before it replaces the old one (a power loss then leaves one of the two
    whole), its folder after (the rename itself is on the disk when the call returns)."""
    import lib.files

    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append(("fsync", os.path.isdir(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(src, dst):
        events.append(("replace", os.path.basename(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    lib.files.write_json(str(tmp_path / "a.json"), {"x": 1})
    assert events == [("fsync", False), ("replace", "a.json"), ("fsync", True)]
    assert json.loads((tmp_path / "a.json").read_text()) == {"x": 1}


def test_a_model_with_another_saves_card_is_refused(tmp_path):
    """A crash between the weights' rename and the card's pairs new weights with an old card: the
    card names its weights' id, and the pair is refused in one line naming both files."""
    from lib.weights import from_checkpoint

    tiny = GPTConfig(vocab_size=10, block_size=16, n_layer=1, n_head=2, n_embd=16, bias=True)
    tokenizer = {"type": "char", "chars": CHARS}
    for name in ("old", "new"):
        save_pretrained(GPT(tiny), tmp_path / name, task="lm", tokenizer=tokenizer)
    from_checkpoint(tmp_path / "old")
    (tmp_path / "old" / "model.safetensors").write_bytes(
        (tmp_path / "new" / "model.safetensors").read_bytes()
    )
    with pytest.raises(Error, match=r"old/model.safetensors is not the model .*old/config.json"):
        from_checkpoint(tmp_path / "old")
    code, _, err = cli("sample.py", f"--out_dir={tmp_path / 'old'}", "--max_new_tokens=2")
    assert code == 2 and "a save was cut short between the two" in err.splitlines()[-1], err


# ---------------------------------------------------------------- folders and files from elsewhere


@pytest.mark.parametrize("kind", ["link", "fifo"])
def test_a_lock_that_is_not_a_regular_file_is_refused_and_nothing_written_through_it(
    files, tmp_path, kind
):
    """A checkpoint folder from a tarball whose .lock links to another file (authorized_keys): the
    run, new or resumed, refuses it in one line and the file it points at is untouched."""
    target = tmp_path / "authorized_keys"
    target.write_text("ssh-ed25519 AAAA me\n")
    out = tmp_path / "out"
    out.mkdir()
    if kind == "link":
        (out / ".lock").symlink_to(target)
    else:
        os.mkfifo(out / ".lock")
    common = TINY + [f"--dataset={files}/lm", f"--out_dir={out}", "--max_iters=2"]
    for init in ([], ["--init_from=resume"]):
        with pytest.raises(Error, match=r"\.lock is a link or not a regular file"):
            run(common + init)
    assert target.read_text() == "ssh-ed25519 AAAA me\n"
    assert sorted(p.name for p in out.iterdir()) == [".lock"]


def test_a_resume_on_data_tokenized_otherwise_is_refused_before_the_first_model_save(
    files, tmp_path
):
    """A run stopped before its first model save (no config.json: only trainer_state.pt), then
    resumed on data prepared again with another tokenizer: the state names the tokenizer it
    trained with, and the resume is refused."""
    out = tmp_path / "out"
    run(TINY + [f"--dataset={files}/lm", f"--out_dir={out}", "--max_iters=2"])
    for name in ("config.json", "model.safetensors"):
        (out / name).unlink()
    state = (out / "trainer_state.pt").read_bytes()
    other = damaged_copy(files / "lm", tmp_path / "lm", "meta.json", "tokenizer.chars", CHARS[::-1])
    with pytest.raises(Error, match="not tokenized as the model in .* trains with"):
        run([f"--dataset={other}", f"--out_dir={out}", "--init_from=resume", "--max_iters=4"])
    assert (out / "trainer_state.pt").read_bytes() == state


@pytest.mark.parametrize(
    "key, value, texts, words",
    [
        ("tokenizer.chars", CHARS + "k", ["abc", "kk"], "the tokenizer has 11 tokens"),
        ("model.pad_token_id", 10**6, ["abc", "ab"], "model.pad_token_id=1000000: must be < 10"),
    ],
    ids=["vocabulary", "pad_token_id"],
)
def test_a_classifier_card_past_its_model_vocabulary_is_one_line(
    files, tmp_path, key, value, texts, words
):
    """A card whose tokenizer has more tokens than the model's vocabulary, or whose padding id is
    past it, is refused where a classifier is loaded (classify.py, and the playground's
    lib.classifier.load), as a GPT's is."""
    from lib import classifier

    folder = damaged_copy(files / "clf", tmp_path / "clf", "config.json", key, value)
    with pytest.raises(Error, match=re.escape(words)):
        classifier.load(str(folder), "cpu")
    code, _, err = cli("classify.py", f"--out_dir={folder}", *texts)
    last = err.strip().splitlines()[-1]
    assert code == 2 and last.startswith("classify.py: error:") and words in last, err[-3000:]


@pytest.mark.parametrize("block_size", [10**7, 10**9])
def test_a_rotary_cards_block_size_is_capped(files, tmp_path, block_size):
    """No tensor fixes a rotary model's context, and a decoder's KV cache holds all of it for each
    row: a card's block_size past the cap is one line, not gigabytes asked of the allocator."""
    folder = damaged_copy(
        files / "rope", tmp_path / "rope", "config.json", "model.block_size", block_size
    )
    code, _, err = cli("sample.py", f"--out_dir={folder}", "--max_new_tokens=2")
    last = err.strip().splitlines()[-1]
    assert code == 2 and f"model.block_size={block_size}: must be <= 131072" in last, err[-3000:]


# the 256 bytes, then two merges: "ab", then "abc"
RANKS = {**{bytes([b]): b for b in range(256)}, b"ab": 256, b"abc": 257}


def bpe_data(folder, ranks):
    """A prepared lm dataset of a trained BPE's ids (lib/bpe.save_ranks's file beside meta.json)."""
    from lib.bpe import save_ranks

    folder.mkdir()
    spec = save_ranks(ranks, folder)
    ids = np.random.default_rng(0).integers(0, len(ranks) + 1, 3000).astype(np.uint16)
    for split in ("train", "val"):
        save_array(str(folder / f"{split}.bin"), ids)
    splits = {"train": 3000, "val": 3000}
    write_meta(
        str(folder),
        task="lm",
        tokenizer=spec,
        vocab_size=len(ranks) + 1,
        dtype="uint16",
        splits=splits,
    )
    return folder


def bpe_checkpoint(folder, ranks):
    """A tiny GPT whose card names a trained BPE of these ranks, its file beside the card."""
    data = bpe_data(folder.with_name(folder.name + "-data"), ranks)
    shape = dict(vocab_size=len(ranks) + 1, block_size=16, n_layer=1, n_head=2, n_embd=16)
    spec = json.loads((data / "meta.json").read_text())["tokenizer"]
    torch.manual_seed(0)
    save_pretrained(GPT(GPTConfig(**shape)), folder, data, task="lm", tokenizer=spec)
    return folder


def lines_of(ranks):
    return [f"{base64.b64encode(t).decode()} {r}\n".encode() for t, r in ranks.items()]


# tokenizer.tiktoken's text, damaged (its sha256 then written into the card, as a sender would)
def missing_rank(ranks):
    return b"".join(lines_of(ranks)) + b"eHl6\n"


def shared_rank(ranks):
    return b"".join(lines_of(ranks)) + b"eHl6 257\n"


def missing_byte(ranks):
    kept = [t for t in ranks if t != b"e"]
    return b"".join(lines_of({t: i for i, t in enumerate(kept)}))


def empty_token(ranks):
    return b"".join(lines_of(ranks)) + b" 258\n"


def not_base64(ranks):
    return b"".join(lines_of(ranks)) + b"!!!! 258\n"


def ranks_from_one(ranks):
    return b"".join(lines_of({t: r + 1 for t, r in ranks.items()}))


# (damage: a function of the ranks giving the file's text, or what the file is; the words)
TOKENIZER_DAMAGES = [
    (missing_rank, "line 259 is not a base64 token, a space and its rank"),
    (shared_rank, "ranks are not 0 to 258, each once"),
    (missing_byte, "byte 101 is not one of its tokens"),
    (empty_token, "line 259 is not a base64 token, a space and its rank"),
    (not_base64, "line 259 is not a base64 token, a space and its rank"),
    (ranks_from_one, "ranks are not 0 to 257, each once"),
    ("/dev/zero", "not a regular file of at most 67,108,864 bytes"),
    ("fifo", "not a regular file of at most 67,108,864 bytes"),
    ("large", "not a regular file of at most 67,108,864 bytes"),
]


@pytest.mark.parametrize(
    "damage, words",
    TOKENIZER_DAMAGES,
    ids=[getattr(damage, "__name__", damage) for damage, _ in TOKENIZER_DAMAGES],
)
def test_a_tokenizer_file_is_checked_as_it_is_read(tmp_path, damage, words):
    """tokenizer.tiktoken comes from whoever sent the checkpoint, its sha256 in the card with it:
    its size, kind and every line are checked as it is read, one line on any failure (no
    traceback, no tiktoken panic, no read of /dev/zero until memory runs out)."""
    folder = bpe_checkpoint(tmp_path / "gpt", RANKS)
    path = folder / "tokenizer.tiktoken"
    path.unlink()
    if damage == "/dev/zero":
        path.symlink_to("/dev/zero")
    elif damage == "fifo":
        os.mkfifo(path)
    elif damage == "large":
        with open(path, "wb") as f:
            f.truncate(2**26 + 1)
    else:
        path.write_bytes(damage(RANKS))
        card = json.loads((folder / "config.json").read_text())
        card["tokenizer"]["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
        (folder / "config.json").write_text(json.dumps(card))
    code, _, err = cli("sample.py", f"--out_dir={folder}", "--start=e", "--max_new_tokens=2")
    last = err.strip().splitlines()[-1]
    assert code == 2 and last.startswith(f"sample.py: error: {path}:"), err[-3000:]
    assert words in last, last


def test_a_tokenizer_that_export_cannot_write_is_refused_before_any_file_is_written(tmp_path):
    """A trained BPE's token that no merge of lower ranks reaches has no place in Hugging Face's
    merges.txt: export.py refuses it in one line, before --hf_dir holds a file."""
    folder = bpe_checkpoint(tmp_path / "gpt", {**RANKS, b"xyz": 258})
    code, _, err = cli("export.py", f"--out_dir={folder}", f"--hf_dir={tmp_path / 'hf'}")
    last = err.strip().splitlines()[-1]
    assert code == 2 and "token b'xyz' is made by no merge" in last, err[-3000:]
    assert not (tmp_path / "hf").exists()


def test_a_tokenizer_file_gone_mid_run_is_named_not_taken_for_a_full_disk(tmp_path, monkeypatch):
    """The data's tokenizer.tiktoken deleted after the run's start: the first model save, which
    copies it, names the missing file, not a full disk."""
    data = bpe_data(tmp_path / "data", RANKS)
    load_data = train.load_data

    def then_delete(cfg):
        loaded = load_data(cfg)
        (data / "tokenizer.tiktoken").unlink()
        return loaded

    monkeypatch.setattr(train, "load_data", then_delete)
    with pytest.raises(Error) as refused:
        run(TINY + [f"--dataset={data}", f"--out_dir={tmp_path / 'out'}", "--max_iters=2"])
    assert "cannot read the tokenizer" in str(refused.value)
    assert "free space" not in str(refused.value)


def test_a_resumed_runs_saved_settings_are_checked_as_a_new_runs(files, tmp_path):
    """trainer_state.pt's settings (damaged, or from another version) go through every key's rule
    and the rules between keys, as a new run's do: one line each, the state untouched."""
    out = tmp_path / "out"
    run(TINY + [f"--dataset={files}/lm", f"--out_dir={out}", "--max_iters=2"])
    path = out / "trainer_state.pt"
    good = torch.load(path, weights_only=True)
    for damage, words in (
        ({"eval_interval": 0}, "eval_interval=0: must be >= 1"),
        ({"seed": -1}, "seed=-1: must be >= 0"),
        ({"min_lr": 1.0}, "min_lr=1.0: must be <= learning_rate"),
        ({"init_from": None}, "not a trainer state that train.py wrote"),
    ):
        state = {**good, "config": {**good["config"], **damage}}
        if damage.get("init_from", "") is None:
            del state["config"]["init_from"]
        torch.save(state, path)
        saved = path.read_bytes()
        with pytest.raises(Error, match=re.escape(words)):
            run([f"--out_dir={out}", "--init_from=resume", "--max_iters=4"])
        assert path.read_bytes() == saved


# JSON that json.loads meets with a RecursionError and a ValueError of Python's own limits; the
# nesting past any recursion limit a library sets (inductor raises it to 2,000)
PAST_PYTHONS_LIMITS = [
    ("[" * 100_000 + "]" * 100_000, "arrays or objects nested too deep to read"),
    ('{"messages": ' + "9" * 5000 + "}", "an integer of more than 4,300 digits"),
]


@pytest.mark.parametrize("line, why", PAST_PYTHONS_LIMITS, ids=["nested", "digits"])
def test_a_jsonl_line_past_pythons_limits_is_a_bad_line_to_every_reader(tmp_path, line, why):
    """A text corpus's, a labelled set's and a run's metrics JSON Lines: such a line is what a
    malformed one is to each, never a traceback."""
    path = tmp_path / "metrics.jsonl"
    good = json.dumps({"text": "ab", "label": 0, "step": 1}) + "\n"
    path.write_text(good + line + "\n" + good)
    with pytest.raises(Error, match=re.escape(f"{path}:2: not a JSON object ({why})")):
        list(jsonl_rows(str(path), None))
    assert read_records(str(path)) == [("ab", 0), (None, None), ("ab", 0)]
    with pytest.raises(Error, match=f"{path}:2: not a record with an integer 'step'"):
        read_metrics(str(tmp_path))


def test_an_older_states_damaged_card_is_one_line_on_resume(files, tmp_path):
    """A trainer state saved before states named their tokenizer: resume reads the model card's,
    and a card that is no JSON object is the card checks' one line."""
    out = tmp_path / "out"
    run(TINY + [f"--dataset={files}/lm", f"--out_dir={out}", "--max_iters=2"])
    state = torch.load(out / "trainer_state.pt", weights_only=True)
    del state["tokenizer"]
    torch.save(state, out / "trainer_state.pt")
    (out / "config.json").write_text("[1]")
    with pytest.raises(Error, match=r"config.json: the file holds list \[1\], not a JSON object"):
        run([f"--out_dir={out}", "--init_from=resume", "--max_iters=4"])


@pytest.mark.parametrize("name", ["config.json", "metrics.jsonl", "trainer_state.pt"])
@pytest.mark.parametrize("kind", ["device", "fifo"])
def test_a_file_that_is_not_a_regular_file_is_refused_not_read_forever(tmp_path, name, kind):
    """A checkpoint folder's config.json, metrics.jsonl or trainer_state.pt that is a link to
    /dev/zero or a named pipe: one line, where reading it would never end."""
    path = tmp_path / name
    if kind == "device":
        path.symlink_to("/dev/zero")
    else:
        os.mkfifo(path)
    readers = {
        "config.json": partial(common.read_json, str(path), "checkpoint config"),
        "metrics.jsonl": partial(read_metrics, str(tmp_path)),
        "trainer_state.pt": partial(
            checkpoint.resume,
            settings.parse([f"--out_dir={tmp_path}"], train.OPTIONS, "")[0],
            set(),
            train.OPTIONS,
        ),
    }
    with pytest.raises(Error, match=f"{name}: not a regular file"):
        readers[name]()


@pytest.mark.parametrize(
    "card", [{"architecture": "GPT", "model": {}}, {"model_type": "gpt2"}], ids=["ours", "hf"]
)
def test_weights_that_are_not_a_regular_file_are_refused_not_read_forever(tmp_path, card):
    """A model.safetensors that is a named pipe, beside this project's config.json or Hugging
    Face's (sample.py and export.py read both): config.json's one line, not a read that never
    ends."""
    (tmp_path / "config.json").write_text(json.dumps(card))
    os.mkfifo(tmp_path / "model.safetensors")
    with pytest.raises(Error, match="model.safetensors: not a regular file"):
        load_pretrained(str(tmp_path))
