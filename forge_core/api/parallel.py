"""What a parallelism strategy is given and may return.

Torch-free: the types below only name torch objects in annotations, so rules and specs
can import them for ``forge-run check``.
"""

from __future__ import annotations

from collections.abc import Callable
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


@attrs.define
class ModelSplit:
    """What a strategy's ``apply`` returns when it splits the model (pipeline
    parallelism) instead of returning a module.

    Later strategies are applied to each of ``parts`` separately; once every strategy
    has been applied, ``finalize(pmodel, runners)`` is called with the
    :class:`~forge_core.train.parallelize.ParallelModel` and, for each part, the module
    the later strategies returned for it (a wrapper, or the part itself), and sets
    ``train_step`` and ``is_last_stage`` (and anything else it drives).
    """

    parts: list[Any]
    finalize: Callable[[Any, list[Any]], None]
