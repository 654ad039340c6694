"""The KV cache decoding reads and writes: a row's keys and values preallocated and written in
place (gpt-fast's static cache); a window model's rolling one is patterns.RollingCache. A step's
cache enters the model as positions, n_keys (how many keys it reads), mask(pattern) and
update(layer, k, v)."""

import torch


class KVCache:
    """Every layer's keys and values, preallocated and written in place (gpt-fast's static
    cache), and each row's length."""

    def __init__(self, config, rows, length, device, dtype=torch.float32):
        shape = (rows, config.n_head, length, config.n_embd // config.n_head)  # (rows, h, L, d_k)
        # (keys, values) per layer, written in place: a compiled step mutates no views
        self.kv = [
            [torch.zeros(shape, device=device, dtype=dtype) for _ in range(2)]
            for _ in range(config.n_layer)
        ]
        self.lengths = [0] * rows  # on the host: reading them costs no device sync

    def step(self, rows, T):
        """Readies the cache for T new tokens of rows (row indices), each at its next positions."""
        device = self.kv[0][0].device
        lengths = [self.lengths[row] for row in rows]
        start = torch.tensor(lengths)
        self.rows = torch.tensor(rows, device=device)
        self.positions = (start[:, None] + torch.arange(T)).to(device)  # [B, T]
        self.n_keys = max(lengths) + T  # how many keys the queries may read
        # (keys,): the positions of the keys update() returns
        self.key_positions = torch.arange(self.n_keys, device=device)
        # every row in order: the cache's own views are read, no copies
        in_order = rows == list(range(len(self.lengths)))
        self.read = slice(None) if in_order else self.rows
        # every row at one length: one new token sees every key read, and in order the new
        # keys are written as one slice from start (an int: compiled, a slice's bounds are
        # constants)
        level = len(set(lengths)) == 1
        self.unmasked = level and T == 1
        self.start = lengths[0] if level and in_order else None
        for row in rows:
            self.lengths[row] += T
        return self

    def mask(self, pattern=None):
        """[B, 1, T, keys]: the query at position p sees its row's keys read at positions <= p
        (and, with a pattern, those it keeps); None where each query sees every key read."""
        queries = self.positions[:, None, :, None]  # (B, 1, T, 1), against (keys,)
        if pattern is not None:  # causal: it keeps keys <= p only
            return pattern(None, None, queries, self.key_positions)
        if self.unmasked:
            return None
        return self.key_positions <= queries

    def update(self, layer, k, v):
        """k, v [B, h, T, d_k] written at the rows' positions -> the rows' keys and values so far
        [B, h, keys, d_k]."""
        kept = []
        for cache, new in zip(self.kv[layer], (k, v)):
            new = new.to(cache.dtype)  # (B, h, T, d_k)
            if self.start is not None:  # a copy into a view, not an indexed write
                cache[:, :, self.start : self.n_keys] = new
            else:  # [B, T, h, d_k] places: row b, every head, position positions[b, t]
                cache[self.rows[:, None], :, self.positions] = new.transpose(1, 2)
            kept.append(cache[self.read, :, : self.n_keys])  # (B, h, keys, d_k)
        return kept

    def reset(self, row):
        self.lengths[row] = 0

    def copy(self, source, rows):
        """Row source's keys, values and length into each of rows (a prompt prefilled once)."""
        n = self.lengths[source]
        for layer in self.kv:
            for cache in layer:
                # a copy: all of a RollingCache's slots would be read as they are written
                cache[rows, :, :n] = cache[source, :, :n].clone()
        for row in rows:
            self.lengths[row] = n
