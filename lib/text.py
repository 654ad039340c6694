"""Stop strings in a decode's text (sample.py's and serve.py's)."""


def first_stop(text, stops):
    """Where the first of stops begins in text, or -1."""
    return min((text.find(stop) for stop in stops if stop in text), default=-1)


def printable(text, stops=()):
    """What of a growing continuation can be printed now: not a trailing half character (U+FFFD)
    nor a tail that may begin a stop string."""
    text = text.rstrip("\ufffd")
    held = 0  # characters at the end that may begin a stop string
    for stop in stops:
        for n in range(1, min(len(stop) - 1, len(text)) + 1):
            if stop.startswith(text[-n:]):
                held = max(held, n)
    return text[: len(text) - held]
