"""
How well a classifier's probabilities match its accuracy: the expected calibration error (15
equal-width bins of the top probability, classify.calibration_error), accuracy and mean negative
log-likelihood of a bow_head checkpoint's encoder alone, its bag-of-words model alone, the product
of their probabilities and the mean of their log-probabilities (what the model predicts), each also
divided by a temperature fitted on the first file (by its negative log-likelihood).
  python bench/calibration.py OUT_DIR val.csv holdout.csv
"""

import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from classify import calibration_error
from lib.classifier import load, pad_batch
from lib.common import ArgumentParser, Error, run_script
from lib.prepare import read_labelled


@torch.no_grad()
def members(model, rows):
    """(encoder log-probabilities, bag-of-words log-probabilities), [len(rows), n_classes] each."""
    encoder, bow = [], []
    for i in range(0, len(rows), 64):
        idx, mask = pad_batch(rows[i : i + 64], model.config.pad_token_id)
        table, model.bow = model.bow, None  # the encoder's logits alone
        encoder.append(F.log_softmax(model(idx, mask)[0], -1))
        model.bow = table
        bow.append(F.log_softmax(model.bow_logits(idx, mask.bool()), -1))
    return torch.cat(encoder), torch.cat(bow)


def fit_temperature(logits, labels):
    """The temperature of least negative log-likelihood, on a grid from e^-2 to e^3."""
    grid = torch.exp(torch.linspace(-2, 3, 501))
    losses = torch.stack([F.cross_entropy(logits / t, labels) for t in grid])
    return grid[losses.argmin()].item()


def main(argv=None):
    p = ArgumentParser(prog="calibration.py", description=__doc__)
    p.add_argument("out_dir", help="a classifier trained with bow_head=True")
    p.add_argument("files", nargs="+", metavar="FILE", help="labelled files; the first fits")
    a = p.parse_args(argv)
    model, tokenizer, names, max_length = load(a.out_dir, "cpu")
    if model.bow is None:
        raise Error(f"{a.out_dir}: no bow_head: nothing to compare the encoder with")
    results = {}
    for path in a.files:
        texts, labels, _ = read_labelled(path, names)
        rows = [row[:max_length] for row in tokenizer.encode_batch(texts)]
        encoder, bow = members(model, rows)
        results[path] = (
            torch.tensor(labels),
            {
                "encoder alone": encoder,
                "bag-of-words alone": bow,
                "product of the probabilities": encoder + bow,
                "mean of the log-probabilities": (encoder + bow) / 2,
            },
        )
    labels, first = results[a.files[0]]
    scaled = {name: fit_temperature(logits, labels) for name, logits in first.items()}
    print("| file | combination | accuracy | ECE | NLL | mean top probability |")
    print("|---|---|---|---|---|---|")
    for path, (labels, combinations) in results.items():
        for name, logits in combinations.items():
            for t in (1.0, scaled[name]):
                probs = torch.softmax(logits / t, -1)
                accuracy = (probs.argmax(-1) == labels).float().mean().item()
                nll = F.cross_entropy(logits / t, labels).item()
                ece = calibration_error(probs, labels)
                top = probs.max(-1)[0].mean().item()
                what = name if t == 1.0 else f"{name} / T = {t:.2f}"
                print(
                    f"| {os.path.basename(path)} | {what} | {accuracy:.4f} | {ece:.4f} | "
                    f"{nll:.4f} | {top:.4f} |"
                )


if __name__ == "__main__":
    run_script(main, "calibration.py")
