"""A GPT as one GGUF file, llama.cpp's format (its gpt2 architecture), which llama.cpp, Ollama and
LM Studio run: the weights under llama.cpp's names, the tokenizer inside. export.py --gguf imports
it, and the gguf package (llama.cpp's own writer) with it."""

import gguf
from gguf import GGMLQuantizationType as Type

from lib.files import atomic_path
from lib.tokenizer import special_tokens

# --gguf_dtype: (llama.cpp's file type, the type of its weight matrices); Q8_0 is int8 in blocks
# of 32 with a float16 scale each
DTYPES = {
    "float32": (gguf.LlamaFileType.ALL_F32, Type.F32),
    "float16": (gguf.LlamaFileType.MOSTLY_F16, Type.F16),
    "q8_0": (gguf.LlamaFileType.MOSTLY_Q8_0, Type.Q8_0),
}


def write_gguf(path, state, config, tokenizer, bpe, dtype, name):
    """Writes path whole or not at all. state: export.hf_state_dict's tensors (GPT-2's names,
    biases everywhere, Linear's [out, in]), renamed by llama.cpp's own table; bpe:
    lib/bpe.py's bpe_files' (vocab, merges), None for characters."""
    file_type, matrices = DTYPES[dtype]
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GPT2, config.n_layer)
    with atomic_path(path) as tmp:
        writer = gguf.GGUFWriter(tmp, "gpt2")
        writer.add_name(name)
        writer.add_context_length(config.block_size)
        writer.add_embedding_length(config.n_embd)
        writer.add_feed_forward_length(4 * config.n_embd)
        writer.add_block_count(config.n_layer)
        writer.add_head_count(config.n_head)
        writer.add_layer_norm_eps(1e-5)  # nn.LayerNorm's
        writer.add_file_type(file_type)
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
        add_tokenizer(writer, tokenizer, bpe)
        for hf_name, tensor in state.items():
            if hf_name == "transformer.wte.weight":
                # the rows past the tokenizer's (GPT-2's 50,257 padded to 50,304) are never read
                # nor picked: llama.cpp's vocabulary is the tokenizer's
                tensor = tensor[: tokenizer.vocab_size]
            array = tensor.float().contiguous().numpy()
            kind = tensor_type(hf_name, array, matrices)
            data = gguf.quants.quantize(array, kind)
            writer.add_tensor(names.get_name(hf_name, (".weight", ".bias")), data, raw_dtype=kind)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()


def tensor_type(hf_name, array, matrices):
    """As llama.cpp's converter stores them: norms, biases and the position table in float32, the
    other matrices in the file's type (float16 for Q8_0 where a row is no whole number of
    blocks)."""
    if array.ndim == 1 or hf_name == "transformer.wpe.weight":
        return Type.F32
    block = gguf.GGML_QUANT_SIZES[matrices][0]
    return Type.F16 if array.shape[-1] % block else matrices


def add_tokenizer(writer, tokenizer, bpe):
    """A byte-pair encoding as llama.cpp's gpt2 tokenizer (GPT-2's split of text into words, then
    the merges); characters as its rwkv one, the longest token that matches, which is the one
    character (a backslash escaped: rwkv's tokens read \\x00-style escapes). The special tokens
    follow as control tokens; a chat model's template and end of turn with them."""
    if bpe is None:
        writer.add_tokenizer_model("rwkv")
        tokens = [char.replace("\\", "\\\\") for char in tokenizer.chars]
    else:
        vocab, merges = bpe
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre("gpt-2")  # r50k's regular expression: ours, trained or not
        tokens = sorted(vocab, key=vocab.get)
        writer.add_token_merges(merges)
    types = [gguf.TokenType.NORMAL] * len(tokens)
    specials = special_tokens(tokenizer)  # their ids follow the vocabulary's
    tokens += specials
    types += [gguf.TokenType.CONTROL] * len(specials)
    eos = tokenizer.eot_token
    if tokenizer.spec.get("chat"):
        from lib.chat import TEMPLATE

        writer.add_chat_template(TEMPLATE)
        eos = tokenizer.end_token  # a reply ends at the end of its turn
        # named, not guessed from the tokens' text (<|endoftext|> would match as well)
        writer.add_eot_token_id(eos)
    if tokenizer.eot_token is not None:
        writer.add_bos_token_id(tokenizer.eot_token)
    if eos is not None:
        writer.add_eos_token_id(eos)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_add_bos_token(False)  # a prompt starts as given, as sample.py's
