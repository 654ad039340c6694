"""
Tiny Shakespeare at the character level, as nanoGPT's shakespeare_char: the vocabulary is the sorted set of the
text's characters (65), the first 90% of the text is train and the last 10% val. Writes train.bin, val.bin and
meta.json (task "lm") into this folder, or into --out_dir.
  python data/shakespeare_char/prepare.py                                                   # downloads 1 MB
  python data/shakespeare_char/prepare.py --source ../shared/data/tinyshakespeare/input.txt # offline
"""
import argparse
import os
import sys
import time

SHAKESPEARE_URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))  # the repo root: common.py, dataset.py, tokenizer.py
from common import ArgumentParser, run_script
from dataset import check_out_dir, read_text, write_lm
from tokenizer import CharTokenizer


def main():
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--source", help=f"a local copy of the text (default: download {SHAKESPEARE_URL})")
    p.add_argument("--out_dir", default=HERE, help="where to write (default: %(default)s)")
    args = p.parse_args()
    t0 = time.time()
    check_out_dir(args.out_dir)
    text = read_text(args.source, SHAKESPEARE_URL)
    tok = CharTokenizer("".join(sorted(set(text))))
    n = int(len(text) * 0.9)  # split the text, not the ids: the same cut as nanoGPT, so the same counts
    splits = {"train": tok.encode(text[:n]), "val": tok.encode(text[n:])}
    write_lm(args.out_dir, splits, tok, source=args.source or SHAKESPEARE_URL)
    print(f"{len(text):,} characters, vocab {tok.vocab_size}: train {len(splits['train']):,} tokens, "
          f"val {len(splits['val']):,} tokens -> {args.out_dir} ({time.time() - t0:.1f} s)")


if __name__ == "__main__":
    run_script(main, "prepare.py")
