"""``compile``: ``torch.compile`` of the model's blocks, in place, block by block.

A wrapper (``mesh_dim=None``) at order 300: after the pipeline split (100), tensor
parallelism (200) and activation checkpointing (250), so it compiles the blocks each
stage holds with their sharded forward and recomputation; before data-parallel wrapping
(400), as FSDP and DDP expect compiled blocks. Switched on by ``train.compile: true``
(its spec's ``enabled_by``) or by naming it in ``parallel.wrappers``; the two are the
same switch.

Each block is compiled with ``Module.compile()`` (the same small graph is reused for
every block, and state-dict keys keep their names, unlike an ``OptimizedModule``); a
model whose contract names no blocks is compiled whole. Compiling is lazy (it traces at
the first call), so a model still on the meta device may be compiled before it is
materialised.
"""

from __future__ import annotations

from typing import Any

from forge_core.api import blocks_of


def compile_part(module: Any) -> None:
    """``torch.compile`` ``module`` in place, block by block; the whole module for a model
    whose contract names no blocks."""
    for block in blocks_of(module) or [module]:
        block.compile()


class Compile:
    def __init__(self, options: Any) -> None:
        self.options = options

    def apply(self, model: Any, ctx: Any) -> Any:
        compile_part(model)
        return model
