"""``window``: causal sliding-window attention that honours ``doc_ids``.

Query ``i`` attends to key ``j`` when ``i - window < j <= i`` and, with ``doc_ids``,
both tokens belong to the same document. :meth:`WindowAttention.prepare` builds that
boolean mask once per model forward (every layer reuses it); :meth:`attend` hands it
to PyTorch's ``scaled_dot_product_attention``. The mask is dense (``S x S`` booleans
per row), which keeps the example short; a production backend would use FlexAttention
with a ``BlockMask`` to skip the masked blocks.

The diagonal is always kept, so no query row is fully masked (no NaN from softmax).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F


class WindowAttention:
    def __init__(self, options: Any) -> None:
        self.window = options.window

    def prepare(self, doc_ids: torch.Tensor | None, seq_len: int, device: torch.device | str) -> torch.Tensor:
        """Boolean mask, True where attention is allowed: ``(1, 1, S, S)`` without
        ``doc_ids``, ``(B, 1, S, S)`` with them."""
        q_idx = torch.arange(seq_len, device=device)[:, None]
        kv_idx = torch.arange(seq_len, device=device)[None, :]
        band = (kv_idx <= q_idx) & (q_idx - kv_idx < self.window)
        if doc_ids is None:
            return band[None, None]
        doc_ids = doc_ids.to(device)
        same_doc = doc_ids[:, :, None] == doc_ids[:, None, :]
        return (band[None] & same_doc)[:, None]

    def attended_pairs(self, doc_ids: torch.Tensor | None, rows: int, seq_len: int) -> int:
        """The query-key pairs :meth:`prepare`'s mask allows, for Forge's MFU: a token at
        position ``p`` of its document (of the row, without ``doc_ids``) attends to
        ``min(p + 1, window)`` keys."""
        if doc_ids is None:
            return rows * int(torch.arange(1, seq_len + 1).clamp(max=self.window).sum())
        ids = doc_ids.detach().cpu()
        starts = torch.ones_like(ids, dtype=torch.bool)
        starts[:, 1:] = ids[:, 1:] != ids[:, :-1]
        # Position within the document: distance to the latest document start.
        index = torch.arange(seq_len).expand_as(ids)
        last_start = torch.where(starts, index, torch.zeros_like(index)).cummax(dim=1).values
        return int((index - last_start + 1).clamp(max=self.window).sum())

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prepared: torch.Tensor
    ) -> torch.Tensor:
        # Head counts come from the shapes (tensor parallelism shards heads per rank).
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=prepared, enable_gqa=q.shape[1] != k.shape[1]
        )
