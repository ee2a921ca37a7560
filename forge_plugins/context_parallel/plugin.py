"""Registers context parallelism (``parallel.cp``) and its rules; imports nothing heavy.

The strategy declares its mesh dimension (``cp``, between ``dp_shard`` and ``tp``, its
ranks splitting each batch's tokens and sharding parameters with ``dp_shard``), a batch
transform (applied in ``apply``) and an attention wrapper: everything through
:mod:`forge_core.api`, as a third-party strategy would.
"""

from __future__ import annotations

from forge_core.api import MeshDim, ParallelismSpec, hookimpl
from forge_plugins.context_parallel.options import ContextParallelOptions


@hookimpl
def forge_parallelisms() -> list[ParallelismSpec]:
    return [
        ParallelismSpec(
            name="cp",
            summary=(
                "Context parallelism: each row's tokens split over parallel.cp ranks (load-balanced); "
                "attention gathers keys/values or exchanges heads (Ulysses)"
            ),
            impl="forge_plugins.context_parallel.strategy:ContextParallel",
            options=ContextParallelOptions,
            mesh_dim="cp",
            dim=MeshDim(
                "cp",
                place=400,
                summary="Context-parallel degree: every row's tokens are split over this many ranks.",
                splits_tokens=True,
                shards_with="dp_shard",
            ),
            attention="forge_plugins.context_parallel.strategy:wrap_attention",
            order=150,  # after the pipeline split; it changes no module
            handles_meta_device=True,
        )
    ]


@hookimpl
def forge_rules() -> list:
    from forge_plugins.context_parallel.rules import rules

    return rules()
