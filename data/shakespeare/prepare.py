"""
Tiny Shakespeare in GPT-2's byte-pair encoding (tiktoken r50k_base), as nanoGPT's shakespeare: the
first 90% of the text is train, the last 10% val, each encoded on its own. Writes train.bin, val.bin
(uint16) and meta.json (task "lm") into this folder, or into --out_dir.
  python data/shakespeare/prepare.py  # downloads 1 MB
  TIKTOKEN_CACHE_DIR=../shared/tiktoken_cache \
  python data/shakespeare/prepare.py --source ../shared/data/tinyshakespeare/input.txt  # offline
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))  # the repo root, for lib/
from lib.bpe import BPETokenizer
from lib.common import run_script
from lib.prepare import prepare_text

URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"

if __name__ == "__main__":
    run_script(
        lambda: prepare_text(__doc__, URL, HERE, lambda text: BPETokenizer("r50k_base")),
        "prepare.py",
    )
