"""rl.py, learning from a checker: the advantage and the loss by hand, a reward that tells the
replies nothing changes nothing, exact resume, DDP as one process, and each bad input in one
line with nothing written."""

import json
import math
import re
from contextlib import nullcontext
from dataclasses import replace

import pytest
import torch
from conftest import ROOT, run_distributed
from test_robustness import cli

import plot
import rl
import rollouts
from data.chat import prepare, reward
from lib.checkpoint import save_pretrained
from lib.distributed import Run
from lib.settings import parse
from lib.weights import load_gpt
from model import GPT, GPTConfig
from plot import evaluations

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors: one thread

CHARS = "abcde"
REWARDS = """
def a_count(example, reply):
    return reply.count("a") + example["bonus"]

def same(example, reply):
    return 1.0

def raises(example, reply):
    return 1 / 0

def nan(example, reply):
    return float("nan")

def text(example, reply):
    return "one"
"""


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """(a tiny random chat GPT's folder, a prompts file, a rewards file)."""
    folder = tmp_path_factory.mktemp("rl")
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=len(CHARS) + 4, block_size=16, n_layer=1, n_head=2, n_embd=16)
    spec = {"type": "char", "chars": CHARS, "chat": True}
    save_pretrained(GPT(config), folder / "start", task="lm", tokenizer=spec)
    prompts = folder / "prompts.jsonl"
    with open(prompts, "w") as f:
        for i in range(40):
            content = CHARS[i % 5] * (1 + i % 3)
            f.write(json.dumps({"messages": [{"role": "user", "content": content}], "bonus": i}))
            f.write("\n")
    rewards = folder / "rewards.py"
    rewards.write_text(REWARDS)
    return str(folder / "start"), str(prompts), str(rewards)


def argv(setup, out_dir, name="a_count", *extra):
    start, prompts, rewards = setup
    return [
        f"--init_from={start}",
        f"--prompts={prompts}",
        f"--reward={rewards}:{name}",
        f"--out_dir={out_dir}",
        "--batch_size=2",
        "--group_size=4",
        "--max_new_tokens=4",
        "--eval_interval=2",
        "--log_interval=1",
        "--learning_rate=1e-2",
        "--warmup_iters=0",
        "--lr_decay_iters=4",
        "--device=cpu",
        "--dtype=float32",
        *extra,
    ]


def test_the_advantage_and_the_masked_loss_by_hand():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [2.0, 2.0, 2.0, 5.0]])
    centred = [[0.5, -0.5, -0.5, 0.5], [-0.75, -0.75, -0.75, 2.25]]
    assert rollouts.advantages(rewards).tolist() == centred
    spread = rollouts.advantages(rewards, std=True)
    assert torch.allclose(spread[0], torch.tensor([1.0, -1.0, -1.0, 1.0]), atol=1e-5)

    class Fixed(torch.nn.Module):
        def forward(self, idx):
            # row 0's tokens 0 and 1 at odds 3 : 1, row 1's even
            logits = torch.zeros(2, 3, 2)
            logits[0, :, 0] = math.log(3)
            return logits, None

    # row 0: one prompt token, a reply of tokens 0 and 1; row 1: a reply of token 1, then padding
    targets = torch.tensor([[0, 1, -1], [-1, 1, -1]])
    advantage = torch.tensor([0.5, -2.0])
    _, loss = rl.PolicyLoss(Fixed(), kl=0.0)(None, targets, advantage, scale=1 / 3)
    by_hand = -(0.5 * (math.log(3 / 4) + math.log(1 / 4)) - 2.0 * math.log(1 / 2)) / 3
    assert loss.item() == pytest.approx(by_hand)
    # KL's k3 estimate: e^g - g - 1 of each reply token's gap g, the reference's log p less ours
    logp = rollouts.token_logprobs(Fixed()(None)[0], targets)
    reference = logp + torch.tensor([[0.5, 0.0, 0.0], [0.0, -1.0, 3.0]])  # padding's gap unread
    _, with_kl = rl.PolicyLoss(Fixed(), kl=0.1)(None, targets, advantage, 1 / 3, reference)
    k3 = (math.exp(0.5) - 1.5) + (math.exp(-1.0) + 1.0 - 1)
    assert with_kl.item() == pytest.approx(by_hand + 0.1 * k3 / 3)


def test_the_loss_reads_the_distribution_that_drew_the_replies():
    """Replies drawn at temperature 0.5, every one of advantage 1: the expected gradient is zero
    (the score's mean), as it is only for the log-probabilities of the draws' distribution."""
    logits = torch.tensor([2.0, 0.5, -1.0], requires_grad=True)

    class Fixed(torch.nn.Module):
        def forward(self, idx):
            return logits.expand(3, 1, 3), None  # three replies of one token each

    # each token a reply of its own, weighted by its chance of being drawn: the expectation
    drawn = torch.softmax(logits.detach() / 0.5, -1)
    targets = torch.arange(3)[:, None]
    _, loss = rl.PolicyLoss(Fixed(), kl=0.0, temperature=0.5)(None, targets, drawn, scale=1.0)
    loss.backward()
    assert logits.grad.abs().max() < 1e-6
    # log p at temperature 1 instead: the likeliest token pushed up for nothing
    _, biased = rl.PolicyLoss(Fixed(), kl=0.0)(None, targets, drawn, scale=1.0)
    (push,) = torch.autograd.grad(biased, logits)
    assert push[0] < -0.1


@pytest.mark.parametrize("kl", [0.0, 0.1])
def test_a_reward_equal_for_every_reply_changes_nothing(setup, tmp_path, kl):
    """No advantage, and no gap to the start for the KL penalty to close: a zero gradient."""
    start, _, _ = setup
    model, _ = rl.main(argv(setup, tmp_path, "same", "--max_iters=3", f"--kl={kl}"))
    source, _, _ = load_gpt(start, "cpu")
    for (name, p), q in zip(source.state_dict().items(), model.state_dict().values()):
        assert torch.equal(p, q), name
    records = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    assert [r["grad_norm"] for r in records if "grad_norm" in r] == [0.0] * 3


def test_a_run_records_its_rewards_resumes_exactly_and_saves_a_chat_checkpoint(setup, tmp_path):
    whole, metrics = rl.main(argv(setup, tmp_path / "whole", "a_count", "--max_iters=4"))
    rl.main(argv(setup, tmp_path / "cut", "a_count", "--max_iters=2"))
    again = [f"--out_dir={tmp_path / 'cut'}", "--init_from=resume", "--max_iters=4"]
    resumed, resumed_metrics = rl.main(again)
    for (name, p), q in zip(whole.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(p, q), name
    assert metrics == resumed_metrics
    records = [json.loads(line) for line in open(tmp_path / "whole" / "metrics.jsonl")]
    assert [r["step"] for r in records if "val/reward" in r] == [0, 2, 4]
    steps = [r for r in records if "train/reward" in r]
    assert len(steps) == 4
    for key in ("train/reward_std", "train/reply_tokens", "rollout tok/s", "train/step_loss"):
        assert all(math.isfinite(r[key]) for r in steps), key
    # the bonus field of the line reached the reward
    assert all(r["val/reward"] >= 1 for r in records if "val/reward" in r)
    model, tokenizer, _ = load_gpt(str(tmp_path / "whole"), "cpu")
    assert tokenizer.spec["chat"]
    # plot.py draws val/reward in a panel of its own
    assert [r["step"] for r in evaluations(str(tmp_path / "whole"), "step")] == [0, 2, 4]
    plot.main([str(tmp_path / "whole"), "--out", str(tmp_path / "reward.png")])
    assert (tmp_path / "reward.png").stat().st_size


def test_the_word_task_checker_agrees_with_the_answers_prepare_writes():
    for _, line in prepare.word_tasks(60, 0):
        messages = json.loads(line)["messages"]
        answer = messages.pop()["content"]
        example = {"messages": messages}
        assert reward.word_task(example, answer) == 1.0
        assert reward.word_task(example, answer + "a") == 0.0
    assert reward.exact_match({"answer": "ab"}, "ab") == 1.0
    example = {"letters": 3, "first": "k"}
    assert [reward.letters_partial(example, r) for r in ("kit", "kite", "sit", "Kit")] == [
        1.0,
        0.5,
        0.5,
        0.0,
    ]
    assert [reward.letters(example, r) for r in ("kit", "kite", "sit", "kIt", "k t")] == [
        1,
        0,
        0,
        0,
        0,
    ]


def test_word_letters_credits_each_right_letter_in_its_place():
    """Capitals: abcd -> ABCD: a reply's right letters in place over the longer of the two."""
    example = {"messages": [{"role": "user", "content": "Capitals: abcd"}]}
    replies = ("ABCD", "ABXD", "ABC", "ABCDE", "DCBA", "")
    assert [reward.word_letters(example, r) for r in replies] == [1.0, 0.75, 0.75, 0.8, 0.0, 0.0]


def write(path, lines):
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def asks(content, *turns):
    return {"messages": [{"role": "user", "content": content}, *turns], "bonus": 0}


@pytest.mark.parametrize(
    "case, message",
    [
        ("no file", r"--reward=.*nowhere\.py:a_count: no file .*nowhere\.py; name the Python"),
        ("no function", r"rewards\.py: no function 'missing' in it; define missing\(example"),
        ("raises", r"prompts\.jsonl:\d+: the reward raised ZeroDivisionError: division by zero"),
        ("nan", r"prompts\.jsonl:\d+: the reward returned nan .*not a finite number"),
        ("text", r"prompts\.jsonl:\d+: the reward returned 'one' .*not a finite number"),
        ("assistant", r"bad\.jsonl:2: the conversation ends in an assistant turn: a prompt"),
        ("empty", r"--prompts .*bad\.jsonl: no train prompts \(0 train, 0 held out\)"),
        ("long", r"bad\.jsonl:1: \d+ tokens and a reply of max_new_tokens=4 pass the model's"),
        ("min_lr", r"min_lr=0\.1: must be <= learning_rate=0\.01$"),
        ("processes", r"gradient_accumulation_steps=3: must be a multiple of the 2 processes"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(setup, tmp_path, monkeypatch, case, message):
    """Each bad input is one line, train.py's rules of the keys the two share among them: under
    torchrun (its WORLD_SIZE) a gradient_accumulation_steps the processes cannot share."""
    start, prompts, rewards = setup
    name, extra = "a_count", []
    bad = tmp_path / "bad.jsonl"
    if case == "no file":
        extra = [f"--reward={tmp_path / 'nowhere.py'}:a_count"]
    elif case == "no function":
        name = "missing"
    elif case in ("raises", "nan", "text"):
        name = case
    elif case == "assistant":
        reply = {"role": "assistant", "content": "a"}
        extra = [f"--prompts={write(bad, [asks('a'), asks('b', reply)])}"]
    elif case == "empty":
        extra = [f"--prompts={write(bad, [])}"]
    elif case == "long":
        extra = [f"--prompts={write(bad, [asks('abcde' * 3)])}"]
    elif case == "min_lr":
        extra = ["--min_lr=0.1", "--max_iters=1"]
    elif case == "processes":
        monkeypatch.setenv("WORLD_SIZE", "2")
        extra = ["--gradient_accumulation_steps=3", "--max_iters=1"]
    out_dir = tmp_path / "out"
    code, _, err = cli("rl.py", *argv(setup, out_dir, name, *extra))
    assert code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith("rl.py: error: ") and re.search(message, err), err
    assert not out_dir.exists()


def test_a_rollout_ends_at_any_special_token_and_learns_it(setup, tmp_path):
    """A role marker drawn mid-reply ends the reply, as every decode's end_tokens end one, and
    the loss learns that marker where the reply ended, not a made-up <|end|>."""
    cfg, _ = parse(argv(setup, tmp_path), rl.OPTIONS, rl.__doc__)
    inputs = rl.Inputs(cfg)
    user = inputs.tokenizer.ids["<|user|>"]
    config = replace(inputs.model.config, bias=True)
    inputs.model = model = GPT(config)
    with torch.no_grad():  # every position's logits: 20 for <|user|>, 0 for the others
        model.ln_f.weight.zero_()
        model.ln_f.bias.copy_(torch.eye(config.n_embd)[0])
        model.lm_head.weight[:, 0] = 20.0 * (torch.arange(config.vocab_size) == user)
    rollout = rollouts.Rollout(cfg, Run("cpu", "float32"), inputs, nullcontext())
    batches, logged = rollout.batches(model, 0, None)
    assert logged["train/reply_tokens"] == 0
    for batch in batches:
        learnt = batch["targets"][batch["targets"] >= 0]
        assert learnt.tolist() == [user] * len(batch["idx"])


@pytest.mark.slow
def test_rl_under_ddp_equals_one_process(setup, tmp_path):
    """Two ranks, each with one prompt's group of replies, against one process taking both in two
    micro-steps: the same replies, the same scaled sums, equal bit for bit."""
    common = argv(setup, tmp_path, "a_count", "--max_iters=2", "--batch_size=1")
    common += ["--gradient_accumulation_steps=2"]
    script = tmp_path / "ddp_rl.py"
    script.write_text(
        f"import os, sys\nimport torch\nsys.path.insert(0, {ROOT!r})\nimport rl\n"
        "model, metrics = rl.main(sys.argv[1:])\n"
        "out = [a[10:] for a in sys.argv if a.startswith('--out_dir=')][-1]\n"
        "torch.save((model.state_dict(), metrics), f\"{out}/rank{os.environ['RANK']}.pt\")\n"
    )
    result = run_distributed(script, common + [f"--out_dir={tmp_path / 'ddp'}"])
    assert result.returncode == 0, result.stderr[-2000:]
    single, metrics = rl.main(common + [f"--out_dir={tmp_path / 'one'}"])
    rank0, metrics0 = torch.load(tmp_path / "ddp" / "rank0.pt")
    for name, p in single.state_dict().items():
        assert torch.equal(rank0[name], p), name
    assert metrics0 == metrics
    lines = [[json.loads(x) for x in open(tmp_path / d / "metrics.jsonl")] for d in ("ddp", "one")]
    keep = ("train/reward", "train/reward_std", "train/reply_tokens", "val/reward")
    assert [{k: r.get(k) for k in keep} for r in lines[0]] == [
        {k: r.get(k) for k in keep} for r in lines[1]
    ]
