"""bench.py: the notebook-style per-head loop computes what the fused projection computes; a measurement runs."""
import torch

from bench import LoopAttention, bench_attention


def test_loop_reference_matches_fused_and_explicit_paths():
    torch.manual_seed(0)
    loop = LoopAttention(48, 6)
    mha = loop.fused_copy()  # the loop's per-head weights copied into one qkv projection
    x = torch.randn(2, 10, 48)
    expected = loop(x)
    fused, _ = mha(x)
    explicit, weights = mha(x, need_weights=True)
    torch.testing.assert_close(fused, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(explicit, expected, atol=1e-5, rtol=1e-5)
    assert weights.shape == (2, 6, 10, 10)


def test_attention_measurement_smoke():
    sizes = {}
    for path in ("fused", "explicit", "loop"):
        r = bench_attention(path, 64, "cpu", repeats=1)
        assert r["min_s"] > 0 and r["median_s"] > 0 and len(r["times_s"]) == 1 and r["saved_bytes"] > 0
        sizes[path] = r["saved_bytes"]
    assert sizes["fused"] < sizes["explicit"]  # the explicit path keeps the n x n weights for backward
