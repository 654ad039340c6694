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

from lib.common import ArgumentParser, Error, run_script
from lib.files import atomic_path
from lib.options import Option, flags
from lib.records import read_metrics

FLAGS = {
    "x": Option("step", "the horizontal axis", choices=("step", "seconds")),
    "out": Option(
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


# ---------------------- the drawing, which classify.py and bench/ share: matplotlib into files
# the metrics drawn beside the loss, each in a panel of its own: a classifier's accuracy, and a
# language model's bits per byte, which compares runs of different tokenizers; rl.py's reward
PANELS = {
    "val/accuracy": "validation accuracy",
    "val/bpb": "validation bits per byte",
    "val/reward": "validation reward (greedy replies)",
}


def plot_runs(out_dirs, path, x="step"):
    """Validation (solid) and training (dashed) loss of each run against step or seconds, one colour
    a run; a panel beside it with each of PANELS that any run records. Saved to path (PNG, SVG,
    PDF: by its extension)."""
    if not path.lower().endswith((".png", ".svg", ".pdf")) or not os.path.isdir(
        os.path.dirname(os.path.abspath(path))
    ):
        raise Error(
            f"{path}: give an image path ending in .png, .svg or .pdf, in an existing folder"
        )
    plt = pyplot()
    runs = {d: evaluations(d, x) for d in out_dirs}
    # a panel beside the loss for each of these that any run records
    panels = [k for k in PANELS if any(k in r for rows in runs.values() for r in rows)]
    # the loss's panel, unless no run records a loss (rl.py's)
    loss = any("val/loss" in r for rows in runs.values() for r in rows)
    width = loss + len(panels)
    fig, axes = plt.subplots(
        1, width, figsize=(2 + 5 * width, 4.5), squeeze=False, layout="constrained"
    )
    for i, (d, rows) in enumerate(runs.items()):
        colour, label = f"C{i % 10}", os.path.basename(os.path.abspath(d))
        losses = [r for r in rows if "val/loss" in r]
        if losses:
            axes[0][0].plot(
                [r[x] for r in losses],
                [r["val/loss"] for r in losses],
                "-o",
                color=colour,
                markersize=3,
                label=f"{label} val",
            )
        # an evaluation may have no training loss beside it (one before the first step)
        trained = [r for r in rows if "train/loss" in r]
        if trained:  # a legend names only the runs drawn in its panel
            axes[0][0].plot(
                [r[x] for r in trained],
                [r["train/loss"] for r in trained],
                "--",
                color=colour,
                label=f"{label} train",
            )
        for ax, key in zip(axes[0][loss:], panels):
            # a language model has no accuracy, a classifier no bits per byte
            recorded = [r for r in rows if key in r]
            if recorded:
                ys = [r[key] for r in recorded]
                ax.plot([r[x] for r in recorded], ys, "-o", color=colour, markersize=3, label=label)
    if loss:
        axes[0][0].set(xlabel=x, ylabel="loss (evaluation batches)", title="loss")
    for ax, key in zip(axes[0][loss:], panels):
        ax.set(xlabel=x, ylabel=PANELS[key], title=PANELS[key])
    for ax in axes[0]:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    save_figure(fig, path, dpi=110)
    plt.close(fig)


def evaluations(out_dir, x):
    """The records of out_dir's evaluations that hold x (step, or seconds, which a record may
    lack); a run whose evaluations all lack it is one line."""
    rows = [r for r in read_metrics(out_dir) if {"val/loss", *PANELS} & r.keys()]
    placed = [r for r in rows if x in r]
    if rows and not placed:
        raise Error(
            f"{os.path.join(out_dir, 'metrics.jsonl')}: no evaluation that records {x!r}: "
            "plot this run against --x step"
        )
    if len(placed) < len(rows):
        sys.stderr.write(
            f"warning: {out_dir}: {len(rows) - len(placed):,} evaluations without {x!r} left out\n"
        )
    return placed


def save_figure(fig, path, dpi):
    """fig as an image of the type path's extension names, written atomically: a write the system
    refuses is one line (lib.files.writing), an image there before stays whole."""
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=dpi, format=os.path.splitext(path)[1][1:].lower())


def pyplot():
    """matplotlib's pyplot drawing into files only (no window), with plain-text labels ("$5" is not
    TeX)."""
    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams["text.parse_math"] = False
    import matplotlib.pyplot as plt

    return plt


if __name__ == "__main__":
    run_script(main, "plot.py")
