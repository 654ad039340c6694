"""GPT and EncoderClassifier: causality, padding invariance, initial loss, overfitting, KV cache,
checkpoints."""

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import optim
from lib.checkpoint import save_pretrained
from lib.common import Error
from lib.gpt2 import from_pretrained
from lib.records import flops_per_token
from lib.weights import from_checkpoint
from model import (
    GPT,
    EncoderClassifier,
    EncoderConfig,
    GPTConfig,
    attention,
    rotary,
    rotation,
    varying_lengths,
)
from muon import Muon, orthogonalize
from optim import configure_optimizers

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors: one thread

TINY = dict(vocab_size=50, block_size=16, n_layer=2, n_head=2, n_embd=16, dropout=0.0, bias=True)
MODERN = dict(rope=True, qk_norm=True)
OPTIONS = pytest.mark.parametrize(
    "options", [{}, MODERN], ids=["gpt2", "modern"]
)  # the defaults, and every option on


def tiny_gpt(**kw):
    torch.manual_seed(0)
    return GPT(GPTConfig(**{**TINY, **kw}))


def tiny_classifier(**kw):
    torch.manual_seed(0)
    return EncoderClassifier(EncoderConfig(**{**TINY, "n_classes": 3, "pad_token_id": 0, **kw}))


def randomised(model):
    """Weights drawn afresh, larger than the init's 0.02: a leak through a mask or a cache then
    moves the logits visibly."""
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    return model


@OPTIONS
def test_gpt_is_causal(options):
    model = randomised(tiny_gpt(**options)).eval()
    idx = torch.randint(0, 50, (2, 12))
    changed = idx.clone()
    changed[:, 6:] = (changed[:, 6:] + 1) % 50
    a, _ = model(idx)
    b, _ = model(changed)
    assert a.shape == (2, 12, 50)
    assert torch.allclose(a[:, :6], b[:, :6], atol=1e-6) and not torch.allclose(
        a[:, 6:], b[:, 6:], atol=1e-3
    )


@pytest.mark.parametrize(
    "options", [{}, MODERN, dict(bow_head=True, bow_buckets=32)], ids=["gpt2", "modern", "encoder"]
)
def test_classifier_ignores_padding(options):
    model = randomised(tiny_classifier(**options)).eval()
    idx = torch.randint(1, 50, (2, 5))
    logits, _ = model(idx, torch.ones_like(idx))
    padded = torch.cat([idx, torch.zeros(2, 3, dtype=torch.long)], 1)
    mask = torch.cat([torch.ones(2, 5), torch.zeros(2, 3)], 1).long()
    padded_logits, _ = model(padded, mask)
    assert torch.allclose(logits, padded_logits, atol=1e-5)
    garbage = padded.clone()  # what sits under the padding does not matter either
    garbage[:, 5:] = 7
    assert torch.allclose(model(garbage, mask)[0], logits, atol=1e-5)
    assert torch.allclose(model(padded)[0], logits, atol=1e-5)  # default mask: idx != pad_token_id
    all_padding, _ = model(torch.zeros(1, 4, dtype=torch.long), torch.zeros(1, 4))
    assert torch.isfinite(all_padding).all()


def test_classifier_attention_maps_hide_padding():
    model = tiny_classifier().eval()
    idx = torch.tensor([[5, 6, 7, 0, 0]])
    logits, _, maps = model(idx, need_weights=True)
    assert len(maps) == 2 and maps[0].shape == (1, 2, 5, 5)
    assert (maps[1][..., 3:] == 0).all() and torch.allclose(logits, model(idx)[0], atol=1e-5)


def test_varying_lengths_turns_cudnn_attention_off_on_a_gpu_only():
    """cuDNN's attention, which plans anew at each length, is off within a stretch of varying
    lengths on a GPU (the context touches no device); a CPU, which has no such kernel, changes
    nothing."""
    assert torch.backends.cuda.cudnn_sdp_enabled()
    with varying_lengths("cpu"):
        assert torch.backends.cuda.cudnn_sdp_enabled()
    with varying_lengths("cuda"):
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        assert torch.backends.cuda.flash_sdp_enabled()
    assert torch.backends.cuda.cudnn_sdp_enabled()


def test_untrained_loss_is_ln_vocab():
    model = tiny_gpt(vocab_size=1000, n_embd=32)
    idx = torch.randint(0, 1000, (4, 16))
    _, loss = model(idx, torch.randint(0, 1000, (4, 16)))
    assert abs(loss.item() - math.log(1000)) < 0.1


@OPTIONS
@pytest.mark.parametrize("kind", ["gpt", "classifier"])
def test_overfits_one_batch(kind, options):
    model = tiny_gpt(**options) if kind == "gpt" else tiny_classifier(**options)
    torch.manual_seed(1)
    idx = torch.randint(1, 50, (4, 16))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    for _ in range(150):
        _, loss = (
            model(idx, idx.roll(-1, 1))
            if kind == "gpt"
            else model(idx, labels=torch.tensor([0, 1, 2, 1]))
        )
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.05


def test_tied_head_parameter_count_and_decay_groups():
    model = tiny_gpt()
    assert model.lm_head.weight is model.wte.weight
    c = model.config
    per_layer = (
        12 * c.n_embd**2 + 13 * c.n_embd
    )  # attention 4d^2+4d, MLP 8d^2+5d, two LayerNorms 4d
    expected = c.vocab_size * c.n_embd + c.n_layer * per_layer + 2 * c.n_embd
    assert model.num_params() == expected
    assert model.num_params(non_embedding=False) == expected + c.block_size * c.n_embd
    (adamw,) = configure_optimizers(model, 0.1, 1e-3, (0.9, 0.95), "cpu")
    decay, no_decay = adamw.param_groups
    assert all(p.dim() == 2 for p in decay["params"]) and all(
        p.dim() == 1 for p in no_decay["params"]
    )
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert sum(p.numel() for g in (decay, no_decay) for p in g["params"]) == model.num_params(
        non_embedding=False
    )


def test_logits_to_keep_is_the_last_rows_of_the_full_forward():
    model = randomised(tiny_gpt()).eval()
    idx = torch.randint(0, 50, (2, 9))
    full, _ = model(idx)
    last, _ = model(idx, logits_to_keep=3)
    assert last.shape == (2, 3, 50) and torch.allclose(last, full[:, -3:], atol=1e-6)


def test_save_and_load_roundtrip(tmp_path):
    for model in (tiny_gpt(), tiny_classifier()):
        model.eval()
        save_pretrained(model, tmp_path / type(model).__name__, task="x")
        loaded, info = from_checkpoint(tmp_path / type(model).__name__)
        idx = torch.randint(1, 50, (2, 8))
        assert info["task"] == "x" and info["model"]["n_embd"] == 16
        assert torch.equal(model(idx)[0], loaded(idx)[0])
        assert not list(tmp_path.glob("**/*.tmp"))


def test_from_pretrained_matches_independent_gpt2(tmp_path):
    """A tiny random GPT-2 in the Hugging Face layout (Conv1D weights [in, out], 'h.N.' names,
    causal-mask buffers); the reference forward below is written from GPT-2's definition, not from
    model.py."""
    import json

    from safetensors.torch import save_file

    torch.manual_seed(0)
    V, P, L, H, D = 40, 12, 2, 2, 16

    def r(*s):
        return torch.randn(*s) * 0.2

    sd = {"wte.weight": r(V, D), "wpe.weight": r(P, D), "ln_f.weight": 1 + r(D), "ln_f.bias": r(D)}
    for i in range(L):
        p = f"h.{i}."
        sd.update(
            {
                p + "ln_1.weight": 1 + r(D),
                p + "ln_1.bias": r(D),
                p + "ln_2.weight": 1 + r(D),
                p + "ln_2.bias": r(D),
                p + "attn.c_attn.weight": r(D, 3 * D),
                p + "attn.c_attn.bias": r(3 * D),
                p + "attn.c_proj.weight": r(D, D),
                p + "attn.c_proj.bias": r(D),
                p + "mlp.c_fc.weight": r(D, 4 * D),
                p + "mlp.c_fc.bias": r(4 * D),
                p + "mlp.c_proj.weight": r(4 * D, D),
                p + "mlp.c_proj.bias": r(D),
                p + "attn.bias": torch.ones(1, 1, P, P).tril(),
            }
        )
    save_file(sd, tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text(
        json.dumps({"vocab_size": V, "n_positions": P, "n_layer": L, "n_head": H, "n_embd": D})
    )

    def reference(idx):
        def ln(x, n):
            return torch.nn.functional.layer_norm(x, (D,), sd[n + ".weight"], sd[n + ".bias"], 1e-5)

        def conv1d(x, n):
            return x @ sd[n + ".weight"] + sd[n + ".bias"]

        def gelu(x):
            return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))

        T = idx.size(1)
        x = sd["wte.weight"][idx] + sd["wpe.weight"][:T]
        for i in range(L):
            p = f"h.{i}."
            q, k, v = conv1d(ln(x, p + "ln_1"), p + "attn.c_attn").split(D, -1)

            def heads(t):
                return t.view(1, T, H, D // H).transpose(1, 2)

            att = heads(q) @ heads(k).transpose(-1, -2) / math.sqrt(D // H)
            att = att.masked_fill(torch.ones(T, T).triu(1).bool(), -1e9).softmax(-1)
            x = x + conv1d((att @ heads(v)).transpose(1, 2).reshape(1, T, D), p + "attn.c_proj")
            x = x + conv1d(gelu(conv1d(ln(x, p + "ln_2"), p + "mlp.c_fc")), p + "mlp.c_proj")
        return ln(x, "ln_f") @ sd["wte.weight"].T

    model = from_pretrained(str(tmp_path)).eval()
    idx = torch.randint(0, V, (1, 10))
    assert torch.allclose(model(idx)[0], reference(idx), atol=1e-5)


def test_from_pretrained_rejects_unknown_names():
    with pytest.raises(Error, match="neither a directory"):
        from_pretrained("gpt3")


def test_broken_checkpoint_is_one_clear_error(tmp_path):
    save_pretrained(tiny_gpt(), tmp_path, task="lm")
    (tmp_path / "model.safetensors").write_bytes(b"half a file")
    with pytest.raises(Error, match="is not a readable checkpoint of this project"):
        from_checkpoint(tmp_path)


def test_token_dropout_never_hides_every_token_of_a_row():
    """A row with every key hidden would attend to nothing (zeros on the CPU, NaN in some GPU
    kernels): a row whose draw hides all its tokens keeps them all instead; other rows lose about
    the fraction asked for."""
    model = tiny_classifier(token_dropout=0.5).train()
    seen = []
    model.hidden_states = lambda idx, mask, **kw: (
        seen.append(mask[:, 0, 0, :]) or (torch.zeros(*idx.shape, 16), [])
    )
    idx = torch.randint(1, 50, (4000, 2))
    idx[:, 1] = 0  # one real token per row: half the draws hide it
    model(idx)
    kept = seen[0]
    assert kept[:, 0].all() and not kept[:, 1].any()
    long_rows = torch.randint(1, 50, (200, 16))
    model(long_rows)
    assert 0.45 < 1 - seen[1].float().mean() < 0.55 and seen[1].any(1).all()


@pytest.mark.slow
def test_from_pretrained_holds_one_copy_of_the_weights(tmp_path):
    """Built on the meta device, the model takes the loaded tensors: peak memory grows by about one
    model, not two (a random model and the loaded tensors at once). Measured in a fresh process, as
    the growth of its peak RSS."""
    import json
    import subprocess
    import sys

    from safetensors.torch import save_file

    V, P, L, D = 20000, 256, 4, 512
    sd = {
        "wte.weight": torch.randn(V, D),
        "wpe.weight": torch.randn(P, D),
        "ln_f.weight": torch.ones(D),
        "ln_f.bias": torch.zeros(D),
    }
    for i in range(L):
        for name, shape in (
            ("ln_1", (D,)),
            ("ln_2", (D,)),
            ("attn.c_attn", (D, 3 * D)),
            ("attn.c_proj", (D, D)),
            ("mlp.c_fc", (D, 4 * D)),
            ("mlp.c_proj", (4 * D, D)),
        ):
            sd[f"h.{i}.{name}.weight"] = torch.randn(shape)
            sd[f"h.{i}.{name}.bias"] = torch.zeros(shape[-1])
    save_file(sd, tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text(
        json.dumps({"vocab_size": V, "n_positions": P, "n_layer": L, "n_head": 8, "n_embd": D})
    )
    size = sum(t.numel() * 4 for t in sd.values())
    script = (
        "import resource, sys, torch; "
        "sys.path.insert(0, sys.argv[1]); import lib.gpt2; torch.zeros(1)\n"
        "rss = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024\n"
        "base = rss(); lib.gpt2.from_pretrained(sys.argv[2]); print(rss() - base)"
    )
    from conftest import ROOT

    grown = int(
        subprocess.run(
            [sys.executable, "-c", script, ROOT, str(tmp_path)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    assert grown < 1.5 * size, grown / size  # two copies would grow it by about 2x


def test_rotary_scores_depend_only_on_relative_position():
    torch.manual_seed(0)
    q, k = torch.randn(2, 3, 10, 8), torch.randn(2, 3, 10, 8)

    def turn(t, start):
        return rotary(t, *rotation(torch.arange(start, start + 10), 8))

    def scores(start):
        return turn(q, start) @ turn(k, start).transpose(-1, -2)

    assert torch.allclose(
        scores(0), scores(37), atol=1e-4
    )  # every position shifted by the same amount
    assert not torch.allclose(
        scores(0), q @ k.transpose(-1, -2), atol=1e-2
    )  # yet the positions do enter
    assert torch.allclose(
        turn(q, 5).norm(dim=-1), q.norm(dim=-1), atol=1e-5
    )  # a rotation: lengths kept


def test_qk_norm_follows_its_formula():
    torch.manual_seed(0)
    # queries and keys RMS-normalised per head
    attn = randomised(tiny_gpt(qk_norm=True)).blocks[0].attn.eval()
    x = torch.randn(2, 7, 16)

    def rms(t):
        return t / torch.sqrt(t.pow(2).mean(-1, keepdim=True) + torch.finfo(t.dtype).eps)

    q, k, v = attn.qkv(x).view(2, 7, 3, 2, 8).permute(2, 0, 3, 1, 4)
    y, _ = attention(rms(q), rms(k), v, torch.ones(7, 7, dtype=torch.bool).tril())
    assert torch.allclose(attn(x)[0], attn.proj(y.transpose(1, 2).reshape(2, 7, 16)), atol=1e-5)


def test_bow_head_is_a_linear_model_over_tokens_and_hashed_bigrams_averaged_in():
    """bow_head: a second classifier, the sum of one weight row per real token and per hashed
    (previous, token) pair over the square root of their count; the prediction is the mean of the
    two models' log-probabilities (their probabilities' normalised geometric mean); the loss is
    the mean of their cross-entropies; its table learns at BOW_LR_SCALE times the rate, without
    weight decay."""
    model = randomised(tiny_classifier(bow_head=True, bow_buckets=7)).eval()
    idx, labels = torch.tensor([[5, 9, 9, 0, 0], [3, 4, 6, 7, 8]]), torch.tensor([0, 2])
    logits, loss = model(idx, labels=labels)

    def rows(seq):
        previous = [0] + seq[:-1]
        tokens = [model.bow.weight[t] for t in seq]
        pairs = [model.bow.weight[50 + (p * 1_000_003 + t) % 7] for p, t in zip(previous, seq)]
        return tokens + pairs

    bow = torch.stack(
        [sum(rows(seq)) / math.sqrt(2 * len(seq)) for seq in ([5, 9, 9], [3, 4, 6, 7, 8])]
    )
    with torch.no_grad():
        model.bow.weight.zero_()  # a uniform second model: what is left is the encoder's prediction
        uniform, _ = model(idx)
    encoder = 2 * uniform + math.log(3)  # the encoder's log-probabilities
    assert torch.allclose(logits, (encoder + torch.log_softmax(bow, -1)) / 2, atol=1e-5)
    geometric = (encoder.exp() * torch.softmax(bow, -1)).sqrt()
    probs = torch.softmax(logits, -1)
    assert torch.allclose(probs, geometric / geometric.sum(-1, keepdim=True), atol=1e-6)
    # the same argmax as the product of the two models' probabilities
    product = encoder.exp() * torch.softmax(bow, -1)
    assert torch.equal(probs.argmax(-1), product.argmax(-1))
    encoder_loss = F.cross_entropy(encoder, labels)
    assert torch.allclose(loss, (encoder_loss + F.cross_entropy(bow, labels)) / 2, atol=1e-5)
    *_, table = configure_optimizers(model, 0.1, 1e-3, (0.9, 0.95), "cpu")[0].param_groups
    assert table["params"] == [model.bow.weight] and table["weight_decay"] == 0.0
    assert table["lr_scale"] == model.BOW_LR_SCALE > 1


def test_flops_per_token_counts_the_weight_matrices_a_token_meets():
    """6 FLOPs per weight a token meets in a matmul plus 12 L d T for attention, counted by hand:
    each layer's 12 d^2 (Q/K/V 3d^2, W_O d^2, the MLP 8d^2), then GPT's head (its tied token table,
    V x d) or the encoder's class head (d x classes); the position table and the encoder's token and
    bag-of-words tables are looked up, not multiplied."""
    V, T, L, d, classes = 50, 8, 2, 16, 3
    blocks, scores = L * 12 * d * d, 12 * L * d * T
    assert (
        flops_per_token(tiny_gpt(), T)
        == flops_per_token(tiny_gpt(rope=True), T)
        == 6 * (blocks + V * d) + scores
    )
    encoder = tiny_classifier(bow_head=True, bow_buckets=7)
    assert flops_per_token(encoder, T) == 6 * (blocks + d * classes) + scores


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_every_parameter_is_in_one_optimizer_group(optimizer):
    for model in (tiny_gpt(), tiny_classifier(bow_head=True)):
        optimizers = configure_optimizers(model, 0.1, 1e-3, (0.9, 0.95), "cpu", optimizer)
        grouped = [p for opt in optimizers for group in opt.param_groups for p in group["params"]]
        assert sorted(map(id, grouped)) == sorted(map(id, model.parameters()))
        if optimizer == "muon":  # the blocks' matrices, and only they
            matrices = [
                p
                for name, p in model.named_parameters()
                if name.startswith("blocks.") and p.dim() == 2
            ]
            assert [p for group in optimizers[1].param_groups for p in group["params"]] == matrices


def muon_steps(make, steps=3):
    """Three steps of make(params) over a tall, a wide and a square matrix, fixed gradients."""
    g = torch.Generator().manual_seed(0)
    params = [
        nn.Parameter(torch.randn(s, generator=g) / 50) for s in ((96, 32), (32, 80), (40, 40))
    ]
    optimizer = make(params)
    for _ in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=g)
        optimizer.step()
    return params


def test_muon_in_bfloat16_is_torchs_muon_bit_for_bit():
    """Where bfloat16 is native, the Muon here is torch's: the same weights to the last bit."""
    ours = muon_steps(lambda p: Muon(p, 2e-2, 0.1, torch.bfloat16))
    torchs = muon_steps(lambda p: torch.optim.Muon(p, 2e-2, 0.1, adjust_lr_fn="match_rms_adamw"))
    assert all(torch.equal(a, b) for a, b in zip(ours, torchs))


def test_muon_in_float32_is_the_same_iteration_to_bfloat16s_rounding():
    """Newton-Schulz in float32 and bfloat16 against float64: float32 off by its rounding
    through ten products (5e-7 measured; 1e-5 bounds 2^-24 grown by sums of 512), bfloat16 by
    a few of its units (2^-8: 4e-3 to 9e-3 measured, bound 2e-2); the same function."""
    g = torch.Generator().manual_seed(0)
    coefficients = torch.optim.Muon([nn.Parameter(torch.zeros(2, 2))]).defaults["ns_coefficients"]
    for shape in ((384, 128), (128, 512), (64, 64)):
        grad = torch.randn(shape, generator=g)
        exact = orthogonalize(grad.double(), torch.float64, coefficients, 5, 1e-7)
        for dtype, bound in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2)):
            found = orthogonalize(grad, dtype, coefficients, 5, 1e-7)
            assert found.dtype == dtype
            assert (found.double() - exact).abs().max() < bound, dtype


@pytest.mark.parametrize("native", [True, False])
def test_muon_orthogonalises_in_the_dtype_the_device_multiplies_fast(monkeypatch, native):
    """bfloat16 where native_bf16 (dtype=auto's rule), float32 where bfloat16 is emulated."""
    monkeypatch.setattr(optim, "native_bf16", lambda device: native)
    optimizers = configure_optimizers(tiny_gpt(), 0.1, 1e-3, (0.9, 0.95), "cpu", "muon")
    assert optimizers[1].dtype == (torch.bfloat16 if native else torch.float32)


def test_load_body_takes_a_gpts_body_and_starts_the_head_afresh():
    """A model started from a pretrained GPT with a longer context, built on the meta device as
    train.py builds it: the token table, blocks and final norm are the GPT's exactly, the position
    table its first block_size rows; the GPT's head is left, and a classifier's head and
    bag-of-words table start afresh at the init's scale."""
    gpt = randomised(tiny_gpt(block_size=32)).eval()
    source = gpt.state_dict()
    with torch.device("meta"):
        classifier = EncoderClassifier(EncoderConfig(**{**TINY, "n_classes": 3, "bow_head": True}))
        short_gpt = GPT(GPTConfig(**TINY))
    classifier.load_body(source)
    state = classifier.state_dict()
    fresh = ("head.weight", "head.bias", "bow.weight")
    assert state.keys() - fresh == source.keys() - {"lm_head.weight"}
    for name in state.keys() - fresh:
        assert torch.equal(
            state[name], source[name][:16] if name == "wpe.weight" else source[name]
        ), name
    assert all(
        0.01 < state[name].std() < 0.03 for name in ("head.weight", "bow.weight")
    )  # N(0, 0.02), not 0.3
    assert not state["head.bias"].any()
    logits, _ = classifier.eval()(torch.randint(1, 50, (2, 8)))
    assert torch.isfinite(logits).all()
    short_gpt.load_body(source).eval()  # a GPT's own head is its token table: nothing starts afresh
    assert short_gpt.lm_head.weight is short_gpt.wte.weight
    idx = torch.randint(0, 50, (2, 16))
    assert torch.allclose(short_gpt(idx)[0], gpt(idx)[0], atol=1e-5)
