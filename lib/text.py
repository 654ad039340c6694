"""The text of a decode: each row's continuation as it grows, cut at its stop strings, and the
part of it that can be shown now. sample.py and the playground print through these."""


def continuations(engine, request, tokenizer, stops=()):
    """Step engine until request is done; after every step yield (the texts of its rows so far,
    which have stopped). A text ends right before the first of stops it holds (the continuation
    is searched, not the prompt), and its row stops decoding there."""
    rows = request.rows
    texts = [""] * len(rows)
    while not request.done:
        engine.step()
        for i, row in enumerate(rows):
            # the whole continuation decoded: bytes split over tokens join up; a row that
            # stopped takes no more tokens, so its text stays cut
            texts[i] = tokenizer.decode(row.generated)
            cut = first_stop(texts[i], stops)
            if cut >= 0:
                texts[i] = texts[i][:cut]
                row.finish()
        yield texts, [row.done for row in rows]


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
