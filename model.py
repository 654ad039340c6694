"""
The models, in one file: attention written once, one Block built on it, two models sharing it:
  GPT                a causal decoder LM (GPT-2's layout by default, head tied to the token table)
  EncoderClassifier  a bidirectional encoder: padding mask, the mean over real tokens, a class head
A sparse pattern (patterns.py) enters attention as its mask, a KV cache (cache.py) as an object
whose update() gives the keys and values so far. To try an idea in attention, edit attention() and
run with attn_impl="explicit": every path, the patterns' and the caches' too, then goes through it.
"""

import math
from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from lib.common import Error
from lib.options import setting

# Attention kernels for lengths that change call to call (decoding, padded batches): all but
# cuDNN's, which plans anew for every new length, a cost that training at one block_size pays once
VARYING_LENGTHS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def varying_lengths(device):
    """SDPA restricted to VARYING_LENGTHS' kernels, for a stretch of calls at changing lengths;
    on a CPU, whose kernels all are, no context (its 30 us a token: up to 11% of small models')."""
    cpu = torch.device(device).type == "cpu"
    return nullcontext() if cpu else sdpa_kernel(VARYING_LENGTHS)


def init_module(module):
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)


@dataclass
class GPTConfig:
    """The model's shape and options; the defaults are train.py's."""

    vocab_size: int = 50304  # GPT-2's 50,257 padded up to a multiple of 64, which matmuls prefer
    block_size: int = setting(
        256, "tokens of context (classify: the most tokens of a row the model reads)", ge=1
    )
    n_layer: int = setting(6, "transformer blocks", ge=1)
    n_head: int = setting(6, "attention heads per block, dividing n_embd", ge=1)
    n_embd: int = setting(384, "width of the residual stream", ge=1)
    dropout: float = setting(
        0.0,
        "dropout on embeddings, attention weights and residual branches "
        "(training with a pattern then takes its dense mask)",
        ge=0,
        lt=1,
    )
    bias: bool = setting(False, "biases in Linears and LayerNorms, as GPT-2's (False: faster)")
    attn_impl: str = setting(
        "sdpa",
        "sdpa: fused F.scaled_dot_product_attention; explicit: model.attention(), the math to edit",
        choices=("sdpa", "explicit"),
    )
    rope: bool = setting(False, "rotary position embeddings instead of the learned position table")
    qk_norm: bool = setting(False, "RMS-normalise each head's queries and keys (stabler)")
    gelu: str = setting(
        "tanh",
        "GELU's form, as F.gelu's approximate: tanh, GPT-2's (its weights load exactly); none, "
        "the exact erf, nanoGPT's (3x faster on CPUs with AVX2 alone)",
        choices=("tanh", "none"),
    )
    # a sparse pattern, its parts or'd: FlexAttention skips the tiles where nothing may attend
    window: int = setting(
        0,
        "> 0: each query sees the keys less than this many positions away (with rope: "
        "generation past block_size at a constant cost per token)",
        ge=0,
    )
    global_tokens: int = setting(
        0, "> 0: the first this many positions see every key and every query sees them", ge=0
    )
    random_links: int = setting(
        0, "> 0: each query sees this many keys drawn at random (BigBird's), from random_seed", ge=0
    )
    random_seed: int = setting(
        0, "the seed of random_links: every run of the model sees one draw", ge=0, lt=2**64
    )

    def __post_init__(self):
        if self.n_head < 1 or self.n_embd % self.n_head:
            raise Error(f"n_head={self.n_head!r}: must be a divisor of n_embd={self.n_embd}")
        if self.rope and self.n_embd // self.n_head % 2:
            raise Error(
                f"n_head={self.n_head!r}: must be such that the head size n_embd / n_head even: "
                "rotary embeddings rotate pairs"
            )
        for key in ("window", "global_tokens", "random_links"):
            value = getattr(self, key)
            if value > self.block_size:
                raise Error(f"{key}={value!r}: must be <= block_size={self.block_size}")


@dataclass
class EncoderConfig(GPTConfig):
    n_classes: int = 4
    pad_token_id: int = 0
    token_dropout: float = setting(
        0.0,
        "classify: hide this fraction of each training row's tokens (augmentation for small data)",
        ge=0,
        lt=1,
    )
    bow_head: bool = setting(
        False,
        "classify: a fastText classifier beside the encoder, "
        "the two models' log-probabilities averaged",
    )
    bow_buckets: int = setting(
        0,
        "classify: > 0: bow_head also counts (previous token, token) pairs, "
        "hashed into this many rows",
        ge=0,
    )

    def __post_init__(self):
        super().__post_init__()
        if self.bow_buckets and not self.bow_head:
            raise Error(f"bow_buckets={self.bow_buckets!r}: must be 0 unless bow_head=True")


def attention(q, k, v, mask=None, causal=False, dropout_p=0.0):
    """softmax(Q K^T / sqrt(d_k)) V on [..., n, d_k] tensors -> (output, weights before dropout).
    mask (True = may attend) or causal, as F.scaled_dot_product_attention's."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, h, T, S): T queries, S keys
    if causal:
        T, S = scores.shape[-2:]
        mask = torch.ones(T, S, dtype=torch.bool, device=q.device).tril(S - T)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    # every key masked: 0/0 -> zeros
    weights = torch.softmax(scores.float(), dim=-1).nan_to_num(0.0).to(q.dtype)  # (B, h, T, S)
    return F.dropout(weights, dropout_p) @ v, weights  # (B, h, T, d_k)


def rotation(positions, d_k):
    """(cos, sin) of rotary embeddings at positions [T] -> [T, d_k/2], or [B, T] -> [B, 1, T,
    d_k/2]: channel pair (i, i + d_k/2) turns by position * 10000^(-2i/d_k)."""
    half = d_k // 2
    steps = torch.arange(half, device=positions.device, dtype=torch.float32)
    inv_freq = 10000.0 ** (-steps / half)
    angles = positions.float()[..., None] * inv_freq  # (T, d_k/2) or (B, T, d_k/2)
    if angles.dim() == 3:
        angles = angles[:, None]  # a head axis
    return angles.cos(), angles.sin()


def rotary(x, cos, sin):
    """x [B, h, T, d_k] rotated pair by pair: query-key products see relative positions."""
    x1, x2 = x.chunk(2, dim=-1)  # each (B, h, T, d_k/2)
    cos = cos.to(x.dtype)
    sin = sin.to(x.dtype)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class MultiHeadAttention(nn.Module):
    """h heads of size d_k = d/h from one fused Q/K/V projection (3d x d) plus W_O (d x d):
    4 d^2 weights for any h."""

    def __init__(self, config, causal, layer=0):
        super().__init__()
        self.config = config
        self.causal = causal
        self.layer = layer  # its place in the KV cache
        self.qkv = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.float32_attention = False  # True: in float32 under any autocast (lib.autotune)

    def forward(self, x, mask=None, rope=None, cache=None, need_weights=False):
        """x [B, T, d] -> (y [B, T, d], maps or None). mask: True = may attend (None: all, causal
        on a causal model) or a pattern's attend(q, k, v); rope, cache: rotation()'s, cache.py's."""
        B, T, C = x.shape  # (B, T, d)
        # q, k, v each (B, h, T, d_k)
        q, k, v = self.qkv(x).view(B, T, 3, self.config.n_head, -1).permute(2, 0, 3, 1, 4)
        if self.config.qk_norm:
            q = F.rms_norm(q, q.shape[-1:])
            k = F.rms_norm(k, k.shape[-1:])
        if rope is not None:
            q = rotary(q, *rope)
            k = rotary(k, *rope)
        if cache is not None:
            k, v = cache.update(self.layer, k, v)  # (B, h, S, d_k): every key so far
            q = q.to(k.dtype)  # attention in the cache's dtype
        f32 = self.float32_attention  # bfloat16's flash backward is slower on some CPUs
        if f32:
            q, k, v = q.float(), k.float(), v.float()
        causal = self.causal and mask is None and cache is None  # a cache: every key read
        drop = self.config.dropout if self.training else 0.0
        weights = None
        with torch.autocast(x.device.type, enabled=False) if f32 else nullcontext():
            if need_weights or self.config.attn_impl == "explicit":
                y, weights = attention(q, k, v, mask, causal, drop)
            elif callable(mask):
                y = mask(q, k, v)
            else:
                y = F.scaled_dot_product_attention(q, k, v, mask, drop, is_causal=causal)
        y = y.transpose(1, 2).reshape(B, T, C)  # (B, h, T, d_k) -> (B, T, d): heads side by side
        if cache is not None:
            y = y.to(x.dtype)  # back from the cache's dtype
        return self.resid_dropout(self.proj(y)), weights


class Block(nn.Module):
    """Pre-norm block: x + Attention(LN(x)), then x + FFN(LN(x))."""

    def __init__(self, config, causal, layer=0):
        super().__init__()
        d = config.n_embd
        self.ln_1 = nn.LayerNorm(d, bias=config.bias)
        self.attn = MultiHeadAttention(config, causal, layer)
        self.ln_2 = nn.LayerNorm(d, bias=config.bias)
        self.mlp = nn.ModuleDict(
            {
                "fc": nn.Linear(d, 4 * d, bias=config.bias),
                "proj": nn.Linear(4 * d, d, bias=config.bias),
            }
        )
        self.mlp_dropout = nn.Dropout(config.dropout)
        self.gelu = config.gelu

    def forward(self, x, mask=None, rope=None, cache=None, need_weights=False):
        attended, weights = self.attn(self.ln_1(x), mask, rope, cache, need_weights)
        x = x + attended
        hidden = F.gelu(self.mlp.fc(self.ln_2(x)), approximate=self.gelu)  # (B, T, 4d)
        return x + self.mlp_dropout(self.mlp.proj(hidden)), weights


class Transformer(nn.Module):
    """The body both models share: embeddings, n_layer Blocks, a final norm."""

    OWN_MODULES = ()  # the model's modules outside the body: load_body starts them afresh

    def __init__(self, config, causal):
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = None if config.rope else nn.Embedding(config.block_size, config.n_embd)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config, causal, i) for i in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.pattern = None
        if config.window or config.global_tokens or config.random_links:
            from patterns import Pattern  # FlexAttention's import: only a model with a pattern

            self.pattern = Pattern(config, causal)
        # a sequence may run past block_size: a window over rotary positions, which see distances
        # only, reads its last window keys (and the global ones) wherever it is
        self.endless = config.rope and config.window > 0 and not config.random_links

    def init_weights(self):
        """nanoGPT's init: N(0, 0.02), the residual projections' std over sqrt(2 n_layer) so that
        the residual stream's variance does not grow with depth."""
        self.apply(init_module)
        for name, p in self.named_parameters():
            if name.endswith("proj.weight"):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * self.config.n_layer))

    def hidden_states(self, idx, mask=None, cache=None, need_weights=False):
        """idx [B, T] -> (final hidden states [B, T, d], per-layer attention maps or Nones)."""
        if cache is None:
            longest = idx.size(1)
            positions = torch.arange(longest, device=idx.device)
            if self.pattern is not None:
                # the dense mask where attention() or dropout reads it, else the fast path
                dense = need_weights or self.config.attn_impl == "explicit"
                dense = dense or (self.training and self.config.dropout > 0)
                mask = self.pattern.mask(longest, idx.device, mask, dense)
        else:
            longest = cache.n_keys  # known on the host: no device sync
            positions = cache.positions
            mask = cache.mask(self.pattern)
        if longest > self.config.block_size and not self.endless:
            raise Error(f"sequence of {longest} tokens exceeds block_size={self.config.block_size}")
        x = self.wte(idx)  # (B, T, d)
        if self.wpe is not None:
            x = x + self.wpe(positions)  # (T, d) or (B, T, d), broadcast
        rope = None
        if self.config.rope:
            rope = rotation(positions, self.config.n_embd // self.config.n_head)
        x = self.drop(x)
        maps = []
        for block in self.blocks:
            x, weights = block(x, mask, rope, cache, need_weights)
            maps.append(weights)
        return self.ln_f(x), maps

    def num_params(self, non_embedding=True):
        """Parameters, shared ones counted once; by default without the position table."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding and self.wpe is not None:
            n -= self.wpe.weight.numel()
        return n

    def optimizer_groups(self):
        """AdamW groups with settings of their own, beside optim.configure_optimizers' two."""
        return []

    def load_weights(self, state):
        """Load a state dict in place of the current tensors: one copy in memory."""
        # assign keeps a tensor's dtype: a float16 or bfloat16 file is cast to float32, the dtype
        # every model is built in
        for k, v in state.items():
            if v.is_floating_point():
                state[k] = v.float()
        missing, unexpected = self.load_state_dict(state, strict=False, assign=True)
        if missing or unexpected:
            raise Error(
                f"the weights do not fit the model: missing {sorted(missing)[:3]}, unexpected "
                f"{sorted(unexpected)[:3]}"
            )
        return self

    def load_body(self, state):
        """A pretrained GPT's body, OWN_MODULES afresh; wpe cut to block_size (a copy: saveable),
        the token table grown to vocab_size (a chat fine-tune's tokens)."""
        parts = ("wte", "wpe", "blocks", "ln_f")
        body = {k: v for k, v in state.items() if k.split(".")[0] in parts}
        if "wpe.weight" in body:
            body["wpe.weight"] = body["wpe.weight"][: self.config.block_size].clone()
        table = body["wte.weight"]
        if self.config.vocab_size > len(table):
            # each new row drawn from the old rows' mean and spread, as Hugging Face's
            # resize_token_embeddings draws them
            mean = table.mean(0).expand(self.config.vocab_size - len(table), -1)
            body["wte.weight"] = torch.cat([table, torch.normal(mean, table.std(0))])
        for name in self.OWN_MODULES:
            module = getattr(self, name)
            if module is not None:
                module.to_empty(device="cpu")
                init_module(module)
                body |= module.state_dict(prefix=f"{name}.")
        return self.load_weights(body)


class GPT(Transformer):
    """The causal decoder LM: the body, then a head tied to the token embedding, as GPT-2's."""

    def __init__(self, config):
        super().__init__(config, causal=True)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        # tied: reading a token and writing it share one table
        self.lm_head.weight = self.wte.weight
        self.init_weights()

    def forward(self, idx, targets=None, cache=None, logits_to_keep=0):
        """idx [B, T] -> (logits [B, T, vocab], cross-entropy against targets or None; -1 ignored).
        logits_to_keep > 0: the last that many positions' logits, in float32, for decoding."""
        x, _ = self.hidden_states(idx, cache=cache)
        if logits_to_keep:
            # float32 whatever autocast's dtype: in bfloat16 close logits round to ties
            with torch.autocast(x.device.type, enabled=False):
                return self.lm_head(x[:, -logits_to_keep:].float()), None
        logits = self.lm_head(x)  # (B, T, vocab)
        loss = None
        if targets is not None:
            flat = logits.view(-1, logits.size(-1)).float()  # (B * T, vocab)
            loss = F.cross_entropy(flat, targets.view(-1), ignore_index=-1)
        return logits, loss

    def load_weights(self, state):
        """The base's load, then the head tied again: either name of the shared tensor fills it."""
        table = state.get("wte.weight", state.get("lm_head.weight"))
        if table is not None:
            state = {**state, "wte.weight": table, "lm_head.weight": table}
        super().load_weights(state)
        self.lm_head.weight = self.wte.weight
        return self


class EncoderClassifier(Transformer):
    """The same Blocks without the causal mask, a padding mask, mean pooling over real tokens and
    a class head."""

    # bow_head's learning rate, a multiple of train.py's (peak 0.2 for config/agnews.py)
    BOW_LR_SCALE = 200
    OWN_MODULES = ("head", "bow")

    def __init__(self, config):
        super().__init__(config, causal=False)
        self.head = nn.Linear(config.n_embd, config.n_classes)
        self.bow = None
        if config.bow_head:
            # a row per token, then bow_buckets rows of hashed bigrams
            self.bow = nn.Embedding(config.vocab_size + config.bow_buckets, config.n_classes)
        self.init_weights()

    def optimizer_groups(self):
        """bow's table learns at fastText's far higher rate, without decay."""
        if self.bow is None:
            return []
        return [{"params": [self.bow.weight], "weight_decay": 0.0, "lr_scale": self.BOW_LR_SCALE}]

    def bow_logits(self, idx, real):
        """fastText's linear classifier [B, n_classes]: a row per real token (and hashed bigram),
        summed over the square root of their count."""
        features = idx
        real = real.float()
        if self.config.bow_buckets:
            previous = F.pad(idx[:, :-1], (1, 0), value=self.config.pad_token_id)
            hashed = (previous * 1_000_003 + idx) % self.config.bow_buckets
            bigrams = self.config.vocab_size + hashed
            features = torch.cat([idx, bigrams], 1)
            real = real.repeat(1, 2)
        summed = (self.bow(features).float() * real.unsqueeze(-1)).sum(1)
        count = real.sum(1, keepdim=True).clamp(min=1)
        return summed / count.sqrt()

    def forward(self, idx, attention_mask=None, labels=None, need_weights=False):
        """idx [B, n], attention_mask [B, n] (1 = real token; default idx != pad_token_id) ->
        (logits [B, n_classes], loss or None[, maps])."""
        # (B, n): True = a real token
        real = idx != self.config.pad_token_id if attention_mask is None else attention_mask.bool()
        # hidden tokens read as padding: a shorter text
        if self.training and self.config.token_dropout > 0:
            kept = real & (torch.rand(real.shape, device=real.device) >= self.config.token_dropout)
            # a row left with no key would attend to nothing (NaN in some GPU kernels):
            # such rows keep their tokens
            real = torch.where(kept.any(1, keepdim=True), kept, real)
        # padded lengths change from batch to batch: no cuDNN attention
        with varying_lengths(idx.device):
            # padding keys hidden
            x, maps = self.hidden_states(idx, real[:, None, None, :], need_weights=need_weights)
        weights = real.unsqueeze(-1).to(x.dtype)
        # mean over real tokens, not a CLS token: every token gets a gradient
        mean = (x * weights).sum(1) / weights.sum(1).clamp(min=1)  # (B, d)
        logits = self.head(mean).float()  # (B, n_classes)
        loss = None if labels is None else F.cross_entropy(logits, labels)
        if self.bow is not None:
            # an ensemble: each classifier trained by its own loss; the mean of their
            # log-probabilities (the normalised geometric mean of their probabilities) has the
            # product's argmax without its overconfidence
            bow = self.bow_logits(idx, real)
            if labels is not None:
                loss = (loss + F.cross_entropy(bow, labels)) / 2
            logits = (F.log_softmax(logits, -1) + F.log_softmax(bow, -1)) / 2
        return (logits, loss, maps) if need_weights else (logits, loss)


ARCHITECTURES = {"GPT": (GPT, GPTConfig), "EncoderClassifier": (EncoderClassifier, EncoderConfig)}
