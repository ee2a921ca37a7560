"""``ep``: expert parallelism. Every routed-experts module (found through the model's
parallel contract, ``ParallelContract.experts``) keeps its rank's block of experts
(:mod:`~forge_plugins.expert_parallel.slicing`) and dispatches tokens by all-to-all
(:mod:`~forge_plugins.expert_parallel.dispatch`); nothing else of the model changes.

The ep ranks read their own batches (data parallelism for the dense parts): FSDP,
switched on by ``dp_shard x ep``, shards and sums the dense parameters over them, and the
experts over the data-parallel ranks that do not hold them through ep."""

from __future__ import annotations

from typing import Any

from forge_core.api import ForgeError, blocks_of, contract_of
from forge_plugins.expert_parallel.dispatch import AllToAllDispatch
from forge_plugins.expert_parallel.slicing import slice_experts


def routed_experts(model: Any) -> list[Any]:
    """The routed-experts modules of a model part's blocks (``[]`` for dense blocks)."""
    contract = contract_of(model)
    path = getattr(contract, "experts", None)
    if path is None:
        name = type(model).__name__
        raise ForgeError(
            f"parallel.ep is above 1 but model part {name} declares no routed experts "
            "(ParallelContract.experts): expert parallelism needs a mixture-of-experts model"
        )
    found = []
    for block in blocks_of(model):
        try:
            found.append(block.get_submodule(path))
        except AttributeError:
            continue  # a dense block
    return found


class ExpertParallel:
    def __init__(self, options: Any) -> None:
        self.options = options

    def apply(self, model: Any, ctx: Any) -> Any:
        if ctx.mesh is None or ctx.mesh["ep"].size() == 1:
            return model  # every expert is local: the model's own dispatcher stays
        mesh = ctx.mesh["ep"]
        dispatcher = AllToAllDispatch(mesh.get_group(), mesh.size())
        for experts in routed_experts(model):
            slice_experts(experts, mesh, dispatcher)
        return model
