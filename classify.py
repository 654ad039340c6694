"""
Use a trained classifier (an EncoderClassifier checkpoint written by train.py) in one of three
modes:
  python classify.py --out_dir out-agnews --eval val.csv --plot confusion.png
      accuracy, per-class table, confusion, expected calibration error
  python classify.py --out_dir out-agnews "Stocks fall on rate fears" "Lakers win again"
      predict (or --file, stdin)
  python classify.py --out_dir out-agnews --json < headlines.txt
      one JSON object per line
  python classify.py --out_dir out-agnews --attention_maps attn.png "Stocks fall"
      every head of every layer
Eval files are csv, parquet or jsonl with columns text,label (label: a class id or a class name),
read as the prepare scripts read them (lib/prepare.py). Texts are tokenized as in training: the
checkpoint's tokenizer, cut to its max_length and block_size. Results go to stdout; progress and
messages go to stderr.
"""

import json
import os
import sys

import numpy as np
import torch

from lib.classifier import attention_maps, load, predict
from lib.common import ArgumentParser, Error, pick_device, run_script
from lib.options import DEVICE_OPTION, Option, flags
from lib.prepare import read_labelled
from plot import pyplot, save_figure

IMAGE_TYPES = (".png", ".jpg", ".jpeg", ".svg", ".pdf")
FLAGS = {
    "out_dir": Option("out-agnews", "a classifier checkpoint written by train.py"),
    "device": DEVICE_OPTION,
    "batch_size": Option(64, "texts per forward pass", ge=1),
    "file": Option(None, "read the texts from this file, one per line (blank lines are skipped)"),
    "json": Option(False, "print one JSON object per text: text, label, label_id, probs"),
}


def calibration_error(probs, labels, bins=15):
    """Expected calibration error: in equal-width bins of the top probability, the gap between
    its mean and the accuracy, weighted by the bin's share of the rows."""
    confidence, predicted = probs.max(-1)
    correct = (predicted == labels).float()
    # bin i holds the confidences in (i / bins, (i + 1) / bins]
    which = (confidence * bins).ceil().clamp(1, bins) - 1
    error = 0.0
    for i in range(bins):
        rows = which == i
        if rows.any():
            gap = (confidence[rows].mean() - correct[rows].mean()).abs()
            error += rows.float().mean().item() * gap.item()
    return error


def report(labels, probs, names):
    """accuracy, a per-class table with macro averages, the confusion matrix and the expected
    calibration error, as text lines; and the matrix."""
    preds = probs.argmax(-1).tolist()
    k = len(names)
    cm = [[0] * k for _ in range(k)]
    for y, p in zip(labels, preds):
        cm[y][p] += 1
    w = max(9, *(len(n) for n in names))
    correct = sum(cm[i][i] for i in range(k))
    lines = [
        f"accuracy: {correct / len(labels):.4f}  ({correct} of {len(labels)})",
        "",
        f"{'class':<{w}}  precision  recall      f1  support",
    ]
    scores = []
    for i, name in enumerate(names):
        tp, predicted, support = cm[i][i], sum(row[i] for row in cm), sum(cm[i])
        p, r = tp / predicted if predicted else 0.0, tp / support if support else 0.0
        scores.append((p, r, 2 * p * r / (p + r) if p + r else 0.0))
        lines.append(f"{name:<{w}}  {p:9.4f}  {r:6.4f}  {scores[-1][2]:6.4f}  {support:7d}")
    macro = [sum(s[j] for s in scores) / k for j in range(3)]
    lines += [
        f"{'macro avg':<{w}}  {macro[0]:9.4f}  {macro[1]:6.4f}  {macro[2]:6.4f}  {len(labels):7d}",
        "",
        "confusion matrix (rows = true, columns = predicted):",
    ]
    c = max(6, *(len(n) for n in names))
    lines.append(" " * w + "".join(f"  {n:>{c}}" for n in names))
    lines += [f"{name:<{w}}" + "".join(f"  {v:>{c}d}" for v in row) for name, row in zip(names, cm)]
    ece = calibration_error(probs, torch.tensor(labels))
    lines += ["", f"expected calibration error (15 bins): {ece:.4f}"]
    return lines, cm


def plot_confusion(cm, names, path, title):
    plt = pyplot()
    k = len(names)
    fig, ax = plt.subplots(figsize=(1.2 * k + 2.5, 1.2 * k + 2))
    ax.imshow(cm, cmap="Blues")
    top = max(max(row) for row in cm)
    for i in range(k):
        for j in range(k):
            ax.text(
                j,
                i,
                cm[i][j],
                ha="center",
                va="center",
                color="white" if cm[i][j] > top / 2 else "black",
            )
    ax.set(xticks=range(k), yticks=range(k), xlabel="predicted", ylabel="true", title=title)
    ax.set_xticklabels(names, rotation=45, ha="right")
    ax.set_yticklabels(names)
    fig.tight_layout()
    save_figure(fig, path, dpi=120)
    plt.close(fig)


def attention_figure(maps, tokens, title):
    """maps: per layer [h, n, n]; one heatmap per (layer, head), queries down, keys across, tokens
    on both axes, one colour scale for every panel (0 to the largest weight) with its colour bar: a
    near-uniform head reads as faint; a pair the model's pattern masks (NaN) is grey."""
    plt = pyplot()
    L, H, n = len(maps), maps[0].shape[0], len(tokens)
    # inches per token row, font size: labels that fit
    per_token, size = (0.17, 7) if n <= 64 else (0.12, 5)
    side = max(2.5, per_token * n + 1.2)
    fig, axes = plt.subplots(
        L, H, figsize=(side * H + 1, side * L + 0.5), squeeze=False, layout="constrained"
    )
    top = max(float(np.nanmax(m)) for m in maps)
    colours = plt.get_cmap("viridis").with_extremes(bad="lightgrey")
    for layer in range(L):
        for h in range(H):
            ax = axes[layer][h]
            image = ax.imshow(maps[layer][h], cmap=colours, vmin=0, vmax=top)
            ax.set_title(f"layer {layer} head {h}", fontsize=10)
            ax.set_xticks(range(n), tokens, rotation=90, fontsize=size)
            ax.set_yticks(range(n), tokens, fontsize=size)
            ax.set_xlabel("key", fontsize=8)
            ax.set_ylabel("query", fontsize=8)
    fig.colorbar(image, ax=axes, shrink=0.6, label="attention weight")
    fig.suptitle(title, fontsize=12)
    return fig


def read_texts(a):
    """The texts to classify: arguments, else --file, else stdin; one per line, blank lines
    skipped."""
    texts = [t for t in a.texts if t.strip()]
    # no stdin at all (`<&-`): nothing to read
    if not texts and (a.file or (sys.stdin and not sys.stdin.isatty())):
        try:
            with open(a.file, encoding="utf-8") if a.file else sys.stdin as f:
                texts = [line.rstrip("\r\n") for line in f if line.strip()]
        except OSError as e:
            raise Error(f"--file {a.file}: {e.strerror}") from None
        except UnicodeDecodeError:
            raise Error(
                f"{'--file ' + a.file if a.file else 'stdin'}: not UTF-8 text; convert it to UTF-8"
            ) from None
    if not texts:
        raise Error(
            "no text to classify: pass texts as arguments, --file PATH, or pipe them on stdin"
        )
    return texts


def check_image_path(option, path):
    """Before any work: an image path that can be written, of a type matplotlib writes."""
    if not path.lower().endswith(IMAGE_TYPES):
        raise Error(f"{option} {path}: the file name must end in {', '.join(IMAGE_TYPES)}")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
        raise Error(
            f"{option} {path}: cannot write into {folder} (no such folder, or not writable)"
        )


def main(argv=None):
    p = ArgumentParser(prog="classify.py", description=__doc__)
    p.add_argument(
        "texts", nargs="*", help="texts to classify; none: --file, else stdin (one text per line)"
    )
    flags(p, FLAGS)
    p.add_argument(
        "--eval",
        metavar="FILE",
        help="score a labelled .csv, .parquet or .jsonl file (columns text,label): "
        "accuracy, per-class precision/recall/F1, macro averages, the confusion matrix and the "
        "expected calibration error",
    )
    p.add_argument(
        "--plot", metavar="PNG", help="with --eval: also draw the confusion matrix into this image"
    )
    p.add_argument(
        "--attention_maps",
        metavar="PNG",
        help="draw every head of every layer for one text into this image "
        "(rows = layers, columns = heads)",
    )
    a = p.parse_args(argv)
    if a.plot and not a.eval:
        p.error("--plot draws the confusion matrix of --eval: pass --eval FILE too")
    if a.eval and (a.texts or a.file or a.attention_maps or a.json):
        p.error(
            "--eval takes its texts from FILE: drop the texts, --file, --json and --attention_maps"
        )
    if a.texts and a.file:
        p.error("pass texts or --file, not both")
    for option, path in (("--plot", a.plot), ("--attention_maps", a.attention_maps)):
        if path:
            check_image_path(option, path)
    device = pick_device(a.device)
    model, tok, names, max_len = load(a.out_dir, device)

    def encode(texts):
        return [row[:max_len] for row in tok.encode_batch(texts)]

    if a.eval:
        texts, labels, warnings = read_labelled(a.eval, names)
        for warning in warnings:
            print(f"warning: {warning}", file=sys.stderr)
        probs = predict(model, encode(texts), a.batch_size, device)
        lines, cm = report(labels, probs, names)
        print("\n".join(lines))
        if a.plot:
            plot_confusion(
                cm, names, a.plot, f"{os.path.basename(a.eval)}: accuracy {lines[0].split()[1]}"
            )
            print(f"wrote {a.plot}", file=sys.stderr)
        return

    texts = read_texts(a)
    rows = encode(texts)
    if a.attention_maps:
        if len(texts) != 1:
            raise Error(f"--attention_maps draws one text, got {len(texts)}")
        prob, maps = attention_maps(model, rows[0], device)
        tokens = [tok.decode([t]).replace("\n", "\\n") for t in rows[0]]
        title = f"predicted: {names[prob.argmax()]} ({prob.max():.2f})  |  " + (
            texts[0] if len(texts[0]) <= 80 else texts[0][:79] + "…"
        )
        fig = attention_figure([m.numpy() for m in maps], tokens, title)
        save_figure(fig, a.attention_maps, dpi=100)
        print(
            f"wrote {a.attention_maps}: {len(maps) * maps[0].shape[0]} panels, "
            f"{len(maps)} layers x {maps[0].shape[0]} heads, {len(tokens)} tokens",
            file=sys.stderr,
        )
        return
    probs = predict(model, rows, a.batch_size, device)
    width = max(len(n) for n in names)
    for text, pr in zip(texts, probs.tolist()):
        best = max(range(len(names)), key=pr.__getitem__)
        if a.json:
            print(
                json.dumps(
                    {
                        "text": text,
                        "label": names[best],
                        "label_id": best,
                        "probs": dict(zip(names, pr)),
                    }
                )
            )
        else:
            print(
                f"{names[best]:<{width}}  "
                f"({', '.join(f'{n} {q:.2f}' for n, q in zip(names, pr))})  {text}"
            )


if __name__ == "__main__":
    run_script(main, "classify.py")
