"""Packed-row metadata for tests and benchmarks, built the way packers define it.

``doc_ids[i]`` is the number of document ends strictly before ``i`` and ``positions``
restart at 0 at every document, so a row is fully described by its document lengths.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch


def spans(lengths: Sequence[int]) -> list[tuple[int, int]]:
    """``[start, end)`` of every document of a row."""
    ends = np.cumsum(lengths).tolist()
    return [(end - length, end) for end, length in zip(ends, lengths)]


def packed_metadata(
    rows: Sequence[Sequence[int]], device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(doc_ids, positions)``, LongTensors ``(len(rows), S)``, for rows of document
    lengths that each sum to the same ``S``."""
    totals = {sum(lengths) for lengths in rows}
    if len(totals) != 1 or any(n <= 0 for lengths in rows for n in lengths):
        raise ValueError(f"every row needs positive lengths summing to one length, got {rows}")
    doc_ids = [np.repeat(np.arange(len(lengths)), lengths) for lengths in rows]
    positions = [np.concatenate([np.arange(n) for n in lengths]) for lengths in rows]
    return (
        torch.as_tensor(np.stack(doc_ids), dtype=torch.long, device=device),
        torch.as_tensor(np.stack(positions), dtype=torch.long, device=device),
    )


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
