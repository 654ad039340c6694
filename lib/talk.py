"""sample.py's conversations with a chat model: --messages answers one read from a file, --chat
talks in the terminal, the history kept and its oldest turns dropped once it outgrows the
context."""

import json
import sys

from lib.chat import check_messages, end_tokens
from lib.common import Error
from lib.text import SEPARATOR, continuation


def talk(engine, tokenizer, picks, args):
    """Replies on stdout to args.messages' conversation (a sample per pick), then with
    args.chat to each line typed."""
    if not tokenizer.spec.get("chat"):
        raise Error(
            f"{args.init_from or args.out_dir} has no chat tokens: fine-tune it on "
            "conversations first (data/chat/prepare.py, config/chat.py)"
        )
    messages = read_messages(args.messages) if args.messages else []
    if not args.chat:  # --messages alone: a reply for each sample
        for i, pick in enumerate(picks):
            if i:
                print(SEPARATOR)
            reply(engine, tokenizer, messages, pick, args, args.stream and not i)
        return
    while True:  # the user's turn, unless --messages ends with one
        if not messages or messages[-1]["role"] != "user":
            line = ask()
            if line is None:
                return
            messages.append({"role": "user", "content": line})
        try:
            text = reply(engine, tokenizer, messages, picks[0], args, stream=True)
        except Error as e:  # a character the model never saw: the turn is dropped
            messages.pop()
            print(f"error: {e}", file=sys.stderr)
            continue
        messages.append({"role": "assistant", "content": text})


def ask():
    """The next line typed that is not blank, or None at the end of input (Ctrl-D)."""
    line = ""
    while not line.strip():
        print("> ", end="", file=sys.stderr, flush=True)
        line = sys.stdin.readline()
        if not line:
            print(file=sys.stderr)
            return None
    return line.rstrip("\n")


def read_messages(path):
    """A conversation from a JSON file: {"messages": [...]} or the list alone."""
    try:
        with open(path, encoding="utf-8") as f:
            conversation = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise Error(f"--messages {path}: cannot read it as JSON ({type(e).__name__})") from None
    if isinstance(conversation, dict):
        conversation = conversation.get("messages")
    try:
        check_messages(conversation)
    except Error as e:
        raise Error(f"--messages {path}: {e}") from None
    return conversation


def reply(engine, tokenizer, messages, pick, args, stream):
    """The assistant's reply to messages, cut at its end of turn or --stop; printed,
    token by token with stream. -> its text."""
    # room for a reply of max_new_tokens, or half the context
    room = min(args.max_new_tokens, engine.block_size // 2)
    ids = fitted(tokenizer, messages, engine.block_size - room)
    # <|end|>, or a role marker drawn mid-reply: the text never holds one
    request = engine.submit(ids, [pick], args.max_new_tokens, end_tokens(tokenizer))
    stops = [args.stop] if args.stop else []
    text, shown = "", 0
    try:
        while not request.done:
            for row in engine.step():
                text, ready, _ = continuation(tokenizer, row, stops)
                if stream:
                    print(ready[shown:], end="", flush=True)
                    shown = max(shown, len(ready))
    except KeyboardInterrupt:  # Ctrl-C: the reply ends here
        request.finish()
        engine.step()
    print(text[shown if stream else 0 :], flush=True)
    return text


def fitted(tokenizer, messages, size):
    """The prompt of a reply to messages, the oldest turns after a system prompt dropped
    while it is longer than size, or starts at a reply, and more than the last is left."""
    system = messages[:1] if messages[0]["role"] == "system" else []
    turns = messages[len(system) :]
    while len(turns) > 1:
        ids, _ = tokenizer.render(system + turns, reply=True)
        if len(ids) <= size and turns[0]["role"] != "assistant":
            return ids
        turns = turns[1:]
    return tokenizer.render(system + turns, reply=True)[0]
