"""Which tokens of a row each context-parallel rank holds: the load balancers.

Causal attention makes the work of a token grow with its position, so a contiguous
split gives the last rank most of it. :func:`shard_index` returns, for every row, the
row positions each rank holds (ascending within a rank, ``seq_len // cp`` each):

- ``zigzag`` cuts the row into ``2 * cp`` chunks and gives rank ``r`` chunks ``r`` and
  ``2 * cp - 1 - r`` (the head-tail split). Exact for one document spanning the row;
  a packed row's work is in its long documents, wherever they sit, so it drifts.
- ``documents`` balances the actual work of a packed row. The work of a query token
  is the number of keys it attends: its position in its document + 1. The row is cut
  into ``2 * cp * m`` granules of ``g`` contiguous tokens (``g`` = :func:`granule`),
  the granules are sorted by work, heaviest first, and dealt out snake-wise (ranks
  ``0 .. cp-1``, then ``cp-1 .. 0``, ...), so every rank gets ``2m`` granules. Any two
  ranks' totals then differ by at most the heaviest granule's work (the differences
  of consecutive deals telescope), so the imbalance is at most
  ``1 + cp * heaviest granule / row work``. One document spanning the row comes out
  exactly balanced, as under zigzag (granule works are an arithmetic progression and
  every rank gets an even number of deals). A row whose deal leaves a busier rank
  than zigzag would (it happens with a few granules per rank) takes zigzag: never
  worse than zigzag.

The granule is :data:`GRANULE` = 128 tokens where ``seq_len`` allows: flex's block size,
so each of a rank's query blocks is one block-aligned run of the row and the document
mask keeps one process's block sparsity. Smaller granules balance the token work
better but make block-sparse attention dearer: measured on 64 log-normal rows (median
512, as in the bench) of 8192 tokens at cp = 8, the busiest rank's non-empty mask
blocks are 1.17x one process's share at 128, 1.56x at 64 and 1.88x at 32 (zigzag:
1.62x), while the token work imbalance falls from 1.048 to 1.014 and 1.003.

Why a sort of granules rather than zigzag within each document plus a greedy fill of
small documents: the greedy fill is a sequential loop with a host round trip every
step on every rank, and it cannot give every rank exactly ``seq_len // cp`` tokens
without splitting documents anyway. The sort is a handful of batched tensor ops on
the device that holds ``doc_ids``, without a host sync (a few ms of CPU for 8 rows of
32768 tokens).

Both are pure functions of the full row's ``doc_ids`` and the sizes, in integer
arithmetic with ties broken by position (sort keys are unique), so the batch
transform and the attention wrapper, on CPU or GPU, compute the same split.
:func:`attention_work` and :func:`imbalance` measure a split (bench and tests).
"""

from __future__ import annotations

import torch

BALANCERS = ("zigzag", "documents")
# Tokens per granule of the ``documents`` balancer when seq_len allows: flex's default
# block size, so a local query block is one contiguous, block-aligned run of the row.
GRANULE = 128


def _check_sizes(seq_len: int, cp: int, balancer: str) -> None:
    if not isinstance(cp, int) or cp < 1:
        raise ValueError(f"cp must be a positive integer, got {cp!r}")
    if seq_len < 1 or seq_len % (2 * cp):
        raise ValueError(
            f"{balancer} sharding needs seq_len divisible by 2 * cp = {2 * cp}, got seq_len = {seq_len}; "
            f"use a seq_len that is a multiple of {2 * cp}"
        )


def zigzag_index(seq_len: int, cp: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """``(cp, seq_len // cp)`` row positions: rank ``r`` holds chunks ``r`` and
    ``2 * cp - 1 - r`` of ``2 * cp`` equal chunks. ``seq_len`` must divide by ``2 * cp``."""
    _check_sizes(seq_len, cp, "zigzag")
    chunks = torch.arange(seq_len, device=device).view(2 * cp, seq_len // (2 * cp))
    return torch.stack([torch.cat([chunks[r], chunks[2 * cp - 1 - r]]) for r in range(cp)])


def contiguous_index(seq_len: int, cp: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """``(cp, seq_len // cp)``: rank ``r`` holds the ``r``-th contiguous slice (the
    unbalanced baseline the measurements compare against; not a balancer option)."""
    if seq_len % cp:
        raise ValueError(f"a contiguous split needs seq_len divisible by cp = {cp}, got {seq_len}")
    return torch.arange(seq_len, device=device).view(cp, seq_len // cp)


def granule(seq_len: int, cp: int) -> int:
    """Tokens per granule of the ``documents`` balancer: the largest divisor of
    ``seq_len // (2 * cp)`` that is at most :data:`GRANULE` (so every rank gets an even
    number of granules; :data:`GRANULE` itself when ``seq_len`` is a multiple of
    ``2 * cp * GRANULE``)."""
    _check_sizes(seq_len, cp, "documents")
    half = seq_len // (2 * cp)
    return next(g for g in range(min(GRANULE, half), 0, -1) if half % g == 0)


def token_work(doc_ids: torch.Tensor) -> torch.Tensor:
    """``(B, S)`` int64: keys each query token attends under the causal document mask,
    its position within its (row-local) document + 1. A document is a run of equal ids."""
    B, S = doc_ids.shape
    pos = torch.arange(S, device=doc_ids.device).expand(B, S)
    new_doc = torch.ones_like(doc_ids, dtype=torch.bool)
    new_doc[:, 1:] = doc_ids[:, 1:] != doc_ids[:, :-1]
    start = torch.where(new_doc, pos, torch.zeros_like(pos)).cummax(dim=1).values
    return pos - start + 1


def documents_index(doc_ids: torch.Tensor, cp: int) -> torch.Tensor:
    """``(B, cp, S // cp)`` row positions balancing each row's causal attention work
    (the ``documents`` balancer; see the module docstring). A row where the deal comes
    out worse than zigzag (possible only with a few granules per rank) takes zigzag."""
    B, S = doc_ids.shape
    g = granule(S, cp)
    n = S // g  # granules per row: 2 * cp * m
    device = doc_ids.device
    work = token_work(doc_ids).view(B, n, g).sum(-1)
    ids = torch.arange(n, device=device)
    # Heaviest first, ties by position: the key is unique, so every sort agrees.
    order = torch.argsort(ids - work * n, dim=1)
    within = ids % cp
    snake = torch.where((ids // cp) % 2 == 0, within, cp - 1 - within)
    rank = torch.empty_like(order).scatter_(1, order, snake.expand(B, n))
    # Each rank's granules in row order, then their tokens.
    held = torch.argsort(rank * n + ids, dim=1).view(B, cp, n // cp)
    index = (held[..., None] * g + torch.arange(g, device=device)).view(B, cp, S // cp)
    # Zigzag's chunks are whole granules, so both splits' busiest ranks come from `work`.
    busiest = torch.zeros(B, cp, dtype=work.dtype, device=device).scatter_add_(1, rank, work).max(1).values
    chunks = work.view(B, 2 * cp, n // (2 * cp)).sum(-1)
    zigzag_busiest = (chunks[:, :cp] + chunks[:, cp:].flip(1)).max(1).values
    worse = (busiest > zigzag_busiest)[:, None, None]
    return torch.where(worse, zigzag_index(S, cp, device)[None], index)


def shard_index(doc_ids: torch.Tensor | None, seq_len: int, cp: int, balance: str) -> torch.Tensor:
    """``(B, cp, seq_len // cp)`` row positions per rank (``B`` = 1, broadcast, when the
    split is the same for every row), each rank's positions ascending. A pure function
    of ``doc_ids`` (the packer's non-decreasing ids, or ``None``) and the sizes: the
    attention recomputes it from the gathered ``doc_ids`` rather than carrying it.

    Both balancers need ``seq_len`` divisible by ``2 * cp``; ``documents`` without
    ``doc_ids`` (one document per row) is ``zigzag``."""
    if balance not in BALANCERS:
        raise ValueError(f"unknown balancer {balance!r}; known: {', '.join(BALANCERS)}")
    if doc_ids is not None and (doc_ids.dim() != 2 or doc_ids.shape[1] != seq_len):
        raise ValueError(f"doc_ids must be (batch, seq_len = {seq_len}), got shape {tuple(doc_ids.shape)}")
    if balance == "zigzag" or doc_ids is None:
        device = "cpu" if doc_ids is None else doc_ids.device
        return zigzag_index(seq_len, cp, device)[None]
    return documents_index(doc_ids, cp)


def attention_work(doc_ids: torch.Tensor | None, index: torch.Tensor) -> torch.Tensor:
    """``(B, cp)`` int64: causal attention work (keys attended, summed over the rank's
    query tokens) of each rank under the split ``index`` (``(B or 1, cp, S // cp)``).
    ``doc_ids`` ``None`` is one document per row (``B`` is then ``index``'s)."""
    _, cp, n = index.shape
    if doc_ids is None:
        doc_ids = torch.zeros(index.shape[0], cp * n, dtype=torch.long, device=index.device)
    work = token_work(doc_ids)
    B = work.shape[0]
    return work.gather(1, index.reshape(-1, cp * n).expand(B, cp * n)).view(B, cp, n).sum(-1)


def imbalance(doc_ids: torch.Tensor | None, index: torch.Tensor) -> torch.Tensor:
    """``(B,)`` float64: the busiest rank's work over the mean rank work, per row
    (1.0 is perfect; the step waits for the busiest rank)."""
    work = attention_work(doc_ids, index).double()
    return work.max(dim=1).values / work.mean(dim=1)


def splits(doc_ids: torch.Tensor, cp: int) -> dict[str, torch.Tensor]:
    """The contiguous split and every balancer's split of the rows ``doc_ids``, by name
    (what ``bench/context_parallel_balance.py`` measures with :func:`imbalance`)."""
    S = doc_ids.shape[1]
    out = {"contiguous": contiguous_index(S, cp, doc_ids.device)[None]}
    out.update({name: shard_index(doc_ids, S, cp, name) for name in BALANCERS})
    return out
