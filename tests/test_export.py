"""export.py: a GPT checkpoint becomes a folder that transformers loads as GPT2LMHeadModel, with the
same logits, the same token ids (GPT-2's BPE) and a working text-generation pipeline; options GPT-2
lacks are refused."""

import json
import os

import pytest
import torch
from conftest import SHARED, generate, needs_shared

from decoding import NextToken, Options
from export import export
from lib.checkpoint import save_pretrained
from lib.common import Error
from lib.gpt2 import from_pretrained
from model import GPT, GPTConfig

transformers = pytest.importorskip(
    "transformers", reason="transformers is a test extra: pip install -e '.[test]'"
)


def checkpoint(path, tokenizer, **options):
    torch.manual_seed(0)
    vocab = 50304
    if tokenizer["type"] == "char":
        vocab = len(tokenizer["chars"]) + tokenizer.get("eot", False)
    model = GPT(
        GPTConfig(
            vocab_size=vocab,
            block_size=32,
            n_layer=2,
            n_head=2,
            n_embd=16,
            **{"bias": True, **options},
        )
    )
    # weights larger than training's init, so the logits differ visibly between tokens
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.2)
    save_pretrained(
        model,
        path,
        task="lm",
        dataset="toy",
        tokenizer=tokenizer,
        metrics={"step": 7, "val/loss": 1.5},
        command=["python", "train.py", "config/toy.py"],
    )
    return model.eval()


@pytest.mark.parametrize(
    "options, activation",
    [({"bias": True}, "gelu_new"), ({"bias": False}, "gelu_new"), ({"gelu": "none"}, "gelu")],
)
def test_transformers_loads_the_same_logits(tmp_path, options, activation):
    """And so does this project, from the export: the GELU's form named as transformers names
    it. The two forms' logits differ by 2.3e-5 at these weights, float32's rounding by 3e-8
    (measured): 1e-6 tells them apart."""
    ours = checkpoint(tmp_path / "ckpt", {"type": "char", "chars": "abcdefgh"}, **options)
    export(str(tmp_path / "ckpt"), str(tmp_path / "hf"))
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert type(hf).__name__ == "GPT2LMHeadModel"
    again = from_pretrained(str(tmp_path / "hf")).eval()
    idx = torch.randint(0, 8, (2, 20))
    with torch.no_grad():
        assert torch.allclose(hf(idx).logits, ours(idx)[0], atol=1e-6)
        assert torch.allclose(again(idx)[0], ours(idx)[0], atol=1e-6)
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert (config["model_type"], config["n_positions"], config["activation_function"]) == (
        "gpt2",
        32,
        activation,
    )
    assert config["n_ctx"] == 32  # GPT-2's own name, which llama.cpp's converter reads
    card = (tmp_path / "hf" / "README.md").read_text()
    assert "python train.py config/toy.py" in card and "val/loss | 1.5000" in card
    assert not (tmp_path / "hf" / "vocab.json").exists()  # characters: no BPE files


@needs_shared
@pytest.mark.parametrize("eot", [False, True])
def test_autotokenizer_gives_a_character_models_ids(tmp_path, eot):
    """A character model's export carries a tokenizer.json: AutoTokenizer gives our ids on a line
    of Shakespeare and decodes them back; the end of text is its special token."""
    from lib.tokenizer import CharTokenizer

    path = os.path.join(SHARED, "data", "tinyshakespeare", "input.txt")
    text = open(path, encoding="utf-8").read()
    ours = CharTokenizer("".join(sorted(set(text))), eot=eot)
    checkpoint(tmp_path / "ckpt", ours.spec)
    export(str(tmp_path / "ckpt"), str(tmp_path / "hf"))
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    line = text[:200]  # "First Citizen:\nBefore we proceed any further, hear me speak.\n..."
    ids = tokenizer.encode(line)
    assert ids == ours.encode(line)
    assert tokenizer.decode(ids) == line
    assert tokenizer.eos_token_id == ours.eot_token


@needs_shared
def test_bpe_tokenizer_files_and_the_pipeline(tmp_path):
    import tiktoken

    ours = checkpoint(tmp_path / "ckpt", {"type": "bpe", "encoding": "r50k_base"})
    export(str(tmp_path / "ckpt"), str(tmp_path / "hf"))
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    enc = tiktoken.get_encoding("r50k_base")
    for text in [
        "Hello, wörld! ROMEO: what say'st thou?\n\n  spaces\t",
        "日本語の文章 🎉 naïve café",
        "x" * 50,
    ]:
        assert tokenizer.encode(text) == enc.encode_ordinary(text), text
    prompt = enc.encode_ordinary("ROMEO: what")
    pick = NextToken(Options(), greedy=True)
    greedy = [step[0] for step in generate(ours, [prompt], 8, [pick])]
    pipe = transformers.pipeline("text-generation", model=str(tmp_path / "hf"))
    out = pipe("ROMEO: what", max_new_tokens=8, do_sample=False)[0]["generated_text"]
    assert out == "ROMEO: what" + enc.decode(greedy)


@pytest.mark.parametrize(
    "option", [dict(rope=True), dict(qk_norm=True), dict(window=8), dict(random_links=2)]
)
def test_options_gpt2_lacks_are_refused(tmp_path, option):
    checkpoint(tmp_path / "ckpt", {"type": "char", "chars": "abcdefgh"}, **option)
    name = next(iter(option))
    with pytest.raises(Error, match=f"{name}=.* has no place in GPT-2's layout"):
        export(str(tmp_path / "ckpt"), str(tmp_path / "hf"))
    assert not os.path.exists(tmp_path / "hf")


def test_a_folder_holding_a_model_is_never_overwritten_unless_asked(tmp_path):
    """The checkpoint being exported is never the target; an earlier export (or any folder with
    model.safetensors or config.json) is replaced only with overwrite."""
    checkpoint(tmp_path / "ckpt", {"type": "char", "chars": "abcdefgh"})
    saved = {p.name: p.read_bytes() for p in (tmp_path / "ckpt").iterdir()}
    with pytest.raises(Error, match="is the checkpoint being exported: pass another folder"):
        export(str(tmp_path / "ckpt"), str(tmp_path / "ckpt"), overwrite=True)
    assert {p.name: p.read_bytes() for p in (tmp_path / "ckpt").iterdir()} == saved
    export(str(tmp_path / "ckpt"), str(tmp_path / "hf"))
    (tmp_path / "hf" / "model.safetensors").write_bytes(b"an earlier export")
    with pytest.raises(Error, match=r"already holds a model \(model.safetensors, config.json\)"):
        export(str(tmp_path / "ckpt"), str(tmp_path / "hf"))
    assert (tmp_path / "hf" / "model.safetensors").read_bytes() == b"an earlier export"
    export(str(tmp_path / "ckpt"), str(tmp_path / "hf"), overwrite=True)
    assert (tmp_path / "hf" / "model.safetensors").read_bytes() != b"an earlier export"


def test_an_overwritten_export_holds_only_the_new_exports_files(tmp_path):
    """A trained BPE's export (tokenizer.tiktoken, vocab.json, merges.txt, tokenizer_config.json)
    replaced by a character model's: none of its tokenizer files stays to be read with the new
    weights; a file no export writes (a clone's .gitattributes) stays, and no staging folder is
    left, in it or beside it."""
    from lib.bpe import save_ranks

    ranks = {bytes([b]): b for b in range(256)} | {b"ab": 256}
    (tmp_path / "data").mkdir()
    spec = save_ranks(ranks, tmp_path / "data")
    model = GPT(GPTConfig(vocab_size=258, block_size=8, n_layer=1, n_head=1, n_embd=8))
    save_pretrained(model, tmp_path / "bpe", tmp_path / "data", task="lm", tokenizer=spec)
    checkpoint(tmp_path / "char", {"type": "char", "chars": "abcdefgh"})
    export(str(tmp_path / "bpe"), str(tmp_path / "hf"))
    assert (tmp_path / "hf" / "merges.txt").read_text().splitlines()[1] == "a b"
    (tmp_path / "hf" / ".gitattributes").write_text("*.safetensors filter=lfs\n")
    export(str(tmp_path / "char"), str(tmp_path / "hf"), overwrite=True)
    export(str(tmp_path / "char"), str(tmp_path / "fresh"))
    fresh = {p.name for p in (tmp_path / "fresh").iterdir()}
    assert {p.name for p in (tmp_path / "hf").iterdir()} == fresh | {".gitattributes"}
    assert {p.name for p in tmp_path.iterdir()} == {"data", "bpe", "char", "hf", "fresh"}


def test_weights_files_have_the_mode_of_the_files_beside_them(tmp_path):
    """A checkpoint's and an export's model.safetensors are as readable as a plain file."""
    checkpoint(tmp_path / "ckpt", {"type": "char", "chars": "abcdefgh"})
    export(str(tmp_path / "ckpt"), str(tmp_path / "hf"))
    for folder in ("ckpt", "hf"):
        (tmp_path / folder / "plain.txt").write_text("plain")
        plain = (tmp_path / folder / "plain.txt").stat().st_mode
        assert (tmp_path / folder / "model.safetensors").stat().st_mode == plain


def test_a_half_precision_char_export_samples_with_its_own_tokenizer(tmp_path):
    """The hub's folders hold float16 or bfloat16 weights: they load as float32, the dtype the
    model runs in; a character model's export is sampled with its characters, not GPT-2's BPE."""
    from safetensors.torch import load_file, save_file

    from lib.weights import load_gpt, load_pretrained

    ours = checkpoint(tmp_path / "ckpt", {"type": "char", "chars": "abcdefgh"})
    export(str(tmp_path / "ckpt"), str(tmp_path / "hf"))
    weights = tmp_path / "hf" / "model.safetensors"
    for dtype in (torch.float16, torch.bfloat16):
        save_file({k: v.to(dtype) for k, v in load_file(weights).items()}, weights)
        model, info = load_pretrained(str(tmp_path / "hf"))
        assert {p.dtype for p in model.parameters()} == {torch.float32}
        idx = torch.randint(0, 8, (2, 20))
        with torch.no_grad():
            assert torch.allclose(model(idx)[0], ours(idx)[0], atol=0.05)
    model, tokenizer, _ = load_gpt(str(tmp_path / "hf"), "cpu", hub=True)
    assert tokenizer.decode(tokenizer.encode("hgfabc")) == "hgfabc" and tokenizer.vocab_size == 8
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    config["tokenizer"]["chars"] = "abcdefghij"
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    with pytest.raises(Error, match="config.json: the tokenizer has 10 tokens, the model's vocab"):
        load_gpt(str(tmp_path / "hf"), "cpu", hub=True)
