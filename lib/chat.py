"""Conversations: the one chat template, its special tokens (ids after the tokenizer's own, which
no text encodes to) and which tokens a fine-tune learns: the assistant's."""

from lib.common import Error
from lib.tokenizer import pieces

ROLES = ("system", "user", "assistant")
END = "<|end|>"  # ends every turn; a reply ends where the model draws it
# each role's marker, then the end of a turn: their ids in this order
SPECIAL_TOKENS = tuple(f"<|{role}|>" for role in ROLES) + (END,)
# the template in transformers' form (tokenizer_config.json's chat_template): a
# marker, the content and END for each message; a reply starts at the marker
TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>' + message['content'] + '<|end|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


class ChatTokenizer:
    """A tokenizer with the chat tokens after its vocabulary. Text encodes as the
    tokenizer's does, so a "<|user|>" typed in a message is plain text."""

    def __init__(self, base):
        self.base = base
        first = base.vocab_size
        self.ids = {name: first + i for i, name in enumerate(SPECIAL_TOKENS)}
        self.vocab_size = first + len(SPECIAL_TOKENS)
        self.end_token = self.ids[END]
        self.spec = {**base.spec, "chat": True}

    def __getattr__(self, name):
        return getattr(self.base, name)  # encode, eot_token, start_token, name

    def decode(self, ids):
        """The base tokenizer's text, each chat token as its name."""
        return "".join(text for text, _ in pieces(self, ids))

    def render(self, messages, reply=False):
        """(ids, learn) of messages in the template; learn[i]: whether a fine-tune learns
        token i (an assistant's content and its END); reply: end with the assistant's
        marker, the prompt of an answer."""
        ids, learn = [], []
        for message in messages:
            content = self.encode(message["content"])
            ids += [self.ids[f"<|{message['role']}|>"], *content, self.end_token]
            answer = message["role"] == "assistant"
            learn += [False] + [answer] * (len(content) + 1)
        if reply:
            ids.append(self.ids["<|assistant|>"])
            learn.append(False)
        return ids, learn


def with_chat(tokenizer, chat, where):
    """The tokenizer, with the chat tokens after where its spec's "chat" is true."""
    if not isinstance(chat, bool):
        raise Error(f"{where}: 'tokenizer.chat' is {chat!r:.40}, not true or false")
    return ChatTokenizer(tokenizer) if chat else tokenizer


def check_messages(messages):
    """A conversation as OpenAI's and Hugging Face's files hold it: a list of
    {"role", "content"} objects; an Error says what is wrong."""
    if not isinstance(messages, list) or not messages:
        raise Error("'messages' must be a non-empty list of {role, content} objects")
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise Error(f"messages[{i}] is {type(message).__name__}, not an object")
        if message.get("role") not in ROLES:
            raise Error(
                f"messages[{i}]: role {message.get('role')!r:.40} is not one of {', '.join(ROLES)}"
            )
        if not isinstance(message.get("content"), str):
            raise Error(f"messages[{i}]: 'content' must be a string")


def fitted(tokenizer, messages, block_size, max_tokens):
    """(ids, dropped) of a reply's prompt: while it and room for the reply (max_tokens, at
    most half of block_size) outgrow block_size, the oldest message after a system prompt is
    dropped, and a reply whose question left; the last message stays."""
    room = min(max_tokens, block_size // 2)
    system = messages[:1] if messages[0]["role"] == "system" else []
    turns = messages[len(system) :]
    ids, _ = tokenizer.render(messages, reply=True)
    while len(ids) + room > block_size and len(turns) > 1:
        turns = turns[1:]
        while len(turns) > 1 and turns[0]["role"] == "assistant":
            turns = turns[1:]
        ids, _ = tokenizer.render(system + turns, reply=True)
    return ids, len(messages) - len(system) - len(turns)
