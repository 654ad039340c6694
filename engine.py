"""
The generation engine: every GPT decode of the project (sample.py, the playground, the tests) runs
here. One KVCache of `rows` slots; requests join a running batch at a step boundary (their prompt
prefilled once and copied to each of their rows, as nanochat's engine does), every active row then
takes one token a step in one batched forward (continuous batching, as vLLM's), and a row that
finishes frees its slot. Each row keeps its own decoding (its pick, with its own generator), so
its tokens never depend on what else is in the batch.
  engine = Engine(model, rows=8)
  request = engine.submit(prompt, picks, max_new_tokens=100)    one row per pick
  while engine.busy(): engine.step()                            request.rows[i].tokens grow
With compile=True the one-token step runs through torch.compile (gpt-fast's compiled decode):
compiled once at construction; on a CPU it pays with bfloat16 and int8 weights (BENCHMARKS.md).
The window past block_size is the model's rule: once a row's context would pass it, it restarts
from the last block_size // 2 tokens (positions are absolute, so a full cache cannot slide); the
uncached path (use_cache=False, for comparison) runs each row's whole window every step instead.
"""

import time
from collections import Counter, deque

import torch
from torch.nn.attention import sdpa_kernel

from decoding import pick_tokens
from lib.common import Error
from model import VARYING_LENGTHS, KVCache


class Row:
    """One sequence: its tokens (prompt, then what was generated), how it picks the next token,
    how many more it may make, its slot in the cache, and with logprobs the chosen tokens'
    log-probabilities (and the top `logprobs` alternatives when > 0)."""

    def __init__(self, prompt, pick, max_new_tokens, block_size, logprobs=None, client=None):
        self.tokens = list(prompt)
        self.prompt_length = len(prompt)
        self.pick = pick
        self.remaining = max_new_tokens
        self.start = max(0, len(prompt) - block_size)  # the window: tokens[start:]
        self.slot = None
        self.done = False
        self.logprobs = logprobs
        self.token_logprobs = []
        self.top_logprobs = []
        self.error = None  # why its decoding stopped short (decoding's Error), or None
        self.client = client  # who asked for it: waiting requests take turns by client

    @property
    def generated(self):
        return self.tokens[self.prompt_length :]

    def finish(self):
        """Stop at the next step boundary (the consumer saw a stop string, or left)."""
        self.done = True


class Request:
    """The rows of one prompt, submitted together and prefilled once. With echo, the prefill
    also scores the prompt: each prompt token's log-probability given the ones before it (None
    for the first, which has none) and, with logprobs > 0, the top alternatives at each."""

    def __init__(self, rows, echo=False):
        self.rows = rows
        self.echo = echo
        self.prompt_logprobs = None
        self.prompt_top_logprobs = None
        self.first_token = None  # when its first tokens came: time to first token

    @property
    def done(self):
        return all(row.done for row in self.rows)

    def finish(self):
        for row in self.rows:
            row.finish()


class Engine:
    """Continuous batching over one KVCache of `rows` slots (see the module's docstring)."""

    def __init__(self, model, rows, use_cache=True, compile=False):
        self.model = model
        self.block_size = model.config.block_size
        self.use_cache = use_cache
        weight = model.wte.weight
        self.device = weight.device
        # one spare position: a slice of the keys is never the whole cache, so a compiled step
        # never specializes on a full window
        length = self.block_size + 1
        dtype = cache_dtype(weight)
        self.cache = KVCache(model.config, rows, length, self.device, dtype)
        self.free = list(range(rows))
        self.waiting = deque()
        self.active = []
        self.one_token = model
        if compile:
            self.one_token = torch.compile(model, dynamic=True)
            try:
                self.warm_up(rows)
            except torch._dynamo.exc.BackendCompilerFailed as e:  # no C++ compiler, say
                reason = str(e).strip().splitlines()[0]
                raise Error(
                    f"torch.compile failed ({reason}): drop --compile, or install a C++ compiler"
                ) from None

    def submit(self, prompt, picks, max_new_tokens, logprobs=None, echo=False, client=None):
        """A Request of one row per pick, decoded from the next step on; prompt: token ids.
        echo: score the prompt too (it must fit in block_size). client: who asks (any
        hashable): waiting requests take turns by client (next_waiting)."""
        if not prompt:
            raise Error("the prompt is empty: give at least one token (a start token)")
        slots = len(self.cache.lengths)
        if len(picks) > slots:
            raise Error(f"{len(picks)} rows asked of an engine of {slots}")
        if echo and len(prompt) > self.block_size:
            raise Error(f"a prompt scored whole must fit in block_size {self.block_size}")
        rows = [
            Row(prompt, pick, max_new_tokens, self.block_size, logprobs, client) for pick in picks
        ]
        request = Request(rows, echo)
        self.waiting.append(request)
        return request

    def warm_up(self, rows):
        """Throwaway steps of one row and of every row, which compile the one-token step before
        any request is timed: the compiler keeps one graph for a single row (a size it
        specializes on) and one for any larger batch."""
        for size in sorted({1, rows}):
            slots = list(range(size))
            idx = torch.zeros(size, 1, dtype=torch.long, device=self.device)
            with torch.no_grad(), sdpa_kernel(VARYING_LENGTHS):
                # position 0 eager, 1 compiled: the compiler would make a single key a constant
                self.model(idx, cache=self.cache.step(slots, 1), logits_to_keep=1)
                self.one_token(idx, cache=self.cache.step(slots, 1), logits_to_keep=1)
            for row in slots:
                self.cache.reset(row)

    def busy(self):
        return bool(self.waiting or self.active)

    @torch.no_grad()
    def step(self):
        """One token for every active row, the waiting requests that fit joining first; returns
        the rows that took one."""
        self.release()
        joined = self.admit()
        decoding = [row for row in self.active if row not in joined]
        with sdpa_kernel(VARYING_LENGTHS):
            self.decode(decoding)
        self.release()
        return joined + decoding

    def admit(self):
        """Requests join while their rows fit in the free slots: the prompt's window prefilled
        once into the first row's slot, copied to the others, each row's first token picked."""
        joined = []
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
            # every position's logits to score the prompt, else the last one's
            keep = len(rows[0].tokens) if request.echo else 1
            logits = self.prefill(rows[0], keep)
            if self.use_cache:
                self.cache.copy(rows[0].slot, [row.slot for row in rows[1:]])
            if request.echo:
                score_prompt(request, logits, rows[0].logprobs)
            self.take(rows, logits[-1:].expand(len(rows), -1))
            request.first_token = time.perf_counter()
            self.active.extend(rows)
            joined.extend(rows)
        return joined

    def next_waiting(self):
        """The waiting request whose turn it is: the first of the client with the fewest rows
        decoding, so that one client's many requests take turns with the others' instead of
        holding them back; first come, first served between equals."""
        decoding = Counter(row.client for row in self.active)
        turns = [decoding[request.rows[0].client] for request in self.waiting]
        return self.waiting[turns.index(min(turns))]

    def prefill(self, row, keep=1):
        """The row's window through the model (with the cache, into its slot afresh) -> the
        logits [keep, vocab] of its last keep positions."""
        window = row.tokens[row.start :]
        idx = torch.tensor([window], device=self.device)
        step = None
        if self.use_cache:
            self.cache.reset(row.slot)
            step = self.cache.step([row.slot], len(window))
        logits, _ = self.model(idx, cache=step, logits_to_keep=keep)
        return logits[0]

    def decode(self, rows):
        """Each row's last token through the model in one forward (a row whose window is full
        restarts it with a prefill of its own, as every row does without the cache), and each
        row's next token picked."""
        batched = []
        for row in rows:
            if self.slide(row) or not self.use_cache:
                self.take([row], self.prefill(row))
            else:
                batched.append(row)
        if not batched:
            return
        idx = torch.tensor([[row.tokens[-1]] for row in batched], device=self.device)
        step = self.cache.step([row.slot for row in batched], 1)
        logits, _ = self.one_token(idx, cache=step, logits_to_keep=1)
        self.take(batched, logits[:, -1])

    def slide(self, row):
        """Whether the row's window must restart: its last token would take it past
        block_size, so it becomes the last block_size // 2 tokens."""
        if len(row.tokens) - row.start <= self.block_size:
            return False
        row.start = len(row.tokens) - max(1, self.block_size // 2)
        return True

    def take(self, rows, logits):
        """Each row's next token from its row of logits [len(rows), vocab], picked with its whole
        context (decoding.pick_tokens: rows that share their options pick as one batch); rows
        asked for no tokens are done instead."""
        if not rows[0].remaining:  # a request's rows share max_new_tokens
            for row in rows:
                row.done = True
            return
        tokens = pick_tokens([row.pick for row in rows], logits, [row.tokens for row in rows])
        for row, row_logits, token in zip(rows, logits, tokens):
            if isinstance(token, Error):
                row.error = str(token)
                row.done = True
                continue
            if row.logprobs is not None:
                chosen, top = log_probabilities(row_logits[None], [token], row.logprobs)
                row.token_logprobs += chosen
                if row.logprobs:
                    row.top_logprobs += top
            row.tokens.append(token)
            row.remaining -= 1
            if row.remaining == 0:
                row.done = True

    def fail(self, message):
        """Every row in the engine ends with message as its error (a bug in a step)."""
        for row in self.active + [row for request in self.waiting for row in request.rows]:
            row.error = message
            row.done = True
        self.waiting.clear()
        self.release()

    def release(self):
        """The slots of rows that are done go back to the free list."""
        for row in [row for row in self.active if row.done]:
            self.active.remove(row)
            self.free.append(row.slot)


def cache_dtype(weight):
    """The KV cache's dtype for weights like weight: attention runs in it, and a CPU's bfloat16
    attention is several times slower than its float32 one (BENCHMARKS.md)."""
    return torch.float32 if weight.device.type == "cpu" else weight.dtype


def log_probabilities(logits, tokens, top):
    """Each of tokens' log-probability under logits [len(tokens), vocab] (the model's, before any
    decoding option), and each position's top alternatives as [(token, log-probability)]."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    ids = torch.tensor(tokens, device=logits.device)
    chosen = logprobs.gather(1, ids[:, None])[:, 0]
    values, top_ids = logprobs.topk(top, dim=-1)  # [len(tokens), top]
    pairs = zip(top_ids.tolist(), values.tolist())
    return chosen.tolist(), [list(zip(*pair)) for pair in pairs]


def score_prompt(request, logits, top):
    """The request's prompt scored from its prefill's logits [T, vocab]: token t + 1's
    log-probability after tokens 0..t, and with top > 0 the top alternatives."""
    tokens = request.rows[0].tokens[1:]
    chosen, alternatives = log_probabilities(logits[:-1], tokens, top or 0)
    request.prompt_logprobs = [None, *chosen]
    request.prompt_top_logprobs = [None, *alternatives]
