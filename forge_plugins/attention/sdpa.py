"""``sdpa``: PyTorch's ``scaled_dot_product_attention``.

Without ``doc_ids`` it calls SDPA with ``is_causal=True`` and no mask, so GPUs keep the
flash kernel. With ``doc_ids`` it builds one block-diagonal causal boolean mask
``(B, 1, S, S)`` per forward (in :meth:`SdpaAttention.prepare`) that every layer
shares. That mask costs ``O(S^2)`` memory (``S^2`` bytes per row: 16 MiB at 4096,
64 MiB at 8192) and an explicit ``attn_mask`` rules out the flash kernel, so compute is
dense ``O(S^2)`` even though most entries are masked; prefer ``flex`` for long packed
rows (the rule ``sdpa.dense-mask-long-seq`` warns from
``attention.options.dense_mask_warn_seq_len``).

:meth:`SdpaAttention.prepare_queries` (context parallelism: the queries of some row
positions against the whole row) builds the rectangular dense mask ``(B, 1, Sq, S)``,
also without ``doc_ids``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from forge_plugins.attention.masks import document_causal_mask, query_causal_mask


class SdpaAttention:
    def __init__(self, options: Any) -> None:
        self.options = options

    def prepare(
        self, doc_ids: torch.Tensor | None, seq_len: int, device: torch.device | str
    ) -> torch.Tensor | None:
        if doc_ids is None:
            return None
        return document_causal_mask(doc_ids, seq_len, device)

    def prepare_queries(
        self,
        doc_ids: torch.Tensor | None,
        query_index: torch.Tensor,
        seq_len: int,
        device: torch.device | str,
    ) -> torch.Tensor:
        # The queries at query_index against the whole row: always a dense mask (is_causal
        # would align the query and key ends, which is wrong for rows out of the middle).
        return query_causal_mask(doc_ids, query_index, seq_len, device)

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prepared: torch.Tensor | None
    ) -> torch.Tensor:
        # Head counts come from the shapes: tensor parallelism shards heads per rank.
        gqa = q.shape[1] != k.shape[1]
        if prepared is None:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=prepared, enable_gqa=gqa)
