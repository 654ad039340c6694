"""The checkpoints a server holds and what it admits: each loaded through the library sample.py
and classify.py use, a completion request checked against the server's limits and the deadline
before it takes a slot, and a classification run as classify.py runs it."""

import dataclasses
import math
import os
import secrets
import threading

import decoding
from lib import classifier
from lib.common import Error, pick_device, read_json
from lib.formats import for_decoding
from lib.weights import load_gpt
from serving.completions import Completion, check_candidates
from serving.protocol import MAX_TEXTS, at_most, option_named
from serving.scheduler import MAX_ROWS, Decoder, ServingEngine, free_rows
from serving.transport import DEADLINE, MAX_ACTIVE, RequestError, Slots


class Playground:
    """The loaded checkpoints and what bounds a request: slots for the requests in flight, and
    the lock that runs one classifier call at a time (a GPT's run in its decoder's thread)."""

    def __init__(
        self,
        out_dirs,
        device="cpu",
        weights="auto",
        max_tokens=256,
        max_n=8,
        max_active=MAX_ACTIVE,
        rows=MAX_ROWS,
        compile=False,
    ):
        self.device = pick_device(device)
        self.compile = compile
        self.models = {}
        self.max_tokens = max_tokens
        self.max_n = min(max_n, rows)
        self.rows = rows
        self.lock = threading.Lock()
        self.completions = Slots(max_active)
        self.classifications = Slots(max_active)
        self.tokens_generated = 0  # every request's, for the tests and the load benchmark
        for out_dir in out_dirs:
            name = os.path.basename(os.path.abspath(out_dir))
            if name in self.models:
                raise Error(f"two checkpoints named {name!r}: serve folders with different names")
            self.models[name] = self.load(out_dir, weights)

    def load(self, out_dir, weights):
        """A checkpoint through the loads sample.py and classify.py use, by its config.json
        (read once for a classifier)."""
        info = read_json(os.path.join(out_dir, "config.json"), "checkpoint config")
        # anything but a classifier's goes to the GPT's load, whose checks name what is wrong
        if isinstance(info, dict) and info.get("architecture") == "EncoderClassifier":
            model, tokenizer, names, max_len = classifier.load(out_dir, self.device, info)
            return dict(
                task="classify",
                model=model,
                tokenizer=tokenizer,
                labels=names,
                max_length=max_len,
                parameters=model.num_params(),
            )
        model, tokenizer, _ = load_gpt(out_dir, self.device)
        # counted before a decoding format holds some weights as buffers
        parameters = model.num_params()
        model = for_decoding(model, self.device, weights)
        try:
            engine = ServingEngine(model, self.rows, tokenizer.vocab_size, self.compile)
        except Error as e:
            raise Error(f"--max_rows {self.rows}: {e}") from None
        decoder = Decoder(engine)
        return dict(
            task="lm", model=model, tokenizer=tokenizer, decoder=decoder, parameters=parameters
        )

    def describe(self):
        """GET /v1/models: OpenAI's list, each entry with what the page needs to draw it."""
        data = []
        for name, served in self.models.items():
            config = served["model"].config
            shape = ("block_size", "n_layer", "n_head", "n_embd")
            data.append(
                {
                    "id": name,
                    "object": "model",
                    "owned_by": "gpt-starter",
                    "task": served["task"],
                    "labels": served.get("labels"),
                    **{k: getattr(config, k) for k in shape},
                    **free_rows(served),
                    "chat": served["tokenizer"].spec.get("chat", False),
                }
            )
        return {"object": "list", "data": data}

    @staticmethod
    def decoding_options():
        """GET /v1/options: every decoding option as decoding.Options declares it (its type, off
        value, range and help), from which the page builds its form."""
        data = []
        for f in dataclasses.fields(decoding.Options):
            data.append(
                {
                    "name": f.name,
                    "type": f.type.__name__,
                    "default": f.default,
                    # what sample.py and the page start from
                    "sample_default": decoding.SAMPLE_DEFAULTS.get(f.name, f.default),
                    **f.metadata,
                }
            )
        return {"object": "list", "data": data}

    def pick_model(self, name, task):
        """The checkpoint a request names (or the only one of its task),
        checked to be of that task."""
        of_task = [n for n, served in self.models.items() if served["task"] == task]
        if not of_task:
            what = "GPT" if task == "lm" else "classifier"
            raise RequestError(
                400, f"no {what} is loaded; start serve.py with one (--out_dir)", "model"
            )
        if name is None:
            if len(of_task) != 1:
                raise RequestError(400, f"name the model: one of {', '.join(of_task)}", "model")
            name = of_task[0]
        if name not in self.models:
            raise RequestError(
                404, f"no model {name!r}: the server has {', '.join(self.models)}", "model"
            )
        if self.models[name]["task"] != task:
            other = "/v1/classify" if task == "lm" else "/v1/completions"
            raise RequestError(
                400, f"model {name!r} is a {self.models[name]['task']} model: use {other}", "model"
            )
        return name, self.models[name]

    # ---------------------------------------------------------------------------------- completions
    def completion(self, req, deadline=DEADLINE, kind=Completion):
        """A checked completion request -> a Completion (or kind, its subclass), not yet
        submitted; one that the model's measured speed cannot finish within deadline seconds is
        refused at once."""
        name, served = self.pick_model(req.model, "lm")
        if req.max_tokens == 0 and not req.echo:
            raise RequestError(400, "max_tokens 0 scores the prompt: send echo too", "max_tokens")
        at_most("max_tokens", req.max_tokens, self.max_tokens)
        at_most("n", req.n, self.max_n)
        stops = [req.stop] if isinstance(req.stop, str) else req.stop or []
        if len(stops) > 4 or not all(stops):
            raise RequestError(
                400, "stop must be a non-empty string or a list of at most 4 of them", "stop"
            )
        vocab_size = served["tokenizer"].vocab_size
        if req.logprobs is not None and req.logprobs > vocab_size:
            raise RequestError(
                400,
                f"logprobs must be at most {vocab_size}, this model's vocabulary, "
                f"got {req.logprobs}",
                "logprobs",
            )
        prompts = self.prompts(req.prompt, served)
        decoder = served["decoder"]
        steps = decoder.steps_for(len(prompts) * req.n, req.max_tokens)
        prompt_tokens = sum(len(ids) for _, ids in prompts)
        seconds = steps * decoder.step_seconds + prompt_tokens * decoder.token_seconds
        if seconds > deadline:
            raise RequestError(
                503,
                f"this completion takes at least {steps} decoding steps, {seconds:.0f} s at this "
                f"model's speed now, past the {deadline} s deadline: ask for fewer max_tokens, "
                "choices (n) or prompts",
            )
        seed = secrets.randbits(63) if req.seed is None else req.seed
        names = [option.name for option in dataclasses.fields(decoding.Options)]
        try:  # each option's type, finiteness and range, declared there
            options = decoding.Options(**{name: getattr(req, name) for name in names})
        except Error as e:
            raise RequestError(400, str(e), option_named(str(e))) from None
        check_candidates(req, prompts, options)
        return kind(self, name, served, req, prompts, options, seed, stops)

    def prompts(self, prompt, served):
        """A request's prompt -> [(its text, its token ids)], one per prompt given: a text, a
        list of token ids, or a list of either; an empty text starts from the start token."""
        tokenizer = served["tokenizer"]
        block_size = served["model"].config.block_size
        one = isinstance(prompt, str) or (prompt and isinstance(prompt[0], int))
        given = [prompt] if one else prompt
        if not 1 <= len(given) <= MAX_TEXTS:
            raise RequestError(400, f"prompt: send 1 to {MAX_TEXTS} prompts", "prompt")
        made = []
        for p in given:
            if isinstance(p, str):
                ids = self.encode(tokenizer, p, "prompt") if p else [tokenizer.start_token]
            else:
                ids = self.check_ids(tokenizer, p, "prompt")
            if len(ids) > block_size:
                raise RequestError(
                    400,
                    f"prompt is {len(ids)} tokens, past this model's block_size {block_size}",
                    "prompt",
                )
            text = p if isinstance(p, str) else tokenizer.decode(ids)
            made.append((text, ids))
        return made

    @staticmethod
    def encode(tokenizer, text, field):
        try:
            return tokenizer.encode(text)
        except Error as e:  # a character a char model never saw
            raise RequestError(400, f"{field}: {e}", field) from None

    @staticmethod
    def check_ids(tokenizer, ids, field):
        """Token ids, each checked to be one of the tokenizer's."""
        if not ids:
            raise RequestError(400, f"{field}: a list of token ids must not be empty", field)
        bad = [t for t in ids if not 0 <= t < tokenizer.vocab_size]
        if bad:
            raise RequestError(
                400,
                f"{field}: token id {bad[0]} is not in [0, {tokenizer.vocab_size})",
                field,
            )
        return ids

    # ------------------------------------------------------------------------------------- classify
    def classify(self, req):
        """POST /v1/classify: the probabilities classify.py gives (its predict, the same batches),
        and with attention one text's tokens and maps [layer][head][query][key]."""
        name, served = self.pick_model(req.model, "classify")
        texts = [req.input] if isinstance(req.input, str) else req.input
        if not texts or len(texts) > MAX_TEXTS or not all(t.strip() for t in texts):
            raise RequestError(
                400,
                f"input must be a non-blank text or a list of 1 to {MAX_TEXTS} of them",
                "input",
            )
        if req.attention and len(texts) != 1:
            raise RequestError(
                400,
                "attention maps are drawn for one text: send input as a single text",
                "attention",
            )
        try:
            rows = [row[: served["max_length"]] for row in served["tokenizer"].encode_batch(texts)]
        except Error as e:  # a character a char model never saw
            raise RequestError(400, f"input: {e}", "input") from None
        with self.lock:  # float32, as classify.py runs
            probs = classifier.predict(served["model"], rows, 64, self.device).tolist()
            maps = None
            if req.attention:
                maps = classifier.attention_maps(served["model"], rows[0], self.device)[1]
        data = []
        for i, p in enumerate(probs):
            best = max(range(len(p)), key=p.__getitem__)
            data.append(
                {
                    "index": i,
                    "label": served["labels"][best],
                    "label_id": best,
                    "probs": dict(zip(served["labels"], p)),
                }
            )
        if maps is not None:
            data[0]["tokens"] = [served["tokenizer"].decode([t]) for t in rows[0]]
            # a pair the model's pattern masks: null
            data[0]["attention"] = [
                [
                    [[None if math.isnan(w) else round(w, 5) for w in q] for q in head]
                    for head in layer.tolist()
                ]
                for layer in maps
            ]
        return {"object": "list", "model": name, "data": data}
