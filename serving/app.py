"""The app: FastAPI's routes over a Playground (the page, the API), its errors as OpenAI's, the
guard in front, a completion or chat completion streamed or answered whole (its decoding stopped
when the client leaves), and uvicorn's server on a socket bound first."""

import asyncio
import os

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException
from starlette.middleware.cors import CORSMiddleware

from serving.chat import ChatRequest, chat_completion
from serving.protocol import (
    ClassifyRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
    http_error,
    invalid,
    refused,
    server_error,
)
from serving.transport import (
    DEADLINE,
    MAX_CONNECTIONS,
    Guard,
    Protocol,
    RequestError,
    host_names,
    listen,
)

PAGE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "serve.html")


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
        return await respond(playground.completion(body, deadline), request)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatRequest, request: Request):
        return await respond(chat_completion(playground, body, deadline), request)

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
        _, served = playground.pick_model(model, "lm")
        tokenizer = served["tokenizer"]
        return {
            "tokenizer_class": type(tokenizer).__name__,
            "eos_token": tokenizer.decode([tokenizer.start_token]),
            "model_max_length": served["model"].config.block_size,
        }

    @app.post("/tokenize")
    def tokenize(body: TokenizeRequest):
        _, served = playground.pick_model(body.model, "lm")
        tokens = playground.encode(served["tokenizer"], body.prompt, "prompt")
        block_size = served["model"].config.block_size
        return {"count": len(tokens), "max_model_len": block_size, "tokens": tokens}

    @app.post("/detokenize")
    def detokenize(body: DetokenizeRequest):
        _, served = playground.pick_model(body.model, "lm")
        tokens = playground.check_ids(served["tokenizer"], body.tokens, "tokens")
        return {"prompt": served["tokenizer"].decode(tokens)}

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


async def respond(completion, request):
    """A completion (or chat completion) submitted, then streamed or answered whole."""
    await completion.start()
    if completion.req.stream:
        return EventStream(completion)
    try:  # a client that leaves stops its decoding
        answer = await unless_gone(completion.answer(), request.receive)
        return JSONResponse(answer)  # plain JSON already: no jsonable_encoder walk
    finally:
        completion.close()


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
