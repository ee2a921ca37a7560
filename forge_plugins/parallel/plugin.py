"""Registers the built-in parallelism strategies and their rules.

Imports nothing heavy: it runs for ``forge-run check``. Each spec says which
``parallel.*`` degree switches the strategy on, where it sits in the application order
(pipeline split 100, tensor parallel 200, activation checkpointing 250, compile 300,
data-parallel wrapping 400) and what per-token metadata still reaches every layer under
it (all of it, under each: the pipeline hands every stage its microbatch's ``doc_ids``
and ``positions``).
"""

from __future__ import annotations

from forge_core.api import (
    BLOCKS,
    DOC_IDS,
    PIPELINE,
    POSITIONS,
    TENSOR_PARALLEL,
    MeshDim,
    ParallelismSpec,
    hookimpl,
)
from forge_plugins.parallel.options import (
    ActivationCheckpointOptions,
    DDPOptions,
    FSDPOptions,
    PipelineOptions,
    TensorParallelOptions,
)


@hookimpl
def forge_parallelisms() -> list[ParallelismSpec]:
    return [
        ParallelismSpec(
            name="pp",
            summary=(
                "Pipeline parallelism over parallel.pp ranks: GPipe, 1F1B, interleaved, looped BFS, "
                "zero-bubble and V schedules"
            ),
            impl="forge_plugins.parallel.pipeline:PipelineParallel",
            handles_meta_device=True,
            options=PipelineOptions,
            mesh_dim="pp",
            dim=MeshDim("pp", place=100, summary="Pipeline-parallel stages.", splits_layers=True),
            order=100,
            # Every stage gets its microbatch's doc_ids and positions (pipeline.py).
            forwards=frozenset({DOC_IDS, POSITIONS}),
            requires={PIPELINE},
        ),
        ParallelismSpec(
            name="tp",
            summary=(
                "Tensor parallelism (DTensor): applies the model's plan (column/row-wise layers, sharded "
                "embeddings and head)"
            ),
            impl="forge_plugins.parallel.tensor:TensorParallel",
            handles_meta_device=True,
            options=TensorParallelOptions,
            mesh_dim="tp",
            dim=MeshDim("tp", place=500, summary="Tensor-parallel degree."),
            order=200,
            requires={TENSOR_PARALLEL},
        ),
        ParallelismSpec(
            name="act_ckpt",
            summary="Activation checkpointing: recompute every (or every k-th) block in the backward pass",
            impl="forge_plugins.parallel.checkpointing:ActivationCheckpoint",
            options=ActivationCheckpointOptions,
            mesh_dim=None,  # a wrapper: listed in parallel.wrappers
            order=250,  # the sharded blocks (after tp), before compile and data-parallel wrapping
            requires={BLOCKS},
        ),
        ParallelismSpec(
            name="compile",
            summary="torch.compile the model's blocks in place, one by one (train.compile: true)",
            impl="forge_plugins.parallel.compile:Compile",
            handles_meta_device=True,  # compiling is lazy: nothing is traced before the first call
            mesh_dim=None,  # a wrapper: train.compile, or named in parallel.wrappers
            enabled_by="train.compile",
            order=300,  # after tp and act_ckpt (their sharded, recomputed blocks), before fsdp/ddp
        ),
        ParallelismSpec(
            name="fsdp",
            summary="FSDP2 fully_shard per block and at the root; HSDP when dp_replicate > 1",
            impl="forge_plugins.parallel.fsdp:FullyShard",
            handles_meta_device=True,
            options=FSDPOptions,
            mesh_dim="dp_shard",
            dim=MeshDim(
                "dp_shard",
                place=300,
                summary=(
                    "Data-parallel shards (FSDP2). -1 takes what the other degrees leave of the world "
                    "size: 1 in one process, N under `--nproc N` with every other degree 1."
                ),
                default=-1,
                fills_world=True,
                reads_own_batch=True,
            ),
            order=400,
        ),
        ParallelismSpec(
            name="ddp",
            summary="DistributedDataParallel over parallel.dp_replicate replicas",
            impl="forge_plugins.parallel.ddp:DataParallel",
            options=DDPOptions,
            mesh_dim="dp_replicate",
            dim=MeshDim(
                "dp_replicate",
                place=200,
                summary="Data-parallel replicas (DDP; HSDP with dp_shard > 1).",
                reads_own_batch=True,
            ),
            order=400,
            yields_to=("fsdp",),
        ),
    ]


@hookimpl
def forge_rules() -> list:
    from forge_plugins.parallel import composition_rules
    from forge_plugins.parallel.rules import rules

    return rules() + composition_rules.rules()
