"""
Rewards for rl.py, and the word tasks' prompts. word_task checks a reply to one of
data/chat/prepare.py's word tasks by that file's own answers; exact_match compares a reply with
the prompt line's "answer" field.
  python data/chat/reward.py          # writes data/chat/prompts.jsonl: word tasks to learn from
  python rl.py config/chat_rl.py      # learns from them, scored by word_task
The prompts are words of another seed than the fine-tune's, less the questions of its held-out
split (prepare.py's defaults): those stay held out of both.
"""

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))  # the repo root, for lib/
from data.chat.prepare import FLAGS, TASKS, word_tasks
from lib import prepare
from lib.common import ArgumentParser, run_script
from lib.keys import Key, flags


def word_task(example, reply):
    """1.0 if reply is the answer to the word task that the last message asks, else 0.0."""
    question = example["messages"][-1]["content"]
    for ask, answer in TASKS:
        head = ask.format("")
        if question.startswith(head):
            return float(reply == answer(question[len(head) :]))
    raise ValueError(f"not a word task: {question!r:.60}")


def exact_match(example, reply):
    """1.0 if reply is the line's "answer", else 0.0."""
    return float(reply == example["answer"])


def held_out_questions():
    """The questions of the fine-tune's val split, as prepare.py makes it by default."""
    held = set()
    defaults = {name: key.default for name, key in FLAGS.items()}
    for _, line in word_tasks(defaults["examples"], defaults["seed"]):
        if prepare.in_val(line.strip(), defaults["val_fraction"]):
            held.add(json.loads(line)["messages"][-2]["content"])
    return held


def main():
    p = ArgumentParser(description=__doc__)
    flags(
        p,
        {
            "out": Key(os.path.join(HERE, "prompts.jsonl"), "the prompts file to write"),
            "examples": Key(3000, "word tasks to generate", ge=1),
            "seed": Key(2026, "their random seed"),
        },
    )
    args = p.parse_args()
    held = held_out_questions()
    written = 0
    with open(args.out, "w") as f:
        for _, line in word_tasks(args.examples, args.seed):
            messages = json.loads(line)["messages"][:-1]  # the answer is the model's to give
            if messages[-1]["content"] not in held:
                f.write(json.dumps({"messages": messages}) + "\n")
                written += 1
    print(f"{written:,} prompts -> {args.out}")


if __name__ == "__main__":
    run_script(main, "reward.py")
