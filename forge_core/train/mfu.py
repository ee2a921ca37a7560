"""Model FLOPs utilisation of each step: its FLOPs (:mod:`forge_core.train.flops`) over
its time, per process, against the peak (:mod:`forge_core.train.peak`).

The peak is fixed for the whole run and the log names its source. MFU is never reported
above 1: a step that computes faster than the peak shows the peak is too low (a GPU faster
than its table entry, a measurement that went wrong, a ``train.peak_tflops`` set too low).
Its MFU is then reported as 1 and the run says so once, naming the source and the fix.

``d_attn`` is measured on a copy of the model built on the meta device around an
:class:`~forge_core.train.flops.AttentionProbe`: the model that trains never holds the
probe.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import attrs
import torch

from forge_core import components
from forge_core.train import flops
from forge_core.train.peak import peak_flops

if TYPE_CHECKING:
    from forge_core.api import Plan
    from forge_core.registry import Registries


@attrs.define
class MfuMeter:
    """``meter(input_tokens, pairs, seconds) -> (mfu, capped, notice or None)`` for one
    step; ``capped`` is true when the step beat the peak and ``mfu`` reads 1 for it.
    ``n_matmul`` counts every matmul parameter, ``n_active`` those one token is computed
    with (:func:`~forge_core.train.flops.active_matmul_params`): the FLOPs count these."""

    n_matmul: int
    attn_width: int
    peak: float
    peak_source: str
    world_size: int
    n_active: int = attrs.field(default=attrs.Factory(lambda self: self.n_matmul, takes_self=True))
    warned: bool = False

    def step_flops(self, input_tokens: int, pairs: int) -> float:
        return flops.step_flops(self.n_active, self.attn_width, input_tokens, pairs)

    def __call__(self, input_tokens: int, pairs: int, seconds: float) -> tuple[float, bool, str | None]:
        achieved = self.step_flops(input_tokens, pairs) / seconds / self.world_size
        mfu = achieved / self.peak
        if mfu <= 1:
            return mfu, False, None
        notice = None
        if not self.warned:
            self.warned = True
            notice = (
                f"this run computes {achieved / 1e12:.3g} TFLOP/s per process, above the peak of "
                f"{self.peak / 1e12:.3g} TFLOP/s ({self.peak_source}): the peak is underestimated, "
                "so MFU is reported as 100% whenever a step beats it. Set train.peak_tflops to "
                "this device's peak (dense, in the training dtype) for a true MFU."
            )
        return 1.0, True, notice


def attention_width(plan: Plan, registries: Registries, vocab_size: int, warn: Callable[[str], None]) -> int:
    """``d_attn`` summed over layers, from one forward of a meta-device copy of the model
    (pretrained weights not loaded); 0, with a warning, when the model cannot be built
    or run there: MFU then counts the parameter matmuls alone."""
    probe = flops.AttentionProbe(components.attention(plan, registries))
    try:
        with torch.device("meta"):
            model = components.model(components.without_pretrained(plan), registries, vocab_size, probe)
        return flops.measure_attention_width(model, probe, torch.device("meta"))
    except Exception as exc:  # noqa: BLE001 - a metric must not stop the run
        warn(
            f"MFU leaves attention out: model {plan.config.model.name!r} could not be built and run on "
            f"the meta device to measure it ({type(exc).__name__}: {exc})"
        )
        return 0


def build_meter(
    plan: Plan,
    registries: Registries,
    model: torch.nn.Module,
    vocab_size: int,
    device: torch.device,
    world_size: int,
    warn: Callable[[str], None],
) -> MfuMeter:
    """The meter of a built model, with the run's peak."""
    train = plan.config.train
    dtype = torch.bfloat16 if train.precision == "bf16" else torch.float32
    peak = peak_flops(device, dtype, train.peak_tflops)
    return MfuMeter(
        flops.matmul_params(model),
        attention_width(plan, registries, vocab_size, warn),
        peak.flops,
        peak.source,
        world_size,
        flops.active_matmul_params(model),
    )
