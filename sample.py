"""
Sample from a trained checkpoint (--out_dir) or from GPT-2 (--init_from). Stdout carries only the samples, each the
prompt followed by its continuation, separated by a line of dashes; what was loaded and the speed go to stderr, so
the output can be piped. Examples:
  python sample.py --out_dir out --start "ROMEO:" --num_samples 3 --max_new_tokens 200
  python sample.py --init_from gpt2 --start FILE:prompt.txt --top_p 0.9 --stop $'\\n\\n' --stream
"""
import argparse
import contextlib
import os
import sys
import time

import torch

from decoding import make_next_token
from model import GPT, from_checkpoint
from tokenizer import get_tokenizer
from train import pick_device

GPT2_NAMES = ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl")
SEPARATOR = "-" * 40


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, not argparse's usage block: the message says what is wrong
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def parse_args(argv=None):
    p = Parser(prog="sample.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out_dir", default="out", help="a checkpoint written by train.py (default: %(default)s)")
    p.add_argument("--init_from", help=f"sample GPT-2 instead of --out_dir: one of {', '.join(GPT2_NAMES)} "
                   "(downloaded from the Hugging Face hub) or a local directory in the Hugging Face layout "
                   "(model.safetensors + config.json); the tokenizer is GPT-2's BPE")
    p.add_argument("--start", default="", help="the prompt, or FILE:path to read it from a file; empty (the "
                   "default) starts from the tokenizer's start token (newline for char models, <|endoftext|> for "
                   "BPE), which is not printed")
    p.add_argument("--num_samples", type=int, default=1,
                   help="samples, generated together as one batch (default: %(default)s)")
    p.add_argument("--max_new_tokens", type=int, default=500, help="tokens generated per sample (default: %(default)s)")
    p.add_argument("--seed", type=int, default=1337,
                   help="random seed; the same seed gives the same samples (default: %(default)s)")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:1, mps, ...; auto: cuda, then mps, then cpu")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                   help="autocast dtype; auto: bfloat16 on cuda where supported, else float16 on cuda, float32 "
                   "elsewhere; on cpu only float32 and bfloat16")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile the model (it recompiles a few times at first: pays off only for long "
                   "samples on a GPU)")
    p.add_argument("--stream", action="store_true", help="print the first sample token by token as it is "
                   "generated; the others follow when the batch is done (stdout is the same as without --stream)")
    p.add_argument("--stop", help="a string that ends a sample: the sample is cut right before it, and generation "
                   "ends when every sample has stopped (only the continuation is searched, not the prompt; in bash, "
                   "$'\\n\\n' is two newlines)")
    p.add_argument("--no_cache", action="store_true", help="re-run the whole context every step instead of using "
                   "the KV cache (slower, the same tokens; for comparison)")
    g = p.add_argument_group("decoding strategy (applied in this order: penalties and n-gram blocking on the raw "
                             "logits, then temperature, top-k, top-p, then sampling)")
    g.add_argument("--greedy", action="store_true", help="take the most likely token instead of sampling "
                   "(the penalties and --no_repeat_ngram_size still apply)")
    g.add_argument("--temperature", type=float, default=0.8, help="divide the logits by this, >= 0; < 1 is more "
                   "conservative, > 1 more random, 0 is greedy (default: %(default)s)")
    g.add_argument("--top_k", type=int, default=200, help="keep only the k most likely tokens, >= 1; ties with the "
                   "k-th are kept; 0 or a value >= the vocabulary keeps all (default: %(default)s)")
    g.add_argument("--top_p", type=float, default=1.0, help="nucleus: keep the fewest most likely tokens whose "
                   "probabilities sum to >= p, in (0, 1]; 1 keeps all (default: %(default)s)")
    g.add_argument("--frequency_penalty", type=float, default=0.0, help="subtract this times the number of times a "
                   "token occurs in the context so far from its logit (OpenAI's; default: %(default)s)")
    g.add_argument("--presence_penalty", type=float, default=0.0, help="subtract this from the logit of every token "
                   "that occurs in the context so far (OpenAI's; default: %(default)s)")
    g.add_argument("--repetition_penalty", type=float, default=1.0, help="> 0: for tokens in the context, divide "
                   "positive logits by this and multiply negative ones (Hugging Face's; 1 = off, 1.2 is common)")
    g.add_argument("--no_repeat_ngram_size", type=int, default=0, help="never complete an n-gram of this size that "
                   "already occurs in the prompt or the output (Hugging Face's; 0 = off)")
    args = p.parse_args(argv)
    if args.num_samples < 1:
        p.error(f"--num_samples must be >= 1, got {args.num_samples}")
    if args.max_new_tokens < 0:
        p.error(f"--max_new_tokens must be >= 0, got {args.max_new_tokens}")
    try:
        pick = make_next_token(temperature=args.temperature, top_k=args.top_k or None, top_p=args.top_p,
                               frequency_penalty=args.frequency_penalty, presence_penalty=args.presence_penalty,
                               repetition_penalty=args.repetition_penalty,
                               no_repeat_ngram_size=args.no_repeat_ngram_size, greedy=args.greedy)
    except ValueError as e:
        p.error(f"--{e}")  # the messages start with the option's name
    if args.start.startswith("FILE:"):
        try:
            with open(args.start[5:], encoding="utf-8") as f:
                args.start = f.read()
        except OSError as e:
            p.error(f"--start {args.start}: {e.strerror}")
    return p, args, pick


def autocast(device, dtype, error):
    """The autocast context for --dtype on this device, or a no-op for float32."""
    kind = torch.device(device).type
    if dtype == "auto":
        dtype = ("bfloat16" if torch.cuda.is_bf16_supported() else "float16") if kind == "cuda" else "float32"
    if dtype == "float32":
        return dtype, contextlib.nullcontext()
    if kind == "cpu" and dtype == "float16":
        error("--dtype float16 needs a GPU; on cpu use bfloat16 or float32")
    return dtype, torch.autocast(device_type=kind, dtype=getattr(torch, dtype))


def load(args, device, error):
    """(model in eval mode on device, tokenizer, a line saying what was loaded)."""
    if args.init_from:
        if args.init_from not in GPT2_NAMES and not os.path.isdir(args.init_from):
            error(f"--init_from {args.init_from!r} is neither a directory nor one of {', '.join(GPT2_NAMES)}")
        try:
            model = GPT.from_pretrained(args.init_from).to(device).eval()
        except Exception as e:  # no network, no such file, a broken checkpoint
            sys.exit(f"sample.py: error: cannot load {args.init_from!r}: {type(e).__name__}: {e}".splitlines()[0])
        spec, what = {"type": "bpe", "encoding": "r50k_base"}, args.init_from
    else:
        if not os.path.isfile(os.path.join(args.out_dir, "config.json")):
            error(f"no checkpoint in {args.out_dir!r}: train one with `python train.py config/shakespeare_char.py "
                  f"--out_dir={args.out_dir}`, point --out_dir at one, or sample GPT-2 with --init_from gpt2")
        try:
            model, info = from_checkpoint(args.out_dir, device)
        except RuntimeError as e:
            sys.exit(f"sample.py: error: {e}")
        if info["architecture"] != "GPT":
            error(f"{args.out_dir!r} holds an {info['architecture']} (task {info.get('task')!r}): sample.py needs a "
                  f"GPT; classify.py runs a classifier")
        spec, what = info["tokenizer"], args.out_dir
    try:
        tokenizer = get_tokenizer(spec)
    except RuntimeError as e:
        sys.exit(f"sample.py: error: {e}")
    return model, tokenizer, f"loaded {what}: {model.num_params() / 1e6:.2f}M parameters, {spec['type']} tokenizer"


def printable(text, stop):
    """The part of a growing continuation that can be printed now: never a trailing half of a multi-byte character
    (tiktoken decodes it to U+FFFD) nor a tail that may turn out to be the start of the stop string."""
    text = text.rstrip("\ufffd")
    if stop:
        for n in range(min(len(stop) - 1, len(text)), 0, -1):
            if stop.startswith(text[-n:]):
                return text[:-n]
    return text


def main(argv=None):
    parser, args, pick = parse_args(argv)
    device = pick_device(args.device, parser.error)
    dtype, ctx = autocast(device, args.dtype, parser.error)
    model, tokenizer, what = load(args, device, parser.error)
    try:
        prompt = tokenizer.encode(args.start) if args.start else [tokenizer.start_token]
    except ValueError as e:  # a character the char model never saw
        parser.error(f"--start: {e}")
    print(f"{what}; {device}, {dtype}{', compiled' if args.compile else ''}", file=sys.stderr)
    if args.compile:
        model.compile()
    if len(prompt) > model.config.block_size:
        print(f"the prompt has {len(prompt)} tokens; the model sees only the last {model.config.block_size}",
              file=sys.stderr)
    n_vocab = tokenizer.vocab_size  # the model's vocabulary may be padded past the tokenizer's: never pick those ids
    next_token = lambda logits, context: pick(logits[:, :n_vocab], context)

    torch.manual_seed(args.seed)  # here, after loading: the draws do not depend on how the model was built
    texts, steps, seconds = generate(model, tokenizer, prompt, next_token, args, device, ctx)
    n = args.num_samples * steps
    print(f"{args.num_samples} x {steps} tokens in {seconds:.2f} s: {n / max(seconds, 1e-9):.0f} tokens/s"
          f"{' (no KV cache)' if args.no_cache else ''}", file=sys.stderr)
    for i, text in enumerate(texts):
        if i or not args.stream:  # a streamed first sample is already out
            print(f"{SEPARATOR}\n" if i else "", args.start, text, sep="")


def generate(model, tokenizer, prompt, next_token, args, device, ctx):
    """Decode num_samples continuations of prompt as one batch -> (their texts, steps run, seconds)."""
    B = args.num_samples
    idx = torch.tensor([prompt] * B, dtype=torch.long, device=device)
    tokens, texts, done = [[] for _ in range(B)], [""] * B, [False] * B
    shown = 0  # characters of sample 0 already streamed
    if args.stream:
        print(args.start, end="", flush=True)
    t0, steps = time.perf_counter(), 0
    try:
        with ctx:
            for token in model.generate(idx, args.max_new_tokens, next_token=next_token, use_cache=not args.no_cache):
                steps += 1
                for i, t in enumerate(token.tolist()):
                    if done[i]:
                        continue
                    tokens[i].append(t)
                    texts[i] = tokenizer.decode(tokens[i])  # the whole continuation: bytes split over tokens join up
                    cut = texts[i].find(args.stop) if args.stop else -1
                    if cut >= 0:
                        texts[i], done[i] = texts[i][:cut], True
                if args.stream:
                    out = texts[0] if done[0] else printable(texts[0], args.stop)
                    print(out[shown:], end="", flush=True)
                    shown = max(shown, len(out))
                if all(done):
                    break
    except ValueError as e:  # every token blocked by --no_repeat_ngram_size
        sys.exit(f"sample.py: error: {e}")
    seconds = time.perf_counter() - t0
    if args.stream:
        print(texts[0][shown:], flush=True)
    return texts, steps, seconds


if __name__ == "__main__":
    try:
        main()
    except BrokenPipeError:  # piped into head and the like: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
