"""
The replies rl.py learns from: each step's groups of replies drawn by the engine, scored by the
reward, and the micro-batches of their tokens with each reply's advantage; the greedy replies of
an evaluation.
"""

import math
import numbers
import time
from functools import partial

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from decoding import NextToken, Options, make_rules
from engine import Engine
from lib.common import Error
from lib.distributed import agreed
from lib.options import options_of
from lib.tokenizer import end_tokens


def score(reward, prompt, reply):
    """reward(example, reply) as a float, or an Error naming the prompt's line."""
    try:
        value = reward(prompt.example, reply)
    except Exception as e:
        raise Error(
            f"{prompt.where}: the reward raised {type(e).__name__}: {e} (reply {reply!r:.60}); "
            "fix the reward function"
        ) from None
    if not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise Error(
            f"{prompt.where}: the reward returned {value!r:.40} (reply {reply!r:.60}), not a "
            "finite number; make the reward return a float"
        )
    return float(value)


def advantages(rewards, std=False):
    """rewards [prompts, group] -> each less its group's mean (over its group's spread, std)."""
    centred = rewards - rewards.mean(1, keepdim=True)
    if std:
        centred = centred / (rewards.std(1, keepdim=True, correction=0) + 1e-6)
    return centred


def token_logprobs(logits, targets, temperature=1.0):
    """[B, T]: log p of each target token at temperature (0 where targets is -1; temperature 0,
    greedy draws, read at 1)."""
    flat = (logits.float() / (temperature or 1.0)).transpose(1, 2)
    return -F.cross_entropy(flat, targets, ignore_index=-1, reduction="none")


class Rollout:
    """The replies of a step's prompts, their rewards and the micro-batches they make; and the
    greedy replies of an evaluation."""

    def __init__(self, cfg, run, inputs, ctx):
        self.cfg, self.run, self.inputs, self.ctx = cfg, run, inputs, ctx
        self.options = Options(**{name: getattr(cfg, name) for name in options_of(Options)})
        self.ends = end_tokens(inputs.tokenizer)  # as every decode ends a reply (sample.py's)

    def replies(self, model, prompts, rules, ends):
        """The Rows of each prompt's request, one a rule of rules[j] for prompt j."""
        requests = []
        model.eval()
        with self.ctx:
            engine = Engine(model, min(sum(map(len, rules)), 256))
            for prompt, drawn in zip(prompts, rules):
                requests.append(engine.submit(prompt.ids, drawn, self.cfg.max_new_tokens, ends))
            while engine.busy():
                engine.step()
        model.train()
        return [request.rows for request in requests]

    def evaluate(self, model):
        """The mean reward of greedy replies to the held-out prompts, shared out over the ranks."""
        prompts = self.inputs.val[self.run.rank :: self.run.world_size]
        greedy = [NextToken(Options(), greedy=True)]
        rows = self.replies(model, prompts, [greedy] * len(prompts), self.ends)
        texts = [self.inputs.tokenizer.decode(row[0].generated) for row in rows]
        rewards = agreed(self.run, partial(self.scores, prompts, [[t] for t in texts]))
        sums = torch.tensor([float(rewards.sum()), len(prompts)], dtype=torch.float64)
        if self.run.distributed:
            dist.all_reduce(sums)
        return (sums[0] / sums[1]).item()

    def scores(self, prompts, replies):
        """[prompts, replies] rewards of each prompt's replies (texts)."""
        reward = self.inputs.reward
        return torch.tensor(
            [[score(reward, p, r) for r in texts] for p, texts in zip(prompts, replies)],
            dtype=torch.float64,
        ).reshape(len(prompts), -1)

    def batches(self, model, step, reference):
        """This rank's micro-batches of the step's replies -> (the batches, the step's records)."""
        cfg, run = self.cfg, self.run
        n = cfg.batch_size * cfg.gradient_accumulation_steps
        # the step's prompts from (seed, step); each prompt's draws from (seed, step, its place)
        chosen = np.random.default_rng([cfg.seed, step]).integers(0, len(self.inputs.train), n)
        share = n // run.world_size
        places = range(run.rank * share, (run.rank + 1) * share)
        prompts = [self.inputs.train[chosen[j]] for j in places]
        t0 = time.perf_counter()
        rules = [self.rules(step, place) for place in places]
        rows = self.replies(model, prompts, rules, self.ends)
        seconds = time.perf_counter() - t0
        tokenizer = self.inputs.tokenizer
        texts = [[tokenizer.decode(row.generated) for row in group] for group in rows]
        rewards = agreed(run, partial(self.scores, prompts, texts))
        advantage = advantages(rewards, cfg.std_advantage).float()
        # each reply's tokens and the end it drew (<|end|> or a role marker), learnt with them
        sequences = [
            [(row.tokens + [row.end_token] * row.ended, row.prompt_length) for row in group]
            for group in rows
        ]
        generated = sum(len(row.generated) for group in rows for row in group)
        learnt = sum(len(s) - p for group in sequences for s, p in group)
        # the step's sums over the ranks: rewards, their squares, replies, tokens learnt and drawn
        sums = torch.tensor(
            [rewards.sum(), (rewards**2).sum(), rewards.numel(), learnt, generated],
            dtype=torch.float64,
        )
        if run.distributed:
            dist.all_reduce(sums)
        total, squares, count, learnt, generated = sums.tolist()
        micro_steps = cfg.gradient_accumulation_steps // run.world_size
        # each micro-batch's loss over the step's tokens, undoing the step's mean over micro-steps
        # and DDP's over ranks: the gradient is the step's sum over every reply token, / them
        scale = micro_steps * run.world_size / learnt
        batches = []
        for i in range(0, share, cfg.batch_size):
            # a group whose replies scored alike has no advantage: without a KL it teaches
            # nothing, and its forward and backward are skipped (one kept: a micro-step runs)
            teach = [j for j in range(i, i + cfg.batch_size) if cfg.kl or advantage[j].any()]
            kept = teach or [i]
            part = [s for j in kept for s in sequences[j]]
            weights = advantage[kept].reshape(-1)
            batches.append(self.batch(part, weights, scale, reference))
        mean = total / count
        logged = {"train/reward": mean, "train/reply_tokens": generated / count}
        logged["train/reward_std"] = math.sqrt(max(0.0, squares / count - mean**2))
        logged["rollout tok/s"] = generated / seconds
        return batches, logged

    def rules(self, step, place):
        """The group's draws of the prompt at a place of the step."""
        seed = int(np.random.default_rng([self.cfg.seed, step, place]).integers(2**62))
        vocab = self.inputs.tokenizer.vocab_size
        return make_rules(self.options, False, seed, self.cfg.group_size, vocab)

    def batch(self, sequences, weights, scale, reference):
        """The micro-batch of sequences [(tokens, prompt length)]; its targets: the replies'."""
        width = max(len(s) for s, _ in sequences) - 1
        idx = torch.zeros(len(sequences), width, dtype=torch.long)
        targets = torch.full_like(idx, -1)
        for row, (tokens, start) in enumerate(sequences):
            ids = torch.tensor(tokens)
            idx[row, : len(ids) - 1] = ids[:-1]
            targets[row, start - 1 : len(ids) - 1] = ids[start:]
        device = self.run.device
        batch = dict(idx=idx.to(device), targets=targets.to(device), scale=scale)
        batch["advantage"] = weights.to(device)
        if reference is not None:
            with torch.no_grad(), self.ctx:
                logits, _ = reference(batch["idx"])
                batch["reference"] = token_logprobs(logits, batch["targets"], self.cfg.temperature)
        return batch
