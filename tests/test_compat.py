"""bench/compat.py's verdicts: a text or a tensor equal to another, or where it parts."""

import torch

from bench.compat import closeness, first_difference


def test_first_difference_names_where_two_samples_part():
    assert first_difference("ROMEO: ay", "ROMEO: ay") == "equal"
    found = first_difference("ROMEO: ay<|end|>", "ROMEO: ay")
    assert found == "DIFFERS at character 9: '<|end|>' against ''"


def test_closeness_allows_float32_noise_only():
    probs = torch.tensor([[0.25, 0.75]])
    assert closeness(probs, probs + 1e-7) == "equal"
    assert closeness(probs, probs + 1e-3) == "DIFFERS by 1.00e-03"
