"""The collectives of expert parallelism, differentiable, over one process group.

:func:`all_to_all` sends a tensor's rows in uneven blocks: block ``j`` of
``send_splits`` (rows) goes to rank ``j``, and ``recv_splits[i]`` rows come back from
rank ``i``, concatenated in rank order. Its backward is the same exchange with the
splits swapped, so the gradient of every row returns to the rank that sent it.
:func:`exchange_counts` tells every rank how many rows it will receive (an all-to-all
of integers, no gradient).

The same code runs on gloo (CPU) and nccl (GPU): both implement
``all_to_all_single`` with uneven splits. Each call is kept out of compiled graphs
(``torch.compiler.disable``): the blocks that hold the experts may be compiled, and the
splits are read on the host.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist


def _exchange(x: torch.Tensor, send: list[int], recv: list[int], group: Any) -> torch.Tensor:
    x = x.contiguous()
    out = x.new_empty((sum(recv), *x.shape[1:]))
    dist.all_to_all_single(out, x, output_split_sizes=recv, input_split_sizes=send, group=group)
    return out


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, send, recv, group):
        ctx.send, ctx.recv, ctx.group = send, recv, group
        return _exchange(x, send, recv, group)

    @staticmethod
    def backward(ctx, grad):
        return _exchange(grad, ctx.recv, ctx.send, ctx.group), None, None, None


@torch.compiler.disable
def all_to_all(x: torch.Tensor, send_splits: list[int], recv_splits: list[int], group: Any) -> torch.Tensor:
    """``x``'s rows ``(sum(send_splits), ...)`` exchanged over ``group``: the first
    ``send_splits[0]`` to rank 0, the next ``send_splits[1]`` to rank 1, ...; returns
    ``(sum(recv_splits), ...)``, the rows from rank 0 first. Differentiable."""
    if len(send_splits) != dist.get_world_size(group) or len(recv_splits) != len(send_splits):
        raise ValueError(
            f"all_to_all needs one split per rank of the group ({dist.get_world_size(group)}), "
            f"got {len(send_splits)} to send and {len(recv_splits)} to receive"
        )
    if sum(send_splits) != x.shape[0]:
        raise ValueError(f"the send splits {send_splits} sum to {sum(send_splits)}, not to {x.shape[0]} rows")
    return _AllToAll.apply(x, list(send_splits), list(recv_splits), group)


@torch.compiler.disable
def exchange_counts(counts: torch.Tensor, group: Any) -> torch.Tensor:
    """``counts (size, n)`` integers, row ``j`` for rank ``j``; returns ``(size, n)``
    whose row ``i`` is what rank ``i`` sent this rank."""
    counts = counts.contiguous()
    out = torch.empty_like(counts)
    dist.all_to_all_single(out, counts, group=group)
    return out
