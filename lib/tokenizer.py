"""Tokenizers, named by a dataset's meta.json: GPT-2's byte-pair encoding (tiktoken) or a character vocabulary."""

import tiktoken

from lib.common import Error


def get_tokenizer(spec, where="tokenizer"):
    """spec: {"type": "bpe", "encoding": "r50k_base", "lowercase": false} or {"type": "char", "chars": "..."}; where:
    the file it comes from, for the error a missing or damaged spec gets."""
    needs = {"char": "chars", "bpe": "encoding"}.get(
        spec.get("type") if isinstance(spec, dict) else None
    )
    if needs is None or needs not in spec:
        raise Error(
            f"{where}: no tokenizer this project knows ({str(spec)[:60]}): a char one needs 'chars', a bpe "
            f"one 'encoding'"
        )
    if needs == "chars":
        return CharTokenizer(spec["chars"])
    return BPETokenizer(spec["encoding"], spec.get("lowercase", False))


class CharTokenizer:
    def __init__(self, chars):
        self.chars, self.stoi = chars, {c: i for i, c in enumerate(chars)}
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
    def __init__(
        self, encoding="r50k_base", lowercase=False
    ):  # r50k_base: GPT-2's, tiktoken's "gpt2" ranks
        try:
            self.enc = tiktoken.get_encoding(encoding)
        except Exception as e:  # tiktoken downloads the file once, then reads its cache
            raise Error(
                f"cannot load the tiktoken encoding {encoding!r} ({type(e).__name__}); offline, set "
                f"TIKTOKEN_CACHE_DIR to a folder holding its cache file"
            ) from None
        self.vocab_size, self.start_token = (
            self.enc.n_vocab,
            self.enc.eot_token,
        )  # <|endoftext|> = 50256
        self.pad_token_id = (
            self.start_token
        )  # never produced from text: padding cannot be mistaken for a token
        self.lowercase = lowercase  # "Oil", " oil", "OIL": one token, which small labelled sets spread thinly otherwise
        self.spec = {
            "type": "bpe",
            "encoding": encoding,
            **({"lowercase": True} if lowercase else {}),
        }

    def encode(self, text):
        return self.enc.encode_ordinary(
            text.lower() if self.lowercase else text
        )  # special tokens are plain text

    def encode_batch(self, texts):
        return self.enc.encode_ordinary_batch(
            [t.lower() for t in texts] if self.lowercase else texts, num_threads=8
        )

    def decode(self, ids):
        return self.enc.decode(ids)
