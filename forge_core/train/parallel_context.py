"""What a parallelism strategy is given when it is applied to the model."""

from __future__ import annotations

from typing import Any

import attrs


@attrs.frozen
class ParallelContext:
    """Passed to ``strategy.apply(model, ctx)``.

    - ``config``: the resolved ForgeConfig.
    - ``mesh``: a ``torch.distributed.device_mesh.DeviceMesh`` with dimensions named
      ``pp``, ``dp_replicate``, ``dp_shard``, ``tp`` (size-1 dimensions included), or
      ``None`` in a single process.
    - ``device``: the ``torch.device`` this process trains on.
    - ``options``: the strategy's structured options (``parallel.options.<name>``).
    - ``loss_fn``: ``loss_fn(logits, labels) -> (loss_sum, token_count)``; a strategy that
      takes over forward and backward (pipeline parallelism) computes the loss with it.
    """

    config: Any
    mesh: Any
    device: Any
    options: Any
    loss_fn: Any = None
