"""export.py --gguf: a GPT as one GGUF file, llama.cpp's gpt2 architecture with the tokenizer
inside; llama.cpp itself (llama-cpp-python) reads the same tokens and greedily decodes the same
ones as ours; what llama.cpp cannot run, and bad input, are refused before a byte is written."""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import ROOT, needs_shared

from bench import gguf_check as bench
from engine import Engine
from export import GGUF_DTYPES, export, main
from lib.bpe import bytes_to_unicode, save_ranks, train_bpe
from lib.checkpoint import save_pretrained
from lib.common import Error, run_script
from lib.files import WriteError
from lib.weights import from_checkpoint, get_tokenizer
from model import GPT, EncoderClassifier, EncoderConfig, GPTConfig

gguf = pytest.importorskip("gguf", reason="the gguf package is an extra: pip install -e '.[gguf]'")

# Tiny Shakespeare's 65 characters, a backslash (rwkv's escape) and two of more than one byte
CHARS = "\n !$&',-.3:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz\\éー"
TEXT = (
    "ROMEO: what say'st thou, my dear nurse? Hello, wörld!\n\n  First Citizen:\n"
    "Before we proceed any further, hear me speak. 日本語 🎉 naïve café 12345 it's we'll\n"
)
PROMPT = "ROMEO: what"
N_NEW = 200  # greedy tokens compared


def make_checkpoint(path, tokenizer, vocab_size, data_dir=None, **options):
    """A random GPT of shapes that Q8_0's blocks of 32 fit, its logits spread as a trained
    model's (std ~3, so near ties are rare) and varying with the position (so greedy tokens are
    no one token repeated)."""
    torch.manual_seed(0)
    shape = dict(block_size=256, n_layer=2, n_head=2, n_embd=32)
    model = GPT(GPTConfig(vocab_size=vocab_size, **{**shape, "bias": True, **options}))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.1)
        for norm in [model.ln_f, *[m for b in model.blocks for m in (b.ln_1, b.ln_2)]]:
            norm.weight.normal_(1.0, 0.2)
        model.wte.weight.normal_(0.0, 0.5)
        if model.wpe is not None:  # rope=True has none
            model.wpe.weight.normal_(0.0, 1.0)
    save_pretrained(model, path, data_dir, task="lm", dataset="toy", tokenizer=tokenizer)
    return str(path)


def trained_bpe(folder):
    """A byte-level BPE trained on TEXT (data/text/prepare.py's trainer), saved in folder: its
    spec."""
    folder.mkdir()
    tok = train_bpe([TEXT] * 20, 300)
    return save_ranks(tok.ranks, folder), tok.vocab_size


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """{kind: checkpoint folder}: characters, a trained BPE (its model's vocabulary padded to a
    multiple of 64) and, where the shared folder holds its file, GPT-2's BPE."""
    root = tmp_path_factory.mktemp("ckpts")
    spec, n = trained_bpe(root / "data")
    found = {
        "char": make_checkpoint(root / "char", {"type": "char", "chars": CHARS}, len(CHARS)),
        "trained": make_checkpoint(
            root / "trained", spec, -(-n // 64) * 64, root / "data", bias=False
        ),
    }
    if os.path.isdir(os.environ.get("TIKTOKEN_CACHE_DIR", "")):
        bpe = {"type": "bpe", "encoding": "r50k_base"}
        found["gpt2"] = make_checkpoint(root / "gpt2", bpe, 50304)
    return found


def checkpoint(checkpoints, kind):
    if kind not in checkpoints:
        pytest.skip("GPT-2's BPE needs TIKTOKEN_CACHE_DIR (the shared folder's tiktoken_cache)")
    return checkpoints[kind]


def read_tokenizer(out_dir):
    where = os.path.join(out_dir, "config.json")
    return get_tokenizer(json.loads(open(where).read())["tokenizer"], where)


def read(path):
    """{tensor name: (type name, float32 array in torch's [out, in] order)}, {key: value}."""
    reader = gguf.GGUFReader(path)
    tensors = {}
    for t in reader.tensors:
        values = gguf.quants.dequantize(t.data, t.tensor_type)
        tensors[t.name] = (t.tensor_type.name, values.reshape(list(reversed(t.shape.tolist()))))
    fields = {key: field.contents() for key, field in reader.fields.items()}
    return tensors, fields


@pytest.mark.parametrize("dtype", ["float32", "float16", "q8_0"])
def test_the_tensors_are_ours_under_llamas_names(checkpoints, tmp_path, dtype):
    """Each weight under llama.cpp's gpt2 name, as Linear's [out, in]; zeros for a bias=False
    model's biases; the token table cut to the tokenizer's rows (the model's padded to a multiple
    of 64); norms, biases and positions float32, the matrices of the file's type (Q8_0: within
    half a step of 1/127 of each block's largest weight)."""
    out_dir = checkpoint(checkpoints, "trained")
    vocab = read_tokenizer(out_dir).vocab_size
    export(out_dir, gguf_path=str(tmp_path / "m.gguf"), gguf_dtype=dtype)
    ours = from_checkpoint(out_dir)[0].state_dict()
    tensors, fields = read(tmp_path / "m.gguf")
    matrix = {"float32": "F32", "float16": "F16", "q8_0": "Q8_0"}[dtype]
    # the most a weight moves, relative to itself (Q8_0: to its block's largest; half a step of
    # 127, and the step's own float16 rounding)
    step = {"float32": 0, "float16": 2**-11, "q8_0": (0.5 + 127 * 2**-11) / 127}[dtype]
    names = {"token_embd": "wte", "position_embd": "wpe", "output_norm": "ln_f"}
    for i in range(2):
        for theirs, mine in [
            ("attn_norm", "ln_1"),
            ("attn_qkv", "attn.qkv"),
            ("attn_output", "attn.proj"),
            ("ffn_norm", "ln_2"),
            ("ffn_up", "mlp.fc"),
            ("ffn_down", "mlp.proj"),
        ]:
            names[f"blk.{i}.{theirs}"] = f"blocks.{i}.{mine}"
    assert len(tensors) == 2 * len(names) - 2  # a weight and a bias each, the tables no bias
    for theirs, mine in names.items():
        kind, weight = tensors[theirs + ".weight"]
        flat = weight.ndim == 1 or theirs == "position_embd"
        assert kind == ("F32" if flat else matrix), theirs
        expected = ours[mine + ".weight"].numpy()
        if theirs == "token_embd":
            assert expected.shape == (320, 32) and weight.shape == (vocab, 32) and vocab <= 300
            expected = expected[:vocab]
        error, scale = np.abs(weight - expected), np.abs(expected)
        if kind == "Q8_0":  # by blocks of 32
            error = error.reshape(-1, 32)
            scale = scale.reshape(-1, 32).max(-1, keepdims=True)
        assert np.all(error <= step * scale + 1e-7), theirs
        if not theirs.endswith("_embd"):
            kind, bias = tensors[theirs + ".bias"]
            assert kind == "F32" and not bias.any() and bias.shape[0] == weight.shape[0]
    assert fields["general.architecture"] == "gpt2"
    assert fields["general.file_type"] == {"float32": 0, "float16": 1, "q8_0": 7}[dtype]
    shape = {"context_length": 256, "embedding_length": 32, "feed_forward_length": 128}
    shape |= {"block_count": 2, "attention.head_count": 2}
    assert {key: fields[f"gpt2.{key}"] for key in shape} == shape
    assert fields["gpt2.attention.layer_norm_epsilon"] == pytest.approx(1e-5)


@pytest.mark.parametrize("kind", ["char", "trained", "gpt2"])
def test_the_tokenizer_is_inside(checkpoints, tmp_path, kind):
    """Token i is our token i: a BPE's in GPT-2's byte-to-character map, with its merges and
    <|endoftext|> a control token that begins and ends a text; characters as themselves (rwkv's
    tokens, a backslash escaped), with no end of text."""
    out_dir = checkpoint(checkpoints, kind)
    export(out_dir, gguf_path=str(tmp_path / "m.gguf"), gguf_dtype="q8_0")
    _, fields = read(tmp_path / "m.gguf")
    tokenizer = read_tokenizer(out_dir)
    tokens = fields["tokenizer.ggml.tokens"]
    types = fields["tokenizer.ggml.token_type"]
    assert len(tokens) == len(types) == tokenizer.vocab_size
    if kind == "char":
        assert fields["tokenizer.ggml.model"] == "rwkv"
        assert tokens == [c.replace("\\", "\\\\") for c in CHARS] and set(types) == {1}
        assert "tokenizer.ggml.eos_token_id" not in fields
        return
    assert fields["tokenizer.ggml.model"] == "gpt2" and fields["tokenizer.ggml.pre"] == "gpt-2"
    char = bytes_to_unicode()
    for i in range(tokenizer.vocab_size - 1):
        assert tokens[i] == "".join(char[b] for b in tokenizer.enc.decode_single_token_bytes(i))
    eot = tokenizer.eot_token
    assert (tokens[eot], types[eot], set(types[:eot])) == ("<|endoftext|>", 3, {1})
    assert fields["tokenizer.ggml.eos_token_id"] == fields["tokenizer.ggml.bos_token_id"] == eot
    assert fields["tokenizer.ggml.add_bos_token"] is False
    merges = fields["tokenizer.ggml.merges"]
    assert len(merges) == tokenizer.vocab_size - 257  # the 256 bytes and <|endoftext|> aside
    if kind == "gpt2":
        assert merges[0] == "Ġ t"  # GPT-2's first merge


@pytest.mark.parametrize("kind", ["char", "trained", "gpt2"])
def test_a_chat_models_tokens_template_and_end_of_turn_are_inside(checkpoints, tmp_path, kind):
    """A chat model's file: the chat tokens (lib/chat.py's) at our ids after the vocabulary's,
    control tokens, as <|endoftext|> is, their rows in the token table; the template; a reply
    ends at <|end|> (eos, and llama.cpp's end of turn), the end of text still its bos."""
    from lib.chat import SPECIAL_TOKENS, TEMPLATE

    plain = checkpoint(checkpoints, kind)
    card = json.loads(open(os.path.join(plain, "config.json")).read())
    base = read_tokenizer(plain)
    spec = {**card["tokenizer"], "chat": True}
    vocab = max(card["model"]["vocab_size"], base.vocab_size + 4)  # GPT-2's padding holds them
    out_dir = make_checkpoint(tmp_path / "chat", spec, vocab, plain)
    export(out_dir, gguf_path=str(tmp_path / "m.gguf"))
    tensors, fields = read(tmp_path / "m.gguf")
    tokens = fields["tokenizer.ggml.tokens"]
    types = fields["tokenizer.ggml.token_type"]
    n = base.vocab_size
    assert tokens[n:] == list(SPECIAL_TOKENS) and types[n:] == [3] * 4
    assert len(tokens) == len(types) == n + 4
    assert tensors["token_embd.weight"][1].shape == (n + 4, 32)
    assert fields["tokenizer.chat_template"] == TEMPLATE
    assert fields["tokenizer.ggml.eos_token_id"] == fields["tokenizer.ggml.eot_token_id"] == n + 3
    assert fields.get("tokenizer.ggml.bos_token_id") == base.eot_token


# ------------------------------------------------------------------------------- llama.cpp itself
def llama_cpp():
    return pytest.importorskip(
        "llama_cpp",
        reason="llama.cpp's check needs llama-cpp-python (pip install llama-cpp-python; it builds "
        "llama.cpp, minutes)",
    )


def our_greedy(out_dir, prompt, n):
    """(our n greedy tokens: sample.py's engine over the tokenizer's ids, float32 weights; the
    model)."""
    model, _ = from_checkpoint(out_dir)
    vocab = read_tokenizer(out_dir).vocab_size
    return bench.our_greedy(Engine(model, 1), prompt, n, vocab)[0], model


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["char", "trained", "gpt2"])
def test_llama_cpp_decodes_our_greedy_tokens(checkpoints, tmp_path, kind, one_thread):
    """Greedy, 200 tokens: float32 and float16 files give ours token for token, Q8_0 the first
    50 or up to a near tie."""
    out_dir = checkpoint(checkpoints, kind)
    llama_cpp()
    prompt = read_tokenizer(out_dir).encode(PROMPT)
    ours, model = our_greedy(out_dir, prompt, N_NEW)
    assert len(set(ours)) > 10  # not one token over and over
    for dtype, n in [("float32", N_NEW), ("float16", N_NEW), ("q8_0", 50)]:
        path = tmp_path / f"{dtype}.gguf"
        export(out_dir, gguf_path=str(path), gguf_dtype=dtype)
        theirs, logits, _ = bench.llama_greedy(bench.load_llama(path), prompt, n)
        found = bench.first_difference(theirs, ours, logits, model, prompt)
        if dtype == "q8_0" and found:
            # a near tie that Q8_0's rounding (of weights and activations) tips: our margin
            # within what the logits move, which is a small part of their spread
            error = found["logit_error"]
            assert found["our_margin"] <= 2 * error < 0.2 * found["logit_std"], found["line"]
        else:
            assert found is None, f"{dtype}: {found['line']}"


@pytest.mark.parametrize("kind", ["char", "trained", "gpt2"])
def test_llama_cpp_reads_text_as_our_tokens(checkpoints, tmp_path, kind):
    """Text to ids and back: a character model's text in its characters, a BPE's any text."""
    out_dir = checkpoint(checkpoints, kind)
    llama_cpp()
    export(out_dir, gguf_path=str(tmp_path / "m.gguf"), gguf_dtype="q8_0")
    llama = bench.load_llama(tmp_path / "m.gguf")
    tokenizer = read_tokenizer(out_dir)
    texts = [TEXT, "x" * 50, "  spaces\t\ttabs \n\n\nand 's 're 've"]
    if kind == "char":
        texts = [CHARS, "ROMEO:\nWhat\\ say'st thou? café ーー", "  a  b\n\n"]
    for text in texts:
        ids = tokenizer.encode(text)
        assert llama.tokenize(text.encode(), add_bos=False, special=False) == ids, text
        assert llama.detokenize(ids).decode() == text


@pytest.mark.parametrize("kind", ["char", "trained", "gpt2"])
def test_llama_cpp_reads_the_chat_template_as_our_ids_and_replies_as_ours(
    checkpoints, tmp_path, kind
):
    """A chat model's file in llama.cpp: the rendered template, its markers parsed as special
    tokens, is our render's ids; greedy from a reply's prompt, the tokens ours are."""
    llama_cpp()
    plain = checkpoint(checkpoints, kind)
    card = json.loads(open(os.path.join(plain, "config.json")).read())
    base = read_tokenizer(plain)
    spec = {**card["tokenizer"], "chat": True}
    vocab = max(card["model"]["vocab_size"], base.vocab_size + 4)
    out_dir = make_checkpoint(tmp_path / "chat", spec, vocab, plain)
    export(out_dir, gguf_path=str(tmp_path / "m.gguf"))
    llama = bench.load_llama(tmp_path / "m.gguf")
    tokenizer = read_tokenizer(out_dir)
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "ROMEO: what say'st thou?"},
        {"role": "assistant", "content": ""},
        {"role": "user", "content": "Hello"},
    ]
    ids, _ = tokenizer.render(messages, reply=True)
    rendered = tokenizer.decode(ids)  # the template's text: markers and contents
    assert llama.tokenize(rendered.encode(), add_bos=False, special=True) == ids
    ours, _ = our_greedy(out_dir, ids, 40)
    assert bench.llama_greedy(llama, ids, 40)[0] == ours


@pytest.mark.slow
@needs_shared
def test_llama_cpps_converter_reads_our_hugging_face_export(checkpoints, tmp_path):
    """llama.cpp's convert_hf_to_gguf.py (in LLAMA_CPP_DIR, a llama.cpp checkout) reads our
    GPT-2 export (n_ctx beside n_positions), to a file that decodes our greedy tokens."""
    converter = os.path.join(os.environ.get("LLAMA_CPP_DIR", ""), "convert_hf_to_gguf.py")
    if not os.path.isfile(converter):
        pytest.skip("needs LLAMA_CPP_DIR: a llama.cpp checkout, its convert_hf_to_gguf.py")
    llama_cpp()
    out_dir = checkpoint(checkpoints, "gpt2")
    export(out_dir, str(tmp_path / "hf"))
    path = tmp_path / "converted.gguf"
    command = [sys.executable, converter, str(tmp_path / "hf"), "--outfile", str(path)]
    done = subprocess.run(command + ["--outtype", "f32"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    prompt = read_tokenizer(out_dir).encode(PROMPT)
    ours = our_greedy(out_dir, prompt, 50)[0]
    assert bench.llama_greedy(bench.load_llama(path), prompt, 50)[0] == ours


# ------------------------------------------------------------------------------------- refusals
@pytest.mark.parametrize(
    "option, message",
    [
        (dict(gelu="none"), "gelu='none' has no place in llama.cpp's gpt2 architecture"),
        (dict(rope=True), "rope=True has no place in GPT-2's layout"),
        (dict(qk_norm=True), "qk_norm=True has no place in GPT-2's layout"),
        (dict(window=8), "window=8 has no place in GPT-2's layout"),
        (dict(global_tokens=2), "global_tokens=2 has no place in GPT-2's layout"),
    ],
)
def test_what_llama_cpp_cannot_run_is_refused(tmp_path, option, message):
    out_dir = make_checkpoint(tmp_path / "ckpt", {"type": "char", "chars": "abc"}, 3, **option)
    with pytest.raises(Error, match=message):
        export(out_dir, gguf_path=str(tmp_path / "m.gguf"))
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]


def test_an_encoder_and_a_lowercasing_tokenizer_are_refused(tmp_path):
    config = EncoderConfig(vocab_size=3, block_size=8, n_layer=1, n_head=1, n_embd=8)
    tokenizer = {"type": "char", "chars": "abc"}
    save_pretrained(
        EncoderClassifier(config), tmp_path / "enc", task="classify", tokenizer=tokenizer
    )
    with pytest.raises(Error, match="holds an EncoderClassifier: export.py writes GPT-2's layout"):
        export(str(tmp_path / "enc"), gguf_path=str(tmp_path / "m.gguf"))
    if os.path.isdir(os.environ.get("TIKTOKEN_CACHE_DIR", "")):
        lower = {"type": "bpe", "encoding": "r50k_base", "lowercase": True}
        out_dir = make_checkpoint(tmp_path / "lower", lower, 50304)
        with pytest.raises(Error, match="the tokenizer lowercases text, which llama.cpp's"):
            export(out_dir, gguf_path=str(tmp_path / "m.gguf"))
    assert not os.path.exists(tmp_path / "m.gguf")


def test_an_existing_file_is_replaced_only_with_overwrite(tmp_path):
    """And a write that fails midway leaves what the file held, and nothing beside it."""
    out_dir = make_checkpoint(tmp_path / "ckpt", {"type": "char", "chars": "abc"}, 3)
    path = tmp_path / "m.gguf"
    path.write_bytes(b"an earlier file")
    with pytest.raises(Error, match=r"--gguf .*m.gguf already exists: pass another name, or"):
        export(out_dir, gguf_path=str(path))
    assert path.read_bytes() == b"an earlier file"

    def full_disk(self, **kwargs):
        raise OSError(28, "No space left on device")

    writer = gguf.GGUFWriter.write_tensors_to_file
    gguf.GGUFWriter.write_tensors_to_file = full_disk
    try:
        with pytest.raises(WriteError, match="m.gguf .No space left on device.: what it held"):
            export(out_dir, gguf_path=str(path), overwrite=True)
    finally:
        gguf.GGUFWriter.write_tensors_to_file = writer
    assert path.read_bytes() == b"an earlier file"
    assert sorted(os.listdir(tmp_path)) == ["ckpt", "m.gguf"]
    export(out_dir, gguf_path=str(path), overwrite=True)
    assert path.read_bytes()[:4] == b"GGUF"


@pytest.mark.parametrize(
    "damage, message",
    [
        ("tokenizer", "config.json: no tokenizer this project knows"),
        ("weights", "is not a readable checkpoint of this project"),
        ("name", r"--gguf .*m.bin: name the file \*.gguf"),
        ("none", "pass --hf_dir, --gguf, --peft_dir or more"),
    ],
)
def test_bad_input_is_one_line(tmp_path, capsys, damage, message):
    """As `python export.py ...` prints it: one line, exit status 2, no file written."""
    out_dir = make_checkpoint(tmp_path / "ckpt", {"type": "char", "chars": "abc"}, 3)
    args = [f"--out_dir={out_dir}", f"--gguf={tmp_path / 'm.gguf'}"]
    if damage == "tokenizer":
        card = json.loads((tmp_path / "ckpt" / "config.json").read_text())
        del card["tokenizer"]
        (tmp_path / "ckpt" / "config.json").write_text(json.dumps(card))
    if damage == "weights":
        weights = tmp_path / "ckpt" / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[:-100])
    if damage == "name":
        args[1] = f"--gguf={tmp_path / 'm.bin'}"
    if damage == "none":
        args = args[:1]
    with pytest.raises(SystemExit) as e:
        run_script(lambda: main(args), "export.py")
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1
    assert re.match(f"export.py: error: .*{message}", err)
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]


def test_a_plain_export_imports_no_gguf():
    """The gguf package is an optional extra: export.py without --gguf, sample.py and train.py
    never import it."""
    code = "import export, sample, train, sys; print([m for m in sys.modules if 'gguf' in m])"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "[]\n"


def test_every_gguf_dtype_the_flag_takes_is_one_the_writer_writes():
    """--gguf_dtype's choices (export.py, which imports no gguf) name the writer's types."""
    from gguf_export import DTYPES

    assert tuple(DTYPES) == GGUF_DTYPES
