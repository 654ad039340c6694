"""Completions and log-probabilities: a completion request's choices as they decode (text cut
before a stop string, never half a character), each token's log-probability and top alternatives
(logprobs), the prompt scored (echo), each draw traced through every filter (trace), what these
cost, and the answer whole or as server-sent events."""

import asyncio
import bisect
import secrets
import time

import torch
from fastapi.responses import JSONResponse

import decoding
from lib.tokenizer import continuation, end_tokens
from serving.protocol import error_response, option_named
from serving.transport import RequestError

# the log-probabilities one completion may send: each a line of JSON in its answer and held in
# memory until it is sent (about 20 bytes each, some 5 MB in all)
MAX_CANDIDATES = 2**18


def check_candidates(req, prompts, options):
    """A 400 for a completion whose logprobs and trace come to more than MAX_CANDIDATES
    log-probabilities: per token, logprobs' top and the chosen one, and trace's top at each
    stage (the raw logits and each option on); with echo, per prompt token too."""
    per_token = 0 if req.logprobs is None else req.logprobs + 1
    stages = 1 + len(list(decoding.NextToken(options).on()))
    generated = len(prompts) * req.n * req.max_tokens
    candidates = generated * (per_token + req.trace * stages)
    if req.echo:
        candidates += req.n * sum(len(ids) for _, ids in prompts) * per_token
    if candidates > MAX_CANDIDATES:
        raise RequestError(
            400,
            f"logprobs and trace come to {candidates:,} log-probabilities (prompts x n x "
            f"max_tokens x (logprobs + 1 + trace x stages)), more than {MAX_CANDIDATES:,}: ask "
            "for a smaller trace or logprobs, or fewer max_tokens, choices (n) or prompts",
            "trace" if req.trace else "logprobs",
        )


class Choice:
    """One completion of one prompt as it decodes: its engine row, its text so far (cut before
    a stop string), how much of that was sent, its trace, and whether it has ended."""

    def __init__(self, index, row, prompt_text, trace, echo):
        self.index = index
        self.row = row
        self.prompt_text = prompt_text
        self.trace = trace
        self.count = 0  # generated tokens turned into text
        self.starts = []  # where each of them begins in text
        self.kept = 0  # tokens counted in usage and sent with logprobs: none cut by a stop
        self.text = ""
        self.sent = 0  # characters of text sent
        self.finished = False
        self.echoed = False
        # characters before the next token, for logprobs' text_offset: the prompt's unless echoed
        self.offset = 0 if echo else len(prompt_text)


class Completion:
    """One completion request: n choices per prompt (in OpenAI's order), each prompt one engine
    request of the model's Decoder; events() says what each engine step adds."""

    ID = "cmpl"  # OpenAI's id prefix and objects: the answer's, a streamed chunk's
    OBJECT = CHUNK = "text_completion"

    def __init__(self, playground, name, served, req, prompts, options, seed, stops):
        self.playground = playground
        self.req = req
        self.tokenizer = served["tokenizer"]
        self.decoder = served["decoder"]
        self.stops = stops
        self.prompts = prompts
        self.options = options
        self.seed = seed
        self.requests = []
        self.choices = []
        self.head = {
            "id": f"{self.ID}-{secrets.token_hex(12)}",
            "object": self.OBJECT,
            "created": int(time.time()),
            "model": name,
        }
        self.slot = None
        self.watcher = None

    async def start(self):
        """A slot taken (or a 503), then each prompt submitted to the decoder; the slot goes
        back as soon as the decoding ends, however slowly the client reads."""
        slots = self.playground.completions
        await slots.take()
        self.slot = slots
        req = self.req
        vocab_size = self.tokenizer.vocab_size
        # a choice ends where the model draws a special token, which is not text (OpenAI's end of
        # text, a chat model's markers): never in its text, nor in its logprobs
        ends = () if req.ignore_eos else end_tokens(self.tokenizer)
        for text, ids in self.prompts:
            # generators of the request's own: a choice draws as it would alone
            rules = decoding.make_rules(self.options, False, self.seed, req.n, vocab_size)
            traces = [[] for _ in rules]
            if req.trace:
                rules = [Traced(p, req.trace, self.tokenizer, t) for p, t in zip(rules, traces)]
            # the prompt scored only where its log-probabilities are asked for
            echo = req.echo and req.logprobs is not None
            # the engine's client: its prompts take turns with other completions' prompts
            request = self.decoder.submit(
                ids, rules, req.max_tokens, ends, req.logprobs, echo, self
            )
            self.requests.append(request)
            for row, trace in zip(request.rows, traces):
                self.choices.append(Choice(len(self.choices), row, text, trace, req.echo))
        self.watcher = asyncio.ensure_future(self.give_back_when_decoded())

    async def give_back_when_decoded(self):
        for request in self.requests:
            async for _ in self.decoder.progress(request):
                pass
        self.give_back()

    def close(self):
        """Every row stops at the next step boundary, and the slot goes back."""
        for request in self.requests:
            request.finish()
        self.give_back()

    def give_back(self):
        """The slot back to the playground, once."""
        if self.slot is not None:
            self.slot.give_back()
            self.slot = None

    def usage(self):
        prompt_tokens = sum(len(ids) for _, ids in self.prompts)
        generated = sum(choice.kept for choice in self.choices)
        return {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": generated,
            "total_tokens": prompt_tokens + generated,
        }

    async def events(self):
        """After each engine step, what it added: [(choice index, new text, finish reason or
        None, [trace entries], logprobs or None)], one entry per token taken (the echoed prompt
        first). New text is never half a character nor a tail that may start a stop string; the
        logprobs are those of the tokens that begin in the text sent."""
        for request in self.requests:
            async for _ in self.decoder.progress(request):
                yield self.step()
            for row in request.rows:
                if row.bug:  # the engine failed while this request was admitted
                    raise RequestError(500, row.error)
                if row.error:  # no token left to draw: the message names the option
                    raise RequestError(400, row.error, option_named(row.error))
        ends = []
        for c in self.choices:
            if not c.finished:  # at the end of a document, or of max_tokens
                reason = "stop" if c.row.ended else "length"
                logprobs = self.keep(c, c.count)
                ends.append((c.index, c.text[c.sent :], reason, [], logprobs))
        yield ends

    def step(self):
        events = []
        for c in self.choices:
            if self.req.echo and not c.echoed:
                request = self.requests[c.index // self.req.n]
                if request.echo and request.prompt_logprobs is None:
                    continue  # not yet scored: it waits for a slot in the cache
                c.echoed = True
                events.append((c.index, c.prompt_text, None, [], self.echo_logprobs(c, request)))
            while not c.finished and c.count < len(c.row.generated):
                events.append(self.next_token(c))
        return events

    def next_token(self, c):
        """The event of choice c's next generated token."""
        c.count += 1
        self.playground.tokens_generated += 1
        # where the token begins: after the text before it, less a half character it completes
        c.starts.append(len(c.text.rstrip("\ufffd")))
        c.text, out, c.finished = continuation(self.tokenizer, c.row, self.stops, c.count)
        trace = [c.trace[c.count - 1]] if c.trace else []
        reason = "stop" if c.finished else None
        new = out[c.sent :]
        c.sent = max(c.sent, len(out))
        # the tokens that begin in the text sent: none that a stop string cuts off
        logprobs = self.keep(c, bisect.bisect_left(c.starts, len(out)))
        return (c.index, new, reason, trace, logprobs)

    def keep(self, c, end):
        """Choice c's generated tokens up to end counted -> the logprobs of those not yet
        sent, or None (none asked for, or none new)."""
        first = c.kept
        c.kept = max(first, end)
        if self.req.logprobs is None or c.kept == first:
            return None
        tokens = c.row.generated[first : c.kept]
        chosen = c.row.token_logprobs[first : c.kept]
        tops = c.row.top_logprobs[first : c.kept] if self.req.logprobs else [[]] * len(tokens)
        return self.logprobs(c, tokens, chosen, tops)

    def echo_logprobs(self, c, request):
        """The logprobs of choice c's prompt, or None where none are asked for."""
        if self.req.logprobs is None:
            return None
        tokens = c.row.tokens[: c.row.prompt_length]
        return self.logprobs(c, tokens, request.prompt_logprobs, request.prompt_top_logprobs)

    def logprobs(self, c, tokens, chosen, tops):
        """OpenAI's logprobs object for tokens of choice c: each token's text, log-probability,
        top alternatives {text: log-probability} (None where there is no context) and offset."""
        texts = [self.tokenizer.decode([t]) for t in tokens]
        offsets = []
        for text in texts:
            offsets.append(c.offset)
            c.offset += len(text)
        top_logprobs = []
        for top in tops:
            if top is None:
                top_logprobs.append(None)
            else:
                top_logprobs.append({self.tokenizer.decode([t]): lp for t, lp in top})
        return {
            "tokens": texts,
            "token_logprobs": chosen,
            "top_logprobs": top_logprobs,
            "text_offset": offsets,
        }

    async def answer(self):
        """The whole response of a request not streamed."""
        choices = []
        for c in self.choices:
            choices.append({"text": "", "index": c.index, "logprobs": None, "finish_reason": None})
        async for step in self.events():
            for i, text, finish, trace, logprobs in step:
                choice = choices[i]
                choice["text"] += text
                choice["finish_reason"] = finish or choice["finish_reason"]
                if trace:
                    choice.setdefault("trace", []).extend(trace)
                if logprobs:
                    join_logprobs(choice, logprobs)
        return {**self.head, "choices": choices, "usage": self.usage()}

    async def stream(self):
        """Server-sent events, as OpenAI streams: the opening chunks, then the chunks of each
        choice's tokens, the usage with stream_options' include_usage, then data: [DONE]; an
        error past the headers is the stream's last event, as OpenAI sends it."""
        head = {**self.head, "object": self.CHUNK}
        try:
            for choice in self.opening():
                yield event({**head, "choices": [choice]})
            async for step in self.events():
                for entry in step:
                    for choice in self.chunks(*entry):
                        yield event({**head, "choices": [choice]})
        except Exception as e:  # past the headers: the error is an event, then [DONE]
            yield event(error_response(e).body)
            yield b"data: [DONE]\n\n"
            return
        options = self.req.stream_options
        if options and options.include_usage:
            yield event({**head, "choices": [], "usage": self.usage()})
        yield b"data: [DONE]\n\n"

    def opening(self):
        """The chunks' choices before any token: none for a completion."""
        return []

    def chunks(self, i, text, finish, trace, logprobs):
        """The streamed choices of one event of choice i: one, where it adds anything."""
        if not (text or finish or trace or logprobs):
            return []
        choice = {"text": text, "index": i, "logprobs": logprobs, "finish_reason": finish}
        if trace:
            choice["trace"] = trace
        return [choice]


def join_logprobs(choice, logprobs):
    """A chunk's logprobs appended to a choice's."""
    if choice["logprobs"] is None:
        choice["logprobs"] = {key: [] for key in logprobs}
    for key, values in logprobs.items():
        choice["logprobs"][key].extend(values)


def event(data):
    """One server-sent event of a JSON object (or of JSON bytes)."""
    if not isinstance(data, bytes):
        data = JSONResponse(data).body
    return b"data: " + data + b"\n\n"


class Traced(decoding.NextToken):
    """rule's decoding, recording each token it draws in trace: the token and the top candidates
    (token, id, probability) of the raw logits and after each filter that runs."""

    def __init__(self, rule, top, tokenizer, trace):
        super().__init__(rule.options, rule.greedy, rule.generator, rule.vocab_size)
        self.top = top
        self.tokenizer = tokenizer
        self.trace = trace

    def draw(self, processed, logits, context):
        token = super().draw(processed, logits, context)
        t = int(token)
        entry = {"id": t, "token": self.tokenizer.decode([t]), "stages": []}
        for name, x in self.stages(logits, context):
            p = torch.softmax(x[0].float(), -1)
            values, ids = p.topk(min(self.top, p.numel()))
            top_tokens = []
            for v, j in zip(values.tolist(), ids.tolist()):
                top_tokens.append([self.tokenizer.decode([j]), j, round(v, 6)])
            stage = {"name": name, "chosen": round(p[t].item(), 6), "top": top_tokens}
            entry["stages"].append(stage)
        self.trace.append(entry)
        return token
