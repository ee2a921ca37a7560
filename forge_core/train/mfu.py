"""Model FLOPs utilisation of each step: its FLOPs (:mod:`forge_core.train.flops`) over
its time, per process, against the peak (:mod:`forge_core.train.peak`).

The peak is fixed for the whole run: ``train.peak_tflops`` when set, else the figure
measured once and cached. MFU is reported against it as it is. A step that computes
faster than a *measured* peak shows the peak was taken while the machine was busy: MFU
then reads above 1 and the run says so once, with how to measure again; nothing a step
does rewrites the cache.

``d_attn`` is measured on a copy of the model built on the meta device around an
:class:`~forge_core.train.flops.AttentionProbe`: the model that trains never holds the
probe.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs
import torch

from forge_core import components
from forge_core.train import flops
from forge_core.train.peak import cache_file, cached_peak, peak_flops

if TYPE_CHECKING:
    from forge_core.api import Plan


@attrs.define
class MfuMeter:
    """``meter(input_tokens, pairs, seconds) -> (mfu, notice or None)`` for one step."""

    n_matmul: int
    attn_width: int
    peak: float
    peak_source: str
    peak_measured: bool
    world_size: int
    warned: bool = False

    def step_flops(self, input_tokens: int, pairs: int) -> float:
        return flops.step_flops(self.n_matmul, self.attn_width, input_tokens, pairs)

    def __call__(self, input_tokens: int, pairs: int, seconds: float) -> tuple[float, str | None]:
        achieved = self.step_flops(input_tokens, pairs) / seconds / self.world_size
        mfu = achieved / self.peak
        if mfu <= 1 or not self.peak_measured or self.warned:
            return mfu, None
        self.warned = True
        return mfu, (
            f"this run computes {achieved / 1e9:,.1f} GFLOP/s per process, above the peak of "
            f"{self.peak / 1e9:,.1f} GFLOP/s measured earlier (while the machine was busy?), "
            f"so MFU reads above 1. Delete {cache_file()} to measure the peak again at the next "
            "start, or set train.peak_tflops."
        )


def attention_width(plan: Plan, registries: Any, vocab_size: int, warn: Callable[[str], None]) -> int:
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
    registries: Any,
    model: torch.nn.Module,
    vocab_size: int,
    device: torch.device,
    world_size: int,
    log: Callable[[str], None],
    warn: Callable[[str], None],
) -> MfuMeter:
    """The meter of a built model, with the run's peak (measured now if not cached)."""
    train = plan.config.train
    dtype = torch.bfloat16 if train.precision == "bf16" else torch.float32
    if train.peak_tflops <= 0 and cached_peak(device, dtype) is None:
        log("measuring the peak matmul rate for MFU (once; cached) ...")
    peak, source = peak_flops(device, dtype, train.peak_tflops)
    return MfuMeter(
        flops.matmul_params(model),
        attention_width(plan, registries, vocab_size, warn),
        peak,
        source,
        train.peak_tflops <= 0,
        world_size,
    )
