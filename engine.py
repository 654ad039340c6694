"""Every GPT decode's engine: continuous batching over one KV cache, each row drawing by its own
generator (never depending on the batch).
  engine = Engine(model, rows=8)
  request = engine.submit(prompt, rules, max_new_tokens=100, end_tokens={eot})  # a row per rule
  while engine.busy(): engine.step()  # request.rows[i].tokens grow
"""

import torch

from cache import KVCache
from decoding import pick_tokens
from lib.common import Error
from lib.options import Option
from model import varying_lengths

# the scripts' --compile (sample.py, serve.py)
COMPILE_OPTION = Option(
    False,
    "compile a GPT's one-token step at the start (seconds to a minute), for long or many "
    "samples: on a CPU it pays with bfloat16, int8 and int8_dynamic weights, not float32",
)


class Row:
    """One sequence: its tokens (prompt, then generated), rule and cache slot."""

    def __init__(
        self, prompt, rule, max_new_tokens, block_size, end_tokens=(), logprobs=None, client=None
    ):
        self.tokens = list(prompt)
        self.prompt_length = len(prompt)
        self.rule = rule
        self.remaining = max_new_tokens
        self.end_tokens = frozenset(end_tokens)  # one drawn ends the row unseen
        self.ended = False  # whether the row drew one (a document's or a turn's end)
        self.end_token = None  # the one it drew
        # the window: tokens[start:] (block_size None: every token, a rolling cache's)
        self.start = max(0, len(prompt) - block_size) if block_size else 0
        self.slot = None
        self.done = False
        self.error = None  # why its decoding stopped short (decoding's Error), or None
        self.bug = False  # whether the error is a failure of the server's step, not of its options
        self.client = client  # who asks (any hashable): the server's requests take turns by it
        # logprobs None: no scores; else each taken token's log-probability and its top logprobs
        self.logprobs = logprobs
        self.token_logprobs = []  # [n generated]
        self.top_logprobs = []  # [n generated][logprobs] of (token, log-probability)

    @property
    def generated(self):
        return self.tokens[self.prompt_length :]

    def finish(self):
        """Stop at the next step (the consumer saw a stop string, or left)."""
        self.done = True


class Request:
    """The rows of one prompt, submitted together and prefilled once."""

    def __init__(self, rows, echo=False):
        self.rows = rows
        self.echo = echo  # whether the prefill scores the prompt
        self.prompt_logprobs = None  # with echo: [len(prompt)], None first (nothing before it)
        self.prompt_top_logprobs = None  # with echo: the top alternatives at each

    @property
    def done(self):
        return all(row.done for row in self.rows)

    def finish(self):
        for row in self.rows:
            row.finish()


class Engine:
    """Continuous batching over a KVCache of `rows` slots; each token's log-probability among the
    tokenizer's vocab_size tokens where asked (a model's vocabulary may be padded past it)."""

    AHEAD_OF_TIME = True  # whether compile may build compiled.OneRowStep, which holds the GIL

    def __init__(self, model, rows, use_cache=True, compile=False, vocab_size=None):
        self.model = model
        self.vocab_size = vocab_size or model.config.vocab_size
        self.block_size = model.config.block_size
        self.use_cache = use_cache  # False: each row's whole window every step, for comparison
        self.device = model.wte.weight.device
        dtype = cache_dtype(model.wte.weight)
        # one spare position: a slice of the keys is never the whole cache, so a compiled step
        # never specializes on a full window
        try:
            if model.endless:  # each row's last window keys and the global ones, rolling
                from patterns import RollingCache  # a window model has imported patterns

                self.cache = RollingCache(model.config, rows, self.device, dtype)
            else:
                self.cache = KVCache(model.config, rows, self.block_size + 1, self.device, dtype)
        except RuntimeError:  # torch.OutOfMemoryError is one
            raise Error(
                f"a KV cache of {rows:,} rows does not fit in memory: ask for fewer"
            ) from None
        self.free = list(range(rows))
        self.waiting = []
        self.active = []
        self.one_token = model
        if compile:  # before any request is timed; compiled.py is --compile's alone
            from compiled import warm_up

            warm_up(self, rows)

    def submit(
        self, prompt, rules, max_new_tokens, end_tokens=(), logprobs=None, echo=False, client=None
    ):
        """A Request of a row per rule, decoded from the next step on; a row that draws one of
        end_tokens (lib/tokenizer.py's end_tokens: the special ones) ends there, without it.
        logprobs: each token's log-probability and its top that many; echo: the prompt scored
        too (it must fit in block_size); client: who asks."""
        if not prompt:
            raise Error("the prompt is empty: give at least one token (a start token)")
        slots = len(self.cache.lengths)
        if len(rules) > slots:
            raise Error(f"{len(rules)} rows asked of an engine of {slots}")
        if echo and len(prompt) > self.block_size:
            raise Error(f"a prompt scored whole must fit in block_size {self.block_size}")
        size = None if self.model.endless else self.block_size
        rows = [
            Row(prompt, rule, max_new_tokens, size, end_tokens, logprobs, client) for rule in rules
        ]
        request = Request(rows, echo)
        # queued only once whole: a server's thread steps while requests come in
        self.waiting.append(request)
        return request

    def busy(self):
        return bool(self.waiting or self.active)

    @torch.no_grad()
    def step(self):
        """A token for every active row, then requests that fit join -> the rows taking one."""
        self.release()
        with varying_lengths(self.device):
            took = self.decode(self.active)
        took += self.admit()
        self.release()
        return took

    def admit(self):
        """Waiting requests join while their rows fit -> the rows that took a token."""
        took = []
        while self.waiting:
            request = self.next_waiting()
            if len(request.rows) > len(self.free):
                break  # it waits for slots: no later request takes them first
            self.waiting.remove(request)
            rows = [row for row in request.rows if not row.done]
            if not rows:
                continue
            for row in rows:
                # the lowest free slots: one request's rows in order, views of the cache
                row.slot = min(self.free)
                self.free.remove(row.slot)
            logits = self.prompt_logits(request, rows[0])
            if self.use_cache:
                self.cache.copy(rows[0].slot, [row.slot for row in rows[1:]])
            self.active.extend(rows)
            if rows[0].remaining:
                took += self.take(rows, logits.expand(len(rows), -1))
            else:  # no token asked: the prompt only (a prompt_logits hook may score it)
                request.finish()
        return took

    def next_waiting(self):
        """The waiting request whose turn it is: the first come."""
        return self.waiting[0]

    def prompt_logits(self, request, row):
        """The logits [1, vocab] after the request's prompt, prefilled into row; with echo, each
        prompt token's log-probability given the ones before it and the top alternatives at each."""
        if not request.echo:
            return self.prefill(row)
        logits = self.prefill(row, len(row.tokens))  # (T, vocab): every position's
        within = logits[:-1, : self.vocab_size]
        chosen, alternatives = log_probabilities(within, row.tokens[1:], row.logprobs or 0)
        request.prompt_logprobs = [None, *chosen]
        request.prompt_top_logprobs = [None, *alternatives]
        return logits[-1:]

    def prefill(self, row, keep=1):
        """The row's window through the model, into its slot afresh -> its last keep logits. A
        rolling cache takes it in chunks of block_size, each query reading the slots the chunks
        before it left: what the model computes on the whole sequence, at a bounded cost."""
        window = row.tokens[row.start :]
        n = len(window)
        chunk = self.block_size if self.use_cache and self.model.endless else n
        if self.use_cache:
            self.cache.reset(row.slot)
        kept = []
        for start in range(0, n, chunk):
            end = min(n, start + chunk)
            idx = torch.tensor([window[start:end]], device=self.device)  # (1, T)
            step = self.cache.step([row.slot], end - start) if self.use_cache else None
            wanted = end - max(start, n - keep)  # this chunk's share of the last keep
            with torch.inference_mode(self.use_cache):  # as decode()'s
                logits, _ = self.model(idx, cache=step, logits_to_keep=max(1, wanted))
            if wanted > 0:
                kept.append(logits[0])  # (keep, vocab)
        return torch.cat(kept)

    def decode(self, rows):
        """The rows' last tokens through the model in one forward -> the rows that took one."""
        took = []
        batched = []
        for row in rows:
            if self.slide(row) or not self.use_cache:  # a prefill of its own
                took += self.take([row], self.prefill(row))
            else:
                batched.append(row)
        if batched:
            idx = torch.tensor([[row.tokens[-1]] for row in batched], device=self.device)  # (B, 1)
            logits = self.next_logits(idx, [row.slot for row in batched])
            took += self.take(batched, logits)
        return took

    def next_logits(self, idx, slots):
        """The logits [B, vocab] after one new token idx [B, 1] in each of slots: the one-token
        step, eager at position 0, where a compiled step would hold a single key as a constant."""
        step = self.cache.step(slots, 1)
        forward = self.model if step.n_keys == 1 else self.one_token
        # no version counters or autograd records: a tenth off a small model's token; a
        # cached forward keeps no tensor that a later training step could meet
        with torch.inference_mode():
            logits, _ = forward(idx, cache=step, logits_to_keep=1)
        return logits[:, -1]  # (B, 1, vocab) -> (B, vocab)

    def slide(self, row):
        """Whether the row's window restarts (past block_size) as its last block_size // 2; a
        rolling cache's never does."""
        if self.model.endless or len(row.tokens) - row.start <= self.block_size:
            return False
        # positions are absolute: a full cache cannot slide
        row.start = len(row.tokens) - max(1, self.block_size // 2)
        return True

    def take(self, rows, logits):
        """Each row's next token from its logits -> the rows that took one."""
        # rows that share their options draw as one batch, each from its own generator
        tokens = pick_tokens([row.rule for row in rows], logits, [row.tokens for row in rows])
        took = []
        for row, row_logits, token in zip(rows, logits, tokens):
            if isinstance(token, Error):  # its options leave no token: it ends alone
                row.error = str(token)
                row.done = True
                continue
            if token in row.end_tokens:  # a document or turn ends: the row ends without it
                row.ended, row.end_token = True, token
                row.done = True
                continue
            self.score(row, row_logits, token)
            row.tokens.append(token)
            row.remaining -= 1
            if row.remaining == 0:
                row.done = True
            took.append(row)
        return took

    def score(self, row, logits, token):
        """The log-probability of the token row takes (and the top alternatives), before its
        readers see the token."""
        if row.logprobs is None:
            return
        within = logits[None, : self.vocab_size]  # (1, vocab_size)
        chosen, top = log_probabilities(within, [token], row.logprobs)
        row.token_logprobs += chosen
        if row.logprobs:
            row.top_logprobs += top

    def release(self):
        for row in [row for row in self.active if row.done]:
            self.active.remove(row)
            self.free.append(row.slot)


def cache_dtype(weight):
    """The KV cache's dtype: float32 on a CPU, whose bfloat16 attention is slower."""
    return torch.float32 if weight.device.type == "cpu" else weight.dtype


def log_probabilities(logits, tokens, top):
    """Each of tokens' log-probability under logits [len(tokens), vocab] (the model's, before any
    decoding option), and each position's top alternatives as [(token, log-probability)]."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    chosen = logprobs[range(len(tokens)), tokens]  # position i's of tokens[i]
    values, top_ids = logprobs.topk(top, dim=-1)  # [len(tokens), top]
    pairs = zip(top_ids.tolist(), values.tolist())
    return chosen.tolist(), [list(zip(*pair)) for pair in pairs]
