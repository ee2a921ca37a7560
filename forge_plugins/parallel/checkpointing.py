"""``act_ckpt``: activation checkpointing of the model's blocks.

Each chosen block keeps only its inputs from the forward pass; the backward pass runs
its forward again to get the activations it needs (``torch.utils.checkpoint``,
non-reentrant). Memory falls from every intermediate tensor of every block to one
block's worth plus the blocks' inputs, for about one more forward per step.

Which blocks: the ones the model's parallel contract names (``blocks_of``), every one
(``every: 1``) or every k-th of each model part. The block's ``forward`` is replaced on
the instance by a checkpointed call of the original, so the module tree and every
parameter name stay as they were: checkpoints load with or without it.

Its place in the order is 250: after tensor parallelism (200), so that the recomputed
forward is the sharded one, with its collectives; before ``train.compile`` (300), so
that compile traces the checkpointed forward and sees the recomputation in one graph;
before FSDP (400), whose per-block hooks then wrap the checkpointed block and gather its
parameters again for the recomputation, as they do for the backward. torchtitan applies
its parallelisms in the same order (tensor parallel, activation checkpointing,
compile, data parallel).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from torch.utils.checkpoint import checkpoint

from forge_core.api import ForgeError, blocks_of

#: Marks a block whose forward is already checkpointed (applied once per block).
_MARK = "_forge_checkpointed"


def chosen(blocks: list[Any], every: int) -> list[Any]:
    """The blocks checkpointed with ``every``: all for 1, else the k-th, 2k-th, ..."""
    return [block for i, block in enumerate(blocks) if (i + 1) % every == 0]


def checkpointed(forward: Callable[..., Any]) -> Callable[..., Any]:
    """``forward`` run under non-reentrant activation checkpointing."""

    @functools.wraps(forward)
    def run(*args: Any, **kwargs: Any) -> Any:
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)

    return run


class ActivationCheckpoint:
    def __init__(self, options: Any) -> None:
        self.options = options

    def apply(self, model: Any, ctx: Any) -> Any:
        blocks = blocks_of(model)
        if not blocks:
            raise ForgeError(
                f"activation checkpointing found no blocks in model {ctx.model_name!r} "
                f"({type(model).__name__}): its parallel_contract() names none. Remove 'act_ckpt' from "
                "parallel.wrappers, or (model authors) name the repeated blocks in the contract."
            )
        for block in chosen(blocks, self.options.every):
            if not getattr(block, _MARK, False):
                block.forward = checkpointed(block.forward)
                setattr(block, _MARK, True)
        return model
