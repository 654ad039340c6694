"""Each decoding strategy against its definition, on cases small enough to work out by hand (in the
comments)."""

import math

import pytest
import torch
from conftest import generate

import decoding as d
from lib.common import Error
from model import GPT, GPTConfig

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors: one thread

INF = float("inf")


def make_next_token(greedy=False, generator=None, **options):
    """NextToken for the options named (the rest stay off)."""
    return d.NextToken(d.Options(**options), greedy, generator)


def T(*rows):  # logits, one row per argument
    return torch.tensor(rows, dtype=torch.float32)


def C(*rows):  # contexts
    return torch.tensor(rows, dtype=torch.long)


def draw(next_token, logits, context, n=20000):
    """Frequencies of each token over n draws (the row repeated n times: one batched call)."""
    tokens = next_token(logits.expand(n, -1), context.expand(n, -1))
    return torch.bincount(tokens, minlength=logits.size(-1)).float() / n


def test_counts_with_repeated_tokens():
    # row 0: token 2 three times, token 0 once; row 1: token 3 twice, token 1 twice
    assert torch.equal(
        d.token_counts(torch.zeros(2, 4), C([2, 0, 2, 2], [3, 1, 1, 3])),
        T([1, 0, 3, 0], [0, 2, 0, 2]),
    )


def test_frequency_and_presence_penalties():
    logits, context = T([1, 1, 1, 1], [1, 1, 1, 1]), C([2, 0, 2, 2], [3, 1, 1, 3])
    # frequency, a = 0.5: 1 - 0.5 * count; counts [1, 0, 3, 0] and [0, 2, 0, 2]
    assert torch.equal(
        d.frequency_penalty(logits, context, 0.5), T([0.5, 1, -0.5, 1], [1, 0, 1, 0])
    )
    # presence, b = 0.5: 1 - 0.5 once per seen token, however often it was seen
    assert torch.equal(
        d.presence_penalty(logits, context, 0.5), T([0.5, 1, 0.5, 1], [1, 0.5, 1, 0.5])
    )
    # negative values reward repetition (OpenAI allows -2..2): 1 + 0.5 * 3 = 2.5
    assert d.frequency_penalty(logits, context, -0.5)[0, 2] == 2.5
    assert torch.equal(logits, T([1, 1, 1, 1], [1, 1, 1, 1]))  # pure: the input is untouched


def test_repetition_penalty_divides_positive_and_multiplies_negative():
    logits, context = T([2, -2, 3, -1, 0]), C([0, 1, 1, 4])  # seen: 0, 1 (twice), 4
    # r = 2: 2 / 2 = 1; -2 * 2 = -4 (the count does not matter); 3 and -1 unseen; 0 stays 0
    assert torch.equal(d.repetition_penalty(logits, context, 2.0), T([1, -4, 3, -1, 0]))
    # r = 0.5 < 1 encourages: 2 / 0.5 = 4, -2 * 0.5 = -1
    assert torch.equal(d.repetition_penalty(logits, context, 0.5), T([4, -1, 3, -1, 0]))


@pytest.mark.parametrize(
    "n, banned",
    [
        (1, [1, 2, 3]),  # every token seen so far
        (2, [3]),  # the last token is 2; bigrams starting with 2: (2, 3) -> ban 3
        (3, [3]),  # the last two are (1, 2); trigrams starting with (1, 2): (1, 2, 3) -> ban 3
        # the last three are (3, 1, 2); the 4-grams start (1, 2, 3) and (2, 3, 1): no match
        (4, []),
        # the only 5-gram is the whole context; it starts (1, 2, 3, 1), the last four are
        # (2, 3, 1, 2)
        (5, []),
        (6, []),  # longer than the context: no n-gram at all
    ],
)
def test_no_repeat_ngram(n, banned):
    out = d.no_repeat_ngram(torch.zeros(1, 6), C([1, 2, 3, 1, 2]), n)
    assert torch.isinf(out[0]).nonzero().flatten().tolist() == banned
    assert (out[0][banned] == -INF).all()


def test_no_repeat_ngram_blocks_prompt_ngrams_per_row():
    # row 0: prompt (4, 5), generated (0, 4): the next 5 would repeat the prompt's bigram (4, 5)
    # row 1: (4, 0, 0, 4): bigrams after 4 are (4, 0): ban 0; 5 is free
    out = d.no_repeat_ngram(torch.zeros(2, 6), C([4, 5, 0, 4], [4, 0, 0, 4]), 2)
    assert torch.isinf(out).nonzero().tolist() == [[0, 5], [1, 0]]
    # the same prefix twice followed by the same token: one ban, not an error; a repeated prefix
    # with two followers bans both: (7, 1), (7, 2), last token 7 -> ban 1 and 2
    out = d.no_repeat_ngram(torch.zeros(1, 8), C([7, 1, 7, 2, 7]), 2)
    assert torch.isinf(out[0]).nonzero().flatten().tolist() == [1, 2]


def test_temperature():
    logits = T([2, 4, -6])
    assert torch.equal(d.temperature(logits, 2.0), T([1, 2, -3]))
    # t = 0.5 squares the probabilities (then renormalises):
    # p = [0.5, 0.25, 0.25] -> [0.25, 1/16, 1/16] / 0.375
    p = torch.softmax(d.temperature(T([0.5, 0.25, 0.25]).log(), 0.5), -1)
    assert torch.allclose(p, T([2 / 3, 1 / 6, 1 / 6]))


def test_top_k():
    assert torch.equal(d.top_k(T([3, 1, 2, 0]), 2), T([3, -INF, 2, -INF]))
    # ties at the k-th value are all kept (Hugging Face's rule): k = 2 on [3, 2, 2, 1] keeps three
    # tokens
    assert torch.equal(d.top_k(T([3, 2, 2, 1]), 2), T([3, 2, 2, -INF]))
    assert torch.equal(
        d.top_k(T([2, 2, 1]), 1), T([2, 2, -INF])
    )  # a tie for first place: both stay
    for k in (4, 100):  # k >= vocab keeps all
        assert torch.equal(d.top_k(T([3, 1, 2, 0]), k), T([3, 1, 2, 0]))
    # row by row: each row keeps its own two best
    assert torch.equal(d.top_k(T([0, 1, 2], [2, 1, 0]), 2), T([-INF, 1, 2], [2, 1, -INF]))


# probabilities 0.125, 0.5, 0.125, 0.25: sorted 0.5, 0.25, 0.125, 0.125;
# running sums 0.5, 0.75, 0.875, 1
NUCLEUS = T([0.125, 0.5, 0.125, 0.25]).log()


@pytest.mark.parametrize(
    "p, kept",
    [
        (0.1, [1]),  # 0.5 >= 0.1 already: the top token alone
        (0.4, [1]),
        (0.6, [1, 3]),  # 0.5 < 0.6 <= 0.75
        (0.8, [0, 1, 2, 3]),  # 0.75 < 0.8 needs one 0.125; the two are tied, both stay
        (1.0, [0, 1, 2, 3]),  # p = 1 keeps everything
    ],
)
def test_top_p(p, kept):
    out = d.top_p(NUCLEUS, p)
    assert torch.isfinite(out[0]).nonzero().flatten().tolist() == kept
    assert torch.equal(out[0][kept], NUCLEUS[0][kept])  # kept logits are untouched


def test_top_p_keeps_everything_at_one_and_the_top_token_always():
    tiny = T(
        [10, -10, -10, -30]
    )  # the tail's probabilities underflow the float sum; p = 1 still keeps it
    assert torch.equal(d.top_p(tiny, 1.0), tiny)
    assert torch.isfinite(
        d.top_p(T([0, 0, 0, 0]), 1e-6)
    ).all()  # four tied at 0.25: all are "the top token"
    # after top-k, -inf tokens have probability 0: kept = 0.5 / 0.75 = 2/3 of what is left, so
    # p = 0.6 keeps one
    assert torch.isfinite(d.top_p(d.top_k(NUCLEUS, 2), 0.6)[0]).nonzero().flatten().tolist() == [1]


def test_greedy_and_temperature_zero_take_the_argmax_of_the_penalised_logits():
    logits, context = T([3, 2.5, 0]), C([0, 0])
    # frequency 0.5: 3 - 0.5 * 2 = 2 < 2.5, so token 1 wins; temperature, top-k and top-p cannot
    # change that
    for kw in (dict(greedy=True, temperature=5.0, top_k=1), dict(temperature=0.0, top_p=0.01)):
        assert make_next_token(frequency_penalty=0.5, **kw)(logits, context).tolist() == [1]
    assert make_next_token(greedy=True)(logits, context).tolist() == [0]


def test_sampling_frequencies_match_the_filtered_distribution():
    g = torch.Generator().manual_seed(0)
    # top_p 0.6 keeps 0.5 and 0.25: renormalised 2/3 and 1/3 (20,000 draws: one standard deviation
    # is 0.003)
    freq = draw(make_next_token(top_p=0.6, generator=g), NUCLEUS, C([0]))
    assert torch.allclose(freq, T([0, 2 / 3, 0, 1 / 3])[0], atol=0.02)
    # temperature 0.5 squares: [1/64, 1/4, 1/64, 1/16] / (22/64) = [1/22, 16/22, 1/22, 4/22]
    freq = draw(make_next_token(temperature=0.5, generator=g), NUCLEUS, C([0]))
    assert torch.allclose(freq, T([1, 16, 1, 4])[0] / 22, atol=0.02)


def test_all_strategies_together_in_the_documented_order():
    logits, context = T([2, 1, 3, 0.5, -1]), C([0, 2, 0])  # counts [2, 0, 1, 0, 0]
    next_token = make_next_token(
        frequency_penalty=0.5,
        presence_penalty=0.5,
        repetition_penalty=2.0,
        no_repeat_ngram_size=2,
        temperature=0.5,
        top_k=3,
        top_p=0.8,
        generator=torch.Generator().manual_seed(0),
    )
    # frequency 0.5 * counts:      [1,    1,   2.5,  0.5, -1]
    # presence 0.5 on 0 and 2:     [0.5,  1,   2,    0.5, -1]
    # repetition 2 on 0 and 2:     [0.25, 1,   1,    0.5, -1]   (positive: divided)
    # no-repeat bigrams: last token 0, bigram (0, 2) seen: ban 2
    #                              [0.25, 1,  -inf,  0.5, -1]
    # temperature 0.5:             [0.5,  2,  -inf,  1,   -2]
    # top-k 3 keeps 2, 1, 0.5:     [0.5,  2,  -inf,  1,  -inf]
    # top-p 0.8: probabilities e^2, e^1, e^0.5 / 11.756 = 0.629, 0.231, 0.140;
    # 0.629 + 0.231 = 0.860 >= 0.8
    #                              [-inf, 2,  -inf,  1,  -inf]
    assert torch.equal(next_token.process(logits, context), T([-INF, 2, -INF, 1, -INF]))
    e = math.e
    freq = draw(next_token, logits, context)
    assert torch.allclose(
        freq, T([0, e / (e + 1), 0, 1 / (e + 1), 0])[0], atol=0.02
    )  # 0.731, 0.269
    # greedy uses the penalised, blocked logits: argmax of [0.25, 1, -inf, 0.5, -1] -> 1 (3 was the
    # raw argmax's 2)
    greedy = make_next_token(
        frequency_penalty=0.5,
        presence_penalty=0.5,
        repetition_penalty=2.0,
        no_repeat_ngram_size=2,
        greedy=True,
    )
    assert greedy(logits, context).tolist() == [1]


@pytest.mark.parametrize("greedy", [True, False], ids=["greedy", "sampled"])
def test_logits_without_a_softmax_are_an_error_greedy_or_not(greedy):
    """NaN, +inf or every logit -inf leave no distribution, greedy (which reads the argmax's
    logit alone) as sampled; some logits -inf leave one."""
    pick = make_next_token(greedy=greedy, generator=torch.Generator().manual_seed(0))
    inf = float("inf")
    for bad in ([0.0, float("nan"), 1.0], [0.0, inf, 1.0], [-inf, -inf, -inf]):
        with pytest.raises(Error, match="the model's logits are not finite numbers"):
            pick(T(bad), C([0]))
    assert pick(T([-inf, 2.0, -inf]), C([0])).tolist() == [1]


def test_defaults_change_nothing_and_every_blocked_token_is_an_error():
    logits = torch.randn(3, 7)
    assert torch.equal(make_next_token().process(logits, C([1, 2], [3, 3], [0, 6])), logits)
    with pytest.raises(Error, match="no_repeat_ngram_size blocks every token"):
        make_next_token(no_repeat_ngram_size=1)(torch.zeros(1, 2), C([0, 1]))
    # 1 / 1e-300 is inf in float32; the message names the option at fault
    with pytest.raises(Error, match="^temperature overflows the logits"):
        make_next_token(temperature=1e-300)(torch.ones(1, 3), C([0]))
    # a seen token's positive logit / 1e-300 is inf in float32
    with pytest.raises(Error, match="^repetition_penalty overflows the logits"):
        make_next_token(repetition_penalty=1e-300)(torch.ones(1, 3), C([0]))


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(temperature=-0.1), r"temperature=-0.1: must be >= 0"),
        (dict(top_k=-1), r"top_k=-1: must be >= 0"),
        (dict(top_k=2.0), r"top_k=2.0: must be int"),
        (dict(temperature=True), r"temperature=True: must be float"),
        (dict(frequency_penalty=2.5), r"frequency_penalty=2.5: must be <= 2"),
        (dict(presence_penalty=-3), r"presence_penalty=-3.0: must be >= -2"),
        (dict(temperature=10**400), r"temperature=inf: must be a finite number"),
        (dict(top_p=0.0), r"top_p=0.0: must be > 0"),
        (dict(top_p=1.5), r"top_p=1.5: must be <= 1"),
        (dict(repetition_penalty=0.0), r"repetition_penalty=0.0: must be > 0"),
        (dict(no_repeat_ngram_size=-1), r"no_repeat_ngram_size=-1: must be >= 0"),
        (
            dict(frequency_penalty=float("nan")),
            r"frequency_penalty=nan: must be a finite number",
        ),
        (dict(temperature=float("inf")), r"temperature=inf: must be a finite number"),
    ],
)
def test_out_of_range_values_raise(kw, message):
    with pytest.raises(Error, match=message):
        make_next_token(**kw)


def test_with_the_engine():
    torch.manual_seed(0)
    model = GPT(
        GPTConfig(vocab_size=50, block_size=64, n_layer=1, n_head=2, n_embd=16, bias=True)
    ).eval()
    prompts = torch.randint(0, 50, (2, 4)).tolist()

    def rows(pick):
        steps = list(generate(model, prompts, 20, [pick, pick]))
        return [prompt + [step[i] for step in steps] for i, prompt in enumerate(prompts)]

    def repeats(row):  # bigrams seen before
        return len(row) - 1 - len(set(zip(row, row[1:])))

    plain = rows(make_next_token(greedy=True))
    # a random model's greedy text loops...
    assert any(repeats(row) for row in plain)
    # ... and never repeats a bigram when told not to
    blocked = rows(make_next_token(greedy=True, no_repeat_ngram_size=2))
    assert not any(repeats(row) for row in blocked)


def test_a_seeded_generator_gives_the_same_draws():
    """(On a GPU a CPU generator draws on the CPU: the same seed gives the same tokens on any
    device.)"""
    logits = torch.randn(4, 50)

    def draw():
        return make_next_token(generator=torch.Generator().manual_seed(3))(
            logits, C([1], [2], [3], [4])
        )

    assert torch.equal(draw(), draw())


def test_rows_that_share_options_pick_as_one_batch_each_with_its_own_draws(monkeypatch):
    """pick_tokens gives each row what its own NextToken gives it alone, draws included, while the
    options run once per group of rows that share them; the context tensor is built only for
    options that read it, and an error stays in its row."""
    torch.manual_seed(0)
    logits = torch.randn(5, 12)
    contexts = [[1, 2, 3], [4, 5, 6], [7, 8], [1, 1, 1], [2, 3]]
    sampled = d.Options(temperature=0.9, top_p=0.8)
    penalised = d.Options(frequency_penalty=1.0, top_k=3)
    overflowing = d.Options(temperature=1e-300)
    specs = [sampled, sampled, penalised, overflowing, penalised]

    def picks():
        return [
            d.NextToken(o, False, torch.Generator().manual_seed(i)) for i, o in enumerate(specs)
        ]

    alone = []
    for pick, row, context in zip(picks(), logits, contexts):
        try:
            alone.append(int(pick(row[None], torch.tensor([context]))))
        except Error as e:
            alone.append(str(e))
    calls = []
    process = d.NextToken.process

    def counted(self, logits, context):
        calls.append((len(logits), context is not None))
        return process(self, logits, context)

    monkeypatch.setattr(d.NextToken, "process", counted)
    batched = d.pick_tokens(picks(), logits, contexts)
    assert [t if isinstance(t, int) else str(t) for t in batched] == alone
    assert "temperature overflows the logits" in alone[3] and isinstance(alone[4], int)
    # the two sampled rows in one call without a context, the two penalised ones (of one length)
    # in one with theirs, the overflowing row alone
    assert sorted(calls) == [(1, False), (2, False), (2, True)]
