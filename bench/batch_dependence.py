"""
What a row's numbers owe to the batch beside it: in each weight format, one sample decoded alone
and again as one of 12 rows (the others other prompts and seeds), its tokens and its chosen
tokens' log-probabilities compared, over several seeds. The draws are the row's own (its
generator); what can differ is rounding: the products sum in another order for another number
of rows, and bfloat16 and int8 round each product's output to bfloat16.
  python bench/batch_dependence.py --out_dir=out-shakespeare-char --seeds=20
"""

import os
import sys

import torch

# run from anywhere: the repository root
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from decoding import Options, make_rules  # noqa: E402
from lib.common import ArgumentParser, run_script  # noqa: E402
from lib.formats import for_decoding  # noqa: E402
from lib.options import (  # noqa: E402
    Option,
    flags,
)
from lib.weights import load_gpt  # noqa: E402
from serving.scheduler import ServingEngine  # noqa: E402

PROMPTS = ["ROMEO:", "KING HENRY:", "First Citizen:", "JULIET:"]
OPTIONS = Options(temperature=0.9, top_k=40)
FLAGS = {
    "seeds": Option(20, "samples compared per format", ge=1),
    "tokens": Option(100, "tokens per sample", ge=1),
}


def decode(model, tokenizer, seed, tokens, company):
    """The row of seed's sample of PROMPTS[0], decoded beside `company` other rows."""
    engine = ServingEngine(model, 1 + company)
    vocab_size = tokenizer.vocab_size
    for i in range(company):
        prompt = tokenizer.encode(PROMPTS[1 + i % 3])
        engine.submit(prompt, make_rules(OPTIONS, False, 1000 + i, 1, vocab_size), tokens)
    prompt = tokenizer.encode(PROMPTS[0])
    picks = make_rules(OPTIONS, False, seed, 1, vocab_size)
    request = engine.submit(prompt, picks, tokens, logprobs=0)
    while engine.busy():
        engine.step()
    return request.rows[0]


def main(argv=None):
    p = ArgumentParser(prog="batch_dependence.py", description=__doc__)
    p.add_argument("--out_dir", required=True, help="a GPT checkpoint of train.py")
    flags(p, FLAGS)
    args = p.parse_args(argv)
    print("| weights | samples whose tokens differ | largest log-probability difference |")
    print("| --- | --- | --- |")
    for weights in ("float32", "bfloat16", "int8"):
        model, tokenizer, _ = load_gpt(args.out_dir, "cpu")
        model = for_decoding(model, "cpu", weights)
        differ = 0
        worst = 0.0
        for seed in range(args.seeds):
            alone = decode(model, tokenizer, seed, args.tokens, 0)
            beside = decode(model, tokenizer, seed, args.tokens, 11)
            differ += alone.tokens != beside.tokens
            # up to the first token that differs: after it the contexts differ
            pairs = zip(
                alone.generated, beside.generated, alone.token_logprobs, beside.token_logprobs
            )
            for a, b, la, lb in pairs:
                if a != b:
                    break
                worst = max(worst, abs(la - lb))
        print(f"| {weights} | {differ} of {args.seeds} | {worst:.2e} |")


if __name__ == "__main__":
    with torch.no_grad():
        run_script(main, "batch_dependence.py")
