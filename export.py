"""
Export a GPT checkpoint of this project to the Hugging Face GPT-2 layout, which transformers loads
as GPT2LMHeadModel (AutoModelForCausalLM, pipeline("text-generation")):
  python export.py --out_dir=out-shakespeare --hf_dir=hf-shakespeare
writes config.json (model_type gpt2), model.safetensors (GPT-2's names; its Conv1D weights are
[in, out]), generation_config.json, a model card (README.md) and the tokenizer's files for
AutoTokenizer (tokenizer.json; a byte-pair encoding's vocab.json and merges.txt too), which give
our ids; a trained BPE's tokenizer.tiktoken too, which sample.py reads; export_manifest.json lists
them with their sha256: a later export there replaces them as written, and any other file in its
way (or one changed since) only with --overwrite. A
chat model's carry its template (tokenizer_config.json's chat_template) and end a reply at <|end|>
(eos).
Options GPT-2 does not have (rotary positions, QK-norm, a sparse attention pattern) cannot be
expressed in its layout: such a model is refused.
  python export.py --out_dir=out-shakespeare-char --gguf=shakespeare.gguf --gguf_dtype=q8_0
writes one GGUF file, which llama.cpp, Ollama and LM Studio run (llama.cpp's gpt2 architecture, the
tokenizer inside, a chat model's tokens and template too; needs the gguf package: pip install -e
'.[gguf]'). Its GELU is the tanh form: a model trained with gelu=none is refused there.
"""

import hashlib
import os
import shutil
import sys
from contextlib import contextmanager

import torch
from safetensors.torch import save_file

from lib.bpe import RANKS_FILE, BPETokenizer, bpe_files, save_ranks
from lib.common import ArgumentParser, Error, read_json, run_script
from lib.files import WriteError, atomic_path, fsync, temporary, write_json, writing
from lib.gpt2 import HF_GELU
from lib.options import Option, flags
from lib.tokenizer import EOT, end_tokens, special_tokens
from lib.weights import from_checkpoint, get_tokenizer

# the options' values that GPT-2's layout can hold: dense attention, learned positions
GPT2_LAYOUT = {"rope": False, "qk_norm": False, "window": 0, "global_tokens": 0, "random_links": 0}
# and llama.cpp's gpt2 architecture, whose GELU is the tanh form
GGUF_LAYOUT = {**GPT2_LAYOUT, "gelu": "tanh"}
# --gguf_dtype: the weight matrices' type (gguf_export.py); q8_0: llama.cpp's int8 blocks
GGUF_DTYPES = ("float32", "float16", "q8_0")
# transformers' activation_function of each of GPTConfig's gelu forms
HF_ACTIVATION = {gelu: name for name, gelu in HF_GELU.items()}


def hf_state_dict(model, conv1d=True):
    """Our tensors under GPT-2's names; with conv1d, Linear weights transposed to Conv1D's [in,
    out], as GPT-2's folders hold them (GGUF's are Linear's); zeros for the biases a bias=False
    model lacks (GPT-2 has them everywhere)."""
    state = {}
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight":
            continue  # tied to wte: transformers ties it again on load
        hf = "transformer." + name.replace("blocks.", "h.").replace(".qkv.", ".c_attn.").replace(
            ".proj.", ".c_proj."
        )
        hf = hf.replace(".fc.", ".c_fc.")
        linear = hf.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight"))
        state[hf] = tensor.t().contiguous() if conv1d and linear else tensor
    for name in list(state):
        if name.endswith(".weight") and name.split(".")[-2] in (
            "ln_1",
            "ln_2",
            "ln_f",
            "c_attn",
            "c_proj",
            "c_fc",
        ):
            bias = name[: -len("weight")] + "bias"
            outputs = state[name].shape[-1 if conv1d else 0]  # Conv1D's [in, out]
            state.setdefault(bias, torch.zeros(outputs))
    return state


def model_card(info, config, tokenizer):
    metrics = info.get("metrics", {})
    command = " ".join(info.get("command") or ["(not recorded)"])
    return "\n".join(
        [
            "---",
            "library_name: transformers",
            "pipeline_tag: text-generation",
            "tags: [gpt2, gpt-starter]",
            "---",
            "",
            f"# {info.get('dataset', 'a')} GPT "
            f"({config.n_layer} layers, {config.n_head} heads, d = {config.n_embd})",
            "",
            f"Trained from {info.get('init_from', 'scratch')} by gpt-starter's train.py "
            f"on the `{info.get('dataset')}` data set, "
            "exported to the GPT-2 layout by its export.py. "
            "Validation metrics of this checkpoint (the best one):",
            "",
            "| | |",
            "|---|---|",
            f"| context | {config.block_size} tokens |",
            f"| vocabulary | {config.vocab_size} |",
            f"| tokenizer | {tokenizer.name} |",
            *[
                f"| {k} | {v:.4f} |" if isinstance(v, float) else f"| {k} | {v} |"
                for k, v in metrics.items()
            ],
            "",
            "Trained with:",
            "",
            "```",
            command,
            "```",
            "",
        ]
    )


# the list of the files an export wrote, which lets the next export replace them
MANIFEST = "export_manifest.json"
# the files an export may write: an earlier export's that the new one lacks are removed
EXPORT_FILES = (
    "model.safetensors",
    "config.json",
    "generation_config.json",
    "README.md",
    "vocab.json",
    "merges.txt",
    "tokenizer.json",
    "tokenizer_config.json",
    RANKS_FILE,
    MANIFEST,
)
# the files a PEFT adapter folder's export may write
PEFT_FILES = ("adapter_model.safetensors", "adapter_config.json", MANIFEST)


def check_target(out_dir, hf_dir, overwrite, flag="--hf_dir", files=EXPORT_FILES):
    """hf_dir (flag's) is a folder this export may write into: never the checkpoint it reads, and
    none of files there unless an earlier export wrote it or overwrite says to replace it."""
    if os.path.exists(hf_dir) and not os.path.isdir(hf_dir):
        raise Error(f"{flag} {hf_dir} is a file: pass a folder")
    if os.path.isdir(hf_dir) and os.path.samefile(out_dir, hf_dir):
        raise Error(f"{flag} {hf_dir} is the checkpoint being exported: pass another folder")
    if overwrite:
        return
    ours = exported_files(hf_dir)
    held = [
        name for name in files if os.path.lexists(os.path.join(hf_dir, name)) and name not in ours
    ]
    if held:
        raise Error(
            f"{flag} {hf_dir} holds files no export wrote there (or changed since), "
            f"which this one would replace or remove ({', '.join(held)}): pass another "
            "folder, or --overwrite"
        )


def exported_files(hf_dir):
    """The files that MANIFEST says an earlier export wrote in hf_dir, as it wrote them (each
    its sha256), and MANIFEST; none where it says nothing readable."""
    try:
        manifest = read_json(os.path.join(hf_dir, MANIFEST), "export manifest")
    except Error:  # absent or damaged: the files are nobody's
        return []
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict):
        return []
    kept = [name for name, digest in files.items() if sha256(hf_dir, name) == digest]
    return kept + [MANIFEST]


def sha256(folder, name):
    """The sha256 of folder/name, a regular file's; None for anything else."""
    path = os.path.join(folder, name)
    if os.path.islink(path) or not os.path.isfile(path):
        return None
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


@contextmanager
def staged(hf_dir, files=EXPORT_FILES):
    """A new folder in hf_dir (one filesystem: each move a rename) to write the export into, then
    moved out file by file, MANIFEST listing them, an earlier export's other files removed: a
    failed export leaves what hf_dir held as it was."""
    hf_dir = os.path.normpath(hf_dir)
    staging = temporary(os.path.join(hf_dir, ".export"))
    with writing(hf_dir):
        os.makedirs(staging)
    try:
        yield staging
        written = sorted(os.listdir(staging))
        digests = {name: sha256(staging, name) for name in written}
        write_json(os.path.join(staging, MANIFEST), {"files": digests})
        written.append(MANIFEST)
        for name in written:
            os.replace(os.path.join(staging, name), os.path.join(hf_dir, name))
        for name in set(files) - set(written):
            if os.path.lexists(os.path.join(hf_dir, name)):
                os.remove(os.path.join(hf_dir, name))
        fsync(hf_dir)
    except WriteError as e:  # named by the file it replaces
        raise WriteError(str(e).replace(staging, hf_dir)) from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def export(
    out_dir, hf_dir=None, overwrite=False, gguf_path=None, gguf_dtype="float16", peft_dir=None
):
    """Writes the Hugging Face folder hf_dir, the GGUF file gguf_path, or both (an adapter's
    merged into its base), and an adapter's PEFT folder peft_dir; every refusal comes before the
    first write."""
    model, info = from_checkpoint(out_dir)
    if peft_dir is not None:
        from lib.lora import peft_adapter, write_peft

        peft = peft_adapter(out_dir, info)
    config_path = os.path.join(out_dir, "config.json")
    tokenizer = get_tokenizer(info.get("tokenizer"), config_path, model.config.vocab_size)
    if info["architecture"] != "GPT":
        raise Error(
            f"{out_dir} holds an {info['architecture']}: export.py writes GPT-2's layout, for a GPT"
        )
    check_layout(
        out_dir,
        model.config,
        GPT2_LAYOUT,
        "GPT-2's layout",
        "such a model loads with this project's from_checkpoint only",
    )
    if gguf_path is not None:
        check_layout(
            out_dir,
            model.config,
            GGUF_LAYOUT,
            "llama.cpp's gpt2 architecture",
            "--hf_dir exports it for transformers",
        )
        check_gguf_target(gguf_path, overwrite)
        if getattr(tokenizer, "lowercase", False):
            raise Error(
                f"{out_dir}: the tokenizer lowercases text, which llama.cpp's tokenizers never "
                "do: export it with --hf_dir, or train on a tokenizer without lowercase"
            )
        write_gguf = gguf_writer()
    if hf_dir is not None:
        check_target(out_dir, hf_dir, overwrite)
    if peft_dir is not None:
        check_target(out_dir, peft_dir, overwrite, "--peft_dir", PEFT_FILES)
    if hf_dir and peft_dir and os.path.realpath(hf_dir) == os.path.realpath(peft_dir):
        raise Error(
            f"--hf_dir and --peft_dir name one folder ({peft_dir}), whose manifest lists one "
            "export's files: pass two folders"
        )
    # refused, if at all, before a file is written
    base = getattr(tokenizer, "base", tokenizer)  # a chat tokenizer's own
    bpe = bpe_files(tokenizer.enc) if isinstance(base, BPETokenizer) else None
    if hf_dir is not None:
        write_hf(hf_dir, model, info, tokenizer, bpe)
    if gguf_path is not None:
        with writing(gguf_path):
            os.makedirs(os.path.dirname(os.path.abspath(gguf_path)), exist_ok=True)
        name = f"{info.get('dataset') or 'gpt-starter'} GPT"
        state = hf_state_dict(model, conv1d=False)
        write_gguf(gguf_path, state, model.config, tokenizer, bpe, gguf_dtype, name)
        print(
            f"wrote {gguf_path}: llama.cpp's gpt2, {gguf_dtype} weights, "
            f"{os.path.getsize(gguf_path) / 1e6:.1f} MB; tokenizer: {tokenizer.name}",
            file=sys.stderr,
        )
    if peft_dir is not None:
        with staged(peft_dir, PEFT_FILES) as folder:
            write_peft(folder, *peft)
        print(f"wrote {peft_dir}: a PEFT LoRA adapter of rank {peft[1]['r']}", file=sys.stderr)


def check_layout(out_dir, config, layout, where, fix):
    """An Error naming the first option whose value the layout where cannot hold."""
    for option, value in layout.items():
        if getattr(config, option) != value:
            raise Error(
                f"{out_dir}: {option}={getattr(config, option)!r} has no place in {where} "
                f"(it needs {option}={value!r}); {fix}"
            )


def check_gguf_target(path, overwrite):
    """path is a new *.gguf file, or one that overwrite says to replace."""
    if not path.endswith(".gguf"):
        raise Error(f"--gguf {path}: name the file *.gguf, as llama.cpp, Ollama and LM Studio do")
    if os.path.isdir(path):
        raise Error(f"--gguf {path} is a folder: pass a file name")
    if os.path.lexists(path) and not overwrite:
        raise Error(
            f"--gguf {path} already exists: pass another name, or --overwrite to replace it"
        )


def gguf_writer():
    """gguf_export's write_gguf, imported here: the gguf package is an optional extra."""
    try:
        from gguf_export import write_gguf
    except ImportError as e:
        raise Error(
            f"--gguf needs the gguf package, llama.cpp's GGUF writer ({e}): "
            "pip install -e '.[gguf]'"
        ) from None
    return write_gguf


def write_hf(hf_dir, model, info, tokenizer, bpe):
    """The Hugging Face folder: GPT-2's config, weights and tokenizer files, and a model card."""
    config = model.config
    with staged(hf_dir) as folder:
        with atomic_path(os.path.join(folder, "model.safetensors")) as tmp:
            save_file(hf_state_dict(model), tmp, metadata={"format": "pt"})
        if "file" in tokenizer.spec:  # a trained BPE's, which sample.py reads the export with
            tokenizer.spec = {**tokenizer.spec, **save_ranks(tokenizer.ranks, folder)}
        bos = tokenizer.eot_token
        # a chat model's replies end at the end of its turn (transformers' generate stops there)
        eos = tokenizer.end_token if tokenizer.spec.get("chat") else bos
        write_json(
            os.path.join(folder, "config.json"),
            {
                "model_type": "gpt2",
                "architectures": ["GPT2LMHeadModel"],
                "vocab_size": config.vocab_size,
                "n_positions": config.block_size,
                # GPT-2's own config.json carries both: llama.cpp's converter reads n_ctx
                "n_ctx": config.block_size,
                "n_embd": config.n_embd,
                "n_layer": config.n_layer,
                "n_head": config.n_head,
                "activation_function": HF_ACTIVATION[config.gelu],
                "layer_norm_epsilon": 1e-5,
                "resid_pdrop": 0.0,
                "embd_pdrop": 0.0,
                "attn_pdrop": 0.0,
                "tie_word_embeddings": True,
                "bos_token_id": bos,
                "eos_token_id": eos,
                "torch_dtype": "float32",
                # this project's tokenizer (characters or a tiktoken encoding), for sample.py
                "tokenizer": tokenizer.spec,
            },
        )
        # generate stops at any special token, as our replies end at a role marker drawn
        ends = [eos, *sorted(end_tokens(tokenizer) - {eos})]
        write_json(
            os.path.join(folder, "generation_config.json"),
            {"bos_token_id": bos, "eos_token_id": ends[0] if len(ends) == 1 else ends},
        )
        described = write_tokenizer(folder, tokenizer, bpe, config.block_size)
        with (
            atomic_path(os.path.join(folder, "README.md")) as tmp,
            open(tmp, "w", encoding="utf-8") as f,
        ):
            f.write(model_card(info, config, tokenizer))
    print(
        f"wrote {hf_dir}: GPT2LMHeadModel, {model.num_params() / 1e6:.2f}M parameters; "
        f"tokenizer: {tokenizer.name}, {described}",
        file=sys.stderr,
    )


def write_tokenizer(folder, tokenizer, bpe, block_size):
    """The tokenizer's files for AutoTokenizer -> what they are. bpe: lib/bpe.py's bpe_files()
    (vocab, merges) of a BPE, None for characters. A chat model's carry its template, and end a
    reply at the end of a turn."""
    settings = {"model_max_length": block_size}
    if tokenizer.eot_token is not None:
        settings |= {"bos_token": EOT, "eos_token": EOT}
    hf_tokenizer(tokenizer, bpe).save(os.path.join(folder, "tokenizer.json"))
    described = "tokenizer.json: AutoTokenizer gives a character's id"
    if bpe is None:
        settings["tokenizer_class"] = "PreTrainedTokenizerFast"
    else:
        vocab, merge_lines = bpe
        write_json(os.path.join(folder, "vocab.json"), vocab | special_tokens(tokenizer))
        with (
            atomic_path(os.path.join(folder, "merges.txt")) as tmp,
            open(tmp, "w", encoding="utf-8") as f,
        ):
            f.write("#version: 0.2\n" + "\n".join(merge_lines) + "\n")
        settings |= {
            "tokenizer_class": "GPT2Tokenizer",
            "unk_token": EOT,
            "add_prefix_space": False,
        }
        described = "tokenizer.json, vocab.json, merges.txt: AutoTokenizer gives tiktoken's ids"
    if tokenizer.spec.get("chat"):
        from lib.chat import END, TEMPLATE

        settings |= {"eos_token": END, "chat_template": TEMPLATE}
        described += "; the chat template"
    write_json(os.path.join(folder, "tokenizer_config.json"), settings)
    return described


def hf_tokenizer(tokenizer, bpe):
    """Our tokenizer as Hugging Face's tokenizers holds it: characters each a word of its own,
    decoded by joining them, or bpe's byte-pair encoding of GPT-2's words; the special tokens
    (the end of text, a chat model's) at our ids, never made from text."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    specials = special_tokens(tokenizer)
    if bpe is None:
        hf = Tokenizer(models.WordLevel(tokenizer.stoi | specials, unk_token=None))
        hf.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
        hf.decoder = decoders.Fuse()
    else:
        vocab, merge_lines = bpe
        pairs = [tuple(line.split(" ")) for line in merge_lines]
        hf = Tokenizer(models.BPE(vocab | specials, pairs))
        hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        hf.decoder = decoders.ByteLevel()
    hf.add_special_tokens(list(specials))
    return hf


FLAGS = dict(
    hf_dir=Option(None, "the folder to write the Hugging Face model into"),
    gguf=Option(None, "the GGUF file to write, for llama.cpp (name.gguf)"),
    gguf_dtype=Option(
        "float16",
        "the GGUF file's weight matrices; q8_0: llama.cpp's int8, the smallest",
        choices=GGUF_DTYPES,
    ),
    peft_dir=Option(None, "a LoRA checkpoint's PEFT adapter folder, for its base's export"),
    overwrite=Option(
        False,
        "replace or remove files in --hf_dir that no earlier export wrote, or replace the "
        "--gguf file (refused without it)",
    ),
)


def main(argv=None):
    parser = ArgumentParser(prog="export.py", description=__doc__)
    parser.add_argument("--out_dir", required=True, help="a GPT checkpoint written by train.py")
    flags(parser, FLAGS)
    args = parser.parse_args(argv)
    if args.hf_dir is None and args.gguf is None and args.peft_dir is None:
        parser.error("pass --hf_dir, --gguf, --peft_dir or more: where to write the model")
    export(args.out_dir, args.hf_dir, args.overwrite, args.gguf, args.gguf_dtype, args.peft_dir)


if __name__ == "__main__":
    run_script(main, "export.py")
