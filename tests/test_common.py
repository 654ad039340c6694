"""common.py: the one dtype rule, device errors, atomic writes, the peak MFU is measured against;
lib/options.py's flags, the scripts' one way to declare a flag."""

import os

import pytest
import torch

from lib import common, distributed, formats, records
from lib.common import ArgumentParser, Error
from lib.files import atomic_path
from lib.options import Option, flags


@pytest.mark.parametrize(
    "device, native, expected",
    [
        ("cuda:0", True, "bfloat16"),  # compute capability 8.0 and up: A100, H100, RTX 30xx
        ("cuda:0", False, "float16"),  # T4, V100, RTX 20xx: bf16 only emulated there
        ("cpu", True, "bfloat16"),  # AMX or AVX-512 BF16
        ("cpu", False, "float32"),
        ("mps", False, "float32"),
    ],
)
def test_dtype_and_weights_auto_follow_one_bfloat16_rule(monkeypatch, device, native, expected):
    monkeypatch.setattr(distributed, "native_bf16", lambda device: native)
    monkeypatch.setattr(formats, "native_bf16", lambda device: native)
    assert distributed.resolve_dtype("auto", device) == expected
    on_cpu = "int8" if device == "cpu" else "float32"
    assert formats.resolve_weights("auto", device) == ("bfloat16" if native else on_cpu)
    assert formats.resolve_weights("int8", device) == "int8"


def test_a_gpu_that_only_emulates_bfloat16_is_not_native(monkeypatch):
    monkeypatch.setattr(
        torch.cuda, "is_bf16_supported", lambda including_emulation=True: including_emulation
    )
    assert not common.native_bf16("cuda:0")
    assert not common.native_bf16("mps")


def test_resolve_dtype_refuses_what_the_device_cannot_run():
    with pytest.raises(
        Error, match="dtype=float16 needs a CUDA GPU; on cpu use bfloat16 or float32"
    ):
        distributed.resolve_dtype("float16", "cpu")
    with pytest.raises(
        Error, match="dtype must be auto, float32, bfloat16 or float16, got 'float8'"
    ):
        distributed.resolve_dtype("float8", "cpu")
    assert distributed.resolve_dtype("auto", "cpu") == (
        "bfloat16" if common.native_bf16("cpu") else "float32"
    )


def test_explicit_bfloat16_on_a_gpu_without_bfloat16_matmuls_is_refused(monkeypatch):
    """A T4 or V100 emulates bfloat16 (slowly, and compile skips it): dtype=bfloat16 there is one
    clear line."""
    monkeypatch.setattr(
        torch.cuda, "is_bf16_supported", lambda including_emulation=True: including_emulation
    )
    with pytest.raises(Error, match="dtype=bfloat16: this GPU has no bfloat16 matmuls"):
        distributed.resolve_dtype("bfloat16", "cuda:0")


@pytest.mark.parametrize(
    "name, peak",
    [
        ("NVIDIA H100 80GB HBM3", 989e12),
        ("NVIDIA H100 PCIe", 756e12),
        ("NVIDIA H200", 989e12),
        ("NVIDIA A100-SXM4-80GB", 312e12),
        ("NVIDIA A10", 125e12),
        ("NVIDIA A10G", None),
        ("NVIDIA L4", 121e12),
        ("NVIDIA L40S", 362e12),
        ("NVIDIA GeForce RTX 4090", 165e12),
        ("Tesla T4", None),
    ],
)
def test_datasheet_peaks_match_whole_names(name, peak):
    """An A10G is not an A10, nor an L40S an L4, nor an H100 PCIe the SXM H100: an unknown device
    has no peak, and no MFU."""
    assert records.datasheet_peak(name) == peak


def test_atomic_path_replaces_whole_or_not_at_all(tmp_path):
    target = tmp_path / "state.pt"
    target.write_text("old")
    with pytest.raises(KeyboardInterrupt):
        with atomic_path(str(target)) as tmp:
            open(tmp, "w").write("half")
            raise KeyboardInterrupt
    # no temporary left behind
    assert target.read_text() == "old" and os.listdir(tmp_path) == ["state.pt"]
    with atomic_path(str(target)) as a, atomic_path(str(target)) as b:
        assert a != b  # two writers never share a temporary file
        open(a, "w").write("a")
        open(b, "w").write("b")
    assert target.read_text() == "a"  # the last to finish wins, whole


@pytest.mark.parametrize("umask", [0o022, 0o077], ids=["022", "077"])
def test_atomic_writes_take_a_plain_files_mode(tmp_path, umask):
    """safetensors' save_file creates its file 0600: atomic_path gives it the mode open() would."""
    from safetensors.torch import save_file

    before = os.umask(umask)
    try:
        with atomic_path(str(tmp_path / "model.safetensors")) as tmp:
            save_file({"w": torch.zeros(2)}, tmp)
        (tmp_path / "plain.txt").write_text("plain")
    finally:
        os.umask(before)
    mode = (tmp_path / "model.safetensors").stat().st_mode
    assert mode == (tmp_path / "plain.txt").stat().st_mode == 0o100666 & ~umask


def test_a_cpu_and_float32_have_no_peak_and_no_mfu():
    assert (
        records.peak_flops("cpu", "bfloat16") is None
        and records.peak_flops("cpu", "float32") is None
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_absent_devices_are_one_line():
    with pytest.raises(Error, match=r"--device cuda:1: no such device here \(.+\)$"):
        common.pick_device("cuda:1")
    with pytest.raises(Error, match=r"--device tpu: no such device here \(Expected one of"):
        common.pick_device("tpu")


FLAGS = {
    "rows": Option(8, "rows at once", ge=1),
    "share": Option(0.1, "a share", gt=0, lt=1),
    "mode": Option("auto", "a mode", choices=("auto", "fast")),
    "name": Option(None, "a name"),
    "quick": Option(False, "a switch"),
}


def parse_flags(*argv):
    parser = ArgumentParser(prog="x.py")
    flags(parser, FLAGS)
    return parser, parser.parse_args(argv)


def test_flags_parse_as_their_keys_types_with_their_defaults():
    _, args = parse_flags()
    assert vars(args) == dict(rows=8, share=0.1, mode="auto", name=None, quick=False)
    _, args = parse_flags("--rows", "3", "--share=0.5", "--mode", "fast", "--name", "a", "--quick")
    assert vars(args) == dict(rows=3, share=0.5, mode="fast", name="a", quick=True)
    assert type(args.share) is float


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--rows", "0"], "argument --rows: must be >= 1, got 0 (see --help)"),
        (["--rows", "1.5"], "argument --rows: invalid int value: '1.5' (see --help)"),
        (["--share", "1"], "argument --share: must be < 1, got 1 (see --help)"),
        (["--share", "nan"], "argument --share: must be a finite number, got nan (see --help)"),
        (["--mode", "slow"], "argument --mode: invalid choice: 'slow'"),
        (["--quick=1"], "argument --quick: ignored explicit argument '1'"),
    ],
)
def test_a_flag_out_of_its_keys_range_is_argparses_one_line(argv, message):
    with pytest.raises(Error) as e:
        parse_flags(*argv)
    assert str(e.value).startswith(message)


def test_a_flags_help_shows_its_default_unless_none():
    parser, _ = parse_flags()
    help = " ".join(parser.format_help().split())
    assert "--rows ROWS rows at once (default: 8)" in help
    assert "--share SHARE a share (default: 0.1)" in help
    assert "--mode {auto,fast} a mode (default: auto)" in help
    assert "--name NAME a name --quick a switch" in help
