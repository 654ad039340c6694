"""
A playground in the browser over this project's checkpoints, and the OpenAI-style API behind it
(FastAPI on uvicorn; its docs at /docs): type a prompt and watch a GPT decode, with each token's
candidates before and after every decoding filter; type a headline and see the classifier's
probabilities and every attention head.
  python serve.py --out_dir=out-shakespeare-char --out_dir=out-agnews
      then open http://127.0.0.1:8000
  GET  /v1/models        the loaded checkpoints
  GET  /v1/options       every decoding option, as decoding.Options declares it
  POST /v1/completions   OpenAI's fields: prompt (a text, token ids, or a list of either),
                         max_tokens, n, stop, seed, stream (server-sent events), stream_options,
                         logprobs, echo, and every decoding option (OpenAI's defaults); vLLM's
                         ignore_eos: on past the end-of-text token; trace: the top candidates at
                         every filter
  POST /v1/classify      {"input": a text or a list of texts, "attention": true for one text's
                         every head}
  GET /tokenizer_info, POST /tokenize, POST /detokenize    vLLM's, which lm-evaluation-harness
                         reads to tokenize as the model does
Checkpoints load and decode through the library sample.py and classify.py use; a GPT's requests
share its engine's batch, step by step. Safe by default: only Host headers that name this server
(a page that rebinds its domain to this address sends its own), POST bodies of application/json
only (what a page of another site cannot send without asking), no Origin but the server's own
unless --allow_origin names it. Bounded: every request has a deadline, connections and requests in
flight have a limit (a 503 past it), a client that leaves stops its decoding.
Bad input gets a 4xx and one JSON line naming the field: {"error": {"message", "type", "param"}}.
"""

import argparse
import asyncio
import contextlib
import dataclasses
import math
import os
import secrets
import sys
import threading

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException
from starlette.middleware.cors import CORSMiddleware

import decoding
from lib import classifier
from lib.common import (
    ArgumentParser,
    Error,
    pick_device,
    read_json,
    run_script,
)
from lib.config import at_least
from lib.formats import WEIGHTS, for_decoding
from lib.transport import (
    DEADLINE,
    MAX_ACTIVE,
    MAX_CONNECTIONS,
    Guard,
    Protocol,
    RequestError,
    Slots,
    exposure,
    host_names,
    listen,
)
from lib.weights import load_gpt
from serving.completions import Completion, check_candidates
from serving.protocol import (
    MAX_TEXTS,
    ClassifyRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
    http_error,
    invalid,
    option_named,
    refused,
    server_error,
)
from serving.scheduler import MAX_ROWS, Decoder, ServingEngine, free_rows

PAGE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "serving", "serve.html")


# ------------------------------------------------------------------------------ the checkpoints
class Playground:
    """The loaded checkpoints and what bounds a request: slots for the requests in flight, and
    the lock that runs one classifier call at a time (a GPT's run in its decoder's thread)."""

    def __init__(
        self,
        out_dirs,
        device="cpu",
        weights="auto",
        max_tokens=256,
        max_n=8,
        max_active=MAX_ACTIVE,
        rows=MAX_ROWS,
        compile=False,
    ):
        self.device = pick_device(device)
        self.compile = compile
        self.models = {}
        self.max_tokens = max_tokens
        self.max_n = min(max_n, rows)
        self.rows = rows
        self.lock = threading.Lock()
        self.completions = Slots(max_active)
        self.classifications = Slots(max_active)
        self.tokens_generated = 0  # every request's, for the tests and the load benchmark
        for out_dir in out_dirs:
            name = os.path.basename(os.path.abspath(out_dir))
            if name in self.models:
                raise Error(f"two checkpoints named {name!r}: serve folders with different names")
            self.models[name] = self.load(out_dir, weights)

    def load(self, out_dir, weights):
        """A checkpoint through the loads sample.py and classify.py use, by its config.json
        (read once for a classifier)."""
        info = read_json(os.path.join(out_dir, "config.json"), "checkpoint config")
        # anything but a classifier's goes to the GPT's load, whose checks name what is wrong
        if isinstance(info, dict) and info.get("architecture") == "EncoderClassifier":
            model, tokenizer, names, max_len = classifier.load(out_dir, self.device, info)
            return dict(
                task="classify",
                model=model,
                tokenizer=tokenizer,
                labels=names,
                max_length=max_len,
                parameters=model.num_params(),
            )
        model, tokenizer, _ = load_gpt(out_dir, self.device)
        # counted before a decoding format holds some weights as buffers
        parameters = model.num_params()
        model = for_decoding(model, self.device, weights)
        try:
            engine = ServingEngine(model, self.rows, tokenizer.vocab_size, self.compile)
        except Error as e:
            raise Error(f"--max_rows {self.rows}: {e}") from None
        decoder = Decoder(engine)
        return dict(
            task="lm", model=model, tokenizer=tokenizer, decoder=decoder, parameters=parameters
        )

    def describe(self):
        """GET /v1/models: OpenAI's list, each entry with what the page needs to draw it."""
        data = []
        for name, m in self.models.items():
            config = m["model"].config
            shape = ("block_size", "n_layer", "n_head", "n_embd")
            data.append(
                {
                    "id": name,
                    "object": "model",
                    "owned_by": "gpt-starter",
                    "task": m["task"],
                    "labels": m.get("labels"),
                    **{k: getattr(config, k) for k in shape},
                    **free_rows(m),
                }
            )
        return {"object": "list", "data": data}

    @staticmethod
    def decoding_options():
        """GET /v1/options: every decoding option as decoding.Options declares it (its type, off
        value, range and help), from which the page builds its form."""
        data = []
        for f in dataclasses.fields(decoding.Options):
            data.append(
                {
                    "name": f.name,
                    "type": f.type.__name__,
                    "default": f.default,
                    # what sample.py and the page start from
                    "sample_default": decoding.SAMPLE_DEFAULTS.get(f.name, f.default),
                    **f.metadata,
                }
            )
        return {"object": "list", "data": data}

    def pick_model(self, name, task):
        """The checkpoint a request names (or the only one of its task),
        checked to be of that task."""
        of_task = [n for n, m in self.models.items() if m["task"] == task]
        if not of_task:
            what = "GPT" if task == "lm" else "classifier"
            raise RequestError(
                400, f"no {what} is loaded; start serve.py with one (--out_dir)", "model"
            )
        if name is None:
            if len(of_task) != 1:
                raise RequestError(400, f"name the model: one of {', '.join(of_task)}", "model")
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
    def completion(self, req, deadline=DEADLINE):
        """A checked completion request -> a Completion, not yet submitted; one that the model's
        measured speed cannot finish within deadline seconds is refused at once."""
        name, m = self.pick_model(req.model, "lm")
        if req.max_tokens == 0 and not req.echo:
            raise RequestError(400, "max_tokens 0 scores the prompt: send echo too", "max_tokens")
        limits = [("max_tokens", self.max_tokens), ("n", self.max_n)]
        for field, high in limits:
            if getattr(req, field) > high:
                got = getattr(req, field)
                raise RequestError(400, f"{field} must be at most {high}, got {got}", field)
        stops = [req.stop] if isinstance(req.stop, str) else req.stop or []
        if len(stops) > 4 or not all(stops):
            raise RequestError(
                400, "stop must be a non-empty string or a list of at most 4 of them", "stop"
            )
        vocab_size = m["tokenizer"].vocab_size
        if req.logprobs is not None and req.logprobs > vocab_size:
            raise RequestError(
                400,
                f"logprobs must be at most {vocab_size}, this model's vocabulary, "
                f"got {req.logprobs}",
                "logprobs",
            )
        prompts = self.prompts(req.prompt, m)
        decoder = m["decoder"]
        steps = decoder.steps_for(len(prompts) * req.n, req.max_tokens)
        prompt_tokens = sum(len(ids) for _, ids in prompts)
        seconds = steps * decoder.step_seconds + prompt_tokens * decoder.token_seconds
        if seconds > deadline:
            raise RequestError(
                503,
                f"this completion takes at least {steps} decoding steps, {seconds:.0f} s at this "
                f"model's speed now, past the {deadline} s deadline: ask for fewer max_tokens, "
                "choices (n) or prompts",
            )
        seed = secrets.randbits(63) if req.seed is None else req.seed
        names = [option.name for option in dataclasses.fields(decoding.Options)]
        try:  # each option's type, finiteness and range, declared there
            options = decoding.Options(**{name: getattr(req, name) for name in names})
        except Error as e:
            raise RequestError(400, str(e), option_named(str(e))) from None
        check_candidates(req, prompts, options)
        return Completion(self, name, m, req, prompts, options, seed, stops)

    def prompts(self, prompt, m):
        """A request's prompt -> [(its text, its token ids)], one per prompt given: a text, a
        list of token ids, or a list of either; an empty text starts from the start token."""
        tokenizer = m["tokenizer"]
        block_size = m["model"].config.block_size
        one = isinstance(prompt, str) or (prompt and isinstance(prompt[0], int))
        given = [prompt] if one else prompt
        if not 1 <= len(given) <= MAX_TEXTS:
            raise RequestError(400, f"prompt: send 1 to {MAX_TEXTS} prompts", "prompt")
        made = []
        for p in given:
            if isinstance(p, str):
                ids = self.encode(tokenizer, p, "prompt") if p else [tokenizer.start_token]
            else:
                ids = self.check_ids(tokenizer, p, "prompt")
            if len(ids) > block_size:
                raise RequestError(
                    400,
                    f"prompt is {len(ids)} tokens, past this model's block_size {block_size}",
                    "prompt",
                )
            text = p if isinstance(p, str) else tokenizer.decode(ids)
            made.append((text, ids))
        return made

    @staticmethod
    def encode(tokenizer, text, field):
        try:
            return tokenizer.encode(text)
        except Error as e:  # a character a char model never saw
            raise RequestError(400, f"{field}: {e}", field) from None

    @staticmethod
    def check_ids(tokenizer, ids, field):
        """Token ids, each checked to be one of the tokenizer's."""
        if not ids:
            raise RequestError(400, f"{field}: a list of token ids must not be empty", field)
        bad = [t for t in ids if not 0 <= t < tokenizer.vocab_size]
        if bad:
            raise RequestError(
                400,
                f"{field}: token id {bad[0]} is not in [0, {tokenizer.vocab_size})",
                field,
            )
        return ids

    # ------------------------------------------------------------------------------------- classify
    def classify(self, req):
        """POST /v1/classify: the probabilities classify.py gives (its predict, the same batches),
        and with attention one text's tokens and maps [layer][head][query][key]."""
        name, m = self.pick_model(req.model, "classify")
        texts = [req.input] if isinstance(req.input, str) else req.input
        if not texts or len(texts) > MAX_TEXTS or not all(t.strip() for t in texts):
            raise RequestError(
                400,
                f"input must be a non-blank text or a list of 1 to {MAX_TEXTS} of them",
                "input",
            )
        if req.attention and len(texts) != 1:
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
            probs = classifier.predict(m["model"], rows, 64, self.device).tolist()
            maps = None
            if req.attention:
                maps = classifier.attention_maps(m["model"], rows[0], self.device)[1]
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
            # a pair the model's pattern masks: null
            data[0]["attention"] = [
                [
                    [[None if math.isnan(w) else round(w, 5) for w in q] for q in head]
                    for head in layer.tolist()
                ]
                for layer in maps
            ]
        return {"object": "list", "model": name, "data": data}


class EventStream(StreamingResponse):
    """A completion's stream, its rows stopped whatever ends it: its last event, the client
    leaving (Starlette cancels the stream) or the deadline."""

    def __init__(self, completion):
        super().__init__(completion.stream(), media_type="text/event-stream")
        self.headers["Cache-Control"] = "no-cache"
        self.completion = completion

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.body_iterator.aclose()
            self.completion.close()


async def until_gone(receive):
    """Returns when the client disconnects (the body was read before)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def unless_gone(work, receive):
    """work's result, or None if the client disconnects first (work is then cancelled)."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(until_gone(receive))
    await asyncio.wait([task, gone], return_when=asyncio.FIRST_COMPLETED)
    gone.cancel()
    if not task.done():
        task.cancel()
        return None
    return task.result()


# ------------------------------------------------------------------------------------ the app
def make_app(playground, names, port, origins=(), deadline=DEADLINE):
    """The FastAPI app over playground: its routes, its errors as OpenAI's, guarded."""
    app = FastAPI(title="gpt-starter playground", docs_url="/docs", redoc_url=None)
    app.add_exception_handler(RequestError, refused)
    app.add_exception_handler(RequestValidationError, invalid)
    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(Exception, server_error)

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    def page():
        with open(PAGE, encoding="utf-8") as f:
            return f.read()

    @app.get("/v1/models")
    def models():
        return playground.describe()

    @app.get("/v1/options")
    def options():
        return playground.decoding_options()

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        completion = playground.completion(body, deadline)
        await completion.start()
        if body.stream:
            return EventStream(completion)
        try:  # a client that leaves stops its decoding
            answer = await unless_gone(completion.answer(), request.receive)
            return JSONResponse(answer)  # plain JSON already: no jsonable_encoder walk
        finally:
            completion.close()

    @app.post("/v1/classify")
    async def classify_texts(body: ClassifyRequest):
        slots = playground.classifications
        await slots.take()
        try:
            return await asyncio.to_thread(playground.classify, body)
        finally:
            slots.give_back()

    @app.get("/tokenizer_info")
    def tokenizer_info(model: str | None = None):
        _, m = playground.pick_model(model, "lm")
        tokenizer = m["tokenizer"]
        return {
            "tokenizer_class": type(tokenizer).__name__,
            "eos_token": tokenizer.decode([tokenizer.start_token]),
            "model_max_length": m["model"].config.block_size,
        }

    @app.post("/tokenize")
    def tokenize(body: TokenizeRequest):
        _, m = playground.pick_model(body.model, "lm")
        tokens = playground.encode(m["tokenizer"], body.prompt, "prompt")
        block_size = m["model"].config.block_size
        return {"count": len(tokens), "max_model_len": block_size, "tokens": tokens}

    @app.post("/detokenize")
    def detokenize(body: DetokenizeRequest):
        _, m = playground.pick_model(body.model, "lm")
        tokens = playground.check_ids(m["tokenizer"], body.tokens, "tokens")
        return {"prompt": m["tokenizer"].decode(tokens)}

    if origins:  # their pages may read the answers (after the preflight a JSON POST needs)
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(origins),
            allow_methods=["GET", "POST"],
            allow_headers=["content-type", "authorization"],
        )
    app.add_middleware(Guard, names=names, port=port, origins=origins, deadline=deadline)
    return app


class Server(uvicorn.Server):
    """uvicorn's server over the playground's app, on a socket bound first (so that port 0 has
    its number before serving)."""

    def __init__(
        self, playground, host="127.0.0.1", port=8000, quiet=False, origins=(), deadline=DEADLINE
    ):
        self.socket = listen(host, port)
        self.port = self.socket.getsockname()[1]
        app = make_app(playground, host_names(host), self.port, origins, deadline)
        config = uvicorn.Config(
            app,
            http=Protocol,
            ws="none",
            lifespan="off",
            limit_concurrency=MAX_CONNECTIONS,
            log_level="warning" if quiet else "info",
            access_log=not quiet,
        )
        config.deadline = deadline  # for Protocol
        super().__init__(config)

    def serve_forever(self):
        self.run(sockets=[self.socket])

    def stop(self):
        self.should_exit = True


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
        help="the address to listen on: 127.0.0.1 or ::1 for this machine only (default: "
        "%(default)s); 0.0.0.0 or :: for every network it is on",
    )
    p.add_argument(
        "--port", type=at_least(0), default=8000, help="(default: %(default)s; 0: any free port)"
    )
    p.add_argument(
        "--allow_origin",
        action="append",
        default=[],
        help="a web page's origin (such as http://localhost:3000) whose scripts may call the API; "
        "repeat it for several",
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
        "--compile",
        action="store_true",
        help="compile a GPT's one-token step at start, as sample.py's --compile",
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
    p.add_argument(
        "--deadline",
        type=at_least(1),
        default=DEADLINE,
        help="seconds a request may take, to its last byte; a stream read slower is cut "
        "(default: %(default)s)",
    )
    a = p.parse_args(argv)
    if a.port > 65535:
        p.error(f"argument --port: must be at most 65535, got {a.port}")
    playground = Playground(
        a.out_dir, a.device, a.weights, a.max_tokens, a.max_n, rows=a.max_rows, compile=a.compile
    )
    server = Server(playground, a.host, a.port, origins=a.allow_origin, deadline=a.deadline)
    for name, m in playground.models.items():
        print(
            f"loaded {name}: {m['task']}, {m['parameters'] / 1e6:.2f}M parameters",
            file=sys.stderr,
        )
    warning = exposure(a.host)
    if warning:
        print(warning, file=sys.stderr)
    shown = f"[{a.host}]" if ":" in a.host else a.host
    print(f"serving on http://{shown}:{server.port} (Ctrl-C stops)", file=sys.stderr, flush=True)
    with contextlib.closing(server.socket):
        server.serve_forever()


if __name__ == "__main__":
    run_script(main, "serve.py")
