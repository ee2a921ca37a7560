"""Registers expert parallelism (``parallel.ep``) and its rules; imports nothing heavy.

The strategy declares its mesh dimension: ``ep``, between ``dp_shard`` and ``cp``, its
ranks reading their own batches (data-parallel for the dense parts) and sharding
parameters with ``dp_shard`` (FSDP shards the dense parameters over ``dp_shard x ep``);
the experts are split over it. Everything goes through :mod:`forge_core.api`, as a
third-party strategy would.
"""

from __future__ import annotations

from forge_core.api import BLOCKS, MeshDim, ParallelismSpec, hookimpl


@hookimpl
def forge_parallelisms() -> list[ParallelismSpec]:
    return [
        ParallelismSpec(
            name="ep",
            summary=(
                "Expert parallelism: each MoE layer's routed experts split over parallel.ep ranks, "
                "tokens dispatched and combined by all-to-all; the dense parts data-parallel"
            ),
            impl="forge_plugins.expert_parallel.strategy:ExpertParallel",
            mesh_dim="ep",
            dim=MeshDim(
                "ep",
                place=350,
                summary=(
                    "Expert-parallel degree: every MoE layer's routed experts are split over this many "
                    "ranks, which read their own batches (data-parallel for the dense parameters)."
                ),
                reads_own_batch=True,
                shards_with="dp_shard",
            ),
            # After the pipeline split (each stage slices its own blocks' experts) and before
            # tensor parallelism, checkpointing, compile and FSDP, which see sliced experts.
            order=160,
            requires={BLOCKS},
        )
    ]


@hookimpl
def forge_rules() -> list:
    from forge_plugins.expert_parallel.rules import rules

    return rules()
