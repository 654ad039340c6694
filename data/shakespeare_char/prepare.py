"""
Tiny Shakespeare at the character level, as nanoGPT's shakespeare_char: the vocabulary is the sorted
set of the text's characters (65), the first 90% of the text is train and the last 10% val. Writes
train.bin, val.bin and meta.json (task "lm") into this folder, or into --out_dir.
  python data/shakespeare_char/prepare.py  # downloads 1 MB
  # offline
  python data/shakespeare_char/prepare.py --source ../shared/data/tinyshakespeare/input.txt
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))  # the repo root, for lib/
from lib.common import run_script
from lib.prepare import prepare_text
from lib.tokenizer import CharTokenizer

URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"

if __name__ == "__main__":
    run_script(
        lambda: prepare_text(
            __doc__, URL, HERE, lambda text: CharTokenizer("".join(sorted(set(text))))
        ),
        "prepare.py",
    )
