"""Calls the trainer makes on every module of the model that defines them, found by the
method's name, never by class (a mixture-of-experts block of any model uses them):

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


def calls(parts: Iterable[Any], name: str) -> list[Any]:
    """The bound ``name`` of every module of ``parts`` that defines it. A walk over every
    module: a caller on the per-step path looks them up once
    (:class:`~forge_core.train.step.StepFixed`)."""
    found = (getattr(module, name, None) for part in parts for module in part.modules())
    return [call for call in found if callable(call)]


def set_token_group(parts: Iterable[Any], group: Any, step_tokens: int) -> None:
    for call in calls(parts, "set_token_group"):
        call(group, step_tokens)
