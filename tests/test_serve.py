"""serve.py on a loopback port: each endpoint against sample.py and classify.py on the same
checkpoints and seeds, the stream against the whole answer, bad requests refused while the server
keeps answering, a client that leaves, a bounded load, and the page driven in headless Chromium."""

import asyncio
import contextlib
import dataclasses
import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
import transformers
from chromium import Browser, find
from conftest import ROOT, eot_checkpoint

import classify
import decoding
import engine as engine_module
import sample
from lib.checkpoint import save_pretrained
from lib.tokenizer import EOT
from model import GPT, EncoderClassifier, EncoderConfig, GPTConfig
from serving import completions, transport
from serving.app import Server
from serving.playground import Playground
from serving.scheduler import MAX_ROWS

CHARS = "abcdefgh .\n"
LABELS = ["alpha", "beta", "gamma"]
SAMPLING = dict(
    temperature=0.9,
    top_k=6,
    top_p=0.9,
    frequency_penalty=0.3,
    presence_penalty=0.2,
    repetition_penalty=1.3,
    no_repeat_ngram_size=3,
)


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    d = tmp_path_factory.mktemp("checkpoints")
    torch.manual_seed(0)
    gpt = GPT(
        GPTConfig(vocab_size=len(CHARS), block_size=32, n_layer=2, n_head=2, n_embd=32, bias=True)
    )
    with torch.no_grad():  # weights larger than training's init: text that varies
        for p in gpt.parameters():
            p.normal_(0.0, 0.1)
    save_pretrained(gpt, d / "gpt", task="lm", tokenizer={"type": "char", "chars": CHARS})
    clf = EncoderClassifier(
        EncoderConfig(
            vocab_size=len(CHARS),
            block_size=32,
            n_layer=2,
            n_head=2,
            n_embd=16,
            bias=True,
            n_classes=3,
            pad_token_id=CHARS.index(" "),
        )
    )
    with torch.no_grad():
        for p in clf.parameters():
            p.normal_(0.0, 0.3)
    save_pretrained(
        clf,
        d / "clf",
        task="classify",
        tokenizer={"type": "char", "chars": CHARS},
        label_names=LABELS,
        max_length=24,
    )
    return d


class SmallBuffers(transport.Protocol):
    """A connection that buffers 4 KB in asyncio before the server waits for its client, as over
    a network (asyncio's own 64 KiB could hold a whole stream of a loopback test, sent whole
    after the deadline)."""

    def connection_made(self, connection):
        super().connection_made(connection)
        connection.set_write_buffer_limits(high=4096)


@contextlib.contextmanager
def serving(checkpoints, host="127.0.0.1", send_buffer=None, rows=MAX_ROWS, **options):
    """The playground on a free port of host, in a thread of this process: (its address, the
    Playground), until the block ends. send_buffer: the bytes of each connection's kernel send
    buffer (the listening socket's, which connections inherit), asyncio's SmallBuffers' then;
    rows: the GPT's KV cache rows."""
    playground = Playground(
        [checkpoints / "gpt", checkpoints / "clf"], "cpu", "float32", max_tokens=256, rows=rows
    )
    httpd = Server(playground, host, 0, quiet=True, **options)
    if send_buffer:
        httpd.socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send_buffer)
        httpd.config.http = SmallBuffers
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    while not httpd.started:
        time.sleep(0.01)
    shown = f"[{host}]" if ":" in host else host
    try:
        yield f"{shown}:{httpd.port}", playground
    finally:
        httpd.stop()
        thread.join()


@pytest.fixture(scope="module")
def server(checkpoints):
    with serving(checkpoints) as running:
        yield running


@pytest.fixture(scope="module")
def strict(checkpoints):
    """A server whose requests have 6 s each, whose API one other origin may call, and whose
    kernel buffers hold little of a stream, as over a network."""
    origins = ["http://localhost:3000"]
    with serving(checkpoints, deadline=6, origins=origins, send_buffer=16384) as running:
        yield running


JSON = {"Content-Type": "application/json"}


def request(address, method, path, body=None, raw=None, headers=None):
    """(status, the JSON answer) of one request."""
    connection = http.client.HTTPConnection(address, timeout=60)
    data = raw if raw is not None else None if body is None else json.dumps(body).encode()
    connection.request(method, path, body=data, headers=JSON if headers is None else headers)
    response = connection.getresponse()
    status, text = response.status, response.read().decode()
    connection.close()
    return status, json.loads(text)


def post(server, path, body):
    status, answer = request(server[0], "POST", path, body)
    assert status == 200, answer
    return answer


def stream(server, body):
    """The data lines of a streamed completion, [DONE] included."""
    connection = http.client.HTTPConnection(server[0], timeout=60)
    connection.request(
        "POST", "/v1/completions", body=json.dumps({**body, "stream": True}), headers=JSON
    )
    response = connection.getresponse()
    kind = response.getheader("Content-Type")
    assert response.status == 200 and kind.startswith("text/event-stream")
    events = [
        line[6:] for line in response.read().decode().split("\n\n") if line.startswith("data: ")
    ]
    connection.close()
    return events


def cli(script, *args):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, os.path.join(ROOT, script), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def test_models_lists_each_checkpoint_with_its_task(server):
    status, answer = request(server[0], "GET", "/v1/models")
    assert status == 200 and answer["object"] == "list"
    assert [(m["id"], m["task"], m["labels"], m["n_head"]) for m in answer["data"]] == [
        ("gpt", "lm", None, 2),
        ("clf", "classify", LABELS, 2),
    ]


def test_options_are_decodings_own_declaration(server):
    status, answer = request(server[0], "GET", "/v1/options")
    assert status == 200 and answer["object"] == "list"
    declared = dataclasses.fields(decoding.Options)
    assert [(o["name"], o["default"], o["help"]) for o in answer["data"]] == [
        (f.name, f.default, f.metadata["help"]) for f in declared
    ]
    top_p = next(o for o in answer["data"] if o["name"] == "top_p")
    assert (top_p["type"], top_p["gt"], top_p["le"]) == ("float", 0, 1)


def test_the_page_starts_from_sample_pys_defaults(server):
    status, answer = request(server[0], "GET", "/v1/options")
    _, options = sample.parse_args([])
    assert {o["name"]: o["sample_default"] for o in answer["data"]} == dataclasses.asdict(options)


def test_a_completion_stops_at_the_end_of_text_unless_ignore_eos(checkpoints, tmp_path, capsys):
    """finish_reason "stop" where a choice draws <|endoftext|>, its text sample.py's (the one
    ignore_eos gives, up to it), streamed alike."""
    folder = tmp_path / "eot"
    eot_checkpoint(folder / "gpt", "ab\n")
    (folder / "clf").symlink_to(checkpoints / "clf")
    body = dict(model="gpt", prompt="ab", n=3, max_tokens=40, seed=7, temperature=0.8, top_k=200)
    with serving(folder) as server:
        ended = post(server, "/v1/completions", body)["choices"]
        going = post(server, "/v1/completions", {**body, "ignore_eos": True})["choices"]
        chunks = [json.loads(e)["choices"][0] for e in stream(server, body)[:-1]]
    assert all(c["text"].count(EOT) >= 2 and c["finish_reason"] == "length" for c in going)
    assert [c["text"] for c in ended] == [c["text"].split(EOT)[0] for c in going]
    assert [c["finish_reason"] for c in ended] == ["stop"] * 3
    for c in ended:
        mine = [chunk for chunk in chunks if chunk["index"] == c["index"]]
        assert "".join(chunk["text"] for chunk in mine) == c["text"]
        assert [chunk["finish_reason"] for chunk in mine][-1] == "stop"
    argv = ["--out_dir", str(folder / "gpt"), "--start", "ab", "--num_samples", "3"]
    sample.main(argv + ["--max_new_tokens", "40", "--seed", "7", "--weights", "float32"])
    texts = capsys.readouterr().out[:-1].split(f"\n{sample.SEPARATOR}\n")
    assert texts == ["ab" + c["text"] for c in ended]


@pytest.mark.parametrize(
    "options", [SAMPLING, dict(temperature=0.0, stop=["h."])], ids=["sampled", "greedy-stop"]
)
@pytest.mark.slow
def test_completions_are_sample_py_samples(server, checkpoints, options):
    """The same checkpoint, prompt, seed and flags: the same texts as sample.py's, sample for
    sample."""
    body = dict(model="gpt", prompt="abc", n=3, max_tokens=40, seed=7, **options)
    answer = post(server, "/v1/completions", body)
    flags = [f"--{k}={v}" for k, v in options.items() if k != "stop"] + (
        ["--stop", options["stop"][0]] if "stop" in options else []
    )
    out = cli(
        "sample.py",
        f"--out_dir={checkpoints / 'gpt'}",
        "--start=abc",
        "--num_samples=3",
        "--max_new_tokens=40",
        "--seed=7",
        "--device=cpu",
        "--weights=float32",
        *flags,
    )
    samples = [s.removeprefix("abc") for s in out[:-1].split(f"\n{'-' * 40}\n")]
    assert [c["text"] for c in answer["choices"]] == samples
    stopped = [c["finish_reason"] for c in answer["choices"]]
    assert stopped == ["stop" if len(s) < 40 else "length" for s in samples]
    assert answer["usage"]["prompt_tokens"] == 3 and answer["object"] == "text_completion"


def test_the_stream_adds_up_to_the_whole_answer_and_traces_each_token(server):
    body = dict(prompt="fade", n=2, max_tokens=30, seed=3, stop=["ab", "gh"], trace=4, **SAMPLING)
    whole = post(server, "/v1/completions", body)
    events = stream(server, body)
    assert events[-1] == "[DONE]" and len(events) > 10  # token by token, not one block
    chunks = [json.loads(e)["choices"][0] for e in events[:-1]]
    for choice in whole["choices"]:
        mine = [c for c in chunks if c["index"] == choice["index"]]
        assert "".join(c["text"] for c in mine) == choice["text"]
        assert [c["finish_reason"] for c in mine if c["finish_reason"]] == [choice["finish_reason"]]
        assert [t for c in mine for t in c.get("trace", [])] == choice["trace"]
        # every generated token is traced; a stopped text lacks the stop string's tokens
        drawn = "".join(t["token"] for t in choice["trace"])
        assert drawn.startswith(choice["text"]) and len(drawn) - len(choice["text"]) in (0, 1, 2)
        for t in choice["trace"]:
            names = [s["name"] for s in t["stages"]]
            assert names == [
                "raw",
                "frequency_penalty",
                "presence_penalty",
                "repetition_penalty",
                "no_repeat_ngram_size",
                "temperature",
                "top_k",
                "top_p",
            ]
            last = t["stages"][-1]  # what was drawn from: the drawn token is among the survivors
            assert last["chosen"] > 0 and len(last["top"]) <= 4
            assert all(a[2] >= b[2] for s in t["stages"] for a, b in zip(s["top"], s["top"][1:]))


@pytest.mark.slow
def test_classify_gives_classify_py_probabilities_and_every_head(server, checkpoints, tmp_path):
    texts = ["abc", "hhh gg", "a", "dead beef cafe", "bag"]
    answer = post(server, "/v1/classify", {"input": texts})
    lines = [
        json.loads(line)
        for line in cli(
            "classify.py", f"--out_dir={checkpoints / 'clf'}", "--json", "--device=cpu", *texts
        ).splitlines()
    ]
    assert [d["probs"] for d in answer["data"]] == [
        line["probs"] for line in lines
    ]  # to the last bit
    assert [d["label"] for d in answer["data"]] == [line["label"] for line in lines]
    one = post(server, "/v1/classify", {"model": "clf", "input": "dead beef", "attention": True})[
        "data"
    ][0]
    model, tokenizer, _, _ = classify.load(str(checkpoints / "clf"), "cpu")
    _, maps = classify.attention_maps(model, tokenizer.encode("dead beef"), "cpu")
    assert one["tokens"] == list("dead beef")
    got = torch.tensor(one["attention"])
    assert got.shape == (2, 2, 9, 9)  # layers, heads, queries, keys
    assert torch.allclose(got, torch.stack(maps), atol=5e-6)  # rounded to 5 decimals
    assert torch.allclose(
        got.sum(-1), torch.ones(2, 2, 9), atol=9 * 5e-6
    )  # each query's weights sum to 1


# (method, path, body: an object, or raw bytes, status, the field the error names)
BAD = [
    ("POST", "/v1/completions", b"{not json", 400, None),
    ("POST", "/v1/completions", [1, 2], 400, None),
    ("POST", "/v1/completions", {"prompt": "a", "logprobs": 21}, 400, "logprobs"),
    ("POST", "/v1/completions", {"prompt": [1, 11]}, 400, "prompt"),  # 11 chars: ids 0 to 10
    ("POST", "/v1/completions", {"prompt": [-1]}, 400, "prompt"),
    ("POST", "/v1/completions", {"prompt": []}, 400, "prompt"),
    ("POST", "/v1/completions", {"prompt": [[]]}, 400, "prompt"),
    ("POST", "/v1/completions", {"prompt": ["a"] * 65}, 400, "prompt"),
    ("POST", "/v1/completions", {"prompt": ["a", 1]}, 400, "prompt"),
    ("POST", "/v1/completions", {"stream_options": {"usage": True}}, 400, "stream_options"),
    # the logits overflow after the penalty, not after temperature
    ("POST", "/v1/completions", {"repetition_penalty": 1e-300}, 400, "repetition_penalty"),
    ("POST", "/tokenize", {"prompt": "xyz"}, 400, "prompt"),
    ("POST", "/detokenize", {"tokens": [11]}, 400, "tokens"),
    ("POST", "/v1/completions", {"prompt": 3}, 400, "prompt"),
    ("POST", "/v1/completions", {"n": "2"}, 400, "n"),
    ("POST", "/v1/completions", {"max_tokens": True}, 400, "max_tokens"),
    ("POST", "/v1/completions", {"stream": "yes"}, 400, "stream"),
    ("POST", "/v1/completions", {"max_tokens": 0}, 400, "max_tokens"),
    ("POST", "/v1/completions", {"max_tokens": 257}, 400, "max_tokens"),
    ("POST", "/v1/completions", {"n": 9}, 400, "n"),
    ("POST", "/v1/completions", {"trace": 21}, 400, "trace"),
    ("POST", "/v1/completions", {"temperature": -1}, 400, "temperature"),
    ("POST", "/v1/completions", {"top_p": 1.5}, 400, "top_p"),
    ("POST", "/v1/completions", {"top_k": -2}, 400, "top_k"),
    ("POST", "/v1/completions", {"repetition_penalty": 0}, 400, "repetition_penalty"),
    ("POST", "/v1/completions", {"no_repeat_ngram_size": -1}, 400, "no_repeat_ngram_size"),
    ("POST", "/v1/completions", {"seed": 2**70}, 400, "seed"),
    ("POST", "/v1/completions", {"temperature": 10**400}, 400, "temperature"),  # past a float
    (
        "POST",
        "/v1/completions",
        {"temperature": 1e-300},
        400,
        "temperature",
    ),  # the logits overflow to inf
    (
        "POST",
        "/v1/completions",
        {"frequency_penalty": 2.5},
        400,
        "frequency_penalty",
    ),  # OpenAI's [-2, 2]
    (
        "POST",
        "/v1/completions",
        b'{"n": 1' + b"0" * 5000 + b"}",
        400,
        None,
    ),  # past Python's 4,300 digits
    ("POST", "/v1/completions", b"[" * 60000, 400, None),  # nested past Python's recursion limit
    ("POST", "/v1/completions", {"stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),
    ("POST", "/v1/completions", {"stop": [""]}, 400, "stop"),
    ("POST", "/v1/completions", {"prompt": "a" * 33}, 400, "prompt"),  # block_size 32
    ("POST", "/v1/completions", {"prompt": "xyz"}, 400, "prompt"),  # not in the vocabulary
    (
        "POST",
        "/v1/completions",
        {"prompt": "abcdefgh .", "no_repeat_ngram_size": 1},
        400,
        "no_repeat_ngram_size",
    ),
    ("POST", "/v1/completions", {"model": "clf"}, 400, "model"),
    ("POST", "/v1/completions", {"model": "gpt-4"}, 404, "model"),
    ("POST", "/v1/classify", {"model": "gpt", "input": "abc"}, 400, "model"),
    ("POST", "/v1/classify", {"input": ""}, 400, "input"),
    ("POST", "/v1/classify", {"input": "xyz"}, 400, "input"),  # not in the vocabulary
    ("POST", "/v1/classify", {"input": ["abc", 3]}, 400, "input"),
    ("POST", "/v1/classify", {"input": ["a"] * 65}, 400, "input"),
    ("POST", "/v1/classify", {"input": ["a", "b"], "attention": True}, 400, "attention"),
    ("POST", "/v1/classify", {"text": "abc"}, 400, "text"),
    ("POST", "/v1/completions", b"{" + b" " * transport.MAX_BODY + b"}", 413, None),
    ("POST", "/v1/chat/completions", {}, 400, "messages"),
    ("GET", "/v1/nothing", None, 404, None),
]


@pytest.mark.parametrize(
    "method, path, body, status, param", BAD, ids=[f"{i}-{b[4]}" for i, b in enumerate(BAD)]
)
def test_bad_requests_get_a_4xx_naming_the_field_and_the_server_keeps_answering(
    server, method, path, body, status, param
):
    raw = body if isinstance(body, bytes) else None
    got, answer = request(server[0], method, path, None if raw else body, raw=raw)
    assert (
        got == status
        and answer["error"]["param"] == param
        and "\n" not in answer["error"]["message"]
    ), answer
    assert post(server, "/v1/completions", {"prompt": "ab", "max_tokens": 2})["choices"][0][
        "finish_reason"
    ]


@pytest.mark.parametrize("option", ["top_k", "no_repeat_ngram_size"])
def test_a_400_digit_count_means_no_limit_not_a_500(server, option):
    """top_k past the vocabulary keeps every token; an n-gram longer than any text bans none:
    each decodes as with the option off."""
    body = dict(prompt="ab", max_tokens=8, seed=5)
    huge = post(server, "/v1/completions", {**body, option: 10**399})
    off = post(server, "/v1/completions", body)
    assert huge["choices"] == off["choices"]


def test_an_error_mid_stream_is_its_last_event_before_done(server):
    """Every token blocked at the second step: the headers are out, so the error comes as an
    event, and the stream still ends with [DONE]."""
    events = stream(server, {"prompt": "abcdefgh .", "no_repeat_ngram_size": 1, "max_tokens": 5})
    assert (
        json.loads(events[0])["choices"][0]["text"] == "\n"
    )  # the one token no 1-gram of the prompt bans
    assert json.loads(events[1])["error"]["param"] == "no_repeat_ngram_size"
    assert events[2:] == ["[DONE]"]


def test_unknown_fields_sent_as_null_mean_not_given(server):
    """As OpenAI's clients send an option left unset."""
    answer = post(
        server, "/v1/completions", {"prompt": "ab", "max_tokens": 2, "logprobs": None, "user": None}
    )
    assert answer["usage"]["completion_tokens"] == 2


def test_a_body_without_content_length_is_refused(server):
    address = server[0]
    host, port = address.split(":")
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(
            b"POST /v1/completions HTTP/1.0\r\nHost: %s\r\n"
            b"Content-Type: application/json\r\n\r\n" % address.encode()
        )
        assert s.makefile("rb").readline().split()[1] == b"411"


def test_a_client_that_leaves_mid_stream_stops_its_decoding(server):
    address, playground = server
    host, port = address.split(":")
    body = json.dumps(
        {"prompt": "ab", "max_tokens": 256, "n": 8, "trace": 20, "stream": True}
    ).encode()
    decoder = playground.models["gpt"]["decoder"]
    before = decoder.steps
    head = b"POST /v1/completions HTTP/1.0\r\nHost: %s\r\nContent-Type: application/json\r\n"
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(head % address.encode() + b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        received = b""
        while b"data: " not in received:  # the headers, then the first token; now hang up
            chunk = s.recv(4096)
            assert chunk, received
            received += chunk
    for _ in range(100):  # the disconnect is seen, and the decoding stops where it stands
        then = decoder.steps
        time.sleep(0.1)
        if decoder.steps == then:
            break
    assert decoder.steps - before < 256, "the decoding ran to max_tokens after the client left"


def rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


@pytest.mark.slow
def test_a_bounded_load_answers_every_request_correctly_with_flat_memory(server):
    """200 requests, 8 at a time, after a warm-up round of the same: every answer equals the one
    each request gets alone (interleaved decoding steps do not mix their draws), and the process's
    memory does not grow."""
    bodies = [
        dict(prompt="abc"[: 1 + i % 3], max_tokens=8 + i % 5, seed=i, n=1 + i % 2, **SAMPLING)
        for i in range(20)
    ]
    alone = [post(server, "/v1/completions", b)["choices"] for b in bodies]
    rounds = []
    decoder = server[1].models["gpt"]["decoder"]
    with ThreadPoolExecutor(8) as pool:
        for _ in range(2):
            steps = decoder.steps
            tokens = server[1].tokens_generated
            answers = list(
                pool.map(
                    lambda i: post(server, "/v1/completions", bodies[i % 20])["choices"], range(200)
                )
            )
            rounds.append(rss_mb())
            assert answers == [alone[i % 20] for i in range(200)]
            # continuous batching: concurrent requests share the model's steps
            assert decoder.steps - steps < (server[1].tokens_generated - tokens) / 2
    warm, after = rounds
    assert after - warm < 10, rounds  # MB: a leak of ~50 KB a request would show


@pytest.mark.skipif(
    find() is None, reason="no Chromium here (Debian's chromium package; .ci/run installs it)"
)
def test_the_page_streams_a_completion_and_draws_every_head(server, tmp_path):
    browser = Browser(find(), str(tmp_path / "profile"))
    try:
        browser.goto(f"http://{server[0]}/")
        browser.wait("document.body.dataset.ready")
        browser.js("""document.getElementById("prompt").value = "bead";
                      document.getElementById("max_tokens").value = "30";
                      document.getElementById("seed").value = "11";
                      document.getElementById("go").click()""")
        assert (
            browser.wait(
                'document.body.dataset.generation !== "running" && document.body.dataset.generation'
            )
            == "done"
        ), browser.js('document.getElementById("gen-error").textContent')
        shown = browser.js('document.getElementById("output").textContent')
        events = int(browser.js('document.getElementById("output").dataset.events'))
        _, options = sample.parse_args([])  # the page's defaults are sample.py's
        options = dataclasses.asdict(options)
        field = 'document.getElementById("{}").value'
        assert {name: float(browser.js(field.format(name))) for name in options} == options
        answer = post(
            server,
            "/v1/completions",
            dict(model="gpt", prompt="bead", max_tokens=30, seed=11, **options),
        )
        assert (
            shown == "bead" + answer["choices"][0]["text"] and events == 30 + 1
        )  # one a token, then the end
        assert browser.js('document.querySelectorAll("#tokens span").length') == 30
        browser.js('document.querySelector("#tokens span:nth-child(5)").click()')
        assert (
            browser.js('document.querySelectorAll("#stages .stage").length') == 3
        )  # raw, temperature, top-k
        browser.js(
            'document.getElementById("text").value = "dead beef";'
            'document.getElementById("classify-go").click()'
        )
        assert (
            browser.wait(
                'document.body.dataset.classification !== "running" && '
                "document.body.dataset.classification"
            )
            == "done"
        )
        assert (
            browser.js('document.querySelectorAll("canvas.head").length') == 2 * 2
        )  # layers x heads
        assert browser.js('document.querySelectorAll("#probs .label-row").length') == len(LABELS)
        browser.screenshot(tmp_path / "playground.png")
        # an error after the stream began (every token blocked at the second step) is shown, not
        # taken for the end
        browser.js("""document.getElementById("prompt").value = "abcdefgh .";
                      document.getElementById("no_repeat_ngram_size").value = "1";
                      document.getElementById("go").click()""")
        assert (
            browser.wait(
                'document.body.dataset.generation !== "running" && document.body.dataset.generation'
            )
            == "failed"
        )
        error = browser.js('document.getElementById("gen-error").textContent')
        assert error.startswith("no_repeat_ngram_size blocks every token"), error
    finally:
        browser.close()
    assert (tmp_path / "playground.png").read_bytes()[:4] == b"\x89PNG"


# ------------------------------------------------------------------ each finding of the review
def raw_exchange(address, data, timeout=30):
    """Bytes sent on a fresh connection -> the whole answer, read until the server closes."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout) as s:
        s.sendall(data)
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    return answer


def status_of(answer):
    return int(answer.split(b" ", 2)[1])


def test_64_connections_at_once_are_all_answered(server):
    """A listen backlog of uvicorn's 2048, not http.server's 5: every one of 64 simultaneous
    clients, and of 40 simultaneous classifications (bounded, they wait their turn), answered."""
    barrier = threading.Barrier(64)

    def models(_):
        barrier.wait()
        return request(server[0], "GET", "/v1/models")[0]

    def classification(i):
        return request(server[0], "POST", "/v1/classify", {"input": "abc"[: 1 + i % 3]})[0]

    with ThreadPoolExecutor(64) as pool:
        assert list(pool.map(models, range(64))) == [200] * 64
        assert list(pool.map(classification, range(40))) == [200] * 40


def reset(reader):
    """Whether the server has dropped reader's connection: a peek at it meets the reset."""
    try:
        reader.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except BlockingIOError:  # open, nothing buffered yet
        return False
    except ConnectionResetError:
        return True
    return False


@pytest.mark.slow
def test_slow_readers_leave_a_normal_client_answered_and_are_cut_at_the_deadline(strict):
    """16 streams of 4 traced choices of 32 tokens (60 KB each), each client reading 2 KB a
    second: their slots go back when their decoding ends (half a second for all on 2 cores),
    so another client is answered before any slow stream is cut at its 6 s deadline, not read
    to its end. Were the slots held to the streams' ends, it would wait for the cuts."""
    address, playground = strict
    host, port = address.split(":")
    body = json.dumps(dict(prompt="ab", n=4, max_tokens=32, trace=20, stream=True)).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {address}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    readers = []
    for _ in range(16):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a reader that keeps little
        s.connect((host, int(port)))
        s.sendall(head.encode() + body)
        readers.append(s)
    start = time.perf_counter()
    status, answer = request(address, "POST", "/v1/completions", dict(prompt="ab", max_tokens=8))
    assert status == 200 and len(answer["choices"][0]["text"]) == 8, answer
    assert not any(map(reset, readers))  # answered before the first cut
    received = [0] * len(readers)
    closed = [False] * len(readers)
    when = [None] * len(readers)
    # read to its end, a stream takes 30 s; cut at its deadline, about 6
    while not all(closed) and time.perf_counter() - start < 15:
        # 2 KB a second each (512 bytes a quarter), whether or not a read waits for its data
        quarter = time.perf_counter() + 0.25
        for i, s in enumerate(readers):
            if closed[i]:
                continue
            s.settimeout(0.01)
            try:
                chunk = s.recv(512)
            except TimeoutError:
                continue
            except ConnectionResetError:  # dropped, with what the kernel had buffered
                chunk = b""
            closed[i] = not chunk
            if not chunk:
                when[i] = round(time.perf_counter() - start, 2)
            received[i] += len(chunk)
        time.sleep(max(0.0, quarter - time.perf_counter()))
    for s in readers:
        s.close()
    # each cut after its deadline, counted from when the server read it, and before half its read
    assert all(closed) and min(when) > 5, when
    # a whole stream (60 KB: every token's trace) is more than twice what was read
    assert max(received) < 30_000, received


def test_a_rebinding_host_a_text_plain_post_and_a_foreign_origin_are_refused(strict):
    address, _ = strict
    port = address.split(":")[1]
    body = {"prompt": "ab", "max_tokens": 2}
    assert request(address, "GET", "/v1/models", headers={"Host": "attacker.example"})[0] == 421
    for host in (f"attacker.example:{port}", f"127.0.0.1:{int(port) + 1}", f"10.0.0.1:{port}"):
        assert request(address, "GET", "/v1/models", headers={"Host": host})[0] == 421
    for name in ("localhost", "127.0.0.1", "[::1]"):  # the names of loopback are this server
        assert request(address, "GET", "/v1/models", headers={"Host": f"{name}:{port}"})[0] == 200
    # what a page of another site may send without a preflight
    plain = {"Content-Type": "text/plain"}
    assert request(address, "POST", "/v1/completions", body, headers=plain)[0] == 415
    assert request(address, "POST", "/v1/completions", body, headers={})[0] == 415
    foreign = {**JSON, "Origin": "http://attacker.example"}
    status, answer = request(address, "POST", "/v1/completions", body, headers=foreign)
    assert status == 403 and "--allow_origin" in answer["error"]["message"]
    assert request(address, "GET", "/v1/models", headers={"Origin": "null"})[0] == 403
    own = {**JSON, "Origin": f"http://localhost:{port}"}  # the page this server serves
    assert request(address, "POST", "/v1/completions", body, headers=own)[0] == 200
    # an origin --allow_origin names: its preflight answered, its answers readable
    allowed = "http://localhost:3000"
    connection = http.client.HTTPConnection(address, timeout=30)
    preflight = {
        "Origin": allowed,
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type",
    }
    connection.request("OPTIONS", "/v1/completions", headers=preflight)
    response = connection.getresponse()
    response.read()
    assert response.status == 200
    assert response.getheader("Access-Control-Allow-Origin") == allowed
    connection.request(
        "POST", "/v1/completions", json.dumps(body), headers={**JSON, "Origin": allowed}
    )
    response = connection.getresponse()
    assert response.status == 200 and response.getheader("Access-Control-Allow-Origin") == allowed
    response.read()
    connection.close()


def test_listening_on_ipv6_loopback_works(checkpoints):
    if not socket.has_ipv6:
        pytest.skip("this machine has no IPv6")
    try:
        socket.create_server(("::1", 0), family=socket.AF_INET6).close()
    except OSError as e:
        pytest.skip(f"no IPv6 loopback here ({e.strerror})")
    with serving(checkpoints, "::1") as (address, _):
        assert address.startswith("[::1]:")
        assert request(address, "GET", "/v1/models")[0] == 200


def test_a_wildcard_address_takes_ip_addresses_and_warns():
    assert transport.host_names("0.0.0.0") is None
    assert transport.names_server("192.168.1.7:80", None, 80)
    assert not transport.names_server("rebound.example:80", None, 80)  # a rebinding page's name
    assert "beyond this machine" in transport.exposure("0.0.0.0")
    assert "beyond this machine" in transport.exposure("192.168.1.7")
    assert transport.exposure("127.0.0.1") is None and transport.exposure("::1") is None


def test_a_head_sent_a_line_at_a_time_is_cut(server, monkeypatch):
    """A client that sends one header line every 0.3 s holds no connection past HEAD_SECONDS
    (monkeypatched to 1 s here; uvicorn alone would keep it for ever)."""
    monkeypatch.setattr(transport, "HEAD_SECONDS", 1)
    host, port = server[0].split(":")
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(b"GET /v1/models HTTP/1.1\r\n")
        try:
            for sent in range(30):
                time.sleep(0.3)
                s.sendall(b"X-Slow-%d: 1\r\n" % sent)
        except (BrokenPipeError, ConnectionResetError):
            pass
        while s.recv(4096):
            pass
    # cut about a second in, long before its last line (9 s)
    assert sent < 20, sent


def test_a_client_that_leaves_a_whole_answer_stops_its_decoding(server):
    """Not streamed: the server hears the disconnect while it decodes, and stops."""
    address, playground = server
    decoder = playground.models["gpt"]["decoder"]
    body = json.dumps({"prompt": "ab", "max_tokens": 256, "n": 8, "trace": 20}).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {address}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    host, port = address.split(":")
    before = decoder.steps
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(head.encode() + body)
        while decoder.steps == before:  # decoding has begun: hang up
            time.sleep(0.01)
    for _ in range(100):
        then = decoder.steps
        time.sleep(0.1)
        if decoder.steps == then:
            break
    assert decoder.steps - before < 256, "the decoding ran to max_tokens after the client left"


@pytest.mark.parametrize("length", ["²", "1" + "0" * 5000, "-1", "0x10"])
def test_a_content_length_that_is_no_number_is_a_400(server, length):
    address = server[0]
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {address}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n{{}}"
    )
    assert status_of(raw_exchange(address, head.encode())) == 400
    assert request(address, "GET", "/v1/models")[0] == 200


def test_the_page_answers_with_a_query(server):
    connection = http.client.HTTPConnection(server[0], timeout=30)
    connection.request("GET", "/?x=1")
    response = connection.getresponse()
    assert response.status == 200 and b"<html" in response.read()
    connection.close()


# --------------------------------------------------------------- the API evaluation harnesses use
def test_echoed_logprobs_are_hugging_faces_and_pick_its_multiple_choice_answer(
    server, checkpoints, tmp_path
):
    """The prompt's log-probabilities, given as text and as token ids, against transformers'
    GPT2LMHeadModel on export.py's folder of the same checkpoint, run in float64. Tolerance:
    Higham's bound for a float32 dot product of n terms is n u |x||w| (u = 2^-24); the logits
    come through 4 matmuls a layer and the head, none longer than 4 n_embd, and log_softmax
    moves by at most twice the largest logit error: 2 (4 n_layer + 1) 4 n_embd u max|logit|."""
    from export import export

    export(str(checkpoints / "gpt"), str(tmp_path / "hf"))
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").double().eval()

    def hf_scores(ids):
        with torch.no_grad():
            logits = hf(torch.tensor([ids])).logits[0]
        logprobs = torch.log_softmax(logits[:-1], -1)
        return logprobs.gather(1, torch.tensor(ids[1:])[:, None])[:, 0], logits.abs().max()

    text = "bead fade gh.\nab"
    ids = [CHARS.index(c) for c in text]
    expected, biggest = hf_scores(ids)
    u = 2.0**-24
    tolerance = 2 * (4 * 2 + 1) * 4 * 32 * u * biggest.item()
    for prompt in (text, ids):
        body = dict(model="gpt", prompt=prompt, echo=True, max_tokens=0, logprobs=2)
        choice = post(server, "/v1/completions", body)["choices"][0]
        logprobs = choice["logprobs"]
        assert choice["text"] == text and logprobs["tokens"] == list(text)
        assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
        got = torch.tensor(logprobs["token_logprobs"][1:], dtype=torch.float64)
        assert (got - expected).abs().max() <= tolerance
        assert logprobs["text_offset"] == list(range(len(text)))
        assert all(len(top) == 2 for top in logprobs["top_logprobs"][1:])
    # a multiple-choice item, as lm-evaluation-harness scores one: each ending's summed
    # log-probability after the context, the prompts in one request
    context = "dead beef "
    endings = ["cafe", "hhhh", "a.\n"]
    prompts = [context + ending for ending in endings]
    body = dict(model="gpt", prompt=prompts, echo=True, max_tokens=0, logprobs=0)
    answer = post(server, "/v1/completions", body)
    ours = []
    for choice in answer["choices"]:
        ours.append(sum(choice["logprobs"]["token_logprobs"][len(context) :]))
    theirs = []
    for prompt in prompts:
        scores, _ = hf_scores([CHARS.index(c) for c in prompt])
        theirs.append(scores[len(context) - 1 :].sum().item())
    assert ours == pytest.approx(theirs, abs=len(endings[2]) * tolerance)
    assert ours.index(max(ours)) == theirs.index(max(theirs))
    assert answer["usage"]["prompt_tokens"] == sum(map(len, prompts))


def test_openais_client_completes_scores_and_streams_with_usage(server):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"http://{server[0]}/v1", api_key="unused", max_retries=0)
    options = dict(model="gpt", prompt="ab", max_tokens=6, seed=3, logprobs=2, temperature=0.9)
    got = client.completions.create(**options, extra_body={"top_k": 4})
    ours = post(server, "/v1/completions", {**options, "top_k": 4})
    assert got.choices[0].text == ours["choices"][0]["text"]
    assert (
        got.choices[0].logprobs.token_logprobs == ours["choices"][0]["logprobs"]["token_logprobs"]
    )
    assert got.usage.completion_tokens == 6
    stream = client.completions.create(
        **options, extra_body={"top_k": 4}, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == got.choices[0].text
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 6
    with pytest.raises(openai.BadRequestError, match="top_p"):
        client.completions.create(model="gpt", prompt="ab", top_p=2.0)


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc, sets prlimit")
def test_out_of_file_descriptors_the_server_waits_instead_of_spinning(checkpoints):
    """With its descriptor limit 8 past what it holds, 24 clients, more than it can accept:
    accept() fails with EMFILE, and the server retries a second later (asyncio's rule) instead
    of spinning a core; once they leave, it answers."""
    import resource

    command = [sys.executable, os.path.join(ROOT, "serve.py"), f"--out_dir={checkpoints / 'gpt'}"]
    command += ["--port=0", "--device=cpu"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    server = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=env)
    try:
        for line in server.stderr:
            if "serving on" in line:
                address = line.split("http://")[1].split()[0]
                break
        threading.Thread(target=server.stderr.read, daemon=True).start()
        held = len(os.listdir(f"/proc/{server.pid}/fd"))
        resource.prlimit(server.pid, resource.RLIMIT_NOFILE, (held + 8, held + 8))
        host, port = address.split(":")
        clients = [socket.create_connection((host, int(port)), timeout=5) for _ in range(24)]
        time.sleep(0.5)  # the accepts fail from here on
        before = cpu_seconds(server.pid)
        time.sleep(2)
        spent = cpu_seconds(server.pid) - before
        for s in clients:
            s.close()
        assert spent < 0.5, f"{spent:.2f} s of CPU in 2 s with no descriptor left"
        for _ in range(50):  # the backlog's leftovers are accepted and closed
            try:
                if request(address, "GET", "/v1/models")[0] == 200:
                    break
            except (ConnectionError, TimeoutError, http.client.HTTPException):
                time.sleep(0.2)
        assert request(address, "GET", "/v1/models")[0] == 200
    finally:
        server.kill()
        server.wait()


def test_the_docs_list_every_decoding_option_and_a_client_gone_before_its_error_is_no_matter(
    server,
):
    """FastAPI's OpenAPI schema holds the completion body made from decoding.Options (ranges and
    help included); a client that sends a bad request and leaves at once leaves the server
    answering."""
    status, schema = request(server[0], "GET", "/openapi.json")
    assert status == 200
    body = schema["components"]["schemas"]["CompletionRequest"]["properties"]
    for f in dataclasses.fields(decoding.Options):
        assert body[f.name]["description"] == f.metadata["help"]
    assert (body["top_p"]["exclusiveMinimum"], body["top_p"]["maximum"]) == (0, 1)
    connection = http.client.HTTPConnection(server[0], timeout=30)
    connection.request("GET", "/docs")
    assert connection.getresponse().status == 200
    connection.close()
    for _ in range(20):
        host, port = server[0].split(":")
        with socket.create_connection((host, int(port)), timeout=30) as s:
            data = b'{"n": "2"}'
            s.sendall(
                b"POST /v1/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (server[0].encode(), len(data), data)
            )
    assert post(server, "/v1/completions", {"prompt": "ab", "max_tokens": 2})["usage"]


# ------------------------------------------------------------------- the guard's framing and CORS
def test_a_body_framed_both_ways_is_refused(server):
    """Content-Length beside Transfer-Encoding: h11 frames by the chunks, so the length the
    guard checked would not bound the body (RFC 9112 lets a server refuse such a request)."""
    address = server[0]
    body = b'{"prompt": "ab", "max_tokens": 2}'
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\n"
        "Content-Length: 20\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    )
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    assert status_of(raw_exchange(address, head.encode() + chunked)) == 400
    assert request(address, "GET", "/v1/models")[0] == 200


def test_the_body_limit_counts_the_bytes_received():
    """Whatever the headers say, a body is refused with a 413 once its bytes pass MAX_BODY, and
    the app never sees it."""
    seen = []

    async def app(scope, receive, send):
        seen.append(await receive())

    guard = transport.Guard(app, {"localhost"}, 80, (), deadline=30)
    scope = {
        "type": "http",
        "method": "POST",
        "headers": [
            (b"host", b"localhost:80"),
            (b"content-type", b"application/json"),
            (b"content-length", b"10"),
        ],
    }
    chunk = b" " * (transport.MAX_BODY // 2)

    async def receive():
        return {"type": "http.request", "body": chunk, "more_body": True}

    sent = []

    async def send(message):
        sent.append(message)

    asyncio.run(guard(scope, receive, send))
    assert sent[0]["status"] == 413 and not seen


def test_a_content_length_with_leading_zeros_is_its_number(server):
    address = server[0]
    body = b'{"prompt": "ab", "max_tokens": 2}'
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body):010d}\r\nConnection: close\r\n\r\n"
    )
    assert status_of(raw_exchange(address, head.encode() + body)) == 200


def test_an_allowed_origin_reads_why_the_guard_refused(strict):
    address, _ = strict
    allowed = "http://localhost:3000"
    body = {"prompt": "ab", "max_tokens": 2}
    connection = http.client.HTTPConnection(address, timeout=30)
    plain = {"Content-Type": "text/plain", "Origin": allowed}
    connection.request("POST", "/v1/completions", json.dumps(body), headers=plain)
    response = connection.getresponse()
    assert response.status == 415 and response.getheader("Access-Control-Allow-Origin") == allowed
    response.read()
    connection.close()


# ------------------------------------------------------------------------ text and numbers refused
@pytest.mark.parametrize("stream_it", [False, True])
def test_text_that_is_not_unicode_is_a_400_naming_its_field(server, stream_it):
    """A lone surrogate ("\\ud800" in the JSON) in a prompt, a stop string or a text to
    classify or tokenize: refused before any work, streamed or not."""
    body = {"prompt": "a\ud800b", "max_tokens": 2, "echo": True, "logprobs": 1}
    status, answer = request(server[0], "POST", "/v1/completions", {**body, "stream": stream_it})
    assert status == 400 and answer["error"]["param"] == "prompt"
    cases = [
        ("/v1/completions", {"prompt": "ab", "stop": ["\udfff"]}, "stop"),
        ("/v1/classify", {"input": ["abc", "\ud800"]}, "input"),
        ("/tokenize", {"prompt": "\ud800"}, "prompt"),
    ]
    for path, body, field in cases:
        status, answer = request(server[0], "POST", path, body)
        assert status == 400 and answer["error"]["param"] == field, answer


@pytest.mark.parametrize("raw", ["1e400", "Infinity", "-Infinity", "NaN"])
@pytest.mark.parametrize("option", ["temperature", "repetition_penalty", "top_p"])
def test_a_number_that_is_not_finite_is_a_400(server, option, raw):
    """JSON's 1e400 and Python's Infinity and NaN read as floats: decoding.Options refuses them,
    on the 400 path."""
    data = '{"prompt": "ab", "max_tokens": 2, "%s": %s}' % (option, raw)
    status, answer = request(server[0], "POST", "/v1/completions", raw=data.encode())
    assert status == 400 and answer["error"]["param"] == option, answer
    assert "finite" in answer["error"]["message"]


@pytest.mark.parametrize("weights", ["float32", "int8"])
def test_the_parameter_count_is_the_models_in_any_weight_format(checkpoints, weights):
    """Packed and int8 formats hold the weights as buffers: the count is taken before."""
    playground = Playground([checkpoints / "gpt", checkpoints / "clf"], "cpu", weights)
    loaded = playground.models["gpt"]
    assert loaded["parameters"] == GPT(loaded["model"].config).num_params()


def test_a_completion_past_the_deadline_at_the_measured_speed_is_refused_at_once(strict):
    """64 prompts x 8 choices x 256 tokens: 16 waves of the engine's 32 rows, 4,096 steps, which
    at 10 ms a step take 41 s, past the 6 s deadline: a 503 that says why, before any decoding;
    a small request still gets its answer."""
    address, playground = strict
    decoder = playground.models["gpt"]["decoder"]
    decoder.step_seconds = 0.01
    big = {"prompt": ["ab"] * 64, "n": 8, "max_tokens": 256}
    before = decoder.steps
    status, answer = request(address, "POST", "/v1/completions", big)
    assert status == 503 and "4096 decoding steps" in answer["error"]["message"], answer
    assert decoder.steps == before
    small = {"prompt": "ab", "max_tokens": 2}
    assert request(address, "POST", "/v1/completions", small)[0] == 200


def free_slots(playground):
    return len(playground.models["gpt"]["decoder"].engine.free)


def test_logprobs_past_the_vocabulary_is_a_400_and_takes_no_slot(server):
    """The served model has 11 tokens: 20 alternatives is a 400 naming logprobs, before any slot
    is taken, and again and again the server keeps answering (it once lost 8 slots a request)."""
    address, playground = server
    before = free_slots(playground)
    bad = {"prompt": "ab", "max_tokens": 5, "logprobs": 20, "n": 8}
    for _ in range(5):
        status, answer = request(address, "POST", "/v1/completions", bad)
        assert status == 400 and answer["error"]["param"] == "logprobs", answer
        assert free_slots(playground) == before
    every = post(server, "/v1/completions", {**bad, "logprobs": len(CHARS)})
    assert len(every["choices"][0]["logprobs"]["top_logprobs"][0]) == len(CHARS)
    assert free_slots(playground) == before


def test_a_failure_inside_the_engine_ends_its_own_request_and_gives_back_its_slots(
    server, monkeypatch
):
    """A bug while one request is admitted (here log_probabilities raising for it): that request
    gets a 500, its slots go back, and a request decoding beside it ends as it would alone."""
    address, playground = server
    before = free_slots(playground)
    alongside = {"prompt": "ab", "max_tokens": 60, "seed": 3, "n": 2}
    alone = post(server, "/v1/completions", alongside)["choices"]
    real = engine_module.log_probabilities

    def failing(logits, tokens, top):
        if top == 7:
            raise RuntimeError("selected index k out of range")
        return real(logits, tokens, top)

    monkeypatch.setattr(engine_module, "log_probabilities", failing)
    with ThreadPoolExecutor(2) as pool:
        beside = pool.submit(request, address, "POST", "/v1/completions", alongside)
        time.sleep(0.05)
        for _ in range(3):
            bad = {"prompt": "ab", "max_tokens": 5, "logprobs": 7, "n": 8}
            status, answer = request(address, "POST", "/v1/completions", bad)
            assert status == 500 and "out of range" in answer["error"]["message"], answer
        status, answer = beside.result()
    assert status == 200 and answer["choices"] == alone
    assert free_slots(playground) == before


class Slow:
    """A model that takes `seconds` more a call."""

    def __init__(self, model, seconds):
        self.model = model
        self.seconds = seconds

    def __call__(self, *args, **kwargs):
        time.sleep(self.seconds)
        return self.model(*args, **kwargs)


def test_the_deadline_estimate_keeps_prefill_apart_and_does_not_stick_after_a_burst(
    checkpoints,
):
    """A slow prefill, then slow decoding steps: neither leaves a small request refused for the
    2 s deadline once the server is idle again."""
    with serving(checkpoints, deadline=2) as (address, playground):
        decoder = playground.models["gpt"]["decoder"]
        engine = decoder.engine
        model = engine.model
        small = {"prompt": "ab", "max_tokens": 64}
        engine.model = Slow(model, 0.4)  # prefills only: decoding steps call engine.one_token
        request(address, "POST", "/v1/completions", {"prompt": "abcd", "max_tokens": 1})
        engine.model = model
        status, answer = request(address, "POST", "/v1/completions", small)
        assert status == 200, answer
        engine.one_token = Slow(model, 0.2)  # a burst of slow decoding steps
        request(address, "POST", "/v1/completions", {"prompt": "ab", "max_tokens": 6})
        engine.one_token = model
        deadline = time.monotonic() + 5
        while engine.busy() and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.1)
        status, answer = request(address, "POST", "/v1/completions", small)
        assert status == 200, answer


def test_a_fresh_server_estimates_before_its_first_step(checkpoints):
    """No step decoded yet: 64 prompts x 256 tokens on one row, 16,384 steps (some 0.3 ms each at
    least), are refused at once for the 2 s deadline, not decoded until it cuts them."""
    with serving(checkpoints, deadline=2, rows=1) as (address, playground):
        decoder = playground.models["gpt"]["decoder"]
        big = {"prompt": ["ab"] * 64, "max_tokens": 256}
        status, answer = request(address, "POST", "/v1/completions", big)
        assert status == 503 and "16384 decoding steps" in answer["error"]["message"], answer
        assert decoder.steps == 0


@pytest.fixture(scope="module")
def padded(checkpoints, tmp_path_factory):
    """The served GPT's weights with 16 rows of vocabulary for the tokenizer's 11, as
    config/gpt2.py pads 50,257 to 50,304."""
    d = tmp_path_factory.mktemp("padded")
    torch.manual_seed(0)
    gpt = GPT(GPTConfig(vocab_size=16, block_size=32, n_layer=2, n_head=2, n_embd=32, bias=True))
    with torch.no_grad():
        for p in gpt.parameters():
            p.normal_(0.0, 0.1)
        gpt.wte.weight[len(CHARS) :] *= 30  # the padded rows' logits the largest
    save_pretrained(gpt, d / "gpt", task="lm", tokenizer={"type": "char", "chars": CHARS})
    return d


def test_logprobs_and_trace_of_a_padded_vocabulary_are_the_tokenizers_tokens(padded):
    playground = Playground([padded / "gpt"], "cpu", "float32")
    httpd = Server(playground, "127.0.0.1", 0, quiet=True)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    while not httpd.started:
        time.sleep(0.01)
    try:
        body = {"prompt": "abc", "max_tokens": 4, "logprobs": 5, "echo": True, "trace": 5}
        status, answer = request(f"127.0.0.1:{httpd.port}", "POST", "/v1/completions", body)
    finally:
        httpd.stop()
        thread.join()
    assert status == 200, answer
    choice = answer["choices"][0]
    tops = [top for top in choice["logprobs"]["top_logprobs"] if top]
    assert all(len(top) == 5 and set(top) <= set(CHARS) for top in tops), tops
    stages = [stage for entry in choice["trace"] for stage in entry["stages"]]
    assert all(t[1] < len(CHARS) for stage in stages for t in stage["top"])


@pytest.mark.parametrize("flag", ["--port=70000", "--max_rows=100000000"])
def test_a_port_past_65535_and_a_cache_past_memory_are_one_line(checkpoints, flag):
    result = subprocess.run(
        [sys.executable, os.path.join(ROOT, "serve.py"), f"--out_dir={checkpoints / 'gpt'}", flag],
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert flag.split("=")[0] in result.stderr.splitlines()[-1], result.stderr


def test_logprobs_and_trace_past_their_budget_are_a_400_before_any_step(server):
    """8 prompts x 8 choices x 256 tokens, each with 10 alternatives and the chosen one, and a
    trace of 20 at each of 8 stages (the raw logits and 7 options): 2,801,664 log-probabilities,
    past completions.MAX_CANDIDATES, refused before decoding; one choice of it is well within."""
    address, playground = server
    decoder = playground.models["gpt"]["decoder"]
    big = dict(prompt=["ab"] * 8, n=8, max_tokens=256, trace=20, logprobs=10, **SAMPLING)
    before = decoder.steps
    status, answer = request(address, "POST", "/v1/completions", big)
    assert status == 400 and answer["error"]["param"] == "trace", answer
    assert "2,801,664 log-probabilities" in answer["error"]["message"], answer
    assert f"{completions.MAX_CANDIDATES:,}" in answer["error"]["message"], answer
    assert decoder.steps == before
    small = {**big, "prompt": "ab", "n": 1, "max_tokens": 2}
    assert len(post(server, "/v1/completions", small)["choices"][0]["trace"]) == 2


@pytest.mark.parametrize("stream_it", [False, True])
def test_logprobs_and_usage_leave_out_the_tokens_a_stop_string_cuts(server, stream_it):
    """A text cut before a stop string of two characters: its logprobs are its own tokens (one a
    character), none of the stop string's, and its usage counts those alone."""
    body = dict(prompt="ab", max_tokens=30, seed=5, logprobs=1, **SAMPLING)
    whole = post(server, "/v1/completions", body)["choices"][0]["text"]
    stop = whole[12:14]
    cut = whole.index(stop)
    body = {**body, "stop": stop, "stream_options": {"include_usage": True}}
    if stream_it:
        chunks = [json.loads(e) for e in stream(server, body)[:-1]]
        usage = chunks[-1]["usage"]
        choices = [c for chunk in chunks for c in chunk["choices"]]
        logprobs = [c["logprobs"] for c in choices if c["logprobs"]]
        text = "".join(c["text"] for c in choices)
    else:
        answer = post(server, "/v1/completions", {**body, "stream_options": None})
        usage, choice = answer["usage"], answer["choices"][0]
        logprobs, text = [choice["logprobs"]], choice["text"]
    assert text == whole[:cut]
    assert "".join(t for lp in logprobs for t in lp["tokens"]) == whole[:cut]
    assert sum(len(lp["token_logprobs"]) for lp in logprobs) == cut
    assert usage["completion_tokens"] == cut


def test_a_body_in_a_charset_other_than_utf_8_is_a_415_naming_it(server):
    body = {"prompt": "ab", "max_tokens": 2}
    for charset in ("utf-16", "latin-1"):
        kind = {"Content-Type": f"application/json; charset={charset}"}
        raw = json.dumps(body).encode(charset)
        status, answer = request(server[0], "POST", "/v1/completions", raw=raw, headers=kind)
        assert status == 415 and charset in answer["error"]["message"], answer
    for charset in ("UTF-8", '"utf-8"'):
        kind = {"Content-Type": f"application/json; charset={charset}"}
        raw = json.dumps(body).encode()
        assert request(server[0], "POST", "/v1/completions", raw=raw, headers=kind)[0] == 200


def test_a_task_with_no_model_loaded_says_to_start_the_server_with_one(checkpoints):
    for served, task, what in [("gpt", "classify", "classifier"), ("clf", "lm", "GPT")]:
        playground = Playground([checkpoints / served], "cpu", "float32", rows=1)
        with pytest.raises(transport.RequestError) as refused:
            playground.pick_model(None, task)
        message = f"no {what} is loaded; start serve.py with one (--out_dir)"
        assert refused.value.status == 400 and str(refused.value) == message
