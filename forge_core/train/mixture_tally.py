"""The data mixture a run really trains on, step by step.

For a ``data.sources`` mixture every step reports, per source, ``data/<source>/tokens``
(the labelled tokens of this step's rows from that source, over all processes) and
``data/<source>/share`` (the source's share of the labelled tokens since the run
started). The rows' sources come from the loader (``StatefulLoader.last_sources``); each
process counts its own rows and the counts travel in the step's one all-reduce. The
running totals are saved in checkpoints, so a resumed run reports what an uninterrupted
one does.

Under ``data.phases`` each step also reports ``data/<source>/phase_share`` (the share
since the step's phase started), and when a phase ends (the next one starts, or the run
reaches ``train.steps``) one line says what it trained on: the labelled tokens of the
phase per source beside the phase's weights.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from forge_core.api import IGNORE_INDEX, LABELS

#: The train-state key of the running totals.
STATE_KEY = "mixture_tokens"
#: The train-state key of the totals per phase.
PHASE_KEY = "mixture_phase_tokens"


class MixtureTally:
    """``schedule``: the mixture's :class:`~forge_core.data.mix_schedule.MixtureSchedule`
    (phases are tallied when it has more than one); ``end``: the run's last step."""

    def __init__(self, labels: list[str], schedule: Any = None, end: int = 0) -> None:
        self.labels = list(labels)
        self.total = np.zeros(len(self.labels), np.int64)
        self.schedule = schedule if schedule is not None and len(schedule.phases) > 1 else None
        self.end = end
        phases = len(self.schedule.phases) if self.schedule is not None else 0
        self.phase_total = np.zeros((phases, len(self.labels)), np.int64)

    def local(self, micro: list[dict[str, Any]], sources: list[np.ndarray]) -> list[float]:
        """This process's labelled tokens per source in ``micro`` (rows from ``sources``)."""
        counts = np.zeros(len(self.labels), np.float64)
        for batch, source in zip(micro, sources):
            labelled = (batch[LABELS] != IGNORE_INDEX).sum(dim=1).numpy()
            counts += np.bincount(source, weights=labelled, minlength=len(self.labels))
        return counts.tolist()

    def metrics(self, step_counts: list[float], step: int = 1) -> dict[str, Any]:
        """The metrics of step ``step`` (counted from 1, as logged) from its counts over all
        processes; adds them to the totals."""
        # Rounded: the per-process weights (data-parallel size / world size) are fractions.
        now = np.rint(np.asarray(step_counts, np.float64)).astype(np.int64)
        self.total += now
        out: dict[str, Any] = {}
        for label, tokens, share in zip(self.labels, now.tolist(), _shares(self.total)):
            out[f"data/{label}/tokens"] = tokens
            out[f"data/{label}/share"] = share
        if self.schedule is not None:
            phase = self.phase_total[self.schedule.phase_of(step - 1)]
            phase += now
            for label, share in zip(self.labels, _shares(phase)):
                out[f"data/{label}/phase_share"] = share
        return out

    def phase_ended(self, step: int) -> str | None:
        """The line for the phase that step ``step`` (counted from 1) ended, if it did."""
        from forge_core.data.mixture import shares as weight_shares

        if self.schedule is None:
            return None
        phases = self.schedule.phases
        i = self.schedule.phase_of(step - 1)
        end = phases[i + 1].start if i + 1 < len(phases) else self.end
        if step != min(end, self.end):
            return None
        phase, tokens = phases[i], self.phase_total[i]
        weights = weight_shares(phase.weights)
        shares = ", ".join(
            f"{label} {share:.1%} (weight {w:.1%})"
            for label, share, w in zip(self.labels, _shares(tokens), weights)
        )
        return (
            f"data: {phase.name} ended at step {step:,}: {int(tokens.sum()):,} labelled tokens "
            f"since step {phase.start + 1:,}: {shares}"
        )

    def state_dict(self) -> list[int]:
        return self.total.tolist()

    def phase_state(self) -> list[list[int]]:
        return self.phase_total.tolist()

    def load_state_dict(self, totals: list[int] | None, phases: list[list[int]] | None = None) -> None:
        """Continue from saved totals (``None``: a checkpoint that kept none counts from 0);
        ``phases``: the totals of each phase (those of phases added since start at 0)."""
        if totals is not None and len(totals) == len(self.labels):
            self.total = np.asarray(totals, np.int64)
        for i, row in enumerate((phases or [])[: len(self.phase_total)]):
            if len(row) == len(self.labels):
                self.phase_total[i] = row


def _shares(counts: np.ndarray) -> list[float]:
    return (counts / max(int(counts.sum()), 1)).tolist()
