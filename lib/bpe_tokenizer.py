"""The byte-pair tokenizers: GPT-2's BPE (tiktoken), and a byte-level BPE trained on the data and
kept in a file beside it (lib/bpe.py trains it)."""

import base64
import hashlib
import os
import stat

import tiktoken
from tiktoken_ext.openai_public import r50k_pat_str

from lib.common import Error
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
