"""Conversations: the one chat template, its special tokens (ids after the tokenizer's own, which
no text encodes to), which tokens a fine-tune learns (the assistant's) and the batches it learns
from, and sample.py's conversations: --messages answers one read from a file, --chat talks in
the terminal."""

import functools
import re
import sys

import numpy as np
import torch
from jinja2.sandbox import ImmutableSandboxedEnvironment

from lib.common import Error, read_json
from lib.data import LMData, check, load_array
from lib.prepare import Rows
from lib.tokenizer import SEPARATOR, decode_request, end_tokens, pieces, stopped_short

ROLES = ("system", "user", "assistant")
END = "<|end|>"  # ends every turn; a reply ends where the model draws it
# each role's marker, then the end of a turn: their ids in this order
SPECIAL_TOKENS = tuple(f"<|{role}|>" for role in ROLES) + (END,)
# the template in transformers' form (tokenizer_config.json's chat_template), which
# render() runs too: a marker, the content and END for each message; a reply starts
# at the marker
TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>' + message['content'] + '<|end|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)
# message i's content in a rendering: a slot, its text encoded apart
SLOT = "\0{}\0"
# a rendering's pieces: the chat tokens, the slots, and the template's text
PIECES = re.compile("(" + "|".join(map(re.escape, SPECIAL_TOKENS)) + r"|\0\d+\0)")


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
        """(ids, learn) of messages in TEMPLATE, rendered as transformers renders it;
        learn[i]: whether a fine-tune learns token i (an assistant's content and the END
        after it); reply: end with the prompt of an answer, the assistant's marker."""
        slots = [{**m, "content": SLOT.format(i)} for i, m in enumerate(messages)]
        text = compiled(TEMPLATE).render(messages=slots, add_generation_prompt=reply)
        ids, learn = [], []
        answer = False  # whether the last content was an assistant's
        for piece in PIECES.split(text):
            if piece in self.ids:
                ids.append(self.ids[piece])
                learn.append(answer and piece == END)
            elif piece.startswith("\0"):
                message = messages[int(piece[1:-1])]
                answer = message["role"] == "assistant"
                content = self.encode(message["content"])
                ids += content
                learn += [answer] * len(content)
            elif piece:  # the template's own text
                text = self.encode(piece)
                ids += text
                learn += [False] * len(text)
        return ids, learn


@functools.cache
def compiled(template):
    """A chat template compiled as transformers compiles it (apply_chat_template)."""
    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    return environment.from_string(template)


class ConversationData(Rows):
    """Conversations: as inputs, each one's tokens but its last; as targets, the next
    token where the mask marks it, else -1 (cross_entropy's ignore_index)."""

    best = ("val/loss", "min")
    labelled = False
    unit = "tok"  # the speed counts tokens, padding included
    task = "lm"
    tokens_per_byte = None

    def __init__(self, path, n, block_size, meta):
        """path: the split's files, less their extensions; n: its conversations."""
        super().__init__(path, n, meta)
        self.learn = load_array(path + ".mask.bin", "uint8")
        check(
            len(self.learn) == len(self.tokens),
            path + ".mask.bin",
            f"{len(self.learn):,} marks for {len(self.tokens):,} tokens",
        )
        longest = int(np.diff(self.offsets).max())
        if longest > block_size + 1:
            raise Error(
                f"{path}.bin holds a conversation of {longest} tokens, past block_size + 1 = "
                f"{block_size + 1}: train with block_size={longest - 1}, or prepare with "
                f"--block_size={block_size}"
            )

    def batch(self, rows):
        spans = [(self.offsets[i], self.offsets[i + 1]) for i in rows]
        width = max(end - start for start, end in spans) - 1
        idx = torch.zeros(len(rows), width, dtype=torch.long)
        targets = torch.full_like(idx, -1)
        for row, (start, end) in enumerate(spans):
            ids = torch.from_numpy(self.tokens[start:end].astype(np.int64))
            learn = torch.from_numpy(self.learn[start + 1 : end].astype(bool))
            idx[row, : end - start - 1] = ids[:-1]
            targets[row, : end - start - 1] = ids[1:].where(learn, -1)
        return {"idx": idx, "targets": targets}

    count = staticmethod(LMData.count)  # tokens


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


def talk(engine, tokenizer, rules, args):
    """Replies on stdout to args.messages' conversation (a sample per rule), then with
    args.chat to each line typed."""
    if not tokenizer.spec.get("chat"):
        raise Error(
            f"{args.init_from or args.out_dir} has no chat tokens: fine-tune it on "
            "conversations first (data/chat/prepare.py, config/chat.py)"
        )
    messages = read_messages(args.messages) if args.messages else []
    if not args.chat:  # --messages alone: a reply for each sample
        rows = []
        for i, rule in enumerate(rules):
            if i:
                print(SEPARATOR)
            _, row = reply(engine, tokenizer, messages, rule, args, args.stream and not i)
            rows.append(row)
        stopped_short(rows)  # once all are out, as sample.py's samples
        return
    while True:  # the user's turn, unless --messages ends with one
        if not messages or messages[-1]["role"] != "user":
            line = ask()
            if line is None:
                return
            messages.append({"role": "user", "content": line})
        # a character the model never saw, or a reply cut short: the turn is dropped, the
        # conversation goes on
        try:
            text, row = reply(engine, tokenizer, messages, rules[0], args, stream=True)
            stopped_short([row])
        except Error as e:
            messages.pop()
            print(f"error: {e}", file=sys.stderr)
            continue
        messages.append({"role": "assistant", "content": text})


def ask():
    """The next line typed that is not blank, or None at the end of input (Ctrl-D) or
    where there is no input at all (stdin closed: `<&-`). A line not in stdin's
    encoding is said on stderr, and the next one read."""
    line = ""
    while not line.strip():
        print("> ", end="", file=sys.stderr, flush=True)
        # bytes: a text read that fails to decode loses the lines read with it
        raw = sys.stdin.buffer.readline() if sys.stdin else b""
        if not raw:
            print(file=sys.stderr)
            return None
        try:
            line = raw.decode(sys.stdin.encoding)
        except UnicodeDecodeError as e:
            encoding = sys.stdin.encoding
            print(f"error: not {encoding} text ({e.reason}); type it again", file=sys.stderr)
    return line.rstrip("\r\n")


def read_messages(path):
    """A conversation from a JSON file: {"messages": [...]} or the list alone."""
    try:
        conversation = read_json(path, "conversation")
    except Error as e:  # it names path
        raise Error(f"--messages {e}") from None
    if isinstance(conversation, dict):
        conversation = conversation.get("messages")
    try:
        check_messages(conversation)
    except Error as e:
        raise Error(f"--messages {path}: {e}") from None
    return conversation


def reply(engine, tokenizer, messages, rule, args, stream):
    """The assistant's reply to messages, cut at its end of turn or --stop; printed,
    token by token with stream. -> (its text, its engine row)."""
    ids, _ = fitted(tokenizer, messages, engine.block_size, args.max_new_tokens)
    # <|end|>, or a role marker drawn mid-reply: the text never holds one
    request = engine.submit(ids, [rule], args.max_new_tokens, end_tokens(tokenizer))
    # Ctrl-C ends the reply where it is, not the conversation
    (text,), _, _ = decode_request(engine, request, tokenizer, args.stop, stream)
    if not stream:
        print(text, flush=True)
    return text, request.rows[0]
