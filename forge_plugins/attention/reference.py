"""Packed-row metadata for tests and benchmarks, built the way packers define it.

``doc_ids[i]`` is the number of document ends strictly before ``i`` and ``positions``
restart at 0 at every document, so a row is fully described by its document lengths.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

# The conformance kit owns the doc_ids convention; packed rows here are built by it too.
from forge_core.testing.attention import doc_ids_from_lengths, spans

__all__ = ["lognormal_lengths", "packed_metadata", "spans"]


def packed_metadata(
    rows: Sequence[Sequence[int]], device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(doc_ids, positions)``, LongTensors ``(len(rows), S)``, for rows of positive
    document lengths that each sum to the same ``S``."""
    doc_ids = doc_ids_from_lengths(rows, sum(rows[0]) if rows else 0)
    positions = [torch.cat([torch.arange(n) for n in lengths]) for lengths in rows]
    return doc_ids.to(device), torch.stack(positions).to(device)


def lognormal_lengths(
    seq_len: int, median: float = 512, sigma: float = 1.0, seed: int = 0
) -> list[int]:
    """Document lengths drawn log-normally (``median``, ``sigma`` of the log) until they
    fill ``seq_len``; the last document is cut to end the row."""
    rng = np.random.default_rng(seed)
    lengths: list[int] = []
    while sum(lengths) < seq_len:
        length = max(1, int(round(rng.lognormal(np.log(median), sigma))))
        lengths.append(min(length, seq_len - sum(lengths)))
    return lengths
