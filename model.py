"""
The models, in one file. Attention is written once; one Block is built on it; two models share that Block:
  GPT                a causal decoder language model (the GPT-2 layout, LM head tied to the token embedding)
  EncoderClassifier  a bidirectional encoder: padding mask, mean pooling over real tokens, a class head
The math follows the course notes: Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V, d_k the size of one head.
"""
import json
import math
import os
from dataclasses import asdict, dataclass, fields

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import load_file, load_model, save_model


def attention(q, k, v, mask=None):
    """The explicit math on [..., n, d_k] tensors; returns (output, weights).
    mask is boolean, True = may attend (F.scaled_dot_product_attention's convention), broadcastable to the scores."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # a query with every key masked: 0/0, make it zeros
    return weights @ v, weights


class MultiHeadAttention(nn.Module):
    """h heads of size d_k = d/h from one fused Q/K/V projection (3d x d) plus W_O (d x d): 4 d^2 weights for any h."""

    def __init__(self, n_embd, n_head, dropout=0.0, bias=True):
        super().__init__()
        if n_embd % n_head:
            raise ValueError(f"n_embd={n_embd} must be divisible by n_head={n_head}")
        self.n_head, self.dropout = n_head, dropout
        self.qkv = nn.Linear(n_embd, 3 * n_embd, bias=bias)
        self.proj = nn.Linear(n_embd, n_embd, bias=bias)
        self.resid_dropout = nn.Dropout(dropout)

    def forward(self, x, mask=None, causal=False, cache=None, need_weights=False):
        """x [B, T, d]; mask boolean, broadcastable to [B, h, T, keys]; cache: a dict holding this layer's earlier
        keys and values (decoding), extended in place. need_weights takes the explicit path and returns the maps."""
        B, T, C = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.n_head, C // self.n_head).permute(2, 0, 3, 1, 4)  # 3 x [B, h, T, d_k]
        if cache is not None:
            if cache:
                k, v = torch.cat([cache["k"], k], dim=2), torch.cat([cache["v"], v], dim=2)
            cache["k"], cache["v"] = k, v
        n_keys = k.size(2)
        causal = causal and T > 1  # one new query may see every key before it
        if causal and (mask is not None or n_keys != T or need_weights):
            # spell the triangle out: query i sits at position n_keys - T + i and sees keys up to there
            tri = torch.ones(T, n_keys, dtype=torch.bool, device=x.device).tril(n_keys - T)
            mask, causal = (tri if mask is None else mask & tri), False
        if need_weights:
            y, weights = attention(q, k, v, mask)
        else:
            dropout_p = self.dropout if self.training else 0.0
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=causal)
            weights = None
        y = y.transpose(1, 2).reshape(B, T, C)  # concatenate the heads
        return self.resid_dropout(self.proj(y)), weights


class Block(nn.Module):
    """Pre-LayerNorm block: x + Attention(LN(x)), then x + FFN(LN(x)). Causal is a flag, not a second class."""

    def __init__(self, config, causal):
        super().__init__()
        d, self.causal = config.n_embd, causal
        self.ln_1 = nn.LayerNorm(d, bias=config.bias)
        self.attn = MultiHeadAttention(d, config.n_head, config.dropout, config.bias)
        self.ln_2 = nn.LayerNorm(d, bias=config.bias)
        self.mlp = nn.ModuleDict(dict(fc=nn.Linear(d, 4 * d, bias=config.bias), proj=nn.Linear(4 * d, d, bias=config.bias)))
        self.mlp_dropout = nn.Dropout(config.dropout)

    def forward(self, x, mask=None, cache=None, need_weights=False):
        a, weights = self.attn(self.ln_1(x), mask, self.causal, cache, need_weights)
        x = x + a
        h = F.gelu(self.mlp.fc(self.ln_2(x)), approximate="tanh")  # GPT-2's GELU, so its weights load exactly
        return x + self.mlp_dropout(self.mlp.proj(h)), weights


@dataclass
class GPTConfig:
    vocab_size: int = 50304  # GPT-2's 50,257 padded up to a multiple of 64, which matmuls prefer
    block_size: int = 1024
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = True  # biases in Linears and LayerNorms, as GPT-2; False is a little faster and no worse


@dataclass
class EncoderConfig(GPTConfig):
    n_classes: int = 4
    pad_token_id: int = 0


class Transformer(nn.Module):
    """What both models share: token + learned position embeddings, n_layer Blocks, a final LayerNorm."""

    def __init__(self, config, causal):
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.block_size, config.n_embd)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config, causal) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd, bias=config.bias)

    def init_weights(self):
        """nanoGPT's init: N(0, 0.02) everywhere, the residual projections scaled by 1/sqrt(2 n_layer) so that the
        residual stream's variance does not grow with depth."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        for name, p in self.named_parameters():
            if name.endswith("proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * self.config.n_layer))

    def hidden_states(self, idx, mask=None, cache=None, need_weights=False):
        """idx [B, T] -> (final hidden states [B, T, d], attention maps per layer, or Nones)."""
        start = cache[0]["k"].size(2) if cache and cache[0] else 0
        T = idx.size(1)
        if start + T > self.config.block_size:
            raise ValueError(f"sequence of {start + T} tokens exceeds block_size={self.config.block_size}")
        pos = torch.arange(start, start + T, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        maps = []
        for i, block in enumerate(self.blocks):
            x, weights = block(x, mask, None if cache is None else cache[i], need_weights)
            maps.append(weights)
        return self.ln_f(x), maps

    def num_params(self, non_embedding=True):
        """Parameters, counted once (the tied head is the token embedding); by default without the position table."""
        n = sum(p.numel() for p in self.parameters())
        return n - self.wpe.weight.numel() if non_embedding else n

    def flops_per_token(self, seq_len):
        """Training FLOPs per token: 6 per weight it meets in a matmul (forward + backward), plus 12 L d T for the
        attention scores. Embedding rows are looked up, not multiplied; GPT's tied table is multiplied, as the head."""
        c = self.config
        lookups = self.wpe.weight.numel() + (0 if hasattr(self, "lm_head") else self.wte.weight.numel())
        return 6 * (self.num_params(non_embedding=False) - lookups) + 12 * c.n_layer * c.n_embd * seq_len

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        """AdamW with two groups: matrices (and embeddings) decay; biases and LayerNorm gains do not."""
        params = [p for p in self.parameters() if p.requires_grad]
        groups = [
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ]
        # fused: each tensor updated in one pass over memory, not a dozen elementwise ops (2.4x to 5.8x on our CPU)
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, fused=device_type in ("cuda", "cpu"))

    def save_pretrained(self, out_dir, **extra):
        """model.safetensors + config.json, as on the Hugging Face hub; each written to a temporary file, then
        os.replace'd, so a crash mid-save never leaves a broken checkpoint. extra: task, tokenizer, label names."""
        os.makedirs(out_dir, exist_ok=True)
        path = os.path.join(out_dir, "model.safetensors")
        save_model(self, path + ".tmp")  # drops the tied head's duplicate tensor
        os.replace(path + ".tmp", path)
        info = {"architecture": type(self).__name__, "model": asdict(self.config), **extra}
        write_json(os.path.join(out_dir, "config.json"), info)


class GPT(Transformer):
    def __init__(self, config):
        super().__init__(config, causal=True)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied: reading a token and writing it share one table
        self.init_weights()

    def forward(self, idx, targets=None, cache=None):
        """idx [B, T] -> (logits [B, T, vocab], mean cross-entropy against targets, or None; -1 targets ignored)."""
        x, _ = self.hidden_states(idx, cache=cache)
        logits = self.lm_head(x)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.view(-1), ignore_index=-1)
        return logits, loss

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, next_token=None, use_cache=True):
        """Yield the next token of every row, [B], max_new_tokens times; idx [B, T] is the prompt.
        next_token(logits [B, vocab] in float32, context [B, t]) -> [B] picks a token; greedy by default.
        Without the cache every step re-runs the last block_size tokens (nanoGPT). With it, the prompt runs once,
        then one token a step. Positions are absolute, so a full cache cannot just shift: the last block_size // 2
        tokens are run again as a fresh prompt and decoding goes on from there."""
        next_token = next_token or (lambda logits, context: logits.argmax(dim=-1))
        block_size, cache = self.config.block_size, None
        for _ in range(max_new_tokens):
            if not use_cache:
                logits, _ = self(idx[:, -block_size:])
            elif cache is None or cache[0]["k"].size(2) == block_size:
                window = block_size if cache is None else max(1, block_size // 2)
                cache = [{} for _ in self.blocks]
                logits, _ = self(idx[:, -window:], cache=cache)
            else:
                logits, _ = self(idx[:, -1:], cache=cache)
            token = next_token(logits[:, -1, :].float(), idx)
            idx = torch.cat([idx, token[:, None]], dim=1)
            yield token

    @classmethod
    def from_pretrained(cls, name_or_dir, dropout=0.0):
        """GPT-2 weights in the Hugging Face layout (model.safetensors + config.json): a local directory, or one of
        gpt2, gpt2-medium, gpt2-large, gpt2-xl downloaded from the hub."""
        path = name_or_dir
        if not os.path.isdir(path):
            if name_or_dir not in ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl"):
                raise ValueError(f"{name_or_dir!r} is neither a directory nor one of gpt2, gpt2-medium, gpt2-large, gpt2-xl")
            from huggingface_hub import snapshot_download

            path = snapshot_download(f"openai-community/{name_or_dir}", allow_patterns=["model.safetensors", "config.json"])
        with open(os.path.join(path, "config.json")) as f:
            hf = json.load(f)
        config = GPTConfig(vocab_size=hf["vocab_size"], block_size=hf["n_positions"], n_layer=hf["n_layer"],
                           n_head=hf["n_head"], n_embd=hf["n_embd"], dropout=dropout, bias=True)
        model = cls(config)
        state = {}
        for key, tensor in load_file(os.path.join(path, "model.safetensors")).items():
            if key.endswith((".attn.bias", ".attn.masked_bias")) or key == "lm_head.weight":
                continue  # the causal-mask buffers of old checkpoints; the head is tied to wte
            key = key.removeprefix("transformer.")
            key = "blocks." + key[2:] if key.startswith("h.") else key
            for old, new in (("c_attn", "qkv"), ("c_proj", "proj"), ("c_fc", "fc")):
                key = key.replace(old, new)
            # GPT-2 was written with Conv1D, whose weight is [in, out]; Linear's is [out, in]
            conv1d = key.endswith(("qkv.weight", "proj.weight", "fc.weight"))
            state[key] = tensor.t() if conv1d else tensor
        model.load_state_dict(state, strict=False)  # strict=False only for the tied lm_head.weight
        missing = set(model.state_dict()) - set(state) - {"lm_head.weight"}
        if missing:
            raise ValueError(f"{path}: the checkpoint lacks {sorted(missing)[:3]}...")
        return model


class EncoderClassifier(Transformer):
    """The same Blocks without the causal mask, a padding mask, mean pooling over real tokens and a class head.
    Mean pooling rather than a CLS token: every real token gets a gradient from the loss, which trains faster and
    better for small models learned from scratch; a CLS token must first learn to gather the sentence."""

    def __init__(self, config):
        super().__init__(config, causal=False)
        self.head = nn.Linear(config.n_embd, config.n_classes)
        self.init_weights()

    def forward(self, idx, attention_mask=None, labels=None, need_weights=False):
        """idx [B, n]; attention_mask [B, n], 1 = real token, 0 = padding (as Hugging Face), by default
        idx != pad_token_id. Returns (logits [B, n_classes], loss or None), plus the attention maps if need_weights."""
        if attention_mask is None:
            attention_mask = idx != self.config.pad_token_id
        real = attention_mask.bool()
        x, maps = self.hidden_states(idx, real[:, None, None, :], need_weights=need_weights)  # hide padding keys
        real = real.unsqueeze(-1).to(x.dtype)
        pooled = (x * real).sum(1) / real.sum(1).clamp(min=1)
        logits = self.head(pooled)
        loss = None if labels is None else F.cross_entropy(logits.float(), labels)
        return (logits, loss, maps) if need_weights else (logits, loss)


def write_json(path, obj):
    """Write JSON atomically: a temporary file, then os.replace."""
    with open(path + ".tmp", "w") as f:
        json.dump(obj, f, indent=2)
    os.replace(path + ".tmp", path)


def from_checkpoint(out_dir, device="cpu"):
    """Load what save_pretrained wrote: (model in eval mode, the config.json dict)."""
    try:
        with open(os.path.join(out_dir, "config.json")) as f:
            info = json.load(f)
    except FileNotFoundError:
        raise FileNotFoundError(f"no checkpoint in {out_dir!r} (config.json missing): train one with train.py first")
    try:  # one readable error for a broken or foreign checkpoint, whatever broke in it
        cls, config_cls = {"GPT": (GPT, GPTConfig), "EncoderClassifier": (EncoderClassifier, EncoderConfig)}[info["architecture"]]
        known = {f.name for f in fields(config_cls)}
        model = cls(config_cls(**{k: v for k, v in info["model"].items() if k in known}))
        load_model(model, os.path.join(out_dir, "model.safetensors"))
    except Exception as e:
        raise RuntimeError(f"{out_dir!r} is not a readable checkpoint of this project ({type(e).__name__}: "
                           f"{str(e).splitlines()[0] if str(e) else ''})") from None
    return model.to(device).eval(), info
