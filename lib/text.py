"""Stop strings in a decode's growing text, the line between samples, and a sample cut short."""

from lib.common import Error
from lib.tokenizer import pieces

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


def stopped_short(rows):
    """An Error naming the first of the engine rows (sample i + 1) that stopped where its
    options left no token to draw, and how far it got; the message names the option
    (serve.py's 400)."""
    for i, row in enumerate(rows):
        if row.error:
            raise Error(f"sample {i + 1} stopped after {len(row.generated)} tokens: {row.error}")
