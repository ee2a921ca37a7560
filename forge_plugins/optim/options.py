"""Options classes of the built-in optimizers and schedules (no torch import)."""

from __future__ import annotations

from typing import Literal

import attrs

from forge_core.api import above, at_least, between


def opt(default, doc, validator=None):
    return attrs.field(default=default, metadata={"doc": doc}, validator=validator)


#: A decay rate or momentum: 1 or more never forgets (and diverges).
_decay = between(0, 1, high_open=True)
_fraction = between(0, 1)


@attrs.frozen
class AdamWOptions:
    beta1: float = opt(0.9, "First-moment decay.", _decay)
    beta2: float = opt(0.95, "Second-moment decay.", _decay)
    eps: float = opt(1e-8, "Denominator epsilon.", above(0))
    weight_decay: float = opt(0.1, "Decoupled weight decay (not applied to norms and biases).", at_least(0))
    implementation: Literal["auto", "fused", "foreach", "loop"] = opt(
        "auto", "'auto': fused on CUDA, foreach elsewhere."
    )


@attrs.frozen
class SGDOptions:
    momentum: float = opt(0.9, "Momentum factor.", _decay)
    nesterov: bool = opt(False, "Nesterov momentum (needs a momentum above 0).")
    weight_decay: float = opt(0.0, "L2 penalty (not applied to norms and biases).", at_least(0))


@attrs.frozen
class DecayOptions:
    min_lr_ratio: float = opt(0.1, "Final learning rate as a fraction of train.lr.", _fraction)


@attrs.frozen
class WSDOptions:
    decay_fraction: float = opt(0.2, "Share of the steps spent in the final decay.", _fraction)
    min_lr_ratio: float = opt(0.0, "Final learning rate as a fraction of train.lr.", _fraction)
    decay_shape: Literal["linear", "cosine", "sqrt"] = opt("sqrt", "Shape of the final decay.")


@attrs.frozen
class ConstantOptions:
    pass
