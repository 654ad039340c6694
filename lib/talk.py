"""sample.py's conversations with a chat model: --messages answers one read from a file, --chat
talks in the terminal, the history kept and its oldest turns dropped once it outgrows the
context."""

import sys

from lib.chat import check_messages, fitted
from lib.common import Error, read_json
from lib.text import SEPARATOR, continuation, stopped_short
from lib.tokenizer import end_tokens


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
        rows = []
        for i, pick in enumerate(picks):
            if i:
                print(SEPARATOR)
            _, row = reply(engine, tokenizer, messages, pick, args, args.stream and not i)
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
            text, row = reply(engine, tokenizer, messages, picks[0], args, stream=True)
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


def reply(engine, tokenizer, messages, pick, args, stream):
    """The assistant's reply to messages, cut at its end of turn or --stop; printed,
    token by token with stream. -> (its text, its engine row)."""
    ids, _ = fitted(tokenizer, messages, engine.block_size, args.max_new_tokens)
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
    return text, request.rows[0]
