"""The device mesh: every process's coordinates along each declared mesh dimension
(``pp``, ``dp_replicate``, ``dp_shard``, ``cp``, ``tp`` for the built-ins), built from
the resolved ``parallel.*`` degrees in the dimensions' declared order.

Dimensions of size 1 are kept, so a strategy can always slice ``mesh["tp"]`` and the
layout is the same whatever is switched on. :func:`dp_coords` flattens the dimensions
whose ranks read their own batches (``MeshDim.reads_own_batch``): the processes that
read different batches. The process group must already exist
(:func:`forge_core.distributed.placement.setup`: gloo on CPU, nccl on CUDA); a single
process gets no mesh at all.
"""

from __future__ import annotations

import math
from typing import Any

import attrs
import torch
import torch.distributed as dist

from forge_core.api import ForgeError


def world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def build_mesh(degrees: dict[str, int], device: torch.device) -> Any:
    """A ``DeviceMesh`` with one dimension per entry of ``degrees`` (mesh order, as the
    plan holds them), or ``None`` when this is a single process with every degree 1.
    Called by every process, in the same order: creating the sub-groups is collective."""
    names, shape = tuple(degrees), tuple(degrees.values())
    world = world_size()
    if any(size < 1 for size in shape):
        raise ForgeError(f"parallel degrees must be resolved to positive sizes, got {degrees}")
    if math.prod(shape) != world:
        shown = " * ".join(f"{dim}={size}" for dim, size in degrees.items())
        raise ForgeError(
            f"{shown} = {math.prod(shape)} processes, but {world} are running. "
            "Launch as many processes as the product (forge-run --nproc N), or change parallel.*"
        )
    if world == 1:
        return None
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(torch.device(device).type, shape, mesh_dim_names=names)


@attrs.frozen
class DataParallelCoords:
    """Which batch this process reads: ``rank`` of ``size`` data-parallel slices, and the
    group to sum over them (``None`` when there is one slice)."""

    rank: int = 0
    size: int = 1
    group: Any = None


def flat(mesh: Any, names: tuple[str, ...], flat_name: str) -> Any:
    """The sub-mesh over ``names`` flattened into one dimension (the dimension itself
    for one name). Collective the first time for a mesh: every rank calls it."""
    if len(names) == 1:
        return mesh[names[0]]
    return mesh[names]._flatten(flat_name)


def dp_coords(mesh: Any, dims: tuple[Any, ...] = ()) -> DataParallelCoords:
    """Data-parallel coordinates from the mesh: every rank of the other dimensions
    (pipeline stages, tensor- and context-parallel ranks) of a replica shares them, so
    they read the same batch."""
    names = tuple(d.name for d in dims if d.reads_own_batch)
    if mesh is None or not names:
        return DataParallelCoords()
    dp = flat(mesh, names, "dp")
    if dp.size() == 1:
        return DataParallelCoords(0, 1, None)
    return DataParallelCoords(dp.get_local_rank(), dp.size(), dp.get_group())


def token_group(mesh: Any, dims: tuple[Any, ...] = ()) -> Any:
    """The process group of the processes that compute different tokens: the
    data-parallel ranks and those that split a batch's tokens (context parallelism);
    ``None`` when that is this process alone. Collective the first time: every rank calls it."""
    names = tuple(d.name for d in dims if d.reads_own_batch or d.splits_tokens)
    if mesh is None or not names:
        return None
    tokens = flat(mesh, names, "_".join(names))
    return None if tokens.size() == 1 else tokens.get_group()


def group_of(mesh: Any, dim: str) -> Any:
    """The process group along ``dim``, or ``None`` when the mesh is absent, has no such
    dimension, or the dimension has size 1."""
    if mesh is None or dim not in (mesh.mesh_dim_names or ()) or mesh[dim].size() == 1:
        return None
    return mesh[dim].get_group()


def rank_along(mesh: Any, dim: str) -> tuple[int, int]:
    """``(rank, size)`` of this process along ``dim``; ``(0, 1)`` without it."""
    if mesh is None or dim not in (mesh.mesh_dim_names or ()):
        return 0, 1
    return mesh[dim].get_local_rank(), mesh[dim].size()
