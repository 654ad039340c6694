"""serve.py's /v1/chat/completions through OpenAI's client: each reply the engine's decode of the
conversation rendered in lib/chat.py's template, ended by <|end|>, streamed alike; stop strings,
usage, the 400s, and the page's chat section in headless Chromium."""

import http.client
import json
import re
import threading
import time

import pytest
import torch
from chromium import Browser, find
from conftest import marker_checkpoint
from openai import OpenAI

import decoding
from engine import Engine
from lib.checkpoint import save_pretrained
from lib.tokenizer import end_tokens
from lib.weights import load_gpt
from model import GPT, GPTConfig
from serving.app import Server
from serving.chat import NO_CHAT
from serving.playground import Playground

CHARS = "abcdefghrsu .\n:<|>"
MARKER = re.compile(r"<\|(system|user|assistant)\|>")  # a role marker's text
MESSAGES = [
    {"role": "system", "content": "be a dad."},
    {"role": "user", "content": "abc: head"},
]
SAMPLING = dict(temperature=0.9, top_p=0.95, frequency_penalty=0.3, presence_penalty=0.2)

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A random GPT with the chat tokens after its characters ("chat"), one without ("plain")
    and conftest's undertrained one ("markers"), served on a free port: (its address, the chat
    model's folder)."""
    d = tmp_path_factory.mktemp("chat")
    torch.manual_seed(0)
    for name, extra in (("chat", 4), ("plain", 0)):
        shape = dict(block_size=64, n_layer=1, n_head=2, n_embd=32, bias=True)
        model = GPT(GPTConfig(vocab_size=len(CHARS) + extra, **shape))
        with torch.no_grad():  # weights larger than training's init: text that varies
            for p in model.parameters():
                p.normal_(0.0, 0.2)
            # a chat model in miniature: the last LayerNorm's feature 0 is 1 for every token,
            # through which the role markers' logits fall by 10 (no reply holds one) and
            # <|end|>'s rises by 0.5 (some replies end)
            model.ln_f.weight[0], model.ln_f.bias[0] = 0.0, 1.0
            model.wte.weight[len(CHARS) :, 0] = -10.0
            model.wte.weight[len(CHARS) + 3 :, 0] = 0.5
        spec = {"type": "char", "chars": CHARS, "chat": extra > 0}
        save_pretrained(model, d / name, task="lm", tokenizer=spec)
    marker_checkpoint(d / "markers")
    models = [d / "chat", d / "plain", d / "markers"]
    playground = Playground(models, "cpu", "float32", max_tokens=64, rows=8)
    httpd = Server(playground, "127.0.0.1", 0, quiet=True)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    while not httpd.started:
        time.sleep(0.01)
    yield f"127.0.0.1:{httpd.port}", d / "chat"
    httpd.stop()
    thread.join()


@pytest.fixture(scope="module")
def client(server):
    return OpenAI(base_url=f"http://{server[0]}/v1", api_key="unused")


def engine_replies(out_dir, messages, n, seed, max_tokens, ends=end_tokens, **options):
    """[(text, finish reason)] of the engine's decode of messages rendered up to the assistant's
    marker, choice i drawing from a generator seeded seed + i, as /v1/completions draws, ending
    at ends(tokenizer); the tokens of the prompt and of the replies."""
    model, tokenizer, _ = load_gpt(str(out_dir), "cpu")
    ids, _ = tokenizer.render(messages, reply=True)
    picks = decoding.make_rules(decoding.Options(**options), False, seed, n, tokenizer.vocab_size)
    engine = Engine(model, n)
    request = engine.submit(ids, picks, max_tokens, ends(tokenizer))
    while engine.busy():
        engine.step()
    rows = request.rows
    texts = [(tokenizer.decode(r.generated), "stop" if r.ended else "length") for r in rows]
    return texts, len(ids), sum(len(r.generated) for r in rows)


def replies(answer):
    return [(c.message.content, c.finish_reason) for c in answer.choices]


def test_replies_are_the_engines_decode_of_the_rendered_conversation(client, server):
    """n sampled replies: each the engine's, those that drew <|end|> stopped there ("stop"),
    the rest at max_tokens ("length"); the same seed gives them again; usage counts the
    template's tokens and the replies'."""
    asked = dict(model="chat", messages=MESSAGES, n=6, seed=7, max_tokens=24, **SAMPLING)
    answer = client.chat.completions.create(**asked, extra_body={"top_k": 12})
    expected, prompt_tokens, tokens = engine_replies(
        server[1], MESSAGES, 6, 7, 24, top_k=12, **SAMPLING
    )
    assert replies(answer) == expected
    assert {reason for _, reason in expected} == {"stop", "length"}
    assert len({text for text, _ in expected}) == 6
    assert answer.object == "chat.completion" and answer.id.startswith("chatcmpl-")
    assert [c.message.role for c in answer.choices] == ["assistant"] * 6
    usage = answer.usage
    assert usage.prompt_tokens == prompt_tokens == 1 + 9 + 1 + 1 + 9 + 1 + 1
    assert usage.completion_tokens == tokens
    again = client.chat.completions.create(**asked, extra_body={"top_k": 12})
    assert replies(again) == expected


def test_the_stream_adds_up_to_the_whole_answer(client, server):
    """A role chunk per choice first, then content deltas, then each finish reason on a chunk
    of its own, the usage last, then data: [DONE]."""
    asked = dict(model="chat", messages=MESSAGES, n=3, seed=3, max_tokens=20, **SAMPLING)
    whole = client.chat.completions.create(**asked)
    chunks = list(
        client.chat.completions.create(**asked, stream=True, stream_options={"include_usage": True})
    )
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage
    choices = [(chunk.object, chunk.choices[0]) for chunk in chunks[:-1]]
    assert {kind for kind, _ in choices} == {"chat.completion.chunk"}
    assert [c.delta.role for _, c in choices[:3]] == ["assistant"] * 3
    for i, reply in enumerate(whole.choices):
        mine = [c for _, c in choices if c.index == i]
        assert "".join(c.delta.content or "" for c in mine) == reply.message.content
        assert len(mine) > 3  # token by token, not one block
        assert [c.finish_reason for c in mine] == [None] * (len(mine) - 1) + [reply.finish_reason]
        assert mine[-1].delta.content is None
    events = raw_stream(server[0], {**asked, "stream": True})
    assert events[-1] == "[DONE]" and len(events) > 10


def raw_stream(address, body):
    """The data lines of a streamed chat completion."""
    connection = http.client.HTTPConnection(address, timeout=60)
    headers = {"Content-Type": "application/json"}
    connection.request("POST", "/v1/chat/completions", json.dumps(body), headers)
    text = connection.getresponse().read().decode()
    connection.close()
    return [line[6:] for line in text.split("\n\n") if line.startswith("data: ")]


def test_a_stop_string_cuts_the_replies_and_their_usage(client):
    """Each reply cut before a stop string found in the first, finish_reason "stop" where it
    was cut, the usage the tokens kept (a character each); a content of text parts is their
    joined text."""
    asked = dict(model="chat", messages=MESSAGES, n=6, seed=7, max_tokens=24, **SAMPLING)
    whole = replies(client.chat.completions.create(**asked))
    stop = whole[0][0][10:12]
    answer = client.chat.completions.create(**asked, stop=[stop, "zz"])
    cut = []
    for text, reason in whole:
        cut.append((text[: text.index(stop)], "stop") if stop in text else (text, reason))
    assert replies(answer) == cut and len(cut[0][0]) <= 10
    assert answer.usage.completion_tokens == sum(len(text) for text, _ in cut)
    parts = [{"type": "text", "text": "abc"}, {"type": "text", "text": ": head"}]
    split = [MESSAGES[0], {"role": "user", "content": parts}]
    assert replies(client.chat.completions.create(**{**asked, "messages": split})) == whole


def test_a_typed_marker_is_plain_text(client, server):
    """ "<|user|>" typed in a message is its 8 characters, not the user's marker."""
    messages = [{"role": "user", "content": "<|user|>"}]
    answer = client.chat.completions.create(
        model="chat", messages=messages, temperature=0, max_completion_tokens=8
    )
    expected, prompt_tokens, _ = engine_replies(server[1], messages, 1, 0, 8, temperature=0)
    assert replies(answer) == expected
    assert answer.usage.prompt_tokens == prompt_tokens == 1 + 8 + 1 + 1


def fits(messages, room):
    """The conversation with its oldest turns after the system prompt dropped until its
    prompt (each message its marker, characters and end; then the assistant's marker) and
    room more tokens fit block_size 64, never starting at a reply: (it, how many left)."""
    for dropped in range(len(messages) - 1):
        kept = messages[:1] + messages[1 + dropped :]
        tokens = sum(len(m["content"]) + 2 for m in kept) + 1
        if tokens + room <= 64 and kept[1]["role"] == "user":
            return kept, dropped
    raise AssertionError("the last message alone does not fit")


def test_drop_oldest_replies_to_the_turns_that_fit_and_counts_the_rest(client):
    """Past block_size beside a reply of max_tokens, drop_oldest leaves out the oldest turns
    after the system prompt: the reply is the one to the rest, dropped_messages counts them;
    without it, the answer has no such field."""
    turns = [{"role": r, "content": "abc: head"} for r in ("user", "assistant") * 2]
    messages = [MESSAGES[0], *turns, MESSAGES[1]]  # 67 tokens
    asked = dict(model="chat", temperature=0, max_tokens=12)
    answer = client.chat.completions.create(
        messages=messages, extra_body={"drop_oldest": True}, **asked
    )
    kept, dropped = fits(messages, 12)
    alone = client.chat.completions.create(messages=kept, **asked)
    assert (answer.dropped_messages, dropped) == (2, 2)
    assert replies(answer) == replies(alone) and "dropped_messages" not in alone.model_extra


def turn_end(tokenizer):
    return [tokenizer.end_token]


def test_a_role_marker_drawn_mid_reply_ends_it(client, server):
    """An undertrained chat model draws role markers inside its replies: each reply ends at the
    first ("stop"), as at <|end|>, never holding a marker's text, whose characters this model
    lacks; sent back as the assistant's turn, a reply is accepted."""
    asked = dict(model="markers", messages=MESSAGES[1:], n=8, seed=1, temperature=1.5)
    answer = replies(client.chat.completions.create(**asked, max_tokens=30))
    folder = server[1].parent / "markers"
    drawn, _, _ = engine_replies(folder, MESSAGES[1:], 8, 1, 30, turn_end, temperature=1.5)
    cut = []
    for text, reason in drawn:
        marker = MARKER.search(text)
        cut.append((text[: marker.start()], "stop") if marker else (text, reason))
    assert answer == cut
    assert sum(bool(MARKER.search(text)) for text, _ in drawn) >= 4
    # a reply that a marker cut after some text
    reply = next(text for (text, _), (whole, _) in zip(answer, drawn) if text and whole != text)
    history = [*MESSAGES[1:], {"role": "assistant", "content": reply}, *MESSAGES[1:]]
    again = client.chat.completions.create(**{**asked, "messages": history}, max_tokens=8)
    assert len(again.choices) == 8


@pytest.mark.parametrize("ignore_eos", [False, True])
def test_a_completions_text_is_its_logprobs_tokens(client, ignore_eos):
    """/v1/completions on that model: a special token ends a choice ("stop"), as OpenAI's end
    of text does, so neither its text nor its logprobs hold it; with ignore_eos its name is in
    both; the stop "r" cuts the text after a marker, never the marker's name."""
    answer = client.completions.create(
        model="markers",
        prompt="abc",
        n=8,
        seed=1,
        temperature=1.5,
        max_tokens=30,
        logprobs=0,
        stop=["r"],
        extra_body={"ignore_eos": ignore_eos},
    )
    for choice in answer.choices:
        tokens = choice.logprobs.tokens if choice.logprobs else []
        assert choice.text == "".join(tokens), choice
    held = [bool(MARKER.search(choice.text)) for choice in answer.choices]
    assert sum(held) >= 4 if ignore_eos else not any(held)


def user(content):
    return {"model": "chat", "messages": [{"role": "user", "content": content}]}


# (body, the field the error names, words of its message)
BAD = [
    ({**user("abc"), "model": "plain"}, "model", NO_CHAT),
    ({"model": "chat", "messages": [{"role": "robot", "content": "a"}]}, "messages", "'robot'"),
    (user([{"type": "image_url", "image_url": {"url": "x"}}]), "messages", "'image_url'"),
    (user([{"type": "text", "text": 3}]), "messages", "'text' must be a string"),
    (user(3), "messages", "content is int"),
    (user("a" * 62), "messages", "65 tokens in the chat template, past this model's block_size"),
    (user("xyz"), "messages", "not in this model's vocabulary"),
    (user("a\ud800"), "messages", "lone surrogate"),
    ({"model": "chat", "messages": []}, "messages", "non-empty list"),
    ({"model": "chat"}, "messages", "Field required"),
    ({**user("a"), "max_tokens": 2, "max_completion_tokens": 2}, "max_completion_tokens", "both"),
    ({**user("a"), "max_completion_tokens": 65}, "max_completion_tokens", "at most 64"),
    ({**user("a"), "n": 9}, "n", "at most 8"),
    ({**user("a"), "temperature": -1}, "temperature", ""),
    ({**user("a"), "logprobs": True}, "logprobs", "Extra inputs"),
]


@pytest.mark.parametrize("body, param, words", BAD, ids=[f"{i}-{b[1]}" for i, b in enumerate(BAD)])
def test_bad_chat_requests_get_a_400_naming_the_field(server, body, param, words):
    connection = http.client.HTTPConnection(server[0], timeout=60)
    headers = {"Content-Type": "application/json"}
    connection.request("POST", "/v1/chat/completions", json.dumps(body), headers)
    response = connection.getresponse()
    error = json.loads(response.read())["error"]
    connection.close()
    assert (response.status, error["param"]) == (400, param), error
    assert words in error["message"] and "\n" not in error["message"], error


@pytest.mark.skipif(
    find() is None, reason="no Chromium here (Debian's chromium package; .ci/run installs it)"
)
def test_the_chat_section_streams_replies_to_the_conversation(server, client, tmp_path):
    """Two turns under a system prompt: each reply the API's to the conversation so far, with
    the page's decoding options; Clear empties it; a model without chat tokens is said so."""
    browser = Browser(find(), str(tmp_path / "profile"))
    options = dict(max_tokens=12, seed=5, temperature=0.8, extra_body={"top_k": 200})
    messages = [{"role": "system", "content": "be a dad."}]
    try:
        browser.goto(f"http://{server[0]}/")
        browser.wait("document.body.dataset.ready")
        browser.js('document.getElementById("max_tokens").value = "12";')
        browser.js('document.getElementById("seed").value = "5";')
        browser.js('document.getElementById("system").value = "be a dad.";')
        for text in ("abc: head", "bad"):
            browser.js(f"""document.getElementById("message").value = {json.dumps(text)};
                           document.getElementById("send").click()""")
            state = 'document.body.dataset.chat !== "running" && document.body.dataset.chat'
            assert browser.wait(state) == "done", browser.js(
                'document.getElementById("chat-error").textContent'
            )
            messages.append({"role": "user", "content": text})
            answer = client.chat.completions.create(model="chat", messages=messages, **options)
            reply = answer.choices[0].message.content
            messages.append({"role": "assistant", "content": reply})
            browser.js('document.body.dataset.chat = ""')
        turns = browser.js(
            '[...document.querySelectorAll("#conversation .turn")].map((t) => t.textContent)'
        )
        assert turns == [m["content"] for m in messages[1:]]
        browser.js('document.getElementById("clear").click()')
        assert browser.js('document.querySelectorAll("#conversation .turn").length') == 0
        assert browser.js('document.getElementById("chat-note").textContent') == ""
        browser.js("""const select = document.getElementById("chat-model");
                      select.value = "plain"; select.dispatchEvent(new Event("change"))""")
        assert browser.js('document.getElementById("chat-note").textContent') == NO_CHAT
        assert browser.js('document.getElementById("send").disabled')
    finally:
        browser.close()


@pytest.mark.skipif(
    find() is None, reason="no Chromium here (Debian's chromium package; .ci/run installs it)"
)
def test_the_chat_section_drops_the_oldest_turns_and_says_so(server, client, tmp_path):
    """Five turns with block_size 64: once the conversation and room for a reply of max_tokens
    outgrow it, each reply is the API's to the system prompt and the turns that fit; the
    turns left out are faded, and a note says so."""
    browser = Browser(find(), str(tmp_path / "profile"))
    options = dict(max_tokens=12, seed=5, temperature=0.8, extra_body={"top_k": 200})
    messages = [{"role": "system", "content": "be a dad."}]
    seen = []
    try:
        browser.goto(f"http://{server[0]}/")
        browser.wait("document.body.dataset.ready")
        browser.js('document.getElementById("max_tokens").value = "12";')
        browser.js('document.getElementById("seed").value = "5";')
        browser.js('document.getElementById("system").value = "be a dad.";')
        for text in ("abc: head", "bad", "a ruse", "cab: a cab", "he sees"):
            browser.js(f"""document.getElementById("message").value = {json.dumps(text)};
                           document.getElementById("send").click()""")
            state = 'document.body.dataset.chat !== "running" && document.body.dataset.chat'
            assert browser.wait(state) == "done", browser.js(
                'document.getElementById("chat-error").textContent'
            )
            messages.append({"role": "user", "content": text})
            kept, dropped = fits(messages, 12)
            answer = client.chat.completions.create(model="chat", messages=kept, **options)
            messages.append({"role": "assistant", "content": answer.choices[0].message.content})
            faded = browser.js('document.querySelectorAll("#conversation .turn.dropped").length')
            assert faded == dropped
            shown = browser.js('document.getElementById("chat").innerText')  # what one sees
            assert (f"the oldest {dropped} messages (faded)" in shown) == (dropped > 0)
            seen.append(dropped)
            browser.js('document.body.dataset.chat = ""')
        turns = browser.js(
            '[...document.querySelectorAll("#conversation .turn")].map((t) => t.textContent)'
        )
        assert turns == [m["content"] for m in messages[1:]]
        assert seen[0] == 0 and seen[-1] >= 4  # the conversation went on past the context
        browser.js('document.getElementById("clear").click()')
        assert "(faded)" not in browser.js('document.getElementById("chat").innerText')
    finally:
        browser.close()
