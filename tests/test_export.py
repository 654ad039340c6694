"""export.py: a GPT checkpoint becomes a folder that transformers loads as GPT2LMHeadModel, with the
same logits, the same token ids (GPT-2's BPE) and a working text-generation pipeline; options GPT-2
lacks are refused."""

import json
import os

import pytest
import torch
from conftest import SHARED, generate, marker_checkpoint, needs_shared
from test_robustness import cli

from decoding import NextToken, Options
from engine import Engine
from export import export
from lib.checkpoint import save_pretrained
from lib.common import Error
from lib.gpt2 import from_pretrained
from lib.tokenizer import EOT, end_tokens
from lib.weights import get_tokenizer, load_pretrained
from model import GPT, GPTConfig

transformers = pytest.importorskip(
    "transformers", reason="transformers is a test extra: pip install -e '.[test]'"
)


def checkpoint(path, tokenizer, data_dir=None, **options):
    """A random GPT over tokenizer's ids (GPT-2's padded to 50,304) saved in path; a trained BPE's
    file lies in data_dir."""
    torch.manual_seed(0)
    ours = get_tokenizer(tokenizer, os.path.join(data_dir or path, "meta.json"))
    vocab = 50304 if tokenizer.get("encoding") else ours.vocab_size
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
        if tokenizer.get("chat"):  # its replies end within a few tokens, as a fine-tune's do
            model.wte.weight[ours.end_token] *= 4
    save_pretrained(
        model,
        path,
        data_dir,
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
    assert tokenizer.eos_token_id == ours.eot_token and tokenizer.chat_template is None


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
    """The checkpoint being exported is never the target; a model no export wrote there (one
    exported before exports listed their files) is replaced only with overwrite."""
    checkpoint(tmp_path / "ckpt", {"type": "char", "chars": "abcdefgh"})
    saved = {p.name: p.read_bytes() for p in (tmp_path / "ckpt").iterdir()}
    with pytest.raises(Error, match="is the checkpoint being exported: pass another folder"):
        export(str(tmp_path / "ckpt"), str(tmp_path / "ckpt"), overwrite=True)
    assert {p.name: p.read_bytes() for p in (tmp_path / "ckpt").iterdir()} == saved
    export(str(tmp_path / "ckpt"), str(tmp_path / "hf"))
    (tmp_path / "hf" / "export_manifest.json").unlink()
    (tmp_path / "hf" / "model.safetensors").write_bytes(b"an earlier model")
    with pytest.raises(Error, match=r"no export wrote there.*\(model.safetensors, config.json, "):
        export(str(tmp_path / "ckpt"), str(tmp_path / "hf"))
    assert (tmp_path / "hf" / "model.safetensors").read_bytes() == b"an earlier model"
    export(str(tmp_path / "ckpt"), str(tmp_path / "hf"), overwrite=True)
    assert (tmp_path / "hf" / "model.safetensors").read_bytes() != b"an earlier model"


def test_files_no_export_wrote_are_replaced_only_when_asked(tmp_path):
    """A folder's own README.md, merges.txt and vocab.json (a clone's, a tokenizer's) are refused
    in one line, every byte kept, unless overwrite; an export's files, as it wrote them, are the
    next export's to replace, without overwrite, and one edited since is the user's; a file no
    export writes is never touched."""
    checkpoint(tmp_path / "ckpt", {"type": "char", "chars": "abcdefgh"})
    ckpt, hf = str(tmp_path / "ckpt"), tmp_path / "hf"
    hf.mkdir()
    theirs = {"README.md": "# a project", "merges.txt": "#version: 0.2", "vocab.json": "{}"}
    theirs["notes.txt"] = "mine"
    for name, text in theirs.items():
        (hf / name).write_text(text)
    code, _, err = cli("export.py", f"--out_dir={ckpt}", f"--hf_dir={hf}")
    assert code == 2 and err == (
        f"export.py: error: --hf_dir {hf} holds files no export wrote there (or changed since), "
        "which this one would replace or remove (README.md, vocab.json, merges.txt): pass "
        "another folder, or --overwrite\n"
    )
    assert {p.name: p.read_text() for p in hf.iterdir()} == theirs
    export(ckpt, str(hf), overwrite=True)
    assert {"vocab.json", "merges.txt"}.isdisjoint(p.name for p in hf.iterdir())
    assert (hf / "README.md").read_text().startswith("---\nlibrary_name: transformers")
    files = {p.name: p.read_bytes() for p in hf.iterdir()}
    export(ckpt, str(hf))  # an earlier export's files, as it wrote them
    assert {p.name: p.read_bytes() for p in hf.iterdir()} == files
    (hf / "README.md").write_text("# my notes on this model")  # edited since: the user's
    with pytest.raises(Error, match=r"\(or changed since\), which this one would replace or "):
        export(ckpt, str(hf))
    assert (hf / "README.md").read_text() == "# my notes on this model"
    assert (hf / "notes.txt").read_text() == "mine"


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


# ------------------------------------------------------------------------------------------ chat
# every role, several turns, text beyond ASCII, empty contents
CONVERSATIONS = [
    [{"role": "user", "content": "hello"}],
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "héllo 世界 🙂"},
        {"role": "assistant", "content": "world"},
        {"role": "user", "content": " two  words\n"},
    ],
    [{"role": role, "content": ""} for role in ("system", "user", "assistant")],
]
CONTENTS = [m["content"] for messages in CONVERSATIONS for m in messages]


@pytest.fixture(scope="module")
def chat_exports(tmp_path_factory):
    """{kind: (model, our chat tokenizer, its export)}: random chat models over the
    conversations' characters (and an end of text), a BPE trained on them and, where the shared
    folder holds its file, GPT-2's BPE."""
    from lib.bpe import save_ranks, train_bpe

    root = tmp_path_factory.mktemp("chat")
    (root / "data").mkdir()
    trained = save_ranks(train_bpe(CONTENTS * 20, 300).ranks, root / "data")
    chars = "".join(sorted(set("".join(CONTENTS))))
    specs = {"char": {"type": "char", "chars": chars, "eot": True}, "trained": trained}
    if os.path.isdir(os.environ.get("TIKTOKEN_CACHE_DIR", "")):
        specs["gpt2"] = {"type": "bpe", "encoding": "r50k_base"}
    found = {}
    for kind, spec in specs.items():
        spec = {**spec, "chat": True}
        model = checkpoint(root / kind, spec, root / "data")
        export(str(root / kind), str(root / f"hf-{kind}"))
        tokenizer = get_tokenizer(spec, str(root / "data" / "meta.json"))
        found[kind] = model, tokenizer, root / f"hf-{kind}"
    return found


def chat_export(chat_exports, kind):
    if kind not in chat_exports:
        pytest.skip("GPT-2's BPE needs TIKTOKEN_CACHE_DIR (the shared folder's tiktoken_cache)")
    return chat_exports[kind]


@pytest.mark.parametrize("kind", ["char", "trained", "gpt2"])
def test_a_chat_models_template_gives_our_ids(chat_exports, kind):
    """transformers' apply_chat_template renders each conversation as ours: every role, several
    turns, empty contents, with or without the assistant's marker to answer after; the chat tokens
    are special tokens at our ids, and <|end|> ends a reply."""
    from lib.chat import END, SPECIAL_TOKENS

    _, ours, folder = chat_export(chat_exports, kind)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    for messages in CONVERSATIONS:
        for reply in (False, True):
            rendered = tokenizer.apply_chat_template(
                messages, add_generation_prompt=reply, return_dict=True
            )
            assert rendered["input_ids"] == ours.render(messages, reply)[0], (messages, reply)
    added = json.loads((folder / "tokenizer.json").read_text())["added_tokens"]
    first = ours.base.vocab_size  # the chat tokens follow the end of text
    chat = {token: first + i for i, token in enumerate(SPECIAL_TOKENS)}
    assert {t["content"]: t["id"] for t in added if t["special"]} == {EOT: first - 1, **chat}
    assert tokenizer.eos_token == END and tokenizer.eos_token_id == first + 3
    generation = json.loads((folder / "generation_config.json").read_text())
    ends = [first + 3, first - 1, first, first + 1, first + 2]  # <|end|>, then the others
    assert generation == {"bos_token_id": first - 1, "eos_token_id": ends}


def our_reply(model, prompt, end_token, n):
    """Our greedy reply to prompt (ids), as sample.py's engine decodes it, and the end of its
    turn if drawn within n tokens."""
    engine = Engine(model, 1)
    pick = NextToken(Options(), greedy=True)
    row = engine.submit(prompt, [pick], n, [end_token]).rows[0]
    while engine.busy():
        engine.step()
    return row.generated + [end_token] * row.ended


def hf_reply(model, prompt, n):
    """transformers' greedy generate: the ids after prompt."""
    ids = torch.tensor([prompt])
    out = model.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False
    )
    return out[0, len(prompt) :].tolist()


def test_generate_replies_as_ours_and_stops_at_the_end_of_the_turn(chat_exports):
    """A random chat model of a trained BPE: transformers' greedy generate gives our replies'
    tokens, and stops where ours stop, at <|end|>, one of them after a few tokens."""
    model, ours, folder = chat_exports["trained"]
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    replies = []
    for messages in CONVERSATIONS:
        prompt = ours.render(messages, reply=True)[0]
        replies.append(our_reply(model, prompt, ours.end_token, 8))
        assert hf_reply(hf, prompt, 8) == replies[-1], messages
    assert any(len(reply) > 1 and reply[-1] == ours.end_token for reply in replies)


def test_generate_stops_at_a_role_marker_as_our_replies_end(tmp_path):
    """An undertrained chat model draws a role marker mid-reply: transformers' greedy generate
    stops at it, as our replies end there, on the same tokens."""
    out_dir = marker_checkpoint(tmp_path / "markers")
    export(out_dir, str(tmp_path / "hf"))
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    model, info = load_pretrained(out_dir)
    ours = get_tokenizer(info["tokenizer"])
    prompt = ours.render([{"role": "user", "content": "a"}], reply=True)[0]
    engine = Engine(model, 1)
    row = engine.submit(prompt, [NextToken(Options(), greedy=True)], 20).rows[0]
    while engine.busy():
        engine.step()
    drawn = row.generated  # no end tokens: the markers drawn stay in
    cut = next(i for i, t in enumerate(drawn) if t in end_tokens(ours))
    assert 0 < cut < 19
    assert hf_reply(hf, prompt, 20) == drawn[: cut + 1]
