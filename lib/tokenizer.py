"""The tokenizers a dataset's meta.json or a checkpoint names: characters, or a byte-pair encoding
(lib/bpe_tokenizer.py: GPT-2's through tiktoken, or one trained on the data)."""

from lib.common import Error

# the end of a document: a token of its own, never produced from text
EOT = "<|endoftext|>"


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
    else:
        from lib.bpe_tokenizer import bpe_tokenizer

        tokenizer = bpe_tokenizer(spec, where)
    if "chat" in spec:  # a chat fine-tune's: its tokens after
        from lib.chat import with_chat

        tokenizer = with_chat(tokenizer, spec["chat"], where)
    if vocab_size is not None and tokenizer.vocab_size > vocab_size:
        raise Error(
            f"{where}: the tokenizer has {tokenizer.vocab_size:,} tokens, the model's vocabulary "
            f"{vocab_size:,}: the tokenizer is not the one this model was trained with"
        )
    return tokenizer


class CharTokenizer:
    name = "characters"

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


def special_tokens(tokenizer):
    """{token: id} of the ids no text encodes to, which follow the vocabulary's in id order:
    <|endoftext|>, then a chat tokenizer's."""
    found = {} if tokenizer.eot_token is None else {EOT: tokenizer.eot_token}
    return found | getattr(tokenizer, "ids", {})


def end_tokens(tokenizer):
    """The ids that end a decode: every special token, none of which is text. A chat model's
    role marker drawn mid-reply ends it as <|end|> does: a reply never holds a marker."""
    return frozenset(special_tokens(tokenizer).values())


def pieces(tokenizer, ids):
    """The text of ids in pieces -> [(text, whether a special token)]: each special token its
    name, alone; each run of other tokens between them its decoded text (the last, maybe "")."""
    names = {i: name for name, i in special_tokens(tokenizer).items()}
    decode = getattr(tokenizer, "base", tokenizer).decode  # a chat tokenizer's splits here
    made, run = [], []
    for i in ids:
        if i in names:
            made += [(decode(run), False), (names[i], True)]
            run = []
        else:
            run.append(i)
    return made + [(decode(run), False)]
