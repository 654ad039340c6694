"""A byte-level BPE trained on a corpus, saved in tiktoken's format, and its merges for Hugging
Face's tokenizer files: for data/text/prepare.py and export.py, outside train.py's and sample.py's
imports (lib/bpe_tokenizer.py reads and uses what this writes)."""

import base64
import hashlib
import os
import sys

from lib.bpe_tokenizer import RANKS_FILE, TrainedBPE
from lib.files import atomic_path


def train_bpe(texts, vocab_size):
    """A TrainedBPE of vocab_size ids (its <|endoftext|> included) learned
    from texts (an iterable of strings, read once) by Hugging Face's
    trainer, on GPT-2's words: the 256 bytes, then one token per merge.
    A token that tiktoken's encoding never reaches from its bytes (no
    pair of lower ranks makes it) is dropped, so Hugging Face's tokenizer
    of the same merges gives the same ids (merges())."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    # GPT-2's regular expression and byte-to-character map
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - 1,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        # its bars go to stdout, and leave blank lines where that is a file or a pipe
        show_progress=sys.stdout.isatty(),
    )
    tok.train_from_iterator(texts, trainer)
    byte = {c: b for b, c in bytes_to_unicode().items()}
    ranks = {}
    vocab = tok.get_vocab()  # token text -> id, in merge order
    for text in sorted(vocab, key=vocab.get):
        ranks[bytes(byte[c] for c in text)] = len(ranks)
    reached = {t for t, pair in merges(ranks).items() if pair}
    kept = [t for t in ranks if len(t) == 1 or t in reached]
    return TrainedBPE({t: i for i, t in enumerate(kept)})


def save_ranks(ranks, folder):
    """Writes a TrainedBPE's ranks into folder as RANKS_FILE (tiktoken's
    format: a token's bytes in base64, its id) and returns the spec that
    names them, which lib.tokenizer.get_tokenizer reads back."""
    lines = [base64.b64encode(token).decode() + f" {rank}\n" for token, rank in ranks.items()]
    text = "".join(lines).encode()
    path = os.path.join(folder, RANKS_FILE)
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        f.write(text)
    return {
        "type": "bpe",
        "file": RANKS_FILE,
        "sha256": hashlib.sha256(text).hexdigest(),
    }


def merges(ranks):
    """{token: the pair that makes it, or None}: byte-pair encoding of a
    token's bytes with only the lower ranks leaves it as that pair (none
    for a single byte or a token it never reaches)."""
    found = {}
    for token, rank in ranks.items():
        parts = [bytes([b]) for b in token]
        while len(parts) > 1:
            pair_ranks = [ranks.get(parts[j] + parts[j + 1], rank) for j in range(len(parts) - 1)]
            if min(pair_ranks) >= rank:
                break
            i = pair_ranks.index(min(pair_ranks))
            parts[i : i + 2] = [parts[i] + parts[i + 1]]
        found[token] = tuple(parts) if len(parts) == 2 else None
    return found


def bytes_to_unicode():
    """GPT-2's map from the 256 byte values to printable characters, in
    which Hugging Face's byte-level vocabularies are written."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    extra = iter(range(256, 512))
    return {b: chr(b if b in printable else next(extra)) for b in range(256)}
