"""Stop strings in a decode's growing text."""


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
