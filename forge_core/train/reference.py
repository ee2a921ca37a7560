"""The frozen reference model of an objective that needs one (``needs_reference``: the
``dpo`` objective's policy is scored against it).

With a model transform applied (``model.transforms``: LoRA), the reference is the
trained model itself with the transforms switched off
(:func:`~forge_core.api.transforms_disabled` on every part this process holds): the base
is frozen, so with the adapters off it is the model as the run started, and no copy is
made (:func:`adapters_off`).

Without one, the reference is the model as the run starts: a copy of it taken once it is built and
before any strategy shards or wraps it, filled the way the model itself is (a model
built on the meta device, whose weights come from a checkpoint, is materialised through
its ``init_weights()``, :func:`~forge_core.distributed.parallelize.materialize`), on the
same device, in eval mode and without gradients. A resumed run builds it the same way
before the checkpoint is loaded, so it is the same reference at every start. Every
process holds it whole, whatever the strategies do to the trained model: it costs one
more copy of the weights (no gradients, no optimizer state).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable
from typing import Any

import torch

from forge_core.api.transforms import applied_transforms, transforms_disabled
from forge_core.distributed.parallelize import ParallelModel, is_meta, materialize


def frozen_copy(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """A copy of ``model`` on ``device``, materialised, in eval mode, no gradients."""
    reference = copy.deepcopy(model)
    if is_meta(reference):
        materialize(reference, device)
    else:
        reference.to(device)
    reference.requires_grad_(False)
    return reference.eval()


def build_reference(model: torch.nn.Module, device: torch.device) -> Callable[[dict[str, Any]], Any]:
    """``reference(inputs) -> output``: the forward of a frozen copy of ``model``
    (:func:`frozen_copy`) under ``torch.no_grad``, taking the keyword arguments the
    model takes."""
    reference = frozen_copy(model, device)

    @torch.no_grad()
    def forward(inputs: dict[str, Any]) -> Any:
        return reference(**inputs)

    forward.module = reference  # type: ignore[attr-defined]  # the copy, for inspection
    return forward


def adapters_off(pmodel: ParallelModel) -> Callable[[dict[str, Any]], Any]:
    """``reference(inputs) -> output``: ``pmodel``'s own forward with every transform of
    every part disabled, under ``torch.no_grad`` and in eval mode (each module put back
    in the mode it had)."""
    from forge_core.train.evaluate import eval_mode

    @torch.no_grad()
    def forward(inputs: dict[str, Any]) -> Any:
        with contextlib.ExitStack() as stack:
            for part in pmodel.parts:
                stack.enter_context(transforms_disabled(part))
            stack.enter_context(eval_mode([*pmodel.parts, pmodel.forward]))
            return pmodel.forward(**inputs)

    return forward


def needs_copy(model: torch.nn.Module) -> bool:
    """Whether the reference of ``model`` is a copy (:func:`build_reference`): it is
    unless a transform can be switched off (:func:`adapters_off`)."""
    return not applied_transforms(model)
