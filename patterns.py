"""Sparse attention patterns as attention-gym's mask_mod functions (True where query position q
may attend key position k): the notes' window and global tokens, BigBird's random links. Their fast
paths: block_sparse() by tiles on a CPU or MPS, FlexAttention on the BlockMask elsewhere; a window
model's rolling KV cache. Only a model whose config sets a pattern imports this module."""

import functools

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from cache import KVCache
from lib.common import compiling

# block_sparse()'s tile: the smaller, the fewer masked pairs it computes; random links are drawn
# per TILE queries
TILE = 64


@functools.cache
def flex():
    """FlexAttention compiled on first use (eager it computes every score, n x n): importing the
    compiler takes seconds that a model without a pattern never pays."""
    return torch.compile(flex_attention)


class Pattern:
    """A config's sparse pattern, its parts or'd, and causal: True where query position q may attend
    key position k, and the masks built from that one function."""

    def __init__(self, config, causal):
        self.config = config
        self.causal = causal
        with torch.device("cpu"):  # a model built on the meta device draws the same
            self.links = self.draw_links(config.block_size, config.random_links)
        self.built = None  # (n, device) and blocks() of the last length

    def draw_links(self, n, R):
        """links [n, R]: each query block draws R key blocks (causal: from those before it, the
        first from itself), as BigBird's kernels do, and each query a key in each of them (causal:
        one it may see), so a query block reads at most R key blocks for them."""
        generator = torch.Generator().manual_seed(self.config.random_seed)
        count = -(-n // TILE)  # query blocks
        reach = torch.arange(count).clamp(min=1) if self.causal else torch.tensor(count)
        key_blocks = (torch.rand(count, R, generator=generator) * reach[..., None]).long()
        q = torch.arange(n)[:, None]
        start = key_blocks[q[:, 0] // TILE] * TILE  # [n, R]
        width = (n - start).clamp(max=TILE)
        if self.causal:
            width = width.minimum(q - start + 1)
        return start + (torch.rand(n, R, generator=generator) * width).long()

    def __call__(self, b, h, q, k):
        """q, k: broadcasting tensors of positions -> True where q may attend k (in any batch row
        b and head h: FlexAttention's mask_mod): the notes' window and global tokens, BigBird's
        random links (query q sees the keys links[q])."""
        c = self.config
        # a part at 0 keeps no pair
        keep = (q - k).abs() < c.window
        keep = keep | (q < c.global_tokens) | (k < c.global_tokens)
        if c.random_links:
            links = self.links.to(q.device)
            # a kernel's padding rows read the last row's; links[row, r], not links[row][r], which
            # compiled FlexAttention reads wrongly
            row = q.clamp(max=len(links) - 1)
            for r in range(c.random_links):
                keep = keep | (links[row, r] == k)
        return keep & (k <= q) if self.causal else keep

    def mask(self, n, device, padding=None, dense=False):
        """The model's mask for n positions, padding's [B, 1, 1, n] (True = a real key) and'd
        in: dense, the [n, n] one attention() and dropout read; else the fast path attend(q, k,
        v)."""
        if dense:
            mask = self.dense(n, device)
            return mask if padding is None else mask & padding
        real = None if padding is None else padding[:, 0, 0]
        return functools.partial(sparse_attention, blocks=self.blocks(n, device), real=real)

    def dense(self, n, device):
        """The [n, n] mask of n positions: model.attention()'s, the reference."""
        positions = torch.arange(n, device=device)
        return self(None, None, positions[:, None], positions)

    def blocks(self, n, device):
        """For n positions: each query tile's key tiles [tiles, K], kept ones first, their masks
        as the -inf SDPA adds where a pair is not kept [tiles, TILE, K * TILE], and
        FlexAttention's BlockMask; built eagerly once per length, even in a compiled model."""
        if torch.compiler.is_compiling():
            return torch.compiler.disable(self.blocks)(n, device)
        if self.built is None or self.built[0] != (n, device):
            block_mask = create_block_mask(self, None, None, n, n, device=device)
            tiled = create_block_mask(self, None, None, n, n, device=device, BLOCK_SIZE=TILE)
            kept = tiled.to_dense()[0, 0]
            # K: the most any query block keeps (one at least); a block past a row's own is masked
            # throughout
            K = kept.sum(1).max().clamp(min=1)
            indices = kept.argsort(dim=1, descending=True, stable=True)[:, :K]
            offsets = torch.arange(TILE, device=device)
            # padding rows copy the last query's row; padding keys are never seen
            queries = torch.arange(len(kept) * TILE, device=device).clamp(max=n - 1)
            keys = (indices[..., None] * TILE + offsets).flatten(1)[:, None]
            tiles = self(None, None, queries.view(-1, TILE, 1), keys) & (keys < n)
            bias = torch.where(tiles, 0.0, float("-inf"))
            self.built = ((n, device), (indices, bias, block_mask))
        return self.built[1]


def sparse_attention(q, k, v, blocks, real=None):
    """A pattern's fast path: block_sparse() on a CPU or MPS, where FlexAttention has no backward
    pass and its compiled forward fails at some lengths; FlexAttention on its BlockMask elsewhere.
    real [B, n]: the keys not padding."""
    indices, bias, block_mask = blocks
    if q.device.type in ("cpu", "mps"):
        if real is not None:
            real = F.pad(real, (0, -real.size(1) % TILE)).view(len(real), -1, TILE)
            bias = torch.where(real[:, indices].flatten(2)[:, :, None], bias, float("-inf"))
        return block_sparse(q, k, v, indices, bias.to(q.dtype))
    return flex_sparse(q, k, v, block_mask, real)


def flex_sparse(q, k, v, block_mask, real=None):
    """FlexAttention on the pattern's BlockMask, padding keys (real [B, n] False) masked."""

    def padding(score, b, h, q_idx, k_idx):
        return torch.where(real[b, k_idx], score, float("-inf"))

    with compiling("set attn_impl=explicit (the dense mask)"):
        return flex()(q, k, v, padding if real is not None else None, block_mask)


def block_sparse(q, k, v, indices, bias):
    """SDPA on [B, h, n, d_k] tensors by blocks of TILE queries, each against only its key blocks
    (indices [blocks, K]) under their masks bias [(B,) blocks, TILE, K * TILE], -inf where a pair
    is not kept."""
    B, h, n, _ = q.shape
    if n % TILE:  # padded to whole tiles (a pad of nothing would still copy)
        q, k, v = (F.pad(t, (0, 0, 0, -n % TILE)) for t in (q, k, v))
    q, k, v = (t.unflatten(2, (-1, TILE)) for t in (q, k, v))
    # [B, h, blocks, K * TILE, d_k]; index_select's backward sums by index_add, far faster on a
    # CPU than an indexed gather's index_put
    k, v = (t.index_select(2, indices.flatten()).unflatten(2, indices.shape) for t in (k, v))
    k, v = (t.flatten(3, 4) for t in (k, v))
    # blocks on the batch axis, the mask's on the heads' broadcast: [B * blocks, h, TILE, d_k]
    q, k, v = (t.transpose(1, 2).flatten(0, 1) for t in (q, k, v))
    mask = bias.expand(B, *bias.shape[-3:]).flatten(0, 1)[:, None]  # [B * blocks, 1, TILE, .]
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # no key seen: zeros
    return y.unflatten(0, (B, -1)).transpose(1, 2).flatten(2, 3)[:, :, :n]


class RollingCache(KVCache):
    """A window model's cache for rows of any length: a slot for each of the global_tokens first
    positions, then a ring of the last window ones."""

    EMPTY = 2**62  # an empty slot's position: no query sees it

    def __init__(self, config, rows, device, dtype):
        self.sinks = config.global_tokens
        self.ring = config.window
        length = self.sinks + self.ring
        super().__init__(config, rows, length, device, dtype)
        self.held = torch.full((rows, length), self.EMPTY, device=device)  # each slot's position

    def step(self, rows, T):
        super().step(rows, T)
        p = self.positions
        s = self.sinks
        # the new keys a later query sees: the sinks and the last ring of them
        self.at = ((p < s) | (p > p[:, -1:] - self.ring)).nonzero(as_tuple=True)
        kept = p[self.at]
        slots = torch.where(kept < s, kept, s + (kept - s) % self.ring)
        self.slots = (self.rows[self.at[0]], slots)  # [row, slot] of each kept key
        # the keys read: the slots as they were, then the new ones
        self.key_positions = torch.cat([self.held[self.rows], p], 1)[:, None, None]
        self.held[self.slots] = kept
        return self

    def update(self, layer, k, v):
        kept = []
        for cache, new in zip(self.kv[layer], (k, v)):
            new = new.to(cache.dtype)
            kept.append(torch.cat([cache[self.rows], new], 2))
            cache.transpose(1, 2)[self.slots] = new.transpose(1, 2)[self.at]
        return kept

    def reset(self, row):
        super().reset(row)
        self.held[row] = self.EMPTY

    def copy(self, source, rows):
        super().copy(source, rows)  # the first lengths[source] slots: those written
        self.held[rows] = self.held[source].clone()
