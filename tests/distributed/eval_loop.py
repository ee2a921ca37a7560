"""The evaluation loop in the distributed scenarios (:mod:`scenarios`): after a scenario
trains, :func:`evaluate` runs :func:`forge_core.train.evaluate.run_eval` on the same held-out rows
under its layout, as the trainer does; the single-process reference does the same, so
the test compares the two.

The rows: 10 rows of 16 tokens (a fifth of the labels -100), evaluated 4 rows to a
batch, so the last batch holds 2 rows and 2 filler rows (labels all -100) and every
data-parallel rank takes its slice of each batch.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from forge_core.api import IGNORE_INDEX, INPUT_IDS, LABELS
from forge_core.data.packed_rows import ArrayRows
from forge_core.train.evaluate import EvalData, EvalSet, run_eval

EVAL_ROWS, EVAL_BATCH = 10, 4


def heldout(vocab: int, seq: int) -> EvalData:
    rng = np.random.default_rng(4321)
    ids = rng.integers(0, vocab, (EVAL_ROWS, seq + 1))
    labels = ids[:, 1:].copy()
    labels[rng.random(labels.shape) < 0.2] = IGNORE_INDEX
    rows = ArrayRows({INPUT_IDS: np.ascontiguousarray(ids[:, :-1]), LABELS: labels})
    return EvalData(
        (EvalSet("heldout", rows, EVAL_ROWS, EVAL_ROWS * seq),), EVAL_BATCH, EVAL_ROWS, "test rows"
    )


def evaluate(pmodel: Any, vocab: int, seq: int) -> dict[str, Any]:
    """``{"loss", "tokens"}`` of the rows under ``pmodel``'s layout (every process calls
    it; a single-process model on every process gives the same sums, weighted 1/world)."""
    result = run_eval(
        pmodel,
        heldout(vocab, seq),
        device=torch.device("cpu"),
        slice_weight=pmodel.dp_size / dist.get_world_size(),
    )
    return {"loss": result.loss, "tokens": result.tokens}
