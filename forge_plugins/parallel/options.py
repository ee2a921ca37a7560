"""Options of the built-in parallelism strategies (``parallel.options.<name>``).

Light on purpose: ``forge-run check`` structures these without importing torch. The
degrees, the pipeline schedule and sequence parallelism live in ``parallel.*`` itself
because several strategies and rules read them.
"""

from __future__ import annotations

import attrs

from forge_core.api import above


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
