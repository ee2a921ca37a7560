"""One optimizer step over a step's micro-batches.

1. count, over every data-parallel rank, the tokens whose label is not
   :data:`~forge_core.api.IGNORE_INDEX`, what the objective normalizes by (its
   ``count``: the labelled tokens again for ``lm``, the pairs for ``dpo``) and the
   attended pairs (one small all-reduce that also carries whether any process received
   a stop signal, and the caller's own counts: a mixture's labelled tokens per source);
2. for each micro-batch, :meth:`~forge_core.distributed.parallelize.ParallelModel.forward_backward`
   under the chosen precision with the objective's count as its normalizer (the gradient
   convention, docs/plugin-guide/parallelism.md#the-gradient-convention), gradient sync
   only on the last micro-batch;
3. finish the gradients (what strategies reduce once per step, after the last backward),
   clip to the global gradient norm, sum the loss over the processes (one all-reduce
   that also carries the objective's metric sums, divided by the same count, and what
   the forwards measured: the model's statistics, :mod:`forge_core.train.model_stats`)
   and, when the loss and the norm are finite, step every optimizer, then the modules
   that ask for it (``after_optimizer_step``, :mod:`~forge_core.train.module_hooks`).

What does not change from step to step (the model's parameters, its modules'
``after_optimizer_step``) the trainer looks up once (:class:`StepFixed`): each lookup
walks every module, about 1 ms a step at 32 layers, which a step on a GPU notices.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import torch

from forge_core.api import IGNORE_INDEX, LABELS, OptimizerStepModule
from forge_core.distributed.parallelize import clip_grad_norm
from forge_core.distributed.placement import all_reduce_sum, to_device
from forge_core.train import module_hooks, precision


@attrs.frozen
class StepFixed:
    """What :func:`optimizer_step` needs of the model that stays the same for the whole
    run (the strategies are applied before the first step and never change the modules
    after): its parameters and its modules' ``after_optimizer_step``
    (:mod:`~forge_core.train.module_hooks`)."""

    params: tuple[torch.nn.Parameter, ...]
    after_step: tuple[Callable[[], Any], ...]

    @classmethod
    def of(cls, pmodel: Any) -> StepFixed:
        return cls(
            tuple(pmodel.parameters()),
            tuple(module_hooks.calls(pmodel.parts, OptimizerStepModule)),
        )


@attrs.frozen
class StepOutcome:
    loss: float
    grad_norm: float
    #: Labelled tokens and attended pairs over the global batch.
    tokens: float
    pairs: float
    #: Whether any process had received a stop signal when the step began.
    stop_agreed: bool
    #: Whether the optimizers stepped (the loss and the gradient norm were finite).
    stepped: bool
    #: The caller's ``counts`` summed over the global batch.
    counts: tuple[float, ...] = ()
    #: What ``measured`` returned, summed over every process.
    measured: tuple[float, ...] = ()
    #: The objective's metrics (its spec's ``metrics``), each a mean over its count.
    metrics: dict[str, float] = attrs.field(factory=dict)


def global_counts(
    micro: list[dict[str, torch.Tensor]],
    count_pairs: Callable[[dict[str, torch.Tensor]], int],
    slice_weight: float,
    stop: bool,
    device: torch.device,
    counts: Sequence[float] = (),
    count: Callable[[dict[str, torch.Tensor]], int] | None = None,
) -> tuple[float, float, float, float, tuple[float, ...]]:
    """``(labelled tokens, the objective's count, attended pairs, stop requests, counts)``
    over every process, ``counts`` being the caller's own per-batch counts, ``count`` the
    objective's (``None``: the labelled tokens) and ``count_pairs`` the attention's count
    of attended pairs (:func:`~forge_core.train.flops.pair_counter`). Every process of a
    data-parallel slice reads the same batch: ``slice_weight`` counts each batch once."""
    labelled = sum(int((b[LABELS] != IGNORE_INDEX).sum()) for b in micro)
    units = labelled if count is None else sum(count(b) for b in micro)
    pairs = sum(count_pairs(b) for b in micro)
    w = slice_weight
    labelled, units, pairs, stops, *summed = all_reduce_sum(
        [labelled * w, units * w, pairs * w, 1.0 if stop else 0.0, *(c * w for c in counts)], device
    )
    return labelled, units, pairs, stops, tuple(summed)


def optimizer_step(
    pmodel: Any,
    optimizers: list[Any],
    micro: list[dict[str, torch.Tensor]],
    lr: float,
    *,
    precision_name: str,
    device: torch.device,
    slice_weight: float,
    grad_clip: float,
    stop: bool,
    count_pairs: Callable[[dict[str, torch.Tensor]], int],
    counts: Sequence[float] = (),
    measured: Callable[[], Sequence[float]] | None = None,
    fixed: StepFixed | None = None,
) -> StepOutcome:
    """Train one step on ``micro`` at learning rate ``lr``; the gradients are cleared
    afterwards whether or not the optimizers stepped. ``counts`` (this process's numbers
    about its batches) come back summed over the global batch, in the same all-reduce.
    ``measured()``, called after the last backward, gives this process's numbers about
    its forwards (already weighted); they come back summed over every process, in the
    loss's all-reduce. The model's objective (``pmodel.objective``) counts the
    normalizer; without one, the labelled tokens do. ``fixed``: :meth:`StepFixed.of`
    ``pmodel``, made once by a caller that steps many times (``None``: made here)."""
    fixed = StepFixed.of(pmodel) if fixed is None else fixed
    count = None if pmodel.objective is None else pmodel.objective.count
    labelled, units, pairs, stops, summed = global_counts(
        micro, count_pairs, slice_weight, stop, device, counts, count
    )
    for optimizer in optimizers:
        for group in optimizer.param_groups:
            group["lr"] = lr
    normalizer = max(units, 1.0)
    autocast = precision.autocast(precision_name, device)
    loss_total = torch.zeros((), dtype=torch.float32, device=device)
    for i, batch in enumerate(micro):
        batch = to_device(batch, device)
        with pmodel.gradient_sync(i == len(micro) - 1), autocast:
            loss_sum, _ = pmodel.forward_backward(batch, None, normalizer)
        loss_total += loss_sum.detach().float()
    pmodel.finish_gradients()  # what strategies reduce once per step (tp's partial parameters)
    grad_norm = float(clip_grad_norm(pmodel, grad_clip, fixed.params))
    # Every process holds its data-parallel slice's loss (pipeline ranks get it back
    # from the last stage), or its share of it under a token split: weight so each
    # slice counts once.
    weight = slice_weight * pmodel.token_split
    sums = pmodel.take_objective_sums()
    local = list(measured()) if measured is not None else []
    loss, *rest = all_reduce_sum(
        [float(loss_total) * weight, *(float(v) * weight for v in sums.values()), *local], device
    )
    loss /= normalizer
    metrics = {name: value / normalizer for name, value in zip(sums, rest)}
    measured_sums = rest[len(sums) :]
    stepped = math.isfinite(loss) and math.isfinite(grad_norm)
    if stepped:
        for optimizer in optimizers:
            optimizer.step()
        for call in fixed.after_step:
            call()
    for optimizer in optimizers:
        optimizer.zero_grad(set_to_none=True)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return StepOutcome(
        loss, grad_norm, labelled, pairs, stops > 0, stepped, summed, tuple(measured_sums), metrics
    )
