"""Chat completions (POST /v1/chat/completions): OpenAI's messages rendered in lib/chat.py's
template, then completed as a prompt of /v1/completions is (its checks, its engine, its stop
strings, its end at a special token: <|end|> or a role marker drawn mid-reply); the answer in
OpenAI's chat shape."""

from pydantic import Field, create_model

from lib.chat import check_messages, fitted
from lib.common import Error
from serving.completions import Completion
from serving.protocol import (
    CompletionRequest,
    DecodeFields,
    at_most,
    check_unicode,
    decoding_fields,
)
from serving.transport import RequestError

NO_CHAT = (
    "this model has no chat tokens: fine-tune it on conversations (data/chat/prepare.py, "
    "config/chat.py)"
)


class ChatFields(DecodeFields):
    messages: list = Field(
        description="[{role, content}]: content a text or a list of {type: text, text} parts"
    )
    max_tokens: int | None = Field(None, ge=1, description="default: the server's --max_tokens")
    max_completion_tokens: int | None = Field(None, ge=1, description="max_tokens' newer name")
    drop_oldest: bool = Field(
        False,
        description="drop the oldest messages after a system prompt until the conversation "
        "fits with room for the reply, as sample.py --chat does; dropped_messages counts them",
    )


ChatRequest = create_model("ChatRequest", __base__=ChatFields, **decoding_fields())


def chat_completion(playground, req, deadline):
    """A chat request -> a ChatCompletion, not yet submitted: the completion of the
    conversation rendered up to the assistant's marker, checked as any completion is."""
    name, served = playground.pick_model(req.model, "lm")
    tokenizer = served["tokenizer"]
    if not tokenizer.spec.get("chat"):
        raise RequestError(400, f"model {name!r}: {NO_CHAT}", "model")
    messages = conversation(req.messages)
    field = "max_tokens" if req.max_completion_tokens is None else "max_completion_tokens"
    if field == "max_completion_tokens" and req.max_tokens is not None:
        raise RequestError(400, f"send max_tokens or its newer name {field}, not both", field)
    max_tokens = getattr(req, field) or playground.max_tokens
    at_most(field, max_tokens, playground.max_tokens)
    block_size = served["model"].config.block_size
    ids, dropped = prompt_ids(tokenizer, messages, block_size, max_tokens, req.drop_oldest)
    fields = {k: v for k, v in req if k in CompletionRequest.model_fields}
    fields.update(model=name, prompt=ids, max_tokens=max_tokens)
    asked = CompletionRequest.model_construct(**fields)  # every other field its default
    chat = playground.completion(asked, deadline, ChatCompletion)
    if req.drop_oldest:  # in the answer and in each chunk streamed
        chat.head["dropped_messages"] = dropped
    return chat


def conversation(messages):
    """OpenAI's messages -> lib/chat.py's, each content one text (its text parts joined); a
    400 naming messages says what is wrong."""
    made = []
    for i, message in enumerate(messages):
        if isinstance(message, dict) and "content" in message:
            message = {**message, "content": content_text(message["content"], i)}
        made.append(message)
    try:
        check_messages(made)
    except Error as e:
        raise bad(str(e)) from None
    return made


def content_text(content, i):
    """Message i's content as one text: a text, or the texts of a list of text parts."""
    where = f"messages[{i}].content"
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            if kind != "text":
                raise bad(
                    f"{where}[{j}] is a part of type {kind!r:.40}: this model reads text parts "
                    'only, {"type": "text", "text": "..."}'
                )
            if not isinstance(part.get("text"), str):
                raise bad(f"{where}[{j}]: 'text' must be a string")
            texts.append(part["text"])
        content = "".join(texts)
    if not isinstance(content, str):
        raise bad(f"{where} is {type(content).__name__}: send a text or a list of text parts")
    check_unicode(content, where, "messages")
    return content


def prompt_ids(tokenizer, messages, block_size, max_tokens, drop_oldest):
    """(ids, dropped): the conversation's ids in the template, ending with the assistant's
    marker; with drop_oldest, the dropped oldest messages left out (lib/chat.py's fitted)."""
    try:
        if drop_oldest:
            ids, dropped = fitted(tokenizer, messages, block_size, max_tokens)
        else:
            ids, dropped = tokenizer.render(messages, reply=True)[0], 0
    except Error as e:  # a character a char model never saw
        raise bad(f"messages: {e}") from None
    if len(ids) > block_size:
        raise bad(
            f"messages come to {len(ids)} tokens in the chat template, past this model's "
            f"block_size {block_size}: send fewer or shorter messages"
        )
    return ids, dropped


def bad(message):
    """A 400 naming messages."""
    return RequestError(400, message, "messages")


class ChatCompletion(Completion):
    """A completion whose choices end where the model draws <|end|> or a role marker
    (finish_reason "stop"), answered and streamed in OpenAI's chat shape."""

    ID = "chatcmpl"
    OBJECT = "chat.completion"
    CHUNK = "chat.completion.chunk"

    async def answer(self):
        whole = await super().answer()
        for choice in whole["choices"]:
            choice["message"] = {"role": "assistant", "content": choice.pop("text")}
        return whole

    def opening(self):
        """Each choice's first chunk: the role, as OpenAI streams it."""
        return [delta(c.index, {"role": "assistant", "content": ""}) for c in self.choices]

    def chunks(self, i, text, finish, trace, logprobs):
        """New text as a content delta, then the finish reason on an empty one."""
        made = [delta(i, {"content": text})] if text else []
        if finish:
            made.append(delta(i, {}, finish))
        return made


def delta(i, what, finish=None):
    """A streamed chat choice: choice i's delta."""
    return {"index": i, "delta": what, "logprobs": None, "finish_reason": finish}
