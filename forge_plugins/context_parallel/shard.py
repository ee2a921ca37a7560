"""The batch transform of context parallelism: each cp rank keeps its share of every
row (:func:`~forge_plugins.context_parallel.balance.shard_index`), with ``positions``
that stay global, so rotary embeddings restart per document exactly as in one process."""

from __future__ import annotations

import torch

from forge_core.api import DOC_IDS, INPUT_IDS, POSITIONS
from forge_plugins.context_parallel.balance import shard_index


def shard_batch(
    batch: dict[str, torch.Tensor], rank: int, size: int, balance: str
) -> dict[str, torch.Tensor]:
    """The tokens of ``batch`` that cp rank ``rank`` of ``size`` holds. Every ``(B, S)``
    tensor (inputs, labels, per-token metadata) is gathered along the sequence; the
    labels are the packer's (already the next token), so nothing is shifted here.
    ``positions`` is added when the packer emits none: the row position."""
    ids = batch[INPUT_IDS]
    rows, seq_len = ids.shape[:2]
    index = shard_index(batch.get(DOC_IDS), seq_len, size, balance)[:, rank].to(ids.device)
    index = index.expand(rows, -1)
    out = {}
    for key, value in batch.items():
        if isinstance(value, torch.Tensor) and value.dim() == 2 and value.shape == (rows, seq_len):
            out[key] = value.gather(1, index)
        else:
            out[key] = value
    if POSITIONS not in batch:
        out[POSITIONS] = index.clone()
    return out
