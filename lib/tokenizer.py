"""The tokenizers a dataset's meta.json or a checkpoint names: characters, or a byte-pair encoding
(lib/bpe.py: GPT-2's through tiktoken, or one trained on the data); the special tokens every
tokenizer shares, and a decode's text: where a stop string cuts it, what can be printed yet, and
a decode stepped to its end, its first row printed as it grows (sample.py's and chat's)."""

from lib.common import Error

# the end of a document: a token of its own, never produced from text
EOT = "<|endoftext|>"


class CharTokenizer:
    name = "characters"

    def __init__(self, chars, eot=False):
        """eot: one more id, after the characters', ends a document."""
        self.chars = chars
        self.stoi = {c: i for i, c in enumerate(chars)}
        self.vocab_size = len(chars)
        self.eot_token = None
        self.spec = {"type": "char", "chars": chars}
        # what an empty prompt starts from
        self.start_token = self.stoi.get("\n", 0)
        if eot:
            self.eot_token = len(chars)
            self.vocab_size += 1
            self.start_token = self.eot_token
            self.spec["eot"] = True

    def encode(self, text):
        unknown = sorted(set(text) - self.stoi.keys())
        if unknown:
            raise Error(f"characters not in this model's vocabulary: {''.join(unknown)!r}")
        return [self.stoi[c] for c in text]

    def encode_batch(self, texts):
        return [self.encode(t) for t in texts]

    def decode(self, ids):
        return "".join(EOT if i == self.eot_token else self.chars[i] for i in ids)


def special_tokens(tokenizer):
    """{token: id} of the ids no text encodes to, which follow the vocabulary's in id order:
    <|endoftext|>, then a chat tokenizer's."""
    found = {} if tokenizer.eot_token is None else {EOT: tokenizer.eot_token}
    return found | getattr(tokenizer, "ids", {})


def end_tokens(tokenizer):
    """The ids that end a decode: every special token, none of which is text. A chat model's
    role marker drawn mid-reply ends it as <|end|> does: a reply never holds a marker."""
    return frozenset(special_tokens(tokenizer).values())


def pieces(tokenizer, ids):
    """The text of ids in pieces -> [(text, whether a special token)]: each special token its
    name, alone; each run of other tokens between them its decoded text (the last, maybe "")."""
    names = {i: name for name, i in special_tokens(tokenizer).items()}
    decode = getattr(tokenizer, "base", tokenizer).decode  # a chat tokenizer's splits here
    made, run = [], []
    for i in ids:
        if i in names:
            made += [(decode(run), False), (names[i], True)]
            run = []
        else:
            run.append(i)
    return made + [(decode(run), False)]


SEPARATOR = "-" * 40  # printed between samples


def first_stop(text, stops):
    """Where the first of stops begins in text, or -1."""
    return min((text.find(stop) for stop in stops if stop in text), default=-1)


def printable(text, stops=()):
    """All of text but a tail that may begin one of stops: what can be printed now."""
    text = text.rstrip("\ufffd")  # tiktoken's half of a multi-byte character
    held = 0
    for stop in stops:
        for n in range(1, min(len(stop) - 1, len(text)) + 1):
            if stop.startswith(text[-n:]):
                held = max(held, n)
    return text[: len(text) - held]


def continuation(tokenizer, row, stops, count=None):
    """The text of an engine row's generated tokens (its first count), cut before the first of
    stops, where the row finishes -> (that text, what of it can be shown now, whether a stop cut
    it). The whole is decoded each time: bytes split over tokens join up. A stop is found in the
    text between special tokens, never in a special token's name nor across one."""
    text = ""
    parts = pieces(tokenizer, row.generated[:count])
    for piece, special in parts:
        cut = -1 if special else first_stop(piece, stops)
        if cut >= 0:
            row.finish()
            return text + piece[:cut], text + piece[:cut], True
        text += piece
    last = parts[-1][0]  # the text after the last special token: it may begin a stop
    return text, text[: len(text) - len(last)] + printable(last, stops), False


def decode_request(engine, request, tokenizer, stop, stream):
    """Steps engine until request is done, each row cut right before stop (a string, or None);
    with stream, the first row's text printed as it grows, then a newline. Ctrl-C ends the
    request where it is. -> (each row's text, the steps taken, whether Ctrl-C ended it)."""
    rows = request.rows
    stops = [stop] if stop else []
    steps = shown = 0  # shown: the characters of the first row already printed
    interrupted = False
    try:
        while not request.done:
            for row in engine.step():  # the rows that took a token
                # each row decoded as it grows where a stop may cut it, else once at the end
                if stops or (stream and row is rows[0]):
                    text, ready, _ = continuation(tokenizer, row, stops)
                if stream and row is rows[0]:
                    out = text if row.done else ready
                    print(out[shown:], end="", flush=True)
                    shown = max(shown, len(out))
            steps += 1
    except KeyboardInterrupt:
        interrupted = True
        request.finish()
        engine.step()  # the finished rows leave the engine
    texts = [continuation(tokenizer, row, stops)[0] for row in rows]
    if stream:
        print(texts[0][shown:], flush=True)
    return texts, steps, interrupted


def stopped_short(rows):
    """An Error naming the first of the engine rows (sample i + 1) that stopped where its
    options left no token to draw, and how far it got; the message names the option
    (serve.py's 400)."""
    for i, row in enumerate(rows):
        if row.error:
            raise Error(f"sample {i + 1} stopped after {len(row.generated)} tokens: {row.error}")
