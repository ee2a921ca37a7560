"""Mixture weights that change by step (``data.phases``): which source every slot of
the run comes from, as a closed form of the slot number.

A schedule is a list of *phases*, each with a start step, weights per source and an
optional linear anneal. Step ``s`` is slots ``s * step_slots`` onwards
(``step_slots``: the global batch, ``train.batch_size``), so phases fall on step
boundaries whatever the number of data-parallel ranks. Before the first configured
phase (when it starts after step 0) the weights of ``data.sources`` hold.

The slots are cut into *segments*, each with its own slot counter from 0:

- a *steady* segment reads one :class:`~forge_core.data.mixture.MixturePlan` (the
  period pattern of its weights);
- an *anneal* of ``A`` steps goes linearly from the weights before the phase (``P``)
  to the phase's own (``Q``): step ``j`` of it (from 0) gives a share
  ``t_j = (2j + 1) / 2A`` of its slots to ``Q``'s plan and the rest to ``P``'s, so
  neither end repeats the weights around it and the midpoint is half and half. Which
  slots are ``Q``'s is a closed form: of the first ``n`` slots of the anneal,
  ``q(n) = round(sum of t over them)``, exactly in integers:
  ``(B j^2 + (n - jB)(2j + 1) + A) // 2A`` with ``j = n // B`` and ``B`` slots a step.
  ``q`` grows by 0 or 1 a slot (``t < 1``), so slot ``n`` is ``Q``'s when
  ``q(n + 1) > q(n)``; its source is then ``Q``'s plan at slot ``q(n)``, else ``P``'s
  at slot ``n - q(n)``.

How many rows each source has given before any slot (its row's index in that source's
own endless order) is the sum over the segments before it plus the count inside its
segment: all computed, never simulated, so a resume at any step (at a phase boundary or
in the middle of an anneal) reads what an uninterrupted run reads.
"""

from __future__ import annotations

from typing import Any

import attrs
import numpy as np

from forge_core.data.mixture import MixturePlan


@attrs.frozen
class Phase:
    """One phase: from step ``start`` (steps done before it) on, weights ``weights``
    (per source, in ``data.sources`` order), reached over ``anneal`` steps. ``name`` is
    its config path; ``where`` each weight's (for errors)."""

    start: int
    weights: tuple[float, ...]
    anneal: int = 0
    name: str = "data.sources"
    where: tuple[str, ...] | None = None


class _Anneal:
    def __init__(self, before: MixturePlan, after: MixturePlan, steps: int, step_slots: int) -> None:
        self.before, self.after = before, after
        self.steps, self.step_slots = steps, step_slots

    def after_count(self, n: np.ndarray) -> np.ndarray:
        """Slots of the first ``n`` that ``after``'s plan gives (the module docstring's ``q``)."""
        a, b = self.steps, self.step_slots
        j = n // b
        return (b * j * j + (n - j * b) * (2 * j + 1) + a) // (2 * a)

    def at(self, n: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        q = self.after_count(n)
        late = self.after_count(n + 1) > q
        p = n - q
        source = np.empty(len(n), np.int32)
        index = np.empty(len(n), np.int64)
        s, i = self.after.at(q[late])
        source[late], index[late] = s, i + self.before.taken_of(s, p[late])
        s, i = self.before.at(p[~late])
        source[~late], index[~late] = s, i + self.after.taken_of(s, q[~late])
        return source, index

    def taken(self, n: int) -> np.ndarray:
        q = int(self.after_count(np.int64(n)))
        return self.before.taken(n - q) + self.after.taken(q)

    def describe(self) -> dict[str, Any]:
        return {"anneal": [self.before.counts.tolist(), self.after.counts.tolist()], "steps": self.steps}


class MixtureSchedule:
    """Slot -> (source, that source's row count so far) for ``phases`` (the first starts
    at step 0), ``step_slots`` slots a step."""

    def __init__(self, phases: list[Phase], labels: list[str], step_slots: int) -> None:
        self.phases = phases
        self.labels = labels
        self.step_slots = step_slots
        plans = [MixturePlan(list(p.weights), labels, list(p.where) if p.where else None) for p in phases]
        starts: list[int] = []
        segments: list[Any] = []
        for i, (phase, plan) in enumerate(zip(phases, plans)):
            end = phases[i + 1].start if i + 1 < len(phases) else None
            steady_from = phase.start
            if phase.anneal:
                starts.append(phase.start * step_slots)
                segments.append(_Anneal(plans[i - 1], plan, phase.anneal, step_slots))
                steady_from += phase.anneal
            if end is None or steady_from < end:
                starts.append(steady_from * step_slots)
                segments.append(plan)  # a steady segment: the plan itself
        self.starts = np.asarray(starts, np.int64)
        self.segments = segments
        # Rows each source has given before each segment.
        base = [np.zeros(len(labels), np.int64)]
        for k in range(len(segments) - 1):
            base.append(base[-1] + segments[k].taken(int(self.starts[k + 1] - self.starts[k])))
        self.base = base

    @classmethod
    def of(
        cls, weights: list[float], labels: list[str], phases: list[Phase] = (), step_slots: int = 1
    ) -> MixtureSchedule:
        """The sources' ``weights`` from step 0, then ``phases``."""
        return cls([Phase(0, tuple(weights)), *phases], labels, step_slots)

    def slots(self, first: int, count: int) -> tuple[np.ndarray, np.ndarray]:
        """For slots ``first .. first + count - 1``: the source of each, and how many
        rows that source had given before it (the row's index in the source's order)."""
        n = np.arange(first, first + count, dtype=np.int64)
        segment = np.searchsorted(self.starts, n, side="right") - 1
        source = np.empty(count, np.int32)
        index = np.empty(count, np.int64)
        for k in np.unique(segment).tolist():
            mine = segment == k
            s, i = self.segments[k].at(n[mine] - self.starts[k])
            source[mine], index[mine] = s, i + self.base[k][s]
        return source, index

    def taken(self, slots: int) -> np.ndarray:
        """Rows each source has given in the first ``slots`` slots."""
        k = int(np.searchsorted(self.starts, slots, side="right")) - 1
        return self.base[k] + self.segments[k].taken(int(slots - self.starts[k]))

    def phase_of(self, step: int) -> int:
        """The phase the batches of step ``step`` (steps done before it) belong to."""
        return int(np.searchsorted([p.start for p in self.phases], step, side="right")) - 1

    def describe(self) -> list[dict[str, Any]]:
        """What must match for saved slot counts to mean the same rows: each segment's
        first slot, its last and its plans."""
        ends = [*self.starts[1:].tolist(), None]
        return [
            {"from": int(start), "to": end, **segment.describe()}
            for start, end, segment in zip(self.starts.tolist(), ends, self.segments)
        ]


def same_prefix(saved: list[dict[str, Any]], now: list[dict[str, Any]], slots: int) -> bool:
    """Whether schedules ``saved`` and ``now`` (:meth:`MixtureSchedule.describe`) give
    the same source and row to each of the first ``slots`` slots: phases that start
    later may be added, changed or removed (a steady segment running then may end at
    another step), never the ones already read."""

    def read(schedule: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out = []
        for segment in schedule:
            if segment["from"] >= slots:
                break
            if "counts" in segment and (segment["to"] is None or segment["to"] >= slots):
                segment = {**segment, "to": None}  # still running at the resume point
            out.append(segment)
        return out

    return read(saved) == read(now)
