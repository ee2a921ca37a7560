"""The chunked loss (``train.loss.name: chunked``): the output projection and the
cross-entropy computed a chunk of tokens at a time, so the logits (tokens x vocabulary)
never exist at once.

At a 128k vocabulary, 8 rows of 4,096 tokens give 16 GiB of fp32 logits, plus their
gradient; a chunk of 1,024 tokens holds 512 MiB. The model declares its output head in
its parallel contract (:attr:`forge_core.api.ParallelContract.output_head`);
:func:`take_over_head` makes that head's forward the identity, so the model returns the
final hidden states, and :class:`ChunkedLoss` applies the head's weight itself. The
head stays registered where it was, so state-dict keys, sharding (FSDP, tensor
parallelism) and tied weights are those of the plain model.

One pass, forward and gradient together: for each chunk the logits are computed, the
log-sum-exp and the target's logit give the chunk's loss, and, when a gradient will be
needed, ``softmax - one_hot`` gives the logits' gradient, from which the gradients of
the hidden states (this chunk's rows) and of the head's weight (accumulated over the
chunks) follow at once; the chunk's logits are then dropped. Backward only scales those
by the incoming gradient. That is the plain loss's matmul count (one forward, two
backward), where recomputing the logits in backward would add a fourth. The price:
between forward and backward the head's weight gradient is held (one copy of the
weight, fp32), which a pipeline schedule that runs every forward first (``gpipe``)
holds once per microbatch in flight.

Vocabulary-parallel (loss parallelism): when the head's weight is a DTensor sharded
along the vocabulary (``Shard(0)``, as a column-wise tensor-parallel head is), each rank
computes the logits of its own vocabulary rows only; the row maximum (MAX), the sum of
exponentials (SUM) and the target's logit (SUM, held by exactly one rank) are combined
over the tensor-parallel group, three all-reduces of ``chunk_tokens`` numbers per chunk,
and the hidden-state gradient (the sum over vocabulary shards) is all-reduced once at the
end. No rank ever holds more than its shard of a chunk's logits. The hidden states and
labels must be the same on every rank of that group (replicated activations: what a
column-wise head's input is).

Precision: the logits are cast to at least fp32 (float64 stays float64) before the
softmax, as the plain loss does; the matmuls run in the autocast dtype when autocast is
on (as the plain head would), else in the inputs' dtype.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist

from forge_core.api import IGNORE_INDEX, ForgeError, contract_of


def _identity(hidden: torch.Tensor) -> torch.Tensor:
    return hidden


def take_over_head(model: torch.nn.Module, model_name: str) -> torch.nn.Module:
    """The model's output head (named by its contract), with its forward made the
    identity so the model returns hidden states; a ForgeError naming the fix when the
    model declares none or the head is not a linear map."""
    contract = contract_of(model)
    name = None if contract is None else contract.output_head
    head = None if name is None else getattr(model, name, None)
    if head is None:
        why = (
            "it has no parallel_contract()"
            if contract is None
            else "its parallel contract names no output_head"
            if name is None
            else f"its output_head {name!r} is not an attribute of the model"
        )
        raise ForgeError(
            f"train.loss.name: chunked applies the output head itself, but model {model_name!r} "
            f"({type(model).__name__}) does not say where it is: {why}. Set train.loss.name: full, or "
            "(model authors) name the head in ParallelContract.output_head and declare OUTPUT_HEAD "
            "in the spec's supports."
        )
    weight = getattr(head, "weight", None)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        raise ForgeError(
            f"train.loss.name: chunked: the output head {name!r} of model {model_name!r} "
            f"({type(head).__name__}) has no 2-D weight (vocab, dim); the chunked loss applies only a "
            "linear head. Set train.loss.name: full."
        )
    head.forward = _identity
    return head


def _vocab_shard(
    weight: torch.Tensor, bias: torch.Tensor | None
) -> tuple[Any, int, torch.Tensor, torch.Tensor | None]:
    """``(group, first vocabulary row, local weight, local bias)``: the group over which
    the vocabulary is sharded (``None`` when this rank holds all of it)."""
    from torch.distributed.tensor import DTensor

    if not isinstance(weight, DTensor):
        return None, 0, weight, bias
    local_bias = bias.to_local() if isinstance(bias, DTensor) else bias
    sharded = [dim for dim, p in enumerate(weight.placements) if not p.is_replicate()]
    if not sharded:
        return None, 0, weight.to_local(), local_bias
    mesh = weight.device_mesh
    if len(sharded) > 1 or not weight.placements[sharded[0]].is_shard(0):
        raise ForgeError(
            f"train.loss.name: chunked: the output head's weight is placed {tuple(weight.placements)} "
            f"on mesh {mesh.mesh_dim_names}; the chunked loss handles a head sharded along the vocabulary "
            "(Shard(0) on one mesh dimension) or a whole one. Set train.loss.name: full."
        )
    dim = sharded[0]
    ranks, rank = mesh.size(dim), mesh.get_local_rank(dim)
    vocab = weight.shape[0]
    rows = math.ceil(vocab / ranks)  # torch.chunk's split, which Shard(0) uses
    local = weight.to_local()
    offset = min(rank * rows, vocab)
    if local.shape[0] != min(rows, vocab - offset):
        raise ForgeError(
            f"the output head's vocabulary shard on rank {rank} has {local.shape[0]} rows, "
            f"expected {min(rows, vocab - offset)} of {vocab}"
        )
    return mesh.get_group(dim), offset, local, local_bias


class _ChunkedCrossEntropy(torch.autograd.Function):
    """``sum over tokens with a label of -log softmax(hidden @ weight.T + bias)[label]``
    (see the module docstring)."""

    @staticmethod
    def forward(
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        labels: torch.Tensor,
        chunk: int,
        group: Any,
        offset: int,
        compute: torch.dtype,
        with_grads: bool,
    ) -> torch.Tensor:
        loss_dtype = torch.promote_types(compute, torch.float32)
        grad_dtype = torch.promote_types(weight.dtype, torch.float32)
        w = weight.to(compute)
        b = None if bias is None else bias.to(compute)
        local_vocab = weight.shape[0]
        loss_sum = torch.zeros((), dtype=loss_dtype, device=hidden.device)
        grad_hidden = torch.empty_like(hidden) if with_grads else None
        grad_weight = (
            torch.zeros(weight.shape, dtype=grad_dtype, device=weight.device) if with_grads else None
        )
        grad_bias = (
            None
            if bias is None or not with_grads
            else torch.zeros(bias.shape, dtype=grad_dtype, device=bias.device)
        )
        with torch.autocast(hidden.device.type, enabled=False):
            for start in range(0, hidden.shape[0], chunk):
                h = hidden[start : start + chunk].to(compute)
                y = labels[start : start + chunk]
                logits = torch.nn.functional.linear(h, w, b).to(loss_dtype)
                valid = y != IGNORE_INDEX
                local_y = y - offset
                # Single process: every label is in range (an out-of-range one fails in
                # gather, as in the plain loss); sharded: the rank holding it answers.
                mine = valid if group is None else valid & (local_y >= 0) & (local_y < local_vocab)
                index = torch.where(mine, local_y, 0).unsqueeze(1)
                target = torch.where(mine, logits.gather(1, index).squeeze(1), 0.0)
                top = logits.detach().amax(dim=1)
                if group is not None:
                    dist.all_reduce(top, op=dist.ReduceOp.MAX, group=group)
                probs = (logits - top.unsqueeze(1)).exp_()
                total = probs.sum(dim=1)
                if group is not None:
                    dist.all_reduce(total, group=group)
                    dist.all_reduce(target, group=group)
                loss_sum += torch.where(valid, top + total.log() - target, 0.0).sum()
                if not with_grads:
                    continue
                # d loss / d logits = softmax - one_hot(label), zero for ignored tokens.
                probs.div_(total.unsqueeze(1))
                probs.scatter_add_(1, index, torch.where(mine, -1.0, 0.0).to(loss_dtype).unsqueeze(1))
                probs.mul_(valid.unsqueeze(1))
                grad_logits = probs.to(compute)
                grad_hidden[start : start + chunk] = grad_logits @ w
                grad_weight += grad_logits.t() @ h
                if grad_bias is not None:
                    grad_bias += grad_logits.sum(dim=0)
        if with_grads and group is not None:
            dist.all_reduce(grad_hidden, group=group)  # each shard's share of the vocabulary
        ctx.save_for_backward(grad_hidden, grad_weight, grad_bias)
        ctx.dtypes = (hidden.dtype, weight.dtype, None if bias is None else bias.dtype)
        return loss_sum

    @staticmethod
    def backward(ctx: Any, grad_loss: torch.Tensor) -> tuple[Any, ...]:
        # Only reached when forward computed the gradients (with_grads: some input
        # required one with grad mode on).
        grad_hidden, grad_weight, grad_bias = ctx.saved_tensors
        h_dtype, w_dtype, b_dtype = ctx.dtypes
        scale = grad_loss.to(grad_weight.dtype)
        return (
            (grad_hidden * scale.to(grad_hidden.dtype)).to(h_dtype),
            (grad_weight * scale).to(w_dtype),
            None if grad_bias is None else (grad_bias * scale).to(b_dtype),
            None,
            None,
            None,
            None,
            None,
            None,
        )


def _compute_dtype(hidden: torch.Tensor, weight: torch.Tensor) -> torch.dtype:
    device = hidden.device.type
    if torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return torch.promote_types(hidden.dtype, weight.dtype)


class ChunkedLoss:
    """``loss(hidden, labels) -> (loss_sum, token_count)``, the trainer's loss contract
    (:func:`forge_core.train.loss.loss_fn`) over hidden states ``(..., dim)`` instead of
    logits, ``chunk_tokens`` tokens at a time through ``head``'s weight (read at each
    call: FSDP swaps the parameter object between its sharded and gathered forms)."""

    #: The model this loss was built for returns hidden states, not logits.
    takes_hidden_states = True

    def __init__(self, head: torch.nn.Module, chunk_tokens: int) -> None:
        if chunk_tokens < 1:
            raise ValueError(f"chunk_tokens must be at least 1, got {chunk_tokens}")
        self.head, self.chunk_tokens = head, chunk_tokens

    def __call__(self, hidden: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        from torch.distributed.tensor import DTensor, Replicate

        if isinstance(hidden, DTensor):  # a plan that keeps the head's input a DTensor
            hidden = hidden.redistribute(placements=[Replicate()] * hidden.device_mesh.ndim).to_local()
        group, offset, weight, bias = _vocab_shard(self.head.weight, getattr(self.head, "bias", None))
        flat = hidden.reshape(-1, hidden.shape[-1])
        flat_labels = labels.reshape(-1)
        if flat.shape[0] != flat_labels.shape[0]:
            raise ValueError(
                f"hidden states of shape {tuple(hidden.shape)} do not match labels of shape "
                f"{tuple(labels.shape)}"
            )
        needs = [t for t in (flat, weight, bias) if t is not None]
        with_grads = torch.is_grad_enabled() and any(t.requires_grad for t in needs)
        loss_sum = _ChunkedCrossEntropy.apply(
            flat,
            weight,
            bias,
            flat_labels,
            self.chunk_tokens,
            group,
            offset,
            _compute_dtype(flat, weight),
            with_grads,
        )
        return loss_sum, (labels != IGNORE_INDEX).sum()
