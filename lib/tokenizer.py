"""The tokenizers a dataset's meta.json or a checkpoint names: GPT-2's BPE (tiktoken), a byte-level
BPE trained on the data and kept in a file beside it (lib/bpe.py trains it), or characters."""

import base64
import hashlib
import os

import tiktoken
from tiktoken_ext.openai_public import r50k_pat_str

from lib.common import Error

# the end of a document: a token of its own, never produced from text
EOT = "<|endoftext|>"
# a trained BPE's ids are stored as tiktoken's files store them
RANKS_FILE = "tokenizer.tiktoken"


def get_tokenizer(spec, where="tokenizer", vocab_size=None):
    """The tokenizer that spec (its keys: lib/schema.py's) names in the file where; a trained BPE's
    file lies beside that file. With vocab_size, every id must index a model's embedding rows."""
    if spec is None:
        raise Error(
            f"{where}: no tokenizer this project knows: add a 'tokenizer' key "
            "(a char one holds 'chars', a bpe one 'encoding')"
        )
    if spec["type"] == "char":
        tokenizer = CharTokenizer(spec["chars"], spec.get("eot", False))
    elif "file" in spec:
        path = os.path.join(os.path.dirname(where), spec["file"])
        tokenizer = TrainedBPE(read_ranks(path, spec["sha256"], where), spec)
    else:
        tokenizer = BPETokenizer(spec["encoding"], spec.get("lowercase", False))
    if vocab_size is not None and tokenizer.vocab_size > vocab_size:
        raise Error(
            f"{where}: the tokenizer has {tokenizer.vocab_size:,} tokens, the model's vocabulary "
            f"{vocab_size:,}: the tokenizer is not the one this model was trained with"
        )
    return tokenizer


class CharTokenizer:
    name = "characters (not a Hugging Face tokenizer)"

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
    """The ranks in path (tiktoken's format, as lib/bpe.save_ranks writes them), checked against
    the sha256 that the file where names, so a folder never mixes two runs' files."""
    try:
        with open(path, "rb") as f:
            text = f.read()
    except OSError as e:
        raise Error(
            f"{path}: cannot read the tokenizer that {where} names "
            f"({e.strerror}): copy it back beside {os.path.basename(where)}"
        ) from None
    if hashlib.sha256(text).hexdigest() != sha256:
        raise Error(
            f"{path}: not the tokenizer that {where} names (its sha256 "
            "differs): the folder mixes two runs' files; prepare or "
            "export again"
        )
    ranks = {}
    for line in text.splitlines():
        token, rank = line.split()
        ranks[base64.b64decode(token)] = int(rank)
    return ranks
