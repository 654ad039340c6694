"""The course notes' worked numbers, reproduced by model.attention and MultiHeadAttention."""

import math

import pytest
import torch

import model
from model import GPTConfig, MultiHeadAttention, attention

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors: one thread

# "dogs chase cats", d = 4, d_k = d_v = 2
X = torch.tensor([[1.0, 0, 1, 0], [0, 1, 0, 1], [1, 0, 0, 1]])
W_Q = torch.tensor([[1.0, 0], [0, 1], [1, 0], [0, 0]])
W_K = torch.tensor([[0.0, 1], [1, 0], [0, 0], [1, 1]])
W_V = torch.tensor([[1.0, 0], [0, 2], [1, 1], [0, 1]])
Q, K, V = X @ W_Q, X @ W_K, X @ W_V


def close(actual, expected, tol=1e-3):  # the notes print 3 decimals
    assert torch.allclose(actual, torch.tensor(expected, dtype=actual.dtype), atol=tol), actual


def test_worked_example():
    close(Q, [[2, 0], [0, 1], [1, 0]], 0)
    close(K, [[0, 1], [2, 1], [1, 2]], 0)
    close(V, [[2, 1], [0, 3], [1, 1]], 0)
    close(Q @ K.T, [[0, 4, 2], [1, 1, 2], [0, 2, 1]], 0)
    Y, A = attention(Q, K, V)
    close(A, [[0.045, 0.768, 0.187], [0.248, 0.248, 0.503], [0.140, 0.576, 0.284]])
    close(Y, [[0.277, 2.536], [1.000, 1.497], [0.564, 2.152]])
    close(torch.softmax(Q @ K.T, -1)[0], [0.016, 0.867, 0.117])  # without 1/sqrt(d_k): much peakier


def test_padding_and_causal_masks():
    # "cats" is padding: its key column is hidden
    _, A = attention(Q, K, V, mask=torch.tensor([True, True, False]))
    close(A, [[0.056, 0.944, 0], [0.5, 0.5, 0], [0.196, 0.804, 0]])
    _, A = attention(Q, K, V, mask=torch.ones(3, 3, dtype=torch.bool).tril())
    close(A, [[1, 0, 0], [0.5, 0.5, 0], [0.140, 0.576, 0.284]])


def test_fully_masked_query_gets_zeros():
    Y, A = attention(Q, K, V, mask=torch.tensor([[False] * 3, [True] * 3, [True] * 3]))
    assert not Y.isnan().any() and (A[0] == 0).all() and (Y[0] == 0).all()


def test_no_projections_symmetric_scores_asymmetric_weights():
    _, A = attention(X, X, X)
    close(A, [[0.506, 0.186, 0.307], [0.186, 0.506, 0.307], [0.274, 0.274, 0.452]])
    assert torch.equal(X @ X.T, (X @ X.T).T) and not torch.allclose(A, A.T)


def test_permutation_equivariance_and_causal_breaks_it():
    torch.manual_seed(0)
    mha = MultiHeadAttention(GPTConfig(n_embd=8, n_head=2, bias=True), causal=False).eval()
    x, perm = torch.randn(1, 5, 8), torch.tensor([3, 0, 4, 1, 2])
    y, _ = mha(x)
    y_perm, _ = mha(x[:, perm])
    assert torch.allclose(y_perm, y[:, perm], atol=1e-6)
    mha.causal = True  # the same weights, a decoder's attention
    y, _ = mha(x)
    y_perm, _ = mha(x[:, perm])
    assert not torch.allclose(y_perm, y[:, perm], atol=1e-3)


def test_sqrt_dk_simulation():
    """n = 16 keys, q, k ~ N(0, I), 2000 trials per d_k: the notes' table."""
    torch.manual_seed(0)
    notes = {  # d_k: (std of q.k, max weight unscaled, scaled, 1 - sum(alpha^2) unscaled)
        1: (0.99, 0.21, 0.21, 0.87),
        4: (1.99, 0.43, 0.23, 0.71),
        16: (4.01, 0.69, 0.25, 0.43),
        64: (8.02, 0.84, 0.25, 0.22),
        512: (22.49, 0.94, 0.25, 0.08),
    }
    for d_k, (std, max_raw, max_scaled, spread_raw) in notes.items():
        q, k = (
            torch.randn(2000, 1, d_k, dtype=torch.float64),
            torch.randn(2000, 16, d_k, dtype=torch.float64),
        )
        dots = (q * k).sum(-1)
        raw, scaled = torch.softmax(dots, -1), torch.softmax(dots / math.sqrt(d_k), -1)
        assert abs(dots.std().item() / std - 1) < 0.05, d_k
        assert abs(raw.max(-1).values.mean().item() - max_raw) < 0.03, d_k
        assert abs(scaled.max(-1).values.mean().item() - max_scaled) < 0.03, d_k
        assert abs((1 - (raw**2).sum(-1)).mean().item() - spread_raw) < 0.03, d_k
        assert abs((1 - (scaled**2).sum(-1)).mean().item() - 0.87) < 0.03, d_k


@pytest.mark.parametrize("d, h", [(32, 4), (768, 12), (64, 1), (64, 2), (64, 8), (64, 64)])
def test_parameter_count_is_4d2_for_any_h(d, h):
    n = sum(
        p.numel()
        for p in MultiHeadAttention(GPTConfig(n_embd=d, n_head=h, bias=False), True).parameters()
    )
    assert n == 4 * d * d
    if d == 32:
        assert n == 3 * 4 * 32 * 8 + 32**2 == 4096


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("padded", [False, True])
def test_fused_and_explicit_paths_agree(causal, padded):
    torch.manual_seed(0)
    mha = MultiHeadAttention(GPTConfig(n_embd=32, n_head=4, bias=True), causal).eval()
    x = torch.randn(3, 7, 32)
    mask = None
    if padded:  # row 0 real throughout, rows 1-2 end in padding
        attention_mask = torch.tensor([[1] * 7, [1] * 4 + [0] * 3, [1] * 2 + [0] * 5])
        mask = attention_mask.bool()[:, None, None, :]
        if causal:  # a mask given is the whole mask: the triangle joins it
            mask = mask & torch.ones(7, 7, dtype=torch.bool).tril()
    fused, none = mha(x, mask)
    explicit, weights = mha(x, mask, need_weights=True)
    assert none is None and weights.shape == (3, 4, 7, 7)
    assert torch.allclose(fused, explicit, atol=1e-5)
    assert torch.allclose(weights.sum(-1), torch.ones(3, 4, 7), atol=1e-6)
    if causal:
        assert (weights.triu(1) == 0).all()
    if padded:
        assert (weights[2, :, :, 2:] == 0).all()


def test_float32_attention_runs_the_kernel_in_float32_under_bfloat16_autocast(monkeypatch):
    """lib.autotune's choice where bfloat16's backward is the slower: the products stay bfloat16."""
    seen = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def recording(q, k, v, *args, **kw):
        seen.append((q.dtype, k.dtype, v.dtype, torch.is_autocast_enabled("cpu")))
        return sdpa(q, k, v, *args, **kw)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recording)
    config = GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=16)
    attn = MultiHeadAttention(config, causal=True)
    x = torch.randn(2, 8, 16)
    losses = {}
    for on in (False, True):
        attn.float32_attention = on
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y, _ = attn(x)
        assert y.dtype == torch.bfloat16  # W_O's product in bfloat16 either way
        y.float().square().mean().backward()
        losses[on] = y.float().square().mean().item()
    bf16, f32 = torch.bfloat16, torch.float32
    assert seen == [(bf16, bf16, bf16, True), (f32, f32, f32, False)]
    assert losses[True] == pytest.approx(losses[False], rel=0.05)
    assert torch.isfinite(attn.qkv.weight.grad).all()


def test_float32_attention_holds_on_the_explicit_path_too(monkeypatch):
    """attention(), the math to edit, runs outside the autocast too where float32_attention is on:
    its products in float32, not rounded back to bfloat16."""
    seen = []
    explicit = model.attention

    def recording(q, k, v, *args):
        seen.append((q.dtype, torch.is_autocast_enabled("cpu")))
        return explicit(q, k, v, *args)

    monkeypatch.setattr(model, "attention", recording)
    config = GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=16)
    attn = MultiHeadAttention(config, causal=True)
    attn.float32_attention = True
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _, maps = attn(torch.randn(2, 8, 16), need_weights=True)
    assert seen == [(torch.float32, False)] and maps.dtype == torch.float32
