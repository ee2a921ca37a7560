"""``tp``: tensor parallelism with DTensor ``parallelize_module`` over the ``tp`` mesh.

The plan (Megatron-style), by module name of the model contract
(:mod:`forge_plugins.models.llama`):

- ``attention.wq/wk/wv`` and ``feed_forward.w1/w3`` column-wise: each rank computes
  ``n_heads / tp`` heads and ``1 / tp`` of the MLP's hidden units, with no
  communication; ``attention.wo`` and ``feed_forward.w2`` row-wise: one all-reduce
  (or reduce-scatter) per sub-layer brings the partial sums together.
- ``tok_embeddings`` row-wise (the vocabulary is split; the input ids are replicated).
- ``output`` column-wise with a replicated output: every rank gets the full logits and
  computes the same loss (loss parallelism is off).
- With ``parallel.sequence_parallel`` the norms run on ``1 / tp`` of the sequence
  (``SequenceParallel``): the residual stream is a sequence-sharded DTensor between
  sub-layers, gathered before attention and the MLP, reduce-scattered after. It keeps
  the DTensor (global shape) so the model reads the true sequence length.

The model builds identical weights on every rank (same seed); distributing a module
keeps each rank's slice of its local copy.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from forge_core.train.parallelize import transformer_blocks


def root_plan(model: torch.nn.Module, sequence_parallel: bool) -> dict[str, Any]:
    """The plan for the pieces outside the blocks that this part holds."""
    plan: dict[str, Any] = {}
    if getattr(model, "tok_embeddings", None) is not None:
        plan["tok_embeddings"] = RowwiseParallel(
            input_layouts=Replicate(),
            output_layouts=Shard(1) if sequence_parallel else Replicate(),
            use_local_output=not sequence_parallel,
        )
    if getattr(model, "norm", None) is not None and sequence_parallel:
        plan["norm"] = SequenceParallel(use_local_output=False)
    if getattr(model, "output", None) is not None:
        plan["output"] = ColwiseParallel(
            input_layouts=Shard(1) if sequence_parallel else Replicate(),
            output_layouts=Replicate(),
            use_local_output=True,
        )
    return plan


def block_plan(sequence_parallel: bool) -> dict[str, Any]:
    """The plan for one transformer block."""
    residual = Shard(1) if sequence_parallel else Replicate()
    plan: dict[str, Any] = {
        "attention.wq": ColwiseParallel(),
        "attention.wk": ColwiseParallel(),
        "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(output_layouts=residual, use_local_output=not sequence_parallel),
        "feed_forward.w1": ColwiseParallel(),
        "feed_forward.w3": ColwiseParallel(),
        "feed_forward.w2": RowwiseParallel(output_layouts=residual, use_local_output=not sequence_parallel),
    }
    if sequence_parallel:
        plan.update({
            "attention_norm": SequenceParallel(use_local_output=False),
            "ffn_norm": SequenceParallel(use_local_output=False),
            # attention(x, cos, sin, prepared): gather x; the rest are not DTensors.
            "attention": PrepareModuleInput(
                input_layouts=(Shard(1), None, None, None),
                desired_input_layouts=(Replicate(), None, None, None),
                use_local_output=True,
            ),
            "feed_forward": PrepareModuleInput(
                input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),), use_local_output=True
            ),
        })
    return plan


class TensorParallel:
    def __init__(self, options: Any) -> None:
        self.options = options

    def apply(self, model: torch.nn.Module, ctx: Any) -> torch.nn.Module:
        mesh = ctx.mesh["tp"]
        sequence_parallel = bool(ctx.config.parallel.sequence_parallel)
        plan = root_plan(model, sequence_parallel)
        if plan:
            parallelize_module(model, mesh, plan)
        for block in transformer_blocks(model):
            parallelize_module(block, mesh, block_plan(sequence_parallel))
        return model
