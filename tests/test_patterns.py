"""The notes' sparse patterns (window, global tokens, random links): each mask against its
definition cell by cell, the fast paths against the explicit one in both models, a window of
block_size against full causal attention, the pairs a window keeps, and the rolling cache that
lets a windowed rotary model generate past block_size."""

import subprocess
import sys

import pytest
import torch
from conftest import generate

from decoding import NextToken, Options
from engine import Engine, Row
from lib.checkpoint import save_pretrained
from lib.common import Error
from lib.weights import from_checkpoint
from model import GPT, EncoderClassifier, EncoderConfig, GPTConfig, attention
from patterns import Pattern, RollingCache, flex_sparse, sparse_attention

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors: one thread

TINY = dict(vocab_size=50, block_size=300, n_layer=2, n_head=2, n_embd=16)
PATTERNS = {
    "window": dict(window=5),
    "global": dict(global_tokens=3),
    "random": dict(random_links=2),
    "bigbird": dict(window=5, global_tokens=3, random_links=2),
}
# Float32 outputs of the explicit path (one softmax over the row) and a fast one (SDPA by blocks,
# or FlexAttention's online softmax): the same products summed in another order. An output sums
# at most 300 weights x values of size O(0.02 * sqrt(16)) through 2 layers of O(1) activations;
# reordering moves each by a few float32 ulps (2^-23 ~ 1.2e-7 relative): 1e-5 is two orders above
# that, and far below the O(0.01) change one pair kept or dropped makes.
ATOL = 1e-5


def definition(n, causal, window=0, global_tokens=0, random_links=0, links=None):
    """The notes' patterns written as loops: query i may attend key j."""
    allowed = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        for j in range(n):
            near = window > 0 and abs(i - j) < window
            seen_by_all = i < global_tokens or j < global_tokens
            linked = random_links > 0 and j in links[i].tolist()
            allowed[i, j] = (near or seen_by_all or linked) and (j <= i or not causal)
    return allowed


@pytest.mark.parametrize("causal", [True, False], ids=["gpt", "encoder"])
@pytest.mark.parametrize("name", PATTERNS)
def test_each_mask_is_its_definition_cell_by_cell(name, causal):
    config = GPTConfig(**TINY | PATTERNS[name])
    pattern = Pattern(config, causal)
    expected = definition(40, causal, **PATTERNS[name], links=pattern.links)
    assert torch.equal(pattern.dense(40, "cpu"), expected)
    indices, bias, block_mask = pattern.blocks(40, "cpu")
    assert torch.equal(bias[0, :40, :40] == 0, expected)  # 40 positions: one block
    # the one block is kept if any pair in it is
    assert block_mask.to_dense()[0, 0].item() == expected.any()


def test_random_links_are_fixed_by_the_seed_and_causal_ones_look_back():
    config = GPTConfig(**TINY, random_links=3, random_seed=7)
    links = Pattern(config, causal=True).links
    assert torch.equal(links, Pattern(config, causal=True).links)  # every run: one draw
    other = Pattern(GPTConfig(**TINY, random_links=3, random_seed=8), causal=True).links
    assert not torch.equal(links, other)
    assert (links <= torch.arange(300)[:, None]).all()  # query q's links: keys 0..q
    assert links[100:].float().mean() > 50  # and spread over them, not at the start


def test_a_query_blocks_random_links_fall_in_at_most_r_key_blocks():
    """Drawn per query block, as BigBird's kernels do: random links keep the pattern block-sparse,
    where links drawn per query would reach nearly every key block."""
    config = GPTConfig(**TINY | dict(block_size=1024, random_links=3))
    for causal in (True, False):
        indices = Pattern(config, causal).blocks(1024, "cpu")[0]  # [query blocks, K]
        assert indices.shape[1] <= 3


def models(options):
    torch.manual_seed(0)
    gpt = GPT(GPTConfig(**TINY | options))
    encoder = EncoderClassifier(EncoderConfig(**TINY | options))
    return [gpt, encoder]


def outputs(model, idx, impl):
    model.config.attn_impl = impl
    logits = model(idx)[0]
    logits.sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    return logits, grads


@pytest.mark.parametrize("name", PATTERNS)
def test_the_block_sparse_path_trains_as_the_explicit_one(name):
    """With gradients on a CPU the fast path is block_sparse(): its outputs and gradients are the
    dense mask's, in both models, padding included, at a length that is not a whole block."""
    for model in models(PATTERNS[name]):
        idx = torch.randint(1, 50, (2, 260))
        idx[1, 150:] = 0  # the encoder's padding (the GPT reads it as a token)
        (fast, fast_grads), (explicit, explicit_grads) = [
            outputs(model, idx, impl) for impl in ("sdpa", "explicit")
        ]
        assert torch.allclose(fast, explicit, atol=ATOL)
        # the gradients of the summed logits run to 1e3: the same bound, relative to their size
        for a, b in zip(fast_grads, explicit_grads):
            assert torch.allclose(a, b, atol=ATOL * b.abs().max())


@pytest.mark.slow  # compiles FlexAttention (a C++ build) per pattern
@pytest.mark.parametrize("causal", [True, False], ids=["gpt", "encoder"])
def test_flex_attention_is_the_explicit_path(causal):
    """FlexAttention, a GPU's fast path, on the pattern's BlockMask: attention() under its dense
    mask, padding included."""
    torch.manual_seed(0)
    pattern = Pattern(GPTConfig(**TINY | PATTERNS["bigbird"]), causal)
    q, k, v = torch.randn(3, 2, 2, 260, 8).unbind(0)
    real = torch.ones(2, 260, dtype=torch.bool)
    real[1, 150:] = False
    mask = pattern.dense(260, "cpu") & real[:, None, None, :]
    expected = attention(q, k, v, mask)[0]
    block_mask = pattern.blocks(260, "cpu")[2]
    assert torch.allclose(flex_sparse(q, k, v, block_mask, real), expected, atol=ATOL)


@pytest.mark.slow
def test_a_flex_attention_that_cannot_compile_is_one_line_naming_the_way_out():
    """No working compiler: FlexAttention says so in one line and names the dense mask, instead
    of inductor's traceback."""
    torch._dynamo.reset()  # compile afresh: an earlier test's kernel would serve this call
    settings = dict(fx_graph_cache=False, **{"cpp.cxx": ("/nonexistent/c++",)})
    pattern = Pattern(GPTConfig(**TINY | PATTERNS["window"]), causal=True)
    q = torch.randn(1, 2, 40, 8)
    block_mask = pattern.blocks(40, "cpu")[2]
    with torch._inductor.config.patch(settings), pytest.raises(Error) as failed:
        flex_sparse(q, q, q, block_mask)
    torch._dynamo.reset()
    message = str(failed.value)
    assert "\n" not in message and "C++" in message and "attn_impl=explicit" in message


def test_a_compiled_model_trains_through_a_pattern():
    """Dynamo traces the model around the blocks (built eagerly): the eager loss and gradients."""
    model = models(PATTERNS["bigbird"])[0]
    idx = torch.randint(1, 50, (2, 260))
    eager = model(idx, idx)[1]
    eager.backward()
    expected = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    compiled = torch.compile(model, backend="eager")(idx, idx)[1]
    compiled.backward()
    assert torch.allclose(compiled, eager, atol=ATOL)
    for p, grad in zip(model.parameters(), expected):
        assert torch.allclose(p.grad, grad, atol=ATOL * grad.abs().max())


def test_importing_the_model_loads_no_compiler_and_no_option():
    """Dynamo's import costs seconds of every script's start that a model without a pattern never
    needs; FlexAttention, the patterns, the optimizers and the caches load where they are used,
    and the model imports on a torch without torch.optim.Muon."""
    code = (
        "import sys, torch; del torch.optim.Muon; import model; "
        "print([m for m in sys.modules if m in ('torch._dynamo', "
        "'torch.nn.attention.flex_attention', 'patterns', 'optim', 'muon', 'cache')])"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.stdout.strip() == "[]", result.stderr


def test_a_window_of_block_size_is_full_causal_attention():
    torch.manual_seed(0)
    full = GPT(GPTConfig(**TINY))
    windowed = GPT(GPTConfig(**TINY, window=300))
    windowed.load_state_dict(full.state_dict())
    idx = torch.randint(0, 50, (2, 300))
    for impl in ("sdpa", "explicit"):
        full.config.attn_impl = windowed.config.attn_impl = impl
        assert torch.allclose(windowed(idx)[0], full(idx)[0], atol=ATOL)


def test_the_pairs_a_window_keeps_grow_linearly():
    """A causal window of W keeps n W - W (W - 1) / 2 pairs, full attention n (n + 1) / 2; the
    fast path's tiles grow as n as well."""
    W = 64
    kept, tiles = [], []
    for n in (512, 1024, 2048):
        pattern = Pattern(GPTConfig(block_size=n, window=W), causal=True)
        kept.append(int(pattern.dense(n, "cpu").sum()))
        assert kept[-1] == n * W - W * (W - 1) // 2
        tiles.append(pattern.blocks(n, "cpu")[1].numel())
    assert tiles[1] == 2 * tiles[0] and tiles[2] == 2 * tiles[1]


def test_a_cpu_never_takes_flex_attention(monkeypatch):
    """FlexAttention has no backward pass on a CPU, and its compiled forward fails at some
    lengths: there, every forward takes block_sparse(), with gradients or without."""
    called = []

    def flex(q, *args):
        called.append(q)
        return q

    monkeypatch.setattr("patterns.flex", lambda: flex)
    pattern = Pattern(GPTConfig(block_size=16, window=4), causal=True)
    q = torch.randn(1, 1, 16, 8, requires_grad=True)
    sparse_attention(q, q, q, pattern.blocks(16, "cpu"))
    sparse_attention(q.detach(), q.detach(), q.detach(), pattern.blocks(16, "cpu"))
    assert not called


@pytest.mark.parametrize("name", PATTERNS)
def test_an_encoder_evaluates_any_length_on_a_cpu_as_the_explicit_path(name):
    """Evaluation (no gradients) of an encoder with a pattern, at three lengths, padding
    included: the explicit path's logits (FlexAttention's compiled CPU kernel fails at some)."""
    model = models(PATTERNS[name])[1].eval()
    for n in (17, 40, 64):
        idx = torch.randint(1, 50, (2, n))
        idx[1, n // 2 :] = 0
        with torch.no_grad():
            model.config.attn_impl = "explicit"
            explicit = model(idx)[0]
            model.config.attn_impl = "sdpa"
            assert torch.allclose(model(idx)[0], explicit, atol=ATOL)


def endless_model(**options):
    torch.manual_seed(0)
    config = GPTConfig(**TINY | dict(block_size=16, rope=True, attn_impl="explicit") | options)
    model = GPT(config)
    with torch.no_grad():  # larger than the init's 0.02: a wrong key read shows
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    return model.eval()


@pytest.mark.parametrize("options", [dict(window=6), dict(window=6, global_tokens=2)])
def test_a_window_generates_past_block_size_as_the_uncached_model(options):
    """A rolling cache of window + global_tokens slots per row gives the tokens the model computes
    from scratch on the whole sequence (the uncached path), far past block_size = 16, for
    prompts shorter and longer than the window."""
    model = endless_model(**options)
    prompts = [[1, 2, 3], list(range(1, 17))]
    runs = []
    for use_cache in (True, False):
        sampled = NextToken(Options(temperature=1.0), generator=torch.Generator().manual_seed(0))
        runs.append(list(generate(model, prompts, 60, [sampled, greedy()], use_cache)))
    assert runs[0] == runs[1] and len(runs[0]) == 60
    engine = Engine(model, rows=2)
    assert isinstance(engine.cache, RollingCache)
    assert engine.cache.kv[0][0].shape[2] == options["window"] + options.get("global_tokens", 0)


def test_a_prompt_past_block_size_is_read_whole_by_a_rolling_cache():
    """A prompt of 3 x block_size: its first tokens stay the global ones, and the prefill (in
    chunks through the rolling cache) and the greedy tokens after it are what the model computes
    from scratch on the whole sequence."""
    model = endless_model(window=6, global_tokens=2)
    prompt = torch.randint(1, 50, (48,), generator=torch.Generator().manual_seed(1)).tolist()
    engine = Engine(model, rows=1)
    row = Row(prompt, greedy(), 1, None)  # an endless model: no window
    row.slot = 0
    with torch.no_grad():
        whole = model(torch.tensor([prompt]))[0][0]
        assert torch.allclose(engine.prefill(row, keep=48), whole, atol=ATOL)
        expected = list(prompt)
        for _ in range(20):
            logits = model(torch.tensor([expected]))[0][0, -1]
            expected.append(int(logits.argmax()))
    cached = [step[0] for step in generate(model, [prompt], 20, [greedy()])]
    assert cached == expected[48:]


def greedy():
    return NextToken(Options(), greedy=True)


def test_other_models_keep_block_size():
    model = endless_model(window=6, random_links=1)  # random links: positions past block_size
    assert not model.endless and not isinstance(Engine(model, rows=1).cache, RollingCache)
    with pytest.raises(Exception, match="exceeds block_size=16"):
        model(torch.zeros(1, 17, dtype=torch.long))


def test_a_checkpoint_keeps_its_pattern(tmp_path):
    model = GPT(GPTConfig(**TINY, window=5, global_tokens=2, random_links=1, random_seed=3))
    save_pretrained(model, str(tmp_path))
    loaded, _ = from_checkpoint(str(tmp_path))
    assert loaded.config == model.config
    assert torch.equal(loaded.pattern.dense(50, "cpu"), model.pattern.dense(50, "cpu"))
