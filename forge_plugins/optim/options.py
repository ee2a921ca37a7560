"""Options classes of the built-in optimizers and schedules (no torch import)."""

from __future__ import annotations

from typing import Literal

import attrs


def opt(default, doc):
    return attrs.field(default=default, metadata={"doc": doc})


@attrs.frozen
class AdamWOptions:
    beta1: float = opt(0.9, "First-moment decay.")
    beta2: float = opt(0.95, "Second-moment decay.")
    eps: float = opt(1e-8, "Denominator epsilon.")
    weight_decay: float = opt(0.1, "Decoupled weight decay (not applied to norms and biases).")
    implementation: Literal["auto", "fused", "foreach", "loop"] = opt(
        "auto", "'auto': fused on CUDA, foreach elsewhere."
    )


@attrs.frozen
class SGDOptions:
    momentum: float = opt(0.9, "Momentum factor.")
    nesterov: bool = opt(False, "Nesterov momentum.")
    weight_decay: float = opt(0.0, "L2 penalty (not applied to norms and biases).")


@attrs.frozen
class DecayOptions:
    min_lr_ratio: float = opt(0.1, "Final learning rate as a fraction of train.lr.")


@attrs.frozen
class WSDOptions:
    decay_fraction: float = opt(0.2, "Share of the steps spent in the final decay.")
    min_lr_ratio: float = opt(0.0, "Final learning rate as a fraction of train.lr.")
    decay_shape: Literal["linear", "cosine", "sqrt"] = opt("sqrt", "Shape of the final decay.")


@attrs.frozen
class ConstantOptions:
    pass
