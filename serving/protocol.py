"""The API's wire protocol: the request bodies as pydantic models (their fields, types and
bounds), their limits, and every refusal as OpenAI's error object, {"error": {"message", "type",
"param"}}."""

import dataclasses
import re
import traceback

from pydantic import BaseModel, ConfigDict, Field, create_model, model_validator

import decoding
from serving.transport import RequestError

MAX_TEXTS = 64  # texts in one classify request, prompts in one completion request
MAX_TRACE = 20  # candidates per filter in a trace, alternatives per token in logprobs
SURROGATE = re.compile("[\ud800-\udfff]")


# ------------------------------------------------------------------------------- request bodies
class Body(BaseModel):
    """A request's JSON object: unknown fields refused, types strict (true is not a number, "2"
    not an int), null meaning the default, as OpenAI's clients send a field left unset."""

    model_config = ConfigDict(extra="forbid", strict=True)

    @model_validator(mode="before")
    @classmethod
    def null_is_default(cls, data):
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if v is not None}
        return data

    @model_validator(mode="before")
    @classmethod
    def unicode_text(cls, data):
        """A RequestError for a text field holding a lone surrogate ("\\ud800" in JSON): no
        UTF-8 text has one, so it could be neither encoded nor sent back."""
        if not isinstance(data, dict):
            return data
        for name, value in data.items():
            for text in value if isinstance(value, list) else [value]:
                if isinstance(text, str):
                    check_unicode(text, name, name)
        return data


def check_unicode(text, where, field):
    """A 400 naming field where text holds a lone surrogate ("\\ud800" in JSON)."""
    if SURROGATE.search(text):
        what = "is not valid Unicode (a lone surrogate): send UTF-8 text"
        raise RequestError(400, f"{where} {what}", field)


class StreamOptions(Body):
    include_usage: bool = Field(False, description="a last chunk with the usage")


class DecodeFields(Body):
    """What a completion and a chat completion both take (with decoding.Options' fields)."""

    model: str | None = None
    n: int = Field(1, ge=1, description="completions per prompt")
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=0, lt=2**63)
    stream: bool = False
    stream_options: StreamOptions | None = None


class CompletionFields(DecodeFields):
    prompt: str | list[str] | list[int] | list[list[int]] = Field(
        "", description="a text, token ids, or a list of either (one completion each)"
    )
    max_tokens: int = Field(16, ge=0, description="0: the prompt scored only (with echo)")
    ignore_eos: bool = Field(False, description="go on past the tokenizer's end-of-text token")
    logprobs: int | None = Field(
        None, ge=0, le=MAX_TRACE, description="each token's log-probability and this many top"
    )
    echo: bool = Field(False, description="the prompt before the completion, scored")
    trace: int = Field(0, ge=0, le=MAX_TRACE, description="top candidates at every filter")


def decoding_fields():
    """decoding.Options' fields as pydantic's: the type, off value, range and help declared
    there."""
    made = {}
    for f in dataclasses.fields(decoding.Options):
        help = f.metadata["help"]
        # shown in the schema, checked by decoding.Options (Playground.completion)
        bounds = {SCHEMA_BOUNDS[k]: v for k, v in f.metadata.items() if k in SCHEMA_BOUNDS}
        bounds = {k: v for k, v in bounds.items() if v is not None}
        field = Field(f.default, description=help, json_schema_extra=bounds)
        made[f.name] = (f.type, field)
    return made


# the bounds each decoding option declares (lib.options.setting), by their JSON Schema names
SCHEMA_BOUNDS = {"ge": "minimum", "gt": "exclusiveMinimum", "le": "maximum"}


CompletionRequest = create_model(
    "CompletionRequest", __base__=CompletionFields, **decoding_fields()
)


class ClassifyRequest(Body):
    model: str | None = None
    input: str | list[str] | None = None
    attention: bool = Field(False, description="one text's every head")


class TokenizeRequest(Body):
    model: str | None = None
    prompt: str
    add_special_tokens: bool = True  # vLLM's field; this project's tokenizers add none


class DetokenizeRequest(Body):
    model: str | None = None
    tokens: list[int]


# ---------------------------------------------------------------------------------------- errors
def invalid(request, e):
    """pydantic's first complaint about a body as one RequestError naming the field."""
    first = e.errors()[0]
    where = first["loc"]
    if first["type"] == "json_invalid":
        return RequestError(400, "the body is not JSON that can be read").response()
    param = where[1] if len(where) > 1 else None
    got = repr(first.get("input"))[:40]
    message = f"{param}: {first['msg']}, got {got}" if param else first["msg"]
    return RequestError(400, message, param).response()


def refused(request, e):
    return e.response()


def http_error(request, e):
    """Starlette's own refusals (no route, a body it cannot parse) as OpenAI's error object."""
    message = e.detail
    if e.status_code == 404:
        message = f"no endpoint {request.url.path}: see /docs"
    return RequestError(e.status_code, message).response()


def server_error(request, e):
    """A bug: its traceback to the log, one line to the client."""
    traceback.print_exception(e)
    return RequestError(500, f"{type(e).__name__}: {e}").response()


def error_response(e):
    """The answer to an exception: a RequestError's own, any other server_error's."""
    if isinstance(e, RequestError):
        return e.response()
    return server_error(None, e)


def at_most(field, value, high):
    """A 400 naming field where its value is past the server's limit high."""
    if value > high:
        raise RequestError(400, f"{field} must be at most {high}, got {value}", field)


def option_named(message):
    """The decoding option an engine row's error begins with, or None."""
    first = message.split()[0].partition("=")[0]
    names = [f.name for f in dataclasses.fields(decoding.Options)]
    return first if first in names else None
