"""Sample from a trained checkpoint (--out_dir) or from GPT-2 (--init_from). Stdout carries only
the samples, each the prompt followed by its continuation, separated by a line of dashes; what was
loaded and the speed go to stderr, so the output can be piped. Examples:
  python sample.py --out_dir out --start "ROMEO:" --num_samples 3 --max_new_tokens 200
  python sample.py --init_from gpt2 --start FILE:prompt.txt --top_p 0.9 --stop $'\\n\\n' --stream"""

import argparse
import os
import sys
import time
from dataclasses import fields

import torch

import decoding
from lib.common import (
    ArgumentParser,
    Error,
    at_least,
    autocast,
    pick_device,
    resolve_dtype,
    run_script,
)
from lib.tokenizer import get_tokenizer
from model import GPT2_NAMES, load_pretrained

SEPARATOR = "-" * 40
# this script's own defaults for decoding.Options (nanoGPT's); every other option starts off
DEFAULTS = dict(temperature=0.8, top_k=200)


def parse_args(argv=None):
    p = ArgumentParser(
        prog="sample.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--out_dir",
        default="out",
        help="a checkpoint written by train.py (default: %(default)s)",
    )
    p.add_argument(
        "--init_from",
        help=f"sample these weights instead of --out_dir: one of {', '.join(GPT2_NAMES)} "
        "(downloaded from the Hugging Face hub), a local GPT-2 folder in the Hugging Face "
        "layout (model.safetensors + config.json; GPT-2's BPE), or a checkpoint folder of "
        "this project",
    )
    p.add_argument(
        "--start",
        default="",
        help="the prompt, or FILE:path to read it from a file; empty: the tokenizer's start "
        "token (newline, or BPE's <|endoftext|>), not printed",
    )
    p.add_argument(
        "--num_samples",
        type=at_least(1),
        default=1,
        help="samples, generated together as one batch (default: %(default)s)",
    )
    p.add_argument(
        "--max_new_tokens",
        type=at_least(0),
        default=500,
        help="tokens generated per sample (default: %(default)s)",
    )
    p.add_argument(
        "--seed",
        type=int,
        default=1337,
        help="random seed; the same seed gives the same samples (default: %(default)s)",
    )
    p.add_argument(
        "--device",
        default="auto",
        help="cpu, cuda, cuda:1, mps, ...; auto: cuda, then mps, then cpu",
    )
    p.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "float32", "bfloat16", "float16"],
        help="autocast dtype; auto: bfloat16 where the hardware has it, float16 on older GPUs, "
        "else float32 (as train.py)",
    )
    p.add_argument(
        "--stream",
        action="store_true",
        help="print the first sample token by token as it is generated; the others follow "
        "when the batch is done (stdout is the same as without --stream)",
    )
    p.add_argument(
        "--stop",
        help="a string that ends a sample: the sample is cut right before it, and generation "
        "ends when every sample has stopped (only the continuation is searched, not the "
        "prompt; in bash, $'\\n\\n' is two newlines)",
    )
    p.add_argument(
        "--no_cache",
        action="store_true",
        help="re-run the model's whole window every step instead of using the KV cache "
        "(slower, the same tokens; for comparison)",
    )
    g = p.add_argument_group(
        "decoding strategy (applied in this order: penalties and n-gram blocking on the raw "
        "logits, then temperature, top-k, top-p, then sampling)"
    )
    g.add_argument(
        "--greedy",
        action="store_true",
        help="take the most likely token instead of sampling (the penalties and "
        "--no_repeat_ngram_size still apply)",
    )
    for f in fields(decoding.Options):
        default = DEFAULTS.get(f.name, f.default)
        help = f"{f.metadata['help']} (default: {default})"
        g.add_argument(f"--{f.name}", type=f.type, default=default, help=help)
    args = p.parse_args(argv)
    try:
        options = decoding.Options(
            **{f.name: getattr(args, f.name) for f in fields(decoding.Options)}
        )
    except Error as e:
        p.error(f"--{e}")  # the messages start with the option's name
    pick = decoding.NextToken(options, args.greedy)
    if args.start.startswith("FILE:"):
        args.start = read_prompt(p, args.start[5:])
    return args, pick


def read_prompt(parser, path):
    """The text of a --start=FILE:path prompt, or the parser's error line."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as e:
        parser.error(f"--start FILE:{path}: {e.strerror}")
    except UnicodeDecodeError:
        parser.error(f"--start FILE:{path}: not UTF-8 text; save the prompt as UTF-8")


def load(source, device, hub=False):
    """(model in eval mode on device, tokenizer, a line saying what was loaded) from a checkpoint
    folder of this project, or with hub, GPT-2's weights (a name, or a Hugging Face folder)."""
    if not hub and not os.path.isfile(os.path.join(source, "config.json")):
        raise Error(
            f"no checkpoint in {source!r}: train one with "
            "`python train.py config/shakespeare_char.py`, point --out_dir at one, "
            "or sample GPT-2 with --init_from gpt2"
        )
    model, info = load_pretrained(source, device)
    if info["architecture"] != "GPT":
        raise Error(
            f"{source!r} holds an {info['architecture']} (task {info.get('task')!r}): "
            "sample.py needs a GPT; classify.py runs a classifier"
        )
    tokenizer = get_tokenizer(info.get("tokenizer"), os.path.join(source, "config.json"))
    millions = model.num_params() / 1e6
    kind = info["tokenizer"]["type"]
    what = f"loaded {source}: {millions:.2f}M parameters, {kind} tokenizer"
    return model, tokenizer, what


def printable(text, stops=()):
    """The part of a growing continuation that can be printed now: never a trailing half of a
    multi-byte character (tiktoken decodes it to U+FFFD) nor a tail that may turn out to be the
    start of a stop string."""
    text = text.rstrip("\ufffd")
    held = 0  # characters at the end that may begin a stop string
    for stop in stops:
        for n in range(1, min(len(stop) - 1, len(text)) + 1):
            if stop.startswith(text[-n:]):
                held = max(held, n)
    return text[: len(text) - held]


def main(argv=None):
    args, pick = parse_args(argv)
    device = pick_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    source = args.init_from or args.out_dir
    model, tokenizer, what = load(source, device, hub=bool(args.init_from))
    try:
        prompt = tokenizer.encode(args.start) if args.start else [tokenizer.start_token]
    except Error as e:  # a character the char model never saw
        raise Error(f"--start: {e}") from None
    print(f"{what}; {device}, {dtype}", file=sys.stderr)
    block_size = model.config.block_size
    if len(prompt) > block_size:
        print(
            f"the prompt has {len(prompt)} tokens; the model sees only the last {block_size}",
            file=sys.stderr,
        )
    # seeded here, after loading: the draws do not depend on how the model was built
    torch.manual_seed(args.seed)
    with autocast(device, dtype):
        texts, steps, seconds, interrupted = decode_samples(model, tokenizer, prompt, pick, args)
    rate = args.num_samples * steps / max(seconds, 1e-9)
    no_cache = " (no KV cache)" if args.no_cache else ""
    print(
        f"{args.num_samples} x {steps} tokens in {seconds:.2f} s: {rate:.0f} tokens/s{no_cache}",
        file=sys.stderr,
    )
    for i, text in enumerate(texts):
        if i or not args.stream:  # a streamed first sample is already out
            print(f"{SEPARATOR}\n" if i else "", args.start, text, sep="")
    if interrupted:
        print(
            f"interrupted after {steps} tokens: the samples above are what was generated",
            file=sys.stderr,
        )
        raise SystemExit(130)


def continuations(model, tokenizer, prompts, pick, max_new_tokens, stops=(), use_cache=True):
    """Decode a continuation of each prompt (lists of token ids, of one length) as one batch, each
    token chosen by pick (a decoding.NextToken); after every step yield (their texts so far, which
    have stopped, the step's tokens [n]). A text ends right before the first of stops it holds (the
    continuation is searched, not the prompt); the decoding ends once all have stopped."""
    n = len(prompts)
    idx = torch.tensor(prompts, dtype=torch.long, device=model.wte.weight.device)
    # the model's vocabulary may be padded past the tokenizer's: never pick those ids
    n_vocab = tokenizer.vocab_size

    def next_token(logits, context):
        return pick(logits[:, :n_vocab], context)

    tokens = [[] for _ in range(n)]
    texts = [""] * n
    done = [False] * n
    for token in model.generate(idx, max_new_tokens, next_token, use_cache):
        for i, t in enumerate(token.tolist()):
            if done[i]:
                continue
            tokens[i].append(t)
            # the whole continuation decoded: bytes split over tokens join up
            texts[i] = tokenizer.decode(tokens[i])
            cuts = [texts[i].find(stop) for stop in stops]
            cut = min([c for c in cuts if c >= 0], default=-1)
            if cut >= 0:
                texts[i] = texts[i][:cut]
                done[i] = True
        yield texts, done, token
        if all(done):
            return


def decode_samples(model, tokenizer, prompt, pick, args):
    """sample.py's decoding -> (the texts, steps run, seconds, interrupted); --stream prints the
    first sample as it grows."""
    texts = [""] * args.num_samples
    steps = 0
    shown = 0  # characters of sample 0 already streamed
    if args.stream:
        print(args.start, end="", flush=True)
    stops = [args.stop] if args.stop else []
    prompts = [prompt] * args.num_samples
    decoding_steps = continuations(
        model, tokenizer, prompts, pick, args.max_new_tokens, stops, not args.no_cache
    )
    t0 = time.perf_counter()
    interrupted = False
    try:
        for steps, (texts, done, _) in enumerate(decoding_steps, 1):  # noqa: B007 (read after)
            if args.stream:
                out = texts[0] if done[0] else printable(texts[0], stops)
                print(out[shown:], end="", flush=True)
                shown = max(shown, len(out))
    except KeyboardInterrupt:  # Ctrl-C: keep what was generated
        interrupted = True
    seconds = time.perf_counter() - t0
    if args.stream:
        print(texts[0][shown:], flush=True)
    return texts, steps, seconds, interrupted


if __name__ == "__main__":
    run_script(main, "sample.py")
