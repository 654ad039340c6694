"""The text of a decode: where a continuation's first stop string begins, and the part of it
that can be shown now. sample.py and the playground print through these."""


def first_stop(text, stops):
    """Where the first of stops begins in text, or -1."""
    found = [text.find(stop) for stop in stops]
    return min([c for c in found if c >= 0], default=-1)


def printable(text, stops=()):
    """The part of a growing continuation that can be printed now: never a trailing half of a
    multi-byte character (tiktoken decodes it to U+FFFD) nor a tail that may turn out to be the
    start of a stop string."""
    text = text.rstrip("\ufffd")
    held = 0  # characters at the end that may begin a stop string
    for stop in stops:
        for n in range(1, min(len(stop) - 1, len(text)) + 1):
            if stop.startswith(text[-n:]):
                held = max(held, n)
    return text[: len(text) - held]
