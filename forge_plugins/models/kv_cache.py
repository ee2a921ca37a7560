"""A key/value cache for sampling from the ``llama`` model with its own forward.

``Llama.new_cache(batch, max_len)`` allocates one :class:`KVCache`; ``model(ids,
cache=cache)`` then runs the usual forward on the new tokens only: their positions
continue from ``cache.length`` (packed ``positions`` may still be given), each
attention layer writes its rotated keys and values into the cache and attends over
everything cached so far, and the cache advances.

The first call on an empty cache (the prompt) goes through the configured attention
backend exactly as training does. Later calls attend over the cache with torch's
``scaled_dot_product_attention``: the new queries sit after every cached key, which a
backend's causal kernel (built for queries and keys of one length) cannot express; a
single new token needs no mask at all, several get the causal mask shifted by the
cache length. Both compute the same softmax attention as every backend; the cache holds
one sequence per row (no packed documents).

Rows of different lengths share a cache left-padded: ``model(ids, positions=...,
attention_mask=mask, cache=cache)`` with ``mask (B, S)`` False at padding. The cache
records which of its slots hold tokens, and from then on every call attends through
``scaled_dot_product_attention`` with one mask, built once per forward in
:meth:`KVCache.reserve`: causal, never a padding slot, except that a padding query sees
itself: a query with every key masked is ``nan`` under some kernels (torch's CPU kernel
gives 0), and a ``nan`` in a padding slot's values would reach every real token through
its probability of 0 (``0 * nan``).

Buffers are allocated once for ``max_len`` tokens, in the model's dtype and device, so
a step writes in place and allocates nothing that grows with the sequence.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F


class KVCache:
    """Keys and values of each layer ``(batch, kv_heads, max_len, head_dim)``; ``length``
    tokens of each row are filled."""

    def __init__(
        self,
        n_layers: int,
        batch: int,
        n_kv_heads: int,
        head_dim: int,
        max_len: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        shape = (batch, n_kv_heads, max_len, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.max_len = max_len
        self.length = 0
        #: Which slots hold a token (``False``: padding), once a call gave ``attention_mask``.
        self.filled: torch.Tensor | None = None
        #: The mask of the current call ``(B, 1, S, length + S)``, or ``None``: see the module docstring.
        self.mask: torch.Tensor | None = None

    def reserve(self, seq_len: int, attention_mask: torch.Tensor | None = None) -> int:
        """The position of the first of ``seq_len`` new tokens (the cached count); an
        error when they do not fit. ``attention_mask (B, seq_len)``: which of them are
        tokens (``False``: padding)."""
        start = self.length
        if start + seq_len > self.max_len:
            raise ValueError(
                f"the cache holds {self.max_len} tokens: {start} cached + {seq_len} new do not fit"
            )
        if attention_mask is not None and self.filled is None:
            batch = self.keys[0].shape[0]
            self.filled = torch.ones(batch, self.max_len, dtype=torch.bool, device=attention_mask.device)
        if self.filled is not None:
            end = start + seq_len
            if attention_mask is not None:
                self.filled[:, start:end] = attention_mask
            ones = torch.ones(seq_len, end, dtype=torch.bool, device=self.filled.device)
            causal, own = ones.tril(start), ones.tril(start) & ~ones.tril(start - 1)
            self.mask = (self.filled[:, None, None, :end] & causal) | own
        return start

    def layer(self, index: int) -> LayerCache:
        return LayerCache(self, index)

    def advance(self, seq_len: int) -> None:
        self.length += seq_len

    def clear(self) -> None:
        self.length = 0
        self.filled = self.mask = None


class LayerCache:
    """One layer's view of a :class:`KVCache`."""

    def __init__(self, cache: KVCache, index: int) -> None:
        self.cache, self.index = cache, index

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, backend: Any, prepared: Any
    ) -> torch.Tensor:
        """Store ``k``/``v`` ``(B, kv_heads, S, D)`` after the cached tokens and attend
        ``q`` ``(B, heads, S, D)`` over all of them."""
        start, seq_len = self.cache.length, k.shape[2]
        end = start + seq_len
        keys, values = self.cache.keys[self.index], self.cache.values[self.index]
        keys[:, :, start:end] = k
        values[:, :, start:end] = v
        mask = self.cache.mask
        if start == 0 and mask is None:
            return backend.attend(q, k, v, prepared)
        keys, values = keys[:, :, :end], values[:, :, :end]
        if mask is None and seq_len > 1:
            mask = torch.ones(seq_len, end, dtype=torch.bool, device=q.device).tril(start)
        return F.scaled_dot_product_attention(
            q, keys, values, attn_mask=mask, enable_gqa=q.shape[1] != keys.shape[1]
        )
