"""Apply the active parallelism strategies to a model and describe the result.

The trainer sees only :class:`ParallelModel`: the model parts this process holds (one,
or several pipeline stages), the data-parallel coordinates that decide which batch it
reads, an optional ``train_step`` for strategies that take over forward and backward
(pipeline parallelism), and a gradient-clipping function that computes the true global
norm across every shard and stage.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import torch


@attrs.define
class ParallelModel:
    """The model as this process holds it after every strategy is applied.

    - ``parts``: modules whose parameters this process trains and checkpoints (their
      state-dict keys equal the unsplit model's keys).
    - ``forward``: the module to call for logits when ``train_step`` is ``None``.
    - ``train_step``: ``train_step(batch, loss_fn) -> (loss_sum, tokens)`` doing forward
      and backward itself (set by pipeline parallelism), or ``None``.
    - ``dp_rank``/``dp_size``: this process's data-parallel coordinates; every process
      with the same ``dp_rank`` reads the same batch.
    - ``mesh``: the DeviceMesh, or ``None`` in one process.
    - ``is_last_stage``: whether this process computes the loss (pipeline: last stage).
    """

    parts: list[torch.nn.Module]
    forward: torch.nn.Module | None
    train_step: Callable[..., tuple[torch.Tensor, torch.Tensor]] | None = None
    dp_rank: int = 0
    dp_size: int = 1
    mesh: Any = None
    is_last_stage: bool = True

    def parameters(self):
        for part in self.parts:
            yield from part.parameters()


def single_process(model: torch.nn.Module) -> ParallelModel:
    return ParallelModel(parts=[model], forward=model)


def clip_grad_norm(pmodel: ParallelModel, max_norm: float) -> torch.Tensor:
    """Global gradient norm (clipped to ``max_norm`` when above 0), as a float tensor."""
    params = [p for p in pmodel.parameters() if p.grad is not None]
    if max_norm > 0:
        return torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=True)
    return torch.nn.utils.get_total_norm([p.grad for p in params], foreach=True)
