"""The layout of an evaluation: every document whole, every target token scored.

An evaluation's loss must be the mean, over the target tokens, of each document's loss
alone (what transformers computes one document at a time). The training packer need not
give that: ``concat`` cuts documents across rows (the second part loses the context of
the first) and drops the last partial row (its targets are never scored). So the
evaluation lays its documents out itself, whatever ``data.packer`` is:

- a document of up to ``seq_len`` tokens (EOS included) sits whole in one row;
- when the run can isolate documents (``isolate``: its attention backend honours
  ``doc_ids`` and every active strategy forwards ``doc_ids`` and ``positions``), a row
  holds several documents in stream order, with ``doc_ids`` and restarting
  ``positions``; otherwise each document has a row of its own (padded);
- a document longer than ``seq_len`` cannot be scored alone by a model of that length:
  it is cut into consecutive windows of ``seq_len`` tokens, each in a row of its own and
  scored without the context before it, and the evaluation says how many were
  (:attr:`EvalLayout.windowed`). Every target token is still scored once: the last token
  of a window is labelled with the first of the next (``boundaries="documents"``).

The placement is next fit in stream order: one pass, a new row when the next piece does
not fit, so reading the rows in order reads the documents in order.
"""

from __future__ import annotations

import attrs
import numpy as np

from forge_core.api import RowLayout


@attrs.frozen
class EvalLayout:
    layout: RowLayout
    #: Documents longer than seq_len, scored in windows (module docstring).
    windowed: int


def whole_documents(lengths: np.ndarray, seq_len: int, *, isolate: bool) -> EvalLayout:
    """The rows of documents of ``lengths`` (EOS included): see the module docstring."""
    lengths = np.asarray(lengths, np.int64)
    offsets = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    windows = -(-lengths // seq_len)  # ceil; an empty document has none
    doc = np.repeat(np.arange(len(lengths)), windows)
    first = np.cumsum(windows) - windows
    chunk = np.arange(len(doc), dtype=np.int64) - np.repeat(first, windows)
    starts = offsets[:-1][doc] + chunk * seq_len
    sizes = np.minimum(seq_len, lengths[doc] - chunk * seq_len)
    if isolate:
        rows, cols = _next_fit(sizes, seq_len)
    else:
        rows, cols = np.arange(len(sizes), dtype=np.int64), np.zeros(len(sizes), np.int64)
    layout = RowLayout.from_placement(
        seq_len, starts, sizes, rows, cols, rows=int(rows[-1]) + 1 if len(rows) else 0, metadata=isolate
    )
    return EvalLayout(layout, int(np.count_nonzero(lengths > seq_len)))


def _next_fit(sizes: np.ndarray, capacity: int) -> tuple[np.ndarray, np.ndarray]:
    """``(row, column)`` of each piece placed in order, a new row when it does not fit."""
    rows = np.empty(len(sizes), np.int64)
    cols = np.empty(len(sizes), np.int64)
    row = used = 0
    for j, size in enumerate(sizes.tolist()):
        if used + size > capacity:
            row, used = row + 1, 0
        rows[j], cols[j] = row, used
        used += size
    return rows, cols
