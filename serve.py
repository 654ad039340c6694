"""
A playground in the browser over this project's checkpoints, and the small JSON API behind it: type
a prompt and watch a GPT decode, with each token's candidates before and after every decoding
filter; type a headline and see the classifier's probabilities and every attention head.
  python serve.py --out_dir=out-shakespeare-char --out_dir=out-agnews
      then open http://127.0.0.1:8000
  GET  /v1/models        the loaded checkpoints
  POST /v1/completions   OpenAI's fields (prompt, max_tokens, temperature, top_p, n, stop,
                         frequency_penalty, presence_penalty, seed, stream as server-sent events)
                         and this project's (top_k, repetition_penalty, no_repeat_ngram_size;
                         trace: the top candidates at every filter)
  POST /v1/classify      {"input": a text or a list of texts, "attention": true for one text's
                         every head}
Checkpoints load and decode through sample.py's and classify.py's own functions. Model calls run one
at a time (a decoding step of one request, then one of another), so streams interleave; a stream
whose client goes away stops.
Bad input gets a 4xx and one JSON line naming the field: {"error": {"message", "type", "param"}}.
"""

import argparse
import dataclasses
import json
import os
import secrets
import sys
import threading
import time
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import torch

import classify
import decoding
import sample
from engine import WEIGHTS, Engine, for_decoding
from lib.common import (
    ArgumentParser,
    Error,
    at_least,
    pick_device,
    read_json,
    run_script,
)

PAGE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "serve.html")
MAX_BODY = 1 << 16  # bytes of one request's JSON
MAX_TEXTS = 64  # texts in one classify request
MAX_TRACE = 20  # candidates per filter in a trace
MAX_ACTIVE = 16  # requests in flight at once; more get a 503
MAX_ROWS = 32  # a GPT's KV cache rows: the most choices decoding at once (more wait their turn)
# a field's accepted types and default; null means the default, as in OpenAI's API
COMPLETION = dict(
    model=((str,), None),
    prompt=((str,), ""),
    max_tokens=((int,), 16),
    n=((int,), 1),
    stop=((str, list), None),
    seed=((int,), None),
    stream=((bool,), False),
    trace=((int,), 0),
)
# and every decoding option, off by default (OpenAI's defaults), its range checked by decoding
for option in dataclasses.fields(decoding.Options):
    COMPLETION[option.name] = ((int, float) if option.type is float else (int,), option.default)
CLASSIFY = dict(model=((str,), None), input=((str, list), None), attention=((bool,), False))


class RequestError(Exception):
    """A request the server refuses: (HTTP status, message, the field it names or None)."""

    def __init__(self, status, message, param=None):
        super().__init__(message)
        self.status, self.param = status, param

    def body(self):
        """OpenAI's error object."""
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {"error": {"message": str(self), "type": kind, "param": self.param}}


def fields(body, table):
    """A request's JSON object checked against table: unknown fields, wrong types ->
    RequestError naming the field."""
    if not isinstance(body, dict):
        raise RequestError(400, "the body must be a JSON object")
    for name, value in body.items():
        # null means not given, as OpenAI's clients send it
        if name not in table and value is not None:
            raise RequestError(400, f"unknown field {name!r} (fields: {', '.join(table)})", name)
    out = {}
    for name, (types, default) in table.items():
        value = body.get(name)
        if value is None:
            value = default
        elif type(value) not in types:  # type(), not isinstance(): true is not a number
            raise RequestError(
                400,
                f"{name} must be {' or '.join(t.__name__ for t in types)}, got {value!r:.40}",
                name,
            )
        # an int past a float's range; decoding works in floats
        elif float in types and abs(value) > 1e300:
            raise RequestError(400, f"{name} must be a finite number, got {value!r:.40}", name)
        out[name] = value
    return out


class Playground:
    """The loaded checkpoints, what bounds a request, and the lock that runs one model call
    at a time."""

    def __init__(
        self,
        out_dirs,
        device="cpu",
        weights="auto",
        max_tokens=256,
        max_n=8,
        max_active=MAX_ACTIVE,
        rows=MAX_ROWS,
    ):
        self.device = pick_device(device)
        self.models = {}
        self.max_tokens = max_tokens
        self.max_n = min(max_n, rows)
        self.rows = rows
        # the classifiers' calls, one at a time (a GPT's run in its decoder's thread)
        self.lock = threading.Lock()
        self.slots = threading.BoundedSemaphore(max_active)
        self.tokens_generated = 0  # every request's, for the tests and the load benchmark
        for out_dir in out_dirs:
            name = os.path.basename(os.path.abspath(out_dir))
            if name in self.models:
                raise Error(f"two checkpoints named {name!r}: serve folders with different names")
            self.models[name] = self.load(out_dir, weights)

    def load(self, out_dir, weights):
        """A checkpoint through sample.py's load (a GPT) or classify.py's (a classifier),
        by its config.json."""
        info = read_json(os.path.join(out_dir, "config.json"), "checkpoint config")
        # anything but a classifier's goes to sample.py's load, whose checks name what is wrong
        classifier = isinstance(info, dict) and info.get("architecture") == "EncoderClassifier"
        if classifier:
            model, tokenizer, names, max_len = classify.load(out_dir, self.device)
            return dict(
                task="classify", model=model, tokenizer=tokenizer, labels=names, max_length=max_len
            )
        model, tokenizer, _ = sample.load(out_dir, self.device)
        model = for_decoding(model, self.device, weights)
        decoder = Decoder(Engine(model, self.rows))
        return dict(task="lm", model=model, tokenizer=tokenizer, decoder=decoder)

    def describe(self):
        """GET /v1/models: OpenAI's list, each entry with what the page needs to draw it."""
        return {
            "object": "list",
            "data": [
                {
                    "id": name,
                    "object": "model",
                    "owned_by": "gpt-starter",
                    "task": m["task"],
                    "labels": m.get("labels"),
                    **{
                        k: getattr(m["model"].config, k)
                        for k in ("block_size", "n_layer", "n_head", "n_embd")
                    },
                }
                for name, m in self.models.items()
            ],
        }

    @staticmethod
    def decoding_options():
        """GET /v1/options: every decoding option as decoding.Options declares it (its type, off
        value, range and help), from which the page builds its form."""
        data = []
        for f in dataclasses.fields(decoding.Options):
            data.append(
                {"name": f.name, "type": f.type.__name__, "default": f.default, **f.metadata}
            )
        return {"object": "list", "data": data}

    def pick_model(self, name, task):
        """The checkpoint a request names (or the only one of its task),
        checked to be of that task."""
        of_task = [n for n, m in self.models.items() if m["task"] == task]
        if name is None:
            if len(of_task) != 1:
                raise RequestError(
                    400, f"name the model: one of {', '.join(of_task) or 'none loaded'}", "model"
                )
            name = of_task[0]
        if name not in self.models:
            raise RequestError(
                404, f"no model {name!r}: the server has {', '.join(self.models)}", "model"
            )
        if self.models[name]["task"] != task:
            other = "/v1/classify" if task == "lm" else "/v1/completions"
            raise RequestError(
                400, f"model {name!r} is a {self.models[name]['task']} model: use {other}", "model"
            )
        return name, self.models[name]

    # ---------------------------------------------------------------------------------- completions
    def completion(self, body):
        """A checked completion request -> a job: req (the fields), head (the response's fixed
        fields), prompt_tokens, counts (tokens generated per choice, so far) and events, an iterator
        over the decoding steps, not yet begun."""
        req = fields(body, COMPLETION)
        name, m = self.pick_model(req["model"], "lm")
        block_size, tokenizer = m["model"].config.block_size, m["tokenizer"]
        limits = [
            ("max_tokens", 1, self.max_tokens),
            ("n", 1, self.max_n),
            ("trace", 0, MAX_TRACE),
        ]
        for field, low, high in limits:
            if not low <= req[field] <= high:
                raise RequestError(
                    400, f"{field} must be in [{low}, {high}], got {req[field]}", field
                )
        stops = [req["stop"]] if isinstance(req["stop"], str) else req["stop"] or []
        if len(stops) > 4 or not all(isinstance(s, str) and s for s in stops):
            raise RequestError(
                400, "stop must be a non-empty string or a list of at most 4 of them", "stop"
            )
        try:
            prompt = tokenizer.encode(req["prompt"]) if req["prompt"] else [tokenizer.start_token]
        except Error as e:  # a character a char model never saw
            raise RequestError(400, f"prompt: {e}", "prompt") from None
        if len(prompt) > block_size:
            raise RequestError(
                400,
                f"prompt is {len(prompt)} tokens, past this model's block_size {block_size}",
                "prompt",
            )
        seed = secrets.randbits(63) if req["seed"] is None else req["seed"]
        names = [option.name for option in dataclasses.fields(decoding.Options)]
        try:
            options = decoding.Options(**{name: req[name] for name in names})
        except Error as e:  # its messages begin with the option's name
            raise RequestError(400, str(e), str(e).split()[0]) from None
        try:  # generators of the request's own: a choice draws as it would alone
            picks = sample.make_picks(options, False, seed, req["n"], tokenizer.vocab_size)
        except (RuntimeError, ValueError, OverflowError) as e:  # past the 64 bits a generator takes
            raise RequestError(400, f"seed: {e}", "seed") from None
        traces = [[] for _ in picks]
        if req["trace"]:
            picks = [traced(pick, req["trace"], tokenizer, t) for pick, t in zip(picks, traces)]
        head = {
            "id": f"cmpl-{secrets.token_hex(12)}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": name,
        }
        counts = [0] * req["n"]
        decoder = m["decoder"]
        request = decoder.submit(prompt, picks, req["max_tokens"])
        events = self.events(decoder, request, tokenizer, stops, counts, traces)
        return dict(req=req, head=head, prompt_tokens=len(prompt), counts=counts, events=events)

    def events(self, decoder, request, tokenizer, stops, counts, traces):
        """Per generated token of each choice, what it adds: (its index, its printable new text:
        never half a character nor a tail that may start a stop string, its finish reason once
        it ends: "stop", or "length" at max_tokens, the trace of its new token or None). The
        request's rows stop decoding when this generator is closed (the client gone)."""
        n = len(request.rows)
        shown = [0] * n
        finished = [False] * n
        texts = [""] * n
        try:
            for _ in decoder.progress(request):
                events = []
                for i, row in enumerate(request.rows):
                    generated = row.generated
                    while not finished[i] and counts[i] < len(generated):
                        counts[i] += 1
                        self.tokens_generated += 1
                        texts[i] = tokenizer.decode(generated[: counts[i]])
                        cut = sample.first_stop(texts[i], stops)
                        if cut >= 0:
                            texts[i] = texts[i][:cut]
                            finished[i] = True
                            row.finish()
                        out = texts[i] if finished[i] else sample.printable(texts[i], stops)
                        trace = traces[i][counts[i] - 1] if traces[i] else None
                        reason = "stop" if finished[i] else None
                        events.append((i, out[shown[i] :], reason, trace))
                        shown[i] = max(shown[i], len(out))
                yield events
                for row in request.rows:
                    if row.error:  # no token left to draw: the message names the option
                        raise RequestError(400, row.error, row.error.split()[0])
        finally:
            request.finish()
        ends = []
        for i in range(n):
            if not finished[i]:
                ends.append((i, texts[i][shown[i] :], "length", None))
        yield ends

    # ------------------------------------------------------------------------------------- classify
    def classify(self, body):
        """POST /v1/classify: the probabilities classify.py gives (its predict, the same batches),
        and with attention one text's tokens and maps [layer][head][query][key]."""
        req = fields(body, CLASSIFY)
        name, m = self.pick_model(req["model"], "classify")
        texts = [req["input"]] if isinstance(req["input"], str) else req["input"]
        if (
            texts is None
            or not texts
            or len(texts) > MAX_TEXTS
            or not all(isinstance(t, str) and t.strip() for t in texts)
        ):
            raise RequestError(
                400,
                f"input must be a non-blank text or a list of 1 to {MAX_TEXTS} of them",
                "input",
            )
        if req["attention"] and len(texts) != 1:
            raise RequestError(
                400,
                "attention maps are drawn for one text: send input as a single text",
                "attention",
            )
        try:
            rows = [row[: m["max_length"]] for row in m["tokenizer"].encode_batch(texts)]
        except Error as e:  # a character a char model never saw
            raise RequestError(400, f"input: {e}", "input") from None
        with self.lock:  # float32, as classify.py runs
            probs = classify.predict(m["model"], rows, 64, self.device).tolist()
            maps = (
                classify.attention_maps(m["model"], rows[0], self.device)[1]
                if req["attention"]
                else None
            )
        data = []
        for i, p in enumerate(probs):
            best = max(range(len(p)), key=p.__getitem__)
            data.append(
                {
                    "index": i,
                    "label": m["labels"][best],
                    "label_id": best,
                    "probs": dict(zip(m["labels"], p)),
                }
            )
        if maps is not None:
            data[0]["tokens"] = [m["tokenizer"].decode([t]) for t in rows[0]]
            data[0]["attention"] = [
                [[[round(w, 5) for w in q] for q in head] for head in layer.tolist()]
                for layer in maps
            ]
        return {"object": "list", "model": name, "data": data}


def traced(pick, top, tokenizer, trace):
    """pick, recording each token it draws in trace: the token and the top candidates (token, id,
    probability) of the raw logits and after each filter that runs."""

    def next_token(logits, context):
        token = pick(logits, context)
        t = int(token)
        entry = {"id": t, "token": tokenizer.decode([t]), "stages": []}
        for name, x in pick.stages(logits, context):
            p = torch.softmax(x[0].float(), -1)
            values, ids = p.topk(min(top, p.numel()))
            top_tokens = []
            for v, j in zip(values.tolist(), ids.tolist()):
                top_tokens.append([tokenizer.decode([j]), j, round(v, 6)])
            stage = {"name": name, "chosen": round(p[t].item(), 6), "top": top_tokens}
            entry["stages"].append(stage)
        trace.append(entry)
        return token

    return next_token


class Decoder:
    """A GPT's Engine, stepped by a thread of its own while it has work: every request's rows share
    each model step (continuous batching), and a request's consumer wakes after each step."""

    def __init__(self, engine):
        self.engine = engine
        self.changed = threading.Condition()
        self.steps = 0
        threading.Thread(target=self.run, daemon=True, name="decoder").start()

    def submit(self, prompt, picks, max_new_tokens):
        request = self.engine.submit(prompt, picks, max_new_tokens)  # a deque: thread-safe
        with self.changed:
            self.changed.notify_all()
        return request

    def run(self):
        """Steps while there is work, outside the lock: the consumers turn the last step's tokens
        into text while the model computes the next (torch's kernels release the GIL)."""
        while True:
            with self.changed:
                while not self.engine.busy():
                    self.changed.wait()
            try:
                self.engine.step()
            except Exception as e:  # a bug: every request in flight ends with it
                traceback.print_exc()
                self.engine.fail(f"{type(e).__name__}: {e}")
            with self.changed:
                self.steps += 1
                self.changed.notify_all()

    def progress(self, request):
        """Yields after each step of the engine, until request is done."""
        seen = 0
        while True:
            with self.changed:
                while self.steps == seen and not request.done:
                    self.changed.wait()
                seen = self.steps
            yield
            if request.done:
                return


class Handler(BaseHTTPRequestHandler):
    server_version = "gpt-starter-playground"
    playground = None  # set by make_server
    quiet = False
    # seconds a client may take to send its request or to read the next event:
    # then it counts as gone
    timeout = 30

    def log_message(self, format, *args):
        if not self.quiet:
            super().log_message(format, *args)

    def send(self, status, body, content_type="application/json"):
        data = body if isinstance(body, bytes) else (json.dumps(body) + "\n").encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def fail(self, e):
        self.send(e.status, e.body())

    def do_GET(self):
        if self.path in ("/", "/index.html"):
            with open(PAGE, "rb") as f:
                self.send(200, f.read(), "text/html; charset=utf-8")
        elif self.path == "/v1/models":
            self.send(200, self.playground.describe())
        elif self.path == "/v1/options":
            self.send(200, self.playground.decoding_options())
        else:
            self.fail(RequestError(404, f"no page {self.path}: try /, /v1/models or /v1/options"))

    def do_POST(self):
        routes = {"/v1/completions": self.complete, "/v1/classify": self.classify}
        try:
            if self.path not in routes:
                raise RequestError(
                    404, f"no endpoint {self.path}: POST /v1/completions or /v1/classify"
                )
            routes[self.path](self.body())
        except RequestError as e:
            self.fail(e)
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            self.close_connection = True  # the client went away, or stopped reading
        except Exception as e:  # a bug: report it, keep serving
            traceback.print_exc()
            self.fail(RequestError(500, f"{type(e).__name__}: {e}"))

    def body(self):
        """The request's JSON, bounded in size."""
        length = self.headers.get("Content-Length")
        if length is None or not length.isdigit():
            raise RequestError(411, "send a Content-Length header with the JSON body")
        if int(length) > MAX_BODY:
            self.close_connection = True
            # read, so that the client reads the answer, up to 1 MiB
            self.rfile.read(min(int(length), 16 * MAX_BODY))
            raise RequestError(413, f"the body is {length} bytes, more than {MAX_BODY}")
        try:
            return json.loads(self.rfile.read(int(length)))
        # not UTF-8, not JSON, nested past Python's depth, 4300+ digits
        except (ValueError, RecursionError) as e:
            raise RequestError(
                400, f"the body is not JSON that can be read ({type(e).__name__})"
            ) from None

    def classify(self, body):
        self.send(200, self.playground.classify(body))

    def complete(self, body):
        playground = self.playground
        job = playground.completion(body)
        if not playground.slots.acquire(blocking=False):
            raise RequestError(503, "the server is busy with other requests: try again shortly")
        try:
            if job["req"]["stream"]:
                self.stream(job["head"], job["events"])
                return
            choices = [
                {"text": "", "index": i, "logprobs": None, "finish_reason": None}
                for i in range(len(job["counts"]))
            ]
            for step in job["events"]:
                for i, text, finish, trace in step:
                    choices[i]["text"] += text
                    choices[i]["finish_reason"] = finish or choices[i]["finish_reason"]
                    if trace:
                        choices[i].setdefault("trace", []).append(trace)

            generated = sum(job["counts"])
            usage = {
                "prompt_tokens": job["prompt_tokens"],
                "completion_tokens": generated,
                "total_tokens": job["prompt_tokens"] + generated,
            }
            self.send(200, {**job["head"], "choices": choices, "usage": usage})
        finally:
            job["events"].close()  # a decoding cut short (the client gone) ends where it stands
            playground.slots.release()

    def stream(self, head, events):
        """Server-sent events, as OpenAI streams: one chunk per choice and step,
        then data: [DONE]."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()
        self.close_connection = True
        try:
            for step in events:
                for i, text, finish, trace in step:
                    if text or finish or trace:
                        choice = {
                            "text": text,
                            "index": i,
                            "logprobs": None,
                            "finish_reason": finish,
                        }
                        chunk = {
                            **head,
                            "choices": [choice | ({"trace": [trace]} if trace else {})],
                        }
                        self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            raise
        # past the headers: the error is the stream's last event, as OpenAI sends it
        except Exception as e:
            if not isinstance(e, RequestError):  # a bug: report it, keep serving
                traceback.print_exc()
                e = RequestError(500, f"{type(e).__name__}: {e}")
            self.wfile.write(f"data: {json.dumps(e.body())}\n\n".encode())
            return
        self.wfile.write(b"data: [DONE]\n\n")


def make_server(playground, host="127.0.0.1", port=8000, quiet=False):
    """An HTTP server over playground, each request in a thread of its own
    (call serve_forever to run it)."""
    handler = type("PlaygroundHandler", (Handler,), {"playground": playground, "quiet": quiet})
    try:
        server = ThreadingHTTPServer((host, port), handler)
    except OSError as e:
        raise Error(f"cannot listen on {host}:{port} ({e.strerror}): pick another --port") from None
    server.daemon_threads = True
    return server


def main(argv=None):
    p = ArgumentParser(
        prog="serve.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--out_dir",
        action="append",
        required=True,
        help="a checkpoint folder written by train.py (a GPT or a classifier); "
        "repeat it to serve several",
    )
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="the address to listen on (default: %(default)s, this machine)",
    )
    p.add_argument(
        "--port", type=at_least(0), default=8000, help="(default: %(default)s; 0: any free port)"
    )
    p.add_argument(
        "--device",
        default="auto",
        help="cpu, cuda, cuda:1, mps, ...; auto: cuda, then mps, then cpu",
    )
    p.add_argument(
        "--weights",
        default="auto",
        choices=WEIGHTS,
        help="the format a GPT's weights decode in, as sample.py's (default: %(default)s)",
    )
    p.add_argument(
        "--max_rows",
        type=at_least(1),
        default=MAX_ROWS,
        help="a GPT's KV cache rows: the most choices decoding at once, in one batch; more wait "
        "their turn (default: %(default)s)",
    )
    p.add_argument(
        "--max_tokens",
        type=at_least(1),
        default=256,
        help="the most tokens a request may ask for (default: %(default)s)",
    )
    p.add_argument(
        "--max_n",
        type=at_least(1),
        default=8,
        help="the most completions a request may ask for (default: %(default)s)",
    )
    a = p.parse_args(argv)
    playground = Playground(a.out_dir, a.device, a.weights, a.max_tokens, a.max_n, rows=a.max_rows)
    server = make_server(playground, a.host, a.port)
    for name, m in playground.models.items():
        print(
            f"loaded {name}: {m['task']}, {m['model'].num_params() / 1e6:.2f}M parameters",
            file=sys.stderr,
        )
    print(
        f"serving on http://{a.host}:{server.server_address[1]} (Ctrl-C stops)",
        file=sys.stderr,
        flush=True,
    )
    try:
        server.serve_forever()
    finally:
        server.server_close()


if __name__ == "__main__":
    run_script(main, "serve.py")
