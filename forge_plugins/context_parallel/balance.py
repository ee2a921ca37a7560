"""Which tokens of a row each context-parallel rank holds: the load balancers.

Causal attention makes the work of a token grow with its position, so a contiguous
split gives the last rank most of it. :func:`shard_index` returns, for every row, the
row positions each rank holds (ascending within a rank): ``zigzag`` cuts the row into
``2 * cp`` chunks and gives rank ``r`` chunks ``r`` and ``2 * cp - 1 - r`` (the
head-tail split).
"""

from __future__ import annotations

import torch

BALANCERS = ("zigzag", "documents")


def zigzag_index(seq_len: int, cp: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """``(cp, seq_len // cp)`` row positions: rank ``r`` holds chunks ``r`` and
    ``2 * cp - 1 - r`` of ``2 * cp`` equal chunks. ``seq_len`` must divide by ``2 * cp``."""
    if seq_len % (2 * cp):
        raise ValueError(f"zigzag sharding needs seq_len divisible by 2 * cp = {2 * cp}, got {seq_len}")
    chunks = torch.arange(seq_len, device=device).view(2 * cp, seq_len // (2 * cp))
    return torch.stack([torch.cat([chunks[r], chunks[2 * cp - 1 - r]]) for r in range(cp)])


def shard_index(doc_ids: torch.Tensor | None, seq_len: int, cp: int, balance: str) -> torch.Tensor:
    """``(B, cp, seq_len // cp)`` row positions per rank (``B`` = 1, broadcast, when the
    split is the same for every row), each rank's positions ascending. A pure function
    of ``doc_ids`` (the packer's non-decreasing ids, or ``None``) and the sizes: the
    attention recomputes it from the gathered ``doc_ids`` rather than carrying it."""
    device = "cpu" if doc_ids is None else doc_ids.device
    if balance == "zigzag" or doc_ids is None:
        return zigzag_index(seq_len, cp, device)[None]
    raise ValueError(f"unknown balancer {balance!r}; known: {', '.join(BALANCERS)}")
