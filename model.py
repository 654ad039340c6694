"""
The models, in one file. Attention is written once; one Block is built on it; two models share that Block:
  GPT                a causal decoder language model (the GPT-2 layout by default, LM head tied to the token embedding)
  EncoderClassifier  a bidirectional encoder: padding mask, mean pooling over real tokens, a class head
The math follows the course notes: Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V, d_k the size of one head.
To try an idea in attention, edit attention() and train with attn_impl="explicit": that is the path which then runs.
The modern options (rotary, RMSNorm, QK-norm, ReLU^2, untied head, logit soft-cap, zero-init projections) are each
off by default, so the defaults are GPT-2 and load OpenAI's weights exactly.
"""
import math
import os
from dataclasses import asdict, dataclass, fields

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import load_file, save_model
from torch.nn.attention import SDPBackend, sdpa_kernel

from common import Error, atomic_path, read_json, write_json

GPT2_NAMES = ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl")  # OpenAI's weights on the Hugging Face hub
# Attention kernels for calls whose lengths change from one call to the next (decoding token by token, batches padded
# to their longest row): all but cuDNN's, which prepares a plan for every new length, a cost that training at one
# fixed block_size pays once
VARYING_LENGTHS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def init_module(module):
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)


@dataclass
class GPTConfig:
    vocab_size: int = 50304  # GPT-2's 50,257 padded up to a multiple of 64, which matmuls prefer
    block_size: int = 1024
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = True  # biases in Linears and LayerNorms, as GPT-2; False is a little faster and no worse
    attn_impl: str = "sdpa"  # sdpa: F.scaled_dot_product_attention (fused); explicit: attention() below, the math
    rope: bool = False  # rotary position embeddings (RoFormer) instead of the learned position table
    rmsnorm: bool = False  # RMSNorm (no mean, no bias) instead of LayerNorm
    qk_norm: bool = False  # RMS-normalise each head's queries and keys before the scores (stabler at high lr)
    relu2: bool = False  # MLP activation ReLU(x)^2 instead of GELU (Primer; the modded-nanogpt speedrun)
    tie_embeddings: bool = True  # the LM head is the token embedding (GPT-2); False: a separate head matrix
    logit_softcap: float = 0.0  # > 0: logits = cap * tanh(logits / cap) (Gemma 2, the speedrun); 0 = off
    zero_init: bool = False  # residual output projections start at zero: each block starts as the identity


@dataclass
class EncoderConfig(GPTConfig):
    n_classes: int = 4
    pad_token_id: int = 0
    token_dropout: float = 0.0  # training only: hide this fraction of each row's tokens, as if padding (augmentation)
    bow_head: bool = False  # fastText beside the encoder: a linear classifier over the tokens, trained by its own loss
    bow_buckets: int = 0  # > 0: bow_head also counts each (previous token, token) pair, hashed into this many rows


def attention(q, k, v, mask=None, dropout_p=0.0):
    """The explicit math on [..., n, d_k] tensors; returns (output, weights before dropout).
    mask is boolean, True = may attend (F.scaled_dot_product_attention's convention), broadcastable to the scores."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores.float(), dim=-1).nan_to_num(0.0).to(q.dtype)  # every key masked: 0/0 -> zeros
    return F.dropout(weights, dropout_p) @ v, weights


def rotation(start, T, d_k, device):
    """(cos, sin) [T, d_k/2] of rotary position embedding at positions start ... start + T - 1: channel pair
    (i, i + d_k/2) turns by the angle position * 10000^(-2i/d_k). Computed once per forward, used by every layer."""
    half = d_k // 2
    inv_freq = 10000.0 ** (-torch.arange(half, device=device, dtype=torch.float32) / half)
    angles = torch.arange(start, start + T, device=device, dtype=torch.float32)[:, None] * inv_freq
    return angles.cos(), angles.sin()


def rotary(x, cos, sin):
    """x [B, h, T, d_k] rotated pair by pair: a query-key product then depends only on the two positions'
    difference, so attention sees relative positions."""
    half = x.size(-1) // 2
    x1, x2, cos, sin = x[..., :half], x[..., half:], cos.to(x.dtype), sin.to(x.dtype)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class MultiHeadAttention(nn.Module):
    """h heads of size d_k = d/h from one fused Q/K/V projection (3d x d) plus W_O (d x d): 4 d^2 weights for any h."""

    def __init__(self, config):
        super().__init__()
        if config.n_embd % config.n_head:
            raise Error(f"n_embd={config.n_embd} must be divisible by n_head={config.n_head}")
        self.config = config
        self.qkv = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(self, x, mask=None, causal=False, cache=None, need_weights=False, rope=None):
        """x [B, T, d]; mask boolean, broadcastable to [B, h, T, keys]; cache: a dict holding this layer's earlier
        keys and values (decoding), extended in place. need_weights also returns the maps (the explicit path).
        rope: the (cos, sin) of rotation() for these positions, with config.rope."""
        B, T, C = x.shape
        c = self.config
        q, k, v = self.qkv(x).view(B, T, 3, c.n_head, C // c.n_head).permute(2, 0, 3, 1, 4)  # 3 x [B, h, T, d_k]
        if c.qk_norm:
            q, k = F.rms_norm(q, (q.size(-1),)), F.rms_norm(k, (k.size(-1),))
        start = cache["k"].size(2) if cache else 0  # the position of the first new token
        if c.rope:
            rope = rope or rotation(start, T, q.size(-1), x.device)
            q, k = rotary(q, *rope), rotary(k, *rope)
        if cache is not None:
            if cache:
                k, v = torch.cat([cache["k"], k], dim=2), torch.cat([cache["v"], v], dim=2)
            cache["k"], cache["v"] = k, v
        causal = causal and T > 1  # one new query may see every key before it
        explicit = need_weights or c.attn_impl == "explicit"
        if causal and (mask is not None or start or explicit):
            # spell the triangle out: query i sits at position start + i and sees keys up to there
            tri = torch.ones(T, start + T, dtype=torch.bool, device=x.device).tril(start)
            mask, causal = (tri if mask is None else mask & tri), False
        dropout_p = c.dropout if self.training else 0.0
        if explicit:
            y, weights = attention(q, k, v, mask, dropout_p)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=causal)
            weights = None
        y = y.transpose(1, 2).reshape(B, T, C)  # concatenate the heads
        return self.resid_dropout(self.proj(y)), weights


def norm(config):
    return nn.RMSNorm(config.n_embd) if config.rmsnorm else nn.LayerNorm(config.n_embd, bias=config.bias)


class Block(nn.Module):
    """Pre-norm block: x + Attention(LN(x)), then x + FFN(LN(x)). Causal is a flag, not a second class."""

    def __init__(self, config, causal):
        super().__init__()
        d, self.causal, self.relu2 = config.n_embd, causal, config.relu2
        self.ln_1 = norm(config)
        self.attn = MultiHeadAttention(config)
        self.ln_2 = norm(config)
        self.mlp = nn.ModuleDict(dict(fc=nn.Linear(d, 4 * d, bias=config.bias), proj=nn.Linear(4 * d, d, bias=config.bias)))
        self.mlp_dropout = nn.Dropout(config.dropout)

    def forward(self, x, mask=None, cache=None, need_weights=False, rope=None):
        a, weights = self.attn(self.ln_1(x), mask, self.causal, cache, need_weights, rope)
        x = x + a
        h = self.mlp.fc(self.ln_2(x))
        h = F.relu(h).square() if self.relu2 else F.gelu(h, approximate="tanh")  # GPT-2's GELU: its weights load exactly
        return x + self.mlp_dropout(self.mlp.proj(h)), weights


class Transformer(nn.Module):
    """What both models share: token (+ learned position) embeddings, n_layer Blocks, a final norm."""

    def __init__(self, config, causal):
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = None if config.rope else nn.Embedding(config.block_size, config.n_embd)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config, causal) for _ in range(config.n_layer))
        self.ln_f = norm(config)

    def init_weights(self):
        """nanoGPT's init: N(0, 0.02) everywhere, the residual projections scaled by 1/sqrt(2 n_layer) so that the
        residual stream's variance does not grow with depth (or zero, with zero_init)."""
        for module in self.modules():
            init_module(module)
        for name, p in self.named_parameters():
            if name.startswith("blocks.") and name.endswith("proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.0 if self.config.zero_init else 0.02 / math.sqrt(2 * self.config.n_layer))

    def hidden_states(self, idx, mask=None, cache=None, need_weights=False):
        """idx [B, T] -> (final hidden states [B, T, d], attention maps per layer, or Nones)."""
        start = cache[0]["k"].size(2) if cache and cache[0] else 0
        T = idx.size(1)
        if start + T > self.config.block_size:
            raise Error(f"sequence of {start + T} tokens exceeds block_size={self.config.block_size}")
        x = self.wte(idx)
        if self.wpe is not None:
            x = x + self.wpe(torch.arange(start, start + T, device=idx.device))
        rope = rotation(start, T, self.config.n_embd // self.config.n_head, idx.device) if self.config.rope else None
        x = self.drop(x)
        maps = []
        for i, block in enumerate(self.blocks):
            x, weights = block(x, mask, None if cache is None else cache[i], need_weights, rope)
            maps.append(weights)
        return self.ln_f(x), maps

    def num_params(self, non_embedding=True):
        """Parameters, counted once (a tied head is the token embedding); by default without the position table."""
        n = sum(p.numel() for p in self.parameters())
        return n - self.wpe.weight.numel() if non_embedding and self.wpe is not None else n

    def flops_per_token(self, seq_len):
        """Training FLOPs per token: 6 per weight it meets in a matmul (forward + backward), plus 12 L d T for the
        attention scores. Embedding rows are looked up, not multiplied; a tied table is multiplied, as the head."""
        c = self.config
        tied = getattr(self, "lm_head", None) is not None and self.lm_head.weight is self.wte.weight
        looked_up = (None if tied else self.wte, self.wpe, getattr(self, "bow", None))
        tables = [m for m in looked_up if m is not None]
        lookups = sum(m.weight.numel() for m in tables)
        return 6 * (self.num_params(non_embedding=False) - lookups) + 12 * c.n_layer * c.n_embd * seq_len

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type, optimizer="adamw"):
        """A list of optimizers. adamw: AdamW with two groups, matrices and embeddings decay, biases and norm gains
        do not. muon: torch.optim.Muon (orthogonalised momentum) for the 2-D weights inside the blocks, AdamW for
        the rest; Muon's update is scaled to AdamW's size (match_rms_adamw), so one learning rate serves both."""
        params = {n: p for n, p in self.named_parameters() if p.requires_grad}
        hidden = [p for n, p in params.items() if n.startswith("blocks.") and p.dim() == 2] if optimizer == "muon" else []
        bow = [p for n, p in params.items() if n == "bow.weight"]
        rest = [p for p in params.values() if all(p is not q for q in hidden + bow)]
        groups = [{"params": [p for p in rest if p.dim() >= 2], "weight_decay": weight_decay},
                  {"params": [p for p in rest if p.dim() < 2], "weight_decay": 0.0}]
        if bow:  # a linear model's rows, each met only by the rows that hold its token: fastText's rate, no decay
            groups.append({"params": bow, "weight_decay": 0.0, "lr_scale": self.BOW_LR_SCALE})
        # fused: each tensor updated in one pass over memory, not a dozen elementwise ops (2.4x to 5.8x on our CPU)
        optimizers = [torch.optim.AdamW(groups, lr=learning_rate, betas=betas, fused=device_type in ("cuda", "cpu"))]
        if hidden:
            optimizers.append(torch.optim.Muon(hidden, lr=learning_rate, weight_decay=weight_decay,
                                               adjust_lr_fn="match_rms_adamw"))
        return optimizers

    def save_pretrained(self, out_dir, **extra):
        """model.safetensors + config.json, as on the Hugging Face hub; each written to a temporary file, then
        os.replace'd, so a crash mid-save never leaves a broken checkpoint. extra: task, tokenizer, label names."""
        os.makedirs(out_dir, exist_ok=True)
        with atomic_path(os.path.join(out_dir, "model.safetensors")) as tmp:
            save_model(self, tmp)  # drops a tied head's duplicate tensor
        write_json(os.path.join(out_dir, "config.json"),
                   {"architecture": type(self).__name__, "model": asdict(self.config), **extra})

    def load_weights(self, state, new=()):
        """Load a state dict in place of the current tensors (assign: a model built on the meta device takes the
        loaded tensors without a second copy in memory); ties the head again where it is tied. new: modules that
        start afresh instead (a classifier's head on a pretrained GPT)."""
        for name in new:
            module = self.get_submodule(name)
            module.to_empty(device="cpu")
            init_module(module)
            state = {**state, **{f"{name}.{k}": v for k, v in module.state_dict().items()}}
        tied = isinstance(self, GPT) and self.config.tie_embeddings
        if tied and "lm_head.weight" in state:  # save_model keeps one name of a shared tensor, at times the head's
            state.setdefault("wte.weight", state.pop("lm_head.weight"))
        missing, unexpected = self.load_state_dict(state, strict=False, assign=True)
        if tied:
            self.lm_head.weight = self.wte.weight
            missing = [k for k in missing if k != "lm_head.weight"]
        if missing or unexpected:
            raise Error(f"the weights do not fit the model: missing {sorted(missing)[:3]}, unexpected "
                        f"{sorted(unexpected)[:3]}")
        return self


class GPT(Transformer):
    def __init__(self, config):
        super().__init__(config, causal=True)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.wte.weight  # tied: reading a token and writing it share one table
        self.init_weights()

    def forward(self, idx, targets=None, cache=None):
        """idx [B, T] -> (logits [B, T, vocab], mean cross-entropy against targets, or None; -1 targets ignored)."""
        x, _ = self.hidden_states(idx, cache=cache)
        logits = self.lm_head(x)
        if self.config.logit_softcap > 0:
            logits = self.config.logit_softcap * torch.tanh(logits.float() / self.config.logit_softcap)
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
            with sdpa_kernel(VARYING_LENGTHS):
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
        gpt2, gpt2-medium, gpt2-large, gpt2-xl downloaded from the hub. The model is built on the meta device and
        takes the loaded tensors, so loading holds one copy of the weights in memory, not two."""
        path = name_or_dir
        if not os.path.isdir(path):
            if name_or_dir not in GPT2_NAMES:
                raise Error(f"{name_or_dir!r} is neither a directory nor one of {', '.join(GPT2_NAMES)}")
            from huggingface_hub import snapshot_download

            path = snapshot_download(f"openai-community/{name_or_dir}", allow_patterns=["model.safetensors", "config.json"])
        hf = read_json(os.path.join(path, "config.json"), "Hugging Face config")
        try:
            config = GPTConfig(vocab_size=hf["vocab_size"], block_size=hf["n_positions"], n_layer=hf["n_layer"],
                               n_head=hf["n_head"], n_embd=hf["n_embd"], dropout=dropout, bias=True)
            loaded = load_file(os.path.join(path, "model.safetensors"))
        except Exception as e:
            raise Error(f"{path} is not a GPT-2 checkpoint in the Hugging Face layout ({type(e).__name__}: {e})") from None
        state = {}
        for key in list(loaded):
            tensor = loaded.pop(key)  # dropped from the loaded dict as it moves: one copy at a time
            if key.endswith((".attn.bias", ".attn.masked_bias")) or key == "lm_head.weight":
                continue  # the causal-mask buffers of old checkpoints; the head is tied to wte
            key = key.removeprefix("transformer.")
            key = "blocks." + key[2:] if key.startswith("h.") else key
            for old, new in (("c_attn", "qkv"), ("c_proj", "proj"), ("c_fc", "fc")):
                key = key.replace(old, new)
            # GPT-2 was written with Conv1D, whose weight is [in, out]; Linear's is [out, in]
            state[key] = tensor.t().contiguous() if key.endswith(("qkv.weight", "proj.weight", "fc.weight")) else tensor
        with torch.device("meta"):
            model = cls(config)
        return model.load_weights(state)


class EncoderClassifier(Transformer):
    """The same Blocks without the causal mask, a padding mask, mean pooling over real tokens and a class head.
    Mean pooling rather than a CLS token: every real token gets a gradient from the loss, which trains faster and
    better for small models learned from scratch; a CLS token must first learn to gather the sentence."""
    BOW_LR_SCALE = 200  # bow_head's learning rate, a multiple of train.py's (peak 0.2 for config/agnews.py)

    def __init__(self, config):
        super().__init__(config, causal=False)
        self.head = nn.Linear(config.n_embd, config.n_classes)
        self.bow = nn.Embedding(config.vocab_size + config.bow_buckets, config.n_classes) if config.bow_head else None
        self.init_weights()

    def bow_logits(self, idx, real):
        """fastText's linear classifier [B, n_classes]: one weight row per real token and, with bow_buckets, one per
        (previous token, token) pair hashed into that many rows (phrases such as "oil prices" as features of their
        own; the first token's previous is padding); summed over the square root of their count, so that long texts
        do not get larger logits."""
        features, real = idx, real.float()
        if self.config.bow_buckets:
            previous = F.pad(idx[:, :-1], (1, 0), value=self.config.pad_token_id)
            bigrams = self.config.vocab_size + (previous * 1_000_003 + idx) % self.config.bow_buckets
            features, real = torch.cat([idx, bigrams], 1), torch.cat([real, real], 1)
        return (self.bow(features).float() * real.unsqueeze(-1)).sum(1) / real.sum(1, keepdim=True).clamp(min=1).sqrt()

    def encode(self, idx, real, need_weights=False):
        """(hidden states [B, n, d], maps) of idx, the keys where real [B, n] is False (padding) hidden. Padded
        lengths change from batch to batch: no cuDNN attention (VARYING_LENGTHS)."""
        with sdpa_kernel(VARYING_LENGTHS):
            return self.hidden_states(idx, real[:, None, None, :], need_weights=need_weights)

    def forward(self, idx, attention_mask=None, labels=None, need_weights=False, mlm_vocab=None):
        """idx [B, n]; attention_mask [B, n], 1 = real token, 0 = padding (as Hugging Face), by default
        idx != pad_token_id. Returns (logits [B, n_classes], loss or None), plus the attention maps if need_weights.
        With mlm_vocab: (None, the masked language modelling loss) instead, for pretraining (see masked_lm_loss)."""
        real = (idx != self.config.pad_token_id) if attention_mask is None else attention_mask.bool()
        if mlm_vocab is not None:
            return None, self.masked_lm_loss(idx, real, mlm_vocab)
        if self.training and self.config.token_dropout > 0:  # hidden tokens read as padding: a shorter text
            kept = real & (torch.rand(real.shape, device=real.device) >= self.config.token_dropout)
            # a row left with no key would attend to nothing (NaN in some GPU kernels): such rows keep their tokens
            real = torch.where(kept.any(1, keepdim=True), kept, real)
        x, maps = self.encode(idx, real, need_weights)
        weights = real.unsqueeze(-1).to(x.dtype)
        logits = self.head((x * weights).sum(1) / weights.sum(1).clamp(min=1)).float()  # mean over real tokens
        loss = None if labels is None else F.cross_entropy(logits, labels)
        if self.bow is not None:
            # Two classifiers side by side on the same batches, each trained by its own loss, and their probabilities
            # multiplied: an ensemble of unlike models. Trained jointly instead, on the sum of their logits, they scored
            # 0.2 to 0.9 points lower on val (BENCHMARKS.md).
            bow = self.bow_logits(idx, real)
            loss = None if labels is None else (loss + F.cross_entropy(bow, labels)) / 2
            logits = F.log_softmax(logits, -1) + F.log_softmax(bow, -1)
        return (logits, loss, maps) if need_weights else (logits, loss)


    def masked_lm_loss(self, idx, real, vocab):
        """BERT's pretraining on the texts themselves: 15% of the real tokens are replaced by the padding token (never
        attended to as padding, it reads as [MASK] where it is a real position) and predicted from the rest, through
        the token embedding (tied, as GPT's head). The softmax runs over vocab, the ids that occur in the training
        data (a few thousand), not over all of GPT-2's 50,257, which would cost far more than the model itself."""
        masked = real & (torch.rand(real.shape, device=idx.device) < 0.15)
        inputs = idx.masked_fill(masked, self.config.pad_token_id)
        x, _ = self.encode(inputs, real)
        position = torch.full((self.config.vocab_size,), -1, dtype=torch.long, device=idx.device)
        position[vocab] = torch.arange(len(vocab), device=idx.device)  # token id -> its row among vocab
        logits = x[masked] @ self.wte.weight[vocab].t()
        return F.cross_entropy(logits.float(), position[idx[masked]])


ARCHITECTURES = {"GPT": (GPT, GPTConfig), "EncoderClassifier": (EncoderClassifier, EncoderConfig)}


def build_model(task, settings):
    """A fresh GPT (task lm) or EncoderClassifier (classify), its config taken from the matching keys of settings."""
    cls, config_cls = ARCHITECTURES["GPT" if task == "lm" else "EncoderClassifier"]
    return cls(config_cls(**{f.name: settings[f.name] for f in fields(config_cls) if f.name in settings}))


def from_checkpoint(out_dir, device="cpu"):
    """Load what save_pretrained wrote: (model in eval mode, the config.json dict)."""
    path = os.path.join(out_dir, "config.json")
    if not os.path.isfile(path):
        raise Error(f"no checkpoint in {str(out_dir)!r} (config.json missing): train one with train.py first")
    info = read_json(path, "checkpoint config")
    try:  # one readable error for a broken or foreign checkpoint, whatever broke in it
        cls, config_cls = ARCHITECTURES[info["architecture"]]
        known = {f.name for f in fields(config_cls)}
        with torch.device("meta"):
            model = cls(config_cls(**{k: v for k, v in info["model"].items() if k in known}))
        model.load_weights(load_file(os.path.join(out_dir, "model.safetensors")))
    except Exception as e:
        raise Error(f"{str(out_dir)!r} is not a readable checkpoint of this project ({type(e).__name__}: "
                    f"{str(e).splitlines()[0] if str(e) else ''})") from None
    return model.to(device).eval(), info


def load_pretrained(name_or_dir, device="cpu"):
    """A checkpoint of this project (its config.json names an architecture) or GPT-2's weights (a name, or a folder in
    the Hugging Face layout): (model in eval mode, info; GPT-2's info names its BPE tokenizer)."""
    config = os.path.join(name_or_dir, "config.json")
    if os.path.isfile(config) and "architecture" in read_json(config):
        return from_checkpoint(name_or_dir, device)
    info = {"architecture": "GPT", "tokenizer": {"type": "bpe", "encoding": "r50k_base"}}
    return GPT.from_pretrained(name_or_dir).to(device).eval(), info
