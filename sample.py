"""Sample from a trained checkpoint (--out_dir) or from GPT-2 (--init_from). Stdout carries only
the samples, each the prompt followed by its continuation, separated by a line of dashes; what was
loaded and the speed go to stderr, so the output can be piped. Examples:
  python sample.py --out_dir out-shakespeare-char-cpu --start "ROMEO:" --num_samples 3
  python sample.py --init_from gpt2 --start FILE:prompt.txt --top_p 0.9 --stop $'\\n\\n' --stream
  python sample.py --out_dir out-chat --chat                 talk to a chat fine-tune"""

import sys
import time
from dataclasses import fields
from functools import partial

import decoding
from engine import COMPILE_OPTION, Engine
from lib.common import ArgumentParser, Error, pick_device, run_script
from lib.formats import WEIGHTS_OPTION, for_decoding
from lib.options import DEVICE_OPTION, GPT2_NAMES, Option, flags, options_of
from lib.tokenizer import SEPARATOR, decode_request, end_tokens, stopped_short
from lib.weights import load_gpt

log = partial(print, file=sys.stderr)  # stdout carries only the samples
FLAGS = {
    "out_dir": Option("out", "a checkpoint written by train.py"),
    "init_from": Option(
        None,
        f"sample these weights instead of --out_dir: {', '.join(GPT2_NAMES)} (from the Hugging "
        "Face hub), a GPT-2 folder in its layout (model.safetensors + config.json; GPT-2's BPE), "
        "or a checkpoint folder of this project",
    ),
    "start": Option(
        "",
        "the prompt, or FILE:path to read it from a file; empty: the tokenizer's start token "
        "(newline, or BPE's <|endoftext|>), not printed",
    ),
    "num_samples": Option(1, "samples, generated together as one batch", ge=1),
    "max_new_tokens": Option(500, "tokens generated per sample", ge=0),
    "seed": Option(
        1337,
        "random seed: sample i draws from a generator of its own seeded seed + i, so it is the "
        "sample that --seed=seed+i --num_samples=1 gives",
    ),
    "device": DEVICE_OPTION,
    "weights": WEIGHTS_OPTION,
    "compile": COMPILE_OPTION,
    "stream": Option(
        False,
        "print the first sample token by token as it is generated; the others follow when the "
        "batch is done (stdout is the same as without --stream)",
    ),
    "stop": Option(
        None,
        "a string that ends a sample, cut right before it (searched in the continuation, not the "
        "prompt); generation ends once all have (in bash, $'\\n\\n' is two newlines)",
    ),
    "ignore_eos": Option(
        False,
        "go on past the tokenizer's special tokens (<|endoftext|>, a chat model's <|end|> and "
        "role markers), one of which otherwise ends a sample, unprinted",
    ),
    "messages": Option(None, "a JSON file of a conversation ({'messages': [...]}): reply to it"),
    "chat": Option(
        False,
        "talk to a chat model (config/chat.py's), after --messages' conversation if given: each "
        "line typed is your turn; the oldest turns leave past the context",
    ),
    "no_cache": Option(
        False,
        "re-run the model's whole window every step instead of using the KV cache (slower, the "
        "same tokens; for comparison)",
    ),
}


def decoding_flags():
    """--greedy and a flag per decoding.Options field, at sample.py's defaults; their ranges are
    Options' to check, so the messages name the option as the API's do."""
    keys = {
        "greedy": Option(
            False,
            "take the most likely token instead of sampling (the penalties and "
            "--no_repeat_ngram_size still apply)",
        )
    }
    for name, key in options_of(decoding.Options).items():
        keys[name] = Option(decoding.SAMPLE_DEFAULTS.get(name, key.default), key.help)
    return keys


def parse_args(argv=None):
    p = ArgumentParser(prog="sample.py", description=__doc__)
    flags(p, FLAGS)
    g = p.add_argument_group(
        "decoding strategy (applied in this order: penalties and n-gram blocking on the raw "
        "logits, then temperature, top-k, top-p, then sampling)"
    )
    flags(g, decoding_flags())
    args = p.parse_args(argv)
    # sample i is seeded seed + i, and torch's generators take seeds in [-2**63, 2**64)
    if not -(2**63) <= args.seed <= 2**64 - args.num_samples:
        p.error(
            f"--seed {args.seed}: must be in [-2**63, 2**64 - num_samples] "
            "(sample i is seeded seed + i)"
        )
    if args.compile and args.no_cache:
        p.error(
            "--compile compiles the cached one-token step, which --no_cache never runs: drop one"
        )
    try:
        options = decoding.Options(
            **{f.name: getattr(args, f.name) for f in fields(decoding.Options)}
        )
    except Error as e:
        p.error(f"--{e}")  # the messages start with the option's name
    if args.start.startswith("FILE:"):
        path = args.start[5:]
        try:
            with open(path, encoding="utf-8") as f:
                args.start = f.read()
        except OSError as e:
            p.error(f"--start FILE:{path}: {e.strerror}")
        except UnicodeDecodeError:
            p.error(f"--start FILE:{path}: not UTF-8 text; save the prompt as UTF-8")
    return args, options


def main(argv=None):
    args, options = parse_args(argv)
    device = pick_device(args.device)
    model, tokenizer, what = load_gpt(
        args.init_from or args.out_dir, device, hub=bool(args.init_from)
    )
    talking = args.chat or args.messages
    if not talking:  # before any measuring: a prompt the model cannot read is one line
        try:
            prompt = tokenizer.encode(args.start) if args.start else [tokenizer.start_token]
        except Error as e:  # a character the char model never saw
            raise Error(f"--start: {e}") from None
    model = for_decoding(model, device, args.weights)
    log(f"{what}; {device}, {model.weights_format} weights")
    t0 = time.perf_counter()
    try:
        engine = Engine(model, args.num_samples, not args.no_cache, args.compile)
    except Error as e:  # a cache past memory
        raise Error(f"--num_samples {args.num_samples}: {e}") from None
    rules = decoding.make_rules(
        options, args.greedy, args.seed, args.num_samples, tokenizer.vocab_size
    )
    if args.compile:
        log(f"compiled the one-token step in {time.perf_counter() - t0:.1f} s")
    if talking:
        from lib.chat import talk

        return talk(engine, tokenizer, rules, args)
    block_size = model.config.block_size
    if len(prompt) > block_size:
        log(f"the prompt has {len(prompt)} tokens; the model sees only the last {block_size}")
    # the special tokens: none for plain characters, a chat model's markers and <|end|> too
    ends = () if args.ignore_eos else end_tokens(tokenizer)
    request = engine.submit(prompt, rules, args.max_new_tokens, ends)
    print_samples(engine, request, tokenizer, args)
    stopped_short(request.rows)


def print_samples(engine, request, tokenizer, args):
    """Decodes the request and prints its samples, each cut right before --stop (searched in the
    continuation, not the prompt) where its row stops; --stream prints the first as it grows."""
    if args.stream:
        print(args.start, end="", flush=True)
    t0 = time.perf_counter()
    texts, steps, interrupted = decode_request(engine, request, tokenizer, args.stop, args.stream)
    seconds = time.perf_counter() - t0
    rate = len(texts) * steps / max(seconds, 1e-9)
    no_cache = " (no KV cache)" if args.no_cache else ""
    log(f"{len(texts)} x {steps} tokens in {seconds:.2f} s: {rate:.0f} tokens/s{no_cache}")
    for i, text in enumerate(texts):
        if i or not args.stream:  # a streamed first sample is already out
            print(f"{SEPARATOR}\n" if i else "", args.start, text, sep="")
    if interrupted:  # Ctrl-C: what was generated is printed above
        log(f"interrupted after {steps} tokens: the samples above are what was generated")
        raise SystemExit(130)


if __name__ == "__main__":
    run_script(main, "sample.py")
