"""sample.py end to end, as a user runs it (a subprocess), on a tiny random char-level GPT and a
tiny random GPT-2."""

import os
import subprocess
import sys
from functools import partial

import pytest
import torch
from conftest import ROOT, eot_checkpoint, generate, needs_shared, tiny_gpt2

from decoding import NextToken, Options, make_rules
from engine import Engine, Row
from lib.chat import ChatTokenizer
from lib.checkpoint import save_pretrained
from lib.common import run_script
from lib.tokenizer import EOT, CharTokenizer, continuation, decode_request, printable
from lib.weights import from_checkpoint
from model import GPT, GPTConfig
from sample import SEPARATOR, main

CHARS = (
    "\n !$&',-.3:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"  # Tiny Shakespeare's 65
)

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors: one thread


def launch(*args, cwd):
    """Start sample.py; the test collects it with finish(). Runs start together: each spends ~1.5 s
    importing torch."""
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
    }  # several at once: one thread each, or they fight over the cores
    return subprocess.Popen(
        [sys.executable, os.path.join(ROOT, "sample.py"), *args],
        cwd=cwd,
        env=env,
        text=True,
        encoding="utf-8",
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def finish(process):
    """-> (exit status, stdout, stderr)."""
    out, err = process.communicate(timeout=120)
    return process.returncode, out, err


def split(out):
    assert out.endswith("\n")
    return out[:-1].split(f"\n{SEPARATOR}\n")


@pytest.fixture(scope="module")
def char_model(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("char")
    torch.manual_seed(0)
    model = GPT(
        GPTConfig(vocab_size=len(CHARS), block_size=32, n_layer=2, n_head=2, n_embd=32, bias=True)
    )
    with (
        torch.no_grad()
    ):  # weights larger than training's init: greedy text that varies instead of one repeated char
        for p in model.parameters():
            p.normal_(0.0, 0.1)
    save_pretrained(model, out_dir, task="lm", tokenizer={"type": "char", "chars": CHARS})
    return str(out_dir)


@pytest.fixture(scope="module")
def greedy_text(char_model):
    """'ROMEO:' + 26 greedy tokens (32 = block_size: cached and uncached forwards see the same
    tokens), decoded here with engine.generate, independently of sample.py."""
    model, info = from_checkpoint(char_model)
    prompt = [CHARS.index(c) for c in "ROMEO:"]
    greedy = NextToken(Options(), greedy=True)
    tokens = [step[0] for step in generate(model, [prompt], 26, [greedy])]
    return "ROMEO:" + "".join(CHARS[t] for t in tokens)


@pytest.fixture(scope="module")
def runs(char_model, greedy_text, tmp_path_factory):
    """Every sample.py run of the char-model tests, started at once, collected by name."""
    cwd = tmp_path_factory.mktemp("runs")
    (cwd / "prompt.txt").write_text(PROMPT)
    stop = greedy_text[
        9:11
    ]  # two characters greedy decoding is known to produce, the 4th and 5th generated
    batch = ["--start", "ROMEO:", "--num_samples", "3", "--max_new_tokens", "20", "--seed", "7"]
    # greedy text compared with engine.generate's in float32 weights
    greedy = [
        "--start",
        "ROMEO:",
        "--num_samples",
        "2",
        "--max_new_tokens",
        "26",
        "--greedy",
        "--weights",
        "float32",
    ]
    commands = {
        "batch": batch,
        "batch_stream": batch + ["--stream"],
        "greedy": greedy,
        "greedy_no_cache": greedy + ["--no_cache"],
        "stop": greedy + ["--stop", stop],
        "file": ["--start", "FILE:prompt.txt", "--max_new_tokens", "5"],
        "empty": ["--start", "", "--max_new_tokens", "10"],
    }
    started = {
        name: launch("--out_dir", char_model, *args, cwd=cwd) for name, args in commands.items()
    }
    return {name: finish(p) for name, p in started.items()} | {"stop_string": stop}


# 62 characters: past block_size
PROMPT = "First Citizen:\nBefore we proceed any further, hear me speak.\n"


@pytest.mark.slow
def test_stdout_holds_only_the_samples_and_stream_does_not_change_it(runs):
    rc, out, err = runs["batch"]
    samples = split(out)
    assert (
        rc == 0 and len(samples) == 3 and len(set(samples)) == 3
    )  # a batch of three different samples
    assert all(
        s.startswith("ROMEO:") and len(s) == 6 + 20 for s in samples
    )  # char model: a token is a character
    assert "loaded" in err and "3 x 20 tokens" in err and "tokens/s" in err  # the logs go to stderr
    assert runs["batch_stream"][:2] == (
        0,
        out,
    )  # the same seed, the same samples; streaming changes only the timing


@pytest.mark.slow
def test_greedy_is_identical_with_and_without_the_kv_cache(runs, greedy_text):
    (rc, out, _), (rc2, out2, err2) = runs["greedy"], runs["greedy_no_cache"]
    assert rc == rc2 == 0 and out == out2 and "no KV cache" in err2
    assert split(out) == [greedy_text, greedy_text]  # both rows, and what engine.generate gives


@pytest.mark.slow
def test_stop_cuts_the_sample_and_ends_generation(runs, greedy_text):
    rc, out, err = runs["stop"]
    continuation = greedy_text[6:]
    cut = continuation.index(runs["stop_string"])  # only the continuation is searched
    assert rc == 0 and split(out) == ["ROMEO:" + continuation[:cut]] * 2
    assert (
        f"2 x {cut + 2} tokens" in err
    )  # both rows stopped on the token that completed the stop string


@pytest.mark.slow
def test_start_from_a_file_and_empty_start(runs):
    rc, out, err = runs["file"]
    assert rc == 0 and out.startswith(PROMPT) and len(out) == len(PROMPT) + 5 + 1
    assert "the model sees only the last 32" in err
    rc, out, _ = runs["empty"]
    assert rc == 0 and len(out) == 10 + 1  # starts from the newline token, which is not printed


def test_errors_are_one_line_and_fail(char_model, capsys):
    """In this process, as test_more_errors_in_process: such an error from a process of its own is
    test_gpt2_without_the_hub_is_one_line_naming_the_local_folder's."""
    for args, message in [
        (["--start", "héllo"], "--start: characters not in this model's vocabulary: 'é'"),
        (["--top_p", "1.5"], "--top_p=1.5: must be <= 1"),
    ]:
        with pytest.raises(SystemExit) as e:
            run_script(partial(main, ["--out_dir", char_model, *args]), "sample.py")
        out, err = capsys.readouterr()
        assert (
            e.value.code == 2
            and out == ""
            and err.startswith(f"sample.py: error: {message}")
            and err.count("\n") == 1
        )


@pytest.mark.parametrize(
    "args, message",
    [
        (["--repetition_penalty", "0"], "--repetition_penalty=0.0: must be > 0"),
        (["--temperature", "-1"], "--temperature=-1.0: must be >= 0"),
        (["--top_k", "-3"], "--top_k=-3: must be >= 0"),
        (["--no_repeat_ngram_size", "-1"], "--no_repeat_ngram_size=-1: must be >= 0"),
        (["--num_samples", "0"], "argument --num_samples: must be >= 1, got 0"),
        (["--max_new_tokens", "-1"], "argument --max_new_tokens: must be >= 0, got -1"),
        (
            ["--out_dir", "missing"],
            "no checkpoint in 'missing': train one with `python train.py config/",
        ),
        (["--start", "FILE:nope.txt"], "--start FILE:nope.txt: No such file or directory"),
        (["--device", "gpu"], "--device gpu: no such device here (Expected one of"),
        (["--weights", "float16"], "argument --weights: invalid choice: 'float16'"),
        (["--init_from", "gpt3"], "'gpt3' is neither a directory nor one of gpt2"),
        (["--compile", "--no_cache"], "--compile compiles the cached one-token step"),
    ],
)
def test_more_errors_in_process(args, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        run_script(lambda: main(args), "sample.py")  # what `python sample.py ARGS` runs
    err = capsys.readouterr().err
    assert (
        e.value.code == 2
        and err.startswith(f"sample.py: error: {message}")
        and err.count("\n") == 1
    )


@pytest.mark.parametrize(
    "args, generated, message",
    [
        # 1e-300 leaves no finite softmax: no token to draw from the first
        (["--temperature", "1e-300"], 0, "temperature overflows the logits"),
        # each of the 65 characters once: 'ROMEO:' holds 5, so 60 more, then none is left
        (["--no_repeat_ngram_size", "1", "--greedy"], 60, "no_repeat_ngram_size blocks every"),
        (["--nan"], 0, "the model's logits are not finite numbers"),
    ],
)
def test_a_sample_with_no_token_left_to_draw_is_printed_then_one_line(
    char_model, tmp_path, capsys, args, generated, message
):
    """What was generated goes to stdout, then the row's error (serve.py's 400) is the last line
    of stderr, naming the sample and how far it got, exit 2."""
    out_dir = char_model
    if args == ["--nan"]:  # weights all NaN: the model's own logits are NaN
        model, _ = from_checkpoint(char_model)
        with torch.no_grad():
            for p in model.parameters():
                p.fill_(float("nan"))
        out_dir = tmp_path / "nan"
        save_pretrained(model, out_dir, task="lm", tokenizer={"type": "char", "chars": CHARS})
        # float32 keeps the NaNs: --weights=auto may measure an int8 format fastest, whose
        # quantized NaN weights give finite logits
        args = ["--weights", "float32"]
    argv = ["--out_dir", str(out_dir), "--start", "ROMEO:", "--max_new_tokens", "100", *args]
    with pytest.raises(SystemExit) as e:
        run_script(lambda: main(argv), "sample.py")
    out, err = capsys.readouterr()
    assert e.value.code == 2 and "Traceback" not in err
    assert out.startswith("ROMEO:") and len(out) == len("ROMEO:") + generated + 1
    assert len(set(out[6:-1])) == generated  # no_repeat_ngram_size=1: every character new
    last = err.splitlines()[-1]
    assert last.startswith(
        f"sample.py: error: sample 1 stopped after {generated} tokens: {message}"
    )


def test_a_sample_ends_at_the_end_of_text_unless_ignore_eos(tmp_path, capsys):
    """Each sample is the one --ignore_eos gives, up to its first <|endoftext|>, which is not
    printed; streamed alike."""
    out_dir = eot_checkpoint(tmp_path / "eot", "ab\n")
    argv = ["--out_dir", out_dir, "--start", "ab", "--num_samples", "3", "--max_new_tokens", "40"]
    samples = {}
    for flags in ([], ["--stream"], ["--ignore_eos"]):
        main(argv + flags)
        samples[flags[0] if flags else "default"] = split(capsys.readouterr().out)
    going = samples["--ignore_eos"]
    assert all(s.count(EOT) >= 2 for s in going)  # every sample draws it, and goes on
    ended = [s.split(EOT)[0] for s in going]
    assert samples["default"] == samples["--stream"] == ended
    assert len(set(ended)) == 3 and all(s.startswith("ab") for s in ended)


def test_printable_holds_back_half_characters_and_a_possible_stop():
    assert printable("caf\ufffd") == "caf"  # the first byte of 'é' only: wait for the next token
    assert printable("hello wor", ["world"]) == "hello "  # 'wor' may begin the stop string
    assert printable("hello w!", ["world"]) == "hello w!" and printable("a\n", ["\n\n"]) == "a"
    assert (
        printable("hello wor", ["or!", "world"]) == "hello "
    )  # the longest tail any stop string may start with


def test_a_continuation_is_cut_before_the_first_stop_string_where_its_row_finishes():
    """sample.py's and serve's one reading of a row: its text, what may be shown, and the stop."""
    tokenizer = CharTokenizer("ab\n")
    row = Row([0], rule=None, max_new_tokens=8, block_size=8)
    row.tokens += tokenizer.encode("ab\nab\n\nb")
    assert continuation(tokenizer, row, ["\n\n"], 5) == ("ab\nab", "ab\nab", False)
    assert continuation(tokenizer, row, ["\n\n"], 6) == ("ab\nab\n", "ab\nab", False)
    assert not row.done
    assert continuation(tokenizer, row, ["\n\n", "b\n"]) == ("a", "a", True) and row.done


def test_a_stop_string_never_matches_inside_a_special_token():
    """A special token is not text: a stop is found in the text around it, never in its name nor
    across it ("r" does not cut <|user|> to <|use)."""
    tokenizer = ChatTokenizer(CharTokenizer("abr", eot=True))
    row = Row([0], rule=None, max_new_tokens=8, block_size=8)
    row.tokens += [0, tokenizer.ids["<|user|>"], 1, tokenizer.eot_token, 2, 0]
    whole = "a<|user|>b<|endoftext|>"
    assert continuation(tokenizer, row, ["r", "|>", "b<"], 4) == (whole, whole, False)
    assert continuation(tokenizer, row, ["a<"], 1) == ("a", "", False)  # "a" may begin it
    assert continuation(tokenizer, row, ["a<", "user"], 2) == ("a<|user|>", "a<|user|>", False)
    assert continuation(tokenizer, row, ["b<", "r"]) == (whole, whole, True) and row.done


def test_one_loop_steps_a_request_streams_its_first_row_and_ends_it_at_ctrl_c(capsys):
    """sample.py's samples and chat's replies: the first row printed as it grows is its text,
    a stop cuts every row, and Ctrl-C ends the request and leaves the engine free."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=3, block_size=32, n_layer=1, n_head=2, n_embd=16)).eval()
    tokenizer = CharTokenizer("ab\n")
    engine = Engine(model, rows=2)

    def decoded(stop, stream, tokens=20):
        request = engine.submit([0], make_rules(Options(), False, 0, 2, 3), tokens)
        return decode_request(engine, request, tokenizer, stop, stream), request

    (texts, steps, interrupted), _ = decoded(None, stream=True)
    assert capsys.readouterr().out == texts[0] + "\n" and len(texts[0]) == steps == 20
    assert texts[0] != texts[1] and not interrupted
    (cut, _, _), _ = decoded("b", stream=False)
    assert capsys.readouterr().out == "" and cut == [t.split("b")[0] for t in texts]
    step, calls = engine.step, []

    def interrupted_step():  # Ctrl-C in the fourth step
        calls.append(1)
        if len(calls) == 4:
            raise KeyboardInterrupt
        return step()

    engine.step = interrupted_step
    (texts, steps, interrupted), request = decoded(None, stream=True)
    assert interrupted and steps == 3 and request.done and not engine.busy()
    assert capsys.readouterr().out == texts[0] + "\n" and len(texts[0]) == 3


@pytest.mark.parametrize(
    "offline",
    [{"HF_HUB_OFFLINE": "1"}, {"HF_ENDPOINT": "http://127.0.0.1:9"}],  # told, or unreachable
    ids=["HF_HUB_OFFLINE", "unreachable"],
)
def test_gpt2_without_the_hub_is_one_line_naming_the_local_folder(tmp_path, offline):
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), **offline}  # an empty cache
    r = subprocess.run(
        [sys.executable, os.path.join(ROOT, "sample.py"), "--init_from=gpt2"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("sample.py: error: gpt2: the Hugging Face hub could not be reached")
    assert "model.safetensors + config.json" in r.stderr


@pytest.mark.slow
@needs_shared
def test_init_from_a_hugging_face_gpt2_directory_with_bpe(tmp_path):
    """A tiny random GPT-2 in the Hugging Face layout (see test_model.py), GPT-2's 50,257 tokens:
    random tokens include byte pieces of multi-byte characters, which streaming must not break."""
    gpt2 = tiny_gpt2(tmp_path / "tiny-gpt2")
    args = [
        "--init_from",
        str(gpt2),
        "--start",
        "Héllo, wörld",
        "--num_samples",
        "2",
        "--max_new_tokens",
        "30",
        "--temperature",
        "2",
        "--top_k",
        "0",
        "--seed",
        "1",
    ]
    plain, streamed = launch(*args, cwd=tmp_path), launch(*args, "--stream", cwd=tmp_path)
    (rc, out, err), (rc2, out2, _) = finish(plain), finish(streamed)
    assert rc == rc2 == 0 and "bpe tokenizer" in err
    samples = split(out)
    assert len(samples) == 2 and all(s.startswith("Héllo, wörld") and len(s) > 12 for s in samples)
    assert out2 == out  # streamed piece by piece, decoded the same
