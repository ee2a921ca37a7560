"""Expert slicing: a routed-experts module keeps this rank's contiguous block of experts.

Every parameter of the module stacks the experts along dim 0 (``w1``, ``w3``:
``[E, dim, hidden]``, ``w2``: ``[E, hidden, dim]``). Each becomes a DTensor sharded
along dim 0 over the ep mesh (``Shard(0)``) whose local tensor is this rank's block, so:

- the checkpoint (torch.distributed.checkpoint) stores every expert whole, under its
  unsliced name and shape, and loads into any ep degree (elastic resume re-slices);
- the gradient norm counts each expert once (a sharded DTensor);
- FSDP, applied later, shards the experts over the data-parallel ranks that do not hold
  them through ep (the dimensions of its mesh the DTensor is not already sharded along).

The model's ``compute`` multiplies tokens by the local tensors (``to_local()``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.tensor import DTensor, Shard

from forge_core.api import ForgeError


def expert_block(num_experts: int, rank: int, size: int) -> tuple[int, int]:
    """``(first, local)``: the experts rank ``rank`` of ``size`` holds."""
    if num_experts % size:
        raise ForgeError(
            f"{num_experts} routed experts do not divide by parallel.ep = {size}: every ep rank "
            "holds the same number of whole experts"
        )
    local = num_experts // size
    return rank * local, local


def slice_experts(experts: Any, mesh: Any, dispatcher: Any) -> None:
    """Keep this rank's block of ``experts`` (in place), sharded over ``mesh`` (the 1-D
    ep mesh), and install ``dispatcher``."""
    size = mesh.size()
    first, local = expert_block(experts.num_experts, mesh.get_local_rank(), size)
    for name, param in list(experts.named_parameters(recurse=False)):
        if param.shape[0] != experts.num_experts:
            raise ForgeError(
                f"parameter {name!r} of the routed experts has shape {tuple(param.shape)}: expert "
                f"parallelism needs every parameter stacked along dim 0 ({experts.num_experts} experts)"
            )
        block = param.detach()[first : first + local].clone()
        sharded = DTensor.from_local(block, mesh, [Shard(0)], run_check=False)
        setattr(experts, name, torch.nn.Parameter(sharded, requires_grad=param.requires_grad))
    experts.first_expert, experts.local_experts = first, local
    experts.dispatcher = dispatcher
