"""Decoding strategies, each a pure function of a batch of logits [B, V] (and, where it needs one, the context [B, t]
of every token so far, prompt included) that returns new logits, so they compose; make_next_token chains them. Names
and meanings follow Hugging Face's generate() and OpenAI's API."""

import math

import torch

from lib.common import Error

NEG_INF = float("-inf")


def token_counts(logits, context):
    """[B, V], same dtype as logits: how many times each token occurs in each row of the context."""
    return torch.zeros_like(logits).scatter_add_(
        1, context, torch.ones_like(context, dtype=logits.dtype)
    )


def frequency_penalty(logits, context, a):
    """OpenAI's frequency penalty: logit -= a * (times the token occurs in the context)."""
    return logits - a * token_counts(logits, context)


def presence_penalty(logits, context, b):
    """OpenAI's presence penalty: logit -= b for every token that occurs in the context at least once."""
    return logits - b * (token_counts(logits, context) > 0).to(logits.dtype)


def repetition_penalty(logits, context, r):
    """Hugging Face's (from the CTRL paper): for tokens in the context, positive logits are divided by r and
    negative ones multiplied by r, so r > 1 makes every seen token less likely, however often it was seen."""
    seen = token_counts(logits, context) > 0
    return torch.where(seen, torch.where(logits < 0, logits * r, logits / r), logits)


def no_repeat_ngram(logits, context, n):
    """Hugging Face's no_repeat_ngram_size: a token that would complete an n-gram already present anywhere in the
    context (prompt and generated tokens alike) gets -inf. n = 1 bans every token seen so far; n = 0 does nothing."""
    if n == 0 or context.size(1) < n:
        return logits
    ngrams = context.unfold(1, n, 1)  # [B, t - n + 1, n], every n-gram of each row
    prefix = context[
        :, context.size(1) - n + 1 :
    ]  # the last n - 1 tokens: the n-gram the next token would end
    match = (ngrams[:, :, :-1] == prefix[:, None, :]).all(-1)  # n-grams that start with that prefix
    hits = torch.zeros_like(logits).scatter_add_(1, ngrams[:, :, -1], match.to(logits.dtype))
    return logits.masked_fill(hits > 0, NEG_INF)


def temperature(logits, t):
    """logits / t: below 1 sharpens the distribution, above 1 flattens it; t = 0 takes the most likely token."""
    return logits / t


def top_k(logits, k):
    """Keep the k largest logits of each row, the rest -inf; k >= V keeps everything. Ties at the k-th value are all
    kept (as Hugging Face), so more than k tokens may survive: [3, 2, 2, 1] with k = 2 keeps 3, 2 and 2."""
    if k >= logits.size(-1):
        return logits
    kth = torch.topk(logits, k, dim=-1).values[:, -1:]
    return logits.masked_fill(logits < kth, NEG_INF)


def top_p(logits, p):
    """Nucleus sampling: keep the smallest set of most likely tokens whose probabilities sum to >= p, the rest
    -inf. The top token always stays; p = 1 keeps everything. Tokens tied with the least likely kept one are kept
    too (as top_k does), so that the result does not depend on how a sort orders equal values."""
    if p >= 1:
        return logits
    probs = torch.softmax(logits, dim=-1)
    sorted_probs = probs.sort(dim=-1, descending=True).values
    n_keep = (sorted_probs.cumsum(-1) < p).sum(
        -1, keepdim=True
    ) + 1  # up to and including the first to reach p
    cutoff = sorted_probs.gather(-1, n_keep.clamp(max=logits.size(-1)) - 1)
    return logits.masked_fill(probs < cutoff, NEG_INF)


# every option: (its function, the value that turns it off, whether the function reads the context), in the order
# of application: the penalties and n-gram blocking on the raw logits, then temperature, top-k, top-p
OPTIONS = dict(
    frequency_penalty=(frequency_penalty, 0.0, True),
    presence_penalty=(presence_penalty, 0.0, True),
    repetition_penalty=(repetition_penalty, 1.0, True),
    no_repeat_ngram_size=(no_repeat_ngram, 0, True),
    temperature=(temperature, 1.0, False),
    top_k=(top_k, None, False),
    top_p=(top_p, 1.0, False),
)
RANGES = dict(
    temperature=(lambda t: t >= 0, ">= 0 (0 = greedy)"),
    top_k=(lambda k: k >= 1, ">= 1"),
    top_p=(lambda p: 0 < p <= 1, "in (0, 1]"),
    repetition_penalty=(lambda r: r > 0, "> 0 (1 = off)"),
    no_repeat_ngram_size=(lambda n: n >= 0, ">= 0 (0 = off)"),
)


def make_next_token(greedy=False, generator=None, **options):
    """next_token(logits [B, V], context [B, t]) -> [B] for GPT.generate, from OPTIONS by name (the rest stay off):
    the filters in OPTIONS' order, then a draw from the softmax, or the argmax when greedy or temperature == 0 (greedy
    skips temperature, top-k and top-p: they never change the argmax). next_token.stages lists the filters that run as
    (name, f(logits, context)); next_token.process(logits, context) applies them all. generator: a torch.Generator
    for the draws, made on its device (a CPU one serves a model on a GPU), so a seed gives the same tokens anywhere.
    An unknown option or a value out of its range raises Error."""
    value = {name: options.pop(name, off) for name, (_, off, _) in OPTIONS.items()}
    if options:
        raise Error(
            f"{next(iter(options))} is not a decoding option (they are {', '.join(OPTIONS)})"
        )
    for name, v in value.items():
        ok, rule = RANGES.get(name, (lambda v: True, ""))
        if v is not None and not (math.isfinite(v) and ok(v)):
            raise Error(
                f"{name} must be {'a finite number' if not math.isfinite(v) else rule}, got {v}"
            )
    greedy = greedy or value["temperature"] == 0
    stage = lambda f, v, reads: (
        (lambda x, context: f(x, context, v)) if reads else (lambda x, context: f(x, v))
    )
    stages = [
        (name, stage(f, value[name], reads))
        for name, (f, off, reads) in OPTIONS.items()
        if value[name] not in (off, None) and (reads or not greedy)
    ]

    def process(logits, context):
        for _, f in stages:
            logits = f(logits, context)
        return logits

    def next_token(logits, context):
        logits = process(logits, context)
        probs = torch.softmax(logits, dim=-1)
        if not torch.isfinite(
            probs
        ).all():  # a row all -inf, or a logit at +inf: no distribution to draw from
            if (logits == NEG_INF).all(-1).any():
                raise Error(
                    "no_repeat_ngram_size blocks every token (it bans each token that would repeat an "
                    "n-gram; with a small vocabulary and a small n that can be all of them)"
                )
            raise Error(
                "temperature or a penalty overflows the logits (try a temperature nearer 1, smaller penalties)"
            )
        if greedy:
            return logits.argmax(dim=-1)
        probs = probs.to(logits.device if generator is None else generator.device)
        return torch.multinomial(probs, 1, generator=generator).squeeze(-1).to(logits.device)

    next_token.stages, next_token.process = stages, process
    return next_token
