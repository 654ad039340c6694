"""LoRA: adapters on a frozen start (step 0 is the base's), saved alone with the base's name and
hash, resumed exactly, merged at load, and exported merged or as PEFT's adapter folder: the same
greedy tokens everywhere."""

import json
import os
import pathlib
import re
import shutil

import numpy as np
import pytest
import torch
from conftest import TINY, random_chat_gpt, save_chat_gpt
from safetensors.torch import load_file, save_file
from test_robustness import DELETE, cli, damaged_copy
from test_train import torchrun

import train
from export import export
from lib.checkpoint import save_pretrained
from lib.common import Error
from lib.finetune import adapted
from lib.settings import make_model
from lib.weights import load_pretrained
from model import GPT, GPTConfig
from optim import configure_optimizers

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors: one thread

CHARS = "abcde :"
# TINY's schedule on base's shape
SCHEDULE = [
    a for a in TINY if a.split("=")[0] not in ("--n_layer", "--n_head", "--n_embd", "--block_size")
]
LORA = ["--lora_rank=4", "--lora_targets=attn.qkv,mlp.proj", "--lora_alpha=8"]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A random chat GPT in GPT-2's layout (its chat tokens in its table: none grow), saved."""
    model = random_chat_gpt(CHARS, block_size=128, n_layer=2, n_embd=16)
    return save_chat_gpt(model, CHARS, tmp_path_factory.mktemp("base"))


@pytest.fixture(scope="module")
def chats(base, tmp_path_factory):
    """Short conversations prepared for base."""
    folder = tmp_path_factory.mktemp("chats")
    rng = np.random.default_rng(0)
    with open(folder / "chats.jsonl", "w") as f:
        for _ in range(100):
            ask, reply = ("".join(rng.choice(list("abcde"), 3)) for _ in range(2))
            turns = [{"role": "user", "content": ask}, {"role": "assistant", "content": reply}]
            f.write(json.dumps({"messages": turns}) + "\n")
    code, _, err = cli(
        "data/chat/prepare.py",
        f"--source={folder / 'chats.jsonl'}",
        f"--tokenizer_from={base}",
        f"--out_dir={folder}",
        "--val_fraction=0.2",
    )
    assert code == 0, err
    return str(folder)


def tune(chats, base, out_dir, *extra):
    """train.py: LoRA on base over chats, TINY's schedule -> (model, last metrics)."""
    argv = [f"--dataset={chats}", f"--init_from={base}", f"--out_dir={out_dir}"]
    return train.main(SCHEDULE + LORA + argv + ["--eval_interval=3", *extra])


@pytest.fixture(scope="module")
def tuned(base, chats, tmp_path_factory):
    """(folder, model, metrics) of a 6-step LoRA fine-tune."""
    out_dir = tmp_path_factory.mktemp("tuned")
    model, metrics = tune(chats, base, out_dir, "--max_iters=6")
    return str(out_dir), model, metrics


def greedy(model, n=100):
    """n greedy tokens after token 0, the whole context each step."""
    idx = torch.zeros(1, 1, dtype=torch.long)
    with torch.no_grad():
        for _ in range(n):
            logits, _ = model(idx[:, -model.config.block_size :])
            idx = torch.cat([idx, logits[:, -1:].argmax(-1)], 1)
    return idx[0, 1:].tolist()


def test_step_0_is_the_base_and_only_the_adapters_train(base, chats):
    cfg, _ = train.parse(
        SCHEDULE + LORA + [f"--dataset={chats}", f"--init_from={base}"], train.OPTIONS, ""
    )
    meta = json.load(open(os.path.join(chats, "meta.json")))
    cfg, model = make_model(cfg, meta, None, set())
    source, _ = load_pretrained(base)
    idx = torch.randint(0, len(CHARS), (2, 12))
    with torch.no_grad():
        assert torch.equal(model.eval()(idx)[0], source(idx)[0])
    trained = [n for n, p in model.named_parameters() if p.requires_grad]
    assert len(trained) == 2 * 2 * 2 and all(".lora_" in n for n in trained)
    (adamw,) = configure_optimizers(model, 0.1, 1e-3, (0.9, 0.95), "cpu")
    held = [p for group in adamw.param_groups for p in group["params"]]
    assert {id(p) for p in held} == {id(p) for p in model.parameters() if p.requires_grad}


def test_the_frozen_count_is_the_bases_alone(capsys):
    model = GPT(GPTConfig(vocab_size=9, block_size=16, n_layer=2, n_head=2, n_embd=16))
    frozen = model.num_params(False)
    adapted(model, dict(rank=4, alpha=8.0, dropout=0.0, targets="attn.qkv"), None)
    assert f": 512 trainable parameters, the base's {frozen:,} frozen" in capsys.readouterr().err


def test_the_checkpoint_holds_the_adapters_and_names_the_base(base, tuned):
    out_dir, model, _ = tuned
    card = json.load(open(os.path.join(out_dir, "config.json")))
    adapter = card["adapter"]
    assert adapter["base"] == os.path.abspath(base) and len(adapter["sha256"]) == 64
    assert (adapter["rank"], adapter["alpha"], adapter["targets"]) == (4, 8.0, "attn.qkv,mlp.proj")
    state = torch.load(os.path.join(out_dir, "trainer_state.pt"), weights_only=True)
    names = set(state["model"])
    assert names and all(".lora_" in n for n in names) and state["adapter"] == adapter
    assert not torch.equal(model.blocks[0].attn.qkv.lora_B, torch.zeros(48, 4))


def test_a_lora_fine_tune_resumes_exactly(base, chats, tuned, tmp_path):
    _, model, metrics = tuned
    tune(chats, base, tmp_path, "--max_iters=3")
    resumed, resumed_metrics = tune(chats, base, tmp_path, "--max_iters=6", "--init_from=resume")
    for (name, p), q in zip(model.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(p, q), name
    assert metrics == resumed_metrics


def test_the_adapter_checkpoint_decodes_as_its_merge(tuned):
    """sample.py and serve.py load the adapters merged into the base: the same greedy tokens as
    the adapters beside the frozen weights."""
    out_dir, model, _ = tuned
    merged, _ = load_pretrained(out_dir)
    assert not any(".lora_" in n for n, _ in merged.named_parameters())
    assert greedy(merged) == greedy(model.eval())


def test_exports_and_peft_decode_as_the_adapter(base, tuned, tmp_path):
    """The merged export in transformers and PEFT's adapter on the base's export: 100 greedy
    tokens each, the adapter checkpoint's."""
    transformers = pytest.importorskip(
        "transformers", reason="a test extra: pip install -e .[test]"
    )
    out_dir, model, _ = tuned
    ours = greedy(model.eval())
    export(out_dir, str(tmp_path / "merged"))
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "merged").eval()
    start = torch.zeros(1, 1, dtype=torch.long)
    # no end tokens (the export's are the chat markers): 100 tokens whatever they are
    options = dict(max_new_tokens=100, do_sample=False, pad_token_id=0)
    hf.generation_config.eos_token_id = None
    assert hf.generate(start, **options)[0, 1:].tolist() == ours
    peft = pytest.importorskip("peft", reason="peft is a test extra: pip install -e .[test]")
    export(base, str(tmp_path / "base"))
    export(out_dir, peft_dir=str(tmp_path / "peft"))
    plain = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "base")
    plain.generation_config.eos_token_id = None
    adapted = peft.PeftModel.from_pretrained(plain, tmp_path / "peft").eval()
    assert adapted.generate(input_ids=start, **options)[0, 1:].tolist() == ours


def test_llama_cpp_decodes_the_merged_gguf_as_the_adapter(tuned, tmp_path):
    """The merged GGUF file (float32) in llama.cpp: 100 greedy tokens, the adapter checkpoint's."""
    pytest.importorskip("gguf", reason="the gguf package is an extra: pip install -e '.[gguf]'")
    pytest.importorskip("llama_cpp", reason="needs llama-cpp-python (it builds llama.cpp)")
    from bench.gguf_check import llama_greedy, load_llama

    out_dir, model, _ = tuned
    path = tmp_path / "merged.gguf"
    export(out_dir, gguf_path=str(path), gguf_dtype="float32")
    theirs, logits, _ = llama_greedy(load_llama(path), [0], 100)
    ours = greedy(model.eval())
    assert theirs == ours
    # each step's logits too (a tiny random model's greedy tokens repeat a few ids), within
    # what llama.cpp's float16 KV cache moves them
    with torch.no_grad():
        mine = model(torch.tensor([[0, *ours[:-1]]]))[0][0].numpy()
    np.testing.assert_allclose(np.stack(logits), mine, atol=1e-3)


def broken(tmp_path, chats, base, *argv):
    """train.py's one line for argv over TINY, LoRA on base."""
    code, _, err = cli(
        "train.py", *SCHEDULE, f"--dataset={chats}", f"--out_dir={tmp_path / 'out'}", *argv
    )
    assert code == 2, err
    return err.strip().splitlines()


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--lora_alpha=4"], "lora_alpha=4.0 but lora_rank=0 (no adapters): pass --lora_rank=8"),
        (["--lora_rank=-1"], "lora_rank=-1: must be >= 0"),
        (["--lora_rank=4", "--lora_targets=mlp.fc2"], "'mlp.fc2' is not a block's Linear"),
        (["--lora_rank=17"], "lora_rank=17 is above the targets' width 16 (n_embd)"),
        (["--lora_rank=4", "--init_from=scratch"], "adapts a pretrained model"),
    ],
)
def test_bad_lora_keys_are_one_line(base, chats, tmp_path, argv, says):
    start = [] if "--init_from=scratch" in argv else [f"--init_from={base}"]
    (line,) = broken(tmp_path, chats, base, *start, *argv)
    assert line.startswith("train.py: error: ") and says in line


def test_a_changed_or_missing_base_is_one_line(base, chats, tmp_path):
    copy = shutil.copytree(base, tmp_path / "base")
    tune(chats, copy, tmp_path / "t", "--max_iters=1")
    model, _ = load_pretrained(copy)
    with torch.no_grad():
        model.ln_f.bias += 1
    save_pretrained(
        model, copy, task="lm", tokenizer=json.load(open(copy / "config.json"))["tokenizer"]
    )
    with pytest.raises(Error, match=r"its base .* changed since the adapter was trained"):
        load_pretrained(tmp_path / "t")
    os.remove(copy / "model.safetensors")
    code, _, err = cli("sample.py", f"--out_dir={tmp_path / 't'}", "--max_new_tokens=2")
    assert code == 2 and "its base" in err and "is missing" in err, err


@pytest.mark.slow
def test_a_lora_fine_tune_under_ddp_equals_one_process(base, chats, tmp_path):
    """Two ranks, a micro-step each, against one process taking both: the adapters equal bit
    for bit."""
    argv = (
        SCHEDULE
        + LORA
        + [
            f"--dataset={chats}",
            f"--init_from={base}",
            "--max_iters=2",
            "--gradient_accumulation_steps=2",
            "--eval_interval=100",
        ]
    )
    result = torchrun(tmp_path, [argv + [f"--out_dir={tmp_path / 'ddp'}"]])
    assert result.returncode == 0, result.stderr[-2000:]
    single, _ = train.main(argv + [f"--out_dir={tmp_path / 'one'}"])
    rank0, _ = torch.load(tmp_path / "ddp" / "rank0.pt")
    assert set(rank0) == set(single.state_dict())
    for name, p in single.state_dict().items():
        assert torch.equal(rank0[name], p), name


def test_a_peft_dir_of_a_grown_table_is_refused_before_the_hf_dir_is_written(tuned, tmp_path):
    """A fine-tune that grew the base's token table has no PEFT form: export.py says so before
    it writes the merged folder it was also asked for."""
    grown = shutil.copytree(tuned[0], tmp_path / "grown")
    card = json.load(open(grown / "config.json"))
    card["model"]["vocab_size"] += 4  # the rows a chat fine-tune of a plain base adds
    json.dump(card, open(grown / "config.json", "w"))
    folders = f"--hf_dir={tmp_path / 'hf'}", f"--peft_dir={tmp_path / 'peft'}"
    code, _, err = cli("export.py", f"--out_dir={grown}", *folders)
    assert code == 2 and "grew the base's token table (11 to 15 rows)" in err, err
    assert not (tmp_path / "hf").exists() and not (tmp_path / "peft").exists()


def test_one_folder_for_hf_dir_and_peft_dir_is_refused_before_a_write(tuned, tmp_path):
    """Each export's manifest lists its own files: the second would disown the first's, so one
    folder named twice is one line, nothing written."""
    folders = f"--hf_dir={tmp_path / 'both'}", f"--peft_dir={tmp_path / '.' / 'both'}"
    code, _, err = cli("export.py", f"--out_dir={tuned[0]}", *folders)
    assert code == 2 and "--hf_dir and --peft_dir name one folder" in err, err
    assert not (tmp_path / "both").exists()


@pytest.mark.parametrize("change", ["missing", "extra", "shape"])
def test_adapter_tensors_unlike_the_card_are_one_line(tuned, tmp_path, change):
    out_dir = shutil.copytree(tuned[0], tmp_path / "t")
    path = out_dir / "model.safetensors"
    tensors = load_file(path)
    name = "blocks.0.attn.qkv.lora_A"
    if change == "missing":
        del tensors[name]
    elif change == "extra":
        tensors["blocks.0.mlp.fc.lora_A"] = tensors[name].clone()
    else:
        tensors[name] = tensors[name][:2]
    save_file(tensors, path)
    with pytest.raises(Error, match=f"^{re.escape(str(path))}: its tensors are not the adapters"):
        load_pretrained(out_dir)


def test_a_peft_dir_keeps_files_no_export_wrote_unless_asked(tuned, tmp_path):
    """A folder's own adapter files are refused in one line, every byte kept, unless overwrite;
    an export's, as it wrote them, are the next export's to replace."""
    peft = tmp_path / "peft"
    peft.mkdir()
    theirs = {"adapter_config.json": "{}", "adapter_model.safetensors": "mine"}
    for name, text in theirs.items():
        (peft / name).write_text(text)
    says = f"--peft_dir {peft} holds files no export wrote there (or changed since), which "
    with pytest.raises(Error, match=re.escape(says)):
        export(tuned[0], peft_dir=str(peft))
    assert {p.name: p.read_text() for p in peft.iterdir()} == theirs
    export(tuned[0], peft_dir=str(peft), overwrite=True)
    files = {p.name: p.read_bytes() for p in peft.iterdir()}
    assert files["adapter_model.safetensors"] != b"mine"
    export(tuned[0], peft_dir=str(peft))  # an earlier export's files, as it wrote them
    assert {p.name: p.read_bytes() for p in peft.iterdir()} == files


@pytest.mark.parametrize(
    "where, value, says",
    [
        ("adapter", "x", "adapter='x': must be dict"),
        ("adapter.base", DELETE, "no 'adapter.base' key"),
        ("adapter.rank", 0, "adapter.rank=0: must be >= 1"),
        ("adapter.targets", "attn.qkv,mlp.fc2", "adapter.targets='mlp.fc2': must be one of"),
        ("model.n_layer", "two", "model.n_layer='two': must be int"),
    ],
)
def test_a_damaged_adapter_card_is_one_line(tuned, tmp_path, where, value, says):
    """A card's adapter entry or model of the wrong type, out of range or missing (None)."""
    source = pathlib.Path(tuned[0])
    out_dir = damaged_copy(source, tmp_path / "t", "config.json", where, value)
    code, _, err = cli("sample.py", f"--out_dir={out_dir}", "--max_new_tokens=2")
    (line,) = err.strip().splitlines()
    assert code == 2 and says in line, err


def test_a_resume_with_other_lora_keys_is_refused_before_anything_is_touched(
    chats, tuned, tmp_path
):
    """The adapters' rank, scale and targets are the run's: a resume that changes one is one
    line, the run's files as they were."""
    out_dir = shutil.copytree(tuned[0], tmp_path / "t")
    before = {p.name: p.read_bytes() for p in out_dir.iterdir() if p.name != ".lock"}
    for key, value in (("lora_rank", 8), ("lora_alpha", 4.0), ("lora_targets", "attn.qkv")):
        argv = [f"--dataset={chats}", f"--out_dir={out_dir}", "--init_from=resume"]
        code, _, err = cli("train.py", *SCHEDULE, *argv, f"--{key}={value}")
        (line,) = err.strip().splitlines()
        assert code == 2 and f"{key}=" in line and f"{value!r} here" in line, err
    after = {p.name: p.read_bytes() for p in out_dir.iterdir() if p.name != ".lock"}
    assert after == before
