"""
AG News, measured so that the figure is not flattered: our recipe beside bag-of-words peers, trained
on the same rows.
Usage, from the repository root (config paths in RUN are taken relative to it from any working
directory):
  python bench/agnews.py                  val.csv only: the split that recipe choices may look at
  python bench/agnews.py --holdout        and the hold-out, which no choice looks at: report it once
  python bench/agnews.py --runs config/agnews.py "config/agnews.py --token_dropout=0.2"
                                          RUN: train.py's arguments
The hold-out is the 2,000 rows of train.csv whose texts have the smallest md5 (fixed, whatever the
file's order); everything trains on the other rows. The peers (scikit-learn, a bench extra:
pip install -e ".[bench]"): TF-IDF of words (sublinear tf) with a linear SVM or logistic regression,
and TF-IDF of words and word bigrams, or of the BPE tokens our recipe reads and their bigrams, with
a linear SVM.
Each of our runs is `python data/agnews/prepare.py` once, then per seed `python train.py RUN` (a
config and overrides) and `python classify.py --eval` on each split, as a user runs them.
"""

import csv
import hashlib
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

# run from anywhere: the repository root
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from lib.common import ArgumentParser, Error, run_script
from lib.options import Option, flags
from lib.prepare import read_labelled
from lib.weights import get_tokenizer

LABEL_NAMES = ["World", "Sports", "Business", "Sci/Tech"]
FLAGS = {
    "source": Option(
        os.path.join(os.path.dirname(ROOT), "shared", "data", "agnews_sample"),
        "a folder with train.csv and val.csv",
    ),
    "holdout": Option(False, "also score the hold-out (report the final recipe once)"),
    "holdout_rows": Option(2000, "rows of train.csv held out"),
    "no_peers": Option(False, "skip the scikit-learn peers"),
    "prepare": Option("", 'arguments for data/agnews/prepare.py, e.g. "--cased"'),
}


def split_holdout(source, n):
    """{split: (texts, labels)}: train.csv without its n hold-out rows, val.csv, and the
    hold-out."""
    texts, labels, _ = read_labelled(os.path.join(source, "train.csv"), LABEL_NAMES)

    def digest(i):
        return hashlib.md5(texts[i].encode("utf-8")).hexdigest()

    held = set(sorted(range(len(texts)), key=digest)[:n])
    splits = {
        "train": (
            [t for i, t in enumerate(texts) if i not in held],
            [y for i, y in enumerate(labels) if i not in held],
        ),
        "holdout": ([texts[i] for i in sorted(held)], [labels[i] for i in sorted(held)]),
    }
    splits["val"] = read_labelled(os.path.join(source, "val.csv"), LABEL_NAMES)[:2]
    return splits


def peers(splits, scored):
    """{peer: {split: accuracy, "C": ...}} of the bag-of-words baselines, trained on
    splits["train"]. Each peer's regularisation C is chosen on val, as our recipe is: no peer is
    handicapped by a default."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.svm import LinearSVC

    def svm(C):
        return LinearSVC(C=C, max_iter=10000)

    bpe = get_tokenizer({"type": "bpe", "encoding": "r50k_base", "lowercase": True})

    # what our recipe reads: prepare.py's lowercased GPT-2 BPE, cut at 128, and its pairs
    def bpe_ngrams(text):
        ids = [str(t) for t in bpe.encode(text)[:128]]
        return ids + [f"{a} {b}" for a, b in zip(ids, ids[1:])]

    models = {
        "TF-IDF words + linear SVM": (dict(sublinear_tf=True), svm),
        "TF-IDF words + logistic regression": (
            dict(sublinear_tf=True),
            lambda C: LogisticRegression(C=C, max_iter=3000),
        ),
        "TF-IDF words and bigrams + linear SVM": (dict(sublinear_tf=True, ngram_range=(1, 2)), svm),
        "TF-IDF BPE tokens and bigrams + linear SVM": (
            dict(sublinear_tf=True, analyzer=bpe_ngrams),
            svm,
        ),
    }
    results = {}
    for name, (features, make) in models.items():
        t0, vectorizer = time.time(), TfidfVectorizer(**features)
        x = vectorizer.fit_transform(splits["train"][0])
        fitted = {C: make(C=C).fit(x, splits["train"][1]) for C in (0.1, 0.3, 1.0, 3.0, 10.0, 30.0)}

        def score(model, s, vectorizer=vectorizer):
            return float((model.predict(vectorizer.transform(splits[s][0])) == splits[s][1]).mean())

        C = max(fitted, key=lambda C: score(fitted[C], "val"))
        results[name] = {
            "C": C,
            "seconds": (time.time() - t0) / len(fitted),
            **{s: score(fitted[C], s) for s in scored},
        }
    return results


def run(command, env):
    """python SCRIPT ARGS, SCRIPT relative to the repository root (and run there): its stdout."""
    script, *args = command
    r = subprocess.run(
        [sys.executable, os.path.join(ROOT, script), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
    )
    if r.returncode:
        raise Error(f"{' '.join(command)} failed: {(r.stderr.strip().splitlines() or ['?'])[-1]}")
    return r.stdout


def ours(splits, runs, seeds, scored, work, prepare_args=()):
    """{run: {split: [accuracy per seed], "seconds": [...]}}: each run is train.py's arguments (a
    config, overrides)."""
    source, data = os.path.join(work, "source"), os.path.join(work, "data")
    os.makedirs(source, exist_ok=True)
    paths = {
        "train": os.path.join(source, "train.csv"),
        "val": os.path.join(source, "val.csv"),
        "holdout": os.path.join(work, "holdout.csv"),
    }  # outside the prepared source: nothing trains on it
    for split, (texts, labels) in splits.items():
        with open(paths[split], "w", newline="", encoding="utf-8") as f:
            csv.writer(f).writerows([("text", "label"), *zip(texts, labels)])
    env = {**os.environ, "WANDB_MODE": "offline"}
    t0 = time.time()
    run(["data/agnews/prepare.py", "--source", source, "--out_dir", data, *prepare_args], env)
    prepare_s = time.time() - t0
    results = {}
    for arguments in runs:
        r = results.setdefault(arguments, {"seconds": [], **{s: [] for s in scored}})
        for seed in seeds:
            out_dir = os.path.join(work, f"run-{len(results)}-seed{seed}")
            t0 = time.time()
            run(
                [
                    "train.py",
                    *shlex.split(arguments),
                    f"--dataset={data}",
                    f"--out_dir={out_dir}",
                    f"--seed={seed}",
                    "--overwrite_out_dir=True",
                ],
                env,
            )
            r["seconds"].append(time.time() - t0 + prepare_s)
            for split in scored:
                out = run(["classify.py", f"--out_dir={out_dir}", f"--eval={paths[split]}"], env)
                r[split].append(float(re.search(r"accuracy: ([0-9.]+)", out).group(1)))
            print(
                f"{arguments} seed {seed}: "
                + ", ".join(f"{s} {r[s][-1]:.4f}" for s in scored)
                + f", {r['seconds'][-1]:.0f} s",
                file=sys.stderr,
            )
    return results


def main(argv=None):
    p = ArgumentParser(prog="agnews.py", description=__doc__)
    flags(p, FLAGS)
    p.add_argument(
        "--runs",
        nargs="+",
        default=["config/agnews.py"],
        metavar="RUN",
        help="train.py's arguments, a config file and overrides, one quoted string per run "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--seeds",
        type=int,
        nargs="+",
        default=[1337, 1338],
        help="seeds per run (default: %(default)s)",
    )
    a = p.parse_args(argv)
    shared_bpe = os.path.join(os.path.dirname(ROOT), "shared", "tiktoken_cache")
    # offline machines: GPT-2's BPE file from ../shared, for the peers and our runs
    if os.path.isdir(shared_bpe):
        os.environ.setdefault("TIKTOKEN_CACHE_DIR", shared_bpe)
    scored = ["val", "holdout"] if a.holdout else ["val"]
    splits = split_holdout(a.source, a.holdout_rows)
    print(
        f"train {len(splits['train'][0]):,} rows, val {len(splits['val'][0]):,}, "
        f"hold-out {len(splits['holdout'][0]):,}{'' if a.holdout else ' (not scored)'}",
        file=sys.stderr,
    )
    rows = []
    if not a.no_peers:
        for name, r in peers(splits, scored).items():
            rows.append(
                [
                    f"{name} (C = {r['C']}, chosen on val)",
                    *(f"{r[s]:.4f}" for s in scored),
                    f"{r['seconds']:.1f} s",
                ]
            )
    with tempfile.TemporaryDirectory(prefix="bench-agnews-") as work:
        for arguments, r in ours(
            splits, a.runs, a.seeds, scored, work, shlex.split(a.prepare)
        ).items():
            rows.append(
                [
                    f"`python train.py {arguments}`",
                    *(
                        " / ".join(f"{x:.4f}" for x in r[s])
                        + f" (mean {statistics.mean(r[s]):.4f})"
                        for s in scored
                    ),
                    " / ".join(f"{x:.0f}" for x in r["seconds"]) + " s",
                ]
            )
    print(
        f"\n| method | {' | '.join(f'{s} accuracy' for s in scored)} | "
        "time (ours: prepare + train, per seed) |"
    )
    print("|---|" + "---|" * (len(scored) + 1))
    print("\n".join("| " + " | ".join(row) + " |" for row in rows))


if __name__ == "__main__":
    run_script(main, "agnews.py")
