"""auto by measurement (lib/autotune.py): the fastest option chosen, remembered per machine,
torch version and shape; a damaged file measured again; explicit formats untouched."""

import copy
import gc
import inspect
import json

import pytest
import torch
from test_engine import tiny_gpt

from lib import autotune, formats
from lib.common import Error
from lib.formats import DynamicInt8Linear, Int8Linear


def fake(seconds, calls):
    """A measure that returns seconds and counts its calls."""

    def measure(options):
        calls.append(options)
        return {option: seconds[option] for option in options}

    return measure


def test_the_fastest_option_is_chosen_and_said_in_one_line(monkeypatch):
    lines = []
    monkeypatch.setattr(autotune, "log", lines.append)
    calls = []
    chosen = autotune.choose(
        "dtype", "a", fake({"float32": 1.0, "bfloat16": 1.25}, calls), ("float32", "bfloat16")
    )
    assert chosen == "float32"
    assert lines == ["dtype auto -> float32: bfloat16 1.25x slower here (measured)"]
    timings = {"float32": 2.0, "bfloat16": 1.0, "int8": 0.5}
    assert autotune.choose("weights", "a", fake(timings, calls), tuple(timings)) == "int8"


def test_a_measurement_is_remembered_per_shape_torch_version_and_cpu(
    monkeypatch, tmp_path, autotune_cache
):
    calls = []
    measure = fake({"float32": 2.0, "bfloat16": 1.0}, calls)
    options = ("float32", "bfloat16")
    assert autotune.choose("dtype", "shape 1", measure, options) == "bfloat16"
    assert autotune.choose("dtype", "shape 1", measure, options) == "bfloat16"
    assert len(calls) == 1  # read back
    assert any("shape 1" in key for key in json.loads(autotune_cache.read_text()))
    autotune.choose("dtype", "shape 2", measure, options)
    assert len(calls) == 2
    monkeypatch.setattr(torch, "__version__", "9.9.9")
    autotune.choose("dtype", "shape 1", measure, options)
    assert len(calls) == 3
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("model name\t: Another CPU\nflags\t\t: fpu avx2\n")
    monkeypatch.setattr(autotune, "CPUINFO", str(cpuinfo))
    autotune.choose("dtype", "shape 1", measure, options)
    assert len(calls) == 4
    autotune.choose("dtype", "shape 1", measure, options)
    assert len(calls) == 4


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", '{"x": 1}', "\x00\x01"])
def test_a_damaged_cache_is_measured_again(monkeypatch, tmp_path, text):
    path = tmp_path / "deep" / "autotune.json"
    monkeypatch.setenv(autotune.ENV, str(path))
    calls = []
    measure = fake({"float32": 1.0, "bfloat16": 2.0}, calls)
    autotune.choose("dtype", "s", measure, ("float32", "bfloat16"))
    path.write_text(text)
    assert autotune.choose("dtype", "s", measure, ("float32", "bfloat16")) == "float32"
    assert len(calls) == 2
    # an entry of other options, or of no numbers
    key = next(iter(json.loads(path.read_text())))
    for entry in ({"float32": 1.0}, {"float32": "fast", "bfloat16": 1.0}, [1.0]):
        path.write_text(json.dumps({key: entry}))
        autotune.choose("dtype", "s", measure, ("float32", "bfloat16"))
    assert len(calls) == 5


def test_the_cache_goes_under_xdg_cache_home_unless_the_variable_names_a_file(monkeypatch):
    monkeypatch.setenv(autotune.ENV, "/somewhere/t.json")
    assert autotune.cache_path() == "/somewhere/t.json"
    monkeypatch.delenv(autotune.ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", "/xdg")
    assert autotune.cache_path() == "/xdg/gpt-starter/autotune.json"


def refuse(*args):
    raise AssertionError("measured, for a format the caller named")


@pytest.mark.parametrize("weights", ["float32", "bfloat16", "int8", "int8_dynamic"])
def test_an_explicit_format_is_never_measured_or_changed(monkeypatch, weights):
    monkeypatch.setattr(autotune, "choose", refuse)
    model = formats.for_decoding(tiny_gpt(), "cpu", weights)
    assert model.weights_format == weights


def test_auto_takes_the_measured_format(monkeypatch):
    monkeypatch.setattr(autotune, "choose", lambda what, shape, measure, options: "int8")
    model = formats.for_decoding(tiny_gpt(), "cpu")
    assert model.weights_format == "int8" and isinstance(model.lm_head, Int8Linear)


@pytest.mark.parametrize(
    "choice, dtype, in_float32",
    [
        ("float32", "float32", False),
        ("bfloat16", "bfloat16", False),
        (autotune.FLOAT32_ATTENTION, "bfloat16", True),
    ],
)
def test_the_training_choice_sets_the_dtype_and_the_attention(
    monkeypatch, choice, dtype, in_float32
):
    """bfloat16 with its attention in float32 is one of the options timed: a run takes both."""
    asked = []

    def chosen(what, shape, measure, options):
        asked.append(options)
        return choice

    monkeypatch.setattr(autotune, "choose", chosen)
    model = tiny_gpt(n_layer=2)
    batch = {"idx": torch.zeros(4, 8, dtype=torch.long), "targets": torch.ones(4, 8).long()}
    assert autotune.training_dtype(model, batch) == dtype
    assert asked == [("float32", "bfloat16", autotune.FLOAT32_ATTENTION)]
    assert [b.attn.float32_attention for b in model.blocks] == [in_float32] * 2


def test_a_real_measurement_leaves_the_model_as_it_was():
    """Decoding's and training's timings (untimed here) run copies or restore what they touch."""
    model = tiny_gpt()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    chosen = autotune.decoding_weights(model, formats.WEIGHTS[1:], formats.for_decoding)
    assert chosen in formats.WEIGHTS
    model.train()
    batch = {"idx": torch.zeros(4, 8, dtype=torch.long), "targets": torch.ones(4, 8).long()}
    state = torch.random.get_rng_state()
    assert autotune.training_dtype(model, batch) in ("float32", "bfloat16")
    assert torch.equal(torch.random.get_rng_state(), state)
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_dynamic_int8_stays_near_float32():
    """Weights and inputs each within half an int8 step: the product within a few percent."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 32)
    x = torch.randn(3, 64)
    exact = linear(x)
    error = (DynamicInt8Linear(linear)(x) - exact).abs().max()
    assert error < 0.05 * exact.abs().max()
    model = formats.for_decoding(tiny_gpt(), "cpu", "int8_dynamic")
    assert isinstance(model.lm_head, DynamicInt8Linear)
    assert model(torch.zeros(1, 4, dtype=torch.long))[0].isfinite().all()


def test_a_copy_of_dynamic_int8_decodes_after_its_original_is_gone():
    """The compiled op finds a layer by its key: a deep copy holds one of its own."""
    torch.manual_seed(0)
    layer = DynamicInt8Linear(torch.nn.Linear(64, 32))
    twin = copy.deepcopy(layer)
    x = torch.randn(3, 64)
    expected = layer(x)
    del layer
    gc.collect()
    assert torch.equal(formats.dynamic_int8_linear(x, twin.key, 32), expected)


def test_the_compiled_int8_op_runs_its_kernel_with_no_python_of_torch_between(monkeypatch):
    """The op a compiled step calls is the dispatcher's straight to int8_products: no
    torch.library.custom_op wrapper (5.7 us a call) in between."""
    callers = []

    def products(x, packed):
        callers.extend(frame.filename for frame in inspect.stack()[1:3])
        return torch.ops.quantized.linear_dynamic(x, packed, True)

    monkeypatch.setattr(formats, "int8_products", products)
    layer = DynamicInt8Linear(torch.nn.Linear(64, 32))
    formats.dynamic_int8_linear(torch.randn(3, 64), layer.key, 32)
    # the kernel, then the op's call (torch/_ops.py): no wrapper of torch/_library between
    assert callers == [formats.__file__, torch._ops.__file__]


def test_a_dynamic_int8_product_asks_its_packed_weights_for_nothing(monkeypatch):
    """torch asks an op's arguments for __torch_function__; the packed weights, a TorchScript
    object, answer by a C++ exception a call. int8_products calls with the asking off."""
    asked = []
    lookup = torch.ScriptObject.__getattr__

    def spy(self, name):
        asked.append(name)
        return lookup(self, name)

    layer = DynamicInt8Linear(torch.nn.Linear(64, 32))
    x = torch.randn(3, 64)
    expected = torch.ops.quantized.linear_dynamic(x, layer.packed, True)
    monkeypatch.setattr(torch.ScriptObject, "__getattr__", spy)
    assert torch.equal(formats.int8_products(x, layer.packed), expected)
    assert asked == []
    torch.ops.quantized.linear_dynamic(x, layer.packed, True)
    assert asked == ["__torch_function__"]  # what the spy sees without the asking off


def test_dynamic_int8_is_refused_off_the_cpu():
    with pytest.raises(Error, match="on a CPU only"):
        formats.resolve_weights("int8_dynamic", "cuda:0")
