"""Options of the built-in parallelism strategies (``parallel.options.<name>``).

Light on purpose: ``forge-run check`` structures these without importing torch. The
degrees live in ``parallel.*`` itself (they shape the device mesh every strategy
shares); everything else a strategy reads is in its own block.
"""

from __future__ import annotations

from typing import Literal

import attrs

from forge_core.api import above, at_least


@attrs.frozen
class PipelineOptions:
    schedule: Literal["gpipe", "1f1b", "interleaved_1f1b"] = attrs.field(
        default="1f1b",
        metadata={"doc": "Pipeline schedule: gpipe (every forward, then every backward), 1f1b (one "
                         "forward, one backward in steady state), interleaved_1f1b (several stages per rank)."},
    )
    microbatches: int = attrs.field(
        default=0, validator=at_least(0),
        metadata={"doc": "Microbatches per pipeline step (0: one per stage, parallel.pp)."},
    )
    virtual_stages: int = attrs.field(
        default=1, validator=at_least(1),
        metadata={"doc": "Stages per pipeline rank (above 1 only with interleaved_1f1b)."},
    )


@attrs.frozen
class TensorParallelOptions:
    sequence_parallel: bool = attrs.field(
        default=False,
        metadata={"doc": "Shard norms and residuals along the sequence (SequenceParallel): less "
                         "activation memory, a reduce-scatter and an all-gather in place of each all-reduce."},
    )


@attrs.frozen
class ActivationCheckpointOptions:
    every: int = attrs.field(
        default=1, validator=at_least(1),
        metadata={"doc": "Checkpoint every k-th block: 1 recomputes every block in the backward pass "
                         "(full activation checkpointing, least memory); k > 1 the k-th, 2k-th, ... "
                         "block of each model part (a pipeline stage counts its own blocks), keeping "
                         "the others' activations (less recomputation)."},
    )


@attrs.frozen
class DDPOptions:
    bucket_cap_mb: float = attrs.field(
        default=25.0,
        validator=above(0),
        metadata={
            "doc": "Gradient bucket size in MiB: DDP all-reduces a bucket as soon as "
            "backward has filled it, overlapping communication with the rest of backward."
        },
    )


@attrs.frozen
class FSDPOptions:
    reshard_after_forward: bool = attrs.field(
        default=True,
        metadata={
            "doc": "Free each block's gathered parameters after its forward and gather them "
            "again in backward (least memory). false keeps them until backward: one "
            "all-gather fewer per block, more memory (ZeRO-2-like); worth it under pp, "
            "where every microbatch would otherwise gather again."
        },
    )
