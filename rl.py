"""
Learn from a checker: reinforcement learning on a reward that a program computes, after a chat
fine-tune. Each step samples a group of replies to each prompt (rollouts.py), scores each reply by
the reward, and raises the log-probability of the replies that beat their group's mean, lowering
the others' (GRPO's advantage, nanochat's chat_rl.py: the loss on the replies' tokens alone, a
mean over them). The result is an ordinary chat checkpoint: the best val/reward, the mean reward
of greedy replies to the held-out prompts.
  python rl.py config/chat_rl.py                    the word tasks, from out-chat
  python rl.py --init_from=out-chat --prompts=FILE.jsonl --reward=check.py:score
  python rl.py --out_dir=out-chat-rl --init_from=resume
--prompts: one {"messages": [...]} a line, ending in a user turn; its other fields go to the
reward, a Python function NAME(example: dict, reply: str) -> float in the file --reward names.
"""

import importlib.util
import os
import sys
from collections import namedtuple
from contextlib import ExitStack
from dataclasses import asdict

from torch import nn

import train
from data.chat.prepare import jsonl_lines
from decoding import Options
from lib import checkpoint, prepare
from lib.chat import check_messages
from lib.common import Error, parse_json, run_script
from lib.distributed import StepGuard, agreed, parallel, started
from lib.options import Option, options_of
from lib.settings import OPTIONS as TRAIN_OPTIONS
from lib.settings import check_shared, parse
from lib.weights import load_gpt
from rollouts import Rollout, token_logprobs

# train.py's keys that mean the same here: the run's, its records', the schedule's, the optimizer's
SHARED = """
overwrite_out_dir seed device dtype gradient_accumulation_steps
eval_interval log_interval always_save_checkpoint wandb_log wandb_project wandb_run_name
learning_rate min_lr warmup_iters lr_decay_iters decay_lr max_iters
optimizer beta1 beta2 grad_clip
""".split()
OPTIONS = dict(
    out_dir=Option("out-rl", "where the checkpoints and metrics.jsonl go"),
    init_from=Option("out-chat", "the chat checkpoint to start from (its folder), or resume"),
    prompts=Option("", "a .jsonl file of prompts (or a folder of them), one conversation a line"),
    reward=Option("", "PATH.py:NAME, a function NAME(example: dict, reply: str) -> float"),
    val_fraction=Option(
        0.1, "the prompts held out for evaluation (a hash of each line)", gt=0, lt=1
    ),
    batch_size=Option(8, "prompts per micro-step per process", ge=1),
    group_size=Option(8, "replies sampled per prompt, each scored against its group", ge=2),
    max_new_tokens=Option(16, "the longest reply, in tokens", ge=1),
    std_advantage=Option(False, "divide each advantage by its group's reward spread (GRPO's)"),
    kl=Option(0.0, "weight of a KL penalty to the starting model (0: none, no copy kept)", ge=0),
    # the replies' draws: sample.py's options, at their off values (the model's own distribution)
    **options_of(Options),
    # no decay by default: without a reward's signal the weights stay as they are
    weight_decay=Option(0.0, "decoupled weight decay of matrices and embeddings", ge=0),
    **{name: TRAIN_OPTIONS[name] for name in SHARED},
)
METRIC = ("val/reward", "max")


def main(argv):
    """The settings, the inputs checked, then the run."""
    cfg, given = parse(argv, OPTIONS, __doc__)
    resuming = cfg.init_from == "resume"
    with started(cfg.device) as run, ExitStack() as held:

        def open_run():
            """(state or None, settings, inputs); nothing written before the inputs pass."""
            state, settings = None, cfg
            if resuming:
                if run.master:
                    held.enter_context(checkpoint.run_out_dir(cfg.out_dir, True, False))
                state, settings = checkpoint.resume(cfg, given, OPTIONS)
            inputs = Inputs(settings)  # first: a missing start gets load_gpt's line
            check_shared(settings, resuming)  # train.py's rules of the keys the two share
            return state, settings, inputs

        state, cfg, inputs = agreed(run, open_run)
        run = run.resolved(cfg.dtype, "ddp")
        with StepGuard(run) as guard, checkpoint.what_survives(cfg.out_dir):
            return learn(cfg, run, guard, state, inputs, held)


class Inputs:
    """The start (a chat model and its tokenizer), the prompts split in two, the reward."""

    def __init__(self, cfg):
        if not cfg.prompts or not cfg.reward:
            raise Error("name --prompts=FILE.jsonl and --reward=PATH.py:NAME (config/chat_rl.py)")
        self.model, self.tokenizer, _ = load_gpt(cfg.init_from, "cpu")
        if not self.tokenizer.spec.get("chat"):
            raise Error(
                f"init_from={cfg.init_from}: not a chat model; fine-tune it on conversations "
                "first (config/chat.py)"
            )
        self.reward = load_reward(cfg.reward)
        self.train, self.val = read_prompts(cfg, self.tokenizer, self.model.config.block_size)


def load_reward(spec):
    """The function that spec (PATH.py:NAME) names."""
    path, colon, name = spec.rpartition(":")
    if not colon or not path or not name:
        raise Error(f"--reward={spec}: write PATH.py:NAME (a function in that file)")
    if not os.path.isfile(path):
        raise Error(f"--reward={spec}: no file {path}; name the Python file that holds the reward")
    module_spec = importlib.util.spec_from_file_location("reward", path)
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
    except Exception as e:
        raise Error(f"{path}: importing it raised {type(e).__name__}: {e}; fix the file") from None
    function = getattr(module, name, None)
    if not callable(function):
        raise Error(f"{path}: no function {name!r} in it; define {name}(example, reply) -> float")
    return function


# one line of --prompts: where it is, its fields (for the reward) and its tokens
Prompt = namedtuple("Prompt", "where example ids")


def read_prompts(cfg, tokenizer, block_size):
    """(train, val) Prompts of cfg.prompts; a bad line is an Error naming it."""
    splits = ([], [])
    for where, line in jsonl_lines(cfg.prompts, "--prompts"):
        example = prompt_line(where, line)
        ids, _ = tokenizer.render(example["messages"], reply=True)
        if len(ids) + cfg.max_new_tokens > block_size:
            raise Error(
                f"{where}: {len(ids)} tokens and a reply of max_new_tokens={cfg.max_new_tokens} "
                f"pass the model's block_size {block_size}: shorten the prompt, or lower "
                "--max_new_tokens"
            )
        splits[prepare.in_val(line.strip(), cfg.val_fraction)].append(Prompt(where, example, ids))
    for name, split in zip(("train", "held-out"), splits):
        if not split:
            raise Error(
                f"--prompts {cfg.prompts}: no {name} prompts ({len(splits[0])} train, "
                f"{len(splits[1])} held out): give more prompts, or another --val_fraction"
            )
    return splits


def prompt_line(where, line):
    """The object of one line: messages that end in a user turn."""
    try:
        example = parse_json(line)
        if not isinstance(example, dict) or "messages" not in example:
            raise Error('not an object with a "messages" list')
        check_messages(example["messages"])
    except Error as e:
        raise Error(f"{where}: {e}; fix or delete that line") from None
    last = example["messages"][-1]["role"]
    if last != "user":
        raise Error(
            f"{where}: the conversation ends in a{'n' * (last == 'assistant')} {last} turn: a "
            "prompt ends in a user turn, whose reply the model writes; cut the turns after it"
        )
    return example


# ---------------------------------------------------------------------------------- the algorithm


class PolicyLoss(nn.Module):
    """The model, and the policy gradient's loss of replies as the loop's step takes it."""

    def __init__(self, model, kl, temperature=1.0):
        super().__init__()
        self.model = model
        self.kl = kl
        # the log-probabilities of the distribution the replies were drawn from: at another
        # temperature the estimate is biased (it pushes each sampled argmax by its advantage)
        self.temperature = temperature

    def forward(self, idx, targets, advantage, scale, reference=None):
        """-sum(advantage x log p) over the replies' tokens (targets >= 0) x scale (1 / the step's
        reply tokens), plus kl x the k3 estimate of the KL to the reference's log-probabilities."""
        logits, _ = self.model(idx)
        logp = token_logprobs(logits, targets, self.temperature)
        loss = -(advantage[:, None] * logp).sum()
        if self.kl:
            gap = (reference - logp).masked_fill(targets < 0, 0)
            loss = loss + self.kl * (gap.exp() - gap - 1).sum()
        return None, loss * scale


# -------------------------------------------------------------------------------------- the run


def learn(cfg, run, guard, state, inputs, held):
    """The model, the optimizer, then the loop -> (the model, the last evaluation's metrics)."""
    raw_model = inputs.model.train()
    if state is not None:
        raw_model.load_weights(state["model"])
    reference = load_gpt(cfg.init_from, run.device)[0] if cfg.kl else None  # the start, frozen
    model = parallel(PolicyLoss(raw_model, cfg.kl, cfg.temperature), run, False)
    optimizers, train_step = train.stepping(model, raw_model, cfg, run)
    step, best, seconds = checkpoint.restore(state, optimizers, train_step.scaler)
    first_step, best_step, metrics = step, None, {}
    rollout = Rollout(cfg, run, inputs, train_step.ctx)
    record = bar = None

    def save():
        seconds = record.seconds() if run.master else None
        progress = dict(step=step, best=best, seconds=seconds, config=asdict(cfg))
        progress["tokenizer"] = inputs.tokenizer.spec
        checkpoint.save_state(cfg.out_dir, raw_model, optimizers, train_step.scaler, progress, run)

    while True:
        # a signal before the start's evaluation stops the run after it: nothing saved before
        if bar is not None and guard.stop_now():
            bar.close()
            with guard.stopping(step, cfg.out_dir):
                save()
        lr = train.get_lr(step, cfg)
        for optimizer in optimizers:
            for group in optimizer.param_groups:
                group["lr"] = lr * group.get("lr_scale", 1.0)
        if step % cfg.eval_interval == 0 or step == cfg.max_iters:
            metrics = {METRIC[0]: rollout.evaluate(raw_model)}
            if bar is None:  # the start evaluated: its reward works, out_dir may be made
                record, bar = start(cfg, run, raw_model, held, inputs, state, seconds)
            if run.master:
                bar.write(f"step {step}: val/reward {metrics[METRIC[0]]:.4f}", file=sys.stderr)
                record.log(step, **metrics, lr=lr)
            if train.improves(metrics[METRIC[0]], best, METRIC[1]):
                best, best_step = metrics[METRIC[0]], step
                save_model(raw_model, cfg, run, inputs, {"step": step, **metrics})
            if step > first_step and (best_step == step or cfg.always_save_checkpoint):
                save()
        if step >= cfg.max_iters:
            break
        batches, logged = rollout.batches(raw_model, step, reference)
        loss_sum, norm = train_step.gradients(batches)
        loss_value, norm_value = guard.gather(loss_sum, norm)
        train.check_finite(loss_value, norm_value, step, train_step.scaler, cfg.out_dir)
        train_step.update()
        step += 1
        bar.update(1)
        if run.master and (step % cfg.log_interval == 0 or step == cfg.max_iters):
            logged.update({"train/step_loss": loss_value, "lr": lr, "grad_norm": norm_value})
            reward, speed = logged["train/reward"], logged["rollout tok/s"]
            bar.set_postfix_str(f"reward {reward:.3f}, {speed:,.0f} tok/s")
            record.log(step, **logged)
    bar.close()
    if run.master:
        done = (first_step, step, record.seconds() - seconds)
        train.finish(cfg.out_dir, record, (METRIC[0], best, best_step), done, metrics)
    return raw_model, metrics


def start(cfg, run, model, held, inputs, state, seconds):
    """out_dir locked (a new run's), the records and the progress bar started."""

    def lock():
        """Rank 0 locks a new run's out_dir."""
        if run.master:
            held.enter_context(checkpoint.run_out_dir(cfg.out_dir, False, cfg.overwrite_out_dir))

    if state is None:
        agreed(run, lock)
    prompts = cfg.batch_size * cfg.gradient_accumulation_steps
    what = (
        f"{cfg.max_iters:,} steps of {prompts} prompts x {cfg.group_size} replies, from "
        f"{len(inputs.train):,} train prompts; {len(inputs.val):,} held out"
    )
    resumed_step = None if state is None else state["step"]
    record, _, bar = train.start_records(cfg, run, model, seconds, resumed_step, what)
    return record, bar


def save_model(model, cfg, run, inputs, scores):
    """An ordinary chat checkpoint: model.safetensors + config.json."""
    card = dict(task="lm", init_from=cfg.init_from, prompts=cfg.prompts, reward=cfg.reward)
    card.update(tokenizer=inputs.tokenizer.spec, command=["python"] + sys.argv)
    checkpoint.save_model(model, cfg.out_dir, run, cfg.init_from, **card, metrics=scores)


def script():
    main(sys.argv[1:])


if __name__ == "__main__":
    run_script(script, "rl.py")
