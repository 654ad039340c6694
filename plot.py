"""
Draw the loss curves of one or more runs on one axis, from the metrics.jsonl that train.py writes
into each out_dir: validation loss (solid) and training loss (dashed) against step or seconds, and
beside them validation accuracy for classifiers and validation bits per byte for language models
(the loss that compares runs of different tokenizers). The picture to compare recipes with.
  python plot.py out-shakespeare-char-cpu out-shakespeare-char-fast --x seconds --out compare.png
Without --out the image is named after the runs (loss-RUN+RUN.png), so plots of other runs never
replace each other.
"""

import os
import sys

from lib.common import ArgumentParser, run_script
from lib.keys import Key, flags
from lib.plots import plot_runs

FLAGS = {
    "x": Key("step", "the horizontal axis", choices=("step", "seconds")),
    "out": Key(
        None,
        "the image to write: .png, .svg or .pdf (default: loss-RUN+RUN.png, from the runs' folder "
        "names, -seconds added against seconds)",
    ),
}


def main(argv=None):
    p = ArgumentParser(prog="plot.py", description=__doc__)
    p.add_argument(
        "out_dirs", nargs="+", metavar="OUT_DIR", help="folders that train.py wrote (metrics.jsonl)"
    )
    flags(p, FLAGS)
    a = p.parse_args(argv)
    if a.out is None:
        a.out = default_name(a.out_dirs, a.x)
    plot_runs(a.out_dirs, a.out, x=a.x)
    print(f"wrote {a.out}: {len(a.out_dirs)} run(s) against {a.x}", file=sys.stderr)


def default_name(out_dirs, x):
    """loss-RUN+RUN[-seconds].png: another plot's runs or axis are another file, and plotting
    the same runs again brings their image up to date."""
    runs = "+".join(os.path.basename(os.path.abspath(d)) for d in out_dirs)
    axis = "" if x == "step" else f"-{x}"
    return f"loss-{runs}{axis}.png"


if __name__ == "__main__":
    run_script(main, "plot.py")
