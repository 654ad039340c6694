"""The byte-pair tokenizers: GPT-2's BPE (tiktoken), and a byte-level BPE trained on the data
(train_bpe) and kept in a file beside it; the files tiktoken and Hugging Face read."""

import base64
import hashlib
import os
import stat
import sys

import tiktoken
from tiktoken_ext.openai_public import r50k_pat_str

from lib.common import Error
from lib.files import atomic_path
from lib.tokenizer import EOT

# a trained BPE's ids are stored as tiktoken's files store them
RANKS_FILE = "tokenizer.tiktoken"
# the largest RANKS_FILE read (bytes): a million tokens of 40 bytes, with room
MAX_RANKS_BYTES = 2**26


def bpe_tokenizer(spec, where):
    """The BPE that spec names: a trained one's file beside the file where, else tiktoken's."""
    if "file" in spec:
        path = os.path.join(os.path.dirname(where), spec["file"])
        return TrainedBPE(read_ranks(path, spec["sha256"], where), spec)
    return BPETokenizer(spec["encoding"], spec.get("lowercase", False))


class BPETokenizer:
    # r50k_base: GPT-2's, tiktoken's "gpt2" ranks
    def __init__(self, encoding, lowercase=False, enc=None):
        """enc: a tiktoken Encoding made elsewhere (TrainedBPE)."""
        try:
            self.enc = enc or tiktoken.get_encoding(encoding)
        except Exception as e:  # tiktoken downloads the file once, then reads its cache
            raise Error(
                f"cannot load the tiktoken encoding {encoding!r} ({type(e).__name__}); "
                f"offline, set TIKTOKEN_CACHE_DIR to a folder holding its cache file"
            ) from None
        self.vocab_size = self.enc.n_vocab
        self.eot_token = self.enc.eot_token  # <|endoftext|>: 50256 in GPT-2's
        self.name = f"tiktoken's {self.enc.name}"  # what it is, in words
        self.start_token = self.eot_token
        # never produced from text: padding cannot be mistaken for a token
        self.pad_token_id = self.start_token
        # "Oil", " oil", "OIL": one token, which small labelled sets spread thinly otherwise
        self.lowercase = lowercase
        self.spec = {"type": "bpe", "encoding": encoding}
        if lowercase:
            self.spec["lowercase"] = True

    def encode(self, text):
        # special tokens are plain text
        return self.enc.encode_ordinary(text.lower() if self.lowercase else text)

    def encode_batch(self, texts):
        if self.lowercase:
            texts = [t.lower() for t in texts]
        return self.enc.encode_ordinary_batch(texts, num_threads=8)

    def decode(self, ids):
        return self.enc.decode(ids)


class TrainedBPE(BPETokenizer):
    """A byte-level BPE trained on the data (lib/bpe.py): its ranks (token bytes -> id), GPT-2's
    split of text into words, <|endoftext|> the last id. spec: the one it was read by."""

    def __init__(self, ranks, spec=None):
        enc = tiktoken.Encoding(
            "trained",
            pat_str=r50k_pat_str,
            mergeable_ranks=ranks,
            special_tokens={EOT: len(ranks)},
        )
        super().__init__(None, enc=enc)
        self.ranks = ranks
        self.spec = spec
        self.name = "a byte-level BPE trained on the data (tokenizer.tiktoken)"


def read_ranks(path, sha256, where):
    """The ranks in path (tiktoken's format, as lib/bpe.save_ranks writes them), checked as read:
    each line a token in base64, a space and its rank; the ranks 0 to n - 1, each once; the 256
    bytes among the tokens (a file that passes its sha256 comes from its sender all the same)."""
    lines = read_ranks_file(path, sha256, where).splitlines()
    ranks = {}
    for number, line in enumerate(lines, 1):
        token, _, rank = line.partition(b" ")
        try:
            token = base64.b64decode(token, validate=True)
        except ValueError:
            token = b""
        if not (token and rank.isdigit()):
            raise not_ranks(path, f"line {number} is not a base64 token, a space and its rank")
        ranks[token] = int(rank)
    if sorted(ranks.values()) != list(range(len(lines))):
        raise not_ranks(path, f"its ranks are not 0 to {len(lines) - 1}, each once")
    missing = [b for b in range(256) if bytes([b]) not in ranks]
    if missing:
        raise not_ranks(path, f"byte {missing[0]} is not one of its tokens")
    return ranks


def not_ranks(path, what):
    return Error(
        f"{path}: {what}: not a tokenizer file this project wrote; prepare or export again"
    )


def read_ranks_file(path, sha256, where):
    """path's bytes: a regular file of at most MAX_RANKS_BYTES whose sha256 is the one that the
    file where names, so a folder never mixes two runs' files."""
    try:
        regular = stat.S_ISREG(os.stat(path).st_mode)  # a FIFO would block, /dev/zero never end
        if regular:
            with open(path, "rb") as f:
                text = f.read(MAX_RANKS_BYTES + 1)
    except OSError as e:
        raise Error(
            f"{path}: cannot read the tokenizer that {where} names "
            f"({e.strerror}): copy it back beside {os.path.basename(where)}"
        ) from None
    if not regular or len(text) > MAX_RANKS_BYTES:
        raise not_ranks(path, f"not a regular file of at most {MAX_RANKS_BYTES:,} bytes")
    if hashlib.sha256(text).hexdigest() != sha256:
        raise Error(
            f"{path}: not the tokenizer that {where} names (its sha256 "
            "differs): the folder mixes two runs' files; prepare or "
            "export again"
        )
    return text


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
    names them, which lib.weights.get_tokenizer reads back."""
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


def bpe_files(encoding):
    """(vocab {token string: id}, merges ["a b", ...] in rank order) of a tiktoken encoding's
    ranks (its special tokens aside), written in GPT-2's byte-to-character map: Hugging Face's
    byte-pair encoding of these merges gives tiktoken's ids."""
    ranks = encoding._mergeable_ranks  # token bytes -> rank = id
    char = bytes_to_unicode()

    def text(token):
        return "".join(char[b] for b in token)

    pairs = merges(ranks)
    lost = [token for token, pair in pairs.items() if len(token) > 1 and pair is None]
    if lost:
        raise Error(
            f"the tokenizer's token {lost[0]!r} is made by no merge of lower ranks, which Hugging "
            "Face's merges.txt cannot express: train on data that data/text/prepare.py made (it "
            "drops such tokens), or use this checkpoint with this project's scripts"
        )
    merged = [(rank, pairs[token]) for token, rank in ranks.items() if len(token) > 1]
    lines = [f"{text(left)} {text(right)}" for _, (left, right) in sorted(merged)]
    return {text(token): rank for token, rank in ranks.items()}, lines
