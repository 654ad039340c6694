"""The generation engine: the KV cache against full forwards, rows at their own positions in one
batch, the window past block_size, the cached path against the uncached one for every decoding
option, requests joining and leaving a running batch, one prefill for n samples, the weight formats,
and what the server's engine adds: log-probabilities, the prompt scored, turns by client."""

import functools

import pytest
import torch
import torch.nn as nn
from conftest import generate
from torch._inductor.utils import run_and_get_cpp_code

from cache import KVCache
from compiled import OneRowStep
from decoding import NextToken, Options
from engine import Engine
from lib import formats
from lib.common import Error
from lib.formats import Int8Linear, PackedLinear, for_decoding, resolve_weights
from model import GPT, GPTConfig
from serving.scheduler import ServingEngine

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors: one thread

TINY = dict(vocab_size=50, block_size=16, n_layer=2, n_head=2, n_embd=16, dropout=0.0, bias=True)
MODERN = dict(rope=True, qk_norm=True)
# the defaults, and every option on
OPTIONS = pytest.mark.parametrize("options", [{}, MODERN], ids=["gpt2", "modern"])
# Every decoding option on its own and all together, each sampled (the seeded draws must match)
DECODING = [
    dict(temperature=1.0),
    dict(temperature=0.7, top_k=5),
    dict(top_p=0.8),
    dict(frequency_penalty=0.5, presence_penalty=0.3),
    dict(repetition_penalty=1.5),
    dict(no_repeat_ngram_size=2),
    dict(temperature=0.9, top_k=10, top_p=0.9, frequency_penalty=0.2, repetition_penalty=1.2),
]
# Float32 logits of one row computed in a batch of other rows, against alone: the same sums in
# another blocking order. Each logit sums d = 16 products per matmul through two layers and the
# head; the weights are N(0, 0.3), so the terms are O(1) and a reordered sum of 16 moves by a few
# float32 ulps of its magnitude (2^-23 ~ 1.2e-7 relative): 1e-5 is two orders above what a
# reordering can do, and far below the 0.1-sized gaps a leak across rows would open.
ATOL = 1e-5


def tiny_gpt(**kw):
    torch.manual_seed(0)
    model = GPT(GPTConfig(**{**TINY, **kw}))
    with torch.no_grad():  # larger than the init's 0.02: a leak through the cache shows
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    return model.eval()


def picks(options, seeds):
    """One NextToken per seed, each with its own generator."""
    made = []
    for seed in seeds:
        generator = torch.Generator().manual_seed(seed)
        made.append(NextToken(Options(**options), generator=generator))
    return made


def greedy():
    return NextToken(Options(), greedy=True)


def lone(model, prompt, pick, n, use_cache=True):
    """The tokens one row gets alone in an engine of one row."""
    return [step[0] for step in generate(model, [prompt], n, [pick], use_cache)]


@pytest.mark.parametrize("use_cache", [True, False], ids=["cached", "uncached"])
def test_a_model_trains_after_it_decoded(use_cache):
    """The engine's forwards in inference mode leave the model nothing autograd refuses: a
    pattern's masks, built once per length, are built outside it."""
    model = tiny_gpt(window=4)
    lone(model, [1, 2, 3], greedy(), 5, use_cache)
    idx = torch.randint(0, 50, (2, 7))  # the length of the last forward
    model.train()
    model(idx, idx)[1].backward()
    assert all(p.grad is not None for p in model.parameters())


@OPTIONS
def test_cache_steps_give_the_full_forwards_logits(options):
    model = tiny_gpt(**options)
    idx = torch.randint(0, 50, (3, 10))
    full, _ = model(idx)
    cache = KVCache(model.config, 3, 16, "cpu")
    prefill, _ = model(idx[:, :4], cache=cache.step([0, 1, 2], 4))
    steps = [prefill]
    for t in range(4, 10):
        logits, _ = model(idx[:, t : t + 1], cache=cache.step([0, 1, 2], 1))
        steps.append(logits)
    assert torch.allclose(torch.cat(steps, 1), full, atol=ATOL)
    assert cache.lengths == [10, 10, 10]


@OPTIONS
def test_rows_at_different_lengths_get_the_logits_they_get_alone(options):
    """Three rows prefilled to lengths 3, 7 and 5 in slots 2, 0 and 1, then one batched step:
    each row's logits equal a full forward of its own tokens, positions and rotary per row."""
    model = tiny_gpt(**options)
    cache = KVCache(model.config, 3, 16, "cpu")
    rows = {2: torch.randint(0, 50, (1, 4)), 0: torch.randint(0, 50, (1, 8))}
    rows[1] = torch.randint(0, 50, (1, 6))
    for slot, tokens in rows.items():
        model(tokens[:, :-1], cache=cache.step([slot], tokens.size(1) - 1))
    order = [2, 0, 1]
    last = torch.cat([rows[slot][:, -1:] for slot in order])
    batched, _ = model(last, cache=cache.step(order, 1), logits_to_keep=1)
    for i, slot in enumerate(order):
        alone, _ = model(rows[slot])
        assert torch.allclose(batched[i, -1], alone[0, -1], atol=ATOL), slot


@OPTIONS
def test_greedy_tokens_are_the_same_with_and_without_the_cache(options):
    model = tiny_gpt(**options)
    prompt = torch.randint(0, 50, (5,)).tolist()
    assert lone(model, prompt, greedy(), 40) == lone(model, prompt, greedy(), 40, use_cache=False)


def test_past_block_size_each_step_sees_the_window_it_keeps():
    """Past block_size the window restarts from the last block_size // 2 tokens; each step's
    logits equal a full forward over exactly the tokens the window holds."""
    model = tiny_gpt()
    seen = []

    class Recorded(NextToken):
        def reads_context(self):
            return True  # the context of every step, to check

        def draw(self, processed, logits, context):
            seen.append((logits, context.clone()))
            return super().draw(processed, logits, context)

    lone(model, torch.randint(0, 50, (5,)).tolist(), Recorded(Options(), greedy=True), 30)
    window = None
    for step, (logits, context) in enumerate(seen):
        n = context.size(1)
        # refilled with the last 8, then grows
        window = n if n <= 16 else 8 if window == 16 else window + 1
        expected, _ = model(context[:, -window:])
        assert torch.allclose(logits, expected[:, -1], atol=ATOL), step


@OPTIONS
@pytest.mark.parametrize("decoding", DECODING, ids=lambda d: ",".join(d))
def test_every_decoding_option_is_the_same_with_and_without_the_cache(options, decoding):
    """60 tokens of a 16-token block: several restarts of the window, seeded draws token for
    token."""
    model = tiny_gpt(**options)
    prompt = torch.randint(0, 50, (3,)).tolist()
    cached = lone(model, prompt, picks(decoding, [7])[0], 60)
    uncached = lone(model, prompt, picks(decoding, [7])[0], 60, use_cache=False)
    assert cached == uncached


def test_requests_joining_and_leaving_a_running_batch_get_their_lone_answers():
    """Four requests of different prompts, lengths, options and seeds, in an engine of 3 rows:
    the fourth waits for a slot, two join mid-way, one leaves early; each row's tokens equal what
    it gets alone."""
    model = tiny_gpt(**MODERN)
    specs = [
        ([1, 2, 3], dict(temperature=1.0), 11, 20),
        ([4, 5, 6, 7, 8, 9, 10], dict(top_k=5), 12, 9),
        ([11], dict(), 13, 25),
        ([12, 13], dict(top_p=0.9, repetition_penalty=1.3), 14, 12),
    ]
    alone = []
    for prompt, options, seed, n in specs:
        alone.append(lone(model, prompt, picks(options, [seed])[0], n))
    engine = Engine(model, rows=3)
    requests = []
    for step in range(60):
        if step in (0, 3, 5):  # the second joins at step 3, the third and fourth at step 5
            for prompt, options, seed, n in specs[len(requests) : len(requests) + 1 + (step == 5)]:
                requests.append(engine.submit(prompt, picks(options, [seed]), n))
        if not engine.busy():
            break
        engine.step()
    assert not engine.busy() and len(requests) == 4
    assert [request.rows[0].generated for request in requests] == alone


def test_n_samples_from_one_prefill_equal_n_separate_runs():
    model = tiny_gpt()
    prompt = [5, 6, 7, 8]
    options = dict(temperature=1.0, top_k=20)
    engine = Engine(model, rows=4)
    request = engine.submit(prompt, picks(options, [1, 2, 3, 4]), 30)
    while engine.busy():
        engine.step()
    separate = [lone(model, prompt, picks(options, [seed])[0], 30) for seed in (1, 2, 3, 4)]
    assert [row.generated for row in request.rows] == separate
    assert len(set(map(tuple, separate))) == 4


@pytest.mark.slow
def test_the_compiled_step_decodes_as_the_eager_one():
    """torch.compile's one-token step, its products PackedLinear's op: a row alone and
    rows of different lengths in a batch (the compiler's two graphs), past block_size, greedy
    and seeded, get the tokens the eager engine gives them, and log-probabilities within ATOL
    (the same sums in another order)."""
    specs = [
        ([1, 2, 3], dict(), 0, 40),
        ([4, 5, 6, 7, 8, 9, 10], dict(top_k=5), 12, 30),
        ([11], dict(temperature=1.0, repetition_penalty=1.3), 13, 24),
    ]
    answers = []
    for compile in (False, True):
        model = for_decoding(tiny_gpt(**MODERN), "cpu", "float32")
        engine = ServingEngine(model, rows=3, compile=compile)
        alone = engine.submit([3, 1, 4], picks({}, [1]), 40, logprobs=0)
        while engine.busy():
            engine.step()
        batch = [engine.submit(p, picks(o, [seed]), n, logprobs=0) for p, o, seed, n in specs]
        while engine.busy():
            engine.step()
        rows = [alone.rows[0]] + [request.rows[0] for request in batch]
        answers.append(rows)
    assert isinstance(model.lm_head, PackedLinear)
    for eager, compiled in zip(*answers):
        assert compiled.generated == eager.generated
        assert compiled.token_logprobs == pytest.approx(eager.token_logprobs, abs=ATOL)


@pytest.mark.slow
def test_a_compiled_step_is_traced_once_for_every_position(monkeypatch):
    """Rows in step decode through one graph, not one per position (were the new keys' place in
    the cache a constant to the compiler, each token would compile anew): the compiler's eager
    backend, a recompile an error, the tokens the eager engine's."""
    torch._dynamo.reset()
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="eager"))
    model = tiny_gpt(**MODERN)
    engine = Engine(model, rows=2, compile=True)
    with torch._dynamo.config.patch(error_on_recompile=True):
        request = engine.submit([1, 2, 3], [greedy(), greedy()], 30)
        while engine.busy():
            engine.step()
    torch._dynamo.reset()
    expected = lone(model, [1, 2, 3], greedy(), 30)
    assert [row.generated for row in request.rows] == [expected, expected]


@pytest.mark.slow
def test_int8_dynamic_compiles_as_one_graph(monkeypatch):
    """int8 x int8 products are an op the compiler calls: the one-token step traces whole
    (a graph break an error) and decodes as the eager engine."""
    torch._dynamo.reset()
    whole = functools.partial(torch.compile, backend="eager", fullgraph=True)
    monkeypatch.setattr(torch, "compile", whole)
    model = for_decoding(tiny_gpt(), "cpu", "int8_dynamic")
    engine = Engine(model, rows=1, compile=True)
    request = engine.submit([1, 2, 3], [greedy()], 20)
    while engine.busy():
        engine.step()
    torch._dynamo.reset()
    assert request.rows[0].generated == lone(model, [1, 2, 3], greedy(), 20)


# what a compiled one-row step's C++ holds and lacks, by weight format, and whether it is
# compiled ahead of time (compiled.OneRowStep: no Python between tokens)
CPP_PRODUCTS = [
    # the int8 x int8 op called from C++ itself: no Python between the step's kernels
    ("int8_dynamic", 'aoti_torch_call_dispatcher("gpt::dynamic_int8_linear"', None, False),
    # inductor's own fused sums over the int8 weights (1.58x a GPT-2 token), not torch's kernel
    ("int8", "const int8_t* in_ptr", "_weight_int8pack_mm", True),
]


@pytest.mark.slow
@pytest.mark.parametrize("weights, holds, lacks, ahead", CPP_PRODUCTS, ids=["int8_dynamic", "int8"])
def test_a_compiled_step_on_a_cpu_multiplies_in_cpp(weights, holds, lacks, ahead):
    """On a CPU the compiled step is C++ (inductor's C++ wrapper, or AOTInductor's step), its
    int8 products as CPP_PRODUCTS says, and it decodes as the eager engine, past block_size;
    its weights are the model's own tensors: a change in place is decoded with."""
    torch._dynamo.reset()
    model = for_decoding(tiny_gpt(**MODERN), "cpu", weights)
    engine, code = run_and_get_cpp_code(Engine, model, 1, compile=True)
    assert isinstance(engine.one_token, OneRowStep) == ahead
    assert holds in code
    assert lacks is None or lacks not in code
    decoded = []
    for _ in range(2):
        request = engine.submit([1, 2, 3], [greedy()], 20)
        while engine.busy():
            engine.step()
        decoded.append(request.rows[0].generated)
        assert decoded[-1] == lone(model, [1, 2, 3], greedy(), 20)
        with torch.no_grad():
            model.ln_f.weight.neg_()
    torch._dynamo.reset()
    assert decoded[0] != decoded[1]


@pytest.mark.slow
@pytest.mark.parametrize("weights", ["float32", "int8"], ids=["dynamo", "ahead_of_time"])
def test_a_compile_that_fails_is_one_line_naming_why(weights):
    """No working C++ compiler: the engine says so in one line instead of inductor's traceback,
    whether Dynamo or AOTInductor compiles its step."""
    torch._dynamo.reset()  # compile afresh: an earlier test's graph would serve this model
    settings = dict(fx_graph_cache=False, **{"cpp.cxx": ("/nonexistent/c++",)})
    with torch._inductor.config.patch(settings), pytest.raises(Error) as failed:
        Engine(for_decoding(tiny_gpt(), "cpu", weights), rows=1, compile=True)
    message = str(failed.value)
    assert "\n" not in message and "torch.compile failed" in message and "C++" in message
    torch._dynamo.reset()


def test_a_finished_row_frees_its_slot_and_zero_tokens_is_no_row():
    engine = Engine(tiny_gpt(), rows=2)
    first = engine.submit([1, 2], [greedy(), greedy()], 3)
    nothing = engine.submit([3], [greedy()], 0)
    assert engine.step() == first.rows
    first.rows[1].finish()  # a consumer that stops early
    assert engine.step() == [first.rows[0]]  # nothing joined, and took no token
    assert engine.free == [first.rows[1].slot] and nothing.done
    while engine.busy():
        engine.step()
    assert [len(row.generated) for row in first.rows] == [3, 1] and sorted(engine.free) == [0, 1]


def test_a_row_whose_decoding_fails_ends_alone_with_its_error():
    model = tiny_gpt()
    engine = Engine(model, rows=2)
    blocked = engine.submit([1, 1, 1], [NextToken(Options(no_repeat_ngram_size=1))], 60)
    fine = engine.submit([1, 2, 3], [greedy()], 60)
    took = []
    while engine.busy():
        took += engine.step()
    assert "no_repeat_ngram_size blocks every token" in blocked.rows[0].error
    assert took.count(blocked.rows[0]) == len(blocked.rows[0].generated)
    assert fine.rows[0].error is None and len(fine.rows[0].generated) == 60


def test_a_failed_step_ends_the_rows_decoding_and_the_waiting_wait_on():
    """The server's engine after a bug in a step past admitting (no request to blame): the rows
    decoding end with the message and give back their slots; a waiting request decodes after."""
    engine = ServingEngine(tiny_gpt(), rows=1)
    running = engine.submit([1, 2], [greedy()], 5)
    waiting = engine.submit([3], [greedy()], 5)
    engine.step()
    engine.fail("RuntimeError: a bug")
    assert running.done and not waiting.done and engine.free == [0]
    assert running.rows[0].error == "RuntimeError: a bug" and running.rows[0].bug
    assert len(running.rows[0].generated) == 1
    while engine.busy():
        engine.step()
    assert waiting.rows[0].error is None and len(waiting.rows[0].generated) == 5


def test_echo_scores_the_prompt_as_a_full_forward_does():
    """With echo, each prompt token's log-probability given the ones before it (None for the
    first) and the top alternatives, from the prefill every row then decodes from; asked for no
    new tokens, a request is scored and done."""
    model = tiny_gpt()
    prompt = [3, 4, 9, 1, 7]
    logits, _ = model(torch.tensor([prompt]))
    expected = torch.log_softmax(logits[0, :-1], -1)
    engine = ServingEngine(model, rows=3)
    scored = engine.submit(prompt, picks({}, [1]), 0, logprobs=2, echo=True)
    both = engine.submit(prompt, picks(dict(temperature=0.0), [1, 2]), 4, echo=True)
    while engine.busy():
        engine.step()
    assert scored.rows[0].generated == [] and scored.prompt_logprobs[0] is None
    chosen = expected.gather(1, torch.tensor(prompt[1:])[:, None])[:, 0]
    assert scored.prompt_logprobs[1:] == pytest.approx(chosen.tolist(), abs=ATOL)
    values, ids = expected.topk(2)
    assert [[t for t, _ in top] for top in scored.prompt_top_logprobs[1:]] == ids.tolist()
    assert both.prompt_logprobs[1:] == pytest.approx(chosen.tolist(), abs=ATOL)
    assert [len(row.generated) for row in both.rows] == [4, 4]


def test_logprobs_are_the_models_own():
    """The chosen token's log-probability and the top alternatives are log_softmax of the raw
    logits of a full forward over the tokens before it, whatever the decoding options."""
    model = tiny_gpt()
    engine = ServingEngine(model, rows=1)
    request = engine.submit([3, 4], picks(dict(temperature=2.0, top_k=4), [5]), 6, logprobs=3)
    while engine.busy():
        engine.step()
    row = request.rows[0]
    for i, token in enumerate(row.generated):
        logits, _ = model(torch.tensor([row.tokens[: 2 + i]]))
        expected = torch.log_softmax(logits[0, -1], -1)
        assert row.token_logprobs[i] == pytest.approx(expected[token].item(), abs=ATOL)
        values, ids = expected.topk(3)
        assert [t for t, _ in row.top_logprobs[i]] == ids.tolist()


def tied_top_two():
    """A GPT whose every next-token logit is 0 but for token 3 (1.0) and token 5 (1.001): its final
    norm (weight 0, bias e) sends every position to e, and the tied head's rows 3 and 5 point along
    e. bfloat16 rounds both logits to 1.0 (its spacing there is 2^-7); float32 keeps token 5
    ahead."""
    model = GPT(GPTConfig(**{**TINY, "bias": True})).eval()
    e = torch.zeros(16)
    e[0] = 1.0
    with torch.no_grad():
        model.ln_f.weight.zero_()
        model.ln_f.bias.copy_(e)
        model.wte.weight.zero_()
        model.wte.weight[3] = e
        model.wte.weight[5] = 1.001 * e
    return model


@pytest.mark.parametrize(
    "pick",
    [dict(greedy=True), dict(top_k=1), dict(temperature=0.0), dict(top_p=1e-6)],
    ids=["greedy", "top_k=1", "temperature=0", "tiny top_p"],
)
def test_bfloat16_weights_decode_from_float32_logits(pick):
    """With the body in bfloat16 the head stays float32: token 5 wins every step, whichever of
    the rules that mean "the most likely token" picks it."""
    model = for_decoding(tied_top_two(), "cpu", "bfloat16")
    assert model.blocks[0].ln_1.weight.dtype == torch.bfloat16  # packed or not
    greedy_pick = pick.pop("greedy", False)
    next_token = NextToken(Options(**pick), greedy_pick, torch.Generator().manual_seed(0))
    assert lone(model, [1, 2, 3], next_token, 20) == [5] * 20


def test_auto_is_bfloat16_where_the_cpu_multiplies_it_natively_else_int8(monkeypatch):
    monkeypatch.setattr(formats, "native_bf16", lambda device: True)
    assert resolve_weights("auto", "cpu") == "bfloat16"
    monkeypatch.setattr(formats, "native_bf16", lambda device: False)
    assert resolve_weights("auto", "cpu") == "int8"
    assert resolve_weights("float32", "cpu") == "float32"


@pytest.mark.skipif(
    not formats.onednn_multiplies("bfloat16"),
    reason="this CPU's oneDNN multiplies no bfloat16 (it needs AVX-512)",
)
def test_bfloat16_packs_the_body_in_bfloat16_and_the_head_in_float32():
    model = for_decoding(tiny_gpt(), "cpu", "bfloat16")
    assert isinstance(model.blocks[0].mlp.fc, PackedLinear)
    assert model.blocks[0].mlp.fc.packed.dtype == torch.bfloat16
    assert model.lm_head.packed.dtype == torch.float32


def test_packed_weights_keep_the_logits_and_the_greedy_tokens():
    """oneDNN's products over the packed layout: the same sums in another order (ATOL), for a
    prefill of 9 positions in 2 rows and for one-token steps; the head packs a copy, and the
    token table it is tied to still looks tokens up."""
    idx = torch.randint(0, 50, (2, 9))
    before, _ = tiny_gpt()(idx)
    model = for_decoding(tiny_gpt(), "cpu", "float32")
    assert isinstance(model.blocks[0].attn.qkv, PackedLinear)
    assert isinstance(model.lm_head, PackedLinear)
    after, _ = model(idx)
    assert (after - before).abs().max() <= ATOL
    assert lone(model, [1, 2], greedy(), 30) == lone(tiny_gpt(), [1, 2], greedy(), 30)


def test_int8_weights_stay_within_their_rounding():
    """Per-channel int8: each weight moves by at most half a step, scale / 2 = max|w| / 254, so a
    row's output moves by at most sum |x_j| max|w| / 254 (plus bfloat16's rounding of x and y,
    2^-8 relative each), for any number of inputs and outputs: the kernel reads 16 inputs at a
    time, and a width of 24 or 40 (n_embd 30 too) reads past its rows."""
    torch.manual_seed(0)
    for n_in in range(1, 130):
        for n_out in (1, 3, 16, 17):
            linear = nn.Linear(n_in, n_out)
            x = torch.randn(5, n_in)
            exact = linear(x)
            bound = x.abs().sum(-1, keepdim=True) * linear.weight.abs().amax(1) / 254
            bound = bound + 2 * 2**-8 * (x.abs() @ linear.weight.abs().t() + exact.abs())
            error = (Int8Linear(linear)(x) - exact).abs()
            assert (error <= bound).all(), (n_in, n_out)
    model = for_decoding(tiny_gpt(n_embd=30), "cpu", "int8")
    assert isinstance(model.lm_head, Int8Linear)
    assert len(lone(model, [1, 2], greedy(), 20)) == 20


def test_a_row_of_fused_int8_products_is_the_kernels_sums_in_another_order():
    """fused_row_products (a compiled one-row step's int8 product) against
    _weight_int8pack_mm: the same float32 sums in another order, without the kernel's bfloat16
    rounding of each output (2^-8 relative); a reordered sum of n products moves by at most n
    float32 ulps of the sum of their magnitudes."""
    import torch._inductor.inductor_prims  # noqa: F401 (its prims, loaded under compile)

    torch.manual_seed(0)
    for n_in, n_out in ((16, 3), (30, 17), (128, 64)):
        layer = Int8Linear(nn.Linear(n_in, n_out))
        weight, scales = layer.weight_int8, layer.scales
        row = torch.randn(1, weight.size(1)).to(torch.bfloat16)
        kernel = torch._weight_int8pack_mm(row, weight, scales).float()
        fused = formats.fused_row_products(row, weight, scales)
        magnitudes = row.float().abs() @ (weight.float().abs() * scales.float()[:, None]).T
        bound = 2**-8 * kernel.abs() + weight.size(1) * 2**-23 * magnitudes
        assert ((fused - kernel).abs() <= bound).all(), (n_in, n_out)


def test_waiting_requests_take_turns_by_client():
    """An engine of 2 rows; client a asks for 4 rows of 6 tokens, then client b for one of 2.
    First come, first served, b would wait for three of a's (done at step 14); taking turns, it
    joins at the first step beside a's first row, and every row still gets its lone tokens."""
    model = tiny_gpt()
    engine = ServingEngine(model, rows=2)
    a = [engine.submit([1, 2], [greedy()], 6, client="a") for _ in range(4)]
    b = engine.submit([3], [greedy()], 2, client="b")
    engine.step()
    assert [request.rows[0].slot for request in (a[0], b)] == [0, 1]
    engine.step()
    assert b.done and b.rows[0].generated == lone(model, [3], greedy(), 2)
    while engine.busy():
        engine.step()
    assert [request.rows[0].generated for request in a] == [lone(model, [1, 2], greedy(), 6)] * 4


def test_a_float32_row_is_the_same_alone_and_beside_others():
    """What docs/generation.md says of the batch: in float32 (oneDNN's packed products on a CPU) a
    sampled row's tokens are the ones it gets alone, and its log-probabilities differ only by
    the reordered sums' rounding: a log-softmax moves by at most twice its logits' largest
    change, 2 * ATOL. bfloat16 and int8 round each product to bfloat16, where a reordered sum
    can end one bfloat16 step apart (BENCHMARKS.md)."""
    model = for_decoding(tiny_gpt(), "cpu", "float32")
    options = dict(temperature=0.9, top_k=20)
    engine = ServingEngine(model, rows=1)
    alone = engine.submit([5, 6], picks(options, [7]), 12, logprobs=0)
    while engine.busy():
        engine.step()
    engine = ServingEngine(model, rows=12)
    for i in range(11):
        engine.submit([1 + i, 2], picks(options, [100 + i]), 12)
    beside = engine.submit([5, 6], picks(options, [7]), 12, logprobs=0)
    while engine.busy():
        engine.step()
    assert beside.rows[0].generated == alone.rows[0].generated
    found = torch.tensor(beside.rows[0].token_logprobs)
    expected = torch.tensor(alone.rows[0].token_logprobs)
    torch.testing.assert_close(found, expected, rtol=0, atol=2 * ATOL)
