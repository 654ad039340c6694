"""The scheduler: a GPT's engine stepped by a thread of its own, every request's rows sharing
each step (continuous batching), requests taking turns by client, each step's time measured for
the deadline's estimate, and a failure in a step ending only the request it came from."""

import asyncio
import math
import threading
import time
import traceback
from collections import Counter

import torch

from engine import Engine
from model import varying_lengths

MAX_ROWS = 32  # a GPT's KV cache rows: the most choices decoding at once (more wait their turn)


class ServingEngine(Engine):
    """The engine with what the server adds: waiting requests taking turns by client, each step's
    prefill timed apart, and a failure that ends the request it came from only."""

    # the decoder thread's steps release the GIL to the event loop: Dynamo's compiled step does,
    # the ahead-of-time one does not
    AHEAD_OF_TIME = False

    def __init__(self, model, rows, vocab_size=None, compile=False):
        super().__init__(model, rows, compile=compile, vocab_size=vocab_size)
        self.admitting = None  # the request whose prompt this step prefills now
        self.prefill_seconds = 0.0  # this step's time in prefills
        self.prefilled = 0  # this step's prompt tokens prefilled

    def step(self):
        """Engine.step, its prefills timed apart (prefill_seconds, prefilled)."""
        self.admitting = None
        self.prefill_seconds = 0.0
        self.prefilled = 0
        return super().step()

    def prefill(self, row, keep=1):
        started = time.perf_counter()
        logits = super().prefill(row, keep)
        logits[-1, 0].item()  # the device done with it
        self.prefill_seconds += time.perf_counter() - started
        self.prefilled += len(row.tokens) - row.start
        return logits

    @torch.no_grad()
    def time_step(self):
        """Seconds of one decoding step of every row, on a throwaway token: the second of two
        (the first pays for warming up); the cache is left empty."""
        slots = list(range(len(self.cache.lengths)))
        idx = torch.zeros(len(slots), 1, dtype=torch.long, device=self.device)
        took = 0.0
        for _ in range(2):
            with varying_lengths(self.device):
                self.next_logits(idx, slots)  # position 0: the timed step reads two keys
                started = time.perf_counter()
                self.next_logits(idx, slots)[0, 0].item()
                took = time.perf_counter() - started
            for slot in slots:
                self.cache.reset(slot)
        return took

    def next_waiting(self):
        """The first request of the client with the fewest rows decoding: one client's many
        requests take turns with the others' (first come, first served between equals)."""
        decoding = Counter(row.client for row in self.active)
        turns = [decoding[request.rows[0].client] for request in self.waiting]
        return self.waiting[turns.index(min(turns))]

    def prompt_logits(self, request, row):
        self.admitting = request
        return super().prompt_logits(request, row)

    def fail(self, message):
        """A bug in a step: the request it was admitting ends with message as its error, or, where
        the failure came after (in the batch's decoding, no row to blame), the rows decoding;
        waiting requests wait on, and every slot no decoding row holds goes back."""
        # a step decodes the running rows, then admits: a failure while admitting is its request's
        request = self.admitting
        failed = list(self.active) if request is None else request.rows
        for row in failed:
            row.error = message
            row.bug = True
            row.done = True
        self.release()
        held = {row.slot for row in self.active}
        self.free = [slot for slot in range(len(self.cache.lengths)) if slot not in held]
        self.admitting = None


class Decoder:
    """A GPT's Engine, stepped by a thread of its own while it has work: every request's rows
    share each model step (continuous batching), and the requests' consumers, on the server's
    event loop, wake after each step."""

    def __init__(self, engine):
        self.engine = engine
        self.work = threading.Condition()
        self.waiting = {}  # event loop -> the futures of its consumers waiting for the next step
        self.steps = 0
        # a running mean of a decoding step's wall time, prefills left out; before any request's
        # step, one of every row timed
        self.step_seconds = engine.time_step()
        self.fastest = self.step_seconds  # the fastest decoding step: the estimate while idle
        self.token_seconds = 0.0  # a running mean of a prompt token's prefill (0: none yet)
        threading.Thread(target=self.run, daemon=True, name="decoder").start()

    def submit(self, prompt, rules, max_new_tokens, *options):
        """engine.submit's request (its options: Engine.submit's), the thread woken."""
        with self.work:
            request = self.engine.submit(prompt, rules, max_new_tokens, *options)
            self.work.notify()
        return request

    def run(self):
        """Steps while there is work, outside the lock: the consumers turn the last step's tokens
        into text while the model computes the next (torch's kernels release the GIL)."""
        while True:
            with self.work:
                if not self.engine.busy():  # a burst's slow steps are not the next request's
                    self.step_seconds = self.fastest
                while not self.engine.busy():
                    self.work.wait()
            decoding = any(not row.done for row in self.engine.active)
            started = time.perf_counter()
            try:
                self.engine.step()
            except Exception as e:  # a bug: the request it came from ends with it
                traceback.print_exc()
                self.engine.fail(f"{type(e).__name__}: {e}")
            self.measured(time.perf_counter() - started, decoding)
            with self.work:
                self.steps += 1
                waiting = self.waiting
                self.waiting = {}
            for loop, futures in waiting.items():  # one wake-up a loop, however many wait
                loop.call_soon_threadsafe(wake, futures)

    def measured(self, took, decoding):
        """The running means after a step of took seconds: a prompt token's prefill, and where
        rows were decoding, a decoding step's (its prefills left out)."""
        prefill = self.engine.prefill_seconds
        if self.engine.prefilled:
            per_token = prefill / self.engine.prefilled
            if self.token_seconds:
                per_token = 0.9 * self.token_seconds + 0.1 * per_token
            self.token_seconds = per_token
        if decoding:
            step = max(0.0, took - prefill)
            self.step_seconds = 0.9 * self.step_seconds + 0.1 * step
            self.fastest = min(self.fastest, step)

    def steps_for(self, rows, max_new_tokens):
        """The fewest engine steps that rows of max_new_tokens each take: in waves of the
        engine's rows, whatever else it decodes."""
        waves = math.ceil(rows / len(self.engine.cache.lengths))
        return waves * max(1, max_new_tokens)

    async def progress(self, request):
        """Yields after each engine step while request decodes, the last time once it is done."""
        loop = asyncio.get_running_loop()
        while not request.done:
            future = loop.create_future()
            with self.work:
                self.waiting.setdefault(loop, []).append(future)
            # done before the step's wake-ups were sent: no wake-up comes for this one
            if not request.done:
                await future
            if not request.done:
                yield
        yield  # done: the last step's tokens


def wake(futures):
    for future in futures:
        if not future.done():  # its consumer may have gone
            future.set_result(None)


def free_rows(served):
    """A GPT's KV cache rows and how many are free now (all of them when idle), else nothing."""
    if served["task"] != "lm":
        return {}
    engine = served["decoder"].engine
    return {"rows": len(engine.cache.lengths), "free_rows": len(engine.free)}
