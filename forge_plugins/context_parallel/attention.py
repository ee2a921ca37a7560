"""Attention over a context-parallel group: :class:`ContextParallelAttention` wraps the
run's attention backend so that a rank holding ``S/cp`` tokens of every row attends as
if it held the row.

A rank's tokens sit at the row positions ``shard_index(...)[:, rank]`` (ascending).
Nothing is carried beside the batch: :meth:`~ContextParallelAttention.prepare` gathers
the local ``doc_ids`` over the group, and since a row's ids never decrease the sorted
gathered values are the full row's ids, from which the shard index is recomputed (so
pipeline microbatches and every schedule need nothing more). Then, per layer:

- ``allgather`` (exact for any mask; the default): ``k`` and ``v`` are gathered over the
  group, put back in row order, and the local queries attend to them through the
  backend's rectangular mask (``prepare_queries``: queries at ``query_index`` against
  the whole row).
- ``ulysses``: an all-to-all trades heads for sequence (each rank gets ``H/cp`` heads of
  the whole row), the backend's ordinary ``prepare``/``attend`` runs on the row, and the
  reverse all-to-all hands every rank its tokens back with all heads. Heads and
  key/value heads must divide by the group size.
"""

from __future__ import annotations

from typing import Any

import attrs
import torch

from forge_core.api import QueryShardingBackend
from forge_plugins.context_parallel.balance import shard_index
from forge_plugins.context_parallel.collectives import gather_sequence, heads_to_sequence, sequence_to_heads

ATTENTION_MODES = ("allgather", "ulysses")


@attrs.frozen
class ShardedRows:
    """What :meth:`ContextParallelAttention.prepare` builds once per forward.

    ``order (B or 1, S)``: the row position of each entry of the rank-order
    concatenation of the shards; ``inverse``: where each row position sits in it;
    ``inner``: the wrapped backend's prepared mask (rectangular for ``allgather``)."""

    order: torch.Tensor
    inverse: torch.Tensor
    inner: Any


def _along_sequence(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``x (..., B, H, S, D)`` with its sequence entries picked by ``index (B or 1, S')``."""
    if index.shape[0] == 1:
        return x.index_select(-2, index[0])
    index = index[:, None, :, None].expand(*x.shape[:-2], index.shape[1], x.shape[-1])
    return x.gather(-2, index)


class ContextParallelAttention:
    """``backend`` (the run's attention backend) over the cp group of ``ctx``
    (``.group``, ``.rank``, ``.size``, ``.options.attention``, ``.options.balance``).

    ``prepare(doc_ids, seq_len, device)`` takes this rank's ``doc_ids (B, S/cp)`` (or
    ``None``) and its local ``seq_len``; ``attend(q, k, v, prepared)`` takes this rank's
    ``q (B, H, S/cp, D)``, ``k``/``v (B, Hkv, S/cp, D)`` and returns ``q``'s shape."""

    def __init__(self, backend: Any, ctx: Any) -> None:
        mode = ctx.options.attention
        if mode not in ATTENTION_MODES:
            raise ValueError(f"unknown cp attention {mode!r}; known: {', '.join(ATTENTION_MODES)}")
        if mode == "allgather" and not isinstance(backend, QueryShardingBackend):
            raise ValueError(
                f"cp attention 'allgather' needs a backend with prepare_queries; "
                f"{type(backend).__name__} has none: use attention 'ulysses' or a built-in backend"
            )
        self.backend, self.ctx, self.mode = backend, ctx, mode

    @torch.compiler.disable
    def prepare(self, doc_ids: torch.Tensor | None, seq_len: int, device: torch.device | str) -> ShardedRows:
        ctx = self.ctx
        full_len = seq_len * ctx.size
        full = None
        if doc_ids is not None:
            if doc_ids.dim() != 2 or doc_ids.shape[1] != seq_len:
                raise ValueError(
                    f"doc_ids must have shape (batch, {seq_len}) (this rank's tokens), "
                    f"got {tuple(doc_ids.shape)}"
                )
            # A row's ids never decrease: its ids are the sorted ids of all shards.
            full = gather_sequence(doc_ids.to(device), ctx.group, dim=1).sort(dim=1).values
        index = shard_index(full, full_len, ctx.size, ctx.options.balance).to(device)
        if full is not None:
            # The ids this rank holds must be those its recomputed share says it holds:
            # otherwise the rows were not non-decreasing or were split by another rule,
            # and the masks would silently pair the wrong tokens.
            mine = full.gather(1, index[:, ctx.rank].expand(full.shape[0], -1))
            if not torch.equal(mine, doc_ids.to(device)):
                raise ValueError(
                    f"cp rank {ctx.rank}: the doc_ids it holds are not its {ctx.options.balance!r} share of "
                    "the row gathered over the cp group: doc_ids must never decrease along a row (the "
                    "packer's contract) and the batch must be split with the same balancer"
                )
        order = index.flatten(1)
        inverse = order.argsort(dim=1)
        if self.mode == "allgather":
            inner = self.backend.prepare_queries(full, index[:, ctx.rank], full_len, device)
        else:
            inner = self.backend.prepare(full, full_len, device)
        return ShardedRows(order=order, inverse=inverse, inner=inner)

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prepared: ShardedRows
    ) -> torch.Tensor:
        if self.mode == "allgather":
            k, v = self.gather_keys(k, v, prepared)
            return self.backend.attend(q, k, v, prepared.inner)
        group = self.ctx.group
        for name, x in (("heads", q), ("key/value heads", k)):
            if x.shape[1] % self.ctx.size:
                raise ValueError(
                    f"cp attention 'ulysses' needs {name} ({x.shape[1]}) divisible by cp ({self.ctx.size}): "
                    "use attention 'allgather'"
                )
        q = _along_sequence(heads_to_sequence(q, group), prepared.inverse)
        # One all-to-all for k and v together: each rank's head share holds its share of
        # k's heads, then the same share of v's.
        batch, kv_heads, shard, head_dim = k.shape
        shares = torch.cat([x.view(batch, self.ctx.size, -1, shard, head_dim) for x in (k, v)], dim=2)
        kv = heads_to_sequence(shares.view(batch, 2 * kv_heads, shard, head_dim), group)
        k, v = _along_sequence(kv, prepared.inverse).chunk(2, dim=1)
        out = self.backend.attend(q, k, v, prepared.inner)
        return sequence_to_heads(_along_sequence(out, prepared.order), group)

    def gather_keys(
        self, k: torch.Tensor, v: torch.Tensor, prepared: ShardedRows
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Every rank's ``k`` and ``v`` in row order, ``(B, Hkv, S, D)`` (one all-gather)."""
        kv = _along_sequence(gather_sequence(torch.stack([k, v]), self.ctx.group, dim=3), prepared.inverse)
        return kv[0], kv[1]
