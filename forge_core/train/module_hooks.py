"""Calls the trainer makes on every module of the model that has them, found by their
protocols in :mod:`forge_core.api` (``TokenGroupModule``, ``OptimizerStepModule``),
never by class (a mixture-of-experts block of any model uses them):

- ``set_token_group(group, step_tokens)``: once, after the strategies are applied:
  ``group`` is the process group of the processes that compute different tokens
  (data parallel, context parallel; :func:`~forge_core.distributed.mesh.token_group`),
  ``None`` in one process; ``step_tokens`` the tokens of one optimizer step over all
  processes (``train.batch_size * data.seq_len``). What a module sums over the global
  batch (balancing statistics), it sums over ``group``; what it averages over a step's
  tokens (a penalty added to the gradient), it divides by ``step_tokens``.
- ``after_optimizer_step()``: on every process after each optimizer step that stepped
  (a loss-free balancing bias update; a collective over ``group`` is allowed: every
  process calls it at the same point).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from forge_core.api import OptimizerStepModule, TokenGroupModule

#: The method each capability names.
METHODS = {TokenGroupModule: "set_token_group", OptimizerStepModule: "after_optimizer_step"}


def calls(parts: Iterable[Any], capability: type) -> list[Any]:
    """The bound method of ``capability`` (a protocol of :data:`METHODS`) of every module
    of ``parts`` that has it. A walk over every module: a caller on the per-step path
    looks them up once (:class:`~forge_core.train.step.StepFixed`)."""
    name = METHODS[capability]
    return [getattr(m, name) for part in parts for m in part.modules() if isinstance(m, capability)]


def set_token_group(parts: Iterable[Any], group: Any, step_tokens: int) -> None:
    for call in calls(parts, TokenGroupModule):
        call(group, step_tokens)
