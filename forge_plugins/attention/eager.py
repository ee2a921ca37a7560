"""``eager``: explicit softmax attention, the readable baseline the other backends are
compared with (the conformance kit's float64 ``reference_attention`` is the stricter one).

Scores are materialised (``B x H x S x S``); the softmax is taken in the input's dtype
but never below fp32 (bf16/fp16 inputs are accumulated in fp32, float64 inputs stay
float64, so ``eager`` in float64 can serve as a float64 reference). Grouped query
attention repeats each key/value head for its query heads
(``repeat_interleave``, the convention SDPA's ``enable_gqa`` and Hugging Face use). The
mask is the dense causal (``doc_ids=None``) or block-diagonal causal boolean mask built
once per forward, ``O(S^2)`` memory like ``sdpa``'s (:meth:`EagerAttention.prepare_queries`:
the rectangular ``(B, 1, Sq, S)`` one for queries at some row positions). Slow; meant for tests and
debugging, not training.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from forge_plugins.attention.masks import causal_mask, document_causal_mask, query_causal_mask


def check_heads(q: torch.Tensor, k: torch.Tensor) -> int:
    """Query heads per key/value head; refuses counts that do not group."""
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"query heads ({q.shape[1]}) must be a multiple of key/value heads ({k.shape[1]})")
    return q.shape[1] // k.shape[1]


def eager_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Softmax attention of ``q (B,H,S,D)`` over ``k, v (B,Hkv,S,D)`` where ``mask`` is True."""
    group = check_heads(q, k)
    if group > 1:
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~mask, float("-inf"))
    # At least fp32: half-precision softmax loses too much; float64 must stay float64.
    probs = torch.softmax(scores, dim=-1, dtype=torch.promote_types(scores.dtype, torch.float32))
    probs = probs.to(q.dtype)
    return probs @ v


class EagerAttention:
    def __init__(self, options: Any) -> None:
        self.options = options

    def prepare(self, doc_ids: torch.Tensor | None, seq_len: int, device: torch.device | str) -> torch.Tensor:
        if doc_ids is None:
            return causal_mask(seq_len, device)
        return document_causal_mask(doc_ids, seq_len, device)

    def prepare_queries(
        self,
        doc_ids: torch.Tensor | None,
        query_index: torch.Tensor,
        seq_len: int,
        device: torch.device | str,
    ) -> torch.Tensor:
        return query_causal_mask(doc_ids, query_index, seq_len, device)

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prepared: torch.Tensor
    ) -> torch.Tensor:
        return eager_attention(q, k, v, prepared)
