"""The data mixture a run really trains on, step by step.

For a ``data.sources`` mixture every step reports, per source, ``data/<source>/tokens``
(the labelled tokens of this step's rows from that source, over all processes) and
``data/<source>/share`` (the source's share of the labelled tokens since the run
started). The rows' sources come from the loader (``StatefulLoader.last_sources``); each
process counts its own rows and the counts travel in the step's one all-reduce. The
running totals are saved in checkpoints, so a resumed run reports what an uninterrupted
one does.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from forge_core.api import IGNORE_INDEX, LABELS

#: The train-state key of the running totals.
STATE_KEY = "mixture_tokens"


class MixtureTally:
    def __init__(self, labels: list[str]) -> None:
        self.labels = list(labels)
        self.total = np.zeros(len(self.labels), np.int64)

    def local(self, micro: list[dict[str, Any]], sources: list[np.ndarray]) -> list[float]:
        """This process's labelled tokens per source in ``micro`` (rows from ``sources``)."""
        counts = np.zeros(len(self.labels), np.float64)
        for batch, source in zip(micro, sources):
            labelled = (batch[LABELS] != IGNORE_INDEX).sum(dim=1).numpy()
            counts += np.bincount(source, weights=labelled, minlength=len(self.labels))
        return counts.tolist()

    def metrics(self, step_counts: list[float]) -> dict[str, Any]:
        """The step's metrics from its counts over all processes; adds them to the totals."""
        # Rounded: the per-process weights (data-parallel size / world size) are fractions.
        step = np.rint(np.asarray(step_counts, np.float64)).astype(np.int64)
        self.total += step
        whole = max(int(self.total.sum()), 1)
        out: dict[str, Any] = {}
        for label, now, total in zip(self.labels, step.tolist(), self.total.tolist()):
            out[f"data/{label}/tokens"] = now
            out[f"data/{label}/share"] = total / whole
        return out

    def state_dict(self) -> list[int]:
        return self.total.tolist()

    def load_state_dict(self, totals: list[int] | None) -> None:
        """Continue from saved totals (``None``: a checkpoint that kept none counts from 0)."""
        if totals is not None and len(totals) == len(self.labels):
            self.total = np.asarray(totals, np.int64)
