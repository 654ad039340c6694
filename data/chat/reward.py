"""
Rewards for rl.py, and prompts for them. word_task checks a reply to one of data/chat/prepare.py's
word tasks by that file's own answers (word_letters: by letter); exact_match compares a reply with
the prompt line's "answer" field; letters checks a task of many right answers, which no
fine-tune's data writes down: any word of the letters and first letter the line's fields name
(letters_partial: a half for each).
  python data/chat/reward.py          # writes data/chat/prompts.jsonl: word tasks to learn from
  python rl.py config/chat_rl.py      # learns from them, scored by word_letters
  python data/chat/reward.py --task=letters --out=data/chat/letters.jsonl
The word tasks' prompts are words of another seed than the fine-tune's, less the questions of its
held-out split (prepare.py's defaults): those stay held out of both.
"""

import json
import os
import string
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))  # the repo root, for lib/
from data.chat.prepare import FLAGS, SYSTEM, TASKS, word_tasks
from lib import prepare
from lib.common import ArgumentParser, run_script
from lib.options import Option, flags


def word_task(example, reply):
    """1.0 if reply is the answer to the word task that the last message asks, else 0.0."""
    return float(reply == word_answer(example))


def word_letters(example, reply):
    """The word task's answer's letters that reply has in their places, over the longer of the
    two: 1.0 for the answer, and credit for each right letter where word_task gives none."""
    answer = word_answer(example)
    right = sum(a == b for a, b in zip(answer, reply))
    return right / max(len(answer), len(reply))


def word_answer(example):
    """The answer to the word task that the last message asks."""
    question = example["messages"][-1]["content"]
    for ask, answer in TASKS:
        head = ask.format("")
        if question.startswith(head):
            return answer(question[len(head) :])
    raise ValueError(f"not a word task: {question!r:.60}")


def exact_match(example, reply):
    """1.0 if reply is the line's "answer", else 0.0."""
    return float(reply == example["answer"])


# the letters task: "Word of five letters: k" (any such word), in words the characters of
# Shakespeare's text spell
NUMBERS = {"three": 3, "four": 4, "five": 5, "six": 6, "seven": 7}
LETTERS = "Word of {} letters: {}"


def letters(example, reply):
    """1.0 if reply is a word of lower-case letters a to z, of the line's "letters" and starting
    with its "first", else 0.0."""
    right = len(reply) == example["letters"] and reply[:1] == example["first"]
    return float(right and set(reply) <= set(string.ascii_lowercase))


def letters_partial(example, reply):
    """letters' pass as 1.0, and half a point for each of its two parts alone (the first letter,
    the length) in lower-case letters: a signal before any reply passes."""
    if not set(reply) <= set(string.ascii_lowercase):
        return 0.0
    return (reply[:1] == example["first"]) / 2 + (len(reply) == example["letters"]) / 2


def letters_tasks():
    """Each letters task once, and once under the word tasks' system prompt."""
    for word, n in NUMBERS.items():
        for first in string.ascii_lowercase:
            ask = [{"role": "user", "content": LETTERS.format(word, first)}]
            for system in ([], [{"role": "system", "content": SYSTEM}]):
                yield json.dumps({"messages": system + ask, "letters": n, "first": first})


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
            "out": Option(os.path.join(HERE, "prompts.jsonl"), "the prompts file to write"),
            "task": Option(
                "word",
                "word: the word tasks; letters: the letters task",
                choices=("word", "letters"),
            ),
            "examples": Option(3000, "word tasks to generate", ge=1),
            "seed": Option(2026, "their random seed"),
        },
    )
    args = p.parse_args()
    lines = list(letters_tasks() if args.task == "letters" else word_prompts(args))
    with open(args.out, "w") as f:
        f.writelines(line + "\n" for line in lines)
    print(f"{len(lines):,} prompts -> {args.out}")


def word_prompts(args):
    """The word tasks of args' seed without their answers, less the fine-tune's held-out ones."""
    held = held_out_questions()
    for _, line in word_tasks(args.examples, args.seed):
        messages = json.loads(line)["messages"][:-1]  # the answer is the model's to give
        if messages[-1]["content"] not in held:
            yield json.dumps({"messages": messages})


if __name__ == "__main__":
    run_script(main, "reward.py")
