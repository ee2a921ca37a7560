"""The device mesh: every process's coordinates along ``pp``, ``dp_replicate``,
``dp_shard`` and ``tp``, built from the resolved ``parallel.*`` degrees.

Dimensions of size 1 are kept, so a strategy can always slice ``mesh["tp"]`` and the
layout is the same whatever is switched on. :func:`dp_coords` flattens the two
data-parallel dimensions: the processes that read different batches. The process group
must already exist (:func:`forge_core.distributed.placement.setup`: gloo on CPU, nccl on
CUDA); a single process gets no mesh at all.
"""

from __future__ import annotations

import math
from typing import Any

import attrs
import torch
import torch.distributed as dist

from forge_core.api import ForgeError
from forge_core.parallel_dims import MESH_DIMS

DP_DIMS = ("dp_replicate", "dp_shard")


def world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def build_mesh(degrees: dict[str, int], device: torch.device) -> Any:
    """A ``DeviceMesh`` of shape ``(pp, dp_replicate, dp_shard, tp)``, or ``None`` when
    this is a single process with every degree 1. Called by every process, in the same
    order: creating the sub-groups is collective."""
    shape = tuple(degrees[dim] for dim in MESH_DIMS)
    world = world_size()
    if any(size < 1 for size in shape):
        raise ForgeError(
            f"parallel degrees must be resolved to positive sizes, got {dict(zip(MESH_DIMS, shape))}"
        )
    if math.prod(shape) != world:
        shown = " * ".join(f"{dim}={size}" for dim, size in zip(MESH_DIMS, shape))
        raise ForgeError(
            f"{shown} = {math.prod(shape)} processes, but {world} are running. "
            "Launch as many processes as the product (forge-run --nproc N), or change parallel.*"
        )
    if world == 1:
        return None
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(torch.device(device).type, shape, mesh_dim_names=MESH_DIMS)


@attrs.frozen
class DataParallelCoords:
    """Which batch this process reads: ``rank`` of ``size`` data-parallel slices, and the
    group to sum over them (``None`` when there is one slice)."""

    rank: int = 0
    size: int = 1
    group: Any = None


def dp_coords(mesh: Any) -> DataParallelCoords:
    """Data-parallel coordinates from the mesh: every pipeline stage and tensor-parallel
    rank of a replica shares them, so they read the same batch. Collective the first
    time for a mesh (it creates the flattened group): every rank calls it."""
    if mesh is None:
        return DataParallelCoords()
    dp = mesh[DP_DIMS]._flatten("dp")
    if dp.size() == 1:
        return DataParallelCoords(0, 1, None)
    return DataParallelCoords(dp.get_local_rank(), dp.size(), dp.get_group())


def group_of(mesh: Any, dim: str) -> Any:
    """The process group along ``dim``, or ``None`` when the mesh is absent or the
    dimension has size 1."""
    if mesh is None or mesh[dim].size() == 1:
        return None
    return mesh[dim].get_group()
