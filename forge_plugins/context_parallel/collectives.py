"""The collectives of context-parallel attention, differentiable, over one process group.

- :func:`gather_sequence`: every rank's shard concatenated along the sequence, in rank
  order. Its backward hands each rank the gradient of its own shard summed over the
  group: an ``all_to_all_single`` of the gradient's rank chunks, then a sum (gloo has no
  ``reduce_scatter``; it has ``all_to_all_single``, and so has nccl).
- :func:`heads_to_sequence` / :func:`sequence_to_heads`: the Ulysses all-to-all,
  ``(B, H, S/cp, D)`` (all heads, a sequence shard) to ``(B, H/cp, S, D)`` (a share of
  the heads, the whole sequence in rank order) and back; each is the other's backward.

The same code runs on gloo (CPU) and nccl (GPU). Each call is kept out of compiled
graphs (``torch.compiler.disable``): the blocks that attend may be compiled, and a
graph should not capture a collective on a process group it does not know.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

#: ``all_gather_into_tensor`` was renamed; take the name this PyTorch has.
_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def _all_to_all(chunks: torch.Tensor, group: Any) -> torch.Tensor:
    """``chunks (cp, ...)``: chunk ``j`` goes to rank ``j``; returns ``(cp, ...)`` whose
    chunk ``i`` came from rank ``i``."""
    chunks = chunks.contiguous()
    out = torch.empty_like(chunks)
    dist.all_to_all_single(out, chunks, group=group)
    return out


def _all_gather(x: torch.Tensor, group: Any) -> torch.Tensor:
    """``(cp, *x.shape)``: every rank's ``x``, in rank order."""
    x = x.contiguous()
    cp = dist.get_world_size(group)
    # Concatenated along the first dimension (what gloo and nccl both take).
    out = torch.empty((cp * x.shape[0], *x.shape[1:]), dtype=x.dtype, device=x.device)
    _ALL_GATHER(out, x, group=group)
    return out.view(cp, *x.shape)


class _GatherSequence(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, dim):
        ctx.group, ctx.dim = group, dim
        parts = _all_gather(x, group)  # (cp, ...) with the shard dimension at dim + 1
        return torch.cat(parts.unbind(0), dim=dim)

    @staticmethod
    def backward(ctx, grad):
        cp = dist.get_world_size(ctx.group)
        # Chunk j of this rank's gradient belongs to rank j's shard; what comes back is
        # every rank's gradient of this rank's shard, summed here.
        chunks = torch.stack(grad.chunk(cp, dim=ctx.dim))
        return _all_to_all(chunks, ctx.group).sum(0), None, None


class _HeadsToSequence(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _heads_to_sequence(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _sequence_to_heads(grad, ctx.group), None


class _SequenceToHeads(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _sequence_to_heads(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _heads_to_sequence(grad, ctx.group), None


def _heads_to_sequence(x: torch.Tensor, group: Any) -> torch.Tensor:
    batch, heads, shard, head_dim = x.shape
    cp = dist.get_world_size(group)
    # Head share j goes to rank j; what comes back is sequence shard i from rank i.
    chunks = x.view(batch, cp, heads // cp, shard, head_dim).transpose(0, 1)
    got = _all_to_all(chunks, group)  # (cp, B, H/cp, S/cp, D)
    return got.permute(1, 2, 0, 3, 4).reshape(batch, heads // cp, cp * shard, head_dim)


def _sequence_to_heads(x: torch.Tensor, group: Any) -> torch.Tensor:
    batch, share, seq_len, head_dim = x.shape
    cp = dist.get_world_size(group)
    # Sequence shard j goes to rank j; what comes back is head share i from rank i.
    chunks = x.view(batch, share, cp, seq_len // cp, head_dim).permute(2, 0, 1, 3, 4)
    got = _all_to_all(chunks, group)  # (cp, B, H/cp, S/cp, D)
    return got.transpose(0, 1).reshape(batch, cp * share, seq_len // cp, head_dim)


@torch.compiler.disable
def gather_sequence(x: torch.Tensor, group: Any, dim: int) -> torch.Tensor:
    """Every rank's ``x`` concatenated along ``dim`` in rank order (each rank's ``x`` of
    the same shape). Differentiable: the gradient of a rank's ``x`` is the sum over the
    group of the gradients of its slice. Integer tensors (``doc_ids``) pass too."""
    if not x.requires_grad:
        return torch.cat(_all_gather(x, group).unbind(0), dim=dim)
    return _GatherSequence.apply(x, group, dim % x.dim())


@torch.compiler.disable
def heads_to_sequence(x: torch.Tensor, group: Any) -> torch.Tensor:
    """Ulysses: ``(B, H, S/cp, D)`` -> ``(B, H/cp, S, D)``: this rank keeps head share
    ``rank`` (heads ``rank * H/cp ...``) of every rank's sequence shard, in rank order.
    ``H`` must divide by the group size."""
    _check_divides(x.shape[1], group, "heads")
    return _HeadsToSequence.apply(x, group)


@torch.compiler.disable
def sequence_to_heads(x: torch.Tensor, group: Any) -> torch.Tensor:
    """The inverse of :func:`heads_to_sequence`: ``(B, H/cp, S, D)`` -> ``(B, H, S/cp, D)``."""
    _check_divides(x.shape[2], group, "sequence length")
    return _SequenceToHeads.apply(x, group)


def _check_divides(n: int, group: Any, what: str) -> None:
    cp = dist.get_world_size(group)
    if n % cp:
        raise ValueError(f"the Ulysses all-to-all needs {what} ({n}) divisible by the cp group size {cp}")
