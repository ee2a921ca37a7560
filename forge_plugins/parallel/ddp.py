"""``ddp``: replicated data parallelism over the ``dp_replicate`` mesh dimension.

Every replica holds the whole model; gradients are all-reduced while backward runs and
summed, DDP's division by the number of replicas replaced by a communication hook (the
gradient convention, docs/plugin-guide/parallelism.md#the-gradient-convention).

- Without pipeline parallelism: ``DistributedDataParallel`` (bucketed all-reduce
  overlapping backward). The wrapper is what gets called; the wrapped module stays the
  part that is checkpointed (its keys carry no ``module.`` prefix).
- Under pipeline parallelism: DDP's reducer cannot follow a pipeline schedule (the
  schedule runs an extra forward and backward to infer shapes on its first step, which
  DDP's bucket rebuilding counts as a second use of every parameter). There, replicas
  are made with FSDP2 on the 2-D ``(dp_replicate, dp_shard=1)`` mesh: shards of size 1,
  i.e. whole parameters on every replica and an all-reduce of gradients, which the
  pipeline schedule drives natively.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def sum_allreduce_hook(group, bucket):  # noqa: ANN001 - see below
    """All-reduce a gradient bucket with SUM, without DDP's division by the group size.

    Unannotated on purpose: DDP checks the annotations against real types, and this
    module's ``from __future__ import annotations`` would turn them into strings."""
    work = dist.all_reduce(bucket.buffer(), group=group, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])


class DataParallel:
    def __init__(self, options: Any) -> None:
        self.options = options

    def apply(self, model: torch.nn.Module, ctx: Any) -> torch.nn.Module:
        if ctx.mesh["pp"].size() > 1:
            from forge_plugins.parallel.fsdp import shard_model

            return shard_model(
                model,
                ctx.mesh_along("dp_replicate", "dp_shard"),
                ctx.precision,
                reshard_after_forward=False,
            )
        device_ids = [ctx.device.index] if ctx.device.type == "cuda" else None
        group = ctx.mesh["dp_replicate"].get_group()
        # broadcast_buffers=False: buffers (the rotary table) are built identically on
        # every rank and never change; DDP would otherwise broadcast them every forward.
        wrapped = DistributedDataParallel(
            model,
            process_group=group,
            device_ids=device_ids,
            bucket_cap_mb=self.options.bucket_cap_mb,
            broadcast_buffers=False,
        )
        wrapped.register_comm_hook(group, sum_allreduce_hook)
        ctx.add_gradient_sync(lambda enabled: contextlib.nullcontext() if enabled else wrapped.no_sync())
        return wrapped
