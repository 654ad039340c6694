"""
Use a trained classifier (an EncoderClassifier checkpoint written by train.py) in one of three modes:
  python classify.py --out_dir out-agnews --eval val.csv --plot confusion.png    accuracy, per-class table, confusion
  python classify.py --out_dir out-agnews "Stocks fall on rate fears" "Lakers win again"   predict (or --file, stdin)
  python classify.py --out_dir out-agnews --json < headlines.txt                  one JSON object per line
  python classify.py --out_dir out-agnews --attention_maps attn.png "Stocks fall"  every head of every layer
Eval files are csv, parquet or jsonl with columns text,label (label: a class id or a class name), read as
data/agnews/prepare.py reads them. Texts are tokenized as in training: the checkpoint's tokenizer, cut to its
max_length and block_size. Results go to stdout; progress and messages go to stderr.
"""
import argparse
import csv
import importlib.util
import json
import os
import sys

import torch
from tqdm import tqdm

from model import from_checkpoint
from tokenizer import get_tokenizer
from train import pick_device

ROOT = os.path.dirname(os.path.abspath(__file__))


def fail(message):
    sys.exit(f"classify.py: error: {message}")


def read_records(path):
    """prepare.py's reader (csv, parquet, jsonl -> (text, label) pairs), imported from that file, not copied."""
    spec = importlib.util.spec_from_file_location("agnews_prepare", os.path.join(ROOT, "data", "agnews", "prepare.py"))
    prepare = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(prepare)
    return prepare.read_records(path)


def load(out_dir, device):
    """(model, tokenizer, label names, max tokens per text) from a checkpoint folder, or a one-line error."""
    try:
        with open(os.path.join(out_dir, "config.json")) as f:
            info = json.load(f)
    except FileNotFoundError:
        fail(f"no checkpoint in {out_dir!r}: train one with `python train.py config/agnews.py`, or pass --out_dir")
    if info.get("architecture") != "EncoderClassifier":
        fail(f"{out_dir!r} holds a {info.get('architecture')} (task {info.get('task')!r}), not a classifier: "
             f"for a GPT use sample.py --out_dir {out_dir}")
    try:
        model, info = from_checkpoint(out_dir, device)
        tok = get_tokenizer(info["tokenizer"])
    except (OSError, RuntimeError, AssertionError) as e:  # no model.safetensors, a broken file, no such device,
        fail(f"cannot load {out_dir!r} on {device}: {str(e).splitlines()[0]}")  # no BPE file offline
    names = info.get("label_names") or [str(i) for i in range(model.config.n_classes)]
    return model, tok, names, min(info.get("max_length") or model.config.block_size, model.config.block_size)


def encode(tok, texts, max_len):
    try:
        ids = tok.encode_batch(texts) if hasattr(tok, "encode_batch") else [tok.encode(t) for t in texts]
    except ValueError as e:  # a character the char model never saw
        fail(str(e))
    return [row[:max_len] for row in ids]


def batches(rows, batch_size, pad_id, device):
    """Yield (indices, idx, attention_mask): rows sorted by length, so each batch pads little, to its longest row."""
    order = sorted(range(len(rows)), key=lambda i: len(rows[i]))
    for start in range(0, len(order), batch_size):
        chunk = order[start:start + batch_size]
        width = max(1, max(len(rows[i]) for i in chunk))
        idx = torch.full((len(chunk), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(chunk), width), dtype=torch.long)
        for j, i in enumerate(chunk):
            idx[j, :len(rows[i])], mask[j, :len(rows[i])] = torch.tensor(rows[i], dtype=torch.long), 1
        yield chunk, idx.to(device), mask.to(device)


@torch.no_grad()
def predict(model, rows, batch_size, device):
    """Class probabilities [len(rows), n_classes], in the rows' order."""
    probs = torch.empty(len(rows), model.config.n_classes)
    n = -(-len(rows) // batch_size)
    for chunk, idx, mask in tqdm(batches(rows, batch_size, model.config.pad_token_id, device), total=n,
                                 desc="classifying", unit="batch", file=sys.stderr, disable=n < 2):
        probs[chunk] = torch.softmax(model(idx, mask)[0].float(), dim=-1).cpu()
    return probs


def label_id(value, names):
    """A class id from an int, an integral float or string, or a class name; None when it is none of the classes."""
    if isinstance(value, str):
        value = names.index(value.strip()) if value.strip() in names else value.strip()
        value = int(value) if isinstance(value, str) and value.lstrip("-").isdigit() else value
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < len(names) else None


def read_eval(path, names):
    if not path.endswith((".csv", ".parquet", ".jsonl")):
        fail(f"--eval {path}: expected a .csv, .parquet or .jsonl file with columns text,label")
    try:
        records = read_records(path)
    except (ValueError, OSError, csv.Error) as e:  # missing, not UTF-8, broken csv or parquet
        fail(f"--eval {path}: cannot read it ({type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]})")
    except SystemExit as e:  # read_records' own message: no text,label columns
        fail(str(e.code))
    if not records or all(t is None for t, _ in records) or all(y is None for _, y in records):
        fail(f"--eval {path}: no rows with a text and a label (it needs columns text,label)")
    kept = [(n, t, y) for n, (t, y) in enumerate(records, 1) if isinstance(t, str) and t.strip()]
    if len(kept) < len(records):
        print(f"warning: --eval {path}: skipped {len(records) - len(kept)} rows with no text", file=sys.stderr)
    if not kept:
        fail(f"--eval {path}: no row has a text")
    labels = [label_id(y, names) for _, _, y in kept]
    bad = [(n, y) for (n, _, y), label in zip(kept, labels) if label is None]
    if bad:
        fail(f"--eval {path}: {len(bad)} of {len(kept)} rows have a label outside the model's classes "
             f"0..{len(names) - 1} ({', '.join(names)}); the first is data row {bad[0][0]}: {bad[0][1]!r}")
    return [t for _, t, _ in kept], labels


def report(labels, preds, names):
    """accuracy, a per-class table with macro averages, and the confusion matrix, as text lines; and the matrix."""
    k = len(names)
    cm = [[0] * k for _ in range(k)]
    for y, p in zip(labels, preds):
        cm[y][p] += 1
    w = max(9, *(len(n) for n in names))
    lines = [f"accuracy: {sum(cm[i][i] for i in range(k)) / len(labels):.4f}  ({sum(cm[i][i] for i in range(k))} of "
             f"{len(labels)})", "", f"{'class':<{w}}  precision  recall      f1  support"]
    scores = []
    for i, name in enumerate(names):
        tp, predicted, support = cm[i][i], sum(row[i] for row in cm), sum(cm[i])
        p, r = tp / predicted if predicted else 0.0, tp / support if support else 0.0
        scores.append((p, r, 2 * p * r / (p + r) if p + r else 0.0))
        lines.append(f"{name:<{w}}  {p:9.4f}  {r:6.4f}  {scores[-1][2]:6.4f}  {support:7d}")
    macro = [sum(s[j] for s in scores) / k for j in range(3)]
    lines += [f"{'macro avg':<{w}}  {macro[0]:9.4f}  {macro[1]:6.4f}  {macro[2]:6.4f}  {len(labels):7d}", "",
              "confusion matrix (rows = true, columns = predicted):"]
    c = max(6, *(len(n) for n in names))
    lines.append(" " * w + "".join(f"  {n:>{c}}" for n in names))
    lines += [f"{name:<{w}}" + "".join(f"  {v:>{c}d}" for v in row) for name, row in zip(names, cm)]
    return lines, cm


def pyplot():
    import matplotlib
    matplotlib.use("Agg")  # files only, no window
    matplotlib.rcParams["text.parse_math"] = False  # "$5 billion ... $3": plain text, not TeX
    import matplotlib.pyplot as plt
    return plt


def plot_confusion(cm, names, path, title):
    plt = pyplot()
    k = len(names)
    fig, ax = plt.subplots(figsize=(1.2 * k + 2.5, 1.2 * k + 2))
    ax.imshow(cm, cmap="Blues")
    top = max(max(row) for row in cm)
    for i in range(k):
        for j in range(k):
            ax.text(j, i, cm[i][j], ha="center", va="center", color="white" if cm[i][j] > top / 2 else "black")
    ax.set(xticks=range(k), yticks=range(k), xlabel="predicted", ylabel="true", title=title)
    ax.set_xticklabels(names, rotation=45, ha="right")
    ax.set_yticklabels(names)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def attention_figure(maps, tokens, title):
    """maps: per layer [h, n, n]; one heatmap per (layer, head), tokens on both axes. Returns the figure."""
    plt = pyplot()
    L, H, n = len(maps), maps[0].shape[0], len(tokens)
    per_token, size = (0.17, 7) if n <= 64 else (0.12, 5)  # inches per token row, font size: labels that fit
    side = max(2.5, per_token * n + 1.2)
    fig, axes = plt.subplots(L, H, figsize=(side * H, side * L + 0.5), squeeze=False, layout="constrained")
    for l in range(L):
        for h in range(H):
            ax = axes[l][h]
            ax.imshow(maps[l][h], cmap="viridis", vmin=0)
            ax.set_title(f"layer {l} head {h}", fontsize=10)
            ax.set_xticks(range(n), tokens, rotation=90, fontsize=size)
            ax.set_yticks(range(n), tokens, fontsize=size)
    fig.suptitle(title, fontsize=12)
    return fig


def main(argv=None):
    p = argparse.ArgumentParser(prog="classify.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("texts", nargs="*", help="texts to classify; none: --file, else stdin (one text per line)")
    p.add_argument("--out_dir", default="out-agnews", help="a classifier checkpoint written by train.py (default: %(default)s)")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:1, mps, ...; auto: cuda, then mps, then cpu")
    p.add_argument("--batch_size", type=int, default=64, help="texts per forward pass (default: %(default)s)")
    p.add_argument("--file", help="read the texts from this file, one per line (blank lines are skipped)")
    p.add_argument("--json", action="store_true", help="print one JSON object per text: text, label, label_id, probs")
    p.add_argument("--eval", metavar="FILE", help="score a labelled .csv, .parquet or .jsonl file (columns text,label): "
                   "accuracy, per-class precision/recall/F1, macro averages and the confusion matrix")
    p.add_argument("--plot", metavar="PNG", help="with --eval: also draw the confusion matrix into this image")
    p.add_argument("--attention_maps", metavar="PNG", help="draw every head of every layer for one text into this "
                   "image (rows = layers, columns = heads)")
    p.error = lambda message: fail(f"{message} (see --help)")  # one line, not argparse's usage block
    a = p.parse_args(argv)
    if a.batch_size < 1:
        p.error("--batch_size must be >= 1")
    if a.plot and not a.eval:
        p.error("--plot draws the confusion matrix of --eval: pass --eval FILE too")
    if a.eval and (a.texts or a.file or a.attention_maps or a.json):
        p.error("--eval takes its texts from FILE: drop the texts, --file, --json and --attention_maps")
    if a.texts and a.file:
        p.error("pass texts or --file, not both")
    device = pick_device(a.device, p.error)
    model, tok, names, max_len = load(a.out_dir, device)

    if a.eval:
        texts, labels = read_eval(a.eval, names)
        preds = predict(model, encode(tok, texts, max_len), a.batch_size, device).argmax(-1).tolist()
        lines, cm = report(labels, preds, names)
        print("\n".join(lines))
        if a.plot:
            plot_confusion(cm, names, a.plot, f"{os.path.basename(a.eval)}: accuracy {lines[0].split()[1]}")
            print(f"wrote {a.plot}", file=sys.stderr)
        return

    texts = [t for t in a.texts if t.strip()]
    if not texts and (a.file or not sys.stdin.isatty()):
        try:
            with open(a.file, encoding="utf-8") if a.file else sys.stdin as f:
                texts = [line.rstrip("\r\n") for line in f if line.strip()]
        except OSError as e:
            fail(f"--file {a.file}: {e.strerror}")
    if not texts:
        fail("no text to classify: pass texts as arguments, --file PATH, or pipe them on stdin")
    rows = encode(tok, texts, max_len)
    if a.attention_maps:
        if len(texts) != 1:
            fail(f"--attention_maps draws one text, got {len(texts)}")
        with torch.no_grad():
            _, idx, mask = next(batches(rows, 1, model.config.pad_token_id, device))
            logits, _, maps = model(idx, mask, need_weights=True)
        prob = torch.softmax(logits[0].float(), -1)
        tokens = [tok.decode([t]).replace("\n", "\\n") for t in rows[0]]
        title = f"predicted: {names[prob.argmax()]} ({prob.max():.2f})  |  " + \
            (texts[0] if len(texts[0]) <= 80 else texts[0][:79] + "…")
        fig = attention_figure([m[0].float().cpu().numpy() for m in maps], tokens, title)
        fig.savefig(a.attention_maps, dpi=100)
        print(f"wrote {a.attention_maps}: {len(fig.axes)} panels, {len(maps)} layers x {maps[0].shape[1]} heads, "
              f"{len(tokens)} tokens", file=sys.stderr)
        return
    probs = predict(model, rows, a.batch_size, device)
    width = max(len(n) for n in names)
    for text, pr in zip(texts, probs.tolist()):
        best = max(range(len(names)), key=pr.__getitem__)
        if a.json:
            print(json.dumps({"text": text, "label": names[best], "label_id": best, "probs": dict(zip(names, pr))}))
        else:
            print(f"{names[best]:<{width}}  ({', '.join(f'{n} {q:.2f}' for n, q in zip(names, pr))})  {text}")


if __name__ == "__main__":
    try:
        main()
    except BrokenPipeError:  # piped into head: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
