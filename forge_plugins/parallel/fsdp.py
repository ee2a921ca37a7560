"""``fsdp``: FSDP2 ``fully_shard`` per block (the blocks the model's parallel contract
names; none for a model without one) and at the root.

Parameters, gradients and optimizer state are sharded over ``dp_shard`` (widened by
every dimension that declares it shards with it: ``dp_shard x cp`` under context
parallelism, whose ranks hold different tokens and so must sum their gradients, and
``x ep`` under expert parallelism, whose ranks read their own batches). A block's
submodules whose parameters are already DTensors sharded along such a dimension (the
experts ``ep`` split) are sharded over the mesh without it, first: the ranks that hold
the same experts (:func:`presharded`); with
``dp_replicate > 1`` as well the mesh is 2-D and FSDP2 runs HSDP (shard within a
replica, all-reduce across replicas). Applied after tensor parallelism, it shards the
tensor-parallel DTensors again along the data-parallel dimension (2-D parallelism).
Gradients are summed over the data-parallel ranks, with divide factor 1 instead of FSDP's
default mean (the gradient convention, docs/plugin-guide/parallelism.md#the-gradient-convention).
Under ``train.precision: bf16`` parameters are gathered in bf16 and gradients reduced in fp32.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any

import attrs
import torch
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

from forge_core.api import blocks_of


def mixed_precision(precision: str) -> MixedPrecisionPolicy:
    if precision == "bf16":
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()


def presharded(block: torch.nn.Module, widening: set[str]) -> list[tuple[torch.nn.Module, tuple[str, ...]]]:
    """The submodules of ``block`` whose own parameters are DTensors sharded along some
    of the mesh dimensions in ``widening`` (those that shard with ``dp_shard``), with
    those dimensions: the routed experts that ``ep`` split. FSDP must shard them over
    the data-parallel ranks that do not already hold different ones."""
    found = []
    for module in block.modules():
        held: set[str] = set()
        for param in module.parameters(recurse=False):
            mesh = getattr(param, "device_mesh", None)
            if mesh is not None:
                held.update(
                    name for name, p in zip(mesh.mesh_dim_names or (), param.placements) if p.is_shard()
                )
        if held & widening:
            found.append((module, tuple(sorted(held & widening))))
    return found


def shard_model(
    model: torch.nn.Module,
    mesh: Any,
    precision: str,
    reshard_after_forward: bool,
    mesh_without: Any = None,
) -> torch.nn.Module:
    """``fully_shard`` every block (``reshard_after_forward`` as given), then the root
    (which takes what is left: embeddings, final norm, head), in place; gradients
    summed over ``mesh``. ``mesh_without(dims)``, when given, is the data-parallel mesh
    without the dimensions ``dims``: a block's submodules already sharded along some of
    them (:func:`presharded`: experts under ``ep``) are sharded over that mesh first."""
    policy = mixed_precision(precision)
    widening = set() if mesh_without is None else set(mesh_without.dims)
    for block in blocks_of(model):
        for module, dims in presharded(block, widening):
            fully_shard(
                module, mesh=mesh_without(dims), mp_policy=policy, reshard_after_forward=reshard_after_forward
            )
        fully_shard(block, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard_after_forward)
    # The root is never resharded after forward (what FSDP2 does for a root left at its
    # default): backward would gather it again at once, and a loss that applies the
    # output head's weight after the forward (the chunked loss) needs it gathered.
    fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=False)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            # Plain SUM collectives: the trainer normalises the loss. (A divide factor
            # alone would use PREMUL_SUM, which gloo lacks; with factor 1 there is
            # nothing to multiply.)
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)
    return model


class FullyShard:
    def __init__(self, options: Any) -> None:
        self.options = options

    def apply(self, model: torch.nn.Module, ctx: Any) -> torch.nn.Module:
        # mesh_along widens dp_shard by the dimensions that shard with it (cp).
        replicated = ctx.mesh["dp_replicate"].size() > 1
        names = ("dp_replicate", "dp_shard") if replicated else ("dp_shard",)
        mesh = ctx.mesh_along(*names)
        without = _MeshWithout(ctx, names)
        sharded = shard_model(model, mesh, ctx.precision, self.options.reshard_after_forward, without)
        ctx.add_gradient_sync(functools.partial(_requires_gradient_sync, sharded))
        return sharded


@attrs.define
class _MeshWithout:
    """The data-parallel mesh over ``names`` without some of the dimensions that widen
    it (``dims``: those that declare they shard with ``dp_shard``)."""

    ctx: Any
    names: tuple[str, ...]

    @property
    def dims(self) -> tuple[str, ...]:
        return tuple(d.name for d in self.ctx.dims if d.shards_with in self.names)

    def __call__(self, without: tuple[str, ...]) -> Any:
        return self.ctx.mesh_along(*self.names, without=without)


def _requires_gradient_sync(module: FSDPModule, enabled: bool) -> contextlib.AbstractContextManager:
    """FSDP2 reduces the gradients in the backward only when ``enabled`` (a flag, not a
    context: set before every micro-batch, so the step's last one always reduces)."""
    module.set_requires_gradient_sync(enabled)
    return contextlib.nullcontext()
