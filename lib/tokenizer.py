"""Tokenizers, named by a dataset's meta.json:
GPT-2's byte-pair encoding (tiktoken) or a character vocabulary."""

import tiktoken

from lib.common import Error


def get_tokenizer(spec, where="tokenizer", vocab_size=None):
    """spec: {"type": "bpe", "encoding": "r50k_base", "lowercase": false} or
    {"type": "char", "chars": "..."}, checked where its file is read (lib/schema.check_tokenizer);
    None: the file (where) names none. With vocab_size, its ids must all index a model's embedding
    table of that many rows."""
    if spec is None:
        raise Error(
            f"{where}: no tokenizer this project knows: add a 'tokenizer' key "
            "(a char one holds 'chars', a bpe one 'encoding')"
        )
    if spec["type"] == "char":
        tokenizer = CharTokenizer(spec["chars"])
    else:
        tokenizer = BPETokenizer(spec["encoding"], spec.get("lowercase", False))
    if vocab_size is not None and tokenizer.vocab_size > vocab_size:
        raise Error(
            f"{where}: the tokenizer has {tokenizer.vocab_size:,} tokens, the model's vocabulary "
            f"{vocab_size:,}: the tokenizer is not the one this model was trained with"
        )
    return tokenizer


class CharTokenizer:
    def __init__(self, chars):
        self.chars = chars
        self.stoi = {c: i for i, c in enumerate(chars)}
        self.vocab_size = len(chars)
        self.start_token = self.stoi.get("\n", 0)  # what an empty prompt starts from
        self.spec = {"type": "char", "chars": chars}

    def encode(self, text):
        unknown = sorted(set(text) - self.stoi.keys())
        if unknown:
            raise Error(f"characters not in this model's vocabulary: {''.join(unknown)!r}")
        return [self.stoi[c] for c in text]

    def encode_batch(self, texts):
        return [self.encode(t) for t in texts]

    def decode(self, ids):
        return "".join(self.chars[i] for i in ids)


class BPETokenizer:
    # r50k_base: GPT-2's, tiktoken's "gpt2" ranks
    def __init__(self, encoding, lowercase=False):
        try:
            self.enc = tiktoken.get_encoding(encoding)
        except Exception as e:  # tiktoken downloads the file once, then reads its cache
            raise Error(
                f"cannot load the tiktoken encoding {encoding!r} ({type(e).__name__}); "
                f"offline, set TIKTOKEN_CACHE_DIR to a folder holding its cache file"
            ) from None
        self.vocab_size = self.enc.n_vocab
        self.start_token = self.enc.eot_token  # <|endoftext|> = 50256
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
        texts = [t.lower() for t in texts] if self.lowercase else texts
        return self.enc.encode_ordinary_batch(texts, num_threads=8)

    def decode(self, ids):
        return self.enc.decode(ids)
