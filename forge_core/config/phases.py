"""The checks of ``data.phases`` that need more than one field: every phase names every
source of the mixture by its label (an unknown one gets a did-you-mean), weighs at
least one above 0 and none below, starts after the phase before it, and anneals over no
more steps than it lasts. A phase may start after ``train.steps``: a run extended later
reaches it (the data summary lists the phases a run reaches)."""

from __future__ import annotations

import math
from typing import Any

from forge_core.api.unstable import show_value, unknown_name
from forge_core.config.schema import source_labels


def _number(weight: Any) -> bool:
    return type(weight) in (int, float) and math.isfinite(weight)  # YAML mappings are not typed


def phase_issues(config: Any) -> list[tuple[str, str]]:
    """``(path, why)`` for every problem of ``config.data.phases``."""
    data = config.data
    if not data.phases:
        return []
    if len(data.sources) < 2:
        return [
            (
                "$.data.phases",
                "phases change the weights of a mixture, and the config reads one source: give "
                "two or more data.sources, or remove data.phases",
            )
        ]
    labels = source_labels(data.sources)
    issues: list[tuple[str, str]] = []
    for i, phase in enumerate(data.phases):
        at = f"$.data.phases[{i}]"
        for name, weight in phase.weights.items():
            if name not in labels:
                issues.append((f"{at}.weights.{name}", unknown_name("source label", name, labels)))
            elif not _number(weight):
                issues.append((f"{at}.weights.{name}", f"expected a finite number, got {show_value(weight)}"))
            elif weight < 0:
                issues.append(
                    (
                        f"{at}.weights.{name}",
                        f"must be at least 0, got {show_value(weight)} (0 leaves it out)",
                    )
                )
        missing = [label for label in labels if label not in phase.weights]
        if missing:
            issues.append(
                (
                    f"{at}.weights",
                    f"no weight for {', '.join(missing)}: give every source of the mixture a "
                    "weight in each phase (0 leaves it out of the phase)",
                )
            )
        elif not any(_number(w) and w > 0 for w in phase.weights.values()):
            issues.append((f"{at}.weights", "every weight is 0: give at least one source a weight above 0"))
        if i and phase.start_step <= data.phases[i - 1].start_step:
            issues.append(
                (
                    f"{at}.start_step",
                    f"{phase.start_step} is not after data.phases[{i - 1}].start_step "
                    f"({data.phases[i - 1].start_step}): list the phases in the order they start",
                )
            )
        end = data.phases[i + 1].start_step if i + 1 < len(data.phases) else None
        if end is not None and end > phase.start_step and phase.anneal_steps > end - phase.start_step:
            issues.append(
                (
                    f"{at}.anneal_steps",
                    f"{phase.anneal_steps} is longer than the phase ({end - phase.start_step} steps, "
                    f"to data.phases[{i + 1}].start_step {end}): anneal over at most that many",
                )
            )
    return issues
