"""Learning-rate schedules as pure functions of the step (so resuming needs no state).

Each returns the multiplier on ``train.lr`` for 0-based ``step``. Warmup is linear from
``1/(warmup_steps+1)`` to 1 over ``warmup_steps`` steps, shared by every schedule.
"""

from __future__ import annotations

import math


def _warmup(step: int, warmup_steps: int) -> float | None:
    if step < warmup_steps:
        return (step + 1) / (warmup_steps + 1)
    return None


def _progress(step: int, total_steps: int, warmup_steps: int) -> float:
    span = max(1, total_steps - warmup_steps - 1)
    return min(1.0, max(0.0, (step - warmup_steps) / span))


def constant(step: int, total_steps: int, warmup_steps: int, options) -> float:
    w = _warmup(step, warmup_steps)
    return 1.0 if w is None else w


def cosine(step: int, total_steps: int, warmup_steps: int, options) -> float:
    w = _warmup(step, warmup_steps)
    if w is not None:
        return w
    p = _progress(step, total_steps, warmup_steps)
    floor = options.min_lr_ratio
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * p))


def linear(step: int, total_steps: int, warmup_steps: int, options) -> float:
    w = _warmup(step, warmup_steps)
    if w is not None:
        return w
    p = _progress(step, total_steps, warmup_steps)
    return 1.0 - (1.0 - options.min_lr_ratio) * p


def warmup_stable_decay(step: int, total_steps: int, warmup_steps: int, options) -> float:
    w = _warmup(step, warmup_steps)
    if w is not None:
        return w
    decay_steps = max(1, round(options.decay_fraction * total_steps))
    decay_start = max(warmup_steps, total_steps - decay_steps)
    if step < decay_start:
        return 1.0
    p = min(1.0, (step - decay_start) / max(1, total_steps - decay_start - 1))
    shape = {"linear": p, "sqrt": math.sqrt(p), "cosine": 0.5 * (1 - math.cos(math.pi * p))}[
        options.decay_shape
    ]
    return 1.0 - (1.0 - options.min_lr_ratio) * shape
