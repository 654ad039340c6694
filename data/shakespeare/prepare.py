"""
Tiny Shakespeare in GPT-2's byte-pair encoding (tiktoken r50k_base), as nanoGPT's shakespeare: the first 90% of the
text is train, the last 10% val, each encoded on its own. Writes train.bin, val.bin (uint16) and meta.json
(task "lm") into this folder, or into --out_dir.
  python data/shakespeare/prepare.py                                                        # downloads 1 MB
  TIKTOKEN_CACHE_DIR=../shared/tiktoken_cache \
  python data/shakespeare/prepare.py --source ../shared/data/tinyshakespeare/input.txt      # offline
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
from tokenizer import BPETokenizer


def main():
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--source", help=f"a local copy of the text (default: download {SHAKESPEARE_URL})")
    p.add_argument("--out_dir", default=HERE, help="where to write (default: %(default)s)")
    p.add_argument("--encoding", default="r50k_base", help="tiktoken encoding (default: %(default)s, GPT-2's)")
    args = p.parse_args()
    t0 = time.time()
    check_out_dir(args.out_dir)
    text = read_text(args.source, SHAKESPEARE_URL)
    tok = BPETokenizer(args.encoding)
    n = int(len(text) * 0.9)  # split the text, then encode each part: the same cut and counts as nanoGPT
    splits = {"train": tok.encode(text[:n]), "val": tok.encode(text[n:])}
    write_lm(args.out_dir, splits, tok, source=args.source or SHAKESPEARE_URL)
    print(f"{len(text):,} characters, {args.encoding}: train {len(splits['train']):,} tokens, "
          f"val {len(splits['val']):,} tokens -> {args.out_dir} ({time.time() - t0:.1f} s)")


if __name__ == "__main__":
    run_script(main, "prepare.py")
