"""Sample from a trained checkpoint (--out_dir) or from GPT-2 (--init_from). Stdout carries only the samples, each the
prompt followed by its continuation, separated by a line of dashes; what was loaded and the speed go to stderr, so
the output can be piped. Examples:
  python sample.py --out_dir out --start "ROMEO:" --num_samples 3 --max_new_tokens 200
  python sample.py --init_from gpt2 --start FILE:prompt.txt --top_p 0.9 --stop $'\\n\\n' --stream"""

import argparse
import os
import sys
import time

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
# decoding.OPTIONS with their types and this script's defaults (checked there); --help shows each function's docstring
DECODING = dict(
    temperature=(float, 0.8),
    top_k=(int, 200),
    top_p=(float, 1.0),
    frequency_penalty=(float, 0.0),
    presence_penalty=(float, 0.0),
    repetition_penalty=(float, 1.0),
    no_repeat_ngram_size=(int, 0),
)


def parse_args(argv=None):
    p = ArgumentParser(
        prog="sample.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--out_dir", default="out", help="a checkpoint written by train.py (default: %(default)s)"
    )
    p.add_argument(
        "--init_from",
        help=f"sample these weights instead of --out_dir: one of {', '.join(GPT2_NAMES)} "
        "(downloaded from the Hugging Face hub), a local GPT-2 folder in the Hugging Face layout "
        "(model.safetensors + config.json; GPT-2's BPE), or a checkpoint folder of this project",
    )
    p.add_argument(
        "--start",
        default="",
        help="the prompt, or FILE:path to read it from a file; empty: the "
        "tokenizer's start token (newline, or BPE's <|endoftext|>), not printed",
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
        help="autocast "
        "dtype; auto: bfloat16 where the hardware has it, float16 on older GPUs, else float32 (as train.py)",
    )
    p.add_argument(
        "--stream",
        action="store_true",
        help="print the first sample token by token as it is "
        "generated; the others follow when the batch is done (stdout is the same as without --stream)",
    )
    p.add_argument(
        "--stop",
        help="a string that ends a sample: the sample is cut right before it, and generation "
        "ends when every sample has stopped (only the continuation is searched, not the prompt; in bash, "
        "$'\\n\\n' is two newlines)",
    )
    p.add_argument(
        "--no_cache",
        action="store_true",
        help="re-run the model's whole window every step instead of "
        "using the KV cache (slower, the same tokens; for comparison)",
    )
    g = p.add_argument_group(
        "decoding strategy (applied in this order: penalties and n-gram blocking on the raw "
        "logits, then temperature, top-k, top-p, then sampling)"
    )
    g.add_argument(
        "--greedy",
        action="store_true",
        help="take the most likely token instead of sampling "
        "(the penalties and --no_repeat_ngram_size still apply)",
    )
    for name, (kind, default) in DECODING.items():
        text = " ".join(decoding.OPTIONS[name][0].__doc__.split())
        g.add_argument(f"--{name}", type=kind, default=default, help=f"{text} (default: {default})")
    args = p.parse_args(argv)
    try:
        options = {name: getattr(args, name) for name in DECODING} | {"top_k": args.top_k or None}
        pick = decoding.make_next_token(**options, greedy=args.greedy)
    except Error as e:
        p.error(f"--{e}")  # the messages start with the option's name
    if args.start.startswith("FILE:"):
        try:
            with open(args.start[5:], encoding="utf-8") as f:
                args.start = f.read()
        except OSError as e:
            p.error(f"--start {args.start}: {e.strerror}")
        except UnicodeDecodeError:
            p.error(f"--start {args.start}: not UTF-8 text; save the prompt as UTF-8")
    return args, pick


def load(source, device, hub=False):
    """(model in eval mode on device, tokenizer, a line saying what was loaded) from a checkpoint folder of this
    project, or with hub, GPT-2's weights (a name, or a folder in the Hugging Face layout)."""
    if not hub and not os.path.isfile(os.path.join(source, "config.json")):
        raise Error(
            f"no checkpoint in {source!r}: train one with `python train.py config/shakespeare_char.py`, point "
            f"--out_dir at one, or sample GPT-2 with --init_from gpt2"
        )
    model, info = load_pretrained(source, device)
    if info["architecture"] != "GPT":
        raise Error(
            f"{source!r} holds an {info['architecture']} (task {info.get('task')!r}): sample.py needs a GPT; "
            f"classify.py runs a classifier"
        )
    tokenizer = get_tokenizer(info.get("tokenizer"), os.path.join(source, "config.json"))
    what = f"loaded {source}: {model.num_params() / 1e6:.2f}M parameters, {info['tokenizer']['type']} tokenizer"
    return model, tokenizer, what


def printable(text, stops=()):
    """The part of a growing continuation that can be printed now: never a trailing half of a multi-byte character
    (tiktoken decodes it to U+FFFD) nor a tail that may turn out to be the start of a stop string."""
    text = text.rstrip("\ufffd")
    held = [
        n
        for stop in stops
        for n in range(1, min(len(stop) - 1, len(text)) + 1)
        if stop.startswith(text[-n:])
    ]
    return text[: len(text) - max(held, default=0)]


def main(argv=None):
    args, pick = parse_args(argv)
    device = pick_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    model, tokenizer, what = load(args.init_from or args.out_dir, device, hub=bool(args.init_from))
    try:
        prompt = tokenizer.encode(args.start) if args.start else [tokenizer.start_token]
    except Error as e:  # a character the char model never saw
        raise Error(f"--start: {e}") from None
    print(f"{what}; {device}, {dtype}", file=sys.stderr)
    if len(prompt) > model.config.block_size:
        print(
            f"the prompt has {len(prompt)} tokens; the model sees only the last {model.config.block_size}",
            file=sys.stderr,
        )
    torch.manual_seed(
        args.seed
    )  # here, after loading: the draws do not depend on how the model was built
    texts, steps, seconds, interrupted = generate(
        model, tokenizer, prompt, pick, args, autocast(device, dtype)
    )
    n = args.num_samples * steps
    print(
        f"{args.num_samples} x {steps} tokens in {seconds:.2f} s: {n / max(seconds, 1e-9):.0f} tokens/s"
        f"{' (no KV cache)' if args.no_cache else ''}",
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


def continuations(model, tokenizer, prompt, pick, n, max_new_tokens, stops=(), use_cache=True):
    """Decode n continuations of prompt (token ids) as one batch, each token chosen by pick (make_next_token's); after
    every step yield (their texts so far, which have stopped, the step's tokens [n]). A text ends right before the
    first of stops it holds (the continuation is searched, not the prompt); the decoding ends once all have stopped."""
    idx = torch.tensor([prompt] * n, dtype=torch.long, device=model.wte.weight.device)
    n_vocab = (
        tokenizer.vocab_size
    )  # the model's vocabulary may be padded past the tokenizer's: never pick those ids
    next_token = lambda logits, context: pick(logits[:, :n_vocab], context)
    tokens, texts, done = [[] for _ in range(n)], [""] * n, [False] * n
    for token in model.generate(idx, max_new_tokens, next_token=next_token, use_cache=use_cache):
        for i, t in enumerate(token.tolist()):
            if not done[i]:
                tokens[i].append(t)
                texts[i] = tokenizer.decode(
                    tokens[i]
                )  # the whole continuation: bytes split over tokens join up
                cut = min(
                    [c for c in (texts[i].find(stop) for stop in stops) if c >= 0], default=-1
                )
                if cut >= 0:
                    texts[i], done[i] = texts[i][:cut], True
        yield texts, done, token
        if all(done):
            return


def generate(model, tokenizer, prompt, pick, args, ctx):
    """sample.py's decoding -> (the texts, steps run, seconds, interrupted); --stream prints the first as it grows."""
    texts, steps, shown = (
        [""] * args.num_samples,
        0,
        0,
    )  # shown: characters of sample 0 already streamed
    if args.stream:
        print(args.start, end="", flush=True)
    stops = [args.stop] if args.stop else []
    run = continuations(
        model,
        tokenizer,
        prompt,
        pick,
        args.num_samples,
        args.max_new_tokens,
        stops,
        not args.no_cache,
    )
    t0, interrupted = time.perf_counter(), False
    try:
        with ctx:
            for steps, (texts, done, _) in enumerate(run, 1):
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
