"""Decoding strategies, pure functions of logits [B, V] (some also of the context [B, t]) that
compose, named as Hugging Face's and OpenAI's; NextToken applies them and draws."""

import math
from dataclasses import dataclass, fields

import torch

from lib.common import Error
from lib.options import options_of, setting

NEG_INF = float("-inf")


def token_counts(logits, context):
    """[B, V]: each token's count in each row of the context."""
    ones = torch.ones_like(context, dtype=logits.dtype)
    return torch.zeros_like(logits).scatter_add_(1, context, ones)


def frequency_penalty(logits, context, a):
    """OpenAI's: logit -= a * count."""
    return logits - a * token_counts(logits, context)


def presence_penalty(logits, context, b):
    """OpenAI's: logit -= b if count > 0."""
    return logits - b * token_counts(logits, context).clamp(max=1)


def repetition_penalty(logits, context, r):
    """Hugging Face's (CTRL's): a seen token's logit / r if positive, x r if negative."""
    seen = token_counts(logits, context) > 0
    penalised = torch.where(logits < 0, logits * r, logits / r)
    return torch.where(seen, penalised, logits)


def no_repeat_ngram(logits, context, n):
    """Hugging Face's: -inf for each token that would repeat an n-gram of the context."""
    if context.size(1) < n:
        return logits
    ngrams = context.unfold(1, n, 1)  # [B, t - n + 1, n], every n-gram of each row
    # the n-grams that start with the last n - 1 tokens (those the next token would end), and the
    # tokens that end them
    match = (ngrams[:, :, :-1] == ngrams[:, -1:, 1:]).all(-1)
    hits = torch.zeros_like(logits).scatter_add_(1, ngrams[:, :, -1], match.to(logits.dtype))
    return logits.masked_fill(hits > 0, NEG_INF)


def temperature(logits, t):
    return logits / t


def top_k(logits, k):
    """Keep each row's k largest logits, and ties (as Hugging Face)."""
    if k >= logits.size(-1):
        return logits
    kth = logits.topk(k).values[:, -1:]
    return logits.masked_fill(logits < kth, NEG_INF)


def top_p(logits, p):
    """Nucleus sampling: keep the fewest top tokens whose probabilities sum to >= p, and ties."""
    if p >= 1:
        return logits
    probs = logits.softmax(-1)
    sorted_probs = probs.sort(descending=True).values
    # the last token kept: the first to reach p (the last of all where rounding keeps sums below p)
    last = (sorted_probs.cumsum(-1) < p).sum(-1, keepdim=True).clamp(max=logits.size(-1) - 1)
    return logits.masked_fill(probs < sorted_probs.gather(-1, last), NEG_INF)


@dataclass(frozen=True)
class Options:
    """Every decoding option, in the order NextToken applies them."""

    frequency_penalty: float = setting(
        0.0, "OpenAI's: logit -= a x (times the token occurs so far)", ge=-2, le=2
    )
    presence_penalty: float = setting(
        0.0, "OpenAI's: logit -= b for each token that occurs at all", ge=-2, le=2
    )
    repetition_penalty: float = setting(
        1.0, "Hugging Face's: seen tokens' logits / r if > 0, x r if < 0 (1 = off)", gt=0
    )
    no_repeat_ngram_size: int = setting(
        0, "Hugging Face's: never repeat an n-gram of the prompt or output (0 = off)", ge=0
    )
    temperature: float = setting(1.0, "logits / t: < 1 sharper, > 1 flatter (0 = greedy)", ge=0)
    top_k: int = setting(0, "keep the k most likely tokens (0 = off)", ge=0)
    top_p: float = setting(
        1.0, "keep the most likely tokens up to probability p (1 = off)", gt=0, le=1
    )

    def __post_init__(self):
        for name, key in options_of(Options).items():
            key.check(name, getattr(self, name))


# sample.py's and the playground page's defaults (nanoGPT's), where they differ from the off
# values; the API keeps the off values, OpenAI's defaults, for OpenAI's clients
SAMPLE_DEFAULTS = dict(temperature=0.8, top_k=200)

# each option's strategy: those that read the context, and those of the logits alone
READS_CONTEXT = dict(
    frequency_penalty=frequency_penalty,
    presence_penalty=presence_penalty,
    repetition_penalty=repetition_penalty,
    no_repeat_ngram_size=no_repeat_ngram,
)
FILTERS = dict(temperature=temperature, top_k=top_k, top_p=top_p)


class NextToken:
    """(logits [B, V], context [B, t]) -> tokens [B] below vocab_size: the options on, then a draw
    by generator (a CPU one: a seed's tokens on any device), or the argmax if greedy."""

    def __init__(self, options, greedy=False, generator=None, vocab_size=None):
        self.options = options
        self.greedy = greedy or options.temperature == 0
        self.generator = generator
        self.vocab_size = vocab_size

    def on(self):
        """(name, value) of each option not at its off value; greedy skips the FILTERS."""
        for f in fields(self.options):
            value = getattr(self.options, f.name)
            if value != f.default and not (self.greedy and f.name in FILTERS):
                yield f.name, value

    def stages(self, logits, context):
        """("raw", logits within vocab_size), then (option, logits after it) for each one on."""
        logits = logits[:, : self.vocab_size]
        yield "raw", logits
        for name, value in self.on():
            if name in FILTERS:
                logits = FILTERS[name](logits, value)
            else:
                logits = READS_CONTEXT[name](logits, context, value)
            yield name, logits

    def process(self, logits, context):
        name, last = list(self.stages(logits, context))[-1]
        return last

    def no_distribution(self, logits, context):
        """Why the processed logits have no softmax: the first stage with none."""
        stages = self.stages(logits, context)
        name, x = next((n, x) for n, x in stages if not torch.isfinite(x.softmax(-1)).all())
        if name == "raw":
            return "the model's logits are not finite numbers"
        if (x == NEG_INF).all(-1).any():
            return (
                f"{name} blocks every token (it bans each token that would repeat an "
                "n-gram; with a small vocabulary and a small n that can be all of them)"
            )
        return f"{name} overflows the logits (try a value nearer its off value)"

    def reads_context(self):
        return any(name in READS_CONTEXT for name, value in self.on())

    def __call__(self, logits, context):
        return self.draw(self.process(logits, context), logits, context)

    def draw(self, processed, logits, context):
        if self.greedy:
            picked, token = processed.max(-1)  # the first of ties, as argmax
            # a softmax where the pick's logit is finite: a NaN or +inf would be the max, and
            # -inf only where every logit is (checked on the host: torch's isfinite is 3 ops)
            if not all(map(math.isfinite, picked.tolist())):
                raise Error(self.no_distribution(logits, context))
            return token
        probs = processed.softmax(-1)
        if not torch.isfinite(probs).all():
            raise Error(self.no_distribution(logits, context))
        if self.generator:
            probs = probs.to(self.generator.device)
        token = torch.multinomial(probs, 1, generator=self.generator)
        return token[:, 0].to(logits.device)


def make_rules(options, greedy, seed, n, vocab_size):
    """One decoding rule (a NextToken) per sample, sample i's generator seeded seed + i."""
    return [
        NextToken(options, greedy, torch.Generator().manual_seed(seed + i), vocab_size)
        for i in range(n)
    ]


def pick_tokens(rules, logits, contexts):
    """Row i's next token (an int) by rules[i], or its Error; rows that share options are
    processed as one batch, each drawing from its own generator."""
    groups = {}
    for i, rule in enumerate(rules):
        length = len(contexts[i]) if rule.reads_context() else 0
        key = rule.options, rule.greedy, rule.vocab_size, length
        groups.setdefault(key, []).append(i)
    tokens = [None] * len(rules)
    for rows in groups.values():
        first = rules[rows[0]]
        context = None
        if first.reads_context():
            context = torch.tensor([contexts[i] for i in rows], device=logits.device)
        # every row: the logits as they are, no copy
        processed = first.process(logits if len(rows) == len(rules) else logits[rows], context)
        for j, i in enumerate(rows):
            own = None if context is None else context[j : j + 1]
            try:
                tokens[i] = int(rules[i].draw(processed[j : j + 1], logits[i : i + 1], own))
            except Error as e:  # no token left to draw: this row's options, not the others'
                tokens[i] = e
    return tokens
