"""Decoding strategies, each a pure function of a batch of logits [B, V] (and, where it needs one, the context [B, t]
of every token so far, prompt included) that returns new logits, so they compose; make_next_token chains them. Names
and meanings follow Hugging Face's generate() and OpenAI's API."""
import math

import torch

from lib.common import Error

NEG_INF = float("-inf")


def token_counts(logits, context):
    """[B, V], same dtype as logits: how many times each token occurs in each row of the context."""
    return torch.zeros_like(logits).scatter_add_(1, context, torch.ones_like(context, dtype=logits.dtype))


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
    prefix = context[:, context.size(1) - n + 1:]  # the last n - 1 tokens: the n-gram the next token would end
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
    n_keep = (sorted_probs.cumsum(-1) < p).sum(-1, keepdim=True) + 1  # up to and including the first to reach p
    cutoff = sorted_probs.gather(-1, n_keep.clamp(max=logits.size(-1)) - 1)
    return logits.masked_fill(probs < cutoff, NEG_INF)


# the strategies by their option names, for make_next_token, whose keyword arguments take those names
STRATEGIES = dict(frequency_penalty=frequency_penalty, presence_penalty=presence_penalty,
                  repetition_penalty=repetition_penalty, temperature=temperature, top_k=top_k, top_p=top_p)


def make_next_token(temperature=1.0, top_k=None, top_p=None, frequency_penalty=0.0, presence_penalty=0.0,
                    repetition_penalty=1.0, no_repeat_ngram_size=0, greedy=False, generator=None):
    """next_token(logits [B, V], context [B, t]) -> [B] for GPT.generate: the penalties and n-gram blocking on the raw
    logits, then temperature, top-k, top-p, then a draw from the softmax, or the argmax when greedy or temperature == 0
    (greedy skips those three: they never change the argmax); next_token.process(logits, context) is the filtering
    alone, and options at their defaults cost nothing. generator: a torch.Generator for the draws, made on its device
    (a CPU one serves a model on a GPU), so a seed gives the same tokens anywhere. Values out of range raise Error."""
    values = dict(temperature=temperature, top_p=top_p, frequency_penalty=frequency_penalty,
                  presence_penalty=presence_penalty, repetition_penalty=repetition_penalty)
    checks = [(v is None or math.isfinite(v), f"{k} must be a finite number, got {v}") for k, v in values.items()]
    checks += [(temperature >= 0, f"temperature must be >= 0 (0 = greedy), got {temperature}"),
              (top_k is None or top_k >= 1, f"top_k must be >= 1, got {top_k}"),
              (top_p is None or 0 < top_p <= 1, f"top_p must be in (0, 1], got {top_p}"),
              (repetition_penalty > 0, f"repetition_penalty must be > 0 (1 = off), got {repetition_penalty}"),
              (no_repeat_ngram_size >= 0, f"no_repeat_ngram_size must be >= 0 (0 = off), got {no_repeat_ngram_size}")]
    for ok, message in checks:
        if not ok:
            raise Error(message)
    greedy = greedy or temperature == 0
    on_context = [(f, v) for f, v, active in [  # f(logits, context, v)
        (STRATEGIES["frequency_penalty"], frequency_penalty, frequency_penalty != 0),
        (STRATEGIES["presence_penalty"], presence_penalty, presence_penalty != 0),
        (STRATEGIES["repetition_penalty"], repetition_penalty, repetition_penalty != 1),
        (no_repeat_ngram, no_repeat_ngram_size, no_repeat_ngram_size > 0)] if active]
    on_logits = [(f, v) for f, v, active in [  # f(logits, v)
        (STRATEGIES["temperature"], temperature, temperature != 1),
        (STRATEGIES["top_k"], top_k, top_k is not None),
        (STRATEGIES["top_p"], top_p, top_p is not None and top_p < 1)] if active and not greedy]

    def process(logits, context):
        for f, v in on_context:
            logits = f(logits, context, v)
        for f, v in on_logits:
            logits = f(logits, v)
        return logits

    def next_token(logits, context):
        logits = process(logits, context)
        if not torch.isfinite(logits).any(-1).all():
            raise Error("every token is blocked (no_repeat_ngram_size bans each token that would repeat an "
                        "n-gram; with a small vocabulary and a small n that can be all of them)")
        if greedy:
            return logits.argmax(dim=-1)
        probs = torch.softmax(logits, dim=-1).to(logits.device if generator is None else generator.device)
        return torch.multinomial(probs, 1, generator=generator).squeeze(-1).to(logits.device)

    next_token.process = process
    return next_token
