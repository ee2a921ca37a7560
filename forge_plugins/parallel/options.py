"""Options of the built-in parallelism strategies (``parallel.options.<name>``).

Light on purpose: ``forge-run check`` structures these without importing torch. The
degrees live in ``parallel.*`` itself (they shape the device mesh every strategy
shares); everything else a strategy reads is in its own block.
"""

from __future__ import annotations

from typing import Literal

import attrs

from forge_core.api import above, at_least, option


@attrs.frozen
class PipelineOptions:
    schedule: Literal[
        "gpipe",
        "1f1b",
        "interleaved_1f1b",
        "looped_bfs",
        "interleaved_zero_bubble",
        "zbv_zero_bubble",
        "dualpipev",
    ] = option(
        "1f1b",
        "Pipeline schedule: gpipe (every forward, then every backward), 1f1b (one "
        "forward, one backward in steady state), interleaved_1f1b and looped_bfs (several "
        "stages per rank, depth first and breadth first), interleaved_zero_bubble (several "
        "stages per rank, backward split into input and weight passes that fill the "
        "bubble), zbv_zero_bubble and dualpipev (two stages per rank in a V: the first "
        "and the last stage on rank 0, split backward).",
    )
    microbatches: int = option(
        0,
        "Microbatches per pipeline step (0: one per stage, parallel.pp x virtual_stages).",
        at_least(0),
    )
    virtual_stages: int = option(
        1,
        "Stages per pipeline rank: 1 for gpipe and 1f1b, at least 2 for interleaved_1f1b, "
        "looped_bfs and interleaved_zero_bubble, exactly 2 for zbv_zero_bubble and dualpipev.",
        at_least(1),
    )


@attrs.frozen
class TensorParallelOptions:
    sequence_parallel: bool = option(
        False,
        "Shard norms and residuals along the sequence (SequenceParallel): less "
        "activation memory, a reduce-scatter and an all-gather in place of each all-reduce.",
    )


@attrs.frozen
class ActivationCheckpointOptions:
    every: int = option(
        1,
        "Checkpoint every k-th block: 1 recomputes every block in the backward pass "
        "(full activation checkpointing, least memory); k > 1 the k-th, 2k-th, ... "
        "block of each model part (a pipeline stage counts its own blocks), keeping "
        "the others' activations (less recomputation).",
        at_least(1),
    )


@attrs.frozen
class DDPOptions:
    bucket_cap_mb: float = option(
        25.0,
        "Gradient bucket size in MiB: DDP all-reduces a bucket as soon as "
        "backward has filled it, overlapping communication with the rest of backward.",
        above(0),
    )


@attrs.frozen
class FSDPOptions:
    reshard_after_forward: bool = option(
        True,
        "Free each block's gathered parameters after its forward and gather them "
        "again in backward (least memory). false keeps them until backward: one "
        "all-gather fewer per block, more memory (ZeRO-2-like); worth it under pp, "
        "where every microbatch would otherwise gather again.",
    )
